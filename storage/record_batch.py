"""Batches of CommitLog records: built by producers ready-made, checked in bulk by the
writer, and copied into the CommitLog by its single appender with vectorised patches.

A ``RecordBatch`` is records back to back in one buffer, in ``storage.record``'s layout,
with arrays of what the appender needs to know of each (size, topic, queue, whether it
takes a queue offset, where its STORETIMESTAMP lies). ``CommitLog.append_batch`` copies
a run of records that fits the current file with one slice assignment, after stamping,
for the whole run at once (numpy over the buffer; a short struct loop for a handful):

    field            value
    QUEUEID          the queue chosen (a producer may leave it to the store: -1)
    QUEUEOFFSET      the topic-queue table's next offset (NOT/COMMIT records only)
    PHYSICALOFFSET   where the record lands
    STORETIMESTAMP   the append's time
    STOREHOSTADDRESS the store's host (records a producer encoded carry zeros)

Producer side (``encode_records``): a SEND_RECORDS frame carries records already in
this layout, made by ``encode_message`` (a batch: ``encode_batch``, the same bytes in one
pass) exactly as ``CommitLog.prepare`` would make them (same property order, body CRC, v1/v2 magic), with QUEUEOFFSET, PHYSICALOFFSET,
STORETIMESTAMP and STOREHOSTADDRESS zero and an IPv4-width store host. An idempotent
producer's identity is in the properties already (``__PID``, ``__SEQ``), where the
writer would have put it.

Writer side (``check_records``): every rule of ``validation.check_message`` and
``validation.check_encoded_size``, judged on the bytes, in bulk where it can be:

    check                                                    outcome
    -------------------------------------------------------  ---------------------------
    offsets table, TOTALSIZE chain, magic, record length     RecordsFormatError: the
      recomputed from BODYLENGTH/TOPICLENGTH/PROPERTIESLENGTH  whole frame is malformed
    v1 magic with a topic over 127 bytes, v2 with one under  RecordsFormatError
    QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP not zero,      RecordsFormatError
      STOREHOSTADDRESS not 8 zero bytes or its IPv6 bit set
    body CRC                                                 MESSAGE_ILLEGAL
    topic not [A-Za-z0-9_%|-]{1,255}, reserved topic         MESSAGE_ILLEGAL
    queue id not -1 and outside 0..default_topic_queue_nums  MESSAGE_ILLEGAL
    born host port outside 0..65535                          MESSAGE_ILLEGAL
    properties not UTF-8, not name\\x01value\\x02 pairs with   MESSAGE_ILLEGAL
      non-empty names and values free of \\x00/\\x01/\\x02,
      or naming __PID/__SEQ (other than the frame's identity)
    properties over 32767 bytes                              PROPERTIES_SIZE_EXCEEDED
    record over max_message_size or a CommitLog file         MESSAGE_ILLEGAL
    a DELAY property, an IPv6 born host, or an IPv6 store     taken the long way: decoded
      host configured                                          to a Message and prepared
                                                               like a SEND record (so the
                                                               delay rewrite and every
                                                               rule apply as there)

Per record, Python does only what has no bulk form: the body CRC (``zlib.crc32`` over a
slice), the properties' UTF-8 and pair grammar (one regular-expression match), and a
dictionary lookup of the topic's verdict; the rest is numpy over the frame. A run of
fewer than ``SMALL_CHECK`` records is first read with ``struct``, record by record,
where numpy's fixed cost would be most of the check (``check_records``).
"""

from __future__ import annotations

import itertools
import re
import struct
import zlib
from typing import NamedTuple, Sequence

import numpy as np

from rocketstore.storage import record
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, KEY_SEPARATOR, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_PRODUCER_ID,
    PROPERTY_TAGS,
    PROPERTY_PRODUCER_SEQUENCE, PROPERTY_WAIT_STORE_MSG_OK, STOREHOSTADDRESS_V6_FLAG, Message,
    TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE, encode_host,
    delay_property_refusal, encode_properties, host_is_v6)
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.validation import check_topic

# Positions in a record whose hosts are both IPv4 (the layout producers encode).
QUEUEID_POS = record.QUEUEID_POS
QUEUEOFFSET_POS = record.QUEUEOFFSET_POS
PHYSICALOFFSET_POS = record.PHYSICALOFFSET_POS
SYSFLAG_POS = record.SYSFLAG_POS
BORNPORT_POS = record.BORNHOST_POS + 4
STORETIMESTAMP_POS = record.BORNHOST_POS + 8
STOREHOST_POS = STORETIMESTAMP_POS + 8
BODYLENGTH_POS = STOREHOST_POS + 8 + 4 + 8
BODY_POS = BODYLENGTH_POS + 4
MIN_RECORD_SIZE = BODY_POS + 1 + 1 + 2     # empty body, 1-byte topic, no properties
assert (STORETIMESTAMP_POS, STOREHOST_POS, BODYLENGTH_POS, BODY_POS) == (56, 64, 84, 88)
STOREHOST_WIDTH = 8
PLACEHOLDER_STORE_HOST = bytes(STOREHOST_WIDTH)
SMALL_BATCH = 24            # below this many records, stamping is a struct loop
SMALL_CHECK = 32            # below this many, check_records tries a struct loop first
MAX_TOPIC_VERDICTS = 4096   # topics whose verdict a cache of ``_verdict`` remembers

_R2 = np.arange(2, dtype=np.int64)
_R4 = np.arange(4, dtype=np.int64)
_R8 = np.arange(8, dtype=np.int64)
_PAIR = rb"(?!__PID\x01|__SEQ\x01)[^\x00\x01\x02]+\x01[^\x00\x01\x02]+\x02"
_PAIRS = re.compile(rb"(?:%s)*" % _PAIR)                 # one record's properties
_ALL_PAIRS = re.compile(rb"(?:(?:%s)*\x00)*" % _PAIR)   # a run's, each ended by NUL
_BAD_PAIRS = ("properties must be name\\x01value\\x02 pairs with non-empty names and values "
              "free of \\x00, \\x01 and \\x02 (and not __PID/__SEQ)")
_DELAY = PROPERTY_DELAY_TIME_LEVEL.encode() + b"\x01"
_WAIT_FALSE = PROPERTY_WAIT_STORE_MSG_OK.encode() + b"\x01false\x02"
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL


class RecordsFormatError(ValueError):
    """Bytes that are not a well-formed run of records (the frame is refused whole)."""

    def __init__(self, index: int, detail: str):
        self.index, self.detail = index, detail
        super().__init__(f"record {index}: {detail}")


# ------------------------------------------------------------------------ bulk byte access
# Fields 1-8 of every record (TOTALSIZE .. SYSFLAG: the same place whatever its hosts),
# read for a run of records with one ``gather_rows``
FIXED_HEAD = np.dtype([("total", ">i4"), ("magic", ">u4"), ("crc", ">i4"),
                       ("queue_id", ">i4"), ("flag", ">i4"), ("queue_offset", ">i8"),
                       ("physical_offset", ">i8"), ("sys_flag", ">i4")])
assert FIXED_HEAD.itemsize == record.SYSFLAG_POS + 4


def gather_rows(u8: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at each position ``at`` of ``u8``, as rows of a new array:
    rows of a strided view whose row i is the bytes from byte i (no index matrix)."""
    if len(u8) < width:
        return u8[at[:, None] + np.arange(width, dtype=np.int64)]
    windows = np.ndarray((len(u8) - width + 1, width), np.uint8, buffer=u8, strides=(1, 1))
    return windows[at]


def same_bytes(u8: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether the ``lengths[i]`` bytes at each ``at[i]`` of ``u8`` are all the first
    one's (a run of records that name one topic: one comparison, no loop)."""
    n = int(lengths[0])
    if not (lengths == n).all():
        return False
    rows = gather_rows(u8, at, n)
    return bool((rows == rows[0]).all())


def gather_be(u8: np.ndarray, at: np.ndarray, width: int, signed: bool = True) -> np.ndarray:
    """The big-endian integers of ``width`` bytes at positions ``at`` of ``u8``."""
    kind = "i" if signed else "u"
    return gather_rows(u8, at, width).view(f">{kind}{width}").reshape(-1).astype(np.int64)


def scatter_be64(u8: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` as big-endian longs at positions ``at`` of ``u8``."""
    u8[at[:, None] + _R8] = np.ascontiguousarray(values, dtype=">i8").view(np.uint8).reshape(-1, 8)


def scatter_be32(u8: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    u8[at[:, None] + _R4] = np.ascontiguousarray(values, dtype=">i4").view(np.uint8).reshape(-1, 4)


# ------------------------------------------------------------------------ the batch
class RecordBatch(NamedTuple):
    """Records back to back in ``data`` and, per record, what the appender needs.

    ``queue_ids`` are the queues as stored (a delayed message's delay queue);
    ``real_queue_ids`` the queues reported back to the producer. ``host_pos`` lists the
    positions in ``data`` where the store host goes (records a producer encoded).
    """

    data: bytearray
    starts: np.ndarray           # int64, position of each record in data
    sizes: np.ndarray            # int64
    topics: list[str]
    queue_ids: list[int]
    real_queue_ids: list[int]
    consumable: list[bool]
    store_timestamp_pos: np.ndarray   # int64, relative to the record's start
    host_pos: np.ndarray         # int64, absolute positions in data

    def __len__(self) -> int:
        return len(self.topics)

    @classmethod
    def from_encoded(cls, encoded: Sequence) -> "RecordBatch":
        """A batch of ``CommitLog.prepare``'s records (their store host is set)."""
        sizes = np.fromiter((len(e.data) for e in encoded), np.int64, len(encoded))
        return cls(bytearray().join(e.data for e in encoded), _starts(sizes), sizes,
                   [e.topic for e in encoded], [e.queue_id for e in encoded],
                   [e.real_queue_id for e in encoded], [e.consumable for e in encoded],
                   np.fromiter((e.store_timestamp_pos for e in encoded), np.int64,
                               len(encoded)),
                   np.empty(0, np.int64))

    def prefix(self, k: int) -> "RecordBatch":
        """The first ``k`` records."""
        end = int(self.starts[k - 1] + self.sizes[k - 1]) if k else 0
        return RecordBatch(self.data[:end], self.starts[:k], self.sizes[:k], self.topics[:k],
                           self.queue_ids[:k], self.real_queue_ids[:k], self.consumable[:k],
                           self.store_timestamp_pos[:k], self.host_pos[self.host_pos < end])

    @classmethod
    def concat(cls, batches: Sequence["RecordBatch"]) -> "RecordBatch":
        if len(batches) == 1:
            return batches[0]
        data = bytearray().join(b.data for b in batches)
        sizes = np.concatenate([b.sizes for b in batches])
        bases = np.cumsum([0] + [len(b.data) for b in batches[:-1]])
        return cls(data, _starts(sizes), sizes,
                   [t for b in batches for t in b.topics],
                   [q for b in batches for q in b.queue_ids],
                   [q for b in batches for q in b.real_queue_ids],
                   [c for b in batches for c in b.consumable],
                   np.concatenate([b.store_timestamp_pos for b in batches]),
                   np.concatenate([b.host_pos + base for b, base in zip(batches, bases)]))


def from_checked(data, checked: "CheckedRecords", queue_ids: list[int]) -> RecordBatch:
    """Every record of a checked run, taken as it is (the common case: one copy)."""
    starts = checked.starts
    return RecordBatch(bytearray(data), starts, checked.sizes, checked.topics, queue_ids,
                       queue_ids, checked.consumable,
                       np.full(len(starts), STORETIMESTAMP_POS, np.int64),
                       starts + STOREHOST_POS)


def from_pieces(pieces: Sequence[tuple]) -> RecordBatch:
    """A batch of ``(record bytes, topic, queue id, real queue id, consumable, store
    timestamp position, needs the store host)`` pieces, in order."""
    sizes = np.fromiter((len(p[0]) for p in pieces), np.int64, len(pieces))
    starts = _starts(sizes)
    needs_host = np.fromiter((p[6] for p in pieces), bool, len(pieces))
    return RecordBatch(bytearray().join(p[0] for p in pieces), starts, sizes,
                       [p[1] for p in pieces], [p[2] for p in pieces],
                       [p[3] for p in pieces], [p[4] for p in pieces],
                       np.fromiter((p[5] for p in pieces), np.int64, len(pieces)),
                       starts[needs_host] + STOREHOST_POS)


def _starts(sizes: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(sizes), np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], out=starts[1:])
    return starts


def stamp(batch: RecordBatch, lo: int, hi: int, queue_ids: Sequence[int],
          queue_offsets: Sequence[int], physical_offsets: np.ndarray, store_timestamp: int,
          store_host: bytes) -> None:
    """Write QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP (and the store host where
    ``host_pos`` asks) into records ``lo..hi-1`` of ``batch.data``."""
    data, starts = batch.data, batch.starts
    if hi - lo < SMALL_BATCH:
        starts = starts.tolist()
        ipack, lpack = record.INT.pack_into, record.LONG.pack_into
        for k in range(lo, hi):
            s = starts[k]
            ipack(data, s + QUEUEID_POS, queue_ids[k - lo])
            lpack(data, s + QUEUEOFFSET_POS, queue_offsets[k - lo])
            lpack(data, s + PHYSICALOFFSET_POS, physical_offsets[k - lo])
            lpack(data, s + int(batch.store_timestamp_pos[k]), store_timestamp)
    else:
        u8 = np.frombuffer(data, np.uint8)
        at = starts[lo:hi]
        scatter_be32(u8, at + QUEUEID_POS, np.asarray(queue_ids, np.int64))
        scatter_be64(u8, at + QUEUEOFFSET_POS, np.asarray(queue_offsets, np.int64))
        scatter_be64(u8, at + PHYSICALOFFSET_POS, np.asarray(physical_offsets, np.int64))
        scatter_be64(u8, at + batch.store_timestamp_pos[lo:hi],
                     np.full(hi - lo, store_timestamp, np.int64))
        del u8
    hp = batch.host_pos
    if len(hp):
        first, last = int(starts[lo]), int(starts[hi - 1] + batch.sizes[hi - 1])
        if hi - lo < SMALL_BATCH:
            for at in hp.tolist():
                if first <= at < last:
                    data[at:at + len(store_host)] = store_host
            return
        sel = hp[(hp >= first) & (hp < last)]
        if len(sel):
            u8 = np.frombuffer(data, np.uint8)
            u8[sel[:, None] + np.arange(len(store_host), dtype=np.int64)] = \
                np.frombuffer(store_host, np.uint8)
            del u8


# ------------------------------------------------------------------------ producer side
_V4_FIXED = struct.Struct(">iIiiiqqiq8sq8siqi")    # fields 1-15, both hosts IPv4
assert _V4_FIXED.size == BODY_POS
_SET_BY_STORE = frozenset({PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELAY_TIME_LEVEL,
                           PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_PRODUCER_ID,
                           PROPERTY_PRODUCER_SEQUENCE})
_TOPIC_PARTS: dict[str, bytes] = {}    # topic -> its length byte and UTF-8 bytes


def encode_message(msg: Message, born_timestamp: int, identity: tuple[int, int] | None = None) -> bytes:
    """``msg`` as a record ready for SEND_RECORDS: what ``CommitLog.prepare`` would make
    of it, with the appender's fields zero and a placeholder IPv4 store host (the writer
    stamps them). ``identity`` = (producer id, sequence) of an idempotent producer.

    Raises ``ValueError`` (or ``TypeError``) for a message that cannot be laid out as a
    record at all; the store judges everything else and answers with a status."""
    props = msg.properties
    born_host = msg.born_host
    if ":" in born_host[0] or (props and not _SET_BY_STORE.isdisjoint(props)):
        return _encode_general(msg, born_timestamp, identity)
    topic_part = _TOPIC_PARTS.get(msg.topic)
    if topic_part is None:
        topic = msg.topic.encode("utf-8")
        if not 0 < len(topic) <= record.MAX_V1_TOPIC_LENGTH:
            return _encode_general(msg, born_timestamp, identity)
        topic_part = bytes((len(topic),)) + topic
        if len(_TOPIC_PARTS) < 4096:
            _TOPIC_PARTS[msg.topic] = topic_part
    text = encode_properties(props) if props else ""
    if identity is not None:
        text += (f"{PROPERTY_PRODUCER_ID}\x01{identity[0]}\x02"
                 f"{PROPERTY_PRODUCER_SEQUENCE}\x01{identity[1]}\x02")
    pairs = len(props) if props else 0          # name\x01value\x02 pairs in ``text``
    if identity is not None:
        pairs += 2
    tags = msg.tags
    if tags:
        if type(tags) is not str:
            raise TypeError(f"tags are a str, not {type(tags).__name__}")
        text += f"{PROPERTY_TAGS}\x01{tags}\x02"
        pairs += 1
    keys = msg.keys
    if keys:
        if type(keys) is list and len(keys) == 1 and type(keys[0]) is str:
            keys = keys[0]
            if KEY_SEPARATOR in keys:
                raise ValueError("a key holds the key separator (a space)")
        elif type(keys) in (list, tuple):
            if any(KEY_SEPARATOR in k for k in keys):
                raise ValueError("a key holds the key separator (a space)")
            keys = KEY_SEPARATOR.join(k for k in keys if k)
        elif type(keys) is str:
            keys = KEY_SEPARATOR.join(msg.key_list())
        else:
            raise TypeError(f"keys are a str, list or tuple, not {type(keys).__name__}")
        if keys:
            text += f"{PROPERTY_KEYS}\x01{keys}\x02"
            pairs += 1
    if msg.delay_level:
        text += f"{PROPERTY_DELAY_TIME_LEVEL}\x01{msg.delay_level}\x02"
        pairs += 1
    if not msg.wait_store_msg_ok:
        text += f"{PROPERTY_WAIT_STORE_MSG_OK}\x01false\x02"
        pairs += 1
    if text.count("\x01") != pairs or text.count("\x02") != pairs or "\x00" in text:
        raise ValueError("the tags or keys hold a byte the properties reserve")
    properties = text.encode("utf-8")
    if len(properties) > record.MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties are {len(properties)} bytes, over "
                         f"{record.MAX_PROPERTIES_LENGTH}")
    body = msg.body if type(msg.body) is bytes else bytes(msg.body)
    queue_id = msg.queue_id
    if queue_id is not None and queue_id < 0:
        raise ValueError(f"queue id {queue_id} is negative (None lets the store choose)")
    head = _V4_FIXED.pack(
        BODY_POS + len(body) + len(topic_part) + 2 + len(properties),
        record.MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF,
        -1 if queue_id is None else queue_id, msg.flag, 0, 0,
        msg.sys_flag & ~record.HOST_FLAGS,
        born_timestamp if msg.born_timestamp is None else msg.born_timestamp,
        encode_host(born_host), 0, PLACEHOLDER_STORE_HOST, msg.reconsume_times,
        msg.prepared_transaction_offset, len(body))
    return b"".join((head, body, topic_part, record.SHORT.pack(len(properties)), properties))


def _encode_general(msg: Message, born_timestamp: int, identity: tuple[int, int] | None) -> bytes:
    """``encode_message`` for any message: IPv6 born hosts, v2 topics, user properties
    that share a name with the store's own."""
    if identity is not None:
        props = dict(msg.properties)
        props[PROPERTY_PRODUCER_ID] = str(identity[0])
        props[PROPERTY_PRODUCER_SEQUENCE] = str(identity[1])
        for name, value in msg.all_properties().items():
            props[name] = value
    else:
        props = msg.all_properties()
    born_v6 = host_is_v6(msg.born_host)
    sys_flag = (msg.sys_flag & ~record.HOST_FLAGS) | (BORNHOST_V6_FLAG if born_v6 else 0)
    return bytes(record.encode(
        topic=msg.topic.encode("utf-8"), body=bytes(msg.body),
        properties=encode_properties(props).encode("utf-8"),
        queue_id=-1 if msg.queue_id is None else msg.queue_id, flag=msg.flag, queue_offset=0,
        physical_offset=0, sys_flag=sys_flag,
        born_timestamp=born_timestamp if msg.born_timestamp is None else msg.born_timestamp,
        born_host=encode_host(msg.born_host), store_timestamp=0,
        store_host=PLACEHOLDER_STORE_HOST, reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=msg.prepared_transaction_offset))


def encode_records(messages: Sequence[Message], born_timestamp: int, producer_id: int = 0,
                   first_sequence: int = 0) -> tuple[bytes, list[int]]:
    """The records of ``messages`` back to back, and the offset of each."""
    if producer_id:
        parts = [encode_message(m, born_timestamp, (producer_id, first_sequence + i))
                 for i, m in enumerate(messages)]
    elif len(messages) == 1:        # a single put: the batch's set-up costs more
        parts = [encode_message(messages[0], born_timestamp)]
    else:
        parts = encode_batch(messages, born_timestamp)
    offsets = list(itertools.accumulate(map(len, parts), initial=0))
    offsets.pop()
    return b"".join(parts), offsets


# One record of the common shape in one ``pack``: fields 1-15 (QUEUEOFFSET and
# PHYSICALOFFSET, STORETIMESTAMP and the placeholder store host as pad bytes: zeros),
# then BODY, the v1 topic (its length byte and bytes), PROPERTIESLENGTH, PROPERTIES.
_SHAPE_HEAD = ">iIiii16xiq8s16xiqi"
assert struct.calcsize(_SHAPE_HEAD) == BODY_POS
_SHAPES: dict[tuple[int, int], dict[int, struct.Struct]] = {}  # (body, topic part) sizes
_MAX_SHAPES = 1024                                             # -> props size -> layout
_NOTHING = object()


def _shapes(body_len: int, topic_part_len: int) -> dict[int, struct.Struct]:
    """The record layouts of these body and topic part sizes, by properties size."""
    key = (body_len, topic_part_len)
    by_props = _SHAPES.get(key)
    if by_props is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        by_props = _SHAPES[key] = {}
    return by_props


def _shape(by_props: dict[int, struct.Struct], body_len: int, topic_part_len: int,
           props_len: int) -> struct.Struct:
    """The record layout of these part sizes, made once (into ``by_props``)."""
    if len(by_props) >= _MAX_SHAPES:
        by_props.clear()
    s = by_props[props_len] = struct.Struct(f"{_SHAPE_HEAD}{body_len}s{topic_part_len}sh"
                                            f"{props_len}s")
    return s


def encode_batch(messages: Sequence[Message], born_timestamp: int) -> list[bytes]:
    """``encode_message(m, born_timestamp)`` of each message, in one pass over the batch.

    A message of the common shape (no user properties, an IPv4 born host, a v1 topic,
    tags a str or none, keys none or a list of one key, no delay, waiting for the store,
    a bytes body) is one ``pack`` of a struct made once per part sizes (``_shape``). Its
    born host and topic are encoded once for a run of messages naming the same, a tag
    and one key are one format, and the batch's properties texts are checked for the
    bytes the layout reserves once, joined. Any other message is ``encode_message``'s:
    both give the same bytes for any message (a property test holds them to it). Raises
    as ``encode_message`` does."""
    out: list = []
    texts: list[str] = []            # the common shape's properties, checked joined
    pairs = 0                        # the name\x01value\x02 pairs ``texts`` should hold
    magic, crc32, no_flags = record.MESSAGE_MAGIC_CODE, zlib.crc32, ~record.HOST_FLAGS
    largest = record.MAX_PROPERTIES_LENGTH
    last_host = last_topic = last_part = _NOTHING      # no message's host, topic, part
    host_bytes = topic_part = b""
    last_body_len, by_props, size_base = -1, {}, 0
    for msg in messages:
        tags, keys, body = msg.tags, msg.keys, msg.body
        if (msg.born_host is last_host and msg.topic is last_topic and type(tags) is str
                and type(keys) is list and type(body) is bytes and len(keys) == 1
                and not msg.properties and not msg.delay_level and msg.wait_store_msg_ok
                and tags and type(key := keys[0]) is str and key
                and KEY_SEPARATOR not in key):
            text, n = f"TAGS\x01{tags}\x02KEYS\x01{key}\x02", 2
        elif (msg.properties or msg.delay_level or not msg.wait_store_msg_ok
                or type(body) is not bytes):
            out.append(encode_message(msg, born_timestamp))
            continue
        else:
            host, topic = msg.born_host, msg.topic
            parts = _common_parts(msg, host is last_host, topic is last_topic)
            if parts is None:
                out.append(encode_message(msg, born_timestamp))
                continue
            text, n, host_bytes, topic_part = parts[0], parts[1], \
                parts[2] or host_bytes, parts[3] or topic_part
            last_host, last_topic = host, topic
        props = text.encode("utf-8")
        props_len = len(props)
        queue_id = msg.queue_id
        if props_len > largest or (queue_id is not None and queue_id < 0):
            out.append(encode_message(msg, born_timestamp))     # which names the fault
            continue
        if queue_id is None:
            queue_id = -1
        texts.append(text)
        pairs += n
        body_len = len(body)
        if body_len != last_body_len or topic_part is not last_part:
            by_props = _shapes(body_len, len(topic_part))
            last_body_len, last_part = body_len, topic_part
            size_base = BODY_POS + body_len + len(topic_part) + 2
        shape = by_props.get(props_len) or _shape(by_props, body_len, len(topic_part),
                                                  props_len)
        out.append(shape.pack(
            size_base + props_len, magic, crc32(body) & 0x7FFFFFFF, queue_id, msg.flag,
            msg.sys_flag & no_flags,
            born_timestamp if msg.born_timestamp is None else msg.born_timestamp,
            host_bytes, msg.reconsume_times, msg.prepared_transaction_offset, body_len, body,
            topic_part, props_len, props))
    if texts:
        joined = "".join(texts)
        if joined.count("\x01") != pairs or joined.count("\x02") != pairs \
                or "\x00" in joined:      # a tag or key with a reserved byte: named here
            return [encode_message(m, born_timestamp) for m in messages]
    return out


def _common_parts(msg: Message, same_host: bool,
                  same_topic: bool) -> tuple[str, int, bytes, bytes] | None:
    """For a message without user properties, delay or WAIT=false: its properties text,
    the pairs in it, its born host's bytes and its topic part (each b"" when the same as
    the message before); None when it is not of ``encode_batch``'s common shape."""
    host_bytes = topic_part = b""
    if not same_host:
        if ":" in msg.born_host[0]:
            return None
        host_bytes = encode_host(msg.born_host)
    if not same_topic:
        topic_part = _TOPIC_PARTS.get(msg.topic)
        if topic_part is None:
            return None        # encode_message learns a v1 topic's part
    tags, keys = msg.tags, msg.keys
    text, n = "", 0
    if tags:
        if type(tags) is not str:
            return None
        text, n = "TAGS\x01" + tags + "\x02", 1
    if keys:
        if type(keys) is not list or len(keys) != 1 or type(keys[0]) is not str \
                or KEY_SEPARATOR in keys[0]:
            return None
        if keys[0]:
            text, n = text + "KEYS\x01" + keys[0] + "\x02", n + 1
    return text, n, host_bytes, topic_part


# ------------------------------------------------------------------------ writer side
class CheckedRecords(NamedTuple):
    """``check_records``' verdict on a run of records.

    ``refusals[i] = (status, reason)`` for a record the store will not take;
    ``long_way[i]`` the Message of a record to be prepared like a SEND record;
    every other record is taken as it is. ``wait``: some record waits for the flush
    (no ``WAIT=false`` property)."""

    count: int
    refusals: dict[int, tuple[PutMessageStatus, str]]
    long_way: dict[int, Message]
    topics: list[str | None]
    queue_ids: list[int]          # -1: the store chooses
    consumable: list[bool]
    waits: list[bool]
    starts: np.ndarray
    sizes: np.ndarray


def check_records(data, offsets: np.ndarray, config: StoreConfig, *, store_host_v6: bool = False,
                  producer_id: int = 0, first_sequence: int = 0,
                  topic_verdicts: dict | None = None, own_crcs: bool = False) -> CheckedRecords:
    """Judge the records in ``data`` (a bytes-like run, record i at ``offsets[i]``).

    Raises ``RecordsFormatError`` when the bytes are not a well-formed run of records.
    ``topic_verdicts`` caches a topic's bytes -> its name or refusal across calls.
    ``own_crcs``: the records were laid out in this process a moment ago
    (``encode_records``), so each BODYCRC was computed from the body beside it and the
    bulk check does not compute it again; a frame from a socket is always checked.

    A run of fewer than ``SMALL_CHECK`` records is first read record by record in plain
    Python (``_check_clean_run``): numpy's fixed cost (~60 µs a run, several times that
    when the process has been idle a few milliseconds) is most of a short run's check.
    That path takes only runs with nothing to refuse or take the long way; any other
    run is judged in bulk (``_check_bulk``), which names what is wrong.
    """
    verdicts = {} if topic_verdicts is None else topic_verdicts
    if not len(offsets):            # no record: bytes there mean the count is wrong
        none = np.empty(0, np.int64)
        return CheckedRecords(0, {}, {}, [], [], [], [], none,
                              _check_chain(np.frombuffer(data, np.uint8), none))
    if len(offsets) < SMALL_CHECK and not store_host_v6:
        clean = _check_clean_run(data, offsets, config, producer_id, first_sequence, verdicts)
        if clean is not None:
            return clean
    return _check_bulk(data, offsets, config, store_host_v6, producer_id, first_sequence,
                       verdicts, own_crcs)


def _check_bulk(data, offsets, config: StoreConfig, store_host_v6: bool, producer_id: int,
                first_sequence: int, verdicts: dict, own_crcs: bool = False) -> CheckedRecords:
    """``check_records`` in bulk: numpy over the run, Python per record only where the
    module says."""
    n = len(offsets)
    u8 = np.frombuffer(data, np.uint8)
    starts = np.asarray(offsets, np.int64)
    sizes, head = _read_heads(u8, starts, _check_chain(u8, starts))
    del u8
    refusals: dict[int, tuple[PutMessageStatus, str]] = {}
    _size_rules(sizes, head.props_len, config, refusals)
    queue_nums = config.default_topic_queue_nums
    qid = head.queue_id
    for i in np.nonzero((qid < -1) | (qid >= queue_nums))[0].tolist():
        refusals.setdefault(i, (_ILLEGAL, f"queue id {qid[i]} is outside 0..{queue_nums - 1}"))
    v6 = (head.sys_flag & BORNHOST_V6_FLAG) != 0   # a store-host IPv6 bit refused the frame
    port = head.born_port
    for i in np.nonzero(~v6 & ((port < 0) | (port > 0xFFFF)))[0].tolist():
        refusals.setdefault(i, (_ILLEGAL, f"born host port {port[i]} is outside 0..65535"))
    topics, waits, long_way = _check_each(data, starts, head, v6.tolist(), store_host_v6,
                                          producer_id, first_sequence, verdicts, refusals,
                                          own_crcs)
    for i in list(long_way):
        msg = _as_message(data, int(starts[i]), int(sizes[i]), i)
        if isinstance(msg, tuple):
            refusals[i] = msg
            del long_way[i]
        else:
            long_way[i] = msg
    tran = head.sys_flag & TRANSACTION_ROLLBACK_TYPE       # NOT and COMMIT take a unit
    consumable = ((tran == TRANSACTION_NOT_TYPE) | (tran == TRANSACTION_COMMIT_TYPE)).tolist()
    return CheckedRecords(n, refusals, long_way, topics, qid.tolist(), consumable, waits,
                          starts, sizes)


# Fields 1-15 of a record whose hosts are both IPv4, the born host as address and port.
_V4_HEAD_STRUCT = struct.Struct(">iIiiiqqiq4siq8siqi")
assert _V4_HEAD_STRUCT.size == BODY_POS
_TRAN_TAKES_UNIT = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


class CleanRun(NamedTuple):
    """``check_clean_run``'s verdict: every record of the run is taken as it is; one
    entry per record, plain lists."""

    topics: list[str]
    queue_ids: list[int]          # -1: the store chooses
    consumable: list[bool]
    waits: list[bool]
    starts: list[int]
    sizes: list[int]


def _check_clean_run(data, offsets, config: StoreConfig, producer_id: int,
                     first_sequence: int, verdicts: dict) -> CheckedRecords | None:
    """``check_clean_run`` as ``check_records``' verdict."""
    run = check_clean_run(data, offsets, config, producer_id, first_sequence, verdicts)
    if run is None:
        return None
    return CheckedRecords(len(run.starts), {}, {}, run.topics, run.queue_ids, run.consumable,
                          run.waits, np.array(run.starts, np.int64),
                          np.array(run.sizes, np.int64))


def check_clean_run(data, offsets, config: StoreConfig, producer_id: int = 0,
                    first_sequence: int = 0, verdicts: dict | None = None) -> CleanRun | None:
    """The verdict on a short run whose every record is taken as it is, read record by
    record with ``struct`` (``check_clean_record``); None as soon as a record is anything
    else (a format fault, a refusal, an IPv6 host, a v2 topic, a DELAY, non-ASCII
    properties), for the bulk check (``check_records``) to judge and name. What it takes,
    the bulk check takes alike (a test compares the two). Records with an IPv6 store host
    are not for it."""
    if verdicts is None:
        verdicts = {}
    offs = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
    n, end = len(offs), len(data)
    if n == 0 or offs[0] != 0:
        return None
    raw = data if type(data) is bytes else bytes(data)
    limits = clean_limits(config)
    topics, queue_ids, consumable, waits, sizes = [], [], [], [], []
    offs.append(end)
    for i in range(n):
        s, e = offs[i], offs[i + 1]
        taken = check_clean_record(raw, s, e, limits, verdicts, producer_id, first_sequence + i)
        if taken is None:
            return None
        topics.append(taken[0])
        queue_ids.append(taken[1])
        consumable.append(taken[2])
        waits.append(taken[3])
        sizes.append(e - s)
    offs.pop()
    return CleanRun(topics, queue_ids, consumable, waits, offs, sizes)


def clean_limits(config: StoreConfig) -> tuple[int, int]:
    """What ``check_clean_record`` holds a record to: the largest record it takes (no
    larger than ``max_message_size``, and fitting a CommitLog file with a BLANK after
    it) and the queues a topic has (``default_topic_queue_nums``)."""
    return (min(config.max_message_size,
                config.mapped_file_size_commit_log - record.END_FILE_MIN_BLANK_LENGTH),
            config.default_topic_queue_nums)


def check_clean_record(raw: bytes, s: int, e: int, limits: tuple[int, int], verdicts: dict,
                       producer_id: int = 0, sequence: int = 0) -> tuple | None:
    """Record ``raw[s:e]`` of a clean run (``check_clean_run``): ``(topic, queue_id,
    consumable, wait)`` when it is taken as it is: the stamps the store sets still zero,
    the placeholder store host, a v1 topic the store accepts (``verdicts``: the caller's
    cache of topic verdicts), the body's CRC right, ASCII properties of well-formed
    pairs without a DELAY; with ``producer_id``, its identity (``sequence``) stripped
    from what is judged. None for anything else. ``limits``: ``clean_limits``."""
    size = e - s
    if size < MIN_RECORD_SIZE or e > len(raw):       # the offsets table is the bulk's
        return None
    (total, magic, crc, queue_id, _, queue_offset, physical_offset, sys_flag, _, _,
     port, store_ts, store_host, _, _, body_len) = _V4_HEAD_STRUCT.unpack_from(raw, s)
    at = s + BODY_POS + body_len                    # TOPICLENGTH (v1: one byte)
    if (total != size or magic != record.MESSAGE_MAGIC_CODE or queue_offset
            or physical_offset or store_ts or store_host != PLACEHOLDER_STORE_HOST
            or sys_flag & record.HOST_FLAGS or body_len < 0
            or at + 4 > e or size > limits[0] or not -1 <= queue_id < limits[1]
            or not 0 <= port <= 0xFFFF):
        return None
    topic_len = raw[at]
    props_at = at + 3 + topic_len                   # after PROPERTIESLENGTH
    if not 0 < topic_len <= record.MAX_V1_TOPIC_LENGTH or props_at > e \
            or props_at + int.from_bytes(raw[props_at - 2:props_at], "big", signed=True) != e:
        return None
    topic = _verdict(raw[at + 1:at + 1 + topic_len], verdicts)
    if type(topic) is not str:
        return None
    if zlib.crc32(raw[s + BODY_POS:at]) & 0x7FFFFFFF != crc:
        return None
    props = raw[props_at:e]
    if producer_id:
        props, why = _without_identity(props, producer_id, sequence)
        if why:
            return None
    if _DELAY in props or not props.isascii() or _PAIRS.fullmatch(props) is None:
        return None
    return (topic, queue_id, (sys_flag & TRANSACTION_ROLLBACK_TYPE) in _TRAN_TAKES_UNIT,
            _WAIT_FALSE not in props)


# Fields 1-15 of a record whose hosts are both IPv4, as one numpy record: a run's
# headers are read with one gather. (A record with an IPv6 host has its later fields
# shifted; only its STORETIMESTAMP and BODYLENGTH are read again, from their places.)
V4_HEAD = np.dtype(FIXED_HEAD.descr + [
    ("born_timestamp", ">i8"), ("born_ip", "V4"), ("born_port", ">i4"),
    ("store_timestamp", ">i8"), ("store_host", "V8"), ("reconsume_times", ">i4"),
    ("prepared_offset", ">i8"), ("body_len", ">i4")])
assert V4_HEAD.itemsize == BODY_POS


def _check_chain(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each record's byte count by the offsets table (record i ends where record i+1
    starts, the last where the data ends), each at least a minimal record."""
    n, end = len(starts), len(u8)
    if n == 0:
        if end:
            raise RecordsFormatError(0, f"{end} bytes of records for a count of 0")
        return np.empty(0, np.int64)
    if starts[0] != 0:
        raise RecordsFormatError(0, f"the first record starts at {starts[0]}, not 0")
    gaps = np.diff(np.append(starts, end))
    _first_bad(gaps < MIN_RECORD_SIZE, lambda i: f"{gaps[i]} bytes between its offset and "
               f"the next: shorter than a record ({MIN_RECORD_SIZE})")
    return gaps


def _first_bad(mask: np.ndarray, detail) -> None:
    """Raise ``RecordsFormatError`` for the first record ``mask`` marks."""
    if mask.any():
        i = int(np.argmax(mask))
        raise RecordsFormatError(i, detail(i))


def _first_of(checks: list[tuple[np.ndarray, object]]) -> None:
    """``_first_bad`` for each check in order, once any of them marks a record (one
    test when all is well)."""
    bad = checks[0][0]
    for mask, _ in checks[1:]:
        bad = bad | mask
    if bad.any():
        for mask, detail in checks:
            _first_bad(mask, detail)


class Heads(NamedTuple):
    """Header fields of every record of a run, and where its variable parts lie
    (positions relative to the record's start)."""

    crc: np.ndarray
    queue_id: np.ndarray
    sys_flag: np.ndarray
    born_port: np.ndarray      # meaningful for IPv4 born hosts only
    body_pos: np.ndarray
    body_len: np.ndarray
    topic_pos: np.ndarray
    topic_len: np.ndarray
    props_pos: np.ndarray
    props_len: np.ndarray


def _read_heads(u8: np.ndarray, s: np.ndarray, gaps: np.ndarray) -> tuple[np.ndarray, Heads]:
    """Read and check, stage by stage, the fields that place a record's parts; each
    stage is checked before the next is read, so no read runs past a record. Returns
    the sizes (TOTALSIZE, equal to the offsets table's) and the heads."""
    head = gather_rows(u8, s, BODY_POS).view(V4_HEAD).reshape(-1)
    sizes = head["total"].astype(np.int64)
    magic = head["magic"]
    v2 = magic == record.MESSAGE_MAGIC_CODE_V2
    sys_flag = head["sys_flag"].astype(np.int64)
    born_v6 = (sys_flag & BORNHOST_V6_FLAG) != 0
    body_len_pos = np.full(len(s), BODYLENGTH_POS, np.int64)
    store_ts = head["store_timestamp"].astype(np.int64)
    store_host = head["store_host"].view(">i8").astype(np.int64)
    body_len = head["body_len"].astype(np.int64)
    if (sys_flag & record.HOST_FLAGS).any():
        body_len_pos += np.where(born_v6, 12, 0) + np.where(sys_flag & STOREHOSTADDRESS_V6_FLAG, 12, 0)
        shifted = np.nonzero(body_len_pos != BODYLENGTH_POS)[0]
        fits = body_len_pos[shifted] + 4 + 4 <= gaps[shifted]
        rows = shifted[fits]
        if born_v6.any():
            store_ts[born_v6] = gather_be(u8, s[born_v6] + STORETIMESTAMP_POS + 12, 8)
            store_host[born_v6] = gather_be(u8, s[born_v6] + STOREHOST_POS + 12, 8)
        body_len[rows] = gather_be(u8, s[rows] + body_len_pos[rows], 4)
    body_pos = body_len_pos + 4
    topic_len_pos = body_pos + body_len
    _first_of([
        (sizes != gaps, lambda i: f"TOTALSIZE {sizes[i]} disagrees with the offsets table "
                                  f"({gaps[i]} bytes)"),
        (~v2 & (magic != record.MESSAGE_MAGIC_CODE),
         lambda i: f"illegal magic code 0x{int(magic[i]):08X}"),
        ((head["queue_offset"] != 0) | (head["physical_offset"] != 0) | (store_ts != 0)
         | (store_host != 0) | ((sys_flag & STOREHOSTADDRESS_V6_FLAG) != 0),
         lambda i: "QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and STOREHOSTADDRESS are "
                   "the store's to fill: send them as 0 (an IPv4-wide store host)"),
        (body_len_pos + 4 + 4 > sizes, lambda i: f"record size {sizes[i]} cannot hold its "
                                                 "header"),
        ((body_len < 0) | (topic_len_pos + 4 > sizes),
         lambda i: f"body length {body_len[i]} runs past the record")])
    two = gather_be(u8, s + topic_len_pos, 2)
    topic_len = np.where(v2, two, two >> 8)          # v1: the first of the two bytes
    topic_len = np.where(~v2 & (topic_len > 127), topic_len - 256, topic_len)  # signed byte
    topic_pos = topic_len_pos + np.where(v2, 2, 1)
    props_len_pos = topic_pos + topic_len
    _first_of([
        (topic_len < 1, lambda i: f"topic length {topic_len[i]}"),
        (v2 & (topic_len <= record.MAX_V1_TOPIC_LENGTH),
         lambda i: f"a v2 record with a topic of {topic_len[i]} bytes: topics up to "
                   f"{record.MAX_V1_TOPIC_LENGTH} bytes take the v1 layout"),
        (props_len_pos + 2 > sizes, lambda i: f"topic length {topic_len[i]} runs past the "
                                              "record")])
    props_len = gather_be(u8, s + props_len_pos, 2)
    props_pos = props_len_pos + 2
    _first_bad((props_len < 0) | (props_pos + props_len != sizes),
               lambda i: f"record size {sizes[i]} disagrees with its fields")
    return sizes, Heads(head["crc"].astype(np.int64), head["queue_id"].astype(np.int64),
                        sys_flag, head["born_port"].astype(np.int64), body_pos, body_len,
                        topic_pos, topic_len, props_pos, props_len)


def _check_each(data, starts: np.ndarray, head: Heads, v6: list[bool], store_host_v6: bool,
                producer_id: int, first_sequence: int, verdicts: dict,
                refusals: dict, own_crcs: bool = False) -> tuple[list, list[bool], dict[int, None]]:
    """Topics (judged once when every record names the same), body CRCs (one
    ``zlib.crc32`` each), and the properties of the whole run at once: one regular
    expression over all of them joined by NUL, one ASCII test, one search for DELAY and
    WAIT; a record is looked at alone only when the run as a whole fails one of those.
    Returns the topics, the wait flags and the records to take the long way."""
    raw = data if type(data) is bytes else bytes(data)
    topics = _topics(raw, starts, head, verdicts, refusals)
    n = len(starts)
    props_at = starts + head.props_pos
    props = [raw[a:b] for a, b in zip(props_at.tolist(), (props_at + head.props_len).tolist())]
    if not own_crcs:
        _check_crcs(raw, starts, head, refusals)
    if producer_id:
        props = _check_identities(props, producer_id, first_sequence, refusals)
    joined = b"\0".join(props) + b"\0"            # NUL may stand in no property:
    if joined.count(0) != n or _ALL_PAIRS.fullmatch(joined) is None:   # n NULs, the joins'
        for i, p in enumerate(props):
            if _PAIRS.fullmatch(p) is None:
                refusals.setdefault(i, (_ILLEGAL, _BAD_PAIRS))
    if not joined.isascii():
        for i, p in enumerate(props):
            if not p.isascii():
                try:
                    p.decode("utf-8")
                except UnicodeDecodeError as e:
                    refusals.setdefault(i, (_ILLEGAL, f"properties are not UTF-8: {e}"))
    waits = ([True] * n if _WAIT_FALSE not in joined
             else [_WAIT_FALSE not in p for p in props])
    long_way: dict[int, None] = {}
    delayed = _DELAY in joined
    if delayed or store_host_v6 or any(v6):
        for i, p in enumerate(props):
            if i not in refusals and (v6[i] or store_host_v6 or (delayed and (
                    p.startswith(_DELAY) or b"\x02" + _DELAY in p))):
                long_way[i] = None
    return topics, waits, long_way


def _check_crcs(raw: bytes, starts: np.ndarray, head: Heads, refusals: dict) -> None:
    """Each record's BODYCRC against its body (one ``zlib.crc32`` a record)."""
    body_at = (starts + head.body_pos).tolist()
    body_end = (starts + head.body_pos + head.body_len).tolist()
    crc32 = zlib.crc32
    crcs = np.fromiter([crc32(raw[a:b]) for a, b in zip(body_at, body_end)], np.int64,
                       len(body_at))
    for i in np.flatnonzero(crcs & 0x7FFFFFFF != head.crc).tolist():
        refusals.setdefault(i, (_ILLEGAL, f"body CRC {head.crc[i]} does not match the body"))


def _check_identities(props: list[bytes], producer_id: int, first_sequence: int,
                      refusals: dict) -> list[bytes]:
    """Each record's properties without its idempotent identity (checked)."""
    out = []
    for i, p in enumerate(props):
        rest, why = _without_identity(p, producer_id, first_sequence + i)
        if why:
            refusals.setdefault(i, (_ILLEGAL, why))
        out.append(rest)
    return out


def _topics(raw: bytes, starts: np.ndarray, head: Heads, verdicts: dict,
            refusals: dict) -> list[str | None]:
    """Each record's topic (None when refused: its refusal goes into ``refusals``). When
    every record names the same topic (compared in bulk), it is judged once."""
    n = len(starts)
    at = starts + head.topic_pos
    lengths = head.topic_len
    first = raw[int(at[0]):int(at[0] + lengths[0])]
    if n == 1 or same_bytes(np.frombuffer(raw, np.uint8), at, lengths):
        verdict = _verdict(first, verdicts)
        if type(verdict) is str:
            return [verdict] * n
        for i in range(n):
            refusals.setdefault(i, verdict)
        return [None] * n
    topics: list[str | None] = []
    for i, (a, b) in enumerate(zip(at.tolist(), (at + lengths).tolist())):
        verdict = _verdict(raw[a:b], verdicts)
        if type(verdict) is str:
            topics.append(verdict)
        else:
            topics.append(None)
            refusals.setdefault(i, verdict)
    return topics


def _verdict(raw_topic: bytes, verdicts: dict):
    """A topic's name, or its refusal, from the caller's cache (which this keeps to at
    most ``MAX_TOPIC_VERDICTS`` topics: a cache of every topic a producer ever named
    would grow without bound)."""
    verdict = verdicts.get(raw_topic)
    if verdict is None:
        if len(verdicts) >= MAX_TOPIC_VERDICTS:
            verdicts.clear()
        verdict = verdicts[raw_topic] = _topic_verdict(raw_topic)
    return verdict


def _topic_verdict(raw: bytes) -> str | tuple[PutMessageStatus, str]:
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        return (_ILLEGAL, f"topic {raw!r} is not UTF-8")
    reason = check_topic(topic, put=True)
    return (_ILLEGAL, reason) if reason else topic


def _without_identity(props: bytes, producer_id: int, sequence: int) -> tuple[bytes, str]:
    """The properties without the record's idempotent identity, which must be there once,
    as the frame's producer id and the record's sequence."""
    ident = (f"{PROPERTY_PRODUCER_ID}\x01{producer_id}\x02"
             f"{PROPERTY_PRODUCER_SEQUENCE}\x01{sequence}\x02").encode()
    k = props.find(ident)
    if k < 0 or (k > 0 and props[k - 1] != 2):
        return props, (f"the properties do not carry the identity {PROPERTY_PRODUCER_ID}="
                       f"{producer_id} {PROPERTY_PRODUCER_SEQUENCE}={sequence}")
    return props[:k] + props[k + len(ident):], ""


def _as_message(data, start: int, size: int, index: int) -> Message | tuple:
    """A record that takes the long way, as the Message a SEND record would carry."""
    try:
        ext = record.decode_at(memoryview(data)[start:start + size], 0)
    except record.RecordFormatError as e:
        return (_ILLEGAL, f"record {index}: {e.detail}")
    props = dict(ext.properties)
    tags = props.pop("TAGS", None)
    keys = props.pop("KEYS", None)
    delay = props.pop(PROPERTY_DELAY_TIME_LEVEL, "0")
    wait = props.pop(PROPERTY_WAIT_STORE_MSG_OK, "true") != "false"
    props.pop(PROPERTY_PRODUCER_ID, None)       # the writer stamps the identity again
    props.pop(PROPERTY_PRODUCER_SEQUENCE, None)
    refusal = delay_property_refusal(delay)
    if refusal:
        return (_ILLEGAL, f"record {index}: {refusal}")
    delay_level = int(delay)
    return Message(ext.topic, ext.body, tags, keys.split(" ") if keys else None, props,
                   None if ext.queue_id == -1 else ext.queue_id, ext.flag,
                   ext.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG), delay_level,
                   ext.born_timestamp, ext.born_host, ext.reconsume_times,
                   ext.prepared_transaction_offset, wait)


def _size_rules(sizes: np.ndarray, props_len: np.ndarray, config: StoreConfig,
                refusals: dict) -> None:
    """``validation.check_encoded_size`` in bulk."""
    for i in np.nonzero(props_len > record.MAX_PROPERTIES_LENGTH)[0].tolist():
        refusals.setdefault(i, (PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                f"properties are {props_len[i]} bytes, over "
                                f"{record.MAX_PROPERTIES_LENGTH}"))
    for i in np.nonzero(sizes > config.max_message_size)[0].tolist():
        refusals.setdefault(i, (_ILLEGAL, f"message size {sizes[i]} exceeds max_message_size "
                                          f"{config.max_message_size}"))
    room = config.mapped_file_size_commit_log - record.END_FILE_MIN_BLANK_LENGTH
    for i in np.nonzero(sizes > room)[0].tolist():
        refusals.setdefault(i, (_ILLEGAL, f"message size {sizes[i]} cannot fit in a CommitLog "
                                          f"file of {config.mapped_file_size_commit_log} bytes"))
