"""The ``rocketstore`` Spark format, reading: real Spark (local[2]), a real store
(``rocketstore up``: every process, real sockets, shm and files), batch and streaming,
the local path (mapped files) and the remote one (the reader socket)."""

from __future__ import annotations

import json

import pytest

from rocketstore.client import Producer
from rocketstore.client.consumer import read_offsets
from rocketstore.procs.status import store_status
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message
from rocketstore.storage.config import StoreConfig
from store_processes import RunningStore, free_ports, wait_for, wait_past_ms

ORDERS, REFUNDS, TIMED = "Orders", "Refunds", "Timed"
N_ORDERS = 3000
BORN_MS = 1_700_000_000_123


def order(i: int) -> Message:
    return Message(topic=ORDERS, body=f"order {i} ".encode() * (1 + i % 5),
                   tags=None if i % 7 == 0 else f"tag{i % 3}",
                   keys=[] if i % 5 == 0 else [f"order-{i}", f"customer-{i % 11}"],
                   properties={} if i % 4 == 0 else {"region": "eu", "n": str(i)},
                   queue_id=i % 4, born_timestamp=BORN_MS + i)


def send(store_dir: str, messages: list[Message]) -> list:
    with Producer(store_dir) as p:
        results = [r for k in range(0, len(messages), 500) for r in p.send_batch(messages[k:k + 500])]
    assert all(r.ok for r in results)
    return results


def dispatched_all(rs: RunningStore) -> None:
    wait_for(lambda: rs.slot(Slot.DISPATCHED) >= rs.slot(Slot.WRITTEN), 30, "dispatch")


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A store holding N_ORDERS orders (4 queues) and 40 refunds (2 queues)."""
    with RunningStore(tmp_path_factory.mktemp("spark-source")) as rs:
        orders = [order(i) for i in range(N_ORDERS)]
        results = send(rs.store_dir, orders)
        send(rs.store_dir, [Message(topic=REFUNDS, body=b"refund %d" % i, queue_id=i % 2)
                            for i in range(40)])
        dispatched_all(rs)
        rs.expected = {(r.queue_id, r.queue_offset): (m, r) for m, r in zip(orders, results)}
        yield rs


def read(spark, **options):
    return spark.read.format("rocketstore").options(**{k: str(v) for k, v in options.items()}).load()


def row_key(row) -> tuple:
    return (row.topic, row.queue_id, row.queue_offset)


def offsets_of(rows) -> set:
    return {(r.queue_id, r.queue_offset) for r in rows}


# ------------------------------------------------------------------------------ batch
def test_batch_read_returns_every_field_of_what_was_sent(spark, running):
    rows = read(spark, store=running.store_dir, topic=ORDERS).collect()
    assert len(rows) == N_ORDERS
    assert offsets_of(rows) == set(running.expected)
    for row in rows:
        m, r = running.expected[(row.queue_id, row.queue_offset)]
        assert row.topic == ORDERS
        assert (row.commit_log_offset, row.msg_id) == (r.commit_log_offset, r.msg_id)
        assert row.body == m.body
        assert row.tags == m.tags
        assert row.keys == list(m.keys)
        assert row.properties == m.properties
        assert int(row.born_timestamp.timestamp() * 1000 + 0.5) == m.born_timestamp
        assert int(row.store_timestamp.timestamp() * 1000 + 0.5) == r.store_timestamp


def test_remote_path_returns_the_same_rows_as_the_local_path(spark, running):
    local = read(spark, store=running.store_dir, topics=f"{ORDERS},{REFUNDS}").collect()
    remote = read(spark, endpoint=f"ipc://{running.store_dir}",
                  topics=f"{ORDERS},{REFUNDS}").collect()
    assert len(local) == N_ORDERS + 40
    assert sorted(local, key=row_key) == sorted(remote, key=row_key)


@pytest.mark.parametrize("path", ["local", "remote"])
def test_a_schema_naming_some_columns_reads_only_those(spark, running, path):
    where = {"store": running.store_dir} if path == "local" else \
        {"endpoint": f"ipc://{running.store_dir}"}
    df = (spark.read.format("rocketstore").schema("body binary, queue_offset long, queue_id int")
          .options(topic=ORDERS, **where).load())
    assert df.columns == ["body", "queue_offset", "queue_id"]
    rows = df.collect()
    assert len(rows) == N_ORDERS
    for row in rows:
        assert row.body == running.expected[(row.queue_id, row.queue_offset)][0].body


@pytest.mark.parametrize("path", ["local", "remote"])
def test_the_tags_option_reads_only_the_subscribed_tags(spark, running, path):
    """``tags`` = RocketMQ's subscription: only rows with one of its tags leave the
    source, also when the query's schema leaves the tags column out."""
    where = {"store": running.store_dir} if path == "local" else \
        {"endpoint": f"ipc://{running.store_dir}"}
    rows = read(spark, topic=ORDERS, tags="tag0 || tag2", **where).collect()
    wanted = {k for k, (m, _) in running.expected.items() if m.tags in ("tag0", "tag2")}
    assert offsets_of(rows) == wanted and len(rows) == len(wanted)
    df = (spark.read.format("rocketstore").schema("queue_offset long, queue_id int")
          .options(topic=ORDERS, tags="tag1", **where).load())
    assert df.columns == ["queue_offset", "queue_id"]
    assert offsets_of(df.collect()) == {k for k, (m, _) in running.expected.items()
                                        if m.tags == "tag1"}


@pytest.mark.parametrize("schema, words", [
    ("body binary, partition int", "'partition' is not one of"),
    ("queue_offset int", "'queue_offset' is long, not int"),
])
def test_a_schema_the_format_cannot_produce_is_named(spark, running, schema, words):
    with pytest.raises(Exception, match=words):
        spark.read.format("rocketstore").schema(schema).options(
            store=running.store_dir, topic=ORDERS).load().collect()


@pytest.mark.parametrize("path", ["local", "remote"])
def test_offsets_json_selects_exactly_the_rows_asked_for(spark, running, path):
    where = {"store": running.store_dir} if path == "local" else \
        {"endpoint": f"ipc://{running.store_dir}"}
    start = {ORDERS: {"0": 5, "1": -2, "3": 700}}
    end = {ORDERS: {"0": 10, "2": 3, "3": -1}}
    rows = read(spark, topic=ORDERS, startingOffsets=json.dumps(start),
                endingOffsets=json.dumps(end), **where).collect()
    per_queue = N_ORDERS // 4
    expected = ({(0, o) for o in range(5, 10)} | {(1, o) for o in range(per_queue)}
                | {(2, o) for o in range(3)} | {(3, o) for o in range(700, per_queue)})
    assert offsets_of(rows) == expected and len(rows) == len(expected)


def test_starting_timestamp_selects_exactly_the_messages_stored_since(spark, running):
    first = send(running.store_dir, [Message(topic=TIMED, body=b"early %d" % i, queue_id=i % 2)
                                     for i in range(50)])
    since = max(r.store_timestamp for r in first) + 1
    wait_past_ms(since)
    later = send(running.store_dir, [Message(topic=TIMED, body=b"late %d" % i, queue_id=i % 2)
                                     for i in range(30)])
    dispatched_all(running)
    rows = read(spark, store=running.store_dir, topic=TIMED, startingTimestamp=since).collect()
    assert sorted(r.msg_id for r in rows) == sorted(r.msg_id for r in later)
    remote = read(spark, endpoint=f"ipc://{running.store_dir}", topic=TIMED,
                  startingTimestamp=since).collect()
    assert sorted(r.msg_id for r in remote) == sorted(r.msg_id for r in later)


def test_topic_pattern_and_min_partitions(spark, running):
    df = read(spark, store=running.store_dir, topicPattern="Or.*|Ref.*", minPartitions=12)
    assert df.rdd.getNumPartitions() >= 12
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {ORDERS: N_ORDERS, REFUNDS: 40}


def test_an_unknown_topic_reads_nothing(spark, running):
    assert read(spark, store=running.store_dir, topic="NoSuchTopic").count() == 0


@pytest.mark.parametrize("options, words", [
    ({"topic": ORDERS, "startingOffsets": "latest"}, "cannot start at latest"),
    ({"topic": ORDERS, "endingOffsets": json.dumps({ORDERS: {"0": 10**6}})}, "ends at 750"),
    ({"topic": ORDERS, "startingOffset": "earliest"}, "unknown option"),
    ({"topicPattern": "(("}, "not a regular expression"),
])
def test_bad_options_fail_with_a_named_reason(spark, running, options, words):
    with pytest.raises(Exception, match=words):
        read(spark, store=running.store_dir, **options).collect()


def test_a_store_that_is_not_running_is_named(spark, tmp_path):
    with pytest.raises(Exception, match="no store at .*: the directory holds no store"):
        read(spark, store=str(tmp_path), topic=ORDERS).collect()


def test_an_endpoint_where_nothing_listens_is_named_not_timed_out(spark):
    """The reader's connection refused: named from the first request, where the
    driver waited the whole timeoutMs (30 s) and said the outcome was unknown."""
    port = free_ports(-2, 0)
    with pytest.raises(Exception, match=f"nothing listening at tcp://127.0.0.1:{port - 2}"):
        read(spark, endpoint=f"tcp://127.0.0.1:{port}", topic=ORDERS).collect()
    with pytest.raises(Exception, match=f"did you mean tcp://127.0.0.1:{port}"):
        read(spark, endpoint=f"127.0.0.1:{port}", topic=ORDERS).collect()


# ------------------------------------------------------------------------------ streaming
def run_available_now(spark, checkpoint: str, **options) -> list[list]:
    """One AvailableNow run of a streaming read; the rows of each micro-batch."""
    batches: list[list] = []

    def collect(df, batch_id):
        batches.append(df.collect())

    q = (spark.readStream.format("rocketstore").options(**{k: str(v) for k, v in options.items()})
         .load().writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return [b for b in batches if b]


@pytest.mark.parametrize("path", ["local", "remote"])
def test_streaming_reads_everything_then_exactly_the_new_messages_after_a_restart(
        spark, running, tmp_path, path):
    topic = f"Stream{path.title()}"
    where = {"store": running.store_dir} if path == "local" else \
        {"endpoint": f"ipc://{running.store_dir}"}
    first = send(running.store_dir, [Message(topic=topic, body=b"a%d" % i, queue_id=i % 3)
                                     for i in range(500)])
    dispatched_all(running)
    checkpoint = str(tmp_path / "checkpoint")
    group = f"spark-{path}"
    opts = dict(topic=topic, startingOffsets="earliest", group=group, **where)
    got = [r for b in run_available_now(spark, checkpoint, **opts) for r in b]
    assert sorted(r.msg_id for r in got) == sorted(r.msg_id for r in first)

    more = send(running.store_dir, [Message(topic=topic, body=b"b%d" % i, queue_id=i % 3)
                                    for i in range(300)])
    dispatched_all(running)
    again = [r for b in run_available_now(spark, checkpoint, **opts) for r in b]
    assert sorted(r.msg_id for r in again) == sorted(r.msg_id for r in more)

    # Spark commits a micro-batch's end to the source when the next one starts: the
    # group holds the first run's end, and status shows the second run's rows as lag.
    committed = read_offsets(StoreConfig(store_path_root_dir=running.store_dir).config_dir)
    assert committed[f"{topic}@{group}"] == {"0": 167, "1": 167, "2": 166}
    groups = store_status(running.store_dir)["consumer_groups"]
    assert groups[f"{topic}@{group}"]["lag"] == 300


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, running, tmp_path):
    topic = "Throttled"
    sent = send(running.store_dir, [Message(topic=topic, body=b"m%d" % i, queue_id=i % 4)
                                    for i in range(1000)])
    dispatched_all(running)
    batches = run_available_now(spark, str(tmp_path / "ck"), store=running.store_dir,
                                topic=topic, startingOffsets="earliest",
                                maxOffsetsPerTrigger=150)
    assert all(len(b) <= 150 for b in batches)
    assert len(batches) >= 7
    assert sorted(r.msg_id for b in batches for r in b) == sorted(r.msg_id for r in sent)


# ------------------------------------------------------------------------------ data loss
def test_expired_offsets_are_an_error_unless_failOnDataLoss_is_false(spark, tmp_path):
    with RunningStore(tmp_path, file_reserved_time=1) as rs:
        send(rs.store_dir, [Message(topic="Old", body=b"x" * 200, queue_id=0)
                            for _ in range(1500)])
        dispatched_all(rs)
        wait_for(lambda: rs.slot(Slot.FLUSHED) >= rs.slot(Slot.WRITTEN), 30, "flush")
        rs.expire_commit_log(keep=0)
        everything = json.dumps({"Old": {"0": 0}})
        with pytest.raises(Exception, match="expired"):
            read(spark, store=rs.store_dir, topic="Old", startingOffsets=everything).collect()
        with pytest.raises(Exception, match="expired"):
            read(spark, endpoint=f"ipc://{rs.store_dir}", topic="Old",
                 startingOffsets=everything).collect()
        rest = read(spark, store=rs.store_dir, topic="Old", startingOffsets=everything,
                    failOnDataLoss="false").collect()
        offsets = sorted(r.queue_offset for r in rest)
        assert 0 < len(offsets) < 1500
        assert offsets == list(range(1500 - len(offsets), 1500))


def test_a_tcp_endpoint_writes_and_reads_like_the_local_path(spark, tmp_path):
    port = free_ports(-2, 0)
    with RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port) as rs:
        endpoint = f"tcp://127.0.0.1:{port}"
        df = spark.createDataFrame([(b"tcp %d" % i, f"t{i % 2}", i % 3) for i in range(300)],
                                   "body binary, tags string, queue_id int")
        df.write.format("rocketstore").option("endpoint", endpoint).option("topic", "Tcp") \
            .mode("append").save()
        dispatched_all(rs)
        remote = read(spark, endpoint=endpoint, topic="Tcp").collect()
        local = read(spark, store=rs.store_dir, topic="Tcp").collect()
        assert len(remote) == 300
        assert sorted(remote, key=row_key) == sorted(local, key=row_key)
        assert sorted(r.body for r in remote) == sorted(b"tcp %d" % i for i in range(300))
