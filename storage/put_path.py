"""The put path both appenders share: when the store refuses puts, which queue a message
goes to, and validate → choose queue → encode for a batch of messages.

The embedded ``MessageStore`` and the writer process (``procs.writer``) both run

    refusal_reason(...)          the store-wide answer, before any message is looked at
    for each message:            ``prepare_batch``
        validation.check_message     MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED + reason
        admit(i, msg)                the caller's say (an idempotent producer's sequence)
        QueueSelector.select         the message's queue, or round robin per topic
        CommitLog.prepare            the record bytes, or a size refusal
    CommitLog.append_batch       the single appender stamps offsets and copies; its
                                 ``Appended`` says what was stored and, short, why not

so the rules are written once. A refused message costs the others nothing: it gets its
status and reason and the batch goes on.

Store-wide refusals, in the order they are checked (every one SERVICE_NOT_AVAILABLE, the
reason naming the cause, as RocketMQ's ``checkStoreStatus``):

    cause                                            RocketMQ's running flag
    -----------------------------------------------  -------------------------
    the store is not running (starting, stopping)    (shutdown)
    a SLAVE store                                    (BrokerRole.SLAVE)
    a flush failed (fdatasync error)                 FLUSH_ERROR (ours)
    dispatch stopped (consume queue / index write)   WRITE_LOGICS_QUEUE_ERROR
    disk past disk_space_warning_level_ratio         DISK_FULL
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Callable, NamedTuple

import numpy as np

from rocketstore.storage import record_batch
from rocketstore.storage.commit_log import Appended, CommitLog, EncodedMessage, PutMessageResult
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.message import Message
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.validation import check_message

# what a message that cannot be laid out as a record raises while being encoded
UNENCODABLE = (ValueError, TypeError, AttributeError, OverflowError, struct.error,
               UnicodeError, KeyError)


class StoreCondition(NamedTuple):
    """What the refusal rules look at; each field is None/False when all is well."""

    not_running: str | None = None     # the store's state when it is not running
    slave: bool = False
    flush_error: str | None = None     # the failed flush, described
    logics_error: str | None = None    # why dispatch stopped, described
    disk_full: bool = False


def refusal_reason(c: StoreCondition) -> str | None:
    """Why every put is refused now, or None when puts are taken."""
    if c.not_running is not None:
        return f"the store is {c.not_running}"
    if c.slave:
        return "a SLAVE store does not accept puts"
    if c.flush_error is not None:
        return (f"FLUSH_ERROR: commitlog flush failed ({c.flush_error}): the store "
                "refuses writes until it is restarted")
    if c.logics_error is not None:
        return (f"WRITE_LOGICS_QUEUE_ERROR: dispatch stopped ({c.logics_error}): consume "
                "queues or index cannot be written, so consumers would not see new "
                "messages; writes resume when dispatch does")
    if c.disk_full:
        return "DISK_FULL: disk full, the store refuses writes until space is freed"
    return None


def refusal(c: StoreCondition) -> PutMessageResult | None:
    """``refusal_reason`` as the result every put gets, or None."""
    reason = refusal_reason(c)
    if reason is None:
        return None
    return PutMessageResult.refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason)


class QueueSelector:
    """The queue of a message that left the choice to the store: round robin per topic
    over ``default_topic_queue_nums`` queues, starting at queue 0."""

    __slots__ = ("queue_nums", "_next")

    def __init__(self, queue_nums: int):
        self.queue_nums = queue_nums
        self._next: dict[str, int] = {}

    def select(self, msg: Message) -> int:
        if msg.queue_id is not None:
            return msg.queue_id
        return self.next_queue(msg.topic)

    def next_queue(self, topic: str) -> int:
        n = self._next.get(topic, 0)
        self._next[topic] = n + 1
        return n % self.queue_nums

    def choose(self, topics: list[str], queue_ids: list[int]) -> list[int]:
        """The queue of each record of a batch, ``queue_ids[i]`` or, where it is -1, the
        topic's next turn; a batch of one topic that leaves every choice to the store
        takes its turns in bulk."""
        n = len(topics)
        if n > 1 and queue_ids.count(-1) == n and topics.count(topics[0]) == n:
            first = self._next.get(topics[0], 0)
            self._next[topics[0]] = first + n
            return ((np.arange(first, first + n)) % self.queue_nums).tolist()
        select = self.next_queue
        return [q if q >= 0 else select(t) for t, q in zip(topics, queue_ids)]


class PreparedBatch(NamedTuple):
    """``prepare_batch``'s outcome: the records to append, which message each came
    from, and whether any waits for the flush (each message refused has its result in
    the caller's ``results`` already)."""

    records: list[EncodedMessage]
    slots: list[int]          # records[k] encodes messages[slots[k]]
    wait: bool                # some record was sent with wait_store_msg_ok


def prepare_batch(commit_log: CommitLog, config: StoreConfig, messages: Sequence[Message],
                  now: int, selector: QueueSelector, results: list,
                  records: list[EncodedMessage] | None = None,
                  admit: Callable[[int, Message], bool] | None = None,
                  encoded: Callable[[int], None] | None = None) -> PreparedBatch:
    """Validate, choose a queue for and encode each message, in order.

    A refused message gets ``results[i] = PutMessageResult.refused(status, reason)``.
    ``admit(i, msg)`` (after validation, before the queue is chosen) may fill
    ``results[i]`` itself and return False: the message is then not encoded (an
    idempotent producer's duplicate or out-of-order record); it may also change the
    message (the producer identity properties). ``encoded(i)`` is told of each message
    whose record was made, before the next message is looked at. Records are appended
    to ``records`` when given, so several requests can share one append.
    """
    if records is None:
        records = []
    slots: list[int] = []
    wait = False
    prepare = commit_log.prepare
    select = selector.select
    for i, msg in enumerate(messages):
        bad = check_message(msg, config)
        if bad is None:
            if admit is not None and not admit(i, msg):
                continue
            enc = prepare(msg, select(msg), now)
            if type(enc) is EncodedMessage:
                records.append(enc)
                slots.append(i)
                if msg.wait_store_msg_ok:
                    wait = True
                if encoded is not None:
                    encoded(i)
                continue
            bad = enc
        results[i] = PutMessageResult.refused(*bad)
    return PreparedBatch(records, slots, wait)


def put_messages(commit_log: CommitLog, config: StoreConfig, messages: Sequence[Message],
                 now: int, selector: QueueSelector,
                 verdicts: dict) -> Sequence[PutMessageResult]:
    """The embedded store's put: the messages laid out as records as a producer lays out
    a SEND_RECORDS frame (``record_batch.encode_records``), checked as the writer checks
    one (record by record below ``record_batch.SMALL_CHECK``, else in bulk), queues
    chosen, and copied in as they are (``CommitLog.append_small`` / ``append_batch``):
    the writer's path, in one process. A batch with anything else in it (a refusal, a
    delayed message, an IPv6 host, a message that cannot be laid out) takes
    ``prepare_batch`` message by message, which judges and answers each. ``verdicts``
    caches topic verdicts across calls. One result per message, in order (a clean run's
    as ``PutResults`` columns; ``stored_slots`` reads which were stored off either)."""
    if not commit_log.store_host_v6:
        try:
            data, offsets = record_batch.encode_records(messages, now)
        except UNENCODABLE:
            data = None
        if data is not None:
            taken = _put_clean(commit_log, config, data, offsets, now, selector, verdicts)
            if taken is not None:
                return taken
    results: list = [None] * len(messages)
    batch = prepare_batch(commit_log, config, messages, now, selector, results)
    if batch.records:
        records = record_batch.RecordBatch.from_encoded(batch.records)
        done = commit_log.append_batch(records, records.queue_ids, now)
        answers = _results(commit_log, done, records.sizes.tolist(), records.real_queue_ids, now)
        for i, r in zip(batch.slots, answers):
            results[i] = r
    return results


def _put_clean(commit_log: CommitLog, config: StoreConfig, data: bytes, offsets: list[int],
               now: int, selector: QueueSelector,
               verdicts: dict) -> PutResults | None:
    """Append a run of records every one of which is taken as it is; None (nothing
    done) when one is not."""
    if len(offsets) < record_batch.SMALL_CHECK:
        run = record_batch.check_clean_run(data, offsets, config, verdicts=verdicts)
        if run is None:
            return None
        topics, sizes = run.topics, run.sizes
        queue_ids = selector.choose(topics, run.queue_ids)
        done = commit_log.append_small(data, run.starts, sizes, topics, queue_ids,
                                       run.consumable, now)
    else:
        checked = record_batch.check_records(data, np.asarray(offsets, np.int64), config,
                                             topic_verdicts=verdicts, own_crcs=True)
        if checked.refusals or checked.long_way:
            return None
        topics, sizes = checked.topics, checked.sizes.tolist()
        queue_ids = selector.choose(topics, checked.queue_ids)
        done = commit_log.append_batch(record_batch.from_checked(data, checked, queue_ids),
                                       queue_ids, now)
    return _results(commit_log, done, sizes, queue_ids, now)


class PutResults(Sequence):
    """One result per record of an append, kept as columns: record i < ``stored`` is
    PUT_OK at ``wrote_offsets[i]`` (``wrote_bytes``, ``queue_ids``, ``queue_offsets``
    alike, every one at ``store_timestamp``); each record after it is
    CREATE_MAPEDFILE_FAILED for ``failure``. A ``PutMessageResult`` is made when a
    caller takes one, once: a change to it (a flush's timeout) stays. It reads as the
    list it stands for: index, slice, iterate, compare, and ``+`` with a list (a list)."""

    __slots__ = ("stored", "wrote_offsets", "wrote_bytes", "queue_ids", "queue_offsets",
                 "store_timestamp", "msg_id_prefix", "failure", "_count", "_made")

    def __init__(self, count: int, stored: int, wrote_offsets: list[int],
                 wrote_bytes: list[int], queue_ids: list[int], queue_offsets: list[int],
                 store_timestamp: int, msg_id_prefix: str, failure: str):
        self._count, self.stored = count, stored
        self.wrote_offsets, self.wrote_bytes = wrote_offsets, wrote_bytes
        self.queue_ids, self.queue_offsets = queue_ids, queue_offsets
        self.store_timestamp, self.msg_id_prefix = store_timestamp, msg_id_prefix
        self.failure = failure
        self._made: dict[int, PutMessageResult] = {}

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if type(i) is slice:
            return [self[k] for k in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("result index out of range")
        r = self._made.get(i)
        if r is None:
            r = self._made[i] = self._make(i)
        return r

    def __iter__(self):
        return map(self.__getitem__, range(self._count))

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, tuple, PutResults)):
            return len(other) == self._count and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"PutResults({list(self)!r})"

    def __add__(self, other) -> list[PutMessageResult]:
        return list(self) + list(other)

    def __radd__(self, other) -> list[PutMessageResult]:
        return list(other) + list(self)

    def _make(self, i: int) -> PutMessageResult:
        if i >= self.stored:
            return PutMessageResult.refused(PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                            self.failure)
        off = self.wrote_offsets[i]
        return PutMessageResult(PutMessageStatus.PUT_OK, f"{self.msg_id_prefix}{off:016X}",
                                off, self.wrote_bytes[i], self.queue_ids[i],
                                self.queue_offsets[i], self.store_timestamp)


def stored_slots(results: Sequence[PutMessageResult]) -> Sequence[int]:
    """The indices of the PUT_OK results (of ``PutResults``, read off its columns)."""
    if type(results) is PutResults:
        return range(results.stored)
    ok = PutMessageStatus.PUT_OK
    return [i for i, r in enumerate(results) if r.status is ok]


def _results(commit_log: CommitLog, done: Appended, sizes: list[int], queue_ids: list[int],
             now: int) -> PutResults:
    """One result per record: stored where ``done`` says, or CREATE_MAPEDFILE_FAILED for
    the reason it gives."""
    return PutResults(len(sizes), done.count, done.physical_offsets, sizes, queue_ids,
                      done.queue_offsets, now, commit_log.msg_id_prefix, done.error)
