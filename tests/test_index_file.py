"""IndexFile: layout, putKey/selectPhyOffset, capacity, reopen, bad files.

Files are tiny (a handful of slots and entries) so collisions and a full file come
quickly. Bytes are cross-checked against ``tests/refcodec.py`` (an independent codec) and
the golden fixture ``tests/fixtures/index_small.hex``.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import pathlib
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import refuse_space
import refcodec
from rocketstore.storage import mapped_file
from rocketstore.storage.errors import CorruptRecordError, StoreClosedError, StoreFileError
from rocketstore.storage.hashing import index_key_hash
from rocketstore.storage.index_file import (
    INDEX_ENTRY, INDEX_HEADER_SIZE, INDEX_SIZE, IndexFile, decode_entry, decode_header,
    encode_entry, encode_header, human_string_to_time_millis, index_file_size,
    time_millis_to_human_string)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
T0 = 1_700_000_000_000
WHOLE = (0, 2**63 - 1)
SLOTS, ENTRIES = 16, 16


def new_file(tmp_path, name="20240101000000000", slots=SLOTS, entries=ENTRIES, **kw):
    return IndexFile(str(tmp_path / name), slots, entries, **kw)


def same_slot_keys(n: int, slots: int = SLOTS) -> list[str]:
    """``n`` keys with different hashes that share one slot."""
    by_slot: dict[int, list[str]] = {}
    i = 0
    while True:
        key = f"T#k{i}"
        group = by_slot.setdefault(index_key_hash(key) % slots, [])
        if all(index_key_hash(k) != index_key_hash(key) for k in group):
            group.append(key)
        if len(group) == n:
            return group
        i += 1


# ------------------------------------------------------------------ codecs, no disk
def test_header_codec_golden_bytes():
    raw = encode_header(T0, T0 + 2500, 0, 400, 3, 4)
    assert raw.hex() == ("0000018bcfe56800" "0000018bcfe571c4" "0000000000000000"
                         "0000000000000190" "00000003" "00000004")
    assert decode_header(raw) == (T0, T0 + 2500, 0, 400, 3, 4)
    assert len(raw) == INDEX_HEADER_SIZE == 40


def test_entry_codec_golden_bytes():
    raw = encode_entry(2746024, 400, 2, 1)
    assert raw.hex() == "0029e6a8" "0000000000000190" "00000002" "00000001"
    assert decode_entry(raw, 0) == (2746024, 400, 2, 1)
    assert INDEX_ENTRY.size == INDEX_SIZE == 20


def test_file_size_formula():
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040
    assert index_file_size(8, 8) == 40 + 32 + 160


@pytest.mark.parametrize("key, java_hash_code, index_hash", [
    # String.hashCode() values printed by OpenJDK 17
    ("hello", 99162322, 99162322),
    ("Aa", 2112, 2112),
    ("BB", 2112, 2112),
    ("abc", 96354, 96354),
    ("", 0, 0),
    ("Hello World", -862545276, 862545276),
    ("TopicTest#KEY1", -1656969516, 1656969516),
    ("polygenelubricants", -2147483648, 0),   # abs(Integer.MIN_VALUE) stays negative
    ("\U0001F600", 1772899, 1772899),          # a surrogate pair: two code units
    ("T#\u00e9\u4e2d", 2563315, 2563315),
    ("TopicTest#k1", 2746024, 2746024),
])
def test_java_hash_vectors(key, java_hash_code, index_hash):
    from rocketstore.storage.hashing import java_string_hash
    assert java_string_hash(key) == java_hash_code
    assert index_key_hash(key) == index_hash


def test_file_name_is_local_time_with_millis():
    ms = T0 + 42
    expected = datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y%m%d%H%M%S") + "042"
    assert time_millis_to_human_string(ms) == expected
    assert len(expected) == 17
    assert human_string_to_time_millis(expected) == ms
    with pytest.raises(ValueError):
        human_string_to_time_millis("not-a-name")


# ------------------------------------------------------------------ create / header
def test_new_file_is_preallocated_with_fresh_header(tmp_path):
    f = new_file(tmp_path)
    size = index_file_size(SLOTS, ENTRIES)
    st_ = os.stat(f.path)
    assert st_.st_size == size
    assert st_.st_blocks * 512 >= size          # allocated, not sparse
    assert (f.index_count, f.hash_slot_count) == (1, 0)
    assert (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset) == (0,) * 4
    assert decode_header(pathlib.Path(f.path).read_bytes()) == (0, 0, 0, 0, 0, 1)
    assert f.file_name == "20240101000000000"
    assert not f.is_write_full()
    f.close()


def test_new_file_starts_at_previous_end(tmp_path):
    f = new_file(tmp_path, end_phy_offset=4096, end_timestamp=T0)
    assert (f.begin_phy_offset, f.end_phy_offset) == (4096, 4096)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0)
    assert decode_header(pathlib.Path(f.path).read_bytes()) == (T0, T0, 4096, 4096, 0, 1)
    # the first put moves begin to itself; its timeDiff is measured from the old begin
    assert f.put_key("T#a", 5000, T0 + 3500)
    assert (f.begin_phy_offset, f.begin_timestamp) == (5000, T0 + 3500)
    [(_, _, _, time_diff, _)] = list(f.iter_entries())
    assert time_diff == 3
    f.close()


def test_rolled_file_bytes_match_reference(tmp_path):
    f = new_file(tmp_path, slots=8, entries=8, end_phy_offset=4096, end_timestamp=T0)
    ref = refcodec.new_index_file(8, 8, 4096, T0)
    for key, off, ts in [("T#a", 5000, T0 + 3500), ("T#b", 5100, T0 + 9000)]:
        assert f.put_key(key, off, ts)
        assert refcodec.index_put_key(ref, 8, 8, key, off, ts)
    f.close()
    assert pathlib.Path(f.path).read_bytes() == bytes(ref)


def test_header_values_after_puts(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#a", 100, T0)
    f.put_key("T#b", 200, T0 + 1000)
    f.put_key("T#a", 300, T0 + 2000)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0 + 2000)
    assert (f.begin_phy_offset, f.end_phy_offset) == (100, 300)
    assert (f.hash_slot_count, f.index_count) == (3, 4)
    # written through to the mapping, no flush needed to see it in the file
    assert decode_header(pathlib.Path(f.path).read_bytes()) == (T0, T0 + 2000, 100, 300, 3, 4)
    f.close()


def test_golden_fixture_index_small(tmp_path):
    doc = json.loads((FIXTURES / "index_small.json").read_text())
    golden = refcodec.parse_hex_fixture((FIXTURES / "index_small.hex").read_text())
    f = new_file(tmp_path, slots=doc["hash_slot_num"], entries=doc["index_num"])
    for put in doc["puts"]:
        assert f.put_key(put["key"], put["phy_offset"], put["store_timestamp"])
    for q in doc["derived"]["queries"]:
        assert f.select_phy_offset(q["key"], 64, q["begin_ms"], q["end_ms"]) == q["phy_offsets"]
    f.close()
    assert pathlib.Path(f.path).read_bytes() == golden


# ------------------------------------------------------------------ put / select
def test_collisions_in_one_slot_walk_newest_first(tmp_path):
    a, b, c = same_slot_keys(3)
    f = new_file(tmp_path)
    for i, key in enumerate([a, b, a, c, a, b]):
        assert f.put_key(key, (i + 1) * 100, T0 + i * 1000)
    assert f.select_phy_offset(a, 64, *WHOLE) == [500, 300, 100]
    assert f.select_phy_offset(b, 64, *WHOLE) == [600, 200]
    assert f.select_phy_offset(c, 64, *WHOLE) == [400]
    assert f.select_phy_offset(a, 2, *WHOLE) == [500, 300]
    assert f.select_phy_offset(a, 0, *WHOLE) == []
    # the chain links every entry of the slot, newest first
    pre = {n: p for n, _, _, _, p in f.iter_entries()}
    assert [pre[6], pre[5], pre[4], pre[3], pre[2], pre[1]] == [5, 4, 3, 2, 1, 0]
    f.close()


def test_same_hash_keys_are_both_candidates(tmp_path):
    assert index_key_hash("Aa") == index_key_hash("BB")
    f = new_file(tmp_path)
    f.put_key("Aa", 10, T0)
    f.put_key("BB", 20, T0)
    assert f.select_phy_offset("Aa", 64, *WHOLE) == [20, 10]   # the caller verifies
    assert f.select_phy_offset("zz-not-there", 64, *WHOLE) == []
    f.close()


def test_select_filters_by_time(tmp_path):
    f = new_file(tmp_path)
    for i in range(5):
        f.put_key("T#k", i, T0 + i * 10_000)
    assert f.select_phy_offset("T#k", 64, T0 + 15_000, T0 + 35_000) == [3, 2]
    assert f.select_phy_offset("T#k", 64, T0, T0) == [0]
    assert f.select_phy_offset("T#k", 64, T0 + 41_000, T0 + 99_000) == []
    assert f.select_phy_offset("T#k", 64, 0, T0 - 1) == []
    f.close()


def test_entry_times_are_whole_seconds(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#k", 1, T0)
    f.put_key("T#k", 2, T0 + 1999)      # timeDiff 1: read back as T0 + 1000
    assert f.select_phy_offset("T#k", 64, T0 + 1500, T0 + 3000) == []
    assert f.select_phy_offset("T#k", 64, T0 + 1000, T0 + 1000) == [2]
    f.close()


def test_time_diff_clamps(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#a", 1, T0)
    f.put_key("T#b", 2, T0 - 5000)             # before begin: 0
    f.put_key("T#c", 3, T0 + 2**31 * 1000 * 2)  # beyond an int: Integer.MAX_VALUE
    diffs = [d for _, _, _, d, _ in f.iter_entries()]
    assert diffs == [0, 0, 2**31 - 1]
    f.close()


def test_capacity_is_index_num_minus_one(tmp_path):
    f = new_file(tmp_path, entries=8)
    for i in range(7):
        assert f.put_key(f"T#k{i}", i, T0 + i)
    assert f.is_write_full()
    before = pathlib.Path(f.path).read_bytes()
    assert f.put_key("T#late", 99, T0 + 99) is False
    assert pathlib.Path(f.path).read_bytes() == before
    assert (f.index_count, f.end_phy_offset) == (8, 6)
    assert [e[0] for e in f.iter_entries()] == list(range(1, 8))
    f.close()


def test_is_time_matched_is_range_overlap(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#a", 1, T0)
    f.put_key("T#a", 2, T0 + 10_000)
    assert f.is_time_matched(T0 - 5, T0 + 20_000)       # covers
    assert f.is_time_matched(T0 + 1, T0 + 2)            # inside
    assert f.is_time_matched(T0 - 5, T0)                # touches begin
    assert f.is_time_matched(T0 + 10_000, T0 + 20_000)  # touches end
    assert not f.is_time_matched(T0 - 5, T0 - 1)
    assert not f.is_time_matched(T0 + 10_001, T0 + 20_000)
    f.close()


def test_iter_entries(tmp_path):
    f = new_file(tmp_path)
    assert list(f.iter_entries()) == []
    f.put_key("T#a", 7, T0)
    f.put_key("T#a", 8, T0 + 3000)
    h = index_key_hash("T#a")
    assert list(f.iter_entries()) == [(1, h, 7, 0, 0), (2, h, 8, 3, 1)]
    assert f.slot_value(h % SLOTS) == 2
    f.close()


def test_corrupt_chain_does_not_loop(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#a", 1, T0)
    f.put_key("T#a", 2, T0)
    f.close()
    with open(f.path, "r+b") as raw:           # entry 1 now links forward to entry 2
        raw.seek(INDEX_HEADER_SIZE + SLOTS * 4 + 1 * INDEX_SIZE + 16)
        raw.write((2).to_bytes(4, "big"))
    f = new_file(tmp_path)
    assert f.select_phy_offset("T#a", 64, *WHOLE) == [2, 1]
    f.close()


# ------------------------------------------------------------------ reopen / bad files
def test_reopen_keeps_everything(tmp_path):
    f = new_file(tmp_path)
    for i in range(5):
        f.put_key(f"T#k{i % 2}", i * 10, T0 + i * 1000)
    f.flush()
    header = (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset,
              f.hash_slot_count, f.index_count)
    entries = list(f.iter_entries())
    f.close()
    g = new_file(tmp_path, end_phy_offset=999_999, end_timestamp=1)  # ignored: file exists
    assert (g.begin_timestamp, g.end_timestamp, g.begin_phy_offset, g.end_phy_offset,
            g.hash_slot_count, g.index_count) == header
    assert list(g.iter_entries()) == entries
    assert g.select_phy_offset("T#k0", 64, *WHOLE) == [40, 20, 0]
    assert g.put_key("T#k1", 50, T0 + 5000)
    assert g.select_phy_offset("T#k1", 64, *WHOLE) == [50, 30, 10]
    g.close()


def test_wrong_size_raises(tmp_path):
    path = tmp_path / "20240101000000000"
    data = bytearray(index_file_size(SLOTS, ENTRIES) - 1)
    data[:40] = encode_header(T0, T0, 0, 0, 0, 1)       # written: not a cut creation
    path.write_bytes(bytes(data))
    with pytest.raises(StoreFileError) as e:
        IndexFile(str(path), SLOTS, ENTRIES)
    assert str(path) in str(e.value)
    assert os.path.getsize(path) == len(data)           # left as it was
    f = new_file(tmp_path, name="20240101000000001")
    f.close()
    with pytest.raises(StoreFileError):       # opened with other dimensions
        IndexFile(f.path, SLOTS * 2, ENTRIES)


@pytest.mark.parametrize("length", [0, index_file_size(SLOTS, ENTRIES) // 2])
def test_short_never_written_file_is_initialised(tmp_path, length):
    """A creation cut short by a crash: before the first reservation, or between it and
    the ftruncate to full size."""
    path = tmp_path / "20240101000000000"
    path.write_bytes(b"")
    os.truncate(path, length)
    f = IndexFile(str(path), SLOTS, ENTRIES)
    assert os.path.getsize(path) == index_file_size(SLOTS, ENTRIES)
    assert f.index_count == 1 and f.put_key("T#a", 1, T0)
    f.close()


def test_index_count_zero_on_disk_reads_as_one(tmp_path):
    path = tmp_path / "20240101000000000"
    path.write_bytes(bytes(refcodec.new_index_file(SLOTS, ENTRIES)))  # as Java leaves it
    f = IndexFile(str(path), SLOTS, ENTRIES)
    assert f.index_count == 1
    assert f.put_key("T#a", 1, T0) and f.select_phy_offset("T#a", 64, *WHOLE) == [1]
    f.close()


def test_impossible_index_count_raises(tmp_path):
    path = tmp_path / "20240101000000000"
    data = bytearray(index_file_size(SLOTS, ENTRIES))
    data[:40] = encode_header(T0, T0, 0, 0, 0, ENTRIES + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as e:
        IndexFile(str(path), SLOTS, ENTRIES)
    assert e.value.offset == 36


def test_allocation_failure_leaves_no_file(tmp_path, monkeypatch):
    refuse_space(monkeypatch)
    with pytest.raises(StoreFileError, match="cannot allocate"):
        new_file(tmp_path)
    assert os.listdir(tmp_path) == []


def test_flush_error_is_raised(tmp_path, monkeypatch):
    f = new_file(tmp_path)
    f.flush()

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(mapped_file.FILE_OPS, "fdatasync", eio)
    with pytest.raises(OSError):
        f.flush()
    f.close()


def test_closed_file_refuses_use_and_destroy_unlinks(tmp_path):
    f = new_file(tmp_path)
    f.put_key("T#a", 1, T0)
    f.close()
    f.close()                                  # idempotent
    assert f.closed and os.path.exists(f.path)
    for call in (lambda: f.put_key("T#a", 2, T0), lambda: f.flush(),
                 lambda: f.select_phy_offset("T#a", 1, *WHOLE), lambda: list(f.iter_entries())):
        with pytest.raises(StoreClosedError):
            call()
    f.destroy()
    assert not os.path.exists(f.path)
    f.destroy()                                # already gone: no error


# ------------------------------------------------------------------ property
KEYS = st.text(alphabet="abcAB#", min_size=0, max_size=6)
PUTS = st.lists(st.tuples(KEYS, st.integers(0, 2**40), st.integers(T0 - 10**6, T0 + 10**7)),
                min_size=1, max_size=31)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(puts=PUTS)
def test_property_every_put_is_found_and_nothing_else(puts):
    slots, entries = 4, 32                     # 4 slots: long collision chains
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile(os.path.join(d, "20240101000000000"), slots, entries)
        for key, off, ts in puts:
            assert f.put_key(key, off, ts)
        offsets_by_hash: dict[int, set[int]] = {}
        for key, off, _ in puts:
            offsets_by_hash.setdefault(index_key_hash(key), set()).add(off)
        for key, off, _ in puts:
            found = f.select_phy_offset(key, len(puts), *WHOLE)
            assert off in found
            assert set(found) <= offsets_by_hash[index_key_hash(key)]
        f.close()
        data = pathlib.Path(f.path).read_bytes()
    assert data == refcodec.encode_index_file(slots, entries, puts)


def test_a_header_write_never_passes_through_zeros(tmp_path, monkeypatch):
    """struct's ``pack_into`` zero-fills its whole span before writing the fields, so a
    kill in between left indexCount 0 (the next dispatcher then wrote over every entry
    of the file). Headers are packed apart and copied in: the mapping is never seen
    with a zero count, here watched by failing the pack half way."""
    import struct
    from rocketstore.storage import index_file as module
    f = IndexFile(str(tmp_path / "20240101000000000"), 8, 16, 0, 0)
    try:
        for i in range(3):
            assert f.put_key(f"k{i}", 100 * (i + 1), 1_700_000_000_000 + i)
        before = bytes(f._buf[:module.INDEX_HEADER_SIZE])

        class Failing:
            size = module.INDEX_HEADER.size

            def pack_into(self, *args):
                raise AssertionError("pack_into on the mapping")

            def pack(self, *args):
                raise struct.error("killed half way")

        monkeypatch.setattr(module, "INDEX_HEADER", Failing())
        with pytest.raises(struct.error):
            f.put_key("k3", 400, 1_700_000_000_003)
        assert bytes(f._buf[:module.INDEX_HEADER_SIZE]) == before
    finally:
        monkeypatch.undo()
        f.close()


def test_a_torn_header_with_indexcount_0_is_read_back_from_its_entries(tmp_path):
    """A header torn by an older version: every entry counted in hashSlotCount too."""
    from rocketstore.storage.index_file import INDEX_COUNT_POS
    path = str(tmp_path / "20240101000000000")
    f = IndexFile(path, 8, 16, 0, 0)
    for i in range(5):
        assert f.put_key(f"k{i}", 100 * (i + 1), 1_700_000_000_000 + i)
    f._buf[INDEX_COUNT_POS:INDEX_COUNT_POS + 4] = bytes(4)
    f.close()
    again = IndexFile(path, 8, 16, 0, 0)
    try:
        assert again.index_count == 6                  # entries 1..5 kept, not written over
        assert again.put_key("k5", 600, 1_700_000_000_005)
        assert [e[2] for e in again.iter_entries()] == [100, 200, 300, 400, 500, 600]
    finally:
        again.close()


def test_reachable_follows_long_chains_and_short_ones(tmp_path):
    """Every entry of a file whose chains are many and short, or few and long (one key
    put again and again: walked link by link once few chains are left), is reached; an
    entry whose slot is zeroed is not, nor the older ones of its chain."""
    f = new_file(tmp_path, slots=8, entries=400)
    try:
        for i in range(300):
            assert f.put_key("T#same" if i % 3 else f"T#k{i}", 100 * i, T0 + i)
        reached = f.reachable()
        assert not reached[0] and reached[1:].all() and len(reached) == 301
        slot = index_key_hash("T#same") % 8
        f._buf[40 + 4 * slot:44 + 4 * slot] = bytes(4)
        reached = f.reachable()
        lost = {n for n, *_ in f.iter_entries() if not reached[n]}
        assert lost == {n for n, key_hash, *_ in f.iter_entries() if key_hash % 8 == slot}
        assert {n for n in range(1, 301) if (n - 1) % 3} <= lost     # every "same" one
    finally:
        f.close()
