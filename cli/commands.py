"""``rocketstore`` commands for a running store: up, status, send, consume, offsets,
delete-group, clean, query.

They share the exit codes of ``cli.main``: 0 success, 1 a step failed, 2 bad usage,
3 the store cannot be reached or opened, 4 a topic or consumer group named does not
exist in the store (``client.topics``: "no topic T in this store (topics: ...; did you
mean X?)").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time

from rocketstore.procs.cleaner import clean_now_path
from rocketstore.client import Consumer, Producer, ReaderClient
from rocketstore.wire import endpoints
from rocketstore.client import group_offsets
from rocketstore.client.consumer import check_group, check_names
from rocketstore.client.topics import require_topic
from rocketstore.procs.service import configure_logging
from rocketstore.procs.status import reserved_text, store_status
from rocketstore.procs.supervisor import ProcessConfig, Supervisor
from rocketstore.shm import bus
from rocketstore.shm.positions import (
    PositionTable, PositionTableAccessError, PositionTableError, Slot)
from rocketstore.storage import Message, StoreConfig
from rocketstore.storage.reservation import store_reservation
from rocketstore.storage.validation import check_topic

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STORE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")    # host (IPv4/IPv6) + offset


# ------------------------------------------------------------------------------ up
def cmd_up(args: argparse.Namespace, config: StoreConfig,
           processes: dict[str, ProcessConfig]) -> int:
    """Run the store in the foreground until SIGTERM or Ctrl-C."""
    configure_logging(config.store_path_root_dir, "supervisor")   # as its processes log
    supervisor = Supervisor(config, processes)

    def ready() -> None:
        print(up_banner(config, os.getpid()), flush=True)
        reserved = store_reservation(config, supervisor.table.get(Slot.WRITTEN))
        print(f"disk: {reserved_text(reserved)}", flush=True)

    return supervisor.run(ready=ready)


def up_banner(config: StoreConfig, pid: int) -> str:
    """The line ``up`` prints once every process runs: where the store is, where clients
    find it, and how to stop it, whether it runs in the foreground or in the
    background (``&``: Ctrl-C does not reach it, ``kill PID`` does)."""
    store = config.store_path_root_dir
    tcp = ""
    if config.tcp_listen_address:
        ingest = endpoints.tcp_address(config.tcp_listen_address, config.listen_port)
        reader = endpoints.tcp_address(config.tcp_listen_address, config.reader_port)
        tcp = f"; TCP ingest {ingest}, reader {reader} (clients name {ingest})"
    if config.ha_listen_port and not config.slave:
        tcp += "; HA " + endpoints.tcp_address(config.tcp_listen_address or "127.0.0.1",
                                               config.ha_listen_port)
    return (f"rocketstore up: store {os.path.abspath(store)} (supervisor pid {pid}); "
            f"ingest {bus.endpoint(store, 'ingest')}, reader {bus.endpoint(store, 'reader')}"
            f"{tcp}; stop it with Ctrl-C, or kill {pid} from any shell (a clean stop)")


# ------------------------------------------------------------------------------ status
def cmd_status(args: argparse.Namespace, config: StoreConfig) -> int:
    try:
        st = store_status(config.store_path_root_dir)
    except PositionTableError as e:
        state = "UNKNOWN" if isinstance(e, PositionTableAccessError) else "NOT_RUNNING"
        store = config.store_path_root_dir
        there = os.path.isdir(store)
        detail = str(e)      # positions.not_running: no directory, no store, or not running
        if args.json:
            error = type(e).__name__ if there else "NoStore"    # as check names it
            print(json.dumps({"store": store, "state": state, "detail": detail,
                              **failure_doc(error, detail, EXIT_STORE)}))
        else:
            print(f"{'state unknown' if state == 'UNKNOWN' else 'not running'}: {detail}",
                  file=sys.stderr)
        return EXIT_STORE
    if args.json:
        print(json.dumps(st))
        return EXIT_OK
    pos = st["positions"]
    why = ", ".join(NOT_WRITEABLE_WORDS.get(w, w) for w in st["not_writeable"])
    print(f"store      {st['store']}  {st['state']}  {st['role']}  "
          f"{'writeable' if st['writeable'] else f'NOT WRITEABLE ({why})'}  "
          f"(supervisor {st['supervisor_pid']})")
    print(f"positions  min {pos['min_offset']}  written {pos['written']}  flushed {pos['flushed']}"
          f"  dispatched {pos['dispatched']}  (dispatch lag {st['dispatch_lag_bytes']} bytes)")
    print(f"disk       {st['disk']['used_ratio']:.1%} used; "
          f"{reserved_text(st['disk']['reserved'])}")
    kept = st["disk"]["quarantine"]
    if kept["files"]:
        print(f"quarantine {kept['bytes']} bytes in {kept['files']} files from {kept['cuts']} "
              f"cuts under {kept['path']} (kept for inspection; remove when done)")
    for name, p in st["processes"].items():
        age = "-" if p["heartbeat_age_ms"] is None else f"{p['heartbeat_age_ms']} ms"
        print(f"  {name:<11} pid {p['pid']:<8} {p['state']:<9} heartbeat {age:<10} "
              f"restarts {p['restarts']}"
              + (f" (watchdog kills {p['watchdog_kills']})" if p.get("watchdog_kills") else "")
              + (f"  kept on CPU {p['cpus'][0]}" if p.get("cpus") and len(p["cpus"]) == 1
                 and (os.cpu_count() or 1) > 1 else ""))
    _print_replication(st["ha"])
    if "controller" in st:
        _print_group(st["controller"])
    groups = st["consumer_groups"]
    print(f"groups     {len(groups)}  (total lag {sum(g['lag'] for g in groups.values())})")
    for key, g in groups.items():
        print(f"  {key}  lag {g['lag']}")
        for q, v in g["queues"].items():
            committed = "-" if v["committed"] is None else v["committed"]
            lag = "-" if v["lag"] is None else v["lag"]
            print(f"    queue {q:<4} committed {committed:<10} max {v['max_offset']:<10} lag {lag}")
    return EXIT_OK


NOT_WRITEABLE_WORDS = {"SLAVE": "a slave takes only its master's bytes",
                       "flush_error": "a flush failed", "disk_full": "disk full"}


def _print_group(c: dict) -> None:
    """Controller mode: the broker group as this member sees it."""
    print(f"group      {c['group']} member {c['broker_id']}  master {c['master']}  epoch "
          f"{c['epoch']}  lease {c['lease_ms']} ms"
          + ("" if c["connected"] else "  ZOOKEEPER UNREACHABLE")
          + ("  UNCLEAN (elected out of sync)" if c.get("unclean") else "")
          + (f"  HANDING OVER to member {c['handing_over_to']}"
             if c.get("handing_over_to") is not None else ""))
    for m in c.get("members") or []:
        print(f"  member {m['broker_id']:<4} {m['role']:<12} end {m['end']:<12} lag "
              f"{m['lag_bytes']} bytes" + ("  in sync" if m["in_sync"] else ""))


def _print_replication(ha: dict) -> None:
    if ha["role"] == "SLAVE":
        lag_ms = "?" if ha["lag_ms"] is None else ha["lag_ms"]
        lag = "?" if ha["lag_bytes"] is None else ha["lag_bytes"]
        master_end = "?" if ha["master_end"] is None else ha["master_end"]
        print(f"role       SLAVE of {ha['master']}  at {ha['written']}, master at "
              f"{master_end} (lag {lag} bytes, {lag_ms} ms)"
              + (f"  REFUSED: {ha['error']}" if ha["error"] else ""))
        for cut in ha["cuts"]:
            print(f"  cut to {cut['offset']} (was {cut.get('slave_end')}, parted from the "
                  f"master at {cut.get('first_difference')}); cut bytes in {cut['quarantine']}")
        return
    listen = f"  HA {ha['listen']}" if ha["listen"] else ""
    print(f"role       {ha['role']}{listen}  slaves {ha['slaves_connected']}"
          f"  (acked {ha['slave_acked']})")
    for s in ha["slaves"]:
        print(f"  slave {s['address']:<22} acked {s['acked']:<12} lag {s['lag_bytes']} bytes, "
              f"{s['lag_ms']} ms")


# ------------------------------------------------------------------------------ send
def cmd_send(args: argparse.Namespace, config: StoreConfig) -> int:
    """Send ``--count`` copies of ``--body`` (or one message per stdin line with ``-``)."""
    bad = check_topic(args.topic)
    if bad:
        return usage_error(args, "send", bad)
    bodies = (line.rstrip("\n").encode() for line in sys.stdin) if args.body == "-" else \
        (args.body.encode() for _ in range(args.count))
    keys = args.keys.split(",") if args.keys else None
    failed = sent = 0
    _check_running(config.store_path_root_dir)
    with Producer(config.store_path_root_dir) as producer:
        batch: list[Message] = []
        for body in bodies:
            batch.append(Message(topic=args.topic, body=body, tags=args.tags, keys=keys,
                                 queue_id=args.queue_id, delay_level=args.delay_level))
            if len(batch) == 256:
                sent, failed = _send(producer, batch, args.json, sent, failed)
                batch = []
        if batch:
            sent, failed = _send(producer, batch, args.json, sent, failed)
    if not args.json:
        print(f"sent {sent} message(s), {failed} refused", file=sys.stderr)
    return EXIT_OK if not failed else EXIT_FAILED


def _send(producer: Producer, batch: list[Message], as_json: bool, sent: int,
          failed: int) -> tuple[int, int]:
    """Send ``batch``; one line per message on stdout (``--json``: an object each), a
    refused one's reason on stderr too."""
    for m, r in zip(batch, producer.send_batch(batch)):
        if as_json:
            print(json.dumps({"status": r.status.name, "msg_id": r.msg_id, "topic": m.topic,
                              "queue_id": r.queue_id, "queue_offset": r.queue_offset,
                              "commit_log_offset": r.commit_log_offset, "reason": r.reason}))
        elif r.ok:
            print(f"{r.status.name} msgId={r.msg_id} {m.topic}/{r.queue_id}#{r.queue_offset} "
                  f"@{r.commit_log_offset}")
        else:
            print(f"{r.status.name}: {r.reason}", file=sys.stderr)
        sent += r.ok
        failed += not r.ok
    return sent, failed


# ------------------------------------------------------------------------------ consume
def cmd_consume(args: argparse.Namespace, config: StoreConfig) -> int:
    """Print messages of a topic for a consumer group, committing as it goes; with
    ``--follow`` keep waiting for new ones until Ctrl-C, and for the topic to appear
    when it does not exist yet (without: ``TopicNotExistError``, exit 4)."""
    try:
        check_names(args.group, args.topic)
    except ValueError as e:
        return usage_error(args, "consume", str(e))
    _stop_on_interrupt_or_term()
    count, outcome = 0, EXIT_OK
    with Consumer(config.store_path_root_dir, args.group, args.topic, config=config,
                  from_where=args.from_where, tags=args.tags,
                  wait_for_topic=args.follow) as consumer:
        if consumer.topic_missing is not None:
            print(f"rocketstore consume: {consumer.topic_missing}; waiting for it to "
                  "appear (Ctrl-C stops)", file=sys.stderr, flush=True)
        try:
            while args.max is None or count < args.max:
                want = 256 if args.max is None else min(256, args.max - count)
                batch = consumer.poll(want, 1000 if args.follow else 200)
                if not batch and not args.follow:
                    break
                printed = 0
                try:
                    for m in batch:
                        print(json.dumps(m.to_dict()) if args.json else _one_line(m),
                              flush=True)
                        printed += 1
                finally:        # stopped part way (Ctrl-C, a closed pipe): what was not
                    count += printed            # printed is read again, not committed
                    if printed < len(batch):
                        consumer.rewind(batch[printed:])
                consumer.commit()
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:            # the reader went away (``| head``)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            outcome = EXIT_FAILED
    if not args.json:
        print(f"consumed {count} message(s)", file=sys.stderr)
    return outcome


def _stop_on_interrupt_or_term() -> None:
    """SIGINT (Ctrl-C) and SIGTERM (``kill``) raise ``KeyboardInterrupt`` in the main
    thread, which ends ``consume``'s loop cleanly: what it printed is committed, the
    rest is read again. Set here whatever the command inherited: a shell starts a
    background job (``rocketstore consume ... &`` in a script, no job control) with
    SIGINT ignored, Python keeps an ignored SIGINT ignored, and such a consume went on
    polling after ``kill -INT`` (the test of a Ctrl-C while printing, run by a suite
    started in the background). ``up`` does the same for its supervisor."""
    for signo in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signo, signal.default_int_handler)


# ------------------------------------------------------------------------------ offsets
def cmd_offsets(args: argparse.Namespace, config: StoreConfig) -> int:
    """A group's offsets and lag per queue of a topic; ``--reset-to`` moves them
    (``client.group_offsets``; ``--dry-run`` shows where without writing)."""
    try:
        target = None if args.reset_to is None else group_offsets.parse_target(args.reset_to)
        check_names(args.group, args.topic)
    except ValueError as e:
        return usage_error(args, "offsets", str(e))
    store = config.store_path_root_dir
    rows = group_offsets.describe(store, args.group, args.topic, target, args.queue)
    write = target is not None and not args.dry_run
    try:
        if write:
            group_offsets.reset(store, args.group, args.topic, rows)
    except group_offsets.GroupActiveError as e:
        if not args.json:
            _print_offsets(rows, True)
        print(f"rocketstore offsets: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"group": args.group, "topic": args.topic, "queues": rows,
                              "reset": e.written,
                              **failure_doc("GroupActive", str(e), EXIT_FAILED)}))
        return EXIT_FAILED
    if args.json:
        print(json.dumps({"group": args.group, "topic": args.topic, "queues": rows,
                          "reset": write}))
    else:
        _print_offsets(rows, target is not None)
    if write and not args.json:
        print(f"reset group {args.group} of {args.topic}: {len(rows)} queue(s)", file=sys.stderr)
    return EXIT_OK


def _print_offsets(rows: list[dict], with_new: bool) -> None:
    names = ["queue", "committed", "min", "max", "lag"] + (["new"] if with_new else [])
    keys = ["queue", "committed", "min_offset", "max_offset", "lag"] + (["new"] if with_new else [])
    cells = [["-" if r[k] is None else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    for line in [names] + cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))


# ------------------------------------------------------------------------------ delete-group
def cmd_delete_group(args: argparse.Namespace, config: StoreConfig) -> int:
    """Forget a consumer group, of one topic or of all (``group_offsets.delete_group``;
    RocketMQ's ``mqadmin deleteSubGroup``): refused while a consumer of it is live."""
    try:
        if args.topic is None:
            check_group(args.group)
        else:
            check_names(args.group, args.topic)
    except ValueError as e:
        return usage_error(args, "delete-group", str(e))
    try:
        topics = group_offsets.delete_group(config.store_path_root_dir, args.group, args.topic)
    except group_offsets.GroupActiveError as e:
        return say_failure(args, EXIT_FAILED, str(e), error="GroupActive",
                           command="delete-group")
    if args.json:
        print(json.dumps({"group": args.group, "deleted": [f"{t}@{args.group}" for t in topics]}))
    else:
        print(f"deleted consumer group {args.group} of {', '.join(topics)} (its offsets and "
              "membership)")
    return EXIT_OK


def _check_running(store_dir: str) -> None:
    """Raise ``PositionTableError`` at once when the store is not running (a request
    to it would wait its whole timeout and then call its outcome unknown)."""
    PositionTable.attach(store_dir).close()


# ------------------------------------------------------------------------------ clean
def cmd_clean(args: argparse.Namespace, config: StoreConfig) -> int:
    """Ask the running store's cleaner for a manual clean (RocketMQ's
    ``excuteDeleteFilesManualy``): expired files go now, whatever the hour."""
    path = clean_now_path(config.store_path_root_dir)
    _check_running(config.store_path_root_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w"):
        pass
    if args.json:
        print(json.dumps({"asked": True, "request": path}))
    print(f"asked the cleaner for a manual clean ({path})", file=sys.stderr)
    return EXIT_OK


# ------------------------------------------------------------------------------ query
def cmd_query(args: argparse.Namespace, config: StoreConfig) -> int:
    if args.msg_id is not None and not MSG_ID.fullmatch(args.msg_id):
        return usage_error(args, "query", f"{args.msg_id!r} is not a message id (32 or 56 "
                           "hex digits: the store host, then the CommitLog offset)")
    if args.key is not None and not args.topic:
        return usage_error(args, "query", "--key needs --topic")
    _check_running(config.store_path_root_dir)
    with ReaderClient(config.store_path_root_dir) as reader:
        if args.msg_id is not None:
            found = reader.query_by_msg_id(args.msg_id)
        elif args.offset is not None:
            found = reader.query_by_offset(args.offset)
        else:
            found = reader.query_by_key(args.topic, args.key, args.max)
    for m in found:
        print(json.dumps(m.to_dict()) if args.json else _one_line(m))
    if not found:
        if args.key is not None:
            _require_topic(config, args.topic)      # TopicNotExistError: exit 4
        return say_failure(args, EXIT_FAILED, "no message found", error="NotFound",
                           command="query")
    return EXIT_OK


def _require_topic(config: StoreConfig, topic: str) -> None:
    """Raise ``TopicNotExistError`` when the running store has no ``topic``."""
    table = PositionTable.attach(config.store_path_root_dir)
    try:
        require_topic(config.consume_queue_dir, table, topic)
    finally:
        table.close()


def _one_line(m) -> str:
    body = m.body[:60]
    return (f"{m.topic}/{m.queue_id}#{m.queue_offset} @{m.commit_log_offset} "
            f"msgId={m.msg_id} tags={m.tags} keys={m.keys} "
            f"stored={time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(m.store_timestamp / 1000))} "
            f"body={body!r}")


def say_failure(args: argparse.Namespace, code: int, message: str, *, error: str = "usage",
                command: str = "") -> int:
    """Say why a command failed, on stderr, and with ``--json`` also as a JSON object on
    stdout (``error``: what kind, ``message``, ``exit``), as ``cli.main`` promises for
    every failure; returns ``code``."""
    print(f"rocketstore{' ' + command if command else ''}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(failure_doc(error, message, code)))
    return code


def failure_doc(error: str, message: str, code: int) -> dict:
    """What ``--json`` says of a failure, whichever command failed."""
    return {"error": error, "message": message, "exit": code}


def usage_error(args: argparse.Namespace, command: str, message: str) -> int:
    """A bad argument: exit 2."""
    return say_failure(args, EXIT_USAGE, message, command=command)


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (else a usage error, exit 2)."""
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def add_parsers(sub, common) -> None:
    up = sub.add_parser("up", parents=[common], help="run the store in the foreground")
    up.set_defaults(running="up")
    st = sub.add_parser("status", parents=[common], help="positions and processes of a running store")
    st.set_defaults(running="status")
    se = sub.add_parser("send", parents=[common], help="send messages to a running store")
    se.add_argument("--topic", required=True)
    se.add_argument("--body", required=True, help="the body text, or - for one message per stdin line")
    se.add_argument("--count", type=positive_int, default=1)
    se.add_argument("--tags")
    se.add_argument("--keys", help="comma-separated")
    se.add_argument("--queue-id", type=int)
    se.add_argument("--delay-level", type=int, default=0)
    se.set_defaults(running="send")
    co = sub.add_parser("consume", parents=[common], help="read a topic as a consumer group")
    co.add_argument("--group", required=True)
    co.add_argument("--topic", required=True)
    co.add_argument("--follow", action="store_true",
                    help="keep waiting for new messages (and for the topic to appear)")
    co.add_argument("--max", type=positive_int, help="stop after N messages")
    co.add_argument("--tags", help="only messages with this tag")
    co.add_argument("--from-where", choices=("earliest", "latest"), default="earliest",
                    help="where a queue without a committed offset starts")
    co.set_defaults(running="consume")
    of = sub.add_parser("offsets", parents=[common],
                        help="a consumer group's offsets and lag; --reset-to moves them")
    of.add_argument("--group", required=True)
    of.add_argument("--topic", required=True)
    of.add_argument("--queue", type=non_negative_int, action="append",
                    help="only this queue (repeat for more; default: every queue)")
    of.add_argument("--reset-to", metavar="TARGET",
                    help="earliest, latest, an offset N, a shift +N/-N, @MS since the epoch "
                         "or an ISO-8601 time (the message stored nearest it); the group "
                         "must have no live consumer of the topic")
    of.add_argument("--dry-run", action="store_true", help="show the new offsets, write nothing")
    of.set_defaults(running="offsets")
    dg = sub.add_parser("delete-group", parents=[common],
                        help="forget a consumer group: its offsets and membership")
    dg.add_argument("--group", required=True)
    dg.add_argument("--topic", help="only of this topic (default: of every topic)")
    dg.set_defaults(running="delete_group")
    cl = sub.add_parser("clean", parents=[common], help="ask a running store to delete expired files now")
    cl.set_defaults(running="clean")
    q = sub.add_parser("query", parents=[common], help="find messages in a running store")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--key")
    how.add_argument("--msg-id")
    how.add_argument("--offset", type=non_negative_int, help="a commit log offset")
    q.add_argument("--topic")
    q.add_argument("--max", type=positive_int, default=32)
    q.set_defaults(running="query")
