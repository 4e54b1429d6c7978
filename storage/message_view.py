"""MessageView: a message read from the CommitLog, decoded as far as a read must and the
rest when asked.

``decode_at`` builds a whole ``MessageExt``: 17 fields, both hosts, the body copied, the
properties parsed. A consumer that polls hundreds of messages a call mostly wants a
few of them, so ``view_at`` reads what checking a record needs (the fixed header, the
body's and topic's lengths, the topic) with two ``unpack_from`` calls and keeps the
record's bytes; ``body``, ``properties`` (and ``tags``, ``keys``, ``uniq_key``,
``delay_level``), ``born_host``, ``store_host`` and ``msg_id`` are decoded on first
access and kept.

The view holds its own copy of the record (``bytes``), never a view of a mapping: the
cleaner may unmap and unlink the file under a reader at any time, and a ``memoryview``
of an unmapped ``mmap`` would keep the mapping from closing (``BufferError``) or, once
unmapped by other means, read freed pages.

Checked when the view is made (``RecordFormatError`` otherwise), as ``decode_at``
does: the magic, the record's length against its BODYLENGTH, TOPICLENGTH and
PROPERTIESLENGTH fields, and no NUL in the topic. Not checked: a NUL in the properties
(a torn tail), which dispatch already refused before any unit pointed at the record;
the body CRC (``decode_at(check_crc=True)`` for that).

Every field and property of ``MessageExt`` is here under the same name and compares
equal (``view == ext`` when all seventeen fields agree); ``to_ext()`` makes the full
``MessageExt``.
"""

from __future__ import annotations

from storage import record
from storage.message import MessageExt, StoredMessageFields, decode_host, read_properties

_SHORT = record.SHORT.unpack_from
_FIELDS = ("store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
           "commit_log_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
           "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic",
           "properties")


class MessageView(StoredMessageFields):
    __slots__ = ("_data", "store_size", "magic", "body_crc", "queue_id", "flag",
                 "queue_offset", "commit_log_offset", "sys_flag", "born_timestamp",
                 "_born_host", "store_timestamp", "_store_host", "reconsume_times",
                 "prepared_transaction_offset", "topic", "_body_at", "_body_len",
                 "_props_at", "_props_len", "_properties")

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


def view_at(data: bytes) -> MessageView:
    """The record at the start of ``data`` (its own bytes, a copy), checked as the
    module says. Raises ``RecordFormatError``."""
    end = len(data)
    if end < record.HEAD.size:
        raise record.RecordFormatError(0, "truncated record header")
    v = MessageView()
    (total, magic, v.body_crc, v.queue_id, v.flag, v.queue_offset, v.commit_log_offset,
     sys_flag, v.born_timestamp) = record.HEAD.unpack_from(data, 0)
    if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2):
        raise record.RecordFormatError(0, f"illegal magic code 0x{magic:08X}")
    if total <= record.HEAD.size or total > end:
        raise record.RecordFormatError(0, f"record size {total} runs past the data")
    tail = record.tail_struct(sys_flag)
    p = record.HEAD.size
    (v._born_host, v.store_timestamp, v._store_host, v.reconsume_times,
     v.prepared_transaction_offset, body_len) = tail.unpack_from(data, p)
    p += tail.size
    if body_len < 0 or p + body_len + 3 > total:
        raise record.RecordFormatError(0, f"body length {body_len} runs past the record")
    v._body_at, v._body_len = p, body_len
    p += body_len
    if magic == record.MESSAGE_MAGIC_CODE_V2:
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
    v.topic = raw_topic.decode("utf-8", "replace")
    v._props_at, v._props_len = p, props_len
    v._data = data if len(data) == total else data[:total]
    v.store_size, v.magic, v.sys_flag = total, magic, sys_flag
    v._properties = None
    return v
