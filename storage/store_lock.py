"""The ``lock`` and ``abort`` files of a store directory.

``{root}/lock`` is held with an exclusive ``flock`` while a store runs, so a second
store on the same directory fails at once with ``StoreLockedError`` instead of
corrupting the first. The lock goes with the process (no stale locks after a crash).
The holder writes its pid into the file, so the refusal names it (and its command line,
from ``/proc``); the file's content is only ever read for that message.

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
        """Take the lock and write this process's pid into it, or raise
        ``StoreLockedError`` naming the directory and the process that holds it."""
        file_modes.make_dirs(os.path.dirname(self.path))
        fd = file_modes.create(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise StoreLockedError(locked_message(os.path.dirname(self.path), holder)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def holder(root_dir: str) -> int | None:
    """The pid of the process holding the store's lock (0 when it wrote none), or None
    when no process holds it. Takes the lock for an instant to find out; makes nothing."""
    try:
        fd = os.open(os.path.join(root_dir, "lock"), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_pid(fd)
    finally:
        os.close(fd)            # an flock taken here goes with the descriptor
    return None


def locked_message(root_dir: str, pid: int) -> str:
    """Why a store directory cannot be opened, and what to do: the holder's pid and
    command line when it wrote them."""
    lock = os.path.join(root_dir, "lock")
    if not pid:
        return (f"store directory {root_dir} is in use by another process (lock file {lock} "
                "is held): stop it first, or use another store directory")
    command = command_line(pid)
    return (f"store directory {root_dir} is in use by pid {pid}"
            + (f" ({command})" if command else "")
            + f", which holds {lock}: stop it first (kill {pid}: a clean stop), or use "
            "another store directory")


def _holder_pid(fd: int) -> int:
    """The pid the lock's holder wrote (0 if none can be read)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else 0


def command_line(pid: int, limit: int = 160) -> str:
    """``pid``'s command line from ``/proc`` (empty when it cannot be read), at most
    ``limit`` characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = " ".join(" ".join(a.decode(errors="replace").split()) for a in raw.split(b"\0") if a)
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
