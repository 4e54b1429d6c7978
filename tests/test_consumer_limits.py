"""How much a local Consumer's poll returns: up to the ``max_msgs`` asked for, from one
queue or many, bounded by its ``max_poll_bytes`` (not by a broker's per-pull limits of
32 messages and 256 KiB, which the reader socket's PULL keeps)."""

from __future__ import annotations

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
