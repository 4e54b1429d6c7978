"""The writer's ZeroMQ I/O thread: SCHED_BATCH while requests come in together.

Every request reaches the writer's main thread through the I/O thread of its ZeroMQ
context (libzmq names it ``ZMQbg/IO/<n>``), and every reply leaves through it; the two
share the writer's CPU (``procs.affinity``). Under the kernel's usual policy a woken
thread preempts the one running, so with many producers waiting each on its answer the
I/O thread wakes and preempts the writer once for every request that arrives while a
drain is served and once for every reply the drain sends (each reply goes to another
peer, and wakes it anew): two context switches apiece, and the writer's caches turned
over each time. Under SCHED_BATCH (``sched(7)``) a woken thread does not preempt: the
I/O thread runs when the writer waits for the next request, reads everything that
arrived meanwhile, and sends the drain's replies in one pass.

One producer sending one at a time wants the opposite: its reply should leave the moment
it is sent, before the writer's bookkeeping after the replies (the statistics, the
doorbells), which under SCHED_BATCH it waits out. So the policy follows the drains
(``IoThreadPolicy.drained``): SCHED_BATCH from the first drain of several requests,
back to SCHED_OTHER at the first drain of one once no drain of several came for
``HOLD_S``. A change is one ``sched_setscheduler`` a thread; a steady load makes none.

Measured on two cores, one store, the policy switched every 0.5 s under a running load
(20 s each): eight producer processes sending one at a time 11.5 % more messages a
second under SCHED_BATCH (24.6 k against 22.0 k); one producer 4 % fewer (9.4 k against
9.8 k), which is why one producer's drains put it back.

Where the threads cannot be found (a libzmq that does not name them) or the kernel
refuses (a seccomp profile, another platform), nothing changes and the writer says so
once; ``writer_io_batching = false`` turns it off.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

HOLD_S = 0.010          # SCHED_BATCH kept this long after the last drain of several
SMALL_REQUEST = 16      # records a request, on average, of a drain that counts as several
IO_THREAD_NAME = "ZMQbg/IO/"
_PARAM = os.sched_param(0) if hasattr(os, "sched_param") else None


def io_thread_ids(pid: int | None = None) -> list[int]:
    """The native ids of the ZeroMQ I/O threads of process ``pid`` (this one by
    default), found by the name libzmq gives them (``ZMQbg/IO/<n>``, after any
    ZMQ_THREAD_NAME_PREFIX); empty where /proc is not there."""
    pid = os.getpid() if pid is None else pid
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read()
        except OSError:         # ended meanwhile
            continue
        if IO_THREAD_NAME in name:
            found.append(int(task))
    return sorted(found)


def _usual(tid: int) -> bool:
    """Whether thread ``tid`` runs under the usual policy (SCHED_OTHER): one an operator
    gave another (``chrt``) is left as it is."""
    try:
        return os.sched_getscheduler(tid) == os.SCHED_OTHER
    except OSError:
        return False


class IoThreadPolicy:
    """SCHED_BATCH for ``tids`` while drains of several requests come, SCHED_OTHER
    otherwise (the module says why); threads not under SCHED_OTHER to begin with are
    left alone. ``batching`` is the policy now."""

    def __init__(self, tids: list[int]):
        self.tids = [tid for tid in tids if _usual(tid)] if _PARAM is not None else []
        self.batching = False
        self.last_several = 0.0     # time.monotonic() of the last drain of several

    def drained(self, requests: int, records: int, now: float) -> None:
        """A drain of ``requests`` holding ``records`` taken at ``now``
        (``time.monotonic()``), before it is served: its replies go out under the policy
        this sets. Only small requests count as several (at most ``SMALL_REQUEST``
        records each on average): the I/O thread that reads large frames while the
        writer appends the ones before saves the writer a wait."""
        if requests > 1 and records <= requests * SMALL_REQUEST:
            self.last_several = now
            if not self.batching and self.tids:
                self._set(True)
        elif self.batching and now - self.last_several > HOLD_S:
            self._set(False)

    def _set(self, batching: bool) -> None:
        policy = os.SCHED_BATCH if batching else os.SCHED_OTHER
        try:
            for tid in self.tids:
                os.sched_setscheduler(tid, policy, _PARAM)
        except OSError as e:
            log.warning("the writer's I/O thread keeps its scheduling policy (%s): "
                        "requests that come together are not read together", e)
            self.tids = []
            return
        self.batching = batching
