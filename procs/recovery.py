"""Bringing a store's files and shared memory to a state its processes can start from.

The supervisor runs this before any child starts (and only then), holding the store's
``lock`` file. It decides what to do before the files are opened by table S of
storage/recovery_plan.py (``recovery_plan.plan_start``), from what it finds: a
transient store pool that a run which died whole left (its table records one), and a
cut a diverged slave asked for (``storage.replication.request_cut``). It runs the row's
steps in order: the pool's bytes past the dead run's COMMITTED are acknowledged and
worth more than the files, so they are copied in first
(``shm.transient_pool.commit_left_behind``) and the old buffers unlinked; then the cut
(``storage.replication.apply_cut``), so recovery finds the CommitLog ending at the
common prefix.

Then it runs the embedded store's recovery (table R of the same module, chosen and
logged by ``MessageStore.load``: abnormal when ``abort`` exists), which also
re-dispatches whatever the consume queues and the index miss, flushes everything, and
hands the files over with ``abort`` in place (the run is on). Last it makes the position
table anew, whatever held its name (a dead run's table or a foreign segment is unlinked),
makes the pool anew when configured, and fills the table from the recovered files, in
one ``PositionTable.reset`` (the only way a slot may move back, allowed to the
supervisor's table before any process runs):

    WRITTEN = FLUSHED = COMMITTED = DISPATCHED = the CommitLog end; LAST_STORE_TS = the
    checkpoint's physic time; MIN_OFFSET = the first CommitLog byte on disk;
    FLUSH_DISK_TYPE, TRANSIENT_POOL and ROLE from the configuration; STATE = STARTING;
    GENERATION = the start time in ms (unique per start).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import NamedTuple

from rocketstore.client.consumer import GROUPS_DIR
from rocketstore.procs.stats import remove_published
from rocketstore.shm import arrival_bell, doorbell
from rocketstore.shm.positions import (
    PositionTable, Slot, StoreState, now_ms, process_start_ticks, segment_name, segment_state,
    unlink_segment)
from rocketstore.shm.transient_pool import TransientStorePool, commit_left_behind
from rocketstore.storage import MessageStore, StoreConfig
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage import recovery_plan, replication
from rocketstore.storage.recovery_plan import StartInputs, StartRow, StartStep, TableState
from rocketstore.storage.store_lock import StoreLock
from rocketstore.storage import file_modes

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Recovered:
    table: PositionTable
    lock: StoreLock
    last_exit_ok: bool
    pool: TransientStorePool | None = None   # created (and locked) when enabled


def recover_and_publish(config: StoreConfig) -> Recovered:
    """Lock the store, recover it, create and fill the position table.

    Raises ``StoreLockedError`` when another process holds the store, and any
    ``StoreError`` recovery raises (the lock is released again).
    """
    root = config.store_path_root_dir
    file_modes.use_umask(config.data_umask)
    file_modes.make_dirs(root)
    file_modes.make_shared_dirs(os.path.join(root, GROUPS_DIR))  # consumers of the group join
    lock = StoreLock(root)
    lock.acquire()
    pool = table = None
    try:
        found, start = _before_the_files(config)
        store = MessageStore(dataclasses.replace(config, transient_store_pool_enable=False,
                                                 broker_role="ASYNC_MASTER"),
                             take_lock=False)   # recovery is the same for every role
        store.load()
        last_exit_ok = store.last_exit_ok
        written = store.commit_log.get_max_offset()
        min_offset = max(store.commit_log.get_min_offset(), 0)
        store.close(remove_abort_file=False)
        physic_ts = store.checkpoint.physic_msg_timestamp
        table = PositionTable.create(root)  # unlinks whatever holds the name first
        doorbell.create_all(root)           # the same: a dead run's are replaced
        arrival_bell.create(root)           # and the consumers' bells
        if config.transient_store_pool_enable:
            pool = TransientStorePool(root, config.transient_store_pool_size,
                                      config.mapped_file_size_commit_log, create=True)
            pool.lock()
    except BaseException:
        if table is not None:       # a table never filled in must not outlive the start
            table.close()
            unlink_shared(root)
        lock.release()
        raise
    table.reset({Slot.SUPERVISOR_PID: os.getpid(),
                 Slot.SUPERVISOR_START: process_start_ticks(os.getpid()),
                 Slot.GENERATION: now_ms(),  # unique per start: clients notice a restart
                 Slot.FLUSH_DISK_TYPE: 1 if config.sync_flush else 0,
                 Slot.TRANSIENT_POOL: pool.size if pool else 0,
                 Slot.ROLE: BROKER_ROLES.index(config.broker_role),
                 Slot.WRITTEN: written, Slot.LAST_STORE_TS: physic_ts,
                 Slot.FLUSHED: written, Slot.COMMITTED: written, Slot.DISPATCHED: written,
                 Slot.MIN_OFFSET: min_offset, Slot.STATE: StoreState.STARTING})
    log.info("recovered %s (%s exit): end %d, first %d; start row %s (%s); position "
             "table made anew (found %s)", root, "clean" if last_exit_ok else "unclean",
             written, min_offset, start.label, start.action, found.value)
    return Recovered(table, lock, last_exit_ok, pool)


def unlink_shared(root: str) -> None:
    """What a start made in shared memory for the store at ``root`` removed: the
    position table, the doorbells, the consumers' arrival bells, and the statistics its
    processes published; each that is not there is passed over. A clean stop's last
    step, and what a reboot does (a table left behind is only a killed run's)."""
    unlink_segment(segment_name(root))
    doorbell.unlink_all(root)
    arrival_bell.unlink(root)
    remove_published(root)


def _before_the_files(config: StoreConfig) -> tuple[TableState, StartRow]:
    """Table S: what the start finds, the row ``plan_start`` gives for it, and that
    row's steps run in order. Returns what held the position table's name, and the row."""
    root = config.store_path_root_dir
    found = segment_state(root)
    left = _pool_left_behind(root, found)
    request = replication.requested_cut(config.config_dir)
    start = recovery_plan.plan_start(StartInputs(pool_left_behind=left is not None,
                                                 cut_requested=request is not None))
    steps = {StartStep.COPY_POOL: lambda: _copy_pool_left_behind(config, left),
             StartStep.CUT: lambda: _cut_as_asked(config, request)}
    for step in start.steps:
        steps[step]()
    return found, start


class PoolLeftBehind(NamedTuple):
    """A dead run's transient store pool, as its position table recorded it."""
    size: int
    committed: int
    written: int


def _pool_left_behind(root: str, found: TableState) -> PoolLeftBehind | None:
    """The pool the table a dead run left records (the ``pool_left_behind`` input of
    table S); None when no such table holds the name or it records no pool."""
    if found is not TableState.LEFT_BY_CRASH:
        return None
    old = PositionTable.attach(root, left_behind=True)
    try:
        left = PoolLeftBehind(old.get(Slot.TRANSIENT_POOL), old.get(Slot.COMMITTED),
                              old.get(Slot.WRITTEN))
    finally:
        old.close()
    return left if left.size else None


def _copy_pool_left_behind(config: StoreConfig, left: PoolLeftBehind) -> None:
    """Step copy_pool: the acknowledged bytes the dead run's buffers hold past its
    COMMITTED go into the files before they are recovered; the old buffers go."""
    root = config.store_path_root_dir
    commit_left_behind(root, left.size, config.mapped_file_size_commit_log, left.committed,
                       left.written, config.commit_log_dir)
    TransientStorePool.unlink(root, left.size)


def _cut_as_asked(config: StoreConfig, request: dict) -> None:
    """Step cut: the CommitLog cut back where a diverged slave asked, loudly."""
    cut = replication.apply_cut(config, request)
    log.error("CommitLog cut back to %d as replication asked (%s); the cut bytes are in %s",
              cut["offset"], ", ".join(f"{k} {v}" for k, v in cut.items()
                                       if k not in ("offset", "quarantine")),
              cut["quarantine"])
