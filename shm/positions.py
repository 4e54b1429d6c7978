"""The position table: one posix-ipc shared-memory segment of 8-byte slots.

Every slot has exactly one writing process; everyone else only reads. Values are
stored as native, 8-byte-aligned int64s through a ``memoryview`` cast, so a store or a
load is one machine word (atomic on x86-64); there is no read-modify-write anywhere.
Shared memory is a cache, never the truth: the supervisor creates the segment at start
(replacing a stale one left by a crash), fills it from the recovered files, and unlinks
it at a clean stop.

    slot            writer       unit   monotonic  meaning / relations
    --------------  -----------  -----  ---------  ------------------------------------------
    MAGIC           supervisor   -      -          0x52534D50_4F530001 once initialised
    SUPERVISOR_PID  supervisor   pid    -          the running supervisor
    GENERATION      supervisor   ms     yes        the supervisor's start time: new at each start
    STATE           supervisor   enum   -          StoreState: STARTING, RUNNING, STOPPING
    FLUSH_DISK_TYPE supervisor   enum   -          0 ASYNC_FLUSH, 1 SYNC_FLUSH
    WRITTEN_SEQ     writer       count  yes        seqlock over WRITTEN + LAST_STORE_TS: odd
                                                   while the pair is being changed
    WRITTEN         writer       byte   yes        CommitLog end: every byte below it is a
                                                   whole record or BLANK
    LAST_STORE_TS   writer       ms     yes        store time of the record ending at WRITTEN
    FLUSHED         flusher      byte   yes        <= WRITTEN; everything below is fdatasync'ed
    FLUSH_ERROR     flusher      errno  -          != 0: a flush failed; writes are refused
    DISPATCHED      dispatcher   byte   yes        <= CONFIRM; consume queues and index hold
                                                   every message below it
    DISPATCH_ERROR  dispatcher   errno  -          != 0: dispatch stopped on a fault
    MIN_OFFSET      cleaner      byte   yes        first CommitLog byte still on disk;
                                                   MIN_OFFSET <= DISPATCHED
    DISK_FULL       cleaner      bool   -          1: disk past the warning ratio; puts refused
    per process p (PROCESS_NAMES), block at PROCESS_BASE + p * PROCESS_SLOTS:
    PID             supervisor   pid    -          0 when not running
    PROC_STATE      supervisor   enum   -          ProcessState
    RESTARTS        supervisor   count  yes        restarts since the supervisor started
    STARTED_MS      supervisor   ms     -          when the current instance started
    HEARTBEAT_MS    the process  ms     yes        the process's loop last turned

    CONFIRM (not stored) = FLUSHED under SYNC_FLUSH, WRITTEN under ASYNC_FLUSH, and
    MIN_OFFSET <= DISPATCHED <= CONFIRM <= WRITTEN, FLUSHED <= WRITTEN.

Every function that writes a slot names the process that may call it.
"""

from __future__ import annotations

import enum
import hashlib
import mmap
import os
import time

import posix_ipc

SEGMENT_SIZE = 4096
MAGIC_VALUE = 0x52534D50_4F530001


class Slot(enum.IntEnum):
    MAGIC = 0
    SUPERVISOR_PID = 1
    GENERATION = 2
    STATE = 3
    FLUSH_DISK_TYPE = 4
    WRITTEN_SEQ = 8
    WRITTEN = 9
    LAST_STORE_TS = 10
    FLUSHED = 11
    FLUSH_ERROR = 12
    DISPATCHED = 13
    DISPATCH_ERROR = 14
    MIN_OFFSET = 15
    DISK_FULL = 16


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


PROCESS_NAMES = ("flusher", "writer", "dispatcher", "cleaner", "scheduler", "reader")
PROCESS_BASE = 64
PROCESS_SLOTS = 8
PID, PROC_STATE, RESTARTS, STARTED_MS, HEARTBEAT_MS = range(5)
assert (PROCESS_BASE + len(PROCESS_NAMES) * PROCESS_SLOTS) * 8 <= SEGMENT_SIZE


def segment_name(store_dir: str) -> str:
    """The segment's name: derived from the store's real path, so every process of one
    store finds the same segment and two stores never share one."""
    digest = hashlib.sha1(os.path.realpath(store_dir).encode()).hexdigest()[:24]
    return f"/rocketstore-{digest}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class PositionTableError(Exception):
    """The segment is missing, stale or not a position table."""


class PositionTable:
    """A mapped position table. Create it with ``create`` (supervisor) or ``attach``."""

    def __init__(self, name: str, memory: posix_ipc.SharedMemory, owner: bool):
        self.name = name
        self._owner = owner
        self._map = mmap.mmap(memory.fd, SEGMENT_SIZE)
        memory.close_fd()
        self._slots = memoryview(self._map).cast("q")
        self._pid = os.getpid()

    # ------------------------------------------------------------------ life
    @classmethod
    def create(cls, store_dir: str) -> "PositionTable":
        """Supervisor only: create the segment, replacing a stale one (the caller holds
        the store's lock, so any segment of that name belongs to a dead run)."""
        name = segment_name(store_dir)
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=SEGMENT_SIZE)
        table = cls(name, memory, owner=True)
        table._slots[Slot.MAGIC] = MAGIC_VALUE
        return table

    @classmethod
    def attach(cls, store_dir: str) -> "PositionTable":
        """Map the running store's segment. Raises ``PositionTableError`` when no
        supervisor has created one (the store is not running)."""
        name = segment_name(store_dir)
        try:
            memory = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise PositionTableError(f"no running store at {store_dir} "
                                     f"(shared memory {name} does not exist)") from None
        table = cls(name, memory, owner=False)
        if table.get(Slot.MAGIC) != MAGIC_VALUE:
            table.close()
            raise PositionTableError(f"shared memory {name} is not a position table")
        return table

    def close(self) -> None:
        if self._slots is not None:
            self._slots.release()
            self._slots = None
            self._map.close()

    def unlink(self) -> None:
        """Supervisor only, at a clean stop."""
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass

    # ------------------------------------------------------------------ slots
    def get(self, slot: int) -> int:
        return self._slots[slot]

    def set(self, slot: int, value: int) -> None:
        """Store one slot; the caller must be the slot's writer (see the table)."""
        self._slots[slot] = value

    def publish_written(self, written: int, last_store_ts: int) -> None:
        """Writer only: publish the CommitLog end and the store time that goes with it."""
        slots = self._slots
        seq = slots[Slot.WRITTEN_SEQ]
        slots[Slot.WRITTEN_SEQ] = seq + 1
        slots[Slot.WRITTEN] = written
        slots[Slot.LAST_STORE_TS] = last_store_ts
        slots[Slot.WRITTEN_SEQ] = seq + 2

    def read_written(self) -> tuple[int, int]:
        """A consistent (WRITTEN, LAST_STORE_TS) pair."""
        slots = self._slots
        while True:
            seq = slots[Slot.WRITTEN_SEQ]
            if seq & 1 == 0:
                pair = slots[Slot.WRITTEN], slots[Slot.LAST_STORE_TS]
                if slots[Slot.WRITTEN_SEQ] == seq:
                    return pair

    def confirm_offset(self) -> int:
        """How far dispatch and readers may go: FLUSHED under SYNC_FLUSH, else WRITTEN."""
        if self.get(Slot.FLUSH_DISK_TYPE) == 1:
            return min(self.get(Slot.FLUSHED), self.get(Slot.WRITTEN))
        return self.get(Slot.WRITTEN)

    # ------------------------------------------------------------------ processes
    @staticmethod
    def process_slot(name: str, field: int) -> int:
        return PROCESS_BASE + PROCESS_NAMES.index(name) * PROCESS_SLOTS + field

    def set_process(self, name: str, field: int, value: int) -> None:
        """HEARTBEAT_MS: the named process only; every other field: the supervisor."""
        self._slots[self.process_slot(name, field)] = value

    def get_process(self, name: str, field: int) -> int:
        return self._slots[self.process_slot(name, field)]

    def heartbeat(self, name: str) -> None:
        """The named process only: its loop turned."""
        self._slots[self.process_slot(name, HEARTBEAT_MS)] = now_ms()

    def snapshot(self) -> dict:
        """Every slot by name, for ``rocketstore status``."""
        out = {s.name.lower(): self.get(s) for s in Slot if s is not Slot.MAGIC}
        out["processes"] = {
            name: {"pid": self.get_process(name, PID),
                   "state": ProcessState(self.get_process(name, PROC_STATE)).name,
                   "restarts": self.get_process(name, RESTARTS),
                   "started_ms": self.get_process(name, STARTED_MS),
                   "heartbeat_ms": self.get_process(name, HEARTBEAT_MS)}
            for name in PROCESS_NAMES}
        return out
