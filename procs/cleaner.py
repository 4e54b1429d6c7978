"""The cleaner: CleanCommitLogService and CleanConsumeQueueService as one process.

It is the only process that deletes store files, and the only writer of the MIN_OFFSET
and DISK_FULL slots. Every ``clean_resource_interval`` ms, and at once when the file
``{store}/run/clean-now`` exists (how ``rocketstore clean`` asks for a manual clean; it
is removed when that run is over), one run (``run_once``):

1. the disk decision (``storage.expiry.decide_space``) on the commitlog partition and
   the consumequeue partition; DISK_FULL is set past ``disk_space_warning_level_ratio``
   (the writer refuses puts while it is 1), cleared under
   ``disk_space_clean_forcibly_ratio``, kept in between;
2. when the hour is one of ``delete_when``, the disk is past
   ``disk_max_used_space_ratio``, or the clean is manual: CommitLog files unmodified for
   ``file_reserved_time`` hours (any age past the forcible ratio when
   ``clean_file_forcibly_enable``) are unlinked, oldest first, never the last, at most
   ``DELETE_FILES_BATCH_MAX``, stopping at the first that may not go, with
   ``delete_commit_log_files_interval`` ms between two (RocketMQ's pause that spreads the
   unlink I/O) — and never a file that is not wholly below min(DISPATCHED, FLUSHED):
   data must be durable and dispatched before it may expire;
3. MIN_OFFSET = the first CommitLog byte still on disk (never lowered; never past
   DISPATCHED, since only files wholly below it go: the table refuses more with
   ``SlotRelationError``, which ends the process);
4. when MIN_OFFSET moved: every consume-queue file (never the last of its queue) whose
   last unit points below it, with ``delete_consume_queue_files_interval`` ms after each
   queue that lost files, and every index file (never the last) whose endPhyOffset is
   below it, oldest first, stopping at the first kept.

A run may outlast many turns (a pass over thousands of queues with RocketMQ's pauses
takes minutes): its pauses write the heartbeat, so the supervisor's watchdog sees it
alive, and look for a stop, which ends the run at once (a pass cut short is finished
by the next start's first run).

Between runs the loop sleeps in steps of at most MAX_TURN_MS and looks for ``clean-now``
after each: it waits for a time, not for an event (nothing announces a manual clean on
the bus, and the CLI may run where no ZeroMQ context is wanted).

Files are unlinked, never truncated: the dispatcher, readers and consumers keep reading
their mappings until they drop them (each unmaps what lies below MIN_OFFSET). The
cleaner never maps a consume-queue or index file: it reads the 20 or 40 bytes it needs.

Restart decision table (nothing of the cleaner's is persisted):

    what           rebuilt on start from               note
    -------------  ----------------------------------  ---------------------------------
    CommitLog view the commitlog files on disk         mapped read-only, refreshed per run
    MIN_OFFSET     max(slot, first file on disk)       published at start: a kill between
                                                       an unlink and the publication
    consumequeue,  the first run (its last seen min    a pass a kill cut short is redone;
    index pass     offset starts at -1)                an unlink is all or nothing
    DISK_FULL      the slot, until the first run       decided again by every run
    clean-now      the file, still there               a manual run a kill cut short runs
                                                       again
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.shm.positions import Slot, now_ms
from rocketstore.storage import expiry
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.consume_queue import CQ_PHY_OFFSET, CQ_STORE_UNIT_SIZE
from rocketstore.storage.index_file import INDEX_HEADER_SIZE, decode_header
from rocketstore.storage.logic_queues import queue_dirs
from rocketstore.storage.dir_sync import fsync_dir
from rocketstore.storage.mapped_file import MappedFile, unlink_quietly
from rocketstore.storage.mapped_file_queue import DELETE_FILES_BATCH_MAX, gaps_between

log = logging.getLogger(__name__)

CLEAN_NOW_FILE = "clean-now"
CHECK_SELF_INTERVAL_MS = 10 * 60 * 1000   # RocketMQ checks its file queues every 10 minutes

# Fault-injection seam: path -> used fraction of its partition (-1 on error). A real
# disk cannot be filled on demand, so tests replace it, in their own process only.
disk_used_ratio = expiry.disk_partition_used_ratio


def _existing(path: str, cfg) -> str:
    """``path``, or the store's root while it does not exist yet (same partition)."""
    return path if os.path.isdir(path) else cfg.store_path_root_dir


def clean_now_path(store_dir: str) -> str:
    """The file whose existence asks the cleaner for a manual (forced) clean."""
    return os.path.join(store_dir, "run", CLEAN_NOW_FILE)


@dataclasses.dataclass
class CleanReport:
    commit_log_files: int = 0
    consume_queue_files: int = 0
    index_files: int = 0
    min_offset: int = -1
    disk_full: bool = False
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)


class Cleaner(Service):
    name = "cleaner"

    def setup(self) -> None:
        self.commit_log = CommitLog(self.config, read_only=True)
        self._last_logics_min_offset = -1
        self._next_run_ms = now_ms()
        self._next_check_ms = now_ms() + CHECK_SELF_INTERVAL_MS
        self._refresh()
        self._publish_min_offset()

    def turn(self) -> None:
        clean_now = clean_now_path(self.store_dir)
        forced = os.path.exists(clean_now)
        now = now_ms()
        if not forced and now < self._next_run_ms:
            time.sleep(min(MAX_TURN_MS, self._next_run_ms - now) / 1000)
            return
        self._next_run_ms = now + self.config.clean_resource_interval
        report = self.run_once(force=forced)
        for kind in ("commit_log", "consume_queue", "index"):
            self.stats.add("cleaner_deleted_files_total", getattr(report, f"{kind}_files"),
                           kind=kind)
        if forced:
            unlink_quietly(clean_now)
            log.info("manual clean done: %s", report)
        if now >= self._next_check_ms:
            self._next_check_ms = now + CHECK_SELF_INTERVAL_MS
            self.stats.add("check_self_problems_total", len(self.check_self()))

    def check_self(self) -> list[str]:
        """RocketMQ's periodic ``checkSelf``: the CommitLog's files and every consume
        queue's follow each other without a gap (each break logged as an error)."""
        self._refresh()
        problems = self.commit_log.mapped_file_queue.check_self()
        cfg = self.config
        for _, _, queue_dir in queue_dirs(cfg.consume_queue_dir):
            offsets = sorted(int(n) for n in _list(queue_dir) if n.isdigit())
            for problem in gaps_between(offsets, cfg.consume_queue_file_size, queue_dir):
                log.error("[BUG] a consume queue's files are damaged: %s", problem)
                problems.append(problem)
        return problems

    def teardown(self) -> None:
        self.commit_log.close()

    # ================================================================== one run
    def run_once(self, force: bool = False, *, now: int | None = None) -> CleanReport:
        """One run of CleanCommitLogService then CleanConsumeQueueService.

        ``force`` is a manual clean (files still must have expired, unless the disk is
        past the forcible ratio); ``now`` (ms) stands for the clock in the
        ``delete_when`` hour test. Raises ``OSError`` when a directory cannot be read.
        """
        cfg = self.config
        decision = expiry.decide_space(disk_used_ratio(_existing(cfg.commit_log_dir, cfg)),
                                       disk_used_ratio(_existing(cfg.consume_queue_dir, cfg)),
                                       cfg)
        self._apply_disk_decision(decision)
        report = CleanReport(disk_full=bool(self.table.get(Slot.DISK_FULL)),
                             ratios=decision.ratios)
        if expiry.is_time_to_delete(cfg.delete_when, now) or decision.space_to_delete or force:
            report.commit_log_files = self._delete_commit_log_files(
                cfg.clean_file_forcibly_enable and decision.clean_immediately)
            if report.commit_log_files == 0 and decision.space_to_delete:
                log.warning("disk space will be full soon, but delete file failed %s",
                            decision.ratios)
        report.min_offset = self._publish_min_offset()
        if report.min_offset > self._last_logics_min_offset:
            report.consume_queue_files = delete_consume_queue_files(
                cfg.consume_queue_dir, cfg.consume_queue_file_size, report.min_offset,
                cfg.delete_consume_queue_files_interval, self._pause)
            report.index_files = delete_index_files(cfg.index_dir, report.min_offset)
            self._last_logics_min_offset = report.min_offset
        return report

    def _apply_disk_decision(self, d: expiry.SpaceDecision) -> None:
        table = self.table
        if d.disk_full is True and not table.get(Slot.DISK_FULL):
            table.set(Slot.DISK_FULL, 1)
            log.error("disk maybe full soon %s, so mark disk full: puts are refused", d.ratios)
        elif d.disk_full is False and table.get(Slot.DISK_FULL):
            table.set(Slot.DISK_FULL, 0)
            log.info("disk space OK %s, so mark disk ok", d.ratios)

    def _refresh(self) -> None:
        self.commit_log.mapped_file_queue.refresh(self.table.get(Slot.MIN_OFFSET))

    def _delete_commit_log_files(self, clean_immediately: bool) -> int:
        """``deleteExpiredFileByTime``, bounded by min(DISPATCHED, FLUSHED)."""
        cfg = self.config
        self._refresh()
        mfq = self.commit_log.mapped_file_queue
        limit = min(self.table.get(Slot.DISPATCHED), self.table.get(Slot.FLUSHED))
        candidates = [mf for mf in mfq.mapped_files[:-1]
                      if mf.file_from_offset + mf.file_size <= limit]
        reserved_ms = cfg.file_reserved_time * 3_600_000
        deleted: list[MappedFile] = []
        for i, mf in enumerate(candidates):
            if not (clean_immediately or now_ms() >= mf.last_modified_timestamp() + reserved_ms):
                break
            if not mf.destroy(cfg.destroy_maped_file_interval_forcibly):
                break
            log.info("deleted expired commitlog file %s", mf.path)
            deleted.append(mf)
            if len(deleted) >= DELETE_FILES_BATCH_MAX:
                break
            if i + 1 < len(candidates) and \
                    not self._pause(cfg.delete_commit_log_files_interval / 1000):
                break
        mfq.delete_expired_file(deleted)
        if deleted:
            fsync_dir(mfq.store_path)
        return len(deleted)

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` within a run, in steps of MAX_TURN_MS, writing the heartbeat
        after each; False (the run ends there) once the process is asked to stop."""
        end = time.monotonic() + seconds
        while True:
            if self.table is not None:
                self.table.heartbeat(self.name)
            if self.stopping or (self.supervised and self._stop_requested()):
                self.stopping = True
                return False
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, MAX_TURN_MS / 1000))

    def _publish_min_offset(self) -> int:
        """MIN_OFFSET = the first CommitLog byte on disk; never lowered."""
        current = self.table.get(Slot.MIN_OFFSET)
        first = self.commit_log.mapped_file_queue.get_min_offset()
        if first > current:
            self.table.set(Slot.MIN_OFFSET, first)
            log.info("min offset %d", first)
            return first
        return current


# ====================================================================== the logics files
def delete_consume_queue_files(root: str, file_size: int, min_offset: int,
                               interval_ms: int = 0,
                               pause: Callable[[float], bool] | None = None) -> int:
    """Unlink, in every queue under ``root``, the leading files whose last unit points
    below ``min_offset``; never a queue's last file. After a queue that lost files,
    pause ``interval_ms`` (``delete_consume_queue_files_interval``, as RocketMQ's
    CleanConsumeQueueService spreads the unlink I/O) through ``pause(seconds)`` (a
    plain sleep by default), which may end the pass by answering False. Returns how
    many went."""
    deleted = 0
    for _, _, queue_dir in queue_dirs(root):
        n = _delete_queue_files(queue_dir, file_size, min_offset)
        deleted += n
        if n and pause is not None:
            if not pause(interval_ms / 1000):
                break
        elif n and interval_ms > 0:
            time.sleep(interval_ms / 1000)
    return deleted


def _delete_queue_files(queue_dir: str, file_size: int, min_offset: int) -> int:
    names = sorted(n for n in _list(queue_dir) if n.isdigit())
    deleted = 0
    for name in names[:-1]:
        path = os.path.join(queue_dir, name)
        last_unit = _read(path, file_size - CQ_STORE_UNIT_SIZE, CQ_PHY_OFFSET.size, file_size)
        if last_unit is None or CQ_PHY_OFFSET.unpack(last_unit)[0] >= min_offset:
            break
        unlink_quietly(path)
        deleted += 1
    if deleted:
        fsync_dir(queue_dir)
        log.info("deleted %d expired consume queue file(s) in %s", deleted, queue_dir)
    return deleted


def delete_index_files(index_dir: str, min_offset: int) -> int:
    """Unlink the leading index files whose endPhyOffset is below ``min_offset``; never
    the last. Returns how many went."""
    names = sorted(n for n in _list(index_dir) if n.isdigit())
    deleted = 0
    for name in names[:-1]:
        path = os.path.join(index_dir, name)
        header = _read(path, 0, INDEX_HEADER_SIZE)
        if header is None or decode_header(header)[3] >= min_offset:
            break
        unlink_quietly(path)
        deleted += 1
        log.info("deleted expired index file %s", path)
    if deleted:
        fsync_dir(index_dir)
    return deleted


def _list(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read(path: str, pos: int, size: int, expect_size: int | None = None) -> bytes | None:
    """``size`` bytes at ``pos`` of ``path``; None when the file is gone, shorter, or
    not ``expect_size`` bytes long (a file whose creation is under way)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if expect_size is not None and os.fstat(fd).st_size != expect_size:
            return None
        data = os.pread(fd, size, pos)
    finally:
        os.close(fd)
    return data if len(data) == size else None


SERVICE = Cleaner
