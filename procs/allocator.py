"""glibc's allocator in a process that builds large buffers again and again.

glibc serves a block over its mmap threshold (128 KiB at first, raised by itself up to
32 MiB as such blocks are freed) with a fresh mapping, and gives the top of its heap back
to the kernel once more than its trim threshold is free there; either way the next block
of that size is faulted in again, page by page, and the kernel zeroes every page first.
The reader process answers each FETCH with up to 16 MiB of records (``MAX_FETCH_BYTES``),
three buffers of that size a reply (the gathered records, the reply frame, ZeroMQ's copy
of it): with glibc's defaults it took about one page fault per 4 KiB of records, half
of its CPU per row. ``keep_large_blocks`` serves blocks up to ``MMAP_THRESHOLD_BYTES``
from the heap and keeps ``TRIM_THRESHOLD_BYTES`` free at its top, so the pages of one
reply are those of the next: the process holds up to that much more memory while idle.

A process whose environment names ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``
keeps what it names (glibc read it at start). Elsewhere than glibc nothing is tuned.
The Spark workers' setting (``rocketstore.spark.allocator``) goes through ``mallopt``
here too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3    # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20    # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = 64 << 20    # a reply's three buffers and room to spare


def keep_large_blocks() -> bool:
    """Set glibc's mmap and trim thresholds (module docstring) unless the environment
    set them. True when both are in effect."""
    return all(f"MALLOC_{name}_" in os.environ or mallopt(param, value)
               for name, param, value in (("MMAP_THRESHOLD", M_MMAP_THRESHOLD,
                                           MMAP_THRESHOLD_BYTES),
                                          ("TRIM_THRESHOLD", M_TRIM_THRESHOLD,
                                           TRIM_THRESHOLD_BYTES)))


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where it refuses or there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        call = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False            # not glibc: nothing to tune
    call.argtypes, call.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = call(param, value) == 1
    if not ok:
        log.debug("mallopt(%d, %d) refused", param, value)
    return ok
