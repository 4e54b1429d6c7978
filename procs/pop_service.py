"""PopService: RocketMQ 5's pop consumption (ReceiveMessage, AckMessage,
ChangeInvisibleDuration) over the store's mapped files, for the proxy process.

A pop of ``group`` on ``topic`` (``receive``) hands out, up to the batch size:

1. the group's in-flight messages whose invisible duration is over, oldest first, each
   with its delivery attempt raised (RocketMQ revives them into a retry topic; here they
   are read again where they are). One handed out ``retry_max_times + 1`` times already
   goes to the group's dead-letter queue instead (``dead_letter``: a copy put in
   ``%DLQ%<group>``, queue 0, then dropped from the state, as RocketMQ's proxy forwards
   it); a crash between the two puts the copy there twice;
2. then messages never popped, from each queue's pop offset, taking the queues in turn
   from where the last pop stopped, passing over (as done) those the tag filter does not
   take, as RocketMQ's proxy acks them.

Every message handed out is invisible to the group for ``invisible_ms``. The group's
state (``storage.pop_state``) is committed to ``config/popState.journal`` before the
messages leave, and before an ack or a change of invisible duration is answered. A group
that pops a queue for the first time starts at the queue's first message still on disk.

Reads never pass DISPATCHED (``storage.store_reader``), so a message is popped only once
every process could serve it. A pop that finds nothing waits (long polling) for the
dispatcher's ARRIVAL announcements (``wake``, called by the proxy's loop) or for an
in-flight message to become visible again, until its polling time ends; it looks again
at least every ``RECHECK_S`` since the bus may drop an announcement.

Auto-renewal (a PushConsumer's receive, ``renew_for`` its client id): its messages are
invisible for ``AUTO_RENEW_INVISIBLE_MS`` and ``renew`` (the proxy's loop) pushes that
back while the client is seen (any call within ``CLIENT_EXPIRY_S``), until the message
is acked or its invisible duration changed (a nack), as RocketMQ's proxy renews them;
a client that says it terminates has its messages visible again after
``TERMINATED_VISIBLE_MS``. Which messages are renewed for whom lives in this process
only: after a restart of the proxy they are not renewed and come back when their time
ends (delivered twice, never lost).

Threads: gRPC calls run on a pool of threads; one condition's lock holds every read of
the files and every change of the state (StoreReader and PopState are not thread-safe),
and a waiting pop releases it.
"""

from __future__ import annotations

import logging
import threading
import time

from rocketstore.procs.internal_producer import ClientError, InternalProducer
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage.clock import now_ms
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_WAIT_STORE_MSG_OK,
    Message)
from rocketstore.storage.message_view import MessageView
from rocketstore.storage.pop_state import GroupPop, InFlight, PopState, ReceiptHandle
from rocketstore.storage.status import GetMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import RESERVED_PROPERTIES

log = logging.getLogger(__name__)

RECHECK_S = 1.0
AUTO_RENEW_INVISIBLE_MS = 60_000        # the proxy's defaultInvisibleTimeMills
RENEW_AHEAD_MS = 10_000                 # renewed this long before it would end
CLIENT_EXPIRY_S = 120.0                 # a client unheard of this long is gone
TERMINATED_VISIBLE_MS = 1_000
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"         # RocketMQ's MixAll.DLQ_GROUP_TOPIC_PREFIX
SEND_TIMEOUT_MS = 3000
DEAD_LETTER_BACKOFF_S = 10.0   # after a dead letter the store did not take, none tried for this long
# statuses whose next_begin_offset moves a pop offset on without a message to hand out
_PASSED_OVER = (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.NO_MATCHED_MESSAGE,
                GetMessageStatus.MESSAGE_WAS_REMOVING)

Popped = tuple[MessageView, ReceiptHandle, InFlight]


class PopService:
    def __init__(self, config: StoreConfig, table: PositionTable, broker_name: str):
        self.config = config
        self.table = table
        self.broker_name = broker_name
        self.reader = StoreReader(config)
        self.state = PopState(config.config_dir)
        self._cond = threading.Condition()
        self._turns: dict[str, int] = {}    # topic@group -> the queue index to start at
        self._producer = InternalProducer(config.store_path_root_dir,
                                          SEND_TIMEOUT_MS)   # dead letters; under the lock
        self._dead_letters_after = 0.0    # monotonic time before which none is tried
        # (topic@group, unit) -> (client id, pop time) of the auto-renewed messages
        self._renewed: dict[tuple[str, tuple[int, int]], tuple[str, int]] = {}
        self._clients_seen: dict[str, float] = {}    # client id -> monotonic time
        self.stopping = False

    def wake(self) -> None:
        """New messages arrived (the dispatcher's ARRIVAL), or the proxy is stopping:
        waiting pops look again."""
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        self.stopping = True
        self.wake()

    def close(self) -> None:
        with self._cond:
            self.state.close()
            self.reader.close()
            self._producer.close()

    # ------------------------------------------------------------------ receive
    def receive(self, topic: str, group: str, tags: list[str] | None, batch: int,
                invisible_ms: int, wait_s: float, renew_for: str = "") -> list[Popped]:
        """Up to ``batch`` messages handed out to the group, waiting up to ``wait_s``
        for one; renewed for client ``renew_for`` when given (module docstring).
        Raises ``OSError`` when the state cannot be written (nothing is then handed
        out)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                popped = self._pop(topic, group, tags, batch, invisible_ms)
                left = deadline - time.monotonic()
                if popped or left <= 0 or self.stopping:
                    for m, handle, entry in popped if renew_for else ():
                        self._renewed[(f"{topic}@{group}", (m.queue_id, m.queue_offset))] = (
                            renew_for, entry.pop_time_ms)
                    return popped
                self._cond.wait(min(left, RECHECK_S, self._until_visible_s(topic, group)))

    # ------------------------------------------------------------------ auto-renewal
    def seen(self, client_id: str) -> None:
        """A call from ``client_id`` (any thread: one dict store)."""
        self._clients_seen[client_id] = time.monotonic()

    def renew(self) -> None:
        """Push back the end of every auto-renewed message due within RENEW_AHEAD_MS
        whose client is still seen; forget those acked, changed or of a client gone.
        Raises ``OSError`` when the renewal cannot be written."""
        if not self._renewed:
            return
        with self._cond:
            now, alive_since = now_ms(), time.monotonic() - CLIENT_EXPIRY_S
            for (key, unit), (client, pop_time) in list(self._renewed.items()):
                entry = self.state.group_by_key(key).inflight.get(unit)
                if entry is None or entry.pop_time_ms != pop_time or \
                        self._clients_seen.get(client, 0.0) < alive_since:
                    del self._renewed[(key, unit)]
                elif entry.visible_at_ms - now < RENEW_AHEAD_MS:
                    self.state.group_by_key(key).renew(unit, now + AUTO_RENEW_INVISIBLE_MS)
            self._commit()

    def client_terminated(self, client_id: str) -> None:
        """``client_id`` said it stops: its auto-renewed messages become visible again
        after TERMINATED_VISIBLE_MS. Raises ``OSError``."""
        with self._cond:
            visible_at = now_ms() + TERMINATED_VISIBLE_MS
            for (key, unit), (client, pop_time) in list(self._renewed.items()):
                if client != client_id:
                    continue
                del self._renewed[(key, unit)]
                entry = self.state.group_by_key(key).inflight.get(unit)
                if entry is not None and entry.pop_time_ms == pop_time:
                    self.state.group_by_key(key).renew(unit, min(entry.visible_at_ms,
                                                                 visible_at))
            self._clients_seen.pop(client_id, None)
            self._commit()

    def _until_visible_s(self, topic: str, group: str) -> float:
        visible_at = self.state.group(topic, group).next_visible_ms()
        return RECHECK_S if visible_at is None else max(0.005, (visible_at - now_ms()) / 1000)

    def _pop(self, topic: str, group: str, tags: list[str] | None, batch: int,
             invisible_ms: int) -> list[Popped]:
        g = self.state.group(topic, group)
        dispatched = self.table.get(Slot.DISPATCHED)
        min_offset = self.table.get(Slot.MIN_OFFSET)
        self.reader.drop_expired(min_offset)
        now = now_ms()
        popped = self._revive(topic, group, g, batch, invisible_ms, now, dispatched,
                              min_offset)
        popped += self._pop_new(topic, group, g, tags, batch - len(popped), invisible_ms, now,
                                dispatched, min_offset)
        self._commit()
        return popped

    def _revive(self, topic: str, group: str, g: GroupPop, batch: int, invisible_ms: int,
                now: int, dispatched: int, min_offset: int) -> list[Popped]:
        """In-flight messages whose invisible duration is over, handed out again, or
        sent to the dead-letter queue after their last attempt; one the cleaner removed
        meanwhile is dropped from the state."""
        out = []
        for unit in g.due(now)[:batch]:
            r = self.reader.get_message(topic, unit[0], unit[1], 1, dispatched,
                                        min_commit_log_offset=min_offset)
            if r.status is GetMessageStatus.FOUND and r.messages:
                m = r.messages[0]
                if g.inflight[unit].attempt <= self.config.retry_max_times:
                    out.append(self._hand_out(g, m, now, invisible_ms))
                elif self._dead_letter(topic, group, m):
                    g.drop(unit)
            elif r.status is not GetMessageStatus.OFFSET_OVERFLOW_ONE:
                g.drop(unit)      # expired from the files
        return out

    def _dead_letter(self, topic: str, group: str, m: MessageView) -> bool:
        """Put a copy of ``m`` in the group's dead-letter queue. False when the store
        did not take it (logged; the message stays in flight and is tried again at a
        pop ``DEAD_LETTER_BACKOFF_S`` later)."""
        if time.monotonic() < self._dead_letters_after:
            return False
        try:
            (r,) = self._producer.send_batch([dead_letter(topic, group, m)])
        except ClientError as e:
            return self._not_dead_lettered(m, group, str(e))
        if not r.ok:
            return self._not_dead_lettered(m, group, f"{r.status.name} {r.reason}")
        log.info("%s/%d#%d went to %s%s after %d deliveries", topic, m.queue_id,
                 m.queue_offset, DLQ_GROUP_TOPIC_PREFIX, group, self.config.retry_max_times + 1)
        return True

    def _not_dead_lettered(self, m: MessageView, group: str, why: str) -> bool:
        """A dead letter the store did not take (its writer down, or refusing): logged,
        and none tried for ``DEAD_LETTER_BACKOFF_S``. The send runs under the lock every
        receive and ack takes: without the pause each pop would wait out the send's
        timeout again while the writer is away."""
        self._dead_letters_after = time.monotonic() + DEAD_LETTER_BACKOFF_S
        log.warning("%s of %s not put in its dead-letter queue (%s); dead letters wait "
                    "%.0f s", m.msg_id, group, why, DEAD_LETTER_BACKOFF_S)
        return False

    def _pop_new(self, topic: str, group: str, g: GroupPop, tags: list[str] | None,
                 room: int, invisible_ms: int, now: int, dispatched: int,
                 min_offset: int) -> list[Popped]:
        queues = self.reader.queue_ids(topic)
        if room <= 0 or not queues:
            return []
        key = f"{topic}@{group}"
        start = self._turns.get(key, 0) % len(queues)
        self._turns[key] = start + 1
        out: list[Popped] = []
        for queue_id in queues[start:] + queues[:start]:
            if len(out) >= room:
                break
            offset = g.offsets.get(queue_id)
            if offset is None:
                offset = max(0, self.reader.get_min_offset_in_queue(
                    topic, queue_id, dispatched, min_commit_log_offset=min_offset))
            r = self.reader.get_message(topic, queue_id, offset, room - len(out), dispatched,
                                        tags, min_commit_log_offset=min_offset)
            if r.status is GetMessageStatus.FOUND:
                out.extend(self._hand_out(g, m, now, invisible_ms) for m in r.messages)
                g.move_offset(queue_id, r.next_begin_offset)
            elif r.status in _PASSED_OVER:
                g.move_offset(queue_id, r.next_begin_offset)
        return out

    def _hand_out(self, g: GroupPop, m: MessageView, now: int, invisible_ms: int) -> Popped:
        entry = g.hand_out((m.queue_id, m.queue_offset), now, invisible_ms)
        return m, self._handle(m.queue_id, m.queue_offset, m.commit_log_offset, entry,
                               invisible_ms), entry

    def _handle(self, queue_id: int, offset: int, phy: int, entry: InFlight,
                invisible_ms: int) -> ReceiptHandle:
        return ReceiptHandle(queue_id, offset, entry.pop_time_ms, invisible_ms, phy,
                             self.broker_name)

    # ------------------------------------------------------------------ ack, change
    def ack(self, topic: str, group: str, handle: ReceiptHandle) -> bool:
        """End the message ``handle`` names; False when it was acked already. Raises
        ``InvalidReceiptHandle`` and ``OSError`` (the ack is then not made)."""
        with self._cond:
            g = self.state.group(topic, group)
            if not g.ack(handle):
                return False
            self._commit()
            return True

    def change_invisible(self, topic: str, group: str, handle: ReceiptHandle,
                         invisible_ms: int) -> ReceiptHandle:
        """Hide the message ``handle`` names for ``invisible_ms`` from now; its new
        handle (the old one stops working). Raises ``InvalidReceiptHandle``, ``OSError``."""
        with self._cond:
            entry = self.state.group(topic, group).change_invisible(handle, now_ms(),
                                                                    invisible_ms)
            self._commit()
            return self._handle(handle.queue_id, handle.queue_offset,
                                handle.commit_log_offset, entry, invisible_ms)

    def forward_to_dead_letters(self, topic: str, group: str, handle: ReceiptHandle) -> bool:
        """Put the in-flight message ``handle`` names in the group's dead-letter queue and
        end it (a FIFO PushConsumer's ForwardMessageToDeadLetterQueue, after its own last
        attempt). False when the store did not take the copy (nothing changed). Raises
        ``InvalidReceiptHandle`` and ``OSError``."""
        with self._cond:
            g = self.state.group(topic, group)
            g.current(handle)
            r = self.reader.get_message(topic, handle.queue_id, handle.queue_offset, 1,
                                        self.table.get(Slot.DISPATCHED),
                                        min_commit_log_offset=self.table.get(Slot.MIN_OFFSET))
            if r.status is not GetMessageStatus.FOUND or not r.messages:
                g.drop((handle.queue_id, handle.queue_offset))     # gone from the files
            elif not self._dead_letter(topic, group, r.messages[0]):
                return False
            else:
                g.drop((handle.queue_id, handle.queue_offset))
            self._commit()
            return True

    def _commit(self) -> None:
        """Make the changes durable; when that fails, go back to what the files hold
        (the caller then answers an error, and nothing it changed was told)."""
        try:
            self.state.commit()
        except OSError:
            self.state.abandon()
            self.state = PopState(self.config.config_dir)
            raise


def dead_letter(topic: str, group: str, m: MessageView) -> Message:
    """The copy of ``m`` put in ``%DLQ%<group>`` (one queue, 0): its body, tags, keys and
    properties, with RocketMQ's ORIGIN_MESSAGE_ID and RETRY_TOPIC (the topic it came
    from)."""
    skip = {PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_WAIT_STORE_MSG_OK,
            PROPERTY_DELAY_TIME_LEVEL, *RESERVED_PROPERTIES}
    properties = {k: v for k, v in m.properties.items() if k not in skip}
    properties["ORIGIN_MESSAGE_ID"] = m.uniq_key or m.msg_id
    properties["RETRY_TOPIC"] = topic
    return Message(topic=DLQ_GROUP_TOPIC_PREFIX + group, body=m.body, tags=m.tags,
                   keys=m.keys or None, properties=properties, queue_id=0,
                   born_timestamp=m.born_timestamp)
