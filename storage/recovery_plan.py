"""What a start does with the files and shared memory it finds: recovery as decision tables.

Recovery decides twice, each time with everything it decides on already observed, and
each time by calling this module and acting on the one row it returns:

* the supervisor's start (``procs.recovery``), holding the store's ``lock`` and before
  any file is opened: ``plan_start(StartInputs) -> StartRow``, table S;
* the load of the files (``MessageStore.load``, which the embedded store and the
  supervisor's start both run), after the files are mapped and the consume queues and
  index loaded, before the CommitLog is scanned: ``plan(RecoveryInputs) -> Row``, table R.

Each function is pure. Every combination of its inputs lands in exactly one row; no two
rows do the same thing, and every row is reached (tests/test_recovery_plan.py holds all
inputs against a table of expected rows written out there).

Table S, the supervisor's start. Inputs:

    pool_left_behind  yes | no     the position table a dead run left
                                   (``TableState.LEFT_BY_CRASH``) records a transient
                                   store pool (its TRANSIENT_POOL slot is not 0)
    cut_requested     yes | no     ``config/haCutRequest.json``: the writer of a diverged
                                   slave asked for its CommitLog to be cut back

    row  pool_left_behind  cut_requested  steps, in order
    ---  ----------------  -------------  ------------------------------------------------
    S1   no                no             none
    S2   yes               no             copy_pool
    S3   no                yes            cut
    S4   yes               yes            copy_pool, cut

    copy_pool  copy what the dead run's pool buffers hold past its COMMITTED (up to its
               WRITTEN: acknowledged bytes) into the files and fsync them, then unlink
               the buffers (``shm.transient_pool.commit_left_behind``); buffers a machine
               restart took hold nothing to copy: that range is lost, as ASYNC_FLUSH allows
    cut        cut the CommitLog back to the requested offset, the cut bytes kept under
               ``quarantine/`` (``storage.replication.apply_cut``); after the copy,
               which must not write back bytes the cut moved away

Then every row loads the files (table R) and makes the position table anew:
``PositionTable.create`` unlinks whatever holds its name (nothing, a dead run's table, a
foreign segment: ``TableState``, read only for ``pool_left_behind``) and the table is
filled from the recovered files. Shared memory is a cache: nothing in it is trusted
except the pool's bytes, which S2 and S4 copy.

Table R, the files. Inputs:

    commit_log   none | present     CommitLog files on disk
    abort        present | absent   the ``abort`` file: the last run did not stop cleanly
    logics       loaded | unusable  unusable: a consume queue or the index could not be
                                    loaded and was destroyed at load (only in a store that
                                    recorded its file sizes; without that record a file
                                    of another size may be a configuration mistake, and
                                    the load fails instead)

    row  commit_log  abort    logics    scan      consume queues and index  torn units
    ---  ----------  -------  --------  --------  ------------------------  ----------
    R1   none        any      any       none      destroy                   keep
    R2   present     absent   loaded    normal    catch_up                  keep
    R3   present     present  loaded    abnormal  catch_up                  rewind
    R4   present     absent   unusable  normal    rebuild                   keep
    R5   present     present  unusable  abnormal  rebuild                   rewind

    normal    scan from the third-last CommitLog file that holds records, cut at the first
              bad record (``CommitLog.recover_normally``)
    abnormal  scan from the newest file whose first record the checkpoint's times trust,
              or from the first file when they trust none (a run killed before its first
              flush), cut at the first bad record; re-dispatch owes everything from the
              scan's first file (``CommitLog.recover_abnormally``)
    destroy   unlink every consume queue and index file: nothing they point to exists;
              re-dispatch from 0
    catch_up  cut index entries, and units of any queue that reaches past it, at the
              recovered end; re-dispatch from the earliest of the furthest queue end, the
              index end and (abnormal) the scan's first file
    rebuild   cut as catch_up, then re-dispatch everything from the first CommitLog byte
    rewind    a consume queue's last unit that does not match its record (a queue
              writer killed mid-unit) moves back, and re-dispatch starts no later than it

Both scans start no later than a short tail (a truncated last file, grown back at load).
Every row then dispatches up to the recovered end and rebuilds the topic-queue table from
the consume queues.

What is not an input, and why:

* the checkpoint: it decides only which file the abnormal scan starts from, inside the
  scan; a missing checkpoint trusts no file;
* a short tail against whole files: both scans start no later than a short file;
* a short file before written ones, a missing middle file, or a file of another size in a
  store with no recorded size: the load (``MappedFileQueue.load``) fails before recovery
  decides anything, and nothing on disk changes;
* how far the consume queues and index reach against the recovered end: catch_up and
  rebuild cut and re-dispatch from the ends they find, the same steps for every reach;
* what holds the position table's name: the table is made anew whatever it is.
"""

from __future__ import annotations

import dataclasses
import enum


class TableState(enum.Enum):
    """What a start finds under the position table's name (``shm.positions.segment_state``):
    only a table a dead run left can record a pool (``pool_left_behind``)."""
    ABSENT = "absent"
    LEFT_BY_CRASH = "left_by_crash"
    FOREIGN = "foreign"


# ------------------------------------------------------------------ table S
class StartStep(enum.Enum):
    COPY_POOL = "copy_pool"
    CUT = "cut"


@dataclasses.dataclass(frozen=True)
class StartInputs:
    pool_left_behind: bool
    cut_requested: bool


@dataclasses.dataclass(frozen=True)
class StartRow:
    """A row of table S: the steps before the files are loaded, in the order they run."""
    label: str
    steps: tuple[StartStep, ...]

    @property
    def action(self) -> str:
        return ", ".join(step.value for step in self.steps) or "none"


S1_NOTHING = StartRow("S1", ())
S2_COPY_POOL = StartRow("S2", (StartStep.COPY_POOL,))
S3_CUT = StartRow("S3", (StartStep.CUT,))
S4_COPY_POOL_THEN_CUT = StartRow("S4", (StartStep.COPY_POOL, StartStep.CUT))
START_ROWS = (S1_NOTHING, S2_COPY_POOL, S3_CUT, S4_COPY_POOL_THEN_CUT)


def plan_start(inputs: StartInputs) -> StartRow:
    """The row of table S for what the supervisor's start found."""
    if inputs.pool_left_behind:
        return S4_COPY_POOL_THEN_CUT if inputs.cut_requested else S2_COPY_POOL
    return S3_CUT if inputs.cut_requested else S1_NOTHING


# ------------------------------------------------------------------ table R
class CommitLogFiles(enum.Enum):
    NONE = "none"
    PRESENT = "present"


class Logics(enum.Enum):
    LOADED = "loaded"
    UNUSABLE = "unusable"


class Scan(enum.Enum):
    NONE = "none"
    NORMAL = "normal"
    ABNORMAL = "abnormal"


class LogicsAction(enum.Enum):
    DESTROY = "destroy"
    CATCH_UP = "catch_up"
    REBUILD = "rebuild"


@dataclasses.dataclass(frozen=True)
class RecoveryInputs:
    abort: bool
    commit_log: CommitLogFiles
    logics: Logics


@dataclasses.dataclass(frozen=True)
class Row:
    """A row of table R: the scan, then the consume queues and index, then whether the
    queues' torn last units are rewound."""
    label: str
    scan: Scan
    logics: LogicsAction
    rewind_torn_units: bool

    @property
    def action(self) -> str:
        rewind = ", rewind torn units" if self.rewind_torn_units else ""
        return f"scan {self.scan.value}, {self.logics.value}{rewind}"


R1_EMPTY = Row("R1", Scan.NONE, LogicsAction.DESTROY, False)
R2_NORMAL = Row("R2", Scan.NORMAL, LogicsAction.CATCH_UP, False)
R3_ABNORMAL = Row("R3", Scan.ABNORMAL, LogicsAction.CATCH_UP, True)
R4_NORMAL_REBUILD = Row("R4", Scan.NORMAL, LogicsAction.REBUILD, False)
R5_ABNORMAL_REBUILD = Row("R5", Scan.ABNORMAL, LogicsAction.REBUILD, True)
ROWS = (R1_EMPTY, R2_NORMAL, R3_ABNORMAL, R4_NORMAL_REBUILD, R5_ABNORMAL_REBUILD)


def plan(inputs: RecoveryInputs) -> Row:
    """The row of table R for what the load found."""
    if inputs.commit_log is CommitLogFiles.NONE:
        return R1_EMPTY
    if inputs.logics is Logics.UNUSABLE:
        return R5_ABNORMAL_REBUILD if inputs.abort else R4_NORMAL_REBUILD
    return R3_ABNORMAL if inputs.abort else R2_NORMAL
