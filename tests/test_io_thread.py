"""The writer's ZeroMQ I/O thread under SCHED_BATCH while small requests come in
together (procs.io_thread): the policy read back from the kernel, of a real context's
thread here and of a running store's writer."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import zmq
from store_processes import RunningStore

from rocketstore.client import Producer
from rocketstore.procs.io_thread import HOLD_S, SMALL_REQUEST, IoThreadPolicy, io_thread_ids
from rocketstore.storage import Message


@pytest.fixture
def io_threads():
    """A ZeroMQ context of this process with a socket (its I/O thread started, and
    named); the thread ids; SCHED_OTHER again afterwards."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    deadline = time.monotonic() + 5
    while not (tids := io_thread_ids()) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield tids
    for tid in tids:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    sock.close(0)
    ctx.term()


def policies(tids: list[int]) -> set[int]:
    return {os.sched_getscheduler(tid) for tid in tids}


def test_the_io_threads_are_found_by_the_name_libzmq_gives_them(io_threads):
    assert io_threads
    for tid in io_threads:
        with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
            assert f.read().startswith("ZMQbg/IO/")
    assert os.getpid() not in io_threads


def test_batch_from_a_drain_of_several_small_requests_other_after_a_quiet_hold(io_threads):
    policy = IoThreadPolicy(io_threads)
    policy.drained(1, 1, 100.0)                      # one request: nothing to batch
    assert policies(io_threads) == {os.SCHED_OTHER} and not policy.batching
    policy.drained(3, 3, 100.0)
    assert policies(io_threads) == {os.SCHED_BATCH} and policy.batching
    policy.drained(1, 1, 100.0 + HOLD_S / 2)         # within the hold: kept
    assert policies(io_threads) == {os.SCHED_BATCH}
    policy.drained(2, 2, 100.0 + HOLD_S * 0.9)       # several again: the hold starts anew
    policy.drained(1, 1, 100.0 + HOLD_S * 1.5)
    assert policies(io_threads) == {os.SCHED_BATCH}
    policy.drained(1, 1, 100.0 + HOLD_S * 2)         # a drain of one after the hold
    assert policies(io_threads) == {os.SCHED_OTHER} and not policy.batching


def test_large_frames_together_leave_the_policy_as_it_is(io_threads):
    policy = IoThreadPolicy(io_threads)
    policy.drained(8, 8 * 512, 100.0)                # an ingest's frames of 512
    policy.drained(2, 2 * SMALL_REQUEST + 1, 100.0)
    assert policies(io_threads) == {os.SCHED_OTHER} and not policy.batching
    policy.drained(2, 2 * SMALL_REQUEST, 100.0)
    assert policies(io_threads) == {os.SCHED_BATCH}


def a_thread_until(done: threading.Event) -> tuple[threading.Thread, int]:
    """A thread of this process that runs until ``done``; it and its native id."""
    started = threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), done.wait()))
    thread.start()
    started.wait()
    return thread, thread.native_id


def test_a_thread_the_kernel_will_not_change_is_said_once_and_left(caplog):
    done = threading.Event()
    thread, tid = a_thread_until(done)
    policy = IoThreadPolicy([tid])
    done.set()
    thread.join()
    deadline = time.monotonic() + 10             # the OS thread ends a moment after join
    while os.path.exists(f"/proc/{os.getpid()}/task/{tid}"):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    with caplog.at_level(logging.WARNING, logger="rocketstore.procs.io_thread"):
        policy.drained(4, 4, 100.0)
        policy.drained(4, 4, 101.0)
    assert not policy.batching and policy.tids == []
    assert len([r for r in caplog.records if "keeps its scheduling policy" in r.message]) == 1


def test_a_thread_an_operator_gave_another_policy_is_left_alone():
    done = threading.Event()
    thread, tid = a_thread_until(done)
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        policy = IoThreadPolicy([tid])
        policy.drained(4, 4, 100.0)
        policy.drained(1, 1, 101.0)
        assert policy.tids == [] and os.sched_getscheduler(tid) == os.SCHED_IDLE
    finally:
        done.set()
        thread.join()


def writer_io_policies(store: RunningStore) -> set[int]:
    tids = io_thread_ids(store.child_pid("writer"))
    assert tids, "the writer's ZeroMQ I/O thread is not found by its name"
    return policies(tids)


def wait_for_policy(store: RunningStore, wanted: int, load, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while writer_io_policies(store) != {wanted}:
        assert time.monotonic() < deadline, f"the writer's I/O thread never became {wanted}"
        load()


def test_a_store_s_writer_batches_many_sends_in_flight_and_not_one_at_a_time(tmp_path):
    store = RunningStore(tmp_path).start()
    try:
        with Producer(store.store_dir) as p:
            def many_in_flight():
                pending = [p.send_async([Message("Io", b"x" * 100)]) for _ in range(64)]
                assert all(r.ok for h in pending for r in h.result())

            def one_at_a_time():
                for _ in range(50):
                    assert p.send("Io", b"y" * 100).ok
                time.sleep(HOLD_S)
            wait_for_policy(store, os.SCHED_BATCH, many_in_flight)
            wait_for_policy(store, os.SCHED_OTHER, one_at_a_time)
    finally:
        store.stop()


def test_writer_io_batching_off_keeps_the_writer_s_io_thread_as_it_was(tmp_path):
    store = RunningStore(tmp_path, writer_io_batching=False).start()
    try:
        with Producer(store.store_dir) as p:
            for _ in range(5):
                pending = [p.send_async([Message("Io", b"x" * 100)]) for _ in range(64)]
                assert all(r.ok for h in pending for r in h.result())
        assert writer_io_policies(store) == {os.SCHED_OTHER}
    finally:
        store.stop()
