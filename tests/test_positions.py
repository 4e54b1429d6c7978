"""The position table's rules (shm/positions.py): its documented slot table is its enums,
each slot is written by its one process, monotonic slots never go back, and only the
supervisor's start may reset them. Real posix-ipc segments, real store directories."""

from __future__ import annotations

import logging
import os
import re

import posix_ipc
import pytest

from rocketstore.shm import positions
from conftest import msg, small_config
from store_processes import wait_for
from rocketstore.procs.recovery import recover_and_publish, unlink_shared
from rocketstore.shm.positions import (
    HEARTBEAT_MS, PID, PROCESS_BASE, PROCESS_NAMES, PROCESS_SLOTS, RESTARTS, PositionTable,
    ProcessField, ResetRefusedError, Slot, SlotRegressionError, SlotRelationError,
    SlotWriterError, StoreState)
from rocketstore.storage import MessageStore
from rocketstore.storage.recovery_plan import TableState

# a row of the docstring's table: index, name, writer, unit, monotonic, meaning
ROW = re.compile(r"^    (\+?\d+)\s+([A-Z_]+)\s+(.+?)\s{2,}(\S+)\s+(yes|-)\s{2,}\S")


def documented_rows() -> list[tuple[str, str, str, bool]]:
    rows = []
    for line in positions.__doc__.splitlines():
        m = ROW.match(line)
        if m:
            index, name, writer, _unit, monotonic = m.groups()
            rows.append((index, name, writer, monotonic == "yes"))
    return rows


def test_the_documented_slot_table_is_the_enums():
    rows = documented_rows()
    enum_rows = ([(str(int(s)), s.name, s.writer, s.monotonic) for s in Slot]
                 + [(f"+{int(f)}", f.name, f.writer, f.monotonic) for f in ProcessField])
    assert rows == enum_rows


def test_the_parser_sees_a_drifted_row():
    """The check above can fail: a docstring row changed in any column is noticed."""
    doc = positions.__doc__
    for old, new in [("9      WRITTEN         writer", "9      WRITTEN         flusher"),
                     ("11     FLUSHED         flusher      byte   yes",
                      "11     FLUSHED         flusher      byte   -  "),
                     ("13     DISPATCHED", "12     DISPATCHED")]:
        assert old in doc
        positions.__doc__ = doc.replace(old, new)
        try:
            with pytest.raises(AssertionError):
                test_the_documented_slot_table_is_the_enums()
        finally:
            positions.__doc__ = doc


@pytest.fixture
def store_dir(tmp_path, caplog):
    """A recovered store of a few messages with its position table, as the supervisor
    leaves it before starting any process."""
    config = small_config(tmp_path / "store")
    with MessageStore(config) as s:
        assert all(r.ok for r in s.put_batch([msg(i) for i in range(5)]))
    assert positions.segment_state(config.store_path_root_dir) is TableState.ABSENT
    with caplog.at_level(logging.INFO, logger="rocketstore.procs.recovery"):
        recovered = recover_and_publish(config)
    assert "start row S1 (none); position table made anew (found absent)" in caplog.text
    yield config.store_path_root_dir, recovered
    recovered.table.close()
    unlink_shared(config.store_path_root_dir)
    recovered.lock.release()


def test_recovery_fills_the_table_from_the_files(store_dir):
    root, recovered = store_dir
    t = recovered.table
    with MessageStore(small_config(root), take_lock=False) as s:
        end = s.commit_log.get_max_offset()
    assert end > 0
    assert t.read_written()[0] == t.get(Slot.FLUSHED) == t.get(Slot.DISPATCHED) == end
    assert t.get(Slot.STATE) == StoreState.STARTING and t.get(Slot.SUPERVISOR_PID) == os.getpid()
    assert t.get(Slot.WRITTEN_SEQ) % 2 == 0 and t.get(Slot.GENERATION) > 0


def test_a_regression_is_refused_logged_and_stores_nothing(store_dir, caplog):
    root, recovered = store_dir
    flusher = PositionTable.attach(root, process="flusher")
    writer = PositionTable.attach(root, process="writer")
    cleaner = PositionTable.attach(root, process="cleaner")
    try:
        end = flusher.get(Slot.FLUSHED)
        with caplog.at_level(logging.ERROR, logger="rocketstore.shm.positions"):
            with pytest.raises(SlotRegressionError) as e:
                flusher.set(Slot.FLUSHED, end - 1)
        assert (e.value.current, e.value.refused) == (end, end - 1)
        assert "FLUSHED" in caplog.text and str(end - 1) in caplog.text
        assert flusher.get(Slot.FLUSHED) == end
        flusher.set(Slot.FLUSHED, end)                 # the same value again: no change
        flusher.set(Slot.FLUSH_ERROR, 5)               # not monotonic: a flag
        flusher.set(Slot.FLUSH_ERROR, 0)

        written, ts = writer.read_written()
        with pytest.raises(SlotRegressionError):
            writer.publish_written(written - 1, ts + 1)
        with pytest.raises(SlotRegressionError):
            writer.publish_written(written + 1, ts - 1)
        assert writer.read_written() == (written, ts)
        assert writer.get(Slot.WRITTEN_SEQ) % 2 == 0
        writer.publish_written(written + 10, ts + 1)
        assert writer.read_written() == (written + 10, ts + 1)
        assert writer.end_torn_publish() is False          # nothing torn: nothing done
        writer._slots[Slot.WRITTEN_SEQ] += 1                # a writer killed mid-publish
        assert writer.end_torn_publish() is True
        assert writer.read_written() == (written + 10, ts + 1)
        with pytest.raises(SlotWriterError):
            flusher.end_torn_publish()

        cleaner.set(Slot.MIN_OFFSET, 100)
        with pytest.raises(SlotRegressionError):
            cleaner.set(Slot.MIN_OFFSET, 0)
        cleaner.set(Slot.DISK_FULL, 1)
        cleaner.set(Slot.DISK_FULL, 0)

        t = recovered.table
        t.set_process("writer", RESTARTS, 3)
        with pytest.raises(SlotRegressionError):
            t.set_process("writer", RESTARTS, 2)
        assert t.get_process("writer", RESTARTS) == 3
    finally:
        for table in (flusher, writer, cleaner):
            table.close()


@pytest.mark.parametrize("process, slot, bound", [
    ("flusher", Slot.FLUSHED, Slot.WRITTEN),
    ("flusher", Slot.COMMITTED, Slot.WRITTEN),
    ("cleaner", Slot.MIN_OFFSET, Slot.DISPATCHED),
], ids=["FLUSHED", "COMMITTED", "MIN_OFFSET"])
def test_a_slot_past_its_bound_is_refused_logged_and_stores_nothing(store_dir, caplog,
                                                                   process, slot, bound):
    """FLUSHED <= WRITTEN, COMMITTED <= WRITTEN, MIN_OFFSET <= DISPATCHED: checked where
    the bounded slot is stored, against the bound as it is then."""
    root, recovered = store_dir
    table = PositionTable.attach(root, process=process)
    try:
        limit, kept = table.get(bound), table.get(slot)
        with caplog.at_level(logging.ERROR, logger="rocketstore.shm.positions"):
            with pytest.raises(SlotRelationError) as e:
                table.set(slot, limit + 1)
        assert (e.value.slot, e.value.value) == (slot.name, limit + 1)
        assert (e.value.bound, e.value.bound_value) == (bound.name, limit)
        assert f"{slot.name} <= {bound.name}" in caplog.text and str(limit + 1) in caplog.text
        assert table.get(slot) == kept
        table.set(slot, limit)                          # up to the bound is fine
        assert table.get(slot) == limit
    finally:
        table.close()


def test_a_bound_is_read_at_each_store(store_dir):
    """The flusher may publish what the writer's WRITTEN covers now, not before."""
    root, _ = store_dir
    flusher = PositionTable.attach(root, process="flusher")
    writer = PositionTable.attach(root, process="writer")
    try:
        written, ts = writer.read_written()
        with pytest.raises(SlotRelationError):
            flusher.set(Slot.FLUSHED, written + 100)
        writer.publish_written(written + 100, ts)
        flusher.set(Slot.FLUSHED, written + 100)
        flusher.set(Slot.COMMITTED, written + 100)
        assert flusher.get(Slot.FLUSHED) == flusher.get(Slot.COMMITTED) == written + 100
    finally:
        flusher.close()
        writer.close()


def test_each_slot_has_one_writer(store_dir):
    root, recovered = store_dir
    dispatcher = PositionTable.attach(root, process="dispatcher")
    reader = PositionTable.attach(root)
    try:
        with pytest.raises(SlotWriterError):
            dispatcher.set(Slot.FLUSHED, 1 << 40)
        with pytest.raises(SlotWriterError):
            dispatcher.publish_written(1 << 40, 1 << 40)
        with pytest.raises(SlotWriterError):
            dispatcher.heartbeat("writer")                   # another process's heartbeat
        with pytest.raises(SlotWriterError):
            recovered.table.set(Slot.DISPATCHED, 1 << 40)   # the supervisor's table too
        with pytest.raises(SlotWriterError):
            reader.set(Slot.STATE, StoreState.RUNNING)
        with pytest.raises(SlotWriterError):
            dispatcher.set_process("dispatcher", PID, 1)     # the supervisor's field
        assert dispatcher.get(Slot.FLUSHED) < 1 << 40
        assert dispatcher.read_written()[0] < 1 << 40
        dispatcher.heartbeat("dispatcher")
        assert dispatcher.get_process("dispatcher", HEARTBEAT_MS) > 0
        dispatcher.set(Slot.DISPATCHED, dispatcher.get(Slot.DISPATCHED) + 1)
        with pytest.raises(ValueError):
            PositionTable.attach(root, process="nobody")
    finally:
        dispatcher.close()
        reader.close()


def test_writable_slots_follow_the_table():
    """Every slot index belongs to exactly one writer (per-process heartbeats to their
    process)."""
    owners: dict[int, list[str]] = {}
    for name in ("supervisor",) + PROCESS_NAMES:
        for index in positions.writable_slots(name):
            owners.setdefault(index, []).append(name)
    assert all(len(w) == 1 for w in owners.values()), owners
    expected = set(Slot) | {PROCESS_BASE + p * PROCESS_SLOTS + f
                            for p in range(len(PROCESS_NAMES)) for f in ProcessField}
    assert set(owners) == expected
    for p, name in enumerate(PROCESS_NAMES):
        assert owners[PROCESS_BASE + p * PROCESS_SLOTS + HEARTBEAT_MS] == [name]


def test_reset_only_by_the_supervisor_before_processes_run(store_dir):
    root, recovered = store_dir
    t = recovered.table
    dispatcher = PositionTable.attach(root, process="dispatcher")
    try:
        end = t.get(Slot.DISPATCHED)
        with pytest.raises(ResetRefusedError):
            dispatcher.reset({Slot.DISPATCHED: 0})
        t.reset({Slot.DISPATCHED: end - 1, Slot.WRITTEN: end - 1})   # back: allowed here
        assert t.get(Slot.DISPATCHED) == end - 1 and t.read_written()[0] == end - 1
        assert t.get(Slot.WRITTEN_SEQ) % 2 == 0
        t.set_process("reader", PID, 4242)                 # a process runs now
        with pytest.raises(ResetRefusedError, match="reader"):
            t.reset({Slot.DISPATCHED: 0})
        assert t.get(Slot.DISPATCHED) == end - 1
        t.set_process("reader", PID, 0)
        t.reset({Slot.DISPATCHED: 0})
        assert dispatcher.get(Slot.DISPATCHED) == 0
    finally:
        dispatcher.close()


def test_recovery_refills_a_stale_table(tmp_path, caplog):
    """A crash leaves the segment with its old values (here, beyond the files); the next
    start replaces it and fills it from the recovered files."""
    config = small_config(tmp_path / "store")
    with MessageStore(config) as s:
        assert all(r.ok for r in s.put_batch([msg(i) for i in range(5)]))
        end = s.commit_log.get_max_offset()
    first = recover_and_publish(config)
    writer = PositionTable.attach(config.store_path_root_dir, process="writer")
    writer.publish_written(end + 1000, 1 << 50)            # a record the files lost
    writer.close()
    first.table.set_process("writer", PID, 99999)         # a process the crash took
    first.table.close()
    first.lock.release()                                  # the supervisor dies: no unlink
    root = config.store_path_root_dir
    assert positions.segment_state(root) is TableState.LEFT_BY_CRASH
    with caplog.at_level(logging.INFO, logger="rocketstore.procs.recovery"):
        second = recover_and_publish(config)
    assert "start row S1 (none); position table made anew (found left_by_crash)" \
        in caplog.text
    try:
        assert second.table.read_written()[0] == end
        assert second.table.get(Slot.DISPATCHED) == end
        assert second.table.get_process("writer", PID) == 0
    finally:
        second.table.close()
        unlink_shared(root)
        second.lock.release()
    assert positions.segment_state(root) is TableState.ABSENT


def test_a_foreign_segment_is_replaced(tmp_path, caplog):
    """Shared memory of the table's name that is not a position table."""
    config = small_config(tmp_path / "store")
    root = config.store_path_root_dir
    os.makedirs(root)
    name = positions.segment_name(root)
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=64).close_fd()
    try:
        assert positions.segment_state(root) is TableState.FOREIGN
        with caplog.at_level(logging.INFO, logger="rocketstore.procs.recovery"):
            recovered = recover_and_publish(config)
        assert "position table made anew (found foreign)" in caplog.text
        assert recovered.table.get(Slot.MAGIC) == positions.MAGIC_VALUE
        recovered.table.close()
        recovered.lock.release()
    finally:
        unlink_shared(root)


def _state(pid: int) -> str:
    """The state letter /proc gives process ``pid`` (R, S, Z, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_supervisor_alive_tells_a_live_supervisor_from_a_dead_or_reused_pid():
    """By the start time /proc gives in clock ticks since boot (the wall clock may jump
    under a running store), and a zombie or a missing pid is dead."""
    import subprocess
    from rocketstore.shm.positions import process_start_ticks, supervisor_alive
    me = os.getpid()
    assert supervisor_alive(me, process_start_ticks(me))
    assert not supervisor_alive(me, process_start_ticks(me) - 1)      # a reused pid
    assert not supervisor_alive(0, 0)                                  # never filled in
    child = subprocess.Popen(["true"])
    wait_for(lambda: _state(child.pid) == "Z", 10, "the child exited, not reaped")
    assert not supervisor_alive(child.pid, process_start_ticks(child.pid))
    child.wait()
    assert not supervisor_alive(child.pid, 12345)                      # gone
