"""The topic-queue table of a writer that (re)starts while the rest of the store runs.

The table maps ``(topic, queue_id)`` to the next queue offset the writer will stamp on a
NOT/COMMIT message of that queue (RocketMQ's ``topicQueueTable``). The embedded store
rebuilds it at recovery from the consume queues (``recoverTopicQueueTable``, SPEC
§4.10.10), after dispatch caught up with the whole CommitLog. A writer process that
restarts cannot wait for that: the dispatcher may be behind, and may be writing units at
the very moment the writer reads them. ``rebuild`` takes two published positions instead:

    source                       covers                  gives
    ---------------------------  ----------------------  -------------------------------------
    consume queue units (read    messages ending at or   per queue: index + 1 of the last unit
    only; never written or cut)  below DISPATCHED        whose CommitLog end <= DISPATCHED
    CommitLog records            [DISPATCHED, WRITTEN)   per NOT/COMMIT record, in order:
                                                         its QUEUEOFFSET + 1

Why the result is exact:

* Everything below DISPATCHED is in the consume queues: the dispatcher publishes
  DISPATCHED only after the units of every message below it are written, and queue
  offsets are dense (0, 1, 2, ... in CommitLog order), so the number of units whose
  message ends at or below DISPATCHED is that queue's next offset as of DISPATCHED.
  Units past DISPATCHED (written ahead of the published position, or torn mid-write)
  are ignored here; their messages are counted by the CommitLog walk.
* Everything above DISPATCHED is in the CommitLog: every byte below WRITTEN is a whole
  record or a BLANK (the writer publishes WRITTEN only after the bytes are copied), and
  each record carries the QUEUEOFFSET the writer that appended it stamped, so walking
  [DISPATCHED, WRITTEN) in order brings every queue to its state as of WRITTEN.
  PREPARED/ROLLBACK records carry 0 and take no offset; they are skipped.
* Nothing above WRITTEN counts: the restarting writer cuts the CommitLog there first.

The units are searched, not scanned: within a queue the units are in CommitLog order, so
"ends at or below DISPATCHED" holds for a prefix of each file (blank filler units at
the start of a queue count as part of it); a binary search finds the prefix's end with
``pread`` (about 20 reads per queue, no mapping). The candidate unit is then checked
against the record it points at (size, topic, queue id, queue offset) when that record
is still on disk; a unit that fails (torn: the dispatcher writes units while we read)
is excluded and the search runs again below it.
"""

from __future__ import annotations

import logging
import os

from rocketstore.storage import record
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE, CQ_STORE_UNIT_SIZE, CQ_UNIT
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message import is_consumable
from rocketstore.storage.validation import check_topic

log = logging.getLogger(__name__)

TopicQueueTable = dict[tuple[str, int], int]


def rebuild(config: StoreConfig, commit_log: CommitLog, dispatched: int,
            written: int) -> TopicQueueTable:
    """The next queue offset of every queue as of ``written`` (see the module docstring).

    ``commit_log`` must map every file from the one holding ``dispatched`` to the one
    holding ``written``. Raises ``CorruptRecordError`` when the CommitLog between them is
    not whole records (WRITTEN promised it is).
    """
    if dispatched > written:
        raise ValueError(f"DISPATCHED {dispatched} is past WRITTEN {written}")
    table: TopicQueueTable = {}
    first_file = commit_log.mapped_file_queue.get_first_mapped_file()
    min_offset = first_file.file_from_offset if first_file else written
    for topic, queue_id, path in _queue_dirs(config.consume_queue_dir):
        nxt = _next_offset_from_units(path, topic, queue_id, config.consume_queue_file_size,
                                      dispatched, commit_log, min_offset)
        if nxt is not None:
            table[(topic, queue_id)] = nxt
    _walk_commit_log(commit_log, dispatched, written, table)
    return table


# ------------------------------------------------------------------------------ consume queues
def _queue_dirs(root: str):
    """``(topic, queue_id, path)`` of every consume queue directory under ``root``."""
    if not os.path.isdir(root):
        return
    for topic in sorted(os.listdir(root)):
        topic_dir = os.path.join(root, topic)
        if check_topic(topic, internal=True) or not os.path.isdir(topic_dir):
            continue
        for name in sorted(os.listdir(topic_dir)):
            if name.isdigit() and os.path.isdir(os.path.join(topic_dir, name)):
                yield topic, int(name), os.path.join(topic_dir, name)


def _next_offset_from_units(path: str, topic: str, queue_id: int, file_size: int,
                            dispatched: int, commit_log: CommitLog,
                            min_offset: int) -> int | None:
    """index + 1 of the queue's last unit ending at or below ``dispatched``; None when
    it has none. Files are read newest first until one holds such a unit."""
    names = sorted((n for n in os.listdir(path) if n.isdigit()), reverse=True)
    for name in names:
        try:
            fd = os.open(os.path.join(path, name), os.O_RDONLY)
        except FileNotFoundError:  # deleted by the cleaner meanwhile
            continue
        try:
            units = min(os.fstat(fd).st_size, file_size) // CQ_STORE_UNIT_SIZE
            first_index = int(name) // CQ_STORE_UNIT_SIZE
            found = _last_unit_at_or_below(fd, units, first_index, dispatched,
                                           lambda index, unit: _unit_matches(
                                               commit_log, min_offset, topic, queue_id,
                                               index, unit))
        finally:
            os.close(fd)
        if found is not None:
            return first_index + found + 1
    return None


def _read_unit(fd: int, i: int) -> tuple[int, int, int] | None:
    raw = os.pread(fd, CQ_STORE_UNIT_SIZE, i * CQ_STORE_UNIT_SIZE)
    return CQ_UNIT.unpack(raw) if len(raw) == CQ_STORE_UNIT_SIZE else None


def _is_below(unit: tuple[int, int, int] | None, dispatched: int) -> bool:
    if unit is None:
        return False
    offset, size, _ = unit
    if size == BLANK_UNIT_SIZE and offset == 0:
        return True  # filler before a queue's first unit
    return offset >= 0 and size > 0 and offset + size <= dispatched


def _last_unit_at_or_below(fd: int, units: int, first_index: int, dispatched: int,
                           matches) -> int | None:
    """The position (in this file) of the last unit ending at or below ``dispatched``
    that ``matches(index, unit)`` confirms, or None."""
    hi = units
    while hi > 0:
        lo, top = 0, hi  # invariant: units [0, lo) are below; [top, hi) are not
        while lo < top:
            mid = (lo + top) // 2
            if _is_below(_read_unit(fd, mid), dispatched):
                lo = mid + 1
            else:
                top = mid
        if lo == 0:
            return None
        candidate = lo - 1
        if matches(first_index + candidate, _read_unit(fd, candidate)):
            return candidate
        log.warning("consume queue unit %d (file offset %d) does not match its record: "
                    "torn or stale, searching below it", first_index + candidate,
                    candidate * CQ_STORE_UNIT_SIZE)
        hi = candidate
    return None


def _unit_matches(commit_log: CommitLog, min_offset: int, topic: str, queue_id: int,
                  index: int, unit: tuple[int, int, int] | None) -> bool:
    """True when the record the unit points at is unit ``index`` of this queue; also
    True for a blank filler unit and for a unit whose record was already deleted."""
    if unit is None:
        return False
    offset, size, _ = unit
    if size == BLANK_UNIT_SIZE or offset < min_offset:
        return True
    data = commit_log.get_message(offset, size)
    if data is None:
        return True  # beyond the mapped files: cannot check, the unit was whole when read
    req = record.check_message_and_return_size(data, 0, len(data), offset, False)
    return (req.success and req.msg_size == size and req.topic == topic
            and req.queue_id == queue_id and req.consume_queue_offset == index)


# ------------------------------------------------------------------------------ commitlog
def _walk_commit_log(commit_log: CommitLog, start: int, end: int, table: TopicQueueTable) -> None:
    """Advance ``table`` with every NOT/COMMIT record in [start, end)."""
    mfq = commit_log.mapped_file_queue
    check = record.check_message_and_return_size
    offset = start
    while offset < end:
        mf = mfq.find_mapped_file_by_offset(offset)
        if mf is None:
            raise CorruptRecordError(commit_log.config.commit_log_dir, offset,
                                     f"no commitlog file holds offset {offset} below WRITTEN {end}")
        pos = offset - mf.file_from_offset
        req = check(mf.buf, pos, mf.file_size, offset, False)
        if req.success and req.msg_size > 0:
            if offset + req.msg_size > end:
                raise CorruptRecordError(mf.path, offset, f"record of {req.msg_size} bytes "
                                         f"runs past WRITTEN {end}")
            if is_consumable(req.sys_flag):
                table[(req.topic, req.queue_id)] = req.consume_queue_offset + 1
            offset += req.msg_size
        elif req.success:  # the BLANK at the end of a file
            offset = mf.file_from_offset + mf.file_size
        else:
            raise CorruptRecordError(mf.path, offset,
                                     f"not a whole record below WRITTEN {end}")
