"""A power cut, simulated: only bytes that were fsynced survive.

Each seeded round writes batches into a store (SYNC_FLUSH or ASYNC_FLUSH), flushes
everything now and then (and copies the consume queues, index files and checkpoint at
that moment: what a disk could still hold of them after the cut), and stops without
closing. Then the files are made what a power cut could leave:

* the CommitLog past the last byte fdatasync'ed: page by page (4 KiB), kept as written,
  zeroed, or garbage, drawn from the seed;
* consume queues, index files and checkpoint: the copies of the last full flush (or,
  before any, none at all); files made since are gone or zero-filled;
* ``abort`` left behind.

Then the store starts again (abnormal recovery) and must hold every message acknowledged
under SYNC_FLUSH, and every message below the last completed flush under ASYNC_FLUSH,
exactly once, in queue order; ``check()`` is clean; queries by key and by time agree with
the CommitLog. ``ROCKETSTORE_POWER_LOSS_ROUNDS`` runs more rounds (default 12 per mode).
A last test does it to a running multiprocess store, its shared memory gone too.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from conftest import crash, small_config
from rocketstore.client import Consumer, Producer
from rocketstore.procs.recovery import unlink_shared
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message, MessageStore
from store_processes import RunningStore, cli

ROUNDS = int(os.environ.get("ROCKETSTORE_POWER_LOSS_ROUNDS", "12"))
PAGE = 4096
TOPICS = ("PowerA", "PowerB")
LOGICS = ("consumequeue", "index", "checkpoint")


def _message(rng: random.Random, n: int) -> Message:
    return Message(topic=TOPICS[n % 2], body=b"m%06d-" % n + bytes(rng.randrange(0, 300)),
                   tags=f"t{n % 3}", keys=[f"key-{n}"], queue_id=n % 3)


def _snapshot(root: str, into: str) -> None:
    shutil.rmtree(into, ignore_errors=True)
    os.makedirs(into)
    for name in LOGICS:
        src = os.path.join(root, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(into, name))
        elif os.path.exists(src):
            shutil.copy2(src, os.path.join(into, name))


def _cut_power(root: str, flushed: int, snapshot: str | None, rng: random.Random,
               file_size: int) -> None:
    """Make ``root`` what a power cut could leave (the module docstring)."""
    commit_dir = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(commit_dir)):
        start = int(name)
        if start + file_size <= flushed:
            continue
        path = os.path.join(commit_dir, name)
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            pos = max(0, flushed - start)
            while pos < len(data):
                end = min(len(data), (pos // PAGE + 1) * PAGE)
                fate = rng.choice(("keep", "zero", "garbage"))
                if fate == "zero":
                    data[pos:end] = bytes(end - pos)
                elif fate == "garbage":
                    data[pos:end] = rng.randbytes(end - pos)
                pos = end
            f.seek(0)
            f.write(data)
    for name in LOGICS:
        path = os.path.join(root, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else (
            os.path.exists(path) and os.unlink(path))
        if snapshot is not None and os.path.exists(os.path.join(snapshot, name)):
            src = os.path.join(snapshot, name)
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, path)
    assert os.path.exists(os.path.join(root, "abort"))


def _stored(store: MessageStore) -> dict[tuple[str, int], list]:
    """Every message of every queue, in queue order."""
    out = {}
    for topic in TOPICS:
        for q in range(3):
            lo = store.get_min_offset_in_queue(topic, q)
            hi = store.get_max_offset_in_queue(topic, q)
            msgs = []
            offset = max(lo, 0)                # -1: the queue holds nothing
            while offset < hi:
                got = store.get_message("check", topic, q, offset, 32)
                assert got.messages, (topic, q, offset, got.status)
                msgs += got.messages
                offset = got.next_begin_offset
            out[(topic, q)] = msgs
    return out


def _round(root: str, seed: int, flush_type: str) -> None:
    rng = random.Random(seed)
    config = small_config(root, flush_disk_type=flush_type)
    store = MessageStore(config, background=False)
    store.load()
    acked: list[tuple] = []        # (n, topic, queue id, queue offset, end, store time)
    snapshot, n = None, 0
    for _ in range(rng.randint(6, 18)):
        batch = [_message(rng, n + i) for i in range(rng.randint(1, 12))]
        for i, r in enumerate(store.put_batch(batch)):
            assert r.status.name == "PUT_OK", r
            acked.append((n + i, batch[i].topic, r.queue_id, r.queue_offset,
                          r.wrote_offset + r.wrote_bytes, r.store_timestamp))
        n += len(batch)
        if rng.random() < 0.5:
            store.dispatch()
        if rng.random() < 0.3:
            store.dispatch()
            store.flush()
            snapshot = os.path.join(os.path.dirname(root), f"snapshot-{seed}")
            _snapshot(root, snapshot)
    flushed = store.commit_log.mapped_file_queue.flushed_where
    crash(store)
    _cut_power(root, flushed, snapshot, rng, config.mapped_file_size_commit_log)

    durable = [a for a in acked if a[4] <= flushed]
    if flush_type == "SYNC_FLUSH":
        assert durable == acked, "a SYNC_FLUSH acknowledgement before its fdatasync"
    with MessageStore(config, background=False) as again:
        again.dispatch()
        assert again.check() == []
        stored = _stored(again)
        bodies = [m.body[:8] for msgs in stored.values() for m in msgs]
        assert len(bodies) == len(set(bodies)), "a message stored twice"
        for (topic, q), msgs in stored.items():
            assert [m.queue_offset for m in msgs] == list(range(
                msgs[0].queue_offset, msgs[0].queue_offset + len(msgs))) if msgs else True
        where = {m.body[:8]: (key, m) for key, msgs in stored.items() for m in msgs}
        for number, topic, q, offset, end, stamp in durable:
            key, m = where[b"m%06d-" % number]
            assert key == (topic, q) and m.queue_offset == offset, (number, key, m)
            found = again.query_message(topic, f"key-{number}").messages
            assert [x.body for x in found] == [m.body]
            at = again.get_offset_in_queue_by_time(topic, q, stamp)   # the nearest store time
            queue = stored[(topic, q)]
            assert queue[at - queue[0].queue_offset].store_timestamp == stamp


@pytest.mark.parametrize("flush_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_only_what_was_fsynced_must_survive_a_power_cut(tmp_path, flush_type):
    for seed in range(ROUNDS):
        _round(str(tmp_path / f"{flush_type}-{seed}" / "store"), seed, flush_type)


@pytest.mark.parametrize("flush_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_a_running_store_cut_off_keeps_what_was_fsynced(tmp_path, flush_type):
    """The same with real processes under load: every process SIGKILLed at once, the
    shared-memory table gone (a reboot), the CommitLog past FLUSHED cut as above, the
    consume queues, index and checkpoint gone; ``rocketstore up`` again."""
    rng = random.Random(99)
    store = RunningStore(tmp_path, flush_disk_type=flush_type).start()
    acked = {}
    try:
        with Producer(store.store_dir) as p:
            for start in range(0, 1200, 40):
                batch = [_message(rng, n) for n in range(start, start + 40)]
                for m, r in zip(batch, p.send_batch(batch)):
                    if r.status.name == "PUT_OK":
                        acked[m.body[:8]] = (m.topic, r.queue_id, r.queue_offset,
                                             r.commit_log_offset + len(m.body))
        flushed = store.slot(Slot.FLUSHED)
    finally:
        store.kill_all()
    unlink_shared(store.store_dir)         # a reboot empties /dev/shm
    _cut_power(store.store_dir, flushed, None, rng, 64 * 1024)
    durable = {b: a for b, a in acked.items() if a[3] <= flushed}
    if flush_type == "SYNC_FLUSH":
        assert len(durable) == len(acked) == 1200
    again = RunningStore(tmp_path, flush_disk_type=flush_type).start()
    try:
        seen = []
        for topic in TOPICS:
            # wait_for_topic: a topic the cut took every message of is none any more
            with Consumer(again.store_dir, "after-the-cut", topic, wait_for_topic=True) as c:
                while True:
                    got = c.poll(256, timeout_ms=500)
                    if not got:
                        break
                    seen += [(m.body[:8], m.topic, m.queue_id, m.queue_offset) for m in got]
        assert len(seen) == len({s[0] for s in seen}), "a message stored twice"
        where = {s[0]: s[1:] for s in seen}
        for body, (topic, q, offset, _) in durable.items():
            assert where.get(body) == (topic, q, offset), body
        assert again.stop() == 0
    finally:
        again.kill_all()
    r = cli("check", "--config", again.config_path)
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr
