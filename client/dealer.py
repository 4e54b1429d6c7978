"""The request side every socket client shares: a DEALER with request ids, a window of
requests in flight and a deadline per answer, and the errors a caller catches.

``socket_address`` finds a socket from what a user names: a store directory, an
``ipc://`` store or socket directory (``wire.endpoints``), or a socket's own address.
"""

from __future__ import annotations

import itertools
import time

import zmq

from rocketstore.shm import bus
from rocketstore.wire import curve, endpoints, protocol

__all__ = ["ClientError", "Dealer", "RequestTimeout", "raise_if_error", "socket_address"]


class ClientError(Exception):
    """The store answered with an error frame, or could not be reached."""


class RequestTimeout(ClientError):
    """No answer in time: the request's outcome is unknown."""


def socket_address(store_or_endpoint: str, socket_name: str) -> str:
    """The address of socket ``socket_name`` (``ingest`` or ``reader``): of a store
    directory, or of an ``ipc://`` store or socket directory; any other address (a
    ``tcp://`` one, an ``ipc://`` socket file) as it is."""
    where = store_or_endpoint
    if where.startswith("ipc://") and not where.endswith(".sock"):
        return getattr(endpoints.resolve(where), socket_name)
    if "://" in where:
        return where
    return bus.endpoint(where, socket_name)


class Dealer:
    """A DEALER socket with request ids and a window of requests in flight."""

    def __init__(self, endpoint: str, timeout_ms: int, curve_server_key: str | None = None,
                 curve_client_key: str | None = None):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        curve.client_options(self.socket, curve_server_key, curve_client_key)
        endpoints.allow_ipv6(self.socket, endpoint)
        self.socket.connect(endpoint)
        self._poller = zmq.Poller()          # one for every wait
        self._poller.register(self.socket, zmq.POLLIN)
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self.replies: dict[int, bytes] = {}

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: bytes) -> None:
        self.socket.send(frame, copy=len(frame) < 65536)

    def receive(self, request_id: int) -> bytes:
        """The reply to ``request_id`` (others that arrive first are kept)."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while request_id not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self._poller.poll(int(left * 1000) + 1):
                raise RequestTimeout(f"no answer to request {request_id} within "
                                     f"{self.timeout_ms} ms; its outcome is unknown")
            frame = self.socket.recv()
            self.replies[protocol.peek_header(frame).request_id] = frame
        return self.replies.pop(request_id)

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def raise_if_error(frame: bytes) -> None:
    if protocol.peek_header(frame).kind == protocol.Kind.ERROR:
        err = protocol.decode_error(frame)
        raise ClientError(f"{err.code.name}: {err.message}")
