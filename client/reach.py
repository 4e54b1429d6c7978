"""Where a client's socket goes, and how the client learns at once that no store is
there.

A client aimed at the wrong place would wait its whole timeout and then call its
request's outcome unknown. These checks name the fault instead, each on evidence:

    aimed at                        checked     evidence                        raises
    ------------------------------  ----------  ------------------------------  --------------------
    a store directory (or ipc://    when made   no directory; no store files    NoStoreError
    of one)                                     in it; no position table, or
                                                its supervisor dead
    host:port (no scheme), not a    when made   the text                        BadAddressError
    path
    an address ZeroMQ refuses       when made   connect refuses it              BadAddressError
    an ipc:// socket directory or   when made   its directory does not exist    NoStoreError
    socket file
    an ipc:// socket, tcp://        first wait  CONNECT_RETRIED before any      NoListenerError
    host:port                                   connection (refused; or the
                                                host name unknown)
    tcp:// with or without CURVE    first wait  HANDSHAKE_FAILED_*: mechanism   HandshakeRefusedError
                                                mismatch (or the peer's
                                                greeting naming another),
                                                key refused (ZAP 400), CURVE
                                                failing NO_DETAIL_LIMIT times
    a store directory whose socket  first wait  its table says no store runs    NoStoreError
    refuses                                     now (one that runs: wait on, a
                                                process may be restarting)

Nothing else is taken for absence: a store slow to answer, a host that does not answer
a connect, or a peer that connects but never completes a handshake still gets the
whole timeout and ``RequestTimeout``.

"First wait" checks read ZeroMQ's socket monitor of the client's socket, polled beside
it while the client waits for an answer (and read, without waiting, at each send),
until one handshake succeeds; after that a send reads nothing more and a wait reads
the monitor only for connections lost, before it blocks and at least every
``dealer.WATCH_EVERY_MS`` while it does (``ConnectionWatch``: the process at the other
end went away; ``Dealer`` ends or resends what was in flight then).
No request is added: the check rides on the client's own first request.
ZeroMQ delivers nothing before a handshake succeeds, so a client that raises one of
these errors has sent nothing to a store; ``Dealer`` then disconnects, so nothing it
queued goes out later, and raises the same error at every later call.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import NamedTuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from rocketstore.client import group_lookup
from rocketstore.client.errors import (
    BadAddressError, HandshakeRefusedError, NoListenerError, NoStoreError,
    StoreUnreachableError)
from rocketstore.shm import bus
from rocketstore.shm.positions import (
    PositionTable, PositionTableAccessError, PositionTableError)
from rocketstore.wire import endpoints

__all__ = ["ConnectionWatch", "Target", "locate", "running_table"]

_HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "HANDSHAKE_FAILED_NO_DETAIL",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "HANDSHAKE_FAILED_PROTOCOL",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "HANDSHAKE_FAILED_AUTH",
}
NO_DETAIL_LIMIT = 4    # handshakes failed without a reason before that is the verdict
_WATCHED = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED)


class Target(NamedTuple):
    """What a client connects to: a socket's ``address``, and the ``store_dir`` it was
    found from, whose position table tells a store not running from one restarting a
    process (None for an address given as such)."""

    address: str
    store_dir: str | None = None


# ------------------------------------------------------------------------------ when made
def locate(where: str, socket_name: str) -> Target:
    """The socket ``socket_name`` (``ingest`` or ``reader``) of what a user named: a
    store directory, ``ipc://`` naming a store or its socket directory
    (``wire.endpoints``), or a socket's own address (``tcp://``, ``ipc://...sock``),
    taken as it is. Makes nothing anywhere.

    Raises ``NoStoreError`` for a directory without a running store, or an ``ipc://``
    one that does not exist; ``BadAddressError`` for ``host:port`` without its scheme.
    """
    if where.startswith("ipc://"):
        return _ipc_target(where, socket_name)
    if where.startswith("zk://"):         # a broker group: its master (controller mode)
        return Target(group_lookup.endpoint(where, socket_name))
    if "://" in where:
        return Target(where)
    meant = endpoints.tcp_meant(where)
    if meant and not os.path.exists(where):
        raise BadAddressError(f"{where!r} is neither a directory nor an address ZeroMQ can "
                              f"use: did you mean {meant}?")
    return _store_target(where, socket_name)


def _store_target(store_dir: str, socket_name: str) -> Target:
    check_running(store_dir)
    return Target(bus.endpoint(store_dir, socket_name, create=False), store_dir)


def _ipc_target(where: str, socket_name: str) -> Target:
    path = where[len("ipc://"):]
    if path.endswith(".sock"):
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise NoStoreError(f"no store's socket at {where}: the directory {folder} does "
                               "not exist")
        return Target(where)
    path = path.rstrip("/") or "/"
    if not os.path.isdir(path):
        raise NoStoreError(f"no store at {where}: the directory {path} does not exist")
    if endpoints.is_store_dir(path):
        return _store_target(path, socket_name)
    return Target(getattr(endpoints.resolve(where), socket_name))


def running_table(store_dir: str) -> PositionTable:
    """The position table of the store running at ``store_dir``. Raises
    ``NoStoreError`` when none runs there (``positions.not_running`` says why), and
    ``PositionTableAccessError`` for a store this user may not look at."""
    try:
        return PositionTable.attach(store_dir)
    except PositionTableAccessError:
        raise
    except PositionTableError as e:
        raise NoStoreError(str(e)) from None


def check_running(store_dir: str) -> None:
    """Raise ``NoStoreError`` unless a store runs at ``store_dir``; another user's
    store, whose table this user may not open, passes (no evidence either way)."""
    try:
        running_table(store_dir).close()
    except PositionTableAccessError:
        pass


def bad_address(address: str, error: zmq.ZMQError) -> BadAddressError:
    """What a ``connect`` that refused ``address`` means to the user."""
    meant = endpoints.tcp_meant(address)
    return BadAddressError(
        f"{address!r} is not an address ZeroMQ can use ({zmq.strerror(error.errno)}): a "
        "store is reached by its directory, ipc://DIR or tcp://host:port"
        + (f"; did you mean {meant}?" if meant else ""))


# ------------------------------------------------------------------------------ first wait
class ConnectionWatch:
    """ZeroMQ's monitor of a client socket, for the socket's life. Made before the
    socket connects (so no event is missed).

    Until the first handshake succeeds it judges the connection (``take`` returns the
    fault the events show; ``done`` once a handshake succeeded or a fault was found,
    and on a fault the monitor is closed). After, it counts the connections lost:
    ``lost`` grows by one for each DISCONNECTED of a connection whose handshake had
    succeeded (the process at the other end went away: killed, restarted, stopped).
    A request sent over such a connection and not answered before it was lost may or
    may not have been carried out; ZeroMQ connects again by itself, and what is sent
    meanwhile waits for the next connection.
    """

    def __init__(self, client_socket: zmq.Socket, target: Target, curve: bool):
        self.socket, self.target, self.curve = client_socket, target, curve
        self.monitor = client_socket.get_monitor_socket(_WATCHED)
        self.connected = False       # a connection was ever made (for a timeout's message)
        self._attempt_connected = False   # the current attempt made one
        self._no_detail = 0          # handshakes failed without a reason so far
        self.done = False            # the first connection is judged
        self.live = False            # a connection whose handshake succeeded is up
        self.lost = 0                # such connections lost so far
        self.closed = False

    def take(self) -> StoreUnreachableError | None:
        """Read every event waiting, without waiting; the fault they show, if any
        (None, ever, once the first handshake succeeded)."""
        while not self.closed:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return None
            fault = self._judge(event["event"], event["value"])
            if fault is not None:
                self.done = True
                self.close()
                return fault
        return None

    def _judge(self, event: int, value: int) -> StoreUnreachableError | None:
        """The decision table, one event at a time:

            event                   fault
            ----------------------  ---------------------------------------------------
            HANDSHAKE_SUCCEEDED     none, ever: the first connection is judged; a
                                    connection is live
            DISCONNECTED            none; a live connection is lost (``lost`` + 1)
            (any other, once done)  none
            HANDSHAKE_FAILED_AUTH   the store refused this client's key
            HANDSHAKE_FAILED_       CURVE on one side only (mechanism mismatch), or a
            PROTOCOL                peer that does not speak ZMTP
            HANDSHAKE_FAILED_       the peer closed the connection first: at the first,
            NO_DETAIL               CURVE on one side only if the peer's greeting
                                    names another mechanism than ours
                                    (``peer_mechanism``; a mismatch is often seen so,
                                    the peer's RST ahead of its greeting); else none
                                    until the NO_DETAIL_LIMIT-th (a wrong
                                    curve_server_key only ever shows this)
            CONNECT_RETRIED         after an attempt that connected: none (ZeroMQ tries
                                    again); else the connection failed: refused
        """
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.done = self.live = True
        elif event == zmq.EVENT_DISCONNECTED:
            if self.live:
                self.live = False
                self.lost += 1
        elif self.done:
            pass
        elif event == zmq.EVENT_CONNECTED:
            self.connected = self._attempt_connected = True
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._no_detail += 1
            if self._no_detail == 1:
                return self._mismatch()
            if self._no_detail >= NO_DETAIL_LIMIT:
                return handshake_fault(self.target.address, event, value, self.curve)
        elif event in _HANDSHAKE_FAILED:
            return handshake_fault(self.target.address, event, value, self.curve)
        elif event == zmq.EVENT_CONNECT_RETRIED:
            if not self._attempt_connected:
                return self._refused()
            self._attempt_connected = False
        return None

    def _mismatch(self) -> StoreUnreachableError | None:
        """A mechanism mismatch, if the peer's greeting shows one."""
        ours = "CURVE" if self.curve else "NULL"
        theirs = peer_mechanism(self.target.address)
        if theirs is None or theirs == ours:
            return None
        return handshake_fault(self.target.address, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                               zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, self.curve)

    def _refused(self) -> StoreUnreachableError | None:
        """Connecting failed. A store directory's table decides (a store that runs may
        be restarting the process that listens: wait on); an address has nothing
        listening."""
        if self.target.store_dir is not None:
            try:
                check_running(self.target.store_dir)
            except NoStoreError as e:
                return e
            return None
        return no_listener(self.target.address)

    def waiting_for(self) -> str:
        """What the first connection still waits for, for a timeout's message."""
        if self.done:
            return ""
        if self.connected:
            return (f"; connected to {self.target.address}, but the ZeroMQ handshake did "
                    "not finish (is that a store's socket?)")
        return f"; no connection to {self.target.address} was made (is the host reachable?)"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.socket.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(0)


# ZMTP 3's greeting (rfc.zeromq.org/spec/23): signature (0xFF, padding, 0x7F), version,
# the security mechanism ("NULL", "CURVE", NUL-padded), as-server, filler.
GREETING = struct.Struct(">B8sBBB20sB31s")
assert GREETING.size == 64
GREETING_OPENING = b"\xff" + bytes(8) + b"\x7f" + b"\x03"   # signature, major version 3


def peer_mechanism(address: str, timeout_s: float = 1.0) -> str | None:
    """The security mechanism the ZMTP peer at a ``tcp://`` ``address`` names in its
    greeting (``NULL``, ``CURVE``), or None when it cannot be read. Sends only the
    opening of a greeting (a peer sends the rest of its own in answer to the version)
    and closes: the peer sees one more handshake that failed."""
    if not address.startswith("tcp://"):
        return None
    host, _, port = address[len("tcp://"):].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout_s) as s:
            s.sendall(GREETING_OPENING)
            got = b""
            while len(got) < GREETING.size:
                chunk = s.recv(GREETING.size - len(got))
                if not chunk:
                    return None
                got += chunk
    except (OSError, ValueError):
        return None
    signature, _, end, major, _, mechanism, _, _ = GREETING.unpack(got)
    if signature != 0xFF or end & 1 != 1 or major < 3:
        return None
    return mechanism.rstrip(b"\0").decode("ascii", "replace")


def no_listener(address: str) -> NoListenerError:
    if address.startswith("ipc://"):
        return NoListenerError(f"nothing listening at {address}: the connection was refused "
                               "(no socket there, or one a stopped store left); is the "
                               "store running?")
    return NoListenerError(f"nothing listening at {address}: the connection was refused (or "
                           "the host name is unknown); is the store running there, and is "
                           "that its port (listen_port for the ingest socket, listen_port - 2 "
                           "for the reader)?")


def handshake_fault(address: str, event: int, value: int, curve: bool) -> HandshakeRefusedError:
    """What a failed handshake (``event``, ZeroMQ's ``value``) means, for a client with
    CURVE keys (``curve``) or without."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return HandshakeRefusedError(
            f"the store at {address} refused this client's key (ZAP status {value}): its "
            "public key is not among the store's curve_authorized_keys")
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return HandshakeRefusedError(
            f"the store at {address} requires CURVE: give curve_server_key (the store's "
            "public certificate) and curve_client_key (this client's secret one)"
            if not curve else
            f"the store at {address} does not use CURVE: connect without curve_server_key "
            "and curve_client_key")
    if curve and event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return HandshakeRefusedError(
            f"the CURVE handshake with {address} failed at each of {NO_DETAIL_LIMIT} tries: "
            "is curve_server_key that store's public certificate?")
    return HandshakeRefusedError(f"the ZeroMQ handshake with {address} failed "
                                 f"({_HANDSHAKE_FAILED[event]}, {value}): is that a store's "
                                 "socket?")
