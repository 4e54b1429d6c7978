"""Recovery from damaged and abandoned stores (SPEC §4.10, DESIGN §4, STYLE habits 7-11).

Every test works on real files in a temporary directory, with 8 KiB commitlog files so a
few hundred messages cross many files. A run is ended one of three ways (``ENDINGS``):

    ending            abort file  checkpoint               recovery
    ----------------  ----------  -----------------------  --------------------------------
    clean             absent      flushed at close         normal (last 3 files)
    crash             present     never flushed (zeros)    abnormal, from the first file
    clean_then_crash  present     flushed by the 1st run   abnormal; 1st run's index kept

then the files are damaged on disk the way a crash or a bad disk would leave them
(truncated, torn, zeroed, garbage appended), the store is reopened and checked against an
oracle computed independently, with ``tests/refcodec.py``, from the bytes as they were
before the damage:

* exactly the records before the first damaged record survive, and nothing after them
  can be read (commitlog, ``get_message``, ``look_message_by_id``, ``query_message``);
* every consume queue, decoded from disk, holds exactly its surviving messages, and no
  index entry on disk points anywhere but at a surviving record;
* no commitlog file left after the recovered end holds anything but zeros, so records
  that recovery cut can never come back;
* the next put continues the commitlog at the recovered end and each queue at the number
  of its surviving messages;
* ``check() == []``.

Scenarios, by section: 1. truncated tail (named cut points and hypothesis; a short file
that is not the last fails the load and changes nothing), 2. torn last record, 3. torn
middle record, 4. zeroed 4 KiB page (plus two pages lost at a roll-over), 5. crash
without close, 6. the rows of table R of ``storage/recovery_plan.py``, 7. garbage units
after a consume queue's end, 8. idempotence.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import tempfile
import time
from typing import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refcodec
from conftest import crash, msg, read_queue, reopen, small_config
from rocketstore.storage import (
    GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreConfig, StoreFileError)

TOPICS = ("TopicA", "TopicB")
QUEUES = 3
QUEUE_KEYS = [(t, q) for t in TOPICS for q in range(QUEUES)]
N_MESSAGES = 420
ENDINGS = ("clean", "crash", "clean_then_crash")
INF = 1 << 62


# ============================================================================ writing
def make_message(i: int) -> Message:
    """Message ``i``: topic and queue spread over ``QUEUE_KEYS``, a tag, unique keys; every
    41st body is large, so BLANK records at file ends vary from 8 bytes to ~1 KiB."""
    body = (f"big{i:05d}".encode() * 150) if i % 41 == 40 else f"m{i:05d}-".encode() * (2 + i % 5)
    keys = [f"key-{i}", f"alt-{i}"] if i % 5 == 0 else [f"key-{i}"]
    return Message(topic=TOPICS[i % 2], body=body, queue_id=(i // 2) % QUEUES,
                   tags=f"Tag{i % 3}", keys=keys)


def put_range(store: MessageStore, lo: int, hi: int, rng: random.Random) -> None:
    """Put messages ``lo..hi-1`` in batches of 1-7, all acknowledged PUT_OK."""
    i = lo
    while i < hi:
        n = min(hi - i, rng.randint(1, 7))
        for r in store.put_batch([make_message(j) for j in range(i, i + n)]):
            assert r.status is PutMessageStatus.PUT_OK, r
        i += n


def die(store: MessageStore) -> None:
    """End the run as SIGKILL would: ``crash`` (abort file kept, nothing flushed or
    closed cleanly), then drop the mappings and descriptors without writing anything, as
    the kernel does for a dead process (the bytes are already in the page cache)."""
    crash(store)
    store._close_files()


def write_store(root: str, ending: str, n: int = N_MESSAGES, seed: int = 7) -> StoreConfig:
    cfg = small_config(root)
    rng = random.Random(seed)
    s = reopen(cfg)
    if ending == "clean_then_crash":
        put_range(s, 0, n // 2, rng)
        s.close()
        s = reopen(cfg)
        put_range(s, n // 2, n, rng)
    else:
        put_range(s, 0, n // 2, rng)
        s.dispatch()                      # consume queues and index exist, partly
        put_range(s, n // 2, n, rng)
    if ending == "clean":
        s.close()
    else:
        die(s)
    assert os.path.exists(os.path.join(root, "abort")) == (ending != "clean")
    return cfg


# ============================================================================ the oracle
@dataclasses.dataclass(frozen=True)
class Rec:
    pos: int
    end: int
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str
    keys: tuple[str, ...]

    @property
    def tags_code(self) -> int:
        return refcodec.java_hash(self.tags)


@dataclasses.dataclass
class Layout:
    """The commitlog as refcodec reads it: records and BLANK headers by global offset."""
    file_size: int
    file_offsets: list[int]
    records: list[Rec]
    blanks: list[int]          # global positions of BLANK records
    written_end: int

    def file_of(self, pos: int) -> int:
        return pos - pos % self.file_size

    def records_in_file(self, file_offset: int) -> list[Rec]:
        return [r for r in self.records if self.file_of(r.pos) == file_offset]


def read_layout(commit_log_dir: str, file_size: int) -> Layout:
    """Decode every commitlog file with refcodec (strict: the bytes must be whole)."""
    records, blanks, offsets, written_end = [], [], [], 0
    for name in sorted(n for n in os.listdir(commit_log_dir) if n.isdigit()):
        off = int(name)
        offsets.append(off)
        with open(os.path.join(commit_log_dir, name), "rb") as f:
            data = f.read()
        assert len(data) == file_size, name
        walk = refcodec.decode_commitlog_file(data, off)
        for rec in walk["records"]:
            assert rec["crc_ok"], (name, rec["physical_offset"])
            props = rec["properties"]
            records.append(Rec(rec["physical_offset"], rec["physical_offset"] + rec["total_size"],
                               rec["msg_id"], rec["topic"], rec["queue_id"], rec["queue_offset"],
                               rec["body"], props["TAGS"], tuple(props["KEYS"].split(" "))))
        if walk["blank"] is not None:
            blanks.append(off + walk["end"])
        if walk["records"]:
            written_end = off + walk["end"]
    return Layout(file_size, offsets, records, blanks, written_end)


@dataclasses.dataclass
class Expected:
    survivors: list[Rec]
    end: int                   # the commitlog's end after recovery


def expect_after_damage(layout: Layout, damaged: Iterable[tuple[int, int]],
                        existing_files: set[int] | None = None) -> Expected:
    """Walk records and BLANK headers (8 bytes) in offset order, as recovery should, and
    stop at the first one that overlaps a damaged byte range ``[lo, hi)`` or lies in a
    file that no longer exists. Bytes inside a BLANK's filler carry nothing."""
    damaged = list(damaged)
    existing = set(layout.file_offsets) if existing_files is None else existing_files
    items = sorted([(r.pos, r.end) for r in layout.records] + [(b, b + 8) for b in layout.blanks])
    for pos, end in items:
        if layout.file_of(pos) not in existing:
            # the scan stops at the BLANK of the last file present and cuts it there
            end_pos = max(b for b in layout.blanks if b < pos)
            return Expected([r for r in layout.records if r.pos < pos], end_pos)
        if any(lo < end and pos < hi for lo, hi in damaged):
            return Expected([r for r in layout.records if r.pos < pos], pos)
    return Expected(list(layout.records), layout.written_end)


# ============================================================================ damage
def file_path(cfg: StoreConfig, file_offset: int) -> str:
    return os.path.join(cfg.commit_log_dir, f"{file_offset:020d}")


def cut_commitlog(cfg: StoreConfig, layout: Layout, cut: int) -> Expected:
    """Cut the commitlog at global offset ``cut``: the file holding it is shortened to
    end there (``os.truncate``; a cut on a file boundary leaves that file at 0 bytes)
    and becomes the last file; later files are removed."""
    k = cut - cut % layout.file_size
    assert k in layout.file_offsets
    os.truncate(file_path(cfg, k), cut - k)
    for off in layout.file_offsets:
        if off > k:
            os.unlink(file_path(cfg, off))
    existing = {off for off in layout.file_offsets if off <= k}
    return expect_after_damage(layout, [(cut, INF)], existing)


def overwrite(cfg: StoreConfig, layout: Layout, pos: int, data: bytes) -> None:
    """Write ``data`` at global commitlog offset ``pos`` (within one file)."""
    k = layout.file_of(pos)
    assert layout.file_of(pos + len(data) - 1) == k
    fd = os.open(file_path(cfg, k), os.O_WRONLY)
    try:
        os.pwrite(fd, data, pos - k)
    finally:
        os.close(fd)


def assert_nothing_after(cfg: StoreConfig, file_offset: int) -> None:
    """Every commitlog file on disk after ``file_offset`` is all zeros."""
    for name in sorted(n for n in os.listdir(cfg.commit_log_dir) if n.isdigit()):
        if int(name) > file_offset:
            with open(os.path.join(cfg.commit_log_dir, name), "rb") as f:
                data = f.read()
            assert data == bytes(len(data)), f"{name} still holds data after the cut"


def different_random_bytes(rng: random.Random, original: bytes) -> bytes:
    """Random bytes that differ from ``original`` at every position."""
    return bytes(b ^ rng.randint(1, 255) for b in original)


def read_commitlog_bytes(cfg: StoreConfig, pos: int, n: int) -> bytes:
    k = pos - pos % cfg.mapped_file_size_commit_log
    with open(file_path(cfg, k), "rb") as f:
        f.seek(pos - k)
        return f.read(n)


# ============================================================================ checks
def cq_units_on_disk(cfg: StoreConfig, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    """A queue's units decoded with refcodec from each of its files (each up to its
    first invalid unit), concatenated: units left in a file after a partly filled one
    show up too."""
    d = os.path.join(cfg.consume_queue_dir, topic, str(queue_id))
    if not os.path.isdir(d):
        return []
    units = []
    for name in sorted(n for n in os.listdir(d) if n.isdigit()):
        with open(os.path.join(d, name), "rb") as f:
            units += refcodec.decode_cq_file(f.read())
    return units


def index_entries_on_disk(cfg: StoreConfig) -> list[tuple[str, int, int]]:
    """(file name, key hash, phy offset) of every used entry of every index file."""
    out = []
    if not os.path.isdir(cfg.index_dir):
        return out
    for name in sorted(n for n in os.listdir(cfg.index_dir) if n.isdigit()):
        with open(os.path.join(cfg.index_dir, name), "rb") as f:
            data = f.read()
        decoded = refcodec.decode_index_file(data, cfg.max_hash_slot_num, cfg.max_index_num)
        out += [(name, key_hash, phy) for _, key_hash, phy, _, _ in decoded["entries"]]
    return out


def by_queue(recs: Iterable[Rec]) -> dict[tuple[str, int], list[Rec]]:
    out: dict[tuple[str, int], list[Rec]] = {k: [] for k in QUEUE_KEYS}
    for r in recs:
        out.setdefault((r.topic, r.queue_id), []).append(r)
    return out


def assert_recovered(store: MessageStore, cfg: StoreConfig, layout: Layout, exp: Expected,
                     *, check_queries: bool = True) -> None:
    """The store after ``load`` holds exactly ``exp.survivors`` (see the module doc)."""
    survivors = {r.pos for r in exp.survivors}
    assert store.get_max_phy_offset() == exp.end
    assert_nothing_after(cfg, exp.end - exp.end % cfg.mapped_file_size_commit_log)
    # commitlog: survivors read back whole, everything else is gone
    for r in layout.records:
        if r.pos in survivors:
            m = store.look_message_by_id(r.msg_id)
            assert m is not None, f"record at {r.pos} was lost"
            assert (m.body, m.topic, m.queue_id, m.queue_offset) == \
                (r.body, r.topic, r.queue_id, r.queue_offset)
        else:
            assert store.look_message_by_offset(r.pos) is None, f"record at {r.pos} survived"
    # consume queues, decoded from disk by refcodec, and read through the store
    for (topic, q), recs in by_queue(exp.survivors).items():
        want = [(r.pos, r.end - r.pos, r.tags_code) for r in recs]
        assert cq_units_on_disk(cfg, topic, q) == want, f"consume queue {topic}/{q}"
        assert [m.msg_id for m in read_queue(store, topic, q)] == [r.msg_id for r in recs]
    # index: on disk, no entry points anywhere but at a surviving record
    stale = [(name, phy) for name, _, phy in index_entries_on_disk(cfg) if phy not in survivors]
    assert not stale, f"index entries past the recovered end {exp.end}: {stale[:5]} " \
                      f"({len(stale)} in all)"
    if check_queries:
        for r in layout.records:
            got = [m.msg_id for m in store.query_message(r.topic, r.keys[0]).messages]
            assert got == ([r.msg_id] if r.pos in survivors else []), r.keys[0]


def assert_continues(store: MessageStore, cfg: StoreConfig, exp: Expected) -> None:
    """One new put per queue: the commitlog goes on at ``exp.end`` (or the next file
    when the message does not fit), each queue at its survivor count; then fsck."""
    counts = {k: len(v) for k, v in by_queue(exp.survivors).items()}
    size = cfg.mapped_file_size_commit_log
    first = True
    for i, (topic, q) in enumerate(QUEUE_KEYS):
        m = Message(topic=topic, body=f"after-{i}".encode(), queue_id=q, tags="New",
                    keys=[f"new-{i}"])
        r = store.put(m)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.queue_offset == counts[(topic, q)], (topic, q)
        if first:
            fits = exp.end % size + r.wrote_bytes + 8 <= size
            assert r.wrote_offset == (exp.end if fits else exp.end - exp.end % size + size)
            first = False
        got = store.get_message("g", topic, q, r.queue_offset, 1)
        assert got.status is GetMessageStatus.FOUND and got.messages[0].body == m.body
        assert [x.msg_id for x in store.query_message(topic, f"new-{i}").messages] == [r.msg_id]
    assert store.check() == []


# ============================================================================ templates
class Templates:
    """One pristine store per ending, written once per module and copied per test."""

    def __init__(self, base: str):
        self.base = base
        self._made: dict[str, tuple[str, Layout]] = {}

    def get(self, ending: str) -> tuple[str, Layout]:
        if ending not in self._made:
            root = os.path.join(self.base, ending)
            cfg = write_store(root, ending)
            self._made[ending] = (root, read_layout(cfg.commit_log_dir,
                                                    cfg.mapped_file_size_commit_log))
        return self._made[ending]

    def copy(self, ending: str, dest: str) -> tuple[StoreConfig, Layout]:
        root, layout = self.get(ending)
        shutil.copytree(root, dest)
        return small_config(dest), layout


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> Templates:
    return Templates(str(tmp_path_factory.mktemp("templates")))


def test_template_layout(templates):
    """The store the other tests damage: many files, BLANKs of several sizes, every
    queue in use, and refcodec agrees with what the store reports."""
    for ending in ENDINGS:
        _, layout = templates.get(ending)
        assert len(layout.records) == N_MESSAGES
        assert len(layout.file_offsets) >= 8
        assert len({layout.file_size - b % layout.file_size for b in layout.blanks}) >= 3
        assert any(layout.file_size - b % layout.file_size > 16 for b in layout.blanks)
        assert {(r.topic, r.queue_id) for r in layout.records} == set(QUEUE_KEYS)
        for (t, q), recs in by_queue(layout.records).items():
            assert [r.queue_offset for r in recs] == list(range(len(recs)))


# ============================================================================ 1. truncated tail
def named_cuts(layout: Layout) -> dict[str, int]:
    """Cut points by kind, each inside the written data."""
    size = layout.file_size
    second_file = layout.file_offsets[2]
    recs = layout.records_in_file(second_file)
    mid = recs[len(recs) // 2]
    wide_blank = next(b for b in layout.blanks if size - b % size > 16)
    last = layout.records[-1]
    return {
        "zero": 0,
        "inside_first_record": 50,
        "record_boundary": mid.pos,
        "inside_header": mid.pos + 10,
        "at_body_length": mid.pos + 84,
        "inside_body": mid.pos + 90,
        "inside_properties": mid.end - 3,
        "one_byte_short": mid.end - 1,
        "blank_start": layout.blanks[1],
        "inside_blank_size": layout.blanks[1] + 2,
        "inside_blank_magic": layout.blanks[1] + 6,
        "blank_header_whole": wide_blank + 8,
        "inside_blank_filler": wide_blank + 12,
        "file_boundary_zero_bytes": layout.file_offsets[3],
        "last_file_start": layout.file_of(last.pos),
        "last_record_torn": last.end - 7,
        "last_record_boundary": last.pos,
        "written_end": layout.written_end,
    }


CUT_NAMES = ["zero", "inside_first_record", "record_boundary", "inside_header",
             "at_body_length", "inside_body", "inside_properties", "one_byte_short",
             "blank_start", "inside_blank_size", "inside_blank_magic", "blank_header_whole",
             "inside_blank_filler", "file_boundary_zero_bytes", "last_file_start",
             "last_record_torn", "last_record_boundary", "written_end"]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("cut_name", CUT_NAMES)
def test_truncated_commitlog(templates, tmp_path, caplog, cut_name, ending):
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    cut = named_cuts(layout)[cut_name]
    exp = cut_commitlog(cfg, layout, cut)
    assert exp.survivors == [r for r in layout.records if r.end <= cut]
    with caplog.at_level(logging.INFO, logger="rocketstore.storage.message_store"):
        s = reopen(cfg)
    row = {"clean": "R2", "crash": "R3", "clean_then_crash": "R3"}[ending]
    assert f"recovery row {row}: " in caplog.text
    with s:
        assert s.last_exit_ok == (ending == "clean")
        assert_recovered(s, cfg, layout, exp)
        assert_continues(s, cfg, exp)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(fraction=st.floats(0, 1), ending=st.sampled_from(ENDINGS))
def test_truncated_commitlog_anywhere(templates, fraction, ending):
    """Any cut point in the written data, not only the named ones."""
    with tempfile.TemporaryDirectory() as d:
        cfg, layout = templates.copy(ending, os.path.join(d, "store"))
        cut = round(fraction * layout.written_end)
        exp = cut_commitlog(cfg, layout, cut)
        assert exp.survivors == [r for r in layout.records if r.end <= cut]
        with reopen(cfg) as s:
            assert_recovered(s, cfg, layout, exp, check_queries=False)
            assert_continues(s, cfg, exp)


def store_files(cfg: StoreConfig) -> dict[str, bytes]:
    """Every file under the store root (the lock file aside), by relative path."""
    out = {}
    for dirpath, _, names in os.walk(cfg.store_path_root_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, cfg.store_path_root_dir)
            if rel != "lock":
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("cut_name", ["zero", "record_boundary", "inside_body", "blank_start",
                                      "inside_blank_filler", "file_boundary_zero_bytes"])
def test_short_file_before_later_files_fails_load(templates, tmp_path, cut_name, ending):
    """Only the last file may be short (a truncated tail). A short file with files after
    it is not a tail: the load fails with ``StoreFileError`` naming it, changes nothing
    on disk, and fails the same way again."""
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    cut = named_cuts(layout)[cut_name]
    k = layout.file_of(cut)
    assert k != layout.file_offsets[-1]
    os.truncate(file_path(cfg, k), cut - k)
    before = store_files(cfg)
    for _ in range(2):
        with pytest.raises(StoreFileError) as e:
            reopen(cfg)
        assert f"{k:020d}" in str(e.value)
        assert store_files(cfg) == before


# ============================================================================ 2. torn last record
TEAR_STARTS = [0, 1, 4, 8, 20, 28, 36, 56, 84, "body", "body_end", "props", "last_byte"]


def tear_start(rec: Rec, where) -> int:
    """Offset inside ``rec`` where the tear begins."""
    body_end = 88 + len(rec.body)
    return {"body": 88 + len(rec.body) // 2, "body_end": body_end - 1,
            "props": rec.end - rec.pos - 5, "last_byte": rec.end - rec.pos - 1}.get(where, where)


# Random bytes are torn in only up to the body's end: the record format has no checksum
# over topic and properties, so stale non-zero bytes there cannot be told from data
# (zeros can: no NUL may stand in a topic or in properties).
TEAR_CASES = [("zeros", w) for w in TEAR_STARTS] + \
    [("random", w) for w in TEAR_STARTS if w not in ("props", "last_byte")]


@pytest.mark.parametrize("ending", ["clean", "crash"])
@pytest.mark.parametrize("fill,where", TEAR_CASES)
def test_torn_last_record(templates, tmp_path, fill, where, ending):
    """A crash mid-copy leaves a record's head written and its tail as it was before:
    zeros (a preallocated file) or stale bytes. The record goes; all before survive."""
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    last = layout.records[-1]
    start = tear_start(last, where)
    assert fill == "zeros" or start < 88 + len(last.body)
    lo = last.pos + start
    old = read_commitlog_bytes(cfg, lo, last.end - lo)
    rng = random.Random(start)
    overwrite(cfg, layout, lo, bytes(len(old)) if fill == "zeros"
              else different_random_bytes(rng, old))
    exp = expect_after_damage(layout, [(lo, last.end)])
    assert exp.survivors == layout.records[:-1] and exp.end == last.pos
    with reopen(cfg) as s:
        assert_recovered(s, cfg, layout, exp)
        assert_continues(s, cfg, exp)


# ============================================================================ 3. torn middle record
@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("damage", ["flip_body_byte", "zero_header", "zero_size",
                                    "wrong_physical_offset"])
@pytest.mark.parametrize("which", ["middle_of_last_file", "first_of_last_file",
                                   "middle_of_file_before_last"])
def test_torn_middle_record(templates, tmp_path, damage, ending, which):
    """A bad record with good ones after it: recovery keeps exactly the prefix before
    it, zeroes the rest of its file, unlinks later files, and new puts go on there."""
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    last_file = layout.file_of(layout.records[-1].pos)
    in_file = layout.records_in_file(last_file if which != "middle_of_file_before_last"
                                     else last_file - layout.file_size)
    victim = in_file[0] if which == "first_of_last_file" else in_file[len(in_file) // 2]
    if damage == "flip_body_byte":
        pos = victim.pos + 88 + len(victim.body) // 2
        overwrite(cfg, layout, pos, bytes([read_commitlog_bytes(cfg, pos, 1)[0] ^ 0xFF]))
    elif damage == "zero_header":
        overwrite(cfg, layout, victim.pos, bytes(84))
    elif damage == "zero_size":
        overwrite(cfg, layout, victim.pos, bytes(4))
    else:  # a stale record: whole and checksummed, but written for another offset
        overwrite(cfg, layout, victim.pos + 28, (victim.pos + 1).to_bytes(8, "big"))
    exp = expect_after_damage(layout, [(victim.pos, victim.pos + 1)])
    assert exp.end == victim.pos and len(exp.survivors) == layout.records.index(victim)
    with reopen(cfg) as s:
        assert_recovered(s, cfg, layout, exp)
        # the cut file holds zeros after the cut; a later file left on disk holds
        # nothing but zeros (a preallocated next file may stay for later use)
        tail = read_commitlog_bytes(cfg, victim.pos, cfg.mapped_file_size_commit_log
                                    - victim.pos % cfg.mapped_file_size_commit_log)
        assert tail == bytes(len(tail))
        assert_nothing_after(cfg, layout.file_of(victim.pos))
        assert_continues(s, cfg, exp)


@pytest.mark.parametrize("ending", ["clean", "crash"])
def test_cut_records_never_come_back(templates, tmp_path, ending):
    """Two pages lost together at a roll-over: the BLANK closing file k and the head of
    file k+1 (its first record's size and magic). Recovery cuts at the BLANK; the
    records of file k+1 after its head are history and must stay so, even after the log
    grows into file k+1 again and the store restarts - here with a message of the same
    size as k+1's first record, so the old second record starts right after it."""
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    data_files = sorted({layout.file_of(r.pos) for r in layout.records})
    k, k1 = data_files[-2], data_files[-1]      # inside normal recovery's window
    blank = next(b for b in layout.blanks if layout.file_of(b) == k)
    first = layout.records_in_file(k1)[0]
    overwrite(cfg, layout, blank, bytes(8))
    overwrite(cfg, layout, k1, bytes(8))
    exp = expect_after_damage(layout, [(blank, blank + 8), (k1, k1 + 8)])
    assert exp.end == blank and exp.survivors == [r for r in layout.records if r.pos < k1]
    with reopen(cfg) as s:
        assert_recovered(s, cfg, layout, exp, check_queries=False)
        other_queue = (first.queue_id + 1) % QUEUES
        r = s.put(Message(topic=first.topic, body=first.body, queue_id=other_queue,
                          tags=first.tags, keys=list(first.keys)))
        assert r.status is PutMessageStatus.PUT_OK
        assert (r.wrote_offset, r.wrote_bytes) == (k1, first.end - first.pos)
        assert s.check() == []
    with reopen(cfg) as s:
        assert s.get_max_phy_offset() == k1 + r.wrote_bytes
        for rec in layout.records_in_file(k1)[1:]:
            assert s.look_message_by_offset(rec.pos) is None, f"cut record at {rec.pos} is back"
        assert s.check() == []


# ============================================================================ 4. zeroed region
def zero_regions(layout: Layout, ending: str) -> dict[str, int]:
    """4 KiB-aligned regions to zero. Normal recovery scans only the last three files
    that hold records (RocketMQ's window; files made ahead do not count), so after a
    clean exit the region lies inside that window."""
    files = layout.file_offsets
    holding = [f for f in files if f < layout.written_end]
    window = holding[max(0, len(holding) - 3)]
    regions = {"window_first_page": window, "window_second_page": window + 4096}
    if ending == "crash":   # abnormal recovery from the first file (checkpoint is zero)
        regions.update(early_first_page=files[1], early_second_page=files[2] + 4096,
                       very_first_page=0)
    return regions


ZERO_CASES = [(e, r) for e in ENDINGS for r in ("window_first_page", "window_second_page")] + \
    [("crash", r) for r in ("early_first_page", "early_second_page", "very_first_page")]


@pytest.mark.parametrize("ending,region", ZERO_CASES)
def test_zeroed_page(templates, tmp_path, ending, region):
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    lo = zero_regions(layout, ending)[region]
    assert lo + 4096 <= layout.written_end
    overwrite(cfg, layout, lo, bytes(4096))
    exp = expect_after_damage(layout, [(lo, lo + 4096)])
    assert exp.survivors == [r for r in layout.records if r.end <= lo]
    with reopen(cfg) as s:
        assert_recovered(s, cfg, layout, exp)
        assert_continues(s, cfg, exp)


# ============================================================================ 5. crash without close
@pytest.mark.parametrize("variant", ["as_left", "logic_dirs_deleted", "checkpoint_flushed",
                                     "never_dispatched", "checkpoint_flushed_dirs_deleted"])
def test_crash_without_close(tmp_path, variant):
    """Every put message survives abnormal recovery; consume queues and index are
    rebuilt (from nothing when their directories are gone)."""
    cfg = small_config(tmp_path / "store")
    rng = random.Random(3)
    s = reopen(cfg)
    put_range(s, 0, 150, rng)
    if variant != "never_dispatched":
        s.dispatch()
    if variant.startswith("checkpoint_flushed"):
        s.flush()                       # checkpoint now non-zero
    put_range(s, 150, 300, rng)
    if variant != "never_dispatched":
        s.dispatch()
    put_range(s, 300, 330, rng)         # never dispatched before the crash
    die(s)
    checkpoint = refcodec.decode_checkpoint(open(os.path.join(cfg.store_path_root_dir,
                                                              "checkpoint"), "rb").read())
    assert (checkpoint["physic"] > 0) == variant.startswith("checkpoint_flushed"), checkpoint
    if variant.endswith("dirs_deleted"):
        shutil.rmtree(cfg.consume_queue_dir)
        shutil.rmtree(cfg.index_dir)
    layout = read_layout(cfg.commit_log_dir, cfg.mapped_file_size_commit_log)
    assert len(layout.records) == 330
    exp = expect_after_damage(layout, [])
    with reopen(cfg) as s:
        assert s.last_exit_ok is False
        assert_recovered(s, cfg, layout, exp)
        assert_continues(s, cfg, exp)
    assert not os.path.exists(os.path.join(cfg.store_path_root_dir, "abort"))


# ============================================================================ 6. decision table
# The rows of table R of storage/recovery_plan.py, over real files (the checkpoint was
# flushed by a clean run, so an abnormal scan starts from its file):
#
# abort   commitlog  consume queues  row  expected after load
# ------  ---------  --------------  ---  -----------------------------------------------
# absent  some       equal           R2   every message; nothing cut
# present some       equal           R3   every message; re-dispatch from the checkpoint
# absent  some       ahead | behind  R2   queues and index cut back to the commitlog end
# present some       ahead | behind  R3   (ahead), missing units and index entries
#                                         re-dispatched (behind)
# absent  some       unusable        R4   a damaged queue file and index destroyed at
# present some       unusable        R5   load, rebuilt from the first commitlog byte
# either  none       ahead           R1   consume queues and index destroyed; empty store
# either  none       equal           R1   (no queue files at all) empty store
# either  none       behind          R1   (queue directories, no units) empty store
# either  none       unusable        R1   (a damaged queue file) empty store
DECISIONS = [(abort, cl, cq) for abort in ("absent", "present") for cl in ("some", "none")
             for cq in ("ahead", "equal", "behind", "unusable")]
EXPECTED_ROW = {("absent", "some", "loaded"): "R2", ("present", "some", "loaded"): "R3",
                ("absent", "some", "unusable"): "R4", ("present", "some", "unusable"): "R5",
                ("absent", "none", "loaded"): "R1", ("present", "none", "loaded"): "R1",
                ("absent", "none", "unusable"): "R1", ("present", "none", "unusable"): "R1"}


def _replace_dir(src: str, dest: str) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)


@pytest.mark.parametrize("abort,commitlog,cq", DECISIONS)
def test_recovery_decision_table(tmp_path, caplog, abort, commitlog, cq):
    cfg = small_config(tmp_path / "store")
    saved = tmp_path / "saved"
    rng = random.Random(11)
    n1, n2 = 200, 120
    with reopen(cfg) as s:
        put_range(s, 0, n1, rng)
    # the state after run 1: everything consistent
    for name in ("commitlog", "consumequeue", "index"):
        shutil.copytree(os.path.join(cfg.store_path_root_dir, name), saved / name)
    with reopen(cfg) as s:
        put_range(s, n1, n1 + n2, rng)
    root = cfg.store_path_root_dir
    survivors_n = n1 + n2
    if cq == "ahead":       # an older commitlog under newer queues and index
        _replace_dir(str(saved / "commitlog"), cfg.commit_log_dir)
        survivors_n = n1
    elif cq == "behind":    # newer commitlog over older queues and index
        _replace_dir(str(saved / "consumequeue"), cfg.consume_queue_dir)
        _replace_dir(str(saved / "index"), cfg.index_dir)
    elif cq == "unusable":  # a queue file and the index files of a size none can have
        os.truncate(os.path.join(cfg.consume_queue_dir, TOPICS[0], "0", f"{0:020d}"), 100)
        for name in os.listdir(cfg.index_dir):
            os.truncate(os.path.join(cfg.index_dir, name), 1000)
    if commitlog == "none":
        for name in os.listdir(cfg.commit_log_dir):
            os.unlink(os.path.join(cfg.commit_log_dir, name))
        survivors_n = 0
        if cq == "equal":
            shutil.rmtree(cfg.consume_queue_dir)
            shutil.rmtree(cfg.index_dir)
        elif cq == "behind":
            for t, q in QUEUE_KEYS:
                d = os.path.join(cfg.consume_queue_dir, t, str(q))
                shutil.rmtree(d)
                os.makedirs(d)
    if abort == "present":
        open(os.path.join(root, "abort"), "wb").close()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rocketstore.storage.message_store"):
        s = reopen(cfg)
    logics = "unusable" if cq == "unusable" else "loaded"
    assert f"recovery row {EXPECTED_ROW[abort, commitlog, logics]}:" in caplog.text
    with s:
        assert s.last_exit_ok == (abort == "absent")
        if commitlog == "none":
            assert s.commit_log.mapped_file_queue.mapped_files == []
            assert s.all_consume_queues() == [] and s.index_service.files == []
            assert index_entries_on_disk(cfg) == []
            for t, q in QUEUE_KEYS:
                assert cq_units_on_disk(cfg, t, q) == []
                assert s.get_message("g", t, q, 0).status is \
                    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
            assert s.get_max_phy_offset() == 0
            exp = Expected([], 0)
        else:
            layout = read_layout(cfg.commit_log_dir, cfg.mapped_file_size_commit_log)
            assert len(layout.records) == survivors_n
            exp = expect_after_damage(layout, [])
            assert_recovered(s, cfg, layout, exp)
        assert_continues(s, cfg, exp)


# ============================================================================ 7. dirty consume queue
@pytest.mark.parametrize("ending", ["clean", "crash"])
@pytest.mark.parametrize("where", ["same_file", "new_file", "every_queue"])
def test_garbage_units_past_queue_end_are_cut(tmp_path, ending, where):
    """Valid-looking units (offset >= 0, size > 0) after a queue's end that point past
    the commitlog end, as a torn or stale consume-queue write could leave them."""
    root = str(tmp_path / "store")
    cfg = write_store(root, ending, n=200)
    layout = read_layout(cfg.commit_log_dir, cfg.mapped_file_size_commit_log)
    if ending == "crash":   # give the queues their units first, as a dispatch would
        with reopen(cfg) as s:
            pass
        open(os.path.join(root, "abort"), "wb").close()
    cq_size = cfg.consume_queue_file_size
    targets = QUEUE_KEYS if where == "every_queue" else [("TopicA", 1)]
    for t, q in targets:
        d = os.path.join(cfg.consume_queue_dir, t, str(q))
        n_units = len(cq_units_on_disk(cfg, t, q))
        garbage = b"".join(refcodec.encode_cq_unit(layout.written_end + 100 * j, 150, 77)
                           for j in range(1, 6))
        if where == "new_file":   # a whole extra file of garbage after the last one
            start = (n_units * 20 // cq_size + 1) * cq_size
            data = (garbage * (cq_size // len(garbage) + 1))[:cq_size]
            with open(os.path.join(d, f"{start:020d}"), "wb") as f:
                f.write(data)
            # and the gap in the last file filled too, so the queue looks whole
            end = n_units * 20
            if end % cq_size:
                with open(os.path.join(d, f"{end - end % cq_size:020d}"), "r+b") as f:
                    f.seek(end % cq_size)
                    f.write((garbage * (cq_size // len(garbage) + 1))[:cq_size - end % cq_size])
        else:
            end = n_units * 20
            last = end - end % cq_size
            path = os.path.join(d, f"{last:020d}")
            if end % cq_size == 0 and n_units:   # the last file is full: start a new one
                with open(path, "wb") as f:
                    f.write(bytes(cq_size))
            with open(path, "r+b") as f:
                f.seek(end % cq_size)
                f.write(garbage[:cq_size - end % cq_size])
        assert len(cq_units_on_disk(cfg, t, q)) > n_units
    exp = expect_after_damage(layout, [])
    with reopen(cfg) as s:
        assert_recovered(s, cfg, layout, exp)
        for t, q in targets:
            n = len(by_queue(layout.records)[(t, q)])
            assert s.get_max_offset_in_queue(t, q) == n
        assert_continues(s, cfg, exp)


# ============================================================================ 8. idempotence
def snapshot(cfg: StoreConfig) -> dict[str, bytes]:
    """The bytes of every CommitLog and consume queue file holding any; a file made
    ahead and never written (all zeros) is left out: whether one exists yet depends on
    when the allocation service got to it, not on recovery."""
    out = {}
    for sub in ("commitlog", "consumequeue"):
        base = os.path.join(cfg.store_path_root_dir, sub)
        for dirpath, _, names in os.walk(base):
            for name in names:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    data = f.read()
                if data.strip(b"\0"):
                    out[os.path.relpath(path, cfg.store_path_root_dir)] = data
    return out


@pytest.mark.parametrize("damage", ["none", "cut", "torn_last", "crash_only"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_recovery_is_idempotent(templates, tmp_path, ending, damage):
    """After one recovery, loading and closing twice more changes no byte of the
    commitlog (nor of the consume queues)."""
    cfg, layout = templates.copy(ending, str(tmp_path / "store"))
    if damage == "cut":
        cut_commitlog(cfg, layout, named_cuts(layout)["inside_body"])
    elif damage == "torn_last":
        last = layout.records[-1]
        overwrite(cfg, layout, last.pos + 40, bytes(last.end - last.pos - 40))
    with reopen(cfg) as s:
        first_end = s.get_max_phy_offset()
    snaps = [snapshot(cfg)]
    for _ in range(2):
        with reopen(cfg) as s:
            assert s.last_exit_ok
            assert s.get_max_phy_offset() == first_end
            assert s.check() == []
        snaps.append(snapshot(cfg))
    commitlog_only = [{k: v for k, v in snap.items() if k.startswith("commitlog")}
                      for snap in snaps]
    assert commitlog_only[1] == commitlog_only[0]
    assert commitlog_only[2] == commitlog_only[0]
    assert snaps[1] == snaps[0] and snaps[2] == snaps[0]


# ============================================================================ the normal layout
def test_truncated_tail_with_its_preallocated_next_file(tmp_path):
    """The common layout: the last written file is followed by its preallocated,
    never-written next file. A truncated tail is repaired and that file stays usable."""
    cfg = small_config(str(tmp_path / "store"))
    with reopen(cfg) as s:
        rs = s.put_batch([msg(i, queue_id=i % 3) for i in range(150)])
        last = s.commit_log.mapped_file_queue.mapped_files[-1]
        nxt = file_path(cfg, last.file_from_offset + last.file_size)
    assert os.path.exists(nxt)
    cut = rs[-1].wrote_offset + 5  # inside the last record
    os.truncate(file_path(cfg, last.file_from_offset), cut - last.file_from_offset)
    with reopen(cfg) as s:
        assert s.look_message_by_offset(rs[-2].wrote_offset).msg_id == rs[-2].msg_id
        assert s.look_message_by_offset(rs[-1].wrote_offset) is None
        assert s.put(msg(999, queue_id=rs[-1].queue_id)).queue_offset == rs[-1].queue_offset
        assert s.check() == []


@pytest.mark.parametrize("how", ["read", "warmed"])
def test_files_made_ahead_are_kept_after_a_crash_though_their_pages_were_touched(tmp_path, how):
    """A file made ahead of need and never written is not data: recovery keeps it for
    use (the one after the last written file) or removes it, and quarantines nothing,
    even when reads pulled its pages into the page cache (``read_ahead_kb`` can bring
    8 MiB in for one touch of a mapped file, and the file system then names those
    pages as regions that may hold data) or warm-up wrote zeros over all of them."""
    size = (16 if how == "read" else 80) << 20
    cfg = small_config(str(tmp_path / "store"), mapped_file_size_commit_log=size,
                       warm_maped_file_enable=how == "warmed")
    s = reopen(cfg)
    rs = s.put_batch([msg(i) for i in range(50)])
    ahead = [os.path.join(cfg.commit_log_dir, f"{size * k:020d}") for k in (1, 2)]
    deadline = time.monotonic() + 60
    while not all(map(os.path.exists, ahead)) and time.monotonic() < deadline:
        time.sleep(0.05)                         # the allocation thread makes them
    crash(s)
    assert all(map(os.path.exists, ahead)), os.listdir(cfg.commit_log_dir)
    for path in ahead:                           # every page read: in the page cache
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    with reopen(cfg) as s:
        assert s.commit_log.get_max_offset() == rs[-1].wrote_offset + rs[-1].wrote_bytes
        assert s.check() == []
    assert not os.path.exists(os.path.join(cfg.store_path_root_dir, "quarantine"))
    assert os.path.exists(ahead[0])


def test_cut_data_is_quarantined_not_destroyed(tmp_path):
    """A corrupt record in the middle cuts the log there (RocketMQ's rule), but every
    byte and file cut away is kept under quarantine/ for an operator."""
    cfg = small_config(str(tmp_path / "store"))
    with reopen(cfg) as s:
        rs = s.put_batch([msg(i) for i in range(200)])
        files = [m.file_from_offset for m in s.commit_log.mapped_file_queue.mapped_files]
    victim = next(r for r in rs if r.wrote_offset >= files[-2] and r.wrote_offset > files[-2] + 100)
    k = files[-2]
    with open(file_path(cfg, k), "r+b") as f:  # flip a body byte: the CRC fails
        f.seek(victim.wrote_offset - k + 90)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    with reopen(cfg) as s:
        assert s.commit_log.get_max_offset() == victim.wrote_offset
        assert s.check() == []
    kept = []
    for root, _, names in os.walk(os.path.join(cfg.store_path_root_dir, "quarantine")):
        kept += [os.path.join(root, n) for n in names]
    assert any(n.endswith(f"{files[-2]:020d}.from-{victim.wrote_offset - files[-2]}") for n in kept)
    assert any(n.endswith(f"{files[-1]:020d}") for n in kept)
    with open(next(n for n in kept if ".from-" in n), "rb") as f:
        assert f.read(4) == victim.wrote_bytes.to_bytes(4, "big")


def test_a_quarantined_tail_is_the_cut_bytes_exactly(tmp_path):
    """The copy kept of a cut tail is every byte cut, those of its last record
    included: a record without properties ends in PROPERTIESLENGTH 0, two zero bytes
    that trimming the zeros after the data took away."""
    cfg = small_config(str(tmp_path / "store"))
    with reopen(cfg) as s:
        rs = s.put_batch([Message(topic="Bare", body=b"body%d" % i, queue_id=0)
                          for i in range(10)])
    end = rs[-1].wrote_offset + rs[-1].wrote_bytes
    with open(file_path(cfg, 0), "rb") as f:
        assert f.read()[end - 2:end] == b"\0\0"      # the last record ends in zeros
    victim = rs[3].wrote_offset
    overwrite_at = victim + rs[3].wrote_bytes - 8   # the body's last byte (before the
    # topic's length and 4 bytes, and PROPERTIESLENGTH): the CRC fails
    with open(file_path(cfg, 0), "r+b") as f:
        f.seek(overwrite_at)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
        f.seek(victim)
        cut = f.read(end - victim)
    with reopen(cfg) as s:
        assert s.commit_log.get_max_offset() == victim
    [kept] = [os.path.join(root, n) for root, _, names in
              os.walk(os.path.join(cfg.store_path_root_dir, "quarantine")) for n in names]
    assert kept.endswith(f"{0:020d}.from-{victim}")
    with open(kept, "rb") as f:
        assert f.read() == cut


# ============================================================================ torn units
@pytest.mark.parametrize("kept", [12, 14, 19])
def test_a_unit_torn_by_a_kill_is_written_again(tmp_path, kept):
    """A process killed while copying units into a consume queue leaves a prefix of the
    block: the last unit may have its offset and size (bytes 0-11) and only part of its
    tags code, and looks valid. After the unclean stop, recovery compares each queue's
    last unit with its record and writes a torn one again (seen with SIGKILLs at random
    moments: ``test_crash_kill.test_sigkill_at_random_moments``). The file is given the
    bytes such a kill leaves, as a kill cannot be aimed inside one copy."""
    cfg = small_config(str(tmp_path / "store"))
    s = reopen(cfg)
    rs = s.put_batch([Message(topic="Torn", body=f"b{i}".encode(), queue_id=0, tags="TagT")
                      for i in range(30)])
    s.dispatch()
    cq = s.find_consume_queue("Torn", 0)
    mf = cq.mapped_file_queue.get_last_mapped_file()
    unit_at = mf.wrote_position - 20
    path = mf.path
    crash(s)
    with open(path, "r+b") as f:                   # bytes kept..19 of the last unit lost
        f.seek(unit_at + kept)
        f.write(bytes(20 - kept))
    with reopen(cfg) as s:
        assert s.check() == []
        got = s.get_message("g", "Torn", 0, 29, 5, tags="TagT")
        assert [m.commit_log_offset for m in got.messages] == [rs[-1].wrote_offset]


def test_after_a_clean_stop_units_are_not_compared(tmp_path, caplog):
    cfg = small_config(str(tmp_path / "store"))
    with reopen(cfg) as s:
        s.put_batch([Message(topic="Kept", body=b"x", queue_id=0, tags="T")])
    with caplog.at_level(logging.WARNING), reopen(cfg) as s:
        assert s.check() == []
    assert "torn" not in caplog.text
