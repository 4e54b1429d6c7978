"""The flusher process: makes the CommitLog durable and says how far it is.

It maps nothing. ``fdatasync`` on a file descriptor flushes every dirty page of that
file in the page cache, including the pages the writer dirtied through its own mapping,
so the flusher opens each CommitLog file it must flush by name
(``storage.mapped_file.offset_to_file_name``, read-only) and syncs it. One flush covers
[FLUSHED, WRITTEN) across as many files as that spans:

1. read (WRITTEN, LAST_STORE_TS) with ``read_written`` **before** the fdatasync: every
   byte below that WRITTEN was in the page cache before the sync started;
2. fdatasync every file from FLUSHED's to WRITTEN's (``FILE_OPS.fdatasync``, the seam
   tests use to inject EIO);
3. publish FLUSHED = that WRITTEN, the bus FLUSHED and, under SYNC_FLUSH, where FLUSHED
   is the dispatcher's confirm offset, its doorbell (the table refuses a FLUSHED or
   COMMITTED past the WRITTEN it holds then: ``SlotRelationError`` ends the process);
4. write the checkpoint's physic time = that LAST_STORE_TS into its mapping, so the
   checkpoint never runs ahead of durable data. It is made durable (fdatasync of the
   checkpoint) at most once every ``flush_commit_log_thorough_interval`` ms, by the
   first flush after that long, and at a clean stop (``teardown``), as RocketMQ's
   FlushRealTimeService only sets it and FlushConsumeQueueService persists it (SPEC
   §4.11; the dispatcher's fdatasyncs of the file take it along too). An fdatasync of
   the checkpoint after every flush made every flush two fdatasyncs
   (``docs/PERFORMANCE.md`` measures what that cost one-message sends). A power cut may
   leave the physic time that much older on disk: recovery then starts from an earlier
   file, never a later one.

Two services, chosen by ``flush_disk_type`` (SPEC §4.6):

* FlushRealTimeService (ASYNC_FLUSH): every ``flush_interval_commit_log`` ms, or at
  once when the writer's PAGES wakes it (unless ``flush_commit_log_timed``: WRITTEN
  crossed a multiple of ``flush_commit_log_least_pages`` pages, APPENDED when that is
  0), flush when at least ``flush_commit_log_least_pages`` pages are dirty or a whole
  file is; everything every ``flush_commit_log_thorough_interval`` ms.
* GroupCommitService (SYNC_FLUSH): whenever WRITTEN > FLUSHED, at once; one fdatasync
  covers every request the writer has parked, however many.

The writer's wake-ups (PAGES, or APPENDED) come by the flusher's doorbell where the
supervisor made one (``shm.doorbell``: no ZeroMQ hop), else by the bus.

A failed fdatasync (or a file that cannot be opened) sets FLUSH_ERROR to the errno, is
logged as critical, and FLUSHED never moves again in this run: the writer then refuses
puts with SERVICE_NOT_AVAILABLE naming the error, and answers parked SYNC requests with
FLUSH_DISK_TIMEOUT. Retrying is not safe: after a failed fsync Linux may have marked the
dirty pages clean, so a second fsync can "succeed" over data that never reached the disk.

Restart decision table (``setup``):

    what                    from                   how
    ----------------------  ---------------------  ------------------------------------------
    FLUSHED                 the table, unchanged   the first turn flushes [FLUSHED, WRITTEN):
                                                   the dirty pages are in the page cache,
                                                   whichever process flushes them
    FLUSH_ERROR             the table, unchanged   a set error stays set (see above); only a
                                                   store restart, which recovers from the
                                                   files, clears it
    file descriptors        reopened by name       on the first flush that needs them
    checkpoint physic time  the file               rewritten by the next flush,
                                                   synced one interval on
    interval timers         the clock              a thorough flush is due one interval on

Descriptors of files wholly below max(FLUSHED, MIN_OFFSET) are closed: they are never
flushed again, and the cleaner may unlink them. ``teardown`` flushes everything up to
WRITTEN (unless a flush already failed).
"""

from __future__ import annotations

import errno
import logging
import os
import time

from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.shm import bus
from rocketstore.shm.doorbell import DISPATCH, FLUSH, Doorbell
from rocketstore.shm.positions import Slot, now_ms
from rocketstore.shm.transient_pool import TransientStorePool
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.errors import errno_text
from rocketstore.storage.mapped_file import FILE_OPS, OS_PAGE_SIZE, offset_to_file_name

log = logging.getLogger(__name__)

SLOW_MS = 500   # RocketMQ warns of a commit or flush slower than this


class FlusherService(Service):
    name = "flusher"

    def setup(self) -> None:
        cfg = self.config
        self.file_size = cfg.mapped_file_size_commit_log
        self.sync_flush = cfg.sync_flush
        self.fds: dict[int, int] = {}
        self.checkpoint = StoreCheckpoint(os.path.join(cfg.store_path_root_dir, "checkpoint"))
        self.publisher = bus.Publisher(self.context, self.store_dir, "flusher")
        self.wakeups = self._wake_source()
        self.last_flush_ms = self.last_thorough_ms = now_ms()
        self.checkpoint_synced_ms = now_ms()       # the last fdatasync of the checkpoint
        self.checkpoint_synced_ts = self.checkpoint.physic_msg_timestamp   # its physic time
        self.pool: TransientStorePool | None = None
        if self.table.get(Slot.TRANSIENT_POOL):
            self.pool = TransientStorePool(self.store_dir, self.table.get(Slot.TRANSIENT_POOL),
                                           self.file_size)
        self.last_commit_ms = self.last_thorough_commit_ms = now_ms()
        self.committed_store_ts = 0     # LAST_STORE_TS as of the last commit
        # what of this flusher's announcements moves the dispatcher's confirm offset
        # (FLUSHED under SYNC_FLUSH, COMMITTED with the pool), and its doorbell then
        processes, topics = bus.confirm_announcement(self.table)
        self.dispatch_topic = topics[0] if processes == ["flusher"] else None
        self.dispatch_bell = Doorbell.open(self.store_dir, DISPATCH) \
            if self.dispatch_topic else None
        self.failed = self.table.get(Slot.FLUSH_ERROR) != 0
        if self.failed:
            log.critical("FLUSH_ERROR is set (%s): this flusher will not flush; restart the "
                         "store", errno_text(self.table.get(Slot.FLUSH_ERROR)))

    def teardown(self) -> None:
        if not self.failed:
            if self.pool is not None:
                self.commit_pool(0)
            self.flush_commit_log()
            if not self.failed and \
                    self.checkpoint.physic_msg_timestamp != self.checkpoint_synced_ts:
                self._sync_checkpoint(now_ms())
        if self.pool is not None:
            self.pool.close()
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.checkpoint.close()
        self.publisher.close()
        self.wakeups.close()
        if self.dispatch_bell is not None:
            self.dispatch_bell.close()

    # ================================================================== the loop
    def _wake_source(self) -> "Doorbell | bus.Subscriber":
        """What wakes the flusher: its doorbell (``shm.doorbell``), which the writer rings
        where it announces ``bus.flusher_wake_topic``, when the supervisor made one; else
        that bus announcement. Either only wakes: the position table is the truth."""
        bell = Doorbell.open(self.store_dir, FLUSH)
        if bell is not None:
            return bell
        cfg = self.config
        return bus.Subscriber(self.context, self.store_dir, ["writer"], [
            bus.flusher_wake_topic(cfg.sync_flush, cfg.flush_commit_log_least_pages)])

    def _announce(self, topic: bytes, offset: int) -> None:
        """The bus announcement of FLUSHED or COMMITTED at ``offset``, and the
        dispatcher's doorbell when that is what moves its confirm offset."""
        self.publisher.publish(topic, bus.encode_offset(offset))
        if topic == self.dispatch_topic and self.dispatch_bell is not None:
            self.dispatch_bell.ring()

    def turn(self) -> None:
        if self.failed:
            self.wakeups.wait(MAX_TURN_MS)
        elif self.sync_flush:
            self._group_commit_turn()
        else:
            self._real_time_turn()

    def _group_commit_turn(self) -> None:
        """GroupCommitService: flush whenever something is unflushed, else wait for
        the writer's APPENDED."""
        if self.table.get(Slot.WRITTEN) <= self.table.get(Slot.FLUSHED):
            self.wakeups.wait(MAX_TURN_MS)
        self.flush_commit_log()

    def _real_time_turn(self) -> None:
        """FlushRealTimeService: on the interval (or a wake-up), the least-pages rule;
        everything on the thorough interval. With the transient pool, the commit step
        (CommitRealTimeService) runs first on its own interval, and a commit that moved
        COMMITTED is flushed at once, as RocketMQ's commit wakes its flush thread."""
        cfg = self.config
        now = now_ms()
        if self.pool is not None and self._commit_on_interval(now):
            self.last_flush_ms = 0
        due_ms = self.last_flush_ms + cfg.flush_interval_commit_log
        if self.pool is not None:
            due_ms = min(due_ms, self.last_commit_ms + cfg.commit_interval_commit_log)
        if now < due_ms:
            woken = bool(self.wakeups.wait(min(due_ms - now, MAX_TURN_MS)))
            if cfg.flush_commit_log_timed or not woken:
                return
            now = now_ms()
        thorough_ms = self.last_thorough_ms + cfg.flush_commit_log_thorough_interval
        least_pages = 0 if now >= thorough_ms else cfg.flush_commit_log_least_pages
        if not self._flushable(least_pages):
            # nothing to do until the writer appends or the thorough flush falls due
            until = thorough_ms - now if least_pages else MAX_TURN_MS
            self.wakeups.wait(max(1, min(until, MAX_TURN_MS)))
            return
        self.last_flush_ms = now
        if least_pages == 0:
            self.last_thorough_ms = now
        self.flush_commit_log()

    def _flushable(self, least_pages: int) -> bool:
        """Something unflushed, and (``least_pages`` > 0) at least that many dirty pages
        or a whole file (RocketMQ's ``isAbleToFlush``)."""
        return self._enough(self._flush_end()[0], self.table.get(Slot.FLUSHED), least_pages)

    def _enough(self, end: int, done: int, least_pages: int) -> bool:
        """``isAbleToFlush`` / ``isAbleToCommit``: bytes past ``done``, and with
        ``least_pages`` > 0 that many pages or the end of a file among them."""
        if end <= done:
            return False
        if least_pages <= 0 or (end - 1) // self.file_size != done // self.file_size:
            return True
        return end // OS_PAGE_SIZE - done // OS_PAGE_SIZE >= least_pages

    def _flush_end(self) -> tuple[int, int]:
        """What a flush may make durable, with its store time: (WRITTEN, LAST_STORE_TS),
        or with the transient pool what is committed."""
        if self.pool is None:
            return self.table.read_written()
        return self.table.get(Slot.COMMITTED), self.committed_store_ts

    # ================================================================== the commit step
    def _commit_on_interval(self, now: int) -> bool:
        """CommitRealTimeService's turn: due every ``commit_interval_commit_log`` ms, with
        ``commit_commit_log_least_pages`` unless the thorough interval is due."""
        cfg = self.config
        if now < self.last_commit_ms + cfg.commit_interval_commit_log:
            return False
        self.last_commit_ms = now
        thorough = now >= self.last_thorough_commit_ms + cfg.commit_commit_log_thorough_interval
        if thorough:
            self.last_thorough_commit_ms = now
        return self.commit_pool(0 if thorough else cfg.commit_commit_log_least_pages)

    def commit_pool(self, least_pages: int) -> bool:
        """Copy [COMMITTED, WRITTEN) from the pool's buffers into the files, then publish
        COMMITTED (a kill in between only makes the next flusher copy it again). True
        when COMMITTED moved. A failed write stops flushing like a failed fdatasync."""
        if self.failed:
            return False
        written, store_ts = self.table.read_written()
        committed = self.table.get(Slot.COMMITTED)
        if not self._enough(written, committed, least_pages):
            return False
        began = time.monotonic()
        try:
            self.pool.commit(committed, written, self._fd)
        except OSError as e:
            self._fail(e, f"commit of the transient store pool [{committed}, {written})")
            return False
        self.table.set(Slot.COMMITTED, written)
        self.committed_store_ts = store_ts
        self._announce(bus.COMMITTED, written)
        elapsed = time.monotonic() - began
        self.stats.observe("commit_latency_seconds", elapsed)
        if elapsed > SLOW_MS / 1000:
            log.warning("Commit data to file costs %d ms", elapsed * 1000)
        return True

    # ================================================================== flushing
    def flush_commit_log(self) -> bool:
        """Make [FLUSHED, WRITTEN) durable, then publish FLUSHED and the checkpoint's
        physic time. True when FLUSHED moved.

        The flusher process only (it owns FLUSHED, FLUSH_ERROR and the physic time). An
        ``OSError`` is not raised: it sets FLUSH_ERROR and FLUSHED stays where it was.
        """
        if self.failed:
            return False
        table = self.table
        written, store_ts = self._flush_end()
        flushed = table.get(Slot.FLUSHED)
        if written <= flushed:
            return False
        began = time.monotonic()
        try:
            for file_offset in range(flushed - flushed % self.file_size, written, self.file_size):
                fd = self._fd(file_offset)
                if fd is not None:
                    FILE_OPS.fdatasync(fd)
        except OSError as e:
            self._fail(e, f"fdatasync of the commitlog [{flushed}, {written})")
            return False
        elapsed = time.monotonic() - began
        self.stats.observe("flush_latency_seconds", elapsed)
        if elapsed > SLOW_MS / 1000:
            log.warning("Flush data to disk costs %d ms", elapsed * 1000)
        self.stats.add("flushed_bytes_total", written - flushed)
        table.set(Slot.FLUSHED, written)
        self._announce(bus.FLUSHED, written)
        if store_ts > 0:
            self._note_physic_time(store_ts)
        self._close_fds_below(max(written, table.get(Slot.MIN_OFFSET)))
        return True

    def _note_physic_time(self, store_ts: int) -> None:
        """The checkpoint's physic time after a flush: written into the mapping, and
        synced when the last sync is ``flush_commit_log_thorough_interval`` ms old
        (the module's step 4)."""
        self.checkpoint.physic_msg_timestamp = store_ts
        now = now_ms()
        if now - self.checkpoint_synced_ms < self.config.flush_commit_log_thorough_interval:
            self.checkpoint.write_one("physic")
        else:
            self._sync_checkpoint(now)

    def _sync_checkpoint(self, now: int) -> None:
        """Write the physic time and fdatasync the checkpoint; a failure is the
        flusher's failure (FLUSH_ERROR)."""
        try:
            self.checkpoint.flush_one("physic")
        except OSError as e:
            self._fail(e, "fdatasync of the checkpoint")
            return
        self.checkpoint_synced_ms = now
        self.checkpoint_synced_ts = self.checkpoint.physic_msg_timestamp

    def _fd(self, file_offset: int) -> int | None:
        """A descriptor of the CommitLog file starting at ``file_offset`` (read-only;
        read-write for the pool's commits);
        None for a file the cleaner already removed (wholly below MIN_OFFSET).

        Raises ``OSError`` when a file that must be flushed cannot be opened.
        """
        fd = self.fds.get(file_offset)
        if fd is None:
            path = os.path.join(self.config.commit_log_dir, offset_to_file_name(file_offset))
            try:
                fd = os.open(path, os.O_RDONLY if self.pool is None else os.O_RDWR)
            except FileNotFoundError:
                if file_offset + self.file_size <= self.table.get(Slot.MIN_OFFSET):
                    return None
                raise
            self.fds[file_offset] = fd
        return fd

    def _close_fds_below(self, offset: int) -> None:
        for file_offset in [o for o in self.fds if o + self.file_size <= offset]:
            os.close(self.fds.pop(file_offset))

    def _fail(self, e: OSError, what: str) -> None:
        """Set FLUSH_ERROR (the flusher process only) and stop flushing for good."""
        code = e.errno or errno.EIO
        self.table.set(Slot.FLUSH_ERROR, code)
        self.failed = True
        log.critical("%s FAILED (%s): FLUSHED stays at %d, the writer refuses puts; the "
                     "store must be restarted (and recovered from its files)", what,
                     errno_text(code), self.table.get(Slot.FLUSHED))


SERVICE = FlusherService
