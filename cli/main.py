"""``rocketstore``: the operator's command line.

    rocketstore up      [--store DIR]                         run the store (foreground)
    rocketstore status  [--json]                              positions, processes, lag
    rocketstore send    --topic T --body B [--count N] ...    send to a running store
    rocketstore consume --group G --topic T [--follow]        read from a running store
    rocketstore offsets --group G --topic T [--reset-to X]    a group's lag; move its offsets
    rocketstore delete-group --group G [--topic T]            forget a consumer group
    rocketstore query   (--key K --topic T | --msg-id ID | --offset N)
    rocketstore demo    [--count N] [--embedded] [--json]     the main job, end to end
    rocketstore pipeline demo [--count N] [--endpoint E]      a Spark job over the store
    rocketstore dump    PATH [--type KIND] [--limit N] [--json]
    rocketstore check   [--json]                              load (recovering) and fsck
    rocketstore config  [--json]                              the settings in force
    rocketstore promote --config FILE [--role R]              a SLAVE becomes a master;
                        [--broker-id N]                       a group hands over
    rocketstore keys    --dir DIR [--client NAME ...]         CURVE key pairs (0600 files)
    rocketstore dashboard [--port 8080] [--address ADDR]      the web console

Every command takes ``--config FILE`` (default: the embedded supervisor.toml) and
``--store DIR`` (default: the config's store_path_root_dir). Every table and setting of
the file must exist (``UnknownSettingError`` names the nearest known one), relative
paths in it are read from its directory, and an existing store is opened with the file
sizes it was created with unless the file sets others (``GeometryMismatchError``).

Exit codes: 0 success; 1 the store is inconsistent (``check``) or a step failed;
2 bad usage; 3 the store cannot be opened or is not running (locked, corrupt,
misconfigured); 4 a topic or consumer group named does not exist in the store
(``TopicNotExistError``, ``GroupNotExistError``). With ``--json`` a failure is also
``{"error", "message", "exit"}`` on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import dataclasses
import json
import os
import sys
import tomllib
from importlib import resources
from typing import Iterable

from rocketstore.storage import MessageStore, StoreConfig, StoreConfigError, StoreError
from rocketstore.storage import dump as dumping
from rocketstore.storage.config import setting_mark
from rocketstore.wire import curve
from rocketstore.cli import dashboard, demo, promote, commands as running_commands
from rocketstore.procs import supervisor
from rocketstore.procs.status import quarantine_usage
from rocketstore.procs.supervisor import ProcessConfig
from rocketstore.client import ClientError
from rocketstore.client.topics import NotInStoreError
from rocketstore.shm.positions import PositionTableError, directory_fault

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STORE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


def embedded_config_path() -> str:
    return str(resources.files("rocketstore").joinpath("supervisor.toml"))


def load_config(args: argparse.Namespace, **new_store_sizes) -> StoreConfig:
    """The store's settings in force (``load_settings``)."""
    return load_settings(args, **new_store_sizes)[0]


def load_settings(args: argparse.Namespace, **new_store_sizes
                  ) -> tuple[StoreConfig, dict[str, ProcessConfig]]:
    """The settings in force, the store's and its processes': ``--config`` (or the
    embedded file) and ``--store`` (``procs.supervisor.load_settings``).

    Every table and setting of the file must exist; its relative paths are read from
    its directory. An existing store is opened with the file sizes it recorded unless
    the file sets them; ``new_store_sizes`` apply to a store being created, where the
    file sets none.
    """
    path = args.config or embedded_config_path()
    overrides = {"store_path_root_dir": args.store} if args.store else {}
    try:
        cfg, processes = supervisor.load_settings(path, defaults=not args.config,
                                                  new_store_sizes=new_store_sizes, **overrides)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise StoreConfigError(f"cannot read the settings file {path}: {e}") from None
    root = cfg.store_path_root_dir
    if os.path.exists(root) and not os.path.isdir(root):
        raise StoreConfigError(f"the store directory {root} is not a directory")
    return cfg, processes


def _emit(obj: dict, as_json: bool, text: str | None = None) -> None:
    print(json.dumps(obj, default=str) if as_json else (text if text is not None else obj))


def _progress(done: int, total: int, what: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{what}: {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ demo
def cmd_demo(args: argparse.Namespace) -> int:
    """The main job (cli.demo): the multiprocess store, or ``--embedded``."""
    cfg = load_config(args, **demo.DEMO_FILE_SIZES)
    return (demo.run_embedded if args.embedded else demo.run_pipeline)(args, cfg)


# ------------------------------------------------------------------------------ dump
def cmd_dump(args: argparse.Namespace) -> int:
    kind = args.type or dumping.detect_kind(args.path)
    if kind == "commitlog":
        items = dumping.describe_commit_log(args.path, args.limit)
    elif kind == "consumequeue":
        items = dumping.describe_consume_queue(args.path, args.limit)
    elif kind == "index":
        cfg = load_config(args)
        items = dumping.describe_index(args.path, cfg.max_hash_slot_num, cfg.max_index_num,
                                       args.limit)
    else:
        items = dumping.describe_checkpoint(args.path)
    damaged = _print_items(items, args.json)
    return EXIT_FAILED if damaged else EXIT_OK


def _print_items(items: Iterable[dict], as_json: bool) -> bool:
    """Print each item; whether one said the file holds a bad record."""
    damaged = False
    for item in items:
        damaged = damaged or "bad_record_at" in item
        if as_json:
            print(json.dumps(item, default=str))
        else:
            print(_format_item(item))
    return damaged


def _format_item(item: dict) -> str:
    kind = item.get("kind")
    if kind == "message":
        body = item.get("body", item.get("body_hex", ""))
        body = body if len(body) <= 60 else body[:57] + "..."
        return (f"@{item['commit_log_offset']} size={item['store_size']} {item['topic']}/"
                f"{item['queue_id']}#{item['queue_offset']} tags={item['tags']} "
                f"keys={item['keys']} stored={item['store_timestamp']} "
                f"msgId={item['msg_id']} body={body!r}")
    if kind == "unit":
        return (f"#{item['queue_offset']} -> @{item['commit_log_offset']} size={item['size']} "
                f"tags={item['tags_code']}{' (blank)' if item['blank'] else ''}")
    if kind == "entry":
        return (f"entry {item['entry']}: hash={item['key_hash']} @{item['phy_offset']} "
                f"+{item['time_diff_s']}s prev={item['pre_index_no']}")
    return " ".join(f"{k}={v}" for k, v in item.items() if k != "kind")


# ------------------------------------------------------------------------------ check
def cmd_check(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    fault = directory_fault(cfg.store_path_root_dir)
    if fault:
        return running_commands.say_failure(args, EXIT_STORE, fault, error="NoStore",
                                            command="check")
    with MessageStore(dataclasses.replace(cfg, transient_store_pool_enable=False)) as store:
        problems = store.check()
        status = store.status()
    kept = quarantine_usage(cfg.store_path_root_dir)
    if args.json:
        print(json.dumps({"problems": problems, "status": status, "quarantine": kept},
                         default=str))
    else:
        print("consistent" if not problems else "\n".join(problems))
        if kept["files"]:
            # consistent, but not whole: recovery (or a replica's cut) took bytes away
            print(f"quarantine holds {kept['bytes']} bytes in {kept['files']} files from "
                  f"{kept['cuts']} cuts under {kept['path']}: records cut out of the "
                  "CommitLog, not in any queue (inspect with rocketstore dump; remove "
                  "when done)")
    return EXIT_OK if not problems else EXIT_FAILED


# Commands whose code lives in a room the command line does not import: the Spark demo
# needs the spark extra (pyspark), and the command line is the top floor, reaching down
# to it by name only when the command runs. (command, subcommand) -> "module:function".
LATE_COMMANDS = {("pipeline", "demo"): "rocketstore.spark.demo:run"}


def cmd_pipeline_demo(args: argparse.Namespace) -> int:
    """``rocketstore pipeline demo``: the Spark job of ``rocketstore.spark.demo``."""
    module_name, _, function = LATE_COMMANDS[("pipeline", "demo")].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        print(f"rocketstore pipeline needs the spark extra (pip install 'rocketstore[spark]'):"
              f" {e}", file=sys.stderr)
        return EXIT_FAILED
    return getattr(module, function)(args, load_config(args, **demo.DEMO_FILE_SIZES))


def cmd_config(args: argparse.Namespace) -> int:
    """The settings in force; beside each that does not simply act as RocketMQ's, why
    (``storage.config.setting_mark``): ``--json --marks`` gives both per setting."""
    cfg = load_config(args)
    settings = cfg.to_dict()
    if args.json and args.marks:
        print(json.dumps({k: {"value": v, "mark": setting_mark(k)} for k, v in settings.items()}))
    elif args.json:
        print(json.dumps(settings))
    else:
        for k, v in settings.items():
            mark = setting_mark(k)
            print(f"{k} = {v!r}" + (f"    # {mark}" if mark else ""))
    return EXIT_OK


# ------------------------------------------------------------------------------ keys
def cmd_keys(args: argparse.Namespace) -> int:
    """CURVE key pairs for a store and its clients (wire.curve), and the settings that
    use them: the store's lets in every client made."""
    clients = args.client or ["client"]
    try:
        written = curve.make_keys(args.dir, clients)
    except FileExistsError as e:
        print(f"rocketstore keys: {e}", file=sys.stderr)
        return EXIT_FAILED
    settings = curve.key_settings(args.dir, clients)
    if args.json:
        print(json.dumps({"files": written, **settings}))
        return EXIT_OK
    for path in written:
        print(path)
    print("\n# the store's [store] table (every client above is let in):")
    for name, value in settings["store"].items():
        print(f'{name} = "{value}"')
    d = os.path.abspath(args.dir)
    print(f"# each client ({', '.join(clients)}) passes the store's public key and its own "
          f'secret one:\n#   curve_server_key="{d}/server.key" '
          f'curve_client_key="{d}/NAME.key_secret"\n#   (Producer and ReaderClient '
          "arguments; Spark options curveServerKey, curveClientKey; a slave's [store]: "
          "ha_master_server_key and curve_client_key)")
    return EXIT_OK


# ------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--config", help="settings file (default: embedded supervisor.toml)")
    common.add_argument("--store", help="store directory (default: the config's)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    p = _Parser(prog="rocketstore", description="rocketstore: the operator's command line")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", parents=[common],
                       help="start the store, send, consume and query messages, stop it")
    d.add_argument("--count", type=int, default=2000)
    d.add_argument("--embedded", action="store_true",
                   help="use the embedded store in this process instead")
    d.set_defaults(func=cmd_demo)
    du = sub.add_parser("dump", parents=[common], help="decode one store file offline")
    du.add_argument("path")
    du.add_argument("--type", choices=dumping.KINDS)
    du.add_argument("--limit", type=int, help="at most N records")
    du.set_defaults(func=cmd_dump)
    c = sub.add_parser("check", parents=[common], help="open a store and check consistency")
    c.set_defaults(func=cmd_check)
    cf = sub.add_parser("config", parents=[common], help="print the settings in force")
    cf.add_argument("--marks", action="store_true",
                    help="with --json: each setting's value and what it does here")
    cf.set_defaults(func=cmd_config)
    pl = sub.add_parser("pipeline", help="data pipelines on Spark")
    what = pl.add_subparsers(dest="pipeline_command", required=True)
    pd = what.add_parser("demo", parents=[common],
                         help="Spark reads a topic, counts words per tag, writes another topic")
    pd.add_argument("--count", type=int, default=3000, help="sentences to send")
    pd.add_argument("--endpoint", help="executors use the store's sockets (ipc://STORE or "
                                       "tcp://host:port) instead of its files")
    pd.set_defaults(func=cmd_pipeline_demo)
    running_commands.add_parsers(sub, common)
    promote.add_parser(sub, common)
    dashboard.add_parser(sub, common)
    k = sub.add_parser("keys", parents=[common], help="make CURVE key pairs (server, clients)")
    k.add_argument("--dir", required=True, help="where the key files go (made 0700)")
    k.add_argument("--client", action="append", help="a client's name (repeat; default: client)")
    k.set_defaults(func=cmd_keys)
    return p


def cmd_running(args: argparse.Namespace) -> int:
    """The commands of cli.commands (up, status, send, consume, query)."""
    config, processes = load_settings(args)
    if args.running == "up":
        return running_commands.cmd_up(args, config, processes)
    if args.running == "promote":
        return promote.cmd_promote(args, config, args.config)
    if args.running == "dashboard":
        return dashboard.cmd_dashboard(args, config)
    return getattr(running_commands, f"cmd_{args.running}")(args, config)


def main(argv: list[str] | None = None) -> int:
    _Parser.json_wanted = "--json" in (sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        return cmd_running(args) if getattr(args, "running", None) else args.func(args)
    except NotInStoreError as e:
        command = getattr(args, "running", None) or args.command
        return running_commands.say_failure(args, EXIT_NOT_FOUND, str(e),
                                            error=type(e).__name__,
                                            command=command.replace("_", "-"))
    except (StoreError, PositionTableError, ClientError) as e:
        return _failed(args, e, f"{type(e).__name__}: {e}", EXIT_STORE)
    except BrokenPipeError:
        return EXIT_OK
    except (OSError, ValueError) as e:
        return _failed(args, e, str(e), EXIT_FAILED)


def _failed(args: argparse.Namespace, error: Exception, text: str, code: int) -> int:
    return running_commands.say_failure(args, code, text, error=type(error).__name__)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (exit 2) also say themselves as JSON on
    stdout when ``--json`` is among the arguments."""

    json_wanted = False

    def error(self, message: str):
        if _Parser.json_wanted:
            print(json.dumps(running_commands.failure_doc("usage", message, EXIT_USAGE)))
        super().error(message)


if __name__ == "__main__":
    sys.exit(main())
