"""Delayed messages: RocketMQ's delay levels and the put-time rewrite.

``message_delay_level`` is a space-separated list of durations (units s, m, h, d); level
``i`` (1-based) waits the ``i``-th. The default has 18 levels, 1s ... 2h.

A message put with ``delay_level > 0`` (and transaction type NOT or COMMIT) is stored in
topic ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real destination kept in the
``REAL_TOPIC`` and ``REAL_QID`` properties and its level in ``DELAY``; a level above the
maximum is clamped to it. The ConsumeQueue unit of such a message carries its delivery
time (store time + delay) as tagsCode, so the scheduler finds due messages without
reading the CommitLog. When due, the scheduler restores topic and queue, drops the
delay property and puts the message again (``restore_real_destination``).

The copy also drops an idempotent producer's identity (``__PID``/``__SEQ``): that
identity belongs to the delayed record, which is the one the producer's sequence stored
(``storage.producer_state``). Kept, it would be refused as a client-set identity, or,
were the scheduler allowed to set it, it would rewind the producer's last sequence when
a restarted writer rebuilds its table from the CommitLog. The delivered copy carries
the scheduler's identity instead (one producer per delay level,
``storage.schedule_message``), so a re-put after a crash is answered as a duplicate:
each delivery is stored once.
"""

from __future__ import annotations

from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE,
    PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, Message, MessageExt)
from rocketstore.storage.record import SCHEDULE_TOPIC

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """Delay per level in ms, index 0 unused (0): ``[0, 1000, 5000, ...]``.

    Raises ``StoreConfigError`` for a token that is not a number with a unit.
    """
    levels = [0]
    for token in text.split():
        unit, number = token[-1], token[:-1]
        if unit not in _UNIT_MS or not number.isdigit():
            raise StoreConfigError(f"message_delay_level token {token!r} is not N s|m|h|d")
        levels.append(int(number) * _UNIT_MS[unit])
    if len(levels) < 2:
        raise StoreConfigError("message_delay_level needs at least one level")
    return levels


def level_waiting_at_least(wait_ms: int, levels: list[int]) -> int | None:
    """The level of the shortest delay of ``levels`` (``parse_delay_levels``) that is
    ``wait_ms`` or longer, so a message due at a given time goes out at it or after it,
    never before; None when no level waits that long."""
    fitting = [(delay, level) for level, delay in enumerate(levels) if level and delay >= wait_ms]
    return min(fitting)[1] if fitting else None


def delay_level_to_queue_id(level: int) -> int:
    return level - 1


def queue_id_to_delay_level(queue_id: int) -> int:
    return queue_id + 1


def rewrite_for_delay(topic: str, queue_id: int, properties: dict[str, str],
                      level: int, max_level: int) -> tuple[str, int, dict[str, str]]:
    """Topic, queue and properties a delayed message is stored under."""
    level = min(level, max_level)
    props = dict(properties)
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    return SCHEDULE_TOPIC, delay_level_to_queue_id(level), props


def restore_real_destination(msg: MessageExt) -> Message:
    """The message a due delayed message becomes again (``messageTimeup``)."""
    props = dict(msg.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC)
    queue_id = int(props.pop(PROPERTY_REAL_QUEUE_ID))
    props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    props.pop(PROPERTY_PRODUCER_ID, None)
    props.pop(PROPERTY_PRODUCER_SEQUENCE, None)
    tags = props.pop("TAGS", None)
    keys = props.pop("KEYS", None)
    return Message(topic=topic, body=msg.body, tags=tags, keys=keys, properties=props,
                   queue_id=queue_id, flag=msg.flag, sys_flag=msg.sys_flag,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                   reconsume_times=msg.reconsume_times,
                   prepared_transaction_offset=msg.prepared_transaction_offset)
