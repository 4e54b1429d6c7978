"""The proxy process serves RocketMQ 5's gRPC MessagingService to RocketMQ's official
Python client (rocketmq-python-client, the grpc extra): real gRPC, one real store
(``rocketstore up`` with ``grpc_listen_port`` and an access key) for the whole module.

What a RocketMQ Producer sends is read back by rocketstore's own Consumer and ``query``;
a SimpleConsumer's pops keep RocketMQ's promises (invisible while in flight, acked done,
unacked back with the attempt raised) across a SIGKILL of the proxy; calls not served
answer RocketMQ's NOT_IMPLEMENTED at once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer
from rocketmq import ConsumeResult, MessageListener, PushConsumer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.util.signature import Signature

from rocketstore import Consumer
from rocketstore.procs.grpc_convert import fifo_queue
from rocketstore.shm.positions import Slot
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.delay_level import level_waiting_at_least, parse_delay_levels
from rocketstore.storage.errors import StoreConfigError
from grpc_store import proxied_store, serving
from store_processes import cli, wait_for

AK, SK = "rocketstore-ak", "rocketstore-sk"
INVISIBLE_S = 2          # the shortest the module's store takes (min_invisible ... 1000)
RETRIES = 1              # the module's store: two deliveries, then the dead-letter queue
DELAY_LEVELS = "1s 2s 3s 1m 2h"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with proxied_store(tmp_path_factory.mktemp("grpc"), grpc_access_key=AK,
                       grpc_secret_key=SK, min_invisible_time_mills_for_recv=1000,
                       retry_max_times=RETRIES, message_delay_level=DELAY_LEVELS) as rs:
        yield rs



def configuration(store, sk: str = SK) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{store.grpc_port}", Credentials(AK, sk))


def message(topic: str, body: bytes, tag: str | None = None, keys: str | None = None,
            **properties: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    for k, v in properties.items():
        m.add_property(k, v)
    return m


def send_all(store, topic: str, messages: list[Message]) -> list:
    producer = Producer(configuration(store), (topic,))
    producer.startup()
    try:
        return [producer.send(m) for m in messages]
    finally:
        producer.shutdown()


def own_consumer_reads(store, topic: str, count: int, group: str) -> dict[str, object]:
    """Every message of ``topic`` read with rocketstore's own Consumer, by UNIQ_KEY."""
    seen = {}
    with Consumer(store.store_dir, group, topic, wait_for_topic=True) as c:
        deadline = time.monotonic() + 20
        while len(seen) < count and time.monotonic() < deadline:
            for m in c.poll(64, timeout_ms=500):
                seen[m.uniq_key] = m
    return seen


class Popper:
    """A started SimpleConsumer of one group and topic."""

    def __init__(self, store, group: str, topic: str, await_s: int = 2):
        self.consumer = SimpleConsumer(configuration(store), group,
                                       {topic: FilterExpression()}, await_duration=await_s)
        self.consumer.startup()

    def until(self, want, what: str, invisible_s: int = INVISIBLE_S, timeout: float = 20):
        """Received messages, all kept, until ``want(received)`` holds."""
        got = []
        deadline = time.monotonic() + timeout
        while not want(got):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {got}"
            got += self.consumer.receive(32, invisible_s)
        return got

    def close(self):
        self.consumer.shutdown()


# ---------------------------------------------------------------------------- send
def test_the_proxy_is_one_of_the_stores_supervised_processes(store):
    r = cli("status", "--store", store.store_dir, "--json")
    assert r.returncode == 0, r.stderr
    proxy = json.loads(r.stdout)["processes"]["proxy"]
    assert proxy["state"] == "RUNNING" and proxy["pid"] == store.child_pid("proxy")


def test_sent_messages_are_read_back_by_rocketstores_consumer_and_query(store):
    topic = "GrpcOrders"
    sent = [message(topic, b"plain"), message(topic, b"tagged", tag="created"),
            message(topic, b"keyed", tag="paid", keys="order-42", region="eu")]
    receipts = send_all(store, topic, sent)
    assert all(len(r.message_id) == 34 for r in receipts)     # the client's own ids

    stored = own_consumer_reads(store, topic, 3, "own-readers")
    assert set(stored) == {r.message_id for r in receipts}
    for m, r in zip(sent, receipts):
        s = stored[r.message_id]
        assert s.body == m.body and s.tags == m.tag
        assert s.queue_offset == r.offset          # the offset the store assigned
    assert stored[receipts[2].message_id].keys == ["order-42"]
    assert stored[receipts[2].message_id].properties["region"] == "eu"

    for key in ("order-42", receipts[1].message_id):
        q = cli("query", "--store", store.store_dir, "--topic", topic, "--key", key, "--json")
        assert q.returncode == 0, q.stderr
        assert len(q.stdout.strip().splitlines()) == 1, q.stdout
    found = json.loads(q.stdout.strip().splitlines()[0])
    assert found["tags"] == "created" and found["queue_offset"] == receipts[1].offset


def test_a_message_the_topic_type_refuses_is_not_stored(store):
    """The client checks the type against the route's NORMAL, FIFO, DELAY and
    TRANSACTION; the server refuses a message of two types sent anyway (a half message
    with a message group), as RocketMQ's proxy does, and stores nothing."""
    stub, meta = raw_stub(store)
    written = store.slot(Slot.WRITTEN)
    m = pb.Message(topic=pb.Resource(name="GrpcTyped"), body=b"x")
    m.system_properties.message_id = "01" + "0" * 32
    m.system_properties.message_type = pb.MessageType.TRANSACTION
    m.system_properties.message_group = "order-1"
    r = stub.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=meta, timeout=5)
    assert r.status.code == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    m.ClearField("body")
    m.system_properties.ClearField("message_type")
    m.system_properties.ClearField("message_group")
    r = stub.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=meta, timeout=5)
    assert r.status.code == pb.Code.MESSAGE_BODY_EMPTY
    assert store.slot(Slot.WRITTEN) == written               # nothing stored


def test_a_message_groups_messages_go_to_its_queue_in_the_order_sent(store):
    topic = "GrpcFifo"
    sent = []
    for i in range(6):
        m = message(topic, b"f%d" % i)
        m.message_group = f"order-{i % 2}"
        sent.append(m)
    receipts = send_all(store, topic, sent)
    stored = own_consumer_reads(store, topic, 6, "fifo-readers")
    for group in ("order-0", "order-1"):
        mine = [stored[r.message_id] for m, r in zip(sent, receipts) if m.message_group == group]
        assert {s.queue_id for s in mine} == {fifo_queue(group, 8)}   # RocketMQ's choice
        assert [s.body for s in mine] == [m.body for m in sent if m.message_group == group]
        assert [s.queue_offset for s in mine] == sorted(s.queue_offset for s in mine)
        assert {s.properties["__SHARDINGKEY"] for s in mine} == {group}
    popper = Popper(store, "fifo-group", topic)
    try:
        got = popper.until(lambda got: len(got) >= 6, "the group's messages")
        assert {m.body: m.message_group for m in got} == {m.body: m.message_group for m in sent}
        for m in got:
            popper.consumer.ack(m)
    finally:
        popper.close()


def test_a_delayed_message_waits_in_the_delay_level_that_reaches_its_time(store):
    topic = "GrpcLater"
    producer = Producer(configuration(store), (topic,))
    producer.startup()
    try:
        due_s = int(time.time()) + 2          # whole seconds, as the client sends it:
        later = message(topic, b"later")       # 1-2 s ahead, the 2 s level
        later.delivery_timestamp = due_s
        receipt = producer.send(later)
    finally:
        producer.shutdown()
    assert os.path.isdir(os.path.join(store.store_dir, "consumequeue", "SCHEDULE_TOPIC_XXXX"))
    popper = Popper(store, "later-group", topic)
    try:
        (m,) = popper.until(lambda got: got, "the delayed message")
        assert time.time() >= due_s and m.message_id == receipt.message_id
        assert m.body == b"later" and m.delivery_attempt == 1
        popper.consumer.ack(m)
    finally:
        popper.close()


def test_a_delivery_time_past_the_longest_delay_level_is_refused(store):
    stub, meta = raw_stub(store)
    written = store.slot(Slot.WRITTEN)
    m = pb.Message(topic=pb.Resource(name="GrpcTooLate"), body=b"x")
    m.system_properties.message_id = "01" + "1" * 32
    m.system_properties.message_type = pb.MessageType.DELAY
    m.system_properties.delivery_timestamp.FromSeconds(int(time.time()) + 3 * 3600)
    r = stub.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=meta, timeout=5)
    assert r.status.code == pb.Code.ILLEGAL_DELIVERY_TIME and "message_delay_level" in \
        r.status.message
    assert store.slot(Slot.WRITTEN) == written               # nothing stored


@pytest.mark.parametrize("text, wait_ms, level", [
    (StoreConfig().message_delay_level, 1, 1), (StoreConfig().message_delay_level, 1000, 1),
    (StoreConfig().message_delay_level, 1001, 2), (StoreConfig().message_delay_level, 7200_000, 18),
    (StoreConfig().message_delay_level, 7200_001, None),
    ("10s 1s 5s", 2000, 3), ("10s 1s 5s", 6000, 1)])       # levels need not be in order
def test_a_wait_takes_the_shortest_level_that_reaches_it(text, wait_ms, level):
    assert level_waiting_at_least(wait_ms, parse_delay_levels(text)) == level


# ---------------------------------------------------------------------------- pop
def test_simple_consumer_acked_are_done_unacked_come_back_with_the_attempt_raised(store):
    topic = "GrpcPop"
    receipts = send_all(store, topic, [message(topic, b"m%d" % i) for i in range(6)])
    ids = {r.message_id for r in receipts}
    popper = Popper(store, "pop-group", topic)
    try:
        first = popper.until(lambda got: len(got) >= 6, "the first pop of all six")
        assert {m.message_id for m in first} == ids
        assert all(m.delivery_attempt == 1 for m in first)
        acked, kept, unacked = first[:3], first[3], first[4:]
        for m in acked:
            popper.consumer.ack(m)
        popper.consumer.change_invisible_duration(kept, 60)     # hidden a minute more

        again = popper.until(lambda got: len(got) >= 2, "the unacked to come back")
        assert sorted(m.message_id for m in again) == sorted(m.message_id for m in unacked)
        assert all(m.delivery_attempt == 2 for m in again)
        for m in again:
            popper.consumer.ack(m)
        assert popper.consumer.receive(32, INVISIBLE_S) == []   # kept one still hidden
        popper.consumer.ack(kept)        # with the handle the change gave it
    finally:
        popper.close()


def test_a_tag_filter_passes_over_the_other_tags_as_done(store):
    topic = "GrpcTags"
    send_all(store, topic, [message(topic, b"t%d" % i, tag="red" if i % 2 else "blue")
                            for i in range(6)])
    red = SimpleConsumer(configuration(store), "red-group",
                         {topic: FilterExpression("red || green")}, await_duration=2)
    red.startup()
    try:
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3:
            assert time.monotonic() < deadline, got
            got += red.receive(32, 60)
        assert sorted(m.body for m in got) == [b"t1", b"t3", b"t5"]
        assert {m.tag for m in got} == {"red"}
        assert red.receive(32, 60) == []           # the blue ones are not handed out
    finally:
        red.shutdown()
    everything = Popper(store, "all-group", topic)  # another group sees every message
    try:
        assert len(everything.until(lambda got: len(got) >= 6, "all six")) == 6
    finally:
        everything.close()


def test_a_stale_receipt_handle_is_refused_and_an_ack_is_idempotent(store):
    topic = "GrpcHandles"
    send_all(store, topic, [message(topic, b"once")])
    popper = Popper(store, "handle-group", topic)
    try:
        (m,) = popper.until(lambda got: got, "the message")
        old_handle = m.receipt_handle
        popper.consumer.change_invisible_duration(m, INVISIBLE_S)
        stub, meta = raw_stub(store)
        stale = stub.AckMessage(ack_request(topic, "handle-group", m.message_id, old_handle),
                                metadata=meta, timeout=5)
        assert stale.status.code == pb.Code.INVALID_RECEIPT_HANDLE
        for _ in range(2):
            r = stub.AckMessage(ack_request(topic, "handle-group", m.message_id,
                                            m.receipt_handle), metadata=meta, timeout=5)
            assert r.status.code == pb.Code.OK
    finally:
        popper.close()


def test_a_nack_makes_a_message_visible_again_at_once(store):
    """A PushConsumer's nack is a change of invisible duration to its backoff, shorter
    than a receive may ask: 0 s here, so it comes back with the next receive."""
    topic = "GrpcNack"
    send_all(store, topic, [message(topic, b"retry me")])
    popper = Popper(store, "nack-group", topic)
    try:
        (m,) = popper.until(lambda got: got, "the message", invisible_s=60)
        popper.consumer.change_invisible_duration(m, 0)
        (again,) = popper.until(lambda got: got, "the message again", invisible_s=60)
        assert again.message_id == m.message_id and again.delivery_attempt == 2
        popper.consumer.ack(again)
    finally:
        popper.close()


class Recorder(MessageListener):
    """Records each delivery; fails the first delivery of the bodies in ``fail_once``."""

    def __init__(self, fail_once: set[bytes]):
        self.fail_once = fail_once
        self.deliveries: list[tuple[bytes, int]] = []

    def consume(self, message) -> ConsumeResult:
        self.deliveries.append((message.body, message.delivery_attempt))
        if message.body in self.fail_once and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def test_a_push_consumer_consumes_through_its_listener_and_a_failure_comes_back(store):
    """The PushConsumer asks its assignment, receives with auto-renewal, acks what its
    listener consumed and nacks (its 1 s backoff) what failed."""
    topic, group = "GrpcPush", "push-group"
    bodies = [b"p%d" % i for i in range(4)]
    send_all(store, topic, [message(topic, b) for b in bodies])
    listener = Recorder({b"p0"})
    consumer = PushConsumer(configuration(store), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_for(lambda: (b"p0", 2) in listener.deliveries and
                 {b for b, _ in listener.deliveries} == set(bodies),
                 what="every message consumed and the failed one again")
    finally:
        consumer.shutdown()
    assert sorted(listener.deliveries) == [(b"p0", 1), (b"p0", 2), (b"p1", 1), (b"p2", 1),
                                           (b"p3", 1)]
    popper = Popper(store, group, topic)        # all acked: nothing left for the group
    try:
        assert popper.consumer.receive(32, INVISIBLE_S) == []
    finally:
        popper.close()


def test_a_message_never_acked_goes_to_the_dead_letter_queue_after_its_last_attempt(store):
    topic, group = "GrpcDead", "dead-group"
    receipts = send_all(store, topic, [message(topic, b"d0", tag="t", keys="dk"),
                                       message(topic, b"d1")])
    ids = {r.message_id for r in receipts}
    popper = Popper(store, group, topic)
    try:
        for attempt in range(1, RETRIES + 2):
            got = popper.until(lambda got: len(got) >= 2, f"delivery {attempt}", invisible_s=1)
            assert {m.message_id for m in got} == ids
            assert {m.delivery_attempt for m in got} == {attempt}
        dlq_dir = os.path.join(store.store_dir, "consumequeue", "%DLQ%" + group)
        deadline = time.monotonic() + 20
        while not os.path.isdir(dlq_dir):       # a pop past their last attempt moves them
            assert time.monotonic() < deadline, "nothing went to the dead-letter queue"
            assert not ids & {m.message_id for m in popper.consumer.receive(32, 1)}
    finally:
        popper.close()
    dead = own_consumer_reads(store, "%DLQ%" + group, 2, "dead-readers")
    assert set(dead) == ids
    for m in dead.values():
        assert m.queue_id == 0 and m.properties["RETRY_TOPIC"] == topic
        assert m.properties["ORIGIN_MESSAGE_ID"] == m.uniq_key
    assert {m.body: (m.tags, m.keys) for m in dead.values()} == {b"d0": ("t", ["dk"]),
                                                                 b"d1": (None, [])}


def test_sigkill_of_the_proxy_loses_no_acknowledged_message_and_brings_back_no_acked_one(
        store):
    topic = "GrpcKill"
    producer = Producer(configuration(store), (topic,))
    producer.startup()
    acknowledged, stop = [], threading.Event()

    def send_until_stopped():
        i = 0
        while not stop.is_set():
            try:
                acknowledged.append(producer.send(message(topic, b"k%d" % i)).message_id)
            except Exception:       # the proxy is down: this one was not acknowledged
                pass
            i += 1

    sender = threading.Thread(target=send_until_stopped)
    sender.start()
    popper = Popper(store, "kill-group", topic)
    try:
        wait_for(lambda: len(acknowledged) >= 20, what="sends before the kill")
        popped = popper.until(lambda got: len(got) >= 10, "pops before the kill",
                              invisible_s=3)
        acked = popped[:len(popped) // 2]
        for m in acked:
            popper.consumer.ack(m)
        pid = store.child_pid("proxy")
        restarts = store.restarts("proxy")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: store.restarts("proxy") > restarts and serving(store.grpc_port),
                 what="the proxy to be restarted")
        wait_for(lambda: len(acknowledged) >= 40, what="sends after the restart")
        stop.set()
        sender.join(30)
        assert not sender.is_alive()

        stored = own_consumer_reads(store, topic, len(set(acknowledged)), "kill-readers")
        assert set(acknowledged) <= set(stored)             # nothing acknowledged lost

        acked_ids = {m.message_id for m in acked}
        unacked_ids = {m.message_id for m in popped[len(acked):]}
        rest = []

        def unacked_back():
            """The consumer's channel to the killed proxy reconnects with gRPC's
            back-off, failing calls meanwhile: an application receives again."""
            try:
                rest.extend(popper.consumer.receive(32, INVISIBLE_S))
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            return {m.message_id for m in rest} >= unacked_ids

        wait_for(unacked_back, timeout=30, interval=0.2,
                 what="the unacked to come back after the restart")
        assert not acked_ids & {m.message_id for m in rest}
        assert all(m.delivery_attempt == 2 for m in rest if m.message_id in unacked_ids)
    finally:
        stop.set()
        sender.join(30)
        popper.close()
        producer.shutdown()


# ---------------------------------------------------------------------------- refusals
def raw_stub(store, sk: str = SK):
    channel = grpc.insecure_channel(f"127.0.0.1:{store.grpc_port}")
    config = configuration(store, sk)
    return service_pb2_grpc.MessagingServiceStub(channel), Signature.metadata(config, "c1")


def ack_request(topic: str, group: str, message_id: str, handle: str):
    return rpc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                 entries=[rpc.AckMessageEntry(message_id=message_id,
                                                              receipt_handle=handle)])


def test_a_message_forwarded_to_the_dead_letter_queue_is_there_and_done(store):
    topic, group = "GrpcForward", "forward-group"
    (receipt,) = send_all(store, topic, [message(topic, b"give up")])
    popper = Popper(store, group, topic)
    try:
        (m,) = popper.until(lambda got: got, "the message", invisible_s=1)
        stub, meta = raw_stub(store)
        request = rpc.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            receipt_handle=m.receipt_handle, message_id=m.message_id, delivery_attempt=1,
            max_delivery_attempts=1)
        r = stub.ForwardMessageToDeadLetterQueue(request, metadata=meta, timeout=5)
        assert r.status.code == pb.Code.OK, r.status.message
        again = stub.ForwardMessageToDeadLetterQueue(request, metadata=meta, timeout=5)
        assert again.status.code == pb.Code.INVALID_RECEIPT_HANDLE
        dead = own_consumer_reads(store, "%DLQ%" + group, 1, "forward-readers")
        assert list(dead) == [receipt.message_id]
        assert popper.consumer.receive(32, 1) == []       # done: past its 1 s, not back
    finally:
        popper.close()


def test_a_call_not_served_answers_not_implemented_at_once(store):
    stub, meta = raw_stub(store)
    r = stub.RecallMessage(rpc.RecallMessageRequest(topic=pb.Resource(name="T")),
                           metadata=meta, timeout=5)
    assert r.status.code == pb.Code.NOT_IMPLEMENTED and "RecallMessage" in r.status.message
    pulled = list(stub.PullMessage(rpc.PullMessageRequest(), metadata=meta, timeout=5))
    assert [p.status.code for p in pulled] == [pb.Code.NOT_IMPLEMENTED]


def test_calls_unsigned_or_without_a_client_id_are_refused(store):
    stub, meta = raw_stub(store, sk="not-the-secret")
    request = rpc.QueryRouteRequest(topic=pb.Resource(name="T"))
    assert stub.QueryRoute(request, metadata=meta, timeout=5).status.code == \
        pb.Code.UNAUTHORIZED
    stub, meta = raw_stub(store)
    no_id = [(k, v) for k, v in meta if k != "x-mq-client-id"]
    assert stub.QueryRoute(request, metadata=no_id, timeout=5).status.code == \
        pb.Code.CLIENT_ID_REQUIRED
    r = stub.QueryRoute(request, metadata=meta, timeout=5)
    assert r.status.code == pb.Code.OK and [q.id for q in r.message_queues] == list(range(8))


def test_a_receive_asking_too_short_an_invisible_duration_is_refused(store):
    stub, meta = raw_stub(store)
    request = rpc.ReceiveMessageRequest(
        group=pb.Resource(name="G"), batch_size=1,
        message_queue=pb.MessageQueue(topic=pb.Resource(name="T")))
    request.invisible_duration.FromMilliseconds(500)
    (r,) = stub.ReceiveMessage(request, metadata=meta, timeout=5)
    assert r.status.code == pb.Code.ILLEGAL_INVISIBLE_TIME
    assert "min_invisible_time_mills_for_recv" in r.status.message


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3"])
def test_serving_beyond_loopback_needs_the_access_key(tmp_path, address):
    with pytest.raises(StoreConfigError, match="grpc_access_key"):
        StoreConfig(store_path_root_dir=str(tmp_path), grpc_listen_port=8081,
                    grpc_listen_address=address)
    StoreConfig(store_path_root_dir=str(tmp_path), grpc_listen_port=8081,
                grpc_listen_address=address, grpc_access_key=AK, grpc_secret_key=SK)


def test_the_grpc_port_may_not_be_another_sockets():
    with pytest.raises(StoreConfigError, match="grpc_listen_port 10911 is taken by ingest"):
        StoreConfig(grpc_listen_port=10911, tcp_listen_address="127.0.0.1", listen_port=10911)
    with pytest.raises(StoreConfigError, match="taken by the metrics endpoint"):
        StoreConfig(grpc_listen_port=9100, metrics_port=9100)
    with pytest.raises(StoreConfigError, match="dashboard_port 8081 is taken by the gRPC"):
        StoreConfig(grpc_listen_port=8081, dashboard_port=8081)
