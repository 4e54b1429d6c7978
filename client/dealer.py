"""The request side every socket client shares: a DEALER with request ids, a window of
requests in flight and a deadline per answer, and the errors a caller catches.

``reach.locate`` finds the socket from what a user names (a store directory, an
``ipc://`` store or socket directory, or a socket's own address) and refuses at once
what cannot be a store; until the first handshake succeeds the Dealer watches its
socket's connection (``reach.ConnectionWatch``) and raises what it shows instead of
waiting out a timeout (client/reach.py lists the cases).

After that the same watch tells when the process at the other end went away (killed,
or restarting under the supervisor). The requests in flight then, those sent before
the loss was seen and not yet answered, cannot be answered by that process any more:

    request sent with   on a connection lost                       the caller sees
    ------------------  -----------------------------------------  --------------------------
    resends=0           ended at once                              ConnectionLost at its wait
    resends=n > 0       sent again (the same frame, the same id)   the first answer to either
                        to the next process, at most n times and
                        within timeout_ms of the first send; then
                        ended as above

ZeroMQ connects again by itself and keeps what is sent meanwhile for the next
connection, so a request sent after a loss goes to the process that takes the place of
the one gone. A request sent after the loss but before it was seen is ended (or resent)
too: its outcome is unknown all the same. An answer to a request already answered,
ended or timed out is dropped.

Cost: nothing at a send once the first handshake succeeded (one dict entry; the frame
goes to the send of pyzmq's backend, past the Python wrapper that adds the arguments of
DRAFT sockets). A wait before that polls the data socket and the monitor together. After it, a wait is
one blocking ``recv`` on the data socket (its RCVTIMEO: WATCH_EVERY_MS, or what is
left of the timeout when that is shorter, set only when it changes), after a look at
the monitor's descriptor (one ``poll`` of it without waiting: events are read only
when it shows some); the monitor is read again whenever a ``recv`` ends without a
frame, so a connection lost while a wait is blocked is seen within WATCH_EVERY_MS.
An answer's request id is read with one ``struct`` (``protocol.reply_request_id``);
the answer awaited is handed back at once, others are kept. ``request`` (a send and
its wait, with nothing else in flight: ``Producer.send``) looks at the monitor before
the send instead, at most every LOOK_EVERY_S: with no request in flight then, a loss
it sees ends nothing, and the send goes to the process that took the place; it enters
no dict entry unless its ``recv`` ends without the answer. That is
one ``poll`` of the monitor's descriptor in 5 ms, not one a send (at eight producers
sending one at a time on two cores, about one a dozen sends). ZeroMQ's flags are passed
as ints (``shm.zmq_flags``): pyzmq's are enum flags, whose operators run in
Python.
"""

from __future__ import annotations

import itertools
import select
import time

import zmq

from rocketstore.client import reach
from rocketstore.client.errors import (
    ClientError, ConnectionLost, RequestTimeout, StoreUnreachableError)
from rocketstore.shm.zmq_flags import EVENTS, POLLIN, backend
from rocketstore.wire import curve, endpoints, protocol

__all__ = ["ClientError", "ConnectionLost", "Dealer", "RequestTimeout", "raise_if_error"]

_COPY_BELOW = 65536          # frames shorter than this are copied by ZeroMQ, not tracked
WATCH_EVERY_MS = 50          # longest a settled wait blocks in recv before it reads the monitor
LOOK_EVERY_S = 0.005         # ``request`` looks at the monitor before a send at most this often


class _Resend:
    """A request to send again if its connection is lost: its frame, how many resends
    it has left, and until when (monotonic seconds)."""

    __slots__ = ("frame", "left", "until")

    def __init__(self, frame: bytes, left: int, until: float):
        self.frame, self.left, self.until = frame, left, until


class Dealer:
    """A DEALER socket with request ids and a window of requests in flight.

    Raises ``StoreUnreachableError`` (a subclass) when made, for an address ZeroMQ
    refuses, and at a send or a wait once the first connection showed that no store
    can be reached (refused, or a failed handshake); from then on every call raises
    it again, and nothing sent before went out. Raises ``ConnectionLost`` at the wait
    for a request whose connection was lost (the module's table).

    Invariants: ``_pending`` holds every request sent and neither answered, ended nor
    timed out (None, or its ``_Resend``); ``replies`` only answers to requests that
    were pending when they came; ``_ended`` only requests no longer pending.
    """

    def __init__(self, target: reach.Target, timeout_ms: int,
                 curve_server_key: str | None = None, curve_client_key: str | None = None):
        self.target = target
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self.replies: dict[int, bytes] = {}
        self._pending: dict[int, _Resend | None] = {}
        self._ended: set[int] = set()
        self._lost_seen = 0                  # connections lost handled so far
        self._fault: StoreUnreachableError | None = None
        self._settled = False                # the first handshake succeeded (no fault)
        self._rcvtimeo_ms = -1               # the data socket's RCVTIMEO, as last set
        self._look_at = 0.0                  # when ``request`` next looks at the monitor
        self.context = zmq.Context()
        try:
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            curve.client_options(self.socket, curve_server_key, curve_client_key)
            endpoints.allow_ipv6(self.socket, target.address)
            self._watch = reach.ConnectionWatch(self.socket, target, bool(curve_server_key))
            self._watch_fd = select.poll()   # the monitor's descriptor: events may wait
            self._watch_fd.register(self._watch.monitor.getsockopt(zmq.FD), select.POLLIN)
            self._connect()
        except BaseException:
            self.close()     # a context left open would hang the garbage collector
            raise
        # what every wait polls: the data socket, and the monitor while it is watched
        self._poll_items = [(self.socket, POLLIN), (self._watch.monitor, POLLIN)]
        self._send_frame = backend(self.socket).send   # no DRAFT arguments
        self._recv = self.socket.recv

    def _connect(self) -> None:
        try:
            self.socket.connect(self.target.address)
        except zmq.ZMQError as e:
            raise reach.bad_address(self.target.address, e) from None

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: bytes, request_id: int, resends: int = 0) -> None:
        """Send request ``request_id`` (the id in ``frame``); with ``resends``, send it
        again after a lost connection, at most that many times, within
        ``timeout_ms``."""
        if not self._settled:
            self._check_first()
        self._send_frame(frame, 0, len(frame) < _COPY_BELOW)
        self._pending[request_id] = _Resend(
            frame, resends, time.monotonic() + self.timeout_ms / 1000) if resends else None

    def request(self, frame: bytes, request_id: int) -> bytes:
        """``send`` then ``receive`` of request ``request_id`` (not resent), with the
        same outcomes, for a caller that has nothing else in flight (``Producer.send``'s
        one message). Once settled, with no other request pending and a timeout of at
        least WATCH_EVERY_MS (the socket's RCVTIMEO): the monitor is looked at before
        the send, at most every LOOK_EVERY_S (nothing is in flight then, so a loss seen
        ends nothing), then one blocking ``recv``, no deadline reckoned unless it ends
        without the answer. The request is entered among the pending only then (a
        ``recv`` that answered it leaves no trace to clear): a loss not yet seen is seen
        when that ``recv`` ends without it, the request was sent after the loss and
        before it was seen, and is ended (the module's table), unless the process that
        took the place answers first."""
        started = time.monotonic()
        if not self._settled or self._pending or self.timeout_ms < WATCH_EVERY_MS:
            self.send(frame, request_id)
            return self.receive(request_id, started)
        if self._rcvtimeo_ms != WATCH_EVERY_MS:
            self.socket.setsockopt(zmq.RCVTIMEO, WATCH_EVERY_MS)
            self._rcvtimeo_ms = WATCH_EVERY_MS
        if started >= self._look_at:
            self._look_at = started + LOOK_EVERY_S
            if self._watch_fd.poll(0):
                self._read_watch()
        self._send_frame(frame, 0, len(frame) < _COPY_BELOW)
        try:
            answer = self._recv()
        except zmq.Again:
            answer = None
        if answer is not None and protocol.reply_request_id(answer) == request_id:
            return answer
        self._pending[request_id] = None
        if answer is not None:
            self._take_reply(answer)        # a late answer to an earlier request: dropped
        return self.receive(request_id, started)

    def receive(self, request_id: int, since: float | None = None) -> bytes:
        """The reply to ``request_id`` (others that arrive first are kept). Raises
        ``ConnectionLost`` when its connection was lost and it is not resent,
        ``RequestTimeout`` when no answer came within ``timeout_ms`` (of ``since``, a
        ``time.monotonic()``, when given; else of now).

        Once the first handshake succeeded: a blocking ``recv`` after a look at the
        monitor's descriptor (the module's Cost); before, ``_receive_first``."""
        if not self._settled:
            return self._receive_first(request_id, since)
        replies, pending, ended = self.replies, self._pending, self._ended
        deadline = (time.monotonic() if since is None else since) + self.timeout_ms / 1000
        wait_ms = self.timeout_ms if self.timeout_ms < WATCH_EVERY_MS else WATCH_EVERY_MS
        while request_id not in replies:
            if request_id in ended:
                ended.discard(request_id)
                raise self._lost(request_id)
            if self._watch_fd.poll(0):
                self._read_watch()
                continue
            if wait_ms != self._rcvtimeo_ms:
                self.socket.setsockopt(zmq.RCVTIMEO, wait_ms)
                self._rcvtimeo_ms = wait_ms
            try:
                frame = self._recv()
            except zmq.Again:            # the monitor is looked at again first
                left = deadline - time.monotonic()
                if left <= 0 and not self._watch_fd.poll(0):
                    raise self._timed_out(request_id)
                wait_ms = min(WATCH_EVERY_MS, max(int(left * 1000) + 1, 1))
                continue
            answers = protocol.reply_request_id(frame)
            if pending.pop(answers, False) is not False:
                if answers == request_id:
                    return frame
                replies[answers] = frame
        return replies.pop(request_id)

    def _receive_first(self, request_id: int, since: float | None) -> bytes:
        """``receive`` until the first handshake succeeded: a poll of the data socket
        and the monitor together, whose events judge the first connection."""
        deadline = (time.monotonic() if since is None else since) + self.timeout_ms / 1000
        socket, replies = self.socket, self.replies
        while request_id not in replies:
            if request_id in self._ended:
                self._ended.discard(request_id)
                raise self._lost(request_id)
            if not self._watch.done or self._fault is not None:
                self._check_first()
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out(request_id)
            answer = None
            for sock, _ in zmq.zmq_poll(self._poll_items, int(left * 1000) + 1):
                if sock is socket:
                    frame = socket.recv()
                    answers = protocol.reply_request_id(frame)
                    if self._pending.pop(answers, False) is not False:
                        if answers == request_id:
                            answer = frame
                        else:
                            replies[answers] = frame
                else:
                    self._read_watch()
            if answer is not None:
                return answer
        return replies.pop(request_id)

    def _timed_out(self, request_id: int) -> RequestTimeout:
        """No longer wait for ``request_id``: the error its wait raises."""
        self._pending.pop(request_id, None)
        return RequestTimeout(f"no answer to request {request_id} within {self.timeout_ms} "
                              "ms; its outcome is unknown" + self._watch.waiting_for())

    def forget(self, request_id: int) -> None:
        """No longer wait for request ``request_id``: its answer, come or to come, is
        dropped (a reader that stopped before it needed what it asked for ahead)."""
        self._pending.pop(request_id, None)
        self.replies.pop(request_id, None)
        self._ended.discard(request_id)

    def _take_reply(self, frame: bytes) -> None:
        """Keep ``frame`` if it answers a pending request."""
        request_id = protocol.reply_request_id(frame)
        if self._pending.pop(request_id, False) is not False:
            self.replies[request_id] = frame

    def _lost(self, request_id: int) -> ConnectionLost:
        return ConnectionLost(
            f"the connection to {self.target.address} was lost with request {request_id} "
            "in flight (the store's process went away: killed, or restarting); its "
            "outcome is unknown. What is sent next goes to the process that takes its "
            "place")

    def _read_watch(self) -> None:
        """Read the monitor's events; on a connection lost, end or resend what is in
        flight."""
        if not self._watch.done:
            self._check_first()      # raises the fault it shows, if any
        else:
            self._watch.take()
        if self._watch.lost != self._lost_seen:
            self._lost_seen = self._watch.lost
            self._end_in_flight()

    def _end_in_flight(self) -> None:
        """Every request pending: resent if it may be, else ended. Answers that came
        before the loss are taken first (they are in the socket already when ZeroMQ
        reports the loss)."""
        while self.socket.getsockopt(EVENTS) & POLLIN:
            self._take_reply(self.socket.recv())
        now = time.monotonic()
        for request_id, resend in list(self._pending.items()):
            if resend is not None and resend.left > 0 and now < resend.until:
                resend.left -= 1
                self.socket.send(resend.frame, 0, len(resend.frame) < _COPY_BELOW)
            else:
                del self._pending[request_id]
                self._ended.add(request_id)

    def _check_first(self) -> None:
        """Raise the fault the first connection showed, if any (reading its monitor
        until a handshake succeeds, at each send and wait)."""
        if self._fault is None and not self._watch.done:
            self._fault = self._watch.take()
            if self._fault is not None:
                self._poll_items = self._poll_items[:1]
                self._disconnect()
        if self._fault is not None:
            raise self._fault
        self._settled = self._watch.done

    def _disconnect(self) -> None:
        """Drop the connection being retried, and with it what was queued for it."""
        try:
            self.socket.disconnect(self.target.address)
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.close()
        socket = getattr(self, "socket", None)
        if socket is not None:
            socket.close(0)
        self.context.term()


def raise_if_error(frame: bytes) -> None:
    if protocol.peek_header(frame).kind is protocol.Kind.ERROR:
        err = protocol.decode_error(frame)
        raise ClientError(f"{err.code.name}: {err.message}")
