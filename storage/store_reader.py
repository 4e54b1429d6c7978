"""StoreReader: a read-only view of a store that another process is writing.

Consumers and the reader process map the store's files themselves and read them while
the writer appends to the CommitLog, the dispatcher builds consume queues and the
index, and the cleaner unlinks expired files. A StoreReader never writes, never takes
the ``lock`` file, never creates a file or a directory, and never truncates anything.

What may be read is bounded by positions the caller passes on every call (from the
shared position table; ``storage`` never imports ``shm``):

    call                                  bound        a thing counts only if
    ------------------------------------  -----------  ----------------------------------
    get_message, get_raw_messages,        dispatched   its consume queue unit has
    read_queue_units, read_queue_records,              offset + size <= dispatched
    get_{min,max}_offset_in_queue,
    get_offset_in_queue_by_time
    query_message                         dispatched   the index hit's offset < dispatched
    look_message_by_offset / _by_id       written      the whole record lies below written

Where each part lives: a queue's bounds and reads within them in
``storage.consume_queue.ConsumeQueueView``, an index file's header snapshots and slot
walks in ``storage.index_file.IndexFileView``, the read path MessageStore shares
(statuses, batch limits, record checks, key queries) in ``storage.read_path``, the
bulk reads' span planning and copying in ``storage.bulk_read``. This module maps the
CommitLog, opens the views and holds the bounds together.

Invariants the reads rely on (DESIGN.md §3):

* units of one queue point at increasing CommitLog offsets and are followed by zeros,
  so "unit n is within the bound" is true for a prefix of every file: the queue's max
  offset is found by binary search over its last file(s), its min offset by binary
  search for the first unit at or above the CommitLog's min offset;
* every record below ``dispatched`` is whole and has its unit written (the dispatcher
  publishes the position only after it wrote them), so units past the bound, all-zero
  units and torn units are "not there yet", never errors;
* before a message is returned, the record its unit points at is checked: magic, size,
  topic, queue id, queue offset and PHYSICALOFFSET must be the unit's. A mismatch raises
  ``CorruptRecordError`` naming the consume queue file and the unit's position, unless
  the unit is still changing (a unit past the bound read while it was being written),
  which ends the batch instead;
* an index file's 40-byte header is re-read at every query (the dispatcher updates it),
  slot chains are walked as ``IndexFile.select_phy_offset`` does, never past indexCount,
  and every hit is re-read and verified, so a stale or torn entry can hide a message
  for a moment but never return a wrong one.

Files that appear and disappear (decision table; "mapped" means mapped by this reader):

    event                              noticed when                          action
    ---------------------------------  ------------------------------------  ----------------
    new CommitLog file (writer rolled) a bound lies past the last mapped     map it (once
                                       file                                  full-size)
    new consume queue file             the last mapped file is full within   map it
    (dispatcher)                       the bound and the next name exists
    new queue directory                first read of the queue               open the queue
    new index file                     every query lists index/              map it once
                                                                             full-size
    CommitLog file unlinked            every call: the first mapped file is  unmap every file
    (cleaner)                          gone, or ends at or below the given   below the first
                                       min_commit_log_offset                 on disk / the min
    consume queue file unlinked        all its units point below the         unmap it
    (cleaner)                          CommitLog min and it is gone
    index file unlinked (cleaner)      every query lists index/              unmap it
    files cut away and re-created by   the caller sees the store restart     ``reopen()``
    a recovery                         (GENERATION moved)

A file unlinked while mapped stays readable until it is unmapped, so a read racing the
cleaner returns correct bytes or, once the file is gone, OFFSET_TOO_SMALL /
MESSAGE_WAS_REMOVING. Index files are mapped without keeping a descriptor; CommitLog and
consume queue files keep theirs (``MappedFile``) until they are dropped.

Statuses, batch limits and query caps are MessageStore's: both answer through
``storage.read_path``. Where the answers can differ:

* a queue's min offset is computed from its units (the first whose message is at or
  above the CommitLog min), not kept as MessageStore's ``min_logic_offset``, which is
  only corrected when MessageStore itself cleans; so a lagging min is never served;
* a queue directory all of whose units lie past the bound reads NO_MESSAGE_IN_QUEUE
  (MessageStore, dispatching before every read, never has that state);
* the "in disk" batch limits measure from ``dispatched`` instead of the written end.

Not thread-safe: one StoreReader per thread (its mapped files' read positions are set
from the bound of the call in progress).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable

from rocketstore.storage.bulk_read import (
    SHORT_READ_UNITS, QueueRecords, QueueUnits, gather_records, plan_short, read_records,
    unit_columns)
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.consume_queue import (BLANK_UNIT_SIZE, CQ_STORE_UNIT_SIZE, CQ_UNIT,
                                   ConsumeQueueView, unit_within)
from rocketstore.storage.errors import CorruptRecordError, StoreClosedError, StoreFileError
from rocketstore.storage.index_file import IndexFileView
from rocketstore.storage.logic_queues import queue_dirs
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.message import MessageExt
from rocketstore.storage.read_path import (
    NOT_YET, GetMessageResult, GetRawMessagesResult, check_unit_raw, check_unit_view,
    check_unit_views, get_from_queue,
    look_message_by_id, memory_limit_bytes, offset_status, query_messages, tags_of_message,
    tags_of_raw)
from rocketstore.storage.status import GetMessageStatus
from rocketstore.storage.validation import check_topic

log = logging.getLogger(__name__)


def _being_written(units: bytes, count: int, dispatched: int, min_phy: int) -> bool:
    """Whether the last of ``count`` units, the last one the bounds counted, is one the
    dispatcher is writing past the bound: read torn, its old offset 0 and its new size
    looked inside the bound. Now it lies past the bound, or (torn still) points below
    the unit before it or below the CommitLog min, which no unit after the queue's min
    does. Read as it is, its record would look expired and be stepped over."""
    if not unit_within(units, count - 1, dispatched):
        return True
    phy, size, _ = CQ_UNIT.unpack_from(units, (count - 1) * CQ_STORE_UNIT_SIZE)
    if size == BLANK_UNIT_SIZE:
        return False
    floor = min_phy
    if count > 1:
        before, before_size, _ = CQ_UNIT.unpack_from(units, (count - 2) * CQ_STORE_UNIT_SIZE)
        if before_size != BLANK_UNIT_SIZE:
            floor = max(floor, before + before_size)
    return phy < floor


def _digit_names(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return []


# ===================================================================== the reader
class StoreReader:
    """A read-only view of the store at ``config.store_path_root_dir``.

    Every read names its bound (see the module docstring). Raises ``StoreClosedError``
    after ``close()``; ``CorruptRecordError`` (file and offset named) for bytes within
    the bound that cannot be what the store wrote.
    """

    def __init__(self, config: StoreConfig):
        self.config = config
        self._memory_limit = memory_limit_bytes(config)
        self._open()

    def _open(self) -> None:
        self._commit_log = CommitLog(self.config, read_only=True)
        self._cl_files = self._commit_log.mapped_file_queue
        self._cl_bound = 0   # the bound the CommitLog's read positions were last set to
        self._queues: dict[tuple[str, int], ConsumeQueueView] = {}
        self._index: dict[str, IndexFileView] = {}
        self._expired_below = -1       # the MIN_OFFSET ``drop_expired`` last followed
        self._closed = False

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Unmap everything and close every descriptor. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._commit_log.close()
        for qv in self._queues.values():
            qv.close()
        self._queues.clear()
        for view in self._index.values():
            view.close()
        self._index.clear()

    def reopen(self) -> None:
        """Drop every mapping; the next read maps the files afresh. Call it when the
        store restarted (a recovery may have cut files away and created new ones under
        the same names)."""
        self.close()
        self._open()

    def __enter__(self) -> "StoreReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the reader of {self.config.store_path_root_dir} is closed")

    # ----------------------------------------------------------------- CommitLog view
    def min_commit_log_offset(self) -> int:
        """The first CommitLog byte still on disk (-1 when there is no file); drops the
        mappings of files the cleaner unlinked."""
        self._check_open()
        return self._commit_log_min(None)

    def drop_expired(self, min_offset: int) -> None:
        """Unmap what the cleaner unlinked: CommitLog files below ``min_offset``, and
        the consume-queue and index files gone from disk (an unlinked file's space comes
        back only once its last mapping goes). A read of a queue drops that queue's
        gone files itself; a reader that is idle, or reads other queues, calls this
        with MIN_OFFSET as often as it likes: it looks again only when that moved."""
        self._check_open()
        if min_offset == self._expired_below:
            return
        self._expired_below = min_offset
        self._commit_log_min(min_offset)
        for key, qv in list(self._queues.items()):
            if not qv.drop_unlinked():
                self._queues.pop(key).close()     # every file went: mapped again if read
        for name in [n for n, view in self._index.items() if not os.path.exists(view.path)]:
            self._index.pop(name).close()

    def _commit_log_min(self, given: int | None) -> int:
        mfq = self._cl_files
        size = mfq.mapped_file_size
        if given is not None:
            first = mfq.get_first_mapped_file()
            if first is not None and first.file_from_offset + size <= given:
                mfq.refresh(min_offset=given)
            return given
        first = mfq.get_first_mapped_file()
        if first is None:
            mfq.refresh()
            return mfq.get_min_offset()
        if os.path.exists(first.path):
            return first.file_from_offset
        names = _digit_names(mfq.store_path)
        if not names:
            return first.file_from_offset
        on_disk = int(names[0])
        for _ in range(2):  # refresh keeps the last file; a second pass drops it too
            mfq.refresh(min_offset=on_disk)
        return max(on_disk, mfq.get_min_offset())

    def _bound_commit_log(self, end: int) -> None:
        """Map files up to ``end`` and set every file's read position to ``end``."""
        mfq = self._cl_files
        size = mfq.mapped_file_size
        last = mfq.get_last_mapped_file()
        if last is None or last.file_from_offset + size < end:
            mfq.refresh()
        floor = min(self._cl_bound, end)
        for mf in reversed(mfq.mapped_files):
            start = mf.file_from_offset
            if start + size <= floor:
                break  # whole under this bound and the last one: already set whole
            mf.set_positions(min(max(end - start, 0), size))
        self._cl_bound = end

    def _read_record(self, phy: int, size: int, min_phy: int,
                     take=MappedFile.read) -> bytes | memoryview | None:
        """The ``size`` bytes at ``phy`` if they lie below the bound in a mapped file: a
        copy, or what ``take`` (``MappedFile.view``) gives. (Not
        ``CommitLog.get_message``: for offset 0 it falls back to the first file, which
        after expiry holds other bytes.)"""
        if phy < min_phy:
            return None
        mf = self._cl_files.find_mapped_file_by_offset(phy)
        return take(mf, phy - mf.file_from_offset, size) if mf is not None else None

    # ----------------------------------------------------------------- queues
    def _queue(self, topic: str, queue_id: int) -> ConsumeQueueView | None:
        qv = self._queues.get((topic, queue_id))
        if qv is None:
            if check_topic(topic, internal=True) or not isinstance(queue_id, int) \
                    or isinstance(queue_id, bool) or queue_id < 0:
                return None
            path = os.path.join(self.config.consume_queue_dir, topic, str(queue_id))
            if not os.path.isdir(path):
                return None
            qv = self._queues[(topic, queue_id)] = ConsumeQueueView(
                topic, queue_id, self.config.consume_queue_dir, self.config.consume_queue_file_size)
        return qv

    def topics(self) -> dict[str, list[int]]:
        """Every queue with a directory under consumequeue/: topic -> sorted queue ids."""
        self._check_open()
        out: dict[str, list[int]] = {}
        for topic, queue_id, _ in queue_dirs(self.config.consume_queue_dir):
            out.setdefault(topic, []).append(queue_id)
        return {topic: sorted(queue_ids) for topic, queue_ids in out.items()}

    def queue_ids(self, topic: str) -> list[int]:
        """The queues of one topic with a directory under consumequeue/, sorted (what
        ``topics()`` says of it, without listing every other topic)."""
        self._check_open()
        try:
            names = os.listdir(os.path.join(self.config.consume_queue_dir, topic))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def get_max_offset_in_queue(self, topic: str, queue_id: int, dispatched: int) -> int:
        """The number of units within ``dispatched`` (0 for an unknown queue)."""
        bounds = self.queue_bounds(topic, queue_id, dispatched)
        return bounds[1] if bounds else 0

    def queue_bounds(self, topic: str, queue_id: int, dispatched: int, *,
                     min_commit_log_offset: int | None = None) -> tuple[int, int] | None:
        """``(min, max)`` logical offsets of a queue within ``dispatched``; None for an
        unknown queue."""
        self._check_open()
        qv = self._queue(topic, queue_id)
        return qv.bounds(dispatched, self._commit_log_min(min_commit_log_offset)) if qv else None

    def get_min_offset_in_queue(self, topic: str, queue_id: int, dispatched: int, *,
                                min_commit_log_offset: int | None = None) -> int:
        """The first unit whose message still exists (-1 for an unknown queue)."""
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return -1
        return qv.bounds(dispatched, self._commit_log_min(min_commit_log_offset))[0]

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int,
                                    dispatched: int, *,
                                    min_commit_log_offset: int | None = None) -> int:
        """``ConsumeQueue.get_offset_in_queue_by_time`` within ``dispatched`` (0 for an
        unknown queue)."""
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return 0
        min_phy = self._commit_log_min(min_commit_log_offset)
        qv.bounds(dispatched, min_phy)
        self._bound_commit_log(dispatched)
        return qv.get_offset_in_queue_by_time(timestamp_ms, min_phy,
                                              self._commit_log.pickup_store_timestamp)

    # ----------------------------------------------------------------- pull
    def get_message(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                    dispatched: int, tags: Iterable[str] | None = None, *,
                    min_commit_log_offset: int | None = None) -> GetMessageResult:
        """MessageStore's ``get_message`` within ``dispatched``, its messages as
        ``MessageView``s (decoded on demand).

        ``min_commit_log_offset`` (the MIN_OFFSET slot) is trusted when given, else the
        first CommitLog file on disk is. Raises ``CorruptRecordError`` when a unit
        within the bound points at a record that is not its message.
        """
        return self._pull(topic, queue_id, offset, max_msgs, dispatched, tags,
                          min_commit_log_offset, check_unit_view, tags_of_message)

    def get_raw_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                         dispatched: int, tags: Iterable[str] | None = None, *,
                         min_commit_log_offset: int | None = None) -> GetRawMessagesResult:
        """``get_message`` returning each record's bytes as the CommitLog holds them
        (checked the same way, never decoded unless ``tags`` filters)."""
        r = self._pull(topic, queue_id, offset, max_msgs, dispatched, tags,
                       min_commit_log_offset, check_unit_raw, tags_of_raw)
        return GetRawMessagesResult(r.status, r.messages, r.next_begin_offset, r.min_offset,
                                    r.max_offset)

    def _pull(self, topic: str, queue_id: int, offset: int, max_msgs: int, dispatched: int,
              tags: Iterable[str] | None, min_hint: int | None, check: Callable,
              tags_of: Callable) -> GetMessageResult:
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        min_phy = self._commit_log_min(min_hint)
        lo, hi = qv.bounds(dispatched, min_phy)
        if lo <= offset < hi:
            self._bound_commit_log(dispatched)

        def read_unit(index: int, phy: int, size: int, where: tuple[str, int]):
            if phy < min_phy:
                # no unit from the queue's min on (the only ones read) points below the
                # CommitLog min: this one is being written past the bound, read torn
                # (offset 0, its size)
                return NOT_YET
            data = self._read_record(phy, size, min_phy)
            if data is None:
                return None
            try:
                return check(data, topic, queue_id, index, phy, size, where)
            except CorruptRecordError:
                if qv.unit_changing(where, (phy, size)):
                    return NOT_YET
                raise

        return get_from_queue(qv, offset, max_msgs, tags, lo, hi, read_unit,
                              config=self.config, max_phy=dispatched,
                              memory_limit=self._memory_limit,
                              roll_next_file=self._commit_log.roll_next_file, tags_of=tags_of)

    # ----------------------------------------------------------------- look
    def look_message_by_offset(self, commit_log_offset: int, written: int) -> MessageExt | None:
        """The message whose record starts at ``commit_log_offset`` and ends at or below
        ``written``; None when none does (or it is gone). Raises ``CorruptRecordError``
        when a record starts there but fails a check (its CRC included)."""
        self._check_open()
        return self._look(commit_log_offset, written, self._commit_log_min(None))

    def _look(self, phy: int, bound: int, min_phy: int) -> MessageExt | None:
        if phy < min_phy or phy >= bound:
            return None
        self._bound_commit_log(bound)
        return self._commit_log.look_message_by_offset(phy)

    def look_message_by_id(self, msg_id: str, written: int) -> MessageExt | None:
        """The message an offset msgId names, within ``written``. Raises ``ValueError``
        for text that is not a msgId."""
        self._check_open()
        min_phy = self._commit_log_min(None)
        return look_message_by_id(lambda phy: self._look(phy, written, min_phy), msg_id)

    def read_record(self, commit_log_offset: int, size: int, written: int) -> bytes | None:
        """The raw bytes of the record at ``commit_log_offset`` (``size`` long) if it
        lies below ``written`` and is still on disk (for replies that ship records)."""
        self._check_open()
        if commit_log_offset + size > written:
            return None
        self._bound_commit_log(written)
        return self._read_record(commit_log_offset, size, self._commit_log_min(None))

    # ----------------------------------------------------------------- query
    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
                      dispatched: int) -> list[MessageExt]:
        """MessageStore's ``query_message`` within ``dispatched``: messages of ``topic``
        whose key or unique key is ``key``, stored in ``[begin_ms, end_ms]``, oldest
        first, at most ``min(max_num, max_msgs_num_batch)``."""
        self._check_open()
        files = self._index_files()
        for f in files:
            f.snapshot()
        files = [f for f in files if not f.unborn]
        min_phy = self._commit_log_min(None)
        return query_messages(files, lambda phy: self._look(phy, dispatched, min_phy),
                              self.config.max_msgs_num_batch, topic, key, max_num,
                              begin_ms, end_ms).messages

    # ----------------------------------------------------------------- bulk reads
    def read_queue_units(self, topic: str, queue_id: int, offset: int, max_units: int,
                         dispatched: int, *,
                         min_commit_log_offset: int | None = None) -> QueueUnits:
        """The raw 20-byte units of ``topic``/``queue_id`` from logical ``offset``, for
        readers that decode in bulk (the Spark source): at most ``max_units``, never
        past the queue's max within ``dispatched`` nor past the end of the consume queue
        file holding ``offset`` (ask again from ``first + count`` for more).

        ``first`` is ``max(offset, min)``: when it is larger than ``offset`` the units
        in between expired. Blank (filler) units are returned as they lie; callers skip
        them (``size == BLANK_UNIT_SIZE``). ``count`` is 0 for an unknown queue or an
        offset at or past the max.
        """
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return QueueUnits(b"", offset, 0, 0, 0)
        min_phy = self._commit_log_min(min_commit_log_offset)
        lo, hi = qv.bounds(dispatched, min_phy)
        first = max(offset, lo)
        if first >= hi or max_units <= 0:
            return QueueUnits(b"", first, 0, lo, hi)
        units = qv.read_units(first, max_units, hi)   # empty: its file went meanwhile
        count = len(units) // CQ_STORE_UNIT_SIZE
        if count and first + count == hi and _being_written(units, count, dispatched, min_phy):
            count, hi = count - 1, hi - 1           # not there yet
            units = units[:count * CQ_STORE_UNIT_SIZE]
        return QueueUnits(units, first, count, lo, hi)

    def read_queue_records(self, topic: str, queue_id: int, offset: int, max_units: int,
                           max_bytes: int, dispatched: int, *,
                           min_commit_log_offset: int | None = None,
                           at_least_one: bool = True, joined: bool = False,
                           gathered: bool = False) -> QueueRecords:
        """``read_queue_units`` with the records the units point at (``storage.bulk_read``):
        units from ``offset`` while their records fit ``max_bytes`` (a first record over
        it still comes when ``at_least_one``), one consume queue file at most. The
        records are not checked: the caller checks each against its unit.

        The status is ``offset_status``'s for an offset outside the queue,
        NO_MATCHED_LOGIC_QUEUE for an unknown queue, and OFFSET_FOUND_NULL when the
        consume queue file or the first records' CommitLog file went while being read
        (``next_begin_offset`` is past them). ``joined``: the records in one ``bytes``
        at ``starts`` (``bulk_read.plan_joined``), for a reader that decodes them here.
        ``gathered``: the records back to back in one numpy array, copied once from the
        mapping and nothing else of the CommitLog copied (``bulk_read.gather_records``),
        for a reader that ships them on."""
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return QueueRecords(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, offset, 0, 0, 0, 0,
                                b"", [], 0)
        min_phy = self._commit_log_min(min_commit_log_offset)
        got = self.read_queue_units(topic, queue_id, offset, max_units, dispatched,
                                    min_commit_log_offset=min_phy)
        lo, hi = got.min_offset, got.max_offset
        early = offset_status(offset, lo, hi)
        if early is not None:
            return QueueRecords(early.status, offset, 0, early.next_begin_offset, lo, hi,
                                b"", [], 0)
        if got.count == 0:  # the consume queue file went meanwhile
            return QueueRecords(GetMessageStatus.OFFSET_FOUND_NULL, offset, 0,
                                qv.roll_next_file(offset), lo, hi, b"", [], 0)
        if gathered:
            return gather_records(got, max_bytes, at_least_one,
                                  self.config.mapped_file_size_commit_log,
                                  lambda phy, size: self._copy(phy, size, dispatched, min_phy,
                                                               MappedFile.view))
        return read_records(got, max_bytes, at_least_one,
                            self.config.mapped_file_size_commit_log,
                            lambda phy, size: self._copy(phy, size, dispatched, min_phy),
                            joined=joined)

    def nothing_new(self, topic: str, queue_id: int, offset: int, dispatched: int) -> bool:
        """Whether a queue read to its end at ``offset`` still ends there within
        ``dispatched``, told from its one unit at ``offset``
        (``ConsumeQueueView.nothing_at``): True only when that is certain; False when
        the queue may have grown, or is not mapped here yet."""
        self._check_open()
        qv = self._queues.get((topic, queue_id))
        return qv is not None and qv.nothing_at(offset, dispatched)

    def read_few(self, topic: str, queue_id: int, offset: int, max_units: int,
                 max_bytes: int, dispatched: int, min_phy: int
                 ) -> tuple[GetMessageResult, int] | None:
        """A consumer's usual read, a few messages at the end of a queue it keeps up
        with, in one step: what ``read_queue_records(joined=True)`` and
        ``read_path.bulk_result`` make of it (FOUND with the messages' views and the
        bytes of their records), with the same bounds and the same checks of every unit
        and record, without their layers (each its own call with its own lookups: a
        poll of 20 messages from 8 queues costs about a sixth less). None for any other
        read, which the caller makes the general way: an
        offset outside the bounds, ``SHORT_READ_UNITS`` or more units, records that are
        not one span of one CommitLog file within ``max_bytes``
        (``bulk_read.plan_short``), a last unit being written, a file gone, a record
        that is not its unit's. ``min_phy`` is the CommitLog min the caller gave
        ``queue_bounds`` for this ``dispatched`` just before."""
        self._check_open()
        qv = self._queues.get((topic, queue_id))
        if qv is None:
            return None
        lo, hi = qv.bounds(dispatched, min_phy)
        if not lo <= offset < hi:
            return None
        units = qv.read_units(offset, min(max_units, SHORT_READ_UNITS - 1), hi)
        n = len(units) // CQ_STORE_UNIT_SIZE
        if not n or (offset + n == hi and _being_written(units, n, dispatched, min_phy)):
            return None
        columns = unit_columns(units)
        plan = plan_short(units, max_bytes, self.config.mapped_file_size_commit_log,
                          columns=columns)
        if plan is None:
            return None
        begin = plan.begins[0]
        data = self._copy(begin, plan.ends[0] - begin, dispatched, min_phy)
        if data is None:
            return None
        try:
            views = check_unit_views(units, [data], topic, queue_id, offset, plan.starts,
                                     columns=columns)
        except CorruptRecordError:
            return None
        return (GetMessageResult(GetMessageStatus.FOUND, views, offset + n, lo, hi),
                sum(columns[1]))

    def first_offset_stored_since(self, topic: str, queue_id: int, timestamp_ms: int,
                                  dispatched: int, *,
                                  min_commit_log_offset: int | None = None) -> int:
        """The first logical offset whose message was stored at or after
        ``timestamp_ms`` (Kafka's offsetsForTimes), or the queue's max within
        ``dispatched`` when none was; -1 for an unknown queue.

        Unlike ``get_offset_in_queue_by_time`` (RocketMQ's nearest message, which may be
        an earlier one) this never starts before the timestamp. Store times never
        decrease along the CommitLog, so along a queue either: a binary search reads
        about log2(n) records. A unit whose record expired meanwhile counts as earlier.
        """
        self._check_open()
        qv = self._queue(topic, queue_id)
        if qv is None:
            return -1
        min_phy = self._commit_log_min(min_commit_log_offset)
        lo, hi = qv.bounds(dispatched, min_phy)
        self._bound_commit_log(dispatched)
        return qv.first_offset_stored_since(timestamp_ms, lo, hi,
                                            self._commit_log.pickup_store_timestamp)

    def read_commit_log(self, commit_log_offset: int, size: int, dispatched: int) -> bytes | None:
        """A copy of ``size`` CommitLog bytes from ``commit_log_offset`` when they lie in
        one file, at or above the CommitLog's min and below ``dispatched``; else None.
        Bulk readers copy the span covering a batch of records in one call."""
        self._check_open()
        return self._copy(commit_log_offset, size, dispatched, self._commit_log_min(None))

    def _copy(self, commit_log_offset: int, size: int, dispatched: int,
              min_phy: int, take=MappedFile.read) -> bytes | memoryview | None:
        if size < 0 or commit_log_offset + size > dispatched:
            return None
        self._bound_commit_log(dispatched)
        return self._read_record(commit_log_offset, size, min_phy, take)

    def commit_log_view(self, commit_log_offset: int, size: int,
                        dispatched: int) -> memoryview | None:
        """``read_commit_log`` without the copy: a read-only memoryview of the mapped
        bytes. The caller drops it before this reader moves on (``drop_expired``,
        ``close``): a mapping closed while a view of it lives stays mapped until the view
        goes."""
        self._check_open()
        return self._copy(commit_log_offset, size, dispatched, self._commit_log_min(None),
                          MappedFile.view)

    def _index_files(self) -> list[IndexFileView]:
        """The index files on disk now, oldest first: new ones mapped, gone ones dropped."""
        index_dir = self.config.index_dir
        names = [n for n in _digit_names(index_dir)]
        present = set(names)
        for name in [n for n in self._index if n not in present]:
            self._index.pop(name).close()
        files = []
        for name in names:
            view = self._index.get(name)
            if view is None:
                try:
                    view = IndexFileView(os.path.join(index_dir, name), self.config.max_hash_slot_num,
                                      self.config.max_index_num)
                except (OSError, StoreFileError, ValueError):
                    continue  # being created (not full size yet) or gone already
                self._index[name] = view
            files.append(view)
        return files
