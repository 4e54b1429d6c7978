"""Benchmark of recovery: how long an embedded store takes to start after a clean stop
and after an unclean one that lost every consume queue, index file and checkpoint.

Not a test: it prints a table and asserts nothing about time. Run from the project
root (``python bench/recovery.py [--count N] [--body BYTES]``); it works in a fresh
temporary directory on the working directory's file system and removes it.

The unclean start is the worst case RocketMQ's abnormal recovery meets: ``abort``
present and no checkpoint, so the whole CommitLog is scanned (body CRCs checked, as
``check_crc_on_recover`` asks) and every message is dispatched again. The page cache
is warm (the files were just written): the figures are CPU, not disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocketstore.storage import Message, MessageStore, StoreConfig  # noqa: E402

BATCH = 512


def _config(root: str) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root, max_hash_slot_num=5_000_000,
                       max_index_num=20_000_000)


def _fill(root: str, count: int, body_size: int) -> int:
    store = MessageStore(_config(root), background=False)
    store.load()
    body = os.urandom(body_size)
    for i in range(0, count, BATCH):
        msgs = [Message(topic="BenchTopic", body=body, tags=f"Tag{j % 8}", keys=[f"k{j}"],
                        queue_id=j % 4) for j in range(i, min(count, i + BATCH))]
        store.put_batch(msgs)
        store.dispatch()
    size = store.get_max_phy_offset()
    store.close()
    return size


def _start(root: str) -> tuple[float, int]:
    t = time.perf_counter()
    store = MessageStore(_config(root), background=False)
    store.load()
    elapsed = time.perf_counter() - t
    units = sum(cq.get_max_offset_in_queue() for cq in store.all_consume_queues())
    store.close()
    return elapsed, units


def _lose_everything_but_the_commit_log(root: str) -> None:
    for derived in ("consumequeue", "index"):
        shutil.rmtree(os.path.join(root, derived))
    os.unlink(os.path.join(root, "checkpoint"))
    open(os.path.join(root, "abort"), "w").close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rsbench-", dir=".")
    try:
        size = _fill(root, args.count, args.body)
        clean_s, clean_units = _start(root)
        _lose_everything_but_the_commit_log(root)
        unclean_s, unclean_units = _start(root)
        assert clean_units == unclean_units == args.count, (clean_units, unclean_units)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gib = size / (1 << 30)
    rows = {"messages": args.count, "commit_log_gib": round(gib, 3),
            "clean_start_s": round(clean_s, 2), "unclean_start_s": round(unclean_s, 2),
            "unclean_s_per_gib": round(unclean_s / gib, 2),
            "unclean_messages_per_s": round(args.count / unclean_s)}
    if args.json:
        print(json.dumps(rows))
        return
    for name, value in rows.items():
        print(f"{name:>24} | {value:,}" if not isinstance(value, float) else
              f"{name:>24} | {value}")


if __name__ == "__main__":
    main()
