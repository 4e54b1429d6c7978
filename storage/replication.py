"""CommitLog bytes as replication sees them: a tail to compare, whole records to publish.

A slave's CommitLog is its master's, byte for byte, at the same offsets in the same
files (RocketMQ's HAClient appends what it receives verbatim, never parsing it). Two
questions about those bytes need answers of their own:

- *Do two stores hold the same bytes before an offset?* ``tail_check`` is the crc32 of
  the ``TAIL_CHECK_BYTES`` (or fewer: never before the file's start) bytes before it,
  read from the file itself (``pread``: no mapping needed, the page cache is shared).
  A slave sends it in HELLO; the master compares it with its own bytes there.
- *Where do the whole records end?* The master streams blocks blind to message
  boundaries; the slave appends each as it comes but publishes WRITTEN (which promises
  whole records below it) only up to the last record that arrived whole:
  ``whole_records_end`` walks the TOTALSIZE chain from there. A BLANK closes its file:
  the walk goes on at the next file's start.
- *Where must a diverged slave cut?* At the last record boundary at or before the first
  byte that differs from its master (``last_boundary_at_or_before``): the bytes before
  it are the master's, so its records are too. The writer cannot move WRITTEN back while
  the store runs, so it asks (``request_cut``: ``config/haCutRequest.json``); the
  supervisor stops the processes, cuts the CommitLog keeping the cut bytes in
  ``quarantine/`` (``apply_cut``: a row of its start's table, storage.recovery_plan;
  recorded in ``config/haCuts.json``), and
  starts them again; recovery cuts the consume queues and index to match.
- *Which of a slave's bytes came from a master?* Those from ``followed_from`` on
  (``config/haFollowedFrom.json``): a store's writer notes its WRITTEN there when it
  starts as a SLAVE, unless a lower offset is noted already (``note_following``), and
  forgets it when it starts as a master (its bytes are its own from then on). Bytes a
  SYNC_MASTER sent may have been acknowledged on the slave's word: a slave never cuts
  those (``procs.replica``).
"""

from __future__ import annotations

import mmap
import os
import zlib

from rocketstore.storage import json_file, record
from rocketstore.storage.clock import now_ms
from rocketstore.storage.mapped_file import offset_to_file_name

TAIL_CHECK_BYTES = 4096
_SIZE_MAGIC = record.SIZE_MAGIC
_LONG = record.LONG
_SYSFLAG = record.INT
_BLANK = record.BLANK_MAGIC_CODE
_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)


def read_range(commit_log_dir: str, file_size: int, offset: int, length: int) -> bytes:
    """``length`` CommitLog bytes from ``offset``, within one file (fewer when the file
    is shorter). Raises ``FileNotFoundError`` when the file is not there."""
    path = os.path.join(commit_log_dir, offset_to_file_name(offset - offset % file_size))
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset % file_size)
    finally:
        os.close(fd)


def tail_check(commit_log_dir: str, file_size: int, offset: int,
               length: int = TAIL_CHECK_BYTES) -> tuple[int, int]:
    """``(n, crc32)`` of the last ``n`` bytes before ``offset`` that end with a non-zero
    byte: trailing zeros (the filler after a file's BLANK, which two different
    histories share) are passed over, so the bytes compared are records' (or a BLANK's
    header). ``n`` is at most ``length`` and never reaches before the start of the
    file holding byte ``offset - 1``. ``(0, 0)`` at offset 0, or when that file is not
    there (expired). Raises ``ValueError`` when the file ends before ``offset``."""
    if offset <= 0:
        return 0, 0
    base = (offset - 1) - (offset - 1) % file_size
    end = offset
    while end > base:                      # the last non-zero byte, a MiB at a time
        size = min(end - base, 1 << 20)
        try:
            chunk = read_range(commit_log_dir, file_size, end - size, size)
        except FileNotFoundError:
            return 0, 0
        if len(chunk) != size:
            raise ValueError(f"the CommitLog file holding {offset - 1} ends before it")
        kept = chunk.rstrip(b"\0")
        if kept:
            stop = end - size + len(kept)
            start = max(base, stop - length)
            if start < end - size:                 # the tail begins before this chunk
                kept = read_range(commit_log_dir, file_size, start, stop - start)
            tail = kept[start - stop:]
            return len(tail), zlib.crc32(tail)
        end -= size
    return 0, 0


def whole_records_end(buf, file_from: int, pos: int, limit: int,
                      last_store_ts: int) -> tuple[int, int]:
    """Walk the records of one file's bytes ``buf`` from ``pos`` (a record's start)
    while each lies whole below ``limit``. Returns ``(end, store_ts)``: the file
    position after the last whole record (a BLANK ends the file: its size), and the
    store timestamp of the last message passed (``last_store_ts`` when none).

    Raises ``ValueError`` at bytes that are no record (a slave must never publish
    them): the offset is named."""
    size_of_file = len(buf)
    while pos + 8 <= limit:
        size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic == _BLANK:
            if pos + size != size_of_file:
                raise ValueError(f"a BLANK at {file_from + pos} of {size} bytes does not end "
                                 "its file")
            if limit < size_of_file:
                break            # the file's zeros are still coming
            return size_of_file, last_store_ts
        if magic not in _MAGICS or size <= 0 or pos + size > size_of_file:
            raise ValueError(f"no record at CommitLog offset {file_from + pos} "
                             f"(size {size}, magic {magic:#x})")
        if pos + size > limit:
            break
        sys_flag = _SYSFLAG.unpack_from(buf, pos + record.SYSFLAG_POS)[0]
        last_store_ts = _LONG.unpack_from(buf, pos + record.store_timestamp_pos(sys_flag))[0]
        pos += size
    return pos, last_store_ts


# ------------------------------------------------------------------ cutting a diverged tail
CUT_REQUEST_FILE = "haCutRequest.json"
CUT_HISTORY_FILE = "haCuts.json"
FOLLOWED_FILE = "haFollowedFrom.json"
MAX_CUTS_KEPT = 20


def note_following(config_dir: str, written: int) -> None:
    """A store starting as a SLAVE: its bytes from ``written`` on will be its master's.
    An earlier note stays when it is lower (a restarted slave's bytes are the master's
    from the first), and comes down to ``written`` when that is lower (a crash or a cut
    took the slave's tail: what it receives again is the master's)."""
    followed = followed_from(config_dir)
    if followed is None or written < followed:
        json_file.persist(os.path.join(config_dir, FOLLOWED_FILE),
                          {"offset": written, "noted_ms": now_ms()})


def forget_following(config_dir: str) -> None:
    """A store starting as a master: the bytes it writes from now on are its own."""
    json_file.remove(os.path.join(config_dir, FOLLOWED_FILE))


def followed_from(config_dir: str) -> int | None:
    """Where this store's bytes received from a master begin (None: it never followed
    one, or is a master now)."""
    doc = json_file.load(os.path.join(config_dir, FOLLOWED_FILE))
    return None if doc is None else int(doc["offset"])


def last_boundary_at_or_before(commit_log_dir: str, file_size: int, offset: int) -> int:
    """The last record boundary of this store's CommitLog at or before ``offset``,
    walking the records from the start of the file holding it (files start with a
    record). Raises ``ValueError`` at bytes that are no record."""
    base = offset - offset % file_size
    if offset == base:
        return offset
    path = os.path.join(commit_log_dir, offset_to_file_name(base))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        end, _ = whole_records_end(memoryview(m), base, 0, offset - base, 0)
        return base + end


def request_cut(config_dir: str, offset: int, **facts: object) -> None:
    """Ask the supervisor to cut the CommitLog back to ``offset`` at its next start
    (``apply_cut``); ``facts`` say why, for the log and status."""
    json_file.persist(os.path.join(config_dir, CUT_REQUEST_FILE),
                      {"offset": offset, "requested_ms": now_ms(), **facts})


def requested_cut(config_dir: str) -> dict | None:
    return json_file.load(os.path.join(config_dir, CUT_REQUEST_FILE))


def cuts_made(config_dir: str) -> list[dict]:
    """The cuts this store made, oldest first (``status`` shows them)."""
    return (json_file.load(os.path.join(config_dir, CUT_HISTORY_FILE)) or {}).get("cuts", [])


def apply_cut(config, request: dict) -> dict:
    """Before recovery, with no process running (row S3 or S4 of
    storage.recovery_plan): cut the CommitLog at the offset ``request`` (what
    ``requested_cut`` read) asks for. Every byte cut is kept under ``quarantine/``
    (never destroyed); recovery then finds the CommitLog ending there and cuts consume
    queues and index to match. The cut joins ``haCuts.json`` and the request's file
    goes. Returns the cut as recorded."""
    from rocketstore.storage.commit_log import CommitLog
    offset = int(request["offset"])
    cl = CommitLog(config)
    try:
        cl.load()
        quarantine = cl.quarantine_dir()
        cl.mapped_file_queue.truncate_dirty_files(offset, quarantine)
        cl.mapped_file_queue.flush_all()
    finally:
        cl.close()
    cut = {**request, "cut_ms": now_ms(), "quarantine": quarantine}
    history = cuts_made(config.config_dir)[-(MAX_CUTS_KEPT - 1):] + [cut]
    json_file.persist(os.path.join(config.config_dir, CUT_HISTORY_FILE), {"cuts": history})
    json_file.remove(os.path.join(config.config_dir, CUT_REQUEST_FILE))
    return cut
