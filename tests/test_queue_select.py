"""A message whose ``queue_id`` is left as None (``Message``'s default) goes where the
store picks: round robin per topic over ``default_topic_queue_nums`` queues, as
RocketMQ's producer spreads a topic (``MQFaultStrategy.selectOneMessageQueue``), and
an explicit queue still wins. Against a real store (``rocketstore up``): the writer
picks for every producer at once, so producers sending together still spread evenly.
The embedded store's pick is in ``test_message_store``, the Spark sink's in
``test_spark_sink``."""

from __future__ import annotations

import collections
import threading

import pytest

from rocketstore import Consumer, Message, Producer
from rocketstore.shm.positions import Slot
from store_processes import RunningStore, cli, wait_for

QUEUES = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with RunningStore(tmp_path_factory.mktemp("queue-select"),
                      default_topic_queue_nums=QUEUES) as rs:
        yield rs


def test_one_at_a_time_sends_go_round_the_queues(store):
    with Producer(store.store_dir) as p:
        got = [p.send("OneByOne", b"m%d" % i).queue_id for i in range(2 * QUEUES)]
    assert got == list(range(QUEUES)) * 2


def test_a_batch_of_messages_spreads_and_an_explicit_queue_wins(store):
    with Producer(store.store_dir) as p:
        batch = p.send_batch([Message("Batch", b"b%d" % i) for i in range(QUEUES + 1)])
        mixed = p.send_async([Message("Batch", b"x", queue_id=QUEUES - 1),
                              Message("Batch", b"y")]).result()
        one = p.send("Batch", b"z", queue_id=0)
    assert [r.queue_id for r in batch] == list(range(QUEUES)) + [0]
    assert [r.queue_id for r in mixed] == [QUEUES - 1, 1]   # the explicit one took no turn
    assert one.queue_id == 0


def test_producers_sending_together_spread_evenly_and_consumers_read_every_queue(store):
    per_producer, producers = 3 * QUEUES, 4
    results: list = []

    def send(k: int) -> None:
        with Producer(store.store_dir) as p:
            results.extend(p.send("Together", b"%d-%d" % (k, i)) for i in range(per_producer))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == per_producer * producers and all(r.ok for r in results)
    counts = collections.Counter(r.queue_id for r in results)
    assert counts == {q: per_producer * producers // QUEUES for q in range(QUEUES)}
    wait_for(lambda: store.slot(Slot.DISPATCHED) >= store.slot(Slot.WRITTEN), 30, "dispatch")
    with Consumer(store.store_dir, "together", "Together") as c:
        got: list = []
        while len(got) < len(results):
            polled = c.poll(512, timeout_ms=5000)
            assert polled, f"{len(got)} of {len(results)} read"
            got += polled
    assert collections.Counter(m.queue_id for m in got) == counts


def test_the_send_command_spreads_its_messages(store):
    out = cli("send", "--config", store.config_path, "--topic", "Cli", "--body", "hello",
              "--count", str(QUEUES))
    assert out.returncode == 0, out.stderr
    assert [line.split()[2].split("#")[0] for line in out.stdout.splitlines()] == \
        [f"Cli/{q}" for q in range(QUEUES)]
