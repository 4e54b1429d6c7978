"""Put-time validation: every way a message can be refused before it touches a file.

``check_message`` returns ``None`` for a message the store will take, or a
``(PutMessageStatus, reason)`` pair naming what is wrong. A refused message changes
nothing on disk and costs other producers nothing.

    rule                                                   status
    topic not [A-Za-z0-9_%|-]{1,255}                       MESSAGE_ILLEGAL
    reserved topic (SCHEDULE_TOPIC_XXXX, RMQ_SYS_*) from a
      client                                               MESSAGE_ILLEGAL
    body not bytes                                         MESSAGE_ILLEGAL
    queue id outside 0..default_topic_queue_nums-1         MESSAGE_ILLEGAL
    delay level < 0                                        MESSAGE_ILLEGAL
    a header value outside its Java type's range           MESSAGE_ILLEGAL
    a property, tag or key holding \\x00, \\x01 or \\x02, an empty
      property name or value, a key holding a space        MESSAGE_ILLEGAL
    a property the store sets itself (__PID, __SEQ:
      an idempotent producer's identity)                   MESSAGE_ILLEGAL
    properties over 32767 bytes (UTF-8)                    PROPERTIES_SIZE_EXCEEDED
    record longer than max_message_size, or than a
      CommitLog file can hold                              MESSAGE_ILLEGAL

Empty means none: ``tags=""`` stores no TAGS and ``keys=""`` (or ``[]``) no KEYS, so a
message put with them reads back with ``tags`` None and ``keys`` [], as RocketMQ reads
the ``TAGS\\x01\\x02`` its producer writes for ``setTags("")``. A property with an empty
value is refused instead of stored: RocketMQ's ``string2messageProperties`` (and
``message.read_properties``) drops the pair, so nobody could read it back (RocketMQ's
client refuses it before sending). A value of spaces is stored: it reads back as
written. An empty key (in a list, or between two spaces of a ``keys`` string) is no key:
the index never holds ``topic#`` (RocketMQ's ``buildIndex`` skips empty keys too).

The topic rule is stricter than RocketMQ's length check on purpose: it also keeps a
topic from naming a path outside ``consumequeue/``. Topics of 128-255 bytes are legal
and are stored with the v2 record layout.
"""

from __future__ import annotations

import functools
import ipaddress
import re

from rocketstore.storage.config import StoreConfig
from rocketstore.storage.message import (
    KEY_SEPARATOR, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQUENCE, Message, delay_property_refusal)
from rocketstore.storage.record import END_FILE_MIN_BLANK_LENGTH, MAX_PROPERTIES_LENGTH, SCHEDULE_TOPIC
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.transactional_message import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

TOPIC_PATTERN = re.compile(r"[A-Za-z0-9_%|-]{1,255}")
RESERVED_TOPIC_PREFIXES = ("RMQ_SYS_",)
RESERVED_TOPICS = frozenset({SCHEDULE_TOPIC})
# Reserved topics a put may name all the same: the proxy's half messages and their op
# records (procs.transaction_service), which it puts through the ingest socket as
# RocketMQ's broker puts them itself. Reads and the gRPC endpoint still treat them as
# reserved: no client sends to them or lists them.
PUT_SYSTEM_TOPICS = frozenset({TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC})
# Properties only the writer sets: the identity it stamps on an idempotent producer's
# records. One set by a client would make a restarted writer believe it stored a
# sequence it never did.
RESERVED_PROPERTIES = (PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE)
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)

Refusal = tuple[PutMessageStatus, str]


def check_topic(topic: object, *, internal: bool = False, put: bool = False) -> str | None:
    """The reason ``topic`` cannot be written, or None. ``internal``: any reserved topic
    may be named (reads); ``put``: the PUT_SYSTEM_TOPICS may (the writer's checks)."""
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        return f"topic {topic!r} must match [A-Za-z0-9_%|-]{{1,255}}"
    if put and topic in PUT_SYSTEM_TOPICS:
        return None
    if not internal and (topic in RESERVED_TOPICS or topic.startswith(RESERVED_TOPIC_PREFIXES)):
        return f"topic {topic!r} is reserved for the store"
    return None


def _illegal(reason: str) -> Refusal:
    return PutMessageStatus.MESSAGE_ILLEGAL, reason


_RESERVED_BYTES = re.compile("[\x00\x01\x02\ud800-\udfff]")


def _has_reserved(text: str) -> bool:
    """NUL and the two separators may not stand in a property; nor may a lone
    surrogate, which UTF-8 cannot encode."""
    return _RESERVED_BYTES.search(text) is not None


def _check_ranges(msg: Message) -> str | None:
    for name, (lo, hi) in (("flag", INT32), ("sys_flag", INT32), ("reconsume_times", INT32),
                           ("prepared_transaction_offset", INT64), ("born_timestamp", INT64)):
        value = getattr(msg, name)
        if value is None and name == "born_timestamp":
            continue
        if not isinstance(value, int) or not lo <= value <= hi:
            return f"{name}={value!r} is outside a Java {'long' if hi > INT32[1] else 'int'}"
    return None


def _check_properties(msg: Message) -> Refusal | None:
    if not isinstance(msg.properties, dict):
        return _illegal("properties must be a dict of str to str")
    if msg.properties and (PROPERTY_PRODUCER_ID in msg.properties
                           or PROPERTY_PRODUCER_SEQUENCE in msg.properties):
        return _illegal(f"properties {' and '.join(RESERVED_PROPERTIES)} are reserved: the "
                        "store sets them from the SEND record's producer_id and sequence")
    for name, value in msg.properties.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name:
            return _illegal(f"property {name!r} must be a non-empty str name with a str value")
        if not value:
            return _illegal(f"property {name!r} has an empty value: RocketMQ's readers (and "
                            "ours) drop such a pair, so it could never be read back")
        if _has_reserved(name) or _has_reserved(value):
            return _illegal(f"property {name!r} holds a reserved byte (\\x00, \\x01 or \\x02)")
    delay = msg.properties.get(PROPERTY_DELAY_TIME_LEVEL)
    refusal = None if delay is None else delay_property_refusal(delay)
    if refusal:
        return _illegal(refusal)
    if msg.tags is not None and (not isinstance(msg.tags, str) or _has_reserved(msg.tags)):
        return _illegal("tags must be a str without \\x00, \\x01 or \\x02")
    if msg.keys is not None and not isinstance(msg.keys, (str, list, tuple)):
        return _illegal("keys must be a list of str (or one space-separated str)")
    keys = msg.keys.split(KEY_SEPARATOR) if isinstance(msg.keys, str) else msg.keys or ()
    for key in keys:
        if not isinstance(key, str) or (KEY_SEPARATOR in key) or _has_reserved(key):
            return _illegal(f"key {key!r} must be a str without spaces or separators")
    return None


def _check_born_host(msg: Message) -> str | None:
    host = msg.born_host
    if not (isinstance(host, tuple) and len(host) == 2 and isinstance(host[0], str)
            and isinstance(host[1], int) and 0 <= host[1] <= 65535):
        return f"born_host {host!r} must be an (ip, port) pair"
    return _check_address(host[0])


@functools.lru_cache(maxsize=4096)
def _check_address(address: str) -> str | None:
    """Parsing an address costs more than the rest of a put: hosts repeat, so cache."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return f"born_host address {address!r} is not an IPv4 or IPv6 address"
    return None


def check_message(msg: Message, config: StoreConfig, *, internal: bool = False) -> Refusal | None:
    """None when ``msg`` may be stored; else the status and a reason naming the fault."""
    if not isinstance(msg, Message):
        return _illegal(f"expected a Message, got {type(msg).__name__}")
    reason = check_topic(msg.topic, internal=internal, put=True)
    if reason is None and msg.tags is not None and not isinstance(msg.tags, str):
        reason = "tags must be a str"
    if reason:
        return _illegal(reason)
    if not isinstance(msg.body, (bytes, bytearray, memoryview)):
        return _illegal("body must be bytes")
    if msg.queue_id is not None and (not isinstance(msg.queue_id, int) or
                                     not 0 <= msg.queue_id < config.default_topic_queue_nums):
        return _illegal(f"queue id {msg.queue_id!r} is outside 0.."
                        f"{config.default_topic_queue_nums - 1}")
    if not isinstance(msg.delay_level, int) or msg.delay_level < 0:
        return _illegal(f"delay level {msg.delay_level!r} must be a non-negative int")
    reason = _check_ranges(msg) or _check_born_host(msg)
    if reason:
        return _illegal(reason)
    return _check_properties(msg)


def check_encoded_size(record_length: int, properties_length: int,
                       config: StoreConfig) -> Refusal | None:
    """The size rules, once the record's length is known."""
    if properties_length > MAX_PROPERTIES_LENGTH:
        return (PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                f"properties are {properties_length} bytes, over {MAX_PROPERTIES_LENGTH}")
    if record_length > config.max_message_size:
        return _illegal(f"message size {record_length} exceeds max_message_size "
                        f"{config.max_message_size}")
    if record_length + END_FILE_MIN_BLANK_LENGTH > config.mapped_file_size_commit_log:
        return _illegal(f"message size {record_length} cannot fit in a CommitLog file of "
                        f"{config.mapped_file_size_commit_log} bytes")
    return None
