"""shm.doorbell: the writer's wake-up of the dispatcher, a POSIX semaphore, between real
processes."""

from __future__ import annotations

import multiprocessing
import time

import posix_ipc
import pytest
from store_processes import RunningStore

from rocketstore.shm import doorbell
from rocketstore.shm.doorbell import Doorbell


@pytest.fixture
def bell(tmp_path):
    doorbell.create(str(tmp_path))
    b = Doorbell.open(str(tmp_path))
    yield b
    b.close()
    doorbell.unlink(str(tmp_path))


def _wait_in_another_process(store_dir: str, timeout_ms: int, out) -> None:
    b = Doorbell.open(store_dir)
    out.put("waiting")
    t0 = time.monotonic()
    rang = b.wait(timeout_ms)
    out.put((rang, time.monotonic() - t0))
    b.close()


def test_a_ring_from_another_process_wakes_a_waiter_at_once(bell, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_wait_in_another_process, args=(str(tmp_path), 60_000, out))
    proc.start()
    try:
        assert out.get(timeout=60) == "waiting"
        time.sleep(0.2)                 # let it block in the wait (a ring before is kept)
        bell.ring()
        rang, waited = out.get(timeout=60)
        assert rang is True and waited < 30     # woken, not after its 60 s timeout
    finally:
        proc.join(30)


def test_rings_with_no_waiter_leave_one_wake_pending_and_the_wait_after_it_times_out(bell):
    for _ in range(1000):
        bell.ring()
    assert bell._sem.value == 1          # one pending wake covers every ring before it
    assert bell.wait(5_000) is True      # taken at once
    assert bell.wait(50) is False        # nothing more pending: the timeout
    assert bell._sem.value == 0


def test_a_ring_raced_past_the_count_check_is_taken_with_the_first(bell):
    bell._sem.release()
    bell._sem.release()                  # two posts (two rings that both read 0)
    assert bell.wait(1_000) is True
    assert bell._sem.value == 0 and bell.wait(20) is False


def test_there_is_no_doorbell_where_no_supervisor_made_one_and_create_replaces_a_stale_one(
        tmp_path):
    store = str(tmp_path)
    assert Doorbell.open(store) is None
    stale = posix_ipc.Semaphore(doorbell.semaphore_name(store), posix_ipc.O_CREX,
                                initial_value=7)     # a dead run's, with wakes left in it
    stale.close()
    doorbell.create(store)
    b = Doorbell.open(store)
    try:
        assert b._sem.value == 0
    finally:
        b.close()
        doorbell.unlink(store)
    assert Doorbell.open(store) is None
    doorbell.unlink(store)               # unlinking what is not there is no error


def test_a_running_store_has_its_doorbell_and_a_clean_stop_removes_it(tmp_path):
    with RunningStore(tmp_path) as store:
        b = Doorbell.open(store.store_dir)
        assert b is not None and doorbell.semaphore_name(store.store_dir) != \
            doorbell.semaphore_name(str(tmp_path / "another"))
        b.close()
        assert store.stop() == 0
        assert Doorbell.open(store.store_dir) is None
