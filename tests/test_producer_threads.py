"""A Producer shared by threads (client/producer.py, "Threads"): ``rocketstore up`` with
every process, real sockets, real threads, real files.

What is checked, against what was read back at the end (``storage.MessageStore`` on
the stopped store, every queue of the topic, ``check() == []``): every send answered
PUT_OK is stored once, with the body, tags, keys and properties it was sent with, at
the queue and offset its result names; nothing is stored that was not sent; a send that
raised (its outcome unknown) is stored at most once. That sends made together went in
fewer frames than sends is read from the producer's request ids (each frame takes one).
The writer is SIGKILLed (the supervisor restarts it) for the one fault test. The
tests of a wait interrupted in line answer from a bare ROUTER (test_plain_send's), so
the socket stays in use for as long as they need.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter

import pytest

from rocketstore.client import ClientError, Consumer, Producer
from rocketstore.client import producer as producer_module
from rocketstore.storage import record
from rocketstore.storage.errors import StoreClosedError
from rocketstore.wire import protocol
from rocketstore.storage import Message, MessageStore, PutMessageStatus, StoreConfig
from rocketstore.storage.config import recorded_geometry
from rocketstore.storage.message import PROPERTY_PRODUCER_SEQUENCE
from conftest import read_queue
from store_processes import RunningStore, wait_for
from test_plain_send import (  # noqa: F401 (fixture)
    STORE_HOST, a_send_answered_at, answer, router, settled)

TOPIC = "Shared"
THREADS = 8


@pytest.fixture
def store(tmp_path):
    rs = RunningStore(tmp_path, flush_disk_type="ASYNC_FLUSH").start()
    yield rs
    rs.kill_all()


def read_topic(store_dir: str) -> dict[bytes, list]:
    """Every message of TOPIC in the stopped store, by body (a list: a body stored twice
    shows twice), each with the queue and offset it was read at."""
    s = MessageStore(StoreConfig(store_path_root_dir=store_dir, **recorded_geometry(store_dir)))
    s.load()
    try:
        assert s.check() == []
        found: dict[bytes, list] = {}
        for q in range(32):
            for offset, m in enumerate(read_queue(s, TOPIC, q)):
                found.setdefault(m.body, []).append((q, offset, m))
        return found
    finally:
        s.close()


def frames_used(p: Producer) -> int:
    """Request ids the producer took so far: one a frame."""
    return p._dealer.next_id() - 1


def in_threads(work, count: int = THREADS) -> list:
    """``work(i)`` in ``count`` threads started together; their returns, in order (an
    exception a thread raised is raised here)."""
    out: list = [None] * count
    errors: list = []
    start = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            start.wait()
            out[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a thread hung (left waiting for the socket?)"
    if errors:
        raise errors[0]
    return out


def assert_stored_as_answered(found: dict[bytes, list], answered: dict[bytes, object]) -> None:
    """Each body answered PUT_OK is stored once, where its result says."""
    for body, result in answered.items():
        assert result.status is PutMessageStatus.PUT_OK, (body, result)
        assert len(found.get(body, [])) == 1, (body, found.get(body))
        q, offset, m = found[body][0]
        assert (q, offset) == (result.queue_id, result.queue_offset)
        assert m.commit_log_offset == result.commit_log_offset
        assert m.msg_id == result.msg_id


def test_threads_sending_one_at_a_time_each_get_their_own_record_stored(store):
    per_thread = 150
    with Producer(store.store_dir) as p:
        def work(i: int) -> dict:
            sent = {}
            for n in range(per_thread):
                body = f"t{i}-{n}".encode()
                sent[body] = p.send(TOPIC, body, tags=f"tag{i}", keys=[f"k{i}-{n}"])
            return sent
        answered = {b: r for sent in in_threads(work) for b, r in sent.items()}
        frames = frames_used(p)
    assert len(answered) == THREADS * per_thread
    assert frames < len(answered), "no two sends went in one frame"
    assert store.stop() == 0, store.log()
    found = read_topic(store.store_dir)
    assert set(found) == set(answered)
    assert_stored_as_answered(found, answered)
    for body, [(_, _, m)] in found.items():
        i, n = body.decode()[1:].split("-")
        assert (m.tags, m.keys) == (f"tag{i}", [f"k{i}-{n}"])


def test_every_kind_of_send_goes_from_threads_and_a_bad_one_fails_alone(store):
    """Plain sends, sends with properties, several keys, a delay level, a chosen queue,
    a bytearray body, and one whose body is a str (TypeError in its own thread only),
    from threads at once."""
    kinds = [
        lambda body: dict(tags="plain"),
        lambda body: dict(properties={"color": "red"}),
        lambda body: dict(keys=["a", "b"]),
        lambda body: dict(queue_id=3),
        lambda body: dict(delay_level=1),
        lambda body: dict(tags="none", keys=None),
    ]
    refused: list[str] = []
    with Producer(store.store_dir) as p:
        def work(i: int) -> dict:
            sent = {}
            for n in range(40):
                body = f"k{i}-{n}".encode()
                if i == len(kinds):            # the bad thread: every other send wrong
                    if n % 2:
                        with pytest.raises(TypeError):
                            p.send(TOPIC, body.decode())
                        refused.append(body.decode())
                        continue
                    sent[body] = p.send(TOPIC, bytearray(body))
                    continue
                sent[body] = p.send(TOPIC, body, **kinds[i](body))
            return sent
        answered = {b: r for sent in in_threads(work, len(kinds) + 1) for b, r in sent.items()}
    assert len(refused) == 20
    delayed = {b for b in answered if b.startswith(b"k4-")}
    with Consumer(store.store_dir, "delivered", TOPIC) as c:     # at their delivery
        seen: set[bytes] = set()

        def all_delivered() -> bool:
            seen.update(m.body for m in c.poll(64, 200))
            return delayed <= seen
        wait_for(all_delivered, 60, "the delayed sends' delivery")
    assert store.stop() == 0, store.log()
    found = read_topic(store.store_dir)
    assert set(found) == set(answered)
    for body, [(q, _, m)] in found.items():
        i = int(body.decode()[1:].split("-")[0])
        if i == 1:
            assert m.properties["color"] == "red"
        elif i == 2:
            assert m.keys == ["a", "b"]
        elif i == 3:
            assert q == 3
        elif i == 0:
            assert m.tags == "plain"
    assert_stored_as_answered(found, {b: r for b, r in answered.items() if b not in delayed})


def test_other_calls_take_their_turn_among_the_sends(store):
    """``send_batch``, ``send_async`` with ``result`` and ``flush`` from their own
    threads while others send one at a time: every record stored once, each batch's
    records in order."""
    with Producer(store.store_dir) as p:
        def work(i: int) -> dict:
            sent = {}
            for n in range(30):
                if i == 0:
                    batch = [Message(TOPIC, f"b{n}-{j}".encode(), queue_id=1) for j in range(5)]
                    sent.update(zip((m.body for m in batch), p.send_batch(batch)))
                elif i == 1:
                    batch = [Message(TOPIC, f"a{n}-{j}".encode()) for j in range(3)]
                    handle = p.send_async(batch)
                    if n % 3 == 0:
                        p.flush()
                    sent.update(zip((m.body for m in batch), handle.result()))
                else:
                    body = f"s{i}-{n}".encode()
                    sent[body] = p.send(TOPIC, body)
            return sent
        answered = {b: r for sent in in_threads(work, 6) for b, r in sent.items()}
    assert store.stop() == 0, store.log()
    found = read_topic(store.store_dir)
    assert set(found) == set(answered)
    assert_stored_as_answered(found, answered)
    for n in range(30):
        offsets = [found[f"b{n}-{j}".encode()][0][1] for j in range(5)]
        assert offsets == list(range(offsets[0], offsets[0] + 5))


def test_an_idempotent_producer_shared_by_threads_stores_each_sequence_once(store):
    with Producer(store.store_dir, idempotent=True) as p:
        def work(i: int) -> dict:
            return {f"i{i}-{n}".encode(): p.send(TOPIC, f"i{i}-{n}".encode(), keys=[str(n)])
                    for n in range(40)}
        answered = {b: r for sent in in_threads(work, 4) for b, r in sent.items()}
        assert all(r.reason == "" for r in answered.values())
        assert p.next_sequence == 160
    assert store.stop() == 0, store.log()
    found = read_topic(store.store_dir)
    assert_stored_as_answered(found, answered)
    sequences = sorted(int(entries[0][2].properties[PROPERTY_PRODUCER_SEQUENCE])
                       for entries in found.values())
    assert sequences == list(range(160))


def test_every_acknowledged_send_of_threads_survives_writer_kills(store):
    """SIGKILL of the writer, three times at random moments, while eight threads send
    one at a time through one producer: a send that raised is not sent again (its
    outcome unknown: stored at most once); each answered PUT_OK is stored, once."""
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    stop = threading.Event()
    answered: dict[bytes, object] = {}
    unknown: list[bytes] = []
    with Producer(store.store_dir, timeout_ms=5_000) as p:
        def work(i: int) -> None:
            n = 0
            while not stop.is_set():
                body = f"w{i}-{n}".encode()
                n += 1
                try:
                    answered[body] = p.send(TOPIC, body, keys=[body.decode()])
                except ClientError:
                    unknown.append(body)
                    time.sleep(0.01)     # while the writer restarts
        senders = threading.Thread(target=in_threads, args=(work,))
        senders.start()
        try:
            for _ in range(3):
                wait_for(lambda: len(answered) > 200, 60, "sends before the kill")
                time.sleep(rng.uniform(0, 0.3))
                writer = store.child_pid("writer")
                os.kill(writer, signal.SIGKILL)
                wait_for(lambda: store.child_pid("writer") not in (0, writer), 60,
                         "the writer's restart")
                before = len(answered)
                wait_for(lambda: len(answered) > before + 200, 60, "sends after the restart")
        finally:
            stop.set()
            senders.join(120)
    assert not senders.is_alive()
    assert store.stop() == 0, store.log()
    found = read_topic(store.store_dir)
    assert set(found) <= set(answered) | set(unknown)
    assert all(len(entries) == 1 for entries in found.values())
    assert_stored_as_answered(found, answered)
    counts = Counter(b.split(b"-")[0] for b in answered)
    assert len(counts) == THREADS


# ============================================================================ a bare ROUTER
def blocked(tid: int) -> bool:
    """Thread ``tid`` of this process sleeps (blocked in a wait)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.parametrize("call", ["send", "send_batch"])
def test_a_call_interrupted_while_waiting_its_turn_leaves_the_line(router, call):
    """A signal handler that raises (as Ctrl-C's does) in the main thread while it waits
    for the socket another thread uses: its call raises, it is out of the line, the
    socket goes back to nobody once the other thread's send is answered, and the next
    call goes as before. The signal comes once the main thread sleeps in line."""
    sock, address = router

    class Interrupted(Exception):
        pass

    def interrupt(signo, frame):
        raise Interrupted

    p = Producer(address, timeout_ms=20_000)
    holder = None
    try:
        settled(p, sock)
        holder_result: list = []
        holder = threading.Thread(target=lambda: holder_result.append(
            p.send("Orders", b"holder", tags="TagA")))
        holder.start()
        assert sock.poll(10_000)             # the holder's send is out: the socket is its

        def signal_once_in_line():
            wait_for(lambda: p._line.waiting and blocked(os.getpid()), 10, "the main thread in line")
            os.kill(os.getpid(), signal.SIGUSR1)

        before = signal.signal(signal.SIGUSR1, interrupt)
        signaller = threading.Thread(target=signal_once_in_line)
        signaller.start()
        try:
            with pytest.raises(Interrupted):
                if call == "send":
                    p.send("Orders", b"waiting", tags="TagA")
                else:
                    p.send_batch([Message("Orders", b"waiting")])
        finally:
            signaller.join()
            signal.signal(signal.SIGUSR1, before)
        assert not p._line.waiting
        answer(sock, 3)
        holder.join(10)
        assert holder_result[0].queue_offset == 3
        assert not p._line.locked()
        result = a_send_answered_at(p, sock, 4)
        assert (result.status, result.queue_offset) == (PutMessageStatus.PUT_OK, 4)
    finally:       # a line left wedged must fail this test, not hang its close
        if holder is not None:
            if holder.is_alive() and sock.poll(0):
                answer(sock, 3)
            holder.join(10)
        if p._line.locked():
            p._line.waiting.clear()
            p._line._lock.release()
        p.close()


def in_line(p: Producer, count: int) -> None:
    wait_for(lambda: len(p._line.waiting) == count, 10, f"{count} in line")


def hold_the_socket(p: Producer, sock) -> tuple[threading.Thread, list]:
    """A send in a thread, at the ROUTER unanswered: the socket stays that thread's."""
    out: list = []
    holder = threading.Thread(target=lambda: out.append(p.send("Orders", b"holder")))
    holder.start()
    assert sock.poll(10_000)
    return holder, out


def sends_in_threads(p: Producer, bodies: list[bytes], outcomes: dict) -> list[threading.Thread]:
    """One thread a body, each ``send``: its result or its error into ``outcomes``."""
    def send(body: bytes) -> None:
        try:
            outcomes[body] = p.send("Orders", body, keys=[body.decode()])
        except BaseException as e:  # noqa: BLE001 - looked at by the test
            outcomes[body] = e
    threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    return threads


def answer_group(sock, offsets_of) -> list[bytes]:
    """Read one SEND_RECORDS frame; answer each record PUT_OK at ``offsets_of(body)``;
    the bodies, in the frame's order."""
    peer, frame = sock.recv_multipart()
    sent = protocol.decode_send_records(frame)
    data = bytes(sent.records)
    bodies = [record.decode_at(data, int(at)).body for at in sent.offsets]
    offsets = [offsets_of(b) for b in bodies]
    n = len(bodies)
    sock.send_multipart([peer, protocol.encode_send_records_reply(
        sent.request_id, STORE_HOST, {"status": [0] * n, "queue_id": [1] * n,
                                      "queue_offset": offsets, "commit_log_offset": offsets,
                                      "store_timestamp": [17] * n}, {})])
    return bodies


def line_up_behind_a_holder(p: Producer, sock, bodies: list[bytes],
                            outcomes: dict) -> list[threading.Thread]:
    """A thread a body sending while another send holds the socket, all in line; then
    the holder answered: the first of them has the socket, its frame at the ROUTER."""
    settled(p, sock)
    holder, _ = hold_the_socket(p, sock)
    threads = sends_in_threads(p, bodies, outcomes)
    in_line(p, len(bodies))
    answer(sock, 3)
    holder.join(10)
    assert sock.poll(10_000)
    return threads


def test_the_sends_waiting_together_go_in_one_frame_each_its_own_result(router):
    sock, address = router
    bodies = [str(100 + i).encode() for i in range(5)]
    outcomes: dict = {}
    with Producer(address, timeout_ms=20_000) as p:
        threads = line_up_behind_a_holder(p, sock, bodies, outcomes)
        grouped = answer_group(sock, int)
        for t in threads:
            t.join(10)
    assert sorted(grouped) == bodies           # all five in the one frame
    for body in bodies:
        result = outcomes[body]
        assert (result.status, result.queue_offset) == (PutMessageStatus.PUT_OK, int(body))


def test_a_group_over_its_byte_limit_goes_in_several_frames_in_order(router, monkeypatch):
    sock, address = router
    bodies = [str(200 + i).encode() for i in range(5)]
    outcomes: dict = {}
    with Producer(address, timeout_ms=20_000) as p:
        settled(p, sock)
        size = len(p._record("Orders", bodies[0], None, [bodies[0].decode()], None, None, 0))
        monkeypatch.setattr(producer_module, "GROUP_MAX_BYTES", 2 * size)
        holder, _ = hold_the_socket(p, sock)
        threads = []
        for i, body in enumerate(bodies):        # in line in this order
            threads += sends_in_threads(p, [body], outcomes)
            in_line(p, i + 1)
        answer(sock, 3)
        holder.join(10)
        frames = []
        while sum(map(len, frames)) < len(bodies):
            assert sock.poll(10_000)
            frames.append(answer_group(sock, int))
        for t in threads:
            t.join(10)
    assert frames == [bodies[0:2], bodies[2:4], bodies[4:5]]
    assert all(outcomes[b].queue_offset == int(b) for b in bodies)


def test_an_error_answer_to_a_group_is_raised_in_each_of_its_threads(router):
    sock, address = router
    bodies = [str(300 + i).encode() for i in range(4)]
    outcomes: dict = {}
    with Producer(address, timeout_ms=20_000) as p:
        threads = line_up_behind_a_holder(p, sock, bodies, outcomes)
        peer, frame = sock.recv_multipart()
        sock.send_multipart([peer, protocol.encode_error(
            protocol.peek_header(frame).request_id, protocol.ErrorCode.INTERNAL, "broken")])
        for t in threads:
            t.join(10)
    errors = [outcomes[b] for b in bodies]
    assert all(isinstance(e, ClientError) and "broken" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == len(errors)      # each thread its own


def test_close_in_line_ends_the_sends_behind_it(router):
    sock, address = router
    outcomes: dict = {}
    p = Producer(address, timeout_ms=20_000)
    settled(p, sock)
    holder, held = hold_the_socket(p, sock)
    closer = threading.Thread(target=p.close)
    closer.start()
    in_line(p, 1)
    threads = sends_in_threads(p, [b"behind"], outcomes)
    in_line(p, 2)
    answer(sock, 3)
    for t in [holder, closer, *threads]:
        t.join(10)
        assert not t.is_alive()
    assert held[0].queue_offset == 3
    assert isinstance(outcomes[b"behind"], StoreClosedError)
    with pytest.raises(StoreClosedError):
        p.send("Orders", b"after")
    with pytest.raises(StoreClosedError):
        p.send_batch([Message("Orders", b"after")])
    p.close()                                   # again: nothing


def test_a_pending_send_waited_for_by_two_threads_gives_both_its_results(router):
    sock, address = router
    with Producer(address, timeout_ms=3_000) as p:
        settled(p, sock)
        pending = p.send_async([Message("Orders", b"a"), Message("Orders", b"b")])
        got: list = []

        def wait_result() -> None:
            try:
                got.append(pending.result())
            except BaseException as e:  # noqa: BLE001 - looked at below
                got.append(e)
        waiters = [threading.Thread(target=wait_result) for _ in range(2)]
        for t in waiters:
            t.start()
        assert sock.poll(10_000)
        answer_group(sock, lambda body: 40 if body == b"a" else 41)
        for t in waiters:
            t.join(10)
    assert len(got) == 2 and got[0] == got[1], got
    assert [r.queue_offset for r in got[0]] == [40, 41]
