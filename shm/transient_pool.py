"""The TransientStorePool: write buffers of one CommitLog file each, in shared memory.

With ``transient_store_pool_enable`` (ASYNC_FLUSH only, as RocketMQ's
``isTransientStorePoolEnable``) the writer appends records into a pool buffer instead
of the file's mapping, and the flusher's commit step (RocketMQ's CommitRealTimeService:
``commit_interval_commit_log``, ``commit_commit_log_least_pages``, the thorough
interval) copies ``[COMMITTED, WRITTEN)`` from the buffers into the files with
``pwrite``, publishes COMMITTED, and flushes only what is committed. Dispatch, readers
and consumers never pass COMMITTED (``PositionTable.confirm_offset``): only committed
bytes are in the files they map.

Which buffer: CommitLog file ``k`` (from offset ``k * file_size``) is written in buffer
``k % size``. That buffer last held file ``k - size``, so it is free once that file is
wholly committed (``COMMITTED >= (k - size + 1) * file_size``): buffers come back in
order, as RocketMQ's ``returnBuffer`` after a file's last commit. No table is needed,
and nothing about the pool is lost when a process dies.

    segment                               size        created / removed by
    ------------------------------------  ----------  ------------------------------------
    /rocketstore-<digest>-pool-<i>         file size   the supervisor at start / at a clean
    (i = 0 .. transient_store_pool_size-1)            stop; a start after a crash first
                                                      commits what the last run's hold

Crash story: the buffers live in shared memory, not in any store process, so a killed
writer or flusher loses nothing acknowledged: the flusher (a new one too) commits
``[COMMITTED, WRITTEN)`` and a restarted writer appends on in the same buffer. When every
process dies (the supervisor too), the segments stay until the next ``rocketstore up``,
which commits them into the files before recovery (``commit_left_behind``: step
copy_pool of storage.recovery_plan's table S). Only a machine crash loses them, with
everything else not yet flushed: ASYNC_FLUSH's promise.

Memory: each buffer is locked in RAM (``mlock``, RocketMQ's reason for the pool) by the
supervisor where RLIMIT_MEMLOCK allows; when it does not, the start says so and the
buffers stay unlocked.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os

import posix_ipc

from rocketstore.shm.positions import SHM_DIR, segment_name
from rocketstore.storage.errors import StoreError

log = logging.getLogger(__name__)


class NoPoolBufferError(Exception):
    """The buffer the next CommitLog file needs still holds an uncommitted file."""


class PoolMemoryError(StoreError):
    """The shared memory cannot hold the pool's buffers."""


def buffer_name(store_dir: str, index: int) -> str:
    return f"{segment_name(store_dir)}-pool-{index}"


class TransientStorePool:
    """``size`` shared-memory buffers of ``file_size`` bytes, mapped read-write."""

    def __init__(self, store_dir: str, size: int, file_size: int, *, create: bool = False):
        self.store_dir = store_dir
        self.size = size
        self.file_size = file_size
        self.buffers: list[mmap.mmap] = []
        try:
            for i in range(size):
                self.buffers.append(_map(buffer_name(store_dir, i), file_size, create))
        except BaseException:
            self.close()
            if create:
                self.unlink(store_dir, size)
            raise

    # ---------------------------------------------------------------- which buffer
    def buffer_for(self, file_offset: int) -> mmap.mmap:
        """The buffer CommitLog file ``file_offset`` is written in."""
        return self.buffers[(file_offset // self.file_size) % self.size]

    def is_free_for(self, file_offset: int, committed: int) -> bool:
        """True when the buffer of file ``file_offset`` no longer holds uncommitted
        bytes of the file ``size`` files before it."""
        return committed >= file_offset - (self.size - 1) * self.file_size

    def remaining(self, written: int, committed: int) -> int:
        """Buffers not holding uncommitted bytes (RocketMQ's remainBufferNumbs)."""
        busy = (written - 1) // self.file_size - committed // self.file_size + 1 \
            if written > committed else 0
        return self.size - busy

    # ---------------------------------------------------------------- commit
    def commit(self, committed: int, written: int, fd_of) -> None:
        """Copy ``[committed, written)`` from the buffers into the files (``fd_of(file
        offset)`` gives a writable descriptor). Raises ``OSError``."""
        pos = committed
        while pos < written:
            file_offset = pos - pos % self.file_size
            end = min(written, file_offset + self.file_size)
            view = memoryview(self.buffer_for(file_offset))
            try:
                _pwrite_all(fd_of(file_offset), view[pos - file_offset:end - file_offset],
                            pos - file_offset)
            finally:
                view.release()
            pos = end

    # ---------------------------------------------------------------- memory
    def lock(self) -> bool:
        """mlock every buffer; False (logged) when the kernel refuses."""
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        for buf in self.buffers:
            anchor = ctypes.c_char.from_buffer(buf)
            address = ctypes.addressof(anchor)
            del anchor                       # the mapping may be closed again later
            if libc.mlock(address, self.file_size) != 0:
                err = ctypes.get_errno()
                log.warning("transient store pool: %d buffers of %d bytes not locked in RAM "
                            "(mlock: %s; raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK= in systemd)",
                            self.size, self.file_size, os.strerror(err))
                return False
        log.info("transient store pool: %d buffers of %d bytes locked in RAM", self.size,
                 self.file_size)
        return True

    def close(self) -> None:
        for buf in self.buffers:
            try:
                buf.close()
            except BufferError:
                pass    # a view is still out: the mapping goes with the process
        self.buffers = []

    @staticmethod
    def unlink(store_dir: str, size: int) -> None:
        for i in range(size):
            try:
                posix_ipc.unlink_shared_memory(buffer_name(store_dir, i))
            except posix_ipc.ExistentialError:
                pass


def _map(name: str, file_size: int, create: bool) -> mmap.mmap:
    if create:
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        try:
            # every page given now: a sparse buffer the tmpfs cannot back later would
            # kill the writer with SIGBUS at its append
            os.posix_fallocate(memory.fd, 0, file_size)
        except OSError as e:
            memory.close_fd()
            raise PoolMemoryError(
                f"the transient store pool cannot have its {file_size} bytes for {name} in "
                f"{SHM_DIR} ({e.strerror}; {_shm_free()}): enlarge {SHM_DIR} (a "
                "container's --shm-size), lower transient_store_pool_size, or turn "
                "transient_store_pool_enable off") from e
    else:
        memory = posix_ipc.SharedMemory(name)
    try:
        if memory.size != file_size:
            raise ValueError(f"{name} is {memory.size} bytes, not the file size {file_size}")
        return mmap.mmap(memory.fd, file_size)
    finally:
        memory.close_fd()


def _shm_free() -> str:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return f"{SHM_DIR} cannot be looked at"
    return f"{st.f_bavail * st.f_frsize} bytes free there"


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def copy_into_files(pool: TransientStorePool, committed: int, written: int,
                    commit_log_dir: str, *, sync: bool) -> None:
    """Copy ``[committed, written)`` from ``pool`` into the CommitLog files under
    ``commit_log_dir`` (fdatasync'ed with ``sync``). Raises ``OSError``."""
    from rocketstore.storage.mapped_file import offset_to_file_name
    fds: dict[int, int] = {}

    def fd_of(file_offset: int) -> int:
        if file_offset not in fds:
            fds[file_offset] = os.open(os.path.join(
                commit_log_dir, offset_to_file_name(file_offset)), os.O_RDWR)
        return fds[file_offset]

    try:
        pool.commit(committed, written, fd_of)
        if sync:
            for fd in fds.values():
                os.fdatasync(fd)
    finally:
        for fd in fds.values():
            os.close(fd)


def commit_left_behind(store_dir: str, size: int, file_size: int, committed: int,
                       written: int, commit_log_dir: str) -> int:
    """After every process died: copy what the last run's buffers hold past its
    COMMITTED into the files and fsync them. Returns the bytes committed (0 when the
    buffers are gone: a machine restart)."""
    if written <= committed:
        return 0
    try:
        pool = TransientStorePool(store_dir, size, file_size)
    except (posix_ipc.ExistentialError, ValueError) as e:
        log.warning("transient store pool of the last run is gone (%s): [%d, %d) was never "
                    "committed and is lost, as ASYNC_FLUSH allows", e, committed, written)
        return 0
    try:
        copy_into_files(pool, committed, written, commit_log_dir, sync=True)
    finally:
        pool.close()
    log.warning("committed [%d, %d) left in the transient store pool by the last run",
                committed, written)
    return written - committed
