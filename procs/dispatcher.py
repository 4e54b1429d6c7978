"""The dispatcher: RocketMQ's ReputMessageService in its own process.

It tails the CommitLog the writer appends to (mapped read-only) up to the confirm offset
(FLUSHED under SYNC_FLUSH, WRITTEN under ASYNC_FLUSH: a consumer never sees a message a
crash could take back), and builds from every record its consume-queue unit and its
index entries with ``storage.reput.ReputMessageService``. It is the only writer of
``consumequeue/``, ``index/`` and the checkpoint's logics and index times, and of the
DISPATCHED and DISPATCH_ERROR slots.

One turn is passes for up to ``TURN_MS`` (10 ms) from the first that dispatched, so
the loop's heartbeat, statistics and stop check come at most every 10 ms while
messages flow, not once a pass; the statistics of the turn's passes are counted once at
its end. One pass:

1. wait on the bus up to MAX_TURN_MS (the first pass of a turn; later ones only as long
   as the turn has left), unless work is already waiting. The dispatcher listens only
   to what moves the confirm offset: the writer's appends under ASYNC_FLUSH, the
   flusher's FLUSHED under SYNC_FLUSH, its COMMITTED with the transient pool. The one
   that moves it rings the dispatcher's doorbell (``shm.doorbell``: a semaphore, which
   costs neither side a ZeroMQ hop); where no supervisor made one, the dispatcher
   listens to that process's bus announcement instead. Wake-ups only wake; the
   position table is the truth.
   A pass woken less than ``REPUT_INTERVAL_S`` (1 ms) after the last one that
   dispatched, with less than ``PACE_MAX_BYTES`` (4 KiB: a few one-message sends)
   waiting, waits out the rest first, so a trickle of one-message sends is dispatched a few records a pass, not a
   pass per record (``_pace``). Once a wake came that soon, the next pass does not wait
   on the bus at all: it sleeps out the interval and reads the table; only when that
   finds nothing does it wait on the bus again (``_trickle``). The doorbell holds at
   most one pending wake-up, the subscription only the newest (ZMQ_CONFLATE), so none
   pile up meanwhile and none is received one by one. A message sent after a quiet spell, while dispatch is behind
   (no wait at all), or with ``PACE_MAX_BYTES`` or more waiting (a frame of many
   messages, which a pass per frame costs little, or frames that came close together
   because their producer was held up: pacing them added up to the interval to the
   very frames that were already late, 5-11 % of the frames of 20 at 4,000 messages a
   second on a busy machine), is dispatched at once;
2. follow MIN_OFFSET: unmap CommitLog, consume-queue and index files wholly below it
   (the cleaner unlinks them; an unlinked file's disk space comes back only when the
   last mapping goes);
3. dispatch everything written since the last pass, towards ``confirm_offset()``, in
   chunks that end on a record boundary (at most ``CHUNK_RECORDS`` records, never
   across a file), for at most ``DISPATCH_BUDGET_MS``; after each chunk publish
   DISPATCHED (every unit and index entry below it is in its mapped file), then
   announce DISPATCHED and one ARRIVAL per topic that grew, with each of its queues that
   grew and that queue's next offset, and ring those topics' arrival bells (``shm.
   arrival_bell``: local consumers wake without a ZeroMQ hop); a run of a few records
   is parsed with ``struct`` alone (``storage.reput``'s small path), a long one with
   numpy;
4. raise what the flush thread failed with, if it did (below).

The flushes run on a thread of their own, RocketMQ's FlushConsumeQueueService
(``FlushConsumeQueueService`` here): every ``flush_interval_consume_queue`` ms the
consume queues with ``flush_consume_queue_least_pages``; every
``flush_consume_queue_thorough_interval`` ms everything: each queue until nothing is
left, the index, and only then the checkpoint's logics and index times (``flush_one``),
with the logics time read *before* the queues were flushed, so the checkpoint never
promises more than the disk holds (``storage.logic_queues``, the timing and the flush
the embedded store uses too). The index is flushed only on the thorough pass (and when
a file fills): its durability matters only through the checkpoint's index time, which
only that pass moves. An fdatasync takes milliseconds (eight queues' least-pages pass
took 1.5-3.6 ms here), and ``os.fdatasync`` lets the interpreter go meanwhile, so on
its own thread a flush no longer holds up the dispatch of what arrives during it.
What the thread shares with the dispatch loop: the files (the loop only appends to
them, and the thread flushes below a position it read; unmapping expired files, the
one change under it, takes the thread's lock), the queue table (the thread flushes a
snapshot of it), the logics time (read once) and the dirty flag (cleared before a
thorough flush, so a dispatch during it is flushed next time). At teardown the thread
stops first, then the last flush runs in the loop's thread.

A new topic's queues get their first files inline with dispatch, and every topic's
dispatch waits meanwhile, so a creation waits for nothing it need not: the directory
fsyncs it owes are paid by the next thorough flush, before the checkpoint's logics time
can cover the file (``storage.dir_sync``; a restarted dispatcher owes those of every
queue it finds), and a fresh file faults in a page at a time instead of reading 8 MiB
around its first write (``MappedFile.advise_random``). Measured with another topic
loaded (50-message frames every 5 ms): a new topic's first frame of eight queues was
dispatched 19-20 ms after its acknowledgement (median; at most 37-42 ms) before
either, 3-7 ms after (at most 11-13 ms); a frame of a known topic 0.3 ms. What is left
is the ``mkdir`` and ``open`` of each queue, slow on a busy journal.

A record below the confirm offset that cannot be read is damage on disk: DISPATCH_ERROR
is set (EBADMSG), the error is logged, and the process exits non-zero so the supervisor
restarts it; it never skips data. A failed fdatasync, or a file it cannot create for
another reason, stops it the same way, with the errno in DISPATCH_ERROR. A full disk
(ENOSPC, EDQUOT: a consume-queue or index file that cannot be made) does not: exiting
would only crash-loop the dispatcher until the supervisor stops the store. It sets
DISPATCH_ERROR (the writer refuses puts meanwhile), says so once, keeps following
MIN_OFFSET (an expired file's space comes back only once its last mapping goes) and
tries again every ``SPACE_RETRY_MS``; dispatch is idempotent, so the retry redoes
nothing twice. DISPATCH_ERROR is cleared once DISPATCHED moves again.

Restart decision table (``setup``; after a SIGKILL at any instant, or a clean stop):

    what               rebuilt on start from                   how
    -----------------  --------------------------------------  ---------------------------
    reput_from_offset  the DISPATCHED slot                     as is
    CommitLog view     the commitlog files on disk             mapped read-only from the
                                                               first; files the writer is
                                                               still allocating are mapped
                                                               when complete (``refresh``)
    a consume queue    its files on disk                       a zero-length last file (a
                                                               creation the kill cut short)
                                                               is allocated; ``recover``
                                                               cuts a tail unit a kill tore
                                                               (offset or size invalid);
                                                               then the write position is
                                                               rewound to the first unit
                                                               whose message starts at or
                                                               past DISPATCHED (files past
                                                               it closed, kept on disk)
    the index          its files on disk, all kept (process    re-dispatch skips messages
                       death loses no page-cache byte)         below the last file's
                                                               endPhyOffset
    the checkpoint     its file (logics and index times)       only ever raised after a
                                                               full flush
    DISPATCH_ERROR     the slot                                kept until DISPATCHED moves
    MIN_OFFSET follow  nothing (first turn)                    files below it unmapped

Why re-dispatch after a SIGKILL at any instant neither loses nor duplicates a unit:

* Not lost: DISPATCHED is published only after ``do_reput`` has copied every unit and
  index entry below it into the mapped files; a killed process's mapped writes stay in
  the page cache, so everything below DISPATCHED is there for the successor, which
  re-dispatches every record from DISPATCHED to the (monotonic) confirm offset.
* Not duplicated, not torn: a unit's place is fixed by its record (unit n at byte
  n * 20, n the record's QUEUEOFFSET), not by a counter. The predecessor can only have
  written units for records in [DISPATCHED, its confirm offset]; the rewind
  (``ConsumeQueue.rewind_to``) moves each queue's write position back to the first of
  those, so re-dispatch writes each of them again, byte for byte, over itself (which also heals a unit the kill tore in its tag
  code, which ``recover`` cannot see), and ``put_message_position_info`` skips every
  record below DISPATCHED as a repeat (its end <= the queue's ``max_physic_offset``).
  Nothing is zeroed, truncated or unlinked: consumers may map these files, and only
  read units whose message ends at or below DISPATCHED, which the rewind never touches.
* The index keeps what the predecessor wrote past DISPATCHED: an IndexFile writes the
  entry, then the header, then the slot, so every entry below indexCount is whole, and
  ``build_index`` skips messages below the last file's endPhyOffset. The message at
  endPhyOffset is indexed again (as in RocketMQ), which also re-links the one entry a
  kill between header and slot can leave unlinked (it is that message's); a query may
  see its offset twice and drops the duplicate; every hit is verified against the
  CommitLog.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Callable

from rocketstore.procs.service import MAX_TURN_MS, TURN_MS, Service
from rocketstore.shm.bus import (
    DISPATCHED, Publisher, Subscriber, arrival_topic, confirm_announcement, encode_arrival,
    encode_offset)
from rocketstore.shm.arrival_bell import ArrivalBells
from rocketstore.shm.doorbell import Doorbell
from rocketstore.shm.positions import Slot
from rocketstore.storage.clock import now_ms
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.logic_queues import LogicQueues
from rocketstore.storage.errors import CorruptRecordError, StoreError
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.dispatch_batch import walk
from rocketstore.storage.record import BLANK_MAGIC_CODE, HEAD, SIZE_MAGIC
from rocketstore.storage.reput import ReputMessageService

log = logging.getLogger(__name__)

CHUNK_RECORDS = 2048              # records per dispatch pass between two publications
DISPATCH_BUDGET_MS = MAX_TURN_MS * 3 // 4
STALL_WAIT_MS = 5                 # behind, but the next bytes are not whole yet
REPUT_INTERVAL_S = 0.001          # a woken pass starts at least this long after the last
PACE_MAX_BYTES = 4096             # ... when less than this is waiting (a trickle)
SPACE_RETRY_MS = 1000             # a full disk: dispatch is tried again this often
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
FLUSH_TICK_MIN_S = 0.005          # the flush thread's shortest wait (an interval of 0)


def flush_tick_s(interval_ms: int) -> float:
    """How often the flush thread looks at the clock: twice an interval, so a flush
    starts at most half an interval late."""
    return max(FLUSH_TICK_MIN_S, interval_ms / 2000)


class FlushConsumeQueueService:
    """RocketMQ's FlushConsumeQueueService for the dispatcher process: ``work`` (the
    flush on its interval) on a thread, every ``tick_s`` seconds, under ``lock``. The
    first exception stops the thread and is kept for ``raise_error`` to raise in the
    dispatcher's own thread, which then fails as before (a failed fdatasync stops
    dispatch)."""

    def __init__(self, work: Callable[[], None], tick_s: float):
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._work = work
        self._tick_s = tick_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flush-consume-queue",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (a flush in progress finishes first)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while not self._stopping.wait(self._tick_s):
            try:
                with self.lock:
                    self._work()
            except BaseException as e:  # noqa: BLE001 - raised in the dispatcher's thread
                self.error = e
                return


class IndexBuildError(StoreError):
    """No index file could be created: the index would miss messages."""


class Dispatcher(Service):
    name = "dispatcher"

    # ================================================================== setup
    def setup(self) -> None:
        try:
            self._open_files()
        except (StoreError, OSError) as e:
            self._fail(e)
            raise
        self.wakeups = self._wake_source()
        self.publisher = Publisher(self.context, self.store_dir, self.name)
        self.bells = ArrivalBells.open(self.store_dir, writable=True)   # local consumers'
        if self.bells is not None:
            self.bells.ring_all()       # what a killed predecessor published but never rang
        self.flush_service = FlushConsumeQueueService(
            self._flush_on_interval, flush_tick_s(self.config.flush_interval_consume_queue))
        self.flush_service.start()

    def _wake_source(self) -> "Doorbell | Subscriber":
        """What wakes a pass: the dispatcher's doorbell (``shm.doorbell``), which the
        process that moves the confirm offset rings, when the supervisor made one; else
        the bus announcement of what moves it (``confirm_announcement``)."""
        bell = Doorbell.open(self.store_dir)
        if bell is not None:
            return bell
        processes, topics = confirm_announcement(self.table)
        return Subscriber(self.context, self.store_dir, processes, topics, conflate=True)

    def _open_files(self) -> None:
        cfg, table = self.config, self.table
        dispatched = table.get(Slot.DISPATCHED)
        self.commit_log = CommitLog(cfg, read_only=True)
        self.commit_log.mapped_file_queue.refresh(table.get(Slot.MIN_OFFSET))
        self.logic_queues = LogicQueues(cfg)
        for cq in self.logic_queues.discover():
            cq.mapped_file_queue.finish_interrupted_creation()
            cq.load()
            cq.recover()
        rewound = sum(cq.rewind_to(dispatched) for cq in self.logic_queues.all())
        self.checkpoint = StoreCheckpoint(os.path.join(cfg.store_path_root_dir, "checkpoint"))
        self.index_service = None
        if cfg.message_index_enable:
            self.index_service = IndexService(cfg.index_dir, cfg.max_hash_slot_num,
                                              cfg.max_index_num)
            self.index_service.load(True, self.checkpoint.index_msg_timestamp)
        self.reput = ReputMessageService(self.commit_log, self.logic_queues.find,
                                         self.index_service, self._index_failed)
        self.reput.queue_listener = self._arriving
        self.reput.reput_from_offset = dispatched
        self._published = dispatched
        self._last_pass_end = 0.0     # time.monotonic() after the last pass that dispatched
        self._trickle = False         # the last wake came within REPUT_INTERVAL_S of a pass
        self._arrivals: dict[str, dict[int, int]] = {}   # topic -> queue id -> next offset
        self._seen_min_offset = -1
        self._dirty = False
        self._stalled = False
        self._error_shown = bool(self.table.get(Slot.DISPATCH_ERROR))
        self._uncounted = 0           # messages dispatched this turn, for the statistics
        self._space_retry_ns = 0      # set while dispatch waits for disk space
        self.dispatched_messages = 0
        self.dispatch_busy_ns = 0
        log.info("dispatching from %d (%d queues, %d units past it rewound)", dispatched,
                 len(self.logic_queues), rewound)

    def _arriving(self, topic: str, queue_id: int, next_offset: int) -> None:
        queues = self._arrivals.get(topic)
        if queues is None:
            queues = self._arrivals[topic] = {}
        queues[queue_id] = next_offset

    def _index_failed(self) -> None:
        raise IndexBuildError("no index file can be created: dispatch stops rather than "
                              "publish messages the index misses") \
            from self.index_service.create_error

    # ================================================================== the loop
    def turn(self) -> None:
        try:
            if self._waiting_for_space():
                return
            first_ns = 0
            wait_ms = MAX_TURN_MS
            while self._pass(wait_ms):
                now_ns = time.monotonic_ns()
                first_ns = first_ns or now_ns
                left_ns = first_ns + TURN_MS * 1_000_000 - now_ns
                if left_ns <= 0:
                    break
                wait_ms = left_ns // 1_000_000 + 1
            self._count()
            self.flush_service.raise_error()
        except (StoreError, OSError) as e:
            self._fail(e)
            raise

    def _pass(self, wait_ms: int) -> bool:
        """Wait for work (up to ``wait_ms``) unless some is there, then dispatch it; True
        when it dispatched (another pass may follow in this turn)."""
        reput = self.reput
        end = self.table.confirm_offset()
        if reput.reput_from_offset >= end or self._stalled:
            end = self._wait(min(wait_ms, STALL_WAIT_MS) if self._stalled else wait_ms)
        self._follow_min_offset()
        deadline_ns = time.monotonic_ns() + DISPATCH_BUDGET_MS * 1_000_000
        before = reput.reput_from_offset
        try:
            self.dispatch_to(end, deadline_ns)
        except (StoreError, OSError) as e:
            if not _out_of_space(e):
                raise
            self._no_space(e)
            return False
        moved = reput.reput_from_offset > before
        if self._space_retry_ns and moved:
            self._space_retry_ns = 0
            log.warning("dispatch goes on at %d: there is disk space again",
                        reput.reput_from_offset)
        self._stalled = not moved and before < end
        return moved

    def _wait(self, wait_ms: int) -> int:
        """The confirm offset once the bus woke the dispatcher, or after ``wait_ms``.
        While one-message sends trickle in (``_trickle``) the bus is not waited on: the
        rest of the interval is slept out (unless ``PACE_MAX_BYTES`` are already
        waiting) and the table read; the bus is waited on only when that found nothing
        (its one wake-up kept meanwhile then costs one empty pass)."""
        table, reput = self.table, self.reput
        if self._trickle and not self._stalled:
            end = table.confirm_offset()
            if end - reput.reput_from_offset < PACE_MAX_BYTES:
                self._sleep_out_interval()
                end = table.confirm_offset()
            if reput.reput_from_offset < end:
                return end
            self._trickle = False
        if self.wakeups.wait(wait_ms):
            end = table.confirm_offset()
            if end - reput.reput_from_offset >= PACE_MAX_BYTES:
                return end
            self._pace()
        return table.confirm_offset()

    def _pace(self) -> None:
        """Woken, with less than ``PACE_MAX_BYTES`` waiting, after a pass that dispatched
        less than ``REPUT_INTERVAL_S`` ago: wait out the rest of it, so the pass takes
        every record written meanwhile, and stay off the bus while that goes on
        (``_trickle``). One-at-a-time sends then cost the dispatcher one pass per
        millisecond, not one per message (RocketMQ's ReputMessageService sleeps 1 ms
        between passes); a record sent after a quiet spell, or while dispatch is behind
        (no wait at all), is dispatched at once."""
        if self._sleep_out_interval():
            self._trickle = True

    def _sleep_out_interval(self) -> bool:
        """Sleep until ``REPUT_INTERVAL_S`` after the last pass that dispatched; whether
        any of it was left."""
        left = self._last_pass_end + REPUT_INTERVAL_S - time.monotonic()
        if left <= 0:
            return False
        time.sleep(left)
        return True

    def _no_space(self, e: BaseException) -> None:
        """Dispatch met a full disk: DISPATCH_ERROR, said once, tried again later."""
        if not self._space_retry_ns:
            log.error("DISPATCH WAITS at %d: no disk space for its files (%s); puts are "
                      "refused until it goes on; trying again every %d ms",
                      self.reput.reput_from_offset, e, SPACE_RETRY_MS)
        self.table.set(Slot.DISPATCH_ERROR, _errno_of(e))
        self._error_shown = True
        self._space_retry_ns = time.monotonic_ns() + SPACE_RETRY_MS * 1_000_000

    def _waiting_for_space(self) -> bool:
        """While dispatch waits for disk space: follow MIN_OFFSET (the cleaner's
        deletions free space only once unmapped) until the next try is due."""
        left_ns = self._space_retry_ns - time.monotonic_ns()
        if not self._space_retry_ns or left_ns <= 0:
            return False
        self.wakeups.wait(min(MAX_TURN_MS, left_ns // 1_000_000 + 1))
        self._follow_min_offset()
        self.flush_service.raise_error()
        return True

    def teardown(self) -> None:
        self.flush_service.stop()
        try:
            self.flush_service.raise_error()
            try:
                self.dispatch_to(self.table.confirm_offset(), None)
            except (StoreError, OSError) as e:
                if not _out_of_space(e):
                    raise
                self.flush_logics()       # what was dispatched is kept
                log.error("stopped at %d while waiting for disk space (%s): the next start "
                          "dispatches the rest", self.reput.reput_from_offset, e)
                raise SystemExit(1) from None
            self._count()
            self.flush_logics()
        except (StoreError, OSError) as e:
            self._fail(e)
            raise
        finally:
            self._close_files()
        busy_s = self.dispatch_busy_ns / 1e9
        log.info("stopped at %d: %d messages dispatched in %.3f s of dispatch work (%.0f/s)",
                 self._published, self.dispatched_messages, busy_s,
                 self.dispatched_messages / busy_s if busy_s else 0.0)

    def _fail(self, e: BaseException) -> None:
        code = errno.EBADMSG if isinstance(e, CorruptRecordError) else _errno_of(e)
        self.table.set(Slot.DISPATCH_ERROR, code)
        self._error_shown = True
        log.critical("DISPATCH STOPPED at %d (%s): %s; exiting so the supervisor restarts "
                     "the dispatcher, no data is skipped", self.reput.reput_from_offset
                     if hasattr(self, "reput") else self.table.get(Slot.DISPATCHED),
                     errno.errorcode.get(code, code), e)

    # ================================================================== dispatch
    def dispatch_to(self, end: int, deadline_ns: int | None) -> int:
        """Dispatch towards ``end`` chunk by chunk, publishing after each, until caught
        up, stalled (the next bytes are not mapped or not a whole record yet), or past
        ``deadline_ns``. Returns the messages dispatched. Raises ``CorruptRecordError``."""
        reput = self.reput
        total = 0
        while reput.reput_from_offset < end:
            chunk = self._chunk_end(end)
            if chunk is None:
                if not self._map_new_files():
                    break
                continue
            chunk_end, known_starts = chunk
            if chunk_end <= reput.reput_from_offset:
                break
            t0 = time.monotonic_ns()
            n = reput.do_reput(chunk_end, known_starts)
            t1 = time.monotonic_ns()
            self.dispatch_busy_ns += t1 - t0
            self.dispatched_messages += n
            self._uncounted += n
            total += n
            self._publish()
            self._last_pass_end = t1 / 1e9
            if deadline_ns is not None and t1 >= deadline_ns:
                break
        return total

    def _chunk_end(self, end: int) -> tuple[int, list[int]] | None:
        """The farthest record boundary at most ``end``, at most CHUNK_RECORDS records
        past ``reput_from_offset`` and in the same file, with the starts of the records
        before it (``dispatch_batch.walk``'s, which ``do_reput`` then need not walk
        again); None when that file is not mapped here yet.

        Walking only the size fields keeps ``do_reput`` from ever seeing a record cut
        by its end (a confirm offset inside a record, or a chunk limit). A size that no
        record can have is left for ``do_reput`` to report (the returned end covers it).
        """
        cl = self.commit_log
        reput = self.reput
        first = cl.get_min_offset()
        if 0 <= reput.reput_from_offset < first:
            reput.reput_from_offset = first
        data = cl.get_data(reput.reput_from_offset)
        if data is None:
            return None
        mf, pos, limit = data
        base, buf, file_size = mf.file_from_offset, mf.buf, mf.file_size
        stop = min(limit, end - base)
        starts, pos = walk(buf, pos, stop, CHUNK_RECORDS)
        if len(starts) < CHUNK_RECORDS and pos + 8 <= stop:     # what stopped the walk
            size, magic = SIZE_MAGIC.unpack_from(buf, pos)
            if magic == BLANK_MAGIC_CODE:
                return (base + file_size if base + file_size <= end else base + pos), starts
            if size <= HEAD.size or pos + size > file_size:
                return min(end, base + file_size), starts   # damage: do_reput names it
        return base + pos, starts

    def _count(self) -> None:
        """The turn's messages dispatched, and how long after its store time the last of
        them became visible (its store time is in ms: a delay under 1 ms counts as 0)."""
        if self._uncounted:
            self.stats.add("dispatched_messages_total", self._uncounted)
            self._uncounted = 0
            delay_ms = now_ms() - self.reput.logics_timestamp
            self.stats.observe("dispatch_delay_seconds", max(0, delay_ms) / 1000)

    def _map_new_files(self) -> bool:
        """Map CommitLog files the writer created since; True when one was."""
        mfq = self.commit_log.mapped_file_queue
        last = mfq.get_last_mapped_file()
        mfq.refresh(self.table.get(Slot.MIN_OFFSET))
        return mfq.get_last_mapped_file() is not last

    def _publish(self) -> None:
        """DISPATCHED, then the announcements (everything below it is written)."""
        offset = self.reput.reput_from_offset
        if offset <= self._published:
            return
        table = self.table
        table.set(Slot.DISPATCHED, offset)
        self._published = offset
        self._dirty = True
        if self._error_shown:
            table.set(Slot.DISPATCH_ERROR, 0)
            self._error_shown = False
        publish = self.publisher.publish
        publish(DISPATCHED, encode_offset(offset))
        arrivals = self._arrivals
        for topic, queues in arrivals.items():
            publish(arrival_topic(topic), encode_arrival(topic, queues))
        if self.bells is not None and arrivals:
            self.bells.ring(arrivals)
        arrivals.clear()

    # ================================================================== expiry
    def _follow_min_offset(self) -> None:
        """Unmap every file wholly below MIN_OFFSET (the cleaner unlinks them)."""
        min_offset = self.table.get(Slot.MIN_OFFSET)
        if min_offset <= self._seen_min_offset:
            return
        self._seen_min_offset = min_offset
        self.commit_log.mapped_file_queue.refresh(min_offset)
        with self.flush_service.lock:       # never unmap a file while it is flushed
            self.logic_queues.delete_expired(min_offset, unlink=False)
            if self.index_service is not None:
                self.index_service.delete_expired_file(min_offset, unlink=False)

    # ================================================================== flush
    def _flush_on_interval(self) -> None:
        self.logic_queues.flush_on_interval(self._flush_if_dirty)

    def _flush_if_dirty(self) -> None:
        if self._dirty:
            self._dirty = False     # a dispatch during this flush is flushed next time
            self.flush_logics()

    def flush_logics(self) -> None:
        """Everything dispatched made durable, then the checkpoint's logics and index
        times. Raises ``OSError`` when an fdatasync fails."""
        self.logic_queues.flush_logics(self.index_service, self.checkpoint,
                                       self.reput.logics_timestamp)

    def _close_files(self) -> None:
        self.commit_log.close()
        self.logic_queues.close()
        if self.index_service is not None:
            self.index_service.close()
        self.checkpoint.close()
        self.wakeups.close()
        self.publisher.close()
        if self.bells is not None:
            self.bells.close()


def _out_of_space(e: BaseException) -> bool:
    return _errno_of(e) in OUT_OF_SPACE


def _errno_of(e: BaseException) -> int:
    """The errno behind ``e``: its own, or that of the first error down the chain it
    wraps (an index that cannot grow wraps a file error, which wraps the OSError); EIO
    when there is none."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        cause = todo.pop(0)
        if cause is None or id(cause) in seen:
            continue
        seen.add(id(cause))
        code = getattr(cause, "errno", None)
        if code:
            return code
        todo += [cause.__cause__, cause.__context__]
    return errno.EIO


SERVICE = Dispatcher
