"""MessageView: a message read from the CommitLog, decoded as far as a read must and the
rest when asked.

``decode_at`` builds a whole ``MessageExt``: 17 fields, both hosts, the body copied, the
properties parsed. A consumer that polls hundreds of messages a call mostly wants a
few of them, so ``view_at`` reads what checking a record needs (the fixed header, the
body's and topic's lengths, the topic) with two ``unpack_from`` calls and keeps the
record's bytes; ``body``, ``properties`` (and ``tags``, ``keys``, ``uniq_key``,
``delay_level``), ``born_host``, ``store_host`` and ``msg_id`` are decoded on first
access and kept.

The view holds a ``bytes`` copy of the record, never a view of a mapping: the cleaner
may unmap and unlink the file under a reader at any time, and a ``memoryview`` of an
unmapped ``mmap`` would keep the mapping from closing (``BufferError``) or, once
unmapped by other means, read freed pages. The views ``views_at`` makes share one copy
of the records read together (a poll's) and one ``_Records`` with where each record's
parts lie and what was decoded of it; a view is that object and its record's index (two
slots to fill per message), and a kept view keeps its neighbours' bytes alive with it.

Checked when the view is made (``RecordFormatError`` otherwise), as ``decode_at``
does: the magic, the record's length against its BODYLENGTH, TOPICLENGTH and
PROPERTIESLENGTH fields, and no NUL in the topic. Not checked: a NUL in the properties
(a torn tail), which dispatch already refused before any unit pointed at the record;
the body CRC (``decode_at(check_crc=True)`` for that).

Every field and property of ``MessageExt`` is here under the same name and compares
equal (``view == ext`` when all seventeen fields agree); ``to_ext()`` makes the full
``MessageExt``. The fixed fields (fields 1-9, then the hosts, store time, reconsume
times and prepared offset) are unpacked on first access too.

``views_at`` makes the views of many records at once, the way a Consumer's poll of
hundreds needs them: the same checks as ``view_at``, as numpy operations over all the
records (its fixed cost pays off from about a hundred records; ``read_path`` takes it
from ``BULK_VIEWS_MIN``), then one small object per record over the shared bytes. A
record whose topic is not the expected one is made by ``view_at`` (its own name, its
NUL check).
"""

from __future__ import annotations

import struct
from itertools import repeat
from operator import add, sub

import numpy as np

from rocketstore.storage import record
from rocketstore.storage.message import MessageExt, StoredMessageFields, decode_host, read_properties
from rocketstore.storage.record_batch import (
    BODY_POS, BODYLENGTH_POS, FIXED_HEAD, V4_HEAD, gather_be, gather_rows)

_SHORT = record.SHORT.unpack_from
_FIELDS = ("store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
           "commit_log_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
           "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic",
           "properties")
_V1, _V2 = record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2
_BODY_LENGTH_POS = 84   # with IPv4 hosts; each IPv6 host adds 12


def _head_field(i: int) -> property:
    return property(lambda self: self._head()[i])


def _tail_field(i: int) -> property:
    return property(lambda self: self._tail()[i])


class _Records:
    """What the views of records read together share: the bytes, the topic they were
    read for, and per record its start, where its body and properties begin and end,
    and what was decoded of it (``None`` until asked). Flat lists of ints: nothing per
    record for the garbage collector to track. The bodies' places are lists from the
    start (every reader reads bodies); the starts and the properties' places may come
    as arrays, made lists when a header or properties are first asked for (a poll of
    512 saves three ``tolist`` calls, ~14 µs, when only bodies are read)."""

    __slots__ = ("data", "topic", "body_at", "body_end", "_starts", "_props",
                 "properties", "heads", "tails")

    def __init__(self, data: bytes, topic: str, starts, body_at: list[int],
                 body_end: list[int], props_at, props_end):
        n = len(body_at)
        self.data, self.topic, self.body_at, self.body_end = data, topic, body_at, body_end
        self._starts, self._props = starts, (props_at, props_end)
        self.properties, self.heads, self.tails = [None] * n, [None] * n, [None] * n

    def start(self, i: int) -> int:
        starts = self._starts
        if type(starts) is not list:
            starts = self._starts = starts.tolist()
        return starts[i]

    def props(self, i: int) -> bytes:
        at, end = self._props
        if type(at) is not list:
            at, end = self._props = at.tolist(), end.tolist()
        return self.data[at[i]:end[i]]


class MessageView(StoredMessageFields):
    __slots__ = ("_records", "_i")

    # ------------------------------------------------------------ the fixed fields
    store_size, magic, body_crc, queue_id, flag, queue_offset, commit_log_offset, \
        sys_flag, born_timestamp = (_head_field(i) for i in range(9))
    _born_host, store_timestamp, _store_host, reconsume_times, \
        prepared_transaction_offset = (_tail_field(i) for i in range(5))

    def _head(self) -> tuple:
        r, i = self._records, self._i
        head = r.heads[i]
        if head is None:
            head = r.heads[i] = record.HEAD.unpack_from(r.data, r.start(i))
        return head

    def _tail(self) -> tuple:
        r, i = self._records, self._i
        tail = r.tails[i]
        if tail is None:
            tail = r.tails[i] = record.tail_struct(self._head()[7]).unpack_from(
                r.data, r.start(i) + record.HEAD.size)
        return tail

    # ------------------------------------------------------------ on demand
    @property
    def topic(self) -> str:
        return self._records.topic

    @property
    def body(self) -> bytes:
        r, i = self._records, self._i
        return r.data[r.body_at[i]:r.body_end[i]]

    @property
    def properties(self) -> dict[str, str]:
        r, i = self._records, self._i
        props = r.properties[i]
        if props is None:
            props = r.properties[i] = read_properties(
                r.props(i).decode("utf-8", "replace"))
        return props

    @property
    def born_host(self):
        return decode_host(self._born_host)

    @property
    def store_host(self):
        return decode_host(self._store_host)

    # ------------------------------------------------------------ as a MessageExt
    def to_ext(self) -> MessageExt:
        return MessageExt(*(getattr(self, f) for f in _FIELDS))

    def to_dict(self) -> dict:
        return self.to_ext().to_dict()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MessageView, MessageExt)):
            return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a MessageExt: mutable, unhashable

    def __repr__(self) -> str:
        return (f"MessageView(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, commit_log_offset="
                f"{self.commit_log_offset}, store_size={self.store_size})")


def _views(records: _Records) -> list[MessageView]:
    new = MessageView.__new__
    views = []
    append = views.append
    for i in range(len(records.body_at)):
        v = new(MessageView)
        v._records, v._i = records, i
        append(v)
    return views


def view_at(data: bytes) -> MessageView:
    """The record at the start of ``data`` (its own bytes, a copy), checked as the
    module says. Raises ``RecordFormatError``."""
    end = len(data)
    if end < record.HEAD.size:
        raise record.RecordFormatError(0, "truncated record header")
    head = record.HEAD.unpack_from(data, 0)
    total, magic, sys_flag = head[0], head[1], head[7]
    if magic not in (_V1, _V2):
        raise record.RecordFormatError(0, f"illegal magic code 0x{magic:08X}")
    if total <= record.HEAD.size or total > end:
        raise record.RecordFormatError(0, f"record size {total} runs past the data")
    tail_struct = record.tail_struct(sys_flag)
    if total < record.HEAD.size + tail_struct.size:   # IPv6 bits on a short record
        raise record.RecordFormatError(0, f"record size {total} cannot hold its header")
    p = record.HEAD.size
    tail = tail_struct.unpack_from(data, p)
    body_len = tail[5]
    p += tail_struct.size
    if body_len < 0 or p + body_len + 3 > total:
        raise record.RecordFormatError(0, f"body length {body_len} runs past the record")
    body_at = p
    p += body_len
    if magic == _V2:
        (topic_len,) = _SHORT(data, p)
        p += 2
    else:
        topic_len = data[p] if data[p] < 128 else -1
        p += 1
    if topic_len <= 0 or p + topic_len + 2 > total:
        raise record.RecordFormatError(0, f"record size {total} disagrees with its fields")
    raw_topic = data[p:p + topic_len]
    p += topic_len
    (props_len,) = _SHORT(data, p)
    p += 2
    if props_len < 0 or p + props_len != total:   # calcMsgLength, from where the parts lie
        raise record.RecordFormatError(0, f"record size {total} disagrees with its fields")
    if 0 in raw_topic:
        raise record.RecordFormatError(0, "NUL byte in topic or properties (torn record)")
    records = _Records(data if len(data) == total else data[:total],
                       raw_topic.decode("utf-8", "replace"), [0], [body_at],
                       [body_at + body_len], [p], [p + props_len])
    records.heads[0], records.tails[0] = head, tail
    return _views(records)[0]


class ViewColumns:
    """What ``views_at`` read of each record, for the caller's own checks."""

    __slots__ = ("queue_ids", "queue_offsets", "commit_log_offsets", "topic_matches")

    def __init__(self, queue_ids, queue_offsets, commit_log_offsets, topic_matches):
        self.queue_ids, self.queue_offsets = queue_ids, queue_offsets
        self.commit_log_offsets, self.topic_matches = commit_log_offsets, topic_matches


def views_at(buf: bytes, starts: np.ndarray, sizes: np.ndarray,
             topic: str) -> tuple[list[MessageView], ViewColumns]:
    """``view_at`` for the records of ``buf`` at ``starts``, each ``sizes`` bytes long,
    checked in one numpy pass; the views share ``buf`` (a ``bytes``). The record
    fields a caller checks against its units come back as columns, with whether each
    record's topic is ``topic``.

    Raises ``RecordFormatError`` (``view_at``'s, for the first record that fails) with
    ``index`` set to that record's place in ``starts``. A record ``view_at`` takes whose
    TOTALSIZE is less than its size is its view, and does not match (its unit is wrong,
    not its record)."""
    u8 = np.frombuffer(buf, np.uint8)
    plain = _plain_run(buf, u8, starts, sizes, topic)
    if plain is not None:
        return plain
    if len(u8) < FIXED_HEAD.itemsize:
        u8 = np.zeros(FIXED_HEAD.itemsize, np.uint8)        # nothing is whole: all fail
    ends = starts + sizes
    fixed = gather_rows(u8, np.minimum(starts, len(u8) - FIXED_HEAD.itemsize),
                        FIXED_HEAD.itemsize).view(FIXED_HEAD).reshape(-1)
    magic = fixed["magic"]
    sys_flags = fixed["sys_flag"].astype(np.int64)
    wide = (np.where(sys_flags & record.BORNHOST_V6_FLAG, 12, 0)
            + np.where(sys_flags & record.STOREHOSTADDRESS_V6_FLAG, 12, 0))
    ok = ((magic == _V1) | (magic == _V2)) & (fixed["total"] == sizes) & (
        sizes > record.HEAD.size) & (starts + _BODY_LENGTH_POS + wide + 4 <= ends)
    body_len_at = np.clip(starts + _BODY_LENGTH_POS + wide, 0, np.maximum(ends - 4, 0))
    body_len = gather_be(u8, np.minimum(body_len_at, len(u8) - 4), 4)
    body_at = body_len_at + 4
    ok &= (body_len >= 0) & (body_at + body_len + 3 <= ends)
    v2 = magic == _V2
    topic_len_at = np.clip(body_at + body_len, starts, np.maximum(ends - 2, starts))
    topic_len_at = np.minimum(topic_len_at, len(u8) - 2)
    topic_len = gather_be(u8, topic_len_at, 1)
    if v2.any():
        topic_len = np.where(v2, gather_be(u8, topic_len_at, 2), topic_len)
    topic_at = topic_len_at + np.where(v2, 2, 1)
    ok &= (topic_len > 0) & (topic_at + topic_len + 2 <= ends)
    props_len_at = np.minimum(np.clip(topic_at + topic_len, starts, np.maximum(ends - 2, starts)),
                              len(u8) - 2)
    props_len = gather_be(u8, props_len_at, 2)
    props_at = props_len_at + 2
    ok &= (props_len >= 0) & (props_at + props_len == ends)
    expected = topic.encode("utf-8")
    matches = ok & (topic_len == len(expected))
    if matches.any() and expected:
        rows = gather_rows(u8, topic_at[matches], len(expected))
        matches[matches] = (rows == np.frombuffer(expected, np.uint8)).all(axis=1)
    columns = ViewColumns(fixed["queue_id"].astype(np.int64),
                          fixed["queue_offset"].astype(np.int64),
                          fixed["physical_offset"].astype(np.int64), matches)
    del u8
    alone = {}       # a bad record (view_at names it), or another topic (its name, NULs)
    for i in np.flatnonzero(~matches).tolist():     # not ok: not matching either
        s = int(starts[i])
        try:
            alone[i] = view_at(buf[s:s + int(sizes[i])])
        except record.RecordFormatError as e:
            e.index = i
            raise
        if not ok[i] and fixed["total"][i] == sizes[i]:
            raise AssertionError(f"record {i}: the bulk check and view_at disagree")
    views = _views(_Records(buf, topic, starts.copy(), body_at.tolist(),
                            (body_at + body_len).tolist(), props_at, props_at + props_len))
    for i, view in alone.items():
        views[i] = view
    return views, columns


# A plain record's TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG and
# BODYLENGTH (BODYCRC, FLAG and fields 9-14 skipped): what ``plain_views`` checks
_PLAIN_HEAD = struct.Struct(">iI4xi4xqqi44xi")
assert _PLAIN_HEAD.size == BODY_POS
_PLAIN_SIZE, _PLAIN_MAGIC, _PLAIN_QUEUE_ID, _PLAIN_QUEUE_OFFSET, _PLAIN_PHY, _PLAIN_SYS_FLAG, \
    _PLAIN_BODY_LEN = range(7)


class _PlainRecords(_Records):
    """``_Records`` of a plain run (``plain_views``): every record v1, both hosts IPv4,
    of the topic read for, so its parts lie where its start and lengths say: BODY at
    ``start + BODY_POS``, BODYLENGTH long; the properties after TOPICLENGTH's byte, the
    topic and PROPERTIESLENGTH, to the record's end. Per record only its start and the
    fields the check read (``_PLAIN_HEAD``'s, first in each tuple of ``plain``); a place is
    computed when asked."""

    __slots__ = ("plain", "props_from")

    def __init__(self, data: bytes, topic: str, starts: list[int], plain: list[tuple],
                 props_from: int):
        n = len(starts)
        self.data, self.topic, self._starts, self.plain = data, topic, starts, plain
        self.props_from = props_from       # BODY_POS + 1 + the topic's length + 2
        self.properties, self.heads, self.tails = [None] * n, [None] * n, [None] * n

    def props(self, i: int) -> bytes:
        start, head = self._starts[i], self.plain[i]
        return self.data[start + self.props_from + head[_PLAIN_BODY_LEN]:
                         start + head[_PLAIN_SIZE]]


def _plain_field(i: int) -> property:
    return property(lambda self: self._records.plain[self._i][i])


class _PlainView(MessageView):
    """A ``MessageView`` over ``_PlainRecords``: the fields the check read come from
    there, the body from its computed place."""

    __slots__ = ()

    store_size, magic, queue_id, queue_offset, commit_log_offset, sys_flag = (
        _plain_field(i) for i in range(6))

    @property
    def body(self) -> bytes:
        r, i = self._records, self._i
        at = r._starts[i] + BODY_POS
        return r.data[at:at + r.plain[i][_PLAIN_BODY_LEN]]


def plain_views(buf: bytes, starts: list[int], sizes: tuple[int, ...],
                topic: str) -> tuple[list[MessageView], tuple, tuple, tuple] | None:
    """``views_at``'s plain run with ``struct`` (tuples and lists in, no numpy): the
    views of the records of ``buf`` at ``starts``, each ``sizes`` bytes long, and their
    QUEUEID, QUEUEOFFSET and PHYSICALOFFSET as tuples, when every record is v1, both
    hosts IPv4, of ``topic`` and well formed (``_plain_run``'s checks, which are
    ``view_at``'s for such a record: TOTALSIZE is the size, BODYLENGTH and
    PROPERTIESLENGTH are not negative, TOPICLENGTH and the topic are ``topic``'s, and
    the parts add up to the size); None when any is anything else or lies outside
    ``buf``. Each check is one operation over a column."""
    n = len(starts)
    known = _PLAIN_TOPICS.get(topic)
    if known is None:
        known = _plain_topic(topic)
    prefix, tail, fixed = known
    if (not n or prefix is None or min(starts) < 0
            or (max(starts) + max(sizes) > len(buf)
                and max(map(add, starts, sizes)) > len(buf))):
        return None
    try:
        plain, whole = _plain_heads(buf, starts, n, topic, tail)
        columns = tuple(zip(*plain))
        total, magic, queue_ids, queue_offsets, phys, sys_flags, body_len = columns[:7]
        if (total != tuple(sizes) or magic.count(_V1) != n or min(body_len) < 0
                or (sys_flags.count(0) != n
                    and any(map(record.HOST_FLAGS.__and__, sys_flags)))):
            return None
        if whole and body_len.count(body_len[0]) == n:  # the tails were read in place
            prefixes, props_len = columns[7:]
        else:
            after_body = memoryview(buf)[BODY_POS:]     # a body's end: start + BODYLENGTH
            prefixes, props_len = zip(*map(tail.unpack_from, repeat(after_body, n),
                                            map(add, starts, body_len)))
    except struct.error:                            # a place past the end of ``buf``
        return None
    if (prefixes.count(prefix) != n or min(props_len) < 0
            or list(map(sub, map(sub, total, body_len), props_len)).count(fixed) != n):
        return None
    records = _PlainRecords(buf, topic, starts[:], plain, fixed)
    new = _PlainView.__new__
    views = []
    append = views.append
    for i in range(n):
        v = new(_PlainView)
        v._records, v._i = records, i
        append(v)
    return views, queue_ids, queue_offsets, phys


_PLAIN_TOPICS: dict[str, tuple] = {}    # topic -> what ``plain_views`` checks of it
MAX_PLAIN_TOPICS = 4096
_PLAIN_WHOLE: dict[tuple[str, int], struct.Struct] = {}   # (topic, BODYLENGTH) -> the
#                                                         head, the body skipped, the tail
_BODY_LEN = struct.Struct(">i")


def _plain_heads(buf: bytes, starts: list[int], n: int, topic: str,
                 tail: struct.Struct) -> tuple[list[tuple], bool]:
    """``plain_views``' read of each record's ``_PLAIN_HEAD`` fields, and whether its
    tail (the prefix and PROPERTIESLENGTH, after the body) was read in the same
    ``unpack_from``: it is, at the place the first record's BODYLENGTH gives, which is
    each record's when they all have that BODYLENGTH (the caller compares them; the
    tails of a run whose lengths differ are read again, at their places)."""
    body_len = _BODY_LEN.unpack_from(buf, starts[0] + BODYLENGTH_POS)[0]
    if body_len >= 0:
        whole = _PLAIN_WHOLE.get((topic, body_len))
        if whole is None:
            if len(_PLAIN_WHOLE) >= MAX_PLAIN_TOPICS:
                _PLAIN_WHOLE.clear()
            whole = _PLAIN_WHOLE[(topic, body_len)] = struct.Struct(
                f"{_PLAIN_HEAD.format}{body_len}x{tail.format[1:]}")
        try:
            return list(map(whole.unpack_from, repeat(buf, n), starts)), True
        except struct.error:    # a record shorter than the first's layout: heads alone
            pass
    return list(map(_PLAIN_HEAD.unpack_from, repeat(buf, n), starts)), False


def _plain_topic(topic: str) -> tuple[bytes | None, struct.Struct | None, int]:
    """``(prefix, tail, fixed)`` of ``topic``'s plain records: TOPICLENGTH's byte and
    the topic (None for a topic no v1 record can hold: empty, over 127 bytes, a NUL);
    the struct of the prefix and PROPERTIESLENGTH (a signed short), read at the body's
    end; and a record's size but its body and properties."""
    expected = topic.encode("utf-8")
    if not 0 < len(expected) <= record.MAX_V1_TOPIC_LENGTH or 0 in expected:
        known = None, None, 0
    else:
        prefix = bytes((len(expected),)) + expected
        known = prefix, struct.Struct(f">{len(prefix)}sh"), BODY_POS + len(prefix) + 2
    if len(_PLAIN_TOPICS) < MAX_PLAIN_TOPICS:
        _PLAIN_TOPICS[topic] = known
    return known


def _plain_run(buf: bytes, u8: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
               topic: str) -> tuple[list[MessageView], ViewColumns] | None:
    """``views_at`` for the common run, in about half its numpy operations: every
    record v1, both hosts IPv4, of ``topic``, and well formed. Then BODYLENGTH has one
    place, and TOPICLENGTH, the topic and PROPERTIESLENGTH lie back to back at a place
    known from it: two gathers read all that is checked. None when any record is
    anything else, for the general path to judge and name."""
    expected = topic.encode("utf-8")
    tail = 1 + len(expected) + 2                    # TOPICLENGTH, topic, PROPERTIESLENGTH
    ends = starts + sizes
    if (not 0 < len(expected) <= record.MAX_V1_TOPIC_LENGTH or len(u8) < BODY_POS + tail
            or not len(starts) or int(starts.min()) < 0 or int(ends.max()) > len(u8)):
        return None
    head = gather_rows(u8, np.minimum(starts, len(u8) - BODY_POS),
                       BODY_POS).view(V4_HEAD).reshape(-1)
    body_at = starts + BODY_POS
    body_end = body_at + head["body_len"].astype(np.int64)
    rows = gather_rows(u8, np.clip(body_end, 0, len(u8) - tail), tail)
    props_len = rows[:, -2].astype(np.int64) * 256 + rows[:, -1]
    props_at = body_end + tail
    ok = ((head["magic"] == _V1) & (head["total"] == sizes)
          & ((head["sys_flag"] & record.HOST_FLAGS) == 0) & (body_end >= body_at)
          & (rows[:, -2] < 0x80) & (props_at + props_len == ends)   # a signed short
          & (rows[:, :-2] == np.frombuffer(bytes((len(expected),)) + expected,
                                           np.uint8)).all(axis=1))
    if not ok.all():
        return None
    views = _views(_Records(buf, topic, starts.copy(), body_at.tolist(), body_end.tolist(),
                            props_at, ends))
    return views, ViewColumns(head["queue_id"].astype(np.int64),
                              head["queue_offset"].astype(np.int64),
                              head["physical_offset"].astype(np.int64),
                              np.ones(len(starts), bool))
