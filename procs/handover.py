"""A planned hand-over of a broker group's mastership (``rocketstore promote`` on a group
member; RocketMQ 5's ElectMaster with a broker named): the master stops taking puts, a
slave of the in-sync set catches up to its end and becomes master at the next epoch,
and the old master follows it as a SLAVE.

The request is one persistent node, ``handover`` (``wire.group_nodes``), holding

    {"from": master's broker_id, "to": broker_id, "epoch": E, "timeout_ms": T,
     "state": S, "end": CommitLog offset (from FENCED on), "why": text}

and each step is a version-checked write of it:

    state      written by         meaning, and what comes next
    ---------  -----------------  -------------------------------------------------------
    REQUESTED  the command        ``from``, the master at epoch E, is asked to hand over
                                  to ``to``
    REFUSED    the master         ``to`` is not a registered member of the in-sync set
                                  it keeps (the command checked first; this is the
                                  master's own check): nothing changed
    FENCED     the master         it answers no PUT_OK (MASTER_LEASE_MS =
                                  ``fencing.HANDING_OVER``; the writer refuses puts
                                  SERVICE_NOT_AVAILABLE, ``NOT_MASTER``), its writer
                                  turned since (``writer_quiet``), and its CommitLog
                                  ends at ``end``
    (deleted)  ``to``             ``to`` holds ``end``: in one transaction it deletes
                                  this node, replaces the master node by its own,
                                  raises the epoch to E + 1 and writes an in-sync set
                                  of itself; then it restarts as a master and the old
                                  master, seeing the master node, as its SLAVE
    ABORTED    the master         ``to`` did not take over within T ms of FENCED (it
                                  died, fell behind, lost ZooKeeper): the master takes
                                  puts again
    (deleted)  the command        it gave up (``--timeout``, Ctrl-C) before FENCED was
                                  answered; a master that had fenced takes puts again

Invariant: **never two masters that both answer PUT_OK.** The takeover and the abort
are both conditional on the version FENCED wrote, so exactly one of them happens. The
master grants itself no lease from the moment it accepts a request until the request
is over (its ABORTED written, or the node gone), and then only from a read of the
master node sent after that: a read sent before could name it although ``to`` took
over meanwhile. A request of an older epoch than the group's (its master died and
another was elected) is stale: nobody acts on it, and the master deletes it.

``choose`` is the rule for which member takes over; ``ask`` and ``withdraw`` are the
command's side of the node; the controller (``procs.controller``) plays the master's
and the taker's.
"""

from __future__ import annotations

from rocketstore.wire import group_nodes as nodes

REQUESTED, FENCED, REFUSED, ABORTED = "REQUESTED", "FENCED", "REFUSED", "ABORTED"
OVER = (REFUSED, ABORTED)        # the outcome of the last request, kept for the command
DEFAULT_TIMEOUT_MS = 10_000      # FENCED until ABORTED, unless ``to`` took over
WRITER_QUIET_MS = 2_000          # the longest wait for the writer's next turn


class HandOverRefused(Exception):
    """The group cannot hand over as asked; the message says why. Nothing changed."""


def choose(group: str, master_id: int, members: dict[int, dict], in_sync: list[int],
           wanted: int | None = None) -> int:
    """The member to take over from ``master_id``, as a decision table:

        wanted          the member                  verdict
        --------------  --------------------------  ------------------------------------
        none            the registered slaves of    the greatest end (then the lowest
                        the in-sync set             broker_id); none: refused
        the master      -                           refused: it is master already
        a member        not registered              refused
        a member        not in the in-sync set      refused: a switch to it could lose
                                                    acknowledged messages
        a member        in the in-sync set          it

    ``members``: the registered members' documents by broker_id (``end`` each);
    ``in_sync``: the group's in-sync set. Raises ``HandOverRefused``."""
    master_end = members.get(master_id, {}).get("end", 0)
    if wanted is None:
        slaves = [b for b in in_sync if b != master_id and b in members]
        if not slaves:
            raise HandOverRefused(
                f"no slave of broker group {group} is in its in-sync set {in_sync}: none "
                f"holds all member {master_id} acknowledged (registered: "
                f"{sorted(members)})")
        return max(slaves, key=lambda b: (members[b].get("end", 0), -b))
    if wanted == master_id:
        raise HandOverRefused(f"member {wanted} is the master of broker group {group} "
                              "already")
    if wanted not in members:
        raise HandOverRefused(f"member {wanted} is not a registered member of broker group "
                              f"{group} (registered: {sorted(members)})")
    if wanted not in in_sync:
        behind = max(0, master_end - members[wanted].get("end", 0))
        raise HandOverRefused(
            f"member {wanted} is not in the in-sync set {in_sync} of broker group {group} "
            f"({behind} bytes behind member {master_id}): it may lack messages the master "
            "acknowledged; wait until it is back in the set, or choose another")
    return wanted


def read(zk, path: str) -> tuple[dict, object]:
    """``(document, stat)`` of a node; ``({}, None)`` when it does not exist."""
    from kazoo.exceptions import NoNodeError
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return {}, None
    return nodes.decode(data), stat


def members(zk, group: str) -> dict[int, dict]:
    """The registered members' documents, by broker_id."""
    from kazoo.exceptions import NoNodeError
    out = {}
    try:
        children = zk.get_children(nodes.members_path(group))
    except NoNodeError:
        return out
    for child in children:
        doc, stat = read(zk, nodes.member_path(group, int(child)))
        if stat is not None and isinstance(doc.get("broker_id"), int):
            out[doc["broker_id"]] = doc
    return out


def ask(zk, group: str, wanted: int | None, timeout_ms: int) -> tuple[dict, int]:
    """Create the request (``zk``: a started KazooClient): the master now, the member
    ``choose`` picks. A node left by an earlier request that is over (REFUSED,
    ABORTED, or of an older epoch) is replaced; one under way is not. Returns the
    request and its node's version; raises ``HandOverRefused``."""
    from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
    master, stat = read(zk, nodes.master_path(group))
    if stat is None or not isinstance(master.get("broker_id"), int):
        raise HandOverRefused(f"broker group {group} has no master now: nothing to hand "
                              "over (an election may be under way)")
    sync, _ = read(zk, nodes.sync_state_set_path(group))
    in_sync = [b for b in sync.get("members", []) if isinstance(b, int)] \
        if sync.get("epoch") == master.get("epoch") else [master["broker_id"]]
    found = members(zk, group)
    to = choose(group, master["broker_id"], found, in_sync, wanted)
    doc = {"from": master["broker_id"], "to": to, "epoch": master["epoch"],
           "timeout_ms": timeout_ms, "state": REQUESTED}
    path = nodes.handover_path(group)
    for _ in range(3):
        left, left_stat = read(zk, path)
        try:
            if left_stat is None:
                zk.create(path, nodes.encode(doc), makepath=True)
                return doc, 0
            if left.get("state") not in OVER and left.get("epoch") == master["epoch"]:
                raise HandOverRefused(
                    f"a hand-over of broker group {group} is under way already (member "
                    f"{left.get('from')} to member {left.get('to')}, {left.get('state')})")
            return doc, zk.set(path, nodes.encode(doc), version=left_stat.version).version
        except (NodeExistsError, BadVersionError, NoNodeError):
            continue        # another command was quicker: look again
    raise HandOverRefused(f"the hand-over node of broker group {group} keeps changing: "
                          "another command is asking too")


def withdraw(zk, group: str, version: int) -> bool:
    """Delete the request if it is still at ``version`` (the master has not answered
    it since); whether it was."""
    from kazoo.exceptions import BadVersionError, NoNodeError
    try:
        zk.delete(nodes.handover_path(group), version=version)
    except (BadVersionError, NoNodeError):
        return False
    return True
