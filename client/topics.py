"""Which topics and consumer groups a store has, and the errors that name one it has not.

A topic exists once a message of it has been dispatched: it is then a directory under
``consumequeue/`` holding at least one queue directory (RocketMQ keeps its topics in
``topics.json``; this store learns them from the consume queues, which the dispatcher
makes from the CommitLog, so the CommitLog stays the one truth). A send creates its
topic, as RocketMQ's ``autoCreateTopicEnable`` does; a delayed message's topic appears
when the message is delivered to it.

Dispatch trails the writer. A look that finds no topic therefore waits (at most
``DISPATCH_WAIT_MS``) for DISPATCHED to reach the WRITTEN it read first, and looks
again: a topic a send created before the look began is never missed for dispatch lag.

A consumer group exists while ``config/consumerOffset.json`` holds an offset of it
(``topic@group``, RocketMQ's key) or a consumer of it is live (its member file under
``groups/{group}/{topic}/``).

    NotInStoreError (LookupError)        a name the store does not have; exit 4 in the CLI
    ├── TopicNotExistError(topic, topics)       RocketMQ's TOPIC_NOT_EXIST
    └── GroupNotExistError(group, topic, groups) RocketMQ's SUBSCRIPTION_GROUP_NOT_EXIST
"""

from __future__ import annotations

import difflib
import os
import time

from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage.logic_queues import queue_dirs
from rocketstore.storage.validation import check_topic

DISPATCH_WAIT_MS = 5000     # how long a look for a missing topic waits for dispatch
LISTED_MAX = 10             # names an error lists before "and N more"


class NotInStoreError(LookupError):
    """A topic or consumer group the store does not have."""


class TopicNotExistError(NotInStoreError):
    """``topic`` has no queue in this store; ``topics``: the ones it has (user topics,
    sorted)."""

    def __init__(self, topic: str, topics: list[str]):
        self.topic, self.topics = topic, topics
        listing = _listing("topics", topic, topics) if topics else "it has no topics yet"
        super().__init__(f"no topic {topic} in this store ({listing})")


class GroupNotExistError(NotInStoreError):
    """``group`` (of ``topic``, when given) has no offsets and no live consumer here;
    ``groups``: the groups the store has (of ``topic``, when given), sorted."""

    def __init__(self, group: str, topic: str | None, groups: list[str]):
        self.group, self.topic, self.groups = group, topic, groups
        what = f"consumer group {group}" + (f" of topic {topic}" if topic else "")
        kind = f"groups of {topic}" if topic else "groups"
        listing = _listing(kind, group, groups) if groups else f"it has no {kind}"
        super().__init__(f"no {what} in this store ({listing})")


def _listing(kind: str, name: str, names: list[str]) -> str:
    """``topics: A, B; did you mean A?`` (``names`` not empty)."""
    shown = ", ".join(names[:LISTED_MAX])
    if len(names) > LISTED_MAX:
        shown += f" and {len(names) - LISTED_MAX} more"
    guess = did_you_mean(name, names)
    return f"{kind}: {shown}" + (f"; did you mean {guess}?" if guess else "")


def did_you_mean(name: str, names: list[str]) -> str | None:
    """The one of ``names`` that ``name`` most likely misspells: the same but for case,
    else the closest by difflib's ratio (0.7 at least: a letter or two off), else None."""
    folded = [n for n in names if n.lower() == name.lower()]
    if folded:
        return folded[0]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.7)
    return close[0] if close else None


def user_topics(consume_queue_dir: str) -> list[str]:
    """The topics with a queue under ``consume_queue_dir``, sorted, the store's own
    (SCHEDULE_TOPIC_XXXX, RMQ_SYS_*) left out."""
    return sorted({topic for topic, _, _ in queue_dirs(consume_queue_dir)
                   if check_topic(topic) is None})


def has_topic(consume_queue_dir: str, topic: str) -> bool:
    """Whether ``topic`` has a queue directory under ``consume_queue_dir`` (one listing
    of its own directory, whatever the number of topics)."""
    if check_topic(topic, internal=True) is not None:
        return False
    try:
        names = os.listdir(os.path.join(consume_queue_dir, topic))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(name.isdigit() for name in names)


def require_topic(consume_queue_dir: str, table: PositionTable, topic: str, *,
                  wait_ms: int = DISPATCH_WAIT_MS) -> None:
    """Return when ``topic`` exists; otherwise, once dispatch has reached the WRITTEN of
    the first look (at most ``wait_ms``), look again and raise ``TopicNotExistError``."""
    if has_topic(consume_queue_dir, topic):
        return
    wait_for_dispatch(table, table.get(Slot.WRITTEN), wait_ms)
    if not has_topic(consume_queue_dir, topic):
        raise TopicNotExistError(topic, user_topics(consume_queue_dir))


def wait_for_dispatch(table: PositionTable, written: int, wait_ms: int) -> bool:
    """Whether DISPATCHED reached ``written`` within ``wait_ms`` (looked at every 5 ms:
    the dispatcher announces arrivals per topic only, and this wait is for any)."""
    deadline = time.monotonic() + wait_ms / 1000
    while table.get(Slot.DISPATCHED) < written:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True
