"""``rocketstore promote``: turn a SLAVE store (running or stopped) into a master.

    rocketstore promote --config FILE [--role ASYNC_MASTER|SYNC_MASTER] [--json]

The role is written into FILE, and a running store is asked to restart its processes
in that role; the command waits until it runs so (``procs.promotion`` says what the
supervisor does). docs/OPERATIONS.md says how to build automatic failover on
``rocketstore status --json``. On a member of a broker group (``enable_controller_mode``)
the group is asked for a planned hand-over instead (``cli.handover``; ``--broker-id``,
``--handover-timeout``): which member is master is the group's choice, and the file is
left as it is.

Exit codes: 0 promoted; 1 the store is not a SLAVE, or did not come back in its new role
within ``--timeout`` seconds; 2 bad usage (no --config, a role that cannot work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from rocketstore.cli import handover as hand_over
from rocketstore.cli.commands import say_failure
from rocketstore.procs.promotion import MASTER_ROLES, request, set_role_in_config
from rocketstore.shm.positions import PositionTable, PositionTableError, Slot, StoreState
from rocketstore.storage import StoreConfig
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage.errors import StoreConfigError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def cmd_promote(args: argparse.Namespace, config: StoreConfig, config_path: str | None) -> int:
    if config_path is None:
        return _fail(args, EXIT_USAGE, "promote needs --config FILE: the store's role is "
                                       "written there")
    if config.enable_controller_mode:       # the group's choice: a planned hand-over
        return hand_over.cmd_hand_over(args, config)
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
    request(config.config_dir, args.role)
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
    return say_failure(args, code, why, error="usage" if code == EXIT_USAGE else "NotPromoted",
                       command="promote")


def add_parser(sub, common) -> None:
    p = sub.add_parser("promote", parents=[common],
                       help="turn a SLAVE store (running or stopped) into a master; in a "
                            "broker group, hand the master's role over to a slave")
    p.add_argument("--role", choices=MASTER_ROLES, default="ASYNC_MASTER")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for a running store to come back as a master")
    hand_over.add_arguments(p)
    p.set_defaults(running="promote")
