"""Consumer: reads a running store's mapped files directly, in one consumer group.

``Consumer(store_dir, group, topic)`` maps the consume queues and the CommitLog
read-only (``storage.store_reader.StoreReader``) and never sees past DISPATCHED (so,
under SYNC_FLUSH, never a message a crash could take back); ``poll`` long-polls on the
dispatcher's wake-ups for its topic instead of spinning (its arrival bell,
``shm.arrival_bell``, a futex the dispatcher's thread wakes the waiting one through;
the bus's ARRIVAL announcements where the store has no bells). Messages come as
``storage.message_view.MessageView``: every ``MessageExt`` field by name, the body,
properties and hosts decoded when first read, each over its own copy of the record.

Group membership and queue sharing. Each live consumer holds an ``flock`` on its own
member file ``{store}/groups/{group}/{topic}/{member}``; a member file nobody holds
belongs to a dead consumer and is removed. The directories are group-writable and
setgid (``file_modes.shared_dir_mode``), the files group-readable, so consumers run by
other members of the store owner's group share queues with the owner's. The live
members, sorted, share the topic's queues as RocketMQ's AllocateMessageQueueAveragely
does (queue ``q`` goes to member
``q mod n``), re-checked every ``rebalance_interval_ms``. While membership changes two
consumers may briefly read the same queue: delivery is at least once, as in RocketMQ.

Progress. ``commit()`` writes the group's offsets to ``config/consumerOffset.json`` in
RocketMQ's shape, ``{"offsetTable": {"topic@group": {"0": 42}}}``, merged under an
flock with what other consumers wrote. A queue without a committed offset starts at
``from_where``: ``"earliest"`` (the default) or ``"latest"``, and that start is
committed at once (unless another member committed one meanwhile): the group's place
in a queue is fixed by the first member to read it, so a member that takes the queue
over later never starts again at "latest" past what nobody read.

Queues that move. ``commit`` looks at the membership first and writes only the queues
this member still owns: a queue that went to another member may have moved on there
(Kafka fences such a commit). A queue that goes away is handed over: its position is
written unless the group's committed offset is already past it (RocketMQ persists a
dropped queue's offset), so its new owner reads less of it again.

How much a poll returns. ``poll(max_msgs)`` returns up to ``max_msgs`` messages, from as
many of its queues as it takes, and about ``max_poll_bytes`` of records at most (64 MiB
by default; one larger record still comes, alone; a read with a tag filter may pass it
by one queue's read): it copies from the mapped files in
this process, so a broker's per-pull limits (``max_transfer_count_on_message_in_memory``
= 32 messages and 256 KiB, the tighter ``..._in_disk`` ones), which bound a network
response, do not apply. The reader socket's PULL (``ReaderClient.pull``) keeps them, as
a broker does.

A topic that does not exist (no message of it dispatched yet: ``client.topics``) makes
the constructor raise ``TopicNotExistError`` naming the topics there are (RocketMQ's
clients get "topic route not exist"), before anything of the group is written. With
``wait_for_topic=True`` a consumer subscribes ahead of the topic's first message
instead: ``topic_missing`` holds the error it would have raised, ``poll`` returns
nothing and ``commit`` records nothing until the topic appears, and then it reads the
topic from its first message whatever ``from_where`` says (every message of a topic
that appeared after the consumer subscribed is new to it).

Names and life. A group is named as a topic is, ``[A-Za-z0-9_%|-]{1,255}`` (the reader's
COMMIT takes no other): both become directory names, so anything else raises
``ValueError`` before anything is opened; a ``store_dir`` where no store runs raises
``NoStoreError`` (a ``ClientError``) at once, saying whether the directory is missing,
holds no store, or holds one not running (``client.reach``). After ``close``
(idempotent) every call but ``close`` raises ``StoreClosedError``. One consumer may be used from several threads:
its calls take turns, a ``poll`` waiting for messages lets the others in meanwhile, and
a ``close`` from another thread ends a waiting ``poll`` (which returns nothing) within
200 ms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import threading
import time
import uuid

import zmq

from rocketstore.client.reach import running_table
from rocketstore.shm import bus
from rocketstore.shm.arrival_bell import ArrivalBells
from rocketstore.shm.positions import PositionTable, PositionTableError, Slot
from rocketstore.storage import StoreConfig, json_file
from rocketstore.storage.bulk_read import SHORT_READ_UNITS
from rocketstore.storage.config import recorded_geometry
from rocketstore.storage.errors import StoreClosedError
from rocketstore.storage.message_view import MessageView
from rocketstore.storage.read_path import (
    BULK_READ_MIN, GetMessageResult, bulk_result, offset_status)
from rocketstore.storage.status import GetMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import TOPIC_PATTERN, check_topic
from rocketstore.storage import file_modes
from rocketstore.client.topics import TopicNotExistError, has_topic, require_topic

OFFSET_FILE = "consumerOffset.json"
GROUPS_DIR = "groups"       # the membership of consumer groups (made by ``up`` too)
MAX_POLL_MESSAGES = 1 << 20        # a poll's count is the caller's max_msgs; this bounds it
DEFAULT_MAX_POLL_BYTES = 64 << 20   # records one poll copies, about (one larger still comes)
WAIT_SLICE_MS = 200     # a waiting poll looks at its queues at least this often regardless


class Consumer:
    def __init__(self, store_dir: str, group: str, topic: str, *,
                 config: StoreConfig | None = None, from_where: str = "earliest",
                 tags: list[str] | str | None = None, rebalance_interval_ms: int = 1000,
                 max_poll_bytes: int = DEFAULT_MAX_POLL_BYTES, wait_for_topic: bool = False):
        if from_where not in ("earliest", "latest"):
            raise ValueError("from_where is 'earliest' or 'latest'")
        if max_poll_bytes < 1:
            raise ValueError("max_poll_bytes is at least 1")
        check_names(group, topic)
        self.store_dir, self.group, self.topic = store_dir, group, topic
        self.max_poll_bytes = max_poll_bytes
        self.config = local_read_limits(config or store_config(store_dir), max_poll_bytes)
        file_modes.use_umask(self.config.data_umask)
        self.from_where = from_where
        self.tags = tags
        self.rebalance_interval_ms = rebalance_interval_ms
        self._closed = self._closing = False
        self._lock = threading.RLock()       # one call at a time over the views and offsets
        self._wait_lock = threading.Lock()   # one waiter at a time on the wake-ups
        self.reader = self._wakeups = self._member = None
        self.topic_missing: TopicNotExistError | None = None
        self.table = running_table(store_dir)
        try:
            self.topic_missing = _missing(self.config.consume_queue_dir, self.table, topic,
                                          wait_for_topic)
            self.reader = StoreReader(self.config)
            self._wakeups = _wakeups(store_dir, topic)
            self._member = _Membership(store_dir, group, topic)
        except BaseException:
            self._release()     # a context left open would hang the garbage collector
            raise
        self._topic_here = self.topic_missing is None   # never False again once True
        self._offsets: dict[int, int] = {}
        self._caught_up: dict[int, int] = {}   # queue -> the DISPATCHED it was read up to
        self._assigned: list[int] = []
        self._next_rebalance = 0.0
        self._turn = 0

    # ------------------------------------------------------------------ consuming
    def poll(self, max_msgs: int = 32, timeout_ms: int = 1000) -> list[MessageView]:
        """Up to ``max_msgs`` messages from this consumer's queues, waiting at most
        ``timeout_ms`` for the first one."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._lock:
                self._check_open()
                if self._closing:
                    return []
                self._rebalance_if_due()
                seen = self._wakeups.seen()     # before the look: no wake-up falls between
                found = self._pull_once(max_msgs)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if found or left_ms <= 0:
                return found
            with self._wait_lock:       # the other calls may run meanwhile
                if self._closing:
                    return []
                self._wakeups.wait(seen, min(left_ms, WAIT_SLICE_MS))

    def _pull_once(self, max_msgs: int) -> list[MessageView]:
        """One read of each assigned queue, taking turns at which goes first. A queue
        read to its end is not read again until DISPATCHED moves: nothing new can be in
        it (the pull right after a poll that returned messages costs nothing). Once
        DISPATCHED moves, for any topic, such a queue is looked at by its next unit
        alone (``StoreReader.nothing_new``), and read when that unit came: a trickle into
        one queue of eight costs one read, not eight."""
        dispatched = self.table.get(Slot.DISPATCHED)
        self.reader.drop_expired(self.table.get(Slot.MIN_OFFSET))   # space comes back
        if not self._topic_exists():
            return []
        self._place_new_queues(dispatched)
        out: list[MessageView] = []
        queues = self._assigned[self._turn:] + self._assigned[:self._turn]
        self._turn = (self._turn + 1) % max(1, len(self._assigned))
        moved: dict[int, int] = {}     # applied at the end: a failure or Ctrl-C on the
        caught_up: dict[int, int] = {}  # way moves no queue past messages never returned
        room = self.max_poll_bytes
        for q in queues:
            if len(out) >= max_msgs or room <= 0:
                break
            offset = self._offsets[q]
            last = self._caught_up.get(q)
            if last is not None and (last == dispatched or self.reader.nothing_new(
                    self.topic, q, offset, dispatched)):
                caught_up[q] = dispatched
                continue
            r, nbytes = self._read(q, offset, max_msgs - len(out), dispatched, room)
            if r.status is GetMessageStatus.FOUND:
                out.extend(r.messages)
                room -= nbytes
                offset = moved[q] = r.next_begin_offset
            elif r.status in (GetMessageStatus.OFFSET_TOO_SMALL,
                              GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                              GetMessageStatus.OFFSET_FOUND_NULL,
                              GetMessageStatus.NO_MATCHED_MESSAGE,
                              GetMessageStatus.MESSAGE_WAS_REMOVING):
                offset = moved[q] = r.next_begin_offset
            if offset >= r.max_offset:
                caught_up[q] = dispatched
        self._offsets.update(moved)
        self._caught_up.update(caught_up)
        return out

    def _read(self, queue_id: int, offset: int, max_msgs: int, dispatched: int,
              max_bytes: int) -> tuple[GetMessageResult, int]:
        """Up to ``max_msgs`` messages of a queue, ``max_bytes`` of records at most (at
        least one message when there is one), and the bytes of the records read. An
        offset with nothing to read is answered from the queue's bounds alone. Without a
        tag filter, a few messages (fewer than ``SHORT_READ_UNITS``: a consumer keeping
        up) are read in one step when they are the usual case
        (``StoreReader.read_few``); else, with at least ``BULK_READ_MIN`` messages to
        take, the units and their records are read in bulk (one copy per CommitLog
        span, ``StoreReader.read_queue_records``; joined in one ``bytes`` and checked
        with numpy from ``read_path.BULK_VIEWS_MIN`` on) and each record is checked
        against its unit. Anything unusual (a tag filter, a record that is not its
        unit's: a unit being rewritten) takes ``get_message``, which reads unit by unit
        and knows every such case."""
        min_phy = self.table.get(Slot.MIN_OFFSET)   # the cleaner's: no file system look
        cfg = self.config
        bounds = self.reader.queue_bounds(self.topic, queue_id, dispatched,
                                          min_commit_log_offset=min_phy)
        if bounds is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0), 0
        early = offset_status(offset, *bounds)
        if early is not None:
            return early, 0
        most = min(max_msgs, cfg.max_transfer_count_on_message_in_memory)
        take = min(bounds[1] - offset, most)
        if self.tags is None and take < SHORT_READ_UNITS:
            found = self.reader.read_few(self.topic, queue_id, offset, most, max_bytes,
                                         dispatched, min_phy)
            if found is not None:
                return found
        if self.tags is None and take >= BULK_READ_MIN:
            got = self.reader.read_queue_records(
                self.topic, queue_id, offset, most, max_bytes, dispatched,
                joined=True, min_commit_log_offset=min_phy)
            found = bulk_result(got, self.topic, queue_id)
            if found is not None:
                return found
        # unit by unit: the config's limits are this consumer's, max_poll_bytes per read
        r = self.reader.get_message(self.topic, queue_id, offset, max_msgs, dispatched,
                                    tags=self.tags, min_commit_log_offset=min_phy)
        return r, sum(m.store_size for m in r.messages)

    def _place_new_queues(self, dispatched: int) -> None:
        """A position for each assigned queue without one: the group's committed
        offset, else ``from_where``'s, committed at once (under the lock, unless another
        member committed one meanwhile) so that the group's place in the queue is fixed."""
        new = [q for q in self._assigned if q not in self._offsets]
        if not new:
            return
        committed = self._committed()
        starts = {q: self._start(q, dispatched) for q in new if str(q) not in committed}
        if starts:
            committed = self._merge_committed(lambda held: {
                str(q): at for q, at in starts.items() if str(q) not in held})
        for q in new:
            self._offsets[q] = int(committed[str(q)])

    def _start(self, queue_id: int, dispatched: int) -> int:
        """Where ``from_where`` puts a queue the group has no offset for (a topic that
        appeared after this consumer subscribed is read from its first message)."""
        if self.from_where == "latest" and self.topic_missing is None:
            return self.reader.get_max_offset_in_queue(self.topic, queue_id, dispatched)
        return max(0, self.reader.get_min_offset_in_queue(self.topic, queue_id, dispatched))

    # ------------------------------------------------------------------ positions
    def seek(self, queue_id: int, offset: int) -> None:
        """Continue ``queue_id`` from logical ``offset`` (committed only on ``commit``)."""
        with self._lock:
            self._check_open()
            self._offsets[queue_id] = offset
            self._caught_up.pop(queue_id, None)

    def rewind(self, messages: list[MessageView]) -> None:
        """Continue each queue of ``messages`` (polled, in poll order) from the first of
        them: messages taken but not handled are read again, and not committed."""
        first: dict[int, int] = {}
        for m in messages:
            first.setdefault(m.queue_id, m.queue_offset)
        for q, offset in first.items():
            self.seek(q, offset)

    def seek_to_time(self, timestamp_ms: int) -> None:
        """Every assigned queue continues from the message stored nearest that time."""
        with self._lock:
            self._check_open()
            self._rebalance_if_due()
            dispatched = self.table.get(Slot.DISPATCHED)
            for q in self._assigned:
                self.seek(q, self.reader.get_offset_in_queue_by_time(
                    self.topic, q, timestamp_ms, dispatched))

    def position(self, queue_id: int) -> int | None:
        with self._lock:
            self._check_open()
            return self._offsets.get(queue_id)

    def assignment(self) -> list[int]:
        with self._lock:
            self._check_open()
            self._rebalance_if_due()
            return list(self._assigned)

    def commit(self) -> None:
        """Persist the offsets of the queues this consumer owns now (merged with the
        rest of the group's); the membership is looked at first."""
        with self._lock:
            self._check_open()
            self._rebalance_if_due(now=True)
            mine = {str(q): self._offsets[q] for q in self._assigned if q in self._offsets}
            if mine and self._topic_exists():
                update_offsets(self.config.config_dir, self._key, mine)

    def _topic_exists(self) -> bool:
        """Whether the topic exists, looked at until it does (a topic never goes away):
        nothing of the group is recorded for a topic that does not."""
        if not self._topic_here:
            self._topic_here = has_topic(self.config.consume_queue_dir, self.topic)
        return self._topic_here

    @property
    def _key(self) -> str:
        return f"{self.topic}@{self.group}"

    def _committed(self) -> dict[str, int]:
        return read_offsets(self.config.config_dir).get(self._key, {})

    # ------------------------------------------------------------------ group
    def _rebalance_if_due(self, now: bool = False) -> None:
        """Share the queues again among the live members, every
        ``rebalance_interval_ms`` (or ``now``); the queues that go away are handed over."""
        clock = time.monotonic()
        if clock < self._next_rebalance and not now:
            return
        self._next_rebalance = clock + self.rebalance_interval_ms / 1000
        self._follow_restart()
        members = self._member.live_members()
        if self._member.name not in members:
            members = sorted(members + [self._member.name])
        me = members.index(self._member.name)
        queues = sorted(set(range(self.config.default_topic_queue_nums))
                        | set(self.reader.queue_ids(self.topic)))
        assigned = [q for i, q in enumerate(queues) if i % len(members) == me]
        if assigned != self._assigned:
            gone = set(self._assigned) - set(assigned)
            self._hand_over({q: self._offsets[q] for q in gone if q in self._offsets})
            for q in gone:
                self._offsets.pop(q, None)  # another member continues from the commit
                self._caught_up.pop(q, None)
            self._assigned = assigned

    def _hand_over(self, positions: dict[int, int]) -> None:
        """Commit the positions of queues another member now owns, each unless the
        group's committed offset is past it already (the new owner's commit)."""
        if positions and self._topic_exists():
            self._merge_committed(lambda held: {
                str(q): p for q, p in positions.items() if p > int(held.get(str(q), -1))})

    def _merge_committed(self, choose) -> dict[str, int]:
        """Under the commits' lock, merge what ``choose(committed)`` picks (queue ->
        offset, both as stored) into the group's committed offsets; returns them."""
        with offsets_locked(self.config.config_dir):
            committed = self._committed()
            chosen = choose(committed)
            if chosen:
                merge_offsets(self.config.config_dir, self._key, chosen)
            return {**committed, **chosen}

    def _follow_restart(self) -> None:
        """A restarted store has a new position table (and maybe files recovery cut and
        created again): map both afresh. Offsets stay: they are logical."""
        try:
            fresh = PositionTable.attach(self.store_dir)
        except PositionTableError:
            return  # not running now: keep the last view until it is
        if fresh.get(Slot.GENERATION) == self.table.get(Slot.GENERATION):
            fresh.close()
            return
        self.table.close()
        self.table = fresh
        self.reader.reopen()
        self._caught_up.clear()     # a DISPATCHED of the old table means nothing here
        self._wakeups.reopen()      # and its bells are no longer rung

    def close(self) -> None:
        """Commit, leave the group, release everything; a second close does nothing. A
        ``poll`` waiting in another thread returns first."""
        self._closing = True
        if self._wakeups is not None and not self._closed:
            self._wakeups.interrupt()        # a poll waiting in another thread returns now
        with self._wait_lock, self._lock:    # (or at the end of its slice, on the bus)
            if self._closed:
                return
            try:
                self.commit()
            finally:
                self._closed = True
                self._release()

    def _release(self) -> None:
        """Close what this consumer opened (all of it, or what a failed start made)."""
        if self._member is not None:
            self._member.leave()
        if self._wakeups is not None:
            self._wakeups.close()
        if self.reader is not None:
            self.reader.close()
        self.table.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"consumer {self.group!r} of {self.topic!r} is closed")

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def local_read_limits(config: StoreConfig, max_poll_bytes: int) -> StoreConfig:
    """``config`` with the read limits of a consumer in this process: no count limit but
    the caller's ``max_msgs``, and ``max_poll_bytes`` of records in memory or on disk
    (RocketMQ's transfer limits bound a broker's network response; here the messages are
    copied from the mapped files, and the memory a poll takes is the only cost)."""
    return dataclasses.replace(
        config, max_transfer_count_on_message_in_memory=MAX_POLL_MESSAGES,
        max_transfer_count_on_message_in_disk=MAX_POLL_MESSAGES,
        max_transfer_bytes_on_message_in_memory=max_poll_bytes,
        max_transfer_bytes_on_message_in_disk=max_poll_bytes)


def check_names(group: str, topic: str) -> None:
    """Raise ``ValueError`` for a group or topic that is not a name (both become
    directory names)."""
    check_group(group)
    bad_topic = check_topic(topic, internal=True)
    if bad_topic:
        raise ValueError(bad_topic)


def check_group(group: str) -> None:
    """Raise ``ValueError`` for a group that is not a name."""
    if not isinstance(group, str) or not TOPIC_PATTERN.fullmatch(group):
        raise ValueError(f"group {group!r} must match [A-Za-z0-9_%|-]{{1,255}}")


def _missing(consume_queue_dir: str, table: PositionTable, topic: str,
             wait_for_topic: bool) -> TopicNotExistError | None:
    """None when ``topic`` exists; the ``TopicNotExistError`` that says it does not,
    raised unless ``wait_for_topic``."""
    try:
        require_topic(consume_queue_dir, table, topic)
    except TopicNotExistError as e:
        if not wait_for_topic:
            raise
        return e
    return None


def store_config(store_dir: str) -> StoreConfig:
    """The settings of the store at ``store_dir``, with the file sizes it recorded."""
    recorded = recorded_geometry(store_dir) or {}
    return StoreConfig(store_path_root_dir=store_dir, **recorded)


def update_offsets(config_dir: str, key: str, offsets: dict[str, int]) -> None:
    """Merge ``offsets`` into ``consumerOffset.json`` under an exclusive flock."""
    with offsets_locked(config_dir):
        merge_offsets(config_dir, key, offsets)


def _wakeups(store_dir: str, topic: str) -> "_BellWakeups | _BusWakeups":
    """What wakes a waiting ``poll``: the topic's arrival bell when the store has
    bells, else the bus."""
    bells = ArrivalBells.open(store_dir)
    if bells is not None:
        return _BellWakeups(bells, topic, store_dir)
    return _BusWakeups(store_dir, topic)


class _BellWakeups:
    """The topic's arrival bell: ``seen()`` before looking at the queues, then
    ``wait(seen, ms)`` returns at once if the bell rang since."""

    def __init__(self, bells: ArrivalBells, topic: str, store_dir: str):
        self._bells, self._topic, self._store_dir = bells, topic, store_dir

    def reopen(self) -> None:
        """The restarted store's bells. The old mapping is closed when its last user
        lets go (a wait in another thread may still hold it: it times out); a store
        started without bells leaves the old ones, and ``poll`` then looks every
        ``WAIT_SLICE_MS``."""
        bells = ArrivalBells.open(self._store_dir)
        if bells is not None:
            self._bells = bells

    def seen(self) -> tuple[ArrivalBells, int]:
        """The bells and the word read (a seen word is only good for the bells it was
        read from: a restart may swap them before the wait)."""
        bells = self._bells
        return bells, bells.bell(self._topic)

    def wait(self, seen: tuple[ArrivalBells, int], timeout_ms: int) -> bool:
        """Whether the bell rang (or anything woke it) since ``seen``, or False after
        ``timeout_ms``; True at once when the bells were swapped since."""
        bells, word = seen
        if bells is not self._bells:
            return True
        return bells.wait(self._topic, word, timeout_ms)

    def interrupt(self) -> None:
        """Wake a ``wait`` in another thread (``close``); nothing once the bells are
        closed (a ``close`` racing another)."""
        try:
            self._bells.wake(self._topic)
        except OSError:
            pass        # unmapped under the call: closed meanwhile, nobody waits on it

    def close(self) -> None:
        self._bells.close()


class _BusWakeups:
    """The dispatcher's ARRIVAL announcements of the topic, on the bus: the
    subscription keeps what comes while the queues are looked at."""

    def __init__(self, store_dir: str, topic: str):
        self._context = zmq.Context()
        try:
            self._subscriber = bus.Subscriber(self._context, store_dir, ["dispatcher"],
                                              [bus.arrival_topic(topic)])  # its topic's only
        except BaseException:
            self._context.term()
            raise

    def seen(self) -> int:
        return 0

    def reopen(self) -> None:
        """Nothing: the subscription reconnects to the restarted dispatcher itself."""

    def interrupt(self) -> None:
        """Nothing: a wait on the bus ends at the end of its slice."""

    def wait(self, seen: int, timeout_ms: int) -> bool:
        """Whether an announcement came, or False after ``timeout_ms``."""
        return bool(self._subscriber.wait(timeout_ms))

    def close(self) -> None:
        self._subscriber.close()
        self._context.term()


@contextlib.contextmanager
def offsets_locked(config_dir: str):
    """Hold the exclusive flock every commit to ``consumerOffset.json`` takes."""
    file_modes.make_dirs(config_dir)
    path = os.path.join(config_dir, OFFSET_FILE)
    with os.fdopen(file_modes.create(path + ".lock", os.O_WRONLY | os.O_APPEND), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def merge_offsets(config_dir: str, key: str, offsets: dict[str, int]) -> None:
    """Merge ``offsets`` into ``consumerOffset.json`` (hold ``offsets_locked``)."""
    path = os.path.join(config_dir, OFFSET_FILE)
    doc = json_file.load(path) or {}
    table = doc.setdefault("offsetTable", {})
    table.setdefault(key, {}).update(offsets)
    json_file.persist(path, doc)


def remove_offsets(config_dir: str, keys: list[str]) -> None:
    """Remove the ``topic@group`` ``keys`` from ``consumerOffset.json`` (hold
    ``offsets_locked``)."""
    path = os.path.join(config_dir, OFFSET_FILE)
    doc = json_file.load(path) or {}
    table = doc.get("offsetTable", {})
    if any(key in table for key in keys):
        for key in keys:
            table.pop(key, None)
        json_file.persist(path, doc)


def read_offsets(config_dir: str) -> dict[str, dict[str, int]]:
    doc = json_file.load(os.path.join(config_dir, OFFSET_FILE)) or {}
    return doc.get("offsetTable", {})


class _Membership:
    """A live member file per consumer; a file nobody holds is a dead member."""

    def __init__(self, store_dir: str, group: str, topic: str):
        self.dir = members_dir(store_dir, group, topic)
        file_modes.make_shared_dirs(self.dir)
        self.name = f"{os.getpid():08d}-{uuid.uuid4().hex[:8]}"
        self.path = os.path.join(self.dir, self.name)
        # Locked before it appears under its name, so no member can take it for dead.
        tmp = os.path.join(self.dir, f".{self.name}.new")
        self._fd = file_modes.create(tmp, os.O_RDWR)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, self.path)

    def live_members(self) -> list[str]:
        return live_members(self.dir, self.name)

    def leave(self) -> None:
        if self._fd >= 0:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = -1


def members_dir(store_dir: str, group: str, topic: str) -> str:
    """Where the member files of ``group``'s consumers of ``topic`` are."""
    return os.path.join(store_dir, GROUPS_DIR, group, topic)


def live_members(directory: str, me: str | None = None) -> list[str]:
    """The live members in ``directory`` (``me`` counted without a look); a dead
    member's file is removed."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [name for name in names
            if not name.startswith(".")          # a member being born
            and (name == me or _held(os.path.join(directory, name)))]


def _held(path: str) -> bool:
    """Whether a live consumer holds ``path``; a dead member's file is removed (an
    flock needs only a read-only descriptor; a file this user may not open is taken
    for live)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return True
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return False


def dumps_offsets(config_dir: str) -> str:
    return json.dumps(read_offsets(config_dir), sort_keys=True)
