"""shm.doorbell: the writer's wake-ups of the dispatcher and the flusher, POSIX semaphores,
between real processes."""

from __future__ import annotations

import multiprocessing
import time

import posix_ipc
import pytest
from store_processes import RunningStore, wait_for

from rocketstore.client import Producer
from rocketstore.shm import doorbell
from rocketstore.shm.doorbell import Doorbell
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message


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


def test_a_running_store_has_its_doorbells_and_a_clean_stop_removes_them(tmp_path):
    with RunningStore(tmp_path) as store:
        for name in doorbell.NAMES:
            b = Doorbell.open(store.store_dir, name)
            assert b is not None and doorbell.semaphore_name(store.store_dir, name) != \
                doorbell.semaphore_name(str(tmp_path / "another"), name)
            b.close()
        assert len({doorbell.semaphore_name(store.store_dir, n) for n in doorbell.NAMES}) == 2
        assert store.stop() == 0
        assert all(Doorbell.open(store.store_dir, n) is None for n in doorbell.NAMES)


def test_the_writer_rings_the_flusher_when_enough_pages_are_dirty(tmp_path):
    """ASYNC_FLUSH with a flush interval of ten minutes: what wakes the flusher for an
    append that dirtied ``flush_commit_log_least_pages`` pages is its doorbell (the bus
    is not listened to where the supervisor made one); FLUSHED then follows at once."""
    with RunningStore(tmp_path, flush_interval_commit_log=600_000,
                      flush_commit_log_thorough_interval=600_000) as store:
        with Producer(store.store_dir) as p:
            results = p.send_batch([Message("Pages", bytes(600)) for _ in range(40)])
        assert all(r.ok for r in results)
        end = max(r.commit_log_offset for r in results) + 600
        wait_for(lambda: store.slot(Slot.FLUSHED) >= end, timeout=30,
                 what="FLUSHED past 24 KB sent, long before the flush interval")
