"""The one-message send's own path: ``Producer.send`` of a plain message encodes its
frame from the arguments (``protocol.encode_plain_send``), a settled ``Dealer`` waits
with one blocking ``recv``, and a one-record answer is read with one ``struct``. Each
gives what the general path gives, byte for byte and rule for rule."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import zmq
from hypothesis import given, settings, strategies as st

from rocketstore.client import ConnectionLost, Producer, RequestTimeout
from rocketstore.client import dealer as dealer_module
from rocketstore.storage import Message, record_batch
from rocketstore.storage.status import PutMessageStatus
from rocketstore.wire import protocol
from store_processes import wait_for

STORE_HOST = bytes([127, 0, 0, 1, 0, 0, 0x28, 0x9A])


def general_frame(request_id, topic, body, tags, key, queue_id, born_timestamp):
    """The frame ``Producer.send`` made before it had a path of its own, or the error
    that sent it to a SEND frame."""
    try:
        m = Message(topic, body, tags=tags, keys=[key] if key is not None else None,
                    queue_id=queue_id)
        return protocol.encode_one_send_record(
            request_id, record_batch.encode_message(m, born_timestamp))
    except Exception as e:        # noqa: BLE001 (the producer's own fallback)
        return type(e)


texts = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=400, deadline=None)
@given(topic=st.one_of(st.sampled_from(["Orders", "T", "x" * 127, "x" * 128, ""]), texts),
       body=st.one_of(st.binary(max_size=300), st.just(bytearray(b"ba"))),
       tags=st.one_of(st.none(), st.just(""), texts), key=st.one_of(st.none(), texts),
       queue_id=st.one_of(st.none(), st.integers(-2, 8), st.just(2 ** 31)),
       request_id=st.integers(0, 2 ** 64 - 1), born=st.integers(0, 2 ** 62))
def test_a_plain_frame_is_the_general_frame(topic, body, tags, key, queue_id, request_id,
                                            born):
    plain = protocol.encode_plain_send(request_id, topic, body, tags, key, queue_id, born)
    general = general_frame(request_id, topic, body, tags, key, queue_id, born)
    if plain is not None:
        assert plain == general
    else:                          # judged by the general path, as before
        assert general is not None


@pytest.mark.parametrize("topic, body, tags, key, queue_id", [
    ("Orders", b"body", "TagA", "k1", None),
    ("Orders", b"", None, None, 3),
    ("Orders", b"y", "日本", "ключ", 7),
    ("Orders", b"z", "a b", "", 0),
])
def test_plain_messages_take_the_plain_path(topic, body, tags, key, queue_id):
    plain = protocol.encode_plain_send(9, topic, body, tags, key, queue_id, 1234)
    assert plain is not None
    assert plain == general_frame(9, topic, body, tags, key, queue_id, 1234)


@pytest.mark.parametrize("topic, body, tags, key, queue_id", [
    ("Orders", b"z", "a\x01b", "k", None),      # a byte the properties reserve
    ("Orders", b"z", "t", "a b", None),         # the key separator
    ("Orders", b"z", "t", "k", -1),
    ("Orders", b"z", "t", "k", 2 ** 31),
    ("Orders", bytearray(b"z"), "t", "k", 1),
    ("x" * 128, b"z", "t", "k", 1),             # a v2 topic
    ("Orders", b"z", "t" * 40000, "k", 1),      # properties over 32767 bytes
    (["Orders"], b"z", "t", "k", 1),            # what only the general path names
    ("Orders", b"z", ["t"], "k", 1),
    ("Orders", b"z", "t", 5, 1),
])
def test_what_is_not_plain_goes_the_general_way(topic, body, tags, key, queue_id):
    assert protocol.encode_plain_send(9, topic, body, tags, key, queue_id, 1234) is None


@pytest.mark.parametrize("columns", [
    (0, 1, 3, 900, 17), (0, 1, 3, -1, 17), (1, 2, 3, 2 ** 62 + 5, 5), (0, 0, 0, 0, 0)])
def test_a_one_record_answer_reads_as_the_general_decoder_reads_it(columns):
    frame = protocol.encode_one_send_records_reply(5, STORE_HOST, *columns)
    general = protocol.decode_send_records_reply(frame)[1][0]
    assert protocol.decode_one_send_result(frame) == general
    assert protocol.decode_one_send_result(memoryview(frame)) == general
    columns = dict(zip(("status", "queue_id", "queue_offset", "commit_log_offset",
                        "store_timestamp"), ([c] for c in columns)))
    with_reason = protocol.encode_send_records_reply(5, STORE_HOST, columns, {0: "why"})
    assert protocol.decode_one_send_result(with_reason) is None    # the general decoder's
    assert protocol.decode_send_records_reply(with_reason)[1][0].reason == "why"


@pytest.fixture
def router(tmp_path):
    """A bare ROUTER where a store's ingest socket would be, and its address."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    address = f"ipc://{tmp_path}/ingest.sock"
    sock.bind(address)
    yield sock, address
    sock.close(0)
    ctx.term()


def answer(router: zmq.Socket, offset: int) -> int:
    """Answer the next request PUT_OK at ``offset``; its request id."""
    peer, frame = router.recv_multipart()
    request_id = protocol.reply_request_id(frame)
    router.send_multipart([peer, protocol.encode_one_send_records_reply(
        request_id, STORE_HOST, 0, 1, offset, offset, 17)])
    return request_id


def settled(p: Producer, router: zmq.Socket) -> None:
    """One send answered, so the first handshake is judged and waits block in recv."""
    pending = p.send_async([Message("Orders", b"first")])
    answer(router, 0)
    assert pending.result()[0].ok
    assert p._dealer._settled


def test_a_settled_wait_keeps_other_answers_and_drops_a_forgotten_one(router):
    sock, address = router
    with Producer(address, timeout_ms=5000) as p:
        settled(p, sock)
        dealer = p._dealer
        ids = [dealer.next_id() for _ in range(3)]
        for request_id in ids:
            dealer.send(protocol.encode_plain_send(request_id, "Orders", b"b", None, None,
                                                   None, 1), request_id)
        dealer.forget(ids[0])
        answered = [answer(sock, offset) for offset in (10, 11, 12)]
        assert answered == ids
        third = protocol.decode_one_send_result(dealer.receive(ids[2]))
        second = protocol.decode_one_send_result(dealer.receive(ids[1]))
        assert (second.queue_offset, third.queue_offset) == (11, 12)
        assert not dealer.replies and not dealer._pending    # the forgotten one dropped


def test_a_plain_send_times_out_as_any_send_does(router):
    sock, address = router
    with Producer(address, timeout_ms=300) as p:
        settled(p, sock)
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match=r"no answer to request \d+ within 300 ms; "
                                                 r"its outcome is unknown$"):
            p.send("Orders", b"never answered", tags="TagA", keys=["k"])
        assert time.monotonic() - started >= 0.3
        assert not p._dealer._pending
        late = answer(sock, 5)                        # the late answer is dropped
        p.send_async([Message("Orders", b"next")])
        answer(sock, 6)
        assert p.flush() is None and late not in p._dealer.replies


def test_a_plain_send_blocked_in_its_wait_sees_the_connection_lost(router):
    sock, address = router
    with Producer(address, timeout_ms=20_000) as p:
        settled(p, sock)
        gone = threading.Timer(0.3, sock.close, (0,))   # the store's process goes away
        gone.start()
        started = time.monotonic()
        try:
            with pytest.raises(ConnectionLost, match="was lost with request"):
                p.send("Orders", b"in flight", tags="TagA", keys=["k"])
        finally:
            gone.join()
        assert time.monotonic() - started < 10     # seen at once, not at the timeout


def answer_in_thread(router: zmq.Socket, offset: int) -> threading.Thread:
    """``answer`` in a thread, to a request that comes within 10 s (the thread ends
    by then: the socket is closed only after it)."""
    t = threading.Thread(target=lambda: router.poll(10_000) and answer(router, offset))
    t.start()
    return t


def a_send_answered_at(p: Producer, router: zmq.Socket, offset: int) -> protocol.SendResult:
    """A plain send, its answer PUT_OK at ``offset`` from a thread."""
    answering = answer_in_thread(router, offset)
    try:
        return p.send("Orders", b"next", tags="TagA")
    finally:
        answering.join()


def the_next_send_takes_its_own(p: Producer, router: zmq.Socket) -> None:
    """The answer to an earlier send comes first: it is dropped, and the next send's
    wait goes on to its own; nothing stays pending."""
    late = answer(router, 5)
    result = a_send_answered_at(p, router, 6)
    assert (result.status, result.queue_offset) == (PutMessageStatus.PUT_OK, 6)
    assert late not in p._dealer.replies and not p._dealer._pending


def test_a_plain_send_after_a_late_answer_takes_its_own(router):
    """The answer to a send that timed out comes first: it is dropped, and the next
    send's wait goes on to its own."""
    sock, address = router
    with Producer(address, timeout_ms=300) as p:
        settled(p, sock)
        with pytest.raises(RequestTimeout):
            p.send("Orders", b"answered late", tags="TagA")
        the_next_send_takes_its_own(p, sock)


def test_a_plain_send_after_a_loss_goes_to_the_process_that_took_its_place(tmp_path):
    """The store's process went away between two sends and another bound its socket:
    the loss is seen before the next send (nothing in flight, nothing ended), and that
    send is answered by the new process."""
    address = f"ipc://{tmp_path}/ingest.sock"
    ctx = zmq.Context()
    first = ctx.socket(zmq.ROUTER)
    first.bind(address)
    try:
        with Producer(address, timeout_ms=20_000) as p:
            settled(p, first)
            first.close(0)
            wait_for(lambda: p._dealer._watch_fd.poll(0), 10, "the loss on the monitor")
            second = ctx.socket(zmq.ROUTER)
            second.bind(address)
            answering = answer_in_thread(second, 7)
            try:
                result = p.send("Orders", b"after the loss", tags="TagA")
            finally:
                answering.join()
                second.close(0)
            assert (result.status, result.queue_offset) == (PutMessageStatus.PUT_OK, 7)
            assert p._dealer._lost_seen == 1
    finally:
        first.close(0)
        ctx.term()


def test_a_plain_send_interrupted_in_its_wait_leaves_nothing_pending(router, monkeypatch):
    """A signal handler that raises while a plain send waits for its answer (as Ctrl-C's
    KeyboardInterrupt does) leaves no request pending: the next send takes the short
    path again, and the interrupted one's late answer is dropped. The signal comes once
    the request is at the other end; the wait's RCVTIMEO is raised to 10 s, so the
    signal finds the send in its first ``recv`` however slow the machine."""
    sock, address = router
    monkeypatch.setattr(dealer_module, "WATCH_EVERY_MS", 10_000)

    class Interrupted(Exception):
        pass

    def interrupt(signo, frame):
        raise Interrupted

    def signal_once_sent():
        if sock.poll(10_000):
            os.kill(os.getpid(), signal.SIGUSR1)

    with Producer(address, timeout_ms=20_000) as p:
        settled(p, sock)
        before = signal.signal(signal.SIGUSR1, interrupt)
        signaller = threading.Thread(target=signal_once_sent)
        signaller.start()
        try:
            with pytest.raises(Interrupted):
                p.send("Orders", b"interrupted", tags="TagA")
        finally:
            signaller.join()
            signal.signal(signal.SIGUSR1, before)
        assert not p._dealer._pending
        the_next_send_takes_its_own(p, sock)
