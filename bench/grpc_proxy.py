"""Benchmark: RocketMQ's official Python client through the proxy process (gRPC).

Not a test: it prints a table (or ``--json``) and asserts nothing. One store
(``rocketstore up`` with ``grpc_listen_port``, ASYNC_FLUSH), 128-byte bodies with a tag
and a key, each row for ``--seconds``:

    row                       what runs
    ------------------------  ----------------------------------------------------------
    native send, one at a     rocketstore's own Producer.send to the writer's ingest
    time                      socket: the floor the proxy's sends add to
    gRPC send, one at a time  rocketmq-python-client's Producer.send, each waits
    gRPC send_async           the same client's send_async, ``--window`` futures in flight
    gRPC receive + ack        a SimpleConsumer's receive(32, 30 s), each message acked
                              (the messages the sends left)
    gRPC transaction          a half message sent and committed, one transaction at a
                              time (SendMessage, then EndTransaction: the half, then the
                              message and its op record), to a topic of its own

For each row: messages per second (for the transaction row, transactions; its latency
is one over that rate), and the CPU per message (µs) of the proxy process
(all its threads: gRPC's and the pop's) and of the writer, from /proc, so the figures
say what a message costs the store, whatever else the machine runs. The client's own
CPU is not counted: it runs in this process.

    python bench/grpc_proxy.py [--seconds 5] [--window 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

from store_pipeline import STORE_SETTINGS, _proc_cpu_s  # noqa: E402
from store_processes import RunningStore, free_port, wait_for  # noqa: E402
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,  # noqa: E402
                      Producer as GrpcProducer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)
from rocketstore.client import Producer  # noqa: E402

BODY = os.urandom(128)
TOPIC = "BenchGrpc"
TRANSACTION_TOPIC = "BenchGrpcTx"


def grpc_message(i: int, topic: str = TOPIC) -> Message:
    m = Message()
    m.topic = topic
    m.body = BODY
    m.tag = "bench"
    m.keys = f"k{i}"
    return m


class Meter:
    """Messages per second and each store process's CPU per message over one row."""

    def __init__(self, store: RunningStore, names=("proxy", "writer")):
        self.pids = {name: store.child_pid(name) for name in names}

    def __enter__(self) -> "Meter":
        self.cpu = {n: _proc_cpu_s(p) for n, p in self.pids.items()}
        self.start = time.monotonic()
        self.count = 0
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed = time.monotonic() - self.start
        self.cpu = {n: _proc_cpu_s(p) - self.cpu[n] for n, p in self.pids.items()}

    def row(self) -> dict:
        n = max(1, self.count)
        return {"msgs_s": self.count / self.elapsed, "count": self.count,
                **{f"{name}_cpu_us": cpu / n * 1e6 for name, cpu in self.cpu.items()}}


def native_sends(store: RunningStore, seconds: float) -> dict:
    with Producer(store.store_dir) as p, Meter(store) as m:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            p.send(TOPIC, BODY, tags="bench", keys=[f"k{m.count}"])
            m.count += 1
    return m.row()


def grpc_sends(config: ClientConfiguration, store: RunningStore, seconds: float,
               window: int) -> dict:
    producer = GrpcProducer(config, (TOPIC,))
    producer.startup()
    try:
        with Meter(store) as m:
            deadline = time.monotonic() + seconds
            pending = []
            while time.monotonic() < deadline:
                if window <= 1:
                    producer.send(grpc_message(m.count))
                    m.count += 1
                    continue
                pending.append(producer.send_async(grpc_message(m.count)))
                if len(pending) >= window:
                    for f in pending:
                        f.result()
                    m.count += len(pending)
                    pending.clear()
            for f in pending:
                f.result()
            m.count += len(pending)
    finally:
        producer.shutdown()
    return m.row()


def grpc_receives(config: ClientConfiguration, store: RunningStore, seconds: float) -> dict:
    consumer = SimpleConsumer(config, "bench-group", {TOPIC: FilterExpression()},
                              await_duration=1)
    consumer.startup()
    try:
        with Meter(store) as m:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                got = consumer.receive(32, 30)
                if not got:
                    break
                for message in got:
                    consumer.ack(message)
                m.count += len(got)
    finally:
        consumer.shutdown()
    return m.row()


class CommitAll(TransactionChecker):
    def check(self, message) -> TransactionResolution:
        return TransactionResolution.COMMIT


def grpc_transactions(config: ClientConfiguration, store: RunningStore,
                      seconds: float) -> dict:
    producer = GrpcProducer(config, (TRANSACTION_TOPIC,), CommitAll())
    producer.startup()
    try:
        with Meter(store) as m:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                transaction = producer.begin_transaction()
                producer.send(grpc_message(m.count, TRANSACTION_TOPIC), transaction)
                transaction.commit()
                m.count += 1
    finally:
        producer.shutdown()
    return m.row()


def run(args: argparse.Namespace) -> dict:
    root = tempfile.mkdtemp(prefix="rsbench-", dir=os.getcwd())
    port = free_port()
    store = RunningStore(pathlib.Path(root), grpc_listen_port=port, **STORE_SETTINGS)
    try:
        store.start()
        wait_for(lambda: store.child_pid("proxy"), what="the proxy")
        config = ClientConfiguration(f"127.0.0.1:{port}", Credentials())
        rows = {"native send, one at a time": native_sends(store, args.seconds),
                "gRPC send, one at a time": grpc_sends(config, store, args.seconds, 1),
                f"gRPC send_async, {args.window} in flight":
                    grpc_sends(config, store, args.seconds, args.window),
                "gRPC receive + ack": grpc_receives(config, store, args.seconds),
                "gRPC transaction, one at a time":
                    grpc_transactions(config, store, args.seconds)}
    finally:
        store.stop()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'row':<34} {'msgs/s':>9} {'proxy µs/msg':>13} {'writer µs/msg':>14}")
    for name, r in rows.items():
        print(f"{name:<34} {r['msgs_s']:>9,.0f} {r['proxy_cpu_us']:>13,.0f} "
              f"{r['writer_cpu_us']:>14,.0f}")


if __name__ == "__main__":
    main()
