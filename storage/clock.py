"""The store's clocks, in one place: wall-clock milliseconds (what RocketMQ stamps on
records and files: ``System.currentTimeMillis``) and monotonic milliseconds (for
intervals and deadlines, which must not jump with the wall clock)."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch, as store and born timestamps are written."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """A clock for intervals and deadlines only."""
    return time.monotonic_ns() // 1_000_000
