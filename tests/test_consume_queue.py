"""ConsumeQueue: the 20-byte unit against its golden bytes, idempotent puts, pre-blank
filling, file sizes, recovery, truncation, min-offset correction, expiry, the time
search (through the store) and unit iteration.

Real files in ``tmp_path``; units are written through the ConsumeQueue and files are
read back from disk. Unit ``i`` of the synthetic queues points at CommitLog offset
``100 * i`` with size 100 unless a test says otherwise.
"""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import given, settings, strategies as st

import refcodec
from conftest import msg, small_config
from store_processes import wait_past_ms
from rocketstore.storage import GetMessageStatus, MessageStore
from rocketstore.storage.consume_queue import (
    BLANK_UNIT, CQ_STORE_UNIT_SIZE, CQ_UNIT, ConsumeQueue, ConsumeQueueView,
    _first_unit_at_or_above, _units_within, decode_unit, encode_unit)
from rocketstore.storage.hashing import tags_code
from rocketstore.storage.read_path import read_queue
from rocketstore.storage.mapped_file import offset_to_file_name

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
UNITS_PER_FILE = 32
FILE_SIZE = UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
BLANK = (0, 0x7FFFFFFF, 0)


def fixture_bytes(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name)) as f:
        return refcodec.parse_hex_fixture(f.read())


def new_queue(root, topic: str = "TopicTest", queue_id: int = 0,
              size: int = FILE_SIZE) -> ConsumeQueue:
    cq = ConsumeQueue(topic, queue_id, str(root), size)
    cq.load()
    return cq


def reloaded(cq: ConsumeQueue, root) -> ConsumeQueue:
    cq.close()
    again = new_queue(root, cq.topic, cq.queue_id, cq.mapped_file_size)
    again.recover()
    return again


def put_units(cq: ConsumeQueue, start: int, stop: int, tags: str = "TagA") -> None:
    for i in range(start, stop):
        assert cq.put_message_position_info(100 * i, 100, tags_code(tags), i)


def file_path(cq: ConsumeQueue, first_unit: int) -> str:
    return os.path.join(cq.store_path, offset_to_file_name(first_unit * CQ_STORE_UNIT_SIZE))


def file_units(path: str) -> list[tuple[int, int, int]]:
    with open(path, "rb") as f:
        return refcodec.decode_cq_file(f.read())


def units_of(cq: ConsumeQueue, start: int | None = None) -> list[tuple[int, int, int, int]]:
    return list(cq.iter_units(start))


def disk_names(cq: ConsumeQueue) -> list[str]:
    return sorted(os.listdir(cq.store_path))


@pytest.fixture
def cq(tmp_path):
    q = new_queue(tmp_path)
    yield q
    q.close()


# ------------------------------------------------------------------ golden bytes
def test_unit_codec_matches_the_golden_fixture():
    golden = fixture_bytes("cq_unit.hex")
    assert len(golden) == CQ_STORE_UNIT_SIZE == CQ_UNIT.size
    assert tags_code("TagA") == refcodec.java_hash("TagA") == 2598919
    assert encode_unit(4096, 180, tags_code("TagA")) == golden
    assert decode_unit(golden, 0) == (4096, 180, 2598919)
    assert BLANK_UNIT == struct.pack(">qiq", *BLANK)


def test_unit_written_to_disk_matches_the_golden_fixture(cq, tmp_path):
    assert cq.put_message_position_info(4096, 180, tags_code("TagA"), 0)
    with open(file_path(cq, 0), "rb") as f:
        data = f.read()
    assert len(data) == FILE_SIZE
    assert data[:20] == fixture_bytes("cq_unit.hex")
    assert data[20:] == bytes(FILE_SIZE - 20)


def test_negative_tags_code_is_stored_as_a_signed_long(cq):
    code = tags_code("order-created")
    assert code == refcodec.java_hash("order-created") == -392709271
    cq.put_message_position_info(0, 100, code, 0)
    with open(file_path(cq, 0), "rb") as f:
        assert f.read(20) == refcodec.encode_cq_unit(0, 100, -392709271)
    assert cq.get_unit(0) == (0, 100, -392709271)


# ------------------------------------------------------------------ idempotent put
def test_put_is_idempotent(cq):
    put_units(cq, 0, 3)
    assert cq.get_max_offset_in_queue() == 3
    assert cq.max_physic_offset == 300                        # end-exclusive
    assert cq.put_message_position_info(200, 100, 7, 2)       # the same unit again
    assert cq.put_message_position_info(0, 100, 7, 0)         # a unit below the end
    assert cq.put_message_position_info(100, 100, 7, 1)
    assert cq.get_max_offset_in_queue() == 3
    # a queue offset below the end, even with a new CommitLog offset, is a repeat
    assert cq.put_message_position_info(1000, 100, 7, 1)
    assert cq.get_max_offset_in_queue() == 3
    assert file_units(file_path(cq, 0)) == [(100 * i, 100, tags_code("TagA")) for i in range(3)]
    assert cq.put_message_position_info(300, 100, 9, 3)       # the next one goes in
    assert cq.get_unit(3) == (300, 100, 9)


def test_put_rolls_over_to_the_next_file(cq):
    put_units(cq, 0, UNITS_PER_FILE + 3)
    assert disk_names(cq) == [offset_to_file_name(0), offset_to_file_name(FILE_SIZE)]
    assert len(file_units(file_path(cq, 0))) == UNITS_PER_FILE
    assert file_units(file_path(cq, UNITS_PER_FILE)) == \
        [(100 * i, 100, tags_code("TagA")) for i in range(UNITS_PER_FILE, UNITS_PER_FILE + 3)]
    assert cq.get_max_offset_in_queue() == UNITS_PER_FILE + 3


# ------------------------------------------------------------------ pre-blank
@pytest.mark.parametrize("first", [5, UNITS_PER_FILE + 8, 3 * UNITS_PER_FILE])
def test_first_unit_at_a_non_zero_offset_fills_pre_blanks(tmp_path, first):
    q = new_queue(tmp_path)
    try:
        assert q.put_message_position_info(5000, 100, 42, first)
        assert q.put_message_position_info(5100, 100, 43, first + 1)
        window = first - first % UNITS_PER_FILE
        assert disk_names(q) == [offset_to_file_name(window * CQ_STORE_UNIT_SIZE)]
        blanks = first - window
        assert file_units(file_path(q, window)) == \
            [BLANK] * blanks + [(5000, 100, 42), (5100, 100, 43)]
        assert q.get_min_offset_in_queue() == first
        assert q.get_max_offset_in_queue() == first + 2
        assert units_of(q) == [(first, 5000, 100, 42), (first + 1, 5100, 100, 43)]
        assert q.get_unit(first) == (5000, 100, 42)
        assert q.get_unit(first - 1) is None
    finally:
        q.close()


def test_pre_blanks_survive_reload(tmp_path):
    q = new_queue(tmp_path)
    q.put_message_position_info(5000, 100, 42, 40)
    q = reloaded(q, tmp_path)
    try:
        q.correct_min_offset(0)
        assert q.get_max_offset_in_queue() == 41
        assert q.get_min_offset_in_queue() == 40
        assert q.max_physic_offset == 5100
        assert q.get_unit(40) == (5000, 100, 42)
    finally:
        q.close()


# ------------------------------------------------------------------ file size
@pytest.mark.parametrize("configured, rounded", [
    (20, 20), (1000, 1000), (1001, 1020), (1019, 1020), (1020, 1020), (6_000_000, 6_000_000),
])
def test_configured_size_rounds_up_to_whole_units(tmp_path, configured, rounded):
    cfg = small_config(tmp_path / "store", mapped_file_size_consume_queue=configured)
    assert cfg.consume_queue_file_size == rounded


def test_store_creates_consume_queue_files_of_the_rounded_size(tmp_path):
    cfg = small_config(tmp_path / "store", mapped_file_size_consume_queue=1001)
    with MessageStore(cfg) as store:
        for i in range(60):
            assert store.put(msg(i)).ok
        store.dispatch()
        d = os.path.join(cfg.consume_queue_dir, "TopicTest", "0")
        assert sorted(os.listdir(d)) == [offset_to_file_name(0), offset_to_file_name(1020)]
        for name in os.listdir(d):
            assert os.path.getsize(os.path.join(d, name)) == 1020
        assert store.check() == []
    with MessageStore(cfg) as store:                          # reload accepts them
        assert store.get_max_offset_in_queue("TopicTest", 0) == 60
        assert store.check() == []


# ------------------------------------------------------------------ recovery
def corrupt_unit(cq: ConsumeQueue, index: int, unit: tuple[int, int, int]) -> None:
    path = file_path(cq, index - index % UNITS_PER_FILE)
    with open(path, "r+b") as f:
        f.seek((index % UNITS_PER_FILE) * CQ_STORE_UNIT_SIZE)
        f.write(struct.pack(">qiq", *unit))


@pytest.mark.parametrize("bad", [(0, 0, 0), (-1, 100, 7), (500, -5, 7), (500, 0, 7)])
def test_recover_cuts_at_the_first_invalid_unit(tmp_path, bad):
    q = new_queue(tmp_path)
    put_units(q, 0, 10)
    corrupt_unit(q, 6, bad)
    q = reloaded(q, tmp_path)
    try:
        assert q.get_max_offset_in_queue() == 6
        assert q.max_physic_offset == 600
        with open(file_path(q, 0), "rb") as f:
            data = f.read()
        assert data[6 * 20:] == bytes(FILE_SIZE - 6 * 20), "the cut tail is zeroed"
        assert q.put_message_position_info(600, 100, 1, 6)   # writing resumes at the cut
        assert q.get_unit(6) == (600, 100, 1)
    finally:
        q.close()


def test_recover_cuts_in_a_middle_file_and_unlinks_later_ones(tmp_path):
    q = new_queue(tmp_path)
    put_units(q, 0, 2 * UNITS_PER_FILE + 5)
    corrupt_unit(q, UNITS_PER_FILE + 3, (0, 0, 0))
    q = reloaded(q, tmp_path)
    try:
        assert q.get_max_offset_in_queue() == UNITS_PER_FILE + 3
        assert disk_names(q) == [offset_to_file_name(0), offset_to_file_name(FILE_SIZE)]
        assert q.max_physic_offset == 100 * (UNITS_PER_FILE + 3)
    finally:
        q.close()


def test_recover_of_an_intact_queue_keeps_everything(tmp_path):
    q = new_queue(tmp_path)
    put_units(q, 0, UNITS_PER_FILE)                           # exactly one full file
    q = reloaded(q, tmp_path)
    try:
        assert q.get_max_offset_in_queue() == UNITS_PER_FILE
        assert q.max_physic_offset == 100 * UNITS_PER_FILE
        put_units(q, UNITS_PER_FILE, UNITS_PER_FILE + 1)
        assert disk_names(q)[-1] == offset_to_file_name(FILE_SIZE)
    finally:
        q.close()


# ------------------------------------------------------------------ truncation
def test_truncate_dirty_logic_files_cuts_units_at_or_past_the_offset(cq):
    put_units(cq, 0, 10)
    cq.truncate_dirty_logic_files(550)          # units at 0..500 stay, 600.. go
    assert cq.get_max_offset_in_queue() == 6
    assert cq.max_physic_offset == 600
    assert file_units(file_path(cq, 0)) == [(100 * i, 100, tags_code("TagA")) for i in range(6)]
    cq.truncate_dirty_logic_files(500)          # a unit starting exactly at it goes
    assert cq.get_max_offset_in_queue() == 5
    assert cq.put_message_position_info(500, 100, 3, 5)
    assert cq.get_unit(5) == (500, 100, 3)


def test_truncate_dirty_logic_files_unlinks_a_last_file_wholly_past_the_offset(cq):
    put_units(cq, 0, UNITS_PER_FILE + 8)
    cq.truncate_dirty_logic_files(100 * 30)
    assert disk_names(cq) == [offset_to_file_name(0)]
    assert cq.get_max_offset_in_queue() == 30
    assert cq.max_physic_offset == 3000
    put_units(cq, 30, UNITS_PER_FILE + 2)
    assert cq.get_max_offset_in_queue() == UNITS_PER_FILE + 2
    assert [u[0] for u in units_of(cq)] == list(range(UNITS_PER_FILE + 2))


def test_truncate_past_the_end_changes_nothing(cq):
    put_units(cq, 0, 4)
    cq.truncate_dirty_logic_files(10_000)
    assert cq.get_max_offset_in_queue() == 4
    assert cq.max_physic_offset == 400


# ------------------------------------------------------------------ min offset, expiry
def test_correct_min_offset_moves_to_the_first_unit_still_in_the_commit_log(cq):
    put_units(cq, 0, 10)
    assert cq.get_min_offset_in_queue() == 0
    cq.correct_min_offset(350)
    assert cq.get_min_offset_in_queue() == 4
    cq.correct_min_offset(400)
    assert cq.get_min_offset_in_queue() == 4
    cq.correct_min_offset(0)                      # never moves back
    assert cq.get_min_offset_in_queue() == 4
    cq.correct_min_offset(10_000)                 # everything gone: min = max
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 10


def test_correct_min_offset_skips_pre_blanks(cq):
    cq.put_message_position_info(5000, 100, 1, 7)
    cq.put_message_position_info(5100, 100, 1, 8)
    cq.min_logic_offset = 0
    cq.correct_min_offset(0)
    assert cq.get_min_offset_in_queue() == 7


def test_delete_expired_file_by_min_commit_log_offset(cq):
    put_units(cq, 0, 3 * UNITS_PER_FILE + 4)
    # file 0's last unit points at 3100: below 3150 it goes; file 1 (last at 6300) stays
    assert cq.delete_expired_file(3150) == 1
    assert disk_names(cq) == [offset_to_file_name(i * FILE_SIZE) for i in (1, 2, 3)]
    assert cq.get_min_offset_in_queue() == 32           # 3200 is the first kept
    assert cq.delete_expired_file(3150) == 0
    assert cq.delete_expired_file(6300) == 0             # last unit exactly at it: kept
    assert cq.get_min_offset_in_queue() == 63
    assert cq.delete_expired_file(10**9) == 2            # never the last file
    assert disk_names(cq) == [offset_to_file_name(3 * FILE_SIZE)]
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue()
    assert cq.get_unit(0) is None


def test_expired_files_unmapped_without_unlink_stay_on_disk(cq):
    put_units(cq, 0, 2 * UNITS_PER_FILE + 4)
    names = disk_names(cq)
    assert cq.delete_expired_file(10**9, unlink=False) == 2     # never the last file
    assert disk_names(cq) == names                              # the cleaner unlinks
    assert [mf.file_from_offset for mf in cq.mapped_file_queue.mapped_files] == \
        [2 * FILE_SIZE]
    assert cq.mapped_file_queue.flushed_where >= 2 * FILE_SIZE


def test_rewind_to_moves_the_write_position_back_to_the_first_unit_at_or_past(cq):
    put_units(cq, 0, UNITS_PER_FILE + 3)                # units point at 100 * i
    mfq = cq.mapped_file_queue
    cq.flush(0)
    assert cq.rewind_to(100 * (UNITS_PER_FILE + 1)) == 2
    assert cq.get_max_offset_in_queue() == UNITS_PER_FILE + 1
    assert cq.max_physic_offset == 100 * (UNITS_PER_FILE + 1)
    assert mfq.flushed_where <= mfq.get_max_offset()
    # the units are written again, each over itself; a repeat is skipped
    put_units(cq, 0, UNITS_PER_FILE + 3)
    assert units_of(cq)[-1] == (UNITS_PER_FILE + 2, 100 * (UNITS_PER_FILE + 2), 100,
                                tags_code("TagA"))
    # a rewind to the start of the last file closes it, keeping it on disk
    names = disk_names(cq)
    assert cq.rewind_to(100 * UNITS_PER_FILE) == 3
    assert len(mfq.mapped_files) == 1 and disk_names(cq) == names
    assert cq.get_max_offset_in_queue() == UNITS_PER_FILE
    assert cq.max_physic_offset == 100 * UNITS_PER_FILE


def test_reads_after_expiry_roll_to_the_next_file(cq):
    put_units(cq, 0, 2 * UNITS_PER_FILE + 1)
    cq.delete_expired_file(100 * UNITS_PER_FILE)
    assert cq.get_index_buffer(3) is None
    assert cq.roll_next_file(3) == UNITS_PER_FILE
    assert cq.get_unit(UNITS_PER_FILE) == (100 * UNITS_PER_FILE, 100, tags_code("TagA"))


# ------------------------------------------------------------------ iteration
def test_iter_units_from_min_and_from_a_start(cq):
    put_units(cq, 0, UNITS_PER_FILE + 3)
    all_units = units_of(cq)
    assert [u[0] for u in all_units] == list(range(UNITS_PER_FILE + 3))
    assert all_units[5] == (5, 500, 100, tags_code("TagA"))
    assert [u[0] for u in units_of(cq, 30)] == list(range(30, UNITS_PER_FILE + 3))
    assert units_of(cq, UNITS_PER_FILE + 3) == []
    cq.correct_min_offset(100 * 10)
    assert units_of(cq)[0] == (10, 1000, 100, tags_code("TagA"))


def test_iter_units_from_below_the_min_still_yields_the_units_that_exist(cq):
    """A start below the min offset (in the same file) must not skip the live units."""
    cq.put_message_position_info(5000, 100, 42, 8)
    cq.put_message_position_info(5100, 100, 42, 9)
    got = [u for u in units_of(cq, 0) if u[2] != 0x7FFFFFFF]
    assert got == [(8, 5000, 100, 42), (9, 5100, 100, 42)]


# ------------------------------------------------------------------ time search (store)
def put_at_distinct_times(store, count: int, gap_ms: int = 4) -> list:
    """One message per burst, each stored at least ``gap_ms`` after the previous."""
    results = []
    for i in range(count):
        if results:
            while time.time_ns() // 1_000_000 < results[-1].store_timestamp + gap_ms:
                time.sleep(0.0005)
        r = store.put(msg(i))
        assert r.ok
        results.append(r)
    times = [r.store_timestamp for r in results]
    assert all(b - a >= gap_ms for a, b in zip(times, times[1:]))
    return results


def test_get_offset_in_queue_by_time(store):
    results = put_at_distinct_times(store, 12)
    by_time = lambda ts: store.get_offset_in_queue_by_time("TopicTest", 0, ts)  # noqa: E731
    times = [r.store_timestamp for r in results]
    for r in results:                                            # exact match
        assert by_time(r.store_timestamp) == r.queue_offset
    for i in range(len(times) - 1):                              # nearest neighbour
        assert by_time(times[i] + 1) == i
        assert by_time(times[i + 1] - 1) == i + 1
        if (times[i] + times[i + 1]) % 2 == 0:                  # a tie goes to the earlier
            assert by_time((times[i] + times[i + 1]) // 2) == i
    assert by_time(times[0] - 60_000) == 0                       # before the first
    assert by_time(0) == 0
    assert by_time(times[-1] + 60_000) == len(times) - 1         # after the last
    assert by_time(times[0]) == 0
    assert store.get_offset_in_queue_by_time("NoSuchTopic", 0, times[0]) == 0


def test_get_offset_in_queue_by_time_with_equal_store_times(store):
    """A burst shares one store time: any unit of the burst is an exact match."""
    first = put_at_distinct_times(store, 2)
    burst = store.put_batch([msg(i) for i in range(2, 6)])
    assert len({r.store_timestamp for r in burst}) == 1
    got = store.get_offset_in_queue_by_time("TopicTest", 0, burst[0].store_timestamp)
    assert got in {r.queue_offset for r in burst}
    assert store.get_offset_in_queue_by_time("TopicTest", 0, first[0].store_timestamp) == 0


def test_get_offset_in_queue_by_time_across_files_picks_the_file_by_mtime(store, config):
    """The search runs in the first file modified at or after the time (os.utime sets
    each file's mtime to its last message's store time, as appends would)."""
    results = put_at_distinct_times(store, UNITS_PER_FILE + 8, gap_ms=2)
    store.dispatch()
    times = [r.store_timestamp for r in results]
    d = os.path.join(config.consume_queue_dir, "TopicTest", "0")
    for first, last in ((0, UNITS_PER_FILE - 1), (UNITS_PER_FILE, len(times) - 1)):
        ns = times[last] * 1_000_000
        os.utime(os.path.join(d, offset_to_file_name(first * CQ_STORE_UNIT_SIZE)), ns=(ns, ns))
    by_time = lambda ts: store.get_offset_in_queue_by_time("TopicTest", 0, ts)  # noqa: E731
    for i in (0, 7, UNITS_PER_FILE - 1, UNITS_PER_FILE, UNITS_PER_FILE + 5, len(times) - 1):
        assert by_time(times[i]) == i
    assert by_time(times[0] - 1000) == 0
    assert by_time(times[-1] + 1000) == len(times) - 1


# ------------------------------------------------------------------ through the store
def test_store_units_point_at_their_records(store):
    results = [store.put(msg(i, queue_id=i % 2)) for i in range(50)]
    store.dispatch()
    for qid in (0, 1):
        cq = store.find_consume_queue("TopicTest", qid, create=False)
        mine = [r for r in results if r.queue_id == qid]
        units = units_of(cq)
        assert [(u[0], u[1], u[2]) for u in units] == \
            [(r.queue_offset, r.wrote_offset, r.wrote_bytes) for r in mine]
        for (index, phy, size, code), r in zip(units, mine):
            m = store.look_message_by_offset(phy)
            assert code == tags_code(m.tags) == refcodec.java_hash(m.tags)
    g = store.get_message("g", "TopicTest", 0, 0, 4)
    assert g.status is GetMessageStatus.FOUND and len(g.messages) == 4


def test_a_view_remembers_its_bounds_but_not_a_unit_read_torn(tmp_path):
    """Asked again with the same bound, a reader's view answers as before; but a unit
    the dispatcher was writing past the bound, read torn so that it looked inside it
    (its old zero offset, its new size), is counted once and not remembered."""
    cq = new_queue(tmp_path)
    put_units(cq, 0, 5)                              # records [0, 500)
    view = ConsumeQueueView("TopicTest", 0, str(tmp_path), FILE_SIZE)
    assert view.bounds(500, 0) == (0, 5) == view.bounds(500, 0)
    mf = cq.mapped_file_queue.get_last_mapped_file()
    torn = CQ_UNIT.pack(0, 100, 0)                   # unit 5 half written: looks within
    mf.buf[5 * CQ_STORE_UNIT_SIZE:6 * CQ_STORE_UNIT_SIZE] = torn
    assert view.bounds(499, 0) == (0, 4)             # another bound: searched again
    assert view.bounds(500, 0) == (0, 6)             # the torn unit counted
    put_units(cq, 5, 6)                              # ... then written whole: [500, 600)
    assert view.bounds(500, 0) == (0, 5)             # read again, not remembered
    view.close()
    cq.close()


def test_a_unit_past_the_bound_ends_a_read_and_is_never_skipped(tmp_path):
    """A unit counted within the bound from a torn read, read again whole and past the
    bound (the reader has no bytes for its record yet), ends the read at itself: the
    next read starts there instead of past a message nobody read."""
    cq = new_queue(tmp_path)
    put_units(cq, 0, 6)                              # records [0, 600)

    def read_unit(index, phy, size, where):          # as StoreReader's: nothing past 500
        return f"m{index}" if phy + size <= 500 else None

    got = read_queue(cq, 4, 32, set(), 0, 6, read_unit, config=small_config(tmp_path),
                     max_phy=500, memory_limit=1 << 30, roll_next_file=lambda phy: phy + 1)
    assert got.messages == ["m4"] and got.next_begin_offset == 5
    cq.close()


@given(st.integers(0, 10), st.integers(0, 38), st.integers(0, 50), st.integers(0, 50))
@settings(max_examples=300)
def test_a_view_finds_its_bounds_alike_from_any_hint(blanks, written, bound_units, hint):
    """A reader's search for the units within a bound, started from any guess (a stale
    one, one past the answer, one past the file), finds what the plain search finds;
    so does the search for the first unit not expired. (Blank units lead a queue whose
    first offset was not 0, as pre-blank filling leaves them.)"""
    units = [BLANK] * blanks + [(100 * i, 100, 7) for i in range(blanks, blanks + written)]
    per_file = 48
    buf = b"".join(CQ_UNIT.pack(*u) for u in units) + \
        bytes(CQ_STORE_UNIT_SIZE * (per_file - len(units)))
    bound = 100 * bound_units
    plain = _units_within(buf, per_file, bound)
    assert plain == _units_within(buf, per_file, bound, hint)
    assert plain == next((i for i, u in enumerate(units)
                          if u != BLANK and u[0] + u[1] > bound), len(units))
    for min_phy in (0, bound, 100 * hint):
        assert _first_unit_at_or_above(buf, len(units), min_phy) == next(
            (i for i, u in enumerate(units) if u != BLANK and u[0] >= min_phy), len(units))


def test_offset_by_time_searches_the_file_by_its_store_times_not_its_mtime(tmp_path):
    """A queue over several consume queue files, every file's mtime older than its
    messages (mmap writes move a file's mtime only when a page is first dirtied, so it
    lags the store times of later units; set here with os.utime): every message is
    found by its own store time, and a time between two files' messages answers the
    nearer of the two. (Picked by mtime, the search went to the last file and missed.)"""
    config = small_config(tmp_path, mapped_file_size_consume_queue=20 * 8)
    with MessageStore(config, background=False) as store:
        for batch in range(5):
            results = store.put_batch([msg(batch * 5 + i, queue_id=0) for i in range(5)])
            assert all(r.ok for r in results)
            wait_past_ms(results[-1].store_timestamp + 4)   # batches 5 ms apart at least
        store.dispatch()
        cq_dir = os.path.join(config.consume_queue_dir, "TopicTest", "0")
        files = sorted(os.listdir(cq_dir))
        assert len(files) >= 3
        for name in files:
            os.utime(os.path.join(cq_dir, name), ns=(0, 0))
        stored = [store.get_message("g", "TopicTest", 0, k, 1).messages[0].store_timestamp
                  for k in range(25)]
        for k, ts in enumerate(stored):
            got = store.get_offset_in_queue_by_time("TopicTest", 0, ts)
            assert stored[got] == ts, (k, got)
        ends = [(k, k + 1) for k in range(24) if stored[k + 1] - stored[k] >= 4]
        assert ends
        for k, after in ends:                 # a time between two batches: the nearer
            assert store.get_offset_in_queue_by_time("TopicTest", 0, stored[k] + 1) == k
            assert store.get_offset_in_queue_by_time("TopicTest", 0, stored[after] - 1) == after
