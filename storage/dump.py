"""Offline decoding of single store files, for ``rocketstore dump``.

Each ``describe_*`` function reads one file and yields plain dicts (JSON-ready), so the
CLI can print them as text or JSON lines. Nothing here needs a running store or a lock;
files are read, never changed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import time
from typing import Iterator

import numpy as np

from rocketstore.storage import checkpoint as checkpoint_codec
from rocketstore.storage import record
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE, CQ_STORE_UNIT_SIZE, CQ_UNIT
from rocketstore.storage.errors import StoreFileError
from rocketstore.storage import index_file
from rocketstore.storage.mapped_file import data_regions

KINDS = ("commitlog", "consumequeue", "index", "checkpoint")
RECHECK_S = 0.05       # a failed record with data after it is looked at again after this


_QUARANTINED = re.compile(r"(\d+)\.from-(\d+)")


def _file_offset(path: str) -> int:
    """The offset a file's first byte has in its queue: its name, or for a tail recovery
    kept in quarantine/ (``NAME.from-N``) its file's name plus ``N``; 0 for other names."""
    name = os.path.basename(path)
    if name.isdigit():
        return int(name)
    kept = _QUARANTINED.fullmatch(name)
    return int(kept[1]) + int(kept[2]) if kept else 0


@contextlib.contextmanager
def _mapped(path: str):
    """A read-only mapping of the whole file (empty bytes for an empty file)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield buf


def detect_kind(path: str) -> str:
    """Guess what a file is from where it lies in a store directory.

    Raises ``StoreFileError`` when the path says nothing.
    """
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    if parts[-1] == "checkpoint":
        return "checkpoint"
    if len(parts) >= 2 and parts[-2] in ("commitlog", "index"):
        return parts[-2]
    if len(parts) >= 4 and parts[-4] == "consumequeue":
        return "consumequeue"
    raise StoreFileError(path, "cannot tell the file kind from its path; pass --type")


def describe_commit_log(path: str, limit: int | None = None) -> Iterator[dict]:
    """Every record of a CommitLog file, then a summary ``{"end", "blank", "records"}``.

    The walk ends at the first place that holds no record. Where bytes other than zeros
    lie there (a damaged record, not the end of the data), the summary also says
    ``bad_record_at`` (its position in the file) and ``why``: the records after it are
    not shown, and recovery would cut the CommitLog there."""
    with _mapped(path) as data:
        yield from _walk_commit_log(path, data, limit)


def _walk_commit_log(path: str, data, limit: int | None) -> Iterator[dict]:
    base = _file_offset(path)
    pos, count, blank, bad = 0, 0, None, {}
    while pos < len(data) and (limit is None or count < limit):
        req = _record_at(path, data, pos, base + pos)
        if req is None:                       # zeros from here on: the end of the data
            break
        if not req.success:
            bad = {"bad_record_at": pos, "why": _why_no_record(data, pos, base + pos)}
            break
        if req.msg_size == 0:
            blank = len(data) - pos
            break
        yield {"kind": "message", "position": pos, **record.decode_at(data, pos).to_dict()}
        pos += req.msg_size
        count += 1
    yield {"kind": "summary", "file": path, "records": count, "end": pos, "blank": blank,
           "file_size": len(data), **bad}


def _record_at(path: str, data, pos: int, offset: int):
    """``check_message_and_return_size`` at ``pos``; None where nothing but zeros
    follows. A record that fails with data after it is looked at once more a moment
    later: the file may be a running store's, whose writer is copying it in."""
    req = record.check_message_and_return_size(data, pos, len(data), offset, True)
    if req.success or not _holds_data(path, data, pos):
        return req if req.success else None
    time.sleep(RECHECK_S)
    return record.check_message_and_return_size(data, pos, len(data), offset, True)


def _holds_data(path: str, data, pos: int) -> bool:
    """Whether a byte other than zero lies at or after ``pos``: read in place, in the
    regions the file system says may hold data (a file made ahead is mostly holes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        regions = data_regions(fd, pos, len(data))
    finally:
        os.close(fd)
    return any(np.frombuffer(data, np.uint8, end - start, start).any()
               for start, end in regions)


def _why_no_record(data, pos: int, offset: int) -> str:
    """Why the bytes at ``pos`` (CommitLog offset ``offset``), not all zeros, are no
    record: the first check of ``record.check_message_and_return_size`` they fail."""
    if pos + 8 > len(data):
        return f"{len(data) - pos} bytes, too few for a record's TOTALSIZE and MAGICCODE"
    total, magic = record.SIZE_MAGIC.unpack_from(data, pos)
    if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2):
        return f"MAGICCODE {magic:#010x} is no message's"
    if total <= record.HEAD.size or pos + total > len(data):
        return f"TOTALSIZE {total} does not fit the {len(data) - pos} bytes left"
    physical = record.HEAD.unpack_from(data, pos)[6]
    if physical != offset:
        return f"PHYSICALOFFSET {physical}, where this record lies at {offset}"
    try:
        record.decode_at(data, pos, check_crc=True)
    except record.RecordFormatError as e:
        return str(e)
    return "the record's fields do not hold together"


def describe_consume_queue(path: str, limit: int | None = None) -> Iterator[dict]:
    with _mapped(path) as data:
        yield from _walk_consume_queue(path, data, limit)


def _walk_consume_queue(path: str, data, limit: int | None) -> Iterator[dict]:
    base = _file_offset(path)
    count = 0
    for pos in range(0, len(data) - len(data) % CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE):
        offset, size, tags_code = CQ_UNIT.unpack_from(data, pos)
        if not (offset >= 0 and size > 0) or (limit is not None and count >= limit):
            break
        yield {"kind": "unit", "queue_offset": (base + pos) // CQ_STORE_UNIT_SIZE,
               "commit_log_offset": offset, "size": size, "tags_code": tags_code,
               "blank": size == BLANK_UNIT_SIZE}
        count += 1
    yield {"kind": "summary", "file": path, "units": count}


def index_geometry(file_size: int, hash_slot_num: int, index_num: int) -> tuple[int, int]:
    """The (slots, entries) of an index file: the configured ones if they fit its size,
    else the RocketMQ ratio of four entries per slot. Raises ``StoreFileError``."""
    if 40 + hash_slot_num * 4 + index_num * 20 == file_size:
        return hash_slot_num, index_num
    if (file_size - 40) % 84 == 0 and file_size > 40:
        slots = (file_size - 40) // 84
        return slots, slots * 4
    raise StoreFileError("", f"an index file of {file_size} bytes matches neither the "
                         "configured max_hash_slot_num/max_index_num nor 4 entries per slot")


def describe_index(path: str, hash_slot_num: int, index_num: int,
                   limit: int | None = None) -> Iterator[dict]:
    """The header, then entries 1 .. indexCount-1, read through a read-only mapping."""
    slots, entries = index_geometry(os.path.getsize(path), hash_slot_num, index_num)
    with _mapped(path) as buf:
        begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = \
            index_file.decode_header(buf)
        yield {"kind": "header", "file": path, "hash_slot_num": slots, "index_num": entries,
               "begin_timestamp": begin_ts, "end_timestamp": end_ts,
               "begin_phy_offset": begin_phy, "end_phy_offset": end_phy,
               "hash_slot_count": slot_count, "index_count": index_count}
        base = index_file.INDEX_HEADER_SIZE + slots * index_file.HASH_SLOT_SIZE
        last = min(max(index_count, 1), entries)
        for no in range(1, last if limit is None else min(last, limit + 1)):
            key_hash, phy, diff, prev = index_file.decode_entry(buf, base + no * index_file.INDEX_SIZE)
            yield {"kind": "entry", "entry": no, "key_hash": key_hash, "phy_offset": phy,
                   "time_diff_s": diff, "pre_index_no": prev}


def describe_checkpoint(path: str) -> Iterator[dict]:
    with open(path, "rb") as f:
        data = f.read(checkpoint_codec.TIMESTAMPS.size)
    physic, logics, index = checkpoint_codec.decode(data.ljust(24, b"\0"))
    yield {"kind": "checkpoint", "file": path, "physic_msg_timestamp": physic,
           "logics_msg_timestamp": logics, "index_msg_timestamp": index}
