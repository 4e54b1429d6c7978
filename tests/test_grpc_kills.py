"""RocketMQ's official Python client through the proxy while store processes are
SIGKILLed: one real store (``rocketstore up`` with ``grpc_listen_port``) for the module,
its supervisor restarting what is killed.

A Producer sending one message at a time while the writer is killed: every send the
client saw succeed is in the store afterwards (read with rocketstore's own Consumer),
and every send that failed was answered with one of RocketMQ's codes, not left to hang.
A SimpleConsumer receiving and acking while the writer, then the proxy, is killed (once
at any moment, once the moment after it answered acks): no message acked comes back, and
every one not acked does.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer
from rocketmq import SimpleConsumer
from rocketmq.v5.exception import ClientException

from rocketstore import Consumer
from rocketstore.storage.pop_state import ReceiptHandle
from grpc_store import proxied_store
from store_processes import wait_for

INVISIBLE_S = 2             # the shortest the module's store takes (1000 ms)
REQUEST_TIMEOUT_S = 3       # the client's default request timeout
SEND_ATTEMPTS = 3           # the client's default: a send is tried this many times
KILLS = 3                   # writer kills during the sends, each after more successes
# the writer restarted WRITER_DOWN_S after each kill (a back-off, as after a crash soon
# after its start), so that sends meet a store without a writer, not only a lost answer
WRITER_DOWN_S = 4.0
WRITER = {"startsecs": 3600.0, "backoff_s": WRITER_DOWN_S, "backoff_max_s": WRITER_DOWN_S,
          "startretries": 10}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with proxied_store(tmp_path_factory.mktemp("grpc-kills"),
                       min_invisible_time_mills_for_recv=1000,
                       processes={"writer": WRITER}) as rs:
        yield rs



def configuration(store) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{store.grpc_port}", Credentials(),
                               request_timeout=REQUEST_TIMEOUT_S)


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def kill_and_wait_restart(store, name: str) -> None:
    """SIGKILL store process ``name`` and wait until the supervisor ran another."""
    pid, restarts = store.child_pid(name), store.restarts(name)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: store.restarts(name) > restarts and store.child_pid(name) not in (0, pid),
             what=f"the {name} to be restarted")


def stored_offsets(store, topic: str, wanted: set[str], group: str) -> dict[str, set[int]]:
    """The queue offsets each message of ``topic`` is stored at, by UNIQ_KEY, read with
    rocketstore's own Consumer until every id of ``wanted`` was seen (or 30 s)."""
    seen: dict[str, set[int]] = {}
    with Consumer(store.store_dir, group, topic, wait_for_topic=True) as c:
        deadline = time.monotonic() + 30
        while not wanted <= seen.keys() and time.monotonic() < deadline:
            for m in c.poll(64, timeout_ms=500):
                seen.setdefault(m.uniq_key, set()).add(m.queue_offset)
    return seen


# ---------------------------------------------------------------------------- send
class Sender:
    """An official Producer sending one message at a time on a thread of its own,
    recording each send's receipt or error and how long it took."""

    def __init__(self, store, topic: str):
        self.topic = topic
        self.producer = Producer(configuration(store), (topic,))
        self.producer.startup()
        self.succeeded: list = []              # SendReceipt
        self.failed: list[tuple[Exception, float]] = []
        self.longest_s = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sender")
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.succeeded.append(self.producer.send(message(self.topic, b"w%d" % i)))
            except Exception as e:      # what the client raised: judged by the test
                self.failed.append((e, time.monotonic() - started))
                self.stop.wait(0.05)
            self.longest_s = max(self.longest_s, time.monotonic() - started)
            i += 1

    def close(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        self.thread.join(SEND_ATTEMPTS * REQUEST_TIMEOUT_S + 10)
        assert not self.thread.is_alive(), "a send hung"
        self.producer.shutdown()


def test_every_send_seen_to_succeed_while_the_writer_is_killed_is_stored(store):
    topic = "GrpcWriterKill"
    sender = Sender(store, topic)
    try:
        for k in range(KILLS):
            want = len(sender.succeeded) + 20
            wait_for(lambda: len(sender.succeeded) >= want, timeout=60,
                     what=f"sends before kill {k + 1}")
            kill_and_wait_restart(store, "writer")
        want = len(sender.succeeded) + 20
        wait_for(lambda: len(sender.succeeded) >= want, timeout=60,
                 what="sends after the last restart")
    finally:
        sender.close()

    ids = {r.message_id for r in sender.succeeded}
    stored = stored_offsets(store, topic, ids, "writer-kill-readers")
    assert ids <= stored.keys(), f"acknowledged but not stored: {sorted(ids - stored.keys())}"
    for r in sender.succeeded:          # the receipt's offset is the one the store gave
        assert r.offset in stored[r.message_id]
    for e, took_s in sender.failed:     # answered with RocketMQ's code, in time
        assert isinstance(e, ClientException) and e.code, repr(e)
        assert took_s < SEND_ATTEMPTS * REQUEST_TIMEOUT_S, (e, took_s)
    assert sender.longest_s < SEND_ATTEMPTS * REQUEST_TIMEOUT_S + 1     # none hung


# ---------------------------------------------------------------------------- pop
def unit(m) -> tuple[int, int]:
    """The stored copy a received message is: its queue and queue offset, from its
    receipt handle (RocketMQ's layout, ``storage.pop_state``). A send the client tried
    again after a lost answer may be stored twice, two copies of one message id."""
    handle = ReceiptHandle.decode(m.receipt_handle)
    return handle.queue_id, handle.queue_offset


class Receiver:
    """A SimpleConsumer receiving on a thread of its own: of the copies it gets the
    first time it acks every other one and keeps the rest, which it acks when they come
    back. Records every delivery in the order seen and every ack the proxy answered OK;
    a call that fails (the proxy is down) is tried again. With ``hold`` set it pauses
    after the next batch it acked any of, ``held`` set, until ``resume``."""

    def __init__(self, store, group: str, topic: str):
        self.consumer = SimpleConsumer(configuration(store), group,
                                       {topic: FilterExpression()}, await_duration=1)
        self.consumer.startup()
        self.deliveries: list[tuple[tuple[int, int], str, int, int]] = []
        # ^ (copy, message id, attempt, acks answered before it)
        self.acked: list[tuple[int, int]] = []
        self.kept: set[tuple[int, int]] = set()     # not acked at their first delivery
        self.unsure: set[tuple[int, int]] = set()   # an ack that failed: outcome unknown
        self.errors: list[Exception] = []
        self.stop = threading.Event()
        self.hold, self.held, self.resume = threading.Event(), threading.Event(), \
            threading.Event()
        self.thread = threading.Thread(target=self._run, name="receiver")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                got = self.consumer.receive(8, INVISIBLE_S)
            except Exception as e:      # the proxy is down, or its channel reconnecting
                self.errors.append(e)
                self.stop.wait(0.1)
                continue
            acks_before = len(self.acked)
            for m in got:
                copy = unit(m)
                self.deliveries.append((copy, m.message_id, m.delivery_attempt,
                                        len(self.acked)))
                if m.delivery_attempt == 1 and len(self.deliveries) % 2:
                    self.kept.add(copy)
                    continue
                try:
                    self.consumer.ack(m)
                    self.acked.append(copy)
                except Exception as e:
                    self.errors.append(e)
                    self.unsure.add(copy)
            if self.hold.is_set() and len(self.acked) > acks_before:
                self.held.set()
                self.resume.wait(60)
                self.hold.clear()

    def received(self) -> set[str]:
        return {message_id for _, message_id, _, _ in self.deliveries}

    def came_back(self) -> set[tuple[int, int]]:
        return {copy for copy, _, attempt, _ in self.deliveries if attempt > 1}

    def close(self) -> None:
        self.stop.set()
        self.resume.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "a receive or an ack hung"
        self.consumer.shutdown()


def kill_the_proxy_right_after_an_ack(store, receiver: Receiver) -> None:
    """SIGKILL the proxy the moment after it answered acks, before the receiver calls
    again, and wait for the new one."""
    receiver.hold.set()
    wait_for(receiver.held.is_set, timeout=60, what="an ack answered")
    kill_and_wait_restart(store, "proxy")
    receiver.resume.set()


def test_no_acked_message_comes_back_and_every_unacked_one_does_across_kills(store):
    topic, group = "GrpcPopKill", "pop-kill-group"
    sender = Sender(store, topic)
    receiver = Receiver(store, group, topic)
    try:
        wait_for(lambda: len(receiver.acked) >= 20, timeout=60, what="acks before the kills")
        kills = (lambda: kill_and_wait_restart(store, "writer"),
                 lambda: kill_and_wait_restart(store, "proxy"),
                 lambda: kill_the_proxy_right_after_an_ack(store, receiver))
        for k, kill in enumerate(kills):
            kill()
            want = len(receiver.acked) + 20
            wait_for(lambda: len(receiver.acked) >= want, timeout=60,
                     what=f"acks after restart {k + 1}")
        sender.close()
        ids = {r.message_id for r in sender.succeeded}
        wait_for(lambda: receiver.received() >= ids, timeout=60, what="every message received")
        wait_for(lambda: receiver.came_back() >= receiver.kept, timeout=60,
                 what="every copy kept unacked to come back")
    finally:
        sender.close()
        receiver.close()

    assert any(isinstance(e, grpc.aio.AioRpcError) for e in receiver.errors), \
        "no call met the proxy down"
    acked_at = {}
    for n, copy in enumerate(receiver.acked):
        acked_at.setdefault(copy, n + 1)
    for copy, message_id, attempt, acks_before in receiver.deliveries:
        if copy in acked_at:        # no delivery after the ack the proxy answered
            assert acks_before < acked_at[copy], \
                f"{message_id} at {copy} delivered again (attempt {attempt}) after its ack"
    delivered = {copy for copy, _, _, _ in receiver.deliveries}
    assert delivered == set(acked_at) | receiver.unsure | receiver.kept
