"""A run of CommitLog records read for dispatch in bulk (ReputMessageService's fast path).

``parse_run`` reads the whole records of one file from a position, up to a limit, and
returns their dispatch fields as numpy columns (``RecordRun``): what
``record.check_message_and_return_size`` returns for each, checked by the same rules,
with the per-record Python reduced to walking the TOTALSIZE chain and cutting out each
record's topic and properties.

    step                                   how
    -------------------------------------  --------------------------------------------
    record starts                          the TOTALSIZE chain, walked in Python (a BLANK,
                                           a record not whole before the limit, or a
                                           size no record can have ends the run)
    fields 1-15, BODYLENGTH .. PROPLENGTH  numpy gathers at the starts (IPv6 hosts shift
                                           later fields by 12 each)
    the checks of ``check_message_and_    vectorised: magic, PHYSICALOFFSET == where the
    return_size`` (no body CRC)            record lies, lengths inside TOTALSIZE, TOTALSIZE
                                           == ``calc_msg_length``; no NUL in topics
                                           (per distinct topic) or properties (one search
                                           over all of them)
    TAGS, KEYS, UNIQ_KEY                   ``record._property``'s rule (the last
                                           non-empty value of a name that starts a pair),
                                           found for all records at once in their joined
                                           properties; raw bytes
    DELAY                                  per record, only in SCHEDULE_TOPIC_XXXX
    tagsCode                               Java hash of each distinct TAGS value; the
                                           delivery time for SCHEDULE_TOPIC_XXXX

The run stops *before* the first record that fails any check: the caller hands that
record to the one-record path, which judges it exactly as before (a torn tail beyond
the confirm offset is not reached; below it, ``CorruptRecordError``). So the bulk path
never accepts a record the one-record path would refuse, and never refuses one itself.

A few records (a one-message send, a trickle of them) cost more in numpy's fixed calls
than in their own work, so ``parse_small`` reads them with ``struct`` alone: one
unpack of fields 1-15 per record (IPv4 hosts only; a record with an IPv6 host ends the
run and goes to the one-record path), the same checks, and the same values as plain
tuples (``SmallRecord``'s order), keys and tags raw as the bulk path keeps them. It
stops before the first record that fails, as ``parse_run`` does.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple, Sequence

import numpy as np

from rocketstore.storage import record
from rocketstore.storage.hashing import java_string_hash
from rocketstore.storage.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG
from rocketstore.storage.record_batch import FIXED_HEAD, gather_be, gather_rows, same_bytes

_V1, _V2 = record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2
_IPV4_FIXED = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8   # through PREPARED
_TAGS, _KEYS, _UNIQ, _DELAY = b"TAGS\x01", b"KEYS\x01", b"UNIQ_KEY\x01", b"DELAY\x01"
_R8 = np.arange(8, dtype=np.int64)
_HOST_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
# fields 1-15 of a record with IPv4 hosts, those dispatch needs: TOTALSIZE, MAGICCODE,
# QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP, BODYLENGTH
_V4_DISPATCH = struct.Struct(">iI4xi4xqqi16xq20xi")
assert _V4_DISPATCH.size == _IPV4_FIXED + 4
_V4_LENGTHS = _IPV4_FIXED + 4 + 2     # calc_msg_length less body, topic and properties
_TOPIC_LENGTH = record.SHORT


class RecordRun(NamedTuple):
    """The dispatch fields of ``len(starts)`` consecutive whole records of one file."""

    starts: np.ndarray           # positions in the file's buffer
    end: int                     # the position just past the last record
    sizes: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    physical_offsets: np.ndarray
    sys_flags: np.ndarray
    store_timestamps: np.ndarray
    tags_codes: np.ndarray
    topics: list[str]
    keys: list[bytes | None]     # KEYS, raw
    uniq_keys: list[bytes | None]  # UNIQ_KEY, raw

    def __len__(self) -> int:
        return len(self.starts)

    def prefix(self, k: int) -> "RecordRun":
        """The first ``k`` (> 0) records."""
        end = int(self.starts[k - 1] + self.sizes[k - 1])
        return RecordRun(*(end if name == "end" else column[:k]
                           for name, column in zip(self._fields, self)))


def walk(buf, pos: int, limit: int, max_records: int) -> tuple[list[int], int]:
    """The starts of the records from ``pos`` whose TOTALSIZE is plausible and which end
    at or before ``limit``, at most ``max_records``; and the position after them."""
    starts: list[int] = []
    append = starts.append
    unpack_from = record.SIZE_MAGIC.unpack_from
    head = record.HEAD.size
    blank = record.BLANK_MAGIC_CODE
    last = limit - 8
    for _ in range(max_records):
        if pos > last:
            break
        size, magic = unpack_from(buf, pos)
        if magic == blank or size <= head or pos + size > limit:
            break
        append(pos)
        pos += size
    return starts, pos


class _Checked(NamedTuple):
    """The columns of the records that passed the checks, and their raw topics and
    properties."""

    starts: np.ndarray
    sizes: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    physical_offsets: np.ndarray
    sys_flags: np.ndarray
    store_timestamps: np.ndarray
    body_crcs: np.ndarray
    body_at: np.ndarray
    body_len: np.ndarray
    topics: list[bytes]
    props: list[bytes]

    def prefix(self, k: int) -> "_Checked":
        return _Checked(*(column[:k] for column in self))


def parse_run(buf, starts: list[int], file_from_offset: int,
              delay_level_ms: Sequence[int] = ()) -> RecordRun | None:
    """The records at ``starts`` (from ``walk``; ``file_from_offset`` is the file's
    CommitLog offset) up to the first that fails a check; None when the first does."""
    c = _check(buf, starts, file_from_offset)
    if c is None:
        return None
    names = {raw: record._decode_topic(raw) for raw in dict.fromkeys(c.topics)}
    topics = list(map(names.__getitem__, c.topics))      # one str per distinct topic
    tags, keys, uniq_keys = _dispatch_properties(c.props)
    codes = _tags_codes(tags, topics, c.props, c.store_timestamps, delay_level_ms)
    return RecordRun(c.starts, int(c.starts[-1] + c.sizes[-1]), c.sizes, c.queue_ids,
                     c.queue_offsets, c.physical_offsets, c.sys_flags, c.store_timestamps,
                     codes, topics, keys, uniq_keys)


class SmallRecord(NamedTuple):
    """The order of the plain tuples ``parse_small`` returns (a name for the reader and
    the tests: the tuples themselves are not built as this class)."""

    size: int
    topic: str
    queue_id: int
    physical_offset: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: bytes | None           # KEYS, raw
    uniq_key: bytes | None       # UNIQ_KEY, raw
    sys_flag: int


def parse_small(buf, starts: list[int], file_from_offset: int,
                delay_level_ms: Sequence[int] = ()) -> list[tuple]:
    """``parse_run`` for a few records, without numpy: the records at ``starts`` (from
    ``walk``) up to the first that fails a check of ``check_message_and_return_size``
    (no body CRC) or has an IPv6 host, each as a tuple in ``SmallRecord``'s order."""
    out: list[tuple] = []
    unpack_from = _V4_DISPATCH.unpack_from
    head_end = len(buf) - _V4_DISPATCH.size
    for pos in starts:
        if pos > head_end:
            break
        total, magic, queue_id, queue_offset, phys, sys_flag, store_ts, body_len = \
            unpack_from(buf, pos)
        end = pos + total
        p = pos + _V4_DISPATCH.size + body_len
        if sys_flag & _HOST_FLAGS or phys != file_from_offset + pos or body_len < 0 \
                or p + 3 > end:
            break
        if magic == _V1:
            topic_len = buf[p]
            if topic_len > record.MAX_V1_TOPIC_LENGTH:
                break
            p += 1
        elif magic == _V2:
            (topic_len,) = _TOPIC_LENGTH.unpack_from(buf, p)
            p += 2
        else:
            break
        if topic_len <= 0 or p + topic_len + 2 > end:
            break
        topic_raw = bytes(buf[p:p + topic_len])
        p += topic_len
        (props_len,) = _TOPIC_LENGTH.unpack_from(buf, p)
        if props_len < 0 or total != _V4_LENGTHS + body_len + topic_len + props_len + (
                2 if topic_len > record.MAX_V1_TOPIC_LENGTH else 1):
            break
        props = bytes(buf[p + 2:p + 2 + props_len])
        if 0 in topic_raw or 0 in props:        # a tear left zeros where no NUL may stand
            break
        topic = record._decode_topic(topic_raw)
        code = _tags_code(_value(props, _TAGS))
        if delay_level_ms and topic == record.SCHEDULE_TOPIC:
            code = _delivery_time(props, store_ts, delay_level_ms, code)
        out.append((total, topic, queue_id, phys, code, store_ts, queue_offset,
                    _value(props, _KEYS), _value(props, _UNIQ), sys_flag))
    return out


def _delivery_time(props: bytes, store_ts: int, delay_level_ms: Sequence[int],
                   tags_code: int) -> int:
    """A delayed message's tagsCode in SCHEDULE_TOPIC_XXXX: store time plus its level's
    delay; ``tags_code`` when it has no level."""
    delay = _value(props, _DELAY)
    level = record._int_or_zero(delay.decode("utf-8", "replace")) if delay else 0
    if level > 0:
        return store_ts + delay_level_ms[min(level, len(delay_level_ms) - 1)]
    return tags_code


def valid_end(buf, starts: list[int], file_from_offset: int, check_crc: bool) -> int:
    """The position just past the longest run of records at ``starts`` that pass every
    check of ``check_message_and_return_size`` (the body CRC too with ``check_crc``);
    ``starts[0]`` when the first does not. Recovery's scan."""
    c = _check(buf, starts, file_from_offset)
    if c is None:
        return starts[0]
    if check_crc:
        with memoryview(buf) as view:       # no copy of each body
            crcs = [zlib.crc32(view[a:a + n]) & 0x7FFF_FFFF
                    for a, n in zip(c.body_at.tolist(), c.body_len.tolist())]
        wrong = np.flatnonzero(np.asarray(crcs, np.int64) != c.body_crcs)
        if len(wrong):
            c = c.prefix(int(wrong[0]))
            if not len(c.starts):
                return starts[0]
    return int(c.starts[-1] + c.sizes[-1])


def _check(buf, starts: list[int], base: int) -> _Checked | None:
    """Gather the fields of the records at ``starts`` and check them; the columns of the
    longest prefix that passes, None when the first record fails."""
    u8 = np.frombuffer(buf, np.uint8)
    try:
        c = _fields(buf, u8, np.asarray(starts, np.int64), base)
    finally:
        del u8
    if c is None:
        return None
    good = _without_nul(c.topics, c.props)
    return c if good == len(c.starts) else (c.prefix(good) if good else None)


def _fields(buf, u8: np.ndarray, s: np.ndarray, base: int) -> _Checked | None:
    """The fixed-field checks, vectorised; topics and properties cut out of the
    records that pass (a prefix), None when the first fails."""
    # every record ``walk`` found is longer than fields 1-8: one gather reads them all
    fixed = gather_rows(u8, s, FIXED_HEAD.itemsize).view(FIXED_HEAD).reshape(-1)
    sizes = fixed["total"].astype(np.int64)
    magic = fixed["magic"]
    phys = fixed["physical_offset"].astype(np.int64)
    sys_flags = fixed["sys_flag"].astype(np.int64)
    born_wide = np.where(sys_flags & BORNHOST_V6_FLAG, 12, 0)
    wide = born_wide + np.where(sys_flags & STOREHOSTADDRESS_V6_FLAG, 12, 0)
    body_at = s + _IPV4_FIXED + wide + 4
    ends = s + sizes
    ok = ((magic == _V1) | (magic == _V2)) & (phys == base + s) & (body_at <= ends)
    body_len = gather_be(u8, np.minimum(body_at, ends) - 4, 4)
    v2 = magic == _V2
    topic_len_at = np.clip(body_at + body_len, body_at, ends - 1)
    ok &= (body_len >= 0) & (body_at + body_len + 3 <= ends)
    topic_len = np.where(v2, gather_be(u8, np.minimum(topic_len_at, ends - 2), 2),
                         gather_be(u8, topic_len_at, 1))
    topic_at = topic_len_at + np.where(v2, 2, 1)
    ok &= (topic_len > 0) & (topic_at + topic_len + 2 <= ends)
    props_len = gather_be(u8, np.clip(topic_at + topic_len, 0, ends - 2), 2)
    props_at = topic_at + topic_len + 2
    expected = (_IPV4_FIXED + 4 + wide + body_len + np.where(topic_len > 127, 2, 1)
                + topic_len + 2 + props_len)
    ok &= (props_len >= 0) & (sizes == expected)
    good = len(s) if ok.all() else int(np.argmin(ok))
    if good == 0:
        return None
    s = s[:good]
    fixed = fixed[:good]
    return _Checked(
        s, sizes[:good], fixed["queue_id"].astype(np.int64),
        fixed["queue_offset"].astype(np.int64), phys[:good], sys_flags[:good],
        gather_be(u8, s + record.BORNHOST_POS + 8 + born_wide[:good], 8),
        fixed["crc"].astype(np.int64), body_at[:good], body_len[:good],
        _one_topic(buf, u8, topic_at[:good], topic_len[:good])
        or _slices(buf, topic_at[:good], topic_len[:good]),
        _slices(buf, props_at[:good], props_len[:good]))


def _one_topic(buf, u8: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> list[bytes] | None:
    """``_slices`` of the topics when every record's is the first record's (the common
    run: one comparison of their bytes, one slice); None when they differ."""
    n = int(lengths[0])
    if n > 255 or not same_bytes(u8, at, lengths):
        return None
    first = int(at[0])
    return [bytes(buf[first:first + n])] * len(at)


def _slices(buf, at: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """``bytes(buf[a:a + n])`` for each pair (``buf`` is bytes, bytearray or an mmap)."""
    if isinstance(buf, bytearray):
        return [bytes(buf[a:a + n]) for a, n in zip(at.tolist(), lengths.tolist())]
    return [buf[a:a + n] for a, n in zip(at.tolist(), lengths.tolist())]


def _without_nul(topics: list[bytes], props: list[bytes]) -> int:
    """How many records from the first hold no NUL in topic or properties."""
    bad = len(topics)
    for topic in set(topics):
        if 0 in topic:
            bad = min(bad, topics.index(topic))
    if b"\0" in b"".join(props):
        bad = min(bad, next(i for i, p in enumerate(props) if 0 in p))
    return bad


def _dispatch_properties(props: list[bytes]) -> tuple[list, list, list]:
    """TAGS, KEYS and UNIQ_KEY of each record, raw (None when absent or empty), by
    ``_value``'s rule, found for all records at once.

    The properties are joined (none holds a NUL: checked before) and every \x01 is a
    candidate end of a name: the 8 bytes before it, as one big-endian word, match a
    name of at most 8 bytes under a mask; the name must start its record's properties
    or follow a \x02; its value runs to the next \x02 or the record's end and must not
    be empty; of a record's matches the last counts."""
    n = len(props)
    joined = b"".join(props)
    ends = np.cumsum(np.fromiter(map(len, props), np.int64, n))
    padded = np.zeros(len(joined) + 9, np.uint8)
    padded[9:] = np.frombuffer(joined, np.uint8)
    data = padded[9:]
    ones = np.flatnonzero(data == 1)
    twos = np.append(np.flatnonzero(data == 2), len(data))
    rec = np.searchsorted(ends, ones, side="right")
    rec_begin = (ends - np.diff(ends, prepend=0))[rec]
    value_end = np.minimum(twos[np.searchsorted(twos, ones)], ends[rec])
    words = padded[(ones + 1)[:, None] + _R8].view(">u8").ravel()
    candidates = value_end > ones + 1
    found = []
    for name in (_TAGS, _KEYS, _UNIQ):
        width = len(name) - 1
        start = ones - width
        ok = words & ((1 << (8 * width)) - 1) == int.from_bytes(name[:-1], "big")
        ok &= candidates & (start >= rec_begin)
        ok &= (start == rec_begin) | (padded[start + 8] == 2)
        sel = np.flatnonzero(ok)
        last = np.ones(len(sel), bool)
        last[:-1] = rec[sel][1:] != rec[sel][:-1]
        sel = sel[last]
        if not len(sel):
            found.append([None] * n)
            continue
        first = np.full(n, -1, np.int64)
        stop = np.zeros(n, np.int64)
        first[rec[sel]] = ones[sel] + 1
        stop[rec[sel]] = value_end[sel]
        found.append([joined[a:b] if a >= 0 else None
                      for a, b in zip(first.tolist(), stop.tolist())])
    return found[0], found[1], found[2]


def _value(props: bytes, name_sep: bytes) -> bytes | None:
    """``record._property`` without the decoding: the last non-empty value of a pair
    whose name is ``name_sep`` minus its \\x01."""
    i = props.rfind(name_sep)
    while i >= 0:
        if i == 0 or props[i - 1] == 2:
            start = i + len(name_sep)
            end = props.find(b"\x02", start)
            if end < 0:
                end = len(props)
            if end > start:
                return props[start:end]
        i = props.rfind(name_sep, 0, i)
    return None


_TAGS_CODES: dict[bytes, int] = {}


def _tags_code(tags: bytes | None) -> int:
    """The Java hash of raw TAGS (0 without), cached as ``_tags_codes`` caches it."""
    if tags is None:
        return 0
    code = _TAGS_CODES.get(tags)
    if code is None:
        code = java_string_hash(tags.decode("utf-8", "replace"))
        if len(_TAGS_CODES) < 65536:
            _TAGS_CODES[tags] = code
    return code


def _tags_codes(tags: list, topics: list[str], props: list[bytes], store_ts: np.ndarray,
                delay_level_ms: Sequence[int]) -> np.ndarray:
    """Each record's consume-queue tagsCode: the Java hash of its tags (0 without),
    or for a delayed message in SCHEDULE_TOPIC_XXXX its delivery time."""
    code_of = {t: _tags_code(t) for t in dict.fromkeys(tags)}
    codes = np.fromiter(map(code_of.__getitem__, tags), np.int64, len(tags))
    if delay_level_ms and record.SCHEDULE_TOPIC in topics:
        for i, topic in enumerate(topics):
            if topic == record.SCHEDULE_TOPIC:
                codes[i] = _delivery_time(props[i], int(store_ts[i]), delay_level_ms,
                                          int(codes[i]))
    return codes
