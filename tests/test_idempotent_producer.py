"""Idempotent producers end to end: ``rocketstore up`` with every process, real sockets,
real files; the writer stores each (producer id, sequence) once.

What is checked, against what was read back at the end (``storage.MessageStore`` on the
stopped store, every queue of the topic through its consume queue, ``check() == []``):
each sequence stored exactly once, with the identity the writer stamped (``__PID``,
``__SEQ``) agreeing with the body.

Fault injection uses only the project's existing seams, as the other process tests do:
SIGKILL of the writer (the supervisor restarts it) and SIGSTOP of the flusher; bytes of
the CommitLog zeroed while the store is stopped (what a machine crash leaves of an
unflushed tail; ``tests/test_recovery.py`` damages files the same way); and, for the
one test that needs an append to fail inside a batch, the writer's code in this process
(``tests/test_writer_flusher.InProcessWriter``) with ``storage.mapped_file.FILE_OPS``
fallocate failing with ENOSPC.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter

import pytest
import zmq

from conftest import destroy_context, read_queue, refuse_next_commit_log_file
from rocketstore.wire import protocol
from rocketstore.client import ClientError, Consumer, Producer, RequestTimeout
from rocketstore.shm import bus
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message, MessageStore, PutMessageStatus, StoreConfig
from rocketstore.storage.config import recorded_geometry
from rocketstore.storage.message import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE
from rocketstore.storage.producer_state import SNAPSHOT_FILE
from store_processes import RunningStore, wait_for

TOPIC = "Rows"
QUEUES = 4
OUT_OF_ORDER = PutMessageStatus.OUT_OF_ORDER_SEQUENCE


# ============================================================================ helpers
def row(pid: int, seq: int, **kw) -> Message:
    """The message a producer numbers ``seq``: its body names both."""
    return Message(topic=TOPIC, body=f"p{pid}-s{seq}".encode().ljust(80, b"."),
                   keys=[f"k{seq}"], queue_id=seq % QUEUES, **kw)


def rows(pid: int, first: int, n: int) -> list[Message]:
    return [row(pid, s) for s in range(first, first + n)]


def body_sequence(body: bytes) -> tuple[int, int]:
    pid, seq = body.rstrip(b".").decode().split("-")
    return int(pid[1:]), int(seq[1:])


def send_frame(request_id: int, items: list[tuple[Message, int, int]]) -> bytes:
    """A SEND frame whose records carry any (producer id, sequence) pairs, repeats
    included (``encode_send`` numbers records consecutively)."""
    records = [protocol.encode_send(0, [m], pid, seq)[protocol.HEADER_SIZE:]
               for m, pid, seq in items]
    return protocol.HEADER.pack(protocol.MAGIC, protocol.VERSION, protocol.Kind.SEND,
                                request_id, len(items)) + b"".join(records)


def read_topic(store_dir: str) -> list:
    """Every message of TOPIC, through the consume queues of the stopped store."""
    s = MessageStore(StoreConfig(store_path_root_dir=store_dir, **recorded_geometry(store_dir)))
    s.load()
    try:
        assert s.check() == []
        return [m for q in range(QUEUES) for m in read_queue(s, TOPIC, q)]
    finally:
        s.close()


def stored_sequences(msgs: list, pid: int) -> Counter:
    """How often each sequence of ``pid`` is stored; each carries its identity."""
    seen: Counter = Counter()
    for m in msgs:
        who, seq = body_sequence(m.body)
        if who != pid:
            continue
        assert m.properties[PROPERTY_PRODUCER_ID] == str(pid), m.properties
        assert m.properties[PROPERTY_PRODUCER_SEQUENCE] == str(seq), m.properties
        seen[seq] += 1
    return seen


def exactly_once(n: int) -> Counter:
    return Counter({s: 1 for s in range(n)})


def snapshot(rs: RunningStore) -> dict | None:
    try:
        with open(os.path.join(rs.store_dir, "config", SNAPSHOT_FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def is_duplicate(r) -> bool:
    return r.status is PutMessageStatus.PUT_OK and r.reason.startswith("duplicate:")


class RawClient:
    """A DEALER on the ingest socket, for frames ``Producer`` would not build."""

    def __init__(self, store_dir: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(bus.endpoint(store_dir, "ingest"))

    def put(self, request_id: int, items) -> list[protocol.SendResult]:
        self.socket.send(send_frame(request_id, items))
        assert self.socket.poll(20_000), "no reply"
        rid, results = protocol.decode_send_reply(self.socket.recv())
        assert rid == request_id
        return results

    def close(self) -> None:
        self.socket.close(0)
        destroy_context(self.context)


@pytest.fixture
def store(tmp_path):
    """Starts a running store with the given ``[store]`` settings; stops it at the end."""
    stores = []

    def start(**settings) -> RunningStore:
        where = tmp_path / f"s{len(stores)}"
        where.mkdir()
        rs = RunningStore(where, **settings)
        stores.append(rs)
        return rs.start()
    yield start
    for rs in stores:
        rs.__exit__(None, None, None)


# ============================================================================ the rules
def test_duplicates_in_one_batch_are_stored_once(store):
    rs = store()
    client = RawClient(rs.store_dir)
    try:
        pid = 7001
        got = client.put(1, [(row(pid, 0), pid, 0), (row(pid, 1), pid, 1),
                             (row(pid, 1), pid, 1), (row(pid, 2), pid, 2),
                             (row(pid, 0), pid, 0), (row(0, 3), 0, 0)])
    finally:
        client.close()
    assert [r.status for r in got] == [PutMessageStatus.PUT_OK] * 6
    assert [r.reason == "" for r in got] == [True, True, False, True, False, True]
    for dup, original in ((got[2], got[1]), (got[4], got[0])):
        assert dup.reason.startswith("duplicate:") and "this batch" in dup.reason
        assert (dup.msg_id, dup.commit_log_offset, dup.queue_offset) == \
            (original.msg_id, original.commit_log_offset, original.queue_offset)
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert stored_sequences(msgs, pid) == exactly_once(3)
    plain = [m for m in msgs if PROPERTY_PRODUCER_ID not in m.properties]
    assert [body_sequence(m.body) for m in plain] == [(0, 3)]   # producer id 0: as ever


def test_duplicates_across_batches_get_the_stored_results(store):
    rs = store()
    with Producer(rs.store_dir, idempotent=True) as p:
        pid = p.producer_id
        assert 0 < pid < 1 << 63 and p.next_sequence == 0
        first = p.send_batch(rows(pid, 0, 10))
        assert all(r.status is PutMessageStatus.PUT_OK and r.reason == "" for r in first)
        assert p.next_sequence == 10
        again = p.send_batch(rows(pid, 0, 10), first_sequence=0)
        assert p.next_sequence == 10                      # a resend does not move it
        assert all(is_duplicate(r) for r in again)
        # the last stored record's result is kept: its duplicate says where it went
        assert (again[-1].msg_id, again[-1].commit_log_offset, again[-1].queue_offset) == \
            (first[-1].msg_id, first[-1].commit_log_offset, first[-1].queue_offset)
        assert all(r.commit_log_offset == -1 and r.msg_id == "" for r in again[:-1])
        mixed = p.send_batch(rows(pid, 8, 5), first_sequence=8)
        assert [is_duplicate(r) for r in mixed] == [True, True, False, False, False]
        assert p.next_sequence == 13
        tail = p.send_batch(rows(pid, 13, 2))
        assert [r.reason for r in tail] == ["", ""]
    assert rs.stop() == 0, rs.log()
    assert stored_sequences(read_topic(rs.store_dir), pid) == exactly_once(15)


def test_a_gap_is_refused_and_a_resend_from_the_first_unacknowledged_fills_it(store):
    rs = store()
    with Producer(rs.store_dir, producer_id=4242) as p:
        assert all(r.reason == "" for r in p.send_batch(rows(4242, 0, 10)))
        written = rs.slot(Slot.WRITTEN)
        gap = p.send_batch(rows(4242, 20, 10), first_sequence=20)
        assert [r.status for r in gap] == [OUT_OF_ORDER] * 10
        assert not any(r.ok for r in gap)
        assert all(r.queue_offset == 10 and "expected sequence 10" in r.reason
                   and r.commit_log_offset == -1 for r in gap)
        assert rs.slot(Slot.WRITTEN) == written              # nothing stored
        filled = p.send_batch(rows(4242, 10, 20), first_sequence=10)
        assert all(r.status is PutMessageStatus.PUT_OK and r.reason == "" for r in filled)
        # an unknown producer starts at 0, and only there
        with Producer(rs.store_dir, producer_id=4243) as q:
            late = q.send_batch(rows(4243, 5, 1), first_sequence=5)[0]
            assert late.status is OUT_OF_ORDER and late.queue_offset == 0
            assert "expected sequence 0" in late.reason and "unknown" in late.reason
            assert q.send_batch(rows(4243, 0, 1), first_sequence=0)[0].reason == ""
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert stored_sequences(msgs, 4242) == exactly_once(30)
    assert stored_sequences(msgs, 4243) == exactly_once(1)


def test_a_refused_record_takes_no_sequence(store):
    rs = store()
    with Producer(rs.store_dir, producer_id=77) as p:
        batch = rows(77, 0, 4)
        batch[1] = Message(topic="bad topic", body=b"x", queue_id=1)
        got = p.send_batch(batch)
        assert [r.status for r in got] == [PutMessageStatus.PUT_OK,
                                          PutMessageStatus.MESSAGE_ILLEGAL,
                                          OUT_OF_ORDER, OUT_OF_ORDER]
        assert "expected sequence 1" in got[2].reason
        again = p.send_batch(rows(77, 1, 3), first_sequence=1)   # the bad row dropped
        assert all(r.reason == "" for r in again)
    assert rs.stop() == 0, rs.log()
    assert stored_sequences(read_topic(rs.store_dir), 77) == exactly_once(4)


def test_a_refused_send_leaves_its_sequence_to_the_next(store):
    """``send`` numbers its own records: after one the store refused (not stored, no
    sequence taken), the next ``send`` takes that sequence. It used to take the next
    one, and every later send was answered OUT_OF_ORDER_SEQUENCE."""
    rs = store()

    def send(p: Producer, seq: int):
        m = row(78, seq)
        return p.send(m.topic, m.body, queue_id=m.queue_id)

    with Producer(rs.store_dir, producer_id=78) as p:
        assert send(p, 0).ok
        assert p.send("bad topic", b"x").status is PutMessageStatus.MESSAGE_ILLEGAL
        assert p.next_sequence == 1
        batch = rows(78, 1, 3)
        batch[1] = Message(topic="bad topic", body=b"x", queue_id=1)
        assert [r.ok for r in p.send_batch(batch)] == [True, False, False]
        assert p.next_sequence == 2
        assert all(send(p, seq).reason == "" for seq in (2, 3))
        assert p.next_sequence == 4
    assert rs.stop() == 0, rs.log()
    assert stored_sequences(read_topic(rs.store_dir), 78) == exactly_once(4)


def test_two_attempts_with_one_producer_id_interleaved_store_each_row_once(store):
    """Two attempts of one Spark task at once (a retry beside a straggler, or a
    speculative copy): same producer id, same rows, different batch sizes, their
    batches interleaved on two sockets."""
    rs = store()
    pid, n = 99_000_001, 600
    outcomes = {"a": Counter(), "b": Counter()}
    with Producer(rs.store_dir, producer_id=pid, window=4) as a, \
            Producer(rs.store_dir, producer_id=pid, window=4) as b:
        plan = {"a": (a, 50), "b": (b, 30)}           # b starts later, then catches up
        acked = {"a": 0, "b": 0}
        sent = {"a": 0, "b": 0}
        handles = {"a": [], "b": []}
        deadline = time.monotonic() + 120
        while min(acked.values()) < n:
            assert time.monotonic() < deadline, acked
            for name, (p, size) in plan.items():
                if sent[name] < n:
                    k = min(size, n - sent[name])
                    handles[name].append((sent[name], k, p.send_async(
                        rows(pid, sent[name], k), first_sequence=sent[name])))
                    sent[name] += k
                if len(handles[name]) >= 3 or sent[name] >= n:
                    while handles[name]:
                        first, k, h = handles[name].pop(0)
                        results = h.result()
                        outcomes[name].update(r.status.name + (" dup" if is_duplicate(r)
                                                              else "") for r in results)
                        if all(r.ok for r in results) and first == acked[name]:
                            acked[name] = first + k
                        elif first >= acked[name]:    # behind a gap: rewind
                            for _, _, later in handles[name]:
                                later.result()
                            handles[name].clear()
                            sent[name] = acked[name]
                            break
    assert rs.stop() == 0, rs.log()
    assert stored_sequences(read_topic(rs.store_dir), pid) == exactly_once(n)
    total = outcomes["a"] + outcomes["b"]
    assert total["PUT_OK"] + total["PUT_OK dup"] >= 2 * n
    assert total["PUT_OK"] == n                       # each row stored by one attempt,
    assert total["PUT_OK dup"] >= n                   # the other copy a duplicate


def test_a_client_setting_the_identity_properties_itself_is_refused(store):
    rs = store()
    with Producer(rs.store_dir) as plain, Producer(rs.store_dir, producer_id=5) as idem:
        for p in (plain, idem):
            for name in (PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE):
                r = p.send_batch([Message(topic=TOPIC, body=b"x", queue_id=0,
                                          properties={name: "1"})])[0]
                assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
                assert PROPERTY_PRODUCER_ID in r.reason and PROPERTY_PRODUCER_SEQUENCE in r.reason
        assert idem.send_batch(rows(5, 0, 1), first_sequence=0)[0].reason == ""
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert len(msgs) == 1 and stored_sequences(msgs, 5) == exactly_once(1)


def test_the_non_idempotent_path_is_unchanged(store):
    rs = store()
    with Producer(rs.store_dir) as p:
        assert p.producer_id == 0 and not p.idempotent
        with pytest.raises(ValueError):
            p.send_async(rows(0, 0, 1), first_sequence=0)
        with pytest.raises(ValueError):
            p.next_sequence = 3
        first = p.send_batch(rows(0, 0, 10))
        again = p.send_batch(rows(0, 0, 10))                  # stored twice, as ever
        assert all(r.status is PutMessageStatus.PUT_OK and r.reason == ""
                   for r in first + again)
        assert {r.msg_id for r in first}.isdisjoint(r.msg_id for r in again)
        assert p.next_sequence == 0
    with pytest.raises(ValueError):
        Producer(rs.store_dir, producer_id=0)
    with pytest.raises(ValueError):
        Producer(rs.store_dir, producer_id=1 << 64)
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert Counter(body_sequence(m.body)[1] for m in msgs) == Counter(
        {s: 2 for s in range(10)})
    assert not any(PROPERTY_PRODUCER_ID in m.properties for m in msgs)
    assert snapshot(rs) is None or snapshot(rs)["producers"] == []


# ============================================================================ durability
def test_under_sync_flush_a_duplicate_waits_for_its_original_to_be_flushed(store):
    rs = store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=1000)
    with Producer(rs.store_dir, producer_id=31) as p:
        assert p.send_batch(rows(31, 0, 1))[0].status is PutMessageStatus.PUT_OK
        flusher = rs.child_pid("flusher")
        os.kill(flusher, signal.SIGSTOP)
        try:
            unflushed = p.send_batch(rows(31, 1, 1))[0]
            assert unflushed.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            started = time.monotonic()
            dup = p.send_batch(rows(31, 1, 1), first_sequence=1)[0]
            assert time.monotonic() - started >= 0.9
            assert dup.status is PutMessageStatus.FLUSH_DISK_TIMEOUT   # never a silent OK
            assert dup.msg_id == unflushed.msg_id
            # an older sequence whose offsets are not kept waits for the producer's last
            older = p.send_batch(rows(31, 0, 1), first_sequence=0)[0]
            assert older.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        finally:
            os.kill(flusher, signal.SIGCONT)
        dup = p.send_batch(rows(31, 1, 1), first_sequence=1)[0]
        assert is_duplicate(dup) and dup.msg_id == unflushed.msg_id
    assert rs.stop() == 0, rs.log()
    assert stored_sequences(read_topic(rs.store_dir), 31) == exactly_once(2)


class WriterKiller(threading.Thread):
    """SIGKILLs the writer ``kills`` times at random moments while it takes rows (after an
    append of the current writer, within 0.6 s), waiting for each restart;
    with ``drop_snapshots`` it checks no snapshot is there (the writer never writes one
    on the settings of that case) so every restart rebuilds from the CommitLog."""

    def __init__(self, rs: RunningStore, rng: random.Random, kills: int,
                 drop_snapshots: bool):
        super().__init__(daemon=True)
        self.rs, self.rng, self.kills, self.drop = rs, rng, kills, drop_snapshots
        self.done = 0
        self.error: BaseException | None = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            for _ in range(self.kills):
                # the writer took something since it started: the producer is sending
                written = self.rs.slot(Slot.WRITTEN)
                wait_for(lambda: self.rs.slot(Slot.WRITTEN) > written, 60, "an append")
                if self.stop_event.wait(self.rng.uniform(0.0, 0.6)):
                    return
                pid = self.rs.child_pid("writer")
                if self.drop:
                    assert snapshot(self.rs) is None
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: self.rs.child_pid("writer") not in (0, pid), 60,
                         "writer restart")
                self.done += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def send_exactly_once(p: Producer, pid: int, n: int, rng: random.Random, more=lambda: False,
                      batch: int = 50, window: int = 4,
                      deadline_s: float = 240) -> tuple[int, Counter]:
    """Send rows 0..n-1, and 1000 more each time the end is near while ``more()``, until
    every one is acknowledged: a round pipelines up to ``window`` batches from the first
    unacknowledged row (sometimes from a little before it, resending acknowledged rows),
    then waits for them in order; the first batch not wholly stored (timeout,
    OUT_OF_ORDER_SEQUENCE behind a lost batch) ends the round. Returns the number of
    rows and the statuses seen."""
    acked = 0
    seen: Counter = Counter()
    deadline = time.monotonic() + deadline_s
    while acked < n or more():
        if n - acked < batch * window and more():
            n += 1000
        assert time.monotonic() < deadline, f"only {acked} of {n} rows acknowledged"
        start = max(0, acked - rng.randint(1, 120)) if acked and rng.random() < 0.3 else acked
        handles = []
        for first in range(start, min(n, start + batch * window), batch):
            k = min(batch, n - first)
            handles.append((first, k, p.send_async(rows(pid, first, k), first_sequence=first)))
        failed = False
        for first, k, h in handles:
            try:
                results = h.result()
            except RequestTimeout:
                seen["timeout"] += 1
                failed = True
                continue
            for r in results:
                assert r.status in (PutMessageStatus.PUT_OK, OUT_OF_ORDER,
                                    PutMessageStatus.SERVICE_NOT_AVAILABLE), r
                seen[r.status.name + (" dup" if is_duplicate(r) else "")] += 1
            if not failed and all(r.ok for r in results):
                acked = max(acked, first + k)
            else:
                failed = True
    return n, seen


@pytest.mark.parametrize("snapshots", ["kept", "never_written"])
def test_writer_killed_at_random_moments_every_sequence_is_stored_once(store, snapshots):
    settings = dict(flush_delay_offset_interval=100 if snapshots == "kept" else 3_600_000)
    rs = store(**settings)
    rng = random.Random(f"idempotent-{snapshots}")
    pid, n = 123_456_789, 3000
    killer = WriterKiller(rs, rng, kills=4, drop_snapshots=snapshots == "never_written")
    with Producer(rs.store_dir, producer_id=pid, timeout_ms=1000, window=8) as p:
        killer.start()
        n, seen = send_exactly_once(p, pid, n, rng, more=killer.is_alive)
        killer.join(120)
        assert killer.error is None, killer.error
        assert killer.done == killer.kills
        # after the last restart: everything again, all duplicates
        again = p.send_batch(rows(pid, n - 40, 40), first_sequence=n - 40)
        assert all(is_duplicate(r) for r in again)
    assert rs.restarts("writer") >= killer.done
    assert seen["PUT_OK dup"] > 0, seen
    if snapshots == "kept":
        assert snapshot(rs) is not None
    assert rs.stop() == 0, rs.log()
    log = rs.log() if snapshots == "never_written" else open(rs.log_path).read()
    if snapshots == "kept":
        assert f"{SNAPSHOT_FILE} (" in log           # a restart started from a snapshot
    else:
        assert "(no snapshot)" in log
    assert stored_sequences(read_topic(rs.store_dir), pid) == exactly_once(n)


def test_a_snapshot_covering_more_than_written_is_ignored(store):
    """A machine crash loses an unflushed tail after the snapshot was written: here the
    store is stopped cleanly (the snapshot covers everything), then the last record's
    bytes are zeroed, as an unflushed page would come back. Recovery cuts that record;
    the snapshot, which says sequence 19 is stored, must not be believed."""
    rs = store()
    with Producer(rs.store_dir, producer_id=808) as p:
        got = p.send_batch(rows(808, 0, 20))
    assert rs.stop() == 0, rs.log()
    snap = snapshot(rs)
    last = got[-1]
    assert snap["producers"][0][:2] == [808, 19]
    assert snap["commitLogOffset"] > last.commit_log_offset == snap["lastRecordOffset"]
    geometry = recorded_geometry(rs.store_dir)
    size = geometry["mapped_file_size_commit_log"]
    path = os.path.join(rs.store_dir, "commitlog", f"{last.commit_log_offset // size * size:020d}")
    with open(path, "r+b") as f:
        f.seek(last.commit_log_offset % size + 20)
        f.write(bytes(snap["commitLogOffset"] - last.commit_log_offset - 20))
    rs.start()
    with Producer(rs.store_dir, producer_id=808) as p:
        lost = p.send_batch(rows(808, 19, 1), first_sequence=19)[0]
        assert lost.status is PutMessageStatus.PUT_OK and lost.reason == "", lost
        assert lost.commit_log_offset == last.commit_log_offset   # where the cut was
        assert is_duplicate(p.send_batch(rows(808, 18, 1), first_sequence=18)[0])
    assert rs.stop() == 0, rs.log()
    assert "past WRITTEN" in open(rs.log_path).read()
    assert stored_sequences(read_topic(rs.store_dir), 808) == exactly_once(20)


def test_an_idle_producer_expires_and_starts_over_at_zero(store):
    rs = store(producer_id_expiration_ms=1500, flush_delay_offset_interval=100)
    with Producer(rs.store_dir, producer_id=6006) as p:
        assert all(r.reason == "" for r in p.send_batch(rows(6006, 0, 5)))
        def producers() -> list:
            return [row_[:2] for row_ in (snapshot(rs) or {}).get("producers", [])]
        wait_for(lambda: producers() == [[6006, 4]], 10, "a snapshot holding the producer")
        wait_for(lambda: snapshot(rs)["producers"] == [], 20, "the producer to expire")
        late = p.send_batch([row(6006, 5)])[0]
        assert late.status is OUT_OF_ORDER and late.queue_offset == 0
        assert "unknown" in late.reason and "producer_id_expiration_ms" in late.reason
        p.next_sequence = 0                                  # start over, same id
        again = p.send_batch([row(6006, 5)])[0]
        assert again.status is PutMessageStatus.PUT_OK and again.reason == ""
        assert p.next_sequence == 1
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert sorted(body_sequence(m.body)[1] for m in msgs) == [0, 1, 2, 3, 4, 5]
    restarted = [m for m in msgs if body_sequence(m.body)[1] == 5]
    assert restarted[0].properties[PROPERTY_PRODUCER_SEQUENCE] == "0"


def test_a_delayed_record_delivered_later_does_not_rewind_its_producer(store):
    """The scheduler's re-put of a delayed record carries the scheduler's own identity,
    never the producer's: after a writer restart (which rebuilds from the CommitLog,
    where the re-put lies after the producer's later records) the producer continues
    where it was."""
    rs = store()
    pid = 5150
    with Producer(rs.store_dir, producer_id=pid) as p:
        first = p.send_batch([row(pid, 0, delay_level=1)] + rows(pid, 1, 4))
        assert all(r.reason == "" for r in first)
        with Consumer(rs.store_dir, "g", TOPIC) as c:
            delivered, deadline = [], time.monotonic() + 30
            while len(delivered) < 5 and time.monotonic() < deadline:
                delivered += c.poll(16, 500)
        bodies = sorted(body_sequence(m.body)[1] for m in delivered)
        assert bodies == [0, 1, 2, 3, 4]
        copy = next(m for m in delivered if body_sequence(m.body)[1] == 0)
        assert copy.properties.get(PROPERTY_PRODUCER_ID) != str(pid)
        assert copy.properties[PROPERTY_PRODUCER_SEQUENCE] == "0"   # the level's first
        writer = rs.child_pid("writer")
        os.kill(writer, signal.SIGKILL)
        wait_for(lambda: rs.child_pid("writer") not in (0, writer), 60, "writer restart")
        deadline = time.monotonic() + 30
        while True:
            try:
                nxt = p.send_batch(rows(pid, 5, 1))[0]
                break
            except ClientError:
                assert time.monotonic() < deadline
        assert nxt.status is PutMessageStatus.PUT_OK and nxt.reason == "", nxt
        assert is_duplicate(p.send_batch([row(pid, 0, delay_level=1)], first_sequence=0)[0])
    assert rs.stop() == 0, rs.log()
    msgs = read_topic(rs.store_dir)
    assert sorted(body_sequence(m.body)[1] for m in msgs) == [0, 1, 2, 3, 4, 5]


# ============================================================================ in process
def test_a_duplicate_of_a_record_whose_append_failed_fails_too(tmp_path, monkeypatch):
    """Two requests of one batch carry the same sequences; the append fails at the end
    of the file (no next file: fallocate fails with ENOSPC through ``FILE_OPS``). The
    duplicates of the records that got in share their offsets; those of the records
    that did not are refused too, never answered PUT_OK."""
    from test_writer_flusher import InProcessWriter
    w = InProcessWriter(tmp_path)
    pid, n = 11, 70

    def serve(*requests) -> dict:
        frames = [([client], protocol.encode_send(rid, rows(pid, first, k), pid, first))
                  for client, rid, first, k in requests]
        w.service._serve([(env, f, protocol.peek_header(f)) for env, f in frames])
        replies = dict(protocol.decode_send_reply(f) for f in w.replies)
        w.replies.clear()
        return replies

    try:
        assert all(r.reason == "" for r in serve((b"a", 1, 0, 5))[1])
        refuse_next_commit_log_file(w.config, w.table.read_written()[0], monkeypatch,
                                    w.service.commit_log)
        replies = serve((b"a", 2, 5, n - 5), (b"b", 3, 5, n - 5))
        a, b = replies[2], replies[3]
        fits = sum(r.status is PutMessageStatus.PUT_OK for r in a)
        assert 0 < fits < n - 5
        assert all(r.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED for r in a[fits:])
        for ra, rb in zip(a[:fits], b[:fits]):
            assert is_duplicate(rb) and "this batch" in rb.reason
            assert (rb.msg_id, rb.commit_log_offset) == (ra.msg_id, ra.commit_log_offset)
        assert all(r.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED and
                   "twice in one batch" in r.reason for r in b[fits:])
        assert w.service.producers.last_sequence(pid) == 5 + fits - 1
        monkeypatch.undo()
        rest = serve((b"b", 4, 5 + fits, n - 5 - fits))[4]
        assert all(r.status is PutMessageStatus.PUT_OK and r.reason == "" for r in rest)
        assert w.service.producers.last_sequence(pid) == n - 1
    finally:
        w.close()
    s = MessageStore(w.config)
    s.load()
    try:
        assert s.check() == []
        msgs = [m for q in range(QUEUES) for m in read_queue(s, TOPIC, q)]
    finally:
        s.close()
    assert stored_sequences(msgs, pid) == exactly_once(n)
