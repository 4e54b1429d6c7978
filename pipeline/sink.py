"""The ``rocketstore`` Spark format: batch and streaming writes, exactly once per task.

    df.write.format("rocketstore").option("store", "store").option("topic", "Counts").save()
    df.writeStream.format("rocketstore").option("endpoint", "tcp://host:10911")
      .option("checkpointLocation", "/ckpt").start()

Columns (anything else is refused, so a misspelt column is not silently dropped):

    column      type                          meaning
    ----------  ----------------------------  -----------------------------------------
    body        binary or string (required)   the message body (a string as UTF-8)
    topic       string                        the row's topic; null: the ``topic`` option
    tags        string                        RocketMQ tags
    keys        array<string> or string       index keys (a string: space-separated)
    properties  map<string,string>            user properties
    queue_id    int                           the queue; null: the store picks (round robin)

Exactly once for task retries. Each task sends through its own Producer, opened inside
the task, with an idempotent identity: a producer id derived from what a retry of the
same task shares (the write's id, drawn once on the driver, or the streaming query's
id and micro-batch id, with the partition id) and the row's index in the partition as
its sequence. A retried task, a speculative copy or a restarted streaming query that
replays a micro-batch sends the same (producer id, sequence) pairs again, and the
writer stores each pair once (``procs.writer``; Kafka's idempotent producer, where
Spark's Kafka sink is at least once). This holds as long as a retry sees the same rows
in the same order, which is Spark's own condition for deterministic results.

Inside a task, batches are pipelined (``window`` in flight). A batch answered with a
status that may pass (OS_PAGECACHE_BUSY, SERVICE_NOT_AVAILABLE, OUT_OF_ORDER_SEQUENCE
behind it) or not answered in time makes the task wait for everything in flight and
send again from the first unacknowledged row, with back-off, until ``timeoutMs``; the
writer drops what it already holds. A row the store refuses for good (MESSAGE_ILLEGAL,
PROPERTIES_SIZE_EXCEEDED) fails the task with the row's index and the store's reason.
A task aimed where no store can be reached (no store running at the directory, nothing
listening at the endpoint, a CURVE handshake refused) fails at once with the client's
``StoreUnreachableError`` (``client.reach``), as nothing it sent got in.

What a failed job leaves: the rows of tasks that finished stay stored (a message store
cannot take them back), as with Kafka.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
import uuid
from collections import deque
from typing import Iterable, Iterator

from pyspark.sql.datasource import (
    DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage)
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, ShortType, StringType, StructType)

from rocketstore.spark.options import Options
from rocketstore.spark.access import socket_of
from rocketstore.client import ClientError, Producer, RequestTimeout
from rocketstore.storage.message import Message
from rocketstore.storage.status import PutMessageStatus

log = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 500
WINDOW = 16
FRAME_BYTES = 32 << 20    # a chunk is cut before its messages pass this (a SEND frame's
                          # bound is 64 MiB: half of it leaves room for the layout)
RECORD_OVERHEAD = 256     # a record's fixed fields and the frame's per-record bytes, about
RETRY_PAUSE_S = (0.05, 2.0)
RETRIABLE = {PutMessageStatus.OS_PAGECACHE_BUSY, PutMessageStatus.SERVICE_NOT_AVAILABLE,
             PutMessageStatus.OUT_OF_ORDER_SEQUENCE}
COLUMNS = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "tags": (StringType,),
    "keys": (ArrayType, StringType),
    "properties": (MapType,),
    "queue_id": (IntegerType, ShortType, LongType),
}


@dataclasses.dataclass
class TaskResult(WriterCommitMessage):
    """What a write task tells the driver's ``commit``: the rows it stored."""
    rows: int


class SinkError(RuntimeError):
    """The store refused a row for good, or could not be reached in time."""


def check_schema(schema: StructType, opts: Options) -> None:
    """Raise ``ValueError`` for columns the sink cannot write."""
    names = {f.name: f.dataType for f in schema.fields}
    if "body" not in names:
        raise ValueError("the DataFrame to write needs a body column (binary or string)")
    for name, dtype in names.items():
        allowed = COLUMNS.get(name)
        if allowed is None:
            raise ValueError(f"column {name!r} is not one the rocketstore sink writes "
                             f"({', '.join(COLUMNS)}): select the columns to write")
        if not isinstance(dtype, allowed):
            raise ValueError(f"column {name!r} is {dtype.simpleString()}, expected "
                             f"{' or '.join(t.typeName() for t in allowed)}")
    if "topic" not in names and not opts.topics:
        raise ValueError("name the topic to write with the option topic or a topic column")
    if len(opts.topics) > 1:
        raise ValueError("a write takes one topic option (a topic column picks per row)")


def producer_id_for(*parts: object) -> int:
    """A non-zero 63-bit producer id shared by every attempt of one task."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") & ((1 << 63) - 1)) or 1


def ingest_address(opts: Options) -> str:
    """Where a task's Producer sends: the store directory (the Producer finds its
    ingest socket, or says no store runs there), or the endpoint's ingest socket."""
    if opts.store is not None:
        return opts.store
    return socket_of(opts.endpoint, "ingest")


# ------------------------------------------------------------------------------ rows
def batch_messages(batch, default_topic: str | None) -> list[Message]:
    """The messages of one Arrow record batch, in row order."""
    n = batch.num_rows
    cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    bodies = cols["body"]
    topics = cols.get("topic") or [None] * n
    tags = cols.get("tags") or [None] * n
    keys = cols.get("keys") or [None] * n
    props = cols.get("properties") or [None] * n
    queues = cols.get("queue_id") or [None] * n
    out = []
    for i in range(n):
        body = bodies[i]
        if body is None:
            raise SinkError(f"row {i} of a batch has a null body")
        topic = topics[i] or default_topic
        if topic is None:
            raise SinkError(f"row {i} of a batch has a null topic, and the write has no "
                            "topic option to use instead")
        properties = dict(props[i]) if props[i] else {}
        nulls = [name for name, value in properties.items() if value is None]
        if nulls:
            raise SinkError(f"row {i} of a batch has null property value(s) for "
                            f"{', '.join(map(repr, nulls))}: a property is a string")
        out.append(Message(
            topic=topic, body=body.encode("utf-8") if isinstance(body, str) else body,
            tags=tags[i], keys=keys[i], properties=properties, queue_id=queues[i]))
    return out


def _rows(batches: Iterator, default_topic: str | None) -> Iterator[Message]:
    for batch in batches:
        yield from batch_messages(batch, default_topic)


# ------------------------------------------------------------------------------ sending
def chunks(messages: Iterable[Message], rows: int) -> Iterator[list[Message]]:
    """``messages`` in order, ``rows`` a chunk, each cut sooner where its messages
    would pass ``FRAME_BYTES`` (a SEND frame's bound is 64 MiB)."""
    chunk: list[Message] = []
    size = 0
    for m in messages:
        grows = _size_about(m)
        if chunk and size + grows > FRAME_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += grows
        if len(chunk) == rows:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _size_about(m: Message) -> int:
    """About the bytes ``m`` takes in a frame (at least its record's)."""
    props = m.properties or {}
    return (RECORD_OVERHEAD + len(m.body) + 4 * len(m.topic) + 4 * len(m.tags or "")
            + 4 * len(" ".join(m.key_list())) + sum(4 * (len(k) + len(v)) + 2
                                                     for k, v in props.items()))


class IdempotentSender:
    """Sends a task's rows in order with sequences 0, 1, 2, ... and rewinds to the
    first unacknowledged row whenever a batch did not get in."""

    def __init__(self, address: str, producer_id: int, *, batch_rows: int, timeout_ms: int,
                 curve: tuple[str | None, str | None] = (None, None)):
        self.producer = Producer(address, producer_id=producer_id, window=WINDOW,
                                 timeout_ms=min(timeout_ms, 10_000),
                                 curve_server_key=curve[0], curve_client_key=curve[1])
        self.batch_rows = batch_rows
        self.timeout_s = timeout_ms / 1000
        self.in_flight: deque = deque()   # (first sequence, messages, handle)
        self.sent = 0                     # rows handed to the producer
        self.acked = 0                    # rows every one of which the store holds

    def send_all(self, messages: Iterator[Message]) -> int:
        """Send every message (in ``chunks``); the rows acknowledged."""
        for chunk in chunks(messages, self.batch_rows):
            self._send(chunk)
        while self.in_flight:
            self._settle_oldest()
        return self.acked

    def _send(self, chunk: list[Message]) -> None:
        while len(self.in_flight) >= WINDOW:
            self._settle_oldest()
        handle = self.producer.send_async(chunk, first_sequence=self.sent)
        self.in_flight.append((self.sent, chunk, handle))
        self.sent += len(chunk)

    def _settle_oldest(self) -> None:
        first, chunk, handle = self.in_flight[0]
        failed = self._first_failure(first, chunk, handle)
        if failed is None:
            self.in_flight.popleft()
            self.acked = first + len(chunk)
            return
        self._rewind(failed)

    def _first_failure(self, first: int, chunk: list[Message], handle) -> str | None:
        """None when the store holds every row of the batch; else why not (retriable).
        Raises ``SinkError`` for a row refused for good."""
        try:
            results = handle.result()
        except RequestTimeout as e:
            return str(e)
        for i, r in enumerate(results):
            if r.ok:
                continue
            if r.status in RETRIABLE:
                return f"row {first + i}: {r.status.name} {r.reason}"
            raise SinkError(f"row {first + i} of the partition was refused: "
                            f"{r.status.name}: {r.reason}")
        return None

    def _rewind(self, why: str) -> None:
        """Wait for every batch in flight, then send again from the first
        unacknowledged row, in order, until all are in or time runs out."""
        pending = [m for _, chunk, _ in self.in_flight for m in chunk]
        first = self.in_flight[0][0]
        self._drain()
        deadline = time.monotonic() + self.timeout_s
        pause = RETRY_PAUSE_S[0]
        while True:
            log.info("resending rows %d..%d: %s", first, first + len(pending) - 1, why)
            time.sleep(pause)
            why = self._resend(first, pending)
            if why is None:
                self.acked = first + len(pending)
                return
            if time.monotonic() > deadline:
                raise SinkError(f"rows from {first} not stored within {self.timeout_s:g} s: {why}")
            pause = min(pause * 2, RETRY_PAUSE_S[1])

    def _resend(self, first: int, pending: list[Message]) -> str | None:
        k = 0
        for chunk in chunks(pending, self.batch_rows):
            try:
                handle = self.producer.send_async(chunk, first_sequence=first + k)
            except ClientError as e:
                return str(e)
            why = self._first_failure(first + k, chunk, handle)
            if why is not None:
                return why
            k += len(chunk)
        return None

    def _drain(self) -> None:
        for _, _, handle in self.in_flight:
            try:
                handle.result()
            except ClientError:
                pass
        self.in_flight.clear()

    def close(self) -> None:
        self.producer.close()


def _write_partition(opts: Options, batches: Iterator, *identity: object) -> TaskResult:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    pid = producer_id_for(*identity, partition)
    sender = IdempotentSender(ingest_address(opts), pid,
                              batch_rows=opts.batch_size or DEFAULT_BATCH_ROWS,
                              timeout_ms=opts.timeout_ms, curve=opts.curve)
    try:
        rows = sender.send_all(_rows(batches, opts.topics[0] if opts.topics else None))
    finally:
        sender.close()
    return TaskResult(rows)


# ------------------------------------------------------------------------------ Spark
class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: Options, schema: StructType):
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex  # drawn once, on the driver: every retry shares it

    def write(self, iterator) -> TaskResult:
        return _write_partition(self.opts, iterator, "batch", self.write_id)

    def commit(self, messages) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, TaskResult))
        log.info("rocketstore write %s: %d rows in %d tasks", self.write_id, rows, len(messages))

    def abort(self, messages) -> None:
        log.warning("rocketstore write %s failed; rows of finished tasks stay stored",
                    self.write_id)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: Options, schema: StructType):
        check_schema(schema, opts)
        self.opts = opts

    def write(self, iterator) -> TaskResult:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if query_id is None or batch_id is None:
            raise SinkError("a streaming write task without its query id and batch id "
                            "cannot send idempotently")
        return _write_partition(self.opts, iterator, "stream", query_id, batch_id)

    def commit(self, messages, batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, TaskResult))
        log.info("rocketstore stream write: batch %d, %d rows", batchId, rows)

    def abort(self, messages, batchId: int) -> None:
        log.warning("rocketstore stream write: batch %d failed; rows of finished tasks "
                    "stay stored", batchId)
