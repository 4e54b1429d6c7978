"""RocketMQ 5's gRPC messages and the store's, both ways, and the store's statuses as
RocketMQ's proxy reports them (``apache.rocketmq.v2``, from the ``grpc`` extra's
``rocketmq-python-client``, whose generated modules are used as they ship).

A sent message becomes a store ``Message`` with the properties RocketMQ's proxy
gives it (SendMessageActivity):

    gRPC field                      broker property        refused with
    ------------------------------  ---------------------  ------------------------------
    system_properties.message_id    UNIQ_KEY               ILLEGAL_MESSAGE_ID (blank)
    system_properties.tag           TAGS                   ILLEGAL_MESSAGE_TAG (blank, |)
    system_properties.keys          KEYS (space-joined)    ILLEGAL_MESSAGE_KEY (blank)
    user_properties                 as they are            ILLEGAL_MESSAGE_PROPERTY_KEY
                                                           (a system property's name)
    system_properties.message_group __SHARDINGKEY, and the ILLEGAL_MESSAGE_GROUP (64
                                    queue: Guava's         bytes or more)
                                    consistentHash of its
                                    Java hashCode over the
                                    topic's queues (a FIFO
                                    message)
    system_properties.              the delay level whose  ILLEGAL_DELIVERY_TIME (more
      delivery_timestamp            delay is the shortest  than a day ahead, or past the
                                    that reaches it (a     longest level); none when due
                                    DELAY message)         already
    system_properties.message_type  TRAN_MSG=true and the  MESSAGE_PROPERTY_CONFLICT_WITH_
      TRANSACTION                   PREPARED sysFlag (a    TYPE (with a message group or
                                    half message, stored   a delivery time)
                                    by procs.transaction_
                                    service)
    system_properties.orphaned_     CHECK_IMMUNITY_TIME_IN_
      transaction_recovery_duration SECONDS (whole seconds)
    (always)                        PGROUP = the topic
    body                                                   MESSAGE_BODY_EMPTY,
                                                           MESSAGE_BODY_TOO_LARGE
    a message group and a delivery time, or either with    MESSAGE_PROPERTY_CONFLICT_WITH_
    TRANSACTION                                            TYPE (topics take NORMAL, FIFO,
                                                           DELAY and TRANSACTION, one at
                                                           a time)

A delayed message waits in the store's delay levels (``message_delay_level``, the
scheduler delivers it): RocketMQ 5 delivers at the very time asked, here it goes out at
the first level's end at or after it (asked for 3 s ahead, it waits the 5 s level),
never before.

A stored message goes out as RocketMQ's GrpcConverter builds one: ``message_id`` is
UNIQ_KEY (the offset msgId for a message sent without one, by rocketstore's own
Producer), the body's MD5 in upper-case hex, ``body_encoding`` IDENTITY (the Python
client fails a message without one), and the receipt handle, attempt and invisible
duration of the pop that hands it out. A half message a check asks about goes out
the same way (``checked_message``), under its real topic, TRANSACTION, without a receipt
handle.

Store put status -> Code (RocketMQ's SendMessageProcessor and the proxy's
ResponseBuilder):

    PUT_OK                    OK
    FLUSH_DISK_TIMEOUT        MASTER_PERSISTENCE_TIMEOUT
    FLUSH_SLAVE_TIMEOUT       SLAVE_PERSISTENCE_TIMEOUT
    SLAVE_NOT_AVAILABLE       HA_NOT_AVAILABLE
    OS_PAGECACHE_BUSY         TOO_MANY_REQUESTS (the client backs off)
    PROPERTIES_SIZE_EXCEEDED  MESSAGE_PROPERTIES_TOO_LARGE
    anything else             INTERNAL_SERVER_ERROR, the store's status and reason in the
                              message (SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, ...)
"""

from __future__ import annotations

import hashlib

from rocketmq.grpc_protocol import definition_pb2 as pb

from rocketstore.storage.delay_level import level_waiting_at_least
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_PRODUCER_GROUP, PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQUENCE, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK,
    TRANSACTION_PREPARED_TYPE, Message)
from rocketstore.storage.message_view import MessageView
from rocketstore.storage.pop_state import InFlight, ReceiptHandle
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.transactional_message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
from rocketstore.storage.validation import check_topic

Code = pb.Code

PUT_STATUS_CODES = {
    PutMessageStatus.PUT_OK: Code.OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    PutMessageStatus.OS_PAGECACHE_BUSY: Code.TOO_MANY_REQUESTS,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
}
# user properties may not take a name the broker gives meaning to (MessageConst's)
SYSTEM_PROPERTIES = frozenset({
    PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_PRODUCER_GROUP, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE,
    "__SHARDINGKEY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TRAN_MSG", "__STARTDELIVERTIME",
    "RECONSUME_TIME", "MAX_OFFSET", "MIN_OFFSET", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC",
    "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID", "CORRELATION_ID",
    "MSG_REGION", "TRACE_ON", "BORN_TIMESTAMP", "__BORNHOST", "CLUSTER", "POP_CK",
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, PROPERTY_TRANSACTION_ID,
})
MAX_PROPERTIES_BYTES = 16 * 1024    # the proxy's maxUserPropertySize
MAX_DELAY_MS = 24 * 3600 * 1000     # the proxy's maxDelayTimeMills


class Refused(Exception):
    """A request answered with ``code`` and ``text`` instead of being served."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code
        self.text = text


def status(code: int, text: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=text)


def put_status(result_status: PutMessageStatus, reason: str) -> pb.Status:
    """The store's put status as RocketMQ's proxy reports it (module table)."""
    code = PUT_STATUS_CODES.get(result_status, Code.INTERNAL_SERVER_ERROR)
    text = result_status.name + (f": {reason}" if reason else "")
    return status(code, "OK" if code == Code.OK else text)


def store_message(m: pb.Message, max_message_size: int, delay_levels: list[int],
                  now_ms: int, queue_nums: int) -> Message:
    """The store ``Message`` a sent gRPC message becomes (``delay_levels``:
    ``storage.delay_level.parse_delay_levels``; ``queue_nums``: the topic's queues).
    Raises ``Refused``."""
    topic = m.topic.name
    why = check_topic(topic)
    if why:
        raise Refused(Code.ILLEGAL_TOPIC, why)
    sp = m.system_properties
    if not m.body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(m.body) > max_message_size:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE, f"the body is {len(m.body)} bytes, over "
                      f"max_message_size {max_message_size}")
    _refuse_other_types(sp)
    if not sp.message_id.strip():
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "the message id is blank")
    if sp.HasField("tag") and (not sp.tag.strip() or "|" in sp.tag):
        raise Refused(Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is blank or holds '|'")
    if any(not k.strip() for k in sp.keys):
        raise Refused(Code.ILLEGAL_MESSAGE_KEY, "a message key is blank")
    properties = _user_properties(m)
    properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    properties[PROPERTY_PRODUCER_GROUP] = topic
    queue_id = None                 # the store's round robin
    if sp.message_group:
        if len(sp.message_group.encode()) >= MAX_MESSAGE_GROUP_BYTES:
            raise Refused(Code.ILLEGAL_MESSAGE_GROUP, f"message group {sp.message_group!r} "
                          f"is {MAX_MESSAGE_GROUP_BYTES} bytes or longer")
        properties[PROPERTY_SHARDING_KEY] = sp.message_group
        queue_id = fifo_queue(sp.message_group, queue_nums)
    sys_flag = 0
    if sp.message_type == pb.MessageType.TRANSACTION:
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        sys_flag = TRANSACTION_PREPARED_TYPE
        if sp.HasField("orphaned_transaction_recovery_duration"):
            properties[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(
                0, sp.orphaned_transaction_recovery_duration.seconds))
    born_ms = (sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000
               if sp.HasField("born_timestamp") else None)
    return Message(topic=topic, body=m.body, tags=sp.tag if sp.HasField("tag") else None,
                   keys=list(sp.keys) or None, properties=properties,
                   born_timestamp=born_ms, delay_level=_delay_level(sp, delay_levels, now_ms),
                   queue_id=queue_id, sys_flag=sys_flag)


def _delay_level(sp: pb.SystemProperties, delay_levels: list[int], now_ms: int) -> int:
    """The delay level a DELAY message waits in (module docstring); 0 for none."""
    if not sp.HasField("delivery_timestamp"):
        return 0
    wait_ms = sp.delivery_timestamp.ToMilliseconds() - now_ms
    if wait_ms <= 0:
        return 0
    if wait_ms > MAX_DELAY_MS:
        raise Refused(Code.ILLEGAL_DELIVERY_TIME, f"the delivery time is {wait_ms} ms ahead, "
                      f"over a day ({MAX_DELAY_MS} ms)")
    level = level_waiting_at_least(wait_ms, delay_levels)
    if level is None:
        raise Refused(Code.ILLEGAL_DELIVERY_TIME, f"the delivery time is {wait_ms} ms ahead, "
                      f"past the store's longest delay level ({max(delay_levels)} ms, "
                      "message_delay_level)")
    return level


ACCEPTED_TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO,   # every topic's
                  pb.MessageType.DELAY, pb.MessageType.TRANSACTION)
MAX_MESSAGE_GROUP_BYTES = 64        # the proxy's maxMessageGroupSize
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"


def _refuse_other_types(sp: pb.SystemProperties) -> None:
    """The topics served take NORMAL, FIFO, DELAY and TRANSACTION messages (QueryRoute
    says so), one type at a time: a message of two (a message group, a delivery time, a
    half message) is refused as the proxy refuses a type the topic does not accept."""
    kinds = (bool(sp.message_group) + sp.HasField("delivery_timestamp")
             + (sp.message_type == pb.MessageType.TRANSACTION))
    if kinds > 1 or sp.message_type not in (pb.MessageType.MESSAGE_TYPE_UNSPECIFIED,
                                            *ACCEPTED_TYPES):
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                      "this store's topics take NORMAL, FIFO, DELAY and TRANSACTION "
                      "messages, one at a time (a message group, a delivery time and a "
                      "transaction not together)")


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), a signed 32-bit int."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: the bucket of ``key`` in
    ``0..buckets-1`` (its linear congruential generator, step for step)."""
    state = key & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        following = int((candidate + 1) / (((state >> 33) + 1) / 2.0 ** 31))
        if not 0 <= following < buckets:
            return candidate
        candidate = following


def fifo_queue(message_group: str, queue_nums: int) -> int:
    """The queue of a message group, as RocketMQ's proxy picks it
    (``Hashing.consistentHash(shardingKey.hashCode(), writeQueues.size())``)."""
    return consistent_hash(java_string_hash(message_group), queue_nums)


def _user_properties(m: pb.Message) -> dict[str, str]:
    properties = dict(m.user_properties)
    reserved = sorted(SYSTEM_PROPERTIES.intersection(properties))
    if reserved:
        raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                      f"user properties may not be named {', '.join(reserved)}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in properties.items())
    if size > MAX_PROPERTIES_BYTES:
        raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                      f"user properties take {size} bytes, over {MAX_PROPERTIES_BYTES}")
    return properties


def delivered_message(view: MessageView, handle: ReceiptHandle, entry: InFlight) -> pb.Message:
    """A stored message as ReceiveMessage hands it out (module docstring)."""
    props = view.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    body = view.body
    sp = pb.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or view.msg_id,
        keys=view.keys,
        body_digest=pb.Digest(type=pb.DigestType.MD5,
                              checksum=hashlib.md5(body).hexdigest().upper()),
        body_encoding=pb.Encoding.IDENTITY, message_type=pb.MessageType.NORMAL,
        born_host=view.born_host[0], store_host=f"{view.store_host[0]}:{view.store_host[1]}",
        receipt_handle=handle.encode(), queue_id=view.queue_id,
        queue_offset=view.queue_offset, delivery_attempt=entry.attempt)
    if view.tags is not None:
        sp.tag = view.tags
    if props.get(PROPERTY_SHARDING_KEY):
        sp.message_group = props[PROPERTY_SHARDING_KEY]
        sp.message_type = pb.MessageType.FIFO
    sp.born_timestamp.FromMilliseconds(view.born_timestamp)
    sp.store_timestamp.FromMilliseconds(view.store_timestamp)
    sp.invisible_duration.FromMilliseconds(handle.invisible_ms)
    return pb.Message(topic=pb.Resource(name=view.topic), user_properties=user,
                      system_properties=sp, body=body)


def checked_message(half: MessageView) -> pb.Message:
    """A half message as a RecoverOrphanedTransactionCommand carries it: under its real
    topic, TRANSACTION, its body, tags, keys and user properties (module docstring)."""
    props = half.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    sp = pb.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or half.msg_id,
        keys=half.keys,
        body_digest=pb.Digest(type=pb.DigestType.MD5,
                              checksum=hashlib.md5(half.body).hexdigest().upper()),
        body_encoding=pb.Encoding.IDENTITY, message_type=pb.MessageType.TRANSACTION,
        born_host=half.born_host[0],
        store_host=f"{half.store_host[0]}:{half.store_host[1]}")
    if half.tags is not None:
        sp.tag = half.tags
    sp.born_timestamp.FromMilliseconds(half.born_timestamp)
    sp.store_timestamp.FromMilliseconds(half.store_timestamp)
    return pb.Message(topic=pb.Resource(name=props[PROPERTY_REAL_TOPIC]), user_properties=user,
                      system_properties=sp, body=half.body)
