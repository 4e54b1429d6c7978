"""The read path a message store and its read-only views share.

``MessageStore`` (the embedded store, reading its own files) and ``StoreReader`` (another
process's view, bounded by positions from shared memory) answer pulls, lookups and key
queries with the same functions, taking what they read from as arguments:

* ``get_from_queue``: RocketMQ's ``getMessage`` once the queue and its ``[lo, hi)`` are
  known: the statuses, the batch limits (``batch_full``: fewer, smaller batches for data
  far behind the CommitLog end), the ``MAX_SCAN_UNITS`` scan limit, tag filtering;
* ``check_unit_record`` / ``check_unit_raw``: the record a consume-queue unit points at
  must be that unit's message, else ``CorruptRecordError`` names the unit's file and
  position;
* ``query_messages``: index candidates re-read and verified (topic, key or UNIQ_KEY, store
  time), so a hash collision never returns a wrong message;
* ``look_message_by_id``: an offset msgId back to its message;
* ``bulk_result``: a bulk read (``bulk_read.read_records(joined=True)``: spans of the
  CommitLog, one copy each) checked against its units (with numpy from
  ``BULK_VIEWS_MIN`` records on, with struct below: ``check_unit_views``) and answered
  as a pull, lazy ``MessageView``s; ``MessageStore.get_message`` and a ``Consumer``'s
  poll take it for ``BULK_READ_MIN`` messages or more without a tag filter, and
  ``get_from_queue`` for the rest and for anything unusual. The pull limits are the
  caller's: it passes the count and bytes a read may take.
"""

from __future__ import annotations

import dataclasses
import os
from operator import add
from typing import Callable, Iterable, Sequence

import numpy as np

from rocketstore.storage import record
from rocketstore.storage.bulk_read import SHORT_READ_UNITS, QueueRecords, unit_columns
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.consume_queue import (
    BLANK_UNIT_SIZE, CQ_STORE_UNIT_SIZE, CQ_UNIT, CQ_UNIT_DTYPE, ConsumeQueue)
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.index_service import query_offset
from rocketstore.storage.message import MessageExt, decode_message_id
from rocketstore.storage.message_view import MessageView, plain_views, view_at, views_at
from rocketstore.storage.record import RecordFormatError, decode_at
from rocketstore.storage.status import GetMessageStatus

MAX_SCAN_UNITS = 16000 // CQ_STORE_UNIT_SIZE


@dataclasses.dataclass
class GetMessageResult:
    status: GetMessageStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclasses.dataclass
class QueryMessageResult:
    messages: list[MessageExt]
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


NOT_YET = object()
"""What a unit reader returns for a unit that is still being written: the batch ends."""

ReadUnit = Callable[[int, int, int, tuple[str, int]], object]


@dataclasses.dataclass
class GetRawMessagesResult:
    """``get_raw_messages``: the records exactly as the CommitLog holds them."""

    status: GetMessageStatus
    records: list[bytes]
    next_begin_offset: int
    min_offset: int
    max_offset: int


# ===================================================================== shared read path
def offset_status(offset: int, lo: int, hi: int) -> GetMessageResult | None:
    """The answer of a pull at ``offset`` when it needs no read (queue empty, offset out
    of ``[lo, hi)``), else None. ``next_begin_offset`` is RocketMQ's for each status."""
    if hi == 0:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, [], 0, lo, hi)
    if offset < lo:
        return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, [], lo, lo, hi)
    if offset == hi:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, hi)
    if offset > hi:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, [],
                                lo if lo == 0 else hi, lo, hi)
    return None


def batch_full(config: StoreConfig, size: int, total_bytes: int, count: int, max_msgs: int,
               in_disk: bool) -> bool:
    """``isTheBatchFull``: count and byte limits, tighter for data not in memory."""
    if count == 0:
        return False
    if count >= max_msgs:
        return True
    if in_disk:
        return (total_bytes + size > config.max_transfer_bytes_on_message_in_disk
                or count > config.max_transfer_count_on_message_in_disk - 1)
    return (total_bytes + size > config.max_transfer_bytes_on_message_in_memory
            or count > config.max_transfer_count_on_message_in_memory - 1)


def memory_limit_bytes(config: StoreConfig) -> int:
    """Messages further than this behind the CommitLog end count as "in disk"."""
    return total_physical_memory() * config.access_message_in_memory_max_ratio // 100


def _unit_mismatch(index: int, phy: int, size: int, topic: str, queue_id: int,
                   got: tuple[str, int, int, int, int]) -> str | None:
    got_topic, got_queue_id, got_queue_offset, got_phy, got_size = got
    if (got_size != size or got_phy != phy or got_topic != topic or got_queue_id != queue_id
            or got_queue_offset != index):
        return (f"unit {index} points at commitlog offset {phy}, which holds "
                f"{got_topic}/{got_queue_id}@{got_queue_offset} (size {got_size}, "
                f"PHYSICALOFFSET {got_phy})")
    return None


def check_unit_record(data, topic: str, queue_id: int, index: int, phy: int, size: int,
                      where: tuple[str, int], *, decode=lambda data: decode_at(data, 0)):
    """Decode the record unit ``index`` of ``topic``/``queue_id`` points at (``data`` is
    its ``size`` bytes read at ``phy``) and check it is that unit's message: a
    ``MessageExt``, or what ``decode`` makes of the bytes (``message_view.view_at``).

    Raises ``CorruptRecordError`` naming ``where`` (the unit's file and position) when
    the bytes are not a record or are another message.
    """
    path, pos = where
    try:
        msg = decode(data)
    except RecordFormatError as e:
        raise CorruptRecordError(path, pos, f"unit {index} points at a bad record: {e}") from None
    detail = _unit_mismatch(index, phy, size, topic, queue_id,
                            (msg.topic, msg.queue_id, msg.queue_offset, msg.commit_log_offset,
                             msg.store_size))
    if detail:
        raise CorruptRecordError(path, pos, detail)
    return msg


def check_unit_view(data: bytes, topic: str, queue_id: int, index: int, phy: int,
                    size: int, where: tuple[str, int]) -> MessageView:
    """``check_unit_record`` for a reader that decodes the rest on demand
    (``storage.message_view``): the same checks, a ``MessageView``."""
    return check_unit_record(data, topic, queue_id, index, phy, size, where, decode=view_at)


BULK_VIEWS_MIN = SHORT_READ_UNITS   # fewer records are checked with struct: numpy's fixed
#                                     cost would be more
BULK_READ_MIN = 3       # fewer messages to take are read unit by unit: cheaper then


def bulk_result(got: QueueRecords, topic: str, queue_id: int) -> tuple[GetMessageResult, int] | None:
    """A bulk read of one queue answered as a pull, with the bytes of its records: FOUND
    with each record checked against its unit (``check_unit_views``), or the status the
    read found instead. None when the caller must read unit by unit (``get_from_queue``
    knows every such case): the consume queue file or the first records went while being
    read (OFFSET_FOUND_NULL), or a record is not its unit's message (a unit being
    rewritten; a corrupt one is reported by the unit-by-unit read)."""
    if got.status is GetMessageStatus.OFFSET_FOUND_NULL:
        return None
    if got.status is not GetMessageStatus.FOUND:
        return GetMessageResult(got.status, [], got.next_begin_offset, got.min_offset,
                                got.max_offset), 0
    try:
        views = check_unit_views(got.units, got.data, topic, queue_id, got.first, got.starts,
                                 columns=got.columns)
    except CorruptRecordError:
        return None
    return GetMessageResult(GetMessageStatus.FOUND, views, got.next_begin_offset,
                            got.min_offset, got.max_offset), got.nbytes


def check_unit_views(units: bytes, pieces: Sequence, topic: str, queue_id: int,
                     first: int, starts: np.ndarray | list[int] | None = None, *,
                     columns: tuple | None = None) -> list[MessageView]:
    """``check_unit_view`` for every unit of ``units`` (logical offsets from ``first``)
    and the records ``pieces`` hold back to back (``bulk_read.read_records``; blank
    units have no record), or, with ``starts``, the records at ``starts`` of the one
    ``bytes`` in ``pieces`` (``read_records(joined=True)``). From ``BULK_VIEWS_MIN``
    units on they are checked together with numpy (``message_view.views_at``); fewer,
    with ``starts``, with struct (``message_view.plain_views``) when they are a plain
    run of the queue's messages, else (and without ``starts``) one by one. Raises
    ``CorruptRecordError`` as ``check_unit_view`` would for the first unit whose record
    is bad or another message. ``columns``: ``bulk_read.unit_columns(units)``, when the
    read has them (``QueueRecords.columns``)."""
    if len(units) < BULK_VIEWS_MIN * CQ_STORE_UNIT_SIZE:
        return _check_unit_views_short(units, pieces, topic, queue_id, first, starts,
                                       columns)
    table = np.frombuffer(units, CQ_UNIT_DTYPE)
    real = np.flatnonzero(table["size"] != BLANK_UNIT_SIZE)
    sizes = table["size"][real].astype(np.int64)
    if starts is not None:
        starts = np.asarray(starts, np.int64)
        data = pieces[0]
        if len(starts) != len(sizes) or (len(starts) and int((starts + sizes).max()) > len(data)):
            raise CorruptRecordError("consume queue", first, "the records read do not match "
                                     "their units")
    phys = table["phy"][real].astype(np.int64)
    offsets = real + first
    if starts is None:
        data = b"".join(pieces)
        if int(sizes.sum()) != len(data):
            raise CorruptRecordError("consume queue", first, "the records read do not "
                                     "match their units' sizes")
        starts = np.zeros(len(sizes), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
    try:
        views, got = views_at(data, starts, sizes, topic)
    except RecordFormatError as e:
        i = e.index
        raise CorruptRecordError("consume queue", int(offsets[i]),
                                 f"unit {int(offsets[i])} points at a bad record: {e}") from None
    wrong = ~(got.topic_matches & (got.queue_ids == queue_id) & (got.queue_offsets == offsets)
              & (got.commit_log_offsets == phys))
    if wrong.any():
        i = int(np.argmax(wrong))
        s = int(starts[i])
        check_unit_view(data[s:s + int(sizes[i])], topic, queue_id, int(offsets[i]),
                        int(phys[i]), int(sizes[i]), ("consume queue", int(offsets[i])))
        raise AssertionError(f"unit {int(offsets[i])}: the bulk check and the unit check "
                             "disagree")
    return views


def _check_unit_views_short(units: bytes, pieces: Sequence, topic: str, queue_id: int,
                            first: int, starts: np.ndarray | list[int] | None,
                            columns: tuple | None) -> list[MessageView]:
    """``check_unit_views`` of fewer than ``BULK_VIEWS_MIN`` units: with ``starts``, a
    plain run of ``topic``/``queue_id``'s messages (``plain_views``) whose offsets are
    the units' (QUEUEID, QUEUEOFFSET from ``first`` and PHYSICALOFFSET compared as
    tuples) is taken whole; any other read, and one without ``starts``, is checked one
    by one, which names what is wrong."""
    if starts is None:
        return _check_unit_views_one_by_one(units, pieces, topic, queue_id, first)
    data = pieces[0]
    phys, sizes = unit_columns(units) if columns is None else columns
    n = len(sizes)
    if type(starts) is not list:
        starts = starts.tolist()
    if BLANK_UNIT_SIZE not in sizes:
        found = plain_views(data, starts, sizes, topic)
        if found is not None:
            views, queue_ids, queue_offsets, commit_log_offsets = found
            if (commit_log_offsets == phys and queue_ids.count(queue_id) == n
                    and queue_offsets == tuple(range(first, first + n))):
                return views
    else:
        sizes = tuple(s for s in sizes if s != BLANK_UNIT_SIZE)
    if len(starts) != len(sizes) or (starts and max(map(add, starts, sizes)) > len(data)):
        raise CorruptRecordError("consume queue", first, "the records read do not match "
                                 "their units")
    mv = memoryview(data)
    return _check_unit_views_one_by_one(units, [mv[a:a + b] for a, b in zip(starts, sizes)],
                                        topic, queue_id, first)


def _check_unit_views_one_by_one(units: bytes, pieces: Iterable, topic: str, queue_id: int,
                                 first: int) -> list[MessageView]:
    """``check_unit_views`` record by record: each unit's record is cut from its piece
    by the unit's size."""
    pieces = iter(pieces)
    piece, at = b"", 0
    out = []
    for i, (phy, size, _tags_code) in enumerate(CQ_UNIT.iter_unpack(units)):
        if size == BLANK_UNIT_SIZE:
            continue
        if at >= len(piece):
            piece, at = next(pieces), 0
        out.append(check_unit_view(bytes(piece[at:at + size]), topic, queue_id, first + i,
                                   phy, size, ("consume queue", first + i)))
        at += size
    return out


def check_unit_raw(data, topic: str, queue_id: int, index: int, phy: int, size: int,
                   where: tuple[str, int]) -> bytes:
    """``check_unit_record`` without building a MessageExt: the record's own checks
    (``record.check_message_and_return_size``) and the unit's; returns ``bytes(data)``."""
    path, pos = where
    req = record.check_message_and_return_size(data, 0, len(data), phy, False)
    if not req.success or req.msg_size <= 0:
        raise CorruptRecordError(path, pos, f"unit {index} points at commitlog offset {phy}, "
                                 "which does not hold a whole record")
    detail = _unit_mismatch(index, phy, size, topic, queue_id,
                            (req.topic, req.queue_id, req.consume_queue_offset,
                             req.commit_log_offset, req.msg_size))
    if detail:
        raise CorruptRecordError(path, pos, detail)
    return bytes(data)


def tags_of_message(msg: MessageExt) -> str | None:
    return msg.tags


def tags_of_raw(data: bytes) -> str | None:
    return decode_at(data, 0).tags


def read_queue(cq: ConsumeQueue, offset: int, max_msgs: int, tags: set[str], lo: int,
               hi: int, read_unit: ReadUnit, *, config: StoreConfig, max_phy: int,
               memory_limit: int, roll_next_file: Callable[[int], int],
               tags_of: Callable[[object], str | None] = tags_of_message) -> GetMessageResult:
    """MessageStore's ``_read_queue``: up to ``max_msgs`` messages from unit ``offset``
    (``lo <= offset < hi``), within one consume queue file and ``MAX_SCAN_UNITS`` units.

    ``read_unit(index, phy, size, (path, pos))`` returns the message (checked), None
    when its CommitLog data is gone, or ``NOT_YET`` to end the batch there. ``tags``
    keeps only messages whose TAGS is one of them (empty: all).
    """
    found = cq.get_index_buffer(offset)
    if found is None:
        return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, [],
                                cq.roll_next_file(offset), lo, hi)
    mf, pos, limit = found
    buf, path = mf.buf, mf.path
    messages: list = []
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    total_bytes = 0
    next_phy_file_start = -1
    index = offset
    end = min(limit, pos + max(MAX_SCAN_UNITS, max_msgs) * CQ_STORE_UNIT_SIZE)
    for p in range(pos, end, CQ_STORE_UNIT_SIZE):
        phy, size, _ = CQ_UNIT.unpack_from(buf, p)
        if phy < next_phy_file_start or size == BLANK_UNIT_SIZE:
            index += 1
            continue
        if phy + size > max_phy:    # past the bound (``hi`` counted it from a torn read):
            break                   # it is read once the bound passes it, never skipped
        if batch_full(config, size, total_bytes, len(messages), max_msgs,
                      max_phy - phy > memory_limit):
            break
        msg = read_unit(index, phy, size, (path, p))
        if msg is NOT_YET:
            break
        if msg is None:
            status = GetMessageStatus.MESSAGE_WAS_REMOVING if not messages else status
            next_phy_file_start = roll_next_file(phy)
            index += 1
            continue
        index += 1
        if tags and tags_of(msg) not in tags:
            continue
        messages.append(msg)
        total_bytes += size
        status = GetMessageStatus.FOUND
    return GetMessageResult(status, messages, index, lo, hi)


def get_from_queue(cq: ConsumeQueue, offset: int, max_msgs: int,
                   tags: Iterable[str] | None, lo: int, hi: int, read_unit: ReadUnit,
                   **kw) -> GetMessageResult:
    """MessageStore's ``get_message`` once the queue and its ``[lo, hi)`` are known;
    ``kw`` are ``read_queue``'s keyword arguments. ``tags`` is a subscription
    (``subscription_tags``)."""
    early = offset_status(offset, lo, hi)
    if early is not None:
        return early
    return read_queue(cq, offset, max(1, max_msgs), subscription_tags(tags), lo, hi,
                      read_unit, **kw)


def subscription_tags(expression: str | Iterable[str] | None) -> set[str]:
    """The tags a subscription takes, as RocketMQ's FilterAPI reads its expression:
    ``"TagA || TagB"`` (or a list of tags); ``"*"``, ``""`` or None is every message
    (the empty set); pieces are trimmed and empty ones dropped. Raises ``ValueError``
    for an expression that is neither text nor a collection of text."""
    if expression is None:
        return set()
    pieces = expression.split("||") if isinstance(expression, str) else list(expression)
    if not all(isinstance(p, str) for p in pieces):
        raise ValueError(f"a subscription is text or a list of tags, not {expression!r}")
    tags = {p.strip() for p in pieces} - {""}
    return set() if "*" in tags else tags


def look_message_by_id(look: Callable[[int], MessageExt | None],
                       msg_id: str) -> MessageExt | None:
    """The message an offset msgId names (``look(offset)`` reads it); None for an id of
    another store or a message that is gone. Raises ``ValueError`` for text that is not
    a msgId."""
    _, offset = decode_message_id(msg_id)
    msg = look(offset)
    return msg if msg is not None and msg.msg_id == msg_id.upper() else None


def query_messages(files: Sequence, look: Callable[[int], MessageExt | None],
                   max_msgs_num_batch: int, topic: str, key: str, max_num: int,
                   begin_ms: int, end_ms: int) -> QueryMessageResult:
    """MessageStore's ``query_message`` over index ``files`` (oldest first), reading
    candidates with ``look(offset)``: verified hits, deduplicated, oldest first, at most
    ``min(max_num, max_msgs_num_batch)``."""
    max_num = max(0, min(max_num, max_msgs_num_batch))
    res = query_offset(files, topic, key, max_num * 4 + 16, max(0, begin_ms - 1000), end_ms)
    found: dict[int, MessageExt] = {}
    for phy in res.phy_offsets:
        if len(found) >= max_num:
            break
        if phy in found:
            continue
        msg = look(phy)
        if (msg is not None and msg.topic == topic
                and (key in msg.keys or msg.uniq_key == key)
                and begin_ms <= msg.store_timestamp <= end_ms):
            found[phy] = msg
    return QueryMessageResult([found[p] for p in sorted(found)],
                              res.index_last_update_timestamp, res.index_last_update_phyoffset)


# ===================================================================== views of files


def total_physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30
