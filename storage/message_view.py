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
unmapped by other means, read freed pages. The views ``views_at`` makes share one copy,
the records read together (a poll's), each at its ``_at``: no copy per record, and a
kept view keeps its neighbours' bytes alive with it.

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

import numpy as np

from storage import record
from storage.message import MessageExt, StoredMessageFields, decode_host, read_properties
from storage.record_batch import gather_be

_SHORT = record.SHORT.unpack_from
_FIELDS = ("store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
           "commit_log_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
           "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic",
           "properties")
_V1, _V2 = record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2
_BODY_LENGTH_POS = 84   # with IPv4 hosts; each IPv6 host adds 12


def _head_field(i: int) -> property:
    return property(lambda self: (self._head or self._read_head())[i])


def _tail_field(i: int) -> property:
    return property(lambda self: (self._tail or self._read_tail())[i])


class MessageView(StoredMessageFields):
    __slots__ = ("_data", "_at", "topic", "_body_at", "_body_len", "_props_at",
                 "_props_len", "_properties", "_head", "_tail")

    # ------------------------------------------------------------ the fixed fields
    store_size, magic, body_crc, queue_id, flag, queue_offset, commit_log_offset, \
        sys_flag, born_timestamp = (_head_field(i) for i in range(9))
    _born_host, store_timestamp, _store_host, reconsume_times, \
        prepared_transaction_offset = (_tail_field(i) for i in range(5))

    def _read_head(self) -> tuple:
        head = self._head = record.HEAD.unpack_from(self._data, self._at)
        return head

    def _read_tail(self) -> tuple:
        sys_flag = (self._head or self._read_head())[7]
        tail = self._tail = record.tail_struct(sys_flag).unpack_from(
            self._data, self._at + record.HEAD.size)
        return tail

    # ------------------------------------------------------------ on demand
    @property
    def body(self) -> bytes:
        return self._data[self._body_at:self._body_at + self._body_len]

    @property
    def properties(self) -> dict[str, str]:
        props = self._properties
        if props is None:
            raw = self._data[self._props_at:self._props_at + self._props_len]
            props = self._properties = read_properties(raw.decode("utf-8", "replace"))
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


def _view(data: bytes, at: int, topic: str, body_at: int, body_len: int, props_at: int,
          props_len: int, head, tail) -> MessageView:
    """The view of the record at ``at`` in ``data``; ``body_at`` and ``props_at`` are
    positions in ``data``."""
    v = MessageView.__new__(MessageView)
    v._data, v._at, v.topic, v._body_at, v._body_len = data, at, topic, body_at, body_len
    v._props_at, v._props_len, v._properties, v._head, v._tail = \
        props_at, props_len, None, head, tail
    return v


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
    return _view(data if len(data) == total else data[:total], 0,
                 raw_topic.decode("utf-8", "replace"), body_at, body_len, p, props_len,
                 head, tail)


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
    ``index`` set to that record's place in ``starts``."""
    u8 = np.frombuffer(buf, np.uint8)
    last = len(u8)

    def field(at: np.ndarray, width: int, signed: bool = True) -> np.ndarray:
        return gather_be(u8, np.minimum(at, last - width), width, signed)

    ends = starts + sizes
    total = field(starts, 4)
    magic = field(starts + record.MAGICCODE_POS, 4, signed=False)
    sys_flags = field(starts + record.SYSFLAG_POS, 4)
    wide = (np.where(sys_flags & record.BORNHOST_V6_FLAG, 12, 0)
            + np.where(sys_flags & record.STOREHOSTADDRESS_V6_FLAG, 12, 0))
    ok = ((magic == _V1) | (magic == _V2)) & (total == sizes) & (
        starts + _BODY_LENGTH_POS + wide + 4 <= ends)
    body_len_at = np.minimum(starts + _BODY_LENGTH_POS + wide, ends - 4)
    body_len = gather_be(u8, body_len_at, 4)
    body_at = body_len_at + 4
    ok &= (body_len >= 0) & (body_at + body_len + 3 <= ends)
    v2 = magic == _V2
    topic_len_at = np.clip(body_at + body_len, starts, ends - 2)
    topic_len = np.where(v2, gather_be(u8, topic_len_at, 2), gather_be(u8, topic_len_at, 1))
    topic_at = topic_len_at + np.where(v2, 2, 1)
    ok &= (topic_len > 0) & (topic_at + topic_len + 2 <= ends)
    props_len_at = np.clip(topic_at + topic_len, starts, ends - 2)
    props_len = gather_be(u8, props_len_at, 2)
    props_at = props_len_at + 2
    ok &= (props_len >= 0) & (props_at + props_len == ends)
    expected = topic.encode("utf-8")
    matches = ok & (topic_len == len(expected))
    if matches.any() and expected:
        at = topic_at[matches][:, None] + np.arange(len(expected), dtype=np.int64)
        matches[matches] = (u8[at] == np.frombuffer(expected, np.uint8)).all(axis=1)
    columns = ViewColumns(field(starts + record.QUEUEID_POS, 4),
                          field(starts + record.QUEUEOFFSET_POS, 8),
                          field(starts + record.PHYSICALOFFSET_POS, 8), matches)
    del u8
    if not ok.all():
        bad = int(np.argmin(ok))
        s = int(starts[bad])
        try:
            view_at(buf[s:s + int(sizes[bad])])
        except record.RecordFormatError as e:
            e.index = bad
            raise
        raise AssertionError(f"record {bad}: the bulk check and view_at disagree")
    # a record whose topic is not ``topic`` is decoded one by one (its own name)
    new = MessageView.__new__
    views = []
    append = views.append
    for s, ba, bl, pa, pl in zip(starts.tolist(), body_at.tolist(), body_len.tolist(),
                                 props_at.tolist(), props_len.tolist()):
        v = new(MessageView)
        v._data, v._at, v.topic, v._body_at, v._body_len = buf, s, topic, ba, bl
        v._props_at, v._props_len, v._properties, v._head, v._tail = \
            pa, pl, None, None, None
        append(v)
    if not matches.all():       # another topic: its own name, its own NUL check
        for i in np.flatnonzero(~matches).tolist():
            s = int(starts[i])
            try:
                views[i] = view_at(buf[s:s + int(sizes[i])])
            except record.RecordFormatError as e:
                e.index = i
                raise
    return views, columns
