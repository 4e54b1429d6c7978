"""shm.arrival_bell: the dispatcher's wake-up of local consumers, a futex word per topic
bucket in shared memory, between real processes; and a running store's Consumer woken
through it, with the bus as the fallback, across a SIGKILLed dispatcher."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from store_processes import RunningStore, wait_for

from rocketstore.client import Consumer, Producer
from rocketstore.client.consumer import _BellWakeups, _BusWakeups
from rocketstore.shm import arrival_bell, futex
from rocketstore.shm.arrival_bell import ArrivalBells
from rocketstore.storage import Message

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="no futex on this machine")


@pytest.fixture
def bells(tmp_path):
    arrival_bell.create(str(tmp_path))
    ringer = ArrivalBells.open(str(tmp_path), writable=True)
    yield ringer
    ringer.close()
    arrival_bell.unlink(str(tmp_path))


def _wait_in_another_process(store_dir: str, topic: str, timeout_ms: int, out) -> None:
    b = ArrivalBells.open(store_dir)
    seen = b.bell(topic)
    out.put("waiting")
    t0 = time.monotonic()
    rang = b.wait(topic, seen, timeout_ms)
    out.put((rang, time.monotonic() - t0))
    b.close()


def _waiter(store_dir: str, topic: str, timeout_ms: int):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_wait_in_another_process,
                       args=(store_dir, topic, timeout_ms, out))
    proc.start()
    assert out.get(timeout=60) == "waiting"
    return proc, out


def test_a_ring_of_its_topic_wakes_a_waiter_in_another_process_at_once(bells, tmp_path):
    proc, out = _waiter(str(tmp_path), "Orders", 60_000)
    try:
        time.sleep(0.2)          # let it reach the kernel's wait (a ring before is fine too)
        bells.ring(["Orders"])
        rang, waited = out.get(timeout=60)
        assert rang and waited < 30      # woken, long before its 60 s timeout
    finally:
        proc.join(60)
    assert proc.exitcode == 0


def test_a_wait_after_a_ring_it_did_not_see_returns_at_once(bells, tmp_path):
    reader = ArrivalBells.open(str(tmp_path))
    try:
        seen = reader.bell("Orders")
        bells.ring(["Orders"])            # between the look at the queues and the wait
        t0 = time.monotonic()
        assert reader.wait("Orders", seen, 60_000)
        assert time.monotonic() - t0 < 30
        assert reader.bell("Orders") == (seen + 1) & 0xFFFF_FFFF
    finally:
        reader.close()


def test_a_wait_times_out_when_only_other_buckets_ring(bells, tmp_path):
    other = next(t for t in (f"T{i}" for i in range(1000))
                 if arrival_bell.bucket(t) != arrival_bell.bucket("Orders"))
    reader = ArrivalBells.open(str(tmp_path))
    try:
        seen = reader.bell("Orders")
        bells.ring([other])
        t0 = time.monotonic()
        assert not reader.wait("Orders", seen, 300)
        assert time.monotonic() - t0 >= 0.2
    finally:
        reader.close()


def test_ringing_a_topic_named_twice_moves_its_bell_once(bells, tmp_path):
    reader = ArrivalBells.open(str(tmp_path))
    try:
        before = reader.bell("Orders")
        bells.ring(["Orders", "Orders"])
        assert reader.bell("Orders") == before + 1
    finally:
        reader.close()


def test_no_bells_where_no_supervisor_made_them(tmp_path):
    assert ArrivalBells.open(str(tmp_path)) is None
    assert ArrivalBells.open(str(tmp_path), writable=True) is None


def _poll_in_thread(consumer: Consumer, timeout_ms: int):
    got: list = []
    t = threading.Thread(target=lambda: got.append((consumer.poll(32, timeout_ms),
                                                   time.monotonic())))
    t.start()
    return t, got


def test_a_store_makes_its_bells_and_removes_them_at_a_clean_stop(tmp_path):
    with RunningStore(tmp_path) as rs:
        segment = "/dev/shm" + arrival_bell.bells_name(rs.store_dir)
        assert os.path.exists(segment)
        assert rs.stop() == 0
    assert not os.path.exists(segment)


def test_a_waiting_consumer_is_woken_by_its_bell_and_after_a_killed_dispatcher(tmp_path):
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p, \
                Consumer(rs.store_dir, "bells", "Bells", wait_for_topic=True) as c:
            assert isinstance(c._wakeups, _BellWakeups)
            assert c.poll(32, 0) == []
            bells = ArrivalBells.open(rs.store_dir)
            seen = bells.bell("Bells")
            t, got = _poll_in_thread(c, 60_000)
            time.sleep(0.3)                         # the consumer waits on its bell
            sent_at = time.monotonic()
            assert p.send("Bells", b"first").ok
            t.join(60)
            (msgs, at), = got
            assert [m.body for m in msgs] == [b"first"]
            assert at - sent_at < 30            # woken, long before its 60 s timeout
            wait_for(lambda: bells.bell("Bells") != seen, 30, "the dispatcher's ring")
            seen = bells.bell("Bells")

            dispatcher = rs.child_pid("dispatcher")
            before = rs.restarts("dispatcher")
            os.kill(dispatcher, signal.SIGKILL)
            wait_for(lambda: rs.restarts("dispatcher") > before, 30, "a new dispatcher")
            wait_for(lambda: rs.child_pid("dispatcher") not in (0, dispatcher), 30,
                     "the new dispatcher's pid")
            t, got = _poll_in_thread(c, 60_000)
            time.sleep(0.3)
            sent_at = time.monotonic()
            assert p.send("Bells", b"second").ok
            t.join(90)
            (msgs, at), = got
            assert [m.body for m in msgs] == [b"second"]
            assert at - sent_at < 45
            wait_for(lambda: bells.bell("Bells") != seen, 30, "the successor's ring")
            bells.close()


def test_a_consumer_of_a_store_without_bells_waits_on_the_bus(tmp_path):
    with RunningStore(tmp_path) as rs:
        arrival_bell.unlink(rs.store_dir)           # as a store started before bells
        with Producer(rs.store_dir) as p, \
                Consumer(rs.store_dir, "bus", "OnTheBus", wait_for_topic=True) as c:
            assert isinstance(c._wakeups, _BusWakeups)
            assert c.poll(32, 0) == []
            t, got = _poll_in_thread(c, 60_000)
            time.sleep(0.3)
            sent_at = time.monotonic()
            assert p.send_batch([Message(topic="OnTheBus", body=b"bus")])[0].ok
            t.join(60)
            (msgs, at), = got
            assert [m.body for m in msgs] == [b"bus"]
            assert at - sent_at < 30


def test_a_consumer_that_outlives_a_store_restart_waits_on_the_new_bells(tmp_path):
    rs = RunningStore(tmp_path)
    with rs:
        with Producer(rs.store_dir) as p:
            assert p.send("Again", b"before").ok
        c = Consumer(rs.store_dir, "again", "Again", rebalance_interval_ms=100)
        try:
            assert [m.body for m in c.poll(10, 5000)] == [b"before"]
            old = c._wakeups._bells
            assert rs.stop() == 0, rs.log()
            rs.start()
            wait_for(lambda: c.poll(10, 0) == [] and c._wakeups._bells is not old, 30,
                     "the consumer's look at the restarted store")
            bells = ArrivalBells.open(rs.store_dir)
            seen = c._wakeups.seen()
            assert seen == bells.bell("Again")
            with Producer(rs.store_dir) as p:
                assert p.send("Again", b"after").ok
            wait_for(lambda: bells.bell("Again") != seen, 30, "the new dispatcher's ring")
            t0 = time.monotonic()
            assert c._wakeups.wait(seen, 60_000)        # at once: it rang since ``seen``
            assert time.monotonic() - t0 < 30
            assert [m.body for m in c.poll(10, 5000)] == [b"after"]
            bells.close()
        finally:
            c.close()
