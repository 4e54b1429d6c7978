"""The decision tables of storage/recovery_plan.py against rows written out here.

``EXPECTED_R`` and ``EXPECTED_S`` are typed from the documented behaviour, one line per
combination of inputs, in words: every combination is held against ``plan`` and
``plan_start``, every row the module defines is reached, no two of its rows do the same,
and the module docstring's tables say what these lines say. Then the start's four rows
on real files and shared memory (``procs.recovery.recover_and_publish``); table R's rows
on real files are in tests/test_recovery.py section 6.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re

import pytest

from conftest import msg, small_config
from rocketstore.procs.recovery import recover_and_publish, unlink_shared
from rocketstore.shm.positions import PositionTable, Slot, segment_state
from rocketstore.shm.transient_pool import TransientStorePool, buffer_name
from rocketstore.storage import MessageStore, replication
from rocketstore.storage import recovery_plan as plan
from rocketstore.storage.mapped_file import offset_to_file_name
from rocketstore.storage.recovery_plan import TableState

# Table R: what the load of the files does.
#  commit_log  abort      logics      row   scan        queues and index  torn units
EXPECTED_R = [
    ("none",     "absent",  "loaded",   "R1", "none",     "destroy",  "keep"),
    ("none",     "absent",  "unusable", "R1", "none",     "destroy",  "keep"),
    ("none",     "present", "loaded",   "R1", "none",     "destroy",  "keep"),
    ("none",     "present", "unusable", "R1", "none",     "destroy",  "keep"),
    ("present",  "absent",  "loaded",   "R2", "normal",   "catch_up", "keep"),
    ("present",  "present", "loaded",   "R3", "abnormal", "catch_up", "rewind"),
    ("present",  "absent",  "unusable", "R4", "normal",   "rebuild",  "keep"),
    ("present",  "present", "unusable", "R5", "abnormal", "rebuild",  "rewind"),
]

# Table S: what the supervisor's start does before the files are loaded.
#  pool_left_behind  cut_requested  row   steps, in order
EXPECTED_S = [
    ("no",             "no",          "S1", ()),
    ("yes",            "no",          "S2", ("copy_pool",)),
    ("no",             "yes",         "S3", ("cut",)),
    ("yes",            "yes",         "S4", ("copy_pool", "cut")),
]


def r_inputs(commit_log: str, abort: str, logics: str) -> plan.RecoveryInputs:
    return plan.RecoveryInputs(abort={"present": True, "absent": False}[abort],
                               commit_log=plan.CommitLogFiles(commit_log),
                               logics=plan.Logics(logics))


def s_inputs(pool_left_behind: str, cut_requested: str) -> plan.StartInputs:
    yes = {"yes": True, "no": False}
    return plan.StartInputs(pool_left_behind=yes[pool_left_behind],
                            cut_requested=yes[cut_requested])


def r_answer(row: plan.Row) -> tuple[str, str, str, str]:
    return (row.label, row.scan.value, row.logics.value,
            "rewind" if row.rewind_torn_units else "keep")


def s_answer(row: plan.StartRow) -> tuple[str, tuple[str, ...]]:
    return row.label, tuple(step.value for step in row.steps)


# ============================================================================ the tables
def test_the_expected_lines_hold_every_input_once():
    """Both lists name each combination of the module's input domains exactly once: a
    new input value, or a combination left out here, fails."""
    r_domain = set(itertools.product([c.value for c in plan.CommitLogFiles],
                                     ("absent", "present"), [lg.value for lg in plan.Logics]))
    r_lines = [line[:3] for line in EXPECTED_R]
    assert len(r_lines) == len(set(r_lines)) and set(r_lines) == r_domain
    assert len(r_domain) == 8
    s_lines = [line[:2] for line in EXPECTED_S]
    assert sorted(s_lines) == sorted(itertools.product(("no", "yes"), repeat=2))
    assert [f.name for f in dataclasses.fields(plan.RecoveryInputs)] == \
        ["abort", "commit_log", "logics"]
    assert [f.name for f in dataclasses.fields(plan.StartInputs)] == \
        ["pool_left_behind", "cut_requested"]


@pytest.mark.parametrize("line", EXPECTED_R, ids=lambda line: "-".join(line[:3]))
def test_plan_gives_the_expected_row(line):
    assert r_answer(plan.plan(r_inputs(*line[:3]))) == line[3:]


@pytest.mark.parametrize("line", EXPECTED_S, ids=lambda line: "-".join(line[:2]))
def test_plan_start_gives_the_expected_row(line):
    assert s_answer(plan.plan_start(s_inputs(*line[:2]))) == line[2:]


def test_every_row_is_reached_and_no_two_do_the_same():
    assert [r.label for r in plan.ROWS] == sorted({line[3] for line in EXPECTED_R})
    assert [r.label for r in plan.START_ROWS] == sorted({line[2] for line in EXPECTED_S})
    assert len({r_answer(r)[1:] for r in plan.ROWS}) == len(plan.ROWS)
    assert len({s_answer(r)[1:] for r in plan.START_ROWS}) == len(plan.START_ROWS)


def documented_r_rows(doc: str) -> list[tuple[str, ...]]:
    """Table R's lines in the module docstring, ``any`` spelled out."""
    domains = ([c.value for c in plan.CommitLogFiles], ["present", "absent"],
               [lg.value for lg in plan.Logics])
    out = []
    for m in re.finditer(r"^    (R\d)  +(\S+)  +(\S+)  +(\S+)  +(\S+)  +(\S+)  +(\S+)$", doc,
                         re.M):
        label, *given, scan, logics, rewind = m.groups()
        spelled = [domain if g == "any" else [g] for g, domain in zip(given, domains)]
        out += [(*combo, label, scan, logics, rewind) for combo in itertools.product(*spelled)]
    return out


def documented_s_rows(doc: str) -> list[tuple]:
    out = []
    for m in re.finditer(r"^    (S\d)  +(yes|no)  +(yes|no)  +(.+)$", doc, re.M):
        label, pool, cut, steps = m.groups()
        out.append((pool, cut, label, () if steps == "none" else tuple(steps.split(", "))))
    return out


def test_the_module_documents_these_rows():
    """The docstring's two tables, read line by line, are the lines above."""
    assert sorted(documented_r_rows(plan.__doc__)) == sorted(EXPECTED_R)
    assert sorted(documented_s_rows(plan.__doc__)) == sorted(EXPECTED_S)


def test_a_wrong_document_is_caught():
    """The reading above sees a changed cell, and a row gone."""
    doc = plan.__doc__
    changed = re.sub(r"^(    R4 .*)rebuild", r"\1catch_up", doc, flags=re.M)
    assert changed != doc and sorted(documented_r_rows(changed)) != sorted(EXPECTED_R)
    assert sorted(documented_s_rows(re.sub(r"^    S4 .*$", "", doc, flags=re.M))) \
        != sorted(EXPECTED_S)


# ============================================================================ table S on disk
FILE_SIZE = 8192
POOL_SIZE = 2
N = 90


def _move_tail_into_a_pool(config, committed: int, written: int) -> None:
    """A dead run's pool: ``[committed, written)`` in its buffers, zeros in the files."""
    pool = TransientStorePool(config.store_path_root_dir, POOL_SIZE, FILE_SIZE, create=True)
    try:
        pos = committed
        while pos < written:
            base = pos - pos % FILE_SIZE
            end = min(written, base + FILE_SIZE)
            path = os.path.join(config.commit_log_dir, offset_to_file_name(base))
            fd = os.open(path, os.O_RDWR)
            try:
                data = os.pread(fd, end - pos, pos - base)
                os.pwrite(fd, bytes(end - pos), pos - base)
            finally:
                os.close(fd)
            pool.buffer_for(base)[pos - base:end - base] = data
            pos = end
    finally:
        pool.close()


def _leave_a_table(config, *, pool: int, committed: int, written: int) -> None:
    """The position table of a run that died whole (no unlink), with its pool size."""
    table = PositionTable.create(config.store_path_root_dir)
    table.reset({Slot.TRANSIENT_POOL: pool, Slot.COMMITTED: committed, Slot.WRITTEN: written})
    table.close()


def _quarantined(root: str) -> bytes:
    out = b""
    for where, _, names in os.walk(os.path.join(root, "quarantine")):
        for name in names:
            with open(os.path.join(where, name), "rb") as f:
                out += f.read()
    return out


@pytest.mark.parametrize("line", EXPECTED_S, ids=lambda line: line[2])
def test_the_start_rows_on_real_files(tmp_path, caplog, line):
    """A run dies whole with its last messages past COMMITTED: in its pool's buffers
    (``pool_left_behind``), or in the files; a cut may be asked at a record between
    COMMITTED and WRITTEN. The start keeps every message when nothing is cut, and ends
    the CommitLog at the cut when one is asked, the pool's bytes past it in quarantine/
    (the copy runs before the cut: the other way round, the copy would bring them back)."""
    pool_left_behind, cut_requested, label, _ = line
    config = small_config(tmp_path / "store")
    root = config.store_path_root_dir
    with MessageStore(config) as s:
        results = s.put_batch([msg(i) for i in range(N)])
    committed, cut_at = results[N // 3].wrote_offset, results[2 * N // 3].wrote_offset
    written = results[-1].wrote_offset + results[-1].wrote_bytes
    assert committed // FILE_SIZE < written // FILE_SIZE, "the tail spans files"
    open(os.path.join(root, "abort"), "wb").close()                 # it died
    if pool_left_behind == "yes":
        _move_tail_into_a_pool(config, committed, written)
    _leave_a_table(config, pool=POOL_SIZE if pool_left_behind == "yes" else 0,
                   committed=committed, written=written)
    if cut_requested == "yes":
        replication.request_cut(config.config_dir, cut_at, why="diverged")
    assert segment_state(root) is TableState.LEFT_BY_CRASH
    try:
        with caplog.at_level(logging.INFO, logger="rocketstore.procs.recovery"):
            recovered = recover_and_publish(config)
        try:
            assert f"start row {label} " in caplog.text
            end = cut_at if cut_requested == "yes" else written
            assert recovered.table.read_written()[0] == end
            with MessageStore(config, take_lock=False) as s:
                kept = [s.look_message_by_offset(r.wrote_offset) for r in results]
                assert [m.body for m in kept if m is not None] == \
                    [msg(i).body for i in range(N) if results[i].wrote_offset < end]
                assert s.check() == []
            last_body = msg(N - 1).body
            assert (last_body in _quarantined(root)) == (cut_requested == "yes")
            assert replication.requested_cut(config.config_dir) is None
        finally:
            recovered.table.close()
            unlink_shared(root)
            recovered.lock.release()
        for i in range(POOL_SIZE):
            assert not os.path.exists(f"/dev/shm/{buffer_name(root, i).lstrip('/')}")
    finally:
        TransientStorePool.unlink(root, POOL_SIZE)
