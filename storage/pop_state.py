"""PopState: a consumer group's pop consumption of one topic (RocketMQ 5's
SimpleConsumer), kept in ``config/popState.json`` and ``config/popState.journal``.

Pop consumption hands a message to one consumer of the group and hides it from the
others for an *invisible duration*; an ack ends it, and a message not acked in time is
handed out again with its delivery attempt raised (RocketMQ's PopMessageProcessor,
AckMessageProcessor, ChangeInvisibleTimeProcessor and PopReviveService). RocketMQ keeps
that state as checkpoint and ack records appended to a revive topic; here it is a
snapshot beside ``consumerOffset.json`` and a journal of the changes since:

    popState.json      {"popTable": {"<topic>@<group>": {
                          "offsets":  {"<queueId>": <next queue offset never popped>},
                          "inflight": {"<queueId>:<queueOffset>":
                                       [attempt, visibleAtMs, popTimeMs]}}}}
    popState.journal   one JSON object a line, each a commit's changes of one group:
                         {"k": "<topic>@<group>", "o": {"<queueId>": <offset>},
                          "s": {"<queueId>:<queueOffset>": [attempt, visibleAtMs,
                                popTimeMs]},
                          "d": ["<queueId>:<queueOffset>", ...]}
                       (offsets set, in-flight entries set, in-flight entries dropped)

Invariants:

* every message of a queue below ``offsets[q]`` was popped once; it is done (acked, or
  passed over by the group's tag filter) unless it has an ``inflight`` entry;
* an ``inflight`` entry is a message handed out and not acked: invisible until
  ``visibleAtMs``, then handed out again (``attempt`` + 1) by the next pop;
* a receipt handle names the entry and its ``popTimeMs``; a pop or a change of
  invisible duration gives the entry a new, larger ``popTimeMs``, so every older handle
  of it stops working (INVALID_RECEIPT_HANDLE), as RocketMQ's do;
* ack is idempotent: the handle of an entry that is no longer in flight, below the
  queue's offset, acks nothing and succeeds;
* a journal record sets values, never adds to them, so replaying records over a
  snapshot that already holds them leaves it as it is.

Crash story: ``commit`` appends the changes since the last commit to the journal in
one write and fdatasyncs it before a pop's messages are handed out and before an ack or
a change is answered. A crash before the fdatasync returns loses at most the commit in
progress: a pop never handed out (its messages are popped again, attempt unchanged) or
an ack never answered (the client acks again). Loading reads the snapshot (or its
``.bak``), replays the journal's whole lines in order and cuts a torn last line away.
Once the journal passes ``COMPACT_BYTES`` (and at ``close``) the state is written as a
new snapshot (``json_file.persist``: temporary file, fsync, rename) and the journal is
emptied; a crash between the two replays records the snapshot holds already. So an
acked message never comes back and an unacked one always does, whatever instant the
process dies at.

The receipt handle has RocketMQ's layout (``ExtraInfoUtil``), space separated:
``ckStartOffset popTime invisibleTime reviveQid topicType brokerName queueId
queueOffset commitLogOffset``, with reviveQid 0 and topicType 0 (a normal topic).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from rocketstore.storage import file_modes, json_file
from rocketstore.storage.dir_sync import fsync_creation

log = logging.getLogger(__name__)

POP_STATE_FILE = "popState.json"
POP_JOURNAL_FILE = "popState.journal"
COMPACT_BYTES = 1 << 20     # a journal this long is folded into a new snapshot


class InvalidReceiptHandle(ValueError):
    """A receipt handle that is not one this store gave, or no longer works."""


@dataclasses.dataclass(frozen=True)
class ReceiptHandle:
    """What a receipt handle names: the queue unit and the pop it was handed out by."""

    queue_id: int
    queue_offset: int
    pop_time_ms: int
    invisible_ms: int
    commit_log_offset: int
    broker_name: str

    def encode(self) -> str:
        return " ".join(str(v) for v in (
            self.queue_offset, self.pop_time_ms, self.invisible_ms, 0, 0, self.broker_name,
            self.queue_id, self.queue_offset, self.commit_log_offset))

    @classmethod
    def decode(cls, text: str) -> "ReceiptHandle":
        """Raises ``InvalidReceiptHandle`` for text that is not a handle's layout."""
        parts = text.split(" ")
        if len(parts) != 9:
            raise InvalidReceiptHandle(f"receipt handle {text[:80]!r} has {len(parts)} "
                                       "fields, not 9")
        try:
            _, pop_time, invisible, _, _, _, queue_id, offset, phy = (
                int(p) if i != 5 else 0 for i, p in enumerate(parts))
        except ValueError:
            raise InvalidReceiptHandle(f"receipt handle {text[:80]!r} is not numbers "
                                       "where numbers go") from None
        return cls(queue_id, offset, pop_time, invisible, phy, parts[5])


@dataclasses.dataclass
class InFlight:
    """One message handed out and not acked."""

    attempt: int
    visible_at_ms: int
    pop_time_ms: int


class GroupPop:
    """The pop state of one group on one topic (the document's ``popTable`` entry)."""

    def __init__(self, offsets: dict[int, int], inflight: dict[tuple[int, int], InFlight]):
        self.offsets = offsets
        self.inflight = inflight
        self.changed_queues: set[int] = set()               # since the last commit
        self.changed_units: set[tuple[int, int]] = set()

    def move_offset(self, queue_id: int, offset: int) -> None:
        """Every message of the queue below ``offset`` has been popped."""
        if self.offsets.get(queue_id) != offset:
            self.offsets[queue_id] = offset
            self.changed_queues.add(queue_id)

    def drop(self, unit: tuple[int, int]) -> None:
        """``unit`` is done without an ack (gone from the files, or a dead letter)."""
        del self.inflight[unit]
        self.changed_units.add(unit)

    def due(self, now_ms: int) -> list[tuple[int, int]]:
        """The in-flight units whose invisible duration is over, oldest first."""
        due = [(f.visible_at_ms, unit) for unit, f in self.inflight.items()
               if f.visible_at_ms <= now_ms]
        return [unit for _, unit in sorted(due)]

    def next_visible_ms(self) -> int | None:
        """When the first in-flight unit becomes visible again (None: nothing in flight)."""
        return min((f.visible_at_ms for f in self.inflight.values()), default=None)

    def hand_out(self, unit: tuple[int, int], now_ms: int, invisible_ms: int) -> InFlight:
        """Hand ``unit`` out (again): a new pop time, later than any earlier one of it,
        and the attempt raised when it was in flight already."""
        before = self.inflight.get(unit)
        pop_time = now_ms if before is None else max(now_ms, before.pop_time_ms + 1)
        entry = InFlight(1 if before is None else before.attempt + 1,
                         pop_time + invisible_ms, pop_time)
        self.inflight[unit] = entry
        self.changed_units.add(unit)
        return entry

    def ack(self, handle: ReceiptHandle) -> bool:
        """End the entry ``handle`` names. True when it was in flight under this
        handle; False when it was done already. Raises ``InvalidReceiptHandle`` for a
        handle of an entry handed out again since, or of a unit never popped."""
        unit = (handle.queue_id, handle.queue_offset)
        entry = self.inflight.get(unit)
        if entry is None:
            if handle.queue_offset < self.offsets.get(handle.queue_id, 0):
                return False
            raise InvalidReceiptHandle(f"queue {handle.queue_id} offset "
                                       f"{handle.queue_offset} was never received")
        self._check_current(entry, handle)
        self.drop(unit)
        return True

    def current(self, handle: ReceiptHandle) -> InFlight:
        """The in-flight entry ``handle`` names. Raises ``InvalidReceiptHandle`` when it
        is not in flight or was handed out again since."""
        entry = self.inflight.get((handle.queue_id, handle.queue_offset))
        if entry is None:
            raise InvalidReceiptHandle(f"queue {handle.queue_id} offset "
                                       f"{handle.queue_offset} is not in flight (acked, or "
                                       "never received)")
        self._check_current(entry, handle)
        return entry

    def change_invisible(self, handle: ReceiptHandle, now_ms: int,
                         invisible_ms: int) -> InFlight:
        """Make the entry ``handle`` names invisible for ``invisible_ms`` from now, under a
        new pop time (the old handle stops working). Raises ``InvalidReceiptHandle``."""
        entry = self.current(handle)
        entry.pop_time_ms = max(now_ms, entry.pop_time_ms + 1)
        entry.visible_at_ms = entry.pop_time_ms + invisible_ms
        self.changed_units.add((handle.queue_id, handle.queue_offset))
        return entry

    def renew(self, unit: tuple[int, int], visible_at_ms: int) -> None:
        """Keep ``unit`` invisible until ``visible_at_ms`` under the same pop time (its
        handle stays valid: the proxy renews a PushConsumer's messages itself)."""
        self.inflight[unit].visible_at_ms = visible_at_ms
        self.changed_units.add(unit)

    @staticmethod
    def _check_current(entry: InFlight, handle: ReceiptHandle) -> None:
        if entry.pop_time_ms != handle.pop_time_ms:
            raise InvalidReceiptHandle(
                f"queue {handle.queue_id} offset {handle.queue_offset} was handed out again "
                "since this receipt handle (its invisible duration ended or was changed)")

    def changes(self, key: str) -> dict | None:
        """The journal record of the changes since the last commit (None: none), and
        they are forgotten."""
        if not self.changed_queues and not self.changed_units:
            return None
        record = {"k": key, "o": {str(q): self.offsets[q] for q in sorted(self.changed_queues)},
                  "s": {}, "d": []}
        for unit in sorted(self.changed_units):
            f = self.inflight.get(unit)
            if f is None:
                record["d"].append(f"{unit[0]}:{unit[1]}")
            else:
                record["s"][f"{unit[0]}:{unit[1]}"] = [f.attempt, f.visible_at_ms,
                                                      f.pop_time_ms]
        self.changed_queues.clear()
        self.changed_units.clear()
        return record

    def replay(self, record: dict) -> None:
        """Apply a journal record (``changes``)."""
        for q, o in record.get("o", {}).items():
            self.offsets[int(q)] = int(o)
        for unit, (attempt, visible_at, pop_time) in record.get("s", {}).items():
            self.inflight[_unit(unit)] = InFlight(int(attempt), int(visible_at), int(pop_time))
        for unit in record.get("d", []):
            self.inflight.pop(_unit(unit), None)

    def to_doc(self) -> dict:
        return {"offsets": {str(q): o for q, o in sorted(self.offsets.items())},
                "inflight": {f"{q}:{o}": [f.attempt, f.visible_at_ms, f.pop_time_ms]
                             for (q, o), f in sorted(self.inflight.items())}}

    @classmethod
    def from_doc(cls, doc: dict) -> "GroupPop":
        offsets = {int(q): int(o) for q, o in doc.get("offsets", {}).items()}
        inflight = {_unit(unit): InFlight(int(attempt), int(visible_at), int(pop_time))
                    for unit, (attempt, visible_at, pop_time) in doc.get("inflight", {}).items()}
        return cls(offsets, inflight)


def _unit(text: str) -> tuple[int, int]:
    q, _, o = text.partition(":")
    return int(q), int(o)


class PopState:
    """Every group's pop state of a store, read from and written to its config
    directory. Not thread-safe: its user holds one lock over reads, changes and
    ``commit``. Raises ``OSError`` when the files cannot be read or written."""

    def __init__(self, config_dir: str):
        self.path = os.path.join(config_dir, POP_STATE_FILE)
        self.journal_path = os.path.join(config_dir, POP_JOURNAL_FILE)
        doc = json_file.load(self.path) or {}
        self.groups = {key: GroupPop.from_doc(g) for key, g in doc.get("popTable", {}).items()}
        made = file_modes.make_dirs(config_dir)
        self._journal = file_modes.create(self.journal_path, os.O_RDWR)
        fsync_creation(self.journal_path, made)     # its entry outlives a crash
        self._journal_bytes = self._replay()

    def _replay(self) -> int:
        """Apply the journal's whole lines; cut a torn last one away. Its length."""
        data = os.pread(self._journal, os.fstat(self._journal).st_size, 0)
        good = 0
        for line in data.splitlines(keepends=True):
            try:
                record = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                record = None
            if not isinstance(record, dict):
                log.warning("%s: a torn record at byte %d cut away (its commit was never "
                            "answered)", self.journal_path, good)
                break
            self.group_by_key(record.get("k", "")).replay(record)
            good += len(line)
        if good < len(data):
            os.ftruncate(self._journal, good)
            os.fsync(self._journal)
        return good

    def group_by_key(self, key: str) -> GroupPop:
        return self.groups.setdefault(key, GroupPop({}, {}))

    def group(self, topic: str, group: str) -> GroupPop:
        """The state of ``group`` on ``topic`` (empty the first time)."""
        return self.group_by_key(f"{topic}@{group}")

    def commit(self) -> bool:
        """Make every change since the last commit durable (one journal write and
        fdatasync); False when there was none. Folds the journal into a new snapshot
        once it passes ``COMPACT_BYTES``."""
        records = [r for key, g in self.groups.items() if (r := g.changes(key)) is not None]
        if not records:
            return False
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        os.pwrite(self._journal, data, self._journal_bytes)
        os.fdatasync(self._journal)
        self._journal_bytes += len(data)
        if self._journal_bytes >= COMPACT_BYTES:
            self.compact()
        return True

    def compact(self) -> None:
        """Write the whole state as the snapshot, then empty the journal."""
        json_file.persist(self.path, {"popTable": {
            key: g.to_doc() for key, g in sorted(self.groups.items())}}, compact=True)
        os.ftruncate(self._journal, 0)
        os.fsync(self._journal)
        self._journal_bytes = 0

    def abandon(self) -> None:
        """After a failed ``commit``: cut away what it may have appended (best effort),
        and close the journal; the caller loads the state again from the files."""
        try:
            os.ftruncate(self._journal, self._journal_bytes)
        except OSError as e:
            log.error("%s: cannot cut a failed commit away: %s", self.journal_path, e)
        os.close(self._journal)

    def close(self) -> None:
        """Fold the journal into the snapshot (when it holds anything) and close it."""
        try:
            if self._journal_bytes:
                self.compact()
        finally:
            os.close(self._journal)
