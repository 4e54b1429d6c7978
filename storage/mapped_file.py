"""MappedFile: one fixed-size, memory-mapped store file, its blocks reserved as it fills.

A MappedFile is named by the global offset of its first byte, as a 20-digit zero-padded
decimal (``00000000001073741824``); ``file_from_offset`` is parsed back from the name.
It keeps three positions, each relative to the file's start:

    0 <= flushed_position <= committed_position <= wrote_position <= file_size

``wrote_position`` is where the next append goes; everything below
``committed_position`` is in the file's pages (equal to wrote here: appends go straight
into the mapping; with the transient store pool, what the pool's buffers hold and the
commit step are the CommitLog's and the flusher's, ``shm.transient_pool``); everything below
``flushed_position`` has been through ``fdatasync``. Readers never read past the read
position (``committed_position``). The positions move only through the file's own
methods (``append``/``appended``, ``flush``, ``rewind``, ``set_positions``), each of
which checks the invariant before it moves anything: a move that would break it raises
``MappedFilePositionError`` and leaves the three positions as they were. Every position
is computed by the code (none is read from disk), so a violation is a bug in the
caller; it is checked with code, not ``assert``, so that ``python -O`` keeps it.

Files have their full size from the start, but only a prefix of their blocks is
allocated (``storage.reservation``): a new file reserves its first step (a sixteenth of
the file, 1-64 MiB; a file of 1 MiB or less whole), and every write (``append``, and
the appender's own copies after ``reserve``) is preceded by a reservation that keeps
half a step ahead of it. A full disk therefore fails a creation or an append cleanly
(``StoreFileError`` naming ENOSPC: CREATE_MAPEDFILE_FAILED for a put) instead of killing
the writer with SIGBUS on a page fault, and a store holds the disk its data needs plus a
step per file being written, not every file's full size. A file made ahead of need
(``reserve_first=False``) reserves nothing until it is written. A file that others may
have mapped is never truncated, only unlinked (``destroy``): the inode lives until the
last mapping goes.

Reference counting follows RocketMQ's ReferenceResource: ``hold``/``release`` bracket
reads and flushes; ``shutdown`` marks the file unavailable and drops the file's own
reference; ``destroy`` unmaps, closes and unlinks once nothing holds it, or forcibly after
``interval_forcibly_ms``.

Crash story: nothing of a MappedFile's state is persisted besides its bytes. After a
restart the positions are set to the file size and recovery moves them back to the end
of the last valid record.

Fault-injection seam: ``FILE_OPS`` (``storage.reservation``'s, re-exported here) holds
the OS calls that can fail with ENOSPC or EIO (``fallocate``, ``fdatasync``); tests
replace them to inject those faults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os

from rocketstore.storage.dir_sync import DirSyncs, fsync_creation, owed_by_creation
from rocketstore.storage.errors import StoreError, StoreFileError
from rocketstore.storage.clock import now_ms  # noqa: F401  (re-exported)
from rocketstore.storage import file_modes
from rocketstore.storage.reservation import (  # noqa: F401  (FILE_OPS re-exported)
    FILE_OPS, OS_PAGE_SIZE, Reservation, create_reserved, reserve_step)

# How many bytes of "may hold data" regions ``file_may_hold_data`` reads before it
# errs on the safe side. A never-written file's regions are the pages reads pulled into
# the page cache: one touch of a mapped file reads ahead up to ``read_ahead_kb`` (8 MiB
# on some disks), and recovery touches the first page of several files.
INSPECT_LIMIT = 64 << 20
_INSPECT_CHUNK = 1 << 20
FILE_NAME_DIGITS = 20

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: the 20-digit zero-padded decimal offset."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


class MappedFilePositionError(StoreError):
    """A move of a MappedFile's positions that would break
    ``0 <= flushed <= committed <= wrote <= file_size`` (or a rewind past the wrote
    position); nothing moved."""

    def __init__(self, path: str, detail: str):
        self.path, self.detail = path, detail
        super().__init__(f"{path}: {detail}")


class MappedFile:
    """One store file of ``file_size`` bytes, mapped read-write (or read-only)."""

    def __init__(self, path: str, file_size: int, *, read_only: bool = False,
                 create: bool = True, extend_short: bool = False,
                 dir_syncs: DirSyncs | None = None, reserve_first: bool = True):
        """Open (or create: full size, its first reservation step allocated, none when
        not ``reserve_first``) and map ``path``. A creation fsyncs the directories that
        make it durable, or owes them to ``dir_syncs``.

        Raises ``StoreFileError`` when the name is not an offset, the file is missing and
        ``create`` is false, its size differs from ``file_size`` (a short file is grown
        back to size, zero-filled, when ``extend_short``), or it cannot be allocated.
        """
        self.path = path
        self.file_name = os.path.basename(path)
        if not self.file_name.isdigit():
            raise StoreFileError(path, "a store file's name must be its start offset")
        self.file_from_offset = int(self.file_name)
        self.file_size = file_size
        self.read_only = read_only
        self.was_extended = False
        self._extend_short = extend_short
        step = reserve_step(file_size)
        self.fd, reserved = self._open(create, dir_syncs, step if reserve_first else 0)
        # None when read-only; else what this process knows to be allocated
        self.reservation = None if read_only else \
            Reservation(path, self.fd, file_size, step, reserved)
        try:
            self.buf = mmap.mmap(self.fd, file_size,
                                 access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        if read_only:
            # the mapping holds a descriptor of its own (Python's mmap dups it), and a
            # read-only file needs no other: no flush, no allocation. Every mapped file
            # held two before; a consumer maps every CommitLog file and its queues'.
            os.close(self.fd)
            self.fd = -1
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0
        self.first_create_in_queue = False
        self.write_buffer = None    # a TransientStorePool buffer the appender writes in
        self._ref_count = 1
        self.available = True
        self.cleanup_over = False
        self._first_shutdown_ms = 0

    def _open(self, create: bool, dir_syncs: DirSyncs | None,
              first_reserve: int) -> tuple[int, int]:
        """``(fd, bytes known to be reserved)``: ``first_reserve`` for a file made
        here, 0 for one that was there."""
        flags = os.O_RDONLY if self.read_only else os.O_RDWR
        exists = os.path.exists(self.path)
        if not exists and (not create or self.read_only):
            raise StoreFileError(self.path, "file does not exist")
        self.created = not exists
        made = [] if exists else file_modes.make_dirs(os.path.dirname(self.path) or ".")
        fd = os.open(self.path, flags) if exists else file_modes.create(self.path, flags)
        try:
            size = os.fstat(fd).st_size
            reserved = 0
            if not exists or size == 0:
                create_reserved(self.path, fd, self.file_size, first_reserve)
                reserved = first_reserve
                if not exists:
                    if dir_syncs is not None:
                        dir_syncs.owe(owed_by_creation(self.path, made))
                    else:
                        fsync_creation(self.path, made)
            elif size < self.file_size and not self.read_only and self._extend_short:
                create_reserved(self.path, fd, self.file_size, 0)   # zeros past the end
                self.was_extended = True
            elif size != self.file_size:
                raise StoreFileError(self.path, f"length {size} does not match the configured "
                                     f"file size {self.file_size}; check it manually")
        except BaseException:
            os.close(fd)
            if not exists:
                unlink_quietly(self.path)
            raise
        return fd, reserved

    # ------------------------------------------------------------------- reservation
    def reserve(self, end: int) -> None:
        """Have the file's blocks allocated below ``end`` (and half a reservation step
        past it) before the caller writes up to ``end`` itself (``storage.reservation``).
        Raises ``StoreFileError`` (ENOSPC, ...) when they cannot be; nothing changed."""
        self.reservation.cover(end)

    @property
    def reserved_position(self) -> int:
        """Bytes from the file's start known (to this process) to be allocated."""
        return 0 if self.reservation is None else self.reservation.reserved

    # ------------------------------------------------------------------- positions
    @property
    def read_position(self) -> int:
        """``getReadPosition``: the end of the data readers may see."""
        return self.committed_position

    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    def set_positions(self, position: int) -> None:
        """Set wrote, committed and flushed positions together (load and recovery).
        Raises ``MappedFilePositionError`` for a position outside ``[0, file_size]``."""
        self._move(position, position, position)

    def rewind(self, position: int) -> None:
        """Move the wrote and committed positions back to ``position`` (at most the wrote
        position), the flushed one too where it lies past it. The bytes stay: a writer
        that rewinds writes the same bytes again over them (the dispatcher's restart).
        Raises ``MappedFilePositionError`` for a position past the wrote position or
        below 0."""
        if position > self.wrote_position:
            raise MappedFilePositionError(self.path, f"rewind to {position} is past the "
                                          f"wrote position {self.wrote_position}")
        self._move(position, position, min(self.flushed_position, position))

    def appended(self, size: int) -> None:
        """Publish ``size`` bytes the caller copied into ``buf`` at the wrote position
        (a writer that fills the mapping itself): wrote and committed move past them.
        Raises ``MappedFilePositionError`` when they would end past the file or before
        the flushed position."""
        end = self.wrote_position + size
        self._move(end, end, self.flushed_position)

    def _move(self, wrote: int, committed: int, flushed: int) -> None:
        """Set the three positions if they keep the invariant of the module docstring;
        else raise ``MappedFilePositionError`` and move none."""
        if not 0 <= flushed <= committed <= wrote <= self.file_size:
            raise MappedFilePositionError(
                self.path, f"positions flushed {flushed} <= committed {committed} <= wrote "
                f"{wrote} <= file size {self.file_size} do not hold (now flushed "
                f"{self.flushed_position}, committed {self.committed_position}, wrote "
                f"{self.wrote_position})")
        self.wrote_position, self.committed_position, self.flushed_position = \
            wrote, committed, flushed

    # ------------------------------------------------------------------- writes
    def append(self, data) -> bool:
        """``appendMessage(byte[])``: copy ``data`` at the wrote position.

        Returns False, writing nothing, when it does not fit. Raises ``StoreFileError``,
        writing nothing, when its blocks cannot be reserved (a full disk).
        """
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            return False
        self.reservation.cover(end)
        self.buf[pos:end] = data
        self._move(end, end, self.flushed_position)
        return True

    def mark_committed(self) -> None:
        """Publish the wrote position to readers (a file's own commit is a no-op: see the
        module docstring)."""
        self.committed_position = self.wrote_position

    def zero_tail(self, start: int) -> None:
        """Zero the file from ``start`` to its end (recovery only, by the file's only
        writer).

        Stale records after a truncation point must never be mistaken for new ones.
        Punching a hole is instant and touches no page; the blocks go, and the
        reservation is taken again by the next write. Where the file system cannot
        punch, every chunk of the regions it reports as holding data (``data_regions``)
        that is not zeros already is overwritten: bytes that were written there have
        their blocks.
        """
        length = self.file_size - start
        if length <= 0:
            return
        rc = _libc.fallocate(self.fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                             ctypes.c_long(start), ctypes.c_long(length))
        if rc == 0:
            self.reservation.forget_from(start)
            return
        step = 1 << 20
        for region_start, region_end in data_regions(self.fd, start, self.file_size):
            for pos in range(region_start, region_end, step):
                n = min(step, region_end - pos)
                if self.buf[pos:pos + n].count(0) != n:
                    self.buf[pos:pos + n] = bytes(n)

    def may_hold_data(self, limit: int | None = INSPECT_LIMIT) -> bool:
        """False only when the file was provably never written (``file_may_hold_data``)."""
        if self.fd >= 0:
            return file_may_hold_data(self.fd, self.file_size, limit)
        fd = os.open(self.path, os.O_RDONLY)      # a read-only file keeps no descriptor
        try:
            return file_may_hold_data(fd, self.file_size, limit)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------- flush
    def mlock(self) -> bool:
        """Lock the file's pages in RAM (RocketMQ's warmMappedFile ``mlock``); False
        when the OS refuses (RLIMIT_MEMLOCK). Unmapping the file unlocks them."""
        view = ctypes.c_char.from_buffer(self.buf)
        try:
            rc = _libc.mlock(ctypes.c_void_p(ctypes.addressof(view)),
                             ctypes.c_size_t(self.file_size))
        finally:
            del view                        # the mapping can be closed again
        return rc == 0

    def advise_random(self) -> None:
        """Fault in one page at a time (``MADV_RANDOM``), for a fresh file written in
        small appends. By default a fault reads around itself up to the disk's
        ``read_ahead_kb`` (8 MiB here): the first write to a new 6 MB consume-queue
        file brought the whole file into the page cache as zeros and took 1.4-1.8 ms;
        with this it takes 0.02 ms, and the file's later pages cost about what they
        did (each its own fault instead of a minor one). Not for files that hold
        data: reading them back from disk a page at a time would be slow."""
        self.buf.madvise(mmap.MADV_RANDOM)

    def is_able_to_flush(self, flush_least_pages: int) -> bool:
        """Full, or at least ``flush_least_pages`` dirty pages (any dirty byte when <= 0)."""
        flush, write = self.flushed_position, self.read_position
        if self.is_full():
            return write > flush
        if flush_least_pages > 0:
            return write // OS_PAGE_SIZE - flush // OS_PAGE_SIZE >= flush_least_pages
        return write > flush

    def flush(self, flush_least_pages: int) -> int:
        """Make everything below the read position durable if the least-pages rule allows.

        Returns the flushed position. Raises ``OSError`` when fdatasync fails: a failed
        flush is never reported as done.
        """
        if self.is_able_to_flush(flush_least_pages):
            if self.hold():
                try:
                    value = self.read_position
                    FILE_OPS.fdatasync(self.fd)
                    self._move(self.wrote_position, self.committed_position, value)
                finally:
                    self.release()
            else:
                self._move(self.wrote_position, self.committed_position, self.read_position)
        return self.flushed_position

    # ------------------------------------------------------------------- reads
    def last_modified_timestamp(self) -> int:
        """``getLastModifiedTimestamp``: the file's mtime in milliseconds."""
        try:
            return os.stat(self.path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return 0

    def read(self, pos: int, size: int) -> bytes | None:
        """A copy of ``size`` bytes at ``pos`` if they lie below the read position."""
        if pos < 0 or size < 0 or pos + size > self.read_position or not self.hold():
            return None
        try:
            return self.buf[pos:pos + size]
        finally:
            self.release()

    def view(self, pos: int, size: int) -> memoryview | None:
        """``read`` without the copy: a memoryview of the mapped bytes. While it lives
        the mapping cannot be closed (``_cleanup`` leaves that to the view's end)."""
        if pos < 0 or size < 0 or pos + size > self.read_position or not self.hold():
            return None
        try:
            return memoryview(self.buf)[pos:pos + size]
        finally:
            self.release()

    # ------------------------------------------------------------------- lifecycle
    def hold(self) -> bool:
        if self.available and self._ref_count > 0:
            self._ref_count += 1
            return True
        return False

    def release(self) -> None:
        self._ref_count -= 1
        if self._ref_count <= 0:
            self._cleanup()

    def _cleanup(self) -> bool:
        if self.available:
            return False
        if not self.cleanup_over:
            try:
                self.buf.close()
            except BufferError:
                pass  # a view is still exported; the mapping goes when it is collected
            self.cleanup_over = True
        return True

    def shutdown(self, interval_forcibly_ms: int) -> None:
        if self.available:
            self.available = False
            self._first_shutdown_ms = now_ms()
            self.release()
        elif self._ref_count > 0 and now_ms() - self._first_shutdown_ms >= interval_forcibly_ms:
            self._ref_count = -1000 - self._ref_count
            self.release()

    def is_cleanup_over(self) -> bool:
        return self._ref_count <= 0 and self.cleanup_over

    def close(self) -> None:
        """Unmap and close without deleting (store shutdown)."""
        self.shutdown(0)
        if not self.is_cleanup_over():
            self.shutdown(0)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def destroy(self, interval_forcibly_ms: int) -> bool:
        """Shut down, then unmap, close and unlink once nothing holds the file.

        Returns False (try again later) while a holder remains and the forcible interval
        has not passed. Never truncates: other processes may have the file mapped.
        """
        self.shutdown(interval_forcibly_ms)
        if not self.is_cleanup_over():
            return False
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        unlink_quietly(self.path)
        return True

    def __repr__(self) -> str:
        return (f"MappedFile({self.file_name}, wrote={self.wrote_position}, "
                f"committed={self.committed_position}, flushed={self.flushed_position}, "
                f"size={self.file_size})")


def data_regions(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` regions the file system says may hold data (SEEK_DATA /
    SEEK_HOLE); the whole range where it cannot tell."""
    regions, pos = [], start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            return [(start, end)]
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        regions.append((data, hole))
        pos = hole
    return regions


def file_may_hold_data(fd: int, size: int, limit: int | None = INSPECT_LIMIT) -> bool:
    """False only when the file behind ``fd`` was provably never written.

    The file system names the regions that may hold data (SEEK_DATA/SEEK_HOLE:
    written extents, and pages a read pulled into the cache); each is read and
    checked for a non-zero byte. Past ``limit`` bytes of such regions the answer is
    True, so file systems that cannot tell cost little and err on the safe side;
    ``limit=None`` reads them all (a warmed file is zeros written over every page).
    """
    regions = data_regions(fd, 0, size)
    if limit is not None and sum(end - start for start, end in regions) > limit:
        return True
    for start, end in regions:
        for at in range(start, end, _INSPECT_CHUNK):
            n = min(_INSPECT_CHUNK, end - at)
            chunk = os.pread(fd, n, at)
            if len(chunk) < n or chunk.count(0) != n:
                return True
    return False


def unlink_quietly(path: str) -> None:
    """Unlink ``path``; a file already gone is not an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
