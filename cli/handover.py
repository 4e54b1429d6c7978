"""``rocketstore promote`` on a member of a broker group (``enable_controller_mode``): a
planned hand-over of the group's mastership, asked for in ZooKeeper (``procs.handover``
has the request's states and who does what).

    rocketstore promote --config MEMBER.toml [--broker-id N] [--handover-timeout S]
                        [--timeout S] [--json]

Any member's settings file serves: it names the group and ZooKeeper. The master hands
over to member N, by default the slave of the in-sync set that holds the most; one out
of the set is refused, nothing changed. One line on stderr for each step seen:

    asked broker group G to hand over from member 0 to member 1 (epoch 3)
    member 0 takes no puts; its CommitLog ends at 123456
    member 1 is master of G at epoch 4 (0.21 s after the request)
    member 1 runs as SYNC_MASTER
    member 0 follows member 1 as its SLAVE

Exit codes: 0 handed over (the new master runs as one, the old follows it); 1 refused
(nothing changed), aborted (the slave did not take over within ``--handover-timeout``:
the old master takes puts again), or not done within ``--timeout``; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rocketstore.cli.commands import say_failure
from rocketstore.procs import handover
from rocketstore.storage import StoreConfig
from rocketstore.wire import group_nodes as nodes

EXIT_OK, EXIT_FAILED = 0, 1
POLL_S = 0.05


def cmd_hand_over(args: argparse.Namespace, config: StoreConfig) -> int:
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    group = config.broker_name
    zk = KazooClient(hosts=config.cluster_address, timeout=config.cluster_session_timeout_ms
                     / 1000)
    try:
        zk.start(timeout=5)
    except KazooTimeoutError:
        return _fail(args, f"ZooKeeper at {config.cluster_address} cannot be reached: no "
                           f"hand-over of broker group {group} asked for")
    try:
        request, version = handover.ask(zk, group, args.broker_id,
                                        int(args.handover_timeout * 1000))
    except handover.HandOverRefused as e:
        _stop(zk)
        return _fail(args, f"{e}; nothing changed")
    except (KazooException, KazooTimeoutError) as e:
        _stop(zk)
        return _fail(args, f"ZooKeeper at {config.cluster_address}: {e or type(e).__name__}"
                           "; no hand-over asked for")
    _say(f"asked broker group {group} to hand over from member {request['from']} to "
         f"member {request['to']} (epoch {request['epoch']})")
    try:
        return _follow(args, zk, group, request, version)
    finally:
        _stop(zk)


def _follow(args: argparse.Namespace, zk, group: str, request: dict, version: int) -> int:
    """Watch the request through to its end, saying each step; withdraw it when given
    up before the master answered."""
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    asked = time.monotonic()
    deadline = asked + args.timeout
    seen: dict = {"version": version, "end": None, "master_at": None, "runs": None,
                  "follows": False}
    try:
        while True:
            try:
                outcome = _step(args, zk, group, request, seen, asked)
            except (KazooException, KazooTimeoutError) as e:
                outcome = None
                seen["zookeeper"] = str(e) or type(e).__name__
            if outcome is not None:
                return outcome
            if time.monotonic() > deadline:
                return _late(args, zk, group, request, seen)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        if seen["master_at"] is None and handover.withdraw(zk, group, seen["version"]):
            return _fail(args, f"interrupted: the hand-over was withdrawn; member "
                               f"{request['from']} takes puts again")
        return _fail(args, "interrupted: the hand-over goes on without this command "
                           "(rocketstore status shows the group)")


def _step(args: argparse.Namespace, zk, group: str, request: dict, seen: dict,
          asked: float) -> int | None:
    """One look at the group: a line for each step newly seen; the exit code once the
    hand-over is over, else None."""
    old, new = request["from"], request["to"]
    doc, stat = handover.read(zk, nodes.handover_path(group))
    master, _ = handover.read(zk, nodes.master_path(group))
    taken = master.get("broker_id") == new and master.get("epoch", 0) > request["epoch"]
    if stat is not None:
        seen["version"] = stat.version
    if not taken and stat is not None and doc.get("to") == new:
        state = doc.get("state")
        if state == handover.FENCED and seen["end"] is None:
            seen["end"] = doc.get("end")
            _say(f"member {old} takes no puts; its CommitLog ends at {seen['end']}")
        elif state == handover.REFUSED:
            return _fail(args, f"member {old} refused the hand-over: {doc.get('why')}; "
                               "nothing changed")
        elif state == handover.ABORTED:
            return _fail(args, f"the hand-over was aborted: {doc.get('why')}; member {old} "
                               "takes puts again")
        return None
    if not taken:
        now = master.get("broker_id"), master.get("epoch")
        what = (f"member {old} is master still: the request was withdrawn"
                if now == (old, request["epoch"]) else
                f"the group's master changed meanwhile (now member {now[0]}, epoch "
                f"{now[1]}): an election")
        return _fail(args, f"the hand-over did not happen: {what}")
    if seen["master_at"] is None:
        if seen["end"] is None:         # FENCED came and went between two looks
            seen["end"] = master.get("start")
            _say(f"member {old} takes no puts; its CommitLog ends at {seen['end']}")
        seen["master_at"] = time.monotonic() - asked
        seen["epoch"] = master["epoch"]
        _say(f"member {new} is master of {group} at epoch {master['epoch']} "
             f"({seen['master_at']:.2f} s after the request)")
    found = handover.members(zk, group)
    role = found.get(new, {}).get("role")
    if seen["runs"] is None and role not in (None, "SLAVE"):
        seen["runs"] = role
        _say(f"member {new} runs as {role}")
    if not seen["follows"] and found.get(old, {}).get("role") == "SLAVE":
        seen["follows"] = True
        _say(f"member {old} follows member {new} as its SLAVE")
    if seen["runs"] and seen["follows"]:
        return _done(args, group, request, seen, time.monotonic() - asked)
    return None


def _late(args: argparse.Namespace, zk, group: str, request: dict, seen: dict) -> int:
    old, new = request["from"], request["to"]
    if seen["master_at"] is not None:
        waiting = [f"member {new} to run as a master"] if not seen["runs"] else []
        waiting += [f"member {old} to follow it"] if not seen["follows"] else []
        return _fail(args, f"member {new} is master of {group} at epoch {seen['epoch']}, "
                           f"but {' and '.join(waiting)} did not happen within "
                           f"{args.timeout} s; see their logs")
    if seen["end"] is None and handover.withdraw(zk, group, seen["version"]):
        return _fail(args, f"member {old} did not answer the request within {args.timeout}"
                           " s: withdrawn, nothing changed")
    lost = f" (ZooKeeper: {seen['zookeeper']})" if "zookeeper" in seen else ""
    return _fail(args, f"the hand-over from member {old} to member {new} did not finish "
                       f"within {args.timeout} s{lost}; member {old} takes puts again once "
                       "it aborts it (--handover-timeout) and ZooKeeper answers")


def _done(args: argparse.Namespace, group: str, request: dict, seen: dict,
          seconds: float) -> int:
    if args.json:
        print(json.dumps({"group": group, "from": request["from"], "to": request["to"],
                          "epoch": seen["epoch"], "end": seen["end"], "role": seen["runs"],
                          "master_after_s": round(seen["master_at"], 3),
                          "seconds": round(seconds, 3)}))
    else:
        print(f"handed over: member {request['to']} is master of {group} at epoch "
              f"{seen['epoch']}, member {request['from']} its SLAVE ({seconds:.2f} s)")
    return EXIT_OK


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _stop(zk) -> None:
    zk.stop()
    zk.close()


def _fail(args: argparse.Namespace, why: str) -> int:
    return say_failure(args, EXIT_FAILED, why, error="NotHandedOver", command="promote")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker-id", type=int, help="a broker group's member to hand over to "
                   "(default: the in-sync slave holding the most)")
    p.add_argument("--handover-timeout", type=float,
                   default=handover.DEFAULT_TIMEOUT_MS / 1000,
                   help="seconds the master takes no puts waiting for the slave to take "
                        "over before it takes them again")
