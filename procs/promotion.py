"""``rocketstore promote``: a SLAVE store becomes a master.

RocketMQ's classic master/slave has no automatic failover: an operator (or a tool of
theirs) promotes a slave. Here:

    rocketstore promote --config FILE [--role ASYNC_MASTER|SYNC_MASTER] [--json]

1. ``broker_role`` is set in FILE's ``[store]`` table (the line is rewritten, comments
   and every other line kept; the file is replaced atomically): the store is a master
   from now on, at every start.
2. A running store is asked (``config/haPromoteRequest.json``, which its supervisor
   looks for every tenth of a second): the supervisor stops its processes, restarts
   them as a master (the writer rebuilds its queue offsets and idempotent producers'
   table from the files and takes puts; the delay scheduler runs; the HA process serves
   slaves when ``ha_listen_port`` is set) and removes the request. The command waits
   until the store runs in its new role. A stopped store is a master at its next
   ``rocketstore up``.

The old master, when it comes back, must be configured as a SLAVE of the new one
(``ha_master_address``): whatever it holds that the new master does not (acknowledged
by it alone, under ASYNC_MASTER) is cut and kept in its ``quarantine/``
(procs.replica's divergence rule). docs/OPERATIONS.md says how to build automatic
failover on ``rocketstore status --json``.

Exit codes: 0 promoted; 1 the store is not a SLAVE, or did not come back in its new role
within ``--timeout`` seconds; 2 bad usage (no --config, a role that cannot work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time

from rocketstore.shm.positions import PositionTable, PositionTableError, Slot, StoreState
from rocketstore.storage import StoreConfig, json_file
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage.errors import StoreConfigError

PROMOTE_REQUEST_FILE = "haPromoteRequest.json"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


def set_role_in_config(path: str, role: str) -> None:
    """Rewrite ``broker_role`` in the ``[store]`` table of the TOML file at ``path``
    (added as the table's first setting when it is not there)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    table = None
    done = False
    for i, line in enumerate(lines):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            if table == "store" and not done:
                break
            table = header.group(1).strip()
            continue
        if table == "store" and re.match(r"\s*broker_role\s*=", line):
            comment = line[line.index("#"):].rstrip("\n") if "#" in line else ""
            lines[i] = f'broker_role = "{role}"' + (f"    {comment}" if comment else "") + "\n"
            done = True
    if not done:
        at = next((i + 1 for i, line in enumerate(lines)
                   if re.match(r"\s*\[store\]", line)), None)
        if at is None:
            lines += ["[store]\n"]
            at = len(lines)
        lines.insert(at, f'broker_role = "{role}"\n')
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def request_path(config_dir: str) -> str:
    return os.path.join(config_dir, PROMOTE_REQUEST_FILE)


def clear_request(config_dir: str) -> None:
    """A master has no promotion to make (the supervisor calls this at each start)."""
    json_file.remove(request_path(config_dir))


def requested_role(config_dir: str) -> str | None:
    """The role a promotion asked for, when one is pending."""
    doc = json_file.load(request_path(config_dir))
    role = (doc or {}).get("role")
    return role if role in MASTER_ROLES else None


def cmd_promote(args: argparse.Namespace, config: StoreConfig, config_path: str | None) -> int:
    if config_path is None:
        return _fail(args, EXIT_USAGE, "promote needs --config FILE: the store's role is "
                                       "written there")
    if not config.slave:
        return _fail(args, EXIT_FAILED, f"the store is not a SLAVE (broker_role "
                                        f"{config.broker_role})")
    try:
        dataclasses.replace(config, broker_role=args.role).check_replication()
    except StoreConfigError as e:
        return _fail(args, EXIT_USAGE, str(e))
    set_role_in_config(config_path, args.role)
    store = config.store_path_root_dir
    if _role_and_state(store) is None:
        return _done(args, store, args.role, running=False)
    json_file.persist(request_path(config.config_dir), {"role": args.role})
    want = (BROKER_ROLES.index(args.role), StoreState.RUNNING)
    deadline = time.monotonic() + args.timeout
    while _role_and_state(store) != want:      # the supervisor makes a new table
        if time.monotonic() > deadline:
            return _fail(args, EXIT_FAILED, f"the store did not come back as {args.role} "
                                            f"within {args.timeout} s; see its log")
        time.sleep(0.1)
    return _done(args, store, args.role, running=True)


def _role_and_state(store: str) -> tuple[int, int] | None:
    """The running store's ROLE and STATE; None when no store runs there."""
    try:
        table = PositionTable.attach(store)
    except PositionTableError:
        return None
    try:
        return table.get(Slot.ROLE), table.get(Slot.STATE)
    finally:
        table.close()


def _done(args: argparse.Namespace, store: str, role: str, running: bool) -> int:
    if args.json:
        print(json.dumps({"store": os.path.abspath(store), "role": role, "running": running}))
    elif running:
        print(f"promoted: {store} runs as {role} and takes puts")
    else:
        print(f"promoted: {store} is {role} at its next start (rocketstore up --config "
              f"{args.config})")
    return EXIT_OK


def _fail(args: argparse.Namespace, code: int, why: str) -> int:
    from rocketstore.cli.commands import say_failure     # it imports the supervisor
    return say_failure(args, code, why, error="usage" if code == EXIT_USAGE else "NotPromoted",
                       command="promote")


def add_parser(sub, common) -> None:
    p = sub.add_parser("promote", parents=[common],
                       help="turn a SLAVE store (running or stopped) into a master")
    p.add_argument("--role", choices=MASTER_ROLES, default="ASYNC_MASTER")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for a running store to come back as a master")
    p.set_defaults(running="promote")
