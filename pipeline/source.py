"""The ``rocketstore`` Spark format: batch and streaming reads.

    spark.read.format("rocketstore").option("store", "store").option("topic", "Orders").load()
    spark.readStream.format("rocketstore").option("endpoint", "tcp://host:10911")
         .option("topics", "Orders,Refunds").option("maxOffsetsPerTrigger", 100000).load()

Rows have ``pipeline.arrow_codec.SPARK_SCHEMA_DDL``; tasks hand Spark Arrow record
batches. Options: ``pipeline.options``. A schema given to the reader that names a
subset of the columns (``.schema("queue_offset long, body binary")``) is a projection:
only those columns cross into Spark, which is where most of a read's time goes (the
Python Data Source API has no column pruning of its own); ``bench/spark.py`` measures
both.

Batch (``BatchReader``): on the driver, ``partitions()`` looks up every matching queue's
bounds, resolves ``startingOffsets`` (or ``startingTimestamp``) and ``endingOffsets``,
and plans one task per ``(topic, queue, start, end)``, large ranges split toward
``minPartitions``. A start below a queue's min is data loss (``failOnDataLoss``); a start
or end past its max, or an end before its start, is an error naming the queue.

Streaming (``StreamReader``): offsets are ``{"topic": {"queue": next_offset}}``.

    call                           what it does
    -----------------------------  ----------------------------------------------------------
    initialOffset()                startingTimestamp or startingOffsets (default latest),
                                   resolved once, when the query first starts; a restarted
                                   query resumes from its checkpoint instead
    latestOffset(start, limit)     every matching queue's max now (queues that appeared
                                   since start from 0), capped by the AvailableNow target and
                                   by the limit: ReadMaxRows shares ``maxOffsetsPerTrigger``
                                   among queues in proportion to what each has waiting
    prepareForTriggerAvailableNow  records the max of every queue now as the target
    partitions(start, end)         one task per queue range, split toward minPartitions
    read(partition)                the range, as the batch reader reads it
    commit(end)                    end as the committed offsets of consumer group ``group``
                                   (progress for `rocketstore status`; the checkpoint, not
                                   the group, is what a restart resumes from). Spark calls
                                   it for a micro-batch when the next one starts, so the
                                   group trails the query by one micro-batch

The driver opens the store for each call and closes it again, so nothing but plain
values is pickled to executors; each task opens its own mapping or socket in ``read``.
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, InputPartition)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow)

from rocketstore.spark import offsets as off
from rocketstore.spark.allocator import keep_heap_top
from rocketstore.spark.access import DEFAULT_BATCH_ROWS, open_store
from rocketstore.spark.arrow_codec import SPARK_SCHEMA_DDL
from rocketstore.spark.options import Options, parse

log = logging.getLogger(__name__)


class RangePartition(InputPartition):
    """One task's queue range (plain values: it is pickled to an executor)."""

    def __init__(self, rng: off.QueueRange):
        super().__init__(rng)
        self.topic, self.queue_id, self.start, self.end = rng.topic, rng.queue_id, rng.start, rng.end

    def range(self) -> off.QueueRange:
        return off.QueueRange(self.topic, self.queue_id, self.start, self.end)


class RocketStoreDataSource(DataSource):
    """Format ``rocketstore``: read and write a rocketstore store's topics."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema) -> "BatchReader":
        return BatchReader(parse(self.options, reading=True), projection(schema))

    def streamReader(self, schema) -> "StreamReader":
        return StreamReader(parse(self.options, reading=True), projection(schema))

    def writer(self, schema, overwrite: bool):
        from rocketstore.spark.sink import BatchWriter
        return BatchWriter(parse(self.options, reading=False), schema)

    def streamWriter(self, schema, overwrite: bool):
        from rocketstore.spark.sink import StreamWriter
        return StreamWriter(parse(self.options, reading=False), schema)


# ------------------------------------------------------------------------------ shared
COLUMN_TYPES = {name.strip(): kind.strip() for name, kind in
                (col.strip().split(" ", 1) for col in SPARK_SCHEMA_DDL.split(", "))}
SPARK_NAMES = {"int": "int", "long": "bigint", "string": "string", "binary": "binary",
               "timestamp": "timestamp", "array<string>": "array<string>",
               "map<string,string>": "map<string,string>"}


def projection(schema) -> tuple[str, ...] | None:
    """The columns a read produces, in order: None for the whole schema, else those a
    user-given schema names (case-sensitively). Raises ``ValueError`` for a column the
    format does not have, a type that is not the column's, or NOT NULL (every column
    may be null: a message without tags, a timestamp out of Spark's range)."""
    if isinstance(schema, str) or schema is None:
        return None
    for f in schema.fields:
        want = COLUMN_TYPES.get(f.name)
        if want is None:
            raise ValueError(f"column {f.name!r} is not one of the rocketstore format's "
                             f"({', '.join(COLUMN_TYPES)})")
        if f.dataType.simpleString() != SPARK_NAMES[want]:
            raise ValueError(f"column {f.name!r} is {want}, not {f.dataType.simpleString()}")
        if not f.nullable:
            raise ValueError(f"column {f.name!r} may be null: drop NOT NULL from the schema")
    names = tuple(f.name for f in schema.fields)
    return None if names == tuple(COLUMN_TYPES) else names


def _bounds(opts: Options, since_ms: int | None = None) -> list[off.QueueBounds]:
    """Every queue the query reads, with its bounds now."""
    with open_store(opts.store, opts.endpoint, opts.timeout_ms, opts.curve) as store:
        found = store.bounds(list(opts.topics) if opts.topic_pattern is None else None, since_ms)
    return [b for b in found if opts.matches(b.topic)]


def _read(opts: Options, partition: RangePartition, columns: tuple[str, ...] | None):
    if not isinstance(partition, RangePartition):
        return  # Spark reads one InputPartition(None) when partitions() planned none
    keep_heap_top()     # in the worker: batches reuse the heap instead of faulting it in
    with open_store(opts.store, opts.endpoint, opts.timeout_ms, opts.curve) as store:
        yield from store.read(partition.range(), fail_on_data_loss=opts.fail_on_data_loss,
                              batch_rows=opts.batch_size or DEFAULT_BATCH_ROWS, columns=columns,
                              tags=opts.tags)


def _starting(opts: Options, bounds: list[off.QueueBounds], default: str) -> dict:
    if opts.starting_timestamp is not None:
        return off.resolve_timestamp(_bounds(opts, opts.starting_timestamp))
    spec = _spec(opts, "startingOffsets", opts.starting_offsets, default)
    return off.resolve(spec, bounds, default)


def _spec(opts: Options, name: str, text: str | None, default: str):
    """``parse_spec``, refusing a JSON spec that names a topic the query does not read
    (Kafka refuses it too): a misspelt topic would otherwise leave every queue at the
    default without a word."""
    spec = off.parse_spec(name, text, default)
    if isinstance(spec, dict):
        strangers = sorted({topic for topic, _ in spec if not opts.matches(topic)})
        if strangers:
            raise ValueError(f"option {name}: topic(s) {', '.join(map(repr, strangers))} "
                             "are not read by this query")
    return spec


def _partitions(opts: Options, start: dict, end: dict) -> list[RangePartition]:
    ranges = off.split_ranges(off.ranges_between(start, end), opts.min_partitions)
    return [RangePartition(r) for r in ranges]


# ------------------------------------------------------------------------------ batch
class BatchReader(DataSourceReader):
    def __init__(self, opts: Options, columns: tuple[str, ...] | None = None):
        self.opts = opts
        self.columns = columns

    def partitions(self) -> list[RangePartition]:
        opts = self.opts
        bounds = _bounds(opts)
        start_spec = _spec(opts, "startingOffsets", opts.starting_offsets, "earliest")
        end_spec = _spec(opts, "endingOffsets", opts.ending_offsets, "latest")
        if start_spec == "latest" or end_spec == "earliest":
            raise ValueError("a batch read cannot start at latest nor end at earliest: it "
                             "would read nothing (use a streaming read to follow new messages)")
        start = _starting(opts, bounds, "earliest")
        end = off.resolve(end_spec, bounds, "latest")
        start = self._settle_loss(start, bounds)
        by_queue = {(b.topic, b.queue_id): b for b in bounds}
        for q, stop in end.items():
            b = by_queue[q]
            if stop > b.max_offset:
                raise ValueError(f"endingOffsets: {q[0]}/{q[1]} ends at {b.max_offset}, "
                                 f"before the {stop} asked for")
            if stop < start[q]:
                raise ValueError(f"endingOffsets: {q[0]}/{q[1]} would end at {stop}, before "
                                 f"its start {start[q]}")
        return _partitions(opts, start, end)

    def _settle_loss(self, start: dict, bounds: list[off.QueueBounds]) -> dict:
        problems = off.check_no_loss(start, bounds)
        if problems and self.opts.fail_on_data_loss:
            raise off.DataLossError("; ".join(problems) + "; set failOnDataLoss=false to "
                                    "read what is still there")
        for p in problems:
            log.warning("skipping: %s", p)
        settled = {}
        for b in bounds:
            q = (b.topic, b.queue_id)
            settled[q] = min(max(start[q], b.min_offset), b.max_offset)
        return settled

    def read(self, partition: RangePartition):
        return _read(self.opts, partition, self.columns)


# ------------------------------------------------------------------------------ streaming
class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: Options, columns: tuple[str, ...] | None = None):
        if opts.ending_offsets is not None:
            raise ValueError("endingOffsets is for batch reads; a streaming query runs on")
        self.opts = opts
        self.columns = columns
        self.target: dict | None = None      # AvailableNow: the max of every queue at start
        self.previous: dict | None = None    # the last end handed out (pyspark < 4.2)

    def initialOffset(self) -> dict:
        bounds = _bounds(self.opts)
        start = _starting(self.opts, bounds, "latest")
        return off.to_offset_map(start)

    def getDefaultReadLimit(self):
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {(b.topic, b.queue_id): b.max_offset for b in _bounds(self.opts)}

    def _now(self) -> dict:
        return {(b.topic, b.queue_id): b.max_offset for b in _bounds(self.opts)}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is None:  # pyspark < 4.2 asks without a start and applies no limit
            start = self.previous or self.initialOffset()
            limit = self.getDefaultReadLimit()
        begin = off.from_offset_map(start)
        latest = self._now()
        if self.target is not None:
            latest = {q: min(n, self.target.get(q, begin.get(q, 0))) for q, n in latest.items()}
        latest = {q: max(n, begin.get(q, 0)) for q, n in latest.items()}
        for q, n in begin.items():
            latest.setdefault(q, n)  # a queue that vanished (its files all expired) keeps its place
        if isinstance(limit, ReadMaxRows):
            latest = off.limit_offsets(begin, latest, limit.max_rows)
        self.previous = off.to_offset_map(latest)
        return self.previous

    def reportLatestOffset(self) -> dict:
        return off.to_offset_map(self._now())

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        return _partitions(self.opts, off.from_offset_map(start), off.from_offset_map(end))

    def read(self, partition: RangePartition):
        return _read(self.opts, partition, self.columns)

    def commit(self, end: dict) -> None:
        """Record ``end`` as the consumer group's committed offsets. Failing to record
        it costs only the lag report, never the query."""
        try:
            with open_store(self.opts.store, self.opts.endpoint, self.opts.timeout_ms,
                            self.opts.curve) as store:
                for topic, queues in end.items():
                    store.commit(self.opts.group, topic, {int(q): int(o) for q, o in queues.items()})
        except Exception as e:  # noqa: BLE001 - progress reporting must not stop the query
            log.warning("could not record progress of group %s: %s", self.opts.group, e)
