"""IndexService: building, rolling, querying, loading after a crash, expiry.

Index files are tiny (8 slots, 4 entries: three keys per file) so a few messages roll
over several files. Each message is indexed under one key unless a test says otherwise.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from conftest import refuse_space
from rocketstore.storage import index_service as index_service_module
from rocketstore.storage import mapped_file
from rocketstore.storage.errors import StoreFileError
from rocketstore.storage.index_file import IndexFile, index_file_size, time_millis_to_human_string
from rocketstore.storage.index_service import IndexService, QueryOffsetResult, build_key

SLOTS, ENTRIES = 8, 4                 # 3 entries per file
T0 = 1_700_000_000_000
WHOLE = (0, 2**63 - 1)
NOT, PREPARED, COMMIT, ROLLBACK = 0x0, 0x4, 0x8, 0xC


@pytest.fixture
def index_dir(tmp_path):
    return str(tmp_path / "index")


@pytest.fixture
def service(index_dir):
    s = IndexService(index_dir, SLOTS, ENTRIES)
    s.load(True, 0)
    yield s
    s.close()


def build(s: IndexService, n: int, *, start: int = 0, keys: str | None = "K",
          uniq: bool = False, step_ms: int = 1000) -> list[int]:
    """Index ``n`` messages at offsets 100*i, stored 1 s apart; returns the offsets."""
    offsets = []
    for i in range(start, start + n):
        off = 100 * i
        assert s.build_index("T", off, T0 + i * step_ms, NOT, f"U{i}" if uniq else None, keys)
        offsets.append(off)
    return offsets


def reopen(index_dir: str, last_exit_ok: bool = True, checkpoint_ms: int = 0) -> IndexService:
    s = IndexService(index_dir, SLOTS, ENTRIES)
    s.load(last_exit_ok, checkpoint_ms)
    return s


# ------------------------------------------------------------------ build and query
def test_build_and_query_one_message(service):
    assert service.build_index("T", 0, T0, NOT, "UNIQ1", "k1 k2")
    assert service.query_offset("T", "UNIQ1", 64, *WHOLE).phy_offsets == [0]
    assert service.query_offset("T", "k1", 64, *WHOLE).phy_offsets == [0]
    assert service.query_offset("T", "k2", 64, *WHOLE).phy_offsets == [0]
    assert service.query_offset("T", "k3", 64, *WHOLE).phy_offsets == []
    assert service.query_offset("Other", "k1", 64, *WHOLE).phy_offsets == []
    assert build_key("T", "k1") == "T#k1"


def test_keys_split_on_spaces_and_empty_ones_skipped(service):
    assert service.build_index("T", 0, T0, NOT, None, " a  b ")
    [f] = service.files
    assert f.index_count == 3                 # two entries: "a" and "b"
    assert service.query_offset("T", "a", 64, *WHOLE).phy_offsets == [0]
    assert service.query_offset("T", "b", 64, *WHOLE).phy_offsets == [0]
    assert service.build_index("T", 100, T0, NOT, None, "")
    assert service.build_index("T", 200, T0, NOT, None, None)
    assert f.index_count == 3


@pytest.mark.parametrize("sys_flag, indexed", [
    (NOT, True), (PREPARED, True), (COMMIT, True), (ROLLBACK, False),
    (ROLLBACK | 0x1, False), (COMMIT | 0x30, True)])
def test_rollback_is_not_indexed(service, sys_flag, indexed):
    assert service.build_index("T", 0, T0, sys_flag, "U", "k")
    assert service.query_offset("T", "k", 64, *WHOLE).phy_offsets == ([0] if indexed else [])


def test_offset_below_end_phy_offset_is_skipped(service):
    build(service, 2)                          # offsets 0, 100
    [f] = service.files
    assert f.end_phy_offset == 100
    assert service.build_index("T", 50, T0 + 5000, NOT, None, "K")
    assert f.index_count == 3                  # nothing added
    assert service.query_offset("T", "K", 64, *WHOLE).phy_offsets == [100, 0]


def _entries(s: IndexService) -> list[tuple]:
    return [e[1:3] for f in s.files for e in f.iter_entries()]


def _run(s: IndexService, offsets: list[int], uniq: list, keys: list) -> bool:
    """``build_index_run`` over messages of topic T at ``offsets``."""
    n = len(offsets)
    return s.build_index_run(["T"] * n, np.asarray(offsets, np.int64),
                             np.asarray([T0 + o for o in offsets], np.int64),
                             np.zeros(n, np.int64), uniq, keys)


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("keys", ["b", "b c"])      # 3 entries fill a file; 4 go on
def test_the_last_record_passed_again_adds_no_entry(service, index_dir, bulk, keys):
    """Re-dispatch after every start passes the record at endPhyOffset again: its keys
    are there already (in one file, or over two when they filled one), so nothing is
    added (each start used to add them once more)."""
    assert service.build_index("T", 0, T0, NOT, None, "a")
    assert service.build_index("T", 100, T0, NOT, "U1", keys)
    before = _entries(service)
    service.close()
    s = reopen(index_dir)
    try:
        if bulk:
            assert _run(s, [100, 200], [b"U1", None], [keys.encode(), b"d"])
        else:
            assert s.build_index("T", 100, T0, NOT, "U1", keys)
            assert s.build_index("T", 200, T0, NOT, None, "d")
        after = _entries(s)
        assert after[:len(before)] == before and [p for _, p in after[len(before):]] == [200]
        for key in ["U1"] + keys.split():
            assert s.query_offset("T", key, 64, *WHOLE).phy_offsets == [100]
        assert s.query_offset("T", "d", 64, *WHOLE).phy_offsets == [200]
    finally:
        s.close()


@pytest.mark.parametrize("bulk", [False, True])
def test_a_key_the_last_record_lacks_is_put_when_it_is_passed_again(service, bulk):
    """A kill between two keys of one record leaves the first indexed and the second
    not: passing the record again puts the second only."""
    assert service.build_index("T", 0, T0, NOT, None, "a")
    assert service.build_index("T", 100, T0, NOT, None, "b")     # "c" never came
    if bulk:
        assert _run(service, [100], [None], [b"b c"])
    else:
        assert service.build_index("T", 100, T0, NOT, None, "b c")
    assert [phy for _, phy in _entries(service)] == [0, 100, 100]
    assert service.query_offset("T", "b", 64, *WHOLE).phy_offsets == [100]
    assert service.query_offset("T", "c", 64, *WHOLE).phy_offsets == [100]


def test_roll_over_to_new_files(service):
    offsets = build(service, 10, uniq=False)   # 3 per file: 4 files
    files = service.files
    assert len(files) == 4
    names = [f.file_name for f in files]
    assert len(set(names)) == 4 and names == sorted(names)
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert [f.index_count for f in files] == [4, 4, 4, 2]
    # each file continues where the previous one ended
    assert [(f.begin_phy_offset, f.end_phy_offset) for f in files] == \
        [(0, 200), (300, 500), (600, 800), (900, 900)]
    assert sorted(os.listdir(service.index_dir)) == names
    result = service.query_offset("T", "K", 64, *WHOLE)
    assert result.phy_offsets == offsets[::-1]          # newest file first, newest first
    assert result == QueryOffsetResult(offsets[::-1], T0 + 9000, 900)


def test_roll_over_inside_one_message(service):
    build(service, 1, keys="a b")              # 2 entries
    assert service.build_index("T", 100, T0 + 1000, NOT, "U", "c d")   # 3 more: rolls
    assert len(service.files) == 2
    for key in ("U", "c", "d"):
        assert service.query_offset("T", key, 64, *WHOLE).phy_offsets == [100]


def test_query_max_num(service):
    build(service, 10)
    assert service.query_offset("T", "K", 4, *WHOLE).phy_offsets == [900, 800, 700, 600]
    assert service.query_offset("T", "K", 0, *WHOLE).phy_offsets == []
    assert len(service.query_offset("T", "K", 1000, *WHOLE).phy_offsets) == 10  # no 64 cap here


def test_query_time_range_across_files(service):
    build(service, 10, step_ms=10_000)         # message i stored at T0 + 10 s * i
    q = service.query_offset("T", "K", 64, T0 + 15_000, T0 + 55_000)
    assert q.phy_offsets == [500, 400, 300, 200]
    q = service.query_offset("T", "K", 64, T0 + 1_000_000, T0 + 2_000_000)
    assert q.phy_offsets == [] and q.index_last_update_phyoffset == 900


def test_first_entry_of_a_rolled_file_measures_from_the_previous_end(service):
    """RocketMQ's putKey takes timeDiff against the begin it is about to replace, so
    the first entry of a rolled file reads back late by its gap to the previous file's
    end (kept for byte compatibility)."""
    build(service, 4, step_ms=10_000)          # message 3 (T0 + 30 s) opens file 2
    second = service.files[1]
    assert second.begin_timestamp == T0 + 30_000
    [(_, _, _, time_diff, _)] = list(second.iter_entries())
    assert time_diff == 10                     # (30 s - 20 s), read as T0 + 40 s
    assert service.query_offset("T", "K", 64, T0 + 30_000, T0 + 35_000).phy_offsets == []
    assert second.select_phy_offset("T#K", 64, T0 + 40_000, T0 + 40_000) == [300]
    assert service.query_offset("T", "K", 64, *WHOLE).phy_offsets == [300, 200, 100, 0]


def test_query_stops_at_a_file_that_begins_before_begin(service, monkeypatch):
    build(service, 9)                          # three full files
    first = service.files[0]
    calls = []
    original = IndexFile.select_phy_offset

    def spy(self, *args):
        calls.append(self.file_name)
        return original(self, *args)
    monkeypatch.setattr(IndexFile, "select_phy_offset", spy)
    service.query_offset("T", "K", 64, T0 + 4000, T0 + 8000)
    assert first.file_name not in calls and len(calls) == 2


def test_query_on_empty_service(service):
    assert service.query_offset("T", "K", 64, *WHOLE) == QueryOffsetResult([], 0, 0)


# ------------------------------------------------------------------ flush / durable time
def test_durable_timestamp_after_roll(service):
    assert service.durable_timestamp == 0
    build(service, 3)                          # first file exactly full, no roll yet
    assert service.durable_timestamp == 0
    build(service, 1, start=3)                 # rolls: the full file is flushed
    assert service.durable_timestamp == T0 + 2000 == service.files[0].end_timestamp
    build(service, 3, start=4)                 # second roll
    assert service.durable_timestamp == T0 + 5000


def test_flush_records_last_file_end(service):
    assert service.flush() == 0 and service.durable_timestamp == 0
    build(service, 5)
    assert service.flush() == T0 + 4000 == service.durable_timestamp


def test_flush_failure_during_roll_is_raised(service, monkeypatch):
    build(service, 3)

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(mapped_file.FILE_OPS, "fdatasync", eio)
    with pytest.raises(OSError):
        service.build_index("T", 300, T0 + 3000, NOT, None, "K")
    assert service.durable_timestamp == 0 and len(service.files) == 1
    monkeypatch.undo()
    build(service, 1, start=3)                 # retried: rolls and indexes
    assert service.query_offset("T", "K", 64, *WHOLE).phy_offsets == [300, 200, 100, 0]


def test_build_returns_false_when_no_file_can_be_created(service, monkeypatch):
    refuse_space(monkeypatch)
    assert service.build_index("T", 0, T0, NOT, None, "K") is False
    assert service.files == [] and os.listdir(service.index_dir) == []
    monkeypatch.undo()
    assert service.build_index("T", 0, T0, NOT, None, "K")


# ------------------------------------------------------------------ file names
def test_names_unique_when_the_clock_stands_still(service, monkeypatch):
    monkeypatch.setattr(index_service_module, "now_ms", lambda: T0)
    build(service, 9)
    names = [f.file_name for f in service.files]
    assert names == [time_millis_to_human_string(T0 + i) for i in range(3)]


def test_names_sort_when_the_clock_goes_back(service, monkeypatch):
    clock = iter([T0, T0 - 60_000, T0 - 120_000])
    monkeypatch.setattr(index_service_module, "now_ms", lambda: next(clock))
    build(service, 9)
    names = [f.file_name for f in service.files]
    assert names == sorted(names) and len(set(names)) == 3


# ------------------------------------------------------------------ load
def test_normal_load_keeps_every_file(service, index_dir):
    build(service, 10)
    names = [f.file_name for f in service.files]
    service.close()
    s = reopen(index_dir, True, 0)
    assert [f.file_name for f in s.files] == names
    assert s.query_offset("T", "K", 64, *WHOLE).phy_offsets == [100 * i for i in range(9, -1, -1)]
    assert s.durable_timestamp == 0
    s.close()


def test_abnormal_load_destroys_files_newer_than_the_checkpoint(service, index_dir):
    build(service, 10)                         # files end at T0+2s, +5s, +8s, +9s
    names = [f.file_name for f in service.files]
    assert service.durable_timestamp == T0 + 8000   # the third file's end, at the last roll
    checkpoint_ms = T0 + 5000                  # as if the checkpoint lagged one roll
    service.close()
    s = reopen(index_dir, False, checkpoint_ms)
    assert [f.file_name for f in s.files] == names[:2]
    assert sorted(os.listdir(index_dir)) == names[:2]
    assert s.durable_timestamp == checkpoint_ms
    # re-dispatch from the start: what is kept is skipped, the rest is rebuilt. As in
    # RocketMQ the guard is "offset < endPhyOffset"; the message *at* endPhyOffset (500)
    # is passed too, and its key, found there, is not put a second time
    build(s, 10)
    found = s.query_offset("T", "K", 64, *WHOLE).phy_offsets
    assert found == [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]
    s.close()


@pytest.mark.parametrize("last_exit_ok, end_vs_checkpoint, kept", [
    (True, -1, True), (True, 0, True), (True, +1, True),
    (False, -1, True), (False, 0, True), (False, +1, False)])
def test_load_decision_table(index_dir, last_exit_ok, end_vs_checkpoint, kept):
    f = IndexFile(os.path.join(index_dir, "20240101000000000"), SLOTS, ENTRIES)
    f.put_key("T#K", 0, T0)
    f.close()
    s = reopen(index_dir, last_exit_ok, T0 - end_vs_checkpoint)
    assert len(s.files) == (1 if kept else 0)
    assert os.path.exists(f.path) == kept
    s.close()


def test_load_skips_non_numeric_names(index_dir):
    os.makedirs(os.path.join(index_dir, "20240101000000001.d"))
    with open(os.path.join(index_dir, "README"), "w") as f:
        f.write("not an index file")
    IndexFile(os.path.join(index_dir, "20240101000000000"), SLOTS, ENTRIES).close()
    s = reopen(index_dir)
    assert [f.file_name for f in s.files] == ["20240101000000000"]
    assert os.path.exists(os.path.join(index_dir, "README"))
    s.close()


def test_load_of_missing_directory_is_empty(tmp_path):
    s = IndexService(str(tmp_path / "nowhere"), SLOTS, ENTRIES)
    s.load(False, 0)
    assert s.files == []


def test_load_of_wrong_size_file_raises_and_closes(index_dir):
    IndexFile(os.path.join(index_dir, "20240101000000000"), SLOTS, ENTRIES).close()
    with open(os.path.join(index_dir, "20240101000000001"), "wb") as f:
        f.write(b"\0" * (index_file_size(SLOTS, ENTRIES) + 20))
    s = IndexService(index_dir, SLOTS, ENTRIES)
    with pytest.raises(StoreFileError):
        s.load(True, 0)
    assert s.files == []


# ------------------------------------------------------------------ expiry and destroy
def test_delete_expired_file_never_deletes_the_last(service):
    build(service, 10)                         # file ends: 200, 500, 800, 900
    assert service.delete_expired_file(0) == 0
    assert service.delete_expired_file(200) == 0       # 200 is not < 200
    assert service.delete_expired_file(201) == 1
    assert [f.end_phy_offset for f in service.files] == [500, 800, 900]
    assert service.delete_expired_file(10**9) == 2
    [last] = service.files
    assert last.end_phy_offset == 900 and os.listdir(service.index_dir) == [last.file_name]
    assert service.query_offset("T", "K", 64, *WHOLE).phy_offsets == [900]


def test_expired_files_unmapped_without_unlink_stay_on_disk(service):
    build(service, 10)                         # file ends: 200, 500, 800, 900
    names = sorted(os.listdir(service.index_dir))
    assert service.delete_expired_file(10**9, unlink=False) == 3    # never the last
    assert sorted(os.listdir(service.index_dir)) == names           # the cleaner unlinks
    assert [f.end_phy_offset for f in service.files] == [900]


def test_delete_expired_file_stops_at_the_first_kept(index_dir):
    ends = [100, 500, 50, 10]                  # the third would qualify, but 500 is kept
    for i, end in enumerate(ends):
        f = IndexFile(os.path.join(index_dir, f"2024010100000000{i}"), SLOTS, ENTRIES)
        f.put_key("T#K", end, T0 + i)
        f.close()
    s = reopen(index_dir)
    assert s.delete_expired_file(200) == 1
    assert [f.end_phy_offset for f in s.files] == [500, 50, 10]
    assert sorted(os.listdir(index_dir)) == [f.file_name for f in s.files]
    s.close()


def test_destroy_removes_every_file(service):
    build(service, 10)
    with open(os.path.join(service.index_dir, "stray"), "w") as f:
        f.write("x")
    service.destroy()
    assert service.files == [] and os.listdir(service.index_dir) == []
    assert service.build_index("T", 0, T0, NOT, None, "K")   # usable again


def test_close_keeps_files(service):
    build(service, 4)
    names = sorted(os.listdir(service.index_dir))
    service.close()
    assert service.files == [] and sorted(os.listdir(service.index_dir)) == names


def test_abnormal_load_keeps_only_a_prefix_of_files(index_dir):
    """A file newer than the checkpoint takes every later file with it, even one whose
    own end time is older (a torn or fresh header): the kept files stay a prefix, so
    re-dispatch from the last one leaves no hole in the index."""
    names = ["20260101000000001", "20260101000000002", "20260101000000003"]
    for name, ts in zip(names, (1000, 5000, 0)):
        f = IndexFile(os.path.join(index_dir, name), 16, 16)
        if ts:
            f.put_key("T#k", ts, ts)
        f.close()
    svc = IndexService(index_dir, 16, 16)
    svc.load(False, 2000)
    try:
        assert [f.file_name for f in svc.files] == names[:1]
        assert sorted(os.listdir(index_dir)) == names[:1]
    finally:
        svc.close()
