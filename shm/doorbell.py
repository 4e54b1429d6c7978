"""The doorbells: POSIX named semaphores that wake the dispatcher (``DISPATCH``) and the
flusher (``FLUSH``) when what they follow moves.

The bus (``shm.bus``) wakes a listener through ZeroMQ: a PUB send in the writer, then
the writer's and the listener's ZeroMQ I/O threads, then the listener's poll. For the
dispatcher, woken after every append the writer makes, that chain cost more CPU than
the append itself (measured on two cores, one message sent at a time: without the
writer's APPENDED the writer spent about 25 us less per send and the dispatcher 15 us
less). A semaphore in shared memory wakes the waiting thread directly:

    writer (after WRITTEN is published)          dispatcher
    -----------------------------------------    -----------------------------------
    ring(): post only when the count is 0        wait(ms): take one post, or time out;
    (a count read, no system call, while the      then read the position table (the
    dispatcher is busy or has a wake pending)     truth), as after a bus wake-up

The count stays at most about 1 however many appends ring it (one pending wake covers
every append before the dispatcher reads the table). No wake-up is lost: the writer
publishes WRITTEN before it reads the count; a dispatcher that took the post reads the
table after, so it sees that WRITTEN or a later one, and one whose wait began after a
skipped post finds the count at 1 and returns at once. The doorbell only wakes: a
dispatcher whose wait timed out reads the table as well.

The dispatcher's doorbell is rung by the process that moves its confirm offset: the
writer after an append under ASYNC_FLUSH (as drawn above), the flusher after FLUSHED
under SYNC_FLUSH and after COMMITTED with the transient pool (the same rule: the table
first, then the ring).

The flusher's doorbell is rung where the writer announces what the flusher listens for
(``procs.flusher``): every append under SYNC_FLUSH (a synchronous send's answer waits for
that wake-up, the group commit's fdatasync and the flusher's FLUSHED: one ZeroMQ hop less
on its path), an append that crossed ``flush_commit_log_least_pages`` pages under
ASYNC_FLUSH.

Life: the supervisor creates them with the position table (``create_all``, replacing a
dead run's) and removes them with the table at a clean stop (``unlink_all``); the writer,
the dispatcher and the flusher open theirs (``Doorbell.open``: None where no supervisor
made one, e.g. a process run alone in a test, which then uses the bus). A killed process
holds nothing: the count is a number of pending wakes, not a lock.
"""

from __future__ import annotations

import posix_ipc

from rocketstore.shm.positions import segment_name
from rocketstore.storage import file_modes

DISPATCH = "dispatch"          # whoever moves the dispatcher's confirm offset rings it
FLUSH = "flush"                # the writer rings the flusher
NAMES = (DISPATCH, FLUSH)


def semaphore_name(store_dir: str, name: str = DISPATCH) -> str:
    """The semaphore's name: the position table's segment name and ``name``, so every
    process of one store finds the same one and two stores never share one."""
    return f"{segment_name(store_dir)}-{name}"


def create(store_dir: str, name: str = DISPATCH) -> None:
    """Supervisor only (it holds the store's lock): make the doorbell, count 0,
    replacing one a dead run left."""
    unlink(store_dir, name)
    sem = posix_ipc.Semaphore(semaphore_name(store_dir, name), posix_ipc.O_CREX,
                              mode=file_modes.file_mode(), initial_value=0)
    sem.close()


def unlink(store_dir: str, name: str = DISPATCH) -> None:
    """Remove the doorbell (a clean stop, or before ``create``); nothing if none."""
    try:
        posix_ipc.unlink_semaphore(semaphore_name(store_dir, name))
    except posix_ipc.ExistentialError:
        pass


def create_all(store_dir: str) -> None:
    """Supervisor only: every doorbell of the store (``create``)."""
    for name in NAMES:
        create(store_dir, name)


def unlink_all(store_dir: str) -> None:
    """Every doorbell of the store removed (``unlink``)."""
    for name in NAMES:
        unlink(store_dir, name)


class Doorbell:
    """One process's handle on a store's doorbell."""

    def __init__(self, semaphore: posix_ipc.Semaphore):
        self._sem = semaphore

    @classmethod
    def open(cls, store_dir: str, name: str = DISPATCH) -> "Doorbell | None":
        """The store's doorbell, or None when no supervisor made one."""
        try:
            return cls(posix_ipc.Semaphore(semaphore_name(store_dir, name)))
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
            return None

    def ring(self) -> None:
        """Wake the waiter, unless a wake is pending already (then no system call)."""
        sem = self._sem
        if not sem.value:
            sem.release()

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a ring; whether one came (False on the timeout,
        or when a signal cut the wait short: the caller's loop looks at its stop flag
        and the table either way)."""
        sem = self._sem
        try:
            sem.acquire(max(0, timeout_ms) / 1000)
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return False
        if sem.value:               # a second post raced the first: one wake covers both
            try:
                sem.acquire(0)
            except posix_ipc.BusyError:
                pass
        return True

    def close(self) -> None:
        self._sem.close()
