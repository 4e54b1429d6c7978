"""A store process restarted under a client costs the client the restart, not its
timeout: ``rocketstore up`` with every process, real sockets, real files.

Requests are put in flight reliably by SIGSTOP of the process that would answer them
(the requests wait, unread, in its socket), then SIGKILL of it: the supervisor starts
another. The clients use a 30 s timeout; "at once" is a generous bound well under it.
What a Producer was answered PUT_OK is read back from the stopped store (every queue
of the topic through its consume queue, ``check() == []``) and must be there once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import pytest

from conftest import read_queue
from rocketstore import ConnectionLost, Consumer, Producer, ReaderClient, RequestTimeout
from rocketstore.shm.positions import (
    PROC_STATE, STARTED_MS, PositionTable, ProcessState, Slot, now_ms)
from rocketstore.storage import Message, MessageStore, PutMessageStatus, StoreConfig
from rocketstore.storage.config import recorded_geometry
from store_processes import RunningStore, wait_for

TOPIC = "Gap"
QUEUES = 4
TIMEOUT_MS = 30_000
AT_ONCE_S = 5.0          # well under TIMEOUT_MS: the restart, not the timeout


@pytest.fixture
def store(tmp_path):
    """A running store (every process), stopped at the end."""
    rs = RunningStore(tmp_path).start()
    yield rs
    rs.__exit__(None, None, None)


def message(i: int) -> Message:
    return Message(topic=TOPIC, body=f"m{i}".encode(), queue_id=i % QUEUES)


def stored_bodies(store_dir: str) -> Counter:
    """How many times each body of TOPIC is stored, read from the stopped store."""
    s = MessageStore(StoreConfig(store_path_root_dir=store_dir, **recorded_geometry(store_dir)))
    s.load()
    try:
        assert s.check() == []
        return Counter(m.body for q in range(QUEUES) for m in read_queue(s, TOPIC, q))
    finally:
        s.close()


def kill_stopped(rs, name: str) -> float:
    """SIGKILL the (stopped) process ``name`` and wait for the next; the moment it was
    killed."""
    pid = rs.child_pid(name)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: rs.child_pid(name) not in (0, pid), 30, f"{name} restart")
    return killed


def in_flight_then_killed(rs, p: Producer, first: int, n: int):
    """Send messages first..first+n-1 one batch each to a stopped writer, then kill it;
    the handles and the moment of the kill."""
    writer = rs.child_pid("writer")
    os.kill(writer, signal.SIGSTOP)
    try:
        handles = [p.send_async([message(i)]) for i in range(first, first + n)]
    finally:
        os.kill(writer, signal.SIGKILL)
    killed = time.monotonic()
    return handles, killed


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_writer_killed_with_sends_in_flight(store, idempotent):
    rs = store
    acked: list[bytes] = []
    with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS, idempotent=idempotent) as p:
        assert p.send(TOPIC, b"m0", queue_id=0).status is PutMessageStatus.PUT_OK
        acked.append(b"m0")
        handles, killed = in_flight_then_killed(rs, p, 1, 5)
        outcomes = []
        for h in handles:
            try:
                outcomes.append(h.result()[0])
            except RequestTimeout as e:
                outcomes.append(e)
        took = time.monotonic() - killed
        assert took < AT_ONCE_S, (took, outcomes)
        if idempotent:
            assert all(r.status is PutMessageStatus.PUT_OK for r in outcomes), outcomes
            acked += [f"m{i}".encode() for i in range(1, 6)]
        else:
            assert all(type(e) is ConnectionLost for e in outcomes), outcomes
            assert "was lost with request" in str(outcomes[0])
            assert "its outcome is unknown" in str(outcomes[0])
        # the next send goes to the writer that took its place
        assert p.send(TOPIC, b"m6", queue_id=2).status is PutMessageStatus.PUT_OK
        acked.append(b"m6")
    assert rs.restarts("writer") == 1
    assert rs.stop() == 0, rs.log()
    stored = stored_bodies(rs.store_dir)
    assert all(stored[b] == 1 for b in acked), stored
    if idempotent:
        assert stored == Counter({f"m{i}".encode(): 1 for i in range(7)})


def test_idempotent_resend_of_stored_batches_is_answered_as_duplicates(store):
    """Batches the writer stored but whose answers were lost with it: the resends are
    answered PUT_OK ("duplicate:"), the records stored once."""
    rs = store
    with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS, producer_id=77) as p:
        assert p.send(TOPIC, b"m0", queue_id=0).status is PutMessageStatus.PUT_OK
        p.next_sequence = 0                                    # m0 goes again, as 0
        handles, killed = in_flight_then_killed(rs, p, 0, 3)   # 0 stored above; 1, 2 new
        results = [h.result()[0] for h in handles]
        assert time.monotonic() - killed < AT_ONCE_S
        assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 3
        assert results[0].reason.startswith("duplicate:"), results
    assert rs.stop() == 0, rs.log()
    assert stored_bodies(rs.store_dir) == Counter({b"m0": 1, b"m1": 1, b"m2": 1})


def test_plain_producer_in_a_thread_sees_connection_lost_at_once(store):
    """``send`` blocked in its wait when the writer dies."""
    rs = store
    with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS) as p:
        p.send(TOPIC, b"m0", queue_id=0)
        writer = rs.child_pid("writer")
        os.kill(writer, signal.SIGSTOP)
        outcome: list = []

        def send() -> None:
            try:
                outcome.append(p.send(TOPIC, b"m1", queue_id=1))
            except RequestTimeout as e:
                outcome.append(e)
        t = threading.Thread(target=send, daemon=True)
        t.start()
        wait_for(lambda: p._dealer._pending, 10, "the send to go out")
        killed = kill_stopped(rs, "writer")
        t.join(TIMEOUT_MS / 1000 + 5)
        assert time.monotonic() - killed < AT_ONCE_S
        assert len(outcome) == 1 and type(outcome[0]) is ConnectionLost, outcome
        assert p.send(TOPIC, b"m2", queue_id=2).status is PutMessageStatus.PUT_OK


def test_reader_killed_with_a_read_in_flight_is_read_again(store):
    rs = store
    with Producer(rs.store_dir) as p:
        for i in range(8):
            p.send(TOPIC, f"m{i}".encode(), queue_id=i % QUEUES)
    with ReaderClient(rs.store_dir, timeout_ms=TIMEOUT_MS) as rc:
        wait_for(lambda: sum(q.max_offset for q in rc.offsets([TOPIC])) == 8, 30,
                 "the messages to be dispatched")
        reader = rs.child_pid("reader")
        os.kill(reader, signal.SIGSTOP)
        outcome: list = []

        def read() -> None:
            try:
                outcome.append(rc.offsets([TOPIC]))
            except Exception as e:  # noqa: BLE001 - checked below
                outcome.append(e)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        wait_for(lambda: rc._dealer._pending, 10, "the read to go out")
        killed = kill_stopped(rs, "reader")
        t.join(TIMEOUT_MS / 1000 + 5)
        assert time.monotonic() - killed < AT_ONCE_S, outcome
        assert len(outcome) == 1 and isinstance(outcome[0], list), outcome
        assert sum(q.max_offset for q in outcome[0]) == 8
        rc.commit_offsets("g", TOPIC, {0: 1})          # the new reader answers the next
        r = rc.pull(TOPIC, 1, 0, 32)
        assert [m.body for m in r.messages] == [b"m1", b"m5"]


def test_consumer_long_poll_wakes_after_the_dispatcher_restarted(store):
    rs = store
    with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS) as p:
        p.send(TOPIC, b"m0", queue_id=0)
        with Consumer(rs.store_dir, "g", TOPIC) as c:
            wait_for(lambda: c.poll(32, 200), 30, "the first message")
            got: list = []
            t = threading.Thread(target=lambda: got.append(c.poll(32, TIMEOUT_MS)),
                                 daemon=True)
            t.start()
            dispatcher = rs.child_pid("dispatcher")
            os.kill(dispatcher, signal.SIGKILL)
            wait_for(lambda: rs.child_pid("dispatcher") not in (0, dispatcher), 30,
                     "dispatcher restart")
            assert t.is_alive()                      # nothing to return yet
            sent = time.monotonic()
            p.send(TOPIC, b"m1", queue_id=1)
            t.join(TIMEOUT_MS / 1000 + 5)
            assert time.monotonic() - sent < AT_ONCE_S
            assert [m.body for m in got[0]] == [b"m1"]


def test_a_writer_killed_inside_its_publish_of_written_is_replaced(store):
    """A writer killed between the two stores of ``publish_written`` leaves the seqlock
    over WRITTEN odd; its successor ends the torn publish instead of waiting on it
    forever (and the flusher and dispatcher with it). The odd count is set here by hand
    on the stopped writer: a SIGKILL lands inside those two stores too rarely to aim."""
    rs = store
    with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS, idempotent=True) as p:
        assert p.send(TOPIC, b"m0", queue_id=0).status is PutMessageStatus.PUT_OK
        writer = rs.child_pid("writer")
        os.kill(writer, signal.SIGSTOP)
        table = PositionTable.attach(rs.store_dir, process="writer")
        try:
            table._slots[Slot.WRITTEN_SEQ] += 1           # as if killed mid-publish
        finally:
            table.close()
        handle = p.send_async([message(1)])
        killed = kill_stopped(rs, "writer")
        assert handle.result()[0].status is PutMessageStatus.PUT_OK
        assert time.monotonic() - killed < AT_ONCE_S
        assert rs.slot(Slot.WRITTEN_SEQ) % 2 == 0
        assert "killed while publishing WRITTEN" in rs.log()
    assert rs.stop() == 0, rs.log()
    assert stored_bodies(rs.store_dir) == Counter({b"m0": 1, b"m1": 1})



def test_a_process_that_ran_is_started_again_at_once_and_one_failing_at_start_backs_off(
        tmp_path):
    """The supervisor starts a process that died after ``startsecs`` again at once, as
    supervisord does (its ``backoff_s`` was slept first: half a second of every writer
    restart by default, with every producer waiting); one that dies sooner than that
    still waits out its back-off. The writer's back-off is 30 s here: "at once" is
    well under it."""
    rs = RunningStore(tmp_path, processes={"writer": {"backoff_s": 30.0,
                                                      "backoff_max_s": 60.0,
                                                      "startsecs": 3.0}}).start()
    try:
        table = rs.table()
        try:
            wait_for(lambda: now_ms() - table.get_process("writer", STARTED_MS) > 3500, 30,
                     "the writer to run past its startsecs")
            killed = kill_stopped(rs, "writer")
            assert time.monotonic() - killed < AT_ONCE_S
            assert rs.restarts("writer") == 1
            os.kill(rs.child_pid("writer"), signal.SIGKILL)     # within its startsecs
            wait_for(lambda: table.get_process("writer", PROC_STATE) == ProcessState.BACKOFF,
                     10, "the writer's back-off")
        finally:
            table.close()
        assert rs.restarts("writer") == 1 and rs.child_pid("writer") == 0
    finally:
        rs.__exit__(None, None, None)


def snapshot_offset(store_dir: str) -> int:
    """The CommitLog offset the writer's producer snapshot covers (-1: none yet)."""
    try:
        with open(os.path.join(store_dir, "config", "producerState.json")) as f:
            return json.load(f)["commitLogOffset"]
    except (FileNotFoundError, ValueError):      # not written yet, or being replaced
        return -1


def test_a_restarted_writer_walks_only_what_its_predecessor_wrote_since_its_last_snapshot(
        tmp_path):
    """The producer snapshot follows WRITTEN under plain producers too: it stayed where
    the first writer wrote it, and every later writer walked the CommitLog from there
    for the identities of idempotent records, the whole last file (seconds with 1 GB
    files) although no record carried one."""
    with RunningStore(tmp_path, flush_delay_offset_interval=200) as rs:
        with Producer(rs.store_dir, timeout_ms=TIMEOUT_MS) as p:
            for i in range(3):
                assert all(r.ok for r in p.send_batch([message(j) for j in range(i, 400, 3)]))
                written = rs.slot(Slot.WRITTEN)
                wait_for(lambda: snapshot_offset(rs.store_dir) == written, 10,
                         f"the producer snapshot to cover WRITTEN {written}")
        writer = rs.child_pid("writer")
        os.kill(writer, signal.SIGKILL)
        wait_for(lambda: f"CommitLog [{written}, {written})" in rs.log(), 30,
                 "the next writer's producer state")
        assert rs.slot(Slot.WRITTEN) == written
