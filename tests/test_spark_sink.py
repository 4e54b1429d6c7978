"""The ``rocketstore`` Spark format, writing: real Spark (local[2], up to 4 attempts per
task), a real store, batch and streaming writes, and a write whose Python workers are
SIGKILLed mid-way: Spark retries the task and the store keeps every row exactly once."""

from __future__ import annotations

import collections
import os
import signal
import threading

import pytest

from rocketstore.client import Producer
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message
from store_processes import RunningStore, wait_for


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with RunningStore(tmp_path_factory.mktemp("spark-sink")) as rs:
        yield rs


def read(spark, **options):
    return spark.read.format("rocketstore").options(**{k: str(v) for k, v in options.items()}).load()


def caught_up(rs: RunningStore) -> None:
    wait_for(lambda: rs.slot(Slot.DISPATCHED) >= rs.slot(Slot.WRITTEN), 30, "dispatch")


def rows_df(spark, n: int, topic: str | None = None):
    data = [(f"body {i}".encode(), f"tag{i % 3}", [f"k{i}", f"g{i % 7}"], {"i": str(i)}, i % 4)
            for i in range(n)]
    cols = "body binary, tags string, keys array<string>, properties map<string,string>, queue_id int"
    df = spark.createDataFrame(data, cols)
    if topic is not None:
        from pyspark.sql import functions as F
        df = df.withColumn("topic", F.lit(topic))
    return df


@pytest.mark.parametrize("path", ["local", "remote"])
def test_write_then_read_back_every_column(spark, running, path):
    topic = f"Written{path.title()}"
    where = {"store": running.store_dir} if path == "local" else \
        {"endpoint": f"ipc://{running.store_dir}"}
    rows_df(spark, 2000, topic).repartition(3).write.format("rocketstore").options(**where) \
        .mode("append").save()
    caught_up(running)
    back = read(spark, topic=topic, **where).collect()
    assert len(back) == 2000
    by_body = {r.body: r for r in back}
    assert len(by_body) == 2000
    for i in range(2000):
        r = by_body[f"body {i}".encode()]
        assert (r.tags, r.keys, r.properties, r.queue_id) == \
            (f"tag{i % 3}", [f"k{i}", f"g{i % 7}"], {"i": str(i)}, i % 4)


def test_string_bodies_and_the_topic_option(spark, running):
    df = spark.createDataFrame([("héllo",), ("world",)], "body string")
    df.write.format("rocketstore").option("store", running.store_dir).option("topic", "Texts") \
        .mode("append").save()
    caught_up(running)
    back = sorted(r.body for r in read(spark, store=running.store_dir, topic="Texts").collect())
    assert back == sorted(["héllo".encode(), b"world"])


def test_rows_without_a_queue_are_spread_by_the_store_and_a_given_queue_is_kept(spark, running):
    """No queue_id column, or a null in it: the store picks, round robin over the topic's
    queues (``default_topic_queue_nums``, 8 here), as for a Producer's Message."""
    n = 400
    spark.createDataFrame([(b"s%d" % i,) for i in range(n)], "body binary").repartition(2) \
        .write.format("rocketstore").option("store", running.store_dir) \
        .option("topic", "Spread").mode("append").save()
    spark.createDataFrame([(b"n%d" % i, None if i % 2 else 5) for i in range(40)],
                          "body binary, queue_id int") \
        .write.format("rocketstore").option("store", running.store_dir) \
        .option("topic", "Nulls").mode("append").save()
    caught_up(running)
    spread = collections.Counter(r.queue_id for r in read(
        spark, store=running.store_dir, topic="Spread").collect())
    assert sorted(spread) == list(range(8)) and sum(spread.values()) == n
    assert max(spread.values()) <= 2 * min(spread.values()), spread
    nulls = {r.body: r.queue_id for r in read(spark, store=running.store_dir,
                                              topic="Nulls").collect()}
    assert all(nulls[b"n%d" % i] == 5 for i in range(0, 40, 2))
    assert {nulls[b"n%d" % i] for i in range(1, 40, 2)} == set(range(8))


@pytest.mark.parametrize("columns, words", [
    ("tags string", "needs a body column"),
    ("body binary, value string", "not one the rocketstore sink writes"),
    ("body binary, queue_id string", "expected"),
])
def test_bad_columns_are_named(spark, running, columns, words):
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=words):
        df.write.format("rocketstore").option("store", running.store_dir) \
            .option("topic", "Bad").mode("append").save()


def test_a_refused_row_fails_the_write_with_the_store_reason(spark, running):
    df = spark.createDataFrame([(b"x", "a\x01b")], "body binary, tags string")
    with pytest.raises(Exception, match="MESSAGE_ILLEGAL"):
        df.write.format("rocketstore").option("store", running.store_dir) \
            .option("topic", "Refused").mode("append").save()


@pytest.mark.parametrize("column, value, words", [
    ("topic", None, "null topic, and the write has no topic option"),
    ("properties", [("a", "1"), ("b", None)], "null property value(s) for 'b'"),
])
def test_null_topics_and_property_values_are_refused_by_name(column, value, words):
    """A null topic without a topic option failed deep in the encoder; a null property
    value was stored as the text "None"."""
    import pyarrow as pa
    from rocketstore.spark.sink import SinkError, batch_messages
    good = {"topic": ("T", pa.string()),
            "properties": ([("a", "1")], pa.map_(pa.string(), pa.string()))}
    first, kind = good[column]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"ok", b"bad"]), pa.array([first, value], kind)], ["body", column])
    with pytest.raises(SinkError, match=words.replace("(", r"\(").replace(")", r"\)")):
        batch_messages(batch, None if column == "topic" else "T")


def test_a_write_cuts_its_frames_by_bytes_as_well_as_rows(running, monkeypatch):
    """Rows of large bodies: a chunk of batchSize rows would pass a frame's 64 MiB
    (FRAME_TOO_LARGE on every attempt), so chunks are also cut by their bytes."""
    from rocketstore.spark import sink
    monkeypatch.setattr(sink, "FRAME_BYTES", 1 << 20)       # 1 MiB: a few rows a frame
    sender = sink.IdempotentSender(running.store_dir, 0x5EED, batch_rows=500,
                                   timeout_ms=30_000)
    frames = []
    send_async = sender.producer.send_async
    sender.producer.send_async = lambda chunk, **kw: (frames.append(len(chunk)),
                                                      send_async(chunk, **kw))[1]
    try:
        rows = [Message(topic="BigRows", body=bytes([i]) * 60_000, queue_id=0)
                for i in range(60)]
        assert sender.send_all(iter(rows)) == 60
    finally:
        sender.producer.close()
    assert sum(frames) == 60 and max(frames) <= 17 and len(frames) >= 4
    caught_up(running)
    assert stored_count(running, "BigRows") == 60


def test_chunks_cut_by_rows_and_by_bytes_in_order():
    """What a write sends and what it resends after a failure are cut alike (the
    resend once joined every chunk in flight and cut by rows only: frames of 300 MiB)."""
    from rocketstore.spark.sink import FRAME_BYTES, _size_about, chunks
    big = [Message(topic="T", body=bytes(3 << 20)) for _ in range(30)]
    small = [Message(topic="T", body=b"s%d" % i) for i in range(1200)]
    for rows, messages in ((500, big), (500, small), (7, big + small)):
        cut = list(chunks(iter(messages), rows))
        assert [m for c in cut for m in c] == messages
        assert all(0 < len(c) <= rows for c in cut)
        assert all(sum(map(_size_about, c)) <= FRAME_BYTES for c in cut)
    assert [len(c) for c in chunks(small, 500)] == [500, 500, 200]


def test_a_resend_after_a_timeout_cuts_its_frames_by_bytes_too(running, monkeypatch):
    """The writer stops answering (SIGSTOP) while large rows are in flight: the
    sender times out, waits, and sends again from the first unacknowledged row. That
    resend joined every chunk in flight and cut it by rows only (frames far over
    64 MiB with real bodies); it is cut like the first send, and every row is stored
    once."""
    from rocketstore.spark import sink
    monkeypatch.setattr(sink, "FRAME_BYTES", 1 << 20)       # 1 MiB: a few rows a frame
    sender = sink.IdempotentSender(running.store_dir, 0x5E4D, batch_rows=500,
                                   timeout_ms=20_000)
    sender.producer._dealer.timeout_ms = 1000        # the first answers give up soon
    frames = []
    send_async = sender.producer.send_async
    sender.producer.send_async = lambda chunk, **kw: (frames.append(len(chunk)),
                                                      send_async(chunk, **kw))[1]
    writer = running.child_pid("writer")
    os.kill(writer, signal.SIGSTOP)
    threading.Timer(2.0, os.kill, (writer, signal.SIGCONT)).start()
    try:
        rows = [Message(topic="Resent", body=bytes([i]) * 60_000, queue_id=0)
                for i in range(60)]
        assert sender.send_all(iter(rows)) == 60
    finally:
        os.kill(writer, signal.SIGCONT)
        sender.producer.close()
    assert sum(frames) > 60 and max(frames) <= 17        # some went twice, all small
    caught_up(running)
    assert stored_count(running, "Resent") == 60


# ------------------------------------------------------------------------------ retries
def python_workers() -> list[int]:
    """Pids of the Python workers this process's Spark (its JVM's pyspark.daemon)
    forked: not the daemon, and none of a Spark another test process runs beside this
    one (xdist), whose tasks a kill would fail."""
    daemons, parents = set(), {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"pyspark.daemon" not in cmd:
                continue
            parents[int(pid)] = ppid = _parent(int(pid))
            if _parent(ppid) == os.getpid():        # the daemon <- its JVM <- this process
                daemons.add(int(pid))
        except OSError:
            continue
    return [pid for pid, ppid in parents.items() if ppid in daemons]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def stored_count(rs: RunningStore, topic: str) -> int:
    from rocketstore.client import ReaderClient
    with ReaderClient(rs.store_dir) as c:
        return sum(o.max_offset for o in c.offsets([topic]))


def test_a_write_whose_workers_are_killed_mid_way_is_retried_without_duplicates(spark, running):
    topic, n = "Retried", 120_000
    df = spark.range(n).selectExpr("cast(cast(id as string) as binary) as body",
                                   "cast(id % 4 as int) as queue_id").repartition(2)
    killed: list[int] = []

    def killer():
        # Once some of the rows are stored, SIGKILL the Python workers that send them.
        try:
            wait_for(lambda: stored_count(running, topic) >= n // 10, 120, "first rows")
        except AssertionError:
            return
        if stored_count(running, topic) < n:
            for pid in python_workers():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer)
    t.start()
    df.write.format("rocketstore").option("store", running.store_dir).option("topic", topic) \
        .option("batchSize", 200).mode("append").save()
    t.join()
    assert killed, "no worker was killed while the write ran"
    caught_up(running)
    bodies = [r.body for r in read(spark, store=running.store_dir, topic=topic)
              .select("body").collect()]
    assert len(bodies) == n
    assert len(set(bodies)) == n


# ------------------------------------------------------------------------------ streaming
def test_streaming_write_is_exactly_once_even_when_a_batch_is_replayed(spark, running, tmp_path):
    source, sink = "StreamIn", "StreamOut"
    with Producer(running.store_dir) as p:
        sent = p.send_batch([Message(topic=source, body=b"in %d" % i, queue_id=i % 2)
                             for i in range(400)])
    assert all(r.ok for r in sent)
    caught_up(running)
    checkpoint = str(tmp_path / "ck")

    def run():
        q = (spark.readStream.format("rocketstore").option("store", running.store_dir)
             .option("topic", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 100).load()
             .selectExpr("body", "tags", "keys").writeStream.format("rocketstore")
             .option("store", running.store_dir).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()

    run()
    caught_up(running)
    first = read(spark, store=running.store_dir, topic=sink).collect()
    assert sorted(r.body for r in first) == sorted(b"in %d" % i for i in range(400))
    # Forget that the last micro-batch was committed: Spark runs it again, with the same
    # batch id and offsets, and the store keeps what the first run already wrote once.
    commits = os.path.join(checkpoint, "commits")
    last = max(int(n) for n in os.listdir(commits) if n.isdigit())
    os.remove(os.path.join(commits, str(last)))
    crc = os.path.join(commits, f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    run()
    caught_up(running)
    again = read(spark, store=running.store_dir, topic=sink).collect()
    assert len(again) == 400
