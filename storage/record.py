"""The CommitLog record: byte layout and pure codecs (no files here).

A CommitLog file is ``| MESSAGE | MESSAGE | ... | MESSAGE | BLANK |``. All integers are
big-endian, as Java's ByteBuffer writes them. Offsets below are for IPv4 hosts
(8-byte BORNHOST/STOREHOST); an IPv6 host (sysFlag 0x10 born, 0x20 store) is 20 bytes
and shifts every later field by 12.

    #   offset  width  field                         notes
    1   0       4      TOTALSIZE                     whole record, this field included
    2   4       4      MAGICCODE                     0xDAA320A7 (v1) / 0xDAA320AB (v2)
    3   8       4      BODYCRC                       crc32(body) & 0x7FFFFFFF
    4   12      4      QUEUEID
    5   16      4      FLAG                          application flag, not interpreted
    6   20      8      QUEUEOFFSET                   logical offset in the consume queue
    7   28      8      PHYSICALOFFSET                this record's CommitLog offset
    8   36      4      SYSFLAG
    9   40      8      BORNTIMESTAMP
    10  48      8|20   BORNHOST                      address bytes + 4-byte port
    11  56      8      STORETIMESTAMP
    12  64      8|20   STOREHOSTADDRESS
    13  72      4      RECONSUMETIMES
    14  76      8      PREPARED TRANSACTION OFFSET
    15  84      4+B    BODYLENGTH, BODY
    16  88+B    1+T    TOPICLENGTH, TOPIC            v2: 2-byte length (topics > 127 bytes)
    17  89+B+T  2+P    PROPERTIESLENGTH, PROPERTIES  name\\x01value\\x02 ..., UTF-8
        91+B+T+P       end (v1, IPv4 hosts)

The BLANK (end-of-file) record is ``[int size][int 0xCBD43194][filler]``: it fills the
rest of a file whenever the next record plus 8 bytes does not fit
(``END_FILE_MIN_BLANK_LENGTH``), so every rolled file ends with at least 8 bytes of it.

Crash story: a record is trusted only if its magic, its length (recomputed from its own
fields), its PHYSICALOFFSET (must equal where it lies) and, when asked, its body CRC all
check out, and its topic and properties hold no NUL byte. The body CRC covers only the
body; the NUL rule covers the rest: files are zero-filled before use and the store
refuses NUL in topics and properties, so a record torn anywhere (its tail still zeros)
fails one of these checks. The first record that fails ends the valid data
(``check_message_and_return_size``).
"""

from __future__ import annotations

import functools
import struct
import zlib
from typing import NamedTuple, Sequence

from rocketstore.storage.hashing import java_string_hash
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, MessageExt, decode_host, read_properties)

MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 4 + 4
MAX_V1_TOPIC_LENGTH = 127
MAX_TOPIC_LENGTH = 0x7FFF
MAX_PROPERTIES_LENGTH = 0x7FFF  # Short.MAX_VALUE
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# Field offsets, chained so that one width change cannot silently shift the rest.
TOTALSIZE_POS = 0
MAGICCODE_POS = TOTALSIZE_POS + 4
BODYCRC_POS = MAGICCODE_POS + 4
QUEUEID_POS = BODYCRC_POS + 4
FLAG_POS = QUEUEID_POS + 4
QUEUEOFFSET_POS = FLAG_POS + 4
PHYSICALOFFSET_POS = QUEUEOFFSET_POS + 8
SYSFLAG_POS = PHYSICALOFFSET_POS + 8
BORNTIMESTAMP_POS = SYSFLAG_POS + 4
BORNHOST_POS = BORNTIMESTAMP_POS + 8
assert (MAGICCODE_POS, SYSFLAG_POS, BORNHOST_POS) == (4, 36, 48)

HEAD = struct.Struct(">iIiiiqqiq")  # fields 1-9, identical for every host width
assert HEAD.size == BORNHOST_POS
SIZE_MAGIC = struct.Struct(">iI")
INT = struct.Struct(">i")
LONG = struct.Struct(">q")
SHORT = struct.Struct(">h")
BYTE = struct.Struct(">b")
PHYS_AND_SYSFLAG = struct.Struct(">qi")
BLANK_HEAD = struct.Struct(">iI")
assert BLANK_HEAD.size == END_FILE_MIN_BLANK_LENGTH


def host_width(v6: bool) -> int:
    return 20 if v6 else 8


def store_timestamp_pos(sys_flag: int) -> int:
    """MESSAGE_STORE_TIMESTAMP_POSTION: 56 with an IPv4 born host, 68 with IPv6."""
    return BORNHOST_POS + host_width(bool(sys_flag & BORNHOST_V6_FLAG))


def _fixed_struct(flags: int) -> struct.Struct:
    """Fields 1-15 (through BODYLENGTH) for one combination of host widths."""
    born = host_width(bool(flags & BORNHOST_V6_FLAG))
    store = host_width(bool(flags & STOREHOSTADDRESS_V6_FLAG))
    return struct.Struct(f">iIiiiqqiq{born}sq{store}siqi")


HOST_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_FIXED = {flags: _fixed_struct(flags) for flags in (0, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG,
                                                   HOST_FLAGS)}
assert _FIXED[0].size == 88 and _FIXED[HOST_FLAGS].size == 112
# the tail of the fixed part, after the 48 bytes shared by every layout (for decoding)
_TAILS = {flags: struct.Struct(">" + st.format[10:]) for flags, st in _FIXED.items()}


def tail_struct(sys_flag: int) -> struct.Struct:
    """Fields 10-15 (BORNHOST .. BODYLENGTH) for the host widths ``sys_flag`` names."""
    return _TAILS[sys_flag & HOST_FLAGS]


_tail = tail_struct


def calc_msg_length(sys_flag: int, body_length: int, topic_length: int,
                    properties_length: int) -> int:
    """``calMsgLength``: 91 + B + T + P for v1 with IPv4 hosts.

    A topic longer than 127 bytes takes the v2 layout (2-byte topic length, one more
    byte); each IPv6 host adds 12 bytes.
    """
    born = host_width(bool(sys_flag & BORNHOST_V6_FLAG))
    store = host_width(bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))
    topic_len_width = 2 if topic_length > MAX_V1_TOPIC_LENGTH else 1
    return (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8
            + 4 + body_length + topic_len_width + topic_length + 2 + properties_length)


def body_crc(body: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: CRC-32 masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------- encode
def encode(*, topic: bytes, body: bytes, properties: bytes, queue_id: int, flag: int,
           queue_offset: int, physical_offset: int, sys_flag: int, born_timestamp: int,
           born_host: bytes, store_timestamp: int, store_host: bytes, reconsume_times: int,
           prepared_transaction_offset: int, crc: int | None = None) -> bytearray:
    """One record, all 17 fields. Hosts are already encoded (``message.encode_host``)
    and must agree with the IPv6 bits of ``sys_flag``."""
    if len(properties) > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties are {len(properties)} bytes, over {MAX_PROPERTIES_LENGTH}")
    if not 0 < len(topic) <= MAX_TOPIC_LENGTH:
        raise ValueError(f"topic length {len(topic)} is outside 1..{MAX_TOPIC_LENGTH}")
    total = calc_msg_length(sys_flag, len(body), len(topic), len(properties))
    v2 = len(topic) > MAX_V1_TOPIC_LENGTH
    out = bytearray(_FIXED[sys_flag & HOST_FLAGS].pack(
        total, MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
        body_crc(body) if crc is None else crc, queue_id, flag, queue_offset,
        physical_offset, sys_flag, born_timestamp, born_host, store_timestamp, store_host,
        reconsume_times, prepared_transaction_offset, len(body)))
    out += body
    out += SHORT.pack(len(topic)) if v2 else bytes((len(topic),))
    out += topic
    out += SHORT.pack(len(properties))
    out += properties
    if len(out) != total:
        raise AssertionError(f"encoded {len(out)} bytes, expected {total}")
    return out


def encode_blank(size: int) -> bytes:
    """The head of an end-of-file blank record of ``size`` bytes (filler not included)."""
    return BLANK_HEAD.pack(size, BLANK_MAGIC_CODE)


# ---------------------------------------------------------------------------------- decode
class RecordFormatError(ValueError):
    """Bytes that are not a well-formed record; callers add the file name."""

    def __init__(self, offset: int, detail: str):
        self.offset, self.detail = offset, detail
        super().__init__(f"offset {offset}: {detail}")


def decode_at(buf, pos: int, *, check_crc: bool = False) -> MessageExt:
    """Decode the record at ``pos`` of ``buf`` (bytes, bytearray, mmap or memoryview).

    Raises ``RecordFormatError`` if the bytes are not a whole, consistent record.
    """
    end = len(buf)
    if pos + HEAD.size > end:
        raise RecordFormatError(pos, "truncated record header")
    (total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
     born_ts) = HEAD.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise RecordFormatError(pos, f"illegal magic code 0x{magic:08X}")
    if total <= HEAD.size or pos + total > end:
        raise RecordFormatError(pos, f"record size {total} runs past the data")
    tail = _tail(sys_flag)
    if total < HEAD.size + tail.size:                 # IPv6 bits on a short record
        raise RecordFormatError(pos, f"record size {total} cannot hold its header")
    p = pos + HEAD.size
    born_host, store_ts, store_host, reconsume, prepared, body_len = tail.unpack_from(buf, p)
    p += tail.size
    if body_len < 0 or p + body_len + 3 > pos + total:   # and TOPICLENGTH, PROPERTIESLENGTH
        raise RecordFormatError(pos, f"body length {body_len} runs past the record")
    body = bytes(buf[p:p + body_len])
    p += body_len
    if magic == MESSAGE_MAGIC_CODE_V2:
        (topic_len,) = SHORT.unpack_from(buf, p)
        p += 2
    else:
        (topic_len,) = BYTE.unpack_from(buf, p)
        p += 1
    topic = bytes(buf[p:p + topic_len]).decode("utf-8", "replace")
    p += max(topic_len, 0)
    (props_len,) = SHORT.unpack_from(buf, p) if p + 2 <= pos + total else (-1,)
    p += 2
    props = bytes(buf[p:p + props_len]).decode("utf-8", "replace") if props_len > 0 else ""
    if topic_len <= 0 or props_len < 0 or \
            total != calc_msg_length(sys_flag, body_len, topic_len, props_len):
        raise RecordFormatError(pos, f"record size {total} disagrees with its fields")
    if "\0" in topic or "\0" in props:
        raise RecordFormatError(pos, "NUL byte in topic or properties (torn record)")
    if check_crc and body_crc(body) != crc:
        raise RecordFormatError(pos, "body CRC mismatch")
    return MessageExt(total, magic, crc, queue_id, flag, queue_offset, physical_offset,
                      sys_flag, born_ts, decode_host(born_host), store_ts,
                      decode_host(store_host), reconsume, prepared, body, topic,
                      read_properties(props))


class DispatchRequest(NamedTuple):
    """What the reput service hands to the dispatchers (RocketMQ's DispatchRequest).

    ``success and msg_size > 0``: a message; ``success and msg_size == 0``: the blank at
    the end of a file; ``not success``: torn, corrupt or unwritten bytes.
    """

    msg_size: int
    success: bool
    topic: str = ""
    queue_id: int = 0
    commit_log_offset: int = 0
    tags_code: int = 0
    store_timestamp: int = 0
    consume_queue_offset: int = 0
    keys: str | None = None
    uniq_key: str | None = None
    sys_flag: int = 0
    prepared_transaction_offset: int = 0


_FAILED = DispatchRequest(-1, False)
_BLANK = DispatchRequest(0, True)


def check_message_and_return_size(buf, pos: int, limit: int, expected_offset: int,
                                  check_crc: bool = True,
                                  delay_level_ms: Sequence[int] = ()) -> DispatchRequest:
    """Validate the record at ``buf[pos:limit]`` without raising.

    ``expected_offset`` is the CommitLog offset of ``pos``: a record whose PHYSICALOFFSET
    differs is stale or torn. ``delay_level_ms`` (index = level) turns the tagsCode of a
    SCHEDULE_TOPIC_XXXX message into its delivery time, as RocketMQ does.
    """
    if pos + 8 > limit:
        return _FAILED
    total, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return _BLANK
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or total <= HEAD.size:
        return _FAILED
    if pos + total > limit:
        return _FAILED
    (_, _, crc, queue_id, _, queue_offset, physical_offset, sys_flag,
     _) = HEAD.unpack_from(buf, pos)
    if physical_offset != expected_offset:
        return DispatchRequest(total, False)
    tail = _tail(sys_flag)
    p = pos + HEAD.size
    _, store_ts, _, _, prepared, body_len = tail.unpack_from(buf, p)
    p += tail.size
    if body_len < 0 or p + body_len + 3 > pos + total:
        return DispatchRequest(total, False)
    if check_crc and body_crc(buf[p:p + body_len]) != crc:
        return DispatchRequest(total, False)
    p += body_len
    if magic == MESSAGE_MAGIC_CODE_V2:
        (topic_len,) = SHORT.unpack_from(buf, p)
        p += 2
    else:
        topic_len = buf[p] if buf[p] < 128 else -1
        p += 1
    if topic_len <= 0 or p + topic_len + 2 > pos + total:
        return DispatchRequest(total, False)
    topic_raw = bytes(buf[p:p + topic_len])
    p += topic_len
    (props_len,) = SHORT.unpack_from(buf, p)
    p += 2
    if props_len < 0 or total != calc_msg_length(sys_flag, body_len, topic_len, props_len):
        return DispatchRequest(total, False)
    props_raw = bytes(buf[p:p + props_len])
    if 0 in topic_raw or 0 in props_raw:  # a tear left zeros where no NUL may stand
        return DispatchRequest(total, False)
    topic = _decode_topic(topic_raw)
    tags = _property(props_raw, b"TAGS\x01")
    code = java_string_hash(tags) if tags else 0
    if topic == SCHEDULE_TOPIC and delay_level_ms:
        level = _int_or_zero(_property(props_raw, b"DELAY\x01"))
        if level > 0:
            code = store_ts + delay_level_ms[min(level, len(delay_level_ms) - 1)]
    return DispatchRequest(total, True, topic, queue_id, physical_offset, code, store_ts,
                           queue_offset, _property(props_raw, b"KEYS\x01"),
                           _property(props_raw, b"UNIQ_KEY\x01"), sys_flag, prepared)


def chain_end(buf, least: int) -> int:
    """Where the TOTALSIZE chain of records from ``buf``'s start ends, once at or past
    ``least`` (never less than ``least``): each step must open with a message magic code
    and fit in ``buf``. For bytes whose last non-zero byte is at ``least - 1``: a record
    may end in zeros (PROPERTIESLENGTH 0, say), which these bytes must keep."""
    pos, limit = 0, len(buf)
    while pos < least and pos + 8 <= limit:
        total, magic = SIZE_MAGIC.unpack_from(buf, pos)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or total <= HEAD.size \
                or pos + total > limit:
            break
        pos += total
    return max(pos, least)


def properties_at(buf, pos: int) -> bytes:
    """The raw PROPERTIES of the record at ``pos``, found through its length fields
    without decoding the rest. The record must already have passed
    ``check_message_and_return_size``; raises ``struct.error`` past the buffer."""
    magic, = INT.unpack_from(buf, pos + MAGICCODE_POS)
    sys_flag, = INT.unpack_from(buf, pos + SYSFLAG_POS)
    p = pos + HEAD.size + _tail(sys_flag).size - 4
    (body_len,) = INT.unpack_from(buf, p)
    p += 4 + body_len
    if magic & 0xFFFFFFFF == MESSAGE_MAGIC_CODE_V2:
        (topic_len,) = SHORT.unpack_from(buf, p)
        p += 2 + topic_len
    else:
        p += 1 + buf[p]
    (props_len,) = SHORT.unpack_from(buf, p)
    return bytes(buf[p + 2:p + 2 + props_len])


def find_property(props: bytes, name: str) -> str | None:
    """The value of property ``name`` in a raw properties string, or None."""
    return _property(props, name.encode("utf-8") + b"\x01")


@functools.lru_cache(maxsize=4096)
def _decode_topic(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _property(props: bytes, name_sep: bytes) -> str | None:
    """The value of one property (``name_sep`` is ``b"NAME\\x01"``) in an encoded
    properties string, found without building the whole map: dispatch needs only
    TAGS, KEYS, UNIQ_KEY and DELAY. Read as ``message.read_properties`` reads the whole
    string (RocketMQ's ``string2messageProperties``): an empty value is no value, and
    of a name stored twice the last non-empty value counts."""
    i = props.rfind(name_sep)
    while i >= 0:
        if i == 0 or props[i - 1] == 2:  # a match must start a name/value pair
            start = i + len(name_sep)
            end = props.find(b"\x02", start)
            if end < 0:
                end = len(props)
            if end > start:
                return props[start:end].decode("utf-8", "replace")
        i = props.rfind(name_sep, 0, i)
    return None


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0
