"""Idempotent producers: per producer id, the last sequence the store holds.

A producer that sends with a non-zero ``producer_id`` numbers its records 0, 1, 2, ...
across batches and resends (Kafka's idempotent producer). The writer stores a record
only when its sequence is the next one, and stamps the stored record with its identity
in the properties ``__PID`` and ``__SEQ`` (``storage.message.PROPERTY_PRODUCER_ID``,
``PROPERTY_PRODUCER_SEQUENCE``, decimal text), so the CommitLog itself says which
sequences it holds. This module is the table the writer judges with, its snapshot file,
and its rebuild from the CommitLog. No processes, sockets or shared memory here.

Rules (``judge``; ``last`` is the producer's last stored sequence, None when the table
does not know the producer):

    producer                 sequence s       verdict        the writer answers
    -----------------------  ---------------  -------------  ---------------------------------
    known, last L            s == L + 1       NEW            stores it; the table moves to s
    known, last L            s <= L           DUPLICATE      PUT_OK "duplicate: ...", nothing
                                                             stored; the original's msg id and
                                                             offsets when s == L
    known, last L            s > L + 1        OUT_OF_ORDER   OUT_OF_ORDER_SEQUENCE, expected
                                                             L + 1, nothing stored
    unknown                  s == 0           NEW            stores it; the producer is known
    unknown                  s > 0            OUT_OF_ORDER   OUT_OF_ORDER_SEQUENCE, expected 0

"Unknown" is a producer the store never held a record of, or one idle for
``producer_id_expiration_ms`` (no record stored for that long, by store time; Kafka's
``producer.id.expiration.ms``, default one day). An unknown producer must start at 0,
as in Kafka: accepting any first sequence would let a later batch that overtook a lost
first batch (the writer killed with batch 0 unread, batch 1 delivered to its successor)
make the resent batch 0 look like a duplicate, and drop it. An expired producer goes on
by starting over: it numbers its unacknowledged records from 0 again under the same id
(Kafka's reset after UNKNOWN_PRODUCER_ID). Dedupe therefore holds while a producer
keeps storing within the expiration time; a retry arriving later than that (of records
stored before) is stored again.

Only stored records move the table: a refused record (validation, size, a failed
append, an out-of-order one) leaves no trace, so the next record must carry the same
sequence again; duplicates do not refresh the expiry clock. The table is thus a
function of the CommitLog (the identities in it, in order, the last one winning) and
the clock, which is what makes it rebuildable.

Snapshot ``{root}/config/producerState.json`` (``storage.json_file``: atomic replace, the
previous one kept as ``.bak``), one line of JSON::

    {"version": 1,
     "commitLogOffset": 123456,            # every record below it is in the table
     "lastRecordOffset": 123300,           # the record that ends at commitLogOffset
     "lastRecordStoreTimestamp": 1700000000000,   #   (-1, 0 when there is none)
     "fields": ["producerId", "sequence", "storeTimestamp", "commitLogOffset", "size",
                "queueId", "queueOffset", "msgId"],
     "producers": [[8817, 41, 1700000000000, 120000, 230, 3, 17, "7F00..."], ...]}

Rebuild (``rebuild``, at writer start, after the CommitLog was cut at WRITTEN):

    snapshot (main, then .bak)                      used?  scan
    ----------------------------------------------  -----  --------------------------------
    missing, unreadable, malformed                  no     from the CommitLog's min offset
    commitLogOffset > WRITTEN (recovery cut the     no,    from the min offset
      tail it covered)                              deleted
    its last record is not at lastRecordOffset      no,    from the min offset
      ending at commitLogOffset with that store     deleted
      time (the CommitLog was cut and rewritten
      below it)
    otherwise                                       yes    from max(commitLogOffset, min
                                                           offset) to WRITTEN

Every scan then skips what cannot matter: a file whose successor's first record is
already past the expiration (store timestamps never decrease along the CommitLog: the
writer stamps ``max(now, last store time)``), and a file none of whose bytes in range
spell ``__PID\\x01`` (found at C speed); the file holding WRITTEN is always read, which
gives the last record for the next snapshot. Finally idle producers are expired. A
snapshot is written with the WRITTEN the writer published, so a rejected snapshot can
only be one a later recovery cut under; rejected files are deleted before the writer
appends anything, so a stale ``.bak`` is never used later.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from typing import NamedTuple

from rocketstore.storage import json_file, record
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message import (
    PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE, PROPERTY_REAL_QUEUE_ID,
    STOREHOSTADDRESS_V6_FLAG)

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "producerState.json"
SNAPSHOT_VERSION = 1
FIELDS = ["producerId", "sequence", "storeTimestamp", "commitLogOffset", "size", "queueId",
          "queueOffset", "msgId"]
MAX_U64 = (1 << 64) - 1
_PID_MARK = (PROPERTY_PRODUCER_ID + "\x01").encode("ascii")
_MESSAGE_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)


class Verdict(enum.Enum):
    NEW = 0
    DUPLICATE = 1
    OUT_OF_ORDER = 2


def judge(last: int | None, sequence: int) -> Verdict:
    """The rule of the module docstring; ``last`` None = unknown producer."""
    if last is None:
        return Verdict.NEW if sequence == 0 else Verdict.OUT_OF_ORDER
    if sequence == last + 1:
        return Verdict.NEW
    return Verdict.DUPLICATE if sequence <= last else Verdict.OUT_OF_ORDER


def expected_sequence(last: int | None) -> int:
    """The sequence the store takes next from a producer whose last stored is ``last``."""
    return 0 if last is None else last + 1


class ProducerEntry(NamedTuple):
    """A producer's last stored record: its sequence and where it went."""

    sequence: int
    store_timestamp: int   # also the producer's last-seen time, for expiry
    commit_log_offset: int
    size: int
    queue_id: int
    queue_offset: int
    msg_id: str

    @property
    def end(self) -> int:
        return self.commit_log_offset + self.size


class LastRecord(NamedTuple):
    """The CommitLog's last record below a snapshot's offset: its fingerprint."""

    offset: int
    store_timestamp: int


class ProducerStateTable:
    """Producer id -> ``ProducerEntry`` of its last stored record. ``changed`` is set
    by every change and cleared by the caller once it wrote a snapshot."""

    def __init__(self, expiration_ms: int):
        self.expiration_ms = expiration_ms
        self.producers: dict[int, ProducerEntry] = {}
        self.changed = False

    def __len__(self) -> int:
        return len(self.producers)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    def last_sequence(self, producer_id: int) -> int | None:
        entry = self.producers.get(producer_id)
        return None if entry is None else entry.sequence

    def check(self, producer_id: int, sequence: int) -> Verdict:
        return judge(self.last_sequence(producer_id), sequence)

    def record(self, producer_id: int, entry: ProducerEntry) -> None:
        """``producer_id`` stored ``entry``'s record (the caller judged it NEW)."""
        self.producers[producer_id] = entry
        self.changed = True

    def expire(self, now_ms: int) -> int:
        """Forget producers that stored nothing for ``expiration_ms``; how many."""
        horizon = now_ms - self.expiration_ms
        idle = [pid for pid, e in self.producers.items() if e.store_timestamp <= horizon]
        for pid in idle:
            del self.producers[pid]
        if idle:
            self.changed = True
        return len(idle)

    # ------------------------------------------------------------------ snapshot
    def to_document(self, offset: int, last: LastRecord | None) -> dict:
        return {"version": SNAPSHOT_VERSION, "commitLogOffset": offset,
                "lastRecordOffset": last.offset if last else -1,
                "lastRecordStoreTimestamp": last.store_timestamp if last else 0,
                "fields": FIELDS,
                "producers": [[pid, *e] for pid, e in self.producers.items()]}

    @classmethod
    def from_document(cls, doc: dict, expiration_ms: int) -> "Snapshot":
        """Raises ``ValueError`` naming what is wrong with ``doc``."""
        if doc.get("version") != SNAPSHOT_VERSION or doc.get("fields") != FIELDS:
            raise ValueError(f"version {doc.get('version')!r} / fields are not "
                             f"version {SNAPSHOT_VERSION}'s")
        offset, last_offset, last_ts = (doc.get("commitLogOffset"), doc.get("lastRecordOffset"),
                                        doc.get("lastRecordStoreTimestamp"))
        if not all(_is_int(v) for v in (offset, last_offset, last_ts)) or not (
                (offset == 0 and last_offset == -1) or 0 <= last_offset < offset):
            raise ValueError(f"commitLogOffset {offset!r} / lastRecordOffset {last_offset!r} "
                             "are not a record and its end")
        table = cls(expiration_ms)
        rows = doc.get("producers")
        if not isinstance(rows, list):
            raise ValueError("producers is not a list")
        for row in rows:
            if not (isinstance(row, list) and len(row) == len(FIELDS)
                    and all(_is_int(v) for v in row[:7]) and isinstance(row[7], str)
                    and 0 < row[0] <= MAX_U64 and 0 <= row[1] <= MAX_U64
                    and min(row[3], row[4]) >= 0):
                raise ValueError(f"producer row {row!r} is malformed")
            table.producers[row[0]] = ProducerEntry(*row[1:])
        last = LastRecord(last_offset, last_ts) if last_offset >= 0 else None
        return Snapshot(offset, last, table)

    # ------------------------------------------------------------------ the CommitLog
    def apply_commit_log(self, commit_log: CommitLog, start: int, end: int,
                         now_ms: int) -> LastRecord | None:
        """Record, in order, the identity of every record in [start, end) (``start``
        must be a record boundary: a file start or a record's end). Returns the last
        record read there (None when none was read).

        Raises ``CorruptRecordError`` when the range is not whole records.
        """
        mfq = commit_log.mapped_file_queue
        file_size = commit_log.mapped_file_size
        last_file = (end - 1) - (end - 1) % file_size if end > 0 else 0
        offset = _skip_expired_files(commit_log, start, end, now_ms - self.expiration_ms)
        last = None
        while offset < end:
            mf = mfq.find_mapped_file_by_offset(offset)
            if mf is None:
                raise CorruptRecordError(commit_log.config.commit_log_dir, offset,
                                         f"no commitlog file holds offset {offset} below {end}")
            base = mf.file_from_offset
            pos, limit = offset - base, min(mf.file_size, end - base)
            if base != last_file and mf.buf.find(_PID_MARK, pos, limit) < 0:
                offset = base + mf.file_size   # no identity in the rest of this file
                continue
            pos, found = self._apply_file(mf, pos, limit)
            last = found or last
            offset = base + pos
        return last

    def _apply_file(self, mf, pos: int, limit: int) -> tuple[int, LastRecord | None]:
        """Walk one file's records in [pos, limit); (where the walk ended, its last
        record). A BLANK ends the file."""
        buf, base = mf.buf, mf.file_from_offset
        size_magic, long_, int_ = record.SIZE_MAGIC.unpack_from, record.LONG.unpack_from, \
            record.INT.unpack_from
        last = None
        while pos < limit:
            total, magic = size_magic(buf, pos)
            if magic == record.BLANK_MAGIC_CODE:
                return mf.file_size, last
            offset = base + pos
            if magic not in _MESSAGE_MAGICS or total <= record.HEAD.size or pos + total > limit \
                    or long_(buf, pos + record.PHYSICALOFFSET_POS)[0] != offset:
                raise CorruptRecordError(mf.path, offset,
                                         f"not a whole record below {base + limit}")
            (sys_flag,) = int_(buf, pos + record.SYSFLAG_POS)
            ts_pos = pos + record.store_timestamp_pos(sys_flag)
            (store_ts,) = long_(buf, ts_pos)
            last = LastRecord(offset, store_ts)
            if buf.find(_PID_MARK, pos, pos + total) >= 0:
                self._apply_record(buf, pos, total, sys_flag, ts_pos, offset, store_ts, mf.path)
            pos += total
        return pos, last

    def _apply_record(self, buf, pos: int, total: int, sys_flag: int, ts_pos: int,
                      offset: int, store_ts: int, path: str) -> None:
        props = record.properties_at(buf, pos)
        pid = _u64(record.find_property(props, PROPERTY_PRODUCER_ID))
        seq = _u64(record.find_property(props, PROPERTY_PRODUCER_SEQUENCE))
        if not pid or seq is None:
            if _PID_MARK in props:
                log.warning("%s at %d: producer identity %r/%r is not two u64 numbers; "
                            "ignored", path, offset,
                            record.find_property(props, PROPERTY_PRODUCER_ID),
                            record.find_property(props, PROPERTY_PRODUCER_SEQUENCE))
            return
        queue_id, = record.INT.unpack_from(buf, pos + record.QUEUEID_POS)
        real = record.find_property(props, PROPERTY_REAL_QUEUE_ID)   # a delayed message:
        if real is not None and real.isdigit():   # the queue it was sent to, as answered
            queue_id = int(real)
        queue_offset, = record.LONG.unpack_from(buf, pos + record.QUEUEOFFSET_POS)
        host_pos = ts_pos + 8
        host = buf[host_pos:host_pos + record.host_width(bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))]
        msg_id = (bytes(host) + offset.to_bytes(8, "big")).hex().upper()
        self.record(pid, ProducerEntry(seq, store_ts, offset, total, queue_id, queue_offset,
                                       msg_id))


class Snapshot(NamedTuple):
    offset: int                 # every record below it is in the table
    last_record: LastRecord | None
    table: ProducerStateTable


class Rebuilt(NamedTuple):
    table: ProducerStateTable
    last_record: LastRecord | None   # the record ending at WRITTEN (None: empty)
    source: str                      # how, for the log


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _u64(text: str | None) -> int | None:
    if text is None or not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return value if value <= MAX_U64 else None


def _first_store_timestamp(mf) -> int | None:
    """STORETIMESTAMP of a file's first record, None when it does not start with one."""
    total, magic = record.SIZE_MAGIC.unpack_from(mf.buf, 0)
    if magic not in _MESSAGE_MAGICS:
        return None
    (sys_flag,) = record.INT.unpack_from(mf.buf, record.SYSFLAG_POS)
    return record.LONG.unpack_from(mf.buf, record.store_timestamp_pos(sys_flag))[0]


def _skip_expired_files(commit_log: CommitLog, start: int, end: int, horizon_ms: int) -> int:
    """``start``, or the start of a later file when every record before it was stored
    at or before ``horizon_ms`` (its producers would be expired anyway)."""
    files = commit_log.mapped_file_queue.mapped_files
    for mf, successor in zip(files, files[1:]):
        if successor.file_from_offset <= start or mf.file_from_offset + mf.file_size <= start:
            continue
        if successor.file_from_offset >= end:
            break
        ts = _first_store_timestamp(successor)
        if ts is None or ts > horizon_ms:
            break
        start = successor.file_from_offset
    return start


# ------------------------------------------------------------------------------ files
def snapshot_path(config: StoreConfig) -> str:
    return os.path.join(config.config_dir, SNAPSHOT_FILE)


def write_snapshot(path: str, table: ProducerStateTable, offset: int,
                   last: LastRecord | None) -> None:
    """Persist ``table`` as covering every record below ``offset`` (a published
    WRITTEN, whose last record is ``last``); clears ``changed``. Raises ``OSError``."""
    json_file.persist(path, table.to_document(offset, last), compact=True)
    table.changed = False


def read_snapshot(path: str, expiration_ms: int) -> Snapshot | None:
    """The snapshot in ``path`` alone (no ``.bak`` fallback), None when it is missing
    or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("producer snapshot %s unreadable: %s", path, e)
        return None
    if not isinstance(doc, dict):
        log.warning("producer snapshot %s does not hold a JSON object", path)
        return None
    try:
        return ProducerStateTable.from_document(doc, expiration_ms)
    except (ValueError, TypeError) as e:
        log.warning("producer snapshot %s is malformed: %s", path, e)
        return None


def _fits(snapshot: Snapshot, commit_log: CommitLog, written: int) -> str | None:
    """Why ``snapshot`` cannot be used with this CommitLog cut at ``written``; None
    when it can."""
    if snapshot.offset > written:
        return f"it covers up to {snapshot.offset}, past WRITTEN {written}"
    last = snapshot.last_record
    min_offset = commit_log.mapped_file_queue.get_min_offset()
    if last is None or last.offset < max(min_offset, 0):
        return None   # nothing below it to check, or its last record already expired
    mf = commit_log.mapped_file_queue.find_mapped_file_by_offset(last.offset)
    if mf is None:
        return f"no commitlog file holds its last record at {last.offset}"
    pos = last.offset - mf.file_from_offset
    req = record.check_message_and_return_size(mf.buf, pos, mf.file_size, last.offset, False)
    if not (req.success and req.msg_size > 0 and last.offset + req.msg_size == snapshot.offset
            and req.store_timestamp == last.store_timestamp):
        return (f"its last record ({last.offset}, stored at {last.store_timestamp}) is not "
                f"in the CommitLog any more: the CommitLog was cut below it")
    return None


def rebuild(config: StoreConfig, commit_log: CommitLog, written: int, now_ms: int) -> Rebuilt:
    """The table as of ``written`` (see the module docstring). ``commit_log`` must map
    every file up to the one holding ``written``. Snapshot files found unusable are
    deleted.

    Raises ``CorruptRecordError`` when the CommitLog below ``written`` is not whole
    records from its min offset.
    """
    path = snapshot_path(config)
    expiration_ms = config.producer_id_expiration_ms
    min_offset = max(commit_log.mapped_file_queue.get_min_offset(), 0)
    for candidate in (path, path + ".bak"):
        snap = read_snapshot(candidate, expiration_ms)
        if snap is None:
            continue
        why = _fits(snap, commit_log, written)
        if why is None:
            start = max(snap.offset, min_offset)
            try:
                last = snap.table.apply_commit_log(commit_log, start, written, now_ms)
            except CorruptRecordError as e:
                why = f"the records from its offset {start} are not whole: {e}"
            else:
                table = snap.table
                table.changed = start < written
                return _finish(table, last or snap.last_record, now_ms,
                               f"{candidate} ({len(table)} producers) + CommitLog "
                               f"[{start}, {written})")
        log.warning("producer snapshot %s not used, deleted: %s", candidate, why)
        _unlink_quietly(candidate)
    table = ProducerStateTable(expiration_ms)
    last = table.apply_commit_log(commit_log, min_offset, written, now_ms)
    table.changed = True
    return _finish(table, last, now_ms, f"CommitLog [{min_offset}, {written}) (no snapshot)")


def _finish(table: ProducerStateTable, last: LastRecord | None, now_ms: int,
            source: str) -> Rebuilt:
    expired = table.expire(now_ms)
    log.info("producer state from %s: %d producers (%d expired)", source, len(table), expired)
    return Rebuilt(table, last, source)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
