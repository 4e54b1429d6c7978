"""``storage.bulk_read.plan_spans``: which units a bulk read takes and how it copies
their records (spans within one CommitLog file, touching records joined into pieces);
``plan_joined`` and ``plan_short`` plan the same spans without the loop;
``gather_records`` copies the same records as ``read_records``, straight from views."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rocketstore.storage import bulk_read
from rocketstore.storage.bulk_read import (
    MAX_SPAN_BYTES, SPAN_GAP_BYTES, QueueUnits, Span, copy_records, gather_records,
    plan_joined, plan_short, plan_spans, read_records)
from rocketstore.storage.consume_queue import BLANK_UNIT, CQ_UNIT
from rocketstore.storage.status import GetMessageStatus

FILE = 1 << 20


def pieces(*pairs) -> list[slice]:
    return [slice(a, a + n) for a, n in pairs]


def units(*pairs) -> bytes:
    return b"".join(BLANK_UNIT if p is None else CQ_UNIT.pack(p[0], p[1], 0) for p in pairs)


def test_touching_records_form_one_piece_and_gaps_separate_pieces():
    taken, spans = plan_spans(units((0, 100), (100, 50), (400, 10), (410, 10)), 1 << 30,
                              True, FILE)
    assert taken == 4
    assert spans == [Span(0, 420, 0, 4, pieces((0, 150), (400, 20)))]


def test_a_file_boundary_or_a_large_gap_starts_a_new_span():
    far = 200 + SPAN_GAP_BYTES + 1
    taken, spans = plan_spans(units((0, 100), (far, 100), (FILE, 100), (FILE + 100, 8)),
                              1 << 30, True, FILE)
    assert taken == 4
    assert spans == [Span(0, 100, 0, 1, pieces((0, 100))),
                     Span(far, far + 100, 1, 2, pieces((0, 100))),
                     Span(FILE, FILE + 108, 2, 4, pieces((0, 108)))]


def test_a_span_never_runs_much_past_one_aligned_stretch_of_the_file():
    big_file, size = 4 * MAX_SPAN_BYTES, 1 << 20
    records = [(k * size, size) for k in range(40)]     # 40 MiB back to back
    taken, spans = plan_spans(units(*records), 1 << 30, True, big_file)
    assert taken == 40
    assert [(s.begin, s.end) for s in spans] == [
        (0, MAX_SPAN_BYTES), (MAX_SPAN_BYTES, 2 * MAX_SPAN_BYTES), (2 * MAX_SPAN_BYTES, 40 * size)]


def test_the_byte_budget_cuts_before_the_record_that_would_pass_it():
    u = units((0, 100), (100, 100), (200, 100))
    assert plan_spans(u, 250, True, FILE)[0] == 2
    assert plan_spans(u, 300, True, FILE)[0] == 3
    assert plan_spans(u, 50, True, FILE) == (1, [Span(0, 100, 0, 1, pieces((0, 100)))])
    assert plan_spans(u, 50, False, FILE) == (0, [])


def test_blank_units_are_taken_but_point_at_nothing():
    taken, spans = plan_spans(units(None, None, (0, 100), None, (100, 20)), 1 << 30, True, FILE)
    assert taken == 5
    assert spans == [Span(0, 120, 2, 5, pieces((0, 120)))]
    assert plan_spans(units(None, None), 10, False, FILE) == (2, [])


@given(st.lists(st.tuples(st.integers(0, 3 * SPAN_GAP_BYTES), st.integers(8, 5000)),
                max_size=40), st.integers(1, 100_000))
@settings(max_examples=300)
def test_the_pieces_are_exactly_the_taken_records_in_order(layout, budget):
    phy, pairs = 0, []
    for gap, size in layout:
        phy += gap
        if phy // FILE != (phy + size - 1) // FILE:
            phy = (phy // FILE + 1) * FILE   # a record never crosses a CommitLog file
        pairs.append((phy, size))
        phy += size
    taken, spans = plan_spans(units(*pairs), budget, True, FILE)
    assert taken == len(pairs) or sum(s for _, s in pairs[:taken + 1]) > budget
    assert sum(s for _, s in pairs[:taken]) <= budget or taken == 1
    got = [(span.begin + p.start, p.stop - p.start) for span in spans for p in span.pieces]
    expected, end = [], None
    for p, s in pairs[:taken]:
        if expected and p == end and p // FILE == expected[-1][0] // FILE:
            expected[-1] = (expected[-1][0], expected[-1][1] + s)
        else:
            expected.append((p, s))
        end = p + s
    assert got == expected
    for span in spans:
        assert span.begin // FILE == (span.end - 1) // FILE


layouts = st.one_of(
    st.lists(st.one_of(st.none(), st.tuples(st.integers(-200, 3 * SPAN_GAP_BYTES),
                                            st.integers(8, 5000))), max_size=60),
    st.lists(st.tuples(st.just(0), st.integers(8, 5000)), max_size=60))   # back to back


def _pairs(layout: list, file_size: int) -> list:
    """Units' (commit_log_offset, size) from ``layout``'s gaps and sizes (None: a blank
    unit): no record crosses a file; past ``FILE``, now and then a stretch boundary."""
    phy, pairs = 0, []
    for item in layout:
        if item is None:
            pairs.append(None)
            continue
        gap, size = item
        phy = max(0, phy + gap)
        if phy // file_size != (phy + size - 1) // file_size:
            phy = (phy // file_size + 1) * file_size
        pairs.append((phy, size))
        phy += size
    if file_size > FILE:     # reach past a stretch boundary now and then
        pairs = [None if p is None else (p[0] * 97 % (2 * MAX_SPAN_BYTES), p[1])
                 for p in pairs]
        pairs = [None if p is None or p[0] // file_size != (p[0] + p[1] - 1) // file_size
                 else p for p in pairs]
    return pairs


@given(layouts, st.integers(1, 100_000), st.booleans(),
       st.sampled_from([FILE, 2 * MAX_SPAN_BYTES + (1 << 20)]))
@settings(max_examples=400)
def test_plan_joined_finds_plan_spans_spans(layout, budget, at_least_one, file_size):
    """The numpy planner against the loop: the same units taken, the same spans, and
    each record where the spans' bytes joined hold it, with its span (blanks, gaps,
    records going back, file and stretch boundaries included)."""
    pairs = _pairs(layout, file_size)
    raw = units(*pairs)
    taken, spans, plan = _same_plans(raw, file_size, budget, at_least_one)
    base, expected, span_of = 0, [], []
    for k, s in enumerate(spans):
        records = [p for p in pairs[s.first_unit:s.end_unit] if p is not None]
        expected += [base + p[0] - s.begin for p in records]
        span_of += [k] * len(records)
        base += s.end - s.begin
    assert plan.starts.tolist() == expected
    assert plan.span_of.tolist() == span_of
    assert plan.sizes.tolist() == [p[1] for p in pairs[:taken] if p is not None]


@given(st.one_of(layouts, st.lists(st.tuples(st.integers(0, 600), st.integers(8, 400)),
                                   min_size=1, max_size=40)),
       st.integers(1, 100_000), st.booleans(),
       st.sampled_from([FILE, 2 * MAX_SPAN_BYTES + (1 << 20)]))
@settings(max_examples=400)
def test_plan_short_is_plan_joined_where_it_plans(layout, budget, at_least_one, file_size):
    """``plan_short`` plans exactly the reads ``plan_joined`` takes whole in one span
    with no blank unit, and plans them as it does (its columns are lists); every other
    read it leaves to ``plan_joined``."""
    pairs = _pairs(layout, file_size)
    raw = units(*pairs)
    plan = plan_joined(raw, budget, at_least_one, file_size)
    short = plan_short(raw, budget, file_size)
    whole_span = (len(pairs) > 0 and None not in pairs and plan.taken == len(pairs)
                  and len(plan.begins) == 1 and sum(p[1] for p in pairs) <= budget)
    assert (short is not None) == whole_span
    if short is not None:
        assert short == tuple(c if isinstance(c, int) else c.tolist() for c in plan)
        assert all(type(c) is list for c in short[1:])


def test_plan_short_leaves_damaged_units_to_plan_joined():
    """Sizes that are not positive, records that go back or overlap, a gap one byte
    over ``SPAN_GAP_BYTES``, a first record over the budget: no short plan."""
    for raw, budget in [
        (units((0, 100), (100, 0)), 1 << 40),
        (units((0, 100), (100, -60), (40, 5)), 1 << 40),
        (units((0, 100), (50, 100)), 1 << 40),
        (units((500, 100), (0, 100)), 1 << 40),
        (units((0, 100), (101 + SPAN_GAP_BYTES, 10)), 1 << 40),
        (units((0, 100)), 50),
        (b"", 1 << 40),
    ]:
        assert plan_short(raw, budget, FILE) is None
    assert plan_short(units((0, 100), (100 + SPAN_GAP_BYTES, 10)), 110, FILE).taken == 2


def _same_plans(raw: bytes, file_size: int, budget: int = 1 << 40, at_least_one: bool = True):
    """The loop's plan and the numpy planner's take the same units in the same spans;
    returns (taken, spans, the numpy plan)."""
    taken, spans = plan_spans(raw, budget, at_least_one, file_size)
    plan = plan_joined(raw, budget, at_least_one, file_size)
    assert plan.taken == taken
    assert [(s.begin, s.end, s.first_unit, s.end_unit) for s in spans] == list(zip(
        plan.begins.tolist(), plan.ends.tolist(), plan.first_units.tolist(),
        plan.end_units.tolist()))
    return taken, spans, plan


def test_plan_joined_with_units_of_no_or_negative_size():
    """Units a reader may meet in a damaged queue: what the loop plans, the numpy
    planner plans (a size-0 unit starting a stretch, a negative size within a budget)."""
    big = 4 * MAX_SPAN_BYTES
    for raw, budget, at_least_one, file_size in [
        (units((2 * MAX_SPAN_BYTES - 150, 150), (2 * MAX_SPAN_BYTES, 0)), 1 << 40, True, big),
        (units((0, 100), (105, -60), (50, 5)), 50, False, FILE),       # sums to 45
        (units((0, 100), (100, 0), (100, 10)), 1 << 40, True, FILE),
    ]:
        _same_plans(raw, file_size, budget, at_least_one)


def test_plan_joined_at_the_edges_of_a_span():
    """A gap of exactly SPAN_GAP_BYTES stays in the span, one byte more does not; a
    record touching the last across a stretch or file boundary starts a new span."""
    big = 4 * MAX_SPAN_BYTES
    for raw, file_size, spans in [
        (units((0, 100), (100 + SPAN_GAP_BYTES, 10)), FILE, 1),
        (units((0, 100), (101 + SPAN_GAP_BYTES, 10)), FILE, 2),
        (units((MAX_SPAN_BYTES - 100, 100), (MAX_SPAN_BYTES, 100)), big, 2),
        (units((MAX_SPAN_BYTES - 300, 100), (MAX_SPAN_BYTES - 200, 100)), big, 1),
        (units((500, 100), (0, 100)), FILE, 2),
        (units((FILE - 100, 100), (FILE, 100)), FILE, 2),      # back to back, two files
        (units((FILE - 200, 100), (FILE - 100, 100)), FILE, 1),
    ]:
        _same_plans(raw, file_size)
        assert len(plan_joined(raw, 1 << 40, True, file_size).begins) == spans


# ------------------------------------------------------------------ gather_records
COMMIT_LOG = random.Random(7).randbytes(2 * MAX_SPAN_BYTES + (1 << 20))  # a CommitLog's bytes


def _both_reads(raw: bytes, budget: int, at_least_one: bool, file_size: int,
                gone_from: int | None = None):
    """``read_records`` (copies) and ``gather_records`` (views) of ``raw``'s units over
    ``COMMIT_LOG``; a span from ``gone_from`` on is gone (expired while being read)."""
    mapped = memoryview(COMMIT_LOG)

    def view(phy: int, size: int):
        if gone_from is not None and phy >= gone_from:
            return None
        return mapped[phy:phy + size]

    got = QueueUnits(raw, 5, len(raw) // 20, 0, 1000)
    copied = read_records(got, budget, at_least_one, file_size,
                          lambda phy, size: None if view(phy, size) is None
                          else bytes(view(phy, size)))
    return copied, gather_records(got, budget, at_least_one, file_size, view)


def _same_records(copied, gathered) -> None:
    assert gathered[:6] == copied[:6]   # status, first, count, next, min, max
    assert bytes(gathered.units) == bytes(copied.units)
    assert gathered.nbytes == copied.nbytes
    assert b"".join(gathered.data) == b"".join(copied.data)


@given(layouts, st.integers(1, 100_000), st.booleans(),
       st.sampled_from([FILE, 2 * MAX_SPAN_BYTES + (1 << 20)]), st.integers(0, 2))
@settings(max_examples=300, deadline=None)
def test_gather_records_copies_what_read_records_copies(layout, budget, at_least_one,
                                                        file_size, gone):
    """The same units taken, the same status and offsets, and byte for byte the same
    records back to back, however the records lie (blanks, gaps, records going back,
    file and stretch boundaries), also when the second or the first span is gone."""
    pairs = _pairs(layout, file_size)
    raw = units(*pairs)
    plan = plan_joined(raw, budget, at_least_one, file_size)
    gone_from = None
    if gone and len(plan.begins) >= gone:
        gone_from = int(plan.begins[gone - 1]) if gone == 1 else int(plan.begins[1])
    copied, gathered = _both_reads(raw, budget, at_least_one, file_size, gone_from)
    _same_records(copied, gathered)
    if gone == 1 and len(plan.begins) and plan.first_units[0] == 0:
        assert gathered.status is GetMessageStatus.OFFSET_FOUND_NULL


def test_gather_records_with_units_of_no_or_negative_size():
    """A damaged queue's units are read as ``read_records`` reads them."""
    for raw, budget in [(units((0, 100), (100, 0), (100, 10)), 1 << 40),
                        (units((0, 100), (105, -60), (50, 5)), 50)]:
        _same_records(*_both_reads(raw, budget, False, FILE))


@pytest.mark.parametrize("widths_max", [bulk_read.GATHER_WIDTHS_MAX, 1])
@pytest.mark.parametrize("shape", ["one size", "three sizes", "many sizes", "touching runs"])
def test_copy_records_puts_the_records_back_to_back(shape, widths_max, monkeypatch):
    """Every way ``copy_records`` copies (one gather for one width, one per width, a
    slice per piece past ``GATHER_WIDTHS_MAX`` widths, touching records as one piece)
    gives the records in order, back to back, and writes nothing past them."""
    monkeypatch.setattr(bulk_read, "GATHER_WIDTHS_MAX", widths_max)
    rng = random.Random(shape)
    src = np.frombuffer(COMMIT_LOG[:1 << 20], np.uint8)
    starts, sizes, at = [], [], 3
    for _ in range(500):
        size = {"one size": 263, "three sizes": rng.choice([92, 263, 1000]),
                "many sizes": rng.randint(92, 3000),
                "touching runs": rng.choice([100, 300])}[shape]
        starts.append(at)
        sizes.append(size)
        touching = shape == "touching runs" and rng.random() < 0.7
        at += size + (0 if touching else rng.randint(1, 700))
    out = np.full(sum(sizes) + 16, 0xEE, np.uint8)
    copy_records(src, np.array(starts), np.array(sizes), out[:sum(sizes)])
    assert out[:sum(sizes)].tobytes() == b"".join(COMMIT_LOG[a:a + n]
                                                  for a, n in zip(starts, sizes))
    assert (out[sum(sizes):] == 0xEE).all()
