"""``rocketstore dashboard``: the web console of a running store, in the foreground.

    rocketstore dashboard --store DIR [--port 8080] [--address ADDR]

``--port`` and ``--address`` stand for the settings ``dashboard_port`` (8080 when the
settings leave it 0) and ``dashboard_address`` (127.0.0.1); ``dashboard_auth`` and
``dashboard_allow_writes`` come from the settings file. An address beyond loopback
without ``dashboard_auth`` ends the command at once (exit 3), naming the setting.
``rocketstore up`` serves the same application as its ``dashboard`` process when
``dashboard_port`` is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys

from rocketstore.shm.positions import PositionTable
from rocketstore.storage import StoreConfig

DEFAULT_PORT = 8080
EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(sub, common) -> None:
    d = sub.add_parser("dashboard", parents=[common],
                       help="serve the web console of a running store")
    d.add_argument("--port", type=int, help=f"dashboard_port (default {DEFAULT_PORT})")
    d.add_argument("--address", help="dashboard_address (default 127.0.0.1); beyond "
                                     "loopback only with dashboard_auth")
    d.set_defaults(running="dashboard")


def cmd_dashboard(args: argparse.Namespace, config: StoreConfig) -> int:
    """Serve until Ctrl-C or SIGTERM. Raises ``StoreConfigError`` (exit 3) for an
    address the settings do not allow, ``PositionTableError`` when no store runs."""
    changes = {"dashboard_port": args.port if args.port is not None else
               config.dashboard_port or DEFAULT_PORT}
    if args.address is not None:
        changes["dashboard_address"] = args.address
    config = dataclasses.replace(config, **changes)      # validated again: the address
    try:
        serve = importlib.import_module("rocketstore.console.serve")
    except ImportError as e:
        print(f"rocketstore dashboard needs the dashboard extra (pip install "
              f"'rocketstore[dashboard]'): {e}", file=sys.stderr)
        return EXIT_FAILED
    PositionTable.attach(config.store_path_root_dir).close()    # not running: exit 3 now

    def ready(url: str) -> None:
        print(f"rocketstore dashboard: {url} (store {config.store_path_root_dir}; "
              f"{'writes allowed' if config.dashboard_allow_writes else 'read-only'}); "
              "Ctrl-C stops it", flush=True)

    serve.serve_forever(config, ready)
    return EXIT_OK
