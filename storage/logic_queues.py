"""LogicQueues: the consume queue table of one store, and the wiring around it.

The embedded store (``storage.MessageStore``) and the dispatcher process each hold one.
It keeps every ``ConsumeQueue`` by ``(topic, queue id)`` and does for them what both
holders need:

* ``find``: the queue of a topic and queue id, created on first use (dispatch creates
  queues as messages arrive); ``all`` lists them, in creation order;
* ``discover``: every queue directory under ``consumequeue/``, in name order, as a queue
  of the table (not loaded: each holder loads and recovers its own way); a directory
  whose name is not a topic is skipped with a warning. ``queue_dirs`` is that walk
  alone, for processes that read the files without a table (the cleaner, readers);
* ``flush_on_interval``: FlushConsumeQueueService's timing. Every
  ``flush_interval_consume_queue`` ms the queues are flushed with
  ``flush_consume_queue_least_pages``; every ``flush_consume_queue_thorough_interval`` ms
  the holder's thorough flush runs instead;
* ``flush_logics``: the thorough flush (FlushConsumeQueueService.doFlush): the
  directory fsyncs that queue file creations owe (``dir_syncs``: a creation does not
  wait for them, ``storage.dir_sync``), every queue until nothing is dirty, the index,
  and only then the checkpoint, with the logics time the caller read *before* the
  queues were flushed, so the checkpoint never promises more than the disk holds;
* ``recover``, ``truncate_dirty``, ``delete_expired`` (unlinking, or only unmapping in
  a process that follows the cleaner), ``destroy`` and ``close`` over every queue.

Crash story: nothing here is persisted; the table is rebuilt from the directories.
Single-writer: one process writes a store's consume queues.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterator

from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.consume_queue import ConsumeQueue
from rocketstore.storage.dir_sync import DirSyncs
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.mapped_file import now_ms
from rocketstore.storage.validation import check_topic

log = logging.getLogger(__name__)


def queue_dirs(root: str, *, warn: bool = False) -> Iterator[tuple[str, int, str]]:
    """``(topic, queue id, directory)`` of every queue under ``root`` (consumequeue/),
    topics and queue ids in name order. A name that is not a topic or not a directory
    is skipped (logged when ``warn``); so are queue names that are not all digits.
    Raises ``OSError`` when a directory cannot be listed (gone ones are empty)."""
    for topic in _list(root):
        topic_dir = os.path.join(root, topic)
        if check_topic(topic, internal=True) or not os.path.isdir(topic_dir):
            if warn:
                log.warning("skipping %s: not a topic directory", topic_dir)
            continue
        for name in _list(topic_dir):
            if name.isdigit():
                yield topic, int(name), os.path.join(topic_dir, name)


def _list(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


class LogicQueues:
    def __init__(self, config: StoreConfig):
        self.config = config
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.dir_syncs = DirSyncs()
        self._last_flush_ms = self._last_thorough_ms = now_ms()

    def __len__(self) -> int:
        return len(self._queues)

    def find(self, topic: str, queue_id: int, *, create: bool = True) -> ConsumeQueue | None:
        """The queue of ``topic`` and ``queue_id``; without ``create``, None when the
        table has none."""
        cq = self._queues.get((topic, queue_id))
        if cq is None and create:
            cq = ConsumeQueue(topic, queue_id, self.config.consume_queue_dir,
                              self.config.consume_queue_file_size, dir_syncs=self.dir_syncs)
            self._queues[(topic, queue_id)] = cq
        return cq

    def all(self) -> list[ConsumeQueue]:
        return list(self._queues.values())

    def discover(self) -> Iterator[ConsumeQueue]:
        """Every queue with a directory on disk, topics and queue ids in name order, each
        put in the table (not loaded). Its directory's fsyncs are owed: a process killed
        before its thorough flush may have made it, or files in it, without paying
        them. Raises ``OSError`` when a directory cannot be listed."""
        root = self.config.consume_queue_dir
        for topic, queue_id, path in queue_dirs(root, warn=True):
            self.dir_syncs.owe((path, os.path.dirname(path), root))
            yield self.find(topic, queue_id)

    def recover(self) -> int:
        """Cut every queue at its first invalid unit; returns the largest CommitLog end
        any queue points at (-1 when none)."""
        max_end = -1
        for cq in self.all():
            cq.recover()
            max_end = max(max_end, cq.max_physic_offset)
        return max_end

    # ------------------------------------------------------------------ flush
    def flush_on_interval(self, flush_thorough: Callable[[], None]) -> None:
        """FlushConsumeQueueService's timing: nothing before the interval has passed;
        then ``flush_thorough()`` when the thorough interval has passed too, else every
        queue with the least-pages rule. Raises ``OSError`` when an fdatasync fails."""
        cfg = self.config
        now = now_ms()
        if now - self._last_flush_ms < cfg.flush_interval_consume_queue:
            return
        self._last_flush_ms = now
        if now - self._last_thorough_ms >= cfg.flush_consume_queue_thorough_interval:
            self._last_thorough_ms = now
            flush_thorough()
        else:
            for cq in self.all():
                cq.flush(cfg.flush_consume_queue_least_pages)

    def flush_logics(self, index_service: IndexService | None, checkpoint: StoreCheckpoint,
                     logics_ts: int, *, physic_ts: int | None = None) -> None:
        """The owed directory fsyncs, every queue until nothing is dirty, the index,
        then the checkpoint.

        ``logics_ts`` is the store time of the last message given a unit, read before
        this call. The embedded store, which also flushes the CommitLog, gives
        ``physic_ts``: every time above 0 is written and the file flushed whole. The
        dispatcher shares the file with the flusher (the owner of the physic time): it
        writes only the logics and index times, each only when it moved forward, each
        alone (``StoreCheckpoint.flush_one``). Raises ``OSError`` when an fdatasync
        fails (the checkpoint is then not written).
        """
        self.dir_syncs.pay()
        for cq in self.all():
            cq.mapped_file_queue.flush_dirty(0)
        index_ts = index_service.flush() if index_service is not None else 0
        cp = checkpoint
        if physic_ts is None:
            if logics_ts > cp.logics_msg_timestamp:
                cp.logics_msg_timestamp = logics_ts
                cp.flush_one("logics")
            if index_ts > cp.index_msg_timestamp:
                cp.index_msg_timestamp = index_ts
                cp.flush_one("index")
            return
        if physic_ts > 0:
            cp.physic_msg_timestamp = physic_ts
        if logics_ts > 0:
            cp.logics_msg_timestamp = logics_ts
        if index_ts > 0:
            cp.index_msg_timestamp = index_ts
        cp.flush()

    # ------------------------------------------------------------------ cut, expire, close
    def truncate_dirty(self, phy_offset: int) -> None:
        """Cut every unit whose message starts at or after ``phy_offset`` (recovery)."""
        for cq in self.all():
            cq.truncate_dirty_logic_files(phy_offset)

    def delete_expired(self, min_commit_log_offset: int, *, unlink: bool = True) -> int:
        """Every queue's files whose units all point below ``min_commit_log_offset``,
        never a queue's last; without ``unlink`` only unmapped. Returns how many went."""
        return sum(cq.delete_expired_file(min_commit_log_offset, unlink=unlink)
                   for cq in self.all())

    def destroy(self) -> None:
        """Unlink every queue's files and forget every queue."""
        for cq in self.all():
            cq.destroy()
        self._queues.clear()

    def close(self) -> None:
        for cq in self.all():
            cq.close()
