"""What each page of the dashboard shows, read from a running store the way
``rocketstore status``, ``query`` and the group commands read it: the position table
(read-only), the processes' published statistics, ``config/consumerOffset.json`` and the
mapped files (``StoreReader``). Nothing here writes to the store but ``reset_group`` and
``send_test_message``, which do what ``rocketstore offsets --reset-to`` and
``rocketstore send`` do.

Every function raises ``PositionTableError`` when the store is not running,
``TopicNotExistError`` / ``GroupNotExistError`` for a name the store does not have, and
``BadRequest`` for input that cannot be a query (a malformed msgId, a backwards range).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re

from rocketstore.client import Producer, group_offsets
from rocketstore.client.consumer import check_names, store_config
from rocketstore.client.topics import GroupNotExistError, require_topic
from rocketstore.procs.status import size_text, store_status
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage import Message, StoreConfig
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import check_topic

MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")    # store host + CommitLog offset
BODY_SHOWN_BYTES = 4096          # a message page shows this much of a body; the rest: download
RANGE_MAX_MESSAGES = 64          # a topic + time range query lists at most this many
KEY_MAX_MESSAGES = 32


class BadRequest(ValueError):
    """Input no query can answer; the message says what was wrong."""


class MessageNotFound(LookupError):
    """No message where a msgId points (expired, or never stored here)."""


@contextlib.contextmanager
def reading(store_dir: str):
    """The running store's position table (read-only) and a ``StoreReader`` of its
    files, closed on the way out."""
    table = PositionTable.attach(store_dir)
    try:
        with StoreReader(store_config(store_dir)) as reader:
            reader.drop_expired(table.get(Slot.MIN_OFFSET))
            yield table, reader
    finally:
        table.close()


# ------------------------------------------------------------------------------ overview
def overview(store_dir: str, config: StoreConfig) -> dict:
    """``store_status`` with what the overview draws beside it: the distances between
    the positions, and the disk lines of RocketMQ (``disk_max_used_space_ratio``,
    ``disk_space_clean_forcibly_ratio``, ``disk_space_warning_level_ratio``, percent)."""
    st = store_status(store_dir)
    pos = st["positions"]
    st["distances"] = {"written - flushed": pos["written"] - pos["flushed"],
                       "written - dispatched": pos["written"] - pos["dispatched"],
                       "written - min offset": pos["written"] - pos["min_offset"]}
    if "committed" in pos:
        st["distances"]["written - committed"] = pos["written"] - pos["committed"]
    st["disk"]["lines"] = disk_lines(config)
    disk = st["disk"]
    disk["used_text"] = f"{size_text(disk['used'])} of {size_text(disk['total'])}"
    return st


def disk_lines(config: StoreConfig) -> list[tuple[str, float]]:
    """RocketMQ's three disk thresholds, percent, low to high."""
    return [("expire early", float(config.disk_max_used_space_ratio)),
            ("clean forcibly", config.disk_space_clean_forcibly_ratio * 100),
            ("refuse writes", config.disk_space_warning_level_ratio * 100)]


# ------------------------------------------------------------------------------ topics
def topics(store_dir: str) -> list[dict]:
    """Every topic with its queues: ``min_offset``, ``max_offset``, ``messages`` (max -
    min) and ``last_store_ms`` (the store time of the queue's last message, None when
    the queue is empty); with the topic's totals."""
    out = []
    with reading(store_dir) as (table, reader):
        dispatched = table.get(Slot.DISPATCHED)
        for topic, queue_ids in sorted(reader.topics().items()):
            queues = [_queue_row(reader, topic, q, dispatched) for q in queue_ids]
            last = [q["last_store_ms"] for q in queues if q["last_store_ms"] is not None]
            out.append({"topic": topic, "queues": queues,
                        "messages": sum(q["messages"] for q in queues),
                        "max_offset": sum(q["max_offset"] for q in queues),
                        "last_store_ms": max(last) if last else None})
    return out


def topic(store_dir: str, name: str) -> dict:
    """One topic's row of ``topics`` and the groups that committed offsets of it.
    Raises ``TopicNotExistError`` for a topic the store does not have."""
    with reading(store_dir) as (table, reader):
        require_topic(reader.config.consume_queue_dir, table, name, wait_ms=0)
        dispatched = table.get(Slot.DISPATCHED)
        queues = [_queue_row(reader, name, q, dispatched) for q in reader.queue_ids(name)]
    last = [q["last_store_ms"] for q in queues if q["last_store_ms"] is not None]
    return {"topic": name, "queues": queues, "messages": sum(q["messages"] for q in queues),
            "max_offset": sum(q["max_offset"] for q in queues),
            "last_store_ms": max(last) if last else None,
            "groups": group_offsets.groups_of(store_dir, name)}


def _queue_row(reader: StoreReader, topic: str, queue_id: int, dispatched: int) -> dict:
    low, high = reader.queue_bounds(topic, queue_id, dispatched) or (0, 0)
    low = max(low, 0)
    last = None
    if high > low:
        got = reader.get_message(topic, queue_id, high - 1, 1, dispatched)
        if got.messages:
            last = got.messages[0].store_timestamp
    return {"queue": queue_id, "min_offset": low, "max_offset": high,
            "messages": high - low, "last_store_ms": last}


# ------------------------------------------------------------------------------ groups
def groups(store_dir: str) -> list[dict]:
    """Every ``topic@group`` with offsets (``procs.status.consumer_groups``): group,
    topic, total lag, per queue committed / max / lag."""
    st = store_status(store_dir)
    return [{"group": g["group"], "topic": g["topic"], "lag": g["lag"],
             "queues": [{"queue": int(q), **v} for q, v in g["queues"].items()]}
            for g in st["consumer_groups"].values()]


def group(store_dir: str, name: str, topic_name: str, target: str | None = None) -> dict:
    """One group of one topic (``group_offsets.describe``): per queue committed, min,
    max, lag (and ``new`` with ``target``, what a reset would commit), and the live
    members. Raises ``GroupNotExistError`` for a group with neither offsets nor members,
    ``BadRequest`` for a target that is none."""
    try:
        check_names(name, topic_name)
        parsed = None if target is None else group_offsets.parse_target(target)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    rows = group_offsets.describe(store_dir, name, topic_name, parsed)
    members = group_offsets.live_members(store_dir, name, topic_name)
    if name not in group_offsets.groups_of(store_dir, topic_name):
        raise GroupNotExistError(name, topic_name,
                                 group_offsets.groups_of(store_dir, topic_name))
    return {"group": name, "topic": topic_name, "queues": rows, "members": members,
            "lag": sum(r["lag"] for r in rows if r["lag"] is not None), "target": target}


def reset_group(store_dir: str, name: str, topic_name: str, target: str) -> dict:
    """Commit the offsets ``target`` names for every queue (``group_offsets.reset``:
    refused with ``GroupActiveError`` while a member reads the topic)."""
    described = group(store_dir, name, topic_name, target)
    group_offsets.reset(store_dir, name, topic_name, described["queues"])
    return described


# ------------------------------------------------------------------------------ messages
def find_by_key(store_dir: str, topic_name: str, key: str) -> list[dict]:
    """Messages of ``topic_name`` with ``key`` (the index, as ``query --key``)."""
    if not key:
        raise BadRequest("a key query needs a key")
    with reading(store_dir) as (table, reader):
        require_topic(reader.config.consume_queue_dir, table, topic_name, wait_ms=0)
        found = reader.query_message(topic_name, key, KEY_MAX_MESSAGES, 0, 2 ** 62,
                                     table.get(Slot.DISPATCHED))
        return [summary(m) for m in found]


def find_by_msg_id(store_dir: str, msg_id: str) -> dict:
    """The message a msgId names, in full (``message_page``); raises ``BadRequest`` for
    text that is no msgId and ``MessageNotFound`` when no message is there."""
    if not MSG_ID.fullmatch(msg_id):
        raise BadRequest(f"{msg_id!r} is not a message id (32 or 56 hex digits: the store "
                         "host, then the CommitLog offset)")
    with reading(store_dir) as (table, reader):
        m = reader.look_message_by_id(msg_id, table.get(Slot.WRITTEN))
        if m is None:
            raise MessageNotFound(f"no message {msg_id} in this store (expired, or never "
                              "stored here)")
        return message_page(m, reader.config)


def find_by_time(store_dir: str, topic_name: str, begin_ms: int, end_ms: int) -> list[dict]:
    """Messages of ``topic_name`` stored in ``[begin_ms, end_ms]``, oldest first, at most
    ``RANGE_MAX_MESSAGES`` (each queue read from its first message stored since
    ``begin_ms``, as ``first_offset_stored_since`` finds it)."""
    if end_ms < begin_ms:
        raise BadRequest(f"the time range ends ({_iso(end_ms)}) before it begins "
                         f"({_iso(begin_ms)})")
    found = []
    with reading(store_dir) as (table, reader):
        require_topic(reader.config.consume_queue_dir, table, topic_name, wait_ms=0)
        dispatched = table.get(Slot.DISPATCHED)
        for q in reader.queue_ids(topic_name):
            offset = reader.first_offset_stored_since(topic_name, q, begin_ms, dispatched)
            got = reader.get_message(topic_name, q, max(offset, 0), RANGE_MAX_MESSAGES,
                                     dispatched)
            found += [summary(m) for m in got.messages if m.store_timestamp <= end_ms]
    found.sort(key=lambda m: (m["store_timestamp"], m["commit_log_offset"]))
    return found[:RANGE_MAX_MESSAGES]


def parse_time(text: str, what: str) -> int:
    """Milliseconds since the epoch from ``@MS``, digits or an ISO-8601 time (local time
    when it names no zone, as the browser's datetime-local field sends)."""
    text = text.strip()
    if text.lstrip("@").isdigit():
        return int(text.lstrip("@"))
    try:
        return group_offsets.iso_time_ms(text)
    except ValueError:
        raise BadRequest(f"{what} {text!r} is not a time (ISO-8601, or @ms since the "
                         "epoch)") from None


def summary(m) -> dict:
    """What a list of messages shows of each (a ``MessageExt`` or ``MessageView``)."""
    return {"msg_id": m.msg_id, "topic": m.topic, "queue_id": m.queue_id,
            "queue_offset": m.queue_offset, "commit_log_offset": m.commit_log_offset,
            "tags": m.tags, "keys": m.keys, "store_timestamp": m.store_timestamp,
            "body_size": len(m.body), "body_preview": body_text(m.body, 80)[0]}


def message_page(m, config: StoreConfig) -> dict:
    """Everything of one message: ``MessageExt.to_dict`` less the body, where it is
    stored (the CommitLog file and the position in it, queue and offset), and the body
    as text where it decodes as UTF-8 (else hex), cut at ``BODY_SHOWN_BYTES``."""
    d = m.to_dict()
    d.pop("body", None)
    d.pop("body_hex", None)
    file_size = config.mapped_file_size_commit_log
    start = m.commit_log_offset - m.commit_log_offset % file_size
    d["commit_log_file"] = os.path.abspath(os.path.join(config.commit_log_dir,
                                                        f"{start:020d}"))
    d["position_in_file"] = m.commit_log_offset - start
    d["body_size"] = len(m.body)
    d["body_text"], d["body_is_text"] = body_text(m.body, BODY_SHOWN_BYTES)
    d["body_cut"] = len(m.body) > BODY_SHOWN_BYTES
    d["born_iso"], d["stored_iso"] = _iso(m.born_timestamp), _iso(m.store_timestamp)
    return d


def message_body(store_dir: str, msg_id: str) -> bytes:
    """A message's whole body (its download)."""
    if not MSG_ID.fullmatch(msg_id):
        raise BadRequest(f"{msg_id!r} is not a message id")
    with reading(store_dir) as (table, reader):
        m = reader.look_message_by_id(msg_id, table.get(Slot.WRITTEN))
    if m is None:
        raise MessageNotFound(f"no message {msg_id} in this store")
    return m.body


def body_text(body: bytes, limit: int) -> tuple[str, bool]:
    """The first ``limit`` bytes of ``body`` as text when they decode as UTF-8 (a
    character cut at the limit dropped), else as hex; and whether it was text."""
    head = body[:limit]
    try:
        return head.decode("utf-8"), True
    except UnicodeDecodeError as e:
        if len(body) > limit and e.start >= limit - 3:
            return head[:e.start].decode("utf-8"), True
        return head.hex(" "), False


def send_test_message(store_dir: str, topic_name: str, body: str, tags: str = "",
                      keys: str = "") -> dict:
    """One message sent through a ``Producer``, as ``rocketstore send`` sends it."""
    bad = check_topic(topic_name)
    if bad:
        raise BadRequest(bad)
    message = Message(topic=topic_name, body=body.encode(), tags=tags or None,
                      keys=[k for k in keys.split(",") if k] or None)
    PositionTable.attach(store_dir).close()       # not running: at once, not at a timeout
    with Producer(store_dir) as producer:
        r = producer.send_batch([message])[0]
    return {"status": r.status.name, "ok": r.ok, "msg_id": r.msg_id, "queue_id": r.queue_id,
            "queue_offset": r.queue_offset, "reason": r.reason}


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).astimezone().isoformat(
        timespec="milliseconds")
