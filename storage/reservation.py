"""Reservation: the disk blocks allocated ahead of the writes into a mapped file.

A store file keeps its full logical size (RocketMQ's layout: a CommitLog file is
``mapped_file_size_commit_log`` bytes, named by its start offset), but only a prefix of
it is backed by allocated blocks; past that prefix the file may be sparse. Why the
prefix must cover every write: a store into a mapped page that has no block behind it
makes the kernel allocate one in the page fault, and when the file system is full that
fault is SIGBUS, which kills the process (CPython cannot catch it), not an error. A
``pwrite`` into a hole fails cleanly with ENOSPC instead, but the appender, the
dispatcher and the index writer all write through mappings.

Invariant: a process writes a byte of a file only below the reserved position its
``Reservation`` knows, and that position only ever names blocks ``posix_fallocate``
said were allocated. ``cover(end)`` is called before every write that ends at ``end``:

    end + step / 2 <= reserved      nothing to do (the hot path: one comparison)
    otherwise                       allocate [reserved, target), target = the first
                                    step boundary at or past end + step / 2 (at most
                                    the reservable end): the reservation stays half a
                                    step ahead of the writes, extended about once a step
    ... that fails, end <= reserved the write goes on (it is backed); the look-ahead is
                                    tried again at the next write
    ... that fails, end > reserved  allocate only up to the page holding ``end``; when
                                    that fails too, ``StoreFileError`` naming the file
                                    and the errno (ENOSPC on a full disk), chained to
                                    the OSError: nothing is written and nothing already
                                    stored is touched; the caller refuses the put

``reserve_step(size)``: a sixteenth of what is reserved in steps, in whole pages, at
least 1 MiB and at most 64 MiB; a region of 1 MiB or less is reserved whole. A
``posix_fallocate`` of 64 MiB takes about 0.05-0.25 ms on ext4 here, so the writer
extends its own reservation; no thread is needed.

A process that opens an existing file knows nothing of its reservation (another process
or an older version made it, and recovery may have punched holes): it starts at 0, and
its first ``cover`` allocates everything below the write, which costs nothing where
blocks are already there.

Creating a file: ``create_reserved`` allocates the first ``reserved`` bytes and only
then sets the full size with ``ftruncate``, so a file someone can see at full size has
its first step backed, and a creation that fails (ENOSPC) or is killed leaves a file
shorter than full (never written: callers finish or remove it as an interrupted
creation), never a full-size file that is then unlinked under a reader.

Fault-injection seam: ``FILE_OPS`` holds the OS calls that can fail with ENOSPC or EIO
(``fallocate``, ``fdatasync``); tests replace them to inject those faults.
"""

from __future__ import annotations

import errno
import os
import types

from rocketstore.storage.errors import StoreFileError

FILE_OPS = types.SimpleNamespace(fallocate=os.posix_fallocate, fdatasync=os.fdatasync)

OS_PAGE_SIZE = 4096
RESERVE_STEP_MIN = 1 << 20
RESERVE_STEP_MAX = 64 << 20


def reserve_step(size: int) -> int:
    """How much of a region of ``size`` bytes is reserved at a time: a sixteenth, in
    whole pages, within [1 MiB, 64 MiB]; the whole region when it is 1 MiB or less."""
    sixteenth = -(-(size // 16) // OS_PAGE_SIZE) * OS_PAGE_SIZE
    return min(size, max(RESERVE_STEP_MIN, min(RESERVE_STEP_MAX, sixteenth)))


def allocate(path: str, fd: int, offset: int, length: int) -> None:
    """``posix_fallocate`` through ``FILE_OPS``. Raises ``StoreFileError`` naming
    ``path`` and the errno, chained to the ``OSError``."""
    try:
        FILE_OPS.fallocate(fd, offset, length)
    except OSError as e:
        raise StoreFileError(path, f"cannot allocate {length} bytes: "
                             f"{os.strerror(e.errno or errno.EIO)}") from e


def create_reserved(path: str, fd: int, size: int, reserved: int) -> None:
    """Give a new, empty file its first ``reserved`` bytes of blocks, then its full
    ``size`` (sparse past them). Raises ``StoreFileError`` (the file stays short)."""
    if reserved:
        allocate(path, fd, 0, reserved)
    try:
        os.ftruncate(fd, size)
    except OSError as e:
        raise StoreFileError(path, f"cannot set the size to {size} bytes: "
                             f"{os.strerror(e.errno or errno.EIO)}") from e


class Reservation:
    """The allocated prefix ``[0, reserved)`` of one file this process writes through
    a mapping; ``cover`` keeps it ahead of the writes (module docstring)."""

    __slots__ = ("path", "fd", "end", "step", "reserved", "_half")

    def __init__(self, path: str, fd: int, end: int, step: int, reserved: int = 0):
        """``end``: how far the file may be reserved (its size); ``reserved``: what is
        known to be allocated already (0 when nothing is known)."""
        self.path, self.fd, self.end, self.step = path, fd, end, step
        self.reserved = reserved
        self._half = step // 2

    def cover(self, end: int) -> None:
        """Have ``[0, end)`` backed before a write that ends at ``end``. Raises
        ``StoreFileError`` (ENOSPC, ...) when it is not and cannot be; then nothing
        changed."""
        if end + self._half <= self.reserved:
            return
        target = min(self.end, -(-(end + self._half) // self.step) * self.step)
        if target <= self.reserved:
            return
        try:
            allocate(self.path, self.fd, self.reserved, target - self.reserved)
        except StoreFileError:
            if end <= self.reserved:
                return              # backed; the look-ahead waits for space
            target = min(self.end, -(-end // OS_PAGE_SIZE) * OS_PAGE_SIZE)
            allocate(self.path, self.fd, self.reserved, target - self.reserved)
        self.reserved = target

    def forget_from(self, position: int) -> None:
        """The blocks from ``position`` on were released (a hole was punched there)."""
        self.reserved = min(self.reserved, position)


# --------------------------------------------------------------------- what a store holds
def store_reservation(config, written: int) -> dict:
    """The disk blocks a store's files hold now (``st_blocks``), by kind, and the steps
    they grow by: ``bytes`` (the sum), ``commit_log``, ``commit_log_ahead`` (blocks past
    the data ``written``: each CommitLog file's beyond the bytes of it below
    ``written``), ``index``, ``consume_queues``, and ``steps`` (``commit_log``,
    ``index_entries``, ``index_slots`` reserved whole, ``consume_queue``). Files that go
    while it looks are skipped; it reads only metadata."""
    commit_log = ahead = 0
    size = config.mapped_file_size_commit_log
    for name, used in _blocks(config.commit_log_dir):
        commit_log += used
        ahead += max(0, used - min(max(written - int(name), 0), size))
    index = sum(used for _, used in _blocks(config.index_dir))
    queues = 0
    for directory, _, names in os.walk(config.consume_queue_dir):
        queues += sum(used for _, used in _blocks(directory, names))
    return {"bytes": commit_log + index + queues, "commit_log": commit_log,
            "commit_log_ahead": ahead, "index": index, "consume_queues": queues,
            "steps": {"commit_log": reserve_step(size),
                      "index_entries": reserve_step(config.max_index_num * 20),
                      "index_slots": 40 + config.max_hash_slot_num * 4,
                      "consume_queue": reserve_step(config.consume_queue_file_size)}}


def _blocks(directory: str, names: list[str] | None = None) -> list[tuple[str, int]]:
    """``(name, bytes of blocks)`` of the store files (all-digit names) in
    ``directory``."""
    if names is None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
    out = []
    for name in names:
        if name.isdigit():
            try:
                out.append((name, os.stat(os.path.join(directory, name)).st_blocks * 512))
            except FileNotFoundError:
                continue
    return out
