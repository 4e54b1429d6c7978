"""A consumer group's offsets, as an operator sees and moves them.

RocketMQ's ``mqadmin consumerProgress`` and ``resetOffsetByTime``, Kafka's
``kafka-consumer-groups --describe`` and ``--reset-offsets``: ``describe`` gives, for
each queue of a topic, the group's committed offset beside the queue's first and next
offsets and the lag; ``plan_reset`` works out where a reset would put each queue;
``reset`` commits it to ``config/consumerOffset.json`` (the file ``Consumer.commit``
merges into, under the same lock).

Targets (``parse_target``): ``earliest`` (the first message still stored), ``latest``
(past the last: only what arrives from now on), a time (the message stored nearest it,
RocketMQ's searchOffset; milliseconds since the epoch or ISO-8601, a time without a zone
being local), an offset (each queue's own logical offset, kept inside the queue's first
and next offsets), or a shift of the committed offset by N (``+N`` / ``-N``, kept inside
the same bounds; a queue the group never committed shifts from its first offset).

A reset only holds when no member of the group reads the topic: a live ``Consumer``
keeps its offsets in memory and its next commit writes them over the reset. So
``reset`` refuses a group with live members (``GroupActiveError``), and looks again
after writing: a member that joined meanwhile may have read the old offsets, which the
error then says.

``describe`` and ``reset`` need the store running (the position table bounds every
queue at DISPATCHED, as a consumer sees it), and raise ``TopicNotExistError`` for a
topic the store does not have (``client.topics``).

``delete_group`` forgets a group (RocketMQ's ``mqadmin deleteSubGroup`` with its
offsets): its ``topic@group`` offsets leave ``consumerOffset.json`` and its membership
directories go, so ``rocketstore status`` no longer lists it and a consumer that joins
under its name later starts afresh (at ``from_where``). It refuses a group with live
consumers, as ``reset`` does (their next commit would record the group again), and
needs no running store. A remote client committing through the reader's COMMIT is
nobody's member: its next commit records the group again.
"""

from __future__ import annotations

import datetime
import errno
import os
import re

from rocketstore.client import consumer
from rocketstore.client.consumer import check_group, check_names, read_offsets, store_config
from rocketstore.client.topics import GroupNotExistError, require_topic
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage.store_reader import StoreReader

_SHIFT = re.compile(r"[+-]\d+")


class GroupActiveError(Exception):
    """The group has live members reading the topic: a reset would not hold.
    ``written``: the offsets were written all the same (a member joined meanwhile)."""

    def __init__(self, message: str, written: bool = False):
        super().__init__(message)
        self.written = written


def parse_target(text: str) -> tuple[str, int]:
    """``("earliest"|"latest", 0)``, ``("time", ms)``, ``("offset", n)`` or
    ``("shift", n)`` from the command line's words. Raises ``ValueError``."""
    if text in ("earliest", "latest"):
        return text, 0
    if _SHIFT.fullmatch(text):
        return "shift", int(text)
    if text.isdigit():
        return "offset", int(text)
    if text.startswith("@") and text[1:].isdigit():
        return "time", int(text[1:])
    try:
        return "time", iso_time_ms(text)
    except ValueError:
        raise ValueError(f"{text!r} is not earliest, latest, an offset, +N/-N, @ms or an "
                         "ISO-8601 time") from None


def iso_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time, read as local time (the
    operator's clock, a browser's datetime-local field) when it names no zone.
    Raises ``ValueError``."""
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


def live_members(store_dir: str, group: str, topic: str) -> list[str]:
    """The group's consumers of ``topic`` alive now."""
    return consumer.live_members(consumer.members_dir(store_dir, group, topic))


def describe(store_dir: str, group: str, topic: str,
             target: tuple[str, int] | None = None,
             queues: list[int] | None = None) -> list[dict]:
    """Per queue of ``topic`` (or of ``queues``): ``queue``, ``committed`` (None when
    never), ``min_offset``, ``max_offset``, ``lag`` (None when never committed), and with
    ``target`` the ``new`` offset a reset would commit. Raises ``PositionTableError``
    when the store is not running, ``TopicNotExistError`` for a topic it does not have,
    ``ValueError`` for a queue the topic does not have."""
    check_names(group, topic)
    config = store_config(store_dir)
    committed = read_offsets(config.config_dir).get(f"{topic}@{group}")
    committed = committed if isinstance(committed, dict) else {}
    table = PositionTable.attach(store_dir)
    try:
        require_topic(config.consume_queue_dir, table, topic)
        dispatched = table.get(Slot.DISPATCHED)
        with StoreReader(config) as reader:
            known = reader.topics().get(topic, [])
            unknown = sorted(set(queues or ()) - set(known))
            if unknown:
                raise ValueError(f"topic {topic!r} has no queue {unknown[0]} "
                                 f"(its queues: {known or 'none'})")
            rows = []
            for q in sorted(set(queues)) if queues else known:
                low, high = reader.queue_bounds(topic, q, dispatched) or (0, 0)
                low = max(low, 0)
                done = committed.get(str(q))
                done = done if isinstance(done, int) else None
                row = {"queue": q, "committed": done, "min_offset": low, "max_offset": high,
                       "lag": None if done is None else max(0, high - done)}
                if target is not None:
                    row["new"] = _new_offset(reader, topic, q, target, row, dispatched)
                rows.append(row)
    finally:
        table.close()
    return rows


def _new_offset(reader: StoreReader, topic: str, queue_id: int, target: tuple[str, int],
                row: dict, dispatched: int) -> int:
    kind, value = target
    low, high = row["min_offset"], row["max_offset"]
    if kind == "earliest":
        return low
    if kind == "latest":
        return high
    if kind == "time":
        new = reader.get_offset_in_queue_by_time(topic, queue_id, value, dispatched)
    elif kind == "shift":
        new = (low if row["committed"] is None else row["committed"]) + value
    else:
        new = value
    return min(max(new, low), high)


def reset(store_dir: str, group: str, topic: str, rows: list[dict]) -> None:
    """Commit every row's ``new`` offset for the group. Raises ``GroupActiveError``
    when a member reads the topic (before: nothing written; after: written, but a
    member that joined meanwhile may write its own over it). The commits' lock is held
    from the first look to the second, so a member that came and went meanwhile has
    not committed either: its commit waits for the lock, and it leaves the group only
    after it committed."""
    config_dir = store_config(store_dir).config_dir
    with consumer.offsets_locked(config_dir):
        members = live_members(store_dir, group, topic)
        if members:
            raise GroupActiveError(f"group {group!r} has {len(members)} live consumer(s) "
                                   f"of {topic!r}; stop them first (their commits would "
                                   "undo the reset)")
        consumer.merge_offsets(config_dir, f"{topic}@{group}",
                               {str(r["queue"]): r["new"] for r in rows})
        members = live_members(store_dir, group, topic)
    if members:
        raise GroupActiveError(f"offsets written, but {len(members)} consumer(s) of "
                               f"{topic!r} joined group {group!r} meanwhile and may "
                               "commit the old ones over them: stop them and reset again",
                               written=True)


def delete_group(store_dir: str, group: str, topic: str | None = None) -> list[str]:
    """Forget consumer ``group`` of ``topic`` (None: of every topic): its offsets and
    its membership directories. Returns the topics it was forgotten for, sorted.

    Raises ``GroupNotExistError`` when the group has neither offsets nor a membership
    directory here (of ``topic``), ``GroupActiveError`` when a consumer of it is live:
    nothing is deleted then (``written`` False). The commits' lock is held throughout,
    so no commit of the group lands meanwhile; a consumer that joins meanwhile keeps its
    member file, and the error then says the offsets are gone (``written`` True) but it
    reads on (its commits record the group again)."""
    if topic is None:
        check_group(group)
    else:
        check_names(group, topic)
    config_dir = store_config(store_dir).config_dir
    with consumer.offsets_locked(config_dir):
        topics = _topics_of(store_dir, config_dir, group, topic)
        if not topics:
            raise GroupNotExistError(group, topic, groups_of(store_dir, topic))
        live = {t: n for t in topics if (n := len(live_members(store_dir, group, t)))}
        if live:
            raise GroupActiveError(f"group {group!r} has live consumers ({_counted(live)});"
                                   " stop them first (their commits would record it again)")
        consumer.remove_offsets(config_dir, [f"{t}@{group}" for t in topics])
        joined = [t for t in topics if not _remove_members_dir(store_dir, group, t)]
    if joined:
        raise GroupActiveError(f"offsets of group {group!r} deleted, but consumers of "
                               f"{', '.join(joined)} joined it meanwhile: their commits "
                               "record the group again (stop them and delete it again)",
                               written=True)
    return topics


def _topics_of(store_dir: str, config_dir: str, group: str, topic: str | None) -> list[str]:
    """The topics ``group`` has offsets or a membership directory of (only ``topic``,
    when given)."""
    keyed = {t for t, g in _keys(read_offsets(config_dir)) if g == group}
    joined = set(_list_dirs(os.path.join(store_dir, consumer.GROUPS_DIR, group)))
    found = keyed | joined
    return sorted(found & {topic} if topic is not None else found)


def groups_of(store_dir: str, topic: str | None = None) -> list[str]:
    """Every consumer group the store has (of ``topic``, when given), sorted: those with
    offsets in consumerOffset.json and those with a membership directory."""
    config_dir = store_config(store_dir).config_dir
    groups = {g for t, g in _keys(read_offsets(config_dir)) if topic in (None, t)}
    root = os.path.join(store_dir, consumer.GROUPS_DIR)
    groups |= {g for g in _list_dirs(root)
               if topic is None or os.path.isdir(os.path.join(root, g, topic))}
    return sorted(groups)


def _keys(table: dict) -> list[tuple[str, str]]:
    """``(topic, group)`` of each ``topic@group`` key."""
    return [(t, g) for t, _, g in (k.partition("@") for k in table) if g]


def _list_dirs(path: str) -> list[str]:
    try:
        return [n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _counted(live: dict[str, int]) -> str:
    return ", ".join(f"{n} of {t}" for t, n in sorted(live.items()))


def _remove_members_dir(store_dir: str, group: str, topic: str) -> bool:
    """Remove ``groups/{group}/{topic}`` (dead members' files first), and ``groups/{group}``
    when that empties it. False when a member file is there (a consumer joined after the
    look for live ones): it stays, and so does the directory."""
    directory = consumer.members_dir(store_dir, group, topic)
    consumer.live_members(directory)       # removes the files of dead members
    for path in (directory, os.path.dirname(directory)):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
            return path != directory        # the group's directory has other topics
    return True
