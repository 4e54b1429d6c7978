"""A long soak: mixed load on a running store while its processes are SIGKILLed.

Not part of the test suite (minutes long); it checks correctness and prints a table, and
exits non-zero when a check fails. Run from the project root:

    python bench/soak.py [--minutes 3] [--quick] [--seed N]

For the whole run, in separate processes:

* producers: batches through ``send_async`` and single ``send``s, one of them idempotent,
  some messages delayed (delay level 1-3: the scheduler delivers them to their topic);
* a consumer group reading everything (committing as it goes) and a reader-socket
  client querying keys;
* every 2-5 s (seeded) one store process (writer, flusher, dispatcher, cleaner,
  scheduler or reader) is SIGKILLed; the supervisor restarts it.

At the end, once every delayed message is due and dispatched: every acknowledged
message is read back exactly once (delayed ones in their real topic, read for as long as
the scheduler still delivers them), the consumers saw no message twice within a process
life, and ``rocketstore check`` is clean. The table:
messages acknowledged, kills and restarts per process, throughput, the longest pause
between acknowledgements (overall, and per killed process: for each kill, the gap between
a producer's last acknowledgement before it and its first after it; the querier's answers
for the reader, the consumer's messages for the dispatcher), and every anomaly found.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rocketstore.client import ClientError, Consumer, Producer, ReaderClient, RequestTimeout  # noqa: E402
from rocketstore.shm.positions import PROCESS_NAMES, Slot  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
from store_processes import RunningStore, cli, wait_for  # noqa: E402

TOPIC = "Soak"
SPAWN = multiprocessing.get_context("spawn")


def _message(worker: int, n: int, rng: random.Random) -> Message:
    delay = rng.choice((0, 0, 0, 0, 1, 2, 3))
    return Message(topic=TOPIC, body=b"%02d-%08d-" % (worker, n) + bytes(rng.randrange(200)),
                   tags=f"t{n % 4}", keys=[f"w{worker}-{n}"], delay_level=delay,
                   queue_id=None)


def producer(store_dir: str, worker: int, seconds: float, seed: int, out) -> None:
    """Send for ``seconds``; report every acknowledged body, the longest wait and when
    each answered send was acknowledged (``time.monotonic``, the same clock in every
    process)."""
    rng = random.Random(seed)
    acked, longest, n, times = [], 0.0, 0, []
    deadline = time.monotonic() + seconds
    with Producer(store_dir, idempotent=worker == 0, timeout_ms=10_000) as p:
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = [_message(worker, n + i, rng) for i in range(rng.choice((1, 1, 20, 100)))]
            n += len(batch)
            results = _send(p, batch, deadline)
            if results is None:
                continue                   # the writer was away: unacknowledged
            now = time.monotonic()
            for m, r in zip(batch, results):
                if r.ok:
                    acked.append(m.body[:12])
                    longest = max(longest, now - last)
                    last = now
            if any(r.ok for r in results):
                times.append(now)
    out.put(("producer", worker, acked, longest, times))


def _send(p: Producer, batch: list[Message], deadline: float) -> list | None:
    """The batch's results, or None when it went unanswered. A plain producer gives up
    at the first ``RequestTimeout`` (``ConnectionLost`` included); an idempotent one
    already resent a batch the writer's restart left in flight, and sends it again
    with its own sequences after a timeout (a writer that was paused) until the end."""
    first = p.next_sequence if p.idempotent else None
    while True:
        try:
            return p.send_batch(batch, first_sequence=first)
        except (RequestTimeout, ClientError):
            if not p.idempotent or time.monotonic() > deadline:
                return None


def consumer(store_dir: str, seconds: float, out) -> None:
    """Read the topic as a group for ``seconds``, committing; report duplicates seen."""
    seen, twice, times = set(), 0, []
    deadline = time.monotonic() + seconds
    with Consumer(store_dir, "soak-readers", TOPIC, wait_for_topic=True) as c:
        while time.monotonic() < deadline:
            try:
                got = c.poll(256, timeout_ms=200)
                for m in got:
                    key = m.body[:12]
                    twice += key in seen
                    seen.add(key)
                if got:
                    times.append(time.monotonic())
                c.commit()
            except Exception:  # noqa: BLE001 - a store process restarting: read on
                time.sleep(0.1)
    out.put(("consumer", 0, len(seen), twice, times))


def querier(store_dir: str, seconds: float, out) -> None:
    asked = found = 0
    times = []
    deadline = time.monotonic() + seconds
    rng = random.Random(7)
    with ReaderClient(store_dir, timeout_ms=5000) as r:
        while time.monotonic() < deadline:
            try:
                asked += 1
                found += bool(r.query_by_key(TOPIC, f"w1-{rng.randrange(2000)}"))
                times.append(time.monotonic())
            except (RequestTimeout, ClientError):
                pass
            time.sleep(0.05)
    out.put(("querier", 0, asked, found, times))


def pause_around(times: list[float], at: float) -> float | None:
    """The gap between the last time in ``times`` before ``at`` and the first after it
    (None when ``at`` is not between two of them)."""
    i = bisect.bisect_left(times, at)
    return times[i] - times[i - 1] if 0 < i < len(times) else None


def pauses_per_process(kill_times: list[tuple[str, float]], reports: list) -> dict:
    """For each killed process, the longest pause it caused: a producer's gap around a
    kill of any process (the writer is the one a producer waits for), the querier's
    around the reader's kills, the consumer's around the dispatcher's."""
    series = [r[-1] for r in reports if r[0] == "producer"]
    watched = {"reader": [r[-1] for r in reports if r[0] == "querier"],
               "dispatcher": [r[-1] for r in reports if r[0] == "consumer"]}
    longest: dict[str, float] = {}
    for victim, at in kill_times:
        for times in series + watched.get(victim, []):
            gap = pause_around(times, at)
            if gap is not None:
                longest[victim] = round(max(longest.get(victim, 0.0), gap), 2)
    return longest


def read_back(store_dir: str, acked: set[bytes], quiet_s: float = 10.0) -> dict[bytes, int]:
    """How many times each body key is in the topic, read by a new group: on until every
    acknowledged one was read and a poll finds nothing more, or nothing new came for
    ``quiet_s``. Delayed messages reach the topic only when the scheduler delivers
    them: one restarted often near the end (and slowed by the load) is still
    delivering when dispatch has caught up with what was written."""
    stored: dict[bytes, int] = {}
    left = set(acked)
    last_new = time.monotonic()
    with Consumer(store_dir, "soak-final", TOPIC) as c:
        while time.monotonic() - last_new < quiet_s:
            got = c.poll(1024, timeout_ms=1000)
            if not got and not left:
                break
            if got:
                last_new = time.monotonic()
            for m in got:
                key = m.body[:12]
                stored[key] = stored.get(key, 0) + 1
                left.discard(key)
    return stored


def run(minutes: float, seed: int) -> dict:
    rng = random.Random(seed)
    seconds = minutes * 60
    root = tempfile.mkdtemp(prefix="rssoak-", dir=".")
    store = RunningStore(root, mapped_file_size_commit_log=8 << 20,
                         message_delay_level="1s 2s 3s")
    store.start()
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=producer, args=(store.store_dir, w, seconds, seed + w, out))
               for w in range(3)]
    workers.append(SPAWN.Process(target=consumer, args=(store.store_dir, seconds, out)))
    workers.append(SPAWN.Process(target=querier, args=(store.store_dir, seconds, out)))
    for w in workers:
        w.start()
    kills = {name: 0 for name in PROCESS_NAMES}
    kill_times: list[tuple[str, float]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(rng.uniform(2, 5))
        victim = rng.choice(PROCESS_NAMES)
        pid = store.child_pid(victim)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
                kills[victim] += 1
                kill_times.append((victim, time.monotonic()))
            except ProcessLookupError:
                pass
    reports = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
    elapsed = time.monotonic() - t0
    time.sleep(4)                                        # every delayed message due
    wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN), timeout=60,
             what="dispatch to catch up")
    acked = [b for r in reports if r[0] == "producer" for b in r[2]]
    stored = read_back(store.store_dir, set(acked))
    restarts = {name: store.restarts(name) for name in PROCESS_NAMES}
    store.stop()
    check = cli("check", "--config", store.config_path)
    anomalies = []
    missing = [b for b in acked if b not in stored]
    doubled = [b for b, k in stored.items() if k > 1]
    if missing:
        anomalies.append(f"{len(missing)} acknowledged messages missing, e.g. {missing[:3]}")
    if doubled:
        anomalies.append(f"{len(doubled)} messages stored twice, e.g. {doubled[:3]}")
    if "consistent" not in check.stdout:
        anomalies.append(f"check: {check.stdout.strip()[:300]}")
    if not anomalies:
        shutil.rmtree(root, ignore_errors=True)      # kept for a look when something failed
    consumer_report = next(r for r in reports if r[0] == "consumer")
    querier_report = next(r for r in reports if r[0] == "querier")
    return {
        "minutes": round(elapsed / 60, 2), "acknowledged": len(acked),
        "stored": sum(stored.values()), "acks_per_s": round(len(acked) / elapsed),
        "longest_ack_pause_s": round(max(r[3] for r in reports if r[0] == "producer"), 2),
        "longest_pause_s_per_killed_process": pauses_per_process(kill_times, reports),
        "kills": kills, "restarts": restarts,
        "consumer_seen": consumer_report[2], "consumer_duplicates": consumer_report[3],
        "queries": querier_report[2], "queries_found": querier_report[3],
        "anomalies": anomalies, "store": store.store_dir,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="45 seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(0.75 if args.quick else args.minutes, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name:>22} | {value}")
    return 1 if result["anomalies"] else 0


if __name__ == "__main__":
    sys.exit(main())
