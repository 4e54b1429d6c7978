"""The Spark workers' allocator setting (``rocketstore.spark.allocator``): after
``keep_heap_top`` glibc keeps the heap's top when memory is freed, as with
``MALLOC_TOP_PAD_`` in the environment; without it the heap is trimmed. Each case runs
in a fresh interpreter (the setting is per process and cannot be undone)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
