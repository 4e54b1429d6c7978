"""procs.grpc_convert: RocketMQ 5's gRPC messages as the store's, the FIFO queue
choice as RocketMQ's proxy makes it, the store's statuses as the proxy's codes."""

from __future__ import annotations

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from rocketstore.procs.grpc_convert import (
    Refused, consistent_hash, fifo_queue, java_string_hash, put_status, store_message)
from rocketstore.storage.delay_level import parse_delay_levels
from rocketstore.storage.message import TRANSACTION_PREPARED_TYPE
from rocketstore.storage.status import PutMessageStatus

LEVELS = parse_delay_levels("1s 5s 10s")
NOW_MS = 1_700_000_000_000


def test_consistent_hash_is_guavas():
    """Guava's own golden values (HashingTest)."""
    assert [consistent_hash(i, 100) for i in range(20)] == [
        0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
    assert consistent_hash(10863919174838991, 11) == 6
    assert consistent_hash(2016238256797177309, 11) == 3
    assert consistent_hash(1673758223894951030, 11) == 5
    assert [consistent_hash(k, 100001) for k in (2, 2201, 2202)] == [80343, 22152, 15018]


def test_java_string_hash_is_javas():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("order-1") == -1207111310          # negative: sign-extended
    assert java_string_hash("\U0001F600") == (0xD83D * 31 + 0xDE00)   # UTF-16 units


def grpc_message(**system) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="Orders"), body=b"body",
                   user_properties={"region": "eu"})
    m.system_properties.message_id = "01" + "a" * 32
    for k, v in system.items():
        if k == "delivery_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(v)
        elif k == "keys":
            m.system_properties.keys.extend(v)
        else:
            setattr(m.system_properties, k, v)
    return m


def test_a_message_gets_the_proxys_properties():
    msg = store_message(grpc_message(tag="created", keys=["k1", "k2"]), 1024, LEVELS, NOW_MS, 8)
    assert (msg.topic, msg.body, msg.tags, msg.keys) == ("Orders", b"body", "created",
                                                         ["k1", "k2"])
    assert msg.properties == {"region": "eu", "UNIQ_KEY": "01" + "a" * 32, "PGROUP": "Orders"}
    assert msg.queue_id is None and msg.delay_level == 0


def test_a_fifo_message_goes_to_its_groups_queue():
    msg = store_message(grpc_message(message_group="order-1"), 1024, LEVELS, NOW_MS, 8)
    assert msg.queue_id == fifo_queue("order-1", 8) == consistent_hash(-1207111310, 8)
    assert msg.properties["__SHARDINGKEY"] == "order-1"


@pytest.mark.parametrize("wait_ms, level", [(-5, 0), (0, 0), (1, 1), (1000, 1), (1001, 2),
                                            (10_000, 3)])
def test_a_delivery_time_takes_the_level_that_reaches_it(wait_ms, level):
    msg = store_message(grpc_message(delivery_ms=NOW_MS + wait_ms), 1024, LEVELS, NOW_MS, 8)
    assert msg.delay_level == level


@pytest.mark.parametrize("system, body, code", [
    ({}, b"", pb.Code.MESSAGE_BODY_EMPTY),
    ({}, b"x" * 1025, pb.Code.MESSAGE_BODY_TOO_LARGE),
    ({"message_id": " "}, b"b", pb.Code.ILLEGAL_MESSAGE_ID),
    ({"tag": "a|b"}, b"b", pb.Code.ILLEGAL_MESSAGE_TAG),
    ({"keys": [" "]}, b"b", pb.Code.ILLEGAL_MESSAGE_KEY),
    ({"message_group": "g" * 64}, b"b", pb.Code.ILLEGAL_MESSAGE_GROUP),
    ({"delivery_ms": NOW_MS + 10_001}, b"b", pb.Code.ILLEGAL_DELIVERY_TIME),
    ({"delivery_ms": NOW_MS + 86_400_001}, b"b", pb.Code.ILLEGAL_DELIVERY_TIME),
    ({"message_group": "g", "delivery_ms": NOW_MS + 1}, b"b",
     pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ({"message_type": pb.MessageType.TRANSACTION, "message_group": "g"}, b"b",
     pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ({"message_type": pb.MessageType.TRANSACTION, "delivery_ms": NOW_MS + 1}, b"b",
     pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
])
def test_a_message_the_proxy_refuses_is_refused_with_its_code(system, body, code):
    m = grpc_message(**system)
    m.body = body
    with pytest.raises(Refused) as e:
        store_message(m, 1024, LEVELS, NOW_MS, 8)
    assert e.value.code == code


def test_a_transaction_message_is_prepared_with_its_immunity():
    m = grpc_message(message_type=pb.MessageType.TRANSACTION)
    m.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    msg = store_message(m, 1024, LEVELS, NOW_MS, 8)
    assert msg.sys_flag == TRANSACTION_PREPARED_TYPE
    assert msg.properties["TRAN_MSG"] == "true"
    assert msg.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "30"


def test_a_system_property_name_is_no_user_property():
    m = grpc_message()
    m.user_properties["UNIQ_KEY"] = "mine"
    with pytest.raises(Refused) as e:
        store_message(m, 1024, LEVELS, NOW_MS, 8)
    assert e.value.code == pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY


@pytest.mark.parametrize("status, code", [
    (PutMessageStatus.PUT_OK, pb.Code.OK),
    (PutMessageStatus.FLUSH_DISK_TIMEOUT, pb.Code.MASTER_PERSISTENCE_TIMEOUT),
    (PutMessageStatus.FLUSH_SLAVE_TIMEOUT, pb.Code.SLAVE_PERSISTENCE_TIMEOUT),
    (PutMessageStatus.SLAVE_NOT_AVAILABLE, pb.Code.HA_NOT_AVAILABLE),
    (PutMessageStatus.OS_PAGECACHE_BUSY, pb.Code.TOO_MANY_REQUESTS),
    (PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, pb.Code.MESSAGE_PROPERTIES_TOO_LARGE),
    (PutMessageStatus.SERVICE_NOT_AVAILABLE, pb.Code.INTERNAL_SERVER_ERROR),
    (PutMessageStatus.MESSAGE_ILLEGAL, pb.Code.INTERNAL_SERVER_ERROR),
])
def test_store_statuses_are_the_proxys_codes(status, code):
    s = put_status(status, "why")
    assert s.code == code
    assert s.message == ("OK" if code == pb.Code.OK else f"{status.name}: why")
