"""Benchmark of the embedded store: put, dispatch, pull and query throughput.

Not a test: it prints a table and asserts nothing about time. Run from the project
root (``python bench/embedded.py [--count N] [--body 128,1024] [--repeat N]
[--rows async-batch,async-one,sync-batch,sync-one]``); every run uses a fresh temporary
directory on the working directory's file system. Each rate is the best of ``--repeat``
runs, counted against the thread's CPU time (what a busy machine distorts least), with
the wall-clock rate beside it for the pull and the puts. To compare two trees, run each
one's bench in turn, A, B, A, B, with the same ``--rows``: the load of the machine moves
between runs, and only rates taken side by side compare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocketstore.storage import Message, MessageStore, StoreConfig  # noqa: E402

BATCH = 256
ROWS = {"async-batch": (1, "ASYNC_FLUSH", BATCH), "async-one": (4, "ASYNC_FLUSH", 1),
        "sync-batch": (4, "SYNC_FLUSH", BATCH), "sync-one": (40, "SYNC_FLUSH", 1)}
# row name -> (the share of --count it puts, 1/N; flush; messages a put)


def _config(root: str, flush: str) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=256 << 20,
                       max_hash_slot_num=1_000_000, max_index_num=4_000_000,
                       flush_disk_type=flush)


def _timed(fn) -> tuple[float, object]:
    """(this thread's CPU seconds, fn's result); the wall seconds in ``_wall``."""
    global _wall
    w, t = time.perf_counter(), time.thread_time()
    out = fn()
    t, _wall = time.thread_time() - t, time.perf_counter() - w
    return max(t, 1e-9), out


_wall = 0.0


def run(count: int, body_size: int, flush: str, batch: int) -> dict:
    root = tempfile.mkdtemp(prefix="rsbench-", dir=".")
    try:
        store = MessageStore(_config(root, flush), background=False)
        store.load()
        body = os.urandom(body_size)
        msgs = [Message(topic="BenchTopic", body=body, tags=f"Tag{i % 8}", keys=[f"k{i}"],
                        queue_id=i % 4) for i in range(count)]

        def put():
            if batch == 1:
                for m in msgs:
                    store.put(m)
            else:
                for i in range(0, count, batch):
                    store.put_batch(msgs[i:i + batch])

        t_put, _ = _timed(put)
        wall_put = _wall
        t_dispatch, n = _timed(store.dispatch)

        def pull():
            got = 0
            for q in range(4):
                off = 0
                while True:
                    g = store.get_message("bench", "BenchTopic", q, off, 32)
                    if not g.messages:
                        break
                    got += len(g.messages)
                    off = g.next_begin_offset
            return got

        t_pull, got = _timed(pull)
        wall_pull = _wall
        keys = [f"k{i}" for i in range(0, count, max(1, count // 2000))]
        t_query, _ = _timed(lambda: [store.query_message("BenchTopic", k, 1) for k in keys])
        t_close, _ = _timed(store.close)
        assert got == count, (n, got, count)
        return {"body": body_size, "flush": flush, "batch": batch,
                "put/s": count / t_put, "put/s wall": count / wall_put,
                "dispatch/s": n / t_dispatch, "pull/s": got / t_pull,
                "pull/s wall": got / wall_pull, "query/s": len(keys) / t_query,
                "MB/s put": count * body_size / t_put / 1e6, "close s": t_close}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _best(runs: list[dict]) -> dict:
    """Each rate's best over ``runs`` (the close time's least)."""
    best = dict(runs[0])
    for r in runs[1:]:
        for k, v in r.items():
            if isinstance(v, float):
                best[k] = min(best[k], v) if k == "close s" else max(best[k], v)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--body", default="128,1024")
    p.add_argument("--repeat", type=int, default=3, help="runs per row; the best is shown")
    p.add_argument("--rows", default=",".join(ROWS), help="which of " + ", ".join(ROWS))
    args = p.parse_args()
    rows = []
    for body in (int(b) for b in args.body.split(",")):
        for name in args.rows.split(","):
            share, flush, batch = ROWS[name]
            rows.append(_best([run(args.count // share, body, flush, batch)
                               for _ in range(max(1, args.repeat))]))
    cols = list(rows[0])
    print(" | ".join(f"{c:>11}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>11,.0f}" if isinstance(r[c], float) and r[c] > 10 else
                         f"{r[c]:>11.3f}" if isinstance(r[c], float) else f"{r[c]:>11}"
                         for c in cols))


if __name__ == "__main__":
    main()
