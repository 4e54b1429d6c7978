"""Queue offsets as the Spark source plans with them: specs, ranges, read limits.

Pure functions, no Spark and no store: the driver resolves what a user asked for
(``startingOffsets``, ``endingOffsets``, ``startingTimestamp``, ``maxOffsetsPerTrigger``,
``minPartitions``) against the queues' current bounds, and turns two offset maps into
the ranges its tasks read.

Vocabulary, as in Spark's Kafka source:

* a **queue** is ``(topic, queue_id)``; its offsets are RocketMQ's logical consume queue
  offsets: ``min`` is the first message still stored, ``max`` the next one to come;
* an **offset spec** is ``"earliest"``, ``"latest"`` or a JSON object
  ``{"topic": {"0": 42, "1": -2}}`` where -2 means earliest and -1 latest; a queue the
  JSON does not name takes the option's default (Kafka instead demands every partition);
* an **offset map** (what streaming checkpoints hold) is ``{"topic": {"0": 42}}`` with
  string queue ids, the form JSON gives back (PITFALLS: integer keys come back as
  strings, so they are strings from the start);
* a **range** ``[start, end)`` of one queue is what one task reads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Mapping, NamedTuple

EARLIEST = -2
LATEST = -1

Queue = tuple[str, int]
OffsetMap = dict[str, dict[str, int]]


class QueueBounds(NamedTuple):
    """A queue's offsets now: ``min_offset`` .. ``max_offset`` (exclusive), and the
    first offset stored at or after a timestamp the caller asked about (-1 when none
    was asked)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    time_offset: int = -1


@dataclasses.dataclass(frozen=True)
class QueueRange:
    """Messages ``[start, end)`` of one queue: one Spark task's work."""

    topic: str
    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class DataLossError(RuntimeError):
    """Offsets a query needs are no longer stored (expired), or were taken back."""


# ------------------------------------------------------------------------------ specs
def parse_spec(name: str, text: str | None, default: str) -> str | dict[Queue, int]:
    """``"earliest"``, ``"latest"`` or ``{(topic, queue_id): offset}`` from an option.

    Raises ``ValueError`` naming the option for anything else (bad JSON, an offset
    below -2, a queue id that is not a non-negative integer).
    """
    if text is None or text.strip() == "":
        return default
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"option {name}: expected 'earliest', 'latest' or JSON like "
                         f'{{"topic": {{"0": 42}}}}, got {text!r} ({e})') from None
    if not isinstance(doc, dict):
        raise ValueError(f"option {name}: the JSON must be an object of topics, got {text!r}")
    out: dict[Queue, int] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise ValueError(f"option {name}: topic {topic!r} must map queue ids to offsets")
        for qid, offset in queues.items():
            if not str(qid).isdigit():
                raise ValueError(f"option {name}: queue id {qid!r} of {topic!r} is not a "
                                 "non-negative integer")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ValueError(f"option {name}: offset {offset!r} of {topic}/{qid} must be "
                                 "an integer >= -2 (-2 earliest, -1 latest)")
            out[(topic, int(qid))] = offset
    return out


def resolve(spec: str | dict[Queue, int], bounds: Iterable[QueueBounds],
            default: str) -> dict[Queue, int]:
    """Each queue's concrete offset under ``spec`` (queues it does not name use
    ``default``). Offsets in a JSON spec are taken as given, even outside the bounds:
    the caller decides what a start below ``min`` means (data loss)."""
    out: dict[Queue, int] = {}
    for b in bounds:
        q = (b.topic, b.queue_id)
        want = spec.get(q, default) if isinstance(spec, dict) else spec
        if want in ("earliest", EARLIEST):
            out[q] = b.min_offset
        elif want in ("latest", LATEST):
            out[q] = b.max_offset
        else:
            out[q] = int(want)
    return out


def resolve_timestamp(bounds: Iterable[QueueBounds]) -> dict[Queue, int]:
    """Starting offsets from ``startingTimestamp``: per queue the first message stored
    at or after it (bounds looked up with that timestamp), or the max when none is."""
    return {(b.topic, b.queue_id): b.max_offset if b.time_offset < 0 else b.time_offset
            for b in bounds}


# ------------------------------------------------------------------------------ offset maps
def to_offset_map(offsets: Mapping[Queue, int]) -> OffsetMap:
    out: OffsetMap = {}
    for (topic, qid), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(qid)] = int(offset)
    return out


def from_offset_map(doc: Mapping) -> dict[Queue, int]:
    """The inverse of ``to_offset_map``; raises ``ValueError`` for a malformed map."""
    out: dict[Queue, int] = {}
    try:
        for topic, queues in doc.items():
            for qid, offset in queues.items():
                out[(str(topic), int(qid))] = int(offset)
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"not an offset map of {{topic: {{queue: offset}}}}: {doc!r} ({e})") \
            from None
    return out


# ------------------------------------------------------------------------------ ranges
def ranges_between(start: Mapping[Queue, int], end: Mapping[Queue, int]) -> list[QueueRange]:
    """One range per queue with something between ``start`` and ``end``; a queue
    missing from ``start`` starts at 0 (it appeared after the start was taken)."""
    out = []
    for (topic, qid), stop in sorted(end.items()):
        begin = start.get((topic, qid), 0)
        if stop > begin:
            out.append(QueueRange(topic, qid, begin, stop))
    return out


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Split large ranges so there are about ``min_partitions`` of them, each queue
    in parts proportional to its share of the total (Kafka's
    KafkaOffsetRangeCalculator); fewer ranges than asked only when messages run out."""
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    out: list[QueueRange] = []
    for r in ranges:
        parts = max(1, min(r.size, round(r.size / total * min_partitions)))
        step = r.size / parts
        bounds = [r.start + round(i * step) for i in range(parts)] + [r.end]
        out += [QueueRange(r.topic, r.queue_id, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return out


def limit_offsets(start: Mapping[Queue, int], latest: Mapping[Queue, int],
                  max_rows: int) -> dict[Queue, int]:
    """``latest`` cut so that at most ``max_rows`` offsets lie between it and
    ``start`` in all, shared among the queues in proportion to what each has waiting
    (Kafka's maxOffsetsPerTrigger); remainders go to the queues with most waiting."""
    waiting = {q: max(0, end - start.get(q, 0)) for q, end in latest.items()}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(latest)
    share = {q: n * max_rows // total for q, n in waiting.items()}
    left = max_rows - sum(share.values())
    for q in sorted(waiting, key=lambda q: (-(waiting[q] - share[q]), q)):
        if left <= 0:
            break
        if share[q] < waiting[q]:
            share[q] += 1
            left -= 1
    return {q: (start.get(q, 0) + share[q]) if waiting[q] else latest[q] for q in latest}


def check_no_loss(start: Mapping[Queue, int], bounds: Iterable[QueueBounds]) -> list[str]:
    """Queues whose start lies below their min (expired) or above their max (taken
    back by a recovery): one sentence each."""
    problems = []
    for b in bounds:
        s = start.get((b.topic, b.queue_id))
        if s is None:
            continue
        if s < b.min_offset:
            problems.append(f"{b.topic}/{b.queue_id}: offsets {s}..{b.min_offset - 1} expired "
                            f"(the queue now starts at {b.min_offset})")
        elif s > b.max_offset:
            problems.append(f"{b.topic}/{b.queue_id}: offset {s} is past the queue's end "
                            f"{b.max_offset}")
    return problems
