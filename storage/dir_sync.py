"""DirSyncs: the directory fsyncs that file creations owe, paid by a later flush.

A created file, or a created directory, survives a power cut only once the directory
holding its entry has been fsynced. A consume-queue file is created by dispatch, inline
with it: under load an fsync of a directory waits for the file system's journal (2.7-3.2
ms a file measured here), so a new topic's eight queues held up every topic's dispatch
for about 23 ms.

What depends on those entries is the checkpoint's logics time: recovery after an unclean
stop trusts the consume queues up to it and re-dispatches every message stored after it,
which makes again any queue file a power cut took away. So a creation that can wait
``owe``s its fsyncs here, and the thorough flush ``pay``s them before it writes that time
(``LogicQueues.flush_logics``). Owed before the caller read the logics time means paid
before the checkpoint says it: the queues' units come after their files' creation.

Which directories a creation owes: the file's own, and the parent of every directory
``file_modes.make_dirs`` made for it (``consumequeue/`` for a new topic, the topic's
for a new queue).

Thread-safe: the dispatch loop owes, its flush thread pays.
"""

from __future__ import annotations

import os
import threading
from typing import Iterable


def fsync_dir(path: str) -> None:
    """Make a created or removed directory entry durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def owed_by_creation(path: str, made_dirs: Iterable[str]) -> list[str]:
    """The directories whose fsync makes the created file ``path`` durable, when
    ``made_dirs`` were made for it."""
    dirs = [os.path.dirname(d) for d in made_dirs]
    dirs.append(os.path.dirname(path) or ".")
    return list(dict.fromkeys(dirs))


def fsync_creation(path: str, made_dirs: Iterable[str]) -> None:
    """Make the created file ``path`` durable now (``made_dirs`` made for it)."""
    for directory in owed_by_creation(path, made_dirs):
        fsync_dir(directory)


class DirSyncs:
    def __init__(self) -> None:
        self._owed: set[str] = set()
        self._lock = threading.Lock()

    def owe(self, dirs: Iterable[str]) -> None:
        with self._lock:
            self._owed.update(dirs)

    def owed(self) -> set[str]:
        with self._lock:
            return set(self._owed)

    def pay(self) -> int:
        """fsync every directory owed so far; how many. A directory gone meanwhile
        (its topic deleted) owes nothing. Raises ``OSError`` when an fsync fails: what
        was not paid stays owed."""
        with self._lock:
            dirs, self._owed = self._owed, set()
        paid = 0
        try:
            for d in sorted(dirs, key=len, reverse=True):
                try:
                    fsync_dir(d)
                except FileNotFoundError:
                    pass
                dirs.discard(d)
                paid += 1
        finally:
            if dirs:
                self.owe(dirs)
        return paid
