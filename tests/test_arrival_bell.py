"""shm.arrival_bell: the dispatcher's wake-up of local consumers, a futex word per topic
bucket in shared memory, between real processes; and a running store's Consumer woken
through it, with the bus as the fallback, across a SIGKILLed dispatcher and a store
restart.

A waiting ``poll`` also looks at its queues every ``WAIT_SLICE_MS`` whatever wakes it;
the store tests raise that slice to a minute, so only a wake-up can end a wait before
their bounds. A test waits until the waiter is asleep in the kernel (its thread's
``/proc/.../syscall``) before it rings."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from store_processes import RunningStore, wait_for

from rocketstore.client import Consumer, Producer
from rocketstore.client import consumer as consumer_module
from rocketstore.client.consumer import _BellWakeups, _BusWakeups
from rocketstore.shm import arrival_bell, futex
from rocketstore.shm.arrival_bell import ArrivalBells
from rocketstore.storage import Message

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="no futex on this machine")

SYS_FUTEX = 202                         # x86-64, the only machine futex.AVAILABLE is on
SYS_POLLS = (7, 232, 271, 281)          # poll, epoll_wait, ppoll, epoll_pwait: the bus's


@pytest.fixture
def slow_slice(monkeypatch):
    """Only a wake-up ends a poll's wait within the tests' bounds."""
    monkeypatch.setattr(consumer_module, "WAIT_SLICE_MS", 60_000)


def _in_syscall(pid: int, numbers, tid: int | None = None) -> bool:
    """Whether process ``pid`` (its thread ``tid``, else any thread) sleeps in one of
    the system calls ``numbers``."""
    tids = [tid] if tid is not None else os.listdir(f"/proc/{pid}/task")
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/syscall") as f:
                if int(f.read().split()[0]) in numbers:
                    return True
        except (OSError, ValueError, IndexError):
            pass
    return False


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
        wait_for(lambda: _in_syscall(proc.pid, (SYS_FUTEX,)), 30, "the waiter asleep")
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


def _poll_in_thread(consumer: Consumer, timeout_ms: int, asleep_in=(SYS_FUTEX,)):
    """A ``poll`` in a thread, once that thread sleeps in the kernel's wait."""
    got: list = []
    tid: list = []

    def run():
        tid.append(threading.get_native_id())
        got.append((consumer.poll(32, timeout_ms), time.monotonic()))

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: tid and _in_syscall(os.getpid(), asleep_in, tid[0]), 30,
             "the poll asleep in its wait")
    return t, got


def _woken_by_a_send(consumer: Consumer, send, body: bytes, asleep_in=(SYS_FUTEX,)) -> None:
    """``consumer`` polls in a thread and sleeps; ``send(body)`` then ends its wait
    with that message, long before the poll's timeout (60 s) and its slice."""
    t, got = _poll_in_thread(consumer, 60_000, asleep_in)
    sent_at = time.monotonic()
    assert send(body)
    t.join(90)
    (msgs, at), = got
    assert [m.body for m in msgs] == [body]
    assert at - sent_at < 30


def test_a_store_makes_its_bells_and_removes_them_at_a_clean_stop(tmp_path):
    with RunningStore(tmp_path) as rs:
        segment = "/dev/shm" + arrival_bell.bells_name(rs.store_dir)
        assert os.path.exists(segment)
        assert rs.stop() == 0
    assert not os.path.exists(segment)


def test_a_waiting_consumer_is_woken_by_its_bell_and_after_a_killed_dispatcher(
        tmp_path, slow_slice):
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p, \
                Consumer(rs.store_dir, "bells", "Bells", wait_for_topic=True) as c:
            assert isinstance(c._wakeups, _BellWakeups)
            assert c.poll(32, 0) == []
            bells = ArrivalBells.open(rs.store_dir)
            seen = bells.bell("Bells")
            _woken_by_a_send(c, lambda body: p.send("Bells", body).ok, b"first")
            wait_for(lambda: bells.bell("Bells") != seen, 30, "the dispatcher's ring")
            seen = bells.bell("Bells")

            dispatcher = rs.child_pid("dispatcher")
            before = rs.restarts("dispatcher")
            os.kill(dispatcher, signal.SIGKILL)
            wait_for(lambda: rs.restarts("dispatcher") > before, 30, "a new dispatcher")
            wait_for(lambda: rs.child_pid("dispatcher") not in (0, dispatcher), 30,
                     "the new dispatcher's pid")
            _woken_by_a_send(c, lambda body: p.send("Bells", body).ok, b"second")
            wait_for(lambda: bells.bell("Bells") != seen, 30, "the successor's ring")
            bells.close()


def test_a_consumer_of_a_store_without_bells_waits_on_the_bus(tmp_path, slow_slice):
    with RunningStore(tmp_path) as rs:
        arrival_bell.unlink(rs.store_dir)           # as a store started before bells
        with Producer(rs.store_dir) as p, \
                Consumer(rs.store_dir, "bus", "OnTheBus", wait_for_topic=True) as c:
            assert isinstance(c._wakeups, _BusWakeups)
            assert c.poll(32, 0) == []
            _woken_by_a_send(
                c, lambda body: p.send_batch([Message(topic="OnTheBus", body=body)])[0].ok,
                b"bus", SYS_POLLS)


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
            assert seen[1] == bells.bell("Again")
            with Producer(rs.store_dir) as p:
                assert p.send("Again", b"after").ok
            wait_for(lambda: bells.bell("Again") != seen[1], 30, "the new dispatcher's ring")
            t0 = time.monotonic()
            assert c._wakeups.wait(seen, 60_000)        # at once: it rang since ``seen``
            assert time.monotonic() - t0 < 30
            assert [m.body for m in c.poll(10, 5000)] == [b"after"]
            bells.close()
        finally:
            c.close()


def test_a_message_dispatched_between_the_look_and_the_wait_ends_the_wait_at_once(
        tmp_path, slow_slice, monkeypatch):
    """The order that loses no wake-up: the bell is read before the queues are looked
    at. Here a message is sent, dispatched and rung for right after a look that found
    nothing, before the wait begins: the wait must not sleep through it."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p, \
                Consumer(rs.store_dir, "between", "Between", wait_for_topic=True) as c:
            assert c.poll(32, 0) == []
            bells = ArrivalBells.open(rs.store_dir)
            look = Consumer._pull_once
            sent = []

            def look_then_send(self, max_msgs):
                found = look(self, max_msgs)
                if not sent and not found:
                    before = bells.bell("Between")
                    sent.append(p.send("Between", b"between").ok)
                    wait_for(lambda: bells.bell("Between") != before, 30, "the ring")
                return found

            monkeypatch.setattr(Consumer, "_pull_once", look_then_send)
            t0 = time.monotonic()
            got = c.poll(32, 60_000)
            assert sent == [True] and [m.body for m in got] == [b"between"]
            assert time.monotonic() - t0 < 30       # not the slice, nor the timeout
            bells.close()


def test_close_wakes_a_poll_waiting_in_another_thread(tmp_path, slow_slice):
    with RunningStore(tmp_path) as rs:
        c = Consumer(rs.store_dir, "closing", "Closing", wait_for_topic=True)
        assert c.poll(32, 0) == []
        t, got = _poll_in_thread(c, 60_000)
        t0 = time.monotonic()
        c.close()
        t.join(60)
        assert time.monotonic() - t0 < 30
        (msgs, _), = got
        assert msgs == []


def test_a_closed_bells_wake_does_nothing(bells, tmp_path):
    reader = ArrivalBells.open(str(tmp_path))
    reader.close()
    reader.wake("Orders")                   # unmapped: no futex call at all


def test_a_second_close_of_a_consumer_does_nothing(tmp_path):
    with RunningStore(tmp_path) as rs:
        c = Consumer(rs.store_dir, "twice", "Twice", wait_for_topic=True)
        c.close()
        c.close()
