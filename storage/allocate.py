"""AllocateMappedFileService: the next CommitLog files made ready ahead of the appender.

Creating a file inside the append puts a file creation and a directory fsync on the
writer's path, and every first write to a page of a fresh file then takes a page fault
(measured here: about a seventh of the writer's time under load). RocketMQ prepares the
next two files in a service thread; so does this, in a thread of the appending process:
every OS call it makes (``open``, ``ftruncate``, ``posix_fallocate``, ``pwrite``,
``fdatasync``, ``rename``) releases the interpreter lock, so the appender keeps running
meanwhile.

For each requested offset (the appender asks for the two files after the one it opens):

1. create ``.{name}.allocating`` beside the final name and give it its full size with
   ``ftruncate``: sparse, no block reserved (``storage.reservation``: the appender
   reserves a file's blocks a step ahead of its writes, and the first step of the next
   file once the current one is reserved to its end, ``MappedFileQueue.reserve_next``);
2. with ``warm_maped_file_enable``: ``posix_fallocate`` the whole file and write zeros
   over every page (``pwrite``, 1 MiB at a time), ``fdatasync`` every
   ``flush_least_pages_when_warm_maped_file`` pages (RocketMQ's warmMappedFile), so the
   file's pages sit in the page cache, allocated on disk: warming reserves every file
   made ahead whole, as it always did;
3. link it under its final name (``os.link`` fails rather than replace a file the appender
   made itself meanwhile: then the made one is dropped), unlink the temporary name, and
   fsync the directory.

Read-ahead (without warm-up): the appender says where it writes (``keep_ahead``), and
between allocations the thread reads the CommitLog from there to ``READ_AHEAD`` bytes
past it (``preadv``, 1 MiB at a time, into one buffer; into the next file when the
appender nears the end of one). The read brings those pages into the page cache as clean
zeros with no disk I/O (holes, or unwritten extents), so the appender's first write to a
page finds it there instead of allocating it in a page fault (its block is reserved
before the write, as always; a reservation leaves cached pages alone). It costs about the CPU
those faults took, in this thread instead of on the appender's path: on a 2-core virtual
machine whose fresh memory is slow to touch, copying 300-byte records into a new file
cost the appender 0.3-0.6 µs a record, 0.03 behind the read, and the ASYNC ingest of
``bench/pipeline.py`` rose 3-5% (alternating runs). At a file not made yet, the read
waits until this thread makes it (or the appender reaches it, having made it itself). A
store that is not written reads nothing; the pages are page cache like any other,
dropped under memory pressure. With the transient store pool the appender writes no
file page (the commit step's ``pwrite`` does), so it asks for no read-ahead. The read
comes in bursts (half of ``READ_AHEAD`` once the appender is half-way), and a fresh page
is slow to touch on a virtual machine (one 1 MiB read took up to 18 ms of CPU here): the
writer lets this thread run on its other CPUs (``procs.affinity.free_thread``).

``take(offset)`` hands the appender the file's path: at once when it is ready, after
waiting up to ``wait_ms`` when it is being made, and None when it was never asked for or
failed (the appender then creates it itself, as before). The appender maps the file and,
with warm-up, locks its pages in RAM (``mlock``; refused past RLIMIT_MEMLOCK, which is
said once in the log and otherwise harmless).

Crash story: a ``.allocating`` file is never part of the CommitLog (its name is not an
offset); a store start removes any left behind (``remove_leftovers``). A ready file
holds only zeros, like any preallocated next file, which recovery already knows.
"""

from __future__ import annotations

import logging
import os
import threading

from rocketstore.storage.dir_sync import fsync_dir
from rocketstore.storage.mapped_file import FILE_OPS, OS_PAGE_SIZE, offset_to_file_name
from rocketstore.storage import file_modes

log = logging.getLogger(__name__)

SUFFIX = ".allocating"
WARM_CHUNK = 1 << 20
ZEROS = bytes(WARM_CHUNK)
READ_AHEAD = 64 << 20       # how far past the appender the page cache is read


def remove_leftovers(directory: str) -> int:
    """Unlink the files a killed allocator left half made; how many there were."""
    if not os.path.isdir(directory):
        return 0
    n = 0
    for name in os.listdir(directory):
        if name.startswith(".") and name.endswith(SUFFIX):
            os.unlink(os.path.join(directory, name))
            n += 1
    return n


class AllocateMappedFileService:
    """Makes requested files ready in a background thread, one at a time, in order."""

    def __init__(self, directory: str, file_size: int, *, warm: bool = False,
                 flush_least_pages: int = 4096, wait_ms: int = 5000):
        self.directory = directory
        self.file_size = file_size
        self.warm = warm
        self.flush_every = max(1, flush_least_pages) * OS_PAGE_SIZE
        self.wait_ms = wait_ms
        self._cond = threading.Condition()
        self._queue: list[int] = []         # offsets asked for, not yet started
        self._busy: int | None = None       # the offset being made now
        self._ready: dict[int, str] = {}    # offset -> path, made and not yet taken
        self._failed: set[int] = set()
        self._stopping = False
        self._read_to = 0                   # read-ahead: the CommitLog is read up to here
        self._read_want = 0                 # ... and is to be read up to here
        self._read_blocked: int | None = None   # the file read-ahead waits for
        self._reading: tuple[int, int] | None = None    # (file offset, fd) read from
        self._buf: bytearray | None = None
        self.allocated = 0                  # files made, for status and tests
        self._thread = threading.Thread(target=self._run, name="allocate-mapped-file",
                                        daemon=True)
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        """The thread's id in the kernel (for ``os.sched_setaffinity``)."""
        return self._thread.native_id

    def request(self, *offsets: int) -> None:
        """Ask for these files (ones already on disk, asked for or made are skipped)."""
        with self._cond:
            for offset in offsets:
                if (offset in self._queue or offset == self._busy or offset in self._ready
                        or os.path.exists(self._path(offset))):
                    continue
                self._failed.discard(offset)
                self._queue.append(offset)
            self._cond.notify_all()

    def take(self, offset: int) -> str | None:
        """The path of the ready file for ``offset``, waiting for it when it is being
        made; None when it is not coming (the caller creates it itself)."""
        with self._cond:
            if offset in self._queue:
                self._queue.remove(offset)       # not started: quicker made inline
                return None
            if self._busy == offset:
                self._cond.wait_for(lambda: self._busy != offset, self.wait_ms / 1000)
                if self._busy == offset:
                    log.warning("allocation of %s still running after %d ms",
                                offset_to_file_name(offset), self.wait_ms)
                    return None
            return self._ready.pop(offset, None)

    def keep_ahead(self, offset: int) -> None:
        """The appender writes at CommitLog ``offset``: have the pages up to
        ``READ_AHEAD`` past it read into the page cache. Cheap when nothing new is
        asked: it asks again only every half ``READ_AHEAD``. Nothing with warm-up (the
        files' pages were written already)."""
        if self.warm or offset + READ_AHEAD // 2 <= self._read_want:
            return
        with self._cond:
            self._read_to = max(self._read_to, offset - offset % OS_PAGE_SIZE)
            self._read_want = offset + READ_AHEAD
            if self._read_blocked is not None and self._read_to >= self._read_blocked:
                self._read_blocked = None   # the appender is there: it made the file
            self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=self.wait_ms / 1000 + 1)

    # ---------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            while self._turn():
                pass
        finally:
            self._stop_reading()

    def _turn(self) -> bool:
        """Make the next file asked for, else read one chunk ahead; False to stop."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._stopping or (
                self._read_blocked is None and self._read_to < self._read_want))
            if self._stopping:
                return False
            if self._queue:
                offset = self._busy = self._queue.pop(0)
            else:
                at = self._read_to
                end = self._read_to = min(at + WARM_CHUNK,
                                          at - at % self.file_size + self.file_size)
                offset = None
        if offset is None:
            self._read_chunk(at, end)
            return True
        path = None
        try:
            path = self._make(offset)
        except OSError as e:
            log.warning("allocating %s failed (the appender will create it): %s",
                        offset_to_file_name(offset), e)
        with self._cond:
            self._busy = None
            if path is None:
                self._failed.add(offset)
            else:
                self._ready[offset] = path
                self.allocated += 1
                if self._read_blocked == offset:
                    self._read_blocked = None
            self._cond.notify_all()
        return True

    def _read_chunk(self, at: int, end: int) -> None:
        """Read the CommitLog from ``at`` to ``end`` (within one file). At a file not
        made yet, read-ahead waits until this thread makes it or the appender reaches it
        (then it made the file itself)."""
        base = at - at % self.file_size
        if self._reading is None or self._reading[0] != base:
            self._stop_reading()
            try:
                self._reading = (base, os.open(self._path(base), os.O_RDONLY))
            except OSError:
                with self._cond:
                    if self._read_to == end:    # keep_ahead did not move it meanwhile
                        self._read_to, self._read_blocked = at, base
                return
        if self._buf is None:
            self._buf = bytearray(WARM_CHUNK)
        try:
            os.preadv(self._reading[1], [memoryview(self._buf)[:end - at]], at - base)
        except OSError as e:
            log.debug("read-ahead at %d: %s", at, e)

    def _stop_reading(self) -> None:
        if self._reading is not None:
            os.close(self._reading[1])
            self._reading = None

    def _make(self, offset: int) -> str | None:
        final = self._path(offset)
        if os.path.exists(final):
            return final
        if offset >= self.file_size and not os.path.exists(self._path(offset - self.file_size)):
            log.info("not allocating %s: the file before it is missing (files must follow "
                     "one another)", offset_to_file_name(offset))
            return None
        tmp = os.path.join(self.directory, f".{offset_to_file_name(offset)}{SUFFIX}")
        file_modes.make_dirs(self.directory)
        fd = file_modes.create(tmp, os.O_RDWR | os.O_TRUNC)
        try:
            os.ftruncate(fd, self.file_size)
            if self.warm:
                FILE_OPS.fallocate(fd, 0, self.file_size)
                self._warm(fd)
            try:
                os.link(tmp, final)
            except FileExistsError:
                log.info("%s was made by the appender meanwhile", final)
        finally:
            os.close(fd)
            os.unlink(tmp)
        fsync_dir(self.directory)
        return final

    def _warm(self, fd: int) -> None:
        """Write zeros over the whole file, syncing every ``flush_every`` bytes."""
        unsynced = 0
        for pos in range(0, self.file_size, WARM_CHUNK):
            if self._stopping:
                raise OSError("allocation stopped")
            n = min(WARM_CHUNK, self.file_size - pos)
            os.pwrite(fd, ZEROS[:n] if n < WARM_CHUNK else ZEROS, pos)
            unsynced += n
            if unsynced >= self.flush_every:
                FILE_OPS.fdatasync(fd)
                unsynced = 0
        FILE_OPS.fdatasync(fd)

    def _path(self, offset: int) -> str:
        return os.path.join(self.directory, offset_to_file_name(offset))
