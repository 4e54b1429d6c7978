"""The rates the overview and topics pages chart: the last 15 minutes of the counters
the store's processes publish (``procs.stats``), sampled by one thread of the
dashboard every ``SAMPLE_INTERVAL_S``.

A sample is ``(t_s, puts, gets, latency_sum_s, latency_count, puts_by_topic)``: the
writer's ``put_messages_total`` (all topics, and per topic), the reader's
``get_requests_total`` and the writer's ``put_latency_seconds`` sum and count. A rate
is the difference of two samples over their interval. A process restarts its counters
at zero (its published file names its pid and start): a step whose counter went down
has no rate (None), never a negative one. Reading the statistics files costs the store
nothing: they are written about once a second whether anyone reads them or not.
"""

from __future__ import annotations

import collections
import threading
import time

from rocketstore.procs.stats import read_published

SAMPLE_INTERVAL_S = 5.0
WINDOW_S = 15 * 60


def _counter(snap: dict | None, name: str) -> tuple[int, dict[str, int]]:
    """A published counter's total and its values by first label."""
    counter = (snap or {}).get("counters", {}).get(name)
    if not counter:
        return 0, {}
    by_label: dict[str, int] = {}
    for labels, value in counter["values"]:
        key = labels[0] if labels else ""
        by_label[key] = by_label.get(key, 0) + value
    return sum(by_label.values()), by_label


def take_sample(store_dir: str, now_s: float) -> tuple:
    writer = read_published(store_dir, "writer")
    reader = read_published(store_dir, "reader")
    puts, by_topic = _counter(writer, "put_messages_total")
    gets, _ = _counter(reader, "get_requests_total")
    latency = (writer or {}).get("histograms", {}).get("put_latency_seconds") or {}
    return (now_s, puts, gets, latency.get("sum", 0.0), latency.get("count", 0), by_topic)


class History:
    """The samples of the last ``WINDOW_S``; ``start()`` samples on a daemon thread
    until ``stop()``."""

    def __init__(self, store_dir: str, interval_s: float = SAMPLE_INTERVAL_S):
        self.store_dir = store_dir
        self.interval_s = interval_s
        self.samples: collections.deque = collections.deque(
            maxlen=int(WINDOW_S / interval_s) + 1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dashboard-history",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        self.samples.append(take_sample(self.store_dir, time.time()))

    def series(self) -> dict[str, list[tuple[float, float | None]]]:
        """``puts_per_s``, ``gets_per_s`` and ``put_latency_ms`` (the mean of the puts
        answered in each step; None without any), one point per step."""
        out = {"puts_per_s": [], "gets_per_s": [], "put_latency_ms": []}
        samples = list(self.samples)
        for (t0, p0, g0, s0, c0, _), (t1, p1, g1, s1, c1, _) in zip(samples, samples[1:]):
            dt = max(t1 - t0, 1e-3)
            out["puts_per_s"].append((t1, (p1 - p0) / dt if p1 >= p0 else None))
            out["gets_per_s"].append((t1, (g1 - g0) / dt if g1 >= g0 else None))
            answered = c1 - c0
            out["put_latency_ms"].append(
                (t1, (s1 - s0) / answered * 1000 if answered > 0 else None))
        return out

    def topic_rates(self) -> dict[str, list[float | None]]:
        """Per topic, its puts per second at each step (for the sparklines)."""
        samples = list(self.samples)
        topics = {t for s in samples for t in s[5]}
        out: dict[str, list[float | None]] = {t: [] for t in topics}
        for (t0, *_, a), (t1, *_, b) in zip(samples, samples[1:]):
            dt = max(t1 - t0, 1e-3)
            for topic in topics:
                before, after = a.get(topic, 0), b.get(topic, 0)
                out[topic].append((after - before) / dt if after >= before else None)
        return out
