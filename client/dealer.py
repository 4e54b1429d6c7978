"""The request side every socket client shares: a DEALER with request ids, a window of
requests in flight and a deadline per answer, and the errors a caller catches.

``reach.locate`` finds the socket from what a user names (a store directory, an
``ipc://`` store or socket directory, or a socket's own address) and refuses at once
what cannot be a store; until the first handshake succeeds the Dealer watches its
socket's connection (``reach.FirstConnection``) and raises what it shows instead of
waiting out a timeout (client/reach.py lists the cases).
"""

from __future__ import annotations

import itertools
import time

import zmq

from rocketstore.client import reach
from rocketstore.client.errors import (
    ClientError, RequestTimeout, StoreUnreachableError)
from rocketstore.wire import curve, endpoints, protocol

__all__ = ["ClientError", "Dealer", "RequestTimeout", "raise_if_error"]


class Dealer:
    """A DEALER socket with request ids and a window of requests in flight.

    Raises ``StoreUnreachableError`` (a subclass) when made, for an address ZeroMQ
    refuses, and at a send or a wait once the first connection showed that no store
    can be reached (refused, or a failed handshake); from then on every call raises
    it again, and nothing sent before went out.
    """

    def __init__(self, target: reach.Target, timeout_ms: int,
                 curve_server_key: str | None = None, curve_client_key: str | None = None):
        self.target = target
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self.replies: dict[int, bytes] = {}
        self._fault: StoreUnreachableError | None = None
        self.context = zmq.Context()
        try:
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            curve.client_options(self.socket, curve_server_key, curve_client_key)
            endpoints.allow_ipv6(self.socket, target.address)
            self._first = reach.FirstConnection(self.socket, target, bool(curve_server_key))
            self._connect()
        except BaseException:
            self.close()     # a context left open would hang the garbage collector
            raise
        self._poller = zmq.Poller()          # one for every wait
        self._poller.register(self.socket, zmq.POLLIN)
        self._poller.register(self._first.monitor, zmq.POLLIN)

    def _connect(self) -> None:
        try:
            self.socket.connect(self.target.address)
        except zmq.ZMQError as e:
            raise reach.bad_address(self.target.address, e) from None

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: bytes) -> None:
        self._watch()
        self.socket.send(frame, copy=len(frame) < 65536)

    def receive(self, request_id: int) -> bytes:
        """The reply to ``request_id`` (others that arrive first are kept)."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while request_id not in self.replies:
            self._watch()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(f"no answer to request {request_id} within "
                                     f"{self.timeout_ms} ms; its outcome is unknown"
                                     + self._first.waiting_for())
            for sock, _ in self._poller.poll(int(left * 1000) + 1):
                if sock is self.socket:
                    frame = self.socket.recv()
                    self.replies[protocol.peek_header(frame).request_id] = frame
        return self.replies.pop(request_id)

    def _watch(self) -> None:
        """Raise the fault the first connection showed, if any (reading its monitor
        until a handshake succeeds, then never again)."""
        if self._fault is None and not self._first.done:
            self._fault = self._first.take()
            if self._first.done:
                self._poller.unregister(self._first.monitor)
                if self._fault is not None:
                    self._disconnect()
        if self._fault is not None:
            raise self._fault

    def _disconnect(self) -> None:
        """Drop the connection being retried, and with it what was queued for it."""
        try:
            self.socket.disconnect(self.target.address)
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        first = getattr(self, "_first", None)
        if first is not None:
            first.close()
        socket = getattr(self, "socket", None)
        if socket is not None:
            socket.close(0)
        self.context.term()


def raise_if_error(frame: bytes) -> None:
    if protocol.peek_header(frame).kind == protocol.Kind.ERROR:
        err = protocol.decode_error(frame)
        raise ClientError(f"{err.code.name}: {err.message}")
