"""Where the store's processes run: their names, and the writer's CPU.

Every store process names itself ``rs-<name>`` (``name_process``: the kernel's name of
its main thread, what ``ps``, ``top`` and ``/proc/PID/comm`` show), so an operator tells
the writer from the dispatcher at a glance.

The writer is kept on one CPU (``writer_cpu_affinity``, on by default). A one-message
send is a chain of short runs of several threads (the producer, its ZeroMQ I/O thread,
the writer's I/O thread, the writer), each woken by the one before. Left to the
scheduler, the writer wakes on whichever CPU the chain reached, its caches filled by
whatever ran there last; a send's few dozen microseconds of Python then cost up to half
again as much. Measured on two cores, one producer sending one at a time (three pairs
in turn): the writer's main thread 40-49 us per send and 7.2-7.9 k sends/s free, 32-38
us and 8.6-9.9 k sends/s kept on one CPU. Engines built for low latency keep their threads on CPUs for the same
reason (Seastar's shard per core); like them, this one is a choice an operator can undo.

The CPU (``choose_cpu``): ``writer_cpu`` when set (-1, the default, lets the store
choose); else, of the CPUs the writer may use (its affinity when it starts: a cgroup's or
``taskset``'s limits hold), the one fewest other stores' writers are kept on, the
highest of those (CPU 0 often takes most interrupts). Other writers are found by their
names (``writers_kept``). With a single CPU to use nothing is pinned. Two stores started
at the same instant may choose the same CPU; each still works, the second's sends a
little slower. The threads the writer starts later (ZeroMQ's, the allocation thread)
inherit its CPU, so ``keep_writer`` runs before it makes any. Its ZeroMQ I/O thread
belongs there: moved off the writer's CPU alone, one producer made 5.8-7.4 k sends/s
against 8.8-9.4 k (three rounds).

The allocation thread does not (``free_thread``: it runs on the CPUs the writer could
use but the writer's own). Its read-ahead brings the next 32 MiB of the CommitLog into
the page cache at once (``storage.allocate``); a fresh page is slow to touch on a
virtual machine, and one 1 MiB read took up to 18 ms of CPU here. On the writer's CPU
that took the writer's turn: at 4,000 messages a second in frames of 20, five 20 s runs
in seven stalled send -> visible 16-29 ms at the same point of the CommitLog (32 MiB
in); moved off, at most 10 ms in eight runs, and none in four (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import Counter

log = logging.getLogger(__name__)

PREFIX = "rs-"                 # every store process's name starts with it
WRITER_NAME = PREFIX + "writer"
_PR_SET_NAME = 15
_TASK_COMM_LEN = 16            # the kernel keeps 15 bytes and a NUL


def process_name(name: str) -> str:
    """The name a store process ``name`` gives itself (cut to the kernel's 15 bytes)."""
    return (PREFIX + name)[:_TASK_COMM_LEN - 1]


def name_process(name: str) -> None:
    """Name this process's main thread ``process_name(name)``; nothing where prctl is
    not there."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, process_name(name).encode(), 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("prctl(PR_SET_NAME) unavailable: this process keeps its name")


def writers_kept(exclude: int = 0) -> Counter:
    """How many store writers (``rs-writer`` processes other than ``exclude``) are kept
    on each CPU: only those allowed a single CPU count."""
    kept: Counter = Counter()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().rstrip("\n") != WRITER_NAME:
                    continue
            cpus = os.sched_getaffinity(int(entry))
        except OSError:         # gone meanwhile, or not ours to look at
            continue
        if len(cpus) == 1:
            kept[next(iter(cpus))] += 1
    return kept


def choose_cpu(allowed: set[int], wanted: int, kept: Counter) -> int | None:
    """The writer's CPU: ``wanted`` when it is not -1; else None for a single allowed
    CPU, or the allowed CPU with the fewest ``kept`` writers, the highest of those."""
    if wanted != -1:
        return wanted
    if len(allowed) < 2:
        return None
    return min(allowed, key=lambda cpu: (kept[cpu], -cpu))


def keep_writer(enabled: bool, wanted: int) -> int | None:
    """Keep this process (the writer, before it starts threads) on its CPU; returns the
    CPU, None when it runs free. A CPU it may not use is refused by the kernel, logged,
    and the writer runs free."""
    if not enabled:
        return None
    kept = writers_kept(exclude=os.getpid())
    cpu = choose_cpu(os.sched_getaffinity(0), wanted, kept)
    if cpu is None:
        return None
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as e:
        log.warning("writer_cpu %d cannot be used here (%s): the writer runs on any CPU",
                    cpu, e)
        return None
    log.info("the writer is kept on CPU %d (other stores' writers kept on each CPU: %s)",
             cpu, dict(sorted(kept.items())))
    return cpu


def free_thread(native_id: int | None, cpus: frozenset[int]) -> None:
    """Let the writer's thread ``native_id`` run on ``cpus`` (those the writer could use
    before ``keep_writer``, but its own); nothing when there are none (the writer runs
    free, or had a single CPU). A refusal is logged: the thread stays where it was."""
    if native_id is None or not cpus:
        return
    try:
        os.sched_setaffinity(native_id, cpus)
    except OSError as e:
        log.warning("thread %d cannot be moved off the writer's CPU (%s)", native_id, e)
