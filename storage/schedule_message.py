"""ScheduleMessageService: delivering delayed messages when they fall due.

A delayed message waits in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1`` (see
``storage.delay_level``); its ConsumeQueue unit's tagsCode is its delivery time. For
each level the service keeps the next queue offset to look at, in
``config/delayOffset.json`` as ``{"offsetTable": {"<level>": <offset>}}``.

``deliver_due(now)`` walks each level's queue from its offset: while the unit at the
offset is due (delivery time <= now), the message is read, turned back into a message
for its real topic and queue (``restore_real_destination``) and put again; the offset
then moves past it. The first unit not yet due stops that level: units of one level
are in delivery-time order, since every message of a level waits the same time. A
delivery time further away than the level's delay (a clock that went backwards) is
treated as due now, as RocketMQ's ``correctDeliverTimestamp`` does.

Due messages go out in batches of up to ``BATCH`` (one ``put_again_batch``), and the
offset table is written after every batch that delivered something; a call stops at
its ``deadline`` (a monotonic time) so a process's loop keeps turning however large the
backlog, and the next call goes on where it stopped.

Exactly once: every level re-puts as an idempotent producer (``identity``): a producer
id derived from the level and a generation, and a sequence that counts the level's
deliveries. Both are written with the offset, under ``rocketstoreSequences`` beside
RocketMQ's ``offsetTable`` (which RocketMQ's own reader ignores), so a batch put again
after a crash (between the re-put and the offset write) or after a timeout (stored, but
the answer lost) carries the same identities, and the writer answers it as the
duplicate it is instead of storing it twice (``storage.idempotence``). When the writer
no longer knows the producer (it expires after ``producer_id_expiration_ms`` idle) it
answers OUT_OF_ORDER_SEQUENCE; the level then takes the next generation, whose
sequences start at 0 (no re-put of the old one can still be in flight after that long).
A store that puts in process (the embedded one) loses no answer and ignores identities.

Refusals. A put the store refuses for now (not writeable: a full disk, a flush error,
a busy page cache, ...) leaves the level's offset at that message and holds the level
for ``RETRY_MS`` (RocketMQ's DELAY_FOR_A_PERIOD, 10 s there): the next call does not
look at it before, ``next_due_ms`` says so (a scheduler does not spin on it), and the
refusal is logged once, not at every try. A message the store will never take as it
is (``NEVER_TAKEN``: MESSAGE_ILLEGAL, say a queue id the topic no longer has since
``default_topic_queue_nums`` went down) is passed over with an ERROR naming it, as
RocketMQ drops a message it cannot rebuild: it stays in SCHEDULE_TOPIC_XXXX, readable
by its offset, and holds back none of the level's later messages.

Crash story: the offset table is written after the re-puts (``persist``), so a crash
between the two puts that batch again on restart, with the same identities: never lost,
never stored twice. A put refused because the store is not writeable leaves the offset
at the first message not stored, and is retried after ``RETRY_MS``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
from typing import Iterator, Protocol

from rocketstore.storage import json_file
from rocketstore.storage.delay_level import delay_level_to_queue_id, restore_real_destination
from rocketstore.storage.mapped_file import now_ms
from rocketstore.storage.message import Message, MessageExt
from rocketstore.storage.status import PutMessageStatus

log = logging.getLogger(__name__)

DELAY_OFFSET_FILE = "delayOffset.json"
BATCH = 64                 # due messages put again in one batch
RETRY_MS = 1000            # a level whose put was refused for now waits this long
NEVER_TAKEN = frozenset({PutMessageStatus.MESSAGE_ILLEGAL,
                         PutMessageStatus.PROPERTIES_SIZE_EXCEEDED})


class DelayQueues(Protocol):
    """What the service needs of a store: the embedded MessageStore and the scheduler
    process (a StoreReader plus a Producer) each provide it."""

    def delay_units(self, queue_id: int, start: int) -> Iterator[tuple[int, int, int, int]]:
        """``(queue_offset, commit_log_offset, size, deliver_at_ms)`` of the
        SCHEDULE_TOPIC_XXXX queue ``queue_id`` from ``start`` (raised to the queue's
        min offset) to its dispatched end."""

    def look_message(self, commit_log_offset: int) -> MessageExt | None: ...

    def put_again_batch(self, msgs: list[Message],
                        identity: tuple[int, int]) -> list[tuple[PutMessageStatus, str]]:
        """Put ``msgs`` in order as producer ``identity[0]`` with sequences from
        ``identity[1]``; per message its status and reason (a duplicate is PUT_OK)."""


class ScheduleMessageService:
    def __init__(self, queues: DelayQueues, delay_level_ms: list[int], config_dir: str):
        self.queues = queues
        self.delay_level_ms = delay_level_ms
        self.max_delay_level = len(delay_level_ms) - 1
        self.offset_table: dict[int, int] = {}
        self.sequences: dict[int, tuple[int, int]] = {}   # level -> (generation, next)
        self._persisted: tuple = ({}, {})
        self.path = os.path.join(config_dir, DELAY_OFFSET_FILE)
        self.identity_base = _identity_base(config_dir)
        self.held_levels: dict[int, tuple[float, str]] = {}  # level -> (monotonic s to retry, why)

    def load(self) -> None:
        """Read the offset table; levels without an entry start at offset 0."""
        doc = json_file.load(self.path) or {}
        table = doc.get("offsetTable", {})
        self.offset_table = {int(level): int(offset) for level, offset in table.items()
                             if str(level).isdigit() and 1 <= int(level) <= self.max_delay_level}
        self.sequences = {int(level): (int(pair[0]), int(pair[1]))
                          for level, pair in doc.get("rocketstoreSequences", {}).items()
                          if str(level).isdigit() and isinstance(pair, list) and len(pair) == 2}
        self._persisted = (dict(self.offset_table), dict(self.sequences))

    def persist(self) -> None:
        """Write the offset table (and the levels' sequences) if it changed since it was
        last read or written."""
        if (self.offset_table, self.sequences) == self._persisted:
            return
        json_file.persist(self.path, {
            "offsetTable": {str(k): v for k, v in sorted(self.offset_table.items())},
            "rocketstoreSequences": {str(k): list(v) for k, v in sorted(self.sequences.items())}})
        self._persisted = (dict(self.offset_table), dict(self.sequences))

    def identity(self, level: int) -> tuple[int, int]:
        """(producer id, next sequence) of level ``level``'s re-puts."""
        generation, sequence = self.sequences.get(level, (0, 0))
        return _producer_id(self.identity_base, level, generation), sequence

    def deliver_due(self, now: int | None = None, deadline: float | None = None) -> int:
        """Re-put the delayed messages due at ``now`` (all of them, or as many as fit
        before the monotonic ``deadline``); returns how many went out."""
        now = now_ms() if now is None else now
        delivered = 0
        for level in range(1, self.max_delay_level + 1):
            delivered += self._deliver_level(level, now, deadline)
            if deadline is not None and time.monotonic() >= deadline:
                break
        return delivered

    def _deliver_level(self, level: int, now: int, deadline: float | None) -> int:
        """Deliver level ``level``'s due messages batch by batch, each batch's progress
        written before the next."""
        held = self.held_levels.get(level)
        if held is not None and time.monotonic() < held[0]:
            return 0
        delivered = 0
        due = self._due(level, now)
        while True:
            batch = list(itertools.islice(due, BATCH))
            if not batch:
                return delivered
            done, stored = self._redeliver(level, batch)
            if done:
                self.offset_table[level] = batch[done - 1][0] + 1
                delivered += stored
                self.persist()
            if done < len(batch) or (deadline is not None and time.monotonic() >= deadline):
                return delivered

    def _due(self, level: int, now: int) -> Iterator[tuple[int, int]]:
        """``(queue offset, commit log offset)`` of the level's due units, in order."""
        for index, phy, _, deliver_at in self.queues.delay_units(
                delay_level_to_queue_id(level), self.offset_table.get(level, 0)):
            if deliver_at > now + self.delay_level_ms[level]:
                deliver_at = now
            if deliver_at > now:
                return
            yield index, phy

    def _redeliver(self, level: int, batch: list[tuple[int, int]]) -> tuple[int, int]:
        """Put the batch's messages again: how many from its start are done (stored,
        passed over, or expired with their CommitLog file: nothing left to deliver), and
        how many of them were stored. The level's sequence moves past those stored."""
        held = [self.queues.look_message(phy) for _, phy in batch]
        msgs = [restore_real_destination(m) for m in held if m is not None]
        results = iter(self.queues.put_again_batch(msgs, self.identity(level)) if msgs else [])
        generation, sequence = self.sequences.get(level, (0, 0))
        passed_over = 0
        expired = 0
        for done, ((_, phy), message) in enumerate(zip(batch, held)):
            if message is None:
                expired += 1
                continue
            status, reason = next(results)
            if status is PutMessageStatus.OUT_OF_ORDER_SEQUENCE and passed_over:
                # the records after one the writer refused: not stored (what it stores
                # of a batch is a prefix); the next batch puts them from here
                self.sequences[level] = (generation, sequence)
                return done, done - passed_over - expired
            if status is PutMessageStatus.OUT_OF_ORDER_SEQUENCE:
                log.warning("level %d's producer is not the store's any more (%s): next "
                            "generation", level, reason)
                self.sequences[level] = (generation + 1, 0)
                return done, done - passed_over - expired
            if status in NEVER_TAKEN:
                log.error("delayed message at %d (level %d) passed over: its destination "
                          "refuses it (%s: %s); it stays in %s at that offset", phy, level,
                          status.name, reason, message.topic)
                passed_over += 1            # it took no sequence: none was stored
                continue
            if not status.ok:
                self._hold(level, f"{status.name}: {reason}", phy)
                self.sequences[level] = (generation, sequence)
                return done, done - passed_over - expired
            sequence += 1
        self.sequences[level] = (generation, sequence)
        if self.held_levels.pop(level, None) is not None:
            log.info("level %d delivers again", level)
        return len(batch), len(batch) - passed_over - expired

    def _hold(self, level: int, why: str, phy: int) -> None:
        """Retry ``level`` only after ``RETRY_MS``; say why once, not at every try."""
        before = self.held_levels.get(level)
        if before is None or before[1] != why:
            log.warning("delayed messages of level %d held from the one at %d: %s (tried "
                        "again every %d ms)", level, phy, why, RETRY_MS)
        self.held_levels[level] = (time.monotonic() + RETRY_MS / 1000, why)

    def next_due_ms(self) -> int | None:
        """When the earliest waiting message falls due, or its held level may be tried
        again (None when none waits)."""
        earliest = None
        for level in range(1, self.max_delay_level + 1):
            held = self.held_levels.get(level)
            retry_at = 0 if held is None else \
                now_ms() + int((held[0] - time.monotonic()) * 1000)
            for _, _, _, deliver_at in self.queues.delay_units(
                    delay_level_to_queue_id(level), self.offset_table.get(level, 0)):
                deliver_at = max(deliver_at, retry_at)
                if earliest is None or deliver_at < earliest:
                    earliest = deliver_at
                break
        return earliest


def _identity_base(config_dir: str) -> bytes:
    return os.path.realpath(config_dir).encode()


def _producer_id(base: bytes, level: int, generation: int) -> int:
    """A u64 other than 0, the same for a store's level and generation in every run."""
    digest = hashlib.sha1(base + b"/scheduler/%d/%d" % (level, generation)).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1) or 1
