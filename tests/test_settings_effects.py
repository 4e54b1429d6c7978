"""Every setting acts, or is refused with its reason, or carries a note: none is taken
silently (``storage.config.REFUSED_WHEN_SET``, ``NOTES``); ``rocketstore config`` marks
them; the settings that act here do what RocketMQ's do."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from rocketstore.procs import cleaner as cleaner_module
from rocketstore.client import Producer
from rocketstore.procs.cleaner import Cleaner, delete_consume_queue_files
from rocketstore.procs.writer import MAX_BATCH_RECORDS
from rocketstore.shm.positions import PositionTable
from rocketstore.storage import Message, StoreConfig
from rocketstore.storage.config import NOTES, REFUSED_WHEN_SET, setting_mark
from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.mapped_file_queue import MappedFileQueue, gaps_between
from store_processes import RunningStore, cli
from test_dispatcher_cleaner import env_factory  # noqa: F401  (a fixture)

OTHER = {bool: lambda v: not v, int: lambda v: v + 1}


@pytest.mark.parametrize("name", sorted(REFUSED_WHEN_SET))
def test_a_setting_this_store_cannot_do_is_refused_with_its_reason(name):
    default = getattr(StoreConfig(), name)
    with pytest.raises(StoreConfigError) as e:
        StoreConfig(**{name: OTHER[type(default)](default)})
    assert name in str(e.value) and REFUSED_WHEN_SET[name] in str(e.value)
    StoreConfig(**{name: default})


def test_config_marks_each_setting_that_does_not_simply_act(tmp_path):
    r = cli("config")
    assert r.returncode == 0, r.stderr
    marked = {line.split(" = ")[0]: line.split("    # ", 1)[1]
              for line in r.stdout.splitlines() if "    # " in line}
    assert set(marked) == set(REFUSED_WHEN_SET) | set(NOTES)
    assert all(mark == setting_mark(name) for name, mark in marked.items())
    r = cli("config", "--json", "--marks")
    both = json.loads(r.stdout)
    assert list(both) == StoreConfig.field_names()
    assert both["long_polling_enable"] == {"value": True,
                                           "mark": setting_mark("long_polling_enable")}
    assert both["flush_disk_type"]["mark"] == ""


def test_requests_behind_a_slow_append_are_refused_as_page_cache_busy(tmp_path):
    """``os_page_cache_busy_time_out_mills`` = 1. A frame of MAX_BATCH_RECORDS records is
    one append on its own (the writer drains no more behind it) and takes far over 1 ms;
    the small frames sent right behind it wait meanwhile, and those the writer's socket
    holds when the append ends are answered OS_PAGECACHE_BUSY (PCBUSY_CLEAN_QUEUE). The
    writer is stopped while the four frames are sent, so the small ones are queued
    behind the big one before its append begins (on a busy machine the producer could
    otherwise send them after it ended). Whether they are in the writer's socket when
    the append ends is up to the scheduler: its ZeroMQ I/O thread reads them off the
    connection after the big frame, and on a loaded machine (one run in six with two
    busy loops beside it) it ran only once the append was done. So the scene is played
    up to three times, on a writer free of one CPU (kept on one, the I/O thread waits
    for the CPU the append holds), and must show the refusal once: a writer that never
    refuses fails every time."""
    with RunningStore(tmp_path, os_page_cache_busy_time_out_mills=1,
                      mapped_file_size_commit_log=64 << 20, writer_cpu_affinity=False) as store:
        big = [Message(topic="Busy", body=bytes(200), queue_id=0)
               for _ in range(MAX_BATCH_RECORDS)]
        small = [Message(topic="Busy", body=b"behind", queue_id=1)]
        seen = []
        with Producer(store.store_dir, window=16) as p:
            for _ in range(3):
                stored, waited = _behind_a_slow_append(p, store, big, small)
                assert all(r.status.name == "PUT_OK" for r in stored)
                busy = [r for r in waited if r.status.name == "OS_PAGECACHE_BUSY"]
                seen.append([r.status.name for r in waited])
                if busy:
                    break
        assert busy, seen
        assert all("PCBUSY_CLEAN_QUEUE" in r.reason and
                   "os_page_cache_busy_time_out_mills 1)" in r.reason for r in busy)


def _behind_a_slow_append(p: Producer, store, big: list, small: list) -> tuple[list, list]:
    """The big frame and three small ones sent while the writer is stopped; their
    results."""
    warm_up_until_an_append_is_fast(p)
    writer = store.child_pid("writer")
    os.kill(writer, signal.SIGSTOP)
    try:
        first = p.send_async(big)
        behind = [p.send_async(small) for _ in range(3)]
    finally:
        os.kill(writer, signal.SIGCONT)
    return first.result(), [r for x in behind for r in x.result()]


def warm_up_until_an_append_is_fast(p: Producer) -> None:
    """Send until one send is stored with a round trip, its append included, under
    1 ms: that append armed no refusal of what waits behind it, so the writer has
    nothing left of its turn to refuse when the test stops it. (An append into a fresh
    file can itself take over 1 ms: the send right behind it is then refused, and a
    writer stopped right after its answer would refuse the big frame that follows.)"""
    for _ in range(200):
        began = time.monotonic()
        stored = p.send("BusyWarmUp", b"connected").ok
        if stored and time.monotonic() - began < 0.001:
            return
    raise AssertionError("no send of 200 was stored within 1 ms")


def test_consume_queue_deletions_pause_between_queues(tmp_path, monkeypatch):
    """``delete_consume_queue_files_interval``: after each queue that lost files, the
    cleaner pauses (recorded, not timed)."""
    pauses = []
    sleep, this_thread = cleaner_module.time.sleep, threading.get_ident()

    def recorded_sleep(seconds: float) -> None:
        """The cleaner's pauses, recorded; other threads of this process (a client a
        test before left running) still sleep: ``time`` is one module for them all."""
        if threading.get_ident() == this_thread:
            pauses.append(seconds)
        else:
            sleep(seconds)

    monkeypatch.setattr(cleaner_module.time, "sleep", recorded_sleep)
    root = tmp_path / "cq"
    for queue in ("T/0", "T/1", "U/0"):
        os.makedirs(root / queue)
        for start in (0, 40, 80):
            units = b"".join((start * 100 + i).to_bytes(8, "big") + (10).to_bytes(4, "big")
                             + bytes(8) for i in range(2))
            (root / queue / f"{start:020d}").write_bytes(units)
    assert delete_consume_queue_files(str(root), 40, 5000, 100) == 6   # two in each queue
    assert pauses == [0.1] * 3


def test_check_self_finds_a_gap_between_files(env_factory, tmp_path):  # noqa: F811
    assert gaps_between([0, 100, 200, 400], 100, "q") == ["q: the file after 200 starts at "
                                                          "400, not 300"]
    env = env_factory(fill=700)
    cleaner = Cleaner(env.store_dir, env.config)
    cleaner.table = PositionTable.attach(env.store_dir, process="cleaner")
    cleaner.setup()
    try:
        assert cleaner.check_self() == []
        queue_dir = os.path.join(env.config.consume_queue_dir, "DispA", "0")
        names = sorted(os.listdir(queue_dir))
        assert len(names) >= 3
        os.unlink(os.path.join(queue_dir, names[1]))
        problems = cleaner.check_self()
        assert len(problems) == 1 and queue_dir in problems[0]
        mfq = MappedFileQueue(env.config.commit_log_dir, env.config.mapped_file_size_commit_log)
        mfq.load()
        assert mfq.check_self() == []
        mfq.close()
    finally:
        cleaner.teardown()
        cleaner.table.close()
