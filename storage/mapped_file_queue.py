"""MappedFileQueue: one directory of same-size MappedFiles, seen as one endless file.

File ``n`` is named ``name[n-1] + mapped_file_size`` (20-digit offsets), so a global
offset finds its file by arithmetic relative to the first file (old files are deleted,
so the first need not start at 0). One global pointer summarises the files:

    flushed_where <= max_wrote_position

(committed is wrote here: there is no transient pool, so RocketMQ's committedWhere
would only repeat it.)

``flush(least_pages)`` works on the one file holding ``flushed_where`` per call and
returns True when nothing moved (callers loop). The last file is the only one written.

Creation follows AllocateMappedFileService: when file ``n`` is created, file ``n+1`` is
made on disk too (``preallocate_next``), so the next roll-over only maps it. A file made
ahead is full-size and reads as zeros, but reserves no blocks until it is written, or
until the file before it is reserved to its end (``reserve_next``: its first step then);
a file made ahead that is found at load is simply an empty last file. Every write into
a file of the queue is preceded by its reservation (``storage.reservation``).

Deletion never truncates: files are unlinked (``MappedFile.destroy``), oldest first,
never the last one, at most ``DELETE_FILES_BATCH_MAX`` per call, stopping at the first
file that may not go.

Crash story: at load every file's positions are set to its size; recovery then calls
``truncate_dirty_files(offset)``, which sets the file holding ``offset`` back to it,
zeroes that file's bytes after it, and unlinks every later file (a never-written,
preallocated next file stays on disk, out of the list, until it is needed).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import TYPE_CHECKING, Callable

from rocketstore.storage.dir_sync import DirSyncs, fsync_dir
from rocketstore.storage.errors import StoreFileError
from rocketstore.storage.mapped_file import (
    INSPECT_LIMIT, MappedFile, data_regions, file_may_hold_data, now_ms,
    offset_to_file_name)
from rocketstore.storage.reservation import allocate, reserve_step
from rocketstore.storage import file_modes, record

if TYPE_CHECKING:
    from rocketstore.storage.allocate import AllocateMappedFileService

log = logging.getLogger(__name__)

DELETE_FILES_BATCH_MAX = 10


class MappedFileQueue:
    def __init__(self, store_path: str, mapped_file_size: int, *,
                 preallocate_next: bool = False, read_only: bool = False,
                 dir_syncs: DirSyncs | None = None, advise_random: bool = False):
        self.store_path = store_path
        self.dir_syncs = dir_syncs      # owed the directory fsyncs of files made here
        self.advise_random = advise_random      # files made here: MappedFile.advise_random
        self.mapped_file_size = mapped_file_size
        self.preallocate_next = preallocate_next
        self.allocator: "AllocateMappedFileService | None" = None
        self._lock_refusal_said = False
        self._next_reserved = -1    # the file whose successor reserve_next served
        self.read_only = read_only
        self.mapped_files: list[MappedFile] = []
        self._past_view: list[MappedFile] = []   # mapped, hidden by ``show_first``
        self.flushed_where = 0
        self.store_timestamp = 0
        self.short_file_index: int | None = None

    # ------------------------------------------------------------------ load
    def load(self, *, extend_short: bool = False) -> None:
        """Map every file of the directory in name order; positions set to the size.

        Every check runs before any file is touched: files must follow one another and
        have the configured size, else ``StoreFileError`` names the first that does not.
        One file may be shorter (a truncated tail), only when ``extend_short`` (the
        caller knows the configured size is the store's own) and only if every file
        after it was never written (a preallocated next file): it is grown back,
        zero-filled, so recovery finds where its valid data ends, and
        ``short_file_index`` names it. A short file followed by data is damage an
        operator must look at: the load fails.
        """
        if not os.path.isdir(self.store_path):
            return
        names = sorted(n for n in os.listdir(self.store_path) if n.isdigit())
        self.short_file_index = self._check_files(names, extend_short)
        for i, name in enumerate(names):
            mf = MappedFile(os.path.join(self.store_path, name), self.mapped_file_size,
                            read_only=self.read_only, create=False,
                            extend_short=i == self.short_file_index)
            if mf.was_extended:
                log.warning("%s was shorter than %d bytes; grown back for recovery",
                            mf.path, self.mapped_file_size)
            mf.set_positions(self.mapped_file_size)
            self.mapped_files.append(mf)

    def refresh(self, min_offset: int = -1) -> None:
        """Read-only views only: map files another process created after the last file
        mapped here, and unmap files wholly below ``min_offset`` (deleted by the
        cleaner, or about to be). When the first file on disk lies past the last one
        mapped here, the cleaner took them all: the view starts again from the files
        there are. A file not yet at its full size (being made) is left for a later call. Every
        mapped file is shown again first (``show_all``)."""
        self.show_all()
        while self.mapped_files and \
                self.mapped_files[0].file_from_offset + self.mapped_file_size <= min_offset \
                and len(self.mapped_files) > 1:
            self.mapped_files.pop(0).close()
        try:
            names = sorted(n for n in os.listdir(self.store_path) if n.isdigit())
        except FileNotFoundError:
            return
        last = self.get_last_mapped_file()
        if last is not None and names and int(names[0]) > last.file_from_offset:
            # every file mapped here is gone, and the ones after it too (the cleaner
            # passed them all while this view looked elsewhere): start from the first
            for mf in self.mapped_files:
                mf.close()
            self.mapped_files, last = [], None
        next_offset = last.file_from_offset + self.mapped_file_size if last else None
        for name in names:
            offset = int(name)
            if next_offset is not None and offset != next_offset:
                continue
            path = os.path.join(self.store_path, name)
            try:
                if os.path.getsize(path) != self.mapped_file_size:
                    return
                mf = MappedFile(path, self.mapped_file_size, read_only=self.read_only,
                                create=False)
            except (FileNotFoundError, StoreFileError):
                return
            mf.set_positions(self.mapped_file_size)
            self.mapped_files.append(mf)
            next_offset = offset + self.mapped_file_size

    def finish_interrupted_creation(self) -> None:
        """Finish a short last file that was never written: a creation a kill cut short
        between the ``open(O_CREAT)``, the ``fallocate`` of its first step and the
        ``ftruncate`` to full size (it holds nothing; no one can have mapped it: readers
        map only full-size files). Any other short file is left for ``load`` to reject.
        Call before ``load``."""
        names = sorted(n for n in os.listdir(self.store_path) if n.isdigit())
        if not names:
            return
        path = os.path.join(self.store_path, names[-1])
        size = os.path.getsize(path)
        if size == 0:
            log.warning("%s has length 0 (its creation was interrupted): allocating it", path)
            MappedFile(path, self.mapped_file_size).close()
        elif size < self.mapped_file_size and not _path_may_hold_data(path, size):
            log.warning("%s has length %d and was never written (its creation was "
                        "interrupted): giving it its full size", path, size)
            os.truncate(path, self.mapped_file_size)

    def _check_files(self, names: list[str], extend_short: bool) -> int | None:
        """Raise ``StoreFileError`` for a gap or a wrong size; the short file's index."""
        short = None
        for i, name in enumerate(names):
            path = os.path.join(self.store_path, name)
            if i and int(name) != int(names[i - 1]) + self.mapped_file_size:
                raise StoreFileError(path, f"does not follow {names[i - 1]} at a distance of "
                                     f"{self.mapped_file_size} bytes: a file is missing or the "
                                     "file size differs from the configuration")
            size = os.path.getsize(path)
            if size == self.mapped_file_size:
                if short is not None and _path_may_hold_data(path, size):
                    raise StoreFileError(os.path.join(self.store_path, names[short]),
                                         "is shorter than the configured file size and later "
                                         "files hold data; check it manually")
            elif extend_short and short is None and size < self.mapped_file_size:
                short = i
            else:
                raise StoreFileError(path, f"length {size} does not match the configured file "
                                     f"size {self.mapped_file_size}; check it manually")
        return short

    # ------------------------------------------------------------------ bounded view
    def show_first(self, count: int) -> None:
        """Read-only views only: lookups (first and last file, find by offset or time,
        max offset) see only the first ``count`` mapped files until ``show_all``; the
        others stay mapped (a reader's bound lies before them)."""
        assert self.read_only, "only a read-only view hides files"
        every = self.mapped_files + self._past_view
        self.mapped_files, self._past_view = every[:count], every[count:]

    def show_all(self) -> None:
        """Undo ``show_first``: every mapped file is in ``mapped_files`` again."""
        if self._past_view:
            self.mapped_files = self.mapped_files + self._past_view
            self._past_view = []

    def all_mapped_files(self) -> list[MappedFile]:
        """Every mapped file, those ``show_first`` hides included."""
        return self.mapped_files + self._past_view

    # ------------------------------------------------------------------ lookup
    def get_first_mapped_file(self) -> MappedFile | None:
        return self.mapped_files[0] if self.mapped_files else None

    def get_last_mapped_file(self) -> MappedFile | None:
        return self.mapped_files[-1] if self.mapped_files else None

    def check_self(self) -> list[str]:
        """RocketMQ's ``checkSelf``: adjacent files must start exactly one file size
        apart; each break is described (and logged as an error)."""
        problems = gaps_between([mf.file_from_offset for mf in self.mapped_files],
                                self.mapped_file_size, self.store_path)
        for problem in problems:
            log.error("[BUG] the mapped file queue's data is damaged: %s", problem)
        return problems

    def get_or_create_last_mapped_file(self, start_offset: int = 0) -> MappedFile:
        """``getLastMappedFile(startOffset, true)``: the last file, or a new one when the
        queue is empty (at the window holding ``start_offset``) or its last file is full.

        Raises ``StoreFileError`` when the file cannot be created (disk full, ...).
        """
        last = self.get_last_mapped_file()
        if last is not None and not last.is_full():
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        if self.allocator is not None:
            self.allocator.take(create_offset)      # made ahead, or made here
        mf = MappedFile(self._path(create_offset), self.mapped_file_size,
                        dir_syncs=self.dir_syncs)
        if self.advise_random and mf.created:
            mf.advise_random()
        if self.allocator is not None:
            self.allocator.request(create_offset + self.mapped_file_size,
                                   create_offset + 2 * self.mapped_file_size)
            if self.allocator.warm:
                self._lock(mf)
        elif self.preallocate_next:
            self._preallocate(create_offset + self.mapped_file_size)
        if not self.mapped_files:
            mf.first_create_in_queue = True
        self.mapped_files.append(mf)
        return mf

    def use_allocator(self, allocator: "AllocateMappedFileService") -> None:
        """Have ``allocator`` make the next two files ahead of need from now on (the
        single appender does this; ``storage.allocate``)."""
        self.allocator = allocator

    def _lock(self, mf: MappedFile) -> None:
        """Keep a warmed file's pages in RAM; say once when the OS refuses."""
        if not mf.mlock() and not self._lock_refusal_said:
            self._lock_refusal_said = True
            log.warning("mlock of %s refused (RLIMIT_MEMLOCK %s): warmed files stay "
                        "pre-touched but not locked in RAM", mf.path, _memlock_limit())

    def _preallocate(self, offset: int) -> None:
        """Create the next file ahead of need, reserving nothing; failure only costs
        latency later."""
        path = self._path(offset)
        if os.path.exists(path):
            return
        try:
            MappedFile(path, self.mapped_file_size, dir_syncs=self.dir_syncs,
                       reserve_first=False).close()
        except StoreFileError as e:
            log.warning("preallocation failed: %s", e)

    def reserve_next(self, mf: MappedFile) -> None:
        """Once ``mf`` (the last file) is reserved to its end, which its writes reach a
        step and a half before they fill it, reserve the first step of the file after
        it if that was made ahead: the roll-over then writes into allocated blocks.
        Once per file; a failure is only logged (the append reserves what it writes
        itself, and refuses then if the disk is still full)."""
        if mf.reserved_position < mf.file_size or self._next_reserved == mf.file_from_offset:
            return
        path = self._path(mf.file_from_offset + self.mapped_file_size)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return                  # not made (yet): the roll-over makes it reserved
        self._next_reserved = mf.file_from_offset
        try:
            allocate(path, fd, 0, reserve_step(self.mapped_file_size))
        except StoreFileError as e:
            log.warning("reserving ahead: %s", e)
        finally:
            os.close(fd)

    def _path(self, offset: int) -> str:
        return os.path.join(self.store_path, offset_to_file_name(offset))

    def find_mapped_file_by_offset(self, offset: int,
                                   return_first_on_not_found: bool = False) -> MappedFile | None:
        first, last = self.get_first_mapped_file(), self.get_last_mapped_file()
        if first is None or last is None:
            return None
        if first.file_from_offset <= offset < last.file_from_offset + self.mapped_file_size:
            index = offset // self.mapped_file_size - first.file_from_offset // self.mapped_file_size
            if 0 <= index < len(self.mapped_files):
                mf = self.mapped_files[index]
                if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                    return mf
            for mf in self.mapped_files:
                if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                    return mf
        return first if return_first_on_not_found else None

    # ------------------------------------------------------------------ offsets
    def get_min_offset(self) -> int:
        first = self.get_first_mapped_file()
        return first.file_from_offset if first else -1

    def get_max_offset(self) -> int:
        """The readable end: last file's start + its read position (0 when empty)."""
        last = self.get_last_mapped_file()
        return last.file_from_offset + last.read_position if last else 0

    def get_max_wrote_position(self) -> int:
        last = self.get_last_mapped_file()
        return last.file_from_offset + last.wrote_position if last else 0

    def roll_next_file(self, offset: int) -> int:
        return offset + self.mapped_file_size - offset % self.mapped_file_size

    # ------------------------------------------------------------------ flush
    def flush(self, flush_least_pages: int) -> bool:
        """Flush the file holding ``flushed_where``; True when nothing moved.

        Raises ``OSError`` from fdatasync: the caller must stop accepting writes.
        """
        first = self.get_first_mapped_file()
        if first is not None and self.flushed_where < first.file_from_offset:
            self.flushed_where = first.file_from_offset  # older files were deleted
        mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
        if mf is None:
            return True
        tmp = mf.store_timestamp
        where = mf.file_from_offset + mf.flush(flush_least_pages)
        result = where == self.flushed_where
        self.flushed_where = where
        if flush_least_pages == 0:
            self.store_timestamp = tmp
        return result

    def flush_dirty(self, flush_least_pages: int) -> None:
        """Flush file after file while the least-pages rule lets one move."""
        for _ in range(len(self.mapped_files) + 1):
            if self.flush(flush_least_pages):
                return

    def flush_all(self) -> None:
        """Flush until everything written is durable (shutdown, sync flush); always
        flushes once, which also brings ``store_timestamp`` up to date."""
        target = self.get_max_wrote_position()
        for _ in range(len(self.mapped_files) + 2):
            self.flush(0)
            if self.flushed_where >= target:
                return
        raise StoreFileError(self.store_path, f"flush stopped at {self.flushed_where}, "
                             f"short of {target}")

    # ------------------------------------------------------------------ truncation
    def truncate_dirty_files(self, offset: int, quarantine_dir: str | None = None, *,
                             keep_files: bool = False) -> None:
        """Cut the queue back to ``offset``: the file holding it is reset and zeroed past
        it; every later file goes, except a never-written file right after it (the
        preallocated next file), which is only closed and stays on disk for later use.

        With ``quarantine_dir``, nothing that holds data is destroyed: the non-zero bytes
        cut from the holding file are copied there first, and later files that hold data
        are moved there instead of unlinked.

        With ``keep_files`` (a process restarting while others run and may have these
        files mapped), later files are zeroed in place and closed, never unlinked: a file
        created again under the same name would leave the others reading the old inode.
        """
        remove = []
        holder = None
        for mf in self.mapped_files:
            tail = mf.file_from_offset + self.mapped_file_size
            if tail <= offset:
                continue
            if offset >= mf.file_from_offset:
                holder = mf
                pos = offset % self.mapped_file_size
                if quarantine_dir:
                    _quarantine_tail(mf, pos, quarantine_dir)
                mf.zero_tail(pos)
                mf.set_positions(pos)
                continue
            if keep_files:
                if mf.may_hold_data():              # zeroing zeros again does no harm
                    mf.zero_tail(0)
                mf.close()
                remove.append(mf)
                continue
            # before a quarantine, every byte is read: a warmed file is zeros written
            # over every page, past any limit, and is not data
            never_written = not mf.may_hold_data(limit=None if quarantine_dir else INSPECT_LIMIT)
            next_to_holder = holder is not None and \
                mf.file_from_offset == holder.file_from_offset + self.mapped_file_size
            if never_written and next_to_holder:
                mf.close()
            elif quarantine_dir and not never_written:
                _quarantine_file(mf, quarantine_dir)
            else:
                mf.destroy(1000)
            remove.append(mf)
        self.delete_expired_file(remove)
        self.flushed_where = min(self.flushed_where, offset)

    def mark_flushed_to(self, offset: int) -> None:
        """Everything below ``offset`` is durable already: recovery found it on disk, or
        a queue's first file starts there (the units before it were never written)."""
        self.flushed_where = offset

    def clamp_flushed_where(self) -> None:
        """Keep ``flushed_where`` within the data after a cut or a rewind."""
        self.flushed_where = min(self.flushed_where, self.get_max_offset())

    def close_last_mapped_file(self) -> None:
        """Unmap the last file and drop it from the list, keeping it on disk (a restarting
        writer of a queue others may map: it opens the file again when it gets there)."""
        last = self.mapped_files.pop()
        last.close()

    def delete_last_mapped_file(self) -> None:
        last = self.get_last_mapped_file()
        if last is not None:
            last.destroy(1000)
            self.mapped_files.remove(last)

    def delete_expired_file(self, files: list[MappedFile]) -> None:
        """Drop destroyed (or unmapped) files from the list (those not in it are
        skipped); ``flushed_where`` never stays below the first file left."""
        gone = {id(f) for f in files}
        self.mapped_files = [mf for mf in self.mapped_files if id(mf) not in gone]
        first = self.get_first_mapped_file()
        if first is not None and self.flushed_where < first.file_from_offset:
            self.flushed_where = first.file_from_offset

    # ------------------------------------------------------------------ expiry
    def delete_expired_file_by_time(self, expired_time_ms: int, delete_files_interval_ms: int,
                                    interval_forcibly_ms: int, clean_immediately: bool,
                                    now: Callable[[], int] = now_ms,
                                    below_offset: int | None = None) -> int:
        """Delete files unmodified for ``expired_time_ms`` (any age when
        ``clean_immediately``), oldest first, never the last, stopping at the first that
        may not go, at most ``DELETE_FILES_BATCH_MAX``; with ``below_offset``, only files
        that end at or below it (data not yet flushed and dispatched never expires).
        Returns how many went."""
        candidates = [mf for mf in self.mapped_files[:-1]
                      if below_offset is None or
                      mf.file_from_offset + self.mapped_file_size <= below_offset]
        deleted: list[MappedFile] = []
        for i, mf in enumerate(candidates):
            if not (now() >= mf.last_modified_timestamp() + expired_time_ms or clean_immediately):
                break
            if not mf.destroy(interval_forcibly_ms):
                break
            deleted.append(mf)
            if len(deleted) >= DELETE_FILES_BATCH_MAX:
                break
            if delete_files_interval_ms > 0 and i + 1 < len(candidates):
                time.sleep(delete_files_interval_ms / 1000)
        self.delete_expired_file(deleted)
        if deleted:
            fsync_dir(self.store_path)
        return len(deleted)

    def delete_expired_file_by_offset(self, offset: int,
                                      last_unit_offset: Callable[[MappedFile], int | None], *,
                                      unlink: bool = True) -> int:
        """Delete non-last files whose last unit points below ``offset`` (consume queues).

        ``last_unit_offset(mf)`` reads the CommitLog offset held by the file's last unit
        (None when unreadable, which also lets it go). Without ``unlink`` the files are
        only unmapped and dropped from the list (a process that follows the cleaner,
        which unlinks them).
        """
        deleted: list[MappedFile] = []
        for mf in self.mapped_files[:-1]:
            phy = last_unit_offset(mf)
            if phy is not None and phy >= offset:
                break
            if not unlink:
                mf.close()
            elif not mf.destroy(60_000):
                break
            deleted.append(mf)
        self.delete_expired_file(deleted)
        return len(deleted)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        self.show_all()
        for mf in self.mapped_files:
            mf.close()

    def destroy(self) -> None:
        for mf in self.mapped_files:
            mf.destroy(3000)
        self.mapped_files = []
        self.flushed_where = 0
        if os.path.isdir(self.store_path):
            for name in os.listdir(self.store_path):
                if name.isdigit():
                    os.unlink(os.path.join(self.store_path, name))
            try:
                os.rmdir(self.store_path)
            except OSError:
                pass


def _memlock_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"


def _quarantine_tail(mf: MappedFile, pos: int, quarantine_dir: str) -> None:
    """Copy every region of ``mf`` after ``pos`` (a CommitLog's: a record starts at
    ``pos``) that holds a non-zero byte to ``{name}.from-{region start}``: up to its last
    non-zero byte, and on to the end of the record that holds it where the region
    starts at ``pos`` (a record may end in zeros)."""
    for start, end in data_regions(mf.fd, pos, mf.file_size):
        data = mf.buf[start:end]
        if data.count(0) == len(data):
            continue
        kept = len(data.rstrip(b"\0"))
        if start == pos:
            kept = record.chain_end(data, kept)
        file_modes.make_dirs(quarantine_dir)
        dest = os.path.join(quarantine_dir, f"{mf.file_name}.from-{start}")
        with os.fdopen(file_modes.create(dest, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(data[:kept])
            os.fsync(f.fileno())
        log.warning("recovery cut %s at %d; the bytes from %d are kept in %s",
                    mf.path, pos, start, dest)


def _quarantine_file(mf: MappedFile, quarantine_dir: str) -> None:
    """Move a cut-away file that holds data into ``quarantine_dir`` (never unlinked)."""
    file_modes.make_dirs(quarantine_dir)
    mf.close()
    dest = os.path.join(quarantine_dir, mf.file_name)
    os.replace(mf.path, dest)
    fsync_dir(os.path.dirname(mf.path))
    log.warning("recovery cut away %s; kept as %s", mf.path, dest)


def _path_may_hold_data(path: str, size: int) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return file_may_hold_data(fd, size)
    finally:
        os.close(fd)


def gaps_between(offsets: list[int], file_size: int, where: str) -> list[str]:
    """The places where files starting at ``offsets`` (in order) do not follow each
    other one ``file_size`` apart."""
    return [f"{where}: the file after {prev} starts at {cur}, not {prev + file_size}"
            for prev, cur in zip(offsets, offsets[1:]) if cur - prev != file_size]
