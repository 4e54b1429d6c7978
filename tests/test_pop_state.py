"""storage.pop_state: a group's pop state, its receipt handles and its file."""

from __future__ import annotations

import json
import os

import pytest

from rocketstore.storage.pop_state import (
    POP_JOURNAL_FILE, POP_STATE_FILE, InvalidReceiptHandle, PopState, ReceiptHandle)


def handle(unit, entry, invisible_ms=1000):
    return ReceiptHandle(unit[0], unit[1], entry.pop_time_ms, invisible_ms, 4096, "b")


def test_receipt_handle_has_rocketmqs_layout_and_reads_back():
    h = ReceiptHandle(3, 17, 1_700_000_000_123, 30_000, 123456, "broker-a")
    text = h.encode()
    assert text == "17 1700000000123 30000 0 0 broker-a 3 17 123456"
    assert ReceiptHandle.decode(text) == h


@pytest.mark.parametrize("text", ["", "1 2 3", "a b c d e f g h i", "1 2 3 4 5 b 6 7 8 9"])
def test_a_handle_not_of_that_layout_is_refused(text):
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(text)


def test_a_message_handed_out_again_raises_its_attempt_and_ends_older_handles(tmp_path):
    pop = PopState(str(tmp_path)).group("T", "G")
    first = pop.hand_out((0, 5), now_ms=1000, invisible_ms=500)
    assert (first.attempt, first.visible_at_ms) == (1, 1500)
    assert pop.due(1499) == [] and pop.due(1500) == [(0, 5)]
    old = handle((0, 5), first)
    again = pop.hand_out((0, 5), now_ms=1000, invisible_ms=500)   # same ms: still later
    assert again.attempt == 2 and again.pop_time_ms == 1001
    with pytest.raises(InvalidReceiptHandle, match="handed out again"):
        pop.ack(old)
    assert pop.ack(handle((0, 5), again)) is True
    assert pop.inflight == {}


def test_ack_is_idempotent_below_the_pop_offset_and_refused_past_it(tmp_path):
    pop = PopState(str(tmp_path)).group("T", "G")
    pop.move_offset(0, 6)
    entry = pop.hand_out((0, 5), 1000, 500)
    assert pop.ack(handle((0, 5), entry)) is True
    assert pop.ack(handle((0, 5), entry)) is False          # acked already: nothing to do
    with pytest.raises(InvalidReceiptHandle, match="never received"):
        pop.ack(ReceiptHandle(0, 6, 1000, 500, 0, "b"))


def test_change_invisible_gives_a_new_handle_and_ends_the_old_one(tmp_path):
    pop = PopState(str(tmp_path)).group("T", "G")
    entry = pop.hand_out((1, 0), 1000, 500)
    old = handle((1, 0), entry)
    changed = pop.change_invisible(old, now_ms=1200, invisible_ms=10_000)
    assert (changed.attempt, changed.pop_time_ms, changed.visible_at_ms) == (1, 1200, 11_200)
    with pytest.raises(InvalidReceiptHandle):
        pop.change_invisible(old, 1300, 1000)
    assert pop.ack(handle((1, 0), changed)) is True
    with pytest.raises(InvalidReceiptHandle, match="not in flight"):
        pop.change_invisible(handle((1, 0), changed), 1300, 1000)


def _filled(directory: str) -> PopState:
    state = PopState(directory)
    pop = state.group("Orders", "G1")
    pop.move_offset(0, 4)
    pop.move_offset(3, 1)
    pop.hand_out((0, 2), 1000, 500)
    pop.hand_out((3, 0), 1000, 700)
    pop.hand_out((0, 3), 1000, 700)
    state.group("Orders", "G2").move_offset(1, 9)
    assert state.commit() is True
    pop.ack(ReceiptHandle(0, 3, 1000, 700, 0, "b"))
    assert state.commit() is True
    assert state.commit() is False               # nothing changed since
    return state


EXPECTED_G1 = {"offsets": {"0": 4, "3": 1},
               "inflight": {"0:2": [1, 1500, 1000], "3:0": [1, 1700, 1000]}}


def test_a_process_that_dies_leaves_its_commits_in_the_journal(tmp_path):
    state = _filled(str(tmp_path))               # never closed: as if SIGKILLed
    assert not os.path.exists(os.path.join(tmp_path, POP_STATE_FILE))
    again = PopState(str(tmp_path))
    assert again.group("Orders", "G1").to_doc() == EXPECTED_G1
    assert again.group("Orders", "G2").offsets == {1: 9}
    assert state.group("Orders", "G1").to_doc() == EXPECTED_G1


def test_close_folds_the_journal_into_the_snapshot(tmp_path):
    _filled(str(tmp_path)).close()
    assert os.path.getsize(os.path.join(tmp_path, POP_JOURNAL_FILE)) == 0
    with open(os.path.join(tmp_path, POP_STATE_FILE)) as f:
        assert json.load(f)["popTable"]["Orders@G1"] == EXPECTED_G1
    assert PopState(str(tmp_path)).group("Orders", "G1").to_doc() == EXPECTED_G1


def test_a_journal_replayed_over_the_snapshot_that_holds_it_changes_nothing(tmp_path):
    """A crash between writing the snapshot and emptying the journal."""
    state = _filled(str(tmp_path))
    with open(os.path.join(tmp_path, POP_JOURNAL_FILE), "rb") as f:
        journal = f.read()
    state.compact()
    with open(os.path.join(tmp_path, POP_JOURNAL_FILE), "wb") as f:
        f.write(journal)
    assert PopState(str(tmp_path)).group("Orders", "G1").to_doc() == EXPECTED_G1


@pytest.mark.parametrize("tail", [b'{"k":"Orders@G1","o":{"0":9', b'{"k":"Orders@G1"}', b"\xff"])
def test_a_torn_last_record_is_cut_away(tmp_path, tail):
    """A commit whose write was torn was never answered: loading cuts it away, and the
    next commits follow the last whole record."""
    _filled(str(tmp_path))
    path = os.path.join(tmp_path, POP_JOURNAL_FILE)
    whole = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(tail)                           # no newline: never fdatasynced whole
    again = PopState(str(tmp_path))
    assert again.group("Orders", "G1").to_doc() == EXPECTED_G1
    assert os.path.getsize(path) == whole
    again.group("Orders", "G1").move_offset(0, 5)
    again.commit()
    assert PopState(str(tmp_path)).group("Orders", "G1").offsets == {0: 5, 3: 1}


def test_an_abandoned_commit_is_cut_from_the_journal(tmp_path):
    state = _filled(str(tmp_path))
    path = os.path.join(tmp_path, POP_JOURNAL_FILE)
    whole = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b'{"k":"Orders@G1","o":{"0":99},"s":{},"d":[]}\n')   # its fdatasync failed
    state.abandon()
    assert os.path.getsize(path) == whole
    assert PopState(str(tmp_path)).group("Orders", "G1").offsets == {0: 4, 3: 1}


def test_a_torn_snapshot_falls_back_to_the_copy_before_it(tmp_path):
    state = PopState(str(tmp_path))
    state.group("T", "G").move_offset(0, 1)
    state.commit()
    state.compact()
    state.group("T", "G").move_offset(0, 2)
    state.commit()
    state.compact()                                  # the first is now the .bak
    with open(os.path.join(tmp_path, POP_STATE_FILE), "w") as f:
        f.write('{"popTable": {"T@G": {"off')
    assert PopState(str(tmp_path)).group("T", "G").offsets == {0: 1}
