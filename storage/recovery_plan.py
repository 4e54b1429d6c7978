"""What a start does with the files it finds: recovery as a decision table.

``plan(RecoveryInputs) -> RecoveryPlan`` is a pure function of what a start observes; the
embedded store (``MessageStore.load``) and the supervisor (``procs.recovery``) act on its
rows and do nothing else. Three tables, each row labelled; every combination of inputs
lands in exactly one row of each (tests/test_recovery.py enumerates them all).

Inputs, each with its whole domain:

    abort        present | absent        the ``abort`` file: the last run did not stop cleanly
    checkpoint   written | missing       missing: no file, or times that trust no CommitLog
                                         file (a run killed before its first flush)
    commit_log   none | full | short_tail | short_middle
                                         short_tail: the last written file is short and
                                         only never-written files follow (a truncated
                                         tail, in a store that recorded its file size);
                                         short_middle: a short file before written ones,
                                         or in a store with no recorded size
    logics       none | behind | equal | ahead | unusable
                                         the consume queues and index against the
                                         recovered CommitLog end: no files; some end before
                                         it; all at it; a consume queue past it; a queue or
                                         the index could not be loaded (destroyed at load)
    table        absent | left_by_crash | foreign
                                         the position table's shared memory (the
                                         supervisor's start only; the embedded store has
                                         none: absent)

The CommitLog (``commit_log_row``; decided before the CommitLog is scanned):

    row  commit_log            abort    checkpoint  action
    ---  --------------------  -------  ----------  -------------------------------------------
    C1   short_middle          any      any         refuse: the load fails (StoreFileError),
                                                    nothing on disk changes
    C2   none                  any      any         empty store: nothing to scan
    C3   full | short_tail     absent   any         normal: scan from the third-last file
                                                    that holds records (no later than a
                                                    short tail), cut at the first bad record
    C4   full | short_tail     present  written     abnormal: scan from the newest file the
                                                    checkpoint trusts (no later than a short
                                                    tail), cut there; re-dispatch from it
    C5   full | short_tail     present  missing     abnormal from the first file: nothing
                                                    is trusted; re-dispatch from the start

The consume queues and the index (``logics_row``; decided after the scan, which gives
the recovered end they are compared with):

    row  commit_log            logics     action
    ---  --------------------  ---------  ----------------------------------------------
    L1   short_middle          any        untouched (the load failed)
    L2   none                  any        destroy consume queues and index: nothing they
                                          point to exists
    L3   full | short_tail     unusable   rebuild: cut any queue past the end, re-dispatch
                                          everything from the first CommitLog byte
    L4   full | short_tail     ahead      cut: units and index entries past the end go,
                                          then catch up as L5
    L5   full | short_tail     none |     catch up: re-dispatch from the earliest of the
                               behind |   queue end, the index end and C4's file (nothing
                               equal      to do when all are at the end)

Every L row after L2 also cuts the index past the end and rebuilds the topic-queue
table from the consume queues.

The position table (``table_row``; the supervisor, holding the store's lock, so no live
store can own a segment of that name):

    row  table                  action
    ---  ---------------------  -----------------------------------------------------
    T1   absent                 create it, then fill it from the recovered files
    T2   left_by_crash|foreign  replace it (unlink, create), then fill it: shared memory
                                is a cache, nothing in it is trusted

Which inputs each table reads is part of the design: the position table never changes
what happens to the files, and the checkpoint matters only to an abnormal start.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable


class Checkpoint(enum.Enum):
    WRITTEN = "written"
    MISSING = "missing"


class CommitLogFiles(enum.Enum):
    NONE = "none"
    FULL = "full"
    SHORT_TAIL = "short_tail"
    SHORT_MIDDLE = "short_middle"


class Logics(enum.Enum):
    NONE = "none"
    BEHIND = "behind"
    EQUAL = "equal"
    AHEAD = "ahead"
    UNUSABLE = "unusable"


class TableState(enum.Enum):
    ABSENT = "absent"
    LEFT_BY_CRASH = "left_by_crash"
    FOREIGN = "foreign"


@dataclasses.dataclass(frozen=True)
class RecoveryInputs:
    abort: bool
    checkpoint: Checkpoint
    commit_log: CommitLogFiles
    logics: Logics
    table: TableState = TableState.ABSENT


@dataclasses.dataclass(frozen=True)
class Row:
    """One labelled row: when it applies, and what it does."""
    label: str
    applies: Callable[[RecoveryInputs], bool] = dataclasses.field(compare=False, repr=False)
    action: str = dataclasses.field(compare=False)


_SCANNED = (CommitLogFiles.FULL, CommitLogFiles.SHORT_TAIL)

C1_REFUSE = Row("C1", lambda i: i.commit_log is CommitLogFiles.SHORT_MIDDLE, "refuse")
C2_EMPTY = Row("C2", lambda i: i.commit_log is CommitLogFiles.NONE, "empty")
C3_NORMAL = Row("C3", lambda i: i.commit_log in _SCANNED and not i.abort, "normal")
C4_ABNORMAL = Row("C4", lambda i: i.commit_log in _SCANNED and i.abort
                  and i.checkpoint is Checkpoint.WRITTEN, "abnormal from the checkpoint")
C5_ABNORMAL_FROM_FIRST = Row("C5", lambda i: i.commit_log in _SCANNED and i.abort
                             and i.checkpoint is Checkpoint.MISSING,
                             "abnormal from the first file")
COMMIT_LOG_ROWS = (C1_REFUSE, C2_EMPTY, C3_NORMAL, C4_ABNORMAL, C5_ABNORMAL_FROM_FIRST)

L1_UNTOUCHED = Row("L1", lambda i: i.commit_log is CommitLogFiles.SHORT_MIDDLE, "untouched")
L2_DESTROY = Row("L2", lambda i: i.commit_log is CommitLogFiles.NONE, "destroy")
L3_REBUILD = Row("L3", lambda i: i.commit_log in _SCANNED and i.logics is Logics.UNUSABLE,
                 "rebuild")
L4_CUT = Row("L4", lambda i: i.commit_log in _SCANNED and i.logics is Logics.AHEAD, "cut")
L5_CATCH_UP = Row("L5", lambda i: i.commit_log in _SCANNED and i.logics in (
    Logics.NONE, Logics.BEHIND, Logics.EQUAL), "catch up")
LOGICS_ROWS = (L1_UNTOUCHED, L2_DESTROY, L3_REBUILD, L4_CUT, L5_CATCH_UP)

T1_CREATE = Row("T1", lambda i: i.table is TableState.ABSENT, "create")
T2_REPLACE = Row("T2", lambda i: i.table in (TableState.LEFT_BY_CRASH, TableState.FOREIGN),
                 "replace")
TABLE_ROWS = (T1_CREATE, T2_REPLACE)


@dataclasses.dataclass(frozen=True)
class RecoveryPlan:
    commit_log: Row
    logics: Row
    table: Row

    @property
    def labels(self) -> str:
        return f"{self.commit_log.label} {self.logics.label} {self.table.label}"


def commit_log_row(abort: bool, checkpoint: Checkpoint, commit_log: CommitLogFiles) -> Row:
    """The C row: what to do with the CommitLog before scanning it."""
    if commit_log is CommitLogFiles.SHORT_MIDDLE:
        return C1_REFUSE
    if commit_log is CommitLogFiles.NONE:
        return C2_EMPTY
    if not abort:
        return C3_NORMAL
    return C4_ABNORMAL if checkpoint is Checkpoint.WRITTEN else C5_ABNORMAL_FROM_FIRST


def logics_row(commit_log: CommitLogFiles, logics: Logics) -> Row:
    """The L row: what to do with the consume queues and the index after the scan."""
    if commit_log is CommitLogFiles.SHORT_MIDDLE:
        return L1_UNTOUCHED
    if commit_log is CommitLogFiles.NONE:
        return L2_DESTROY
    if logics is Logics.UNUSABLE:
        return L3_REBUILD
    return L4_CUT if logics is Logics.AHEAD else L5_CATCH_UP


def table_row(table: TableState) -> Row:
    """The T row: the supervisor's position table."""
    return T1_CREATE if table is TableState.ABSENT else T2_REPLACE


def plan(inputs: RecoveryInputs) -> RecoveryPlan:
    """Every row for one start's inputs (the tables above, in one call)."""
    return RecoveryPlan(commit_log_row(inputs.abort, inputs.checkpoint, inputs.commit_log),
                        logics_row(inputs.commit_log, inputs.logics),
                        table_row(inputs.table))


def observe_logics(*, rebuilt: bool, max_queue_end: int, index_end: int | None,
                   commit_log_end: int) -> Logics:
    """The ``logics`` input from what a load saw: ``rebuilt`` when a queue or the index
    was destroyed at load; ``max_queue_end`` the furthest consume queue end and
    ``index_end`` the index's, -1 when there are no such files, ``index_end`` None when
    the index is disabled. These are the ends re-dispatch starts from (RocketMQ's reput
    start), so BEHIND means some message is missing from a queue or the index."""
    if rebuilt:
        return Logics.UNUSABLE
    if max_queue_end > commit_log_end:
        return Logics.AHEAD
    if max_queue_end < 0 and index_end in (None, -1):
        return Logics.NONE
    ends = [max(max_queue_end, 0)] + ([] if index_end is None else [max(index_end, 0)])
    return Logics.BEHIND if min(ends) < commit_log_end else Logics.EQUAL
