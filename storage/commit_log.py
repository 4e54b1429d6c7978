"""CommitLog: the single append-only log of every message, in ``{root}/commitlog/``.

The record layout is in ``storage.record``; this module owns the files and the append
path. Files are ``mapped_file_size_commit_log`` bytes (1 GiB by default), named by their
20-digit start offset; the next file is made (sparse) when one is created. Their blocks
are reserved as they fill (``storage.reservation``): every copy into a file is preceded
by ``MappedFile.reserve`` up to its end, so a full disk refuses the put
(CREATE_MAPEDFILE_FAILED, the reason naming the file and ENOSPC) instead of a page fault
killing the appender with SIGBUS.

Append (``put_message`` in RocketMQ, here ``prepare`` + ``append``):

1. ``prepare`` (no lock needed): validate sizes, apply the delay rewrite, encode the
   record with placeholders for the three values only the appender knows;
2. ``append`` (the single appender): for each record take the last file (create it when
   there is none or it is full); if ``record + 8`` bytes do not fit, fill the rest of the
   file with a BLANK record and move to the next file; reserve the file's blocks up to
   the record's end; stamp QUEUEOFFSET (from the topic-queue table), PHYSICALOFFSET and
   STORETIMESTAMP; copy it in; advance the wrote position and the topic-queue table
   (NOT/COMMIT messages only).

Invariants:

* every byte below a file's wrote position is a whole record or a BLANK;
* PHYSICALOFFSET of a record equals where it lies; QUEUEOFFSET values of a (topic, queue)
  are 0, 1, 2, ... in CommitLog order (PREPARED/ROLLBACK records carry 0 and take none);
* ``topic_queue_table[(topic, queue_id)]`` is the next queue offset of that queue.

Recovery: which scan runs (``recover_normally``, ``recover_abnormally``) and what follows
it is decided in one place, table R of ``storage/recovery_plan.py``. Either scan starts
no later than a short tail (``load`` grew it back) and keeps the records up to the first
bad one.

"Bad record": wrong magic, a size that runs past the file or disagrees with the fields,
a PHYSICALOFFSET that is not where the record lies, (``check_crc_on_recover``) a body
CRC mismatch, or a NUL byte in topic or properties. Everything after the first bad
record is cut, so exactly the intact prefix survives: the rest of its file is zeroed and
later files leave the log. Nothing that held data is destroyed: the cut bytes and files
are kept under ``{root}/quarantine/{time}/commitlog/`` for an operator to inspect.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np

from rocketstore.storage import allocate, record, record_batch
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.delay_level import parse_delay_levels, rewrite_for_delay
from rocketstore.storage.dispatch_batch import valid_end, walk
from rocketstore.storage.errors import CorruptRecordError, StoreFileError
from rocketstore.storage.mapped_file import MappedFile, file_may_hold_data
from rocketstore.storage.mapped_file_queue import MappedFileQueue
from rocketstore.storage.record_batch import RecordBatch
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, Host, Message, MessageExt, encode_host,
    encode_properties, host_is_v6, is_consumable, transaction_value, TRANSACTION_NOT_TYPE,
    TRANSACTION_COMMIT_TYPE)
from rocketstore.storage.status import AppendMessageStatus, PutMessageStatus
from rocketstore.storage.validation import check_encoded_size

log = logging.getLogger(__name__)

QUEUE_COUNT_BULK = 1024  # records of one topic from which queue offsets are counted in
#                          numpy, by one stable sort (below it a dict loop is cheaper:
#                          measured 31 us for 512 records against 29, 120 for 2048
#                          against 107, both giving each queue's next offset as well)

_LONG = record.LONG
SCAN_RECORDS = 4096  # records recovery checks together
POOL_WAIT_MS = 3000  # how long an append waits for a pool buffer (without fast fail)
_INT = record.INT


class EncodedMessage(NamedTuple):
    """A record ready to append; QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP still 0."""

    data: bytearray
    topic: str
    queue_id: int
    consumable: bool
    store_timestamp_pos: int
    real_queue_id: int


@dataclasses.dataclass
class AppendMessageResult:
    status: AppendMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    msg_id: str = ""
    store_timestamp: int = 0
    logics_offset: int = 0
    queue_id: int = 0


@dataclasses.dataclass
class PutMessageResult:
    """What a put returns: the status, and where the message went when it was stored.

    ``reason`` names the fault when the status is not PUT_OK.
    """

    status: PutMessageStatus
    msg_id: str = ""
    wrote_offset: int = -1
    wrote_bytes: int = 0
    queue_id: int = -1
    queue_offset: int = -1
    store_timestamp: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status.ok

    @property
    def commit_log_offset(self) -> int:
        return self.wrote_offset

    @classmethod
    def refused(cls, status: PutMessageStatus, reason: str) -> "PutMessageResult":
        return cls(status, reason=reason)

    @classmethod
    def stored(cls, r: AppendMessageResult) -> "PutMessageResult":
        return cls(PutMessageStatus.PUT_OK, r.msg_id, r.wrote_offset, r.wrote_bytes,
                   r.queue_id, r.logics_offset, r.store_timestamp)


class Appended(NamedTuple):
    """What ``append_batch`` stored: the first ``count`` records, where each landed and
    the queue offset each took; ``error``, when it stopped short, is why (the reason the
    records not stored are given)."""

    count: int
    physical_offsets: list[int]
    queue_offsets: list[int]
    error: str = ""


def _discard_unallocated_files(directory: str, file_size: int, written: int) -> None:
    """Unlink short, never-written files at or past the file holding ``written``: an
    appender killed between creating a file and allocating it leaves one, and the load
    would refuse it. A short file holding data is left for the load to name."""
    if not os.path.isdir(directory):
        return
    holder = written - written % file_size
    for name in os.listdir(directory):
        if not name.isdigit() or int(name) < holder:
            continue
        path = os.path.join(directory, name)
        size = os.path.getsize(path)
        if size == file_size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            holds_data = file_may_hold_data(fd, size)
        finally:
            os.close(fd)
        if not holds_data:
            log.warning("unlinking %s: %d of %d bytes allocated and never written (its "
                        "creator died)", path, size, file_size)
            os.unlink(path)


def _holds_records(mf: MappedFile) -> bool:
    """Whether a file's first record is there. Asked of the file system first: reading a
    never-written file would pull zero pages into the cache, which would then look like
    data to ``truncate_dirty_files``."""
    return mf.may_hold_data() and bytes(mf.buf[:4]) != b"\0\0\0\0"


def _run_end(starts, ends, done: int, room: int, small: bool) -> int:
    """One past the last record from ``done`` on whose end stays within ``room`` bytes
    of where record ``done`` starts."""
    if small:
        limit = starts[done] + room
        k = done
        while k < len(ends) and ends[k] <= limit:
            k += 1
        return k
    return done + int(np.searchsorted(ends[done:] - starts[done], room, "right"))


def _count_one_topic(table: dict, topic: str, queue_ids: Sequence[int],
                     consumable: Sequence[bool]) -> tuple[list[int], dict]:
    """``CommitLog._queue_offsets`` of a batch of one topic, in numpy: the records that
    take a unit, sorted stably by queue, are numbered within each queue's run from the
    table's next offset; the others take 0."""
    queues = np.asarray(queue_ids, np.int64)
    taking = np.flatnonzero(np.asarray(consumable, bool))
    out = np.zeros(len(queues), np.int64)
    if not len(taking):
        return out.tolist(), {}
    taken = queues[taking]
    order = np.argsort(taken, kind="stable")
    ranked = taken[order]
    firsts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
    counts = np.diff(np.append(firsts, len(ranked)))
    keys = [(topic, q) for q in ranked[firsts].tolist()]
    base = np.array([table.get(k, 0) for k in keys], np.int64)
    numbered = np.empty(len(ranked), np.int64)
    numbered[order] = np.repeat(base - firsts, counts) + np.arange(len(ranked))
    out[taking] = numbered
    return out.tolist(), dict(zip(keys, (base + counts).tolist()))


class RecoveryResult(NamedTuple):
    process_offset: int   # end of the intact prefix
    redispatch_from: int  # where dispatch must start again (abnormal: the start file)


class CommitLog:
    def __init__(self, config: StoreConfig, *, read_only: bool = False):
        self.config = config
        self.mapped_file_size = config.mapped_file_size_commit_log
        self.mapped_file_queue = MappedFileQueue(config.commit_log_dir, self.mapped_file_size,
                                                 preallocate_next=True, read_only=read_only)
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.store_host: Host = (config.broker_ip1, config.listen_port)
        self._store_host_bytes = encode_host(self.store_host)
        self._store_host_flag = STOREHOSTADDRESS_V6_FLAG if host_is_v6(self.store_host) else 0
        self._msg_id_prefix = self._store_host_bytes.hex().upper()
        self.delay_level_ms: list[int] = parse_delay_levels(config.message_delay_level)
        self._allocator: allocate.AllocateMappedFileService | None = None
        self.max_delay_level = len(self.delay_level_ms) - 1
        self._pool = None           # the TransientStorePool the appender writes through
        self._committed: Callable[[], int] = lambda: 0
        self.append_error = ""      # why the last append stopped short, for the refusal

    def write_through_pool(self, pool, committed: Callable[[], int], fast_fail: bool) -> None:
        """Append into ``pool``'s buffers (shm.transient_pool) instead of the files'
        mappings; ``committed()`` reads COMMITTED. Without ``fast_fail`` an append that
        finds its buffer still uncommitted waits up to POOL_WAIT_MS for the commit step
        (RocketMQ blocks); with it, it stops at once (fastFailIfNoBufferInStorePool)."""
        self._pool, self._committed, self._pool_fast_fail = pool, committed, fast_fail

    def _sink(self, mf: MappedFile):
        """Where the appender writes ``mf``'s bytes: its mapping, or its pool buffer
        (borrowed here). Raises ``StoreFileError`` when no buffer is free."""
        if self._pool is None:
            return mf.buf
        if mf.write_buffer is None:
            deadline = time.monotonic() + (0 if self._pool_fast_fail else POOL_WAIT_MS / 1000)
            while not self._pool.is_free_for(mf.file_from_offset, self._committed()):
                if time.monotonic() >= deadline:
                    raise StoreFileError(mf.path, "no buffer in the transient store pool: "
                                         f"all {self._pool.size} hold uncommitted files "
                                         "(is the flusher committing?)")
                time.sleep(0.001)
            mf.write_buffer = self._pool.buffer_for(mf.file_from_offset)
        return mf.write_buffer

    @property
    def store_host_bytes(self) -> bytes:
        """The store host as records carry it (address bytes + port)."""
        return self._store_host_bytes

    @property
    def store_host_v6(self) -> bool:
        return bool(self._store_host_flag)

    @property
    def msg_id_prefix(self) -> str:
        """The first half of every offset msg id this store hands out."""
        return self._msg_id_prefix

    # ================================================================== load
    def load(self, *, sizes_confirmed: bool = False) -> None:
        """Map the files. When the store's recorded file size confirms the configured
        one, a short file that only never-written files follow (a truncated tail) is
        grown back so recovery can find where its valid data ends; any other file of
        another size fails the load."""
        self.mapped_file_queue.load(extend_short=sizes_confirmed)

    @classmethod
    def reopen_at(cls, config: StoreConfig, written: int) -> "CommitLog":
        """A restarting appender's CommitLog, cut at ``written`` (the published end:
        bytes past it were never acknowledged, and a killed appender may have torn a
        record there). Later files are zeroed in place, never unlinked (other processes
        may map them), and a short never-written file at or past ``written``'s (an
        appender died creating it) is unlinked first.

        Raises ``StoreFileError`` when the files do not reach ``written``."""
        _discard_unallocated_files(config.commit_log_dir, config.mapped_file_size_commit_log,
                                   written)
        cl = cls(config)
        cl.load()
        mfq = cl.mapped_file_queue
        mfq.truncate_dirty_files(written, keep_files=True)
        if mfq.get_max_wrote_position() != written:
            raise StoreFileError(config.commit_log_dir, f"the files end at "
                                 f"{mfq.get_max_wrote_position()}, the published end is "
                                 f"{written}")
        return cl

    def unmap_all_but_last(self) -> None:
        """An appender that never reads keeps only the file it appends to mapped."""
        files = self.mapped_file_queue.mapped_files
        if len(files) > 1:
            for mf in files[:-1]:
                mf.close()
            del files[:-1]

    # ================================================================== put
    def prepare(self, msg: Message, queue_id: int, born_timestamp: int) -> EncodedMessage | tuple:
        """Encode ``msg`` for ``queue_id`` (``msg`` already passed
        ``validation.check_message``; ``born_timestamp`` is used when it has none).

        Returns the encoded message, or ``(PutMessageStatus, reason)`` when it is too big.
        """
        topic, real_queue_id = msg.topic, queue_id
        props = msg.all_properties()
        tran = transaction_value(msg.sys_flag)
        delay_level = msg.requested_delay_level()
        if delay_level > 0 and tran in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            topic, queue_id, props = rewrite_for_delay(topic, queue_id, props, delay_level,
                                                       self.max_delay_level)
        topic_bytes = topic.encode("utf-8")
        props_bytes = encode_properties(props).encode("utf-8")
        born_v6 = host_is_v6(msg.born_host)
        sys_flag = (msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) \
            | (BORNHOST_V6_FLAG if born_v6 else 0) | self._store_host_flag
        if len(props_bytes) > record.MAX_PROPERTIES_LENGTH:
            return check_encoded_size(0, len(props_bytes), self.config)
        data = record.encode(
            topic=topic_bytes, body=bytes(msg.body), properties=props_bytes, queue_id=queue_id,
            flag=msg.flag, queue_offset=0, physical_offset=0, sys_flag=sys_flag,
            born_timestamp=born_timestamp if msg.born_timestamp is None else msg.born_timestamp,
            born_host=encode_host(msg.born_host), store_timestamp=0,
            store_host=self._store_host_bytes, reconsume_times=msg.reconsume_times,
            prepared_transaction_offset=msg.prepared_transaction_offset)
        refusal = check_encoded_size(len(data), len(props_bytes), self.config)
        if refusal:
            return refusal
        return EncodedMessage(data, topic, queue_id, is_consumable(sys_flag),
                              record.store_timestamp_pos(sys_flag), real_queue_id)

    def append(self, batch: Sequence[EncodedMessage], store_timestamp: int) -> list[AppendMessageResult]:
        """Append ``batch`` in order (the single appender calls this).

        Results are PUT_OK, or UNKNOWN_ERROR for the messages that could not be written
        because no new file could be created (``StoreFileError`` is logged, and nothing
        partial is left: a record is copied whole before the wrote position moves).
        """
        records = RecordBatch.from_encoded(batch)
        done = self.append_batch(records, [e.queue_id for e in batch], store_timestamp)
        prefix = self._msg_id_prefix
        results = [AppendMessageResult(AppendMessageStatus.PUT_OK, off, size,
                                       prefix + f"{off:016X}", store_timestamp, qoff, real)
                   for off, size, qoff, real in zip(done.physical_offsets,
                                                    records.sizes[:done.count].tolist(),
                                                    done.queue_offsets,
                                                    records.real_queue_ids)]
        results.extend(AppendMessageResult(AppendMessageStatus.UNKNOWN_ERROR)
                       for _ in batch[done.count:])
        return results

    def append_batch(self, batch: RecordBatch, queue_ids: Sequence[int],
                     store_timestamp: int) -> "Appended":
        """Append the records of ``batch`` in order, record i to ``queue_ids[i]`` (the
        single appender calls this).

        Each run of records that fits the current file is stamped
        (``record_batch.stamp``) and copied with one slice assignment; a record that
        does not fit (``record + 8`` bytes) closes the file with a BLANK and starts the
        next. The topic-queue table advances for the records stored. When no new file
        can be created or a file's blocks cannot be reserved (a full disk), the records
        from there on are not stored (``StoreFileError`` is logged): ``count`` says how
        many were, always a prefix, every one whole.
        """
        n = len(batch)
        self.append_error = ""
        queue_offsets, following = self._queue_offsets(batch, queue_ids)
        physical: list[int] = []
        small = n < record_batch.SMALL_BATCH      # plain ints: numpy costs more here
        starts = batch.starts.tolist() if small else batch.starts
        sizes = batch.sizes.tolist() if small else batch.sizes
        ends = [a + b for a, b in zip(starts, sizes)] if small else starts + sizes
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file()
        done = 0
        while done < n:
            try:
                mf = self._file_taking(mf, int(sizes[done]))
                sink = self._sink(mf)
            except StoreFileError as e:
                self._no_file(e)
                break
            room = mf.file_size - mf.wrote_position - record.END_FILE_MIN_BLANK_LENGTH
            k = _run_end(starts, ends, done, room, small)     # record ``done`` fits: k > done
            pos = mf.wrote_position
            first, last = int(starts[done]), int(ends[k - 1])
            try:
                mf.reserve(pos + last - first)
            except StoreFileError as e:
                self._no_file(e)
                break
            base = mf.file_from_offset + pos - first
            run = ([a + base for a in starts[done:k]] if small
                   else (starts[done:k] + base).tolist())
            physical += run
            record_batch.stamp(batch, done, k, queue_ids[done:k], queue_offsets[done:k],
                               run, store_timestamp, self._store_host_bytes)
            sink[pos:pos + last - first] = memoryview(batch.data)[first:last]
            mf.appended(last - first)
            mf.store_timestamp = store_timestamp
            done = k
        self._advance_queues(batch, queue_ids, queue_offsets, done, following)
        self._keep_ahead(mf)
        return Appended(done, physical, queue_offsets[:done],
                        self.append_failure() if done < n else "")

    def append_small(self, data, starts: list[int], sizes: list[int], topics: list[str],
                     queue_ids: list[int], consumable: list[bool],
                     store_timestamp: int) -> "Appended":
        """``append_batch`` for a few records taken as a producer laid them out (store
        host a placeholder), with plain lists: the one-message path of the writer and of
        ``MessageStore.put``, where a RecordBatch's arrays cost more than the append.

        Record i (``data[starts[i]:starts[i] + sizes[i]]``) is copied into the CommitLog
        and stamped there (QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP, the store
        host): the caller publishes WRITTEN only afterwards, so no reader sees a record
        before its stamps. The rest is ``append_batch``'s: BLANK and a new file when one
        does not fit, a prefix stored when no file can be made or reserved
        (``append_error`` says why), the topic-queue table advanced for what was stored.
        """
        view = memoryview(data)
        physical, queue_offsets = [], []
        for i, size in enumerate(sizes):
            placed = self.append_one(view, starts[i], size, topics[i], queue_ids[i],
                                     consumable[i], store_timestamp)
            if placed is None:
                break
            physical.append(placed[0])
            queue_offsets.append(placed[1])
        return Appended(len(physical), physical, queue_offsets,
                        self.append_failure() if len(physical) < len(sizes) else "")

    def append_one(self, data, start: int, size: int, topic: str, queue_id: int,
                   consumable: bool, store_timestamp: int) -> tuple[int, int] | None:
        """``append_small`` of one record, ``data[start:start + size]``: copied into the
        CommitLog and stamped there, the topic-queue table advanced (a consumable
        record); ``(physical offset, queue offset)``. None when no file could be made or
        reserved (``append_failure`` says why; nothing was written)."""
        self.append_error = ""
        try:
            mf = self._file_taking(self.mapped_file_queue.get_last_mapped_file(), size)
            sink = self._sink(mf)
            pos = mf.wrote_position
            mf.reserve(pos + size)
        except StoreFileError as e:
            self._no_file(e)
            return None
        phy = mf.file_from_offset + pos
        sink[pos:pos + size] = data[start:start + size]
        if consumable:
            table = self.topic_queue_table
            key = (topic, queue_id)
            queue_offset = table.get(key, 0)
            table[key] = queue_offset + 1
        else:
            queue_offset = 0
        _INT.pack_into(sink, pos + record_batch.QUEUEID_POS, queue_id)
        lpack = _LONG.pack_into
        lpack(sink, pos + record_batch.QUEUEOFFSET_POS, queue_offset)
        lpack(sink, pos + record_batch.PHYSICALOFFSET_POS, phy)
        lpack(sink, pos + record_batch.STORETIMESTAMP_POS, store_timestamp)
        host, host_at = self._store_host_bytes, pos + record_batch.STOREHOST_POS
        sink[host_at:host_at + len(host)] = host
        mf.appended(size)
        mf.store_timestamp = store_timestamp
        self._keep_ahead(mf)
        return phy, queue_offset

    def _file_taking(self, mf: MappedFile | None, size: int) -> MappedFile:
        """The file the next record of ``size`` bytes goes into: ``mf``, or the next one
        (made now) when ``mf`` is full, or closed here with a BLANK when the record and a
        BLANK's head would not fit in it. Raises ``StoreFileError`` when no file can be
        made or the BLANK's blocks cannot be reserved, ``ValueError`` for a record no
        file can hold."""
        mfq = self.mapped_file_queue
        if mf is None or mf.is_full():
            mf = mfq.get_or_create_last_mapped_file(0)
        if size > mf.file_size - mf.wrote_position - record.END_FILE_MIN_BLANK_LENGTH:
            if mf.wrote_position == 0:
                raise ValueError(f"a record of {size} bytes cannot fit a file of "
                                 f"{mf.file_size}: validation let it in")
            self._write_blank(mf)
            mf = mfq.get_or_create_last_mapped_file(0)
        return mf

    def _no_file(self, e: StoreFileError) -> None:
        """An append stops where no file could be made or reserved; ``append_error``
        says why."""
        log.error("create or reserve mapped file failed: %s", e)
        self.append_error = str(e)

    def append_failure(self) -> str:
        """The reason given to the records the last append could not store."""
        if self.append_error:
            return "cannot create or write a commitlog file: " + self.append_error
        return "cannot create or write a commitlog file (disk full?)"

    def _keep_ahead(self, mf: MappedFile | None) -> None:
        """Have the next file's first step reserved once ``mf`` is reserved to its end
        (``MappedFileQueue.reserve_next``), and the allocation thread read the page cache
        ahead of ``mf``'s wrote position (not through the pool: the commit step's pwrite
        brings the file's pages in itself)."""
        if mf is None:
            return
        if mf.reserved_position == mf.file_size:        # within a step or so of full
            self.mapped_file_queue.reserve_next(mf)
        if self._allocator is not None and self._pool is None:
            self._allocator.keep_ahead(mf.file_from_offset + mf.wrote_position)

    def append_verbatim(self, offset: int, data) -> None:
        """A slave's append (RocketMQ's CommitLog.appendData): ``data`` are the master's
        CommitLog bytes at ``offset``, which must be this CommitLog's end (an empty one
        starts at the file holding ``offset``), all within one file. The bytes are not
        parsed: what they hold is published by the caller (storage.replication).

        Raises ``ValueError`` for an offset that is not the end, or bytes crossing the
        file's end, and ``StoreFileError`` when the file cannot be created or its blocks
        reserved (nothing is written then)."""
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file()
        end = mfq.get_max_wrote_position() if mf is not None else offset
        if offset != end:
            raise ValueError(f"bytes for {offset} do not continue the CommitLog's end {end}")
        if mf is None or mf.is_full():
            mf = mfq.get_or_create_last_mapped_file(offset)
        pos = offset - mf.file_from_offset
        if not 0 <= pos <= mf.file_size - len(data):
            raise ValueError(f"{len(data)} bytes at {offset} cross the end of file "
                             f"{mf.file_from_offset}")
        mf.reserve(pos + len(data))
        mf.buf[pos:pos + len(data)] = data
        mf.appended(len(data))

    def _queue_offsets(self, batch: RecordBatch,
                       queue_ids: Sequence[int]) -> tuple[list[int], dict[tuple[str, int], int]]:
        """The QUEUEOFFSET of each record: the topic-queue table's next offsets, counted
        on in batch order (0 for PREPARED/ROLLBACK records); and each queue's next offset
        once every record is stored, by (topic, queue id), for ``_advance_queues``. The
        table is not changed. A long batch of one topic is counted in bulk."""
        table = self.topic_queue_table
        topics = batch.topics
        if len(topics) >= QUEUE_COUNT_BULK and topics.count(topics[0]) == len(topics):
            return _count_one_topic(table, topics[0], queue_ids, batch.consumable)
        taken: dict[tuple[str, int], int] = {}
        offsets: list[int] = []
        append = offsets.append
        for topic, queue_id, consumable in zip(topics, queue_ids, batch.consumable):
            if consumable:
                key = (topic, queue_id)
                offset = taken.get(key)
                if offset is None:
                    offset = table.get(key, 0)
                taken[key] = offset + 1
                append(offset)
            else:
                append(0)
        return offsets, taken

    def _advance_queues(self, batch: RecordBatch, queue_ids: Sequence[int],
                        queue_offsets: list[int], count: int,
                        following: dict[tuple[str, int], int]) -> None:
        """The topic-queue table learns the first ``count`` records: each queue's next
        offset is one past the last it took (``following``, from ``_queue_offsets``,
        when every record was stored)."""
        if count == len(queue_offsets):
            self.topic_queue_table.update(following)
            return
        table = self.topic_queue_table
        for topic, queue_id, takes, offset in zip(batch.topics[:count], queue_ids,
                                                  batch.consumable, queue_offsets):
            if takes:
                table[(topic, queue_id)] = offset + 1

    def _write_blank(self, mf: MappedFile) -> None:
        """The BLANK that ends a file: its 8-byte head; the rest stays zero (a pool
        buffer, which still holds an older file's bytes there, is zeroed first, so a
        commit copies zeros into the file as the mapping would have them). The file is
        reserved to its end first (less than a record: the commit writes it all).
        Raises ``StoreFileError`` when it cannot be; nothing is written then."""
        remain = mf.file_size - mf.wrote_position
        sink, pos = self._sink(mf), mf.wrote_position
        mf.reserve(mf.file_size)
        if sink is not mf.buf:
            sink[pos:mf.file_size] = bytes(remain)
        sink[pos:pos + record.END_FILE_MIN_BLANK_LENGTH] = record.encode_blank(remain)
        mf.appended(remain)

    # ================================================================== offsets
    def get_min_offset(self) -> int:
        first = self.mapped_file_queue.get_first_mapped_file()
        if first is None:
            return -1
        return first.file_from_offset if first.available else self.roll_next_file(first.file_from_offset)

    def get_max_offset(self) -> int:
        return self.mapped_file_queue.get_max_offset()

    def roll_next_file(self, offset: int) -> int:
        return self.mapped_file_queue.roll_next_file(offset)

    # ================================================================== reads
    def get_data(self, offset: int) -> tuple[MappedFile, int, int] | None:
        """``getData``: (file, position of ``offset``, the file's read position)."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset, offset == 0)
        if mf is None:
            return None
        pos = offset % self.mapped_file_size
        return (mf, pos, mf.read_position) if pos < mf.read_position else None

    def get_message(self, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset``, None when they are not (or no longer) there."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        return mf.read(offset % self.mapped_file_size, size) if mf else None

    def look_message_by_offset(self, offset: int, *, check_crc: bool = True) -> MessageExt | None:
        """The message whose record starts at ``offset``, or None if none starts there.

        Raises ``CorruptRecordError`` (naming file and offset) when a record does start
        there but its bytes fail a check.
        """
        head = self.get_message(offset, 8)
        if head is None:
            return None
        size, magic = record.SIZE_MAGIC.unpack(head)
        if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2) \
                or size <= record.HEAD.size:     # no record is that short: not one
            return None
        data = self.get_message(offset, size)
        if data is None:
            return None
        if record.LONG.unpack_from(data, record.PHYSICALOFFSET_POS)[0] != offset:
            return None
        try:
            return record.decode_at(data, 0, check_crc=check_crc)
        except record.RecordFormatError as e:
            mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
            raise CorruptRecordError(mf.path if mf else self.config.commit_log_dir,
                                     offset, e.detail) from None

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        """The STORETIMESTAMP of the record at ``offset``, -1 when it is gone."""
        if offset < self.get_min_offset():
            return -1
        head = self.get_message(offset, min(size, 80))
        if head is None or len(head) < 64:
            return -1
        (sys_flag,) = _INT.unpack_from(head, record.SYSFLAG_POS)
        return _LONG.unpack_from(head, record.store_timestamp_pos(sys_flag))[0]

    def check_message_and_return_size(self, mf: MappedFile, pos: int, limit: int,
                                      check_crc: bool) -> record.DispatchRequest:
        return record.check_message_and_return_size(
            mf.buf, pos, limit, mf.file_from_offset + pos, check_crc, self.delay_level_ms)

    # ================================================================== recovery
    def recover_normally(self) -> RecoveryResult:
        """Scan from the third-from-last file that holds records (files made ahead of
        need, whose first record is still zeros, do not count)."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return RecoveryResult(0, 0)
        written = len(files)       # files made ahead hold nothing: not among the three
        while written > 1 and not _holds_records(files[written - 1]):
            written -= 1
        end = self._scan_and_truncate(self._no_later_than_short_file(max(0, written - 3)))
        return RecoveryResult(end, end)

    def recover_abnormally(self, min_timestamp: int) -> RecoveryResult:
        """Scan from the newest file trusted by the checkpoint; re-dispatch from there."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return RecoveryResult(0, 0)
        start = 0
        for index in range(len(files) - 1, -1, -1):
            if self._is_mapped_file_matched_recover(files[index], min_timestamp):
                start = index
                break
        start = self._no_later_than_short_file(start)
        start_offset = files[start].file_from_offset
        return RecoveryResult(self._scan_and_truncate(start), start_offset)

    def _no_later_than_short_file(self, start: int) -> int:
        short = self.mapped_file_queue.short_file_index
        return start if short is None else min(start, short)

    @staticmethod
    def _is_mapped_file_matched_recover(mf: MappedFile, min_timestamp: int) -> bool:
        buf = mf.buf
        (magic,) = record.SIZE_MAGIC.unpack_from(buf, 0)[1:]
        if magic not in (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2):
            return False
        (sys_flag,) = _INT.unpack_from(buf, record.SYSFLAG_POS)
        (store_ts,) = _LONG.unpack_from(buf, record.store_timestamp_pos(sys_flag))
        return store_ts != 0 and store_ts <= min_timestamp

    def _scan_and_truncate(self, index: int) -> int:
        """Walk valid records from file ``index``; cut everything after the last one.

        Runs of records are checked in bulk (``dispatch_batch.valid_end``, the same
        rules); the record a run stops before, and each file's end, one by one."""
        files = self.mapped_file_queue.mapped_files
        check_crc = self.config.check_crc_on_recover
        mf = files[index]
        pos = 0
        while True:
            starts, _ = walk(mf.buf, pos, mf.file_size, SCAN_RECORDS)
            if len(starts) > 1:
                end = valid_end(mf.buf, starts, mf.file_from_offset, check_crc)
                if end > pos:
                    pos = end
                    continue
            req = self.check_message_and_return_size(mf, pos, mf.file_size, check_crc)
            if req.success and req.msg_size > 0:
                pos += req.msg_size
            elif req.success and req.msg_size == 0 and index + 1 < len(files):
                index += 1
                mf, pos = files[index], 0
            else:
                if not req.success and pos < mf.file_size and mf.buf[pos:pos + 4] != b"\0\0\0\0":
                    log.warning("recovery cut %s at %d", mf.path, pos)
                break
        process_offset = mf.file_from_offset + pos
        mfq = self.mapped_file_queue
        mfq.mark_flushed_to(process_offset)
        mfq.truncate_dirty_files(process_offset, self.quarantine_dir())
        return process_offset

    def quarantine_dir(self) -> str:
        stamp = time.strftime("%Y%m%d%H%M%S", time.localtime())
        return os.path.join(self.config.store_path_root_dir, "quarantine", stamp, "commitlog")

    def set_topic_queue_table(self, table: dict[tuple[str, int], int]) -> None:
        self.topic_queue_table = table

    # ================================================================== flush, expiry
    def flush(self, flush_least_pages: int) -> bool:
        return self.mapped_file_queue.flush(flush_least_pages)

    def delete_expired_file(self, expired_time_ms: int, delete_files_interval_ms: int,
                            interval_forcibly_ms: int, clean_immediately: bool,
                            below_offset: int | None = None) -> int:
        return self.mapped_file_queue.delete_expired_file_by_time(
            expired_time_ms, delete_files_interval_ms, interval_forcibly_ms, clean_immediately,
            below_offset=below_offset)

    def start_allocation(self) -> None:
        """The single appender's: from now on the next two files are made ready ahead of
        need by a service thread (``storage.allocate``), warmed when
        ``warm_maped_file_enable``, and the page cache is read ahead of the appends."""
        cfg = self.config
        leftovers = allocate.remove_leftovers(cfg.commit_log_dir)
        if leftovers:
            log.info("removed %d half-made commitlog files", leftovers)
        self._allocator = allocate.AllocateMappedFileService(
            cfg.commit_log_dir, self.mapped_file_size, warm=cfg.warm_maped_file_enable,
            flush_least_pages=cfg.flush_least_pages_when_warm_maped_file)
        mfq = self.mapped_file_queue
        mfq.use_allocator(self._allocator)
        last = mfq.get_last_mapped_file()
        start = 0 if last is None else last.file_from_offset + self.mapped_file_size
        self._allocator.request(start, start + self.mapped_file_size)

    def allocation_thread_id(self) -> int | None:
        """The kernel's id of the allocation thread (``start_allocation``), None when
        there is none."""
        return None if self._allocator is None else self._allocator.native_id

    def stop_allocation(self) -> None:
        """Stop making files ahead (a half-made one is removed); idempotent."""
        if self._allocator is not None:
            self._allocator.shutdown()
            self.mapped_file_queue.use_allocator(None)
            self._allocator = None

    def close(self) -> None:
        self.stop_allocation()
        self.mapped_file_queue.close()
