"""The multiprocess store end to end: ``rocketstore up`` with every process, real
sockets, real shared memory, real files; children and the whole tree SIGKILLed under
load; every acknowledged message checked."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time

import pytest
import zmq

from rocketstore.wire import protocol
from rocketstore.client import Consumer, Producer, ReaderClient, RequestTimeout
from rocketstore.client.consumer import BULK_READ_MIN, read_offsets
from rocketstore.shm import bus
from rocketstore.shm.positions import PROC_STATE, ProcessState, Slot
from rocketstore.storage import Message, MessageStore, StoreConfig, record, record_batch
from rocketstore.storage.errors import StoreClosedError
from rocketstore.storage.config import recorded_geometry
from store_processes import ROOT, RunningStore, cli, wait_for

TOPIC = "Orders"


def reopen(store_dir: str) -> MessageStore:
    s = MessageStore(StoreConfig(store_path_root_dir=store_dir, **recorded_geometry(store_dir)))
    s.load()
    return s


def consume_all(store_dir: str, group: str, expected: int, timeout: float = 60) -> list:
    """The topic's messages, read by a new group: at least ``expected`` (the ones
    acknowledged), then on until a poll finds nothing more. A store may hold more than
    was acknowledged (a request whose connection was lost with its writer ended
    ``ConnectionLost`` although the next writer stored it), so the count alone must not
    end the read."""
    got = []
    deadline = time.monotonic() + timeout
    with Consumer(store_dir, group, TOPIC) as c:
        while time.monotonic() < deadline:
            batch = c.poll(256, 500)
            got.extend(batch)
            if not batch and len(got) >= expected:
                break
        c.commit()
    return got


def check_exactly_once(acked: dict, got: list) -> None:
    """Everything a new group read of the topic (``got``, in the order read), checked
    whole: no message twice (by msg id, nor by body: each test message's body is its
    own), every queue dense (offsets 0..n-1 in the order read: no hole), and every
    acknowledged message there, at the queue and offset its answer named. ``got`` may
    hold more than ``acked``: a batch whose answer was lost with its writer
    (``ConnectionLost``) may have been stored all the same, and it must fill its
    offsets like any other, never leave them empty."""
    seen, bodies = {}, {}
    for m in got:
        assert m.msg_id not in seen, f"{m.msg_id} delivered twice"
        assert m.body not in bodies, (
            f"{m.body!r} stored twice: at queue {bodies[m.body].queue_id} offset "
            f"{bodies[m.body].queue_offset} and at queue {m.queue_id} offset {m.queue_offset}")
        seen[m.msg_id] = bodies[m.body] = m
    by_queue: dict[int, list[int]] = {}
    for m in got:
        by_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    for queue_id, offsets in sorted(by_queue.items()):
        holes = sorted(set(range(len(offsets))) - set(offsets))
        assert offsets == list(range(len(offsets))), (
            f"queue {queue_id} is not dense: {len(offsets)} messages, offsets "
            f"{offsets[0]}..{max(offsets)}, none read at {holes[:10]}")
    missing = [mid for mid in acked if mid not in seen]
    assert not missing, f"{len(missing)} acknowledged messages missing: {missing[:5]}"
    for mid, (queue_id, queue_offset, body) in acked.items():
        m = seen[mid]
        assert (m.queue_id, m.queue_offset, m.body) == (queue_id, queue_offset, body), (
            f"{mid} was answered at queue {queue_id} offset {queue_offset} ({body!r}), "
            f"read at queue {m.queue_id} offset {m.queue_offset} ({m.body!r})")


def test_the_exactly_once_check_names_a_missing_a_twice_and_a_hole():
    """``check_exactly_once`` fails, saying which, on each fault it is there to find;
    what a lost answer left stored (read, not acknowledged) passes."""
    from types import SimpleNamespace

    def read(queue_id: int, queue_offset: int, body: bytes, msg_id: str = "") -> SimpleNamespace:
        """The fields of a message read that the check looks at."""
        return SimpleNamespace(msg_id=msg_id or f"id-{queue_id}-{queue_offset}", body=body,
                               queue_id=queue_id, queue_offset=queue_offset)

    got = [read(0, 0, b"a"), read(0, 1, b"b"), read(1, 0, b"c")]
    acked = {"id-0-0": (0, 0, b"a"), "id-1-0": (1, 0, b"c")}     # b's answer was lost
    check_exactly_once(acked, got)
    for wrong, says in (
            (got[:2], "1 acknowledged messages missing"),
            (got + [read(1, 1, b"a")], "stored twice"),
            (got + [got[0]], "delivered twice"),
            ([got[0], read(0, 2, b"b"), got[2]], "queue 0 is not dense"),
            ([read(0, 0, b"a"), read(0, 1, b"b"), read(1, 0, b"c", "id-x")],
             "acknowledged messages missing")):
        with pytest.raises(AssertionError, match=says):
            check_exactly_once(acked, wrong)
    with pytest.raises(AssertionError, match="answered at queue 1 offset 0"):
        check_exactly_once({**acked, "id-1-0": (1, 0, b"z")}, got)


def send_some(producer: Producer, acked: dict, start: int, n: int, batch: int = 50) -> None:
    for i in range(start, start + n, batch):
        msgs = [Message(topic=TOPIC, body=f"m{j}".encode(), tags=f"T{j % 3}", keys=[f"k{j}"],
                        queue_id=j % 4) for j in range(i, min(i + batch, start + n))]
        for m, r in zip(msgs, producer.send_batch(msgs)):
            assert r.ok, r
            acked[r.msg_id] = (r.queue_id, r.queue_offset, m.body)


def test_up_send_consume_query_status_stop(tmp_path):
    rs = RunningStore(tmp_path)
    with rs:
        acked: dict = {}
        with Producer(rs.store_dir) as p:
            send_some(p, acked, 0, 3000)
            r = p.send(TOPIC, b"one", tags="X", keys=["only-key"], queue_id=1)
        got = consume_all(rs.store_dir, "g1", 3001)
        check_exactly_once(acked, got)
        with ReaderClient(rs.store_dir) as reader:
            assert [m.body for m in reader.query_by_key(TOPIC, "only-key")] == [b"one"]
            assert reader.query_by_msg_id(r.msg_id)[0].body == b"one"
            pulled = reader.pull(TOPIC, 1, 0, 8)
            assert pulled.status.name == "FOUND" and len(pulled.messages) == 8
        status = json.loads(cli("status", "--config", rs.config_path, "--json").stdout)
        assert status["state"] == "RUNNING" and status["writeable"]
        assert all(p["state"] == "RUNNING" and p["pid"] > 0 for p in status["processes"].values())
        assert status["positions"]["written"] > 0
        assert rs.stop() == 0, rs.log()
    assert not os.path.exists(os.path.join(rs.store_dir, "abort"))
    s = reopen(rs.store_dir)
    try:
        assert s.last_exit_ok and s.check() == []
    finally:
        s.close()


def test_the_store_lifts_its_open_files_limit_to_the_hard_limit(tmp_path):
    """Every mapped file holds two descriptors: started under a soft RLIMIT_NOFILE of
    256, the supervisor lifts it to the hard limit, and its processes run with that."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 256, "this machine cannot show it"
    rs = RunningStore(tmp_path).start(
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    try:
        for name in ("writer", "dispatcher"):
            with open(f"/proc/{rs.child_pid(name)}/limits") as f:
                row = next(line for line in f if line.startswith("Max open files"))
            got_soft, got_hard = row.split()[3:5]
            assert got_soft == got_hard != "256", row
        assert "open files limit raised from 256" in rs.log()
        assert rs.stop() == 0, rs.log()
    finally:
        rs.kill_all()


def test_second_up_on_the_same_directory_is_refused(tmp_path):
    with RunningStore(tmp_path) as rs:
        r = cli("up", "--config", rs.config_path, timeout=60)
        assert r.returncode == 3 and "in use" in r.stderr


def test_bad_frames_get_named_errors_and_the_store_keeps_serving(tmp_path):
    with RunningStore(tmp_path) as rs:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(bus.endpoint(rs.store_dir, "ingest"))
        try:
            for frame in (b"garbage", b"RS\x09\x01" + bytes(12),
                          protocol.encode_send(7, [Message(topic="T", body=b"x")])[:-3]):
                s.send(frame)
                assert s.poll(10_000)
                reply = s.recv()
                assert protocol.peek_header(reply).kind == protocol.Kind.ERROR
            s.send(protocol.encode_send(8, [Message(topic="bad topic", body=b"x"),
                                            Message(topic="T", body=b"x" * 10_000_000)]))
            assert s.poll(10_000)
            _, results = protocol.decode_send_reply(s.recv())
            assert [r.status.name for r in results] == ["MESSAGE_ILLEGAL", "MESSAGE_ILLEGAL"]
        finally:
            s.close(0)
            ctx.term()
        with Producer(rs.store_dir) as p:
            assert p.send(TOPIC, b"still fine").ok


def test_the_reader_answers_every_bad_request_and_keeps_serving(tmp_path):
    """A multi-part request gets MALFORMED_FRAME (it had no answer), and a query by an
    offset where a message body imitates a record head too short to be one answers
    nothing found (it killed the reader with a struct.error)."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            imitation = struct.pack(">iI", 10, record.MESSAGE_MAGIC_CODE) + b"-padding-"
            r = p.send(TOPIC, imitation, queue_id=0)
        wait_for(lambda: rs.table().get(Slot.DISPATCHED) >= r.commit_log_offset + 1, 30,
                 "dispatch")
        reader_pid = rs.child_pid("reader")
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(bus.endpoint(rs.store_dir, "reader"))
        try:
            s.send_multipart([b"", protocol.encode_offsets(77, [], -1)])
            assert s.poll(10_000), "no answer to a two-part request"
            assert protocol.decode_error(s.recv())[:2] == (77, protocol.ErrorCode.MALFORMED_FRAME)
        finally:
            s.close(0)
            ctx.term()
        body_at = r.commit_log_offset + record_batch.BODY_POS
        with ReaderClient(rs.store_dir) as reader:
            assert reader.query_by_offset(body_at) == []
            assert reader.query_by_offset(r.commit_log_offset)[0].body == imitation
        assert rs.child_pid("reader") == reader_pid        # never restarted


FAILED_START = """
import gc, sys
from rocketstore.client import Consumer
try:
    Consumer(sys.argv[1], "g", sys.argv[2])
except OSError as e:
    err = e                 # the traceback keeps the half-made consumer in a cycle
gc.collect()                # its ZeroMQ context, left open, would hang here for ever
print("collected")
"""


def test_a_consumer_takes_only_names_and_is_done_after_close(tmp_path):
    """Group and topic become directory names: anything but [A-Za-z0-9_%|-]{1,255} is a
    ValueError before anything is opened (``../x`` made directories outside the store's,
    ``g/T`` nested one group in another). A consumer whose start fails half way releases
    what it opened (its ZeroMQ context hung the garbage collector). After close, poll and
    commit raise StoreClosedError (commit wrote the old offsets again)."""
    with RunningStore(tmp_path) as rs:
        groups = os.path.join(rs.store_dir, "groups")
        for group, topic in (("../../x", TOPIC), ("/abs", TOPIC), ("gx/T", TOPIC),
                             ("g" * 256, TOPIC), ("", TOPIC), ("g", "a/b"), ("g", "..")):
            with pytest.raises(ValueError):
                Consumer(rs.store_dir, group, topic)
        assert not os.path.exists(groups) or os.listdir(groups) == []
        with Producer(rs.store_dir) as p:           # both topics exist
            assert all(r.ok for r in p.send_batch([Message("Blocked", b"b"),
                                                   Message(TOPIC, b"t")]))
        os.makedirs(os.path.join(groups, "g"))
        open(os.path.join(groups, "g", "Blocked"), "w").close()    # where its dir must go
        run = subprocess.run([sys.executable, "-c", FAILED_START, rs.store_dir, "Blocked"],
                             env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                             text=True, timeout=60)
        assert run.stdout.strip() == "collected", run.stderr
        c = Consumer(rs.store_dir, "g", TOPIC, rebalance_interval_ms=0)
        c.close()
        c.close()
        for call in (lambda: c.poll(1, 0), c.commit, c.assignment, lambda: c.seek(0, 1),
                     lambda: c.seek_to_time(0), lambda: c.position(0)):
            with pytest.raises(StoreClosedError):
                call()


def test_sync_flush_never_shows_an_unflushed_message(tmp_path):
    with RunningStore(tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=1000) as rs:
        with Producer(rs.store_dir) as p:
            assert p.send(TOPIC, b"before").status.name == "PUT_OK"
            flusher = rs.child_pid("flusher")
            os.kill(flusher, signal.SIGSTOP)
            try:
                r = p.send(TOPIC, b"unflushed")
                assert r.status.name == "FLUSH_DISK_TIMEOUT"
                assert rs.slot(Slot.DISPATCHED) <= rs.slot(Slot.FLUSHED) < rs.slot(Slot.WRITTEN)
                with Consumer(rs.store_dir, "g", TOPIC) as c:
                    assert [m.body for m in c.poll(10, 500)] == [b"before"]
                with ReaderClient(rs.store_dir) as reader:  # nor does a query
                    assert reader.query_by_msg_id(r.msg_id) == []
                    assert reader.query_by_offset(r.commit_log_offset) == []
            finally:
                os.kill(flusher, signal.SIGCONT)
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="catch-up")


@pytest.mark.parametrize("victim", ["writer", "flusher", "dispatcher", "cleaner", "scheduler",
                                    "reader"])
def test_a_killed_child_is_restarted_and_nothing_acknowledged_is_lost(tmp_path, victim):
    rng = random.Random(victim)
    acked: dict = {}
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir, timeout_ms=3000) as p:
            sent = 0
            for _ in range(3):
                n = rng.randint(100, 400)
                pid = rs.child_pid(victim)
                try:
                    send_some(p, acked, sent, n // 2)
                    os.kill(pid, signal.SIGKILL)
                    send_some(p, acked, sent + n // 2, n - n // 2)
                except RequestTimeout:
                    pass  # the writer died with this batch: its outcome is unknown
                sent += n
                wait_for(lambda: rs.child_pid(victim) not in (0, pid), what=f"{victim} restart")
        assert rs.restarts(victim) >= 3
        got = consume_all(rs.store_dir, "g", len(acked))
        check_exactly_once(acked, got)       # what the lost answers' batches left too
        assert rs.stop() == 0, rs.log()
    s = reopen(rs.store_dir)
    try:
        assert s.check() == []
    finally:
        s.close()


def test_the_whole_tree_killed_then_restarted_keeps_every_acknowledged_message(tmp_path):
    acked: dict = {}
    rs = RunningStore(tmp_path)
    with rs:
        with Producer(rs.store_dir) as p:
            send_some(p, acked, 0, 1500)
        rs.kill_all()
    assert os.path.exists(os.path.join(rs.store_dir, "abort"))
    with rs:
        got = consume_all(rs.store_dir, "g", len(acked))
        check_exactly_once(acked, got)
        with Producer(rs.store_dir) as p:
            r = p.send(TOPIC, b"after", queue_id=0)
            assert r.queue_offset == sum(1 for q, _, _ in acked.values() if q == 0)
        assert rs.stop() == 0, rs.log()


def test_delayed_message_is_delivered_by_the_scheduler(tmp_path):
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            r = p.send(TOPIC, b"later", delay_level=1, queue_id=2)
            assert r.ok
        # the topic's first message is not delivered yet: the topic appears with it
        with Consumer(rs.store_dir, "g", TOPIC, wait_for_topic=True) as c:
            start = time.monotonic()
            got = []
            while not got and time.monotonic() - start < 30:
                got = c.poll(10, 1000)
        assert [m.body for m in got] == [b"later"] and got[0].queue_id == 2
        assert time.monotonic() - start >= 0.5


def test_consumers_of_one_group_share_the_queues(tmp_path):
    with RunningStore(tmp_path) as rs:
        acked: dict = {}
        with Producer(rs.store_dir) as p:
            send_some(p, acked, 0, 400)
        a = Consumer(rs.store_dir, "shared", TOPIC)
        b = Consumer(rs.store_dir, "shared", TOPIC)
        try:
            got_a, got_b = [], []
            deadline = time.monotonic() + 30
            while len(got_a) + len(got_b) < 400 and time.monotonic() < deadline:
                got_a += a.poll(100, 200)
                got_b += b.poll(100, 200)
            assert sorted(a.assignment() + b.assignment()) == list(range(8))
            assert not set(a.assignment()) & set(b.assignment())
            check_exactly_once(acked, got_a + got_b)
        finally:
            a.close()
            b.close()


def _each_queue(p: Producer, n: int, tag: str) -> None:
    for q in range(8):
        assert all(r.ok for r in p.send_batch(
            [Message(topic=TOPIC, body=f"{tag}{q}-{i}".encode(), queue_id=q)
             for i in range(n)]))


def _drain(c: Consumer, want: int) -> list:
    got, deadline = [], time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        got += c.poll(100, 200)
    return got


def test_a_member_commits_only_the_queues_it_owns_and_never_skips_a_moved_queue(tmp_path):
    """A commit after another member took some queues leaves that member's newer
    offsets alone (they went back to the old ones). A new member reading from "latest"
    that takes queues over before their old owner noticed used to start at their end,
    past what nobody had read: the first member's start is committed at once, so the
    group's place in every queue is fixed, and the old owner's hand-over never moves
    an offset back."""
    with RunningStore(tmp_path) as rs, Producer(rs.store_dir) as p:
        def committed(group: str) -> dict:
            return read_offsets(os.path.join(rs.store_dir, "config"))[f"{TOPIC}@{group}"]

        _each_queue(p, 5, "a")
        a = Consumer(rs.store_dir, "g", TOPIC)
        try:
            assert len(_drain(a, 40)) == 40
            a.commit()
            _each_queue(p, 5, "b")
            with Consumer(rs.store_dir, "g", TOPIC) as b:
                assert len(_drain(b, 20)) == 20 and len(b.assignment()) == 4
                b.commit()
                a.commit()                   # before a's own rebalance was due
                offsets = committed("g")
                assert {offsets[str(q)] for q in b.assignment()} == {10}
                assert {offsets[str(q)] for q in a.assignment()} == {5}
        finally:
            a.close()
        late = Consumer(rs.store_dir, "h", TOPIC, from_where="latest",
                        rebalance_interval_ms=3_600_000)     # notices nobody for an hour
        try:
            assert late.poll(100, 200) == [] and len(late.assignment()) == 8
            assert set(committed("h").values()) == {10}      # its start, fixed at once
            _each_queue(p, 3, "c")          # not read by its owner before the move
            with Consumer(rs.store_dir, "h", TOPIC, from_where="latest") as new:
                got = _drain(new, 12)       # before the old owner knows of it
                assert sorted(m.body for m in got) == sorted(
                    f"c{q}-{i}".encode() for q in new.assignment() for i in range(3))
                new.commit()
                late.commit()               # sees the new member: hands its queues over
                offsets = committed("h")
                assert {offsets[str(q)] for q in new.assignment()} == {13}
        finally:
            late.close()


def _deleted_store_maps(pid: int, root: str) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[-2] for line in f if root in line and "(deleted)" in line]


def test_readers_unmap_expired_files_without_being_asked_for_them(tmp_path):
    """The cleaner unlinks old files; their space comes back only when the last
    mapping goes. The reader process kept them mapped for as long as no request came
    (a queue read once kept its expired files for good), and so did a Consumer for the
    queues it did not read again: both follow MIN_OFFSET now."""
    with RunningStore(tmp_path, mapped_file_size_commit_log=64 << 10) as rs:
        root = os.path.realpath(rs.store_dir)
        with Producer(rs.store_dir) as p:
            for i in range(10):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic="Old", body=b"x" * 1000, keys=[f"k{i}-{j}"], queue_id=0)
                     for j in range(32)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        with ReaderClient(rs.store_dir) as rc, Consumer(rs.store_dir, "idle", "Old") as c:
            assert rc.pull("Old", 0, 0, 32).messages and rc.query_by_key("Old", "k0-0")
            assert c.poll(32, 1000)
            assert _deleted_store_maps(os.getpid(), root) == []
            rs.expire_commit_log(keep=1)
            wait_for(lambda: not _deleted_store_maps(rs.child_pid("reader"), root),
                     timeout=10, what="the idle reader to unmap the expired files")
            assert _deleted_store_maps(os.getpid(), root) != []   # not polled since
            c.poll(1, 0)
            assert _deleted_store_maps(os.getpid(), root) == []


def test_one_consumer_shared_by_threads(tmp_path):
    """Two threads polling one consumer get every message once between them (its
    socket and views were used at once: libzmq aborted, or reads saw torn records);
    a poll that waits lets the other calls in, and a close from another thread ends
    it, returning nothing."""
    import threading
    with RunningStore(tmp_path) as rs:
        acked: dict = {}
        with Producer(rs.store_dir) as p:
            send_some(p, acked, 0, 2000)
        c = Consumer(rs.store_dir, "threads", TOPIC)
        try:
            per_thread: list[list] = [[], []]     # what each thread got, in its order
            errors: list = []

            def take(mine: list) -> None:
                try:
                    deadline = time.monotonic() + 30
                    while sum(map(len, per_thread)) < 2000 and time.monotonic() < deadline:
                        mine.extend(c.poll(37, 100))
                except Exception as e:    # noqa: BLE001 - the test reports it
                    errors.append(e)

            threads = [threading.Thread(target=take, args=(mine,)) for mine in per_thread]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert errors == []
            for mine in per_thread:       # each thread reads every queue forwards
                for q in {m.queue_id for m in mine}:
                    offsets = [m.queue_offset for m in mine if m.queue_id == q]
                    assert offsets == sorted(set(offsets)), (q, offsets)
            # between them, in queue order (the two threads append in any order)
            check_exactly_once(acked, sorted(per_thread[0] + per_thread[1],
                                             key=lambda m: (m.queue_id, m.queue_offset)))
            waited: list = []
            waiting = threading.Thread(target=lambda: waited.append(c.poll(10, 30_000)))
            waiting.start()
            wait_for(c._wait_lock.locked, 10, "the poll to wait for messages")
            c.commit()                    # a poll that waits lets the other calls in:
            assert c.position(c.assignment()[0]) is not None
            assert waiting.is_alive()     # they came back while it still waits
        finally:
            c.close()
        waiting.join(5)
        assert not waiting.is_alive() and waited == [[]]


@pytest.mark.parametrize("per_read", [32, 512])
def test_a_queue_whose_records_touch_is_read_in_bulk(tmp_path, per_read):
    """Records of one queue stored back to back share a piece of the bulk read, and
    reads of many records are checked with numpy (``read_path.check_unit_views``):
    every one comes back, in order, and no read of ``BULK_READ_MIN`` or more goes unit
    by unit (only the last few messages of the queue, by design)."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            for start in range(0, 300, 50):
                results = p.send_batch([Message(topic="Adjacent", body=b"adj-%03d" % i,
                                                queue_id=0) for i in range(start, start + 50)])
                assert all(r.status.name == "PUT_OK" for r in results)
        config = StoreConfig(**{**recorded_geometry(rs.store_dir),
                                "store_path_root_dir": rs.store_dir,
                                "max_transfer_count_on_message_in_memory": per_read})
        with Consumer(rs.store_dir, "touching", "Adjacent", config=config) as c:
            fallbacks = []
            slow = c.reader.get_message

            def spied(topic, queue_id, offset, max_msgs, *rest, **kw):
                if min(300 - offset, max_msgs, per_read) >= BULK_READ_MIN:
                    fallbacks.append((queue_id, offset, max_msgs))
                return slow(topic, queue_id, offset, max_msgs, *rest, **kw)

            c.reader.get_message = spied
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 300 and time.monotonic() < deadline:
                got += c.poll(128, 500)
        assert [m.body for m in got] == [b"adj-%03d" % i for i in range(300)]
        assert [m.queue_offset for m in got] == list(range(300))
        assert not fallbacks


def test_delayed_messages_put_again_after_a_crash_are_stored_once(tmp_path):
    """The scheduler dies after its re-puts, before it wrote its progress: its successor
    puts the same batch again with the same identities, and the writer answers them as
    duplicates, so every delayed message is in its topic once."""
    with RunningStore(tmp_path, message_delay_level="1s 2s") as rs:
        offsets = os.path.join(rs.store_dir, "config", "delayOffset.json")
        with Producer(rs.store_dir) as p:
            assert all(r.ok for r in p.send_batch([
                Message(topic="LaterOnce", body=b"once-%02d" % i, queue_id=0, delay_level=1)
                for i in range(10)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN)
                 and os.path.exists(offsets), 30, "the delivery and its progress")
        with Consumer(rs.store_dir, "once", "LaterOnce") as c:
            got = []
            deadline = time.monotonic() + 20
            while len(got) < 10 and time.monotonic() < deadline:
                got += c.poll(32, 500)
        assert sorted(m.body for m in got) == [b"once-%02d" % i for i in range(10)]
        scheduler = rs.child_pid("scheduler")
        os.kill(scheduler, signal.SIGSTOP)
        os.unlink(offsets)                               # the progress it never wrote
        for leftover in (offsets + ".bak",):
            if os.path.exists(leftover):
                os.unlink(leftover)
        before = rs.restarts("scheduler")
        os.kill(scheduler, signal.SIGKILL)
        wait_for(lambda: rs.restarts("scheduler") > before and os.path.exists(offsets), 30,
                 "the successor's deliveries")
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), 30, "dispatch")
        with Consumer(rs.store_dir, "once-again", "LaterOnce") as c:
            again = []
            while True:
                batch = c.poll(32, 500)
                if not batch:
                    break
                again += batch
        assert sorted(m.body for m in again) == [b"once-%02d" % i for i in range(10)]


def test_cli_send_consume_query_status(tmp_path):
    with RunningStore(tmp_path) as rs:
        c = rs.config_path
        r = cli("send", "--config", c, "--topic", TOPIC, "--body", "hi", "--count", "5",
                "--tags", "T", "--keys", "k1,k2", "--json")
        assert r.returncode == 0, r.stderr
        sent = [json.loads(line) for line in r.stdout.splitlines()]
        assert [s["status"] for s in sent] == ["PUT_OK"] * 5
        r = cli("send", "--config", c, "--topic", "bad topic", "--body", "x")
        assert r.returncode == 2 and "must match" in r.stderr
        r = cli("consume", "--config", c, "--group", "g", "--topic", TOPIC, "--json")
        assert r.returncode == 0, r.stderr
        got = [json.loads(line) for line in r.stdout.splitlines()]
        assert sorted(m["msg_id"] for m in got) == sorted(s["msg_id"] for s in sent)
        r = cli("consume", "--config", c, "--group", "g", "--topic", TOPIC, "--json")
        assert r.stdout == ""  # committed: nothing left for the group
        r = cli("query", "--config", c, "--topic", TOPIC, "--key", "k2", "--json")
        assert len(r.stdout.splitlines()) == 5
        r = cli("query", "--config", c, "--msg-id", sent[0]["msg_id"])
        assert r.returncode == 0 and "hi" in r.stdout
        r = cli("status", "--config", c)
        assert r.returncode == 0 and "writer" in r.stdout and "RUNNING" in r.stdout
        assert "quarantine" not in r.stdout
        st = json.loads(cli("status", "--config", c, "--json").stdout)
        assert st["disk"]["quarantine"]["files"] == 0
        cut = os.path.join(rs.store_dir, "quarantine", "20260101000000", "commitlog")
        os.makedirs(cut)                 # what a cut leaves, as recovery names it
        with open(os.path.join(cut, "00000000000000000000.from-100"), "wb") as f:
            f.write(os.urandom(10_000))
        st = json.loads(cli("status", "--config", c, "--json").stdout)
        assert st["disk"]["quarantine"]["files"] == 1 and st["disk"]["quarantine"]["cuts"] == 1
        assert st["disk"]["quarantine"]["bytes"] >= 10_000
        assert "quarantine" in cli("status", "--config", c).stdout
    r = cli("status", "--config", rs.config_path, "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["state"] == "NOT_RUNNING"


def test_manual_clean_deletes_expired_files_of_a_running_store(tmp_path):
    with RunningStore(tmp_path, file_reserved_time=1, delete_commit_log_files_interval=0) as rs:
        acked: dict = {}
        with Producer(rs.store_dir) as p:
            send_some(p, acked, 0, 2000)
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        names = rs.expire_commit_log(keep=2)
        assert len(names) > 3
        assert min(n for n in os.listdir(os.path.join(rs.store_dir, "commitlog"))
                   if n.isdigit()) > names[0]
        with Consumer(rs.store_dir, "late", TOPIC) as c:
            got = c.poll(5000, 2000)
        assert got and all(m.commit_log_offset >= rs.slot(Slot.MIN_OFFSET) for m in got)
        assert rs.stop() == 0, rs.log()


def test_send_async_keeps_results_past_its_window(tmp_path):
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir, window=2) as p:
            handles = [p.send_async([Message(topic=TOPIC, body=f"{i}".encode(), queue_id=None)])
                       for i in range(6)]
            results = [h.result()[0] for h in handles]
        assert all(r.ok for r in results)
        assert len({r.msg_id for r in results}) == 6


def test_consumer_tag_filter_and_a_store_restart(tmp_path):
    rs = RunningStore(tmp_path)
    with rs:
        with Producer(rs.store_dir) as p:
            p.send_batch([Message(topic=TOPIC, body=f"{i}".encode(), tags=("A", "B")[i % 2],
                                  queue_id=0) for i in range(10)])
        c = Consumer(rs.store_dir, "tagged", TOPIC, tags="A", rebalance_interval_ms=100)
        try:
            got = c.poll(100, 2000)
            assert [m.body for m in got] == [b"0", b"2", b"4", b"6", b"8"]
            assert rs.stop() == 0, rs.log()
            rs.start()
            with Producer(rs.store_dir) as p:
                p.send(TOPIC, b"10", tags="A", queue_id=0)
            later = []
            deadline = time.monotonic() + 30
            while not later and time.monotonic() < deadline:
                later = c.poll(10, 500)
            assert [m.body for m in later] == [b"10"]
        finally:
            c.close()


PROCESSES = ("flusher", "dispatcher", "writer", "cleaner", "scheduler", "reader")


def _gone(pid: int) -> bool:
    """Process ``pid`` has ended (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _state(rs: RunningStore, name: str) -> int:
    t = rs.table()
    try:
        return t.get_process(name, PROC_STATE)
    finally:
        t.close()


def test_the_processes_die_with_a_killed_supervisor_and_hold_nothing_of_it(tmp_path):
    """The processes are forks of the fork server, not of the supervisor: SIGKILL of
    the supervisor alone must still end them all, the fork server too, and none of
    them may hold the store's lock (the next ``up`` starts)."""
    rs = RunningStore(tmp_path)
    rs.start()
    pids = {name: rs.child_pid(name) for name in PROCESSES}
    fork_server = _parent(pids["writer"])
    assert fork_server != rs.proc.pid and {_parent(p) for p in pids.values()} == {fork_server}
    lock = os.path.join(rs.store_dir, "lock")
    for pid in pids.values():
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert lock not in held, pid
    rs.proc.kill()
    rs.proc.wait()
    try:
        wait_for(lambda: all(_gone(p) for p in [fork_server, *pids.values()]), 30,
                 "the fork server and every process dead")
    finally:
        rs.kill_all()       # their group: what outlived the supervisor
    with rs:
        assert rs.stop() == 0, rs.log()


def test_a_killed_fork_server_costs_a_restart_of_the_processes_not_the_store(tmp_path):
    """SIGKILL of the fork server takes every process with it: the supervisor starts
    them again through a new fork server, and nothing acknowledged is lost."""
    acked: dict = {}
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir, timeout_ms=3000) as p:
            send_some(p, acked, 0, 300)
            pids = {name: rs.child_pid(name) for name in PROCESSES}
            fork_server = _parent(pids["writer"])
            os.kill(fork_server, signal.SIGKILL)
            wait_for(lambda: all(rs.child_pid(n) not in (0, pids[n]) for n in PROCESSES), 60,
                     "every process restarted")
            assert all(_gone(p) for p in pids.values())
            assert _parent(rs.child_pid("writer")) not in (fork_server, rs.proc.pid)
            wait_for(lambda: all(_state(rs, n) == ProcessState.RUNNING for n in PROCESSES),
                     60, "every process running again")
            sent = 300
            while sent < 600:
                try:
                    send_some(p, acked, sent, 100)
                except RequestTimeout:
                    pass    # sent while the writer was starting: its outcome is unknown
                sent += 100
        got = consume_all(rs.store_dir, "g", len(acked))
        check_exactly_once(acked, got)
        assert rs.stop() == 0, rs.log()
