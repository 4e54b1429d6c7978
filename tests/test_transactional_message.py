"""The records of a transaction (storage.transactional_message), as RocketMQ's broker
lays them out: pure builders, no store."""

from __future__ import annotations

import pytest

from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, Message,
    MessageExt, create_message_id, transaction_value)
from rocketstore.storage.transactional_message import (
    TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, InvalidTransactionId,
    check_times, committed_message, decode_transaction_id, discarded_message, half_message,
    immunity_ms, is_half, op_keys, op_message, put_back_message, transaction_id,
    transaction_key)
from rocketstore.storage.validation import check_topic


def stored(m: Message, queue_offset: int, commit_log_offset: int) -> MessageExt:
    """``m`` as the store hands it back."""
    return MessageExt(store_size=0, magic=0, body_crc=0, queue_id=m.queue_id or 0,
                      flag=m.flag, queue_offset=queue_offset,
                      commit_log_offset=commit_log_offset, sys_flag=m.sys_flag,
                      born_timestamp=m.born_timestamp or 0, born_host=m.born_host,
                      store_timestamp=0, store_host=("10.0.0.1", 10911),
                      reconsume_times=m.reconsume_times,
                      prepared_transaction_offset=m.prepared_transaction_offset, body=m.body,
                      topic=m.topic, properties=m.all_properties())


def sent() -> Message:
    return Message("Orders", b"paid", tags="created", keys=["o-1"], flag=3,
                   properties={"UNIQ_KEY": "01AB", "PGROUP": "Orders", "TRAN_MSG": "true",
                               "region": "eu"},
                   sys_flag=TRANSACTION_PREPARED_TYPE, born_timestamp=1_000)


def test_a_half_keeps_its_real_topic_and_queue_and_takes_a_unit_of_the_half_queue():
    half = half_message(sent(), 5)
    assert (half.topic, half.queue_id, half.tags, half.keys) == (TRANS_HALF_TOPIC, 0,
                                                                 "created", ["o-1"])
    assert half.properties["REAL_TOPIC"] == "Orders" and half.properties["REAL_QID"] == "5"
    assert half.properties["__transactionId__"] == "01AB"
    assert transaction_value(half.sys_flag) == TRANSACTION_NOT_TYPE   # the bridge resets it
    assert is_half(stored(half, 7, 4096))


def test_a_commit_restores_the_real_message_without_the_halfs_properties():
    half = stored(half_message(sent(), 5), 7, 4096)
    real = committed_message(half)
    assert (real.topic, real.queue_id, real.body, real.tags, real.keys, real.flag) == \
        ("Orders", 5, b"paid", "created", ["o-1"], 3)
    assert transaction_value(real.sys_flag) == TRANSACTION_COMMIT_TYPE
    assert real.prepared_transaction_offset == 4096 and real.born_timestamp == 1_000
    assert real.properties == {"UNIQ_KEY": "01AB", "PGROUP": "Orders", "region": "eu",
                               "__transactionId__": "01AB"}


def test_a_put_back_copy_counts_its_checks_and_keeps_the_first_halfs_key():
    first = stored(half_message(sent(), 5), 7, 4096)
    assert transaction_key(first) == 7 and check_times(first) == 0
    copy = stored(put_back_message(first, 1), 12, 8192)
    assert (copy.topic, copy.queue_id) == (TRANS_HALF_TOPIC, 0)
    assert transaction_key(copy) == 7 and check_times(copy) == 1
    again = stored(put_back_message(copy, 2), 20, 9000)
    assert transaction_key(again) == 7 and check_times(again) == 2
    assert committed_message(again).prepared_transaction_offset == 9000
    kept = discarded_message(again)
    assert kept.topic == TRANS_CHECK_MAX_TIME_TOPIC and kept.properties["REAL_TOPIC"] == "Orders"


def test_an_op_record_names_the_transaction_by_its_first_halfs_offset():
    op = op_message(7)
    assert (op.topic, op.queue_id, op.tags, op.body) == (TRANS_OP_HALF_TOPIC, 0, "d", b"7")
    assert op_keys(stored(op, 0, 0)) == [7]
    assert op_keys(stored(Message(TRANS_OP_HALF_TOPIC, b"3,4,", tags="d"), 1, 0)) == [3, 4]
    assert op_keys(stored(Message(TRANS_OP_HALF_TOPIC, b"x", tags="d"), 2, 0)) == []
    assert op_keys(stored(Message(TRANS_OP_HALF_TOPIC, b"3", tags="e"), 3, 0)) == []


def test_immunity_is_the_messages_own_when_longer_than_the_timeout():
    half = stored(half_message(sent(), 0), 0, 0)
    assert immunity_ms(half, 6000) == 6000
    half.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] = "60"
    assert immunity_ms(half, 6000) == 60_000
    half.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] = "1"
    assert immunity_ms(half, 6000) == 6000


def test_a_transaction_id_is_the_halfs_offset_msg_id():
    half = stored(half_message(sent(), 0), 0, 123456)
    assert transaction_id(half) == create_message_id(("10.0.0.1", 10911), 123456)
    assert decode_transaction_id(transaction_id(half)) == 123456


@pytest.mark.parametrize("text", ["", "01AB", "zz" * 16, "0" * 33])
def test_a_malformed_transaction_id_is_refused(text):
    with pytest.raises(InvalidTransactionId):
        decode_transaction_id(text)


def test_only_puts_may_name_the_transaction_topics():
    for topic in (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC):
        assert check_topic(topic, put=True) is None
        assert "reserved" in check_topic(topic)
    assert "reserved" in check_topic("RMQ_SYS_OTHER", put=True)
