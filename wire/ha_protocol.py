"""The HA socket's frames: how a slave store follows its master's CommitLog.

RocketMQ's classic HA (HAService, HAConnection, HAClient) speaks raw TCP: the slave
writes its CommitLog end as 8 bytes, the master answers with ``{offset i64, size i32}``
and that many CommitLog bytes. rocketstore keeps the meaning and carries it over ZeroMQ
(slave DEALER, master ROUTER at ``ha_listen_port``), one frame per ZeroMQ message.

docs/PROTOCOL.md §10 is the one place the frames are written down: the 4-byte head, each
kind's body field by field, what a session is and how a diverged slave finds where it
parts from its master. This module is a codec of that section and nothing more (pure
functions, no sockets): one ``struct.Struct`` per kind's fixed fields, an encoder per
kind and ``decode``. tests/test_protocol.py reads §10's tables and holds these structs,
encoders and ``decode`` to them; the sides that speak it are ``procs.ha`` (the master)
and ``procs.replica`` (the slave).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

MAGIC = b"RH"
VERSION = 2
HEAD = struct.Struct(">2sBB")
HELLO = struct.Struct(">IQQQII")   # session, epoch, file_size, offset, tail
REPORT = struct.Struct(">Q")
DATA = struct.Struct(">IQQQ")
ERROR = struct.Struct(">H")
PROBE = struct.Struct(">IQI")
RANGE = struct.Struct(">IQQ")
MAX_PROBE = 1024 * 1024            # bytes a RANGE carries at most
MAX_FRAME = 64 * 1024 * 1024      # a DATA frame's bound (ha_transfer_batch_size is below)


class Kind(enum.IntEnum):
    HELLO = 1
    REPORT = 2
    DATA = 3
    ERROR = 4
    PROBE = 5
    RANGE = 6
    FILE = 7


SYNCED_FILES = ("delayOffset.json",)   # config/ files a slave keeps as its master's


class HAError(enum.IntEnum):
    """Why a side refused the other. A slave's ``REPLICA_ERROR`` slot holds the code of
    the refusal that stopped its replication, until its master sends data again."""
    MALFORMED = 1             # a frame that is not one of the above
    UNSUPPORTED_VERSION = 2
    NO_SESSION = 3            # a REPORT before HELLO (a restarted master): say HELLO again
    FILE_SIZE_MISMATCH = 4    # the two stores' mapped_file_size_commit_log differ
    DIVERGED = 5              # the slave holds bytes the master does not (see procs.replica)
    OFFSET_UNAVAILABLE = 6    # the slave's end is below the master's first file
    ACK_BEYOND_END = 7        # a REPORT past what the session was sent (RocketMQ #3015)
    SYNC_DIVERGED = 8         # DIVERGED, from a SYNC_MASTER: the slave's bytes it sent may
                              # have been acknowledged, so the slave does not cut them
    STALE_EPOCH = 9           # the other side was elected in (or follows) a newer epoch:
                              # a slave refuses an older master's stream, and a master
                              # that hears of a newer epoch stops taking puts



class HAProtocolError(Exception):
    """A frame that cannot be read; ``code`` is what the answer says."""

    def __init__(self, code: HAError, detail: str):
        super().__init__(f"{code.name}: {detail}")
        self.code, self.detail = code, detail


class Hello(NamedTuple):
    session: int
    file_size: int
    offset: int
    tail_len: int
    tail_crc: int
    epoch: int = 0           # the slave's group epoch (0: no controller mode)


class Data(NamedTuple):
    session: int
    offset: int
    master_end: int
    epoch: int               # the master's group epoch (0: no controller mode)
    payload: memoryview


class Probe(NamedTuple):
    session: int
    offset: int
    length: int


class Range(NamedTuple):
    session: int
    offset: int
    master_end: int
    payload: memoryview


class File(NamedTuple):
    name: str
    content: bytes


class Error(NamedTuple):
    code: int
    text: str


def _head(kind: Kind) -> bytes:
    return HEAD.pack(MAGIC, VERSION, kind)


def encode_hello(session: int, file_size: int, offset: int, tail_len: int,
                 tail_crc: int, epoch: int = 0) -> bytes:
    return _head(Kind.HELLO) + HELLO.pack(session, epoch, file_size, offset, tail_len,
                                          tail_crc)


def encode_report(offset: int) -> bytes:
    return _head(Kind.REPORT) + REPORT.pack(offset)


def data_head(session: int, offset: int, master_end: int, epoch: int = 0) -> bytes:
    """A DATA frame up to its CommitLog bytes (alone: a heartbeat)."""
    return _head(Kind.DATA) + DATA.pack(session, offset, master_end, epoch)


def encode_probe(session: int, offset: int, length: int) -> bytes:
    return _head(Kind.PROBE) + PROBE.pack(session, offset, length)


def range_head(session: int, offset: int, master_end: int) -> bytes:
    """A RANGE frame up to the master's bytes."""
    return _head(Kind.RANGE) + RANGE.pack(session, offset, master_end)


def encode_file(name: str, content: bytes) -> bytes:
    raw = name.encode()
    return _head(Kind.FILE) + bytes((len(raw),)) + raw + content


def encode_error(code: HAError, text: str) -> bytes:
    return _head(Kind.ERROR) + ERROR.pack(code) + text.encode()[:4000]


def decode(frame) -> Hello | int | Data | Error | Probe | Range | File:
    """One frame: ``Hello``, a REPORT's offset (int), ``Data``, ``Error``, ``Probe`` or
    ``Range``.

    Raises ``HAProtocolError`` for anything else."""
    mv = memoryview(frame)
    if len(mv) < HEAD.size:
        raise HAProtocolError(HAError.MALFORMED, f"a frame of {len(mv)} bytes has no head")
    magic, version, kind = HEAD.unpack_from(mv)
    if magic != MAGIC:
        raise HAProtocolError(HAError.MALFORMED, f"bad magic {bytes(magic)!r} (not an HA frame)")
    if version != VERSION:
        raise HAProtocolError(HAError.UNSUPPORTED_VERSION,
                              f"version {version}; this store speaks {VERSION}")
    body = mv[HEAD.size:]
    try:
        if kind == Kind.HELLO and len(body) == HELLO.size:
            session, epoch, file_size, offset, tail_len, tail_crc = HELLO.unpack_from(body)
            return Hello(session, file_size, offset, tail_len, tail_crc, epoch)
        if kind == Kind.REPORT and len(body) == REPORT.size:
            return REPORT.unpack_from(body)[0]
        if kind == Kind.DATA and len(body) >= DATA.size:
            return Data(*DATA.unpack_from(body), body[DATA.size:])
        if kind == Kind.PROBE and len(body) == PROBE.size:
            return Probe(*PROBE.unpack_from(body))
        if kind == Kind.RANGE and len(body) >= RANGE.size:
            session, offset, end = RANGE.unpack_from(body)
            return Range(session, offset, end, body[RANGE.size:])
        if kind == Kind.FILE and len(body) >= 1 and len(body) >= 1 + body[0]:
            name = bytes(body[1:1 + body[0]]).decode("utf-8", "replace")
            if name in SYNCED_FILES:
                return File(name, bytes(body[1 + body[0]:]))
        if kind == Kind.ERROR and len(body) >= ERROR.size:
            return Error(ERROR.unpack_from(body)[0], bytes(body[ERROR.size:]).decode("utf-8", "replace"))
    except struct.error:
        pass
    raise HAProtocolError(HAError.MALFORMED, f"kind {kind} with a body of {len(body)} bytes")


def error_name(code: int) -> str:
    return HAError(code).name if code in HAError._value2member_map_ else f"error {code}"
