"""TransactionalMessageService: RocketMQ's transactional messages on the store's own
paths, for the proxy process (RocketMQ's TransactionalMessageServiceImpl,
EndTransactionProcessor and TransactionalMessageCheckService). The records are
``storage.transactional_message``'s; every one is put through the writer's ingest socket
as any producer's, and read back from the mapped files.

* ``half``: a message sent as TRANSACTION is stored as a half message, in
  RMQ_SYS_TRANS_HALF_TOPIC queue 0, its real topic and queue (the next of the topic's
  queues in turn) in its properties, so no consumer of the real topic sees it.
* ``end_transaction``: COMMIT puts the committed message and the op record in one batch;
  ROLLBACK the op record only. The half is read where its transaction id says; a
  transaction id that names no half of the topic and message, or a transaction ended
  already, is refused (``InvalidTransactionId``), as RocketMQ's proxy refuses
  transaction data it does not find, and nothing is written.
* ``check``: every ``transaction_check_interval`` ms a pass reads the half queue from the
  check's offset (the offset of group CID_RMQ_SYS_TRANS in ``consumerOffset.json``, as
  RocketMQ keeps it) up to where it stood when the pass began. A half whose transaction
  has an op record is passed over. One checked ``transaction_check_max`` times already
  is discarded: logged, and a copy put in TRANS_CHECK_MAX_TIME_TOPIC. One older than its
  immunity (``transaction_timeout``, or its CHECK_IMMUNITY_TIME_IN_SECONDS) is put back
  at the end of the queue with its check count raised, and the copy is handed to the
  ``listener`` (the proxy sends it to a live producer of the topic as a
  RecoverOrphanedTransactionCommand; with none the check still counts, as RocketMQ's).
  One past the timeout but still immune is put back as it is. The first half younger
  than the timeout ends the pass (the queue is in order of birth, put-back copies
  aside, which are due at once). The check's offset is committed at the end of a pass.

Restart (decision table):

    state at start                       what the service does
    -----------------------------------  ----------------------------------------------
    no half topic                        nothing to check
    half topic, no CID_RMQ_SYS_TRANS     the first pass reads the half queue from its
    offset                               first message still stored
    an offset                            passes go on from it; the op records (every one
                                         still stored) say which transactions ended,
                                         read once the dispatcher reached what the
                                         writer held at start, so a commit acknowledged
                                         before a kill is known
    killed between a put-back and the    that half is checked once more (a second copy
    offset's commit                      of it, the same count): a producer may be asked
                                         twice, never a transaction ended twice
    killed between a commit's batch      the writer stored the batch or not; the
    and its answer                       producer's retry or the check finds the op
    (or the writer did not answer)       (a retry of an end the writer did not answer
                                         first waits for the dispatcher to reach what
                                         the writer holds, and reads the ops again)

Invariants: a transaction's op record is put before any answer says it ended, and at
most one op record is put per transaction by this process (``ended`` holds every
transaction with one); a committed message is put only with its op record, in one batch,
and only once the writer's own checks (``validation.check_message``) take it, so an op
never ends a transaction whose message the writer refused.

Threads: EndTransaction calls run on gRPC threads and the pass on the proxy's loop; one
lock holds the reader, the producer and ``ended``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

from rocketstore.client.consumer import read_offsets, update_offsets
from rocketstore.procs.internal_producer import ClientError, InternalProducer
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage.clock import now_ms
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.errors import StoreError
from rocketstore.storage.message import Message, StoredMessageFields
from rocketstore.storage.message_view import MessageView
from rocketstore.storage.status import GetMessageStatus, PutMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.transactional_message import (
    HALF_QUEUE_ID, TRANS_CONSUMER_GROUP, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
    InvalidTransactionId, check_times, committed_message, decode_transaction_id,
    discarded_message, half_message, immunity_ms, is_half, op_keys, op_message,
    put_back_message, transaction_key)
from rocketstore.storage.validation import check_message
from rocketstore.wire.protocol import SendResult

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 3000
READ_BATCH = 32
CATCH_UP_S = 5.0            # the longest a restarted proxy waits for the dispatcher
HALF_OFFSET_KEY = f"{TRANS_HALF_TOPIC}@{TRANS_CONSUMER_GROUP}"
# statuses whose next_begin_offset moves a read on without a message
_PASSED_OVER = (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.NO_MATCHED_MESSAGE,
                GetMessageStatus.MESSAGE_WAS_REMOVING)

# (the half as stored, the transaction id of the copy to end) -> a producer was told
CheckListener = Callable[[MessageView, str], bool]


class TransactionStoreError(Exception):
    """The store did not take a record; ``status`` and the text say why."""

    def __init__(self, status: PutMessageStatus | None, text: str):
        super().__init__(text)
        self.status = status


class TransactionalMessageService:
    def __init__(self, config: StoreConfig, table: PositionTable, listener: CheckListener):
        self.config = config
        self.table = table
        self.listener = listener
        self.reader = StoreReader(config)
        self._lock = threading.Lock()
        self._producer = InternalProducer(config.store_path_root_dir, SEND_TIMEOUT_MS)
        self._queue_turns: dict[str, itertools.count] = {}
        self.ended: set[int] = set()         # transactions (first half offsets) with an op
        self._unanswered: set[int] = set()   # ends the writer did not answer: unknown
        self._op_next = 0                    # the next op record to read into ``ended``
        self._written_at_start = table.get(Slot.WRITTEN)
        self._caught_up = False
        self._next_check = time.monotonic() + config.transaction_check_interval / 1000

    def close(self) -> None:
        with self._lock:
            self.reader.close()
            self._producer.close()

    # ------------------------------------------------------------------ send
    def half(self, m: Message) -> Message:
        """The half message ``m`` (sent as TRANSACTION) is stored as; its real queue is
        its own when set (a message group's), else the topic's next in turn."""
        queue_id = m.queue_id
        if queue_id is None:
            turn = self._queue_turns.setdefault(m.topic, itertools.count())
            queue_id = next(turn) % self.config.default_topic_queue_nums
        return half_message(m, queue_id)

    # ------------------------------------------------------------------ end
    def end_transaction(self, transaction_id: str, message_id: str, topic: str,
                        commit: bool, timeout_ms: int = SEND_TIMEOUT_MS) -> StoredMessageFields:
        """Commit or roll back the transaction of the half ``transaction_id`` names,
        waiting up to ``timeout_ms`` for the writer; the half. Raises
        ``InvalidTransactionId`` (nothing written) and ``TransactionStoreError`` (the
        store did not take the records, or the writer did not answer)."""
        phy = decode_transaction_id(transaction_id)
        with self._lock:
            self._catch_up()
            half = self._look_half(phy, transaction_id)
            if message_id and half.uniq_key != message_id:
                raise InvalidTransactionId(f"transaction id {transaction_id} names message "
                                           f"{half.uniq_key}, not {message_id}")
            real_topic = half.properties.get("REAL_TOPIC")
            if topic and real_topic != topic:
                raise InvalidTransactionId(f"transaction id {transaction_id} is of topic "
                                           f"{real_topic}, not {topic}")
            key = transaction_key(half)
            if key in self._unanswered:       # stored or not: the op records will say
                self._catch_up(until=self.table.get(Slot.WRITTEN))
                self._unanswered.discard(key)
            if key in self.ended:
                raise InvalidTransactionId(f"transaction {transaction_id} was committed or "
                                           "rolled back already")
            records = [committed_message(half)] if commit else []
            refusal = records and check_message(records[0], self.config)
            if refusal:                 # the op alone would end it without its message
                raise TransactionStoreError(refusal[0], f"the committed message would be "
                                                        f"refused: {refusal[1]}")
            try:
                results = self._send(records + [op_message(key)], timeout_ms)
            except TransactionStoreError:
                self._unanswered.add(key)
                raise
            if results[0].ok:           # the commit (or the op) is stored: never again
                self.ended.add(key)
            _raise_unless_stored(results)
            return half

    def _look_half(self, phy: int, transaction_id: str) -> StoredMessageFields:
        try:
            half = self.reader.look_message_by_offset(phy, self.table.get(Slot.WRITTEN))
        except StoreError:          # no record starts there (a made-up offset)
            half = None
        if half is None or not is_half(half):
            raise InvalidTransactionId(f"transaction id {transaction_id} names no half "
                                       "message of this store")
        return half

    # ------------------------------------------------------------------ check
    def check_if_due(self) -> None:
        """Run a check pass when ``transaction_check_interval`` has passed (the proxy's
        loop). Logs, never raises, when the store cannot be read or written."""
        if time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + self.config.transaction_check_interval / 1000
        try:
            self.check()
        except (OSError, StoreError, ClientError) as e:
            log.error("transaction check pass stopped: %s", e)

    def check(self) -> int:
        """One pass (module docstring); the number of halves handed to the listener."""
        with self._lock:
            self._catch_up()
            dispatched = self.table.get(Slot.DISPATCHED)
            min_phy = self.table.get(Slot.MIN_OFFSET)
            bounds = self.reader.queue_bounds(TRANS_HALF_TOPIC, HALF_QUEUE_ID, dispatched,
                                              min_commit_log_offset=min_phy)
            if bounds is None:
                return 0
            start = max(self._half_offset(), bounds[0])
            offset, checked = self._pass(start, bounds[1], dispatched, min_phy)
            if offset != start:
                update_offsets(self.config.config_dir, HALF_OFFSET_KEY,
                               {str(HALF_QUEUE_ID): offset})
            return checked

    def _pass(self, offset: int, end: int, dispatched: int, min_phy: int) -> tuple[int, int]:
        """Check the halves from ``offset`` to ``end``; the offset it stopped at and the
        halves checked."""
        checked, now = 0, now_ms()
        while offset < end:
            r = self.reader.get_message(TRANS_HALF_TOPIC, HALF_QUEUE_ID, offset,
                                        min(READ_BATCH, end - offset), dispatched,
                                        min_commit_log_offset=min_phy)
            if r.status in _PASSED_OVER:
                offset = r.next_begin_offset
                continue
            if r.status is not GetMessageStatus.FOUND:
                break
            for half in r.messages:
                try:
                    outcome = self._check_one(half, now)
                except TransactionStoreError as e:
                    log.error("transaction check stopped at half %d (tried again next "
                              "pass): %s", half.queue_offset, e)
                    outcome = None
                if outcome is None:
                    return offset, checked
                checked += outcome
                offset = half.queue_offset + 1
        return offset, checked

    def _check_one(self, half: MessageView, now: int) -> int | None:
        """Settle one half of a pass: 1 when handed to the listener, 0 when passed over,
        None when the pass stops at it (younger than the timeout, or not put back)."""
        key = transaction_key(half)
        if key in self.ended or not is_half(half):
            return 0
        times = check_times(half)
        if times >= self.config.transaction_check_max:
            self._put([discarded_message(half)])
            log.warning("half message %s of %s (transaction %d) discarded after %d checks "
                        "(transaction_check_max); a copy is in TRANS_CHECK_MAX_TIME_TOPIC",
                        half.uniq_key, half.properties.get("REAL_TOPIC"), key, times)
            return 0
        age = now - half.born_timestamp
        if age < self.config.transaction_timeout:
            return None
        if age < immunity_ms(half, self.config.transaction_timeout):
            self._put([put_back_message(half, times)])        # immune: later
            return 0
        (copy,) = self._put([put_back_message(half, times + 1)])
        try:
            told = self.listener(half, copy.msg_id)
        except Exception:           # the listener's fault must not stop the checks
            log.exception("the check of %s could not be sent", half.uniq_key)
            told = False
        if not told:
            log.info("no live producer of %s to check transaction %s (check %d)",
                     half.properties.get("REAL_TOPIC"), half.uniq_key, times + 1)
        return 1

    def _half_offset(self) -> int:
        offsets = read_offsets(self.config.config_dir).get(HALF_OFFSET_KEY, {})
        return int(offsets.get(str(HALF_QUEUE_ID), 0))

    # ------------------------------------------------------------------ ops
    def _catch_up(self, until: int = 0) -> None:
        """Read the op records not read yet into ``ended``, once the dispatcher has
        reached ``until`` (bounded by CATCH_UP_S): the first time, what the writer held
        when the proxy started, so every op acknowledged before a restart is known."""
        if not self._caught_up:
            until = max(until, self._written_at_start)
            self._caught_up = True
        deadline = time.monotonic() + CATCH_UP_S
        while self.table.get(Slot.DISPATCHED) < until and time.monotonic() < deadline:
            time.sleep(0.01)
        dispatched = self.table.get(Slot.DISPATCHED)
        min_phy = self.table.get(Slot.MIN_OFFSET)
        bounds = self.reader.queue_bounds(TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, dispatched,
                                          min_commit_log_offset=min_phy)
        if bounds is None:
            return
        offset = max(self._op_next, bounds[0])
        while offset < bounds[1]:
            r = self.reader.get_message(TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, offset,
                                        READ_BATCH, dispatched, min_commit_log_offset=min_phy)
            if r.status is GetMessageStatus.FOUND:
                for op in r.messages:
                    self.ended.update(op_keys(op))
            elif r.status not in _PASSED_OVER:
                break
            offset = r.next_begin_offset
        self._op_next = offset

    # ------------------------------------------------------------------ put
    def _put(self, records: list[Message]) -> list[SendResult]:
        """Put ``records`` in one batch. Raises ``TransactionStoreError`` unless every
        one is stored."""
        results = self._send(records)
        _raise_unless_stored(results)
        return results

    def _send(self, records: list[Message],
              timeout_ms: int = SEND_TIMEOUT_MS) -> list[SendResult]:
        """Each record's outcome. Raises ``TransactionStoreError`` when the writer did
        not answer within ``timeout_ms`` (the outcome is unknown)."""
        try:
            results = self._producer.send_batch(records, timeout_ms)
        except ClientError as e:
            raise TransactionStoreError(None, f"the store's writer did not answer: {e}") \
                from None
        return results


def _raise_unless_stored(results: list[SendResult]) -> None:
    for r in results:
        if not r.ok:
            raise TransactionStoreError(r.status, f"{r.status.name}: {r.reason}")
