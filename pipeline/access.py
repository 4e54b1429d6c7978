"""How the Spark source reaches a store: by mapping its files, or through its sockets.

Both give the same three things, so the source's driver and tasks never care which:

    call                         LocalStore (option ``store``)       RemoteStore (``endpoint``)
    ---------------------------  ----------------------------------  --------------------------------
    bounds(topics, since_ms)     StoreReader over the mapped files,  OFFSETS through the reader
                                 bounded by DISPATCHED (shm table)   socket
    read(range, ...)             consume queue units + CommitLog     FETCH through the reader socket
                                 spans read in the mappings          (units + their records)
    commit(group, topic, ...)    consumerOffset.json, under its      COMMIT through the reader
                                 flock (as a local Consumer)         socket (the reader writes it)

``read`` yields pyarrow RecordBatches of ``pipeline.arrow_codec.SCHEMA`` (or of the
``columns`` asked for: a projection, only those built) for a range
``[start, end)`` of one queue. Every read stops at DISPATCHED, so under SYNC_FLUSH no
row is a message a crash could take back. On both paths every record is checked here
against the unit that points at it (size, queue offset, CommitLog offset, topic, queue
id) before it becomes a row, with the same code (``records_to_batch``); the body CRC is
not checked, as a local Consumer does not check it.

Data loss: when the range starts below the queue's min (its files expired) or files
expire while it is read, ``fail_on_data_loss`` raises ``DataLossError`` naming the
queue and the offsets; otherwise the missing offsets are skipped with a warning.
A range that ends past the queue's max (a recovery took messages back) always raises.
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.spark.arrow_codec import records_to_batch
from rocketstore.spark.offsets import DataLossError, QueueBounds, QueueRange
from rocketstore.wire import endpoints
from rocketstore.client import BadAddressError, ReaderClient, group_lookup
from rocketstore.client.consumer import store_config, update_offsets
from rocketstore.client.reach import running_table
from rocketstore.shm.positions import Slot
from rocketstore.storage.bulk_read import MAX_SPAN_BYTES, SPAN_GAP_BYTES
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE
from rocketstore.storage.status import GetMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import check_topic

log = logging.getLogger(__name__)

CQ_UNITS = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
assert CQ_UNITS.itemsize == 20
DEFAULT_BATCH_ROWS = 65536         # rows per Arrow batch (fewer, larger batches: faster)
BATCH_MAX_BYTES = MAX_SPAN_BYTES   # and about this many bytes of records at most


def open_store(store: str | None, endpoint: str | None, timeout_ms: int = 30_000,
               curve: tuple[str | None, str | None] = (None, None)):
    """A LocalStore for a store directory, a RemoteStore for an endpoint (``curve``: its
    CURVE key files, wire.curve)."""
    return LocalStore(store) if store is not None else RemoteStore(endpoint, timeout_ms,
                                                                    curve)


def socket_of(endpoint: str, name: str) -> str:
    """What a client is given for the ``ingest`` or ``reader`` socket of the
    ``endpoint`` option (``wire.endpoints``): an ``ipc://`` store or socket directory
    as it is (the client finds the socket, and for a store directory tells a store not
    running by its table), a broker group's ``zk://`` address as it is (the client
    follows the group's master, ``client.group_address``), a ``tcp://`` one's socket.
    Raises ``BadAddressError`` (a ``ValueError``) for an endpoint of another form."""
    if endpoint.startswith(group_lookup.SCHEME):
        group_lookup.parse(endpoint)
        return endpoint
    try:
        address = getattr(endpoints.resolve(endpoint), name)
    except ValueError as e:
        raise BadAddressError(str(e)) from None
    return endpoint if endpoint.startswith("ipc://") else address


def _loss(problem: str, fail: bool) -> None:
    if fail:
        raise DataLossError(f"{problem}; set failOnDataLoss=false to skip missing offsets")
    log.warning("skipping: %s", problem)


IDENTITY = ("topic", "queue_id")


def _rows(buf, starts, rng: QueueRange, columns: tuple[str, ...] | None,
          tags: tuple[str, ...] = (), **expect) -> pa.RecordBatch:
    """The records at ``buf[starts]`` as a batch of ``columns`` (None: all), each checked
    against its unit (``expect``: sizes, queue and CommitLog offsets) and to be a message
    of the range's topic and queue; with ``tags``, only the rows with one of them."""
    extra = ("tags",) if tags else ()
    wanted = None if columns is None else tuple(dict.fromkeys(IDENTITY + tuple(columns)
                                                              + extra))
    batch = records_to_batch(buf, starts, columns=wanted, **expect)
    if tags:
        batch = batch.filter(pc.is_in(batch.column("tags"),
                                      value_set=pa.array(tags, pa.string())))
    if batch.num_rows and not (
            pc.all(pc.equal(batch.column("topic"), rng.topic)).as_py()
            and pc.all(pc.equal(batch.column("queue_id"), rng.queue_id)).as_py()):
        raise DataLossError(f"{rng.topic}/{rng.queue_id}: a consume queue unit points at a "
                            "message of another queue (the store is inconsistent; run "
                            "rocketstore check)")
    return batch if columns is None or wanted == columns else batch.select(list(columns))


# ------------------------------------------------------------------------------ local
class LocalStore:
    """A running store on this host, read through its mapped files."""

    def __init__(self, store_dir: str):
        self.store_dir = store_dir
        self.table = running_table(store_dir)      # NoStoreError: says why, and what to run
        self.config = store_config(store_dir)
        self.reader = StoreReader(self.config)
        self.units_per_file = self.config.mapped_file_size_consume_queue // CQ_UNITS.itemsize

    def _positions(self) -> tuple[int, int]:
        return self.table.get(Slot.DISPATCHED), self.table.get(Slot.MIN_OFFSET)

    def bounds(self, topics: list[str] | None = None,
               since_ms: int | None = None) -> list[QueueBounds]:
        """Every queue of ``topics`` (None: all topics) with its offsets now."""
        dispatched, min_phy = self._positions()
        known = self.reader.topics()
        if topics is None:      # every topic a producer may send to, as the reader answers
            topics = [t for t in known if check_topic(t) is None]
        out = []
        for topic in sorted(topics):
            for q in known.get(topic, []):
                lo = self.reader.get_min_offset_in_queue(topic, q, dispatched,
                                                         min_commit_log_offset=min_phy)
                hi = self.reader.get_max_offset_in_queue(topic, q, dispatched)
                at = -1 if since_ms is None else self.reader.first_offset_stored_since(
                    topic, q, since_ms, dispatched, min_commit_log_offset=min_phy)
                out.append(QueueBounds(topic, q, max(lo, 0), hi, at))
        return out

    def read(self, rng: QueueRange, *, fail_on_data_loss: bool = True,
             batch_rows: int = DEFAULT_BATCH_ROWS, columns: tuple[str, ...] | None = None,
             tags: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
        pos = rng.start
        while pos < rng.end:
            dispatched, min_phy = self._positions()
            got = self.reader.read_queue_units(rng.topic, rng.queue_id, pos,
                                               min(batch_rows, rng.end - pos), dispatched,
                                               min_commit_log_offset=min_phy)
            if got.first > pos:
                _loss(f"{rng.topic}/{rng.queue_id}: offsets {pos}.."
                      f"{min(rng.end, got.first) - 1} expired", fail_on_data_loss)
                pos = got.first
                continue
            if got.count == 0 and got.first < got.max_offset:  # its consume queue file went
                end = min(rng.end, (pos // self.units_per_file + 1) * self.units_per_file)
                _loss(f"{rng.topic}/{rng.queue_id}: offsets {pos}..{end - 1} expired while "
                      "being read", fail_on_data_loss)
                pos = end
                continue
            if got.count == 0:
                raise DataLossError(f"{rng.topic}/{rng.queue_id}: the queue ends at "
                                    f"{got.max_offset}, before offset {pos} of the range "
                                    f"{rng.start}..{rng.end} (a recovery took messages back?)")
            yield from self._decode(rng, *_real_units(got.units, got.first), dispatched,
                                    fail_on_data_loss, columns, tags)
            pos = got.first + got.count

    def _decode(self, rng: QueueRange, offsets: np.ndarray, phy: np.ndarray, size: np.ndarray,
                dispatched: int, fail_on_data_loss: bool, columns: tuple[str, ...] | None,
                tags: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
        file_size = self.config.mapped_file_size_commit_log
        # one batch per span, as storage.bulk_read plans them for the reader: records in
        # one CommitLog file and MAX_SPAN_BYTES stretch of it, without a big gap (so a
        # batch holds at most about MAX_SPAN_BYTES of records); the records are read
        # where they are mapped (records_to_batch copies only what goes into the batch,
        # never the other queues' records between them), and the view is dropped before
        # the batch is handed on
        stretch = phy % file_size // MAX_SPAN_BYTES
        cut = np.flatnonzero((phy[1:] // file_size != phy[:-1] // file_size)
                             | (stretch[1:] != stretch[:-1])
                             | (phy[1:] - (phy[:-1] + size[:-1]) > SPAN_GAP_BYTES)) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(phy)]):
            a, b = int(a), int(b)
            begin = int(phy[a])
            data = self.reader.commit_log_view(begin, int(phy[b - 1] + size[b - 1]) - begin,
                                               dispatched)
            if data is None:
                _loss(f"{rng.topic}/{rng.queue_id}: offsets {offsets[a]}..{offsets[b - 1]} "
                      "expired while being read", fail_on_data_loss)
                continue
            batch = _rows(data, phy[a:b] - begin, rng, columns, tags, expect_sizes=size[a:b],
                          expect_queue_offsets=offsets[a:b], expect_commit_log_offsets=phy[a:b],
                          source="CommitLog", buf_offset=begin)
            del data
            yield batch

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        update_offsets(self.config.config_dir, f"{topic}@{group}",
                       {str(q): o for q, o in offsets.items()})

    def close(self) -> None:
        self.reader.close()
        self.table.close()

    def __enter__(self) -> "LocalStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------ remote
_NOTHING_AT = (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
               GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)


class RemoteStore:
    """A store reached through its reader socket, from any host."""

    def __init__(self, endpoint: str, timeout_ms: int = 30_000,
                 curve: tuple[str | None, str | None] = (None, None)):
        """Raises ``BadAddressError`` for an endpoint of another form, and, at its first
        request, the ``StoreUnreachableError`` its reader socket shows
        (``client.reach``) rather than waiting ``timeout_ms``."""
        self.endpoint = endpoint
        self.client = ReaderClient(socket_of(endpoint, "reader"), timeout_ms=timeout_ms,
                                   curve_server_key=curve[0], curve_client_key=curve[1])

    def bounds(self, topics: list[str] | None = None,
               since_ms: int | None = None) -> list[QueueBounds]:
        found = self.client.offsets(topics, since_ms)
        return [QueueBounds(o.topic, o.queue_id, max(o.min_offset, 0), o.max_offset,
                            o.time_offset) for o in found]

    def read(self, rng: QueueRange, *, fail_on_data_loss: bool = True,
             batch_rows: int = DEFAULT_BATCH_ROWS, columns: tuple[str, ...] | None = None,
             tags: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
        """The range's batches, FETCH after FETCH: each found reply's successor is asked
        for before the reply is decoded, so the reader reads the next while this
        process decodes (and Spark takes) this one."""
        def ask(at: int) -> int:
            return self.client.fetch_request(rng.topic, rng.queue_id, at,
                                             min(batch_rows, rng.end - at), BATCH_MAX_BYTES,
                                             tags=tags or "*")

        pos, ahead = rng.start, None
        try:
            while pos < rng.end:
                reply = self.client.fetch_reply(ask(pos) if ahead is None else ahead)
                ahead = None
                if reply.status is GetMessageStatus.OFFSET_TOO_SMALL or (
                        reply.status is not GetMessageStatus.FOUND and reply.min_offset > pos):
                    _loss(f"{rng.topic}/{rng.queue_id}: offsets {pos}.."
                          f"{min(rng.end, reply.min_offset) - 1} expired", fail_on_data_loss)
                    pos = max(pos + 1, reply.min_offset)
                    continue
                if reply.status in _NOTHING_AT:
                    raise DataLossError(f"{rng.topic}/{rng.queue_id}: the queue ends at "
                                        f"{reply.max_offset}, before offset {pos} of the range "
                                        f"{rng.start}..{rng.end} (a recovery took messages "
                                        "back?)")
                if reply.status is GetMessageStatus.OFFSET_FOUND_NULL \
                        and reply.next_begin_offset > pos:
                    _loss(f"{rng.topic}/{rng.queue_id}: offsets {pos}.."
                          f"{min(rng.end, reply.next_begin_offset) - 1} expired while being "
                          "read", fail_on_data_loss)
                elif reply.status is GetMessageStatus.FOUND:
                    if pos < reply.next_begin_offset < rng.end:
                        ahead = ask(reply.next_begin_offset)
                    batch = _remote_batch(reply, rng, pos, columns, tags)
                    if batch.num_rows:
                        yield batch
                if reply.next_begin_offset <= pos:
                    raise DataLossError(f"{rng.topic}/{rng.queue_id}: the reader made no "
                                        f"progress at offset {pos} ({reply.status.name})")
                pos = reply.next_begin_offset
        finally:
            if ahead is not None:   # stopped before its answer was needed
                self.client.forget(ahead)

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.client.commit_offsets(group, topic, offsets)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RemoteStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _real_units(raw, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logical offsets, CommitLog offsets and sizes of the non-blank units in
    ``raw`` (consume queue units from logical offset ``first``)."""
    units = np.frombuffer(raw, CQ_UNITS)
    offsets = np.arange(first, first + len(units), dtype=np.int64)
    real = units["size"] != BLANK_UNIT_SIZE
    if not real.all():
        units, offsets = units[real], offsets[real]
    return offsets, units["phy"].astype(np.int64), units["size"].astype(np.int64)


def _remote_batch(reply, rng: QueueRange, pos: int, columns: tuple[str, ...] | None,
                  tags: tuple[str, ...]) -> pa.RecordBatch:
    """The rows of a FETCH_REPLY for a read from ``pos``: every record checked against
    its unit, as the local path does (the reader already left out other tags' records;
    ``tags`` checks it)."""
    count = len(reply.units) // CQ_UNITS.itemsize
    if count == 0 or reply.first_offset != pos or reply.next_begin_offset != pos + count:
        raise DataLossError(f"the reader answered units {reply.first_offset}.."
                            f"{reply.first_offset + count - 1} (next {reply.next_begin_offset}) "
                            f"for a read from {pos}")
    offsets, phy, size = _real_units(reply.units, pos)
    starts = np.zeros(len(size), np.int64)
    np.cumsum(size[:-1], out=starts[1:])
    return _rows(reply.data, starts, rng, columns, tags, expect_sizes=size,
                 expect_queue_offsets=offsets, expect_commit_log_offsets=phy,
                 source="FETCH_REPLY")
