"""How much a local Consumer's poll returns: up to the ``max_msgs`` asked for, from one
queue or many, bounded by its ``max_poll_bytes`` (not by a broker's per-pull limits of
32 messages and 256 KiB, which the reader socket's PULL keeps)."""

from __future__ import annotations

import collections
import time

import pytest

from rocketstore import Consumer, Message, Producer, ReaderClient
from rocketstore.shm.positions import Slot
from store_processes import RunningStore, wait_for

COUNT = 700


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with RunningStore(tmp_path_factory.mktemp("limits")) as s:
        with Producer(s.store_dir) as p:
            for first in range(0, COUNT, 100):
                results = p.send_async([Message("OneQueue", b"m%04d" % i + b"." * 1000,
                                                queue_id=0)
                                        for i in range(first, first + 100)]).result()
                assert all(r.ok for r in results)
            spread = p.send_batch([Message("Spread", b"s%04d" % i) for i in range(COUNT)])
            assert all(r.ok for r in spread)
        wait_for(lambda: s.slot(Slot.DISPATCHED) == s.slot(Slot.WRITTEN), what="dispatch")
        yield s


def _first_poll(store, **kwargs) -> list:
    with Consumer(store.store_dir, f"g{time.monotonic_ns()}", "OneQueue", **kwargs) as c:
        return c.poll(512, timeout_ms=2000)


def test_a_default_poll_returns_what_it_asked_for_from_one_queue(store):
    got = _first_poll(store)
    assert len(got) == 512                       # not the broker's 32
    assert [m.queue_offset for m in got] == list(range(512))
    assert got[-1].body.startswith(b"m0511")


def test_a_default_poll_fills_from_many_queues(store):
    """Messages left to the store are spread over the topic's 8 queues (about 88 each):
    a poll reads one queue after another, each as far as it goes, until it has what it
    asked for; not 32 from each (256)."""
    with Consumer(store.store_dir, f"g{time.monotonic_ns()}", "Spread") as c:
        got = c.poll(512, timeout_ms=2000)
    assert len(got) == 512
    by_queue = collections.defaultdict(list)
    for m in got:
        by_queue[m.queue_id].append(m.queue_offset)
    assert len(by_queue) > 5 and max(map(len, by_queue.values())) > 32
    assert all(offsets == list(range(len(offsets))) for offsets in by_queue.values())


def test_max_poll_bytes_bounds_a_poll_and_one_record_still_comes(store):
    size = _first_poll(store)[0].store_size
    got = _first_poll(store, max_poll_bytes=10 * size)
    assert len(got) == 10
    got = _first_poll(store, max_poll_bytes=1)
    assert len(got) == 1
    with pytest.raises(ValueError):
        Consumer(store.store_dir, "g-bad", "OneQueue", max_poll_bytes=0)


def test_the_reader_socket_keeps_the_brokers_pull_limits(store):
    with ReaderClient(store.store_dir) as reader:
        reply = reader.pull("OneQueue", 0, 0, 512)
    assert len(reply.messages) == 32             # max_transfer_count_on_message_in_memory


def test_a_trickle_is_read_from_the_queue_it_came_to(store):
    """One message at a time into one queue of eight or another, and messages of another
    topic between them (DISPATCHED moves, nothing of this topic came): each poll returns
    the one message that came, from its queue at its next offset, and nothing else. A
    queue read to its end is looked at by its next unit alone, and read once it came."""
    topic = "Trickle"
    with Producer(store.store_dir) as p:
        assert all(r.ok for r in p.send_batch([Message(topic, b"q%d" % q, queue_id=q)
                                               for q in range(8)]))
        dispatched = lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN)  # noqa: E731
        wait_for(dispatched, what="dispatch")
        with Consumer(store.store_dir, f"g{time.monotonic_ns()}", topic) as c:
            got = c.poll(8, timeout_ms=5000)
            assert sorted((m.queue_id, m.queue_offset) for m in got) == \
                [(q, 0) for q in range(8)]
            following = dict.fromkeys(range(8), 1)
            for i, q in enumerate([3, 3, 0, 7, 3, 5, 0, 1, 1, 6, 3]):
                assert p.send("TrickleOther", b"x").ok
                wait_for(dispatched, what="dispatch")
                assert c.poll(8, timeout_ms=0) == []
                assert p.send(topic, b"t%d" % i, queue_id=q).ok
                got = c.poll(8, timeout_ms=5000)
                assert [(m.queue_id, m.queue_offset, m.body) for m in got] == \
                    [(q, following[q], b"t%d" % i)]
                following[q] += 1
