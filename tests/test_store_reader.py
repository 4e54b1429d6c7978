"""StoreReader: a read-only view of a store another process (here: an open MessageStore,
or the parent of a subprocess) keeps writing. Real files, no mocks: the embedded store
writes with 8 KiB CommitLog files, 32-unit consume queue files and 256-entry index
files, so roll-overs of all three happen within a few hundred messages.

Every comparison is against ``MessageStore``'s answer to the same question, with the
reader bounded by the store's dispatched position (``store.reput_from_offset``).
"""

from __future__ import annotations

import contextlib
import json
import random
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import msg, small_config
from store_processes import WORK_DIR, wait_for
from rocketstore.storage import CorruptRecordError, Message, MessageStore, StoreClosedError
from rocketstore.storage.consume_queue import CQ_STORE_UNIT_SIZE, encode_unit
from rocketstore.storage.record import decode_at
from rocketstore.storage.status import GetMessageStatus as S
from rocketstore.storage.store_reader import StoreReader

TOPIC = "TopicTest"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAR_FUTURE_MS = 2**62


def opened(config) -> MessageStore:
    s = MessageStore(config)
    s.load()
    return s


def fill(store: MessageStore, n: int, start: int = 0, queues: int = 2) -> list:
    """Put ``n`` messages round-robin over ``queues`` queues of TOPIC (not dispatched)."""
    return store.put_batch([msg(i, queue_id=i % queues) for i in range(start, start + n)])


def assert_same(a, b) -> None:
    """A MessageStore GetMessageResult and a reader's are the same answer."""
    assert (b.status, b.next_begin_offset, b.min_offset, b.max_offset) == \
        (a.status, a.next_begin_offset, a.min_offset, a.max_offset)
    assert b.messages == a.messages


def pull_all(reader: StoreReader, topic: str, queue_id: int, dispatched: int) -> list:
    out, offset = [], max(0, reader.get_min_offset_in_queue(topic, queue_id, dispatched))
    while True:
        r = reader.get_message(topic, queue_id, offset, 32, dispatched)
        if r.status is not S.FOUND:
            return out
        out.extend(r.messages)
        offset = r.next_begin_offset


def cq_path(config, topic: str, queue_id: int, first_unit: int = 0) -> str:
    size = config.consume_queue_file_size
    start = first_unit * CQ_STORE_UNIT_SIZE // size * size
    return os.path.join(config.consume_queue_dir, topic, str(queue_id), f"{start:020d}")


def deleted_mappings(root: str) -> list[str]:
    """Files under ``root`` this process still maps or holds open after they were unlinked."""
    root = os.path.realpath(root)
    with open("/proc/self/maps") as f:
        found = [line.split(None, 5)[-1].strip() for line in f
                 if root in line and "(deleted)" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root) and target.endswith("(deleted)"):
            found.append(target)
    return found


@pytest.fixture
def store(config):
    """A store without service threads: these tests dispatch when they say so (a
    reput thread would dispatch what they wrote "not dispatched yet" behind them)."""
    s = MessageStore(config, background=False)
    s.load()
    yield s
    s.close()


@pytest.fixture
def reader(config):
    r = StoreReader(config)
    yield r
    r.close()


# --------------------------------------------------------------------------- bounds
def test_reader_sees_exactly_the_dispatched_prefix(store, reader):
    rs = fill(store, 40)
    assert reader.get_message(TOPIC, 0, 0, 32, store.reput_from_offset).status \
        is S.NO_MATCHED_LOGIC_QUEUE  # written, not dispatched: no consume queue yet
    store.dispatch()
    dispatched = store.reput_from_offset
    for q in (0, 1):
        assert_same(store.get_message("g", TOPIC, q, 0, 32),
                    reader.get_message(TOPIC, q, 0, 32, dispatched))
    rs += fill(store, 40, start=40)      # written, not dispatched
    assert store.reput_from_offset == dispatched
    r = reader.get_message(TOPIC, 0, 0, 64, store.reput_from_offset)
    assert (r.max_offset, len(r.messages)) == (20, 20)
    assert reader.get_message(TOPIC, 0, 20, 32, store.reput_from_offset).status \
        is S.OFFSET_OVERFLOW_ONE
    store.dispatch()
    # every record boundary as the bound: exactly the units whose record ends below it
    ends = sorted({0} | {r.wrote_offset + r.wrote_bytes for r in rs})
    random.Random(7).shuffle(ends)  # the bound moves backwards too
    for bound in ends:
        for q in (0, 1):
            expect = sum(1 for r in rs
                         if r.queue_id == q and r.wrote_offset + r.wrote_bytes <= bound)
            assert reader.get_max_offset_in_queue(TOPIC, q, bound) == expect
            got = pull_all(reader, TOPIC, q, bound)
            assert [m.queue_offset for m in got] == list(range(expect))


def test_units_past_the_bound_are_invisible_in_every_read(store, reader):
    rs = fill(store, 10, queues=1)
    store.dispatch()
    bound = rs[5].wrote_offset  # messages 0..4 only
    assert reader.get_max_offset_in_queue(TOPIC, 0, bound) == 5
    assert reader.get_message(TOPIC, 0, 5, 1, bound).status is S.OFFSET_OVERFLOW_ONE
    assert reader.get_message(TOPIC, 0, 7, 1, bound).status is S.OFFSET_OVERFLOW_BADLY
    assert len(reader.get_message(TOPIC, 0, 0, 32, bound).messages) == 5
    assert reader.look_message_by_offset(rs[5].wrote_offset, bound) is None
    assert reader.look_message_by_offset(rs[4].wrote_offset, bound).queue_offset == 4
    assert reader.look_message_by_id(rs[5].msg_id, bound) is None
    assert reader.query_message(TOPIC, "key-7", 32, 0, FAR_FUTURE_MS, bound) == []
    assert [m.body for m in reader.query_message(TOPIC, "key-3", 32, 0, FAR_FUTURE_MS, bound)] \
        == [msg(3).body]
    last = rs[9].store_timestamp + 10_000
    assert reader.get_offset_in_queue_by_time(TOPIC, 0, last, bound) <= 5


def test_zeroed_and_garbage_units_after_the_end_are_ignored(store, reader, config):
    rs = fill(store, 6, queues=1)
    store.dispatch()
    dispatched = store.reput_from_offset
    cq = store.find_consume_queue(TOPIC, 0)
    mf = cq.mapped_file_queue.get_last_mapped_file()
    end = mf.wrote_position
    before = reader.get_message(TOPIC, 0, 0, 32, dispatched)
    # a garbage unit pointing past the bound, after a zero unit and right at the end
    mf.buf[end + 20:end + 40] = encode_unit(dispatched + 4096, 100, 7)
    r = reader.get_message(TOPIC, 0, 0, 32, dispatched)
    assert_same(before, r)
    mf.buf[end:end + 20] = encode_unit(dispatched + 10, 100, 7)
    assert_same(before, reader.get_message(TOPIC, 0, 0, 32, dispatched))
    assert reader.get_message(TOPIC, 0, 6, 32, dispatched).status is S.OFFSET_OVERFLOW_ONE
    # the dispatcher overwrites it with the real unit; then it is visible
    rs += fill(store, 1, start=6, queues=1)
    store.dispatch()
    r = reader.get_message(TOPIC, 0, 0, 32, store.reput_from_offset)
    assert [m.queue_offset for m in r.messages] == list(range(7))
    assert_same(store.get_message("g", TOPIC, 0, 0, 32), r)


def test_a_unit_pointing_at_the_wrong_record_raises(store, reader, config):
    rs = fill(store, 4)
    store.dispatch()
    cq = store.find_consume_queue(TOPIC, 0)
    mf = cq.mapped_file_queue.mapped_files[0]
    other = rs[1]  # a queue-1 message
    mf.buf[20:40] = encode_unit(other.wrote_offset, other.wrote_bytes, 0)
    for read in (reader.get_message, reader.get_raw_messages):
        with pytest.raises(CorruptRecordError) as e:
            read(TOPIC, 0, 1, 1, store.reput_from_offset)
        assert e.value.path == mf.path == cq_path(config, TOPIC, 0) and e.value.offset == 20
    # a unit pointing into the middle of a record (not a record start) also raises
    mf.buf[20:40] = encode_unit(rs[2].wrote_offset + 8, rs[2].wrote_bytes - 8, 0)
    for read in (reader.get_message, reader.get_raw_messages):
        with pytest.raises(CorruptRecordError):
            read(TOPIC, 0, 1, 1, store.reput_from_offset)
    assert reader.get_message(TOPIC, 0, 0, 1, store.reput_from_offset).status is S.FOUND


@contextlib.contextmanager
def unit_being_written(mf, index: int, states: list[bytes], period_s: float):
    """Unit ``index`` of consume queue file ``mf`` keeps changing among ``states`` in a
    thread, as a unit the dispatcher is writing does, until the block ends; then it is
    left as the last state."""
    stop = threading.Event()
    at = slice(index * CQ_STORE_UNIT_SIZE, (index + 1) * CQ_STORE_UNIT_SIZE)

    def write():
        while not stop.is_set():
            for state in states:
                mf.buf[at] = state
                time.sleep(period_s)

    t = threading.Thread(target=write)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        mf.buf[at] = states[-1]


def test_a_unit_changing_under_the_reader_ends_the_batch_instead_of_raising(store, reader):
    rs = fill(store, 6, queues=1)
    store.dispatch()
    mf = store.find_consume_queue(TOPIC, 0).mapped_file_queue.mapped_files[0]
    good, bad = bytes(mf.buf[60:80]), encode_unit(rs[0].wrote_offset, rs[0].wrote_bytes, 0)
    with unit_being_written(mf, 3, [bad, good], 0.0003):
        for _ in range(20):
            r = reader.get_message(TOPIC, 0, 0, 32, store.reput_from_offset)
            offsets = [m.queue_offset for m in r.messages]
            assert offsets in ([0, 1, 2], [0, 1, 2, 3, 4, 5])
            assert r.next_begin_offset == len(offsets)


def test_a_unit_being_written_past_the_bound_is_never_read_past(store, reader):
    """The dispatcher writing the unit after the bound: read torn, its old zero offset
    and its new size look inside the bound. Bulk and unit-by-unit reads at that offset
    may find nothing, never a skip past it (its record is not there yet: it would look
    expired and be stepped over)."""
    rs = fill(store, 6, queues=1)
    store.dispatch()
    bound, floor = rs[5].wrote_offset, rs[1].wrote_offset   # units 0..4 within the bound
    mf = store.find_consume_queue(TOPIC, 0).mapped_file_queue.mapped_files[0]
    whole = bytes(mf.buf[100:120])
    torn = encode_unit(0, rs[5].wrote_bytes, 0)  # the old zeros of its offset, its size
    with unit_being_written(mf, 5, [torn, whole], 0.0002):
        for _ in range(300):
            r = reader.read_queue_records(TOPIC, 0, 5, 32, 1 << 20, bound,
                                          min_commit_log_offset=floor)
            assert r.next_begin_offset <= 5 and r.count == 0, (r.status, r.next_begin_offset)
            g = reader.get_message(TOPIC, 0, 5, 32, bound, min_commit_log_offset=floor)
            assert g.next_begin_offset <= 5 and not g.messages, (g.status, g.next_begin_offset)
            reader.queue_bounds(TOPIC, 0, bound, min_commit_log_offset=floor)
            assert reader.read_few(TOPIC, 0, 5, 32, 1 << 20, bound, floor) is None


def test_a_unit_read_torn_and_whole_since_counts_as_changing(store, reader):
    """A young store still has CommitLog offset 0: a unit read torn (offset 0) points at
    a real record, which does not match it. The unit, whole by the time it is looked at
    again, is not what was read: changing (the read ends there), not corrupt."""
    rs = fill(store, 6, queues=1)
    store.dispatch()
    reader.get_max_offset_in_queue(TOPIC, 0, store.reput_from_offset)   # maps the queue
    qv = reader._queue(TOPIC, 0)
    path = qv.mapped_file_queue.mapped_files[0].path
    where = (path, 5 * CQ_STORE_UNIT_SIZE)
    assert qv.unit_changing(where, (0, rs[5].wrote_bytes))             # read torn
    assert not qv.unit_changing(where, (rs[5].wrote_offset, rs[5].wrote_bytes))


def _fields(messages) -> list[tuple]:
    return [(m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.store_size, m.body,
             m.tags, m.keys) for m in messages]


def test_read_few_is_get_message_where_it_answers(store, reader, config):
    """``read_few``, a consumer's read of a few messages in one step, at every offset
    of both queues under many bounds (8 KiB CommitLog files: some reads cross one's end):
    where it answers, the messages, next offset and bounds are ``get_message``'s; where
    it does not (outside the bounds, records in two files), it says None."""
    rs = fill(store, 120)
    store.dispatch()
    ends = sorted({r.wrote_offset + r.wrote_bytes for r in rs})
    answered = declined = 0
    for bound in ends[::7] + [ends[-1]]:
        for q in (0, 1):
            lo, hi = reader.queue_bounds(TOPIC, q, bound, min_commit_log_offset=0)
            for offset in range(lo, hi + 2):
                for most in (1, 3, 32):
                    got = reader.read_few(TOPIC, q, offset, most, 1 << 20, bound, 0)
                    if got is None:
                        declined += 1
                        continue
                    answered += 1
                    r, nbytes = got
                    g = reader.get_message(TOPIC, q, offset, most, bound)
                    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == \
                        (g.status, g.next_begin_offset, g.min_offset, g.max_offset)
                    assert _fields(r.messages) == _fields(g.messages)
                    assert nbytes == sum(m.store_size for m in g.messages)
    assert answered > 1000 and declined > 100
    # a read past max_bytes is the general path's (it keeps at least one record)
    lo, hi = reader.queue_bounds(TOPIC, 0, ends[-1], min_commit_log_offset=0)
    assert reader.read_few(TOPIC, 0, hi - 3, 3, 10, ends[-1], 0) is None


def test_nothing_new_is_told_from_the_next_unit(store, reader, config):
    """A queue read to its end: ``nothing_new`` says True only while its next unit is
    unwritten or points past the bound; False once it came, and for a queue not mapped
    here or an end at a consume queue file's end (the next file may not be mapped)."""
    fill(store, 4)
    store.dispatch()
    d = store.reput_from_offset
    assert not reader.nothing_new(TOPIC, 0, 2, d)           # not mapped here yet
    assert reader.queue_bounds(TOPIC, 0, d) == (0, 2)
    assert reader.nothing_new(TOPIC, 0, 2, d)
    store.put_batch([msg(9, queue_id=1)])
    store.dispatch()
    assert reader.nothing_new(TOPIC, 0, 2, store.reput_from_offset)   # another queue grew
    store.put_batch([msg(10, queue_id=0)])
    store.dispatch()
    assert not reader.nothing_new(TOPIC, 0, 2, store.reput_from_offset)
    assert reader.nothing_new(TOPIC, 0, 2, d)               # past that older bound
    per_file = config.consume_queue_file_size // CQ_STORE_UNIT_SIZE
    store.put_batch([msg(i, queue_id=0) for i in range(per_file - 3)])
    store.dispatch()
    d = store.reput_from_offset
    assert reader.queue_bounds(TOPIC, 0, d) == (0, per_file)
    assert not reader.nothing_new(TOPIC, 0, per_file, d)    # the next file's first unit
    store.put_batch([msg(i, queue_id=0) for i in range(3)])  # into the second file
    store.dispatch()
    d = store.reput_from_offset
    assert reader.queue_bounds(TOPIC, 0, d) == (0, per_file + 3)
    assert reader.nothing_new(TOPIC, 0, per_file + 3, d)
    store.put_batch([msg(11, queue_id=0)])
    store.dispatch()
    assert not reader.nothing_new(TOPIC, 0, per_file + 3, store.reput_from_offset)
    assert reader.nothing_new(TOPIC, 0, per_file + 3, d)


# --------------------------------------------------------------------------- equal answers
def test_get_message_equals_message_store_for_every_status(store, reader, config):
    fill(store, 200, queues=3)   # many CommitLog and consume queue files
    store.dispatch()
    os.makedirs(os.path.join(config.consume_queue_dir, "Empty", "0"))
    store.find_consume_queue("Empty", 0)
    dispatched = store.reput_from_offset
    seen = set()
    for q in (0, 1, 2):
        hi = store.get_max_offset_in_queue(TOPIC, q)
        for offset in (-1, 0, 1, 20, 31, 32, 33, hi - 1, hi, hi + 1, hi + 50):
            for max_msgs in (0, 1, 3, 32, 100):
                for tags in (None, ["*"], ["Tag1"], ["Tag0", "Tag2"], ["nope"]):
                    a = store.get_message("g", TOPIC, q, offset, max_msgs, tags)
                    b = reader.get_message(TOPIC, q, offset, max_msgs, dispatched, tags)
                    assert_same(a, b)
                    raw = reader.get_raw_messages(TOPIC, q, offset, max_msgs, dispatched, tags)
                    assert (raw.status, raw.next_begin_offset, raw.min_offset, raw.max_offset) \
                        == (a.status, a.next_begin_offset, a.min_offset, a.max_offset)
                    assert [decode_at(rec, 0) for rec in raw.records] == a.messages
                    seen.add(a.status)
    for topic, q in (("Nope", 0), ("Empty", 0), (TOPIC, 9), ("../x", 0)):
        a = store.get_message("g", topic, q, 0, 32)
        assert_same(a, reader.get_message(topic, q, 0, 32, dispatched))
        seen.add(a.status)
    assert seen >= {S.FOUND, S.NO_MATCHED_MESSAGE, S.OFFSET_OVERFLOW_ONE, S.OFFSET_OVERFLOW_BADLY,
                    S.NO_MATCHED_LOGIC_QUEUE, S.NO_MESSAGE_IN_QUEUE}
    for q in (0, 1, 2):
        assert reader.get_min_offset_in_queue(TOPIC, q, dispatched) == \
            store.get_min_offset_in_queue(TOPIC, q)
        assert reader.get_max_offset_in_queue(TOPIC, q, dispatched) == \
            store.get_max_offset_in_queue(TOPIC, q)
    assert reader.get_min_offset_in_queue("Nope", 0, dispatched) == -1
    assert reader.get_max_offset_in_queue("Nope", 0, dispatched) == 0
    assert reader.topics() == {TOPIC: [0, 1, 2], "Empty": [0]}


def test_batch_limits_are_message_stores(store, reader):
    store.put_batch([Message(topic=TOPIC, body=bytes(3000), queue_id=0) for _ in range(120)])
    store.dispatch()
    a = store.get_message("g", TOPIC, 0, 0, 1000)
    b = reader.get_message(TOPIC, 0, 0, 1000, store.reput_from_offset)
    assert_same(a, b)
    assert 0 < len(b.messages) < 120


def test_files_created_after_the_reader_opened_are_picked_up(store, reader, config):
    assert reader.get_message(TOPIC, 0, 0, 32, store.reput_from_offset).status \
        is S.NO_MATCHED_LOGIC_QUEUE
    puts = []
    for round_ in range(6):  # 32 units a queue a round: each round fills a queue file
        puts += fill(store, 64, start=64 * round_)
        store.dispatch()
        d = store.reput_from_offset
        for q in (0, 1):
            got = pull_all(reader, TOPIC, q, d)
            assert [m.msg_id for m in got] == [r.msg_id for r in puts if r.queue_id == q]
        for i in (0, 64 * round_ + 63):
            assert reader.query_message(TOPIC, f"key-{i}", 32, 0, FAR_FUTURE_MS, d) == \
                store.query_message(TOPIC, f"key-{i}", 32).messages
    assert len(os.listdir(config.commit_log_dir)) > 5
    assert len(os.listdir(os.path.dirname(cq_path(config, TOPIC, 0)))) > 5
    assert len(os.listdir(config.index_dir)) >= 2


def test_query_equals_message_store(store, reader):
    for i in range(150):
        store.put(Message(topic="Q", body=b"%d" % i, keys=["same", f"k{i}"],
                          properties={"UNIQ_KEY": f"U{i}"}))
    store.put(Message(topic="Other", body=b"o", keys=["same"]))
    store.put(Message(topic="Q", body=b"aa", keys=["Aa"]))   # "Q#Aa" and "Q#BB" collide
    store.dispatch()
    d = store.reput_from_offset
    ts = store.look_message_by_offset(0).store_timestamp
    cases = [("Q", "same", 32, 0, FAR_FUTURE_MS), ("Q", "same", 1000, 0, FAR_FUTURE_MS),
             ("Q", "same", 3, 0, FAR_FUTURE_MS), ("Q", "k7", 32, 0, FAR_FUTURE_MS),
             ("Q", "U149", 32, 0, FAR_FUTURE_MS), ("Q", "BB", 32, 0, FAR_FUTURE_MS),
             ("Q", "Aa", 32, 0, FAR_FUTURE_MS), ("Other", "same", 32, 0, FAR_FUTURE_MS),
             ("Q", "missing", 32, 0, FAR_FUTURE_MS), ("Q", "k3", 32, ts, ts + 60_000),
             ("Q", "k3", 32, ts + 60_000, FAR_FUTURE_MS), ("Q", "k3", 0, 0, FAR_FUTURE_MS)]
    for topic, key, n, begin, end in cases:
        expect = store.query_message(topic, key, n, begin, end).messages
        assert reader.query_message(topic, key, n, begin, end, d) == expect, (topic, key, n)
    assert len(reader.query_message("Q", "same", 1000, 0, FAR_FUTURE_MS, d)) == \
        store.config.max_msgs_num_batch
    assert reader.query_message("Q", "BB", 32, 0, FAR_FUTURE_MS, d) == []


def test_look_by_offset_and_id_and_offset_by_time(store, reader):
    rs = fill(store, 120, queues=1)
    store.dispatch()
    written = store.get_max_phy_offset()
    for r in rs[::7] + [rs[-1]]:
        assert reader.look_message_by_offset(r.wrote_offset, written) == \
            store.look_message_by_offset(r.wrote_offset)
        assert reader.look_message_by_id(r.msg_id, written) == store.look_message_by_id(r.msg_id)
        end = r.wrote_offset + r.wrote_bytes
        assert reader.look_message_by_offset(r.wrote_offset, end).queue_offset == r.queue_offset
        assert reader.look_message_by_offset(r.wrote_offset, end - 1) is None
    assert reader.look_message_by_offset(rs[3].wrote_offset + 1, written) is None
    assert reader.look_message_by_offset(10**9, written) is None
    assert reader.look_message_by_id("0A000001" + rs[1].msg_id[8:], written) is None
    with pytest.raises(ValueError):
        reader.look_message_by_id("not-an-id", written)
    d = store.reput_from_offset
    for t in {r.store_timestamp for r in rs} | {0, rs[-1].store_timestamp + 5000}:
        assert reader.get_offset_in_queue_by_time(TOPIC, 0, t, d) == \
            store.get_offset_in_queue_by_time(TOPIC, 0, t)
    assert reader.get_offset_in_queue_by_time("Nope", 0, 0, d) == 0


# --------------------------------------------------------------------------- expiry
@pytest.fixture
def expiring_store(tmp_path):
    """``(config, store, dispatched)``: 300 messages over queues 0 and 1, dispatched,
    in CommitLog files that may be deleted one right after another."""
    config = small_config(tmp_path / "store", delete_commit_log_files_interval=0)
    store = MessageStore(config, background=False)   # expiry by hand only: no clean service
    store.load()
    fill(store, 300)
    store.dispatch()
    yield config, store, store.reput_from_offset
    store.close()


def make_old(directory: str) -> None:
    old = time.time() - 100 * 3600
    for name in os.listdir(directory):
        os.utime(os.path.join(directory, name), (old, old))


def test_files_deleted_by_the_cleaner(tmp_path):
    config = small_config(tmp_path / "store", delete_commit_log_files_interval=0)
    store = opened(config)
    reader = StoreReader(config)
    try:
        puts = fill(store, 300)
        store.dispatch()
        d = store.reput_from_offset
        for q in (0, 1):  # map every file, index included
            assert len(pull_all(reader, TOPIC, q, d)) == 150
        assert len(reader.query_message(TOPIC, "key-1", 32, 0, FAR_FUTURE_MS, d)) == 1
        make_old(config.commit_log_dir)
        result = store.clean_expired_files(force=True)
        assert result.commit_log_files > 0 and result.consume_queue_files > 0
        assert result.index_files > 0
        assert deleted_mappings(config.store_path_root_dir)  # the reader's, until it looks
        min_phy = store.get_min_phy_offset()
        assert reader.min_commit_log_offset() == min_phy
        for q in (0, 1):
            for offset in (0, 1, store.get_min_offset_in_queue(TOPIC, q) - 1,
                           store.get_min_offset_in_queue(TOPIC, q)):
                a = store.get_message("g", TOPIC, q, offset, 32)
                assert_same(a, reader.get_message(TOPIC, q, offset, 32, d))
            assert reader.get_message(TOPIC, q, 0, 32, d).status is S.OFFSET_TOO_SMALL
            got = pull_all(reader, TOPIC, q, d)
            assert got and got[0].commit_log_offset >= min_phy
            assert [m.msg_id for m in got] == \
                [r.msg_id for r in puts if r.queue_id == q and r.wrote_offset >= min_phy]
        assert reader.query_message(TOPIC, "key-1", 32, 0, FAR_FUTURE_MS, d) == []
        assert reader.query_message(TOPIC, "key-299", 32, 0, FAR_FUTURE_MS, d) == \
            store.query_message(TOPIC, "key-299").messages
        assert reader.look_message_by_offset(0, d) is None
        assert deleted_mappings(config.store_path_root_dir) == []
    finally:
        reader.close()
        store.close()


def test_message_was_removing_when_the_minimum_lags(expiring_store):
    """CommitLog files gone, consume queues not yet corrected, the MIN_OFFSET slot
    stale: the unit's message is being removed."""
    config, store, d = expiring_store
    make_old(config.commit_log_dir)
    assert store.commit_log.delete_expired_file(0, 0, 0, True) > 0  # no CQ correction
    a = store.get_message("g", TOPIC, 1, 0, 32)
    assert a.status is S.MESSAGE_WAS_REMOVING
    with StoreReader(config) as reader:
        b = reader.get_message(TOPIC, 1, 0, 32, d, min_commit_log_offset=0)
        assert_same(a, b)
        for q in (0, 1):  # with the minimum read from disk it is simply too small
            assert reader.get_message(TOPIC, q, 0, 32, d).status is S.OFFSET_TOO_SMALL


# --------------------------------------------------------------------------- read only
def tree(root: str) -> dict:
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            st = os.stat(path)
            out[path] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def test_the_reader_never_writes_and_takes_no_lock(store, config, tmp_path):
    rs = fill(store, 100)
    store.dispatch()
    store.flush()
    before = tree(config.store_path_root_dir)
    with StoreReader(config) as reader:   # the store holds the lock all along
        d = store.reput_from_offset
        for q in (0, 1, 5):
            pull_all(reader, TOPIC, q, d)
            reader.get_offset_in_queue_by_time(TOPIC, q, rs[7].store_timestamp, d)
        reader.query_message(TOPIC, "key-3", 32, 0, FAR_FUTURE_MS, d)
        reader.look_message_by_id(rs[9].msg_id, store.get_max_phy_offset())
        reader.topics()
    assert tree(config.store_path_root_dir) == before
    nothing = small_config(tmp_path / "nothing")
    with StoreReader(nothing) as reader:
        assert reader.get_message(TOPIC, 0, 0, 32, 0).status is S.NO_MATCHED_LOGIC_QUEUE
        assert reader.query_message(TOPIC, "k", 32, 0, FAR_FUTURE_MS, 0) == []
        assert reader.look_message_by_offset(0, 100) is None
        assert reader.topics() == {} and reader.min_commit_log_offset() == -1
    assert not os.path.exists(nothing.store_path_root_dir)


def test_closed_reader(config):
    reader = StoreReader(config)
    reader.close()
    reader.close()
    with pytest.raises(StoreClosedError):
        reader.get_message(TOPIC, 0, 0, 1, 0)


def test_reopen_maps_files_afresh(store, reader):
    fill(store, 50)
    store.dispatch()
    d = store.reput_from_offset
    first = pull_all(reader, TOPIC, 0, d)
    reader.reopen()
    assert pull_all(reader, TOPIC, 0, d) == first


# --------------------------------------------------------------------------- other process
CHILD = textwrap.dedent("""
    import json, mmap, os, sys, time
    from rocketstore.storage import StoreConfig
    from rocketstore.storage.store_reader import StoreReader
    from rocketstore.storage.status import GetMessageStatus
    config = StoreConfig(**json.loads(sys.argv[1]))
    fd = os.open(sys.argv[2], os.O_RDWR)
    slot = memoryview(mmap.mmap(fd, 24)).cast("q")
    offsets, seen, pulls = {0: 0, 1: 0}, [], 0
    with StoreReader(config) as reader:
        while True:
            done, dispatched = slot[1], slot[0]
            moved = False
            for q in (0, 1):
                r = reader.get_message("TopicTest", q, offsets[q], 16, dispatched)
                pulls += 1
                if r.status is GetMessageStatus.FOUND:
                    for i, m in enumerate(r.messages):
                        assert m.queue_offset == offsets[q] + i
                        assert m.commit_log_offset + m.store_size <= dispatched
                        seen.append((q, m.queue_offset, m.msg_id, m.body.decode()))
                    offsets[q] = r.next_begin_offset
                    moved = True
            if not moved:
                slot[2] = dispatched        # read everything below it
                if done:
                    break
    print(json.dumps({"seen": seen, "pulls": pulls}))
""")


def test_a_reader_in_another_process_reads_while_the_parent_writes(store, config, tmp_path):
    """Forty rounds: the parent puts and dispatches, publishes how far (slot 0) and puts
    the next round once the child, reading all along, has read everything below it
    (slot 2): every round is read while the next is being written."""
    slot_path = str(tmp_path / "dispatched")
    with open(slot_path, "wb") as f:
        f.write(bytes(24))
    fd = os.open(slot_path, os.O_RDWR)
    slot = memoryview(mmap.mmap(fd, 24)).cast("q")
    cfg = {k: v for k, v in config.to_dict().items()}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg), slot_path],
                             cwd=WORK_DIR, env={**os.environ, "PYTHONPATH": ROOT},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    puts = []
    try:
        for round_ in range(40):
            puts += fill(store, 15, start=15 * round_)
            store.dispatch()
            slot[0] = store.reput_from_offset   # publish only after dispatch
            wait_for(lambda: slot[2] == slot[0] or child.poll() is not None, 60,
                     f"the child to read round {round_}")
        slot[1] = 1
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        slot.release()
        os.close(fd)
    assert child.returncode == 0, err
    seen = json.loads(out)["seen"]
    for q in (0, 1):
        got = [(o, mid, body) for sq, o, mid, body in seen if sq == q]
        expect = [(r.queue_offset, r.msg_id, msg(i).body.decode())
                  for i, r in enumerate(puts) if r.queue_id == q]
        assert got == expect
    assert len(os.listdir(config.commit_log_dir)) > 10


# --------------------------------------------------------------------------- edges
@pytest.mark.parametrize("size,total,count,max_msgs,in_disk,full", [
    (100, 0, 0, 1, False, False),          # the first message always fits
    (100, 100, 1, 1, False, True),         # max_msgs reached
    (100, 100, 31, 100, False, False),     # 32 in memory at most
    (100, 100, 32, 100, False, True),
    (100, 262_100, 5, 100, False, True),   # 256 KiB in memory at most
    (100, 100, 7, 100, True, False),       # 8 from disk at most
    (100, 100, 8, 100, True, True),
    (100, 65_500, 2, 100, True, True),     # 64 KiB from disk at most
])
def test_batch_full_follows_rocketmq(store, size, total, count, max_msgs, in_disk, full):
    from rocketstore.storage.read_path import batch_full
    assert batch_full(store.config, size, total, count, max_msgs, in_disk) is full


def test_a_given_min_offset_drops_the_files_below_it(expiring_store):
    config, store, d = expiring_store
    with StoreReader(config) as reader:
        pull_all(reader, TOPIC, 0, d)
        make_old(config.commit_log_dir)
        store.clean_expired_files(force=True)
        min_phy = store.get_min_phy_offset()
        for q in (0, 1):
            assert_same(store.get_message("g", TOPIC, q, 0, 32),
                        reader.get_message(TOPIC, q, 0, 32, d, min_commit_log_offset=min_phy))
        assert deleted_mappings(config.store_path_root_dir) == []


def test_index_files_being_created_are_skipped(store, reader, config):
    r = store.put(Message(topic="Q", body=b"1", keys=["k"]))
    store.dispatch()
    d = store.reput_from_offset
    ts = r.store_timestamp
    newest = sorted(os.listdir(config.index_dir))[-1]
    short = os.path.join(config.index_dir, str(int(newest) + 1))
    unborn = os.path.join(config.index_dir, str(int(newest) + 2))
    open(short, "wb").close()                      # created, not allocated yet
    with open(unborn, "wb") as f:                  # allocated, header not written yet
        f.truncate(config.index_file_size)
    try:
        for begin in (0, ts):
            assert [m.body for m in reader.query_message("Q", "k", 32, begin, FAR_FUTURE_MS, d)] \
                == [b"1"]
    finally:
        os.unlink(short)
        os.unlink(unborn)
    assert [m.body for m in reader.query_message("Q", "k", 32, 0, FAR_FUTURE_MS, d)] == [b"1"]


def test_a_slot_naming_the_entry_being_put_does_not_hide_its_chain(store, reader, config):
    """The dispatcher writes entry, slot, header: a query between the slot and the
    header sees slot == indexCount, and must wait for the header, not drop the chain."""
    from rocketstore.storage.index_file import INDEX_COUNT_POS
    a = store.put(Message(topic="Q", body=b"a", keys=["k"]))
    store.dispatch()
    b = store.put(Message(topic="Q", body=b"b", keys=["k"]))
    store.dispatch()       # b is indexed, but the reader is only told about a
    path = os.path.join(config.index_dir, sorted(os.listdir(config.index_dir))[-1])
    fd = os.open(path, os.O_RDWR)
    buf = mmap.mmap(fd, config.index_file_size)
    try:
        header = bytes(buf[:40])
        count = int.from_bytes(header[INDEX_COUNT_POS:INDEX_COUNT_POS + 4], "big")
        buf[INDEX_COUNT_POS:INDEX_COUNT_POS + 4] = (count - 1).to_bytes(4, "big")
        done = threading.Timer(0.0003, lambda: buf.__setitem__(slice(0, 40), header))
        done.start()
        got = reader.query_message("Q", "k", 32, 0, FAR_FUTURE_MS, b.wrote_offset)
        done.join()
        assert [m.body for m in got] == [b"a"] and got[0].commit_log_offset == a.wrote_offset
        # a header that never catches up (a crash leftover) only hides the chain
        buf[INDEX_COUNT_POS:INDEX_COUNT_POS + 4] = (count - 1).to_bytes(4, "big")
        assert reader.query_message("Q", "k", 32, 0, FAR_FUTURE_MS, b.wrote_offset) == []
        buf[:40] = header
    finally:
        buf.close()
        os.close(fd)
    assert [m.body for m in reader.query_message("Q", "k", 32, 0, FAR_FUTURE_MS,
                                                 store.reput_from_offset)] == [b"a", b"b"]
