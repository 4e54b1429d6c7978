"""Each store process's statistics (RocketMQ's StoreStatsService), shared through a file.

A process counts what it does in a ``ProcessStats``: counters, optionally labelled
(``put_messages_total{topic="Orders"}``), and histograms with fixed buckets (RocketMQ's
``putMessageDistributeTime`` buckets, made finer below 10 ms, where this store's
latencies live). ``Service.serve`` calls ``publish_if_due`` after every turn: at most
every ``PUBLISH_INTERVAL_S`` the whole snapshot is written to
``stats-<process>.json`` in ``stats_dir`` (temporary file, then rename: a reader never
sees half a file). ``procs.metrics`` reads these files on every scrape.

The loop only encodes the snapshot; a thread of the process writes and renames it
(``SnapshotFile``). A rename over the last snapshot frees that file's blocks, and the
file system may do that while the rename waits (a ``discard`` mount issues the discard
and waits for it): 0.15 ms at the median here, 4 ms at p99 on a quiet disk and up to
51 ms behind a large write-back. On the writer's or the dispatcher's loop that stalled
every message sent meanwhile, once a second. The last snapshot, at a clean stop, is
written by the loop itself once the thread is done.

A thread was not enough while the files lay on the store's disk: the freed blocks and
their discards ride the file system's journal commit, which the writer's own page
faults on the CommitLog can wait for (a first write to a page stamps the file's mtime
through the journal: the likeliest path; the stall is measured, the path inferred).
Measured on ext4 mounted with ``discard``, 4,000 messages a second in frames of 20:
send -> visible stalled 20-28 ms about 30 s after the store started, in each of five
20 s runs, and 0-9 ms with the snapshots not written. So ``stats_dir`` is
in memory (``/dev/shm``, beside the position table's segment), where a rename frees no
disk block; the run directory only where there is no ``/dev/shm``. A clean stop removes
it (``remove_published``), as it unlinks the segment.

Counters start at zero when a process starts (a restart is a counter reset, which
Prometheus expects); each file carries the process's pid and start time. Counting is a
dict update: the writer counts per batch, never per byte.
"""

from __future__ import annotations

import bisect
import gc
import json
import os
import threading
import time
from collections import defaultdict
from typing import Callable

from rocketstore.shm.bus import run_dir
from rocketstore.shm.positions import SHM_DIR, segment_name
from rocketstore.storage.status import PutMessageStatus

PUBLISH_INTERVAL_S = 1.0
_OK = PutMessageStatus.PUT_OK.value
# seconds; RocketMQ's 0, 10, 50, 100, 200, 500 ms, 1-5 s, 10 s, with finer steps below 10 ms
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.2,
                     0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0)


def stats_dir(store_dir: str, create: bool = True) -> str:
    """Where the store's processes publish their snapshots: ``{SHM_DIR}/rocketstore-
    <digest>-stats`` (the position table's segment name; mode 0700, as the run
    directory), made when missing unless ``create`` is false (a reader's lookup); the
    run directory where there is no ``SHM_DIR``."""
    if not os.path.isdir(SHM_DIR):
        return run_dir(store_dir, create)
    path = os.path.join(SHM_DIR, segment_name(store_dir).lstrip("/") + "-stats")
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def stats_path(store_dir: str, process: str, create: bool = True) -> str:
    return os.path.join(stats_dir(store_dir, create), f"stats-{process}.json")


class Histogram:
    """Counts per bucket (``le`` upper bounds, +Inf last), their sum and count."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def snapshot(self) -> dict:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total,
                "count": self.count}


class ProcessStats:
    """The counters and histograms of one process."""

    def __init__(self, process: str):
        self.process = process
        self.started_ms = int(time.time() * 1000)
        self.counters: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
        self.labels: dict[str, tuple[str, ...]] = {}
        self.histograms: dict[str, Histogram] = {}
        self._next_publish = 0.0
        self._file: SnapshotFile | None = None
        self.extra: dict = {}        # a process's own state for status (the HA sessions)
        # how many objects procs.service froze after setup, counted once there: the
        # count walks every frozen object (0.4-1 ms for a store process's ~35,000), too
        # long for the loop's once-a-second snapshot (it only falls later, as frozen
        # objects are freed)
        self.frozen = 0
        # counts a process keeps aside on a hot path, added to the counters by each
        # callback before every snapshot (the writer's one-record lane)
        self.before_snapshot: list[Callable[[], None]] = []

    def add(self, name: str, value: int = 1, **labels: str) -> None:
        """Add ``value`` to counter ``name`` with ``labels`` (the same label names each
        time for one counter)."""
        key = tuple(labels.values())
        if name not in self.labels:
            self.labels[name] = tuple(labels)
        self.counters[name][key] += value

    def observe(self, name: str, seconds: float, times: int = 1) -> None:
        histogram = self.histograms.get(name)
        if histogram is None:
            histogram = self.histograms[name] = Histogram()
        histogram.observe(seconds, times)

    def snapshot(self) -> dict:
        for add_kept_counts in self.before_snapshot:
            add_kept_counts()
        return {
            "process": self.process, "pid": os.getpid(), "started_ms": self.started_ms,
            "counters": {name: {"labels": list(self.labels[name]),
                                "values": [[list(k), v] for k, v in values.items()]}
                         for name, values in self.counters.items()},
            "histograms": {name: h.snapshot() for name, h in self.histograms.items()},
            # the cyclic collector: objects frozen at setup (procs.service), and the
            # collections of each generation so far (a full one can pause a few ms)
            "gc": {"frozen": self.frozen,
                   "collections": [g["collections"] for g in gc.get_stats()]},
            **self.extra,
        }

    def publish_if_due(self, store_dir: str) -> None:
        """The snapshot, handed to this process's ``SnapshotFile`` thread when
        ``PUBLISH_INTERVAL_S`` passed since the last (the loop only encodes it)."""
        now = time.monotonic()
        if now >= self._next_publish:
            self._next_publish = now + PUBLISH_INTERVAL_S
            if self._file is None:
                self._file = SnapshotFile(stats_path(store_dir, self.process))
            self._file.submit(self._encoded())

    def publish(self, store_dir: str) -> None:
        """Write the snapshot now, in the calling thread, after the ``SnapshotFile``
        thread (if any) wrote what it was handed and stopped."""
        if self._file is not None:
            self._file.close()
            self._file = None
        write_snapshot(stats_path(store_dir, self.process), self._encoded())

    def _encoded(self) -> bytes:
        return json.dumps(self.snapshot(), separators=(",", ":")).encode()


class SnapshotFile:
    """A thread that writes the newest snapshot it was handed to ``path``
    (``write_snapshot``), so that the rename's wait falls on it, not on the process's
    loop. Only the newest snapshot waiting is kept; the thread starts with the first
    and is a daemon (a killed process's last snapshot is whatever was written)."""

    def __init__(self, path: str):
        self.path = path
        self._cond = threading.Condition()
        self._pending: bytes | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, data: bytes) -> None:
        with self._cond:
            self._pending = data
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="stats-snapshot")
                self._thread.start()
            self._cond.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is waiting, then stop the thread (waiting at most ``timeout_s``)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                data, self._pending = self._pending, None
                closing = self._closing
            if data is not None:
                write_snapshot(self.path, data)
            if closing:
                return


def write_snapshot(path: str, data: bytes) -> None:
    """``data`` as the file ``path``: a temporary file renamed over it (a reader never
    sees half a file; each thread its own). A failure is not the process's concern
    (metrics only)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_native_id()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass


def clear_published(store_dir: str) -> None:
    """Remove every process's published snapshot, and the temporary file of one killed
    while it wrote (a store starting: they are the last run's, and a process that does
    not run now would go on showing its old one)."""
    where = stats_dir(store_dir, create=False)
    try:
        names = os.listdir(where)
    except OSError:
        return
    for name in names:
        if name.startswith("stats-"):
            try:
                os.unlink(os.path.join(where, name))
            except FileNotFoundError:
                pass


def remove_published(store_dir: str) -> None:
    """``clear_published``, then the directory itself when it is ``SHM_DIR``'s (a
    clean stop: memory is not left holding a stopped store's statistics)."""
    clear_published(store_dir)
    where = stats_dir(store_dir, create=False)
    if os.path.dirname(where) == SHM_DIR:
        try:
            os.rmdir(where)
        except OSError:
            pass


def read_published(store_dir: str, process: str) -> dict | None:
    """The last snapshot ``process`` published, or None."""
    try:
        with open(stats_path(store_dir, process, create=False), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------- the writer
def count_puts(stats: ProcessStats, topics: list[str], sizes) -> None:
    """RocketMQ's putMessageTopicTimesTotal and putMessageTopicSizeTotal for a batch of
    stored records (``sizes``: a numpy array or a list)."""
    first = topics[0]
    if topics.count(first) == len(topics):
        stats.add("put_messages_total", len(topics), topic=first)
        stats.add("put_bytes_total", int(sum(sizes) if type(sizes) is list else sizes.sum()),
                  topic=first)
        return
    for topic, size in zip(topics, sizes if type(sizes) is list else sizes.tolist()):
        stats.add("put_messages_total", 1, topic=topic)
        stats.add("put_bytes_total", size, topic=topic)


def count_reply(stats: ProcessStats, statuses, seconds: float) -> None:
    """One answered SEND: its latency (putMessageDistributeTime) and every result
    that is not PUT_OK, by status (``statuses``: status values, a numpy array or a
    list)."""
    stats.observe("put_latency_seconds", seconds)
    count_refused(stats, statuses)


def count_refused(stats: ProcessStats, statuses) -> None:
    """Every result of an answered SEND that is not PUT_OK, by status (``statuses``:
    status values, a numpy array or a list)."""
    refused = ([v for v in statuses if v != _OK] if type(statuses) is list else
               statuses[statuses != _OK].tolist())
    for value in refused:
        stats.add("put_refused_total", 1, status=_status_name(value))


def _status_name(value: int) -> str:
    try:
        return PutMessageStatus(value).name
    except ValueError:
        return str(value)
