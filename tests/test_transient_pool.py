"""The TransientStorePool in a real store: the writer appends into shared-memory buffers,
the flusher commits them into the files; readers never pass COMMITTED; a SIGKILL of the
writer, of the flusher or of the whole store loses nothing acknowledged; a pool that runs
out answers as RocketMQ does (``fast_fail_if_no_buffer_in_store_pool``)."""

from __future__ import annotations

import os
import signal
import time

import posix_ipc
import pytest

from conftest import small_config
from rocketstore.client import Consumer, Producer
from rocketstore.shm.positions import Slot
from rocketstore.shm.transient_pool import TransientStorePool, buffer_name
from rocketstore.storage import Message, MessageStore
from rocketstore.storage.dispatch_batch import walk
from rocketstore.storage.errors import StoreConfigError
from store_processes import ROOT, RunningStore, cli, wait_for

POOL = dict(transient_store_pool_enable=True, transient_store_pool_size=3,
            commit_interval_commit_log=20, commit_commit_log_thorough_interval=20)


def _messages(topic: str, first: int, n: int) -> list[Message]:
    return [Message(topic=topic, body=b"pool-%06d-" % i + bytes(200), tags="T",
                    keys=[f"k{i}"], queue_id=i % 2) for i in range(first, first + n)]


def _send(store_dir: str, topic: str, first: int, n: int, batch: int = 25) -> list[int]:
    acked = []
    with Producer(store_dir) as p:
        for start in range(first, first + n, batch):
            for i, r in zip(range(start, start + batch),
                            p.send_batch(_messages(topic, start, min(batch, first + n - start)))):
                if r.status.name == "PUT_OK":
                    acked.append(i)
    return acked


def _read_all(store_dir: str, topic: str, expected: int) -> list[int]:
    seen = []
    with Consumer(store_dir, f"g{time.monotonic_ns()}", topic) as c:
        deadline = time.monotonic() + 30
        while len(seen) < expected and time.monotonic() < deadline:
            seen += [int(m.body[5:11]) for m in c.poll(256, timeout_ms=200)]
    return seen


def _check(store: RunningStore) -> None:
    r = cli("check", "--config", store.config_path)
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr


def test_messages_pass_through_the_pool_across_many_files(tmp_path):
    with RunningStore(tmp_path, **POOL) as store:
        acked = _send(store.store_dir, "Pooled", 0, 1500)       # ~340 KB: 6 files of 64 KiB
        assert len(acked) == 1500
        assert sorted(_read_all(store.store_dir, "Pooled", 1500)) == acked
        assert store.slot(Slot.TRANSIENT_POOL) == 3
        wait_for(lambda: store.slot(Slot.COMMITTED) == store.slot(Slot.WRITTEN),
                 what="everything committed")
        assert store.stop() == 0
    _check(store)
    commit_dir = os.path.join(store.store_dir, "commitlog")
    for name in sorted(os.listdir(commit_dir))[:-1]:    # buffers reused: the fillers zero
        data = open(os.path.join(commit_dir, name), "rb").read()
        starts, end = walk(data, 0, len(data), 10_000)
        assert data[end + 8:] == bytes(len(data) - end - 8), name
    for i in range(3):      # a clean stop removes the buffers
        with pytest.raises(posix_ipc.ExistentialError):
            posix_ipc.SharedMemory(buffer_name(store.store_dir, i))


def test_readers_never_pass_what_is_committed(tmp_path):
    """With the flusher (which commits the pool into the files) stopped by SIGSTOP, five
    messages are written but not committed: after the dispatcher has turned its loop
    since, DISPATCHED is still within COMMITTED and the file holds zeros past it; once
    the flusher goes on, all six are dispatched and read."""
    with RunningStore(tmp_path, **POOL) as store:
        _send(store.store_dir, "Slow", 0, 1)
        written0 = store.slot(Slot.WRITTEN)
        wait_for(lambda: store.slot(Slot.COMMITTED) == written0, what="first commit")
        wait_for(lambda: store.slot(Slot.DISPATCHED) == written0, what="first dispatch")
        flusher = store.child_pid("flusher")
        os.kill(flusher, signal.SIGSTOP)
        try:
            assert len(_send(store.store_dir, "Slow", 1, 5, batch=5)) == 5
            _dispatcher_turned(store)
            written, committed = store.slot(Slot.WRITTEN), store.slot(Slot.COMMITTED)
            assert committed == written0 < written
            assert store.slot(Slot.DISPATCHED) <= committed
            with open(os.path.join(store.store_dir, "commitlog", "0" * 20), "rb") as f:
                assert f.read()[committed:written].count(0) == written - committed
        finally:
            os.kill(flusher, signal.SIGCONT)
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="commit, then dispatch")
        assert sorted(_read_all(store.store_dir, "Slow", 6)) == list(range(6))


def _dispatcher_turned(store: RunningStore) -> None:
    """Wait until the dispatcher has begun and ended a whole loop turn from now: its
    heartbeat (written after each turn) moves twice."""
    for _ in range(2):
        beat = store.heartbeat_ms("dispatcher")
        wait_for(lambda: store.heartbeat_ms("dispatcher") > beat, what="a dispatcher turn")


@pytest.mark.parametrize("victim", ["writer", "flusher"])
def test_a_killed_writer_or_flusher_loses_nothing_acknowledged(tmp_path, victim):
    with RunningStore(tmp_path, **POOL) as store:
        acked = _send(store.store_dir, "Kill", 0, 400)
        before = store.restarts(victim)
        os.kill(store.child_pid(victim), signal.SIGKILL)
        acked += _send_until_restarted(store, victim, before, first=400)
        assert sorted(_read_all(store.store_dir, "Kill", len(acked))) == sorted(acked)
        assert store.stop() == 0
    _check(store)


def _send_until_restarted(store: RunningStore, victim: str, before: int, first: int) -> list[int]:
    acked, i = [], first
    deadline = time.monotonic() + 30
    while store.restarts(victim) == before or not acked:
        assert time.monotonic() < deadline, f"{victim} never came back"
        try:
            acked += _send(store.store_dir, "Kill", i, 50)
        except Exception:      # noqa: BLE001 - the writer is away: unacknowledged
            pass
        i += 50
    return acked


def test_a_store_killed_whole_commits_the_pool_at_the_next_start(tmp_path):
    held = dict(POOL, commit_interval_commit_log=60_000,
                commit_commit_log_thorough_interval=60_000, commit_commit_log_least_pages=10_000)
    store = RunningStore(tmp_path, **held).start()
    try:
        acked = _send(store.store_dir, "Whole", 0, 300)
        written, committed = store.slot(Slot.WRITTEN), store.slot(Slot.COMMITTED)
        assert committed < written, "the commit step ran: nothing would be held in the pool"
    finally:
        store.kill_all()                                   # supervisor and all: SIGKILL
    again = RunningStore(tmp_path, **POOL).start()
    try:
        assert again.slot(Slot.WRITTEN) == written
        assert "left in the transient store pool by the last run" in again.log()
        assert sorted(_read_all(again.store_dir, "Whole", len(acked))) == acked
        assert again.stop() == 0
    finally:
        again.kill_all()
    _check(again)


def test_fast_fail_when_no_buffer_is_free(tmp_path):
    cfg = dict(POOL, transient_store_pool_size=2, fast_fail_if_no_buffer_in_store_pool=True)
    with RunningStore(tmp_path, **cfg) as store:
        flusher = store.child_pid("flusher")
        os.kill(flusher, signal.SIGSTOP)                   # nothing is committed any more
        try:
            statuses = []
            with Producer(store.store_dir) as p:
                for start in range(0, 1200, 20):
                    statuses += [(start, r.status.name, r.reason)
                                 for r in p.send_batch(_messages("Full", start, 20))]
                    if statuses[-1][1] != "PUT_OK":
                        break
            refused = [s for s in statuses if s[1] != "PUT_OK"]
            assert refused, "two buffers of 64 KiB cannot hold 1,200 messages of 250 bytes"
            assert refused[0][1] == "CREATE_MAPEDFILE_FAILED"
            assert "transient store pool" in refused[0][2]
        finally:
            os.kill(flusher, signal.SIGCONT)
        wait_for(lambda: store.slot(Slot.COMMITTED) == store.slot(Slot.WRITTEN),
                 what="the flusher to catch up")
        acked = _send(store.store_dir, "Full", 5000, 50)
        assert len(acked) == 50, "puts resume once buffers are committed"
        assert store.stop() == 0
    _check(store)


def test_settings_the_pool_cannot_serve_are_refused(tmp_path):
    with pytest.raises(StoreConfigError, match="ASYNC_FLUSH"):
        small_config(tmp_path, transient_store_pool_enable=True, flush_disk_type="SYNC_FLUSH")
    with pytest.raises(StoreConfigError, match="multiprocess"):
        MessageStore(small_config(tmp_path, transient_store_pool_enable=True))


def test_pool_buffers_map_files_in_turn(tmp_path):
    store_dir = str(tmp_path / "s")
    os.makedirs(store_dir)
    pool = TransientStorePool(store_dir, 3, 4096, create=True)
    try:
        assert pool.buffer_for(0) is pool.buffer_for(3 * 4096)
        assert pool.buffer_for(4096) is not pool.buffer_for(0)
        assert pool.is_free_for(2 * 4096, 0)          # files 0-2 take the three buffers
        assert not pool.is_free_for(3 * 4096, 4095)   # file 0 not wholly committed
        assert pool.is_free_for(3 * 4096, 4096)
        assert pool.remaining(written=2 * 4096 + 10, committed=4096) == 1
    finally:
        pool.close()
        TransientStorePool.unlink(store_dir, 3)


SMALL_SHM = """
import os, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", "/dev/shm"], check=True)
from rocketstore.shm.transient_pool import TransientStorePool
try:
    TransientStorePool(sys.argv[1], 2, 4 << 20, create=True)
    print("made")
except Exception as e:
    print("refused:", type(e).__name__, e)
print("left:", sorted(os.listdir("/dev/shm")))
"""


def test_a_pool_the_shared_memory_cannot_hold_is_refused_at_start(tmp_path):
    """Two buffers of 4 MiB in a 6 MiB /dev/shm (a container's is often 64 MiB): the
    buffers were made sparse, and the writer died of SIGBUS at its first append past
    what the tmpfs could back, again after every restart. Every page is now given at
    creation, and a start that cannot have them is refused, naming /dev/shm; no buffer
    is left behind. Runs in a mount namespace of its own (root and unshare needed)."""
    import shutil
    import subprocess
    import sys
    namespace = ["unshare", "-m", "--propagation", "private"]
    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            namespace + ["mount", "-t", "tmpfs", "tmpfs", "/dev/shm"],
            capture_output=True).returncode != 0:
        pytest.skip("a small /dev/shm needs root, unshare and mount: not tried here")
    run = subprocess.run(namespace + [sys.executable, "-c", SMALL_SHM, str(tmp_path)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert "refused: PoolMemoryError" in run.stdout and "/dev/shm" in run.stdout, \
        run.stdout + run.stderr
    assert "left: []" in run.stdout, run.stdout
