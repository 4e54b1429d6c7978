"""The reader process: pulls and queries over ZeroMQ for clients that cannot map the
store's files (Spark executors on other machines, above all).

A ROUTER at ``ipc://{run}/reader.sock`` answers PULL and QUERY frames
(``procs.protocol``) from a read-only ``StoreReader`` bounded by DISPATCHED (never a
message a crash could take back under SYNC_FLUSH). Records travel as the raw CommitLog
bytes; the client decodes them.

Long polling: a PULL that finds nothing new and carries ``timeout_ms`` > 0 is parked;
every ARRIVAL the dispatcher announces, and every turn, retries the parked pulls, and
one whose budget ran out is answered with whatever its queue holds
(``OFFSET_OVERFLOW_ONE`` when still nothing). Every read stops at DISPATCHED. Bad frames
get an ERROR reply and the reader keeps serving.

Restart: it holds nothing but mappings and parked requests; a restarted reader maps the
files afresh and clients whose requests were parked time out and ask again.
"""

from __future__ import annotations

import logging
import time

import zmq

from procs import protocol
from procs.service import MAX_TURN_MS, Service
from shm import bus
from shm.positions import Slot
from storage.errors import StoreError
from storage.status import GetMessageStatus
from storage.store_reader import StoreReader

log = logging.getLogger(__name__)
MAX_PARKED = 10_000
_NOTHING_YET = (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)


class ReaderService(Service):
    name = "reader"

    def setup(self) -> None:
        self.reader = StoreReader(self.config)
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.bind(bus.endpoint(self.store_dir, "reader"))
        self.arrivals = bus.Subscriber(self.context, self.store_dir, ["dispatcher"], [bus.ARRIVAL])
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.arrivals.socket, zmq.POLLIN)
        self.parked: list[tuple[bytes, protocol.PullRequest, float]] = []

    def turn(self) -> None:
        events = dict(self.poller.poll(MAX_TURN_MS))
        if self.arrivals.socket in events:
            self.arrivals.wait(0)  # drain: any arrival retries every parked pull
        while True:
            try:
                identity, frame = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue  # a multi-part message: not ours
            self._answer(identity, frame)
        self._retry_parked()

    def _answer(self, identity: bytes, frame: bytes) -> None:
        try:
            header = protocol.peek_header(frame)
            if header.kind == protocol.Kind.PULL:
                self._pull(identity, protocol.decode_pull(frame))
            elif header.kind == protocol.Kind.QUERY:
                self._reply(identity, self._query(protocol.decode_query(frame)))
            else:
                raise protocol.ProtocolError(protocol.ErrorCode.UNKNOWN_KIND,
                                             f"the reader answers PULL and QUERY, not "
                                             f"kind {header.kind}", header.request_id)
        except protocol.ProtocolError as e:
            self._reply(identity, protocol.encode_error(e.request_id, e.code, e.detail))
        except StoreError as e:
            log.error("read failed: %s", e)
            rid = _request_id(frame)
            self._reply(identity, protocol.encode_error(rid, protocol.ErrorCode.INTERNAL, str(e)))

    # ------------------------------------------------------------------ pull
    def _pull(self, identity: bytes, req: protocol.PullRequest) -> None:
        final = req.timeout_ms <= 0 or len(self.parked) >= MAX_PARKED
        if not self._try_pull(identity, req, final):
            self.parked.append((identity, req, time.monotonic() + req.timeout_ms / 1000))

    def _try_pull(self, identity: bytes, req: protocol.PullRequest, final: bool) -> bool:
        """Answer ``req`` unless it finds nothing new and may still wait."""
        r = self.reader.get_raw_messages(req.topic, req.queue_id, req.offset, req.max_msgs,
                                         self.table.get(Slot.DISPATCHED),
                                         min_commit_log_offset=self.table.get(Slot.MIN_OFFSET))
        if not final and r.status in _NOTHING_YET:
            return False
        self._reply(identity, protocol.encode_pull_reply(
            req.request_id, r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.records))
        return True

    def _retry_parked(self) -> None:
        now = time.monotonic()
        self.parked = [(identity, req, deadline) for identity, req, deadline in self.parked
                       if not self._try_pull(identity, req, final=now >= deadline)]

    # ------------------------------------------------------------------ query
    def _query(self, req: protocol.QueryRequest) -> bytes:
        # Every read stops at DISPATCHED (<= FLUSHED under SYNC_FLUSH): a query never
        # shows a message a consumer could not see, nor one a crash could take back.
        dispatched = self.table.get(Slot.DISPATCHED)
        written = dispatched
        if req.mode == protocol.QueryMode.BY_KEY:
            found = self.reader.query_message(req.topic, req.key, req.max_num, req.begin_ms,
                                              req.end_ms, dispatched)
        elif req.mode == protocol.QueryMode.BY_MSG_ID:
            try:
                one = self.reader.look_message_by_id(req.msg_id, written)
            except ValueError as e:
                raise protocol.ProtocolError(protocol.ErrorCode.MALFORMED_FRAME, str(e),
                                             req.request_id) from None
            found = [one] if one else []
        else:
            one = self.reader.look_message_by_offset(req.commit_log_offset, written)
            found = [one] if one else []
        records = [self.reader.read_record(m.commit_log_offset, m.store_size, written)
                   for m in found]
        return protocol.encode_query_reply(req.request_id, [r for r in records if r])

    def _reply(self, identity: bytes, frame: bytes) -> None:
        """Send without blocking: a peer that left, or that stopped reading, loses its
        reply and never holds up the others."""
        try:
            self.socket.send_multipart((identity, frame), zmq.NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise

    def teardown(self) -> None:
        for identity, req, _ in self.parked:
            self._try_pull(identity, req, final=True)
        self.reader.close()


def _request_id(frame: bytes) -> int:
    try:
        return protocol.peek_header(frame).request_id
    except protocol.ProtocolError:
        return 0


SERVICE = ReaderService
