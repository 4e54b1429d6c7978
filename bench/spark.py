"""Benchmark of the Spark format: batch-read throughput and streaming latency.

Not a test: it prints figures and asserts nothing about time. Run from the project root
(``python bench/spark.py [--messages N]``). It starts a store (``rocketstore up``,
256 MiB CommitLog files) in a temporary directory under the working directory, fills
topic ``Bench`` (4 queues, 128-byte bodies, a tag and a key each), and measures with a
Spark session on ``local[2]``:

1. batch read, local path (executors map the files) and remote path (FETCH through
   the reader socket): rows/s of ``count(*)`` and ``sum(length(body))`` over the whole
   topic, which makes every row cross from Arrow into Spark; best of ``--repeat`` runs
   after one that warms the JVM up, Spark's start not counted (and before any of them,
   ``--warm-up-rounds`` untimed reads of every configuration: the JVM's JIT compiles
   through the first few million rows, and would otherwise charge its CPU to the
   configuration measured first); then the same with a
   schema naming only the columns the query uses (``queue_offset long, body binary``),
   the projection the format supports. Beside each rate, the CPU per row (user +
   system, averaged over the timed runs) of the Python workers, of Spark's JVM and of
   the store's reader process, from ``/proc``: on a busy machine the rate follows the
   load, the CPU much less;
2. streaming latency: a query with a ``processingTime=0`` trigger reading topic ``Live``
   while a producer sends one message every 20 ms carrying its send time; latency is
   the time of the micro-batch's ``foreachBatch`` minus the send time, p50/p99/max.

The Python workers keep glibc's heap top by themselves (``rocketstore.spark.allocator``):
nothing needs to be exported. To see what that buys, run it once as is and once with
``MALLOC_TOP_PAD_=131072`` (glibc's own default, which a worker then keeps).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import struct
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rocketstore.client import Producer  # noqa: E402
from rocketstore.shm.positions import Slot  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
from store_processes import RunningStore  # noqa: E402

STORE_SETTINGS = dict(mapped_file_size_commit_log=256 << 20,
                      mapped_file_size_consume_queue=300_000 * 20,
                      max_hash_slot_num=1_000_000, max_index_num=4_000_000,
                      flush_interval_commit_log=500, flush_interval_consume_queue=1000)


def fill(store: RunningStore, n: int) -> float:
    body = b"x" * 128
    t = time.perf_counter()
    with Producer(store.store_dir, window=32) as p:
        pending = []
        for k in range(0, n, 1000):
            pending.append(p.send_async([Message(topic="Bench", body=body, tags="t",
                                                 keys=[f"k{i}"], queue_id=i % 4)
                                         for i in range(k, min(n, k + 1000))]))
        assert all(r.ok for h in pending for r in h.result())
    while store.slot(Slot.DISPATCHED) < store.slot(Slot.WRITTEN):
        time.sleep(0.05)
    return time.perf_counter() - t


PROJECTED = "queue_offset long, body binary"


def batch_read(spark, where: dict, n: int, repeat: int, pids: tuple[int, int],
               schema: str | None = None) -> tuple[float, dict[str, float]]:
    """The best rows/s of ``repeat`` runs, and the mean CPU seconds per row of each kind
    of process (``cpu_by_kind(*pids)``) over them."""
    from pyspark.sql import functions as F
    best = 0.0
    cpu: dict[str, float] = {}
    for attempt in range(repeat + 1):   # the first run warms the JVM and the workers up
        reader = spark.read.format("rocketstore")
        if schema:
            reader = reader.schema(schema)
        df = reader.options(**where).option("topic", "Bench").load()
        before = cpu_by_kind(*pids)
        t = time.perf_counter()
        rows, size = df.agg(F.count("*"), F.sum(F.length("body"))).first()
        elapsed = time.perf_counter() - t
        after = cpu_by_kind(*pids)
        assert rows == n and size == 128 * n, (rows, size)
        if attempt:
            best = max(best, n / elapsed)
            for kind in after:
                cpu[kind] = cpu.get(kind, 0.0) + (after[kind] - before.get(kind, 0.0)) \
                    / (n * repeat)
    return best, cpu


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a process, from /proc; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_by_kind(reader_pid: int, store_pid: int) -> dict[str, float]:
    """CPU seconds so far of this process's descendants but the store's (``store_pid``,
    its supervisor), as ``workers`` (Python: the pyspark daemon and its workers) and
    ``JVM``, and of the store's ``reader``."""
    if not os.path.isdir("/proc/self"):
        return {}
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _stat(int(name))
            if got is not None:
                parents[int(name)] = got
    mine, grew = {os.getpid()}, True
    while grew:
        found = {pid for pid, (parent, _) in parents.items()
                 if parent in mine and pid != store_pid} - mine
        mine |= found
        grew = bool(found)
    out = {"workers": 0.0, "JVM": 0.0, "reader": 0.0}
    for pid in mine - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                program = os.path.basename(f.read().split(b"\0")[0])
        except OSError:
            continue
        out["JVM" if program == b"java" else "workers"] += parents[pid][1]
    reader = _stat(reader_pid)
    out["reader"] = reader[1] if reader else 0.0
    return out


def streaming_latency(spark, store: RunningStore, seconds: float, tmp: str) -> list[float]:
    latencies: list[float] = []

    def on_batch(df, batch_id):
        now = time.time()
        for row in df.select("body").collect():
            latencies.append(now - struct.unpack(">d", row.body[:8])[0])

    q = (spark.readStream.format("rocketstore").option("store", store.store_dir)
         .option("topic", "Live").load().writeStream.foreachBatch(on_batch)
         .option("checkpointLocation", os.path.join(tmp, "ck"))
         .trigger(processingTime="0 seconds").start())
    time.sleep(5)  # the first micro-batches plan and start the Python workers

    def produce():
        with Producer(store.store_dir) as p:
            end = time.time() + seconds
            while time.time() < end:
                p.send("Live", struct.pack(">d", time.time()) + b"y" * 120, queue_id=0)
                time.sleep(0.02)

    sender = threading.Thread(target=produce)
    sender.start()
    sender.join()
    time.sleep(3)
    q.stop()
    return sorted(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--warm-up-rounds", type=int, default=1)
    args = parser.parse_args()
    from rocketstore.spark.demo import spark_session
    tmp = tempfile.mkdtemp(prefix="bench-spark-", dir=os.getcwd())
    try:
        with RunningStore(pathlib.Path(tmp), **STORE_SETTINGS) as store:
            print(f"MALLOC_TOP_PAD_={os.environ.get('MALLOC_TOP_PAD_', '(unset)')}")
            fill_s = fill(store, args.messages)
            print(f"filled {args.messages} messages in {fill_s:.1f} s", flush=True)
            t = time.perf_counter()
            spark = spark_session("rocketstore-bench")
            print(f"Spark session started in {time.perf_counter() - t:.1f} s", flush=True)
            configurations = [(path, where, columns, schema)
                              for path, where in (("local", {"store": store.store_dir}),
                                                  ("remote", {"endpoint":
                                                              f"ipc://{store.store_dir}"}))
                              for columns, schema in (("all columns", None),
                                                      ("2 columns", PROJECTED))]
            pids = (store.child_pid("reader"), store.proc.pid)
            for _ in range(args.warm_up_rounds):
                for _, where, _, schema in configurations:
                    batch_read(spark, where, args.messages, 0, pids, schema)
            for path, where, columns, schema in configurations:
                rate, cpu = batch_read(spark, where, args.messages, args.repeat, pids, schema)
                per_row = ", ".join(f"{kind} {s * 1e6:.2f}" for kind, s in cpu.items())
                print(f"batch read, {path} path, {columns}: {rate:,.0f} rows/s "
                      f"(CPU µs per row: {per_row})", flush=True)
            lat = streaming_latency(spark, store, args.latency_seconds, tmp)
            if lat:
                pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
                print(f"streaming end to end ({len(lat)} messages): p50 {pct(0.5):.0f} ms, "
                      f"p99 {pct(0.99):.0f} ms, max {lat[-1] * 1000:.0f} ms")
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
