"""Reference reader/writer for RocketMQ store files, used to cross-check the store.

This module is an independent implementation written only from the format
description (SPEC.md section 2).  It deliberately shares no code with the
``storage`` package: the test suite encodes with one and decodes with the
other, so a mistake has to be made twice, in the same way, to go unnoticed.

Everything is big-endian, as Java writes it.  Only the standard library and
``crcmod`` are used.  Functions are pure: they take and return ``bytes``
(or fill a ``bytearray``) and never touch files.

Formats covered
---------------
* CommitLog message record (SPEC 2.4), 17 fields, IPv4 layout::

      off  width  field
        0    4    TOTALSIZE                 91 + B + T + P
        4    4    MAGICCODE                 0xDAA320A7 (v1) / 0xDAA320AB (v2)
        8    4    BODYCRC                   CRC-32(body) & 0x7FFFFFFF
       12    4    QUEUEID
       16    4    FLAG
       20    8    QUEUEOFFSET
       28    8    PHYSICALOFFSET
       36    4    SYSFLAG
       40    8    BORNTIMESTAMP
       48    8    BORNHOST                  4 address bytes + int port (20 if 0x10)
       56    8    STORETIMESTAMP
       64    8    STOREHOSTADDRESS          4 address bytes + int port (20 if 0x20)
       72    4    RECONSUMETIMES
       76    8    PREPAREDTRANSACTIONOFFSET
       84  4+B    BODYLENGTH, BODY
     88+B  1+T    TOPICLENGTH (signed byte; a short for v2), TOPIC
   89+B+T  2+P    PROPERTIESLENGTH (signed short), PROPERTIES

  Properties are ``name \\x01 value \\x02`` repeated, UTF-8.
* BLANK end-of-file record: int size (the rest of the file), int 0xCBD43194,
  filler.
* Message id (SPEC 2.5): uppercase hex of store host bytes + 8-byte offset.
* ConsumeQueue unit (SPEC 2.6): long offset, int size, long tagsCode.
* IndexFile (SPEC 2.7): 40-byte header, hashSlotNum x 4-byte slots,
  indexNum x 20-byte entries; writes follow ``IndexFile.putKey`` (SPEC 4.9.2)
  and queries follow ``selectPhyOffset`` (SPEC 4.9.3).
* Checkpoint (SPEC 2.8): three longs at the start of a 4096-byte file.

Malformed input raises ``ValueError`` with the position and the reason.
"""

import ipaddress
import json
import os
import struct

import crcmod.predefined

# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------

MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194

BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20

END_FILE_MIN_BLANK_LENGTH = 8
TOPIC_MAX_V1_BYTES = 127          # the v1 length byte is read back signed
PROPERTIES_MAX_BYTES = 32767      # Short.MAX_VALUE

PROPERTY_NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

CQ_UNIT = struct.Struct(">qiq")                       # offset, size, tagsCode
assert CQ_UNIT.size == 20

INDEX_HEADER = struct.Struct(">qqqqii")  # begin/end ts, begin/end phy, slotCount, indexCount
assert INDEX_HEADER.size == 40
INDEX_SLOT = struct.Struct(">i")
assert INDEX_SLOT.size == 4
INDEX_ENTRY = struct.Struct(">iqii")     # keyHash, phyOffset, timeDiff, preIndexNo
assert INDEX_ENTRY.size == 20
INDEX_INVALID = 0
INT_MAX = 2**31 - 1

CHECKPOINT = struct.Struct(">qqq")                    # physic, logics, index
assert CHECKPOINT.size == 24
CHECKPOINT_FILE_SIZE = 4096

_crc32 = crcmod.predefined.mkCrcFun("crc-32")


def body_crc(body: bytes) -> int:
    """CRC-32 of the body, masked to a non-negative Java int (UtilAll.crc32)."""
    return _crc32(body) & 0x7FFFFFFF


# ---------------------------------------------------------------------------
# Java hash codes
# ---------------------------------------------------------------------------

def java_hash(s: str) -> int:
    """Java ``String.hashCode()``: over UTF-16 code units, signed 32-bit."""
    utf16 = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(utf16), 2):
        code_unit = (utf16[i] << 8) | utf16[i + 1]
        h = (31 * h + code_unit) & 0xFFFFFFFF
    if h >= 2**31:
        h -= 2**32
    return h


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: ``Math.abs(key.hashCode())``, or 0.

    Java's ``Math.abs(Integer.MIN_VALUE)`` is still negative, and that case
    maps to 0.
    """
    h = java_hash(key)
    if h == -(2**31):
        return 0
    return abs(h)


# ---------------------------------------------------------------------------
# Hosts and message ids
# ---------------------------------------------------------------------------

def _host_bytes(host, want_v6: bool, which: str) -> bytes:
    ip_str, port = host
    address = ipaddress.ip_address(ip_str)
    if (address.version == 6) != want_v6:
        raise ValueError(
            f"{which} {ip_str!r} is IPv{address.version} but the sysFlag "
            f"says IPv{6 if want_v6 else 4}")
    if not 0 <= port <= 65535:
        raise ValueError(f"{which} port {port} out of range")
    return address.packed + struct.pack(">i", port)


def _host_from_bytes(raw: bytes):
    address = ipaddress.ip_address(raw[:-4])
    (port,) = struct.unpack(">i", raw[-4:])
    return (str(address), port)


def make_msg_id(store_host, physical_offset: int) -> str:
    """offsetMsgId: hex of store host (4+4 or 16+4 bytes) + 8-byte offset."""
    is_v6 = ipaddress.ip_address(store_host[0]).version == 6
    raw = _host_bytes(store_host, is_v6, "store host")
    raw += struct.pack(">q", physical_offset)
    return raw.hex().upper()


def parse_msg_id(msg_id: str):
    """Inverse of ``make_msg_id``: returns ``((ip, port), offset)``.

    32 hex characters is an IPv4 id, 56 an IPv6 id.
    """
    if len(msg_id) not in (32, 56):
        raise ValueError(f"msg id has {len(msg_id)} hex chars, want 32 or 56")
    raw = bytes.fromhex(msg_id)
    (offset,) = struct.unpack(">q", raw[-8:])
    return _host_from_bytes(raw[:-8]), offset


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

def encode_properties(properties: dict) -> bytes:
    """``messageProperties2String``: name \\x01 value \\x02, in dict order."""
    text = ""
    for name, value in properties.items():
        for part in (name, value):
            if PROPERTY_NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part:
                raise ValueError(f"property text {part!r} contains a separator")
        text += name + PROPERTY_NAME_VALUE_SEPARATOR + value + PROPERTY_SEPARATOR
    return text.encode("utf-8")


def decode_properties(raw: bytes) -> dict:
    """``MessageDecoder.string2messageProperties``, step by step as RocketMQ 5 runs it:
    items end at \\x02 (or the end); an item shorter than 3 characters is skipped; its
    first \\x01 must have a name before it and a value after it, or the item is
    skipped (RocketMQ writes ``TAGS\\x01\\x02`` for ``setTags("")`` and reads no tags
    back); a later pair of the same name replaces the earlier value."""
    text = raw.decode("utf-8")
    properties = {}
    index, length = 0, len(text)
    while index < length:
        new_index = text.find(PROPERTY_SEPARATOR, index)
        if new_index < 0:
            new_index = length
        if new_index - index >= 3:
            kv = text.find(PROPERTY_NAME_VALUE_SEPARATOR, index)
            if index < kv < new_index - 1:
                properties[text[index:kv]] = text[kv + 1:new_index]
        index = new_index + 1
    return properties


# ---------------------------------------------------------------------------
# CommitLog message record
# ---------------------------------------------------------------------------

def record_length(body_len: int, topic_len: int, properties_len: int, *,
                  v2: bool = False, born_v6: bool = False,
                  store_v6: bool = False) -> int:
    """``calMsgLength``: 91 + B + T + P, +1 for v2, +12 per IPv6 host."""
    length = 91 + body_len + topic_len + properties_len
    if v2:
        length += 1
    if born_v6:
        length += 12
    if store_v6:
        length += 12
    return length


def encode_record(*, topic, body, queue_id, flag, queue_offset,
                  physical_offset, sys_flag, born_timestamp, born_host,
                  store_timestamp, store_host, reconsume_times,
                  prepared_transaction_offset, properties: dict) -> bytes:
    """Serialise one CommitLog message record (17 fields, SPEC 2.4)."""
    born_v6 = bool(sys_flag & BORNHOST_V6_FLAG)
    store_v6 = bool(sys_flag & STOREHOSTADDRESS_V6_FLAG)
    born_host_raw = _host_bytes(born_host, born_v6, "born host")
    store_host_raw = _host_bytes(store_host, store_v6, "store host")

    topic_raw = topic.encode("utf-8")
    properties_raw = encode_properties(properties)
    if len(properties_raw) > PROPERTIES_MAX_BYTES:
        raise ValueError(f"properties are {len(properties_raw)} bytes, "
                         f"limit {PROPERTIES_MAX_BYTES}")
    v2 = len(topic_raw) > TOPIC_MAX_V1_BYTES
    if v2 and len(topic_raw) > 32767:
        raise ValueError(f"topic is {len(topic_raw)} bytes, limit 32767")

    total_size = record_length(len(body), len(topic_raw), len(properties_raw),
                               v2=v2, born_v6=born_v6, store_v6=store_v6)
    magic = MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE

    out = b""
    out += struct.pack(">i", total_size)
    out += struct.pack(">I", magic)
    out += struct.pack(">i", body_crc(body))
    out += struct.pack(">i", queue_id)
    out += struct.pack(">i", flag)
    out += struct.pack(">q", queue_offset)
    out += struct.pack(">q", physical_offset)
    out += struct.pack(">i", sys_flag)
    out += struct.pack(">q", born_timestamp)
    out += born_host_raw
    out += struct.pack(">q", store_timestamp)
    out += store_host_raw
    out += struct.pack(">i", reconsume_times)
    out += struct.pack(">q", prepared_transaction_offset)
    out += struct.pack(">i", len(body)) + body
    if v2:
        out += struct.pack(">h", len(topic_raw)) + topic_raw
    else:
        out += struct.pack(">b", len(topic_raw)) + topic_raw
    out += struct.pack(">h", len(properties_raw)) + properties_raw

    assert len(out) == total_size, (len(out), total_size)
    return out


class _Cursor:
    """Reads big-endian fields in sequence from buf[start:end]."""

    def __init__(self, buf, start, end):
        self.buf = buf
        self.pos = start
        self.end = end

    def take(self, n, what):
        if n < 0 or self.pos + n > self.end:
            raise ValueError(f"record field {what} at {self.pos} "
                             f"runs past the record end {self.end}")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw

    def unpack(self, fmt, what):
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))
        return value


def decode_record(buf: bytes, pos: int) -> dict:
    """Decode the record at ``buf[pos:]``.

    Returns the 17 fields plus ``topic``, ``properties`` (dict), ``msg_id``,
    ``crc_ok``; or ``{"blank": True, "total_size": n}`` for a BLANK record.
    Raises ValueError for an unknown magic, a truncated record, or a total
    size that does not match the field lengths.
    """
    if pos + 8 > len(buf):
        raise ValueError(f"no record header at {pos}: only {len(buf) - pos} bytes")
    (total_size,) = struct.unpack(">i", bytes(buf[pos:pos + 4]))
    (magic,) = struct.unpack(">I", bytes(buf[pos + 4:pos + 8]))

    if magic == BLANK_MAGIC_CODE:
        return {"blank": True, "total_size": total_size}
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise ValueError(f"illegal magic code 0x{magic:08X} at {pos}")
    if total_size < 8 or pos + total_size > len(buf):
        raise ValueError(f"record at {pos} claims {total_size} bytes, "
                         f"{len(buf) - pos} available")

    c = _Cursor(buf, pos + 8, pos + total_size)
    rec = {"total_size": total_size, "magic": magic}
    rec["body_crc"] = c.unpack(">i", "BODYCRC")
    rec["queue_id"] = c.unpack(">i", "QUEUEID")
    rec["flag"] = c.unpack(">i", "FLAG")
    rec["queue_offset"] = c.unpack(">q", "QUEUEOFFSET")
    rec["physical_offset"] = c.unpack(">q", "PHYSICALOFFSET")
    sys_flag = c.unpack(">i", "SYSFLAG")
    rec["sys_flag"] = sys_flag
    born_v6 = bool(sys_flag & BORNHOST_V6_FLAG)
    store_v6 = bool(sys_flag & STOREHOSTADDRESS_V6_FLAG)
    rec["born_timestamp"] = c.unpack(">q", "BORNTIMESTAMP")
    rec["born_host"] = _host_from_bytes(c.take(20 if born_v6 else 8, "BORNHOST"))
    rec["store_timestamp"] = c.unpack(">q", "STORETIMESTAMP")
    store_host_raw = c.take(20 if store_v6 else 8, "STOREHOSTADDRESS")
    rec["store_host"] = _host_from_bytes(store_host_raw)
    rec["reconsume_times"] = c.unpack(">i", "RECONSUMETIMES")
    rec["prepared_transaction_offset"] = c.unpack(">q", "PREPAREDTRANSACTIONOFFSET")

    body_len = c.unpack(">i", "BODYLENGTH")
    rec["body"] = c.take(body_len, "BODY")

    v2 = magic == MESSAGE_MAGIC_CODE_V2
    topic_len = c.unpack(">h" if v2 else ">b", "TOPICLENGTH")
    rec["topic"] = c.take(topic_len, "TOPIC").decode("utf-8")

    properties_len = c.unpack(">h", "PROPERTIESLENGTH")
    properties_raw = c.take(properties_len, "PROPERTIES")
    rec["properties"] = decode_properties(properties_raw)

    expected = record_length(body_len, topic_len, properties_len,
                             v2=v2, born_v6=born_v6, store_v6=store_v6)
    if total_size != expected:
        raise ValueError(f"record at {pos}: TOTALSIZE {total_size} but the "
                         f"fields add up to {expected}")

    rec["msg_id"] = (store_host_raw + struct.pack(">q", rec["physical_offset"])).hex().upper()
    rec["crc_ok"] = body_crc(rec["body"]) == rec["body_crc"]
    return rec


def encode_blank(size: int) -> bytes:
    """BLANK record of ``size`` bytes: int size, int magic, zero filler."""
    if size < END_FILE_MIN_BLANK_LENGTH:
        raise ValueError(f"blank record needs at least 8 bytes, got {size}")
    return struct.pack(">iI", size, BLANK_MAGIC_CODE) + bytes(size - 8)


def decode_commitlog_file(data: bytes, file_from_offset: int = 0, *,
                          strict: bool = True) -> dict:
    """Walk the records of one CommitLog file from position 0.

    The walk ends at a BLANK record (which must cover the rest of ``data``),
    at a zero or unknown magic, or at the end of ``data``.  Returns
    ``{"records": [...], "end": pos, "blank": size or None}`` where ``end``
    is where valid message data ends (the BLANK's position, if any).

    A record with a valid magic that is malformed (truncated, TOTALSIZE not
    matching its fields, PHYSICALOFFSET != file_from_offset + pos) raises
    ValueError; with ``strict=False`` the walk stops there instead, as
    recovery would.  A CRC mismatch is reported as ``crc_ok`` and never stops
    the walk.
    """
    records = []
    pos = 0
    blank = None
    while pos + 8 <= len(data):
        (magic,) = struct.unpack(">I", bytes(data[pos + 4:pos + 8]))
        if magic == BLANK_MAGIC_CODE:
            (size,) = struct.unpack(">i", bytes(data[pos:pos + 4]))
            if size != len(data) - pos:
                if strict:
                    raise ValueError(f"blank record at {pos} has size {size}, "
                                     f"but {len(data) - pos} bytes remain")
                break
            blank = size
            break
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
            break
        try:
            rec = decode_record(data, pos)
            if rec["physical_offset"] != file_from_offset + pos:
                raise ValueError(
                    f"record at {pos}: PHYSICALOFFSET {rec['physical_offset']}, "
                    f"expected {file_from_offset + pos}")
        except ValueError:
            if strict:
                raise
            break
        records.append(rec)
        pos += rec["total_size"]
    return {"records": records, "end": pos, "blank": blank}


# ---------------------------------------------------------------------------
# ConsumeQueue
# ---------------------------------------------------------------------------

def encode_cq_unit(commit_log_offset: int, size: int, tags_code: int) -> bytes:
    return CQ_UNIT.pack(commit_log_offset, size, tags_code)


def decode_cq_unit(buf: bytes, pos: int = 0):
    """Returns ``(commit_log_offset, size, tags_code)``."""
    if pos + CQ_UNIT.size > len(buf):
        raise ValueError(f"consume queue unit at {pos} is truncated")
    return CQ_UNIT.unpack_from(buf, pos)


def decode_cq_file(data: bytes) -> list:
    """Units up to (not including) the first with not (offset >= 0 and size > 0)."""
    if len(data) % CQ_UNIT.size != 0:
        raise ValueError(f"consume queue data is {len(data)} bytes, "
                         f"not a multiple of {CQ_UNIT.size}")
    units = []
    for pos in range(0, len(data), CQ_UNIT.size):
        offset, size, tags_code = decode_cq_unit(data, pos)
        if not (offset >= 0 and size > 0):
            break
        units.append((offset, size, tags_code))
    return units


# ---------------------------------------------------------------------------
# IndexFile
# ---------------------------------------------------------------------------

def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER.size + hash_slot_num * INDEX_SLOT.size + index_num * INDEX_ENTRY.size


def _slot_pos(slot: int) -> int:
    return INDEX_HEADER.size + slot * INDEX_SLOT.size


def _entry_pos(hash_slot_num: int, n: int) -> int:
    return INDEX_HEADER.size + hash_slot_num * INDEX_SLOT.size + n * INDEX_ENTRY.size


def _header_dict(buf) -> dict:
    fields = INDEX_HEADER.unpack_from(buf, 0)
    names = ("begin_timestamp", "end_timestamp", "begin_phy_offset",
             "end_phy_offset", "hash_slot_count", "index_count")
    return dict(zip(names, fields))


def _check_index_size(data, hash_slot_num, index_num):
    want = index_file_size(hash_slot_num, index_num)
    if len(data) != want:
        raise ValueError(f"index file is {len(data)} bytes, expected {want} "
                         f"for {hash_slot_num} slots and {index_num} entries")


def new_index_file(hash_slot_num: int, index_num: int,
                   prev_end_phy_offset: int = 0,
                   prev_end_timestamp: int = 0) -> bytearray:
    """A fresh, zero-filled index file, as the IndexFile constructor leaves it.

    Positive end values of the previous file become this file's begin and end
    values.  The on-disk indexCount stays 0 until the first put; readers
    treat a value <= 0 as 1.
    """
    buf = bytearray(index_file_size(hash_slot_num, index_num))
    h = _header_dict(buf)
    if prev_end_phy_offset > 0:
        h["begin_phy_offset"] = h["end_phy_offset"] = prev_end_phy_offset
    if prev_end_timestamp > 0:
        h["begin_timestamp"] = h["end_timestamp"] = prev_end_timestamp
    _write_header(buf, h)
    return buf


def _write_header(buf, h):
    INDEX_HEADER.pack_into(buf, 0, h["begin_timestamp"], h["end_timestamp"],
                           h["begin_phy_offset"], h["end_phy_offset"],
                           h["hash_slot_count"], h["index_count"])


def index_put_key(buf: bytearray, hash_slot_num: int, index_num: int,
                  key: str, phy_offset: int, store_timestamp: int) -> bool:
    """``IndexFile.putKey`` (SPEC 4.9.2) on a bytearray; False when full."""
    _check_index_size(buf, hash_slot_num, index_num)
    h = _header_dict(buf)
    index_count = h["index_count"] if h["index_count"] > 0 else 1
    if index_count >= index_num:
        return False

    key_hash = index_key_hash(key)
    slot_pos = _slot_pos(key_hash % hash_slot_num)
    (slot_value,) = INDEX_SLOT.unpack_from(buf, slot_pos)
    if slot_value <= INDEX_INVALID or slot_value > index_count:
        slot_value = INDEX_INVALID

    # Java's long division truncates toward zero; negatives are clamped to 0
    # below, so floor division gives the same result.
    time_diff = (store_timestamp - h["begin_timestamp"]) // 1000
    if h["begin_timestamp"] <= 0:
        time_diff = 0
    elif time_diff > INT_MAX:
        time_diff = INT_MAX
    elif time_diff < 0:
        time_diff = 0

    INDEX_ENTRY.pack_into(buf, _entry_pos(hash_slot_num, index_count),
                          key_hash, phy_offset, time_diff, slot_value)
    INDEX_SLOT.pack_into(buf, slot_pos, index_count)

    if index_count <= 1:
        h["begin_phy_offset"] = phy_offset
        h["begin_timestamp"] = store_timestamp
    h["hash_slot_count"] += 1
    h["index_count"] = index_count + 1
    h["end_phy_offset"] = phy_offset
    h["end_timestamp"] = store_timestamp
    _write_header(buf, h)
    return True


def encode_index_file(hash_slot_num: int, index_num: int, puts) -> bytes:
    """A whole index file after ``puts``, a sequence of (key, phy_offset, store_timestamp)."""
    buf = new_index_file(hash_slot_num, index_num)
    for key, phy_offset, store_timestamp in puts:
        if not index_put_key(buf, hash_slot_num, index_num, key, phy_offset, store_timestamp):
            raise ValueError(f"index file full before key {key!r}")
    return bytes(buf)


def decode_index_file(data: bytes, hash_slot_num: int, index_num: int) -> dict:
    """Header, non-zero slots and the used entries 1..indexCount-1."""
    _check_index_size(data, hash_slot_num, index_num)
    header = _header_dict(data)
    slots = {}
    for slot in range(hash_slot_num):
        (value,) = INDEX_SLOT.unpack_from(data, _slot_pos(slot))
        if value != 0:
            slots[slot] = value
    entries = []
    last = min(header["index_count"], index_num)
    for n in range(1, last):
        key_hash, phy_offset, time_diff, pre_index_no = INDEX_ENTRY.unpack_from(
            data, _entry_pos(hash_slot_num, n))
        entries.append((n, key_hash, phy_offset, time_diff, pre_index_no))
    return {"header": header, "slots": slots, "entries": entries}


def ref_query(data: bytes, hash_slot_num: int, index_num: int, key: str,
              begin_ms: int, end_ms: int) -> list:
    """``IndexFile.selectPhyOffset`` (SPEC 4.9.3) without a result limit.

    Walks the key's slot chain newest first and returns the phyOffsets of
    entries whose hash matches and whose time is within [begin_ms, end_ms].
    """
    _check_index_size(data, hash_slot_num, index_num)
    header = _header_dict(data)
    index_count = header["index_count"]
    key_hash = index_key_hash(key)
    (slot_value,) = INDEX_SLOT.unpack_from(data, _slot_pos(key_hash % hash_slot_num))
    if slot_value <= INDEX_INVALID or slot_value > index_count or index_count <= 1:
        return []

    found = []
    n = slot_value
    while True:
        hash_read, phy_offset, time_diff, prev = INDEX_ENTRY.unpack_from(
            data, _entry_pos(hash_slot_num, n))
        if time_diff < 0:
            break
        time_read = header["begin_timestamp"] + time_diff * 1000
        if hash_read == key_hash and begin_ms <= time_read <= end_ms:
            found.append(phy_offset)
        if prev <= INDEX_INVALID or prev > index_count or prev == n or time_read < begin_ms:
            break
        n = prev
    return found


# ---------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------

def encode_checkpoint(physic: int, logics: int, index: int) -> bytes:
    return CHECKPOINT.pack(physic, logics, index) + bytes(CHECKPOINT_FILE_SIZE - CHECKPOINT.size)


def decode_checkpoint(data: bytes) -> dict:
    if len(data) != CHECKPOINT_FILE_SIZE:
        raise ValueError(f"checkpoint file is {len(data)} bytes, "
                         f"expected {CHECKPOINT_FILE_SIZE}")
    physic, logics, index = CHECKPOINT.unpack_from(data, 0)
    return {"physic": physic, "logics": logics, "index": index}


# ---------------------------------------------------------------------------
# Golden hex fixtures
# ---------------------------------------------------------------------------

def format_hex_fixture(data: bytes, comments=()) -> str:
    """``# comment`` lines, then lowercase hex, 32 bytes per line."""
    lines = ["# " + c if c else "#" for c in comments]
    for i in range(0, len(data), 32):
        lines.append(data[i:i + 32].hex())
    return "\n".join(lines) + "\n"


def parse_hex_fixture(text: str) -> bytes:
    """Bytes of a hex fixture; ``#`` lines and all whitespace are ignored."""
    digits = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        digits.append("".join(line.split()))
    return bytes.fromhex("".join(digits))


FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def load_fixture(name: str) -> tuple[dict, bytes]:
    """A golden fixture: the inputs in ``NAME.json`` and the bytes of ``NAME.hex``."""
    with open(os.path.join(FIXTURES_DIR, name + ".json")) as f:
        inputs = json.load(f)
    with open(os.path.join(FIXTURES_DIR, name + ".hex")) as f:
        return inputs, parse_hex_fixture(f.read())
