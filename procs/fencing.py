"""Fencing: in controller mode, a store answers PUT_OK only while it holds the group's lease.

A broker group (``procs.controller``) elects its master in ZooKeeper. A master cut off
from ZooKeeper (a network partition, a pause: SIGSTOP, swap, a long GC of a JVM
neighbour) may already have been replaced when it next looks; it must not go on
acknowledging then, or two masters would both answer PUT_OK and two histories would
begin. So the controller grants the writer a *lease*, MASTER_LEASE_MS in the position
table (CLOCK_MONOTONIC milliseconds, the same clock in every process of the machine):

    lease = t0 + cluster_session_timeout_ms * LEASE_FRACTION

where ``t0`` is when the controller *sent* a read of the group's master node that came
back naming this store under the controller's live session. ZooKeeper expires a session
only after ``cluster_session_timeout_ms`` without hearing from it, and it heard from it
after ``t0``; no other member can be elected before that expiry, so the lease ends
before another master can exist. The writer checks it twice (``Fence.reason``):

- when a put arrives: refused with SERVICE_NOT_AVAILABLE, the reason starting
  ``NOT_MASTER``, nothing stored;
- when a reply is sent: every PUT_OK of it becomes SERVICE_NOT_AVAILABLE (the records
  may sit in this store's CommitLog, but a store that is not the master does not vouch
  for them: when it rejoins as a slave they are cut into ``quarantine/`` unless the new
  master holds them too; an idempotent producer's resend to the new master is stored
  once).

The HA frames carry the group's epoch (docs/PROTOCOL.md §10). When the HA process of
a master hears of a newer epoch than its own (a slave's HELLO, or a slave refusing its
stream as STALE_EPOCH) it announces ``NEWER_EPOCH`` on its bus, and again at each
refusal; the controller, hearing it, ends the lease and renews none for
``cluster_session_timeout_ms`` after the last announcement (within that time ZooKeeper
names the master of the newer epoch, if there is one; a slave that merely claims one
holds the group up no longer than that).

A planned hand-over (``procs.handover``) holds the lease at ``HANDING_OVER`` (1: a time
already past, so no PUT_OK either) from the moment the master accepts the request until
it ends: the writer refuses with a reason that says so, and clients look for the
master again as they do on any ``NOT_MASTER``.

A paused writer that wakes up reads the clock after the pause, past the lease: nothing
it answers after waking is PUT_OK. Without ``enable_controller_mode`` the fence is open
and costs nothing.
"""

from __future__ import annotations

from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage.clock import monotonic_ms
from rocketstore.storage.config import StoreConfig

LEASE_FRACTION = 0.6     # of the session timeout: what clock rates and a slow turn may eat
NOT_MASTER = "NOT_MASTER"
NEWER_EPOCH = b"newer_epoch\0"   # bus topic, HA -> controller: int64 epoch (shm.bus)
HANDING_OVER = 1         # MASTER_LEASE_MS while this master hands the group over


class Fence:
    """The writer's view of the lease (read from the position table at each check)."""

    __slots__ = ("enabled", "table")

    def __init__(self, config: StoreConfig, table: PositionTable, role: str):
        self.enabled = config.enable_controller_mode and role != "SLAVE"
        self.table = table

    def reason(self) -> str | None:
        """Why this store may not acknowledge puts now, or None when it may."""
        if not self.enabled:
            return None
        lease = self.table.get(Slot.MASTER_LEASE_MS)
        if monotonic_ms() < lease:
            return None
        if lease == HANDING_OVER:
            return (f"{NOT_MASTER}: this store is handing its group's mastership over to "
                    "another member (a planned switch); ask the group for its master")
        if lease == 0:
            return (f"{NOT_MASTER}: this store is not its group's master (or has not heard "
                    "so from ZooKeeper yet); ask the group for its master")
        return (f"{NOT_MASTER}: this store's lease as its group's master ended (ZooKeeper "
                "not heard from in time); another member may be master now")


def holds_lease(lease: int) -> bool:
    """Whether a MASTER_LEASE_MS value is a lease granted (not 0 or HANDING_OVER),
    ended or not."""
    return lease > HANDING_OVER


def lease_until(sent_ms: int, session_timeout_ms: int) -> int:
    """The lease a master node read sent at ``sent_ms`` grants."""
    return sent_ms + int(session_timeout_ms * LEASE_FRACTION)
