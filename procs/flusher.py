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
3. publish FLUSHED = that WRITTEN, and the bus FLUSHED;
4. write the checkpoint's physic time = that LAST_STORE_TS (``flush_one("physic")``),
   so the checkpoint never runs ahead of durable data.

Two services, chosen by ``flush_disk_type`` (SPEC §4.6):

* FlushRealTimeService (ASYNC_FLUSH): every ``flush_interval_commit_log`` ms, or at
  once when the writer's PAGES wakes it (unless ``flush_commit_log_timed``: WRITTEN
  crossed a multiple of ``flush_commit_log_least_pages`` pages, APPENDED when that is
  0), flush when at least ``flush_commit_log_least_pages`` pages are dirty or a whole
  file is; everything every ``flush_commit_log_thorough_interval`` ms.
* GroupCommitService (SYNC_FLUSH): whenever WRITTEN > FLUSHED, at once; one fdatasync
  covers every request the writer has parked, however many.

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
    checkpoint physic time  the file               rewritten by the next flush
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

from procs.service import MAX_TURN_MS, Service
from shm import bus
from shm.positions import Slot, now_ms
from storage.checkpoint import StoreCheckpoint
from storage.errors import errno_text
from storage.mapped_file import FILE_OPS, OS_PAGE_SIZE, offset_to_file_name

log = logging.getLogger(__name__)


class FlusherService(Service):
    name = "flusher"

    def setup(self) -> None:
        cfg = self.config
        self.file_size = cfg.mapped_file_size_commit_log
        self.sync_flush = cfg.sync_flush
        self.fds: dict[int, int] = {}
        self.checkpoint = StoreCheckpoint(os.path.join(cfg.store_path_root_dir, "checkpoint"))
        self.publisher = bus.Publisher(self.context, self.store_dir, "flusher")
        self.appended = bus.Subscriber(self.context, self.store_dir, ["writer"],
                                       [self._wake_topic()])
        self.last_flush_ms = self.last_thorough_ms = now_ms()
        self.failed = self.table.get(Slot.FLUSH_ERROR) != 0
        if self.failed:
            log.critical("FLUSH_ERROR is set (%s): this flusher will not flush; restart the "
                         "store", errno_text(self.table.get(Slot.FLUSH_ERROR)))

    def teardown(self) -> None:
        if not self.failed:
            self.flush_commit_log()
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.checkpoint.close()
        self.publisher.close()
        self.appended.close()

    # ================================================================== the loop
    def _wake_topic(self) -> bytes:
        """GroupCommitService wakes on every append; FlushRealTimeService only when
        enough pages may be dirty for its least-pages rule (bus PAGES), so an append of
        a few bytes does not cost a wake-up that would find nothing to flush."""
        cfg = self.config
        if cfg.sync_flush or not bus.pages_span(cfg.flush_commit_log_least_pages):
            return bus.APPENDED
        return bus.PAGES

    def turn(self) -> None:
        if self.failed:
            self.appended.wait(MAX_TURN_MS)
        elif self.sync_flush:
            self._group_commit_turn()
        else:
            self._real_time_turn()

    def _group_commit_turn(self) -> None:
        """GroupCommitService: flush whenever something is unflushed, else wait for
        the writer's APPENDED."""
        if self.table.get(Slot.WRITTEN) <= self.table.get(Slot.FLUSHED):
            self.appended.wait(MAX_TURN_MS)
        self.flush_commit_log()

    def _real_time_turn(self) -> None:
        """FlushRealTimeService: on the interval (or a wake-up), the least-pages rule;
        everything on the thorough interval."""
        cfg = self.config
        now = now_ms()
        due_ms = self.last_flush_ms + cfg.flush_interval_commit_log
        if now < due_ms:
            woken = bool(self.appended.wait(min(due_ms - now, MAX_TURN_MS)))
            if cfg.flush_commit_log_timed or not woken:
                return
            now = now_ms()
        thorough_ms = self.last_thorough_ms + cfg.flush_commit_log_thorough_interval
        least_pages = 0 if now >= thorough_ms else cfg.flush_commit_log_least_pages
        if not self._flushable(least_pages):
            # nothing to do until the writer appends or the thorough flush falls due
            until = thorough_ms - now if least_pages else MAX_TURN_MS
            self.appended.wait(max(1, min(until, MAX_TURN_MS)))
            return
        self.last_flush_ms = now
        if least_pages == 0:
            self.last_thorough_ms = now
        self.flush_commit_log()

    def _flushable(self, least_pages: int) -> bool:
        """Something unflushed, and (``least_pages`` > 0) at least that many dirty pages
        or a whole file (RocketMQ's ``isAbleToFlush``)."""
        written, flushed = self.table.get(Slot.WRITTEN), self.table.get(Slot.FLUSHED)
        if written <= flushed:
            return False
        if least_pages <= 0 or (written - 1) // self.file_size != flushed // self.file_size:
            return True
        return written // OS_PAGE_SIZE - flushed // OS_PAGE_SIZE >= least_pages

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
        written, store_ts = table.read_written()
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
        self.stats.observe("flush_latency_seconds", time.monotonic() - began)
        self.stats.add("flushed_bytes_total", written - flushed)
        table.set(Slot.FLUSHED, written)
        self.publisher.publish(bus.FLUSHED, bus.encode_offset(written))
        if store_ts > 0:
            self.checkpoint.physic_msg_timestamp = store_ts
            try:
                self.checkpoint.flush_one("physic")
            except OSError as e:
                self._fail(e, "fdatasync of the checkpoint")
        self._close_fds_below(max(written, table.get(Slot.MIN_OFFSET)))
        return True

    def _fd(self, file_offset: int) -> int | None:
        """A read-only descriptor of the CommitLog file starting at ``file_offset``;
        None for a file the cleaner already removed (wholly below MIN_OFFSET).

        Raises ``OSError`` when a file that must be flushed cannot be opened.
        """
        fd = self.fds.get(file_offset)
        if fd is None:
            path = os.path.join(self.config.commit_log_dir, offset_to_file_name(file_offset))
            try:
                fd = os.open(path, os.O_RDONLY)
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
