"""Benchmark of replication (procs.ha, procs.replica): slave catch-up and SYNC_MASTER's
acknowledgement latency. Not a test: it prints a table and asserts nothing about time.

    python bench/replication.py [--megabytes 256] [--rate 500] [--seconds 5] [--batch B]

1. catch-up: a master is loaded with ``--megabytes`` of 1 KiB messages (pipelined
   batches of 512), then an empty slave starts; the time from its start until its
   WRITTEN reaches the master's (the bytes appended, whole records published) and until
   its DISPATCHED does too (its consume queues and index built), in MB/s; the CPU its
   writer and dispatcher used.
2. ack latency: one-at-a-time ``Producer.send`` at ``--rate`` messages/s for
   ``--seconds`` (128-byte bodies), against an ASYNC_MASTER and a SYNC_MASTER, each with
   its slave connected on loopback: p50, p99 and max of the send's round trip. A
   SYNC_MASTER's ack waits for the slave's report of the bytes (writer -> HA process ->
   slave writer -> HA process -> writer).

Stores live in a temporary directory under the working directory (removed at the end),
with 128 MiB CommitLog files.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rocketstore.client import Producer  # noqa: E402
from rocketstore.shm.positions import PID, PositionTable, Slot  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
from rocketstore.storage.status import PutMessageStatus  # noqa: E402
from store_processes import RunningStore, free_port, wait_for  # noqa: E402

SETTINGS = dict(mapped_file_size_commit_log=128 << 20,
                mapped_file_size_consume_queue=300_000 * 20,
                max_hash_slot_num=1_000_000, max_index_num=4_000_000,
                flush_interval_commit_log=500, flush_interval_consume_queue=1000,
                clean_resource_interval=10_000)


def pair(root: str, name: str, role: str) -> tuple[RunningStore, RunningStore]:
    port = free_port()
    for side in ("master", "slave"):
        os.makedirs(os.path.join(root, name, side))
    master = RunningStore(pathlib.Path(root, name, "master"), broker_role=role,
                          ha_listen_port=port, listen_port=free_port(), **SETTINGS)
    slave = RunningStore(pathlib.Path(root, name, "slave"), broker_role="SLAVE",
                         ha_master_address=f"127.0.0.1:{port}", listen_port=free_port(),
                         **SETTINGS)
    return master, slave


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def catch_up(root: str, megabytes: int) -> dict:
    master, slave = pair(root, "catchup", "ASYNC_MASTER")
    with master:
        body = os.urandom(1024)
        batch = [Message("Bulk", body, queue_id=None) for _ in range(512)]
        with Producer(master.store_dir, window=8) as p:
            pending = []
            while master.slot(Slot.WRITTEN) < megabytes << 20:
                pending.append(p.send_async(batch))
                if len(pending) > 8:
                    pending.pop(0).result()
            for h in pending:
                h.result()
        end = master.slot(Slot.WRITTEN)
        t0 = time.monotonic()
        with slave:
            t = PositionTable.attach(slave.store_dir)
            writer = t.get_process("writer", PID)
            dispatcher = t.get_process("dispatcher", PID)
            c0 = cpu_s(writer), cpu_s(dispatcher)
            appended = dispatched = None
            while dispatched is None:
                now = time.monotonic() - t0
                if appended is None and t.read_written()[0] >= end:
                    appended = now
                if t.get(Slot.DISPATCHED) >= end:
                    dispatched = now
                time.sleep(0.01)
            c1 = cpu_s(writer), cpu_s(dispatcher)
            t.close()
    mb = end / (1 << 20)
    return {"megabytes": round(mb, 1), "appended_s": round(appended, 2),
            "appended_mb_s": round(mb / appended, 1), "dispatched_s": round(dispatched, 2),
            "dispatched_mb_s": round(mb / dispatched, 1),
            "slave_writer_cpu_s": round(c1[0] - c0[0], 2),
            "slave_dispatcher_cpu_s": round(c1[1] - c0[1], 2)}


def ack_latency(root: str, role: str, rate: float, seconds: float) -> dict:
    master, slave = pair(root, role.lower(), role)
    with master, slave:
        wait_for(lambda: master.slot(Slot.SLAVES) == 1, what="the slave to connect")
        body = os.urandom(128)
        times, statuses = [], {}
        with Producer(master.store_dir) as p:
            p.send("Lat", body)                       # connect, create the queue
            start = time.monotonic()
            for i in range(int(rate * seconds)):
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.perf_counter()
                r = p.send("Lat", body)
                times.append(time.perf_counter() - t0)
                statuses[r.status.name] = statuses.get(r.status.name, 0) + 1
    times.sort()
    ms = lambda q: round(times[min(len(times) - 1, int(q * len(times)))] * 1000, 2)  # noqa: E731
    return {"role": role, "sends": len(times), "p50_ms": ms(0.50), "p99_ms": ms(0.99),
            "max_ms": round(times[-1] * 1000, 2), "statuses": statuses,
            "all_put_ok": statuses == {PutMessageStatus.PUT_OK.name: len(times)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megabytes", type=int, default=256)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=32 * 1024,
                    help="ha_transfer_batch_size: the largest DATA block")
    args = ap.parse_args()
    SETTINGS["ha_transfer_batch_size"] = args.batch
    root = tempfile.mkdtemp(prefix="bench-replication-", dir=os.getcwd())
    try:
        c = catch_up(root, args.megabytes)
        print(f"catch-up of {c['megabytes']} MB: appended in {c['appended_s']} s "
              f"({c['appended_mb_s']} MB/s), dispatched in {c['dispatched_s']} s "
              f"({c['dispatched_mb_s']} MB/s); slave CPU: writer {c['slave_writer_cpu_s']} s, "
              f"dispatcher {c['slave_dispatcher_cpu_s']} s")
        print(f"ack latency, one-at-a-time sends at {args.rate:.0f}/s for {args.seconds} s:")
        for role in ("ASYNC_MASTER", "SYNC_MASTER"):
            r = ack_latency(root, role, args.rate, args.seconds)
            print(f"  {role:<13} p50 {r['p50_ms']:>6} ms  p99 {r['p99_ms']:>6} ms  "
                  f"max {r['max_ms']:>7} ms  ({r['sends']} sends, {r['statuses']})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
