"""The scheduler process: delivers delayed messages when they fall due.

It runs ``storage.schedule_message.ScheduleMessageService`` over a read-only
``StoreReader`` (the SCHEDULE_TOPIC_XXXX queues, bounded by DISPATCHED) and re-puts due
messages to their real topic and queue through the writer's ingest socket, like any
producer. It sleeps until the earliest waiting message is due, or until the dispatcher
announces a new delayed message.

Restart decision table:

    on start it rebuilds  from
    --------------------  -------------------------------------------------------------
    level offsets         config/delayOffset.json (written after each delivery)
    what is due           the SCHEDULE_TOPIC_XXXX consume queues (their units hold the
                          delivery time)

A crash between a re-put and the offset write puts that batch again on restart, and a
re-put that times out is put again later; both carry the identities of the first try
(one idempotent producer per level, ``storage.schedule_message``), so the writer answers
them as duplicates: never lost, never stored twice. Each turn delivers for at most
``MAX_TURN_MS``, so a backlog never stops the heartbeat. Delivered messages keep ``reconsume_times`` and ``prepared_transaction_offset``:
the producer sends a message carrying either as a SEND_RECORDS record, which holds every
field.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

from rocketstore.client import ClientError, Producer
from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.shm import bus
from rocketstore.shm.positions import Slot, now_ms
from rocketstore.storage.delay_level import parse_delay_levels, queue_id_to_delay_level
from rocketstore.storage.message import Message, MessageExt
from rocketstore.storage.record import SCHEDULE_TOPIC
from rocketstore.storage.schedule_message import ScheduleMessageService
from rocketstore.storage.status import GetMessageStatus, PutMessageStatus
from rocketstore.storage.store_reader import StoreReader

log = logging.getLogger(__name__)
PAGE = 64
PUT_TIMEOUT_MS = 3000


class SchedulerService(Service):
    name = "scheduler"

    def setup(self) -> None:
        self.reader = StoreReader(self.config)
        self.producers: dict[int, Producer] = {}    # one idempotent producer per level
        self.delay_level_ms = parse_delay_levels(self.config.message_delay_level)
        self.held: dict[int, MessageExt] = {}
        self.service = ScheduleMessageService(self, self.delay_level_ms, self.config.config_dir)
        self.service.load()
        # only delayed messages' arrivals wake it
        self.arrivals = bus.Subscriber(self.context, self.store_dir, ["dispatcher"],
                                       [bus.arrival_topic(SCHEDULE_TOPIC)])

    def turn(self) -> None:
        due = self.service.next_due_ms()
        wait_ms = MAX_TURN_MS if due is None else max(0, min(MAX_TURN_MS, due - now_ms()))
        self.arrivals.wait(wait_ms)
        if due is not None and due <= now_ms():       # a bounded turn: the loop keeps turning
            self.service.deliver_due(deadline=time.monotonic() + MAX_TURN_MS / 1000)
        self.held.clear()

    def teardown(self) -> None:
        self.service.persist()
        for producer in self.producers.values():
            producer.close()
        self.reader.close()

    # ------------------------------------------------------------ DelayQueues
    def delay_units(self, queue_id: int, start: int) -> Iterator[tuple[int, int, int, int]]:
        level = queue_id_to_delay_level(queue_id)
        delay_ms = self.delay_level_ms[min(level, len(self.delay_level_ms) - 1)]
        offset = start
        while True:
            r = self.reader.get_message(SCHEDULE_TOPIC, queue_id, offset, PAGE,
                                        self.table.get(Slot.DISPATCHED),
                                        min_commit_log_offset=self.table.get(Slot.MIN_OFFSET))
            if not r.messages:
                if r.next_begin_offset > offset and r.status is not GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                    offset = r.next_begin_offset  # past removed messages
                    continue
                return
            for m in r.messages:
                self.held[m.commit_log_offset] = m
                yield m.queue_offset, m.commit_log_offset, m.store_size, m.store_timestamp + delay_ms
            offset = r.next_begin_offset

    def look_message(self, commit_log_offset: int) -> MessageExt | None:
        return self.held.get(commit_log_offset)

    def put_again_batch(self, msgs: list[Message], identity: tuple[int, int]):
        """Re-put as the level's idempotent producer (``identity``: its id and first
        sequence): a batch put again after a lost answer is answered as a duplicate."""
        producer_id, first_sequence = identity
        producer = self.producers.get(producer_id)
        if producer is None:
            producer = self.producers[producer_id] = Producer(
                self.store_dir, timeout_ms=PUT_TIMEOUT_MS, producer_id=producer_id)
        try:
            results = producer.send_batch(msgs, first_sequence=first_sequence)
        except ClientError as e:
            return [(PutMessageStatus.SERVICE_NOT_AVAILABLE, str(e))] * len(msgs)
        return [(r.status, r.reason) for r in results]


SERVICE = SchedulerService
