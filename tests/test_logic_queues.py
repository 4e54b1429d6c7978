"""LogicQueues: the consume queue table the embedded store and the dispatcher share."""

from __future__ import annotations

import os

import pytest

from conftest import small_config
from rocketstore.storage.checkpoint import StoreCheckpoint, decode
from rocketstore.storage.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.logic_queues import LogicQueues, queue_dirs


@pytest.fixture
def queues(config):
    q = LogicQueues(config)
    yield q
    q.close()


def put(cq: ConsumeQueue, n: int, first_phy: int = 0) -> None:
    for i in range(n):
        cq.put_message_position_info(first_phy + 100 * i, 100, 7, i)


def test_find_creates_once_and_only_when_asked(queues):
    assert queues.find("TopicA", 1, create=False) is None
    cq = queues.find("TopicA", 1)
    assert queues.find("TopicA", 1) is cq is queues.find("TopicA", 1, create=False)
    assert (cq.topic, cq.queue_id) == ("TopicA", 1)
    assert queues.all() == [cq] and len(queues) == 1


def test_discover_lists_queue_directories_in_name_order_and_skips_others(config, queues):
    for topic, qid in [("TopicB", 0), ("TopicA", 10), ("TopicA", 2)]:
        put(queues.find(topic, qid), 1)
    queues.close()
    root = config.consume_queue_dir
    os.makedirs(os.path.join(root, "not a topic", "0"))
    os.makedirs(os.path.join(root, "TopicA", "notes"))
    with open(os.path.join(root, "stray-file"), "w"):
        pass
    again = LogicQueues(config)
    try:
        found = [(cq.topic, cq.queue_id) for cq in again.discover()]
        assert found == [("TopicA", 10), ("TopicA", 2), ("TopicB", 0)]   # names sort as text
        assert [(cq.topic, cq.queue_id) for cq in again.all()] == found
        assert list(queue_dirs(root)) == [(t, q, os.path.join(root, t, str(q))) for t, q in found]
        for cq in again.all():
            cq.load()
        assert again.recover() == 100
    finally:
        again.close()


def test_discover_without_a_consumequeue_directory_finds_nothing(queues):
    assert list(queues.discover()) == []
    assert queues.recover() == -1


def test_thorough_flush_of_the_embedded_store_writes_every_time(config, queues):
    put(queues.find("TopicA", 0), 3)
    index = IndexService(config.index_dir, config.max_hash_slot_num, config.max_index_num)
    index.build_index("TopicA", 0, 5_000, 0, "K0", None)
    cp = StoreCheckpoint(os.path.join(config.store_path_root_dir, "checkpoint"))
    try:
        queues.flush_logics(index, cp, 4_000, physic_ts=6_000)
        with open(cp.path, "rb") as f:
            assert decode(f.read()) == (6_000, 4_000, 5_000)
        mfq = queues.find("TopicA", 0).mapped_file_queue
        assert mfq.flushed_where == 3 * CQ_STORE_UNIT_SIZE
    finally:
        index.close()
        cp.close()


def test_thorough_flush_of_the_dispatcher_writes_only_its_times_and_never_lowers_them(
        config, queues):
    path = os.path.join(config.store_path_root_dir, "checkpoint")
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp = 9_000, 8_000
    cp.flush()
    cp.physic_msg_timestamp = 1       # the flusher's field: never written by the dispatcher
    put(queues.find("TopicA", 0), 2)
    try:
        queues.flush_logics(None, cp, 7_000)           # older than the checkpoint's
        with open(path, "rb") as f:
            assert decode(f.read()) == (9_000, 8_000, 0)
        queues.flush_logics(None, cp, 8_500)
        with open(path, "rb") as f:
            assert decode(f.read()) == (9_000, 8_500, 0)
        assert queues.find("TopicA", 0).mapped_file_queue.flushed_where == 40
    finally:
        cp.close()


@pytest.mark.parametrize("thorough_ms, thorough_runs", [(3_600_000, 0), (0, 1)])
def test_flush_on_interval_runs_the_thorough_flush_only_on_its_interval(
        tmp_path, thorough_ms, thorough_runs):
    cfg = small_config(tmp_path / "s", flush_interval_consume_queue=0,
                       flush_consume_queue_thorough_interval=thorough_ms)
    queues = LogicQueues(cfg)
    thorough = []
    try:
        put(queues.find("TopicA", 0), 1)
        queues.flush_on_interval(lambda: thorough.append(1))
        assert len(thorough) == thorough_runs
        # the least-pages pass leaves one unit unflushed; the thorough one is the caller's
        assert queues.find("TopicA", 0).mapped_file_queue.flushed_where == 0
    finally:
        queues.close()


def test_truncate_delete_and_destroy_reach_every_queue(config, queues):
    a, b = queues.find("TopicA", 0), queues.find("TopicB", 3)
    put(a, 4)
    put(b, 4, first_phy=50)
    queues.truncate_dirty(200)
    assert a.get_max_offset_in_queue() == 2 and b.get_max_offset_in_queue() == 2
    assert queues.delete_expired(10**9) == 0           # never a queue's last file
    queues.destroy()
    assert queues.all() == [] and not os.path.exists(a.store_path)
