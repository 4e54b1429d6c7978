"""``pipeline.access`` without Spark: the local path (mapped files) and the remote path
(FETCH through the reader) against a real running store, where a batch's bytes, not its
row count, must bound what is copied."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rocketstore.spark.access import BATCH_MAX_BYTES, LocalStore, RemoteStore
from rocketstore.spark.offsets import QueueRange
from rocketstore.client import Producer
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message
from store_processes import RunningStore, wait_for

BIG = "Big"
BODY = 300 * 1024
COUNT = 120    # 36 MiB back to back in one queue and one CommitLog file


def body(i: int) -> bytes:
    return (b"%06d" % i) * (BODY // 6)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with RunningStore(tmp_path_factory.mktemp("access"), mapped_file_size_commit_log=64 << 20,
                      max_message_size=1 << 20) as rs:
        with Producer(rs.store_dir) as p:
            for k in range(0, COUNT, 10):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic=BIG, body=body(i), queue_id=0) for i in range(k, k + 10)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) >= rs.slot(Slot.WRITTEN), 30, "dispatch")
        yield rs


@pytest.mark.parametrize("path", ["local", "remote"])
def test_large_records_come_in_batches_bounded_by_bytes(running, path):
    store = LocalStore(running.store_dir) if path == "local" else \
        RemoteStore(f"ipc://{running.store_dir}")
    with store:
        batches = list(store.read(QueueRange(BIG, 0, 0, COUNT)))
    assert len(batches) > 2
    assert all(b.nbytes <= BATCH_MAX_BYTES + 2 * BODY for b in batches)
    rows = pa.Table.from_batches(batches)
    assert rows.column("queue_offset").to_pylist() == list(range(COUNT))
    assert rows.column("body").to_pylist() == [body(i) for i in range(COUNT)]


@pytest.mark.parametrize("path", ["local", "remote"])
def test_columns_asked_for_come_alone(running, path):
    store = LocalStore(running.store_dir) if path == "local" else \
        RemoteStore(f"ipc://{running.store_dir}")
    with store:
        batches = list(store.read(QueueRange(BIG, 0, 3, 9), columns=("queue_offset",)))
    assert [b.schema.names for b in batches] == [["queue_offset"]] * len(batches)
    assert pa.Table.from_batches(batches).column(0).to_pylist() == list(range(3, 9))


def test_a_remote_read_asks_ahead_and_a_read_stopped_early_leaves_no_answer_behind(running):
    """Each found reply's successor is asked for before the reply is decoded: a read
    stopped after its first batch has one request out, whose answer is dropped, so the
    same store's next reads get their own answers and nothing is kept for it."""
    with RemoteStore(f"ipc://{running.store_dir}") as store:
        dealer = store.client._dealer
        reading = store.read(QueueRange(BIG, 0, 0, COUNT), batch_rows=10)
        first = next(reading)
        assert first.column("queue_offset").to_pylist() == list(range(10))
        assert len(dealer._pending) == 1          # the next ten, asked for ahead
        reading.close()
        assert not dealer._pending and not dealer.replies
        again = pa.Table.from_batches(list(store.read(QueueRange(BIG, 0, 5, 45), batch_rows=10)))
        assert again.column("queue_offset").to_pylist() == list(range(5, 45))
        assert not dealer._pending and not dealer.replies


def test_every_topic_is_the_same_set_on_both_paths(running):
    """Bounds of every topic (``topicPattern``): the local path listed the store's own
    SCHEDULE_TOPIC_XXXX too, where delayed messages wait (read now, and again when due);
    the reader never did."""
    with Producer(running.store_dir) as p:
        assert p.send("Later", b"in a minute", delay_level=5).ok
    wait_for(lambda: running.slot(Slot.DISPATCHED) >= running.slot(Slot.WRITTEN), 30,
             "dispatch")
    with LocalStore(running.store_dir) as local, \
            RemoteStore(f"ipc://{running.store_dir}") as remote:
        mine = {b.topic for b in local.bounds()}
        theirs = {b.topic for b in remote.bounds()}
    assert mine == theirs == {BIG}
