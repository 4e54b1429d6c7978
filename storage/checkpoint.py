"""StoreCheckpoint: the 4096-byte ``{root}/checkpoint`` file.

    offset  width  field
    0       8      physicMsgTimestamp  store time of the last flushed CommitLog message (ms)
    8       8      logicsMsgTimestamp  store time of the last flushed ConsumeQueue unit (ms)
    16      8      indexMsgTimestamp   end time of the last flushed (full) IndexFile (ms)
    24..4095       unused, zero

Each timestamp is a promise: everything stored at or before it is durable in its
structure. Abnormal recovery starts from the newest CommitLog file whose first message
is no newer than ``min_timestamp()`` = ``max(0, min(physic, logics) - 3000)`` (3 s of
slack for clocks and in-flight flushes), or ``min_timestamp_index()`` when the index is
included (``message_index_safe``).

Crash story: the file is rewritten in place and flushed with fdatasync; a torn write can
only leave timestamps that are too old, which makes recovery start earlier, never later.
A timestamp is only ever written after what it promises is durable, so every state of
the page is safe to find after a power cut, whenever the page was last written back: a
writer may leave its field to a later fdatasync (``write_one``).
"""

from __future__ import annotations

import mmap
import os
import struct

from rocketstore.storage.mapped_file import FILE_OPS
from rocketstore.storage import file_modes

CHECKPOINT_FILE_SIZE = 4096
PHYSIC_POS = 0
LOGICS_POS = PHYSIC_POS + 8
INDEX_POS = LOGICS_POS + 8
TIMESTAMPS = struct.Struct(">qqq")
_LONG = struct.Struct(">q")
assert TIMESTAMPS.size == INDEX_POS + 8
RECOVERY_SLACK_MS = 3000
_FIELD_POS = {"physic": PHYSIC_POS, "logics": LOGICS_POS, "index": INDEX_POS}


def encode(physic: int, logics: int, index: int) -> bytes:
    return TIMESTAMPS.pack(physic, logics, index).ljust(CHECKPOINT_FILE_SIZE, b"\0")


def decode(data: bytes) -> tuple[int, int, int]:
    return TIMESTAMPS.unpack_from(data, 0)


class StoreCheckpoint:
    def __init__(self, path: str, *, read_only: bool = False):
        self.path = path
        exists = os.path.exists(path)
        if read_only:
            with open(path, "rb") as f:
                self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
                    decode(f.read(TIMESTAMPS.size).ljust(TIMESTAMPS.size, b"\0"))
            self.fd, self.buf = -1, None
            return
        file_modes.make_dirs(os.path.dirname(path) or ".")
        self.fd = file_modes.create(path, os.O_RDWR)
        if os.fstat(self.fd).st_size < CHECKPOINT_FILE_SIZE:
            FILE_OPS.fallocate(self.fd, 0, CHECKPOINT_FILE_SIZE)
        self.buf = mmap.mmap(self.fd, CHECKPOINT_FILE_SIZE)
        if exists:
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
                decode(self.buf)
        else:
            self.physic_msg_timestamp = self.logics_msg_timestamp = self.index_msg_timestamp = 0

    def min_timestamp(self) -> int:
        """``getMinTimestamp``: min(physic, logics) less 3 s, never below 0."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_SLACK_MS)

    def min_timestamp_index(self) -> int:
        """``getMinTimestampIndex``: the index time point participates too."""
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        """Write the three timestamps and fdatasync. Raises ``OSError`` on failure."""
        # packed apart and copied in: pack_into zero-fills first, and a kill or a reader
        # in between would see a time of 0
        self.buf[:TIMESTAMPS.size] = TIMESTAMPS.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp)
        FILE_OPS.fdatasync(self.fd)

    def flush_one(self, field: str) -> None:
        """Write one timestamp (``"physic"``, ``"logics"`` or ``"index"``) and fdatasync.

        Each field has one writing process in the multiprocess store (the flusher owns
        physic, the dispatcher logics and index); writing only its own 8 bytes keeps
        them from overwriting each other. Raises ``OSError`` on failure.
        """
        self.write_one(field)
        FILE_OPS.fdatasync(self.fd)

    def write_one(self, field: str) -> None:
        """Write one timestamp into the mapping, without fdatasync: every process sees
        it at once, and the next fdatasync of the file, whichever process makes it,
        makes it durable (the page cache holds one copy of the page)."""
        pos = _FIELD_POS[field]
        self.buf[pos:pos + _LONG.size] = _LONG.pack(getattr(self, f"{field}_msg_timestamp"))

    def reload(self) -> None:
        """Re-read all three timestamps from the mapping (another process writes some)."""
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
            decode(self.buf)

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()
            self.buf = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def to_dict(self) -> dict[str, int]:
        return {"physic_msg_timestamp": self.physic_msg_timestamp,
                "logics_msg_timestamp": self.logics_msg_timestamp,
                "index_msg_timestamp": self.index_msg_timestamp}
