"""Benchmark: the writer's acknowledgement latency across CommitLog file rolls, with the
next files made ahead (``storage.allocate``) cold or warmed (``warm_maped_file_enable``).

Not a test: it prints a table and asserts nothing. Each row starts a store
(``rocketstore up``) with small CommitLog files, so a run rolls through many of them,
and one producer sends ``--batch``-record SEND_RECORDS frames one at a time (each waits
for its acknowledgement, so every roll-over lands in some batch's latency). Reported:
messages/s, batch latency p50/p99/max, and the writer's CPU per message.

    python bench/allocation.py [--seconds 8] [--file-mb 32] [--batch 512]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from store_pipeline import _proc_cpu_s  # noqa: E402
from rocketstore.client import Producer  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
from store_processes import RunningStore  # noqa: E402


def run(label: str, seconds: float, file_mb: int, batch: int, **store) -> dict:
    with tempfile.TemporaryDirectory(dir=ROOT) as d, \
            RunningStore(pathlib.Path(d), mapped_file_size_commit_log=file_mb << 20,
                         **store) as rs:
        writer = rs.child_pid("writer")
        msgs = [Message("Alloc", os.urandom(128), tags="t", keys=[f"k{i}"], queue_id=None)
                for i in range(batch)]
        lat = []
        with Producer(rs.store_dir) as p:
            p.send_batch(msgs)
            cpu0, t0 = _proc_cpu_s(writer), time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                a = time.perf_counter()
                p.send_batch(msgs)
                lat.append(time.perf_counter() - a)
            elapsed, cpu = time.perf_counter() - t0, _proc_cpu_s(writer) - cpu0
        rs.stop()
    lat.sort()
    n = len(lat) * batch
    return {"row": label, "msgs/s": n / elapsed, "p50 ms": lat[len(lat) // 2] * 1e3,
            "p99 ms": lat[int(len(lat) * 0.99)] * 1e3, "max ms": lat[-1] * 1e3,
            "writer us/msg": cpu / n * 1e6, "files": n * 220 // (file_mb << 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--file-mb", type=int, default=32)
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args()
    rows = [run("files made ahead, cold", args.seconds, args.file_mb, args.batch),
            run("files made ahead, warmed", args.seconds, args.file_mb, args.batch,
                warm_maped_file_enable=True)]
    cols = list(rows[0])
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{v:>14.1f}" if isinstance(v, float) else f"{v!s:>14}"
                         for v in r.values()))


if __name__ == "__main__":
    main()
