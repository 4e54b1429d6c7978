"""Transactional messages as RocketMQ's broker stores them (TransactionalMessageBridge,
TransactionalMessageUtil, EndTransactionProcessor): the half message, the message a
commit writes, the op record that ends a half, and the copy a check puts back. Pure:
builders of ``Message`` values and the transaction id's codec; the proxy puts them
(``procs.transaction_service``).

    record              topic / queue                  what it holds
    ------------------  -----------------------------  ------------------------------------
    half message        RMQ_SYS_TRANS_HALF_TOPIC / 0   the sent message: body, tags, keys,
                                                       properties, with REAL_TOPIC, REAL_QID,
                                                       TRAN_MSG=true, PGROUP and
                                                       __transactionId__ (= UNIQ_KEY); the
                                                       PREPARED sysFlag the send carries is
                                                       reset to NOT, as the bridge does, so
                                                       the half takes a unit of the half
                                                       topic's queue (and of no other)
    put-back half       RMQ_SYS_TRANS_HALF_TOPIC / 0   a half copied to the end of the
                                                       queue when it is checked (or still
                                                       immune): TRANSACTION_CHECK_TIMES =
                                                       checks so far, TRAN_PREPARED_QUEUE_
                                                       OFFSET = the queue offset of the
                                                       transaction's first half
    op record           RMQ_SYS_TRANS_OP_HALF_TOPIC /  tag "d" (REMOVE_TAG), body = the
                        0                              queue offset of the transaction's
                                                       first half, decimal ASCII: the
                                                       transaction is ended, never checked
                                                       again
    committed message   REAL_TOPIC / REAL_QID          the half's body, flag, born time and
                                                       host, tags, keys and properties less
                                                       REAL_TOPIC, REAL_QID and TRAN_MSG;
                                                       sysFlag COMMIT, preparedTransaction-
                                                       Offset = the half's CommitLog offset

A transaction is named by the queue offset of its first half (``transaction_key``): an
op record names it, and every put-back copy carries it, so ending any copy of it ends
them all and a second end is refused. RocketMQ names the copy's own offset in the op
and relies on producers answering checks alike; naming the first half keeps a late
commit of the original from committing a checked copy again.

The transaction id a SendMessage receipt carries, and a check sends, is the offset msgId
of the half (copy) it names (``create_message_id``: store host and CommitLog offset, 32
or 56 hex characters), so EndTransaction reads the half where it lies, as RocketMQ's
EndTransactionProcessor reads it at the commitLogOffset its request carries.
"""

from __future__ import annotations

from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_PRODUCER_GROUP, PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQUENCE, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK, TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE, Message, StoredMessageFields,
    decode_message_id)

TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"           # TopicValidator's
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRANS_CONSUMER_GROUP = "CID_RMQ_SYS_TRANS"              # the check's progress, as offsets
HALF_QUEUE_ID = 0
REMOVE_TAG = "d"                                        # TransactionalMessageUtil's
OFFSET_SEPARATOR = ","
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"              # MessageConst's
PROPERTY_TRANSACTION_ID = "__transactionId__"           # TransactionalMessageUtil's
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
# set on a copy by the store, never by a sender
_HALF_ONLY = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED)
# properties Message carries in fields of its own, or that the writer sets
_IN_FIELDS = {PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_WAIT_STORE_MSG_OK,
              PROPERTY_DELAY_TIME_LEVEL, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE}


class InvalidTransactionId(ValueError):
    """A transaction id that names no half message of this store."""


def half_message(m: Message, real_queue_id: int) -> Message:
    """``parseHalfMessageInner``: ``m`` (as sent to its topic) stored as a half message
    of queue ``real_queue_id`` (module table)."""
    properties = dict(m.properties)
    uniq = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uniq:
        properties[PROPERTY_TRANSACTION_ID] = uniq
    properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    properties[PROPERTY_REAL_TOPIC] = m.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    properties.setdefault(PROPERTY_PRODUCER_GROUP, m.topic)
    return Message(topic=TRANS_HALF_TOPIC, body=m.body, tags=m.tags, keys=m.keys,
                   properties=properties, queue_id=HALF_QUEUE_ID, flag=m.flag,
                   sys_flag=_with_transaction_type(m.sys_flag, TRANSACTION_NOT_TYPE),
                   born_timestamp=m.born_timestamp, born_host=m.born_host)


def is_half(m: StoredMessageFields) -> bool:
    """A stored record is a half message (of the half topic, naming its real topic)."""
    return m.topic == TRANS_HALF_TOPIC and bool(m.properties.get(PROPERTY_REAL_TOPIC)) and \
        _real_queue_id(m) is not None


def committed_message(half: StoredMessageFields) -> Message:
    """``endMessageTransaction`` with the COMMIT type: the message a commit of ``half``
    writes to its real topic and queue."""
    properties = _carried(half)
    for name in _HALF_ONLY:
        properties.pop(name, None)
    return Message(topic=half.properties[PROPERTY_REAL_TOPIC], body=half.body, tags=half.tags,
                   keys=half.keys or None, properties=properties,
                   queue_id=_real_queue_id(half), flag=half.flag,
                   sys_flag=_with_transaction_type(half.sys_flag, TRANSACTION_COMMIT_TYPE),
                   born_timestamp=half.born_timestamp, born_host=half.born_host,
                   reconsume_times=half.reconsume_times,
                   prepared_transaction_offset=half.commit_log_offset)


def op_message(key: int) -> Message:
    """The op record that ends transaction ``key`` (``addRemoveTagInTransactionOp``)."""
    return Message(topic=TRANS_OP_HALF_TOPIC, body=str(key).encode("ascii"), tags=REMOVE_TAG,
                   queue_id=HALF_QUEUE_ID)


def op_keys(op: StoredMessageFields) -> list[int]:
    """The transactions an op record ends (RocketMQ 5 may batch several, comma-
    separated); none for a record that is no "d" op or not numbers."""
    if op.tags != REMOVE_TAG:
        return []
    try:
        return [int(k) for k in op.body.decode("ascii").split(OFFSET_SEPARATOR) if k.strip()]
    except (UnicodeDecodeError, ValueError):
        return []


def put_back_message(half: StoredMessageFields, check_times: int) -> Message:
    """``renewHalfMessageInner``: a copy of ``half`` for the end of the half queue, with
    ``check_times`` checks made and the transaction's key."""
    properties = _carried(half)
    properties[PROPERTY_TRANSACTION_CHECK_TIMES] = str(check_times)
    properties[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(transaction_key(half))
    return Message(topic=TRANS_HALF_TOPIC, body=half.body, tags=half.tags,
                   keys=half.keys or None, properties=properties, queue_id=HALF_QUEUE_ID,
                   flag=half.flag, sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
                   born_host=half.born_host)


def discarded_message(half: StoredMessageFields) -> Message:
    """A half checked ``transaction_check_max`` times, kept for an operator in
    TRANS_CHECK_MAX_TIME_TOPIC (RocketMQ's ``resolveDiscardMsg``), queue 0."""
    copy = put_back_message(half, check_times(half))
    copy.topic = TRANS_CHECK_MAX_TIME_TOPIC
    return copy


def transaction_key(half: StoredMessageFields) -> int:
    """The queue offset of the transaction's first half (module docstring)."""
    text = half.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
    return int(text) if text.isdigit() else half.queue_offset


def check_times(half: StoredMessageFields) -> int:
    text = half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "")
    return int(text) if text.isdigit() else 0


def immunity_ms(half: StoredMessageFields, transaction_timeout_ms: int) -> int:
    """How long after its birth a half is left alone: CHECK_IMMUNITY_TIME_IN_SECONDS
    when set (RocketMQ's ``getImmunityTime``: never less than the timeout), else
    ``transaction_timeout_ms``."""
    text = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "")
    if not text.isdigit():
        return transaction_timeout_ms
    return max(int(text) * 1000, transaction_timeout_ms)


def transaction_id(half: StoredMessageFields) -> str:
    """The id EndTransaction names ``half`` by: its offset msgId."""
    return half.msg_id


def decode_transaction_id(text: str) -> int:
    """The CommitLog offset a transaction id names. Raises ``InvalidTransactionId``."""
    try:
        _, commit_log_offset = decode_message_id(text)
    except ValueError as e:
        raise InvalidTransactionId(f"transaction id {text[:80]!r} is not one this store "
                                   f"gave (an offset msgId): {e}") from None
    if commit_log_offset < 0:
        raise InvalidTransactionId(f"transaction id {text[:80]!r} names a negative offset")
    return commit_log_offset


def _carried(half: StoredMessageFields) -> dict[str, str]:
    return {k: v for k, v in half.properties.items() if k not in _IN_FIELDS}


def _real_queue_id(half: StoredMessageFields) -> int | None:
    text = half.properties.get(PROPERTY_REAL_QUEUE_ID, "")
    return int(text) if text.isdigit() else None


def _with_transaction_type(sys_flag: int, transaction_type: int) -> int:
    """``MessageSysFlag.resetTransactionValue``."""
    return (sys_flag & ~TRANSACTION_ROLLBACK_TYPE) | transaction_type
