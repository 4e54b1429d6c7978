"""Benchmark: what publishing WRITTEN costs the writer (the position table's
``publish_written``: two slots and a sequence word in shared memory).

Not a test: it prints the best of three runs of 200,000 publications and asserts
nothing (about 1 us here).

    python bench/positions.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

from rocketstore.procs.recovery import recover_and_publish, unlink_shared  # noqa: E402
from rocketstore.shm.positions import PositionTable  # noqa: E402
from rocketstore.storage import Message, MessageStore, StoreConfig  # noqa: E402


def main() -> None:
    root = os.path.join(tempfile.mkdtemp(prefix="rsbench-"), "store")
    config = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=1 << 20)
    with MessageStore(config) as store:
        store.put(Message(topic="T", body=b"x"))
    recovered = recover_and_publish(config)
    writer = PositionTable.attach(root, process="writer")
    try:
        written, ts = writer.read_written()
        n, best = 200_000, float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for i in range(written + 1, written + 1 + n):
                writer.publish_written(i, ts)
            best = min(best, (time.perf_counter() - start) / n)
            written += n
        print(f"publish_written: {best * 1e9:.0f} ns")
    finally:
        writer.close()
        recovered.table.close()
        unlink_shared(root)
        recovered.lock.release()


if __name__ == "__main__":
    main()
