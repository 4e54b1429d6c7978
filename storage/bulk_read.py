"""Bulk reads of one queue's records, for readers that check and decode in batches.

A consumer's pull (``read_path.get_from_queue``) reads, checks and returns one record at
a time under RocketMQ's transfer limits (32 messages / 256 KiB). A bulk reader (the
reader process answering FETCH for Spark executors on other hosts) ships thousands of
records a call to a client that checks every one of them against its unit in bulk
(``pipeline.arrow_codec.records_to_batch``), so the store side does as little per record
as it can:

1. ``StoreReader.read_queue_units`` hands over the consume queue's 20-byte units as they
   lie (``QueueUnits``; one file at most, never past DISPATCHED);
2. ``plan_spans`` walks them once: it takes units while their records fit the byte
   budget and groups the records into *spans*, runs of the CommitLog inside one file
   and one ``MAX_SPAN_BYTES``-aligned stretch of it, with no gap over
   ``SPAN_GAP_BYTES`` between two records (a queue's records are interleaved with other
   queues'), each copied out of the mapping in one call: a copy is never much larger
   than ``MAX_SPAN_BYTES`` however far apart the records lie;
3. inside a span, records that touch (``phy == previous end``) form one *piece*: a
   topic with one queue ships each span as one piece, four interleaved queues one piece
   per record. Pieces are memoryviews of the span's copy; joined in order they are
   exactly the taken records, back to back;
4. ``read_records`` copies the spans (``StoreReader.read_queue_records``): a span whose
   CommitLog stretch expired while being read ends the records before it.

A reader that decodes in this process (a Consumer's poll, ``MessageStore.get_message``)
needs no pieces: with ``joined`` the spans' copies are joined into one ``bytes`` (the few
gaps between records included) and each record's place in it comes as a column
(``plan_joined``: the same spans as ``plan_spans``, found with numpy instead of a loop
over the units). A read of fewer than ``SHORT_READ_UNITS`` units whose records make one
span, the common pull, is planned without numpy (``plan_short``: its fixed cost would be
most of the read); its columns are lists, and the records are then checked with
``struct`` too (``read_path.check_unit_views``).

A reader that ships the records on (the reader process's FETCH) takes them with
``gather_records``: ``plan_joined``'s spans, each seen through a view of the mapping
instead of copied, and only the taken records copied out of it, back to back, by a few
numpy gathers (``copy_records``); a span of four interleaved queues is never copied
whole, and there is no object per record.

Blank (filler) units (``BLANK_UNIT_SIZE``) are taken like any other but point at no
record. Nothing here checks a record: the client does, and must.
"""

from __future__ import annotations

import functools
import struct
from itertools import repeat
from operator import add, sub
from typing import Callable, NamedTuple

import numpy as np

from rocketstore.storage import record
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE, CQ_STORE_UNIT_SIZE, CQ_UNIT_DTYPE
from rocketstore.storage.hashing import tags_code
from rocketstore.storage.status import GetMessageStatus


SPAN_GAP_BYTES = 64 << 10   # a larger gap between two records starts a new span
MAX_SPAN_BYTES = 16 << 20   # a record starting in the next aligned stretch starts one too
SHORT_READ_UNITS = 96       # fewer units are planned and checked with struct, not numpy


def stretch_end(phy: int, file_size: int) -> int:
    """Where the span that starts at ``phy`` must end: the end of its CommitLog file or
    of its ``MAX_SPAN_BYTES`` stretch of that file, whichever comes first (numpy
    callers cut at the same places: ``phy % file_size // MAX_SPAN_BYTES`` changes)."""
    in_file = phy % file_size
    return phy - in_file + min(file_size, (in_file // MAX_SPAN_BYTES + 1) * MAX_SPAN_BYTES)


class Span(NamedTuple):
    """CommitLog bytes ``[begin, end)`` in one file, holding the records of units
    ``[first_unit, end_unit)`` (counted from the first unit planned)."""

    begin: int
    end: int
    first_unit: int
    end_unit: int
    pieces: list[slice]   # of the span's bytes (from begin): runs of touching records


class QueueUnits(NamedTuple):
    """Raw consume queue units from ``StoreReader.read_queue_units``."""

    units: bytes      # count * 20 bytes: CQ_UNIT (commit_log_offset, size, tags_code)
    first: int        # the logical offset of the first unit
    count: int
    min_offset: int   # the queue's bounds within the call's ``dispatched``
    max_offset: int


class QueueRecords(NamedTuple):
    """``StoreReader.read_queue_records``: units of one queue and their records."""

    status: GetMessageStatus   # FOUND, or why nothing was read (``offset_status``'s, or
    #                            OFFSET_FOUND_NULL: the file or records at ``first`` are gone)
    first: int                 # the logical offset of the first unit
    count: int                 # units taken
    next_begin_offset: int     # where the next read starts
    min_offset: int            # the queue's bounds within the call's ``dispatched``
    max_offset: int
    units: bytes               # count * 20 bytes, as the consume queue holds them
    data: list                 # the taken units' records back to back, in pieces
    nbytes: int                # the records' total size
    # ``joined``: ``data`` is one bytes holding the records at ``starts`` (one per
    # taken unit that is not blank, in order), with the gaps between them; a list
    # when ``plan_short`` planned the read
    starts: np.ndarray | list[int] | None = None
    # ``plan_short``'s read: the units' CommitLog offsets and sizes (``unit_columns``)
    columns: tuple[tuple[int, ...], tuple[int, ...]] | None = None


def plan_spans(units: bytes, max_bytes: int, at_least_one: bool,
               file_size: int) -> tuple[int, list[Span]]:
    """``(taken, spans)``: how many of ``units`` to take (from the first, while their
    records' sizes add up to at most ``max_bytes``; a first record over the budget is
    still taken when ``at_least_one``) and the spans that copy their records.

    The reader's per-record cost is this loop: one ``struct.unpack`` of every unit, then
    a few comparisons per unit, no call."""
    n = len(units) // CQ_STORE_UNIT_SIZE
    flat = _units_struct(n).unpack(units)
    spans: list[Span] = []
    taken = total = 0
    begin = end = limit = -1
    first_unit = piece_start = piece_end = 0
    pieces: list[slice] = []
    for phy, size in zip(flat[0::3], flat[1::3]):
        if size == BLANK_UNIT_SIZE:
            taken += 1
            continue
        if total + size > max_bytes and (total or not at_least_one):
            break
        if phy == end and phy < limit:                      # touches: the piece grows
            piece_end += size
        elif end < phy <= end + SPAN_GAP_BYTES and phy < limit:   # a new piece
            pieces.append(slice(piece_start, piece_end))
            piece_start = phy - begin
            piece_end = piece_start + size
        else:                                               # a new span
            if begin >= 0:
                pieces.append(slice(piece_start, piece_end))
                spans.append(Span(begin, end, first_unit, taken, pieces))
            begin, first_unit, pieces, piece_start, piece_end = phy, taken, [], 0, size
            limit = stretch_end(phy, file_size)
        end = phy + size
        total += size
        taken += 1
    if begin >= 0:
        pieces.append(slice(piece_start, piece_end))
        spans.append(Span(begin, end, first_unit, taken, pieces))
    return taken, spans


class JoinedPlan(NamedTuple):
    """``plan_joined``: the spans as columns, and each taken record's place (numpy
    arrays; lists from ``plan_short``)."""

    taken: int
    begins: np.ndarray        # per span: CommitLog bytes [begin, end)
    ends: np.ndarray
    first_units: np.ndarray   # per span: its units [first_unit, end_unit)
    end_units: np.ndarray
    span_of: np.ndarray       # per record (taken, not blank): its span
    starts: np.ndarray        # per record: where it lies in the spans' bytes joined
    sizes: np.ndarray


def plan_joined(units: bytes, max_bytes: int, at_least_one: bool,
                file_size: int) -> JoinedPlan:
    """``plan_spans``' spans without a loop over the units: a record continues the
    span of the one before when it starts at or after that one's end, at most
    ``SPAN_GAP_BYTES`` later, in the same file and ``MAX_SPAN_BYTES`` stretch."""
    table = np.frombuffer(units, CQ_UNIT_DTYPE)
    phy = table["phy"].astype(np.int64)
    size = table["size"].astype(np.int64)
    blank = size == BLANK_UNIT_SIZE
    if len(table) and not blank.any():
        whole = _one_span(phy, size, max_bytes, file_size)
        if whole is not None:
            return whole
    counted = np.where(blank, 0, size)
    total = np.cumsum(counted)
    over = ~blank & (total > max_bytes) & ((total - counted > 0) | (not at_least_one))
    taken = int(np.argmax(over)) if over.any() else len(table)
    real = np.flatnonzero(~blank[:taken])
    if not len(real):
        none = np.zeros(0, np.int64)
        return JoinedPlan(taken, none, none, none, none, none, none, none)
    p, s = phy[real], size[real]
    e = p + s
    stretch = p // file_size * (file_size // MAX_SPAN_BYTES + 1) + p % file_size // MAX_SPAN_BYTES
    goes_on = (p[1:] >= e[:-1]) & (p[1:] <= e[:-1] + SPAN_GAP_BYTES) & \
        (stretch[1:] == stretch[:-1])
    firsts = np.flatnonzero(np.concatenate(([True], ~goes_on)))
    lasts = np.append(firsts[1:], len(real)) - 1
    begins, ends = p[firsts], e[lasts]
    at = np.zeros(len(firsts), np.int64)
    np.cumsum((ends - begins)[:-1], out=at[1:])
    span_of = np.repeat(np.arange(len(firsts)), np.diff(np.append(firsts, len(real))))
    return JoinedPlan(taken, begins, ends, real[firsts], np.append(real[firsts[1:]], taken),
                      span_of, at[span_of] + p - begins[span_of], s)


def _one_span(phy: np.ndarray, size: np.ndarray, max_bytes: int,
              file_size: int) -> JoinedPlan | None:
    """``plan_joined``'s plan when every unit is taken and their records make one span
    (each at or after the end of the one before, at most ``SPAN_GAP_BYTES`` later, all
    starting in one stretch): the common read of a queue, its records back to back or
    between other queues' in the CommitLog. None otherwise (a size that is not
    positive included: then the budget is not a sum)."""
    n = len(phy)
    ends = phy + size
    gaps = phy[1:] - ends[:-1]
    first, last = int(phy[0]), int(phy[-1])
    if (int(size.min()) <= 0 or int(size.sum()) > max_bytes or (gaps < 0).any()
            or (gaps > SPAN_GAP_BYTES).any() or first // file_size != last // file_size
            or first % file_size // MAX_SPAN_BYTES != last % file_size // MAX_SPAN_BYTES):
        return None
    one = np.zeros(1, np.int64)
    return JoinedPlan(n, one + first, one + int(ends[-1]), one, one + n,
                      np.zeros(n, np.int64), phy - first, size)


def plan_short(units: bytes, max_bytes: int, file_size: int, *,
               columns: tuple[tuple[int, ...], tuple[int, ...]] | None = None
               ) -> JoinedPlan | None:
    """``plan_joined``'s plan, as lists, when every unit is taken and their records make
    one span (``_one_span``'s case: none blank, every size positive, within
    ``max_bytes``, each record at or after the end of the one before and at most
    ``SPAN_GAP_BYTES`` later, all starting in one file and stretch); None otherwise, for
    ``plan_joined`` to plan. One ``struct.unpack`` of the units, then column operations
    run by the interpreter's builtins: no Python code per unit, no numpy. ``columns``:
    ``unit_columns(units)``, when the caller has them."""
    n = len(units) // CQ_STORE_UNIT_SIZE
    if not n:
        return None
    phy, size = unit_columns(units) if columns is None else columns
    first, last = phy[0], phy[-1]
    if (min(size) <= 0 or BLANK_UNIT_SIZE in size or sum(size) > max_bytes
            or first // file_size != last // file_size
            or first % file_size // MAX_SPAN_BYTES != last % file_size // MAX_SPAN_BYTES):
        return None
    if n > 1:
        gaps = list(map(sub, phy[1:], map(add, phy, size)))
        if min(gaps) < 0 or max(gaps) > SPAN_GAP_BYTES:
            return None
    return JoinedPlan(n, [first], [last + size[-1]], [0], [n], [0] * n,
                      list(map(sub, phy, repeat(first, n))), list(size))


def read_records(got: QueueUnits, max_bytes: int, at_least_one: bool, file_size: int,
                 copy: Callable[[int, int], bytes | None], *,
                 joined: bool = False) -> QueueRecords:
    """The records of ``got``'s units (from its first, ``got.count`` > 0) that fit
    ``max_bytes``: ``plan_spans``, then ``copy(commit_log_offset, size)`` for each span
    (None when those CommitLog bytes are gone: the records stop before that span, and
    when it is the first, the status is OFFSET_FOUND_NULL with ``next_begin_offset``
    past its units). ``joined``: the spans' bytes as one, with each record's place
    (``plan_short`` for fewer than ``SHORT_READ_UNITS`` units, else or when it cannot,
    ``plan_joined``)."""
    if joined:
        return _read_joined(got, max_bytes, at_least_one, file_size, copy)
    offset, lo, hi = got.first, got.min_offset, got.max_offset
    taken, spans = plan_spans(got.units, max_bytes, at_least_one, file_size)
    data: list = []
    nbytes = 0
    for span in spans:
        copied = copy(span.begin, span.end - span.begin)
        if copied is None:  # expired while being read: stop before it
            taken = span.first_unit
            if taken == 0:
                return QueueRecords(GetMessageStatus.OFFSET_FOUND_NULL, offset, 0,
                                    offset + span.end_unit, lo, hi, b"", [], 0)
            break
        data += map(memoryview(copied).__getitem__, span.pieces)
        nbytes += sum(p.stop - p.start for p in span.pieces)
    return QueueRecords(GetMessageStatus.FOUND, offset, taken, offset + taken, lo, hi,
                        got.units[:taken * CQ_STORE_UNIT_SIZE], data, nbytes)


def _read_joined(got: QueueUnits, max_bytes: int, at_least_one: bool, file_size: int,
                 copy: Callable[[int, int], bytes | None]) -> QueueRecords:
    offset, lo, hi = got.first, got.min_offset, got.max_offset
    if len(got.units) < SHORT_READ_UNITS * CQ_STORE_UNIT_SIZE:
        columns = unit_columns(got.units)
        short = plan_short(got.units, max_bytes, file_size, columns=columns)
        if short is not None:
            return _read_one_span(got, short, columns, copy)
    plan = plan_joined(got.units, max_bytes, at_least_one, file_size)
    taken, spans = plan.taken, len(plan.begins)
    copies = []
    for i, (begin, end) in enumerate(zip(plan.begins.tolist(), plan.ends.tolist())):
        copied = copy(begin, end - begin)
        if copied is None:  # expired while being read: stop before it
            taken = int(plan.first_units[i])
            if i == 0:
                return QueueRecords(GetMessageStatus.OFFSET_FOUND_NULL, offset, 0,
                                    offset + int(plan.end_units[0]), lo, hi, b"", [], 0)
            spans = i
            break
        copies.append(copied)
    kept = np.searchsorted(plan.span_of, spans)
    sizes = plan.sizes[:kept]
    return QueueRecords(GetMessageStatus.FOUND, offset, taken, offset + taken, lo, hi,
                        got.units[:taken * CQ_STORE_UNIT_SIZE],
                        [copies[0] if len(copies) == 1 else b"".join(copies)],
                        int(sizes.sum()), plan.starts[:kept])


def _read_one_span(got: QueueUnits, plan: JoinedPlan, columns: tuple,
                   copy: Callable[[int, int], bytes | None]) -> QueueRecords:
    """``_read_joined`` for ``plan_short``'s plan: every unit, one span, one copy."""
    offset, lo, hi, taken = got.first, got.min_offset, got.max_offset, plan.taken
    begin = plan.begins[0]
    copied = copy(begin, plan.ends[0] - begin)
    if copied is None:  # expired while being read
        return QueueRecords(GetMessageStatus.OFFSET_FOUND_NULL, offset, 0, offset + taken,
                            lo, hi, b"", [], 0)
    return QueueRecords(GetMessageStatus.FOUND, offset, taken, offset + taken, lo, hi,
                        got.units, [copied], sum(columns[1]), plan.starts, columns)


def gather_records(got: QueueUnits, max_bytes: int, at_least_one: bool, file_size: int,
                   view: Callable[[int, int], memoryview | None]) -> QueueRecords:
    """``read_records``' records copied once, straight out of the mapping: ``plan_joined``,
    then ``view(commit_log_offset, size)`` for each span (a memoryview of the mapped
    bytes, not a copy; None when they are gone, which ends the records as a failed
    ``copy`` does) and ``copy_records`` of only the taken records, back to back, into
    one numpy array (``data`` is that one array). A span's bytes between the records
    (other queues' records) are never copied. The views are dropped before it returns."""
    offset, lo, hi = got.first, got.min_offset, got.max_offset
    plan = plan_joined(got.units, max_bytes, at_least_one, file_size)
    taken, kept = plan.taken, len(plan.sizes)
    sizes = plan.sizes
    if kept and int(sizes.min()) <= 0:
        # a unit no record can have (a damaged queue): read as read_records reads it,
        # for the client to refuse
        return read_records(got, max_bytes, at_least_one, file_size,
                            lambda phy, size: _copied(view(phy, size)))
    into = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=into[1:])
    data = np.empty(int(into[-1]), np.uint8)
    firsts = np.searchsorted(plan.span_of, np.arange(len(plan.begins) + 1))
    for i, (begin, end) in enumerate(zip(plan.begins.tolist(), plan.ends.tolist())):
        mapped = view(begin, end - begin)
        if mapped is None:  # expired while being read: stop before it
            taken, kept = int(plan.first_units[i]), int(firsts[i])
            if taken == 0:
                return QueueRecords(GetMessageStatus.OFFSET_FOUND_NULL, offset, 0,
                                    offset + int(plan.end_units[0]), lo, hi, b"", [], 0)
            break
        a, b = int(firsts[i]), int(firsts[i + 1])
        copy_records(np.frombuffer(mapped, np.uint8), plan.starts[a:b] - plan.starts[a],
                     sizes[a:b], data[into[a]:into[b]])
        del mapped
    nbytes = int(into[kept])
    return QueueRecords(GetMessageStatus.FOUND, offset, taken, offset + taken, lo, hi,
                        got.units[:taken * CQ_STORE_UNIT_SIZE], [data[:nbytes]], nbytes)


def _copied(mapped: memoryview | None) -> bytes | None:
    return None if mapped is None else bytes(mapped)


GATHER_WIDTHS_MAX = 64   # more distinct piece lengths than this are copied piece by piece


def copy_records(src: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                 out: np.ndarray) -> None:
    """``out`` (uint8, ``sizes.sum()`` bytes) = the records ``src[starts[i]:][:sizes[i]]``
    back to back, in order (``src``: uint8). Touching records are one piece; pieces of
    one length are copied by one numpy gather over overlapping windows of ``src``
    (``strides=(1,)``, each element a piece's bytes) into windows of ``out``, so a
    batch of same-sized records costs a few numpy calls, whatever their count (an
    assignment into the windows: ``np.take`` with ``out=`` would first copy the whole
    overlapping window array). When the pieces have many lengths, each is a slice copy."""
    n = len(starts)
    if n == 0:
        return
    ends = starts + sizes
    leads = np.flatnonzero(np.concatenate(([True], starts[1:] != ends[:-1])))
    pos = starts[leads]
    width = np.add.reduceat(sizes, leads)
    at = np.zeros(len(leads), np.int64)
    np.cumsum(width[:-1], out=at[1:])
    if (width == width[0]).all():
        w = int(width[0])
        _windows(out, w)[at] = _windows(src, w)[pos]
        return
    lengths, group = np.unique(width, return_inverse=True)
    if len(lengths) > GATHER_WIDTHS_MAX:
        target, source = memoryview(out), memoryview(src)
        for p, w, d in zip(pos.tolist(), width.tolist(), at.tolist()):
            target[d:d + w] = source[p:p + w]
        return
    for k, w in enumerate(lengths.tolist()):
        chosen = group == k
        _windows(out, w)[at[chosen]] = _windows(src, w)[pos[chosen]]


def _windows(u8: np.ndarray, width: int) -> np.ndarray:
    """``w[i]`` is the ``width`` bytes from ``u8[i]`` as one numpy void: a view that
    shares ``u8``'s memory (writable when ``u8`` is), no copy."""
    return np.ndarray((max(len(u8) - width + 1, 0),), np.dtype((np.void, width)),
                      buffer=u8, strides=(1,))


def unit_columns(units: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The CommitLog offsets and the sizes of ``units``, as two tuples."""
    n = len(units) // CQ_STORE_UNIT_SIZE
    flat = (_short_units_struct(n) if n < SHORT_READ_UNITS else _units_struct(n)).unpack(units)
    return flat[0::3], flat[1::3]


@functools.lru_cache(maxsize=8)
def _units_struct(n: int) -> struct.Struct:
    return struct.Struct(">" + "qiq" * n)


@functools.lru_cache(maxsize=SHORT_READ_UNITS)
def _short_units_struct(n: int) -> struct.Struct:
    """``_units_struct`` kept for every count a short read may have (a quiet queue's
    pulls take any number below ``SHORT_READ_UNITS``)."""
    return struct.Struct(">" + "qiq" * n)


def keep_tags(units: bytes, data: list, tags: set[str], *,
              codes_are_tags: bool = True) -> tuple[bytes, list]:
    """``units`` and their records (``data``, pieces back to back) with every unit whose
    message has none of ``tags`` made a blank unit and its record left out: offsets
    stay where they are, and a reader of the reply skips the blanks as it skips the
    consume queue's own. The unit's tagsCode picks the candidates, the record's TAGS
    decides (hash codes collide); where a tagsCode is no tags' hash (SCHEDULE_TOPIC_XXXX:
    the delivery time, ``codes_are_tags`` False) every record is read."""
    table = np.frombuffer(units, CQ_UNIT_DTYPE).copy()
    real = table["size"] != BLANK_UNIT_SIZE
    sizes = table["size"][real].astype(np.int64)
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    joined = b"".join(data)
    codes = np.array(sorted({tags_code(t) for t in tags}), np.int64)
    candidate = (np.isin(table["tags_code"][real], codes) if codes_are_tags
                 else np.ones(len(sizes), bool))
    keep = np.zeros(len(sizes), bool)
    for i in np.flatnonzero(candidate).tolist():
        s = int(starts[i])
        keep[i] = record.decode_at(joined[s:s + int(sizes[i])], 0).tags in tags
    dropped = np.flatnonzero(real)[~keep]
    table["phy"][dropped], table["size"][dropped], table["tags_code"][dropped] = \
        0, BLANK_UNIT_SIZE, 0
    kept = [joined[int(starts[i]):int(starts[i] + sizes[i])] for i in np.flatnonzero(keep)]
    return table.tobytes(), kept
