"""Messages as producers send them and as the store hands them back.

``Message`` is what a producer puts: topic, body, tags, keys, properties, queue id and
the few header values a producer may set. ``MessageExt`` is a message decoded from the
CommitLog, with every one of the record's 17 fields under its RocketMQ name in
snake_case (``queue_offset``, ``commit_log_offset``, ``store_timestamp``, ...).

Also here, because both sides need them:

* the properties string, ``name \\x01 value \\x02`` repeated (``messageProperties2String``),
  and the well-known property names (``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``DELAY``, ...).
  A stored record's properties are read as RocketMQ reads them (``read_properties``): a
  pair with an empty name or value is no pair, so ``TAGS\\x01\\x02`` is no tags. Empty
  means none on the way in too: ``tags=""`` and ``keys=""``/``[]``/``[""]`` store no TAGS
  or KEYS (and ``storage.validation`` refuses a property with an empty value);
* the ``sysFlag`` bits: compression, multi-tags, the transaction type (``flag & 0xC``),
  and the IPv6 bits that widen BORNHOST (0x10) and STOREHOST (0x20) from 8 to 20 bytes;
* hosts as ``(ip, port)`` and their record encoding (address bytes + 4-byte port);
* the offset message id: uppercase hex of store host bytes + 8-byte physical offset,
  32 characters for an IPv4 store host, 56 for IPv6, and back.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import struct
from typing import Mapping
from rocketstore.storage.clock import now_ms  # noqa: F401  (re-exported)

# --- property names (MessageConst) -------------------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_PRODUCER_GROUP = "PGROUP"
# rocketstore's idempotent producers: the writer stores each record's identity here so a
# restarted writer can rebuild which sequences it already holds (procs.writer).
PROPERTY_PRODUCER_ID = "__PID"
PROPERTY_PRODUCER_SEQUENCE = "__SEQ"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# --- sysFlag bits (MessageSysFlag) ---------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20

Host = tuple[str, int]


def transaction_value(sys_flag: int) -> int:
    """``MessageSysFlag.getTransactionValue``: the transaction type bits of a sysFlag."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


def is_consumable(sys_flag: int) -> bool:
    """NOT and COMMIT messages enter consume queues; PREPARED and ROLLBACK do not."""
    return transaction_value(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


# --- properties --------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str]) -> str:
    """``messageProperties2String``: ``name\\x01value\\x02`` for each pair, in order.
    Raises ``ValueError`` for a name or value that is not a str (None would be written
    as the text "None")."""
    try:        # + takes str only: the check costs nothing where all are
        return "".join([k + "\x01" + v + "\x02" for k, v in props.items()])
    except TypeError:
        name, value = next((k, v) for k, v in props.items()
                           if not (isinstance(k, str) and isinstance(v, str)))
        raise ValueError(f"property {name!r} = {value!r}: names and values are str") from None


def decode_properties(s: str) -> dict[str, str]:
    """The exact inverse of ``encode_properties``, for a producer's properties on their
    way in (the SEND frame): every ``name\\x01value`` pair, an empty value kept, so
    ``storage.validation`` can refuse it by name. A pair without a name/value separator
    is ignored. Stored records are read with ``read_properties``."""
    out: dict[str, str] = {}
    for item in s.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


def read_properties(s: str) -> dict[str, str]:
    """The properties of a stored record, read as RocketMQ reads them
    (``MessageDecoder.string2messageProperties``): a pair with an empty name or an empty
    value (``TAGS\\x01\\x02``, what RocketMQ writes for ``setTags("")``) and an item
    without ``\\x01`` are dropped; a value runs from the first ``\\x01`` to the next
    ``\\x02``; a name stored twice keeps its first place and its last value."""
    out: dict[str, str] = {}
    for item in s.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            out[name] = value
    return out


# --- hosts ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def encode_host(host: Host) -> bytes:
    """Address bytes (4 for IPv4, 16 for IPv6) followed by the port as a 4-byte int."""
    ip, port = host
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


def host_is_v6(host: Host) -> bool:
    return ":" in host[0]


@functools.lru_cache(maxsize=4096)
def decode_host(raw: bytes) -> Host:
    return str(ipaddress.ip_address(raw[:-4])), int.from_bytes(raw[-4:], "big", signed=True)


def parse_host(text: str) -> Host:
    """``"10.0.0.1:10911"`` or ``"[::1]:10911"`` to ``(ip, port)``. Raises ``ValueError``
    for a port that is not a number or brackets other than one pair around the ip."""
    ip, _, port = text.rpartition(":")
    if ip[:1] == "[" and ip[-1:] == "]":
        ip = ip[1:-1]
    if "[" in ip or "]" in ip:
        raise ValueError(f"host {text!r} is not ip:port or [ip6]:port")
    return ip, int(port)


def format_host(host: Host) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# --- offset message id -------------------------------------------------------------------
def create_message_id(store_host: Host, commit_log_offset: int) -> str:
    """``MessageDecoder.createMessageId``: hex(store host bytes + physical offset)."""
    return (encode_host(store_host) + commit_log_offset.to_bytes(8, "big")).hex().upper()


def decode_message_id(msg_id: str) -> tuple[Host, int]:
    """The store host and physical offset inside an offset message id.

    Raises ``ValueError`` for text that is not a 32- or 56-character hex id.
    """
    if len(msg_id) not in (32, 56):
        raise ValueError(f"a message id has 32 or 56 hex characters, not {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    return decode_host(raw[:-8]), int.from_bytes(raw[-8:], "big", signed=True)


# --- the messages ----------------------------------------------------------------------------
@dataclasses.dataclass
class Message:
    """A message as a producer sends it (RocketMQ's ``Message`` plus broker-inner fields).

    ``queue_id=None`` (the default) lets the store pick a queue, round robin per topic as
    RocketMQ's producer spreads one; ``delay_level`` > 0 makes it a delayed
    message (stored in SCHEDULE_TOPIC_XXXX until due); ``born_timestamp=None`` means now.
    """

    topic: str
    body: bytes = b""
    tags: str | None = None
    keys: list[str] | tuple[str, ...] | str | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    queue_id: int | None = None
    flag: int = 0
    sys_flag: int = 0
    delay_level: int = 0
    born_timestamp: int | None = None
    born_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    wait_store_msg_ok: bool = True

    def key_list(self) -> list[str]:
        if not self.keys:
            return []
        if isinstance(self.keys, str):
            return [k for k in self.keys.split(KEY_SEPARATOR) if k]
        return [k for k in self.keys if k]  # an empty key is no key

    def requested_delay_level(self) -> int:
        """The delay level asked for: the field, or else a ``DELAY`` property (RocketMQ's
        ``setDelayTimeLevel`` is that property); 0 for none or one that is no level
        (``validation`` refuses those first)."""
        return self.delay_level or \
            parse_delay_property(self.properties.get(PROPERTY_DELAY_TIME_LEVEL))

    def all_properties(self) -> dict[str, str]:
        """The properties as they will be stored: user properties plus TAGS/KEYS/DELAY."""
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        keys = self.key_list()
        if keys:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
        if self.delay_level:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if not self.wait_store_msg_ok:
            props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
        return props


DELAY_PROPERTY = re.compile(r"[0-9]{1,9}")     # ASCII digits: int() takes "1_0" and "２"


def delay_property_refusal(value: str) -> str | None:
    """Why a ``DELAY`` property cannot be stored (None when it is a level)."""
    if DELAY_PROPERTY.fullmatch(value):
        return None
    return (f"property {PROPERTY_DELAY_TIME_LEVEL} is the delay level, a decimal number, "
            f"not {value!r}")


def parse_delay_property(value: str | None) -> int:
    """A ``DELAY`` property's level; 0 when absent or not a decimal level (a record
    stored before such values were refused must not break its readers)."""
    return int(value) if isinstance(value, str) and DELAY_PROPERTY.fullmatch(value) else 0


class StoredMessageFields:
    """What a stored message tells beyond its 17 fields, from ``properties``,
    ``store_host`` and ``commit_log_offset`` (``MessageExt`` and
    ``storage.message_view.MessageView`` both have them)."""

    __slots__ = ()

    @property
    def msg_id(self) -> str:
        return create_message_id(self.store_host, self.commit_log_offset)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def delay_level(self) -> int:
        return parse_delay_property(self.properties.get(PROPERTY_DELAY_TIME_LEVEL))


@dataclasses.dataclass
class MessageExt(StoredMessageFields):
    """A message decoded from a CommitLog record; field names follow RocketMQ's."""

    store_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    def to_dict(self) -> dict:
        """A JSON-ready view (body as text when it is UTF-8, else hex)."""
        d = dataclasses.asdict(self)
        try:
            d["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            d["body_hex"] = self.body.hex()
            del d["body"]
        d["born_host"] = format_host(self.born_host)
        d["store_host"] = format_host(self.store_host)
        d["msg_id"] = self.msg_id
        d["tags"] = self.tags
        d["keys"] = self.keys
        return d
