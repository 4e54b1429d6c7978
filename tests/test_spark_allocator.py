"""The Spark workers' allocator setting (``rocketstore.spark.allocator``): after
``keep_heap_top`` glibc keeps the heap's top when memory is freed, as with
``MALLOC_TOP_PAD_`` in the environment; without it the heap is trimmed. Each case runs
in a fresh interpreter (the setting is per process and cannot be undone). And in Spark:
the Python worker that ran a ``rocketstore`` read keeps its heap's top afterwards, with
nothing in its environment asking for it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from rocketstore.client import Producer
from rocketstore.shm.positions import Slot
from rocketstore.spark.allocator import TOP_PAD_BYTES
from rocketstore.storage import Message
from store_processes import RunningStore, wait_for

PROBE = r"""
import ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
# glibc's defaults, fixed: freeing a large mapped block earlier in this interpreter's life
# would have raised the trim threshold on its own (its dynamic thresholds)
libc.mallopt(-1, 128 << 10)     # M_TRIM_THRESHOLD
libc.mallopt(-3, 128 << 10)     # M_MMAP_THRESHOLD
if sys.argv[1] == "tune":
    from rocketstore.spark.allocator import keep_heap_top
    assert keep_heap_top() and keep_heap_top()
blocks = [0] * 800          # the list's own storage comes first, below the blocks: it would
for i in range(800):        # otherwise hold the heap's top up after they are freed
    blocks[i] = libc.malloc(64 << 10)                    # 50 MiB below the mmap threshold
grown = libc.mallinfo2().arena
for b in reversed(blocks):
    libc.free(b)
print(grown, libc.mallinfo2().arena)
"""


def heap_after_free(mode: str) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TOP_PAD_"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tuned_worker_keeps_its_heap_top_and_a_plain_one_trims_it():
    grown, after = heap_after_free("plain")
    assert grown >= 50 << 20 and after < 8 << 20      # trimmed back
    grown, after = heap_after_free("tune")
    assert grown >= 50 << 20 and after >= 50 << 20    # kept for the next batch


def heap_after_freeing(n_blocks: int = 1280, block: int = 64 << 10) -> int:
    """Bytes glibc holds from the system after ``n_blocks`` heap blocks (80 MiB, each
    below any mmap threshold) are taken and given back, in this process: the top pad
    at least when it is set, what is in use when the heap is trimmed (even with the
    trim threshold glibc raises by itself, 64 MiB at most). Its struct is made here: a
    ctypes class cannot be pickled to a Spark worker."""
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    blocks = (ctypes.c_void_p * n_blocks)()     # made before the blocks, below them
    for i in range(n_blocks):
        blocks[i] = libc.malloc(block)
    for i in reversed(range(n_blocks)):
        libc.free(blocks[i])
    return libc.mallinfo2().arena


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.skipif("MALLOC_TOP_PAD_" in os.environ,
                    reason="the workers would inherit MALLOC_TOP_PAD_ from this process")
def test_a_spark_worker_that_read_a_topic_keeps_its_heap_top(spark, tmp_path):
    """The format's reader, run by Spark in its Python worker, then in that same process
    (right after the read's last batch) the heap is given back: it stays at the top pad.
    The read is the ``rocketstore`` format's own, behind a format that adds the probe."""
    from pyspark import cloudpickle
    from rocketstore.spark.source import BatchReader, RocketStoreDataSource

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers lack tests/
    probes = tmp_path / "probes"
    probes.mkdir()
    probe_dir = str(probes)

    class ProbedReader(BatchReader):
        def read(self, partition):
            yield from super().read(partition)
            arena = heap_after_freeing()
            with open(os.path.join(probe_dir, f"{os.getpid()}-{partition.queue_id}"), "w") as f:
                f.write(f"{arena} {os.environ.get('MALLOC_TOP_PAD_', '-')}")

    class ProbedSource(RocketStoreDataSource):
        @classmethod
        def name(cls) -> str:
            return "rocketstore_heap_probe"

        def reader(self, schema):
            reader = super().reader(schema)
            return ProbedReader(reader.opts, reader.columns)

    spark.dataSource.register(ProbedSource)
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            assert all(r.ok for r in p.send_batch(
                [Message("Heap", b"x" * 128, tags="t", keys=[f"k{i}"], queue_id=i % 2)
                 for i in range(2000)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) >= rs.slot(Slot.WRITTEN), 30, "dispatch")
        rows = spark.read.format("rocketstore_heap_probe").option("store", rs.store_dir) \
            .option("topic", "Heap").load().collect()
    assert len(rows) == 2000
    seen = {name: (probes / name).read_text().split() for name in os.listdir(probes)}
    assert len(seen) == 2, seen                       # one per queue: each read probed
    for name, (arena, env_pad) in seen.items():
        assert env_pad == "-", "the worker's environment must not set MALLOC_TOP_PAD_"
        assert int(arena) >= TOP_PAD_BYTES, (name, int(arena) >> 20)
