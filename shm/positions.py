"""The position table: one posix-ipc shared-memory segment of 8-byte slots.

Every slot has exactly one writing process; everyone else only reads. Values are
stored as native, 8-byte-aligned int64s through a ``memoryview`` cast, so a store or a
load is one machine word (atomic on x86-64); there is no read-modify-write anywhere.
Shared memory is a cache, never the truth: the supervisor creates the segment at start
(replacing a stale one left by a crash), fills it from the recovered files (``reset``),
and unlinks it at a clean stop.

    index  slot            writer       unit   monotonic  meaning / relations
    -----  --------------  -----------  -----  ---------  ------------------------------------
    0      MAGIC           supervisor   -      -          0x52534D50_4F530001 once initialised
    1      SUPERVISOR_PID  supervisor   pid    -          the running supervisor
    2      GENERATION      supervisor   ms     -          the supervisor's start time: new at
                                                          each start, set once by ``reset``
    3      STATE           supervisor   enum   -          StoreState: STARTING, RUNNING, ...
    4      FLUSH_DISK_TYPE supervisor   enum   -          0 ASYNC_FLUSH, 1 SYNC_FLUSH
    5      TRANSIENT_POOL  supervisor   count  -          buffers of the TransientStorePool
                                                          (shm.transient_pool); 0: off
    6      ROLE            supervisor   enum   -          BrokerRole: 0 ASYNC_MASTER,
                                                          1 SYNC_MASTER, 2 SLAVE
    7      SUPERVISOR_START supervisor  ticks  -          when SUPERVISOR_PID started
                                                          (/proc starttime: clock ticks
                                                          since boot, whatever the wall
                                                          clock does); with it a client
                                                          tells a live supervisor from a
                                                          dead one whose pid was reused
    8      WRITTEN_SEQ     writer       count  yes        seqlock over WRITTEN + LAST_STORE_TS:
                                                          odd while the pair is being changed
                                                          (a writer killed then leaves it odd:
                                                          the next one evens it at its start,
                                                          ``end_torn_publish``)
    9      WRITTEN         writer       byte   yes        CommitLog end: every byte below it is
                                                          a whole record or BLANK
    10     LAST_STORE_TS   writer       ms     yes        store time of the record ending at
                                                          WRITTEN (the writer never lets it
                                                          go back, even when the clock does)
    11     FLUSHED         flusher      byte   yes        <= WRITTEN; everything below is
                                                          fdatasync'ed
    12     FLUSH_ERROR     flusher      errno  -          != 0: a flush failed; writes refused
    13     DISPATCHED      dispatcher   byte   yes        <= CONFIRM; consume queues and index
                                                          hold every message below it
    14     DISPATCH_ERROR  dispatcher   errno  -          != 0: dispatch stopped on a fault
    15     MIN_OFFSET      cleaner      byte   yes        first CommitLog byte still on disk;
                                                          MIN_OFFSET <= DISPATCHED
    16     DISK_FULL       cleaner      bool   -          1: disk past the warning ratio; puts
                                                          refused
    17     COMMITTED       flusher      byte   yes        with the transient pool: every byte
                                                          below it is copied from the pool
                                                          into its file; FLUSHED <= COMMITTED
                                                          <= WRITTEN
    18     SLAVE_ACKED     ha           byte   yes        master: the highest CommitLog end a
                                                          slave reported stored (RocketMQ's
                                                          push2SlaveMaxOffset; kept after it
                                                          leaves); <= WRITTEN
    19     SLAVES          ha           count  -          master: slaves heard from within
                                                          ha_housekeeping_interval
    20     MASTER_END      writer       byte   -          slave: the master's CommitLog end
                                                          as its last frame said
    21     MASTER_HEARD_MS writer       ms     -          slave: when the master's last frame
                                                          came (0: never)
    22     REPLICA_ERROR   writer       enum   -          slave: != 0 (wire.ha_protocol
                                                          HAError): replication stopped
    23     MASTER_LEASE_MS controller   ms     -          controller mode: the group's master
                                                          answers PUT_OK only before it
                                                          (CLOCK_MONOTONIC; 0: not master,
                                                          or not told yet; 1: handing over;
                                                          procs.fencing)
    24     EPOCH           controller   count  -          controller mode: the group's epoch
                                                          this store last saw
    per process p (PROCESS_NAMES), block at PROCESS_BASE + p * PROCESS_SLOTS:
    +0     PID             supervisor   pid    -          0 when not running
    +1     PROC_STATE      supervisor   enum   -          ProcessState
    +2     RESTARTS        supervisor   count  yes        restarts since the supervisor started
    +3     STARTED_MS      supervisor   ms     -          when the current instance started
    +4     HEARTBEAT_MS    the process  ms     -          the process's loop last turned (wall
                                                          clock: may step back)
    +5     WATCHDOG_KILLS  supervisor   count  yes        times the supervisor killed it for a
                                                          heartbeat older than its
                                                          heartbeat_timeout_s

    CONFIRM (not stored) = FLUSHED under SYNC_FLUSH, WRITTEN under ASYNC_FLUSH (COMMITTED
    with the transient pool), and MIN_OFFSET <= DISPATCHED <= CONFIRM <= WRITTEN,
    FLUSHED <= WRITTEN.

The table above is the ``Slot`` and ``ProcessField`` enums written out: each member
carries its ``writer`` and whether it is ``monotonic``, and tests/test_positions.py checks
that this docstring and the enums agree row by row (names, indexes, writers, monotonicity).

Invariants checked as they run (``set``, ``set_process``, ``publish_written``):

- Single writer. A table knows the process it writes for: ``create`` makes the
  supervisor's, ``attach(store_dir, process=NAME)`` a process's, ``attach(store_dir)`` a
  read-only one. Writing a slot whose writer is another process raises
  ``SlotWriterError`` and stores nothing: a programmer error, found by the first test
  that takes the path. The check is one set lookup: publish_written, called per batch,
  measured ~0.75 µs with its checks against ~0.57 µs without (tests/test_positions.py
  keeps it under 2 µs).
- Monotonic slots never go back. A smaller value for a slot marked monotonic is refused:
  it is logged at ERROR (slot, current value, refused value, writer) and
  ``SlotRegressionError`` is raised; the slot keeps its value. Every writer reads its slot
  before advancing it (the flusher skips when WRITTEN <= FLUSHED, the dispatcher
  publishes only past what it published, the cleaner only raises MIN_OFFSET), so a
  regression means two instances of one process or a bug: the process must not go on
  with a view the table contradicts. The exception ends its loop; the process exits
  non-zero and the supervisor restarts it, and the new instance starts from the table.
  The same value again is accepted (no change).
- Bounded slots never pass their bound (``UPPER_BOUNDS``): FLUSHED <= WRITTEN,
  COMMITTED <= WRITTEN and MIN_OFFSET <= DISPATCHED, checked at each store of the
  bounded slot against the bound as it is then (one more load, on those three slots
  only). A reader of another process's slot may see an older value, but these bounds
  only grow while processes run, and each bounded value is computed from its bound (the
  flusher commits and flushes up to a WRITTEN it read, the cleaner deletes only files
  wholly below DISPATCHED), so the relation holds at the store unless something is
  wrong. A value past its bound is refused as a regression is (logged at ERROR,
  ``SlotRelationError``, the slot kept), and readers take the relations as given:
  ``confirm_offset`` clamps nothing. DISPATCHED <= CONFIRM is not checked: CONFIRM is
  no slot, and its bound would cost the dispatcher more loads per publish.
- Resets only at start. Recovery moves slots back (a cut CommitLog end is smaller than a
  stale WRITTEN); that goes through ``reset``, allowed only to the supervisor's table
  (the one ``create`` made) while no process is recorded running (every PID slot is 0),
  which is how ``procs.recovery`` fills the table before the first child starts.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import mmap
import os
import sys
from typing import Mapping

import posix_ipc

from rocketstore.storage.clock import now_ms  # noqa: F401  (re-exported)
from rocketstore.storage.recovery_plan import TableState
from rocketstore.storage import file_modes
from rocketstore.storage.config import holds_store

SEGMENT_SIZE = 4096
MAGIC_VALUE = 0x52534D50_4F530001
SUPERVISOR = "supervisor"
THE_PROCESS = "the process"   # a per-process slot written by the process it belongs to

log = logging.getLogger(__name__)


class _SlotEnum(enum.IntEnum):
    """An int enum whose members also carry ``writer`` and ``monotonic``."""

    def __new__(cls, index: int, writer: str, monotonic: bool):
        member = int.__new__(cls, index)
        member._value_ = index
        member.writer = writer
        member.monotonic = monotonic
        return member


class Slot(_SlotEnum):
    MAGIC = 0, SUPERVISOR, False
    SUPERVISOR_PID = 1, SUPERVISOR, False
    GENERATION = 2, SUPERVISOR, False
    STATE = 3, SUPERVISOR, False
    FLUSH_DISK_TYPE = 4, SUPERVISOR, False
    TRANSIENT_POOL = 5, SUPERVISOR, False
    ROLE = 6, SUPERVISOR, False
    SUPERVISOR_START = 7, SUPERVISOR, False
    WRITTEN_SEQ = 8, "writer", True
    WRITTEN = 9, "writer", True
    LAST_STORE_TS = 10, "writer", True
    FLUSHED = 11, "flusher", True
    FLUSH_ERROR = 12, "flusher", False
    DISPATCHED = 13, "dispatcher", True
    DISPATCH_ERROR = 14, "dispatcher", False
    MIN_OFFSET = 15, "cleaner", True
    DISK_FULL = 16, "cleaner", False
    COMMITTED = 17, "flusher", True
    SLAVE_ACKED = 18, "ha", True
    SLAVES = 19, "ha", False
    MASTER_END = 20, "writer", False
    MASTER_HEARD_MS = 21, "writer", False
    REPLICA_ERROR = 22, "writer", False
    MASTER_LEASE_MS = 23, "controller", False
    EPOCH = 24, "controller", False


class ProcessField(_SlotEnum):
    """The slots of one process's block (``PositionTable.process_slot``)."""
    PID = 0, SUPERVISOR, False
    PROC_STATE = 1, SUPERVISOR, False
    RESTARTS = 2, SUPERVISOR, True
    STARTED_MS = 3, SUPERVISOR, False
    HEARTBEAT_MS = 4, THE_PROCESS, False
    WATCHDOG_KILLS = 5, SUPERVISOR, True


class StoreState(enum.IntEnum):
    STOPPED = 0
    STARTING = 1
    RUNNING = 2
    STOPPING = 3


class ProcessState(enum.IntEnum):
    STOPPED = 0
    STARTING = 1
    RUNNING = 2
    BACKOFF = 3
    STOPPING = 4
    EXITED = 5
    FATAL = 6


PROCESS_NAMES = ("flusher", "writer", "dispatcher", "cleaner", "scheduler", "reader", "ha",
                 "controller", "dashboard", "proxy")
PROCESS_BASE = 64
PROCESS_SLOTS = 8
PID, PROC_STATE, RESTARTS, STARTED_MS, HEARTBEAT_MS, WATCHDOG_KILLS = ProcessField
assert (PROCESS_BASE + len(PROCESS_NAMES) * PROCESS_SLOTS) * 8 <= SEGMENT_SIZE
assert max(Slot) < PROCESS_BASE and len(ProcessField) <= PROCESS_SLOTS


SHM_DIR = "/dev/shm"          # where Linux keeps POSIX shared memory (a tmpfs)


def segment_name(store_dir: str) -> str:
    """The segment's name: derived from the store's real path, so every process of one
    store finds the same segment and two stores never share one."""
    digest = hashlib.sha1(os.path.realpath(store_dir).encode()).hexdigest()[:24]
    return f"/rocketstore-{digest}"


def supervisor_alive(pid: int, started: int) -> bool:
    """Whether the supervisor ``pid``, which started at ``started`` (its /proc starttime,
    ``process_start_ticks``), still runs: a process of that pid started then, and is no
    zombie. A table never filled in (pid 0: its start was cut short) has none. Where
    /proc does not show the pid (``hidepid``, another pid namespace) only ``kill(pid, 0)``
    can answer, and a reused pid passes it."""
    if pid <= 0:
        return False
    try:
        state, ticks = _stat(pid)
    except FileNotFoundError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass                      # another user's process: alive
        return True
    except (OSError, ValueError, IndexError):
        return True                   # cannot look: do not call it dead
    return state not in ("Z", "X") and (started <= 0 or ticks == started)


def process_start_ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (/proc/PID/stat field
    22): fixed for the process's life, unlike anything measured by the wall clock."""
    return _stat(pid)[1]


def _stat(pid: int) -> tuple[str, int]:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def segment_state(store_dir: str) -> TableState:
    """What a start finds under the segment's name (the ``table`` input of
    storage.recovery_plan): nothing, a table a dead run left, or something else."""
    try:
        memory = posix_ipc.SharedMemory(segment_name(store_dir))
    except posix_ipc.ExistentialError:
        return TableState.ABSENT
    try:
        if memory.size < SEGMENT_SIZE:
            return TableState.FOREIGN
        with mmap.mmap(memory.fd, SEGMENT_SIZE, prot=mmap.PROT_READ) as m:
            magic = int.from_bytes(m[Slot.MAGIC * 8:Slot.MAGIC * 8 + 8], sys.byteorder,
                                   signed=True)
    finally:
        memory.close_fd()
    return TableState.LEFT_BY_CRASH if magic == MAGIC_VALUE else TableState.FOREIGN


def _process_slot(name: str, field: int) -> int:
    return PROCESS_BASE + PROCESS_NAMES.index(name) * PROCESS_SLOTS + field


def _slot_name(index: int) -> str:
    if index < PROCESS_BASE:
        return Slot(index).name
    p, field = divmod(index - PROCESS_BASE, PROCESS_SLOTS)
    return f"{PROCESS_NAMES[p]}.{ProcessField(field).name}"


def writable_slots(process: str | None) -> frozenset[int]:
    """Every slot index ``process`` writes (none for a read-only table)."""
    if process is None:
        return frozenset()
    own = {s for s in Slot if s.writer == process}
    for name in PROCESS_NAMES:
        for field in ProcessField:
            if field.writer == process or (field.writer == THE_PROCESS and name == process):
                own.add(_process_slot(name, field))
    return frozenset(own)


MONOTONIC_SLOTS = frozenset(
    [s for s in Slot if s.monotonic]
    + [_process_slot(n, f) for n in PROCESS_NAMES for f in ProcessField if f.monotonic])

# slot -> the slot it may never pass; each bound grows while processes run
UPPER_BOUNDS = {Slot.FLUSHED: Slot.WRITTEN, Slot.COMMITTED: Slot.WRITTEN,
                Slot.MIN_OFFSET: Slot.DISPATCHED}


# the states in which a store takes puts (with no error slot set: ``puts_clear``)
PUTS_STATES = (int(StoreState.RUNNING), int(StoreState.STARTING))
# the slots ``puts_clear``, the WRITTEN seqlock (``publish_written``, ``read_written``) and
# ``confirm_offset`` read, as plain ints (an enum member indexes a memoryview about 50 ns
# more slowly)
_STATE, _FLUSH_ERROR = int(Slot.STATE), int(Slot.FLUSH_ERROR)
_DISPATCH_ERROR, _DISK_FULL = int(Slot.DISPATCH_ERROR), int(Slot.DISK_FULL)
_WRITTEN, _LAST_STORE_TS = int(Slot.WRITTEN), int(Slot.LAST_STORE_TS)
_WRITTEN_SEQ = int(Slot.WRITTEN_SEQ)
_FLUSH_DISK_TYPE, _TRANSIENT_POOL = int(Slot.FLUSH_DISK_TYPE), int(Slot.TRANSIENT_POOL)
_FLUSHED, _COMMITTED = int(Slot.FLUSHED), int(Slot.COMMITTED)


def create_segment(name: str, size: int) -> posix_ipc.SharedMemory:
    """Supervisor only (it holds the store's lock, so a segment of that name belongs to
    a dead run): make shared memory segment ``name`` of ``size`` bytes, replacing one
    left behind. The owner writes it, the owner's group reads it (consumers of the
    group), as the store's files: ``file_modes.file_mode()``, set again after the
    creation, whose mode the umask cut."""
    unlink_segment(name)
    memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=file_modes.file_mode(),
                                    size=size)
    try:
        os.fchmod(memory.fd, file_modes.file_mode())
    except BaseException:
        memory.close_fd()
        raise
    return memory


def unlink_segment(name: str) -> None:
    """Remove shared memory segment ``name``; nothing if there is none."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


class PositionTableError(Exception):
    """The segment is missing, stale or not a position table."""


class PositionTableAccessError(PositionTableError):
    """The segment is there, but this user may not open it."""


def not_running(store_dir: str, detail: str, up_does: str) -> str:
    """Why no store runs at ``store_dir``, as every command and client says it: the
    directory does not exist, holds no store, or holds one that is not running
    (``detail``: how that shows), with the command that ``up_does`` it."""
    return directory_fault(store_dir) or (
        f"no store running at {store_dir}: {detail}; "
        f"`rocketstore up --store {store_dir}` {up_does} it")


def directory_fault(store_dir: str) -> str | None:
    """What keeps ``store_dir`` from being a store's directory (it does not exist, is
    a file, or holds no store), with the command that makes a store there; None when
    it holds one."""
    up = f"`rocketstore up --store {store_dir}` makes one there"
    if not os.path.exists(store_dir):
        return f"no store at {store_dir}: the directory does not exist ({up})"
    if not os.path.isdir(store_dir):
        return f"no store at {store_dir}: it is not a directory"
    if not holds_store(store_dir):
        return f"no store at {store_dir}: the directory holds no store ({up})"
    return None


class SlotWriteError(Exception):
    """A slot write the table's rules refuse; nothing was stored."""


class SlotWriterError(SlotWriteError):
    """A process wrote a slot another process owns (or a read-only table wrote)."""


class SlotRegressionError(SlotWriteError):
    """A monotonic slot was given a smaller value than it holds."""

    def __init__(self, slot: str, current: int, refused: int, process: str | None):
        super().__init__(f"{slot} may only grow: holds {current}, {process} tried {refused}")
        self.slot, self.current, self.refused = slot, current, refused


class SlotRelationError(SlotWriteError):
    """A bounded slot was given a value past its bound (``UPPER_BOUNDS``)."""

    def __init__(self, slot: str, value: int, bound: str, bound_value: int,
                 process: str | None):
        super().__init__(f"{slot} <= {bound} must hold: {bound} is {bound_value}, "
                         f"{process} tried {slot} = {value}")
        self.slot, self.value, self.bound, self.bound_value = slot, value, bound, bound_value


class ResetRefusedError(SlotWriteError):
    """``reset`` outside the supervisor's start (not its table, or a process running)."""


class PositionTable:
    """A mapped position table. Create it with ``create`` (supervisor) or ``attach``."""

    def __init__(self, name: str, memory: posix_ipc.SharedMemory, owner: bool,
                 process: str | None):
        self.name = name
        self.process = process
        self._owner = owner
        self._map = mmap.mmap(memory.fd, SEGMENT_SIZE, prot=mmap.PROT_READ | (
            mmap.PROT_WRITE if owner or process is not None else 0))
        memory.close_fd()
        self._slots = memoryview(self._map).cast("q")
        self._writable = writable_slots(process)

    # ------------------------------------------------------------------ life
    @classmethod
    def create(cls, store_dir: str) -> "PositionTable":
        """Supervisor only: create the segment, replacing a stale one (the caller holds
        the store's lock, so any segment of that name belongs to a dead run). The table
        writes as the supervisor."""
        name = segment_name(store_dir)
        table = cls(name, create_segment(name, SEGMENT_SIZE), owner=True, process=SUPERVISOR)
        table._slots[Slot.MAGIC] = MAGIC_VALUE
        return table

    @classmethod
    def attach(cls, store_dir: str, process: str | None = None, *,
               left_behind: bool = False) -> "PositionTable":
        """Map the running store's segment, writing as ``process`` (one of
        PROCESS_NAMES), or read-only when it is None. Raises ``PositionTableError`` when
        no supervisor has created one, or the one that did is gone (a killed run leaves
        its segment: the store is not running until ``up`` recovers it), or the segment
        cannot be opened. ``left_behind``: a dead run's table is wanted (recovery)."""
        if process is not None and process not in PROCESS_NAMES:
            raise ValueError(f"{process!r} is not a store process {PROCESS_NAMES}")
        name = segment_name(store_dir)
        try:
            memory = posix_ipc.SharedMemory(name, read_only=process is None)
        except posix_ipc.ExistentialError:
            raise PositionTableError(not_running(
                store_dir, f"no supervisor runs it (shared memory {name} does not exist)",
                "starts")) from None
        except posix_ipc.PermissionsError:
            raise PositionTableAccessError(f"cannot open the position table of {store_dir} "
                                     f"(shared memory {name}): permission denied; it is "
                                     "the store's user's") from None
        table = cls(name, memory, owner=False, process=process)
        if table.get(Slot.MAGIC) != MAGIC_VALUE:
            table.close()
            raise PositionTableError(f"shared memory {name} is not a position table")
        pid = table.get(Slot.SUPERVISOR_PID)
        if not left_behind and not supervisor_alive(pid, table.get(Slot.SUPERVISOR_START)):
            table.close()
            raise PositionTableError(not_running(
                store_dir, f"its supervisor (pid {pid}) is gone and left its table behind",
                "recovers"))
        return table

    def close(self) -> None:
        if self._slots is not None:
            self._slots.release()
            self._slots = None
            self._map.close()

    # ------------------------------------------------------------------ slots
    def get(self, slot: int) -> int:
        return self._slots[slot]

    def puts_clear(self) -> bool:
        """The table's part of "this store takes puts", read once a drain by the writer:
        STATE RUNNING or STARTING, and FLUSH_ERROR, DISPATCH_ERROR and DISK_FULL clear
        (``storage.put_path`` names the refusal when any is not)."""
        slots = self._slots
        return not (slots[_FLUSH_ERROR] or slots[_DISPATCH_ERROR] or slots[_DISK_FULL]) \
            and slots[_STATE] in PUTS_STATES

    def set(self, slot: Slot, value: int) -> None:
        """Store one slot: only its writer (see the table) may. Raises
        ``SlotWriterError`` for another process's slot, ``SlotRegressionError`` for a
        monotonic slot given a smaller value and ``SlotRelationError`` for a bounded
        slot given a value past its bound; either way nothing is stored."""
        self._store(slot, value)

    def _store(self, index: int, value: int) -> None:
        if index not in self._writable:
            raise SlotWriterError(f"{self.process or 'a read-only table'} may not write "
                                  f"{_slot_name(index)}")
        slots = self._slots
        if index in MONOTONIC_SLOTS and value < slots[index]:
            self._refuse(index, value)
        bound = UPPER_BOUNDS.get(index)
        if bound is not None and value > slots[bound]:
            self._refuse_past(index, value, bound)
        slots[index] = value

    def _refuse(self, index: int, value: int) -> None:
        error = SlotRegressionError(_slot_name(index), self._slots[index], value, self.process)
        log.error("refused, slot kept: %s", error)
        raise error

    def _refuse_past(self, index: int, value: int, bound: int) -> None:
        error = SlotRelationError(_slot_name(index), value, _slot_name(bound),
                                  self._slots[bound], self.process)
        log.error("refused, slot kept: %s", error)
        raise error

    def publish_written(self, written: int, last_store_ts: int) -> None:
        """Writer only: publish the CommitLog end and the store time that goes with it.
        Raises as ``set`` does (neither may go back); nothing is stored then."""
        slots = self._slots
        if self.process != "writer":
            raise SlotWriterError(f"{self.process or 'a read-only table'} may not write WRITTEN")
        if written < slots[_WRITTEN]:
            self._refuse(Slot.WRITTEN, written)
        if last_store_ts < slots[_LAST_STORE_TS]:
            self._refuse(Slot.LAST_STORE_TS, last_store_ts)
        seq = slots[_WRITTEN_SEQ]
        slots[_WRITTEN_SEQ] = seq + 1
        slots[_WRITTEN] = written
        slots[_LAST_STORE_TS] = last_store_ts
        slots[_WRITTEN_SEQ] = seq + 2

    def read_written(self) -> tuple[int, int]:
        """A consistent (WRITTEN, LAST_STORE_TS) pair."""
        slots = self._slots
        while True:
            seq = slots[_WRITTEN_SEQ]
            if seq & 1 == 0:
                pair = slots[_WRITTEN], slots[_LAST_STORE_TS]
                if slots[_WRITTEN_SEQ] == seq:
                    return pair

    def end_torn_publish(self) -> bool:
        """Writer only, at its start: end a ``publish_written`` its predecessor was
        killed inside (between the seqlock's two stores of WRITTEN_SEQ). WRITTEN_SEQ is
        then odd, and every reader of the pair (this writer's ``read_written`` first,
        then the flusher's and the dispatcher's) would wait for it forever; the one
        writer there is makes it even. WRITTEN and LAST_STORE_TS each hold the dead
        writer's old value or its new one (each stored whole, neither going back):
        what a kill just before or just after the publish leaves, which recovery from
        WRITTEN handles. Returns True when a publish was torn."""
        if self.process != "writer":
            raise SlotWriterError(f"{self.process or 'a read-only table'} may not write "
                                  "WRITTEN_SEQ")
        slots = self._slots
        seq = slots[Slot.WRITTEN_SEQ]
        if seq & 1 == 0:
            return False
        slots[Slot.WRITTEN_SEQ] = seq + 1
        log.warning("the last writer was killed while publishing WRITTEN; kept WRITTEN=%d, "
                    "LAST_STORE_TS=%d", slots[Slot.WRITTEN], slots[Slot.LAST_STORE_TS])
        return True

    def confirm_offset(self) -> int:
        """How far dispatch and readers may go: FLUSHED under SYNC_FLUSH, else WRITTEN,
        or COMMITTED when the transient pool holds what is past it. Never past WRITTEN:
        FLUSHED and COMMITTED are refused past it where they are stored."""
        slots = self._slots
        if slots[_FLUSH_DISK_TYPE] == 1:
            return slots[_FLUSHED]
        if slots[_TRANSIENT_POOL]:
            return slots[_COMMITTED]
        return slots[_WRITTEN]

    def reset(self, values: Mapping[int, int]) -> None:
        """Supervisor only, before any process starts: store ``values`` (slot index ->
        value, e.g. ``{Slot.WRITTEN: end}`` or ``{process_slot(p, HEARTBEAT_MS): 0}``)
        whatever the slots hold, monotonic or not: the fill from recovered files.
        WRITTEN and LAST_STORE_TS move under the seqlock. Raises ``ResetRefusedError``
        on a table ``create`` did not make, or while a PID slot says a process runs."""
        if not self._owner:
            raise ResetRefusedError(f"only the supervisor's table may reset ({self.process})")
        running = [n for n in PROCESS_NAMES if self.get_process(n, PID)]
        if running:
            raise ResetRefusedError(f"reset while processes run: {', '.join(running)}")
        slots = self._slots
        odd = slots[Slot.WRITTEN_SEQ] | 1   # readers of the pair wait while it is odd
        slots[Slot.WRITTEN_SEQ] = odd
        for index, value in values.items():
            if index != Slot.WRITTEN_SEQ:
                slots[index] = value
        slots[Slot.WRITTEN_SEQ] = odd + 1
        log.info("position table reset: %s",
                 ", ".join(f"{_slot_name(i)}={v}" for i, v in values.items()))

    # ------------------------------------------------------------------ processes
    @staticmethod
    def process_slot(name: str, field: int) -> int:
        return _process_slot(name, field)

    def set_process(self, name: str, field: int, value: int) -> None:
        """HEARTBEAT_MS: the named process only; every other field: the supervisor.
        Raises as ``set`` does."""
        self._store(_process_slot(name, field), value)

    def get_process(self, name: str, field: int) -> int:
        return self._slots[_process_slot(name, field)]

    def heartbeat(self, name: str) -> None:
        """The named process only: its loop turned."""
        self._store(_process_slot(name, HEARTBEAT_MS), now_ms())

    def snapshot(self) -> dict:
        """Every slot by name, for ``rocketstore status``; the processes this store
        runs (one never started is not the store's: a SLAVE's scheduler, the HA
        process of a master without ``ha_listen_port``)."""
        out = {s.name.lower(): self.get(s) for s in Slot if s is not Slot.MAGIC}
        out["processes"] = {
            name: {"pid": self.get_process(name, PID),
                   "state": ProcessState(self.get_process(name, PROC_STATE)).name,
                   "restarts": self.get_process(name, RESTARTS),
                   "watchdog_kills": self.get_process(name, WATCHDOG_KILLS),
                   "started_ms": self.get_process(name, STARTED_MS),
                   "heartbeat_ms": self.get_process(name, HEARTBEAT_MS)}
            for name in PROCESS_NAMES if self.get_process(name, STARTED_MS)}
        return out
