"""The dispatcher and cleaner processes: real processes, real shared memory, real files.

Each test builds and fills a store with the embedded ``MessageStore`` (8 KiB commitlog
files, 32-unit consume-queue files, 255-entry index files), closes it, and does what
the supervisor does before children start (``procs.recovery.recover_and_publish``: the
store lock and the position table, STATE RUNNING). Then it starts the services with
the spawn start method and ``procs.service.run_service``.

No writer or flusher process is involved (other engineers build those): the test
process plays both. ``Appender`` appends with ``storage.commit_log.CommitLog`` (its
queue loaded without recovery and cut at WRITTEN, its topic-queue table rebuilt from the
records), then publishes WRITTEN, announces APPENDED on the writer's bus endpoint and
rings the dispatcher's doorbell;
``Appender.flush`` fdatasyncs and publishes FLUSHED. Every wait is on a condition
(DISPATCHED reaching a value, HEARTBEAT_MS moving, a file vanishing), with a deadline;
the waiting itself is on the dispatcher's bus announcements, with a short timeout.

What is checked against what: consume-queue files are decoded with ``tests/refcodec.py``
and compared with the records decoded, also with refcodec, from the commitlog files:
every unit at exactly its record's queue offset, size and tag hash, none missing, none
twice. After a clean stop (processes stopped, commitlog flushed, ``abort`` removed, the
way the supervisor stops) the store is reopened with ``MessageStore`` (normal recovery,
which repairs nothing in the middle of a queue) and ``check() == []``.

The disk-full test runs the cleaner's ``run_once`` in the test process with
``procs.cleaner.disk_used_ratio`` replaced (a real disk cannot be filled on demand);
every other test runs the real processes on the real disk's ratio.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import re
import signal
import threading
import time

import multiprocess
import pytest
import zmq

from rocketstore.procs import cleaner as cleaner_module
from rocketstore.procs import dispatcher as dispatcher_module
from rocketstore.procs import service as service_module
import refcodec
from conftest import destroy_context, msg, small_config
from rocketstore.procs.cleaner import Cleaner, clean_now_path
from rocketstore.procs.dispatcher import Dispatcher
from rocketstore.procs.recovery import recover_and_publish, unlink_shared
from rocketstore.shm.bus import (
    APPENDED, ARRIVAL, DISPATCHED, Publisher, Subscriber, decode_arrival, encode_offset)
from rocketstore.shm.doorbell import Doorbell
from rocketstore.shm.positions import (
    HEARTBEAT_MS, PROC_STATE, PositionTable, ProcessState, Slot, StoreState, now_ms)
from rocketstore.storage import Message, MessageStore, StoreConfig, mapped_file, record
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.message import is_consumable
from rocketstore.storage.store_lock import remove_abort

SPAWN = multiprocess.get_context("spawn")
TOPICS = ("DispA", "DispB")
QUEUES = 3
FILE = 8192
DEADLINE_S = 30
HOUR_MS = 3_600_000
BLANK_UNIT_SIZE = 0x7FFFFFFF


def message(i: int, body: bytes | None = None) -> Message:
    """Message ``i``: spread over TOPICS x QUEUES, with a tag, a key and a UNIQ_KEY."""
    m = msg(i, topic=TOPICS[i % 2], queue_id=(i // 2) % QUEUES,
            properties={"UNIQ_KEY": f"U{i:010X}"})
    if body is not None:
        m.body = body
    return m


# ============================================================================ the writer's part
class Appender:
    """What the writer and the flusher do, done from the test process."""

    def __init__(self, config: StoreConfig, bus: Publisher):
        self.bus = bus
        root = config.store_path_root_dir
        self.table = PositionTable.attach(root, process="writer")
        self.flusher_table = PositionTable.attach(root, process="flusher")
        self.doorbell = Doorbell.open(root)      # recover_and_publish made it
        self.commit_log = cl = CommitLog(config)
        cl.load()
        self.written = self.table.read_written()[0]
        mfq = cl.mapped_file_queue
        kept = []
        for mf in mfq.mapped_files:
            if mf.file_from_offset + mf.file_size <= self.written:
                kept.append(mf)
            elif mf.file_from_offset <= self.written:
                mf.set_positions(self.written - mf.file_from_offset)
                kept.append(mf)
            else:
                mf.close()
        mfq.mapped_files = kept
        mfq.mark_flushed_to(self.written)
        cl.set_topic_queue_table(self._queue_table())
        self.next_i = 1_000_000

    def _queue_table(self) -> dict[tuple[str, int], int]:
        table = {}
        for mf in self.commit_log.mapped_file_queue.mapped_files:
            pos, end = 0, mf.wrote_position
            while pos < end:
                req = record.check_message_and_return_size(mf.buf, pos, end,
                                                           mf.file_from_offset + pos, False)
                assert req.success, (mf.path, pos)
                if req.msg_size == 0:
                    break
                if is_consumable(req.sys_flag):
                    table[(req.topic, req.queue_id)] = req.consume_queue_offset + 1
                pos += req.msg_size
        return table

    def append(self, messages: list[Message], publish: bool = True) -> list:
        now = now_ms()
        cl = self.commit_log
        results = cl.append([cl.prepare(m, m.queue_id, now) for m in messages], now)
        assert all(r.status.name == "PUT_OK" for r in results)
        self.written = cl.get_max_offset()
        if publish:
            self.publish()
        return results

    def append_new(self, n: int, **kw) -> list:
        msgs = [message(self.next_i + k, **kw) for k in range(n)]
        self.next_i += n
        return self.append(msgs)

    def publish(self) -> None:
        self.table.publish_written(self.written, now_ms())
        self.bus.publish(APPENDED, encode_offset(self.written))
        self.doorbell.ring()         # as the writer wakes the dispatcher

    def flush(self, upto: int | None = None) -> None:
        self.commit_log.mapped_file_queue.flush_all()
        self.flusher_table.set(Slot.FLUSHED, self.written if upto is None else upto)

    def close(self) -> None:
        self.commit_log.close()
        self.table.close()
        self.flusher_table.close()
        self.doorbell.close()


# ============================================================================ the environment
@dataclasses.dataclass
class Env:
    config: StoreConfig
    store_dir: str
    recovered: object
    context: zmq.Context
    appender: Appender
    waiter: Subscriber
    processes: list = dataclasses.field(default_factory=list)
    closed: bool = False

    @property
    def table(self):
        return self.recovered.table

    def start(self, name: str, wait: bool = True):
        """Start ``procs.{name}``; with ``wait``, until its loop has turned once."""
        before = self.table.get_process(name, HEARTBEAT_MS)
        self.table.set_process(name, PROC_STATE, ProcessState.STARTING)
        p = SPAWN.Process(target=service_module.run_service,
                          args=(f"rocketstore.procs.{name}", self.store_dir, self.config.to_dict()))
        p.start()
        p.service_name = name
        self.processes.append(p)
        if wait:
            self.wait_for(lambda: self.table.get_process(name, HEARTBEAT_MS) > before,
                          f"{name} to turn", alive=p)
        return p

    def kill(self, p) -> None:
        os.kill(p.pid, signal.SIGKILL)
        p.join(DEADLINE_S)
        assert p.exitcode == -signal.SIGKILL

    def stop(self, p) -> None:
        """What the supervisor does: mark the process STOPPING, then SIGTERM it."""
        self.table.set_process(p.service_name, PROC_STATE, ProcessState.STOPPING)
        p.terminate()
        p.join(DEADLINE_S)
        assert p.exitcode == 0, f"{p} exited {p.exitcode}"

    def wait_for(self, predicate, what: str, alive=None, timeout_s: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if alive is not None and not alive.is_alive():
                raise AssertionError(f"{what}: the process exited with {alive.exitcode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.waiter.wait(20)

    def wait_turns(self, name: str, p, turns: int = 2) -> None:
        for _ in range(turns):
            seen = self.table.get_process(name, HEARTBEAT_MS)
            self.wait_for(lambda: self.table.get_process(name, HEARTBEAT_MS) > seen,
                          f"{name} to turn again", alive=p)

    def wait_dispatched(self, offset: int, p) -> None:
        self.wait_for(lambda: self.table.get(Slot.DISPATCHED) >= offset,
                      f"DISPATCHED to reach {offset}", alive=p)
        assert self.table.get(Slot.DISPATCHED) == offset

    def shutdown(self) -> None:
        """Stop as the supervisor does at a clean stop; idempotent."""
        if self.closed:
            return
        self.closed = True
        for p in self.processes:
            if p.is_alive():
                p.kill()
            p.join(DEADLINE_S)
        self.waiter.close()
        self.appender.bus.close()
        destroy_context(self.context)
        self.appender.close()
        self.table.close()
        unlink_shared(self.store_dir)
        self.recovered.lock.release()

    def reopen(self) -> MessageStore:
        """After every process stopped cleanly: flush, remove ``abort``, reopen."""
        assert all(not p.is_alive() for p in self.processes)
        self.appender.flush()
        self.shutdown()
        remove_abort(self.store_dir)
        store = MessageStore(self.config)
        store.load()
        return store


def make_env(root, fill: int, **overrides) -> Env:
    config = small_config(root, **overrides)
    with MessageStore(config) as store:
        for i in range(0, fill, 16):
            batch = [message(j) for j in range(i, min(fill, i + 16))]
            assert all(r.ok for r in store.put_batch(batch))
    recovered = recover_and_publish(config)
    recovered.table.set(Slot.STATE, StoreState.RUNNING)
    context = zmq.Context()
    store_dir = config.store_path_root_dir
    bus = Publisher(context, store_dir, "writer")
    waiter = Subscriber(context, store_dir, ["dispatcher"], [DISPATCHED])
    return Env(config, store_dir, recovered, context, Appender(config, bus),
               waiter)


@pytest.fixture
def env_factory(tmp_path):
    envs = []

    def factory(fill: int = 60, **overrides) -> Env:
        env = make_env(tmp_path / f"store{len(envs)}", fill, **overrides)
        envs.append(env)
        return env

    yield factory
    for env in envs:
        env.shutdown()


# ============================================================================ oracles (refcodec)
def commit_log_records(config: StoreConfig, written: int) -> list[dict]:
    """Every record below ``written``, decoded by refcodec from the files on disk."""
    out = []
    d = config.commit_log_dir
    for name in sorted(n for n in os.listdir(d) if n.isdigit()):
        start = int(name)
        if start >= written:
            break
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        if start + len(data) > written:
            data = data[:written - start]
        out.extend(refcodec.decode_commitlog_file(data, start)["records"])
    return out


def expected_units(records: list[dict], below: int | None = None) -> dict:
    """(topic, queue) -> {queue offset: (phy, size, tagsCode)} for records ending by
    ``below``."""
    out: dict = {}
    for r in records:
        if below is not None and r["physical_offset"] + r["total_size"] > below:
            continue
        tags = r["properties"].get("TAGS")
        out.setdefault((r["topic"], r["queue_id"]), {})[r["queue_offset"]] = (
            r["physical_offset"], r["total_size"], refcodec.java_hash(tags) if tags else 0)
    return out


def queue_units(config: StoreConfig, below: int | None = None) -> dict:
    """The units in the consume-queue files, decoded by refcodec (blanks left out),
    those whose message ends after ``below`` left out too."""
    out: dict = {}
    root = config.consume_queue_dir
    for topic in sorted(os.listdir(root)):
        for queue in sorted(os.listdir(os.path.join(root, topic))):
            qdir = os.path.join(root, topic, queue)
            units: dict = {}
            for name in sorted(n for n in os.listdir(qdir) if n.isdigit()):
                with open(os.path.join(qdir, name), "rb") as f:
                    data = f.read()
                first = int(name) // 20
                for k, (phy, size, tags) in enumerate(refcodec.decode_cq_file(data)):
                    if size == BLANK_UNIT_SIZE or (below is not None and phy + size > below):
                        continue
                    assert first + k not in units, f"unit {first + k} twice in {qdir}"
                    units[first + k] = (phy, size, tags)
            if units:
                out[(topic, int(queue))] = units
    return out


def assert_queues_match(env: Env, below: int | None = None) -> None:
    """Consume-queue files == the commitlog's records, unit for unit (below ``below``)."""
    written = env.appender.written
    expected = expected_units(commit_log_records(env.config, written), below)
    assert queue_units(env.config, below) == expected


def dispatched_in_queues(config: StoreConfig) -> int:
    return sum(len(u) for u in queue_units(config).values())


# ============================================================================ dispatcher
def logics_time(env: Env) -> int:
    """The checkpoint's logics time."""
    with open(os.path.join(env.store_dir, "checkpoint"), "rb") as f:
        return refcodec.decode_checkpoint(f.read())["logics"]


def newest_store_time(env: Env) -> int:
    """The store time of the last record appended."""
    return max(r["store_timestamp"] for r in commit_log_records(env.config,
                                                                env.appender.written))


def test_everything_appended_is_dispatched_announced_and_checkpointed(env_factory):
    env = env_factory(fill=60, flush_consume_queue_thorough_interval=0)
    arrivals = Subscriber(env.context, env.store_dir, ["dispatcher"], [ARRIVAL])
    try:
        p = env.start("dispatcher")
        # the SUB socket joins asynchronously: prime until one announcement gets through
        deadline = time.monotonic() + DEADLINE_S
        while not arrivals.wait(100):
            assert time.monotonic() < deadline, "no ARRIVAL ever reached the subscriber"
            env.appender.append_new(1)
        last: dict = {}

        def drain(timeout_ms: int) -> None:
            for _, payload in arrivals.wait(timeout_ms):
                topic, queues = decode_arrival(payload)
                assert queues, "an arrival names at least one queue"
                for queue_id, next_offset in queues.items():
                    assert next_offset > last.get((topic, queue_id), 0)
                    last[(topic, queue_id)] = next_offset

        for batch in (150, 7, 240):
            env.appender.append_new(batch)
            env.wait_dispatched(env.appender.written, p)
            assert_queues_match(env, below=env.table.get(Slot.DISPATCHED))   # while running
            drain(0)
        expected = expected_units(commit_log_records(env.config, env.appender.written))
        final = {key: max(units) + 1 for key, units in expected.items()}
        deadline = time.monotonic() + DEADLINE_S
        while last != final:                      # every queue that grew, announced
            assert time.monotonic() < deadline, (last, final)
            drain(100)
        newest = newest_store_time(env)
        env.wait_for(lambda: logics_time(env) == newest, "the checkpoint's logics time",
                     alive=p)
        env.stop(p)
    finally:
        arrivals.close()
    assert_queues_match(env)
    with env.reopen() as store:
        assert store.check() == []
        for i in range(env.appender.next_i - 6, env.appender.next_i):   # the index, too
            m = message(i)
            by_key = store.query_message(m.topic, f"key-{i}").messages
            by_uniq = store.query_message(m.topic, m.properties["UNIQ_KEY"]).messages
            assert [x.body for x in by_key] == [x.body for x in by_uniq] == [m.body]


def test_sync_flush_dispatches_nothing_past_flushed(env_factory):
    env = env_factory(fill=30, flush_disk_type="SYNC_FLUSH")
    p = env.start("dispatcher")
    start = env.table.get(Slot.DISPATCHED)
    results = env.appender.append_new(40)                 # WRITTEN moves, FLUSHED does not
    env.wait_turns("dispatcher", p)
    assert env.table.get(Slot.DISPATCHED) == start
    assert queue_units(env.config) == expected_units(commit_log_records(env.config, start))

    middle = results[20].wrote_offset                     # a record boundary
    env.appender.flush(middle)
    env.wait_dispatched(middle, p)
    env.appender.flusher_table.set(Slot.FLUSHED, middle + 10)  # inside a record: wait for it
    env.wait_turns("dispatcher", p)
    assert env.table.get(Slot.DISPATCHED) == middle
    assert queue_units(env.config) == expected_units(commit_log_records(env.config, middle))

    env.appender.flush()
    env.wait_dispatched(env.appender.written, p)
    env.stop(p)
    assert_queues_match(env)


def test_sigkill_at_random_moments_neither_loses_nor_duplicates_a_unit(env_factory):
    env = env_factory(fill=40)
    rng = random.Random(8239)
    for mode in ("first_chunk", "load", "load", "first_chunk", "load", "load"):
        before = env.table.get(Slot.DISPATCHED)
        if mode == "first_chunk":             # a backlog; killed once its first chunk is out
            env.appender.append_new(rng.randint(100, 300))
            p = env.start("dispatcher", wait=False)
            env.wait_for(lambda: env.table.get(Slot.DISPATCHED) > before,
                         "the first chunk", alive=p)
        else:                                 # appends go on while it dispatches
            p = env.start("dispatcher")
            target = before + rng.randint(20, 80) * 1000
            deadline = time.monotonic() + DEADLINE_S
            while env.table.get(Slot.DISPATCHED) < target:
                assert time.monotonic() < deadline and p.is_alive()
                env.appender.append_new(rng.randint(1, 40))
        env.kill(p)
        # whatever the kill left, everything below DISPATCHED is exactly right
        assert_queues_match(env, below=env.table.get(Slot.DISPATCHED))
    p = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, p)
    assert_queues_match(env)                     # every unit, exactly once, nothing else
    env.stop(p)
    records = commit_log_records(env.config, env.appender.written)
    assert dispatched_in_queues(env.config) == len(records) > 600
    with env.reopen() as store:
        assert store.check() == []


def test_a_second_writer_of_dispatched_stops_the_dispatcher_and_the_slot_keeps(env_factory):
    """Two dispatchers at once (here: the test, attached as one, runs DISPATCHED ahead):
    the running dispatcher's next advance would move the slot back, so the table refuses
    it (logged, SlotRegressionError), the process exits non-zero for the supervisor to
    restart, and the slot keeps the larger value: nothing is written back."""
    env = env_factory(fill=30)
    p = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, p)
    ahead = 1 << 40
    second = PositionTable.attach(env.store_dir, process="dispatcher")
    try:
        second.set(Slot.DISPATCHED, ahead)
        env.appender.append_new(5)
        p.join(DEADLINE_S)
        assert p.exitcode == 1
        assert env.table.get(Slot.DISPATCHED) == ahead
    finally:
        second.close()


def test_units_past_dispatched_are_rewritten_and_a_cut_creation_completed(env_factory):
    """The state a kill can leave, made on purpose: units past DISPATCHED (one with a
    torn tag code, which recovery cannot see), and a zero-length next file."""
    env = env_factory(fill=90)
    results = env.appender.append_new(120)
    p = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, p)
    env.stop(p)
    back_to = results[60].wrote_offset
    env.table.reset({Slot.DISPATCHED: back_to})  # as if the dead predecessor got no further
    qdir = os.path.join(env.config.consume_queue_dir, TOPICS[0], "0")
    names = sorted(os.listdir(qdir))
    last = os.path.join(qdir, names[-1])
    units = refcodec.decode_cq_file(open(last, "rb").read())
    assert units and units[-1][0] >= back_to
    with open(last, "r+b") as f:                  # tear the tag code of the last unit
        f.seek((len(units) - 1) * 20 + 16)
        f.write(b"\xde\xad\xbe\xef")
    qdir_b = os.path.join(env.config.consume_queue_dir, TOPICS[1], "1")
    names_b = sorted(os.listdir(qdir_b))
    cut = os.path.join(qdir_b, f"{int(names_b[-1]) + env.config.consume_queue_file_size:020d}")
    open(cut, "wb").close()                       # a creation cut before its fallocate
    with pytest.raises(AssertionError):
        assert_queues_match(env)
    p = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, p)
    env.stop(p)
    assert_queues_match(env)
    assert os.path.getsize(cut) == env.config.consume_queue_file_size
    with env.reopen() as store:
        assert store.check() == []


def test_a_corrupt_record_stops_dispatch_loudly_and_a_restart_resumes(env_factory):
    env = env_factory(fill=30)
    p = env.start("dispatcher")
    before = env.table.get(Slot.DISPATCHED)
    results = env.appender.append(
        [message(2_000_000 + k) for k in range(30)], publish=False)
    bad = results[17].wrote_offset
    mf = env.appender.commit_log.mapped_file_queue.find_mapped_file_by_offset(bad)
    pos = bad - mf.file_from_offset + record.PHYSICALOFFSET_POS
    good = bytes(mf.buf[pos:pos + 8])
    mf.buf[pos:pos + 8] = (bad + 1).to_bytes(8, "big")    # PHYSICALOFFSET: not where it lies
    env.appender.publish()
    p.join(DEADLINE_S)
    assert p.exitcode not in (0, None)
    assert env.table.get(Slot.DISPATCH_ERROR) == errno.EBADMSG
    assert before <= env.table.get(Slot.DISPATCHED) <= bad
    assert all(phy < bad for units in queue_units(env.config).values()
               for phy, _, _ in units.values())
    mf.buf[pos:pos + 8] = good                             # an operator repaired it
    p = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, p)
    assert env.table.get(Slot.DISPATCH_ERROR) == 0
    env.stop(p)
    assert_queues_match(env)


# ============================================================================ the flush thread
class InProcessDispatcher:
    """The dispatcher's code in this process, turned by the test, so that
    ``FILE_OPS.fdatasync`` can be replaced in its flush thread: a disk cannot be made
    slow or failing on demand. Only the flush thread's calls are replaced (the dispatch
    loop flushes an index file that fills, and must not be held by the stand-in)."""

    def __init__(self, env: Env, monkeypatch, fdatasync):
        real = mapped_file.FILE_OPS.fdatasync

        def flush_thread_only(fd):
            if threading.current_thread().name == "flush-consume-queue":
                fdatasync(fd)
            real(fd)
        monkeypatch.setattr(mapped_file.FILE_OPS, "fdatasync", flush_thread_only)
        self.env = env
        self.service = Dispatcher(env.store_dir, env.config)
        self.service.table = PositionTable.attach(env.store_dir, process="dispatcher")
        self.service.context = env.context
        self.service.setup()

    def dispatch(self, n: int) -> None:
        """Append ``n`` messages and turn until they are dispatched."""
        self.env.appender.append_new(n)
        self.service.turn()
        assert self.env.table.get(Slot.DISPATCHED) == self.env.appender.written

    def close(self) -> None:
        try:
            self.service.flush_service.stop()
            self.service._close_files()
        finally:
            self.service.table.close()


def test_a_flush_that_hangs_does_not_hold_up_dispatch(env_factory, monkeypatch):
    """FlushConsumeQueueService runs on its own thread: while its fdatasync is held,
    the dispatch loop goes on dispatching; once released, the thorough flush moves the
    checkpoint's logics time only to what was dispatched before the flush began."""
    # flushes 100 ms apart (the thread looks twice an interval): each one's checkpoint
    # is seen before the next
    env = env_factory(fill=60, flush_interval_consume_queue=200,
                      flush_consume_queue_thorough_interval=0)
    inside, release = threading.Event(), threading.Event()

    def held(fd):
        inside.set()
        assert release.wait(DEADLINE_S)
    d = InProcessDispatcher(env, monkeypatch, held)
    try:
        d.dispatch(20)
        assert inside.wait(DEADLINE_S), "the flush thread never flushed"
        first_flush_covers = d.service.reput.logics_timestamp
        before = logics_time(env)
        for _ in range(3):                      # the flush is still held: dispatch goes on
            d.dispatch(15)
        assert d.service.flush_service.lock.locked()     # the flush is still in it
        assert logics_time(env) == before
        release.set()
        newest = newest_store_time(env)
        assert newest > first_flush_covers > before
        seen = [before]
        deadline = time.monotonic() + DEADLINE_S
        while seen[-1] != newest:               # the held flush, then the next one
            if logics_time(env) != seen[-1]:
                seen.append(logics_time(env))
            assert time.monotonic() < deadline, (seen, newest)
            time.sleep(0.002)
        assert seen == [before, first_flush_covers, newest]
        assert d.service.flush_service.error is None
    finally:
        release.set()
        d.close()
    assert_queues_match(env)


def test_a_failed_flush_on_the_flush_thread_stops_dispatch_with_its_errno(env_factory,
                                                                          monkeypatch):
    """An fdatasync that fails with EIO on the flush thread: the next turn of the dispatch
    loop raises it and sets DISPATCH_ERROR to EIO, as a failed flush in the loop did."""
    env = env_factory(fill=30, flush_consume_queue_thorough_interval=0)
    failing = threading.Event()     # set once the first dispatch is done: on a slow machine
                                    # the flush thread's first tick may come within it

    def eio(fd):
        if failing.is_set():
            raise OSError(errno.EIO, os.strerror(errno.EIO))
    d = InProcessDispatcher(env, monkeypatch, eio)
    try:
        d.dispatch(10)
        failing.set()
        env.appender.append_new(5)          # dirty queues for the flush thread to fail on
        deadline = time.monotonic() + DEADLINE_S
        raised = None
        while raised is None:
            assert time.monotonic() < deadline, "no turn raised the flush thread's failure"
            try:
                d.service.turn()
            except OSError as e:
                raised = e
        assert raised.errno == errno.EIO
        assert env.table.get(Slot.DISPATCH_ERROR) == errno.EIO
        assert d.service.flush_service.error is raised
    finally:
        d.close()


def test_a_trickle_right_after_a_pass_is_paced_and_a_frame_is_not(env_factory, monkeypatch):
    """Woken right after a pass that dispatched: less than PACE_MAX_BYTES waiting (a
    one-message send) waits out the rest of REPUT_INTERVAL_S and goes on in trickle
    mode; PACE_MAX_BYTES or more (a frame of many messages) is taken at once, whether
    the bus woke the dispatcher or it was in trickle mode."""
    env = env_factory(fill=30)
    d = InProcessDispatcher(env, monkeypatch, lambda fd: None)
    service = d.service

    def right_after_a_pass(trickle: bool) -> None:
        service.wakeups.wait(0)                 # no wake-up left from before
        service._last_pass_end = time.monotonic()
        service._trickle = trickle

    try:
        d.dispatch(2)
        monkeypatch.setattr(dispatcher_module, "REPUT_INTERVAL_S", 0.5)
        right_after_a_pass(False)
        env.appender.append_new(1)
        assert service._wait(DEADLINE_S * 1000) == env.appender.written
        assert time.monotonic() - service._last_pass_end >= 0.5     # waited it out
        assert service._trickle
        service.dispatch_to(env.appender.written, None)
        # a pace now would outlast the deadline
        monkeypatch.setattr(dispatcher_module, "REPUT_INTERVAL_S", 2 * DEADLINE_S)
        for trickle in (False, True):
            right_after_a_pass(trickle)
            env.appender.append_new(1, body=b"f" * dispatcher_module.PACE_MAX_BYTES)
            began = time.monotonic()
            assert service._wait(DEADLINE_S * 1000) == env.appender.written
            assert time.monotonic() - began < DEADLINE_S, f"paced (trickle {trickle})"
            service.dispatch_to(env.appender.written, None)
    finally:
        d.close()
    assert env.table.get(Slot.DISPATCHED) == env.appender.written
    assert_queues_match(env)


def test_dispatch_of_a_large_run_counts_every_message(env_factory, capfd):
    """128-byte bodies, a key and a UNIQ_KEY each; bigger files so roll-overs are rare.
    Every message of a 50,000-message run is dispatched and counted in the dispatcher's
    log; the rate is printed for whoever runs it (``-s``), never asserted (a busy machine
    would fail it)."""
    n = 50_000
    env = env_factory(fill=10, mapped_file_size_commit_log=64 << 20,
                      mapped_file_size_consume_queue=300_000 * 20, max_hash_slot_num=200_000,
                      max_index_num=800_000, flush_interval_consume_queue=1000)
    p = env.start("dispatcher")
    body = bytes(range(128))
    for i in range(0, n, 1000):
        env.appender.append([message(3_000_000 + j, body=body) for j in range(i, i + 1000)],
                            publish=False)
    t0 = time.perf_counter()
    env.appender.publish()
    env.wait_dispatched(env.appender.written, p)
    elapsed = time.perf_counter() - t0
    env.stop(p)
    logged = re.findall(r"(\d+) messages dispatched in ([\d.]+) s of dispatch work \((\d+)/s\)",
                        capfd.readouterr().err)
    print(f"\ndispatch: {n} messages in {elapsed:.3f} s end to end ({n / elapsed:.0f}/s); "
          f"dispatcher's own measure: {logged}")
    assert logged and int(logged[-1][0]) == n     # the rate is printed, never asserted


# ============================================================================ cleaner
def commit_log_files(config: StoreConfig) -> list[int]:
    return sorted(int(n) for n in os.listdir(config.commit_log_dir) if n.isdigit())


def age_everything(config: StoreConfig, hours: int = 100) -> None:
    old_ns = (now_ms() - hours * HOUR_MS) * 1_000_000
    for start in commit_log_files(config):
        os.utime(os.path.join(config.commit_log_dir, f"{start:020d}"), ns=(old_ns, old_ns))


def manual_clean(env: Env, cleaner) -> None:
    path = clean_now_path(env.store_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    env.wait_for(lambda: not os.path.exists(path), "the manual clean", alive=cleaner)


def deleted_mappings(pid: int, root: str) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if root in line and line.rstrip().endswith("(deleted)")]


def logics_files(config: StoreConfig) -> dict[str, list[tuple[str, int]]]:
    """Directory -> [(file name, the commitlog offset that decides its expiry)], oldest
    first: a consume-queue file's last unit's offset, an index file's endPhyOffset."""
    out = {}
    root = config.consume_queue_dir
    for topic in sorted(os.listdir(root)):
        for queue in sorted(os.listdir(os.path.join(root, topic))):
            qdir = os.path.join(root, topic, queue)
            files = []
            for name in sorted(os.listdir(qdir)):
                units = refcodec.decode_cq_file(open(os.path.join(qdir, name), "rb").read())
                files.append((name, units[-1][0] if units else -1))
            out[qdir] = files
    files = []
    for name in sorted(os.listdir(config.index_dir)):
        header = open(os.path.join(config.index_dir, name), "rb").read(40)
        files.append((name, refcodec.INDEX_HEADER.unpack(header)[3]))
    out[config.index_dir] = files
    return out


def expected_survivors(before: dict, min_offset: int) -> dict:
    """What a clean to ``min_offset`` leaves: per directory, the leading files whose
    offset is below it go, never the last."""
    out = {}
    for d, files in before.items():
        n = 0
        while n < len(files) - 1 and files[n][1] < min_offset:
            n += 1
        out[d] = files[n:]
    return out


def test_cleaner_deletes_only_what_is_durable_and_dispatched(env_factory):
    env = env_factory(fill=260, delete_commit_log_files_interval=0)
    root = os.path.realpath(env.store_dir)
    dispatcher = env.start("dispatcher")
    cleaner = env.start("cleaner")
    files_before = commit_log_files(env.config)
    assert len(files_before) >= 6

    # 1. FLUSHED is the bound: new data is dispatched (ASYNC) but not flushed
    flushed = env.table.get(Slot.FLUSHED)
    env.appender.append_new(30)
    env.wait_dispatched(env.appender.written, dispatcher)
    age_everything(env.config)
    logics = logics_files(env.config)
    manual_clean(env, cleaner)
    first_kept = min(s for s in files_before if s + FILE > flushed)
    assert commit_log_files(env.config)[0] == first_kept > files_before[0]   # not past FLUSHED
    assert env.table.get(Slot.MIN_OFFSET) == first_kept
    assert logics_files(env.config) == expected_survivors(logics, first_kept) != logics
    env.wait_for(lambda: not deleted_mappings(dispatcher.pid, root),
                 "the dispatcher to unmap deleted files", alive=dispatcher)

    # 2. DISPATCHED is the bound: new data is flushed but not dispatched
    env.stop(dispatcher)
    dispatched = env.table.get(Slot.DISPATCHED)
    env.appender.append_new(120)
    env.appender.flush()
    age_everything(env.config)
    logics = logics_files(env.config)
    manual_clean(env, cleaner)
    remaining = commit_log_files(env.config)
    assert remaining[0] == dispatched - dispatched % FILE    # the file holding DISPATCHED
    assert env.table.get(Slot.MIN_OFFSET) == remaining[0]
    assert logics_files(env.config) == expected_survivors(logics, remaining[0])
    env.stop(cleaner)

    dispatcher = env.start("dispatcher")
    env.wait_dispatched(env.appender.written, dispatcher)
    env.stop(dispatcher)
    with env.reopen() as store:
        assert store.get_min_phy_offset() == remaining[0]
        assert store.check() == []


def test_disk_full_flag_follows_the_injected_ratio(env_factory, monkeypatch):
    """In-process run of the cleaner's ``run_once`` with ``procs.cleaner.disk_used_ratio``
    replaced: a real disk cannot be filled on demand."""
    env = env_factory(fill=200, delete_commit_log_files_interval=0)
    ratio = [0.95]
    monkeypatch.setattr(cleaner_module, "disk_used_ratio", lambda path: ratio[0])
    cleaner = Cleaner(env.store_dir, env.config)
    cleaner.table = PositionTable.attach(env.store_dir, process="cleaner")
    cleaner.setup()
    try:
        env.appender.append_new(40)           # WRITTEN only: neither durable nor dispatched
        limit = min(env.table.get(Slot.DISPATCHED), env.table.get(Slot.FLUSHED))
        files = commit_log_files(env.config)
        report = cleaner.run_once()                       # past 0.90: disk full, clean at once
        assert env.table.get(Slot.DISK_FULL) == 1 and report.disk_full
        wholly_below = [s for s in files[:-1] if s + FILE <= limit]
        assert report.commit_log_files == len(wholly_below) > 0          # and not one more
        assert commit_log_files(env.config)[0] == files[report.commit_log_files] <= limit
        assert env.table.get(Slot.MIN_OFFSET) == files[report.commit_log_files]
        ratio[0] = 0.88                                   # between 0.85 and 0.90: kept
        cleaner.run_once()
        assert env.table.get(Slot.DISK_FULL) == 1
        ratio[0] = 0.84                                   # below 0.85: cleared
        assert not cleaner.run_once().disk_full
        assert env.table.get(Slot.DISK_FULL) == 0
        assert commit_log_files(env.config)[0] == min(s for s in files if s + FILE > limit)
    finally:
        cleaner.teardown()
        cleaner.table.close()
