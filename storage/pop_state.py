"""PopState: a consumer group's pop consumption of one topic (RocketMQ 5's
SimpleConsumer), kept in ``config/popState.json``.

Pop consumption hands a message to one consumer of the group and hides it from the
others for an *invisible duration*; an ack ends it, and a message not acked in time is
handed out again with its delivery attempt raised (RocketMQ's PopMessageProcessor,
AckMessageProcessor, ChangeInvisibleTimeProcessor and PopReviveService). RocketMQ keeps
that state as checkpoint and ack records in a revive topic; here it is one small
document beside ``consumerOffset.json`` and ``delayOffset.json``:

    {"popTable": {"<topic>@<group>": {
        "offsets":  {"<queueId>": <next queue offset never popped>},
        "inflight": {"<queueId>:<queueOffset>": [attempt, visibleAtMs, popTimeMs]}}}}

Invariants:

* every message of a queue below ``offsets[q]`` was popped once; it is done (acked, or
  passed over by the group's tag filter) unless it has an ``inflight`` entry;
* an ``inflight`` entry is a message handed out and not acked: invisible until
  ``visibleAtMs``, then handed out again (``attempt`` + 1) by the next pop;
* a receipt handle names the entry and its ``popTimeMs``; a pop or a change of
  invisible duration gives the entry a new, larger ``popTimeMs``, so every older handle
  of it stops working (INVALID_RECEIPT_HANDLE), as RocketMQ's do;
* ack is idempotent: the handle of an entry that is no longer in flight, below the
  queue's offset, acks nothing and succeeds.

Crash story: the document is replaced atomically (``json_file.persist``: temporary
file, fsync, rename) before a pop's messages are handed out and before an ack or a
change is answered. A crash before the write forgets the pop (the messages are popped
again, attempt unchanged) or the ack (the client saw no answer and acks again); a crash
after it keeps everything the client was told. So an acked message never comes back and
an unacked one always does, whatever instant the process dies at.

The receipt handle has RocketMQ's layout (``ExtraInfoUtil``), space separated:
``ckStartOffset popTime invisibleTime reviveQid topicType brokerName queueId
queueOffset commitLogOffset``, with reviveQid 0 and topicType 0 (a normal topic).
"""

from __future__ import annotations

import dataclasses
import os

from rocketstore.storage import json_file

POP_STATE_FILE = "popState.json"


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
        del self.inflight[unit]
        return True

    def change_invisible(self, handle: ReceiptHandle, now_ms: int,
                         invisible_ms: int) -> InFlight:
        """Make the entry ``handle`` names invisible for ``invisible_ms`` from now, under a
        new pop time (the old handle stops working). Raises ``InvalidReceiptHandle``."""
        entry = self.inflight.get((handle.queue_id, handle.queue_offset))
        if entry is None:
            raise InvalidReceiptHandle(f"queue {handle.queue_id} offset "
                                       f"{handle.queue_offset} is not in flight (acked, or "
                                       "never received)")
        self._check_current(entry, handle)
        entry.pop_time_ms = max(now_ms, entry.pop_time_ms + 1)
        entry.visible_at_ms = entry.pop_time_ms + invisible_ms
        return entry

    @staticmethod
    def _check_current(entry: InFlight, handle: ReceiptHandle) -> None:
        if entry.pop_time_ms != handle.pop_time_ms:
            raise InvalidReceiptHandle(
                f"queue {handle.queue_id} offset {handle.queue_offset} was handed out again "
                "since this receipt handle (its invisible duration ended or was changed)")

    def to_doc(self) -> dict:
        return {"offsets": {str(q): o for q, o in sorted(self.offsets.items())},
                "inflight": {f"{q}:{o}": [f.attempt, f.visible_at_ms, f.pop_time_ms]
                             for (q, o), f in sorted(self.inflight.items())}}

    @classmethod
    def from_doc(cls, doc: dict) -> "GroupPop":
        offsets = {int(q): int(o) for q, o in doc.get("offsets", {}).items()}
        inflight = {}
        for unit, (attempt, visible_at, pop_time) in doc.get("inflight", {}).items():
            q, _, o = unit.partition(":")
            inflight[(int(q), int(o))] = InFlight(int(attempt), int(visible_at), int(pop_time))
        return cls(offsets, inflight)


class PopState:
    """Every group's pop state of a store, read from and written to its config
    directory. Not thread-safe: its user holds one lock over reads, changes and
    ``persist``."""

    def __init__(self, config_dir: str):
        self.path = os.path.join(config_dir, POP_STATE_FILE)
        doc = json_file.load(self.path) or {}
        self.groups = {key: GroupPop.from_doc(g) for key, g in doc.get("popTable", {}).items()}

    def group(self, topic: str, group: str) -> GroupPop:
        """The state of ``group`` on ``topic`` (empty the first time)."""
        return self.groups.setdefault(f"{topic}@{group}", GroupPop({}, {}))

    def persist(self) -> None:
        """Replace the document atomically (fsynced). Raises ``OSError``."""
        json_file.persist(self.path, {"popTable": {
            key: g.to_doc() for key, g in sorted(self.groups.items())}}, compact=True)
