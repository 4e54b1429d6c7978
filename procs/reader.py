"""The reader process: pulls, queries, offsets and bulk fetches over ZeroMQ for clients
that cannot map the store's files (Spark executors on other machines, above all).

A ROUTER at ``ipc://{run}/reader.sock`` answers PULL, QUERY, OFFSETS, FETCH and COMMIT
frames (``wire.protocol``) from a read-only ``StoreReader`` bounded by DISPATCHED (never
a message a crash could take back under SYNC_FLUSH). Records travel as the raw CommitLog
bytes; the client decodes them.

- OFFSETS: each queue's min and max offset (and, given a timestamp, the first offset
  stored at or after it), with DISPATCHED and GENERATION so a planner can tell the
  offsets' bound and notice a store restart. No topics named: every topic the store
  has, less the reserved ones (``SCHEDULE_TOPIC_XXXX``, ``RMQ_SYS_*``).
- FETCH: a bulk read for batch readers, answered at once (never parked) with a
  FETCH_REPLY of up to ``MAX_FETCH_MSGS`` units and their records, no more than
  ``max_bytes`` (at most ``MAX_FETCH_BYTES``) of them, read across consume queue files;
  RocketMQ's per-pull transfer limits (32 messages / 256 KiB) are for consumers and do
  not apply. The records go out back to back, copied once from the mapping
  (``storage.bulk_read``), unchecked: the client checks every one against its unit, in
  bulk.
- COMMIT: the reader writes ``config/consumerOffset.json`` on behalf of remote clients:
  their group's offsets are merged in through ``client.consumer.update_offsets`` (the
  same flock and RocketMQ shape local ``Consumer``s use), so a remote group's progress
  sits where a local one's does. It is the one file this process writes; a commit past
  a queue's max offset, of a topic the store does not have (``client.topics``), or with
  a bad group or topic name, is refused (BAD_REQUEST) and nothing of it is written.

Long polling: a PULL that finds nothing new and carries ``timeout_ms`` > 0 is parked;
every ARRIVAL of its topic the dispatcher announces (the reader listens to the topics
pulls wait on, ``_watch``), and every turn, retries the parked pulls, and
one whose budget ran out is answered with whatever its queue holds
(``OFFSET_OVERFLOW_ONE`` when still nothing). Every read stops at DISPATCHED. Bad frames
get an ERROR reply and the reader keeps serving.

Expiry: every turn it follows MIN_OFFSET (``StoreReader.drop_expired``), so the files
the cleaner unlinks are unmapped, and their space comes back, while no request comes.

Restart: it holds nothing but mappings and parked requests; a restarted reader maps the
files afresh and clients whose requests were parked time out and ask again.
"""

from __future__ import annotations

import gc
import logging
import time

import zmq

from rocketstore.wire import curve, endpoints, protocol
from rocketstore.client.consumer import update_offsets
from rocketstore.client.topics import TopicNotExistError, user_topics
from rocketstore.procs.allocator import keep_large_blocks
from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.shm import bus
from rocketstore.shm.positions import Slot
from rocketstore.storage import record
from rocketstore.storage.bulk_read import keep_tags
from rocketstore.storage.errors import StoreError
from rocketstore.storage.read_path import subscription_tags
from rocketstore.storage.status import GetMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import TOPIC_PATTERN, check_topic

log = logging.getLogger(__name__)
MAX_PARKED = 10_000
GC_THRESHOLD = 100_000   # allocations between young-generation collections (default 700)
WATCH_LINGER_S = 10.0     # a topic stays watched this long after its last parked pull
_NOTHING_YET = (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)


class ReaderService(Service):
    name = "reader"

    def setup(self) -> None:
        keep_large_blocks()     # a FETCH reply's buffers reuse the last one's pages
        self.reader = StoreReader(self.config)
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        cfg = self.config
        curve.bind_all(self.socket, endpoints.bind_addresses(
            self.store_dir, "reader", cfg.tcp_listen_address, cfg.listen_port),
            self.curve_guard())
        # arrivals of the topics of parked pulls only (``_watch``): the others would
        # wake the reader for nothing
        self.arrivals = bus.Subscriber(self.context, self.store_dir, ["dispatcher"], [])
        self.watched: dict[str, float] = {}    # topic -> when a pull last waited on it
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.arrivals.socket, zmq.POLLIN)
        self.parked: list[tuple[bytes, protocol.PullRequest, float]] = []
        # A FETCH makes one object per record (~65,000 a reply) and keeps none: with the
        # default thresholds the cyclic collector would run hundreds of times a reply and
        # take about a third of the reader's time; it collects rarely here (and, as in
        # every store process, never walks what setup made: procs.service freezes it).
        gc.set_threshold(GC_THRESHOLD, 50, 100)

    def turn(self) -> None:
        events = dict(self.poller.poll(MAX_TURN_MS))
        if self.arrivals.socket in events:
            self.arrivals.wait(0)  # drain: any arrival retries every parked pull
        while True:
            try:
                identity, *parts = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(parts) != 1:     # refused as the writer refuses it
                self._reply(identity, protocol.encode_error(
                    _request_id(parts[-1]) if parts else 0, protocol.ErrorCode.MALFORMED_FRAME,
                    f"a request is one message part, this one has {len(parts)}"))
                continue
            self._answer(identity, parts[0])
        self._retry_parked()
        self._watch()
        self.reader.drop_expired(self.table.get(Slot.MIN_OFFSET))

    def _watch(self, topic: str | None = None) -> None:
        """Listen to the arrivals of the topics parked pulls wait on (``topic``: one
        just parked), and of those that had one within ``WATCH_LINGER_S`` (a consumer
        that long-polls on and on keeps its topic watched, without a subscription
        racing each pull)."""
        now = time.monotonic()
        waiting = {req.topic for _, req, _ in self.parked}
        if topic is not None:
            waiting.add(topic)
        for t in waiting:
            if t not in self.watched:
                self.arrivals.subscribe(bus.arrival_topic(t))
            self.watched[t] = now
        for t, seen in list(self.watched.items()):
            if now - seen > WATCH_LINGER_S:
                self.arrivals.unsubscribe(bus.arrival_topic(t))
                del self.watched[t]

    def _answer(self, identity: bytes, frame: bytes) -> None:
        try:
            header = protocol.peek_header(frame)
            if header.kind == protocol.Kind.PULL:
                self._pull(identity, protocol.decode_pull(frame))
            elif header.kind == protocol.Kind.QUERY:
                self._reply(identity, self._query(protocol.decode_query(frame)))
            elif header.kind == protocol.Kind.OFFSETS:
                self._reply(identity, self._offsets(protocol.decode_offsets(frame)))
            elif header.kind == protocol.Kind.FETCH:
                self._reply(identity, self._fetch(protocol.decode_fetch(frame)))
            elif header.kind == protocol.Kind.COMMIT:
                self._reply(identity, self._commit(protocol.decode_commit(frame)))
            else:
                raise protocol.ProtocolError(protocol.ErrorCode.UNKNOWN_KIND,
                                             f"the reader answers PULL, QUERY, OFFSETS, FETCH "
                                             f"and COMMIT, not kind {header.kind}",
                                             header.request_id)
        except protocol.ProtocolError as e:
            self._reply(identity, protocol.encode_error(e.request_id, e.code, e.detail))
        except StoreError as e:
            log.error("read failed: %s", e)
            rid = _request_id(frame)
            self._reply(identity, protocol.encode_error(rid, protocol.ErrorCode.INTERNAL, str(e)))
        except Exception as e:  # noqa: BLE001 - a bug must cost one request, not the reader
            log.exception("request failed")
            self._reply(identity, protocol.encode_error(
                _request_id(frame), protocol.ErrorCode.INTERNAL,
                f"the reader failed on this request: {type(e).__name__}: {e}"))

    # ------------------------------------------------------------------ pull
    def _pull(self, identity: bytes, req: protocol.PullRequest) -> None:
        final = req.timeout_ms <= 0 or len(self.parked) >= MAX_PARKED
        if not self._try_pull(identity, req, final):
            self.parked.append((identity, req, time.monotonic() + req.timeout_ms / 1000))
            self._watch(req.topic)

    def _try_pull(self, identity: bytes, req: protocol.PullRequest, final: bool) -> bool:
        """Answer ``req`` unless it finds nothing new and may still wait."""
        r = self.reader.get_raw_messages(req.topic, req.queue_id, req.offset, req.max_msgs,
                                         self.table.get(Slot.DISPATCHED), req.subscription,
                                         min_commit_log_offset=self.table.get(Slot.MIN_OFFSET))
        if not final and r.status in _NOTHING_YET:
            return False
        self._count_get(r.status, len(r.records))
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

    # ------------------------------------------------------------------ offsets
    def _offsets(self, req: protocol.OffsetsRequest) -> bytes:
        dispatched = self.table.get(Slot.DISPATCHED)
        min_phy = self.table.get(Slot.MIN_OFFSET)
        generation = self.table.get(Slot.GENERATION)
        for topic in req.topics:
            _refuse_if(check_topic(topic, internal=True), req.request_id)
        queues = self.reader.topics()
        topics = list(dict.fromkeys(req.topics)) if req.topics else \
            [t for t in queues if check_topic(t) is None]
        found = []
        for topic in topics:
            for queue_id in queues.get(topic, ()):
                lo = self.reader.get_min_offset_in_queue(topic, queue_id, dispatched,
                                                         min_commit_log_offset=min_phy)
                hi = self.reader.get_max_offset_in_queue(topic, queue_id, dispatched)
                at_time = -1
                if req.timestamp_ms >= 0 and req.time_rule == protocol.TIME_NEAREST:
                    at_time = self.reader.get_offset_in_queue_by_time(
                        topic, queue_id, req.timestamp_ms, dispatched,
                        min_commit_log_offset=min_phy)
                elif req.timestamp_ms >= 0:
                    at_time = self.reader.first_offset_stored_since(
                        topic, queue_id, req.timestamp_ms, dispatched,
                        min_commit_log_offset=min_phy)
                found.append(protocol.QueueOffsets(topic, queue_id, lo, hi, at_time))
        return protocol.encode_offsets_reply(req.request_id, dispatched, generation, found)

    # ------------------------------------------------------------------ fetch
    def _fetch(self, req: protocol.FetchRequest) -> bytes:
        """A FETCH_REPLY of the units from ``req.offset`` on and their records, read
        consume queue file after file (``StoreReader.read_queue_records``) until
        ``max_msgs``, ``max_bytes`` or the queue's end, all bounded by one DISPATCHED.
        The records are copied once, from the mapping (``bulk_read.gather_records``),
        not checked: the client checks each against its unit."""
        _refuse_if(check_topic(req.topic, internal=True), req.request_id)
        if req.max_msgs <= 0 or req.max_bytes <= 0:
            _refuse_if(f"max_msgs {req.max_msgs} and max_bytes {req.max_bytes} must be "
                       "positive", req.request_id)
        wanted = subscription_tags(req.subscription)
        max_msgs = min(req.max_msgs, protocol.MAX_FETCH_MSGS)
        max_bytes = min(req.max_bytes, protocol.MAX_FETCH_BYTES)
        dispatched = self.table.get(Slot.DISPATCHED)
        min_phy = self.table.get(Slot.MIN_OFFSET)
        units: list[bytes] = []
        data: list = []
        count = nbytes = 0
        offset = req.offset
        first = last = None
        while count < max_msgs and nbytes < max_bytes:
            r = self.reader.read_queue_records(
                req.topic, req.queue_id, offset, max_msgs - count, max_bytes - nbytes,
                dispatched, min_commit_log_offset=min_phy, at_least_one=nbytes == 0,
                gathered=True)
            first = first or r
            if r.status is not GetMessageStatus.FOUND or r.count == 0:
                break
            if wanted:
                kept_units, kept = keep_tags(r.units, r.data, wanted, codes_are_tags=(
                    req.topic != record.SCHEDULE_TOPIC))
                units.append(kept_units)
                data += kept
            else:
                units.append(r.units)
                data += r.data
            count, nbytes, last = count + r.count, nbytes + r.nbytes, r
            if r.next_begin_offset >= r.max_offset:
                break
            offset = r.next_begin_offset
        answer = last or first
        self._count_get(answer.status, count)
        return protocol.encode_fetch_reply(
            req.request_id, answer.status, answer.next_begin_offset, answer.min_offset,
            answer.max_offset, req.offset, units, data)

    def _count_get(self, status: GetMessageStatus, messages: int) -> None:
        """RocketMQ's getMessageTimesTotalFound / Miss and getMessageTransferedMsgCount."""
        found = status is GetMessageStatus.FOUND and messages > 0
        self.stats.add("get_requests_total", 1, result="found" if found else "miss")
        self.stats.add("get_transferred_messages_total", messages)

    # ------------------------------------------------------------------ commit
    def _commit(self, req: protocol.CommitRequest) -> bytes:
        """Merge a remote group's offsets into consumerOffset.json, all or nothing."""
        rid = req.request_id
        if not TOPIC_PATTERN.fullmatch(req.group):
            _refuse_if(f"group {req.group!r} must match [A-Za-z0-9_%|-]{{1,255}}", rid)
        _refuse_if(check_topic(req.topic, internal=True), rid)
        if req.offsets and not self.reader.queue_ids(req.topic):
            _refuse_if(str(TopicNotExistError(req.topic,
                                              user_topics(self.config.consume_queue_dir))), rid)
        dispatched = self.table.get(Slot.DISPATCHED)
        merged: dict[str, int] = {}
        for queue_id, offset in req.offsets:
            if queue_id < 0 or offset < 0:
                _refuse_if(f"queue {queue_id} offset {offset}: queue ids and offsets are "
                           "not negative", rid)
            if str(queue_id) in merged:
                _refuse_if(f"queue {queue_id} is committed twice", rid)
            max_offset = self.reader.get_max_offset_in_queue(req.topic, queue_id, dispatched)
            if offset > max_offset:
                _refuse_if(f"offset {offset} of {req.topic}/{queue_id} is past the queue's "
                           f"max offset {max_offset}", rid)
            merged[str(queue_id)] = offset
        if merged:
            try:
                update_offsets(self.config.config_dir, f"{req.topic}@{req.group}", merged)
            except OSError as e:
                raise protocol.ProtocolError(protocol.ErrorCode.INTERNAL,
                                             f"consumer offsets not written: {e}", rid) from None
        return protocol.encode_commit_reply(rid, req.offsets)

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


def _refuse_if(reason: str | None, request_id: int) -> None:
    """Raise a BAD_REQUEST ``ProtocolError`` naming ``reason``, when there is one."""
    if reason:
        raise protocol.ProtocolError(protocol.ErrorCode.BAD_REQUEST, reason, request_id)


def _request_id(frame: bytes) -> int:
    try:
        return protocol.peek_header(frame).request_id
    except protocol.ProtocolError:
        return 0


SERVICE = ReaderService
