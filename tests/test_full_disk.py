"""A real full disk: a running store on a 48 MiB tmpfs, filled.

Needs root (to mount the tmpfs); skipped otherwise, with the reason. The ENOSPC
injections of the other tests stay for the cases a real disk cannot produce on demand.

1. With the cleaner stopped (SIGSTOP), the store fills the file system: a CommitLog
   file cannot be made or its reservation grown, and sends get CREATE_MAPEDFILE_FAILED
   naming it, or (whichever the file system refuses first) the dispatcher cannot grow a
   consume queue or the index, and sends get SERVICE_NOT_AVAILABLE naming
   WRITE_LOGICS_QUEUE_ERROR and ENOSPC; no process crashes (no SIGBUS: every write
   into a mapping is reserved first, ``storage.reservation``; tests/test_reservation.py
   fills the disk in the middle of a file).
2. The cleaner runs again: past 90 % it marks the disk full (sends refused with
   SERVICE_NOT_AVAILABLE naming DISK_FULL), past 85 % it deletes the oldest CommitLog
   files at once (RocketMQ's forced clean), and once usage is back under the ratios
   writes resume on their own.
3. Nothing still stored is harmed: every acknowledged message at or above MIN_OFFSET
   reads back intact, and ``rocketstore check`` is clean.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from rocketstore.client import Consumer, Producer, ReaderClient
from rocketstore.procs.dispatcher import SPACE_RETRY_MS
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message
from conftest import mount_tmpfs, take_every_byte
from store_processes import RunningStore, cli, wait_for

MIB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    yield from mount_tmpfs(tmp_path / "disk", "48m")


def _batch(first: int) -> list[Message]:
    return [Message(topic="Full", body=b"full-%06d-" % i + bytes(4000), keys=[f"k{i}"],
                    queue_id=i % 2) for i in range(first, first + 25)]


def test_a_full_disk_refuses_by_name_keeps_what_is_stored_and_recovers(small_disk):
    store = RunningStore(small_disk, mapped_file_size_commit_log=4 * MIB,
                         clean_resource_interval=100, delete_commit_log_files_interval=0)
    store.start()
    acked: dict[bytes, tuple[int, int, int]] = {}
    refusals: list[tuple[str, str]] = []
    cleaner = store.child_pid("cleaner")
    try:
        os.kill(cleaner, signal.SIGSTOP)
        n = 0
        with Producer(store.store_dir) as p:
            while not refusals and n < 40_000:            # 48 MiB hold about 11,000
                batch = _batch(n)
                for m, r in zip(batch, p.send_batch(batch)):
                    if r.status.name == "PUT_OK":
                        acked[m.body[:12]] = (r.queue_id, r.queue_offset, r.commit_log_offset)
                    else:
                        refusals.append((r.status.name, r.reason))
                n += len(batch)
            assert refusals, "the file system never filled"
            status, reason = refusals[0]
            assert (status == "CREATE_MAPEDFILE_FAILED" and "commitlog file" in reason) or \
                (status == "SERVICE_NOT_AVAILABLE" and "WRITE_LOGICS_QUEUE_ERROR" in reason
                 and "ENOSPC" in reason), refusals[0]
            for name in ("writer", "flusher", "dispatcher", "reader"):
                assert store.restarts(name) == 0, f"{name} died on a full disk"
            os.kill(cleaner, signal.SIGCONT)
            wait_for(lambda: store.slot(Slot.MIN_OFFSET) > 0, timeout=30,
                     what="the forced clean")
            resumed, deadline = False, time.monotonic() + 30
            while not resumed and time.monotonic() < deadline:
                results = p.send_batch(_batch(n))
                resumed = all(r.status.name == "PUT_OK" for r in results)
                if not resumed:
                    refused = [r for r in results if r.status.name != "PUT_OK"][0]
                    assert refused.status.name in ("SERVICE_NOT_AVAILABLE",
                                                   "CREATE_MAPEDFILE_FAILED"), refused
                    time.sleep(0.2)
                else:
                    for m, r in zip(_batch(n), results):
                        acked[m.body[:12]] = (r.queue_id, r.queue_offset, r.commit_log_offset)
                n += 25
            assert resumed, "writes did not resume after the clean"
        min_offset = store.slot(Slot.MIN_OFFSET)
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        seen = {}
        with Consumer(store.store_dir, "after-full", "Full") as c:
            while True:
                got = c.poll(256, timeout_ms=500)
                if not got:
                    break
                for m in got:
                    seen[m.body[:12]] = (m.queue_id, m.queue_offset, m.commit_log_offset,
                                         m.body)
        kept = {b: a for b, a in acked.items() if a[2] >= min_offset}
        assert kept and all(seen.get(b, (None,) * 3)[:3] == a for b, a in kept.items())
        assert all(v[3] == k + bytes(4000) for k, v in seen.items())
        assert store.stop() == 0
    finally:
        try:
            os.kill(cleaner, signal.SIGCONT)       # never left stopped, whatever failed
        except ProcessLookupError:
            pass
        store.kill_all()
    r = cli("check", "--config", store.config_path)
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)           # never left stopped, whatever failed
    except ProcessLookupError:
        pass


def _turning_through_retries(store: RunningStore, retries: int) -> None:
    """Wait until the dispatcher has turned its loop ``retries`` retry periods
    (SPACE_RETRY_MS) from now: it lived through that many tries at the full disk. (No
    slot counts the tries; the heartbeat shows the loop went on past them.)"""
    pid = store.child_pid("dispatcher")
    past_ms = time.time_ns() // 1_000_000 + retries * SPACE_RETRY_MS
    wait_for(lambda: store.heartbeat_ms("dispatcher") > past_ms, 30 + retries,
             f"the dispatcher turning through {retries} retries")
    assert store.child_pid("dispatcher") == pid


@contextlib.contextmanager
def _store_beside_a_filler(disk, **settings):
    """A running store on ``disk`` whose cleaner is stopped (its disk-full refusal
    would come first), with the path of the file that is to take the space; both undone
    at the end."""
    store = RunningStore(disk, mapped_file_size_commit_log=4 * MIB,
                         mapped_file_size_consume_queue=20 * 1024, **settings)
    store.start()
    filler = os.path.join(disk, "filler")
    cleaner = store.child_pid("cleaner")
    os.kill(cleaner, signal.SIGSTOP)
    try:
        yield store, filler, cleaner
    finally:
        _continue(cleaner)
        if os.path.exists(filler):
            os.unlink(filler)
        store.kill_all()


@pytest.mark.parametrize("needs", ["consume queue", "index"])
def test_a_dispatcher_that_meets_a_full_disk_waits_for_space_and_goes_on(small_disk, needs):
    """Another file takes the space; a new topic's consume queue, or the index's next
    file, cannot be made. The dispatcher used to exit, crash-loop and have the
    supervisor stop the whole store (an index's ENOSPC, wrapped twice, still did); it now
    waits (puts refused, naming ENOSPC), is not restarted, and goes on by itself once
    there is space again, with every acknowledged message delivered and found."""
    topic = "NewTopic" if needs == "consume queue" else "Before"

    def batch(tag: str, n: int) -> list[Message]:
        return [Message(topic=topic, body=b"%s%d" % (tag.encode(), i), keys=[f"{tag}{i}"],
                        queue_id=0) for i in range(n)]

    with _store_beside_a_filler(small_disk, max_hash_slot_num=16,
                                max_index_num=64) as (store, filler, cleaner):
        with Producer(store.store_dir, timeout_ms=5000) as p:
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Before", body=b"b%d" % i, queue_id=0) for i in range(40)]))
            wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                     what="dispatch")
            take_every_byte(filler)
            first = p.send_batch(batch("n", 100))    # 100 keys: more than an index file holds
            acked = [b"n%d" % i for i, r in enumerate(first) if r.ok]
            wait_for(lambda: store.slot(Slot.DISPATCH_ERROR) != 0, timeout=30,
                     what="the dispatcher to meet the full disk")
            refused = p.send(topic, b"while full", queue_id=0)   # refused, naming why
            assert refused.status.name == "SERVICE_NOT_AVAILABLE" and "ENOSPC" in \
                refused.reason, refused
            _turning_through_retries(store, 3)
            assert store.restarts("dispatcher") == 0 and store.proc.poll() is None
            assert store.slot(Slot.DISPATCH_ERROR) != 0
            os.unlink(filler)
            os.kill(cleaner, signal.SIGCONT)
            wait_for(lambda: store.slot(Slot.DISPATCH_ERROR) == 0, timeout=30,
                     what="dispatch to go on")
            more = p.send_batch(batch("m", 20))
            assert all(r.ok for r in more)
            acked += [b"m%d" % i for i in range(20)]
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        with Consumer(store.store_dir, "after", topic) as c:
            got = []
            while (batch_ := c.poll(256, timeout_ms=500)):
                got += [m.body for m in batch_]
        assert [b for b in got if b[:1] in b"nm"] == acked
        with ReaderClient(store.store_dir) as rc:
            assert all(len(rc.query_by_key(topic, key.decode())) == 1
                       for key in (acked[0], acked[-1]))
        assert store.restarts("dispatcher") == 0
        assert store.stop() == 0


def test_a_stop_while_dispatch_waits_for_space_keeps_what_it_dispatched(small_disk):
    """A stop that comes while the dispatcher waits for disk space: it flushes what it
    dispatched, says why it stops behind, and the next start dispatches the rest (it
    used to log that it stopped to be restarted, and skip the flush)."""
    with _store_beside_a_filler(small_disk) as (store, filler, cleaner):
        with Producer(store.store_dir, timeout_ms=5000) as p:
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Before", body=b"b", queue_id=0) for _ in range(10)]))
            # dispatched before the disk fills: else "Before"'s consume queue, still to be
            # made, is what meets the full disk, and "Later" is refused (seen on a busy
            # machine)
            wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                     what="dispatch")
            take_every_byte(filler)
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Later", body=b"l%d" % i, queue_id=0) for i in range(5)]))
        wait_for(lambda: store.slot(Slot.DISPATCH_ERROR) != 0, timeout=30,
                 what="the dispatcher to meet the full disk")
        os.kill(cleaner, signal.SIGCONT)
        store.stop()
        log = store.log()
        assert "while waiting for disk space" in log and "DISPATCH STOPPED" not in log
        os.unlink(filler)
        store.start()
        with Consumer(store.store_dir, "later", "Later") as c:
            got = []
            while (batch := c.poll(64, timeout_ms=1000)):
                got += [m.body for m in batch]
        assert got == [b"l%d" % i for i in range(5)]
        assert store.stop() == 0
