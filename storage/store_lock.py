"""The ``lock`` and ``abort`` files of a store directory.

``{root}/lock`` is held with an exclusive ``flock`` while a store runs, so a second
store on the same directory fails at once with ``StoreLockedError`` instead of
corrupting the first. The lock goes with the process (no stale locks after a crash).

``{root}/abort`` exists while a store runs and is removed only by a clean shutdown
(everything flushed, dispatch caught up). Finding it at start means the last run ended
abnormally, and selects abnormal recovery.
"""

from __future__ import annotations

import fcntl
import os

from rocketstore.storage.errors import StoreError
from rocketstore.storage.dir_sync import fsync_dir
from rocketstore.storage import file_modes


class StoreLockedError(StoreError):
    """Another process has this store directory open."""


class StoreLock:
    def __init__(self, root_dir: str):
        self.path = os.path.join(root_dir, "lock")
        self.fd = -1

    def acquire(self) -> None:
        """Take the lock or raise ``StoreLockedError`` naming the directory."""
        file_modes.make_dirs(os.path.dirname(self.path))
        fd = file_modes.create(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"store directory {os.path.dirname(self.path)} is in use by another process "
                f"(lock file {self.path} is held)") from None
        os.ftruncate(fd, 0)
        os.write(fd, b"lock")
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def abort_path(root_dir: str) -> str:
    return os.path.join(root_dir, "abort")


def abort_exists(root_dir: str) -> bool:
    return os.path.exists(abort_path(root_dir))


def create_abort(root_dir: str) -> None:
    with open(abort_path(root_dir), "wb"):
        pass
    fsync_dir(root_dir)


def remove_abort(root_dir: str) -> None:
    try:
        os.unlink(abort_path(root_dir))
    except FileNotFoundError:
        return
    fsync_dir(root_dir)
