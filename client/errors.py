"""What a client raises when a store answers with an error or cannot be reached: one
family under ``ClientError`` (``client.topics`` has the errors of a name not found).

    ClientError                  the store answered with an error frame, or cannot be reached
    ├── RequestTimeout           no answer in time: the request's outcome is unknown
    │   └── ConnectionLost       the process answering went away (killed, restarting)
    │                            with the request in flight: its outcome is unknown,
    │                            raised at once instead of at the timeout
    └── StoreUnreachableError    no store can be reached where the client was aimed, and
        │                        the client knows why (``client.reach``); nothing it sent
        │                        reached a store
        ├── NoStoreError         no store at that directory: none there, or not running
        │                        (also a ``PositionTableError``, what a Consumer raised
        │                        for it before)
        ├── BadAddressError      not an address ZeroMQ can use (also a ``ValueError``)
        ├── NoListenerError      nothing listens at that address: the connection was
        │                        refused
        └── HandshakeRefusedError  the ZeroMQ handshake failed: CURVE on one side only,
                                 or the store refused this client's key
"""

from __future__ import annotations

from rocketstore.shm.positions import PositionTableError

__all__ = ["BadAddressError", "ClientError", "ConnectionLost", "HandshakeRefusedError",
           "NoListenerError", "NoStoreError", "RequestTimeout", "StoreUnreachableError"]


class ClientError(Exception):
    """The store answered with an error frame, or could not be reached."""


class RequestTimeout(ClientError):
    """No answer in time: the request's outcome is unknown."""


class ConnectionLost(RequestTimeout):
    """The connection to the store's process went away (the process was killed, or is
    restarting) while the request was in flight: its outcome is unknown, as after a
    timeout, but known at once. What is sent next goes to the process that takes its
    place (the client connects again by itself)."""


class StoreUnreachableError(ClientError):
    """No store can be reached where the client was aimed, and the client knows why.
    Raised at once (when the client is made, or at its first wait for an answer) on
    evidence only, and before any handshake succeeded: nothing the client sent reached
    a store, and nothing it queued goes out later."""


class NoStoreError(StoreUnreachableError, PositionTableError):
    """No store at a directory: it does not exist, holds no store, or holds one that is
    not running."""


class BadAddressError(StoreUnreachableError, ValueError):
    """Not an address ZeroMQ can use (``host:port`` without ``tcp://``, an unknown
    scheme, a missing port)."""


class NoListenerError(StoreUnreachableError):
    """Nothing listens at a socket address: connecting to it failed at once."""


class HandshakeRefusedError(StoreUnreachableError):
    """The ZeroMQ handshake with the store failed: it requires CURVE and the client has
    no keys, or the reverse, or it refused the client's key."""
