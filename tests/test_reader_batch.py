"""What a batch reader on another machine gets from the reader socket: OFFSETS (a
planner's queue offsets, and where a time falls in each queue), FETCH (bulk reads past
the consumers' per-pull limits) and COMMIT (a remote group's progress in
consumerOffset.json).

Real processes throughout: ``rocketstore up`` with every child, real sockets, shared
memory and files (``store_processes.RunningStore``); the StoreReader test at the top
reads an embedded store's files. Expected values come from what the producer was told
(queue offsets, store timestamps) and from the records themselves, never from the code
under test.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import zmq

from conftest import destroy_context, small_config
from rocketstore.wire import protocol
from rocketstore.client import ClientError, Consumer, Producer, ReaderClient
from rocketstore.shm import bus
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message, MessageStore
from rocketstore.storage.record import SCHEDULE_TOPIC, decode_at
from rocketstore.storage.status import GetMessageStatus as S
from rocketstore.storage.store_reader import StoreReader
from store_processes import RunningStore, wait_for, wait_past_ms

BULK, TIMED, SMALL, LATER = "Bulk", "Timed", "Small", "Later"
BULK_COUNT = 1500          # three consume queue files of 512 units, several CommitLog files
SMALL_PER_QUEUE = 40


def bulk_body(i: int) -> bytes:
    return f"bulk-{i:05d}-".encode() + bytes(i % 97)


def offsets_file(store_dir: str) -> dict:
    with open(os.path.join(store_dir, "config", "consumerOffset.json")) as f:
        return json.load(f)["offsetTable"]


# ============================================================ StoreReader.read_queue_records
def test_read_queue_records_takes_units_and_their_records_past_the_per_pull_limits(tmp_path):
    config = small_config(tmp_path / "store", mapped_file_size_consume_queue=20 * 300)
    store = MessageStore(config)
    store.load()
    reader = StoreReader(config)
    try:
        # two queues interleaved: each queue's records have the other's between them
        store.put_batch([Message(topic=BULK, body=bulk_body(i), queue_id=i % 2)
                         for i in range(400)])
        store.dispatch()
        d = store.reput_from_offset
        pulled = reader.get_raw_messages(BULK, 0, 0, 1000, d)
        assert len(pulled.records) == config.max_transfer_count_on_message_in_memory == 32
        r = reader.read_queue_records(BULK, 0, 0, 1000, 1 << 30, d)
        assert (r.status, r.first, r.count, r.next_begin_offset, r.max_offset) == \
            (S.FOUND, 0, 200, 200, 200)
        assert len(r.units) == 20 * 200
        records = [bytes(x) for x in r.data]
        assert len(records) == 200          # no two records of queue 0 touch
        assert records[:32] == pulled.records
        assert r.nbytes == sum(map(len, records))
        msgs = [decode_at(x, 0, check_crc=True) for x in records]
        assert [m.queue_offset for m in msgs] == list(range(200))
        assert [m.body for m in msgs] == [bulk_body(i) for i in range(0, 400, 2)]
        sizes = [len(x) for x in records]
        five = reader.read_queue_records(BULK, 0, 10, 1000, sum(sizes[10:15]), d)
        assert [bytes(x) for x in five.data] == records[10:15] and five.next_begin_offset == 15
        one = reader.read_queue_records(BULK, 0, 3, 1000, 1, d)
        assert [bytes(x) for x in one.data] == records[3:4]   # the first record always comes
        assert reader.read_queue_records(BULK, 0, 3, 1000, 1, d, at_least_one=False).count == 0
        assert reader.read_queue_records(BULK, 0, 0, 7, 1 << 30, d).count == 7
        # one queue alone: its records touch, and come as one piece per CommitLog file
        store.put_batch([Message(topic=SMALL, body=bulk_body(i), queue_id=0) for i in range(50)])
        store.dispatch()
        d = store.reput_from_offset
        alone = reader.read_queue_records(SMALL, 0, 0, 1000, 1 << 30, d)
        assert alone.count == 50 and len(alone.data) <= 2
        assert b"".join(alone.data) == b"".join(
            reader.get_raw_messages(SMALL, 0, k, 32, d).records[0] for k in range(50))
        # the statuses of a pull
        assert reader.read_queue_records(BULK, 0, 200, 10, 1000, d).status is S.OFFSET_OVERFLOW_ONE
        assert reader.read_queue_records(BULK, 0, 250, 10, 1000, d).status is \
            S.OFFSET_OVERFLOW_BADLY
        assert reader.read_queue_records(BULK, 5, 0, 10, 1000, d).status is \
            S.NO_MATCHED_LOGIC_QUEUE
    finally:
        reader.close()
        store.close()


def test_gathered_records_and_commit_log_views_hold_what_the_copies_hold(tmp_path):
    """``gathered`` (the reader's FETCH) gives the records of ``read_queue_records``
    back to back in one array, and ``commit_log_view`` the bytes ``read_commit_log``
    copies, None where it gives None (past dispatched, a negative size)."""
    config = small_config(tmp_path / "store", mapped_file_size_consume_queue=20 * 300)
    store = MessageStore(config)
    store.load()
    reader = StoreReader(config)
    try:
        store.put_batch([Message(topic=BULK, body=bulk_body(i), queue_id=i % 3)
                         for i in range(900)])
        store.dispatch()
        d = store.reput_from_offset
        for queue_id, offset, budget in [(0, 0, 1 << 30), (1, 7, 1 << 30), (2, 250, 1 << 30),
                                         (0, 3, 5000), (1, 3, 1)]:
            copied = reader.read_queue_records(BULK, queue_id, offset, 1000, budget, d)
            gathered = reader.read_queue_records(BULK, queue_id, offset, 1000, budget, d,
                                                 gathered=True)
            assert gathered[:7] == copied[:7] and gathered.nbytes == copied.nbytes
            assert len(gathered.data) == 1
            assert bytes(gathered.data[0]) == b"".join(bytes(x) for x in copied.data)
        for phy, size in [(0, 500), (1000, 4000), (d - 300, 300), (d - 300, 301), (5, -1)]:
            view = reader.commit_log_view(phy, size, d)
            copy = reader.read_commit_log(phy, size, d)
            assert (None if view is None else bytes(view)) == copy
            del view
        assert reader.commit_log_view(0, 100, d) is not None
        assert reader.commit_log_view(d - 50, 100, d) is None
    finally:
        reader.close()
        store.close()


# ============================================================ a running store
@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One store for the module: Bulk/0 (1500 messages), Small/0-3 (40 each), Timed/0-1
    (three batches a few milliseconds apart), Later (one delayed message, delivered)."""
    rs = RunningStore(tmp_path_factory.mktemp("batch"))
    with rs:
        timed = []
        with Producer(rs.store_dir) as p:
            for start in range(0, BULK_COUNT, 250):
                results = p.send_batch([Message(topic=BULK, body=bulk_body(i), queue_id=0)
                                        for i in range(start, start + 250)])
                assert [r.queue_offset for r in results if r.ok] == \
                    list(range(start, start + 250))
            assert all(r.ok for r in p.send_batch(
                [Message(topic=SMALL, body=b"s%d" % i, queue_id=i % 4)
                 for i in range(4 * SMALL_PER_QUEUE)]))
            for _ in range(3):
                timed += p.send_batch([Message(topic=TIMED, body=b"t", queue_id=i % 2)
                                       for i in range(150)])
                wait_past_ms(max(r.store_timestamp for r in timed))
            assert all(r.ok for r in timed)
            assert p.send(LATER, b"later", delay_level=1, queue_id=0).ok
        with ReaderClient(rs.store_dir) as rc:
            wait_for(lambda: rc.offsets([LATER]), timeout=30, what="the delayed message")
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        rs.timed = timed
        yield rs


@pytest.fixture
def rc(running):
    with ReaderClient(running.store_dir) as client:
        yield client


def refused(call, *names: str) -> str:
    with pytest.raises(ClientError) as info:
        call()
    text = str(info.value)
    assert text.startswith("BAD_REQUEST:"), text
    for name in names:
        assert name in text, text
    return text


# ------------------------------------------------------------ OFFSETS
def test_offsets_of_every_topic(running, rc):
    queues = rc.offsets()
    assert [(q.topic, q.queue_id) for q in queues] == \
        [(BULK, 0), (LATER, 0), (SMALL, 0), (SMALL, 1), (SMALL, 2), (SMALL, 3),
         (TIMED, 0), (TIMED, 1)]   # by topic name, reserved SCHEDULE_TOPIC_XXXX left out
    by = {(q.topic, q.queue_id): q for q in queues}
    assert by[(BULK, 0)] == protocol.QueueOffsets(BULK, 0, 0, BULK_COUNT, -1)
    assert by[(LATER, 0)][2:] == (0, 1, -1)
    assert all(by[(SMALL, i)][2:] == (0, SMALL_PER_QUEUE, -1) for i in range(4))
    assert all(by[(TIMED, i)][2:] == (0, 225, -1) for i in range(2))
    assert rc.dispatched == running.slot(Slot.DISPATCHED) == running.slot(Slot.WRITTEN)
    assert rc.generation == running.slot(Slot.GENERATION) > 0
    reply = rc.offsets_reply()
    assert reply.queues == queues and reply.dispatched == rc.dispatched


def test_offsets_of_named_topics(rc):
    named = rc.offsets([SMALL, BULK, SMALL])
    assert [(q.topic, q.queue_id) for q in named] == \
        [(SMALL, 0), (SMALL, 1), (SMALL, 2), (SMALL, 3), (BULK, 0)]
    assert rc.offsets(["NoSuchTopic"]) == []
    assert [q.topic for q in rc.offsets(["NoSuchTopic", BULK])] == [BULK]
    scheduled = rc.offsets([SCHEDULE_TOPIC])   # reserved, but it can be named
    assert scheduled and all(q.topic == SCHEDULE_TOPIC for q in scheduled)
    assert sum(q.max_offset for q in scheduled) == 1
    refused(lambda: rc.offsets(["bad topic"]), "'bad topic'")
    refused(lambda: rc.offsets([BULK, "../etc"]), "'../etc'")


def test_offsets_at_a_time_are_the_first_stored_at_or_after_it(running, rc):
    timed = running.timed
    stamps = sorted({r.store_timestamp for r in timed})
    assert len(stamps) >= 3
    probes = sorted({0, stamps[0] - 1, stamps[-1] + 1, 1 << 62}
                    | {t + d for t in stamps for d in (-1, 0, 1)})
    for t in probes:
        got = {q.queue_id: q for q in rc.offsets([TIMED], t)}
        for queue_id in (0, 1):
            later = [r.queue_offset for r in timed
                     if r.queue_id == queue_id and r.store_timestamp >= t]
            want = min(later) if later else 225
            assert got[queue_id].time_offset == want, (t, queue_id)
            assert got[queue_id][2:4] == (0, 225)
    # several messages share each millisecond: the first of them, never a later one
    shared = [t for t in stamps if sum(r.store_timestamp == t for r in timed) > 2]
    assert shared


# ------------------------------------------------------------ FETCH
def test_fetch_reads_a_large_range_in_one_reply(rc):
    pulled = rc.pull(BULK, 0, 0, BULK_COUNT)
    assert len(pulled.messages) == 32      # a consumer's pull keeps RocketMQ's limit
    r = rc.fetch(BULK, 0, 0)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == \
        (S.FOUND, BULK_COUNT, 0, BULK_COUNT)
    assert len(r.records) == BULK_COUNT
    assert all(isinstance(x, memoryview) for x in r.records)
    msgs = [decode_at(x, 0, check_crc=True) for x in r.records]
    assert [m.queue_offset for m in msgs] == list(range(BULK_COUNT))
    assert [m.body for m in msgs] == [bulk_body(i) for i in range(BULK_COUNT)]
    assert len({m.commit_log_offset // (64 * 1024) for m in msgs}) >= 4  # CommitLog files
    across = rc.fetch(BULK, 0, 500, 100)   # over the 512-unit consume queue file end
    assert [decode_at(x, 0).queue_offset for x in across.records] == list(range(500, 600))
    assert across.next_begin_offset == 600
    huge = rc.fetch(BULK, 0, 1400, 10 ** 9, (1 << 31) - 1)   # the reader caps both
    assert len(huge.records) == 100 and huge.next_begin_offset == BULK_COUNT


def test_fetch_respects_max_bytes(rc):
    full = rc.fetch(BULK, 0, 0)
    sizes = [len(x) for x in full.records]
    for start, limit in [(0, 1), (0, sizes[0]), (0, sizes[0] + sizes[1] - 1),
                         (0, sizes[0] + sizes[1]), (7, 5000), (490, 6000), (500, 100_000),
                         (1490, 1 << 20)]:
        r = rc.fetch(BULK, 0, start, 65536, limit)
        n, total = 0, 0
        while start + n < BULK_COUNT and total + sizes[start + n] <= limit:
            total += sizes[start + n]
            n += 1
        n = max(n, 1)   # a first record larger than the limit still comes, alone
        assert len(r.records) == n, (start, limit)
        assert [bytes(x) for x in r.records] == [bytes(x) for x in full.records[start:start + n]]
        assert r.next_begin_offset == start + n
        assert n == 1 or sum(len(x) for x in r.records) <= limit


def test_fetch_at_past_and_before_the_end_answers_at_once(rc):
    t = time.monotonic()
    r = rc.fetch(BULK, 0, BULK_COUNT)
    assert time.monotonic() - t < 5.0       # never parked: the client gives up at 10 s
    assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_OVERFLOW_ONE, BULK_COUNT, [])
    r = rc.fetch(BULK, 0, BULK_COUNT + 100)
    assert (r.status, r.max_offset, r.records) == (S.OFFSET_OVERFLOW_BADLY, BULK_COUNT, [])
    r = rc.fetch(BULK, 0, -5)
    assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_TOO_SMALL, 0, [])
    assert rc.fetch(BULK, 7, 0).status is S.NO_MATCHED_LOGIC_QUEUE
    assert rc.fetch("NoSuchTopic", 0, 0).status is S.NO_MATCHED_LOGIC_QUEUE
    refused(lambda: rc.fetch(BULK, 0, 0, 0, 100), "max_msgs 0")
    refused(lambda: rc.fetch(BULK, 0, 0, 10, -1), "max_bytes -1")
    refused(lambda: rc.fetch("a/b", 0, 0), "'a/b'")


# ------------------------------------------------------------ COMMIT
def test_commit_is_merged_with_a_local_consumers_commits(running, rc):
    d = running.store_dir
    with Consumer(d, "mixed", SMALL) as c:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 4 * SMALL_PER_QUEUE and time.monotonic() < deadline:
            got += c.poll(256, 500)
        assert len(got) == 4 * SMALL_PER_QUEUE
    table = offsets_file(d)[f"{SMALL}@mixed"]
    assert all(table[str(q)] == SMALL_PER_QUEUE for q in range(4))
    rc.commit_offsets("mixed", SMALL, {0: 10, 2: 25})
    rc.commit_offsets("other", SMALL, {1: 3})
    table = offsets_file(d)
    assert {q: table[f"{SMALL}@mixed"][q] for q in "0123"} == \
        {"0": 10, "1": SMALL_PER_QUEUE, "2": 25, "3": SMALL_PER_QUEUE}
    assert table[f"{SMALL}@other"] == {"1": 3}
    # a local consumer of the group continues where the remote commit left it
    with Consumer(d, "mixed", SMALL) as c:
        again = []
        deadline = time.monotonic() + 30
        while len(again) < 45 and time.monotonic() < deadline:
            again += c.poll(256, 500)
    assert sorted((m.queue_id, m.queue_offset) for m in again) == \
        [(0, i) for i in range(10, 40)] + [(2, i) for i in range(25, 40)]
    assert offsets_file(d)[f"{SMALL}@mixed"]["0"] == SMALL_PER_QUEUE


def test_bad_commits_are_refused_and_write_nothing(running, rc):
    rc.commit_offsets("strict", SMALL, {0: 5})
    path = os.path.join(running.store_dir, "config", "consumerOffset.json")
    with open(path, "rb") as f:
        before = f.read()
    refused(lambda: rc.commit_offsets("bad group", SMALL, {0: 1}), "'bad group'")
    refused(lambda: rc.commit_offsets("", SMALL, {0: 1}), "group ''")
    refused(lambda: rc.commit_offsets("g" * 256, SMALL, {0: 1}), "group")
    refused(lambda: rc.commit_offsets("a@b", SMALL, {0: 1}), "'a@b'")
    refused(lambda: rc.commit_offsets("strict", "bad topic", {0: 1}), "'bad topic'")
    refused(lambda: rc.commit_offsets("strict", SMALL, {0: SMALL_PER_QUEUE + 1}),
            f"offset {SMALL_PER_QUEUE + 1}", f"max offset {SMALL_PER_QUEUE}")
    refused(lambda: rc.commit_offsets("strict", SMALL, {1: 2, 0: 1000}), "1000")  # all or nothing
    refused(lambda: rc.commit_offsets("strict", SMALL, {5: 1}), "max offset 0")
    refused(lambda: rc.commit_offsets("strict", SMALL, {0: -1}), "offset -1")
    refused(lambda: rc.commit_offsets("strict", SMALL, {-1: 0}), "queue -1")
    for offset in (1, 0):                   # a group of a topic the store does not have
        refused(lambda: rc.commit_offsets("strict", "NoSuchTopic", {0: offset}),
                "no topic NoSuchTopic in this store (topics: ")
    with open(path, "rb") as f:
        assert f.read() == before
    rc.commit_offsets("strict", SMALL, {0: SMALL_PER_QUEUE, 1: 0})   # the max itself is fine
    assert offsets_file(running.store_dir)[f"{SMALL}@strict"] == {"0": SMALL_PER_QUEUE, "1": 0}


# ------------------------------------------------------------ bad frames
def test_bad_batch_frames_get_named_errors_and_the_reader_keeps_serving(running, rc):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(bus.endpoint(running.store_dir, "reader"))

    def answer(frame: bytes) -> protocol.ErrorReply:
        s.send(frame)
        assert s.poll(10_000), "no answer"
        return protocol.decode_error(s.recv())

    try:
        offsets = protocol.encode_offsets(40, [BULK])
        fetch = protocol.encode_fetch(41, BULK, 0, 0, 10, 1000)
        commit = protocol.encode_commit(42, "g", SMALL, {0: 1})
        for frame, rid in ((offsets[:-3], 40), (offsets + b"\x00", 40), (fetch[:-1], 41),
                           (fetch + b"xx", 41), (commit[:-4], 42), (commit + b"\x01", 42),
                           (protocol.HEADER.pack(b"RS", 1, protocol.Kind.COMMIT, 43, 1)
                            + b"\xff\xff", 43),
                           (protocol.HEADER.pack(b"RS", 1, protocol.Kind.OFFSETS, 44, 5)
                            + bytes(8), 44)):
            err = answer(frame)
            assert (err.request_id, err.code) == (rid, protocol.ErrorCode.MALFORMED_FRAME), err
        twice = answer(protocol.encode_commit(45, "g", SMALL, [(0, 1), (0, 2)]))
        assert (twice.request_id, twice.code) == (45, protocol.ErrorCode.BAD_REQUEST)
        assert "queue 0" in twice.message
        reply = answer(protocol.encode_offsets_reply(46, 0, 0, []))   # a reply kind
        assert (reply.request_id, reply.code) == (46, protocol.ErrorCode.UNKNOWN_KIND)
    finally:
        s.close(0)
        destroy_context(ctx)
    assert rc.offsets([BULK])[0].max_offset == BULK_COUNT
    assert "g" not in {k.partition("@")[2] for k in offsets_file(running.store_dir)}


# ------------------------------------------------------------ expiry
def test_offsets_and_fetch_below_the_min_after_expiry(tmp_path):
    with RunningStore(tmp_path, file_reserved_time=1, delete_commit_log_files_interval=0) as rs:
        with Producer(rs.store_dir) as p:
            for start in range(0, 2000, 250):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic=BULK, body=bulk_body(i), queue_id=0)
                     for i in range(start, start + 250)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        assert len(rs.expire_commit_log(keep=2)) > 3
        with ReaderClient(rs.store_dir) as rc:
            [q] = rc.offsets([BULK], 0)
            assert 0 < q.min_offset < q.max_offset == 2000
            assert q.time_offset == q.min_offset    # expired messages count as earlier
            low = rc.fetch(BULK, 0, 0)
            assert (low.status, low.next_begin_offset, low.records) == \
                (S.OFFSET_TOO_SMALL, q.min_offset, [])
            r = rc.fetch(BULK, 0, q.min_offset)
            msgs = [decode_at(x, 0, check_crc=True) for x in r.records]
            assert r.status is S.FOUND and len(msgs) == 2000 - q.min_offset
            assert msgs[0].queue_offset == q.min_offset
            assert msgs[0].commit_log_offset >= rs.slot(Slot.MIN_OFFSET)
            assert [m.body for m in msgs] == [bulk_body(i) for i in range(q.min_offset, 2000)]
            refused(lambda: rc.commit_offsets("late", BULK, {0: 2001}), "max offset 2000")
            rc.commit_offsets("late", BULK, {0: 0})   # below the min is allowed, as in RocketMQ
        assert rs.stop() == 0, rs.log()


# ------------------------------------------------------------ the reader's allocator
def page_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
def test_full_fetch_replies_reuse_the_pages_of_the_one_before(tmp_path):
    """FETCH replies of 16 MiB of records one after another: the reader serves each
    one's buffers from the pages of the last (``procs.allocator``), where glibc's
    defaults fault about a page per 4 KiB of records in again every reply."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            for _ in range(11):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic=BULK, body=b"f" * 4000, queue_id=0) for _ in range(400)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        pid = rs.child_pid("reader")
        with ReaderClient(rs.store_dir) as rc:
            first = rc.fetch(BULK, 0, 0)    # maps the CommitLog's pages, grows the heap
            assert first.status is S.FOUND and len(first.data) > 15 << 20
            before = page_faults(pid)
            for _ in range(3):
                again = rc.fetch(BULK, 0, 0)
                assert (again.status, len(again.data)) == (S.FOUND, len(first.data))
            faults = page_faults(pid) - before
        pages = 3 * len(first.data) // 4096
        assert faults < pages // 4, (faults, pages)
