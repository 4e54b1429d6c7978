"""Benchmark of ``pipeline.arrow_codec.records_to_batch``: records/s on one core.

Not a test: it prints a table and asserts nothing about time. Run from the project
root (``python bench/arrow_codec.py [--count N] [--body 128] [--repeat 9]
[--profile]``). The records (IPv4 hosts, topic ``BenchTopic``, a tag, one key, one
user property and the body) are built in memory once; each row converts them
``--repeat`` times and reports the best run:

    row                       what is converted
    adjacent                  one call over the records packed end to end (a mapped file)
    non-adjacent              one call; 0-63 bytes of garbage before each record
    adjacent, N a call        calls of N records each

Then it runs the same rows again in a child process started with
``MALLOC_TOP_PAD_=268435456``: glibc otherwise returns freed heap memory to the kernel
after every call, and the next call page-faults it back in (on this VM that costs
~15 ms per 100,000 records); with the pad the process keeps it.

``--profile`` prints the top of a cProfile of the adjacent row afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocketstore.spark.arrow_codec import records_to_batch  # noqa: E402
from rocketstore.storage import record  # noqa: E402
from rocketstore.storage.message import encode_host, encode_properties  # noqa: E402

BORN_HOST = encode_host(("10.0.0.7", 53120))
STORE_HOST = encode_host(("10.0.0.1", 10911))


def build(count: int, body_size: int, max_gap: int) -> tuple[bytes, np.ndarray]:
    """``count`` records with ``0..max_gap-1`` random bytes before each one."""
    rng = np.random.default_rng(7)
    body = rng.bytes(body_size)
    parts, starts, pos = [], [], 0
    for i in range(count):
        gap = int(rng.integers(0, max_gap)) if max_gap else 0
        parts.append(rng.bytes(gap))
        pos += gap
        props = encode_properties({"TAGS": f"Tag{i % 8}", "KEYS": f"k{i}",
                                   "trace": f"t-{i % 1000}"}).encode()
        rec = record.encode(topic=b"BenchTopic", body=body, properties=props,
                            queue_id=i % 4, flag=0, queue_offset=i // 4, physical_offset=pos,
                            sys_flag=0, born_timestamp=1_700_000_000_000 + i,
                            born_host=BORN_HOST, store_timestamp=1_700_000_000_005 + i,
                            store_host=STORE_HOST, reconsume_times=0,
                            prepared_transaction_offset=0)
        parts.append(bytes(rec))
        starts.append(pos)
        pos += len(rec)
    return b"".join(parts), np.array(starts, np.int64)


def best_rate(buf: bytes, starts: np.ndarray, per_call: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        rows = 0
        for i in range(0, len(starts), per_call):
            rows += records_to_batch(buf, starts[i:i + per_call]).num_rows
        best = min(best, time.perf_counter() - t)
        assert rows == len(starts)
    return len(starts) / best


TOP_PAD = "268435456"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--body", type=int, default=128)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    adjacent = build(args.count, args.body, 0)
    gaps = build(args.count, args.body, 64)
    rows = [("adjacent", best_rate(*adjacent, args.count, args.repeat)),
            ("non-adjacent", best_rate(*gaps, args.count, args.repeat))]
    rows += [(f"adjacent, {per:,} a call", best_rate(*adjacent, per, args.repeat))
             for per in (16384, 4096, 1024) if per < args.count]
    pad = os.environ.get("MALLOC_TOP_PAD_")
    if not args.child:
        print(f"{args.count:,} records, {args.body}-byte bodies, "
              f"{len(adjacent[0]) / args.count:.0f} bytes a record; best of {args.repeat}")
        print(f"{'row':>26} | {'MALLOC_TOP_PAD_':>15} | {'records/s':>11} | {'MB/s':>6}")
    for name, rate in rows:
        mb = rate * len(adjacent[0]) / args.count / 1e6
        print(f"{name:>26} | {pad or '-':>15} | {rate:>11,.0f} | {mb:>6,.0f}", flush=True)
    if not args.child and pad is None:
        subprocess.run([sys.executable, __file__, "--child", "--count", str(args.count),
                        "--body", str(args.body), "--repeat", str(args.repeat)],
                       env={**os.environ, "MALLOC_TOP_PAD_": TOP_PAD}, check=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeat):
            records_to_batch(*adjacent)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
