"""The put path shared by the embedded store and the writer (``storage.put_path``): the
store-wide refusal rules, the queue selector, and a store that refuses puts while its
consume queues cannot be written and takes them again once dispatch resumes."""

from __future__ import annotations

import itertools

import pytest

from conftest import msg, refuse_space
from rocketstore.storage.put_path import QueueSelector, StoreCondition, refusal, refusal_reason
from rocketstore.storage.status import PutMessageStatus

CAUSES = {
    "not_running": ("STOPPING", "the store is STOPPING"),
    "slave": (True, "SLAVE"),
    "flush_error": ("EIO", "FLUSH_ERROR"),
    "logics_error": ("ENOSPC", "WRITE_LOGICS_QUEUE_ERROR"),
    "disk_full": (True, "DISK_FULL"),
}


@pytest.mark.parametrize("present", [c for n in range(len(CAUSES) + 1)
                                     for c in itertools.combinations(CAUSES, n)])
def test_the_first_cause_in_the_table_names_the_refusal(present):
    condition = StoreCondition(**{name: CAUSES[name][0] for name in present})
    reason = refusal_reason(condition)
    if not present:
        assert reason is None and refusal(condition) is None
        return
    first = min(present, key=list(CAUSES).index)    # the docstring table's order
    assert CAUSES[first][1] in reason
    assert refusal(condition).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_round_robin_per_topic_in_bulk_and_one_by_one_agree():
    one, bulk = QueueSelector(4), QueueSelector(4)
    seen = [one.next_queue("A") for _ in range(6)] + [one.next_queue("B")]
    assert seen == [0, 1, 2, 3, 0, 1, 0]
    assert bulk.choose(["A"] * 6, [-1] * 6) + bulk.choose(["B"], [-1]) == seen
    assert bulk.choose(["A", "B", "A"], [-1, 3, -1]) == [2, 3, 3]


def test_a_store_whose_consume_queues_cannot_grow_refuses_puts_until_dispatch_resumes(
        store, monkeypatch):
    """Injected fault: ENOSPC when the new topic's consume queue file is created."""
    assert store.put(msg(0)).ok
    store.dispatch()
    with monkeypatch.context() as m:
        refuse_space(m)
        assert store.put(msg(1, topic="NewTopic")).ok      # the CommitLog has room
        store.dispatch()                                   # its consume queue cannot
        refused = store.put(msg(2))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "WRITE_LOGICS_QUEUE_ERROR" in refused.reason
    store.dispatch()                                       # space again: dispatch resumes
    again = store.put(msg(3, topic="NewTopic"))
    assert again.ok and again.queue_offset == 1
    store.dispatch()
    got = store.get_message("g", "NewTopic", 0, 0, 8)
    assert [m.queue_offset for m in got.messages] == [0, 1]
    assert store.check() == []
