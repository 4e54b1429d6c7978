"""IndexFile: one file of RocketMQ's on-disk hash index, ``{root}/index/{yyyyMMddHHmmssSSS}``.

The index maps ``topic#key`` (a message's UNIQ_KEY and each of its KEYS) to CommitLog
physical offsets, with a coarse store time so queries can be bounded in time. Only the
key's hash is stored, never the key, so every hit is a *candidate*: the caller re-reads
the message at that offset and checks its topic and key.

Layout (big-endian, as Java writes it); the file is exactly
``40 + hash_slot_num * 4 + index_num * 20`` bytes (420,000,040 with the defaults):

    IndexHeader, 40 bytes at 0
    offset  width  field
    0       8      beginTimestamp   store time (ms) of the first entry
    8       8      endTimestamp     store time (ms) of the last entry
    16      8      beginPhyOffset   CommitLog offset of the first entry
    24      8      endPhyOffset     CommitLog offset of the last entry
    32      4      hashSlotCount    incremented on every put (not the slots in use)
    36      4      indexCount       next entry number; starts at 1, entry 0 is never used

    hash slot table, hash_slot_num x 4 bytes at 40
    slot s at 40 + s*4: int, number of the newest entry whose keyHash % hash_slot_num == s;
    empty when <= 0 (invalidIndex) or > indexCount

    index entries, index_num x 20 bytes at 40 + hash_slot_num*4
    entry n at 40 + hash_slot_num*4 + n*20:
    0       4      keyHash          index_key_hash(key) = abs(key.hashCode()), 0 if negative
    4       8      phyOffset        CommitLog offset of the message
    12      4      timeDiff         (storeTimestamp - beginTimestamp) // 1000, in seconds,
                                    clamped to [0, 2^31-1]; < 0 means invalid
    16      4      preIndexNo       previous entry in the same slot's chain; 0 ends it

Each slot heads a singly linked list, newest first. Entries are appended in order, so a
valid ``preIndexNo`` is always smaller than the entry's own number; the chain walk stops
at the first link that is not (stricter than Java, identical on every file Java writes,
and it cannot loop on corrupt bytes). A file holds at most ``index_num - 1`` entries.

File naming: the creation time in local time, ``yyyyMMddHHmmssSSS``
(``UtilAll.timeMillisToHumanString``), e.g. ``20190729015534442``. Names sort
chronologically, except across a daylight-saving fall-back hour (as in RocketMQ).

Write order of a put: the entry, then the header (all 40 bytes, from the Python copy),
then the slot. A reader of the mapping therefore never follows a slot to an entry that
is not written yet, and never sees a slot naming an entry its header does not count
(which the chain walk would take for an empty slot). A crash between the header and the
slot leaves one entry unlinked: a query can miss it, never return a wrong message.

Two RocketMQ behaviours kept for byte compatibility: a new file's header is written at
creation with indexCount 1 (Java leaves 0 on disk until the first put or flush; both
read as 1); and putKey measures timeDiff against the begin it is about to replace, so
the first entry of a rolled file (begin = the previous file's end) reads back late by
its gap to that end.

Disk: the file has its full size from its creation, but its blocks are reserved as it
fills (``storage.reservation``): the header and the slot table (written anywhere, from
the first put) at once, the entries a step at a time (a sixteenth of the entry region,
1-64 MiB) half a step ahead of the next entry. An entry is written only after its
blocks are reserved, so a full disk raises ``StoreFileError`` naming ENOSPC before
anything of the put is written, never SIGBUS. A file opened again reserves what its
header counts at once (a crash may have left holes there; allocated blocks cost
nothing).

Crash story: nothing is checksummed and nothing here is trusted beyond "the caller
verifies every candidate against the CommitLog": a torn or stale entry can make a query
miss a message or return a wrong candidate, never return a wrong message. Full files are
flushed when the next file is created, and ``IndexService`` hands their endTimestamp to
the checkpoint (``indexMsgTimestamp``). After an abnormal exit, files whose endTimestamp
is newer than the checkpoint's index timestamp are destroyed at load and rebuilt by
re-dispatch from the CommitLog; files at or below it are kept as they are.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from operator import attrgetter
from typing import Callable, Iterator

import numpy as np

from rocketstore.storage.errors import CorruptRecordError, StoreClosedError, StoreFileError
from rocketstore.storage.hashing import index_key_hash
from rocketstore.storage.dir_sync import fsync_creation
from rocketstore.storage.mapped_file import FILE_OPS, file_may_hold_data, unlink_quietly
from rocketstore.storage.reservation import Reservation, create_reserved, reserve_step
from rocketstore.storage import file_modes

log = logging.getLogger(__name__)

# --------------------------------------------------------------------- IndexHeader
BEGIN_TIMESTAMP_POS = 0
BEGIN_TIMESTAMP_LEN = 8
END_TIMESTAMP_POS = BEGIN_TIMESTAMP_POS + BEGIN_TIMESTAMP_LEN
END_TIMESTAMP_LEN = 8
BEGIN_PHY_OFFSET_POS = END_TIMESTAMP_POS + END_TIMESTAMP_LEN
BEGIN_PHY_OFFSET_LEN = 8
END_PHY_OFFSET_POS = BEGIN_PHY_OFFSET_POS + BEGIN_PHY_OFFSET_LEN
END_PHY_OFFSET_LEN = 8
HASH_SLOT_COUNT_POS = END_PHY_OFFSET_POS + END_PHY_OFFSET_LEN
HASH_SLOT_COUNT_LEN = 4
INDEX_COUNT_POS = HASH_SLOT_COUNT_POS + HASH_SLOT_COUNT_LEN
INDEX_COUNT_LEN = 4
INDEX_HEADER_SIZE = INDEX_COUNT_POS + INDEX_COUNT_LEN

INDEX_HEADER = struct.Struct(">qqqqii")
assert INDEX_HEADER.size == INDEX_HEADER_SIZE == 40

# --------------------------------------------------------------------- hash slot
HASH_SLOT_SIZE = 4
HASH_SLOT = struct.Struct(">i")
assert HASH_SLOT.size == HASH_SLOT_SIZE
INVALID_INDEX = 0

# --------------------------------------------------------------------- index entry
KEY_HASH_POS = 0
KEY_HASH_LEN = 4
PHY_OFFSET_POS = KEY_HASH_POS + KEY_HASH_LEN
PHY_OFFSET_LEN = 8
TIME_DIFF_POS = PHY_OFFSET_POS + PHY_OFFSET_LEN
TIME_DIFF_LEN = 4
PRE_INDEX_NO_POS = TIME_DIFF_POS + TIME_DIFF_LEN
PRE_INDEX_NO_LEN = 4
INDEX_SIZE = PRE_INDEX_NO_POS + PRE_INDEX_NO_LEN

INDEX_ENTRY = struct.Struct(">iqii")
assert INDEX_ENTRY.size == INDEX_SIZE == 20

_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"),
                         ("pre_index_no", ">i4")])
_SLOT_DTYPE = np.dtype(">i4")
assert _ENTRY_DTYPE.itemsize == INDEX_SIZE

JAVA_INT_MAX = 0x7FFF_FFFF
FILE_NAME_LEN = 17  # yyyyMMddHHmmssSSS
_ITER_CHUNK_ENTRIES = 4096
_FEW_CHAINS = 32        # ``reachable`` walks this few chains link by link


# --------------------------------------------------------------------- pure codecs
def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """The exact size of an IndexFile with these dimensions."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


def encode_header(begin_timestamp: int, end_timestamp: int, begin_phy_offset: int,
                  end_phy_offset: int, hash_slot_count: int, index_count: int) -> bytes:
    """The 40 header bytes. Raises ``struct.error`` when a value does not fit its width."""
    return INDEX_HEADER.pack(begin_timestamp, end_timestamp, begin_phy_offset,
                             end_phy_offset, hash_slot_count, index_count)


def decode_header(buf, pos: int = 0) -> tuple[int, int, int, int, int, int]:
    """``(beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount,
    indexCount)`` from the 40 bytes at ``pos``, unchecked.

    Raises ``struct.error`` when fewer than 40 bytes are there.
    """
    return INDEX_HEADER.unpack_from(buf, pos)


def encode_entry(key_hash: int, phy_offset: int, time_diff: int, pre_index_no: int) -> bytes:
    """The 20 bytes of one index entry."""
    return INDEX_ENTRY.pack(key_hash, phy_offset, time_diff, pre_index_no)


def decode_entry(buf, pos: int) -> tuple[int, int, int, int]:
    """``(keyHash, phyOffset, timeDiff, preIndexNo)`` from the 20 bytes at ``pos``."""
    return INDEX_ENTRY.unpack_from(buf, pos)


def time_millis_to_human_string(timestamp_ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: ``yyyyMMddHHmmssSSS`` in local time."""
    t = time.localtime(timestamp_ms // 1000)
    return (f"{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}"
            f"{t.tm_hour:02d}{t.tm_min:02d}{t.tm_sec:02d}{timestamp_ms % 1000:03d}")


def human_string_to_time_millis(name: str) -> int:
    """The inverse of ``time_millis_to_human_string`` (ambiguous in a DST fall-back hour).

    Raises ``ValueError`` when ``name`` is not 17 digits of a valid local time.
    """
    if len(name) != FILE_NAME_LEN or not name.isdigit():
        raise ValueError(f"not a yyyyMMddHHmmssSSS name: {name!r}")
    fields = (int(name[0:4]), int(name[4:6]), int(name[6:8]),
              int(name[8:10]), int(name[10:12]), int(name[12:14]), 0, 0, -1)
    try:
        seconds = int(time.mktime(fields))
    except OverflowError as e:
        raise ValueError(f"not a valid local time: {name!r}") from e
    return seconds * 1000 + int(name[14:17])


def _time_diff_s(store_timestamp: int, begin_timestamp: int) -> int:
    """The entry's timeDiff: seconds since the file's begin, clamped to a Java int >= 0."""
    if begin_timestamp <= 0:
        return 0
    diff = (store_timestamp - begin_timestamp) // 1000
    if diff > JAVA_INT_MAX:
        return JAVA_INT_MAX
    return diff if diff > 0 else 0


# --------------------------------------------------------------------- reads
def time_matched(begin_ms: int, end_ms: int, begin_timestamp: int, end_timestamp: int) -> bool:
    """``IndexFile.isTimeMatched``: ``[begin_ms, end_ms]`` overlaps the file's range."""
    b, e = begin_timestamp, end_timestamp
    return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e


def select_phy_offsets(buf, hash_slot_num: int, begin_timestamp: int, index_count: int,
                       key_hash: int, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
    """``IndexFile.select_phy_offset`` over any buffer holding an index file: candidate
    offsets of entries hashed ``key_hash`` and stored in ``[begin_ms, end_ms]``, newest
    first, at most ``max_num``. Never reads an entry numbered ``>= index_count`` (a slot
    naming one is empty) and stops at the first link that does not point backwards."""
    found: list[int] = []
    slot_value = HASH_SLOT.unpack_from(
        buf, INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * HASH_SLOT_SIZE)[0]
    if slot_value <= INVALID_INDEX or slot_value >= index_count or index_count <= 1:
        return found
    index_base = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
    unpack_from = INDEX_ENTRY.unpack_from
    next_index = slot_value
    while len(found) < max_num:
        key_hash_read, phy_offset_read, time_diff, prev_index = unpack_from(
            buf, index_base + next_index * INDEX_SIZE)
        if time_diff < 0:
            break
        time_read = begin_timestamp + time_diff * 1000
        if key_hash_read == key_hash and begin_ms <= time_read <= end_ms:
            found.append(phy_offset_read)
        if prev_index <= INVALID_INDEX or prev_index >= next_index or time_read < begin_ms:
            break
        next_index = prev_index
    return found


# --------------------------------------------------------------------- the file
class IndexFile:
    """One IndexFile, mapped read-write; its header is cached here and written through.

    Not thread-safe: one writer (the dispatching process) puts and selects; callers that
    share an instance across threads serialise access themselves.
    """

    def __init__(self, path: str, hash_slot_num: int, index_num: int,
                 end_phy_offset: int = 0, end_timestamp: int = 0):
        """Create ``path`` at full size (header, slots and the first step of entries
        reserved), or open the existing file.

        A new file starts with ``indexCount = 1`` and, when ``end_phy_offset`` /
        ``end_timestamp`` are > 0 (the previous file's end), with both its begin and end
        values set to them. An existing file's header is read from disk (an indexCount
        <= 0 reads as 1) and the two arguments are ignored.

        A short file that was never written (a creation a crash interrupted) is
        allocated and initialised as a new one.

        Raises ``StoreFileError`` when the file has any other size than
        ``40 + hash_slot_num*4 + index_num*20`` or cannot be created, allocated (its
        reservation: ENOSPC) or mapped, and ``CorruptRecordError`` when its indexCount
        exceeds ``index_num``.
        """
        assert hash_slot_num > 0 and index_num > 1, (hash_slot_num, index_num)
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._index_base = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        step = reserve_step(index_num * INDEX_SIZE)
        first = self._index_base + step     # header, slots and the first entries
        if os.path.exists(path):
            self._fd, created = self._open(first)
        else:
            self._fd, created = self._create(first), True
        self._reservation = Reservation(path, self._fd, self.file_size, step,
                                        first if created else 0)
        try:
            self._buf: mmap.mmap | None = mmap.mmap(self._fd, self.file_size)
        except (OSError, ValueError) as e:
            os.close(self._fd)
            raise StoreFileError(path, f"cannot map {self.file_size} bytes: {e}") from e
        if created:
            self._init_header(end_phy_offset, end_timestamp)
        else:
            self._load_header()
            self._reserve_or_close(self._index_base + self._index_count * INDEX_SIZE)

    # ----------------------------------------------------------------- open / create
    def _create(self, reserved: int) -> int:
        made = file_modes.make_dirs(os.path.dirname(self.path) or ".")
        try:
            fd = file_modes.create(self.path, os.O_RDWR | os.O_EXCL)
        except OSError as e:
            raise StoreFileError(self.path, f"cannot create: {os.strerror(e.errno)}") from e
        try:
            create_reserved(self.path, fd, self.file_size, reserved)
            fsync_creation(self.path, made)
        except BaseException:
            os.close(fd)
            unlink_quietly(self.path)
            raise
        return fd

    def _open(self, reserved: int) -> tuple[int, bool]:
        """Open an existing file: ``(fd, created)``.

        A short file that was never written is a creation that a crash interrupted
        before its size was set: it holds nothing, so it is allocated and initialised
        like a new one.
        """
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as e:
            raise StoreFileError(self.path, f"cannot open: {os.strerror(e.errno)}") from e
        try:
            size = os.fstat(fd).st_size
            if size == 0 or (size < self.file_size and not file_may_hold_data(fd, size)):
                create_reserved(self.path, fd, self.file_size, reserved)
                return fd, True
            if size != self.file_size:
                raise StoreFileError(self.path, f"length {size} does not match the "
                                     f"configured index file size {self.file_size} "
                                     f"(hash_slot_num {self.hash_slot_num}, "
                                     f"index_num {self.index_num})")
        except BaseException:
            os.close(fd)
            raise
        return fd, False

    def _reserve_or_close(self, end: int) -> None:
        """Reserve the blocks below ``end`` of a file just opened; close it and raise
        ``StoreFileError`` when they cannot be."""
        try:
            self._reservation.cover(end)
        except StoreFileError:
            self.close()
            raise

    @property
    def reserved_bytes(self) -> int:
        """Bytes from the file's start this process knows to be allocated."""
        return self._reservation.reserved

    def _init_header(self, end_phy_offset: int, end_timestamp: int) -> None:
        self._begin_timestamp = self._end_timestamp = max(end_timestamp, 0)
        self._begin_phy_offset = self._end_phy_offset = max(end_phy_offset, 0)
        self._hash_slot_count = 0
        self._index_count = 1
        self._write_header()

    def _load_header(self) -> None:
        """``IndexFile.load``: read the header; indexCount <= 0 reads as 1."""
        (self._begin_timestamp, self._end_timestamp, self._begin_phy_offset,
         self._end_phy_offset, self._hash_slot_count, index_count) = decode_header(self._buf)
        if index_count > self.index_num:
            self.close()
            raise CorruptRecordError(self.path, INDEX_COUNT_POS,
                                     f"indexCount {index_count} exceeds index_num "
                                     f"{self.index_num}")
        if index_count <= 0 < self._hash_slot_count:
            # a header a kill tore while struct zero-filled it (older versions): every
            # put counts one in hashSlotCount and one in indexCount, so the count is known
            index_count = self._hash_slot_count + 1
            log.warning("%s: indexCount 0 beside %d entries (a torn header): taken as %d",
                        self.path, self._hash_slot_count, index_count)
        self._index_count = index_count if index_count > 0 else 1

    def _write_header(self) -> None:
        self._buf[:INDEX_HEADER_SIZE] = INDEX_HEADER.pack(
            self._begin_timestamp, self._end_timestamp, self._begin_phy_offset,
            self._end_phy_offset, self._hash_slot_count, self._index_count)

    # ----------------------------------------------------------------- header
    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    # the header's fields, read-only: only put_key and truncate move them
    begin_timestamp = property(attrgetter("_begin_timestamp"))
    end_timestamp = property(attrgetter("_end_timestamp"))
    begin_phy_offset = property(attrgetter("_begin_phy_offset"))
    end_phy_offset = property(attrgetter("_end_phy_offset"))
    hash_slot_count = property(attrgetter("_hash_slot_count"))
    index_count = property(attrgetter("_index_count"))

    def is_write_full(self) -> bool:
        """``isWriteFull``: no room for another entry (``indexCount >= index_num``)."""
        return self._index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """``isTimeMatched``: ``[begin, end]`` overlaps ``[beginTimestamp, endTimestamp]``."""
        return time_matched(begin, end, self._begin_timestamp, self._end_timestamp)

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """``putKey``: add ``key -> phy_offset`` as the newest entry of its slot's chain.

        Returns False, writing nothing, when the file is full. Raises
        ``StoreClosedError`` after close, ``struct.error`` when ``phy_offset`` or
        ``store_timestamp`` does not fit a Java long, ``StoreFileError`` (ENOSPC),
        writing nothing, when the entry's blocks cannot be reserved.
        """
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """``put_key`` for a key whose ``index_key_hash`` is already computed."""
        buf = self._buf
        if buf is None:
            raise StoreClosedError(f"{self.path} is closed")
        index_count = self._index_count
        if index_count >= self.index_num:
            return False
        abs_slot_pos = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        slot_value = HASH_SLOT.unpack_from(buf, abs_slot_pos)[0]
        if slot_value <= INVALID_INDEX or slot_value > index_count:
            slot_value = INVALID_INDEX
        # As in Java, the diff is taken against the begin *before* a first put moves it,
        # so the first entry of a rolled file measures from the previous file's end.
        time_diff = _time_diff_s(store_timestamp, self._begin_timestamp)
        entry_pos = self._index_base + index_count * INDEX_SIZE
        self._reservation.cover(entry_pos + INDEX_SIZE)
        INDEX_ENTRY.pack_into(buf, entry_pos, key_hash, phy_offset, time_diff, slot_value)
        if index_count <= 1:
            self._begin_phy_offset = phy_offset
            self._begin_timestamp = store_timestamp
        self._hash_slot_count += 1
        self._index_count = index_count + 1
        self._end_phy_offset = phy_offset
        # packed first, then copied: struct's pack_into zero-fills the whole header before
        # it writes the fields, and a kill in between left indexCount 0 on disk, which the
        # next dispatcher read as an empty file and wrote over every entry
        buf[:INDEX_HEADER_SIZE] = INDEX_HEADER.pack(
            self._begin_timestamp, store_timestamp, self._begin_phy_offset, phy_offset,
            self._hash_slot_count, index_count + 1)
        buf[abs_slot_pos:abs_slot_pos + HASH_SLOT_SIZE] = HASH_SLOT.pack(index_count)  # no
        # zeroed moment either: a slot read as empty would cut its chain off for good
        self._end_timestamp = store_timestamp   # last: a flush on another thread that
        return True                             # reads it has every byte of this entry

    def put_entries(self, key_hashes: np.ndarray, phy_offsets: np.ndarray,
                    store_timestamps: np.ndarray) -> int:
        """``put_key`` for a run of entries whose key hashes are already computed
        (``hashing.index_key_hashes``), written as ``put_key`` would write them one by
        one, byte for byte once done: the entries as one block, the header's counts,
        each slot the run touched, and only then the header's endPhyOffset and end
        time. A kill before that last step leaves endPhyOffset before the run, so a
        restarted dispatcher indexes the whole run again: no slot points past
        indexCount and no entry of the run stays unlinked (entries put twice are dropped
        by queries as duplicates). Written with endPhyOffset first, a kill among the
        slots left every entry of the run but the last unreachable for good. Returns
        how many were put (fewer than given when the file fills). Raises
        ``StoreClosedError`` after close, and ``StoreFileError`` (ENOSPC), having
        written nothing, when the entries' blocks cannot be reserved.
        """
        buf = self._check_open()
        count0 = self._index_count
        n = min(len(key_hashes), self.index_num - count0)
        if n <= 0:
            return 0
        hashes = key_hashes[:n]
        phys, stamps = phy_offsets[:n], store_timestamps[:n]
        numbers = count0 + np.arange(n, dtype=np.int64)
        slots = hashes % self.hash_slot_num
        entries = np.empty(n, _ENTRY_DTYPE)
        entries["key_hash"] = hashes
        entries["phy_offset"] = phys
        entries["time_diff"] = self._time_diffs(stamps, count0)
        entries["pre_index_no"], last_in_slot = self._chain(slots, numbers, count0)
        start = self._index_base + count0 * INDEX_SIZE
        self._reservation.cover(start + n * INDEX_SIZE)
        buf[start:start + n * INDEX_SIZE] = entries.tobytes()
        if count0 <= 1:
            self._begin_phy_offset = int(phys[0])
            self._begin_timestamp = int(stamps[0])
        self._hash_slot_count += n
        self._index_count = count0 + n
        self._write_header()       # the entries counted; endPhyOffset not yet (below)
        table = np.frombuffer(buf, _SLOT_DTYPE, self.hash_slot_num, INDEX_HEADER_SIZE)
        table[slots[last_in_slot]] = numbers[last_in_slot]
        del table
        self._end_phy_offset = int(phys[-1])
        self._end_timestamp = int(stamps[-1])
        self._write_header()
        return n

    def _time_diffs(self, stamps: np.ndarray, count0: int) -> np.ndarray:
        """``_time_diff_s`` of each entry: the first entry of an empty file measures from
        the begin it replaces, every later one from the first's store time."""
        begins = np.full(len(stamps), self._begin_timestamp if count0 > 1 else stamps[0],
                         np.int64)
        if count0 <= 1:
            begins[0] = self._begin_timestamp
        diffs = np.clip((stamps - begins) // 1000, 0, JAVA_INT_MAX)
        diffs[begins <= 0] = 0
        return diffs

    def _chain(self, slots: np.ndarray, numbers: np.ndarray,
               count0: int) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's preIndexNo (the slot's newest entry before it, from this run or
        from the file, validated against indexCount at its put as ``put_key`` does) and
        a mask of the entries that end up heading their slot."""
        order = np.argsort(slots, kind="stable")
        ranked = slots[order]
        first = np.ones(len(order), bool)
        first[1:] = ranked[1:] != ranked[:-1]
        last = np.ones(len(order), bool)
        last[:-1] = first[1:]
        pre_ranked = np.empty(len(order), np.int64)
        pre_ranked[1:] = numbers[order][:-1]
        table = np.frombuffer(self._buf, _SLOT_DTYPE, self.hash_slot_num, INDEX_HEADER_SIZE)
        heads = table[ranked[first]].astype(np.int64)
        del table
        heads[(heads <= INVALID_INDEX) | (heads > numbers[order][first])] = INVALID_INDEX
        pre_ranked[first] = heads
        pre = np.empty(len(order), np.int64)
        pre[order] = pre_ranked
        last_in_slot = np.zeros(len(order), bool)
        last_in_slot[order[last]] = True
        return pre, last_in_slot

    # ----------------------------------------------------------------- select
    def select_phy_offset(self, key: str, max_num: int, begin_ms: int,
                          end_ms: int) -> list[int]:
        """``selectPhyOffset``: candidate offsets for ``key`` stored in
        ``[begin_ms, end_ms]``, newest first, at most ``max_num``.

        Entry times are second-granular (``beginTimestamp + timeDiff * 1000``). Hash
        collisions are included: the caller must verify each candidate. Raises
        ``StoreClosedError`` after close.
        """
        buf = self._buf
        if buf is None:
            raise StoreClosedError(f"{self.path} is closed")
        return select_phy_offsets(buf, self.hash_slot_num, self._begin_timestamp,
                                  self._index_count, index_key_hash(key), max_num,
                                  begin_ms, end_ms)

    def holds_newest(self, key_hash: int, phy_offset: int) -> bool:
        """Whether an entry ``key_hash -> phy_offset`` is among the newest of its slot's
        chain: those for ``phy_offset``, the last record put (``endPhyOffset``), head
        every chain they are in. Re-dispatch after a start passes that record again, and
        puts only the keys this says are missing (a kill may have come between two of its
        keys)."""
        buf = self._check_open()
        count = self._index_count
        entry = HASH_SLOT.unpack_from(
            buf, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE)[0]
        while INVALID_INDEX < entry < count:
            their_hash, their_phy, _, prev = INDEX_ENTRY.unpack_from(
                buf, self._index_base + entry * INDEX_SIZE)
            if their_phy != phy_offset:
                return False
            if their_hash == key_hash:
                return True
            entry = prev if prev < entry else INVALID_INDEX
        return False

    def first_entry_at_or_after(self, phy_offset: int) -> int:
        """The number of the first entry whose phyOffset >= ``phy_offset`` (indexCount
        when none): entries are written in CommitLog order, so a binary search."""
        buf = self._check_open()
        lo, hi = 1, self._index_count
        while lo < hi:
            mid = (lo + hi) // 2
            if INDEX_ENTRY.unpack_from(buf, self._index_base + mid * INDEX_SIZE)[1] < phy_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate(self, phy_offset: int, store_timestamp_of: Callable[[int], int]) -> int:
        """Drop every entry for a CommitLog offset >= ``phy_offset`` (recovery cut the
        CommitLog there); returns how many went.

        The slots those entries headed are walked back to the newest kept entry, the
        dropped entries are zeroed, and the header's end values become the last kept
        entry's (its store time read through ``store_timestamp_of(phy_offset)``). A file
        none of whose entries stays must be destroyed by the caller instead.
        """
        buf = self._check_open()
        first = self.first_entry_at_or_after(phy_offset)
        count = self._index_count
        if first >= count:
            return 0
        assert first > 1, "a file with no entry left is destroyed, not truncated"
        base = self._index_base
        slots = {INDEX_ENTRY.unpack_from(buf, base + n * INDEX_SIZE)[0] % self.hash_slot_num
                 for n in range(first, count)}
        for slot in slots:
            pos = INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE
            head = HASH_SLOT.unpack_from(buf, pos)[0]
            while head >= first:
                prev = INDEX_ENTRY.unpack_from(buf, base + head * INDEX_SIZE)[3]
                head = prev if INVALID_INDEX < prev < head else INVALID_INDEX
            HASH_SLOT.pack_into(buf, pos, head)
        buf[base + first * INDEX_SIZE:base + count * INDEX_SIZE] = bytes((count - first) * INDEX_SIZE)
        _, last_phy, last_diff, _ = INDEX_ENTRY.unpack_from(buf, base + (first - 1) * INDEX_SIZE)
        stored = store_timestamp_of(last_phy)
        self._end_phy_offset = last_phy
        self._end_timestamp = stored if stored > 0 else self._begin_timestamp + last_diff * 1000
        self._hash_slot_count = max(0, self._hash_slot_count - (count - first))
        self._index_count = first
        self._write_header()
        return count - first

    def _check_open(self) -> mmap.mmap:
        if self._buf is None:
            raise StoreClosedError(f"{self.path} is closed")
        return self._buf

    def iter_entries(self) -> Iterator[tuple[int, int, int, int, int]]:
        """``(entry_no, key_hash, phy_offset, time_diff, pre_index_no)`` for entries
        ``1 .. indexCount - 1``, in order (for consistency checks).

        Reads in chunks of copied bytes, so no view of the mapping is held between
        yields. Raises ``StoreClosedError`` if the file is closed while iterating.
        """
        entry_no = 1
        while entry_no < self._index_count:
            buf = self._buf
            if buf is None:
                raise StoreClosedError(f"{self.path} is closed")
            last = min(self._index_count, entry_no + _ITER_CHUNK_ENTRIES)
            start = self._index_base + entry_no * INDEX_SIZE
            chunk = buf[start:self._index_base + last * INDEX_SIZE]
            for fields in INDEX_ENTRY.iter_unpack(chunk):
                yield (entry_no, *fields)
                entry_no += 1

    def reachable(self) -> np.ndarray:
        """Which entries (a mask over ``0 .. indexCount - 1``) a query can reach: walked
        from their slot as ``select_phy_offsets`` walks (a head inside the file, links
        that point backwards, no negative timeDiff), and in the slot their hash names.
        An entry no query reaches is a key lost to a damaged slot or link (for checks)."""
        buf = self._check_open()
        count, slots_n = self._index_count, self.hash_slot_num
        view = np.frombuffer(buf, _SLOT_DTYPE, slots_n, INDEX_HEADER_SIZE)
        slots = view.astype(np.int32)         # native order, 4 bytes: a full file's
        view = np.frombuffer(buf, _ENTRY_DTYPE, count, self._index_base)   # 20 M entries
        key_hash, time_diff, prev = (view[name].astype(np.int32)
                                     for name in ("key_hash", "time_diff", "pre_index_no"))
        del view                              # no export of the mapping outlives this
        reached = np.zeros(count, bool)
        slot = np.flatnonzero((slots > INVALID_INDEX) & (slots < count))
        entry = slots[slot]
        while len(entry) > _FEW_CHAINS:      # a step down every chain at once
            live = time_diff[entry] >= 0
            entry, slot = entry[live], slot[live]
            reached[entry[key_hash[entry] % slots_n == slot]] = True
            after = prev[entry]
            on = (after > INVALID_INDEX) & (after < entry)
            entry, slot = after[on], slot[on]
        for at, where in zip(entry.tolist(), slot.tolist()):   # the few long ones left:
            while time_diff[at] >= 0:         # a numpy step a link would cost more
                if key_hash[at] % slots_n == where:
                    reached[at] = True
                before = int(prev[at])
                if not INVALID_INDEX < before < at:
                    break
                at = before
        return reached

    def slot_value(self, slot: int) -> int:
        """The raw int in hash slot ``slot`` (for consistency checks)."""
        if self._buf is None:
            raise StoreClosedError(f"{self.path} is closed")
        if not 0 <= slot < self.hash_slot_num:
            raise IndexError(f"slot {slot} outside 0..{self.hash_slot_num - 1}")
        return HASH_SLOT.unpack_from(self._buf, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)[0]

    # ----------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Make every put so far durable: fdatasync on the file's descriptor.

        Raises ``OSError`` when fdatasync fails (never reported as done) and
        ``StoreClosedError`` after close.
        """
        if self._fd < 0:
            raise StoreClosedError(f"{self.path} is closed")
        FILE_OPS.fdatasync(self._fd)

    @property
    def closed(self) -> bool:
        return self._buf is None

    def close(self) -> None:
        """Unmap and close the file, keeping it on disk. Idempotent; raises nothing."""
        if self._buf is not None:
            try:
                self._buf.close()
            except BufferError:
                pass  # a view is still exported; the mapping goes when it is collected
            self._buf = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        """Close, then unlink the file. Never truncates: other processes may have it
        mapped, and the inode lives until their mappings go. Raises nothing if the file
        is already gone.
        """
        self.close()
        unlink_quietly(self.path)

    def __repr__(self) -> str:
        return (f"IndexFile({self.file_name}, index_count={self._index_count}, "
                f"phy=[{self._begin_phy_offset}, {self._end_phy_offset}], "
                f"time=[{self._begin_timestamp}, {self._end_timestamp}])")


# ====================================================================== read-only view
_SLOT_SETTLE_CHECKS = 20     # header re-reads while a slot names the entry being put
_SLOT_SETTLE_SLEEP_S = 0.00005
_HEADER_READS = 8            # reads until two consecutive headers agree


class IndexFileView:
    """One index file another process writes, mapped read-only with no descriptor kept
    (``StoreReader``). ``snapshot()`` re-reads the header the writer keeps updating; the
    queries read the values it took.

    The 40-byte header is re-read at every query, slot chains are walked as
    ``IndexFile.select_phy_offset`` does, never past indexCount, and the caller re-reads
    and verifies every hit, so a stale or torn entry can hide a message for a moment but
    never return a wrong one.
    """

    def __init__(self, path: str, hash_slot_num: int, index_num: int):
        """Raises ``StoreFileError`` when the file is not (yet) of the configured size,
        ``OSError`` when it cannot be opened (gone already)."""
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        size = index_file_size(hash_slot_num, index_num)
        fd = os.open(path, os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise StoreFileError(path, f"length {actual} is not the index file size {size}")
            self.buf: mmap.mmap | None = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.begin_timestamp = self.end_timestamp = self.end_phy_offset = 0
        self.index_count = 1
        self.unborn = True

    def snapshot(self) -> None:
        """Re-read the header until two reads agree. Raises ``CorruptRecordError`` when
        indexCount exceeds the file's capacity."""
        buf = self.buf
        if buf is None:
            raise StoreClosedError(f"{self.path} is closed")
        header = decode_header(buf)
        for _ in range(_HEADER_READS):
            again = decode_header(buf)
            if again == header:
                break
            header = again
        begin_ts, end_ts, _, end_phy, _, index_count = header
        # allocated but its header not written yet: no entries, and its begin of 0
        # must not end a query's newest-first walk before the older files
        self.unborn = index_count == 0 and begin_ts == 0 and end_ts == 0
        if index_count > self.index_num:
            raise CorruptRecordError(self.path, INDEX_COUNT_POS,
                                     f"indexCount {index_count} exceeds index_num {self.index_num}")
        self.begin_timestamp, self.end_timestamp, self.end_phy_offset = begin_ts, end_ts, end_phy
        self.index_count = index_count if index_count > 0 else 1

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        return time_matched(begin_ms, end_ms, self.begin_timestamp, self.end_timestamp)

    def select_phy_offset(self, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """As ``IndexFile.select_phy_offset``. A slot naming the entry being put right
        now (slot == indexCount: entry and slot are written, the header not yet) would
        hide the whole chain, so the header is re-read until it counts that entry."""
        key_hash = index_key_hash(key)
        slot_pos = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        for _ in range(_SLOT_SETTLE_CHECKS):
            if HASH_SLOT.unpack_from(self.buf, slot_pos)[0] != self.index_count:
                break
            time.sleep(_SLOT_SETTLE_SLEEP_S)
            self.snapshot()
        return select_phy_offsets(self.buf, self.hash_slot_num, self.begin_timestamp,
                                  self.index_count, key_hash, max_num, begin_ms, end_ms)

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()
            self.buf = None
