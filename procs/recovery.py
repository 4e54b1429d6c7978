"""Bringing a store's files and shared memory to a state its processes can start from.

The supervisor runs this before any child starts (and only then): it holds the store's
``lock`` file, runs the embedded store's recovery (abnormal when ``abort`` exists: see
storage.message_store), which also re-dispatches whatever the consume queues and the
index miss, flushes everything, and hands the files over with ``abort`` in place (the
run is on); the store logs the recovery rows it took (storage/recovery_plan.py, C and L).
Then it creates the position table (row T1), or replaces what a crash left (T2), and
fills it from the recovered files, in one ``PositionTable.reset`` (the only way a
slot may move back, allowed to the supervisor's table before any process runs):

    WRITTEN = FLUSHED = COMMITTED = DISPATCHED = the CommitLog end; LAST_STORE_TS = the
    checkpoint's physic time; MIN_OFFSET = the first CommitLog byte on disk;
    FLUSH_DISK_TYPE, TRANSIENT_POOL and ROLE from the configuration; STATE = STARTING;
    GENERATION = the start time in ms (unique per start).

A cut a diverged slave asked for (``storage.replication.apply_requested_cut``) is made
first, so recovery finds the CommitLog ending at the common prefix.

Everything in the position table is rebuilt from the files. One thing in shared memory
is worth more than the files: with the transient store pool, a run that died whole
leaves acknowledged bytes in the pool's buffers past its COMMITTED; they are copied into
the files first (``shm.transient_pool.commit_left_behind``), then the pool is made anew.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from rocketstore.client.consumer import GROUPS_DIR
from rocketstore.shm.positions import (
    PositionTable, Slot, StoreState, now_ms, process_start_ticks, segment_state)
from rocketstore.shm.transient_pool import TransientStorePool, commit_left_behind
from rocketstore.storage import MessageStore, StoreConfig
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage import recovery_plan, replication
from rocketstore.storage.recovery_plan import TableState
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
        _commit_pool_left_behind(config)
        cut = replication.apply_requested_cut(config)
        if cut is not None:
            log.error("CommitLog cut back to %d as replication asked (%s); the cut bytes "
                      "are in %s", cut["offset"],
                      ", ".join(f"{k} {v}" for k, v in cut.items()
                                if k not in ("offset", "quarantine")), cut["quarantine"])
        store = MessageStore(dataclasses.replace(config, transient_store_pool_enable=False,
                                                 broker_role="ASYNC_MASTER"),
                             take_lock=False)   # recovery is the same for every role
        store.load()
        last_exit_ok = store.last_exit_ok
        written = store.commit_log.get_max_offset()
        min_offset = max(store.commit_log.get_min_offset(), 0)
        store.close(remove_abort_file=False)
        physic_ts = store.checkpoint.physic_msg_timestamp
        table_row = recovery_plan.table_row(segment_state(root))
        table = PositionTable.create(root)  # T1 creates; T2 unlinks the old one first
        if config.transient_store_pool_enable:
            pool = TransientStorePool(root, config.transient_store_pool_size,
                                      config.mapped_file_size_commit_log, create=True)
            pool.lock()
    except BaseException:
        if table is not None:       # a table never filled in must not outlive the start
            table.close()
            table.unlink()
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
    log.info("recovered %s (%s exit): end %d, first %d; position table %s (%s)", root,
             "clean" if last_exit_ok else "unclean", written, min_offset, table_row.action,
             table_row.label)
    return Recovered(table, lock, last_exit_ok, pool)


def _commit_pool_left_behind(config: StoreConfig) -> None:
    """A run that died whole (the supervisor too) may have left acknowledged bytes in
    its transient store pool past its COMMITTED: copy them into the files before the
    files are recovered, then drop the old buffers."""
    root = config.store_path_root_dir
    if segment_state(root) is not TableState.LEFT_BY_CRASH:
        return
    old = PositionTable.attach(root, left_behind=True)
    try:
        size, committed = old.get(Slot.TRANSIENT_POOL), old.get(Slot.COMMITTED)
        written = old.get(Slot.WRITTEN)
    finally:
        old.close()
    if size:
        commit_left_behind(root, size, config.mapped_file_size_commit_log, committed, written,
                           config.commit_log_dir)
        TransientStorePool.unlink(root, size)
