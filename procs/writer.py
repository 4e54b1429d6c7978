"""The writer process: the CommitLog's single appender, serving the ingest socket.

Producers send SEND frames (``wire.protocol``) from DEALER sockets to the writer's
ROUTER at ``shm.bus.endpoint(store, "ingest")``. Each turn the writer drains every
request waiting (at most ``MAX_BATCH_RECORDS`` records), and for the whole batch, across
requests and clients:

1. refuses every request (SERVICE_NOT_AVAILABLE, with the reason) by the rules of
   ``storage.put_path``: STATE is not RUNNING/STARTING, the store is a SLAVE,
   FLUSH_ERROR is set, DISPATCH_ERROR is set (consume queues or index cannot be
   written: RocketMQ's WRITE_LOGICS_QUEUE_ERROR; puts resume once the dispatcher moves
   DISPATCHED again and clears it), or DISK_FULL is set;
2. refuses a request beyond its client's window (``WINDOW`` unanswered requests per
   client identity): OS_PAGECACHE_BUSY, reason ``"busy"``, nothing stored;
3. a SEND, per message (``storage.put_path.prepare_batch``): ``validation.check_message``,
   for a record with a producer id its sequence (below), the queue (round robin per
   topic when the producer left it to the store), ``CommitLog.prepare``; a
   SEND_RECORDS, in bulk (``storage.record_batch.check_records``: the same rules on the
   bytes, records taken as they are, a delayed or IPv6-born one prepared like a SEND
   message); a refused message gets its status and reason and does not stop the others;
4. one ``CommitLog.append_batch`` for every request's records, the producer table
   learns the identities stored, WRITTEN is published in the table, then the replies
   (columns: ``procs.send_results``) and one bus APPENDED (and PAGES when WRITTEN
   crossed the flusher's least pages). Under ASYNC_FLUSH on an ASYNC_MASTER the
   wake-ups of the dispatcher and flusher go out after the producers' answers, which
   they would otherwise delay on a small machine; under SYNC_FLUSH or on a SYNC_MASTER
   before them, since the answers wait for the flusher (or the HA process) they wake.

Idempotent producers: a record whose request carries a producer id is judged NEW,
DUPLICATE or OUT_OF_ORDER against the producer table and what earlier records of the
same batch claimed (``storage.idempotence``: the verdicts and their answers;
``storage.producer_state``: the table and its rules); only NEW records are stored.
The table is written as ``config/producerState.json`` every
``flush_delay_offset_interval`` ms when it changed (idle producers are expired then)
and at teardown; a failed write is logged and retried, never fatal. A SEND whose
records all carry producer id 0 takes the old path untouched (one ``any`` per request).

Roles (the ROLE slot): on a SYNC_MASTER a reply also waits until SLAVE_ACKED (a slave's
report, ``procs.ha``) covers the record, or ``sync_flush_timeout`` ms: then
FLUSH_SLAVE_TIMEOUT; with no slave connected, or the nearest more than
``ha_slave_fallbehind_max`` bytes behind, SLAVE_NOT_AVAILABLE at once (RocketMQ's
isSlaveOK); the message is stored either way. On a SLAVE every put is refused and the
writer appends its master's CommitLog instead (``procs.replica``).

Invariant: **WRITTEN is published only after the bytes it covers are written; a reply
only after WRITTEN (ASYNC_FLUSH) or FLUSHED (SYNC_FLUSH) covers the record.** Under
SYNC_FLUSH a reply is parked until FLUSHED (re-read from the table every turn; the
flusher's bus FLUSHED only wakes the writer) reaches the end of the request's last
record, or ``sync_flush_timeout`` ms pass: then FLUSH_DISK_TIMEOUT (the message is
stored, never a silent OK). A message sent with ``wait_store_msg_ok=False`` does not
wait (RocketMQ's ``WAIT=false``). A flush error answers parked requests at once with
FLUSH_DISK_TIMEOUT naming it.

Faults: an append that cannot create a file (or raises) answers its records
CREATE_MAPEDFILE_FAILED and publishes nothing partial: WRITTEN covers only whole
records that were acknowledged as stored; after an unexpected exception the writer
cuts the CommitLog back to the published WRITTEN and rebuilds its topic-queue table,
as at a restart (the producer table stays: it learnt nothing from that append). A
frame that is not a SEND this side can take (malformed, truncated, unknown version or
kind, too many records, too large) gets an ERROR frame carrying the request id when it
could be read; a peer that vanished (EHOSTUNREACH under ROUTER_MANDATORY)
is dropped silently; a peer that does not read its replies (send queue full) loses
them, with a warning. Frames larger than ``MAX_SOCKET_MESSAGE`` never reach the writer:
ZeroMQ disconnects the peer instead of buffering them.

Restart decision table (``setup``; the supervisor's recovery ran before the first start):

    what                        rebuilt from                          how
    --------------------------  ------------------------------------  ---------------------------
    CommitLog end               WRITTEN (table)                       CommitLog.reopen_at: load
                                                                      every file, cut at
                                                                      WRITTEN: bytes past it were
                                                                      never acknowledged, a killed
                                                                      writer may have torn a
                                                                      record there
    never-allocated files       the directory                         a short file at or past
                                                                      WRITTEN's that holds no
                                                                      data (a writer died creating
                                                                      it) is unlinked
    topic-queue table           consume queues below DISPATCHED +     topic_queue_table.rebuild
                                CommitLog records [DISPATCHED,
                                WRITTEN)
    producer table (idempotent  config/producerState.json (or its     producer_state.rebuild: a
      producers' last           .bak) + the __PID/__SEQ of CommitLog  snapshot past WRITTEN, or
      sequences)                records [its offset, WRITTEN); no     whose last record is not in
                                usable snapshot: records [min         the CommitLog any more, is
                                offset, WRITTEN)                      deleted and not used; idle
                                                                      producers expire
    last record (the snapshot   the same scan, or the snapshot        written into every snapshot
      fingerprint)
    WRITTEN, LAST_STORE_TS      untouched                             the first append moves them
    round-robin queue choice    nothing                               each topic starts at queue 0
    parked SYNC replies         nothing: lost with the process        the messages are stored;
                                                                      clients time out and retry
    ingest socket               bound again (stale ipc file replaced)  DEALERs reconnect by
                                                                      themselves
    a SLAVE's follower          WRITTEN                               a new socket, HELLO from
                                                                      WRITTEN: bytes of a
                                                                      partial record past it
                                                                      were cut above

Only the last CommitLog file stays mapped after setup: the writer appends, never reads.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import time
from typing import NamedTuple

import numpy as np
import zmq

from rocketstore.wire import curve, endpoints, protocol
from rocketstore.wire.protocol import ErrorCode, ProtocolError
from rocketstore.procs import affinity
from rocketstore.procs.fencing import Fence
from rocketstore.procs.io_thread import IoThreadPolicy, io_thread_ids
from rocketstore.procs.replica import Replica
from rocketstore.procs.send_results import SendResults, SmallResults
from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.procs.stats import count_puts, count_refused, count_reply
from rocketstore.shm import bus
from rocketstore.shm.doorbell import FLUSH, Doorbell
from rocketstore.shm.positions import PUTS_STATES, Slot, StoreState, now_ms
from rocketstore.shm.transient_pool import TransientStorePool, copy_into_files
from rocketstore.shm.zmq_flags import (
    EVENTS, NOBLOCK, POLLIN, RCVMORE, SNDMORE_NOBLOCK, backend)
from rocketstore.storage import producer_state, record_batch, replication
from rocketstore.storage.clock import monotonic_ms
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage.commit_log import Appended, CommitLog, PutMessageResult
from rocketstore.storage.errors import errno_text
from rocketstore.storage.idempotence import BatchClaims, Cover, admission
from rocketstore.storage.producer_state import LastRecord, ProducerStateTable
from rocketstore.storage.put_path import QueueSelector, StoreCondition, prepare_batch, refusal
from rocketstore.storage.record_batch import (
    RecordBatch, RecordsFormatError, check_clean_record, check_clean_run, check_records,
    clean_limits)
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.topic_queue_table import rebuild

log = logging.getLogger(__name__)

WINDOW = 64                      # unanswered requests per client identity
MAX_BATCH_RECORDS = 16384        # records drained into one append (bounds a turn)
ROUTER_SNDHWM = 100_000          # replies queued per peer before they are dropped
MAX_SOCKET_MESSAGE = protocol.MAX_FRAME_BYTES + (1 << 20)
TEARDOWN_LINGER_MS = 2000        # time the last replies get to leave at close
SLOW_APPEND_MS = 500             # RocketMQ warns of a put that holds the lock longer
IO_THREAD_LOOKS = 50             # 10 ms apart: the I/O thread names itself as it starts
# SEND_RECORDS frames of fewer records take the small path: record by record in Python
# costs the writer less than numpy's bulk check below this (measured, the writer's main
# thread a frame, back to back: 20 records 155 µs against 187, 48 271 against 310, 63 312
# against 358; 96 501 against 418)
SMALL_FRAME = 64

_PUT_OK = PutMessageStatus.PUT_OK
_PUT_OK_VALUE = _PUT_OK.value
_SEND_RECORDS = protocol.Kind.SEND_RECORDS


class _Request:
    """A SEND or SEND_RECORDS being answered: where the reply goes, what it says, and
    the records it hands to the append."""

    __slots__ = ("envelope", "client", "kind", "request_id", "results", "batch", "slots",
                 "queue_ids", "wait", "end", "deadline_ms", "received", "needs_slave")

    def __init__(self, envelope: list, kind: protocol.Kind, request_id: int,
                 results: "SendResults | SmallResults", received: float):
        self.envelope = envelope
        self.client = envelope[0]
        self.kind = kind
        self.request_id = request_id
        self.results = results
        self.batch: RecordBatch | None = None   # the records to append, in order
        self.slots: list[int] = []       # batch record k is the request's record slots[k]
        self.queue_ids: list[int] = []   # the queue each batch record goes to
        self.wait = False                # some stored message waits for the flush
        self.end = 0                     # CommitLog end of its last stored record
        self.deadline_ms = 0
        self.needs_slave = False         # parked until SLAVE_ACKED covers ``end`` too
        self.received = received         # the drain's time, for the put latency statistics

    def take_cover(self, cover: Cover) -> None:
        """Answer for duplicates too (``storage.idempotence``): not before the CommitLog
        covers their originals' end, nor before the flush when one of them waits."""
        if cover.end > self.end:
            self.end = cover.end
        self.wait = self.wait or cover.wait


class WriterService(Service):
    name = "writer"
    producers: ProducerStateTable | None = None   # loaded by the first _open_commit_log
    last_record: LastRecord | None = None         # the record that ends at WRITTEN
    pool: TransientStorePool | None = None        # with transient_store_pool_enable
    replica: Replica | None = None                # a SLAVE's follower of its master
    page_cache_busy_ms = 0.0      # the last append's time when it was over the busy limit
    snapshot_written = -1         # the WRITTEN the last producer snapshot covers
    other_cpus = frozenset()      # the CPUs the writer could use but its own (``place``)

    # ================================================================== life
    def place(self) -> None:
        allowed = os.sched_getaffinity(0)
        cpu = affinity.keep_writer(self.config.writer_cpu_affinity, self.config.writer_cpu)
        self.other_cpus = frozenset() if cpu is None else frozenset(allowed - {cpu})

    def setup(self) -> None:
        cfg = self.config
        self.table.end_torn_publish()      # a predecessor killed inside publish_written
        self.sync_flush = cfg.sync_flush
        self.role = BROKER_ROLES[self.table.get(Slot.ROLE)]
        self.sync_master = self.role == "SYNC_MASTER"
        self.snapshot_path = producer_state.snapshot_path(cfg)
        self.next_snapshot_ms = monotonic_ms() + cfg.flush_delay_offset_interval
        pool_size = self.table.get(Slot.TRANSIENT_POOL)
        self.pool = (TransientStorePool(self.store_dir, pool_size, cfg.mapped_file_size_commit_log)
                     if pool_size else None)
        self.commit_log = self._open_commit_log()
        self.small_path = not self.commit_log.store_host_v6 and self.role != "SLAVE"
        # answers that wait for nobody (ASYNC_FLUSH on an ASYNC_MASTER): the one-record lane
        self.one_lane = self.small_path and not (self.sync_flush or self.sync_master)
        self.put_counts: dict[str, list[int]] = {}   # the lane's: topic -> [messages, bytes]
        self.stats.before_snapshot.append(self._add_put_counts)
        self.written, self.last_store_ts = self.table.read_written()   # this process's own
        self.drained_at = time.monotonic()   # when the last drain was taken
        self.queues = QueueSelector(cfg.default_topic_queue_nums)
        self.topic_verdicts: dict = {}   # a topic's bytes -> its name or refusal
        self.clean_limits = clean_limits(cfg)
        self.pages_span = bus.pages_span(cfg.flush_commit_log_least_pages)
        self.parked: collections.deque[_Request] = collections.deque()
        self.unanswered: dict[bytes, int] = {}
        ctx = self.context
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, ROUTER_SNDHWM)
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_SOCKET_MESSAGE)
        self.router.setsockopt(zmq.RCVTIMEO, MAX_TURN_MS)  # the wait of ``_drain(wait=True)``
        # every request and reply goes past pyzmq's Python wrapper (``zmq_flags.backend``)
        raw = backend(self.router)
        self._recv_part, self._send_part, self._option = raw.recv, raw.send, raw.get
        curve.bind_all(self.router, endpoints.bind_addresses(
            self.store_dir, "ingest", cfg.tcp_listen_address, cfg.listen_port),
            self.curve_guard())
        self.publisher = bus.Publisher(ctx, self.store_dir, "writer")
        # the dispatcher's doorbell, when the writer's appends move its confirm offset
        # (else the flusher's FLUSHED or COMMITTED do, and the flusher rings it)
        self.doorbell = Doorbell.open(self.store_dir) \
            if bus.confirm_announcement(self.table)[0] == ["writer"] else None
        self.flush_bell = Doorbell.open(self.store_dir, FLUSH)   # the flusher's
        self.flush_every_append = bus.flusher_wake_topic(
            self.sync_flush, cfg.flush_commit_log_least_pages) == bus.APPENDED
        waits_on = ([("flusher", bus.FLUSHED)] if self.sync_flush else []) + \
            ([("ha", bus.SLAVE_ACKED)] if self.sync_master else [])
        self.parked_wakeups = (bus.Subscriber(ctx, self.store_dir, [p for p, _ in waits_on],
                                           [t for _, t in waits_on]) if waits_on else None)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        if self.parked_wakeups is not None:
            self.poller.register(self.parked_wakeups.socket, zmq.POLLIN)
        if self.role == "SLAVE":
            replication.note_following(cfg.config_dir, self.table.read_written()[0])
        else:
            replication.forget_following(cfg.config_dir)
        self.replica = Replica(self) if self.role == "SLAVE" else None
        # nothing but the ingest socket to wait on (no parked replies, not a slave): a
        # turn waits in the ingest socket's receive, not in a poll before it
        self.ingest_only = self.parked_wakeups is None and self.replica is None
        self.fence = Fence(cfg, self.table, self.role)     # controller mode: the lease
        self.io_policy = IoThreadPolicy(self._io_threads() if cfg.writer_io_batching else [])

    def _io_threads(self) -> list[int]:
        """The context's I/O threads (``procs.io_thread``): started with the first
        socket, named by themselves as they start, so looked for a little while."""
        for _ in range(IO_THREAD_LOOKS):
            found = io_thread_ids()
            if found:
                return found
            time.sleep(0.01)
        log.warning("no ZeroMQ I/O thread found by its name: its scheduling policy "
                    "stays as it is")
        return []

    def _open_commit_log(self) -> CommitLog:
        """Map the CommitLog, cut it at WRITTEN, rebuild the topic-queue table.

        Raises ``StoreFileError`` when the files do not reach WRITTEN, and
        ``CorruptRecordError`` when the bytes below WRITTEN are not whole records.
        """
        cfg = self.config
        written, _ = self.table.read_written()
        dispatched = self.table.get(Slot.DISPATCHED)
        if self.pool is not None:        # what the rebuilds below read must be in the files
            copy_into_files(self.pool, self.table.get(Slot.COMMITTED), written,
                            cfg.commit_log_dir, sync=False)
        cl = CommitLog.reopen_at(cfg, written)
        cl.set_topic_queue_table(rebuild(cfg, cl, min(dispatched, written), written))
        if self.producers is None:  # a cut back after a failed append keeps the table
            loaded = producer_state.rebuild(cfg, cl, written,
                                            max(now_ms(), self.table.read_written()[1]))
            self.producers, self.last_record = loaded.table, loaded.last_record
        cl.unmap_all_but_last()
        if self.pool is not None:
            cl.write_through_pool(self.pool, lambda: self.table.get(Slot.COMMITTED),
                                  cfg.fast_fail_if_no_buffer_in_store_pool)
        cl.start_allocation()
        affinity.free_thread(cl.allocation_thread_id(), self.other_cpus)
        log.info("writer ready at %d (dispatched %d), %d queues", written, dispatched,
                 len(cl.topic_queue_table))
        return cl

    def teardown(self) -> None:
        """Refuse what is still queued, answer every parked request (waiting for FLUSHED
        up to ``sync_flush_timeout``), close."""
        deadline = monotonic_ms() + self.config.sync_flush_timeout
        self._refuse_queued("the writer is stopping")
        while self.parked and monotonic_ms() < deadline and not self.table.get(Slot.FLUSH_ERROR):
            if self.parked_wakeups is not None:
                self.parked_wakeups.wait(min(50, max(0, deadline - monotonic_ms())))
            self._release_parked()
            self._refuse_queued("the writer is stopping")
        self._release_parked(final=True)
        self._snapshot()
        self.router.close(linger=TEARDOWN_LINGER_MS)
        if self.replica is not None:
            self.replica.close()
        self.publisher.close()
        if self.doorbell is not None:
            self.doorbell.close()
        if self.flush_bell is not None:
            self.flush_bell.close()
        if self.parked_wakeups is not None:
            self.parked_wakeups.close()
        self.commit_log.close()

    # ================================================================== the loop
    def turn(self) -> None:
        if self.ingest_only:
            frames = self._drain(wait=True)
            if frames:
                self._serve(frames)
                if self.page_cache_busy_ms:
                    self._serve_waited()
            if monotonic_ms() >= self.next_snapshot_ms:
                self._snapshot()
            return
        timeout = MAX_TURN_MS
        if self.parked:
            timeout = max(0, min(timeout, self.parked[0].deadline_ms - monotonic_ms()))
        events = dict(self.poller.poll(timeout))
        if self.parked_wakeups is not None and self.parked_wakeups.socket in events:
            self.parked_wakeups.wait(0)  # wake-ups only: FLUSHED is read from the table
        if self.router in events:
            self._serve(self._drain())
            if self.page_cache_busy_ms:
                self._serve_waited()
        if self.replica is not None:
            if self.replica.socket in events:
                self.replica.receive()
            self.replica.tick()
        if self.parked:
            self._release_parked()
        if monotonic_ms() >= self.next_snapshot_ms:
            self._snapshot()

    def _snapshot(self) -> None:
        """Expire idle producers; write the producer table when it changed or WRITTEN
        moved, as of the published WRITTEN (every record below it is in the table). The
        next writer walks the CommitLog from the snapshot's offset, every record of the
        last file in Python (a second for every 170 MB of 192-byte records): an old
        snapshot, kept while only plain producers sent, made a restart walk the whole
        last file. A failed write is logged and tried again next time."""
        self.next_snapshot_ms = monotonic_ms() + self.config.flush_delay_offset_interval
        if self.replica is not None:
            return      # a slave takes no puts; a promoted one rebuilds from its CommitLog
        table = self.producers
        table.expire(max(now_ms(), self.last_store_ts))
        written = self.table.read_written()[0]
        if not table.changed and written == self.snapshot_written:
            return
        if written and self.last_record is None:
            if table.changed:
                log.warning("no last record known below WRITTEN %d: producer snapshot "
                            "skipped", written)
            return
        try:
            producer_state.write_snapshot(self.snapshot_path, table, written, self.last_record)
            self.snapshot_written = written
        except OSError as e:
            log.warning("cannot write %s (%d producers): %s", self.snapshot_path, len(table), e)

    def _drain(self, wait: bool = False) -> list[tuple[list, bytes]]:
        """Every request waiting (up to ``MAX_BATCH_RECORDS`` records), as
        ``(envelope, frame, header)``; frames whose header is bad are answered here. With
        ``wait``, the first receive waits for a request up to the socket's RCVTIMEO
        (``MAX_TURN_MS``): one blocking receive costs less than a poll and a receive.
        After the first, the socket's EVENTS says whether another waits (cheaper than a
        receive that fails). The drain sets the I/O thread's policy (``procs.io_thread``)
        before it is served."""
        frames = []
        records = received = 0
        recv, option = self._recv_part, self._option
        flags = 0 if wait else NOBLOCK
        while records < MAX_BATCH_RECORDS:
            if received and not option(EVENTS) & POLLIN:
                break
            try:
                parts = [recv(flags)]
            except zmq.Again:
                break
            # a message's parts arrive together, and the ROUTER's identity part is never
            # the last: the second is taken without asking (each RCVMORE read builds a
            # pyzmq SocketOption enum, about half of its 0.5 us)
            parts.append(recv(NOBLOCK))
            while option(RCVMORE):
                parts.append(recv(NOBLOCK))
            if not received:
                self.drained_at = time.monotonic()
                flags = NOBLOCK
            received += 1
            envelope, frame = parts[:1], parts[-1]
            try:
                if len(parts) != 2:
                    raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"a request is one message "
                                        f"part, this one has {len(parts) - 1}")
                head = protocol.peek_header(frame)
                records += head.count
            except ProtocolError as e:
                self._send(envelope, _error_frame(e, frame))
                continue
            frames.append((envelope, frame, head))
        if frames:      # its replies go out under the policy this sets
            self.io_policy.drained(len(frames), records, self.drained_at)
        return frames

    # ================================================================== requests
    def _serve(self, frames: list[tuple[list, bytes, protocol.Header]]) -> None:
        """One batch: validate and encode every request, one append, then WRITTEN and
        LAST_STORE_TS in the table, the replies and APPENDED (in the order the module
        says). Leading one-record sends take the one-record lane first (``_serve_ones``:
        ASYNC_FLUSH on an ASYNC_MASTER), then a leading run of small requests the small
        path."""
        refusal = self._refusal() or self._page_cache_busy()
        if refusal is None and self.one_lane:
            frames = self._serve_ones(frames)
            if not frames:
                return
        if refusal is None and self.small_path:
            frames = self._serve_small(frames)
            if not frames:
                return
        now = max(now_ms(), self.last_store_ts)
        accepted: list[_Request] = []
        claims: BatchClaims | None = None   # made for the first record with a producer id
        prefix = self.commit_log.msg_id_prefix
        for envelope, frame, head in frames:
            send = self._decode(envelope, frame, head)
            if send is None:
                continue
            req = _Request(envelope, _kind(send), send.request_id,
                           SendResults(_count(send), prefix), self.drained_at)
            if refusal is not None:
                req.results.fill(refusal)
                self._reply(req, counted=False)
                continue
            if self.unanswered.get(req.client, 0) >= WINDOW:
                req.results.fill(PutMessageResult.refused(PutMessageStatus.OS_PAGECACHE_BUSY,
                                                          protocol.BUSY_REASON))
                self._reply(req, counted=False)
                continue
            try:
                if claims is None and _idempotent(send):
                    claims = BatchClaims(self.producers)
                idem = claims if _idempotent(send) else None
                if req.kind is protocol.Kind.SEND_RECORDS:
                    self._prepare_records(req, send, now, idem)
                else:
                    self._prepare(req, send, now, idem)
            except ProtocolError as e:   # records that are not records: the frame is refused
                if claims is not None:
                    claims.drop(req)
                self._send(envelope, _error_frame(e, frame))
                continue
            except Exception as e:  # noqa: BLE001 - a bug must cost one request, not the writer
                log.exception("request %d failed before its append", req.request_id)
                if claims is not None:
                    claims.drop(req)
                self._send(envelope, protocol.encode_error(
                    req.request_id, ErrorCode.INTERNAL, f"the writer failed on this request: "
                    f"{type(e).__name__}: {e}"))
                continue
            self.unanswered[req.client] = self.unanswered.get(req.client, 0) + 1
            accepted.append(req)
        if not accepted:
            return
        began = time.monotonic()
        end = self._append([r for r in accepted if r.batch is not None], now)
        self._note_append_time(time.monotonic() - began)
        if claims is not None:
            for req, cover in claims.settle().items():
                req.take_cover(cover)
        self._answer_drain(accepted, now, end)

    # ================================================================== small requests
    def _serve_small(self, frames: list) -> list:
        """The small path: the leading requests that are SEND_RECORDS frames of fewer
        than ``SMALL_FRAME`` records, without a producer id, whose every record
        ``check_clean_run`` takes as it is (the common one-message send), are appended
        record by record (``CommitLog.append_small``: no RecordBatch, no numpy), and
        answered as one drain: WRITTEN once, the replies, one APPENDED; the statistics,
        the last record and the append's time are taken once for the drain, after the
        replies (a producer waiting one at a time waits for none of it). Returns the
        frames from the first one it does not take, for the batch path, in order (so a
        producer's requests are stored in the order it sent them)."""
        now = max(now_ms(), self.last_store_ts)
        drain = _SmallDrain()
        taken = drain.requests
        began = time.monotonic()
        k = 0
        for k, (envelope, frame, head) in enumerate(frames):
            req = self._append_small(envelope, frame, head, now, drain)
            if req is None:
                break
            taken.append(req)
            if req.results.failed_append:
                k += 1              # the appends before it stand; nothing after it runs
                break
        else:
            k = len(frames)
        if taken:
            appending = time.monotonic() - began
            self._answer_drain(taken, now, drain.end)
            self._note_append_time(appending)     # the bookkeeping after the answers
            if drain.topics:
                self.last_record = LastRecord(drain.last_offset, now)
                count_puts(self.stats, drain.topics, drain.sizes)
            if taken[-1].results.failed_append:   # past the WRITTEN just published lie
                self.reset_to_written()            # the torn bytes of the failure
        return frames[k:]

    def _serve_ones(self, frames: list) -> list:
        """The one-record lane, an ASYNC_FLUSH master's common send (``Producer.send``'s
        frame: one record, no producer id, taken as it is by ``check_clean_record``):
        the leading such frames are appended and answered with no per-request objects,
        as plain tuples (``_OneStored``): WRITTEN once, the PUT_OK answers, one
        APPENDED; the puts are counted per topic aside (``put_counts``), into the
        statistics when they are published. Nothing is ever parked on an
        ASYNC_MASTER under ASYNC_FLUSH, so no client's window is held here. A frame it
        does not take, and every frame after it, go back to ``_serve`` (the small path,
        then the batch path), in order. An append that finds no file or raises is
        answered as the small path answers it (CREATE_MAPEDFILE_FAILED; a raise cuts the
        torn bytes back to WRITTEN), after the requests stored before it."""
        now = max(now_ms(), self.last_store_ts)
        stored: list[_OneStored] = []
        put_counts = self.put_counts
        end = 0
        failed = None           # a request whose append stored nothing
        raised = False
        began = time.monotonic()
        k = 0
        for k, (envelope, frame, head) in enumerate(frames):
            at = protocol.plain_one_record_at(frame) \
                if head.kind is _SEND_RECORDS and head.count == 1 else 0
            one = self._place_one(frame, at, now) if at else None
            if one is None:
                break
            topic, queue_id, _, size, placed, raised = one
            if placed is None:
                failed = self._unstored(envelope, head.request_id, size, queue_id, now, raised)
                k += 1
                break
            stored.append(_OneStored(envelope, head.request_id, queue_id, *placed))
            end = placed[0] + size
            counts = put_counts.get(topic)
            if counts is None:
                counts = put_counts[topic] = [0, 0]
            counts[0] += 1
            counts[1] += size
        else:
            k = len(frames)
        appending = time.monotonic() - began
        if stored:
            self._answer_ones(stored, now, end)
        if failed is not None:
            self._reply(failed, counted=False)   # the lane holds no window
            if raised:
                self.reset_to_written()      # the torn bytes of the failure past WRITTEN
        if stored:
            self._note_append_time(appending)     # the bookkeeping after the answers
            self.last_record = LastRecord(stored[-1].offset, now)
        return frames[k:]

    def _add_put_counts(self) -> None:
        """The lane's puts per topic into the statistics (``count_puts``' counters),
        before each snapshot of them."""
        for topic, (messages, size) in self.put_counts.items():
            self.stats.add("put_messages_total", messages, topic=topic)
            self.stats.add("put_bytes_total", size, topic=topic)
        self.put_counts.clear()

    def _answer_ones(self, stored: list["_OneStored"], now: int, end: int) -> None:
        """WRITTEN at ``end``, then each request's PUT_OK (or, when the store may no
        longer be master, SERVICE_NOT_AVAILABLE: ``_reply_drain``'s rule), then the
        wake-ups."""
        before = self._publish_written_slot(end, now)
        not_master = self.fence.reason()
        host, send = self.commit_log.store_host_bytes, self._send
        reply = protocol.encode_one_send_records_reply
        for envelope, request_id, queue_id, offset, queue_offset in stored:
            if not_master:
                results = SmallResults([_PUT_OK_VALUE], [queue_id], [queue_offset], [offset],
                                       [now], {})
                results.time_out(not_master, PutMessageStatus.SERVICE_NOT_AVAILABLE)
                count_refused(self.stats, results.status)
                frame = results.reply(_SEND_RECORDS, request_id, host)
            else:
                frame = reply(request_id, host, _PUT_OK_VALUE, queue_id, queue_offset,
                              offset, now)
            send(envelope, frame)
        self.stats.observe("put_latency_seconds", time.monotonic() - self.drained_at,
                           len(stored))
        self._after_append(before, end)

    def _unstored(self, envelope: list, request_id: int, size: int, queue_id: int,
                  now: int, raised: bool) -> _Request:
        """The request of one record whose append stored nothing: no file could be
        made or reserved, or the append raised (``append_failure`` says why)."""
        return _Request(envelope, _SEND_RECORDS, request_id,
                        SmallResults.stored(None if raised else Appended(0, [], []), [size],
                                            [queue_id], now, self.commit_log.append_failure),
                        self.drained_at)

    def _append_small(self, envelope: list, frame: bytes, head: protocol.Header,
                      now: int, drain: "_SmallDrain") -> "_Request | None":
        """Append one small request's records and return it with its results (what it
        stored noted in ``drain``); None, with nothing done, when it is not one for the
        small path."""
        client = envelope[0]
        if head.kind is not _SEND_RECORDS or not 0 < head.count < SMALL_FRAME \
                or self.unanswered.get(client, 0) >= WINDOW:
            return None
        if head.count == 1:
            at = protocol.plain_one_record_at(frame)
            if at:
                return self._append_one(envelope, frame, head.request_id, at, now, drain)
        try:
            send = protocol.decode_small_send_records(frame, head)
        except ProtocolError:
            return None         # the batch path answers it with its ERROR
        if send.producer_id:
            return None
        run = check_clean_run(send.records, send.offsets, self.config,
                              verdicts=self.topic_verdicts)
        if run is None:
            return None
        sizes = run.sizes
        queue_ids = self.queues.choose(run.topics, run.queue_ids)
        try:
            done = self.commit_log.append_small(send.records, run.starts, sizes,
                                                run.topics, queue_ids, run.consumable, now)
        except Exception:  # noqa: BLE001 - whatever it was, the request is refused whole
            log.exception("append of %d records failed; cutting back to WRITTEN once the "
                          "drain's earlier requests are answered", len(sizes))
            done = None         # _serve_small cuts back after publishing the others
        req = _Request(envelope, _SEND_RECORDS, send.request_id,
                       SmallResults.stored(done, sizes, queue_ids, now,
                                           self.commit_log.append_failure),
                       self.drained_at)
        count = done.count if done is not None else 0
        if count:
            last = done.physical_offsets[count - 1]
            req.end = drain.end = last + sizes[count - 1]
            req.wait = any(run.waits[:count])
            drain.last_offset = last
            if count == len(sizes):
                drain.topics += run.topics
                drain.sizes += sizes
            else:
                drain.topics += run.topics[:count]
                drain.sizes += sizes[:count]
        self.unanswered[client] = self.unanswered.get(client, 0) + 1
        return req

    def _append_one(self, envelope: list, frame: bytes, request_id: int, at: int, now: int,
                    drain: "_SmallDrain") -> "_Request | None":
        """``_append_small`` of a frame of one record without a producer id, the record
        at ``at`` (``Producer.send``'s frame): judged and appended where it lies in the
        frame, with no lists of one."""
        one = self._place_one(frame, at, now)
        if one is None:
            return None
        topic, queue_id, wait, size, placed, raised = one
        if placed is None:
            req = self._unstored(envelope, request_id, size, queue_id, now, raised)
        else:
            phy, queue_offset = placed
            req = _Request(envelope, _SEND_RECORDS, request_id,
                           SmallResults([_PUT_OK_VALUE], [queue_id], [queue_offset], [phy],
                                        [now], {}),
                           self.drained_at)
            req.end = drain.end = phy + size
            req.wait = wait
            drain.last_offset = phy
            drain.topics.append(topic)
            drain.sizes.append(size)
        client = envelope[0]
        self.unanswered[client] = self.unanswered.get(client, 0) + 1
        return req

    def _place_one(self, frame: bytes, at: int, now: int) -> tuple | None:
        """Judge the one record at ``at`` (``check_clean_record``) and append it where
        it lies in ``frame``: ``(topic, queue id, wait, size, (CommitLog offset, queue
        offset) or None when nothing was stored, whether the append raised)``; None,
        with nothing done, for a record the small paths do not take as it is."""
        taken = check_clean_record(frame, at, len(frame), self.clean_limits, self.topic_verdicts)
        if taken is None:
            return None
        topic, queue_id, consumable, wait = taken
        if queue_id < 0:
            queue_id = self.queues.next_queue(topic)
        size = len(frame) - at
        try:
            placed = self.commit_log.append_one(frame, at, size, topic, queue_id, consumable,
                                                now)
        except Exception:  # noqa: BLE001 - whatever it was, the request is refused whole
            log.exception("append of one record failed; cutting back to WRITTEN once the "
                          "drain's earlier requests are answered")
            return topic, queue_id, wait, size, None, True
        return topic, queue_id, wait, size, placed, False

    def _answer_drain(self, accepted: list[_Request], now: int, end: int) -> None:
        """WRITTEN (``end``: the end of the last record this drain appended, 0 for none)
        once for every request of the drain, then the answers and the wake-ups, in the
        order the module says."""
        if not end:
            self._answer(accepted)
            return
        before = self._publish_written_slot(end, now)
        answers_wait = self.sync_flush or self.sync_master   # on the flusher or HA
        if answers_wait:
            self._after_append(before, end)
        self._answer(accepted)
        if not answers_wait:
            self._after_append(before, end)

    def publish_written(self, end: int, store_ts: int) -> None:
        """WRITTEN and LAST_STORE_TS (the table's ``publish_written``: the writer
        process only), then APPENDED, and PAGES when WRITTEN crossed the flusher's least
        pages."""
        self._after_append(self._publish_written_slot(end, store_ts), end)

    def _publish_written_slot(self, end: int, store_ts: int) -> int:
        """WRITTEN and LAST_STORE_TS in the table; returns the WRITTEN before (the
        writer's own copy: no other process stores it)."""
        written = self.written
        self.table.publish_written(end, store_ts)
        self.written, self.last_store_ts = end, store_ts
        return written

    def _after_append(self, before: int, end: int) -> None:
        """The wake-ups of an append that moved WRITTEN from ``before`` to ``end``: the
        bus's APPENDED, and PAGES when it crossed the flusher's least pages; the
        dispatcher's doorbell, and the flusher's where it listens for this append
        (``shm.doorbell``). Then the mappings of full files dropped."""
        self.publisher.publish(bus.APPENDED, bus.encode_offset(end))
        if self.doorbell is not None:
            self.doorbell.ring()
        crossed = bool(self.pages_span) and \
            end // self.pages_span != before // self.pages_span
        if crossed:
            self.publisher.publish(bus.PAGES, bus.encode_offset(end))
        if self.flush_bell is not None and (crossed or self.flush_every_append):
            self.flush_bell.ring()
        self.commit_log.unmap_all_but_last()

    def _note_append_time(self, seconds: float) -> None:
        """RocketMQ's slow-put warning, and its isOSPageCacheBusy: an append that held the
        CommitLog longer than ``os_page_cache_busy_time_out_mills`` makes the requests
        that waited behind it refused (``_serve_waited``)."""
        ms = seconds * 1000
        if ms > SLOW_APPEND_MS:
            log.warning("putMessage in lock cost time(ms)=%d", ms)
        if ms > self.config.os_page_cache_busy_time_out_mills:
            self.page_cache_busy_ms = ms      # armed once this turn's replies are out

    def _serve_waited(self) -> None:
        """Right after a too slow append: the requests queued behind it while it ran
        (up to a batch, drained at once) are refused by ``_page_cache_busy``; a request
        that comes after is served as usual. What waited is what the socket holds then,
        not what comes within some time: on a busy machine the writer's next turn may
        come late, and the requests that waited would then have been stored."""
        frames = self._drain()
        if frames:
            self._serve(frames)
        self.page_cache_busy_ms = 0

    def _page_cache_busy(self) -> PutMessageResult | None:
        """The refusal of every request that waited behind a too slow append
        (``_serve_waited``; RocketMQ's BrokerFastFailure PCBUSY_CLEAN_QUEUE): they waited
        on a busy page cache; their producers may send again (elsewhere)."""
        if not self.page_cache_busy_ms:
            return None
        ms, self.page_cache_busy_ms = self.page_cache_busy_ms, 0
        return PutMessageResult.refused(
            PutMessageStatus.OS_PAGECACHE_BUSY,
            f"[PCBUSY_CLEAN_QUEUE] broker busy: the last append held the commitlog for "
            f"{ms:.0f} ms (os_page_cache_busy_time_out_mills "
            f"{self.config.os_page_cache_busy_time_out_mills})")

    def _prepare(self, req: _Request, send: protocol.SendRequest, now: int,
                 claims: "BatchClaims | None") -> None:
        """Validate and encode each message of a SEND (``storage.put_path.prepare_batch``);
        refusals go straight into its results. With ``claims``, a record with a producer
        id is judged first, and stored with its identity in its properties only when
        NEW."""
        admit = encoded = None
        if claims is not None:
            admit, encoded = admission(req, req.results, send.producer_ids, send.sequences,
                                       claims)
        prepared = prepare_batch(self.commit_log, self.config, send.messages, now,
                                 self.queues, req.results, None, admit, encoded)
        req.wait = prepared.wait
        if prepared.records:
            req.batch = RecordBatch.from_encoded(prepared.records)
            req.slots = prepared.slots
            req.queue_ids = [e.queue_id for e in prepared.records]

    def _prepare_records(self, req: _Request, send: protocol.SendRecords, now: int,
                         claims: "BatchClaims | None") -> None:
        """Check a SEND_RECORDS frame's records in bulk (``record_batch.check_records``),
        choose queues, judge idempotent records, and take the records as they are; a
        record the check sends the long way is prepared like a SEND record."""
        try:
            checked = check_records(send.records, send.offsets, self.config,
                                    store_host_v6=self.commit_log.store_host_v6,
                                    producer_id=send.producer_id,
                                    first_sequence=send.first_sequence,
                                    topic_verdicts=self.topic_verdicts)
        except RecordsFormatError as e:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"SEND_RECORDS {e}",
                                send.request_id) from None
        if not checked.count:
            return      # nothing to store: an empty reply, as to a SEND of no message
        results = req.results
        for i, (status, reason) in checked.refusals.items():
            results[i] = PutMessageResult.refused(status, reason)
        admit = encoded = None
        if claims is not None:
            n = checked.count
            admit, encoded = admission(
                req, req.results, [send.producer_id] * n,
                range(send.first_sequence, send.first_sequence + n), claims, checked.waits)
        if not checked.refusals and not checked.long_way and admit is None:
            self._take_all(req, send, checked)
        else:
            self._take_some(req, send, checked, now, admit, encoded)

    def _take_all(self, req: _Request, send: protocol.SendRecords, checked) -> None:
        """Every record of the frame, as it is: one copy, queues chosen in bulk."""
        queue_ids = self.queues.choose(checked.topics, checked.queue_ids)
        req.batch = record_batch.from_checked(send.records, checked, queue_ids)
        req.slots = list(range(checked.count))
        req.queue_ids = queue_ids
        req.wait = any(checked.waits)

    def _take_some(self, req: _Request, send: protocol.SendRecords, checked, now: int,
                   admit, encoded) -> None:
        """The records not refused, judged and numbered one by one."""
        mv, starts, sizes = send.records, checked.starts.tolist(), checked.sizes.tolist()
        pieces, slots = [], []
        wait = False
        for i in range(checked.count):
            if i in checked.refusals:
                continue
            msg = checked.long_way.get(i)
            if msg is not None:
                one = prepare_batch(self.commit_log, self.config, [msg], now, self.queues,
                                    _Slot(req.results, i), None,
                                    None if admit is None else (lambda _, m, i=i: admit(i, m)))
                if not one.records:
                    continue
                e = one.records[0]
                pieces.append((e.data, e.topic, e.queue_id, e.real_queue_id, e.consumable,
                               e.store_timestamp_pos, False))
                wait = wait or one.wait
            else:
                if admit is not None and not admit(i, None):
                    continue
                topic, queue_id = checked.topics[i], checked.queue_ids[i]
                if queue_id < 0:
                    queue_id = self.queues.next_queue(topic)
                pieces.append((mv[starts[i]:starts[i] + sizes[i]], topic, queue_id, queue_id,
                               checked.consumable[i], record_batch.STORETIMESTAMP_POS, True))
                wait = wait or checked.waits[i]
            slots.append(i)
            if encoded is not None:
                encoded(i)
        req.wait = wait
        if pieces:
            req.batch = record_batch.from_pieces(pieces)
            req.slots = slots
            req.queue_ids = req.batch.queue_ids

    def _append(self, requests: list[_Request], now: int) -> int:
        """One append of every request's records, in order; fill each request's
        results. Returns the end of the last record stored (0 when none was)."""
        if not requests:
            return 0
        batch = RecordBatch.concat([r.batch for r in requests])
        queue_ids = [q for r in requests for q in r.queue_ids]
        try:
            done = self.commit_log.append_batch(batch, queue_ids, now)
            count = done.count
        except Exception:  # noqa: BLE001 - whatever it was, the batch is refused whole
            log.exception("append of %d records failed; cutting back to WRITTEN", len(batch))
            self.reset_to_written()
            done, count = None, 0
        k, end = 0, 0
        reason = self.commit_log.append_failure()
        for req in requests:
            m = len(req.batch)
            stored = max(0, min(count - k, m))
            slots = np.asarray(req.slots, np.int64)
            if stored:
                offsets = done.physical_offsets[k:k + stored]
                sizes = batch.sizes[k:k + stored]
                req.results.stored(slots[:stored], offsets, sizes,
                                   req.batch.real_queue_ids[:stored],
                                   done.queue_offsets[k:k + stored], now)
                req.end = int(offsets[-1] + sizes[-1])
                end = max(end, req.end)
            if stored < m:
                req.results.refuse(slots[stored:], PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                   reason)
            k += m
        if count:
            self.last_record = LastRecord(int(done.physical_offsets[count - 1]), now)
            count_puts(self.stats, batch.topics[:count], batch.sizes[:count])
        return end

    def reset_to_written(self) -> None:
        """After an append raised (or a slave's session restarts): forget everything
        past the published WRITTEN."""
        self.commit_log.close()
        self.commit_log = self._open_commit_log()

    def _answer(self, accepted: list[_Request]) -> None:
        """Reply now (ASYNC_FLUSH on an ASYNC_MASTER, or nothing waits) or park until
        FLUSHED (SYNC_FLUSH) and SLAVE_ACKED (SYNC_MASTER) cover it. On a SYNC_MASTER
        whose slave is not OK (RocketMQ's isSlaveOK: none connected, or more than
        ``ha_slave_fallbehind_max`` bytes behind) the answer is SLAVE_NOT_AVAILABLE at
        once, after the flush under SYNC_FLUSH."""
        if not (self.sync_flush or self.sync_master):
            self._reply_drain(accepted)
            return
        deadline = monotonic_ms() + self.config.sync_flush_timeout
        slave_ok = not self.sync_master or self._slave_ok(max(r.end for r in accepted))
        for req in accepted:
            if not (req.wait and req.end):
                self._reply(req)
                continue
            if not slave_ok:
                req.results.time_out(self._slave_not_ok_reason(),
                                     PutMessageStatus.SLAVE_NOT_AVAILABLE)
            if self.sync_flush or (self.sync_master and slave_ok):
                req.deadline_ms = deadline
                req.needs_slave = self.sync_master and slave_ok
                self.parked.append(req)
            else:
                self._reply(req)

    def _slave_ok(self, put_where: int) -> bool:
        table = self.table
        return bool(table.get(Slot.SLAVES)) and \
            put_where - table.get(Slot.SLAVE_ACKED) < self.config.ha_slave_fallbehind_max

    def _slave_not_ok_reason(self) -> str:
        if not self.table.get(Slot.SLAVES):
            return "SYNC_MASTER: no slave is connected"
        return (f"SYNC_MASTER: the slave is more than ha_slave_fallbehind_max "
                f"{self.config.ha_slave_fallbehind_max} bytes behind")

    def _release_parked(self, final: bool = False) -> None:
        """Answer parked requests FLUSHED now covers; time out the expired ones (all of
        them when ``final``). Ends and deadlines grow along the queue."""
        table = self.table
        flushed = table.get(Slot.FLUSHED) if self.sync_flush else 1 << 62
        acked = table.get(Slot.SLAVE_ACKED) if self.sync_master else 1 << 62
        flush_error = table.get(Slot.FLUSH_ERROR)
        now = monotonic_ms()
        parked = self.parked
        while parked:
            req = parked[0]
            on_disk = req.end <= flushed
            on_slave = not req.needs_slave or req.end <= acked
            if on_disk and on_slave:
                pass
            elif flush_error and not on_disk:
                _time_out(req, f"commitlog flush failed: {errno_text(flush_error)}")
            elif final or req.deadline_ms <= now:
                if not on_slave:     # RocketMQ: a replica failure overwrites a flush failure
                    req.results.time_out(f"not stored by a slave within sync_flush_timeout "
                                         f"{self.config.sync_flush_timeout} ms",
                                         PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
                else:
                    _time_out(req, f"not flushed within sync_flush_timeout "
                                   f"{self.config.sync_flush_timeout} ms")
            else:
                break
            parked.popleft()
            self._reply(req)

    def _decode(self, envelope: list, frame: bytes, head: protocol.Header):
        """The SEND or SEND_RECORDS request in ``frame``; None after answering a bad
        frame with ERROR."""
        try:
            if head.kind is protocol.Kind.SEND_RECORDS:
                return protocol.decode_send_records(frame)
            return protocol.decode_send(frame)
        except ProtocolError as e:
            self._send(envelope, _error_frame(e, frame))
            return None

    def _refuse_queued(self, reason: str) -> None:
        """Answer every request still queued on the socket with SERVICE_NOT_AVAILABLE."""
        refusal = PutMessageResult.refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason)
        for envelope, frame, head in self._drain():
            send = self._decode(envelope, frame, head)
            if send is None:
                continue
            req = _Request(envelope, _kind(send), send.request_id,
                           SendResults(_count(send), self.commit_log.msg_id_prefix),
                           self.drained_at)
            req.results.fill(refusal)
            self._reply(req, counted=False)

    def _refusal(self) -> PutMessageResult | None:
        """The answer every put gets now, when the store does not take puts
        (``storage.put_path``'s rules over the position table)."""
        not_master = self.fence.reason()
        if not_master:
            return PutMessageResult.refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, not_master)
        table = self.table
        if table.puts_clear() and self.role != "SLAVE":
            return None     # puts are taken (every cause below clear)
        flush_error = table.get(Slot.FLUSH_ERROR)
        dispatch_error = table.get(Slot.DISPATCH_ERROR)
        state = table.get(Slot.STATE)
        return refusal(StoreCondition(
            not_running=None if state in PUTS_STATES else _state_name(state),
            slave=self.role == "SLAVE",
            flush_error=errno_text(flush_error) if flush_error else None,
            logics_error=(f"the dispatcher waits for disk space ({errno_text(dispatch_error)})"
                          if dispatch_error in (errno.ENOSPC, errno.EDQUOT) else
                          f"the dispatcher stopped on {errno_text(dispatch_error)}")
            if dispatch_error else None,
            disk_full=bool(table.get(Slot.DISK_FULL))))

    # ================================================================== replies
    def _reply(self, req: _Request, counted: bool = True) -> None:
        if counted:
            self._answered(req.client)
        not_master = self.fence.reason()
        if not_master:      # no PUT_OK from a store that may no longer be master
            req.results.time_out(not_master, PutMessageStatus.SERVICE_NOT_AVAILABLE)
        self._send(req.envelope, req.results.reply(req.kind, req.request_id,
                                                   self.commit_log.store_host_bytes))
        count_reply(self.stats, req.results.status, time.monotonic() - req.received)

    def _reply_drain(self, accepted: list[_Request]) -> None:
        """Answer every request of one drain now; their latencies (one drain: one
        receive time) are counted once."""
        host, send, stats = self.commit_log.store_host_bytes, self._send, self.stats
        not_master = self.fence.reason()    # no PUT_OK from a store that may not be master
        for req in accepted:
            self._answered(req.client)
            results = req.results
            if not_master:
                results.time_out(not_master, PutMessageStatus.SERVICE_NOT_AVAILABLE)
            send(req.envelope, results.reply(req.kind, req.request_id, host))
            count_refused(stats, results.status)
        stats.observe("put_latency_seconds", time.monotonic() - accepted[0].received,
                      len(accepted))

    def _answered(self, client: bytes) -> None:
        """One request of ``client`` less in its window."""
        unanswered = self.unanswered
        n = unanswered.get(client, 0) - 1
        if n > 0:
            unanswered[client] = n
        else:
            unanswered.pop(client, None)

    def _send(self, envelope: list, payload: bytes) -> None:
        """The reply's two parts (``send_multipart``'s two sends, without its checks)."""
        send = self._send_part
        try:
            send(envelope[0], SNDMORE_NOBLOCK)
            send(payload, NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return  # the peer is gone; so is its interest in the answer
            if e.errno == zmq.EAGAIN:
                log.warning("client %s does not read its replies: one dropped",
                            envelope[0].hex())
                return
            raise


def _state_name(state: int) -> str:
    return StoreState(state).name if state in StoreState._value2member_map_ else str(state)


def _error_frame(e: ProtocolError, frame: bytes) -> bytes:
    """The ERROR answer to a frame, with its request id whenever its header has one
    (``peek_header`` leaves it out of FRAME_TOO_LARGE)."""
    request_id = e.request_id
    if not request_id and len(frame) >= protocol.HEADER_SIZE and frame[:2] == protocol.MAGIC:
        request_id = protocol.HEADER.unpack_from(frame, 0)[3]
    return protocol.encode_error(request_id, e.code, e.detail)


def _time_out(req: _Request, reason: str) -> None:
    """Every PUT_OK of ``req`` (stored records and duplicates of stored ones) becomes
    FLUSH_DISK_TIMEOUT."""
    req.results.time_out(reason)


def _kind(send) -> protocol.Kind:
    return protocol.Kind.SEND_RECORDS if type(send) is protocol.SendRecords else protocol.Kind.SEND


def _count(send) -> int:
    return len(send.offsets) if type(send) is protocol.SendRecords else len(send.messages)


def _idempotent(send) -> bool:
    if type(send) is protocol.SendRecords:
        return send.producer_id != 0
    return any(send.producer_ids)


class _OneStored(NamedTuple):
    """A request of the one-record lane, stored: where its answer goes and what it
    says."""

    envelope: list
    request_id: int
    queue_id: int
    offset: int              # the record's CommitLog offset
    queue_offset: int


class _SmallDrain:
    """What one drain's small path stored: its requests, the topic and size of each
    record, where the last one starts and ends (for the statistics, the producer
    snapshot's last record and WRITTEN, each taken once a drain)."""

    __slots__ = ("requests", "topics", "sizes", "last_offset", "end")

    def __init__(self):
        self.requests: list[_Request] = []
        self.topics: list[str] = []
        self.sizes: list[int] = []
        self.last_offset = 0
        self.end = 0            # 0: nothing stored


class _Slot:
    """One result of a request, seen as the results list of a one-message batch."""

    __slots__ = ("results", "i")

    def __init__(self, results: SendResults, i: int):
        self.results, self.i = results, i

    def __setitem__(self, _: int, r: PutMessageResult) -> None:
        self.results[self.i] = r


SERVICE = WriterService
