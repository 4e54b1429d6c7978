"""The writer and flusher processes, run for real: spawned processes, ipc sockets, shm.

Each process test builds a store (8 KiB commitlog files, ``small_config``), optionally
preloads it through the embedded store, and does what the supervisor does before its
children start: ``procs.recovery.recover_and_publish`` (the position table and the
lock), STATE = RUNNING. It then starts the flusher and the writer as spawned processes
running ``procs.service.run_service`` and waits until their HEARTBEAT_MS slots move.
Producers are zmq DEALERs speaking ``wire.protocol``. At the end the children get
SIGTERM and are joined, the lock and the table are given up, and the embedded
``MessageStore`` reopens the store: ``check() == []``, every acknowledged message is
readable by msg id and by (queue, offset) with its body, and every queue holds exactly
the messages acknowledged for it (no gap, no duplicate, nothing refused).

Fault injection, and where a test stands in for another process:

* a stopped flusher: SIGSTOP (SYNC acks wait, time out as FLUSH_DISK_TIMEOUT, and the
  per-client window fills up);
* a killed writer: SIGKILL between batches, then a new writer process; a torn append
  past WRITTEN is made by writing part of a record into the file before it starts;
* a failed fdatasync: a spawned process cannot be monkeypatched, so the writer's
  refusal is tested by setting the FLUSH_ERROR slot from the test (standing in for the
  flusher, as it does for the cleaner's DISK_FULL and the supervisor's STATE), and the
  flusher's EIO handling by running its flush (``FlusherService.flush_commit_log``) in
  this process with ``storage.mapped_file.FILE_OPS.fdatasync`` replaced;
* the writer's restart decision table and ``storage.topic_queue_table.rebuild`` run in
  this process too, over every case, against counts known from what was put.

Nothing here sleeps in place of waiting: replies are waited for with zmq polls, state
with ``wait_until`` (a condition polled until a generous deadline). Processes and shm
segments are cleaned up by the fixture even when a test fails.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from collections import Counter

import multiprocess
import pytest
import zmq

from conftest import destroy_context, refuse_next_commit_log_file, small_config
from rocketstore.wire import protocol
from rocketstore.procs import recovery
from rocketstore.procs.flusher import FlusherService
from rocketstore.wire.protocol import ErrorCode, Kind
from rocketstore.procs.service import run_service
from rocketstore.procs.writer import WINDOW, WriterService
from rocketstore.shm import bus, doorbell
from rocketstore.shm.doorbell import Doorbell
from rocketstore.shm.positions import HEARTBEAT_MS, PROC_STATE, PositionTable, ProcessState, Slot, StoreState
from rocketstore.storage import Message, MessageStore, PutMessageStatus, record, record_batch
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.mapped_file import FILE_OPS, now_ms, offset_to_file_name
from rocketstore.storage.message import TRANSACTION_PREPARED_TYPE
from rocketstore.storage.topic_queue_table import rebuild

SPAWN = multiprocess.get_context("spawn")
DEADLINE_S = 20
FILE_SIZE = 8192
TOPICS = ("TopicA", "TopicB")


# ============================================================================ helpers
def wait_until(condition, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


def message(i: int, topic: str = "TopicA", queue_id: int | None = None, **kw) -> Message:
    body = f"{topic}-{i}-".encode().ljust(100, b".")
    return Message(topic=topic, body=body, tags=f"Tag{i % 3}", keys=[f"k{i}"],
                   queue_id=queue_id, **kw)


def preload_messages(n: int) -> list[Message]:
    """Plain messages on two topics and three queues, every 7th delayed (it goes to
    SCHEDULE_TOPIC_XXXX) and every 9th a PREPARED transaction half (no queue offset)."""
    msgs = []
    for i in range(n):
        m = message(1000 + i, TOPICS[i % 2], i % 3)
        if i % 7 == 6:
            m.delay_level = 2
        elif i % 9 == 8:
            m.sys_flag = TRANSACTION_PREPARED_TYPE
        msgs.append(m)
    return msgs


def queue_counts(msgs: list[Message]) -> Counter:
    """Next queue offset per (topic, queue) after putting ``msgs`` with explicit queues."""
    counts: Counter = Counter()
    for m in msgs:
        if m.sys_flag & TRANSACTION_PREPARED_TYPE:
            continue
        key = (record.SCHEDULE_TOPIC, m.delay_level - 1) if m.delay_level else (m.topic, m.queue_id)
        counts[key] += 1
    return counts


def preload(config: StoreConfig, msgs: list[Message]) -> None:
    """Put ``msgs`` into the store, dispatched (``close()`` does), no delayed one
    delivered: no service thread runs, so no schedule service may deliver a delayed
    message whose time came while the preload took long, into a queue it was not
    counted in."""
    store = MessageStore(config, background=False)
    store.load()
    try:
        assert all(r.ok for r in store.put_batch(msgs))
    finally:
        store.close()


class Client:
    """A producer: one DEALER on the ingest socket."""

    def __init__(self, context: zmq.Context, store_dir: str):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(bus.endpoint(store_dir, "ingest"))
        self.next_id = 1

    def send(self, msgs: list[Message]) -> int:
        request_id = self.next_id
        self.next_id += 1
        self.socket.send(protocol.encode_send(request_id, msgs))
        return request_id

    def recv(self, timeout_s: float = DEADLINE_S):
        """The next reply: ``(request_id, [SendResult])`` or an ``ErrorReply``;
        None when none came within ``timeout_s``."""
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        frame = self.socket.recv()
        if protocol.peek_header(frame).kind is Kind.ERROR:
            return protocol.decode_error(frame)
        return protocol.decode_send_reply(frame)

    def put(self, msgs: list[Message]) -> list[protocol.SendResult]:
        request_id = self.send(msgs)
        reply = self.recv()
        assert reply is not None, "no reply from the writer"
        assert reply[0] == request_id
        return reply[1]


class StandIns:
    """Position tables writing as other processes, for a test standing in for them (the
    table refuses a slot written by anyone but its process); the supervisor's is
    ``table`` itself."""

    def __init__(self, table: PositionTable, root: str):
        self.table, self.root, self.tables = table, root, {}

    def __call__(self, process: str) -> PositionTable:
        if process == "supervisor":
            return self.table
        if process not in self.tables:
            self.tables[process] = PositionTable.attach(self.root, process=process)
        return self.tables[process]

    def close(self) -> None:
        for t in self.tables.values():
            t.close()
        self.tables.clear()


class RunningStore:
    """A store with its flusher and writer running, as the supervisor would have it."""

    def __init__(self, root, **overrides):
        self.config = small_config(root, **overrides)
        self.root = self.config.store_path_root_dir
        self.procs: dict[str, multiprocess.Process] = {}
        self.acks: list[tuple[Message, protocol.SendResult]] = []
        self.expected: Counter = Counter()
        self.recovered: recovery.Recovered | None = None
        self.context = zmq.Context()
        self.stopped_pids: set[int] = set()

    @property
    def table(self) -> PositionTable:
        return self.recovered.table

    # ------------------------------------------------------------------ life
    def start(self, preloaded: list[Message] = ()) -> "RunningStore":
        if preloaded:
            preload(self.config, list(preloaded))
            self.expected.update(queue_counts(list(preloaded)))
        self.recovered = recovery.recover_and_publish(self.config)
        self.as_process = StandIns(self.table, self.root)
        self.table.set(Slot.STATE, StoreState.RUNNING)
        self.start_process("flusher")
        self.start_process("writer")
        return self

    def start_process(self, name: str) -> None:
        self.table.reset({self.table.process_slot(name, HEARTBEAT_MS): 0})
        self.table.set_process(name, PROC_STATE, ProcessState.STARTING)
        p = SPAWN.Process(target=run_service,
                          args=(f"rocketstore.procs.{name}", self.root, self.config.to_dict()), daemon=True)
        p.start()
        self.procs[name] = p

        def beating() -> bool:
            if not p.is_alive():
                raise RuntimeError(f"{name} exited with {p.exitcode} before its first turn")
            return self.table.get_process(name, HEARTBEAT_MS) != 0
        wait_until(beating, f"the {name}'s heartbeat")

    def signal(self, name: str, sig: int) -> None:
        pid = self.procs[name].pid
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped_pids.add(pid)
        elif sig == signal.SIGCONT:
            self.stopped_pids.discard(pid)

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        os.kill(p.pid, signal.SIGKILL)
        p.join(DEADLINE_S)
        assert p.exitcode == -signal.SIGKILL

    def stop(self) -> None:
        """SIGTERM, writer first (the supervisor stops in descending priority)."""
        for name in ("writer", "flusher"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            if p.pid in self.stopped_pids:
                os.kill(p.pid, signal.SIGCONT)
            self.ask_to_stop(name, p)
            p.join(DEADLINE_S)
            assert p.exitcode == 0, f"{name} exited with {p.exitcode}"

    def ask_to_stop(self, name: str, p) -> None:
        """What the supervisor does: mark the process STOPPING, then SIGTERM it."""
        self.table.set_process(name, PROC_STATE, ProcessState.STOPPING)
        p.terminate()

    def release(self) -> None:
        if self.recovered is not None:
            self.as_process.close()
            self.recovered.table.close()
            recovery.unlink_shared(self.root)
            self.recovered.lock.release()
            self.recovered = None

    def cleanup(self) -> None:
        """Whatever happened: no process, segment, lock or socket left behind."""
        for p in self.procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(DEADLINE_S)
        self.procs.clear()
        self.release()
        destroy_context(self.context)
        rundir = bus.run_dir(self.root)
        if rundir.startswith("/tmp/rocketstore-"):
            shutil.rmtree(rundir, ignore_errors=True)

    # ------------------------------------------------------------------ producing
    def client(self) -> Client:
        return Client(self.context, self.root)

    def record(self, msgs: list[Message], results: list[protocol.SendResult]) -> None:
        """Remember what was stored, for the final check."""
        assert len(results) == len(msgs)
        for m, r in zip(msgs, results):
            if r.ok:
                self.acks.append((m, r))
                self.expected[(m.topic, r.queue_id)] += 1

    def put(self, client: Client, msgs: list[Message]) -> list[protocol.SendResult]:
        results = client.put(msgs)
        self.record(msgs, results)
        return results

    # ------------------------------------------------------------------ the final check
    def reopen_and_verify(self) -> None:
        """Stop the processes, open the store (no service thread: the schedule service
        would deliver the delayed messages now due) and check every acknowledged
        message and every queue's length."""
        self.stop()
        self.release()
        store = MessageStore(self.config, background=False)
        store.load()
        store.dispatch()
        try:
            assert store.check() == []
            for m, r in self.acks:
                got = store.look_message_by_id(r.msg_id)
                assert got is not None, r
                assert (got.topic, got.queue_id, got.queue_offset, got.commit_log_offset,
                        got.body) == (m.topic, r.queue_id, r.queue_offset,
                                      r.commit_log_offset, bytes(m.body))
                pulled = store.get_message("g", m.topic, r.queue_id, r.queue_offset, 1)
                assert [x.msg_id for x in pulled.messages] == [r.msg_id]
            for (topic, queue_id), n in self.expected.items():
                assert store.get_max_offset_in_queue(topic, queue_id) == n, (topic, queue_id)
            acked = Counter((m.topic, r.queue_id, r.queue_offset) for m, r in self.acks)
            assert max(acked.values(), default=1) == 1, "a queue offset acknowledged twice"
        finally:
            store.close()


@pytest.fixture
def running(tmp_path):
    stores = []

    def make(**overrides) -> RunningStore:
        s = RunningStore(tmp_path / f"store{len(stores)}", **overrides)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.cleanup()


def end_of_last(results) -> int:
    """A lower bound that a FLUSHED/WRITTEN covering these records must pass."""
    return max(r.commit_log_offset for r in results if r.ok) + 1


# ============================================================================ ASYNC
def test_async_acks_publish_written_and_the_flusher_catches_up(running):
    s = running(flush_commit_log_thorough_interval=200).start(preload_messages(40))
    c = s.client()
    base = Counter(s.expected)
    written_before = s.table.read_written()[0]
    results = []
    for frame in range(3):
        msgs = [message(frame * 100 + i, TOPICS[i % 2],
                        None if i % 4 else i % 3) for i in range(100)]
        got = s.put(c, msgs)
        assert [r.status for r in got] == [PutMessageStatus.PUT_OK] * 100
        # WRITTEN already covers every acknowledged record when the reply arrives
        assert s.table.read_written()[0] >= end_of_last(got)
        results += zip(msgs, got)
    offsets = [r.commit_log_offset for _, r in results]
    assert offsets == sorted(offsets)
    assert offsets[0] in (written_before, _next_file(written_before))
    by_queue: dict = {}
    for m, r in results:
        by_queue.setdefault((m.topic, r.queue_id), []).append(r.queue_offset)
    for key, seen in by_queue.items():
        assert seen == list(range(base[key], base[key] + len(seen))), key
    assert {r.queue_id for m, r in results if m.queue_id is None} == set(range(8))
    written, store_ts = s.table.read_written()
    assert store_ts == results[-1][1].store_timestamp
    wait_until(lambda: s.table.get(Slot.FLUSHED) == written, "FLUSHED to reach WRITTEN")
    wait_until(lambda: StoreCheckpoint(os.path.join(s.root, "checkpoint"), read_only=True)
               .physic_msg_timestamp == store_ts, "the checkpoint's physic time")
    s.reopen_and_verify()


# ============================================================================ SYNC
def test_sync_acks_wait_for_flushed_and_time_out_when_the_flusher_stops(running):
    s = running(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=1000).start()
    c = s.client()
    got = s.put(c, [message(i, queue_id=i % 2) for i in range(50)])
    assert all(r.status is PutMessageStatus.PUT_OK for r in got)
    assert s.table.get(Slot.FLUSHED) >= end_of_last(got)

    # flusher stopped: the reply waits, then says FLUSH_DISK_TIMEOUT; the data is stored
    s.signal("flusher", signal.SIGSTOP)
    flushed = s.table.get(Slot.FLUSHED)
    sent_at = time.monotonic()
    msgs = [message(100 + i, queue_id=0) for i in range(5)]
    got = s.put(c, msgs)
    assert time.monotonic() - sent_at >= 0.9
    assert [r.status for r in got] == [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 5
    assert "sync_flush_timeout" in got[0].reason
    assert s.table.read_written()[0] >= end_of_last(got) and s.table.get(Slot.FLUSHED) == flushed

    # no reply while FLUSHED is short of the record; one as soon as it is not
    msgs = [message(200 + i, queue_id=1) for i in range(5)]
    request_id = _send_and_see_it_stored(s, c, msgs)
    assert c.recv(timeout_s=0.3) is None
    assert s.table.get(Slot.FLUSHED) == flushed
    s.signal("flusher", signal.SIGCONT)
    reply = c.recv()
    assert reply[0] == request_id
    assert [r.status for r in reply[1]] == [PutMessageStatus.PUT_OK] * 5
    assert s.table.get(Slot.FLUSHED) >= end_of_last(reply[1])
    s.record(msgs, reply[1])
    s.reopen_and_verify()


def test_sync_group_commit_one_fdatasync_answers_eight_waiting_producers(running):
    """Group commit with eight producers, each waiting on one message sent the way a
    Producer sends it (SEND_RECORDS: the writer's small path): while the flusher is
    stopped the writer stores and parks all eight; the first flush after it resumes (its
    FLUSHED on the bus) covers every one of them, and each is answered PUT_OK."""
    s = running(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=8000).start()
    flushes = bus.Subscriber(s.context, s.root, ["flusher"], [bus.FLUSHED])
    clients = [s.client() for _ in range(8)]
    for i in range(50):             # until the subscription has seen a flush
        s.put(clients[0], [message(1000 + i, queue_id=0)])
        if flushes.wait(200):
            break
    else:
        raise AssertionError("no FLUSHED reached the test's subscriber")
    s.signal("flusher", signal.SIGSTOP)
    flushed = s.table.get(Slot.FLUSHED)
    sent = {}
    for i, c in enumerate(clients):
        msgs = [message(i, queue_id=i % 4)]
        data, offsets = record_batch.encode_records(msgs, now_ms())
        written = s.table.read_written()[0]
        c.socket.send(protocol.encode_send_records(100 + i, data, offsets))
        wait_until(lambda: s.table.read_written()[0] > written, f"producer {i}'s message stored")
        sent[c] = msgs
    assert clients[0].recv(timeout_s=0.2) is None      # parked: not on disk yet
    written = s.table.read_written()[0]
    s.signal("flusher", signal.SIGCONT)
    for i, c in enumerate(clients):
        assert c.socket.poll(int(DEADLINE_S * 1000)), f"no answer to producer {i}"
        request_id, results = protocol.decode_send_records_reply(c.socket.recv())
        assert request_id == 100 + i and [r.status for r in results] == [PutMessageStatus.PUT_OK]
        assert results[0].commit_log_offset < written
        s.record(sent[c], results)
    first_flush = None
    while first_flush is None:          # earlier flushes' announcements may still come
        got = flushes.wait(int(DEADLINE_S * 1000))
        assert got, "no FLUSHED after the flusher resumed"
        past = [bus.decode_offset(payload) for _, payload in got
                if bus.decode_offset(payload) > flushed]
        first_flush = past[0] if past else None
    assert first_flush >= written, "the first flush left a parked producer for another"
    flushes.close()
    s.reopen_and_verify()


def test_sync_window_full_replies_busy_and_stores_nothing(running):
    s = running(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=8000).start()
    c = s.client()
    s.signal("flusher", signal.SIGSTOP)
    sent = {}
    for i in range(WINDOW + 6):
        msgs = [message(i, queue_id=i % 4)]
        sent[c.send(msgs)] = msgs
    busy = [c.recv() for _ in range(6)]
    assert sorted(r[0] for r in busy) == sorted(sent)[WINDOW:]
    for _, results in busy:
        assert [(r.status, r.reason) for r in results] == \
            [(PutMessageStatus.OS_PAGECACHE_BUSY, protocol.BUSY_REASON)]
    s.signal("flusher", signal.SIGCONT)
    for _ in range(WINDOW):
        request_id, results = c.recv()
        assert results[0].status is PutMessageStatus.PUT_OK
        s.record(sent[request_id], results)
    # the window is free again; the busy requests took no queue offset
    got = s.put(c, [message(999, queue_id=0)])
    assert (got[0].status, got[0].queue_offset) == (PutMessageStatus.PUT_OK, WINDOW // 4)
    s.reopen_and_verify()


def _send_and_see_it_stored(s, c, msgs: list[Message]) -> int:
    """Send ``msgs`` in one request and wait until the writer has stored them (WRITTEN
    moved); returns the request's id."""
    written = s.table.read_written()[0]
    request_id = c.send(msgs)
    wait_until(lambda: s.table.read_written()[0] > written, "the request stored")
    return request_id


def parked_request(running, sync_flush_timeout: int):
    """A SYNC_FLUSH store whose flusher is stopped, and a request of three messages the
    writer parked (stored, not yet flushed, no reply): ``(store, client, msgs,
    request_id)``."""
    s = running(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=sync_flush_timeout).start()
    c = s.client()
    s.signal("flusher", signal.SIGSTOP)
    msgs = [message(i, queue_id=0) for i in range(3)]
    request_id = _send_and_see_it_stored(s, c, msgs)
    assert c.recv(timeout_s=0.2) is None
    return s, c, msgs, request_id


def test_a_stopping_writer_answers_its_parked_requests(running):
    s, c, msgs, request_id = parked_request(running, 1000)
    writer = s.procs.pop("writer")
    s.ask_to_stop("writer", writer)
    reply = c.recv()
    assert reply[0] == request_id
    assert [r.status for r in reply[1]] == [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 3
    writer.join(DEADLINE_S)
    assert writer.exitcode == 0
    s.record(msgs, reply[1])
    s.reopen_and_verify()


def test_a_flush_error_answers_parked_requests_and_refuses_new_ones(running):
    s, c, msgs, request_id = parked_request(running, 60_000)
    s.as_process("flusher").set(Slot.FLUSH_ERROR, errno.EIO)   # standing in for the flusher
    reply = c.recv(timeout_s=20)       # at once, not at the sync_flush_timeout's 60 s
    assert reply[0] == request_id
    assert [r.status for r in reply[1]] == [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 3
    assert "EIO" in reply[1][0].reason
    s.record(msgs, reply[1])
    refused = c.put([message(10, queue_id=0)])
    assert refused[0].status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "flush failed" in refused[0].reason and "EIO" in refused[0].reason
    s.as_process("flusher").set(Slot.FLUSH_ERROR, 0)
    s.signal("flusher", signal.SIGCONT)
    s.reopen_and_verify()


# ============================================================================ refusals
def test_position_table_refusals_store_nothing(running):
    s = running().start()
    c = s.client()
    s.put(c, [message(0, queue_id=0)])
    written = s.table.read_written()
    cases = [(Slot.FLUSH_ERROR, errno.EIO, 0, "flush failed (EIO"),   # the flusher's slot
             (Slot.DISK_FULL, 1, 0, "disk full"),                     # the cleaner's
             (Slot.DISPATCH_ERROR, errno.ENOSPC, 0,                   # the dispatcher's
              "WRITE_LOGICS_QUEUE_ERROR: dispatch stopped (the dispatcher waits for disk "
              "space (ENOSPC"),
             (Slot.STATE, StoreState.STOPPING, StoreState.RUNNING, "STOPPING")]  # supervisor's
    for slot, bad, good, reason in cases:
        s.as_process(slot.writer).set(slot, bad)
        got = c.put([message(1, queue_id=0), message(2, queue_id=1)])
        assert [r.status for r in got] == [PutMessageStatus.SERVICE_NOT_AVAILABLE] * 2
        assert reason in got[0].reason
        assert s.table.read_written() == written
        s.as_process(slot.writer).set(slot, good)
    got = s.put(c, [message(3, queue_id=0)])
    assert got[0].status is PutMessageStatus.PUT_OK and got[0].queue_offset == 1
    s.reopen_and_verify()


# ============================================================================ bad input
def test_bad_input_is_named_and_the_writer_keeps_serving(running):
    s = running().start()
    c = s.client()
    good = s.put(c, [message(0, queue_id=0)])
    assert good[0].ok

    def error_for(frame: bytes) -> protocol.ErrorReply:
        c.socket.send(frame)
        reply = c.recv()
        assert isinstance(reply, protocol.ErrorReply), reply
        return reply

    assert error_for(b"hello").code is ErrorCode.MALFORMED_FRAME
    v9 = protocol.HEADER.pack(protocol.MAGIC, 9, Kind.SEND, 77, 0)
    assert error_for(v9)[:2] == (77, ErrorCode.UNSUPPORTED_VERSION)
    assert error_for(protocol.encode_pull(78, "TopicA", 0, 0, 1))[:2] == \
        (78, ErrorCode.UNKNOWN_KIND)
    unknown_kind = protocol.HEADER.pack(protocol.MAGIC, 1, 12, 79, 0)
    assert error_for(unknown_kind)[:2] == (79, ErrorCode.UNKNOWN_KIND)
    truncated = protocol.encode_send(80, [message(1)])[:-5]
    assert error_for(truncated)[:2] == (80, ErrorCode.MALFORMED_FRAME)
    garbage_after = protocol.encode_send(81, [message(1)]) + b"xx"
    assert error_for(garbage_after)[:2] == (81, ErrorCode.MALFORMED_FRAME)
    c.socket.send_multipart([b"", protocol.encode_send(83, [message(1)])])   # REQ-style
    reply = c.recv()
    assert isinstance(reply, protocol.ErrorReply)
    assert reply[:2] == (83, ErrorCode.MALFORMED_FRAME) and "one message part" in reply.message
    oversized = protocol.HEADER.pack(protocol.MAGIC, 1, Kind.SEND, 82, 1) \
        + bytes(protocol.MAX_FRAME_BYTES)
    assert error_for(oversized)[:2] == (82, ErrorCode.FRAME_TOO_LARGE)

    msgs = [message(10, queue_id=1),
            Message(topic="../../etc", body=b"x"),
            Message(topic=record.SCHEDULE_TOPIC, body=b"x"),
            Message(topic="TopicA", body=b"x" * FILE_SIZE),
            Message(topic="TopicA", body=b"x", queue_id=99),
            Message(topic="TopicA", body=b"x", tags="a\x02b"),
            message(11, queue_id=1)]
    got = s.put(c, msgs)
    assert [r.status for r in got] == [PutMessageStatus.PUT_OK] + \
        [PutMessageStatus.MESSAGE_ILLEGAL] * 5 + [PutMessageStatus.PUT_OK]
    for r, word in zip(got[1:6], ("must match", "reserved", "cannot fit", "queue id",
                                  "tags must be")):
        assert word in r.reason and r.queue_offset == -1 and r.msg_id == ""
    assert (got[0].queue_offset, got[-1].queue_offset) == (0, 1)

    # peers that vanish before their answer are dropped and the others still served
    # (their messages, on a topic of their own, may or may not be stored: nobody was
    # told, so only check() judges them)
    for i in range(20):
        gone = s.client()
        gone.send([message(100 + i, "TopicGone", 0)])
        gone.socket.close(linger=-1)
    assert s.put(c, [message(12, queue_id=1)])[0].queue_offset == 2
    s.reopen_and_verify()


# ============================================================================ writer restarts
def test_writer_killed_between_batches_continues_without_gap_or_duplicate(running):
    s = running().start(preload_messages(30))
    c = s.client()
    first = s.put(c, [message(i, TOPICS[i % 2], i % 3) for i in range(60)])
    assert all(r.status is PutMessageStatus.PUT_OK for r in first)
    written = s.table.read_written()
    s.kill("writer")
    assert s.table.read_written() == written
    s.start_process("writer")
    assert s.table.read_written() == written     # a restart publishes nothing
    c = s.client()
    second = s.put(c, [message(100 + i, TOPICS[i % 2], i % 3) for i in range(60)])
    assert all(r.status is PutMessageStatus.PUT_OK for r in second)
    assert second[0].commit_log_offset in (written[0], _next_file(written[0]))
    s.reopen_and_verify()   # dense queues, each offset once, every ack readable


def test_torn_append_past_written_is_cut_by_the_next_writer(running):
    s = running().start()
    c = s.client()
    first = s.put(c, [message(i, queue_id=0) for i in range(10)])
    written = s.table.read_written()[0]
    s.kill("writer")
    path, pos = _file_and_pos(s.config, written)
    last = first[-1].commit_log_offset
    with open(path, "r+b") as f:
        f.seek(last % FILE_SIZE)
        whole = f.read(written - last)
        torn = bytearray(whole[:len(whole) // 2])           # the head of a record, no tail
        record.LONG.pack_into(torn, record.PHYSICALOFFSET_POS, written)
        f.seek(pos)
        f.write(torn)
    s.start_process("writer")
    with open(path, "rb") as f:
        f.seek(pos)
        assert f.read(len(torn)) == bytes(len(torn))
    second = s.put(s.client(), [message(100 + i, queue_id=0) for i in range(3)])
    assert second[0].commit_log_offset == written and second[0].queue_offset == 10
    s.reopen_and_verify()


def _file_and_pos(config: StoreConfig, offset: int) -> tuple[str, int]:
    start = offset - offset % FILE_SIZE
    return os.path.join(config.commit_log_dir, offset_to_file_name(start)), offset - start


def _next_file(offset: int) -> int:
    return offset - offset % FILE_SIZE + FILE_SIZE


# ---------------------------------------------------------------------------- decision table
RESTART_CASES = ("clean", "torn_record", "unallocated_next_file", "data_in_next_file",
                 "dispatch_behind")


@pytest.mark.parametrize("case", RESTART_CASES)
def test_writer_restart_decision_table(tmp_path, case):
    """Each row of procs/writer.py's restart table, run in this process: the CommitLog
    ends at WRITTEN, nothing past it survives, and the topic-queue table is what the
    puts imply (counts known from the messages, not read back)."""
    config = small_config(tmp_path / "store")
    msgs = preload_messages(150)
    preload(config, msgs)
    recovered = recovery.recover_and_publish(config)
    table = recovered.table
    try:
        written = table.read_written()[0]
        path, pos = _file_and_pos(config, written)
        next_path = os.path.join(config.commit_log_dir, offset_to_file_name(_next_file(written)))
        later_path = os.path.join(config.commit_log_dir,
                                  offset_to_file_name(_next_file(written) + FILE_SIZE))
        if case == "torn_record":
            with open(path, "r+b") as f:
                f.seek(pos)
                f.write(record.SIZE_MAGIC.pack(300, record.MESSAGE_MAGIC_CODE) + b"\x07" * 100)
        elif case == "unallocated_next_file":
            open(later_path, "wb").close()          # created, never allocated
        elif case == "data_in_next_file":
            with open(next_path, "r+b") as f:
                f.write(b"\x55" * 500)
        elif case == "dispatch_behind":
            # a record boundary well inside the CommitLog: the dispatcher is behind,
            # and its consume queues hold units past the position it published
            cl = CommitLog(config, read_only=True)
            cl.load()
            table.reset({Slot.DISPATCHED: _record_boundary(cl, written // 3)})
            cl.close()
        writer = WriterService(config.store_path_root_dir, config)
        writer.table = table
        cl = writer._open_commit_log()
        try:
            cl.stop_allocation()     # the next two files may be made ahead meanwhile: zeros
            assert cl.mapped_file_queue.get_max_wrote_position() == written
            assert dict(cl.topic_queue_table) == dict(queue_counts(msgs))
            with open(path, "rb") as f:
                f.seek(pos)
                assert f.read() == bytes(FILE_SIZE - pos)     # nothing past WRITTEN
            for later in (next_path, later_path):   # absent, or made ahead whole: zeros
                if os.path.exists(later):
                    with open(later, "rb") as f:
                        assert f.read() == bytes(FILE_SIZE), later
            assert len(cl.mapped_file_queue.mapped_files) == 1   # only the last stays mapped
        finally:
            cl.close()
    finally:
        table.close()
        recovery.unlink_shared(config.store_path_root_dir)
        recovered.lock.release()


def _record_boundary(cl: CommitLog, near: int) -> int:
    """The start of the first record at or after ``near``."""
    offset = 0
    while offset < near:
        mf = cl.mapped_file_queue.find_mapped_file_by_offset(offset)
        req = cl.check_message_and_return_size(mf, offset - mf.file_from_offset, FILE_SIZE, False)
        offset = offset + req.msg_size if req.msg_size else mf.file_from_offset + FILE_SIZE
    return offset


# ============================================================================ rebuild (pure)
@pytest.mark.parametrize("dispatch_fraction", [0.0, 0.4, 1.0])
def test_rebuild_matches_the_stores_table(tmp_path, dispatch_fraction):
    """``rebuild`` from (DISPATCHED, WRITTEN) equals the embedded store's own table, with
    dispatch at the start, in the middle (consume queues reach past DISPATCHED) or done,
    and with a torn unit after a queue's last one."""
    config = small_config(tmp_path / "store")
    store = MessageStore(config)
    store.load()
    try:
        first = preload_messages(120)
        assert all(r.ok for r in store.put_batch(first))
        store.dispatch()
        more = preload_messages(200)[120:]
        assert all(r.ok for r in store.put_batch(more))
        written = store.commit_log.get_max_offset()
        dispatched = _record_boundary(store.commit_log,
                                      int(store.reput_from_offset * dispatch_fraction))
        cq = store.find_consume_queue("TopicA", 0, create=False)
        last = cq.mapped_file_queue.get_last_mapped_file()
        torn = (1).to_bytes(8, "big") + (90).to_bytes(4, "big")   # a unit cut after its size
        last.buf[last.wrote_position:last.wrote_position + len(torn)] = torn
        got = rebuild(config, store.commit_log, dispatched, written)
        assert got == store.commit_log.topic_queue_table
        assert got == dict(queue_counts(first + more))
    finally:
        store.close()


# ============================================================================ in process
class InProcessService:
    """A service's code in this process (so FILE_OPS can be replaced) on a recovered
    store whose position table it shares; ``close`` tears it all down."""

    def __init__(self, config):
        self.config = config
        self.recovered = recovery.recover_and_publish(config)
        self.table = self.recovered.table
        self.as_process = StandIns(self.table, config.store_path_root_dir)
        self.context = zmq.Context()
        self.closed = False

    def start(self, service_class):
        svc = service_class(self.config.store_path_root_dir, self.config)
        svc.table = self.as_process(service_class.name)
        svc.context = self.context
        svc.setup()
        return svc

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.service.teardown()
        destroy_context(self.context)
        self.as_process.close()
        self.table.close()
        recovery.unlink_shared(self.config.store_path_root_dir)
        self.recovered.lock.release()


# ============================================================================ the flusher
class InProcessFlusher(InProcessService):
    """The flusher on a store whose position table says [0, WRITTEN) still needs
    flushing."""

    def __init__(self, tmp_path, **settings):
        config = small_config(tmp_path / "store", **settings)
        preload(config, preload_messages(120))
        super().__init__(config)
        self.written, self.store_ts = self.table.read_written()
        self.table.reset({Slot.FLUSHED: 0})  # standing in for a run that never flushed
        self.service = self.make()

    def make(self) -> FlusherService:
        return self.start(FlusherService)

    def physic_ts(self) -> int:
        return StoreCheckpoint(os.path.join(self.config.store_path_root_dir, "checkpoint"),
                               read_only=True).physic_msg_timestamp


@pytest.fixture
def flusher(tmp_path):
    f = InProcessFlusher(tmp_path)
    yield f
    f.close()


def test_flush_syncs_data_before_publishing_flushed_and_the_checkpoint_on_its_interval(
        flusher, monkeypatch):
    """A flush: every file's fdatasync before FLUSHED moves, then the physic time in the
    checkpoint's mapping (what every process reads). The checkpoint itself is
    fdatasync'ed by the first flush one ``flush_commit_log_thorough_interval`` after its
    last sync, after FLUSHED, and at teardown when the time moved since."""
    calls = []
    real = FILE_OPS.fdatasync
    cp_before = flusher.physic_ts()

    def recording(fd):
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")),
                      flusher.table.get(Slot.FLUSHED)))
        real(fd)
    monkeypatch.setattr(FILE_OPS, "fdatasync", recording)
    svc = flusher.service
    assert svc.flush_commit_log() is True
    files = [(offset_to_file_name(o), 0) for o in range(0, flusher.written, FILE_SIZE)]
    assert calls == files                                       # every file, before FLUSHED
    assert flusher.table.get(Slot.FLUSHED) == flusher.written
    assert flusher.physic_ts() == flusher.store_ts >= cp_before  # written, not yet synced
    assert set(svc.fds) == {flusher.written - flusher.written % FILE_SIZE}
    assert svc.flush_commit_log() is False                      # nothing left
    assert flusher.table.get(Slot.FLUSH_ERROR) == 0

    calls.clear()                       # one interval on: the next flush syncs it, last
    flusher.table.reset({Slot.FLUSHED: 0})
    svc.checkpoint_synced_ms -= flusher.config.flush_commit_log_thorough_interval
    assert svc.flush_commit_log() is True
    assert calls == files + [("checkpoint", flusher.written)]

    calls.clear()                       # a teardown with nothing new syncs nothing more
    svc.teardown()
    assert calls == []
    flusher.service = svc = flusher.make()
    flusher.table.reset({Slot.FLUSHED: 0})
    assert svc.flush_commit_log() is True and calls == files
    calls.clear()                       # one whose flush moved the time syncs it
    svc.checkpoint.physic_msg_timestamp -= 1     # standing in for an older synced time
    svc.checkpoint_synced_ts = svc.checkpoint.physic_msg_timestamp
    flusher.table.reset({Slot.FLUSHED: 0})
    svc.teardown()
    assert calls == files + [("checkpoint", flusher.written)]
    assert flusher.physic_ts() == flusher.store_ts
    flusher.service = flusher.make()


@pytest.mark.parametrize("flush_disk_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_a_flush_rings_the_dispatcher_where_flushed_is_its_confirm_offset(
        tmp_path, flush_disk_type):
    """Under SYNC_FLUSH the dispatcher follows FLUSHED: the flusher rings its doorbell
    once FLUSHED moved (the writer's appends do not). Under ASYNC_FLUSH it follows
    WRITTEN, and the flusher leaves the doorbell alone."""
    f = InProcessFlusher(tmp_path, flush_disk_type=flush_disk_type)
    try:
        bell = Doorbell.open(f.config.store_path_root_dir, doorbell.DISPATCH)
        assert bell is not None and bell.wait(0) is False
        assert f.service.flush_commit_log() is True
        assert f.table.get(Slot.FLUSHED) == f.written
        assert bell.wait(0) is (flush_disk_type == "SYNC_FLUSH")
        bell.close()
    finally:
        f.close()


def test_fdatasync_eio_sets_flush_error_and_flushed_stops(flusher, monkeypatch):
    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    cp_before = flusher.physic_ts()
    monkeypatch.setattr(FILE_OPS, "fdatasync", eio)
    assert flusher.service.flush_commit_log() is False
    assert flusher.table.get(Slot.FLUSH_ERROR) == errno.EIO
    assert flusher.table.get(Slot.FLUSHED) == 0
    assert flusher.physic_ts() == cp_before
    monkeypatch.undo()                                       # the disk "recovers": no retry
    assert flusher.service.flush_commit_log() is False
    assert flusher.table.get(Slot.FLUSHED) == 0
    flusher.service.teardown()
    flusher.service = flusher.make()                         # a restarted flusher neither
    assert flusher.service.flush_commit_log() is False
    assert flusher.table.get(Slot.FLUSHED) == 0
    assert flusher.table.get(Slot.FLUSH_ERROR) == errno.EIO


# ============================================================================ append faults
class InProcessWriter(InProcessService):
    """The writer (so FILE_OPS and the CommitLog can be made to fail), fed frames
    directly; its replies are collected instead of sent."""

    def __init__(self, tmp_path, **overrides):
        super().__init__(small_config(tmp_path / "store", **overrides))
        self.table.set(Slot.STATE, StoreState.RUNNING)
        self.service = self.start(WriterService)
        self.replies: list[bytes] = []
        self.service._send = lambda envelope, payload: self.replies.append(payload)
        self.next_id = 1

    def serve(self, msgs: list[Message]) -> None:
        frame = protocol.encode_send(self.next_id, msgs)
        self.next_id += 1
        self.serve_frames([frame])

    def serve_frames(self, frames: list[bytes]) -> None:
        """One drain of ``frames`` from one client, as ``_drain`` hands them over."""
        self.service._serve([([b"client"], f, protocol.peek_header(f)) for f in frames])

    def records_frame(self, msgs: list[Message]) -> bytes:
        """A SEND_RECORDS frame of ``msgs``, as a Producer lays it out."""
        data, offsets = record_batch.encode_records(msgs, now_ms())
        self.next_id += 1
        return protocol.encode_send_records(self.next_id - 1, data, offsets)

    def put(self, msgs: list[Message]) -> list[protocol.SendResult]:
        self.serve(msgs)
        request_id, results = protocol.decode_send_reply(self.replies.pop())
        assert request_id == self.next_id - 1 and not self.replies
        return results


@pytest.fixture
def writer(tmp_path):
    w = InProcessWriter(tmp_path)
    yield w
    w.close()


def _verify_embedded(config: StoreConfig, stored: list[protocol.SendResult]) -> None:
    store = MessageStore(config)
    store.load()
    try:
        assert store.check() == []
        for r in stored:
            assert store.look_message_by_id(r.msg_id).queue_offset == r.queue_offset
    finally:
        store.close()


def test_a_file_that_cannot_be_created_fails_only_its_records(writer, monkeypatch):
    first = writer.put([message(i, queue_id=0) for i in range(5)])
    written = writer.table.read_written()[0]
    refuse_next_commit_log_file(writer.config, written, monkeypatch,
                                writer.service.commit_log)
    got = writer.put([message(10 + i, queue_id=0) for i in range(60)])   # crosses the file end
    fits = [r for r in got if r.status is PutMessageStatus.PUT_OK]
    failed = got[len(fits):]
    assert fits and failed and all(
        r.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED and "commitlog file" in r.reason
        for r in failed)
    assert writer.table.read_written()[0] < _next_file(written)     # nothing past what fits
    monkeypatch.undo()
    again = writer.put([message(100, queue_id=0)])
    assert again[0].status is PutMessageStatus.PUT_OK
    assert again[0].commit_log_offset == _next_file(written)
    assert again[0].queue_offset == len(first) + len(fits)
    writer.close()
    _verify_embedded(writer.config, first + fits + again)


def test_an_append_that_raises_publishes_nothing_and_cuts_back(writer, monkeypatch):
    first = writer.put([message(i, queue_id=0) for i in range(5)])
    written = writer.table.read_written()
    real_append = writer.service.commit_log.append_batch

    def append_then_fail(batch, queue_ids, now):
        real_append(batch.prefix(2), queue_ids[:2], now)   # two records copied, then a fault
        raise RuntimeError("injected")
    monkeypatch.setattr(writer.service.commit_log, "append_batch", append_then_fail)
    got = writer.put([message(10 + i, queue_id=0) for i in range(4)])
    assert [r.status for r in got] == [PutMessageStatus.CREATE_MAPEDFILE_FAILED] * 4
    assert writer.table.read_written() == written
    cl = writer.service.commit_log                  # reopened at WRITTEN, table rebuilt
    assert cl.mapped_file_queue.get_max_wrote_position() == written[0]
    assert cl.topic_queue_table[("TopicA", 0)] == 5
    again = writer.put([message(100, queue_id=0)])
    assert (again[0].commit_log_offset, again[0].queue_offset) == (written[0], 5)
    writer.close()
    _verify_embedded(writer.config, first + again)


def test_a_small_append_that_raises_keeps_the_drains_earlier_sends_and_cuts_back(
        writer, monkeypatch):
    """The small path appends request by request: when the second request of a drain
    raises mid-append, the first is published and answered PUT_OK, the second refused,
    the torn bytes past WRITTEN cut, and the next send goes on where the first ended."""
    first = writer.put([message(i, queue_id=0) for i in range(3)])
    real_append = writer.service.commit_log.append_one    # a one-record frame's append
    calls = []

    done: list = []

    def append(*args):
        calls.append(args)
        got = real_append(*args)
        if len(calls) == 2:
            raise RuntimeError("injected")
        done.append(got)
        return got
    monkeypatch.setattr(writer.service.commit_log, "append_one", append)
    writer.serve_frames([writer.records_frame([message(10, queue_id=0)]),
                         writer.records_frame([message(11, queue_id=0)]),
                         writer.records_frame([message(12, queue_id=0)])])
    replies = [protocol.decode_send_records_reply(f)[1][0] for f in writer.replies]
    writer.replies.clear()
    assert [r.status for r in replies] == [PutMessageStatus.PUT_OK,
                                           PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                           PutMessageStatus.PUT_OK]
    ok, third = replies[0], replies[2]
    assert ok.commit_log_offset == done[0][0]
    size = writer.service.commit_log.look_message_by_offset(ok.commit_log_offset).store_size
    assert third.commit_log_offset == ok.commit_log_offset + size   # the torn bytes went
    assert (ok.queue_offset, third.queue_offset) == (3, 4)   # the failure took no offset
    assert writer.service.commit_log.get_max_offset() == writer.table.read_written()[0]
    monkeypatch.undo()
    writer.close()
    _verify_embedded(writer.config, first + [ok, third])


def test_one_record_sends_take_the_lane_and_are_answered_in_order(writer, monkeypatch):
    """A drain of one-record sends (``Producer.send``'s frame) is stored and answered
    by the one-record lane alone, in order, WRITTEN at the end of the last; a frame of
    two records after them goes on to the small path, and the one-record send after
    that with it, so every producer's requests are stored in the order sent."""
    handed_on = []
    small = writer.service._serve_small
    monkeypatch.setattr(writer.service, "_serve_small",
                        lambda frames: handed_on.append(len(frames)) or small(frames))
    writer.serve_frames([writer.records_frame([message(i, queue_id=0)]) for i in range(3)])
    ones = [protocol.decode_one_send_result(f) for f in writer.replies]
    writer.replies.clear()
    assert handed_on == []
    assert [r.status for r in ones] == [PutMessageStatus.PUT_OK] * 3
    assert [r.queue_offset for r in ones] == [0, 1, 2]
    cl = writer.service.commit_log
    last = cl.look_message_by_offset(ones[2].commit_log_offset)
    assert writer.table.read_written()[0] == ones[2].commit_log_offset + last.store_size
    assert last.body == message(2).body
    counters = writer.service.stats.snapshot()["counters"]     # counted aside until now
    assert counters["put_messages_total"]["values"] == [[["TopicA"], 3]]
    writer.serve_frames([writer.records_frame([message(3, queue_id=0)]),
                         writer.records_frame([message(4, queue_id=0), message(5, queue_id=0)]),
                         writer.records_frame([message(6, queue_id=0)])])
    mixed = [protocol.decode_send_records_reply(f)[1] for f in writer.replies]
    writer.replies.clear()
    assert handed_on == [2]                  # the lane took the first; the rest went on
    assert [[r.queue_offset for r in rs] for rs in mixed] == [[3], [4, 5], [6]]
    assert cl.get_max_offset() == writer.table.read_written()[0]
    monkeypatch.undo()
    writer.close()
    _verify_embedded(writer.config, ones + [r for rs in mixed for r in rs])


def test_a_lease_that_ends_during_a_lane_drain_answers_no_put_ok(writer, monkeypatch):
    """The lane's answers follow ``_reply_drain``'s rule: a store whose master lease
    ended between the drain's refusal check and its answers acknowledges nothing
    (SERVICE_NOT_AVAILABLE, naming why); the records stay stored below WRITTEN. The
    lease's end is injected (``Fence.reason`` answers None once, then a reason): a
    real lease cannot be made to end inside one drain."""
    class EndingLease:
        answers = iter([None])

        def reason(self):
            return next(self.answers, "NOT_MASTER: the lease ended")
    monkeypatch.setattr(writer.service, "fence", EndingLease())
    writer.serve_frames([writer.records_frame([message(i, queue_id=0)]) for i in range(2)])
    got = [protocol.decode_send_records_reply(f)[1][0] for f in writer.replies]
    assert [r.status for r in got] == [PutMessageStatus.SERVICE_NOT_AVAILABLE] * 2
    assert all("the lease ended" in r.reason for r in got)
    cl = writer.service.commit_log
    assert cl.get_max_offset() == writer.table.read_written()[0] > 0
    assert cl.topic_queue_table[("TopicA", 0)] == 2


def test_refused_and_busy_requests_leave_the_window_count_alone(tmp_path):
    """Requests parked under SYNC_FLUSH (no flusher runs here) hold the client's window;
    refusals and busy answers neither take a slot nor free one."""
    w = InProcessWriter(tmp_path, flush_disk_type="SYNC_FLUSH")
    try:
        for i in range(3):
            w.serve([message(i, queue_id=0)])
        assert w.replies == [] and w.service.unanswered == {b"client": 3}
        w.as_process("cleaner").set(Slot.DISK_FULL, 1)      # standing in for the cleaner
        assert w.put([message(9, queue_id=0)])[0].status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert w.service.unanswered == {b"client": 3}
        w.as_process("cleaner").set(Slot.DISK_FULL, 0)
        for i in range(WINDOW - 3):
            w.serve([message(10 + i, queue_id=0)])
        assert w.put([message(99, queue_id=0)])[0].status is PutMessageStatus.OS_PAGECACHE_BUSY
        assert w.service.unanswered == {b"client": WINDOW}
        w.as_process("flusher").set(Slot.FLUSHED, w.table.read_written()[0])  # as the flusher
        w.service._release_parked()
        assert len(w.replies) == WINDOW and w.service.unanswered == {}
    finally:
        w.close()
