"""ConsumeQueue: the per-(topic, queue) index into the CommitLog, in 20-byte units.

    offset  width  field
    0       8      commitLogOffset   where the message's record starts
    8       4      size              the record's total length
    12      8      tagsCode          tags.hashCode(); for SCHEDULE_TOPIC_XXXX the
                                     delivery time in ms

Unit ``n`` (the logical queue offset) lives at byte ``n * 20`` of the queue's byte space,
in ``{root}/consumequeue/{topic}/{queueId}/{20-digit start byte offset}``. File sizes are
a multiple of 20 (the configured size is rounded up). A queue whose first unit is not 0
(its older files were deleted, or the queue was rebuilt from a later point) starts in the
file-aligned window holding that unit, and the units before it in that file are filled
with blanks ``(0, 0x7FFFFFFF, 0)``.

Invariants kept here:

* ``max_physic_offset`` is end-exclusive: the CommitLog offset just past the last
  message this queue holds (RocketMQ >= 4.5.1's convention). A put whose message ends at
  or before it is a duplicate and is skipped, which makes re-dispatch idempotent.
* ``min_logic_offset`` is the byte offset of the first unit whose message still exists.

A file made here owes its directory fsyncs to the holder's ``DirSyncs`` (paid before the
checkpoint covers its units, ``storage.dir_sync``) and faults in a page at a time
(``MappedFile.advise_random``): dispatch creates it inline.

Crash story: the CommitLog is the truth. At load the last three files are scanned and
the queue is cut at the first unit that is not ``offset >= 0 and size > 0``; units that
point past the recovered CommitLog end are then cut (``truncate_dirty_logic_files``) and
missing units are re-dispatched from the CommitLog.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Iterator

import numpy as np

from rocketstore.storage.dir_sync import DirSyncs
from rocketstore.storage.mapped_file import MappedFile, offset_to_file_name
from rocketstore.storage.mapped_file_queue import MappedFileQueue

CQ_STORE_UNIT_SIZE = 20
CQ_UNIT = struct.Struct(">qiq")
assert CQ_UNIT.size == CQ_STORE_UNIT_SIZE
CQ_PHY_OFFSET = struct.Struct(">q")
BLANK_UNIT_SIZE = 0x7FFFFFFF  # the size field of a pre-blank filler unit
BLANK_UNIT = CQ_UNIT.pack(0, BLANK_UNIT_SIZE, 0)
CQ_UNIT_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])  # numpy's CQ_UNIT
assert CQ_UNIT_DTYPE.itemsize == CQ_STORE_UNIT_SIZE


def encode_unit(commit_log_offset: int, size: int, tags_code: int) -> bytes:
    return CQ_UNIT.pack(commit_log_offset, size, tags_code)


def decode_unit(buf, pos: int) -> tuple[int, int, int]:
    return CQ_UNIT.unpack_from(buf, pos)


def is_valid_unit(offset: int, size: int) -> bool:
    return offset >= 0 and size > 0


class ConsumeQueue:
    def __init__(self, topic: str, queue_id: int, root_dir: str, mapped_file_size: int,
                 *, read_only: bool = False, dir_syncs: DirSyncs | None = None):
        self.topic = topic
        self.queue_id = queue_id
        if mapped_file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"a consume queue file size must be a multiple of "
                             f"{CQ_STORE_UNIT_SIZE}, not {mapped_file_size} "
                             "(StoreConfig.consume_queue_file_size rounds it up)")
        self.mapped_file_size = mapped_file_size
        self.store_path = os.path.join(root_dir, topic, str(queue_id))
        self.mapped_file_queue = MappedFileQueue(self.store_path, self.mapped_file_size,
                                                 read_only=read_only, dir_syncs=dir_syncs,
                                                 advise_random=True)
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    # ------------------------------------------------------------------ load, recover
    def load(self) -> None:
        self.mapped_file_queue.load()

    def recover(self) -> None:
        """Cut the queue at its first invalid unit, scanning the last three files."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return
        index = max(0, len(files) - 3)
        process_offset = files[index].file_from_offset
        while True:
            mf = files[index]
            valid = self._valid_prefix(mf)
            process_offset = mf.file_from_offset + valid
            if valid == self.mapped_file_size and index + 1 < len(files):
                index += 1
                continue
            break
        self.mapped_file_queue.mark_flushed_to(process_offset)
        self.mapped_file_queue.truncate_dirty_files(process_offset)

    def _valid_prefix(self, mf: MappedFile) -> int:
        """Bytes of valid units at the start of ``mf``; updates ``max_physic_offset``."""
        buf = mf.buf
        for pos in range(0, self.mapped_file_size, CQ_STORE_UNIT_SIZE):
            offset, size, _ = CQ_UNIT.unpack_from(buf, pos)
            if not is_valid_unit(offset, size):
                return pos
            if size != BLANK_UNIT_SIZE:
                self.max_physic_offset = offset + size
        return self.mapped_file_size

    # ------------------------------------------------------------------ write
    def put_message_position_info(self, offset: int, size: int, tags_code: int,
                                  cq_offset: int) -> bool:
        """Append unit ``cq_offset``; idempotent. False only if no file could be had.

        A unit below the queue's end is a repeat and is skipped; a gap is written
        anyway (RocketMQ logs it as a bug and goes on), which ``check()`` reports.
        """
        if offset + size <= self.max_physic_offset:
            return True
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        mfq = self.mapped_file_queue
        mf = mfq.get_or_create_last_mapped_file(expect)
        if mf.first_create_in_queue and cq_offset != 0 and mf.wrote_position == 0:
            self.min_logic_offset = expect
            mfq.mark_flushed_to(expect)
            self._fill_pre_blank(mf, expect)
        current = mf.file_from_offset + mf.wrote_position
        if expect < current:  # built already (a repeat): never write a unit twice
            return True
        mf.append(CQ_UNIT.pack(offset, size, tags_code))
        self.max_physic_offset = offset + size
        return True

    def put_units(self, offsets: np.ndarray, sizes: np.ndarray, tags_codes: np.ndarray,
                  cq_offsets: np.ndarray) -> None:
        """``put_message_position_info`` for a run of one queue's units in CommitLog
        order, with the same outcome byte for byte: repeats skipped, the first new unit
        put one by one (it may create the queue's first file or meet a gap), and the
        rest, when their queue offsets follow on, copied a file's share at a time."""
        first = int(np.searchsorted(offsets + sizes, self.max_physic_offset, side="right"))
        if first == len(offsets):
            return
        self.put_message_position_info(int(offsets[first]), int(sizes[first]),
                                       int(tags_codes[first]), int(cq_offsets[first]))
        rest = slice(first + 1, len(offsets))
        expect = int(cq_offsets[first]) + 1
        follows = np.array_equal(cq_offsets[rest], np.arange(expect, expect + len(offsets)
                                                             - first - 1))
        mfq = self.mapped_file_queue
        last = mfq.get_last_mapped_file()
        if not follows or last is None or \
                last.file_from_offset + last.wrote_position != expect * CQ_STORE_UNIT_SIZE:
            for k in range(rest.start, rest.stop):
                self.put_message_position_info(int(offsets[k]), int(sizes[k]),
                                               int(tags_codes[k]), int(cq_offsets[k]))
            return
        units = np.empty(rest.stop - rest.start, CQ_UNIT_DTYPE)
        units["phy"], units["size"], units["tags_code"] = \
            offsets[rest], sizes[rest], tags_codes[rest]
        block = units.tobytes()
        done = 0
        while done < len(block):
            mf = mfq.get_or_create_last_mapped_file(expect * CQ_STORE_UNIT_SIZE + done)
            room = self.mapped_file_size - mf.wrote_position
            mf.append(block[done:done + room])
            done += min(room, len(block) - done)
        self.max_physic_offset = int(offsets[-1] + sizes[-1])

    def _fill_pre_blank(self, mf: MappedFile, until_where: int) -> None:
        n = (until_where % self.mapped_file_size) // CQ_STORE_UNIT_SIZE
        mf.append(BLANK_UNIT * n)

    def flush(self, flush_least_pages: int) -> bool:
        return self.mapped_file_queue.flush(flush_least_pages)

    # ------------------------------------------------------------------ read
    def get_min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_max_offset_in_queue(self) -> int:
        """The next logical offset to be written."""
        return self.mapped_file_queue.get_max_offset() // CQ_STORE_UNIT_SIZE

    def get_index_buffer(self, start_index: int) -> tuple[MappedFile, int, int] | None:
        """``getIndexBuffer``: (file, position of unit ``start_index``, read position)."""
        offset = start_index * CQ_STORE_UNIT_SIZE
        if offset < self.min_logic_offset:
            return None
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset % self.mapped_file_size
        return (mf, pos, mf.read_position) if pos < mf.read_position else None

    def read_units(self, first: int, max_units: int, hi: int) -> bytes:
        """The raw units from ``first``: at most ``max_units``, never at or past ``hi``
        nor past the end of the file holding ``first``; empty when that file went."""
        per_file = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        count = min(max_units, hi - first, per_file - first % per_file)
        if count <= 0:
            return b""
        found = self.get_index_buffer(first)
        if found is None:
            return b""
        mf, pos, _ = found
        return bytes(mf.buf[pos:pos + count * CQ_STORE_UNIT_SIZE])

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        found = self.get_index_buffer(index)
        if found is None:
            return None
        mf, pos, _ = found
        return CQ_UNIT.unpack_from(mf.buf, pos)

    def roll_next_file(self, index: int) -> int:
        units = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        return index + units - index % units

    def iter_units(self, start: int | None = None) -> Iterator[tuple[int, int, int, int]]:
        """``(queue_offset, commit_log_offset, size, tags_code)`` from ``start`` (never
        below the min offset) to the end."""
        index = self.get_min_offset_in_queue() if start is None else \
            max(start, self.get_min_offset_in_queue())
        end = self.get_max_offset_in_queue()
        while index < end:
            found = self.get_index_buffer(index)
            if found is None:
                index = self.roll_next_file(index)
                continue
            mf, pos, limit = found
            for p in range(pos, limit, CQ_STORE_UNIT_SIZE):
                yield (index, *CQ_UNIT.unpack_from(mf.buf, p))
                index += 1

    def get_offset_in_queue_by_time(self, timestamp_ms: int, min_phy_offset: int,
                                    pickup_store_timestamp) -> int:
        """Binary search for the unit whose message was stored nearest ``timestamp_ms``.

        ``pickup_store_timestamp(phy_offset, size)`` reads a message's store time (-1 if
        gone); units below ``min_phy_offset`` (deleted CommitLog data) count as earlier.
        Exact match wins; otherwise the nearer neighbour, ties to the earlier.

        The file searched is the first whose last unit's message was stored at or after
        ``timestamp_ms`` (store times never decrease along a queue). RocketMQ picks it by
        the file's mtime, which can be older than the store time of its last units (the
        page was dirtied first): then the search missed exact matches. When the answer is
        that file's first unit, the previous file's last unit may be nearer.
        """
        mf, prev_last = self._file_by_store_time(timestamp_ms, min_phy_offset,
                                                 pickup_store_timestamp)
        if mf is None:
            return 0
        low = max(self.min_logic_offset - mf.file_from_offset, 0)
        high = mf.read_position - CQ_STORE_UNIT_SIZE
        left = right = target = -1
        left_value = right_value = -1
        buf = mf.buf
        while high >= low:
            mid = (low + high) // (2 * CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE
            phy, size, _ = CQ_UNIT.unpack_from(buf, mid)
            if phy < min_phy_offset:
                low, left = mid + CQ_STORE_UNIT_SIZE, mid
                continue
            store_time = pickup_store_timestamp(phy, size)
            if store_time < 0:
                return 0
            if store_time == timestamp_ms:
                target = mid
                break
            if store_time > timestamp_ms:
                high, right, right_value = mid - CQ_STORE_UNIT_SIZE, mid, store_time
            else:
                low, left, left_value = mid + CQ_STORE_UNIT_SIZE, mid, store_time
        if target != -1:
            offset = target
        elif left_value == -1:
            offset = right
        elif right_value == -1:
            offset = left
        else:
            offset = right if abs(timestamp_ms - left_value) > abs(timestamp_ms - right_value) \
                else left
        if offset < 0:  # every probe below the CommitLog's min: start after them
            offset = left + CQ_STORE_UNIT_SIZE if left >= 0 else 0
        if target == -1 and left_value == -1 and right_value != -1 and prev_last is not None \
                and timestamp_ms - prev_last[1] <= right_value - timestamp_ms:
            return prev_last[0]
        return (mf.file_from_offset + offset) // CQ_STORE_UNIT_SIZE

    def _file_by_store_time(self, timestamp_ms: int, min_phy_offset: int, pickup
                            ) -> tuple[MappedFile | None, tuple[int, int] | None]:
        """The first file whose last readable unit's message was stored at or after
        ``timestamp_ms`` (else the last file), and the logical offset and store time of
        the last unit before it whose message is still there (None when none is)."""
        prev_last = None
        files = self.mapped_file_queue.mapped_files
        for mf in files:
            last = mf.read_position - CQ_STORE_UNIT_SIZE
            if last < 0:
                continue
            phy, size, _ = CQ_UNIT.unpack_from(mf.buf, last)
            stored = pickup(phy, size) if phy >= min_phy_offset else -1
            if stored >= timestamp_ms:
                return mf, prev_last
            if stored >= 0:
                prev_last = ((mf.file_from_offset + last) // CQ_STORE_UNIT_SIZE, stored)
        return (files[-1] if files else None), None

    # ------------------------------------------------------------------ truncation, expiry
    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Cut every unit whose message starts at or after ``phy_offset``; a last file
        whose first unit is already past it is unlinked and the one before is cut."""
        mfq = self.mapped_file_queue
        self.max_physic_offset = -1
        while (mf := mfq.get_last_mapped_file()) is not None:
            first_offset, first_size, _ = CQ_UNIT.unpack_from(mf.buf, 0)
            empty = not is_valid_unit(first_offset, first_size)
            if (empty and len(mfq.mapped_files) > 1) or \
                    (not empty and first_offset >= phy_offset):
                mfq.delete_last_mapped_file()  # the file before it may hold units to cut
                continue
            keep = 0
            for pos in range(0, mf.wrote_position, CQ_STORE_UNIT_SIZE):
                offset, size, _ = CQ_UNIT.unpack_from(mf.buf, pos)
                if not is_valid_unit(offset, size) or offset >= phy_offset:
                    break
                keep = pos + CQ_STORE_UNIT_SIZE
                if size != BLANK_UNIT_SIZE:
                    self.max_physic_offset = offset + size
            mf.zero_tail(keep)
            mf.set_positions(keep)
            break
        mfq.clamp_flushed_where()

    def rewind_to(self, phy_offset: int) -> int:
        """Move the write position back to the first unit whose message starts at or
        past ``phy_offset``; returns how many units were rewound (a writer restarting
        while readers map the queue: the dispatcher).

        Re-dispatch from ``phy_offset`` writes those units again, each over itself. Files
        that hold no unit before them (an empty last file included) are closed and dropped
        from the list; re-dispatch opens them again through ``get_or_create_last_mapped_file``
        (which also redoes the pre-blank fill of a queue's first file). Nothing is
        truncated, zeroed or unlinked: readers may map these files.
        """
        mfq = self.mapped_file_queue
        rewound = 0
        while (mf := mfq.get_last_mapped_file()) is not None:
            keep = mf.wrote_position
            while keep > 0:
                phy, size, _ = CQ_UNIT.unpack_from(mf.buf, keep - CQ_STORE_UNIT_SIZE)
                if size == BLANK_UNIT_SIZE or phy < phy_offset:
                    break
                keep -= CQ_STORE_UNIT_SIZE
            rewound += (mf.wrote_position - keep) // CQ_STORE_UNIT_SIZE
            if keep > 0:
                mf.rewind(keep)
                break
            mfq.close_last_mapped_file()
        mfq.clamp_flushed_where()
        self.max_physic_offset = self._last_unit_end()
        return rewound

    def _last_unit_end(self) -> int:
        """The end (offset + size) of the last non-blank unit, -1 when none."""
        last = self.last_unit()
        return -1 if last is None else last[1] + last[2]

    def is_unit_of(self, req, index: int, size: int, tags_code: int) -> bool:
        """Whether unit ``index`` (``size``, ``tags_code``) is the one dispatch makes of
        the record ``req`` (a ``DispatchRequest``) describes."""
        return (req.topic, req.queue_id, req.consume_queue_offset, req.msg_size,
                req.tags_code) == (self.topic, self.queue_id, index, size, tags_code)

    def last_unit(self) -> tuple[int, int, int, int] | None:
        """``(queue_offset, commit_log_offset, size, tags_code)`` of the last non-blank
        unit, None when there is none."""
        mf = self.mapped_file_queue.get_last_mapped_file()
        if mf is None:
            return None
        for pos in range(mf.wrote_position - CQ_STORE_UNIT_SIZE, -1, -CQ_STORE_UNIT_SIZE):
            phy, size, tags_code = CQ_UNIT.unpack_from(mf.buf, pos)
            if size != BLANK_UNIT_SIZE:
                return (mf.file_from_offset + pos) // CQ_STORE_UNIT_SIZE, phy, size, tags_code
        return None

    def correct_min_offset(self, min_phy_offset: int) -> None:
        """Move ``min_logic_offset`` to the first unit whose message still exists."""
        mf = self.mapped_file_queue.get_first_mapped_file()
        if mf is None:
            return
        for pos in range(0, mf.read_position, CQ_STORE_UNIT_SIZE):
            offset, size, _ = CQ_UNIT.unpack_from(mf.buf, pos)
            if size != BLANK_UNIT_SIZE and offset >= min_phy_offset:
                self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + pos)
                return
        self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + mf.read_position)

    def delete_expired_file(self, min_commit_log_offset: int, *, unlink: bool = True) -> int:
        """Delete files whose units all point below ``min_commit_log_offset``, never the
        last. Without ``unlink`` they are only unmapped (a process that follows the
        cleaner: the dispatcher)."""
        def last_unit_offset(mf: MappedFile) -> int | None:
            pos = mf.read_position - CQ_STORE_UNIT_SIZE
            return CQ_PHY_OFFSET.unpack_from(mf.buf, pos)[0] if pos >= 0 else None

        count = self.mapped_file_queue.delete_expired_file_by_offset(
            min_commit_log_offset, last_unit_offset, unlink=unlink)
        if unlink or count:  # a process that only unmaps reads no min offset: no scan
            self.correct_min_offset(min_commit_log_offset)
        return count

    def close(self) -> None:
        self.mapped_file_queue.close()

    def destroy(self) -> None:
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.mapped_file_queue.destroy()


# ====================================================================== read-only view
_UNIT_SETTLE_CHECKS = 5      # re-reads of a mismatching unit before it is called corrupt
_UNIT_SETTLE_SLEEP_S = 0.001


def _is_blank_unit(phy: int, size: int, tags_code: int) -> bool:
    return size == BLANK_UNIT_SIZE and phy == 0 and tags_code == 0


def unit_within(buf, index: int, bound: int) -> bool:
    """Whether unit ``index`` of a consume queue file is a blank or a valid unit whose
    record ends at or below ``bound``."""
    phy, size, tags_code = CQ_UNIT.unpack_from(buf, index * CQ_STORE_UNIT_SIZE)
    return _is_blank_unit(phy, size, tags_code) or (phy >= 0 and size > 0
                                                    and phy + size <= bound)


def _units_within(buf, units: int, bound: int, hint: int = 0) -> int:
    """How many leading units of a consume queue file are there within ``bound``:
    blanks, or valid units whose record ends at or below it (a prefix, by order).

    ``hint`` is a guess, the last answer for this file: when the prefix still reaches
    it, the search gallops up from there (a few reads for a queue that grew a little)
    instead of halving the whole file (~19 reads)."""
    lo, hi = 0, units

    def within(i: int) -> bool:
        return unit_within(buf, i, bound)

    if 0 < hint <= units and within(hint - 1):
        lo, step = hint, 1
        while lo + step <= units and within(lo + step - 1):
            lo, step = lo + step, step * 2
        hi = min(units, lo + step - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if within(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _first_unit_at_or_above(buf, units: int, min_phy: int) -> int:
    """The first of ``units`` leading units that is not a blank and points at or above
    ``min_phy`` (``units`` when none does)."""
    lo, hi = 0, units
    unpack_from = CQ_UNIT.unpack_from
    if units:
        phy, size, _ = unpack_from(buf, 0)
        if size != BLANK_UNIT_SIZE and phy >= min_phy:
            return 0      # the common answer: nothing of this file expired
    while lo < hi:
        mid = (lo + hi) // 2
        phy, size, _ = unpack_from(buf, mid * CQ_STORE_UNIT_SIZE)
        if size != BLANK_UNIT_SIZE and phy >= min_phy:
            hi = mid
        else:
            lo = mid + 1
    return lo


class ConsumeQueueView(ConsumeQueue):
    """A consume queue another process writes, mapped read-only (``StoreReader``).

    Every read is bounded by the caller's ``dispatched``: ``bounds`` maps files the
    dispatcher created since, drops files the cleaner unlinked, and leaves the queue
    showing exactly the units in ``[min, max)`` within the bound: the file holding the
    bound reads up to it, later files are hidden (``MappedFileQueue.show_first``), the
    min offset is the first unit whose message is at or above the CommitLog's min. The
    ConsumeQueue reads (``get_index_buffer``, ``get_unit``, ``iter_units``,
    ``get_offset_in_queue_by_time``) then see nothing past the bound.

    Units of one queue point at increasing CommitLog offsets and are followed by zeros,
    so "unit n is within the bound" holds for a prefix of every file: both ends are
    found by search (the max galloping up from the last answer, the min at once when
    nothing of the first file expired). Never writes, creates, truncates or unlinks a
    file.
    """

    def __init__(self, topic: str, queue_id: int, root_dir: str, mapped_file_size: int):
        super().__init__(topic, queue_id, root_dir, mapped_file_size, read_only=True)
        self.units_per_file = mapped_file_size // CQ_STORE_UNIT_SIZE
        self._partial: MappedFile | None = None
        self._last: tuple[MappedFile | None, int] = (None, 0)   # _last_within's answer
        # the last bounds: (dispatched, min_phy, answer, file and index of its last unit)
        self._bounded: tuple | None = None

    def bounds(self, dispatched: int, min_phy: int) -> tuple[int, int]:
        """``(min, max)`` logical offsets within ``dispatched``; leaves the queue showing
        exactly the units in ``[min, max)``. Asked again with the same ``dispatched`` and
        ``min_phy``, it answers as it did (the queue shows those units already, and what
        lies within a bound does not change while the bound stands) once the last unit
        it counted is read again and still lies within: a unit the dispatcher was
        writing past the bound can look inside it when read torn, and is then counted
        once, never remembered."""
        last = self._bounded
        if last is not None and last[0] == dispatched and last[1] == min_phy and (
                last[3] is None or unit_within(last[3].buf, last[4], dispatched)):
            return last[2]
        self._bounded = None
        mfq = self.mapped_file_queue
        mfq.show_all()
        if not mfq.mapped_files:
            mfq.refresh()
            if not mfq.mapped_files:
                self.min_logic_offset = 0
                return 0, 0
        i, k = self._last_within(dispatched)
        files = mfq.mapped_files
        hi = files[i].file_from_offset // CQ_STORE_UNIT_SIZE + k
        self._set_partial(files[i], k)
        visible = files[:i + 1 if k > 0 else i]
        lo = self._first_alive(visible, min_phy, hi)
        if lo is None:  # an expired file was unlinked and dropped: look again
            return self.bounds(dispatched, min_phy)
        self.min_logic_offset = lo * CQ_STORE_UNIT_SIZE
        mfq.show_first(len(visible))
        self._bounded = (dispatched, min_phy, (lo, hi), files[i] if k else None, k - 1)
        return lo, hi

    def nothing_at(self, offset: int, bound: int) -> bool:
        """Whether unit ``offset`` is not there within ``bound``, told from that one
        unit: True only when it lies in the last file mapped and is unwritten or points
        past the bound (a unit is written before the DISPATCHED that covers it is
        published). False when it is there or that cannot be told so."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return False
        mf = files[-1]
        index = offset - mf.file_from_offset // CQ_STORE_UNIT_SIZE
        return 0 <= index < self.units_per_file and not unit_within(mf.buf, index, bound)

    def _last_within(self, bound: int) -> tuple[int, int]:
        """(file index, units within the bound in it) of the last file holding any."""
        mfq, per_file = self.mapped_file_queue, self.units_per_file
        files = mfq.mapped_files
        i = len(files) - 1
        k = _units_within(files[i].buf, per_file, bound, self._hint(files[i]))
        while k == per_file and self._next_file_exists(files[i]):
            n = len(files)
            mfq.refresh()
            files = mfq.mapped_files
            if len(files) == n:
                break
            i = len(files) - 1
            k = _units_within(files[i].buf, per_file, bound)
        while k == 0 and i > 0:
            i -= 1
            k = _units_within(files[i].buf, per_file, bound)
        self._last = (files[i], k)
        return i, k

    def _hint(self, mf: MappedFile) -> int:
        """The last ``_last_within`` answer when it was about ``mf``, else 0."""
        last_mf, k = self._last
        return k if last_mf is mf else 0

    def _next_file_exists(self, mf: MappedFile) -> bool:
        return os.path.exists(os.path.join(
            self.store_path, offset_to_file_name(mf.file_from_offset + self.mapped_file_size)))

    def _set_partial(self, mf: MappedFile, k: int) -> None:
        """Every file reads whole except the one holding the bound (at most one)."""
        old = self._partial
        if old is not None and old is not mf:
            old.set_positions(self.mapped_file_size)
        mf.set_positions(k * CQ_STORE_UNIT_SIZE)
        self._partial = mf if k < self.units_per_file else None

    def _first_alive(self, visible: list[MappedFile], min_phy: int, hi: int) -> int | None:
        """The first unit pointing at or above ``min_phy`` (``hi`` when none). None when
        an expired first file turned out to be unlinked and was dropped."""
        for n, mf in enumerate(visible):
            units = mf.read_position // CQ_STORE_UNIT_SIZE
            j = _first_unit_at_or_above(mf.buf, units, min_phy)
            if j < units:
                return mf.file_from_offset // CQ_STORE_UNIT_SIZE + j
            if n == 0 and len(self.mapped_file_queue.mapped_files) > 1 \
                    and not os.path.exists(mf.path):
                if self._drop_unlinked_front():
                    return None
        return hi

    def drop_unlinked(self) -> bool:
        """Unmap the files at the front the cleaner unlinked; False when none of this
        queue's files is left on disk (the view should be closed)."""
        files = self.mapped_file_queue.mapped_files
        if not files or os.path.exists(files[0].path):
            return True
        self._bounded = None
        if not self._drop_unlinked_front():
            return any(os.path.exists(mf.path) for mf in self.mapped_file_queue.mapped_files)
        return True

    def _drop_unlinked_front(self) -> bool:
        mfq = self.mapped_file_queue
        try:
            names = sorted(n for n in os.listdir(self.store_path) if n.isdigit())
        except (FileNotFoundError, NotADirectoryError):
            names = []
        if not names:
            return False
        before = len(mfq.mapped_files)
        mfq.refresh(min_offset=int(names[0]))
        if self._partial is not None and self._partial not in mfq.mapped_files:
            self._partial = None
        return len(mfq.mapped_files) < before

    # ------------------------------------------------------------------ reads within bounds
    def first_offset_stored_since(self, timestamp_ms: int, lo: int, hi: int,
                                  pickup_store_timestamp) -> int:
        """The first offset in ``[lo, hi)`` whose message was stored at or after
        ``timestamp_ms``, ``hi`` when none was. Store times never decrease along a
        queue, so a binary search reads about log2(n) records; a unit whose record is
        gone (``pickup_store_timestamp`` < 0) counts as earlier."""
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            stored = -1 if unit is None or unit[1] == BLANK_UNIT_SIZE else \
                pickup_store_timestamp(unit[0], unit[1])
            if 0 <= stored and stored >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def unit_changing(self, where: tuple[str, int], read: tuple[int, int]) -> bool:
        """True when the unit at ``where`` (file path, position) is no longer the
        ``read`` (offset, size) it was read as, or changes within a few milliseconds: it
        was read while being written (a unit past the bound whose torn bytes looked
        inside it)."""
        path, pos = where
        mf = next((f for f in self.mapped_file_queue.all_mapped_files() if f.path == path),
                  None)
        if mf is None:
            return False
        seen = bytes(mf.buf[pos:pos + CQ_STORE_UNIT_SIZE])
        if CQ_UNIT.unpack_from(seen)[:2] != read:
            return True
        for _ in range(_UNIT_SETTLE_CHECKS):
            time.sleep(_UNIT_SETTLE_SLEEP_S)
            if mf.buf[pos:pos + CQ_STORE_UNIT_SIZE] != seen:
                return True
        return False
