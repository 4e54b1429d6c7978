"""Raw CommitLog records to a pyarrow RecordBatch, vectorised.

The Spark data source reads CommitLog records as raw bytes (from the mapped files, or
from reader-socket replies that carry the records unchanged) and hands Spark pyarrow
RecordBatches. ``records_to_batch(buf, starts)`` turns the records that begin at
``buf[starts[i]]`` into one batch; the layout of a record is ``storage.record``'s.

Schema (``SCHEMA``; ``SPARK_SCHEMA_DDL`` is the same for Spark):

    column             arrow type                   from the record
    topic              string                       TOPIC
    queue_id           int32                        QUEUEID
    queue_offset       int64                        QUEUEOFFSET
    commit_log_offset  int64                        PHYSICALOFFSET
    msg_id             string                       hex(STOREHOSTADDRESS + PHYSICALOFFSET),
                                                    as ``message.create_message_id``
    tags               string                       property TAGS; null when absent
    keys               list<string>                 property KEYS split at spaces, empty
                                                    pieces dropped; [] when absent
    properties         map<string, string>          every other property, stored order,
                                                    without TAGS, KEYS, __PID and __SEQ
    body               binary                       BODY
    born_timestamp     timestamp[us, tz=UTC]        BORNTIMESTAMP, ms in the record
    store_timestamp    timestamp[us, tz=UTC]        STORETIMESTAMP, ms in the record
                                                    (both null past int64 microseconds)

Every column equals what ``record.decode_at`` and ``MessageExt`` give (``.msg_id``,
``.tags``, ``.keys``, ``.properties``): a property pair without ``\\x01`` or with an empty
name or value is ignored, as RocketMQ reads them (``message.read_properties``), a
name stored twice keeps its first place and its last value (a dict's update), and bytes
that are not UTF-8 decode with U+FFFD as Python's ``"replace"`` does.

Checks, in this order for each record; the first record that fails any of them raises
``CorruptRecordError(source, buf_offset + starts[i], "record i: ...")`` (the index is
also its ``record_index`` attribute), and nothing is returned:

    1. the shortest possible record (92 bytes) fits in ``buf`` from ``starts[i]``
    2. MAGICCODE is v1 (0xDAA320A7) or v2 (0xDAA320AB); a BLANK is not a record
    3. TOTALSIZE holds at least the fixed fields and ends inside ``buf``
    4. TOTALSIZE, QUEUEOFFSET, PHYSICALOFFSET equal ``expect_sizes``,
       ``expect_queue_offsets``, ``expect_commit_log_offsets`` (each when given)
    5. BODYLENGTH, TOPICLENGTH (1 signed byte for v1, 2 bytes for v2) and
       PROPERTIESLENGTH are not negative (the topic's is positive) and each field ends
       inside TOTALSIZE
    6. TOTALSIZE equals the length recomputed from the fields
       (``record.calc_msg_length``: a v2 record must have a topic over 127 bytes)
    7. no NUL byte in topic or properties (a torn record's zero-filled tail; the same
       rule as ``decode_at``)

The body CRC is not checked: it costs a pass over every body, and the callers that need
it (recovery, ``check_message_and_return_size``, the reader) verify records before they
hand them on. A ``CorruptRecordError`` leaves no reference to ``buf`` in its traceback,
so a caller may close its mmap in the ``except`` block.

Why vectorised: ``decode_at`` plus ``.tags``/``.keys``/``.msg_id`` costs ~17 us a
record here (60 k records/s); the pipeline needs a million rows a second on Spark
local[2]. Here each step is one numpy or Arrow call over all records of the call:

* The fixed fields of every record come from one numpy gather: a view of ``buf`` whose
  elements overlap (``strides=(1,)``, 92-byte elements: fields 1-15 for IPv4 hosts and
  the body's first 4 bytes), indexed by ``starts``, then viewed as a big-endian
  structured dtype (``FIXED_V4``). Records with an IPv6 host re-read fields 11-15 at
  their own positions. TOPICLENGTH is gathered byte by byte, PROPERTIESLENGTH together
  with the first 4 bytes of the properties.
* Topic, body and properties become Arrow ``binary_view`` arrays whose 16-byte views
  point into ``buf`` (a value of at most 12 bytes is stored in its view), and one Arrow
  cast per column copies them into plain ``binary``/``string`` arrays. UTF-8 is
  validated once per column.
* Properties are parsed in that copy: one ``flatnonzero`` finds every \\x01 and \\x02.
  When every record's properties end with \\x02 and the two alternate (what every
  writer writes), the separators are the pair boundaries; otherwise a cumulative
  count of \\x02 per record splits items and keeps each item's first \\x01. Names and
  values are ``take``s from one string array whose offsets are those boundaries.
  Each name's first 8 bytes, as an integer, identify TAGS, KEYS, __PID and __SEQ
  (names of at most 8 bytes, no NUL); a hash of them finds names stored twice in a
  record, confirmed by comparing the names. KEYS with no space is the list itself,
  else ``split_pattern``.
* msg_id: a 65,536-entry table gives the 4 hex digits of every 2 bytes.

Memory: no array has one element per byte (the largest, one per property separator);
the output owns its memory, nothing in it points into ``buf``, so an mmap can be
closed as soon as the call returns. A batch holds less than 2 GiB in each of its
columns (``binary``/``string`` have 32-bit offsets); ``buf`` itself may be larger
(views then reach it through slices 1 GiB apart).

Measured (``python bench/arrow_codec.py``: 100,000 records of 263 bytes, 128-byte
body, a tag, one key, one user property, IPv4 hosts; one process on the 2-core
development VM while other sessions kept both cores busy, load average 2.3-2.8; the
best of 15 runs, lowest and highest of two bench runs):

    records a call   MALLOC_TOP_PAD_   adjacent            non-adjacent (0-63 B gaps)
    100,000          unset             1.04-1.21 M/s       1.10-1.20 M/s
    100,000          256 MiB           1.37-1.53 M/s       1.19-1.43 M/s
    16,384           unset             1.21-1.65 M/s
    16,384           256 MiB           1.52-1.77 M/s
    4,096            either            0.94-1.25 M/s
    1,024            either            0.64-0.67 M/s

What bounds it: some 60 numpy and Arrow calls over all records, 0.2-4 ms each per
100,000 records. The largest: the three casts that copy topic, body and properties
(~9 ms together), the gathers that first touch each record's head, topic and
properties (~4 ms each, about one cache miss per record), the first 8 bytes of every
property name (~4 ms), the separator scan of the properties (~3 ms), the name and
value ``take``s (~5 ms), the msg_id table look-ups (~3 ms). A call also costs ~1 ms
however few records it holds (some 400 Python-level calls), hence the small-call rows:
convert thousands of records a call, ~16,000 at best. Without ``MALLOC_TOP_PAD_``
glibc gives each call's freed temporaries back to the kernel and the next call
page-faults them in again (~5,000 faults, ~15 ms per 100,000 records here); a Spark
worker sets the same through ``mallopt`` before its first read (``allocator``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.storage import record
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, NAME_VALUE_SEPARATOR, PROPERTY_KEYS, PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQUENCE, PROPERTY_SEPARATOR, PROPERTY_TAGS, STOREHOSTADDRESS_V6_FLAG)

SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("commit_log_offset", pa.int64()),
    ("msg_id", pa.string()),
    ("tags", pa.string()),
    ("keys", pa.list_(pa.string())),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
    ("born_timestamp", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", pa.timestamp("us", tz="UTC")),
])
SPARK_SCHEMA_DDL = (
    "topic string, queue_id int, queue_offset long, commit_log_offset long, msg_id string, "
    "tags string, keys array<string>, properties map<string,string>, body binary, "
    "born_timestamp timestamp, store_timestamp timestamp")
HIDDEN_PROPERTIES = (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_PRODUCER_ID,
                     PROPERTY_PRODUCER_SEQUENCE)

# Fields 1-15 of a record with IPv4 hosts as one big-endian numpy record: one gather
# reads them all. Records with an IPv6 host re-read fields 11-15 at their own offsets.
FIXED_V4 = np.dtype([
    ("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"),
    ("flag", ">i4"), ("queue_offset", ">i8"), ("physical_offset", ">i8"),
    ("sys_flag", ">i4"), ("born_timestamp", ">i8"), ("born_host", "V8"),
    ("store_timestamp", ">i8"), ("store_host", "V8"), ("reconsume_times", ">i4"),
    ("prepared_transaction_offset", ">i8"), ("body_length", ">i4")])
HOST_V4_WIDTH, HOST_V6_WIDTH = record.host_width(False), record.host_width(True)
PHYSICALOFFSET_WIDTH = 8
TOPICLENGTH_V1_WIDTH, TOPICLENGTH_V2_WIDTH, PROPERTIESLENGTH_WIDTH = 1, 2, 2
# the shortest record: the fixed fields, no body, a 1-byte topic, no properties
MIN_RECORD_SIZE = FIXED_V4.itemsize + TOPICLENGTH_V1_WIDTH + 1 + PROPERTIESLENGTH_WIDTH
assert MIN_RECORD_SIZE == record.calc_msg_length(0, 0, 1, 0) == 92
assert FIXED_V4.fields["born_host"][1] == record.BORNHOST_POS
assert FIXED_V4.fields["queue_offset"][1] == record.QUEUEOFFSET_POS
assert FIXED_V4.fields["physical_offset"][1] == record.PHYSICALOFFSET_POS
assert FIXED_V4.fields["sys_flag"][1] == record.SYSFLAG_POS
assert FIXED_V4.fields["store_timestamp"][1] == record.store_timestamp_pos(0)

# Fields 11-15 follow the born host, whose width varies: offsets from its end ...
STORETIMESTAMP_AFTER_BORNHOST = 0
STOREHOST_AFTER_BORNHOST = STORETIMESTAMP_AFTER_BORNHOST + 8
# ... and from the end of the store host, whose width varies too.
RECONSUMETIMES_AFTER_STOREHOST = 0
PREPARED_AFTER_STOREHOST = RECONSUMETIMES_AFTER_STOREHOST + 4
BODYLENGTH_AFTER_STOREHOST = PREPARED_AFTER_STOREHOST + 8
BODY_AFTER_STOREHOST = BODYLENGTH_AFTER_STOREHOST + 4
assert (record.BORNHOST_POS + HOST_V4_WIDTH + STOREHOST_AFTER_BORNHOST + HOST_V4_WIDTH
        + BODY_AFTER_STOREHOST) == FIXED_V4.itemsize
STOREHOST_V4_POS = FIXED_V4.fields["store_host"][1]
# what one gather reads at each record: the fixed fields and, with IPv4 hosts, the first
# 4 bytes of the body (for its view); MIN_RECORD_SIZE bytes, so always inside the buffer
FIXED_GATHER = np.dtype(FIXED_V4.descr + [("body_prefix", "V4")])
assert FIXED_GATHER.itemsize <= MIN_RECORD_SIZE

# An Arrow binary_view value is 16 little-endian bytes: int32 length, then either the
# value itself (at most 12 bytes, zero padded) or its first 4 bytes, an int32 buffer
# index and an int32 offset into that buffer.
VIEW_INLINE = 12
VIEW_CHUNK = 1 << 30  # a buffer of 2 GiB or more is seen as slices 1 GiB apart
_INT32_MAX = 2**31 - 1
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)
# for an inline view of k bytes (row k): the length's 4 bytes are cleared, k bytes kept
_INLINE_MASKS = np.array(
    [[((1 << (8 * min(k, 4))) - 1) << 32, (1 << (8 * max(k - 4, 0))) - 1]
     for k in range(VIEW_INLINE + 1)], np.uint64)

# "00".."FF" as '<u2', and "0000".."FFFF" as '<u4' indexed by two bytes read as '<u2':
# table[raw.view("<u2")].view(np.uint8) is the hex text of raw.
_HEX2 = np.frombuffer("".join(f"{i:02X}" for i in range(256)).encode(), "<u2")
_HEX4 = (_HEX2[np.arange(65536) & 0xFF].astype("<u4")
         | (_HEX2[np.arange(65536) >> 8].astype("<u4") << 16))
_MS_TO_US = 1000
_MAX_MS = np.iinfo(np.int64).max // _MS_TO_US


def _name_word(name: str) -> np.uint64:
    """A property name of at most 8 bytes as the '<u8' of its bytes, zero padded."""
    raw = name.encode()
    assert len(raw) <= 8
    return np.uint64(int.from_bytes(raw, "little"))


_TAGS_WORD, _KEYS_WORD = _name_word(PROPERTY_TAGS), _name_word(PROPERTY_KEYS)
_HIDDEN_WORDS = [_name_word(name) for name in HIDDEN_PROPERTIES]
_SEP_NAME_VALUE = ord(NAME_VALUE_SEPARATOR)
_SEP_PROPERTY = ord(PROPERTY_SEPARATOR)
assert (_SEP_NAME_VALUE, _SEP_PROPERTY) == (1, 2)


class _Source:
    """``buf`` as numpy bytes, as overlapping fixed-width windows and as Arrow buffers."""

    def __init__(self, buf):
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        self.mv = mv
        self.size = mv.nbytes
        self.u8 = np.frombuffer(mv, np.uint8)
        self._windows: dict = {}
        self._arrow: list | None = None

    def window(self, dtype) -> np.ndarray:
        """``w[i]`` is the ``dtype`` value whose first byte is ``buf[i]``: a view, no copy."""
        dtype = np.dtype(dtype)
        w = self._windows.get(dtype)
        if w is None:
            w = self._windows[dtype] = _window(self.u8, dtype)
        return w

    def arrow_buffers(self) -> list:
        """Data buffers for view arrays: one, or overlapping slices 1 GiB apart when
        ``buf`` is too large for the views' 32-bit offsets."""
        if self._arrow is None:
            if self.size <= _INT32_MAX:
                self._arrow = [pa.py_buffer(self.mv)]
            else:
                self._arrow = [pa.py_buffer(self.mv[k:k + VIEW_CHUNK + _INT32_MAX])
                               for k in range(0, self.size, VIEW_CHUNK)]
        return self._arrow

    def slices(self, pos: np.ndarray, length: np.ndarray, type_: pa.DataType,
               prefix: np.ndarray | None = None) -> pa.Array:
        """``buf[pos[i]:pos[i] + length[i]]`` as a ``binary`` or ``string`` array, copied:
        a ``binary_view`` array whose views point into ``buf``, cast. Every position is
        at least 4 (values lie after a record's fixed fields). ``prefix``, when the
        caller has them, are the first 4 bytes of each value as '<u4'.

        Raises ``pa.ArrowInvalid`` for a string that is not UTF-8.
        """
        n = len(pos)
        short = length <= VIEW_INLINE
        n_short = int(np.count_nonzero(short))
        if n_short == n:
            views = self._inline_views(pos, length)
        else:  # a value over 12 bytes: its length, first 4 bytes, buffer and offset
            views = np.empty((n, 2), "<u8")
            views[:, 0] = self.window("<u4")[np.minimum(pos, self.size - 4)] \
                if prefix is None else prefix  # short values: below
            views[:, 0] <<= np.uint64(32)
            views[:, 0] |= length.astype(np.uint64)
            if self.size <= _INT32_MAX:
                views[:, 1] = pos.astype(np.uint64) << np.uint64(32)
            else:
                views[:, 1] = (pos // VIEW_CHUNK).astype(np.uint64) \
                    | ((pos % VIEW_CHUNK).astype(np.uint64) << np.uint64(32))
            if n_short:
                at = np.flatnonzero(short)
                views[at] = self._inline_views(pos[at], length[at])
        arr = pa.Array.from_buffers(pa.binary_view(), n,
                                    [None, pa.py_buffer(views)] + self.arrow_buffers())
        return arr.cast(type_)

    def _inline_views(self, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Views of values of at most 12 bytes: the length, then the bytes, zero padded.

        The 16 bytes from ``pos - 4`` are gathered whole and the 4 bytes before the value
        replaced by its length.
        """
        inside = pos <= self.size - VIEW_INLINE
        if inside.all():
            views = self.window(np.dtype((np.void, 16)))[pos - 4]
        else:  # values that end within 12 bytes of the end: from a zero-padded copy
            views = np.zeros(len(pos), np.dtype((np.void, 16)))
            views[inside] = self.window(np.dtype((np.void, 16)))[pos[inside] - 4]
            tail_from = max(0, self.size - 16)
            tail = np.zeros(32, np.uint8)
            tail[:self.size - tail_from] = self.u8[tail_from:]
            near = pos[~inside] - 4 - tail_from
            views[~inside] = tail[near[:, None] + np.arange(16)].view(views.dtype)[:, 0]
        words = views.view("<u8").reshape(-1, 2)
        lo, hi = (int(length.min()), int(length.max())) if len(length) else (0, 0)
        words &= _INLINE_MASKS[lo] if lo == hi else _INLINE_MASKS[length]
        words[:, 0] |= length.astype(np.uint64)
        return words


# ---------------------------------------------------------------------------- checks
class _FirstFault:
    """The first bad record found so far. Later stages look only at the records before
    it (``limit``): a fault further on cannot be the first."""

    def __init__(self, count: int):
        self.limit = count
        self.index: int | None = None
        self.detail = ""

    def check(self, bad: np.ndarray, describe) -> None:
        hits = np.flatnonzero(bad[:self.limit])
        if hits.size:
            i = int(hits[0])
            self.limit, self.index, self.detail = i, i, describe(i)

    def error(self, source: str, buf_offset: int, starts: np.ndarray) -> CorruptRecordError:
        i = self.index
        err = CorruptRecordError(source, buf_offset + int(starts[i]), f"record {i}: {self.detail}")
        err.record_index = i
        return err


class _Layout:
    """The fields and the positions (in ``buf``) of the first ``count`` records."""

    count: int
    fixed: np.ndarray  # FIXED_GATHER; fields 11-15 and body_prefix only if not any_v6
    any_v6: bool
    store_v6: np.ndarray
    store_host_pos: np.ndarray
    store_timestamp: np.ndarray
    body_pos: np.ndarray
    body_len: np.ndarray
    topic_pos: np.ndarray
    topic_len: np.ndarray
    props_pos: np.ndarray
    props_len: np.ndarray
    props_prefix: np.ndarray  # the first 4 bytes of the properties as '<u4' (if over 4)


def _expected(values, count: int, name: str):
    if values is None:
        return None
    values = np.asarray(values, np.int64)
    if values.shape != (count,):
        raise ValueError(f"{name} has shape {values.shape}, expected ({count},)")
    return values


def _locate(src: _Source, starts: np.ndarray, expect: tuple, faults: _FirstFault) -> _Layout:
    """Checks 1-6 of the module docstring; the layout of the records before the first
    fault."""
    size = src.size
    faults.check((starts < 0) | (starts > size - MIN_RECORD_SIZE),
                 lambda i: f"a record at {starts[i]} cannot fit in the {size}-byte buffer")
    k = faults.limit
    s = starts[:k]
    fixed = src.window(np.dtype((np.void, FIXED_GATHER.itemsize)))[s].view(FIXED_GATHER)
    magic = fixed["magic"].astype(np.uint32)
    faults.check((magic != record.MESSAGE_MAGIC_CODE) & (magic != record.MESSAGE_MAGIC_CODE_V2),
                 lambda i: f"illegal magic code 0x{int(magic[i]):08X}")
    total = fixed["total_size"].astype(np.int64)
    sys_flag = fixed["sys_flag"]
    v6 = (sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) != 0
    any_v6 = bool(v6.any())
    if any_v6:
        born_w = np.where(sys_flag & BORNHOST_V6_FLAG, HOST_V6_WIDTH, HOST_V4_WIDTH)
        store_w = np.where(sys_flag & STOREHOSTADDRESS_V6_FLAG, HOST_V6_WIDTH, HOST_V4_WIDTH)
        store_host_rel = record.BORNHOST_POS + born_w + STOREHOST_AFTER_BORNHOST
        body_rel = store_host_rel + store_w + BODY_AFTER_STOREHOST
    else:
        store_host_rel, body_rel = STOREHOST_V4_POS, FIXED_V4.itemsize
    faults.check((total < body_rel + MIN_RECORD_SIZE - FIXED_V4.itemsize) | (total > size - s),
                 lambda i: f"record size {total[i]} is too small or runs past the data")
    for values, field, name in ((expect[0], total, "TOTALSIZE"),
                                (expect[1], fixed["queue_offset"], "QUEUEOFFSET"),
                                (expect[2], fixed["physical_offset"], "PHYSICALOFFSET")):
        if values is not None:
            faults.check(field != values[:len(field)],
                         lambda i: f"{name} {field[i]}, expected {values[i]}")

    k = faults.limit
    lay = _Layout()
    lay.count, lay.any_v6 = k, any_v6
    lay.fixed, s, total, v6 = fixed[:k], s[:k], total[:k], v6[:k]
    lay.store_v6 = (sys_flag[:k] & STOREHOSTADDRESS_V6_FLAG) != 0
    body_len = lay.fixed["body_length"].astype(np.int64)
    lay.store_timestamp = lay.fixed["store_timestamp"].astype(np.int64)
    if any_v6:
        store_host_rel, body_rel = store_host_rel[:k], body_rel[:k]
        at = np.flatnonzero(v6)
        body_len[at] = src.window(">i4")[s[at] + body_rel[at] - BODY_AFTER_STOREHOST
                                         + BODYLENGTH_AFTER_STOREHOST]
        lay.store_timestamp[at] = src.window(">i8")[
            s[at] + store_host_rel[at] - STOREHOST_AFTER_BORNHOST + STORETIMESTAMP_AFTER_BORNHOST]
    lay.store_host_pos = s + store_host_rel
    end = s + total
    v2 = magic[:k] == record.MESSAGE_MAGIC_CODE_V2
    topic_len_pos = s + body_rel + np.maximum(body_len, 0)
    topic_len_w = np.where(v2, TOPICLENGTH_V2_WIDTH, TOPICLENGTH_V1_WIDTH)
    faults.check((body_len < 0) | (topic_len_pos + topic_len_w > end),
                 lambda i: f"body length {body_len[i]} runs past the record")

    k = faults.limit
    s, end, v2, topic_len_pos, topic_len_w = s[:k], end[:k], v2[:k], topic_len_pos[:k], \
        topic_len_w[:k]
    topic_len = src.u8[topic_len_pos].view(np.int8).astype(np.int64)
    at = np.flatnonzero(v2)
    topic_len[at] = _be_short(src.u8, topic_len_pos[at])
    topic_pos = topic_len_pos + topic_len_w
    props_len_pos = topic_pos + np.maximum(topic_len, 0)
    faults.check((topic_len <= 0) | (props_len_pos + PROPERTIESLENGTH_WIDTH > end),
                 lambda i: f"topic length {topic_len[i]} is not positive or runs past the record")

    k = faults.limit
    s, end, props_len_pos, topic_len = s[:k], end[:k], props_len_pos[:k], topic_len[:k]
    body_len, body_rel = body_len[:k], body_rel[:k] if any_v6 else body_rel
    # PROPERTIESLENGTH and the first 4 bytes of the properties (for their views) in one
    # gather; a record within 8 bytes of the end has properties too short to need them
    head = src.window(np.dtype((np.void, 8)))[np.minimum(props_len_pos, size - 8)] \
        .view(np.uint8).reshape(-1, 8)
    props_len = head[:, 0].view(np.int8).astype(np.int64) * 256 + head[:, 1]
    near = np.flatnonzero(props_len_pos > size - 8)
    props_len[near] = _be_short(src.u8, props_len_pos[near])
    topic_len_w = np.where(topic_len > record.MAX_V1_TOPIC_LENGTH, TOPICLENGTH_V2_WIDTH,
                           TOPICLENGTH_V1_WIDTH)  # as calc_msg_length decides
    calc = body_rel + body_len + topic_len_w + topic_len + PROPERTIESLENGTH_WIDTH + props_len
    faults.check((props_len < 0) | (calc != end - s),
                 lambda i: f"record size {end[i] - s[i]} disagrees with its fields (body "
                           f"{body_len[i]}, topic {topic_len[i]} and properties "
                           f"{props_len[i]} bytes make {calc[i]})")

    k = faults.limit
    lay.body_pos = (s + body_rel)[:k]
    lay.body_len = body_len[:k]
    lay.topic_pos = topic_pos[:k]
    lay.topic_len = topic_len[:k]
    lay.props_pos = props_len_pos[:k] + PROPERTIESLENGTH_WIDTH
    lay.props_len = props_len[:k]
    lay.props_prefix = head[:k, 2:6].view("<u4")[:, 0]
    return lay


def _check_no_nul(arr: pa.Array, what: str, faults: _FirstFault) -> None:
    """Check 7 on a binary array of one value per record."""
    data = _data(arr)
    if data.size and data[data.argmin()] == 0:  # argmin: one pass, no temporary
        offsets = _offsets(arr)
        nul = np.zeros(len(arr), bool)
        nul[np.searchsorted(offsets, np.flatnonzero(data == 0), side="right") - 1] = True
        faults.check(nul, lambda i: f"NUL byte in {what} (torn record)")


# ---------------------------------------------------------------------------- arrow bits
def _offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int32 offsets of a binary or string array."""
    return np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)


def _data(arr: pa.Array) -> np.ndarray:
    """The bytes of a binary or string array's values (whose first offset is 0)."""
    offsets = _offsets(arr)
    assert not len(arr) or offsets[0] == 0
    buf = arr.buffers()[2]
    if buf is None or not len(arr):
        return np.zeros(0, np.uint8)
    return np.frombuffer(buf, np.uint8, int(offsets[-1]))


def _from_offsets(type_: pa.DataType, offsets: np.ndarray, data) -> pa.Array:
    return pa.Array.from_buffers(type_, len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.astype(np.int32, copy=False)), data])


def _as_utf8(arr: pa.Array) -> pa.Array:
    """A binary array as string: zero-copy when it is UTF-8, else each value decoded
    with U+FFFD for bad bytes, as ``decode_at``'s ``"replace"`` (corrupt data only)."""
    text = arr.view(pa.string())
    try:
        text.validate(full=True)
        return text
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace")
                         for v in arr.to_pylist()], pa.string())


def _timestamps(ms: np.ndarray) -> pa.Array:
    """Milliseconds to timestamp[us]; null where microseconds overflow int64 (beyond
    the year 294,000: garbage, which an int64 would wrap into a plausible date)."""
    us = ms.astype(np.int64)
    out_of_range = (us > _MAX_MS) | (us < -_MAX_MS)
    us *= _MS_TO_US
    type_ = pa.timestamp("us", tz="UTC")
    if out_of_range.any():
        return pa.array(us, type_, mask=out_of_range)
    return pa.Array.from_buffers(type_, len(us), [None, pa.py_buffer(us)])


def _be_short(u8: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The signed big-endian 2-byte integer at each position, as int64. Byte by byte:
    numpy gathers from a contiguous byte array far faster than through a window."""
    out = np.empty(len(pos), ">i2")
    raw = out.view(np.uint8).reshape(-1, 2)
    raw[:, 0] = u8[pos]
    raw[:, 1] = u8[pos + 1]
    return out.astype(np.int64)


def _window(u8: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A view of the byte array ``u8`` whose element i is the ``dtype`` value at byte i.

    numpy gathers from it at any byte position (``w[positions]``) in one call.
    """
    count = len(u8) - dtype.itemsize + 1
    if count <= 0:
        return np.zeros(0, dtype)
    return np.ndarray((count,), dtype, buffer=u8, strides=(1,))


def _low_bytes(word: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The low ``count`` bytes (0..8, more means 8) of each '<u8' word, the rest zeroed."""
    return word & _LOW_BYTES[np.minimum(count, 8)]


# ---------------------------------------------------------------------------- columns
def _msg_ids(src: _Source, lay: _Layout) -> pa.Array:
    """``create_message_id``: hex of the store host bytes (8 or 20) and the 8 bytes of
    PHYSICALOFFSET."""
    k = lay.count
    phys = slice(record.PHYSICALOFFSET_POS, record.PHYSICALOFFSET_POS + PHYSICALOFFSET_WIDTH)
    fixed = lay.fixed.view(np.uint8).reshape(k, FIXED_GATHER.itemsize)
    v6 = lay.store_v6
    if not lay.any_v6:  # every store host lies at STOREHOST_V4_POS
        host = fixed[:, STOREHOST_V4_POS:STOREHOST_V4_POS + HOST_V4_WIDTH]
        step = 2 * (HOST_V4_WIDTH + PHYSICALOFFSET_WIDTH)
        text = np.empty((k, step), np.uint8)
        words = host.view("<u8")
        if (words == words[0]).all():  # one store host (broker) in the batch
            text[:, :2 * HOST_V4_WIDTH] = _HEX4[host[0].view("<u2")].view(np.uint8)
        else:
            text[:, :2 * HOST_V4_WIDTH] = _HEX4[host.view("<u2")].view(np.uint8)
        text[:, 2 * HOST_V4_WIDTH:] = _HEX4[fixed[:, phys].view("<u2")].view(np.uint8)
        return _from_offsets(pa.string(), np.arange(0, (k + 1) * step, step),
                             pa.py_buffer(text))
    host = src.window(np.dtype((np.void, HOST_V6_WIDTH)))[lay.store_host_pos] \
        .view(np.uint8).reshape(k, HOST_V6_WIDTH)
    raw = np.zeros((k, HOST_V6_WIDTH + PHYSICALOFFSET_WIDTH), np.uint8)
    v4 = ~v6
    raw[v6, :HOST_V6_WIDTH] = host[v6]
    raw[v6, HOST_V6_WIDTH:] = fixed[v6, phys]
    raw[v4, :HOST_V4_WIDTH] = host[v4, :HOST_V4_WIDTH]
    raw[v4, HOST_V4_WIDTH:HOST_V4_WIDTH + PHYSICALOFFSET_WIDTH] = fixed[v4, phys]
    text = _HEX4[raw.view("<u2")].view(np.uint8)
    lengths = 2 * np.where(v6, HOST_V6_WIDTH + PHYSICALOFFSET_WIDTH,
                           HOST_V4_WIDTH + PHYSICALOFFSET_WIDTH)
    chars = text[np.arange(text.shape[1]) < lengths[:, None]]
    offsets = np.zeros(k + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return _from_offsets(pa.string(), offsets, pa.py_buffer(chars))


class _Pairs:
    """Every name/value pair of the properties of a batch, in stored order.

    ``pieces`` is one string array over the properties bytes whose values 4i and 4i+2
    are the name and the value of pair i; ``record`` is the record of each pair and
    ``first[r]:first[r + 1]`` the pairs of record r; ``name8`` the first 8 bytes of each
    name as '<u8', zero padded, which is the whole name when it is at most 8 bytes long
    (no NUL in names), and ``hash`` is equal for equal names of a record.
    """

    def __init__(self, props: pa.Array):
        n = len(props)
        po = _offsets(props).astype(np.int64)
        d = _data(props)
        data = props.buffers()[2]
        sep = np.flatnonzero(d <= _SEP_PROPERTY)  # \x01 and \x02 (NUL was refused before)
        code = d[sep]
        ends = po[1:][po[1:] > po[:-1]] - 1
        # When every record ends with \x02 (as every writer writes them), no item crosses
        # a record's edge; when moreover \x01 and \x02 alternate, each item is one pair.
        closed = bool((d[ends] == _SEP_PROPERTY).all())
        alternate = closed and len(sep) % 2 == 0 and (code[0::2] == _SEP_NAME_VALUE).all() \
            and (code[1::2] == _SEP_PROPERTY).all()
        if alternate:
            eq, value_end = sep[0::2], sep[1::2]
            name_start = np.empty(len(eq), np.int64)
            name_start[:1] = 0
            name_start[1:] = value_end[:-1] + 1
            self.first = np.searchsorted(eq, po)
            self.record = np.repeat(np.arange(n), np.diff(self.first))
        else:
            eq, name_start, value_end = self._items(n, po, sep, code == _SEP_PROPERTY, closed)
        # a pair with an empty name or value is no pair (``read_properties``)
        whole = (eq > name_start) & (value_end > eq + 1)
        if alternate and whole.all():
            bounds = np.empty(2 * len(sep) + 1, np.int32)  # 0, then each separator's edges
            bounds[0] = 0
            bounds[1::2] = sep
            bounds[2::2] = sep
            bounds[2::2] += 1
        else:
            if not whole.all():
                eq, name_start, value_end = eq[whole], name_start[whole], value_end[whole]
                self.record = self.record[whole]
                self.first = np.searchsorted(self.record, np.arange(n + 1))
            bounds = np.empty((len(eq), 4), np.int64)
            bounds[:, 0], bounds[:, 1], bounds[:, 2], bounds[:, 3] = \
                name_start, eq, eq + 1, value_end
            bounds = bounds.ravel()
        self.n, self.count = n, len(eq)
        self.pieces = _from_offsets(pa.string(), bounds, data) if self.count \
            else pa.array([], pa.string())
        name_len = eq - name_start
        if len(d) < 8:
            d = np.concatenate([d, np.zeros(8, np.uint8)])
        w8 = _window(d, np.dtype("<u8"))
        at = np.minimum(name_start, len(d) - 8)  # a name within 8 bytes of the end
        self.name8 = _low_bytes(w8[at] >> ((name_start - at).astype(np.uint64) << np.uint64(3)),
                                name_len)
        self.hash = self.name8 ^ (self.record.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        long = np.flatnonzero(name_len > 8)
        if long.size:  # and the last 8 bytes of longer names
            self.hash[long] ^= w8[eq[long] - 8] * np.uint64(0xC2B2AE3D27D4EB4F)

    def _items(self, n, po, sep, is2, closed):
        """The general case: an item is the text between two \\x02 or a \\x02 and a
        record's edge; only its first \\x01 splits name and value, and an item without
        one is ignored (``read_properties``)."""
        n2 = np.cumsum(is2)  # how many \x02 up to each separator
        ones = np.flatnonzero(~is2)
        if closed:
            item = n2[ones]
        else:
            rec = np.repeat(np.arange(n), np.diff(np.searchsorted(sep, po)))
            item = n2[ones] + rec[ones]
        first = np.ones(len(ones), bool)
        first[1:] = item[1:] != item[:-1]
        j = ones[first]
        eq = sep[j]
        at2 = np.concatenate([[-1], sep[is2], [po[-1]]])  # each \x02, with sentinels
        name_start = at2[n2[j]] + 1
        value_end = at2[n2[j] + 1]
        if closed:
            self.first = np.searchsorted(eq, po)
            self.record = np.repeat(np.arange(n), np.diff(self.first))
        else:
            self.record = rec[j]
            name_start = np.maximum(name_start, po[self.record])
            value_end = np.minimum(value_end, po[self.record + 1])
            self.first = np.searchsorted(self.record, np.arange(n + 1))
        return eq, name_start, value_end

    def name(self, i: np.ndarray) -> pa.Array:
        return self.pieces.take(4 * i)

    def value(self, i: np.ndarray) -> pa.Array:
        return self.pieces.take(4 * i + 2)

    def merge_duplicates(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keep, value_of)``: a name stored twice in a record keeps its first pair,
        showing the last value (``dict`` update in ``read_properties``); the later
        pairs are dropped."""
        keep = np.ones(self.count, bool)
        value_of = np.arange(self.count)
        most = int(np.diff(self.first).max()) if self.n else 0
        if most <= 16:  # compare each pair with the 1..15 pairs before it
            h = self.hash
            found = [(later - lag, later) for lag in range(1, most)
                     for later in [np.flatnonzero(h[lag:] == h[:-lag]) + lag] if later.size]
            if not found:
                return keep, value_of
            earlier = np.concatenate([f[0] for f in found])
            later = np.concatenate([f[1] for f in found])
            # equal hashes: the same record and the same name?
            same = (self.record[earlier] == self.record[later]) & pc.equal(
                self.name(earlier), self.name(later)).to_numpy(zero_copy_only=False)
            earlier, later = earlier[same], later[same]
        else:  # a record with many pairs: sort by (record, name, position)
            code = self.name(np.arange(self.count)).dictionary_encode().indices.to_numpy()
            order = np.lexsort((np.arange(self.count), code, self.record))
            rec, code = self.record[order], code[order]
            leads = np.concatenate([[True], (rec[1:] != rec[:-1]) | (code[1:] != code[:-1])])
            leader = order[np.maximum.accumulate(np.where(leads, np.arange(self.count), 0))]
            earlier, later = leader[~leads], order[~leads]
        keep[later] = False
        np.maximum.at(value_of, earlier, later)
        return keep, value_of


def _property_columns(props: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The tags, keys and properties columns from the UTF-8 properties of each record."""
    n = len(props)
    pairs = _Pairs(props)
    keep, value_of = pairs.merge_duplicates()
    name8 = pairs.name8
    hidden = np.zeros(pairs.count, bool)
    for word in _HIDDEN_WORDS:
        hidden |= name8 == word
    shown = keep & ~hidden
    shown_before = np.zeros(pairs.count + 1, np.int64)
    np.cumsum(shown, out=shown_before[1:])
    shown = np.flatnonzero(shown)
    properties = pa.MapArray.from_arrays(
        pa.array(shown_before[pairs.first], pa.int32()), pairs.name(shown),
        pairs.value(value_of[shown]), type=SCHEMA.field("properties").type)

    at = np.flatnonzero(keep & (name8 == _TAGS_WORD))
    tag_of = np.zeros(n, np.int64)
    tag_of[pairs.record[at]] = value_of[at]
    no_tag = np.ones(n, bool)
    no_tag[pairs.record[at]] = False
    tags = pairs.pieces.take(pa.array(4 * tag_of + 2, mask=no_tag)) if pairs.count \
        else pa.nulls(n, pa.string())
    at = np.flatnonzero(keep & (name8 == _KEYS_WORD))
    keys = _keys(pairs.value(value_of[at]), pairs.record[at], n)
    return tags, keys, properties


def _keys(values: pa.Array, rec: np.ndarray, n: int) -> pa.Array:
    """``MessageExt.keys``: each KEYS value split at spaces, empty pieces dropped; []
    for a record without KEYS."""
    offsets = np.zeros(n + 1, np.int64)
    text = _data(values)
    lengths = np.diff(_offsets(values))
    if not (text == ord(" ")).any() and (lengths > 0).all():  # one key each: no split
        per_record = np.zeros(n, np.int64)
        per_record[rec] = 1
        np.cumsum(per_record, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    split = pc.split_pattern(values, " ")
    flat = split.flatten()
    nonempty = pc.binary_length(flat).to_numpy() > 0
    parent = pc.list_parent_indices(split).to_numpy()
    per_record = np.zeros(n, np.int64)
    per_record[rec] = np.bincount(parent[nonempty], minlength=len(rec))
    np.cumsum(per_record, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat.filter(nonempty))


# ---------------------------------------------------------------------------- the batch
def records_to_batch(buf, starts, *, expect_queue_offsets=None, expect_commit_log_offsets=None,
                     expect_sizes=None, source: str = "<records>", buf_offset: int = 0,
                     columns: Sequence[str] | None = None) -> pa.RecordBatch:
    """One RecordBatch (``SCHEMA``) of the records at ``buf[starts[i]]``.

    ``buf`` is any bytes-like object (bytes, bytearray, memoryview, mmap); ``starts`` the
    position of each record's first byte (any order, gaps allowed). ``expect_*`` are
    optional arrays of one value per record. ``source`` and ``buf_offset`` (the file or
    CommitLog offset of ``buf[0]``) only name the place in an error. ``columns`` (names
    of ``SCHEMA``, in the order wanted) builds only those: every record is checked the
    same, but the columns not asked for cost nothing (tags, keys and properties, parsed
    from the properties string, are about half of a whole batch's time).

    Raises ``CorruptRecordError`` for the first record that fails a check (module
    docstring); ``ValueError`` if ``starts`` or an ``expect_*`` array has the wrong shape
    or ``columns`` names a column ``SCHEMA`` does not have.
    """
    starts = np.asarray(starts, np.int64)
    if starts.ndim != 1:
        raise ValueError(f"starts has shape {starts.shape}, expected one dimension")
    n = len(starts)
    if columns is not None and not set(columns) <= set(SCHEMA.names):
        raise ValueError(f"columns {sorted(set(columns) - set(SCHEMA.names))} are not in "
                         f"{SCHEMA.names}")
    schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
    if n == 0:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    expect = (_expected(expect_sizes, n, "expect_sizes"),
              _expected(expect_queue_offsets, n, "expect_queue_offsets"),
              _expected(expect_commit_log_offsets, n, "expect_commit_log_offsets"))
    src = _Source(buf)
    faults = _FirstFault(n)
    lay = _locate(src, starts, expect, faults)
    topic = src.slices(lay.topic_pos, lay.topic_len, pa.binary())
    props = src.slices(lay.props_pos, lay.props_len, pa.binary(), lay.props_prefix)
    _check_no_nul(topic, "topic", faults)
    _check_no_nul(props, "properties", faults)
    if faults.index is not None:
        err = faults.error(source, buf_offset, starts)
        del src  # the traceback keeps this frame: no export of buf may stay with it
        raise err
    fixed = lay.fixed
    parsed: list = []

    def parsed_properties(i: int):
        if not parsed:
            parsed.extend(_property_columns(_as_utf8(props)))
        return parsed[i]

    build = {
        "topic": lambda: _as_utf8(topic),
        "queue_id": lambda: pa.array(fixed["queue_id"].astype(np.int32), pa.int32()),
        "queue_offset": lambda: pa.array(fixed["queue_offset"].astype(np.int64), pa.int64()),
        "commit_log_offset": lambda: pa.array(fixed["physical_offset"].astype(np.int64),
                                              pa.int64()),
        "msg_id": lambda: _msg_ids(src, lay),
        "tags": lambda: parsed_properties(0),
        "keys": lambda: parsed_properties(1),
        "properties": lambda: parsed_properties(2),
        "body": lambda: src.slices(lay.body_pos, lay.body_len, pa.binary(),
                                   None if lay.any_v6 else fixed["body_prefix"].view("<u4")),
        "born_timestamp": lambda: _timestamps(fixed["born_timestamp"]),
        "store_timestamp": lambda: _timestamps(lay.store_timestamp),
    }
    return pa.RecordBatch.from_arrays([build[f.name]() for f in schema], schema=schema)
