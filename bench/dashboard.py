"""Benchmark: what the web console costs a store, and how long its pages take.

A store run by ``rocketstore up`` with its ``dashboard`` process is filled with
``--count`` messages (1,000,000 by default: 100-byte bodies, a tag and a key each, one
topic of 8 queues, and a consumer group committed half way). Then:

* **CPU of the store's processes while a dashboard refreshes.** Windows of
  ``--window`` seconds in turn (A, B, A, B, ...): A with nobody looking, B with a
  client fetching the overview's live part every 2 s, as an open page does. Each
  process's CPU (utime + stime from /proc) over each window, as ms of CPU per second,
  the median of the windows; the dashboard's own process apart.
* **Each page's time.** Every page fetched ``--repeat`` times: the median wall time
  and the dashboard process's CPU per fetch.

With ``--screenshots DIR`` it also saves the overview and the consumer group pages as
Chromium shows them (Debian's chromium and chromium-driver, Selenium).

Not a test: it prints tables and asserts nothing.

    python bench/dashboard.py [--count 1000000] [--window 20] [--rounds 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

import httpx  # noqa: E402

from rocketstore.client import Producer, ReaderClient  # noqa: E402
from rocketstore.shm.positions import Slot  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
from store_processes import RunningStore, free_port, wait_for  # noqa: E402

TOPIC, GROUP = "Orders", "billing"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def processes(store: RunningStore) -> dict[str, int]:
    t = store.table()
    try:
        snap = t.snapshot()
        pids = {name: p["pid"] for name, p in snap["processes"].items() if p["pid"]}
        pids["supervisor"] = snap["supervisor_pid"]
        return pids
    finally:
        t.close()


def fill(store: RunningStore, count: int) -> None:
    started = time.monotonic()
    with Producer(store.store_dir) as producer:
        pending = []
        for first in range(0, count, 512):
            batch = [Message(TOPIC, b"%-100d" % i, tags="paid", keys=[f"order-{i}"])
                     for i in range(first, min(first + 512, count))]
            pending.append(producer.send_async(batch))
            if len(pending) >= 8:
                pending.pop(0).result()
        for p in pending:
            p.result()
    wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN), timeout=600,
             what="dispatch to catch up")
    with ReaderClient(store.store_dir) as reader:
        half = {q.queue_id: q.max_offset // 2 for q in reader.offsets([TOPIC])}
        reader.commit_offsets(GROUP, TOPIC, half)
    print(f"filled {count:,} messages in {time.monotonic() - started:.0f} s")


def refresher(url: str, stop: threading.Event) -> None:
    """What an open overview does: its live part every 2 s."""
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            client.get(url + "/", headers={"X-Fragment": "live"})
            stop.wait(2.0)


def cpu_windows(store: RunningStore, url: str, window_s: float, rounds: int) -> None:
    pids = processes(store)
    rows: dict[str, dict[str, list[float]]] = {name: {"A": [], "B": []} for name in pids}
    for _ in range(rounds):
        for kind in ("A", "B"):
            stop = threading.Event()
            thread = threading.Thread(target=refresher, args=(url, stop))
            before = {name: cpu_s(pid) for name, pid in pids.items()}
            start = time.monotonic()
            if kind == "B":
                thread.start()
            time.sleep(window_s)
            elapsed = time.monotonic() - start
            after = {name: cpu_s(pid) for name, pid in pids.items()}
            stop.set()
            if kind == "B":
                thread.join()
            for name in pids:
                rows[name][kind].append((after[name] - before[name]) / elapsed * 1000)
    print(f"\nCPU, ms per second (median of {rounds} windows of {window_s:.0f} s); "
          "A: nobody looking, B: the overview refreshed every 2 s")
    print(f"{'process':<12} {'A':>8} {'B':>8}")
    total = {"A": 0.0, "B": 0.0}
    for name, r in rows.items():
        a, b = statistics.median(r["A"]), statistics.median(r["B"])
        print(f"{name:<12} {a:8.1f} {b:8.1f}")
        if name != "dashboard":
            total["A"] += a
            total["B"] += b
    print(f"{'store total':<12} {total['A']:8.1f} {total['B']:8.1f}  (all but the dashboard)")


def page_times(store: RunningStore, url: str, repeat: int) -> None:
    dashboard = processes(store)["dashboard"]
    with ReaderClient(store.store_dir) as reader:
        some = reader.query_by_key(TOPIC, "order-500000", 1) or \
            reader.query_by_key(TOPIC, "order-0", 1)
    msg_id = some[0].msg_id
    stamp = some[0].store_timestamp
    pages = {"overview": "/", "overview (live part)": "/",
             "topics": "/topics", "topic": f"/topics/{TOPIC}",
             "groups": "/groups", "group": f"/groups/{GROUP}/{TOPIC}",
             "by key": f"/messages?topic={TOPIC}&key=order-500000",
             "by msgId (message page)": f"/messages/{msg_id}",
             "by time range (1 s)": f"/messages?topic={TOPIC}&begin=@{stamp}&end=@{stamp + 1000}"}
    print(f"\nPages on {store.slot(Slot.WRITTEN) / (1 << 20):.0f} MiB of CommitLog "
          f"(median of {repeat}; the dashboard's CPU per fetch)")
    print(f"{'page':<26} {'ms':>8} {'CPU ms':>8}")
    with httpx.Client(timeout=60) as client:
        for name, path in pages.items():
            headers = {"X-Fragment": "live"} if "live" in name else {}
            walls = []
            cpu_before = cpu_s(dashboard)
            for _ in range(repeat):
                start = time.perf_counter()
                r = client.get(url + path, headers=headers)
                walls.append((time.perf_counter() - start) * 1000)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            cpu = (cpu_s(dashboard) - cpu_before) / repeat * 1000
            print(f"{name:<26} {statistics.median(walls):8.1f} {cpu:8.1f}")


def screenshots(url: str, out: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="rsbench-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1200,860",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url + "/")
        driver.save_screenshot(os.path.join(out, "dashboard-overview.png"))
        driver.set_window_size(1200, 560)
        driver.get(f"{url}/groups/{GROUP}/{TOPIC}")
        driver.save_screenshot(os.path.join(out, "dashboard-group.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    print(f"\nscreenshots in {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--screenshots", help="save the overview and a group page here")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="rsbench-dashboard-", dir=".")
    port = free_port()
    try:
        with RunningStore(work, dashboard_port=port, mapped_file_size_commit_log=128 << 20,
                          mapped_file_size_consume_queue=6_000_000,
                          max_hash_slot_num=500_000, max_index_num=2_000_000) as store:
            url = f"http://127.0.0.1:{port}"
            fill(store, args.count)
            cpu_windows(store, url, args.window, args.rounds)
            page_times(store, url, args.repeat)
            if args.screenshots:
                screenshots(url, args.screenshots)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
