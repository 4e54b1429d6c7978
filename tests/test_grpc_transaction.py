"""Transactional messages through the proxy (RocketMQ 5's SendMessage of a TRANSACTION
message, EndTransaction, and the check over Telemetry), with RocketMQ's official Python
client: real gRPC, one real store for the whole module (``rocketstore up`` with
``grpc_listen_port``, a short ``transaction_timeout`` and check interval).

A half message lies in RMQ_SYS_TRANS_HALF_TOPIC, unseen by the real topic's consumers,
until a commit puts it there once; a rollback never does; a transaction left open is
asked of the producer's TransactionChecker and its answer applied, also after a SIGKILL
of the proxy; ids that name no open transaction are refused and change nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer,
                      SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.util.signature import Signature

from rocketstore import Consumer
from rocketstore.shm.positions import Slot
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, create_message_id, decode_message_id,
    transaction_value)
from rocketstore.storage.transactional_message import (
    TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC)
from grpc_store import proxied_store, serving
from store_processes import cli, wait_for

AK, SK = "rocketstore-ak", "rocketstore-sk"
TIMEOUT_MS = 5000           # transaction_timeout: born times are whole seconds
CHECK_INTERVAL_MS = 300
CHECK_MAX = 3
INVISIBLE_S = 2
COMMIT, ROLLBACK = TransactionResolution.COMMIT, TransactionResolution.ROLLBACK
UNKNOWN = TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with proxied_store(tmp_path_factory.mktemp("grpc-tx"), grpc_access_key=AK,
                       grpc_secret_key=SK, min_invisible_time_mills_for_recv=1000,
                       transaction_timeout=TIMEOUT_MS,
                       transaction_check_interval=CHECK_INTERVAL_MS,
                       transaction_check_max=CHECK_MAX) as rs:
        yield rs
    r = cli("check", "--config", rs.config_path)      # halves, ops, commits: consistent
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr



def configuration(store) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{store.grpc_port}", Credentials(AK, SK))


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.keys = body.decode()
    return m


class Checker(TransactionChecker):
    """Answers a check with the next of ``answers[body]`` (its last answer ever after;
    COMMIT for a body not named) and records every body asked about."""

    def __init__(self, answers: dict[bytes, list] | None = None):
        self.answers = answers or {}
        self.asked: list[bytes] = []
        self._lock = threading.Lock()

    def check(self, message) -> TransactionResolution:
        with self._lock:
            self.asked.append(message.body)
            answers = self.answers.get(message.body, [COMMIT])
            return answers.pop(0) if len(answers) > 1 else answers[0]

    def times(self, body: bytes) -> int:
        with self._lock:
            return self.asked.count(body)


def started_producer(store, topic: str, checker: Checker) -> Producer:
    producer = Producer(configuration(store), (topic,), checker)
    producer.startup()
    return producer


def send_half(producer: Producer, topic: str, body: bytes):
    transaction = producer.begin_transaction()
    return transaction, producer.send(message(topic, body), transaction)


def own_reads(store, topic: str, group: str, want, timeout: float = 30) -> list:
    """Every message of ``topic`` rocketstore's own Consumer reads (duplicates kept),
    until ``want(read)`` holds and a poll after it finds nothing more."""
    read: list = []
    with Consumer(store.store_dir, group, topic, wait_for_topic=True) as c:
        deadline = time.monotonic() + timeout
        while True:
            got = c.poll(64, timeout_ms=300)
            read += got
            if not got and want(read):
                return read
            assert time.monotonic() < deadline, f"timed out reading {topic}: {read}"


def bodies(messages) -> list[bytes]:
    return sorted(m.body for m in messages)


class Popper:
    def __init__(self, store, group: str, topic: str):
        self.consumer = SimpleConsumer(configuration(store), group,
                                       {topic: FilterExpression()}, await_duration=2)
        self.consumer.startup()

    def until(self, want, what: str, timeout: float = 30) -> list:
        got = []
        deadline = time.monotonic() + timeout
        while not want(got):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {got}"
            got += self.consumer.receive(32, INVISIBLE_S)
        return got

    def close(self) -> None:
        self.consumer.shutdown()


def raw_stub(store):
    channel = grpc.insecure_channel(f"127.0.0.1:{store.grpc_port}")
    return service_pb2_grpc.MessagingServiceStub(channel), \
        Signature.metadata(configuration(store), "tx-raw")


def end_request(topic: str, message_id: str, transaction_id: str, resolution=COMMIT):
    return rpc.EndTransactionRequest(topic=pb.Resource(name=topic), message_id=message_id,
                                     transaction_id=transaction_id, resolution=resolution,
                                     source=pb.TransactionSource.SOURCE_CLIENT)


# ---------------------------------------------------------------------------- commit
def test_a_committed_transaction_is_consumed_once_and_its_half_is_rocketmqs(store):
    topic = "TxCommit"
    producer = started_producer(store, topic, Checker({b"paid": [UNKNOWN]}))   # ours to end
    popper = Popper(store, "tx-commit-group", topic)
    try:
        transaction, receipt = send_half(producer, topic, b"paid")
        (half,) = [m for m in own_reads(store, TRANS_HALF_TOPIC, "tx-half-readers",
                                        lambda r: any(m.uniq_key == receipt.message_id
                                                      for m in r))
                   if m.uniq_key == receipt.message_id]
        assert half.queue_id == 0 and transaction_value(half.sys_flag) == TRANSACTION_NOT_TYPE
        assert half.properties["REAL_TOPIC"] == topic and half.properties["TRAN_MSG"] == "true"
        assert receipt.transaction_id == half.msg_id          # names the half where it lies
        assert popper.consumer.receive(32, INVISIBLE_S) == []          # unseen until the end

        transaction.commit()
        (got,) = popper.until(lambda got: got, "the committed message")
        assert got.body == b"paid" and got.message_id == receipt.message_id
        popper.consumer.ack(got)
        assert popper.consumer.receive(32, INVISIBLE_S) == []

        (committed,) = own_reads(store, topic, "tx-commit-readers", lambda r: r)
        assert transaction_value(committed.sys_flag) == TRANSACTION_COMMIT_TYPE
        assert committed.prepared_transaction_offset == half.commit_log_offset
        assert committed.queue_id == int(half.properties["REAL_QID"])
        assert committed.keys == ["paid"] and committed.uniq_key == receipt.message_id
        assert not {"REAL_TOPIC", "REAL_QID", "TRAN_MSG"} & set(committed.properties)
        ops = own_reads(store, TRANS_OP_HALF_TOPIC, "tx-op-readers",
                        lambda r: any(m.body == str(half.queue_offset).encode() for m in r))
        assert {m.tags for m in ops} == {"d"}
    finally:
        popper.close()
        producer.shutdown()


def test_a_rolled_back_transaction_is_never_consumed_nor_checked(store):
    """The rolled-back half stays where it is: a check pass goes past it (it asks
    about an open transaction sent after it) and asks nothing of it."""
    topic = "TxRollback"
    checker = Checker({b"open": [ROLLBACK]})
    producer = started_producer(store, topic, checker)
    try:
        transaction, _ = send_half(producer, topic, b"cancelled")
        transaction.rollback()
        send_half(producer, topic, b"open")                   # left to the check
        wait_for(lambda: checker.times(b"open") >= 1, timeout=30,
                 what="the check of the open transaction")
        assert checker.times(b"cancelled") == 0
        popper = Popper(store, "tx-rollback-group", topic)
        try:
            assert popper.consumer.receive(32, INVISIBLE_S) == []
        finally:
            popper.close()
        with Consumer(store.store_dir, "tx-rollback-readers", TRANS_HALF_TOPIC) as c:
            assert c.poll(64, timeout_ms=300)             # the halves are there ...
        assert not os.path.isdir(os.path.join(store.store_dir, "consumequeue", topic))
    finally:
        producer.shutdown()


# ---------------------------------------------------------------------------- check
def test_an_open_transaction_is_checked_until_the_checker_knows_and_its_answer_applied(store):
    topic = "TxChecked"
    checker = Checker({b"late": [UNKNOWN, COMMIT]})
    producer = started_producer(store, topic, checker)
    popper = Popper(store, "tx-checked-group", topic)
    try:
        send_half(producer, topic, b"late")
        (got,) = popper.until(lambda got: got, "the message the second check commits")
        assert got.body == b"late" and checker.times(b"late") == 2
        popper.consumer.ack(got)
        assert popper.consumer.receive(32, INVISIBLE_S) == []
        assert checker.times(b"late") == 2                   # ended: asked no more
    finally:
        popper.close()
        producer.shutdown()


def test_a_transaction_never_known_is_discarded_after_the_last_check(store):
    topic = "TxDiscarded"
    checker = Checker({b"never": [UNKNOWN], b"later": [ROLLBACK]})
    producer = started_producer(store, topic, checker)
    try:
        send_half(producer, topic, b"never")
        (kept,) = own_reads(store, TRANS_CHECK_MAX_TIME_TOPIC, "tx-discard-readers",
                            lambda r: r, timeout=60)
        assert kept.body == b"never" and kept.properties["REAL_TOPIC"] == topic
        assert kept.properties["TRANSACTION_CHECK_TIMES"] == str(CHECK_MAX)
        send_half(producer, topic, b"later")               # a pass after the discard
        wait_for(lambda: checker.times(b"later") >= 1, timeout=30, what="a later check")
        assert checker.times(b"never") == CHECK_MAX
    finally:
        producer.shutdown()


def test_a_late_commit_of_the_first_half_ends_the_copy_a_check_put_back(store):
    """A check puts a copy of the half at the end of the half queue before asking; the
    producer's own commit, naming the first half, ends the copy too: it is asked about
    no more (one check in flight at the commit aside) and committed once."""
    topic = "TxLate"
    checker = Checker({b"slow": [UNKNOWN]})
    producer = started_producer(store, topic, checker)
    try:
        transaction, _ = send_half(producer, topic, b"slow")
        wait_for(lambda: checker.times(b"slow") >= 1, timeout=30, what="the first check")
        transaction.commit()
        asked = checker.times(b"slow")
        send_half(producer, topic, b"sentinel")            # a pass well after the commit
        wait_for(lambda: checker.times(b"sentinel") >= 1, timeout=30, what="a later pass")
        assert checker.times(b"slow") <= asked + 1
        assert bodies(own_reads(store, topic, "tx-late-readers", lambda r: len(r) >= 2)) == \
            [b"sentinel", b"slow"]
    finally:
        producer.shutdown()


# ---------------------------------------------------------------------------- refusals
def test_ends_naming_no_open_transaction_are_refused_and_change_nothing(store):
    topic = "TxRefused"
    producer = started_producer(store, topic, Checker({b"once": [UNKNOWN],
                                                       b"open": [UNKNOWN]}))
    try:
        transaction, receipt = send_half(producer, topic, b"once")
        transaction.commit()
        own_reads(store, topic, "tx-refused-readers", lambda r: r)
        stub, meta = raw_stub(store)
        host, phy = decode_message_id(receipt.transaction_id)
        written = store.slot(Slot.WRITTEN)
        for transaction_id, why in [
                ("", "blank"), ("not-an-id", "not an offset msgId"),
                (receipt.transaction_id, "committed already"),
                (create_message_id(host, phy + 1), "no record starts there"),
                (create_message_id(host, written + 4096), "past the end"),
                (create_message_id(host, 1 << 40), "far past the end")]:
            r = stub.EndTransaction(end_request(topic, receipt.message_id, transaction_id),
                                    metadata=meta, timeout=5)
            assert r.status.code == pb.Code.INVALID_TRANSACTION_ID, (why, r.status)
            assert r.status.message, why
        open_, open_receipt = send_half(producer, topic, b"open")
        written = store.slot(Slot.WRITTEN)
        for request, why in [
                (end_request("TxOther", open_receipt.message_id, open_receipt.transaction_id),
                 "another topic"),
                (end_request(topic, receipt.message_id, open_receipt.transaction_id),
                 "another message")]:
            r = stub.EndTransaction(request, metadata=meta, timeout=5)
            assert r.status.code == pb.Code.INVALID_TRANSACTION_ID, (why, r.status)
        assert store.slot(Slot.WRITTEN) == written                  # nothing stored
        open_.rollback()                                           # still open: it ends
    finally:
        producer.shutdown()


def test_an_end_the_writer_did_not_answer_is_never_applied_twice(store):
    """The writer is stopped (SIGSTOP) while a commit waits for it: the commit answers
    PROXY_TIMEOUT, its outcome unknown. Sent again once the writer goes on, it is taken
    or refused as the op records then say: the message is in its topic once."""
    topic = "TxStalled"
    producer = started_producer(store, topic, Checker({b"stalled": [UNKNOWN]}))
    try:
        _, receipt = send_half(producer, topic, b"stalled")
        stub, meta = raw_stub(store)
        request = end_request(topic, receipt.message_id, receipt.transaction_id)
        writer = store.child_pid("writer")
        os.kill(writer, signal.SIGSTOP)
        try:
            r = stub.EndTransaction(request, metadata=meta, timeout=10)
        finally:
            os.kill(writer, signal.SIGCONT)
        assert r.status.code == pb.Code.PROXY_TIMEOUT, r.status
        again = stub.EndTransaction(request, metadata=meta, timeout=15)
        assert again.status.code in (pb.Code.OK, pb.Code.INVALID_TRANSACTION_ID), again.status
        assert bodies(own_reads(store, topic, "tx-stalled-readers", lambda r: r)) == \
            [b"stalled"]
    finally:
        producer.shutdown()


# ---------------------------------------------------------------------------- restart
def test_sigkill_of_the_proxy_between_half_and_end_loses_and_doubles_nothing(store):
    topic = "TxKill"
    checker = Checker({b"ended-after": [UNKNOWN]})         # the producer ends that one
    producer = started_producer(store, topic, checker)
    try:
        ended = []
        for i in range(3):
            transaction, _ = send_half(producer, topic, b"before-%d" % i)
            transaction.commit()
            ended.append(b"before-%d" % i)
        _, by_client = send_half(producer, topic, b"ended-after")
        for i in range(3):
            send_half(producer, topic, b"checked-%d" % i)
        restarts = store.restarts("proxy")
        os.kill(store.child_pid("proxy"), signal.SIGKILL)
        wait_for(lambda: store.restarts("proxy") > restarts and serving(store.grpc_port),
                 timeout=60, what="the proxy to be restarted")

        stub, meta = raw_stub(store)
        r = stub.EndTransaction(end_request(topic, by_client.message_id,
                                            by_client.transaction_id),
                                metadata=meta, timeout=10, wait_for_ready=True)
        assert r.status.code == pb.Code.OK, r.status        # the restarted proxy finds it
        after = Checker({b"ended-after": [UNKNOWN]})
        again = started_producer(store, topic, after)       # the checks go to it
        try:
            want = sorted(ended + [b"ended-after"] + [b"checked-%d" % i for i in range(3)])
            read = own_reads(store, topic, "tx-kill-readers",
                             lambda r: set(bodies(r)) >= set(want), timeout=60)
            assert bodies(read) == want                     # each once
            assert not {b for b in ended + [b"ended-after"]} & set(after.asked)
            send_half(again, topic, b"sentinel")           # a pass after every check
            wait_for(lambda: after.times(b"sentinel") >= 1, timeout=30, what="a later pass")
            assert bodies(own_reads(store, topic, "tx-kill-readers-2",
                                    lambda r: len(r) >= len(want) + 1)) == \
                sorted(want + [b"sentinel"])
        finally:
            again.shutdown()
    finally:
        producer.shutdown()
