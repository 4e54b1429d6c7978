"""Disk reservation: a store's files reserve blocks as they fill, never less than a write
needs (``storage.reservation``).

1. ``Reservation.cover``'s rule, on real files: steps, half a step ahead, a look-ahead
   the disk refuses does not refuse a write that is backed, the exact page is tried
   before a refusal. The refusals are injected through ``FILE_OPS.fallocate`` (a disk
   cannot be made to refuse one call on demand), and the tests say so.
2. The SIGBUS safety on a real full file system: a small tmpfs (needs root; skipped
   otherwise, with the reason), filled to its last block by another file. First the
   hazard itself, so these tests can fail: a store into a mapped page with no block
   behind it kills the process with SIGBUS. Then the embedded store's put, an index
   file and a consume queue, each in a child process whose exit status shows a SIGBUS:
   the write is refused with the named error (ENOSPC), nothing stored before changes,
   and writes go on once there is space. Then a running store, whose writer meets the
   full disk in the middle of a CommitLog file.
3. What a fresh store costs: RocketMQ's default sizes (1 GiB CommitLog files, a 420 MB
   index file), five messages: the files keep their full sizes and hold about a hundred
   MiB of blocks, and ``up`` and ``status`` say so.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from conftest import mount_tmpfs, take_every_byte
from rocketstore.client import Consumer, Producer
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message, MessageStore, StoreConfig, StoreFileError
from rocketstore.storage.consume_queue import CQ_UNIT
from rocketstore.storage.index_file import IndexFileView
from rocketstore.storage.mapped_file import FILE_OPS, offset_to_file_name
from rocketstore.storage.reservation import Reservation, create_reserved, reserve_step
from store_processes import ROOT, RunningStore, cli, wait_for

MIB = 1 << 20
ENOSPC_TEXT = os.strerror(errno.ENOSPC)


def blocks(path) -> int:
    return os.stat(path).st_blocks * 512


# ====================================================================== the rule
@pytest.mark.parametrize("size, step", [
    (16 << 10, 16 << 10),          # 1 MiB or less: whole
    (1 << 20, 1 << 20),
    (6_000_000, 1 << 20),          # a default consume queue file: the 1 MiB floor
    (400_000_000, 25_001_984),     # the default index's entries: a sixteenth, in pages
    (1 << 30, 64 << 20),           # a default CommitLog file: a sixteenth
    (8 << 30, 64 << 20),           # the 64 MiB ceiling
])
def test_reserve_step(size, step):
    assert reserve_step(size) == step


@pytest.fixture
def sparse(tmp_path):
    """A 16 MiB file with nothing reserved, and its descriptor."""
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    create_reserved(path, fd, 16 * MIB, 0)
    yield path, fd
    os.close(fd)


def test_cover_keeps_half_a_step_ahead_and_extends_a_step_at_a_time(sparse):
    path, fd = sparse
    r = Reservation(path, fd, 16 * MIB, MIB)
    assert blocks(path) == 0 and os.path.getsize(path) == 16 * MIB
    r.cover(100)
    assert r.reserved == MIB and blocks(path) == MIB
    r.cover(MIB // 2)                       # half a step still ahead: nothing to do
    assert r.reserved == MIB
    r.cover(MIB // 2 + 1)
    assert r.reserved == 2 * MIB and blocks(path) == 2 * MIB
    r.cover(16 * MIB)                       # never past the end
    assert r.reserved == 16 * MIB and blocks(path) == 16 * MIB


def test_a_refused_look_ahead_does_not_refuse_a_backed_write(sparse, monkeypatch):
    """fallocate is replaced to refuse (ENOSPC) what lies past 1 MiB: a disk cannot be
    made to refuse one range on demand."""
    path, fd = sparse
    real = FILE_OPS.fallocate

    def refuse_past_1_mib(fd_, offset, length):
        if offset + length > MIB:
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        real(fd_, offset, length)
    monkeypatch.setattr(FILE_OPS, "fallocate", refuse_past_1_mib)
    r = Reservation(path, fd, 16 * MIB, MIB)
    r.cover(MIB - 10)                   # wants 1.5 MiB; falls back to the page it needs
    assert r.reserved == MIB
    r.cover(MIB)                        # backed: the refused look-ahead is no refusal
    with pytest.raises(StoreFileError) as e:
        r.cover(MIB + 1)
    assert path in str(e.value) and ENOSPC_TEXT in str(e.value)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    assert r.reserved == MIB and blocks(path) == MIB


def test_the_next_commit_log_file_reserves_its_first_step_when_the_current_is_mostly_full(
        tmp_path):
    """16 MiB files (1 MiB steps): the file made ahead holds no block until the current
    one is reserved to its end, then its first step only; the current one never holds
    more than a step and a half past its writes."""
    config = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                         mapped_file_size_commit_log=16 * MIB)
    store = MessageStore(config, background=False)
    store.load()
    body = bytes(64 << 10)
    first, second = (os.path.join(config.commit_log_dir, offset_to_file_name(o))
                     for o in (0, 16 * MIB))
    try:
        wait_for(lambda: os.path.exists(second), what="the file made ahead")
        reserved_early = None
        while True:
            r = store.put(Message(topic="T", body=body, queue_id=0))
            assert r.ok
            end = r.commit_log_offset + r.wrote_bytes
            if end >= 16 * MIB - 64 * 1024 * 3:
                break
            assert blocks(first) <= end + 3 * MIB // 2 + 4096
            if end < 14 * MIB:
                assert blocks(second) == 0, end
            elif reserved_early is None and blocks(second):
                reserved_early = end
        assert reserved_early is not None and blocks(second) == MIB
        assert os.path.getsize(first) == os.path.getsize(second) == 16 * MIB
    finally:
        store.close()


# ====================================================================== a real full disk
@pytest.fixture
def disk(tmp_path):
    yield from mount_tmpfs(tmp_path / "disk", "24m")


CHILD = r"""
import json, mmap, os, sys
from rocketstore.storage import Message, MessageStore, StoreConfig
from rocketstore.storage.consume_queue import ConsumeQueue
from rocketstore.storage.errors import StoreFileError
from rocketstore.storage.index_file import IndexFile
sys.path.insert(0, sys.argv[3])
from conftest import take_every_byte

kind, disk = sys.argv[1], sys.argv[2]
filler = os.path.join(disk, "filler")
out = {}
if kind == "raw mapping":
    fd = os.open(os.path.join(disk, "raw"), os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 8 << 20)
    m = mmap.mmap(fd, 8 << 20)
    take_every_byte(filler)
    m[4 << 20] = 1                      # a page no block backs: SIGBUS
    out["wrote"] = True
elif kind == "put":
    config = StoreConfig(store_path_root_dir=os.path.join(disk, "store"),
                         mapped_file_size_commit_log=8 << 20,
                         mapped_file_size_consume_queue=20 * 1000,
                         max_hash_slot_num=1024, max_index_num=8192)
    store = MessageStore(config, background=False)
    store.load()
    def put(i):
        return store.put(Message(topic="Full", body=b"%06d" % i + bytes(16 << 10),
                                 keys=["k%d" % i], queue_id=0))
    acked, i = [], 0
    for i in range(20):
        assert put(i).ok
        acked.append(i)
    store.dispatch()
    take_every_byte(filler)
    while True:
        i += 1
        r = put(i)
        if not r.ok:
            break
        acked.append(i)
    store.dispatch()
    out.update(status=r.status.name, reason=r.reason, acked=acked, end=store.get_max_phy_offset())
    os.unlink(filler)
    out["resumed"] = put(i).status.name
    store.dispatch()
    out["problems"] = store.check()
    store.close()
elif kind == "index":
    f = IndexFile(os.path.join(disk, "20240101000000000"), 64, 1 << 20)
    take_every_byte(filler)
    n = 1
    try:
        while True:
            assert f.put_key("T#k%d" % n, n * 100, 1_700_000_000_000 + n)
            n += 1
    except StoreFileError as e:
        out.update(error=str(e), count=f.index_count)
    os.unlink(filler)
    out["resumed"] = f.put_key("T#k%d" % n, n * 100, 1_700_000_000_000 + n)
    f.flush()
    f.close()
elif kind == "consume queue":
    cq = ConsumeQueue("T", 0, disk, 20 * 400_000)
    cq.put_message_position_info(0, 100, 0, 0)      # the file, its first step reserved
    take_every_byte(filler)
    n = 1
    try:
        while True:
            cq.put_message_position_info(n * 100, 100, n, n)
            n += 1
    except StoreFileError as e:
        out.update(error=str(e), count=cq.get_max_offset_in_queue())
    os.unlink(filler)
    cq.put_message_position_info(n * 100, 100, n, n)
    out["resumed"] = cq.get_max_offset_in_queue()
    cq.flush(0)
    cq.close()
print(json.dumps(out))
"""


def run_child(kind: str, disk) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(disk),
                        os.path.dirname(os.path.abspath(__file__))],
                       env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    return r.returncode, (json.loads(lines[-1]) if lines else {"stderr": r.stderr[-3000:]})


def test_a_write_into_an_unbacked_page_of_a_full_disk_is_sigbus(disk):
    """The hazard the reservation guards against, shown here: without it the tests
    below would die the same way."""
    rc, out = run_child("raw mapping", disk)
    assert rc == -signal.SIGBUS, (rc, out)


def test_a_put_on_a_full_disk_is_refused_by_name_and_harms_nothing(disk):
    rc, out = run_child("put", disk)
    assert rc == 0, (rc, out)                            # no SIGBUS
    assert out["status"] == "CREATE_MAPEDFILE_FAILED", out
    first = os.path.join(str(disk), "store", "commitlog", offset_to_file_name(0))
    assert first in out["reason"] and ENOSPC_TEXT in out["reason"], out["reason"]
    assert 20 * (16 << 10) < out["end"] < 8 * MIB        # refused inside the first file
    assert out["resumed"] == "PUT_OK" and out["problems"] == []
    config = StoreConfig(store_path_root_dir=os.path.join(str(disk), "store"),
                         mapped_file_size_commit_log=8 * MIB,
                         mapped_file_size_consume_queue=20 * 1000,
                         max_hash_slot_num=1024, max_index_num=8192)
    store = MessageStore(config, background=False)
    store.load()
    try:
        bodies, offset = [], 0
        while (got := store.get_message("g", "Full", 0, offset, 32).messages):
            bodies += [m.body for m in got]
            offset += len(got)
        assert bodies[:-1] == [b"%06d" % i + bytes(16 << 10) for i in out["acked"]]
        assert len(bodies) == len(out["acked"]) + 1       # the put after the space came
        assert [len(store.query_message("Full", f"k{i}", 4).messages)
                for i in (out["acked"][0], out["acked"][-1])] == [1, 1]
        assert store.check() == []
    finally:
        store.close()


def test_an_index_file_on_a_full_disk_refuses_the_entry_and_harms_nothing(disk):
    """1 Mi entries (20 MiB, reserved 1.25 MiB at a time): the file's first step is
    reserved at its creation, before the disk is filled."""
    rc, out = run_child("index", disk)
    assert rc == 0, (rc, out)
    assert "20240101000000000" in out["error"] and ENOSPC_TEXT in out["error"], out
    assert out["resumed"] is True
    n = out["count"]                    # the entries put before the refusal, + 1
    assert n > 1000
    view = IndexFileView(os.path.join(str(disk), "20240101000000000"), 64, 1 << 20)
    try:
        view.snapshot()
        assert view.index_count == n + 1
        whole = (0, 2 ** 62)
        for k in (1, n // 2, n - 1, n):
            assert view.select_phy_offset(f"T#k{k}", 4, *whole) == [k * 100]
    finally:
        view.close()


def test_a_consume_queue_on_a_full_disk_refuses_the_unit_and_harms_nothing(disk):
    """8 MB files (1 MiB steps), the first step reserved at the file's creation, before
    the disk is filled."""
    rc, out = run_child("consume queue", disk)
    assert rc == 0, (rc, out)
    assert ENOSPC_TEXT in out["error"], out
    n = out["count"]
    assert n > 10_000
    assert out["resumed"] == n + 1
    with open(os.path.join(str(disk), "T", "0", offset_to_file_name(0)), "rb") as f:
        data = f.read(20 * (n + 1))
    units = [CQ_UNIT.unpack_from(data, 20 * i) for i in range(n + 1)]
    assert units == [(i * 100, 100, i) for i in range(n + 1)]


def test_a_running_store_meeting_a_full_disk_mid_file_refuses_and_goes_on(disk):
    """The writer's CommitLog file (8 MiB, reserved 1 MiB at a time) has room, but the
    disk has none: the put that needs the next step is refused with
    CREATE_MAPEDFILE_FAILED naming the file and ENOSPC; no process dies (a SIGBUS
    would restart the writer); every message acknowledged before reads back; puts go
    on once there is space; ``rocketstore check`` is clean. The cleaner is stopped
    (SIGSTOP): its disk-full refusal would come first."""
    store = RunningStore(disk, mapped_file_size_commit_log=8 * MIB,
                         mapped_file_size_consume_queue=20 * 1024)
    store.start()
    cleaner = store.child_pid("cleaner")
    writer = store.child_pid("writer")
    filler = os.path.join(str(disk), "filler")
    acked: dict[bytes, int] = {}
    try:
        os.kill(cleaner, signal.SIGSTOP)
        with Producer(store.store_dir, timeout_ms=5000) as p:
            for i in range(10):
                body = b"before-%04d" % i + bytes(16 << 10)
                assert p.send("Full", body, queue_id=0).ok
                acked[body[:11]] = len(body)
            wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                     what="dispatch")
            take_every_byte(filler)
            refused = None
            for i in range(200):
                body = b"during-%04d" % i + bytes(64 << 10)
                r = p.send("Full", body, queue_id=0)
                if not r.ok:
                    refused = r
                    break
                acked[body[:11]] = len(body)
            assert refused is not None, "the disk never refused"
            written = store.slot(Slot.WRITTEN)
            assert written < 8 * MIB                     # in the middle of the first file
            assert refused.status.name == "CREATE_MAPEDFILE_FAILED", refused
            path = os.path.join(store.store_dir, "commitlog", offset_to_file_name(0))
            assert path in refused.reason and ENOSPC_TEXT in refused.reason, refused.reason
            for name in ("writer", "flusher", "dispatcher", "reader"):
                assert store.restarts(name) == 0, f"{name} died on a full disk"
            assert store.child_pid("writer") == writer
            os.unlink(filler)
            os.kill(cleaner, signal.SIGCONT)
            body = b"after--0000" + bytes(64 << 10)
            assert p.send("Full", body, queue_id=0).ok
            acked[body[:11]] = len(body)
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        seen = {}
        with Consumer(store.store_dir, "after-full", "Full") as c:
            while (got := c.poll(256, timeout_ms=500)):
                seen.update((m.body[:11], m.body) for m in got)
        assert list(seen) == list(acked)
        assert all(len(seen[k]) == n and not seen[k][11:].strip(b"\0") for k, n in acked.items())
        assert store.stop() == 0
    finally:
        try:
            os.kill(cleaner, signal.SIGCONT)
        except ProcessLookupError:
            pass
        store.kill_all()
    r = cli("check", "--config", store.config_path)
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr


# ====================================================================== a fresh store
def test_a_fresh_store_at_default_sizes_holds_what_it_uses_and_says_so(tmp_path):
    """RocketMQ's default sizes: 1 GiB CommitLog files, 6 MB consume queue files, a
    420 MB index file. Three CommitLog files and the index file are there at full size
    (3.5 GB by ``ls -l``); five messages hold a step of each kind of blocks."""
    store = RunningStore(tmp_path, mapped_file_size_commit_log=1 << 30,
                         mapped_file_size_consume_queue=300_000 * 20,
                         max_hash_slot_num=5_000_000, max_index_num=20_000_000)
    store.start()
    try:
        line = []
        reader = threading.Thread(target=lambda: line.append(store.proc.stdout.readline()))
        reader.start()
        reader.join(10)
        assert line and line[0].startswith("disk: ") and "reserved now" in line[0], line
        assert "grows as it fills" in line[0] and "CommitLog 64 MiB" in line[0]
        with Producer(store.store_dir) as p:
            assert all(p.send("Fresh", b"m%d" % i, keys=[f"k{i}"]).ok for i in range(5))
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        every = [os.path.join(d, n) for d, _, names in os.walk(store.store_dir)
                 for n in names]
        held = sum(blocks(p) for p in every)
        assert held < 160 * MIB, held
        logs = os.path.join(store.store_dir, "commitlog")
        assert all(os.path.getsize(os.path.join(logs, n)) == 1 << 30
                   for n in os.listdir(logs) if n.isdigit())
        r = cli("status", "--json", "--config", store.config_path)
        reserved = json.loads(r.stdout)["disk"]["reserved"]
        assert 64 * MIB <= reserved["commit_log"] < 65 * MIB     # a step, no file ahead
        assert reserved["commit_log_ahead"] > 63 * MIB
        assert 19 * MIB < reserved["index"] < 50 * MIB           # slots and a step
        assert 0 < reserved["consume_queues"] < 6 * MIB          # a step a queue
        assert reserved["bytes"] == reserved["commit_log"] + reserved["index"] + \
            reserved["consume_queues"] <= held
        text = cli("status", "--config", store.config_path).stdout
        assert "reserved now (CommitLog 64 MiB: 64 MiB ahead of writes; index" in text, text
        assert store.stop() == 0
    finally:
        store.kill_all()
