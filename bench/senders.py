"""Benchmark: one-at-a-time senders, process by process and thread by thread.

Not a test: it prints a table and asserts nothing. For each count of sender processes
(``--senders 1,8``) it runs three rows, each sender sending 128-byte messages with a
tag and a key one at a time, each waiting for its answer:

    row     the senders                                     the other end
    ------  ----------------------------------------------  ---------------------------
    echo    a bare DEALER, a 200-byte frame                 a bare ROUTER echo process
    bare    the producer's own DEALER socket: the frame     a store (``rocketstore up``,
            ``Producer.send`` would send, sent and          ASYNC_FLUSH), its writer
            received bare (no waiting machinery, no         answering
            reading of the answer)
    send    ``Producer.send``                               the same store

and for each the messages a second and the CPU per message (µs, utime + stime from
``/proc``) of every process at the other end and of the senders together, main thread
and other threads apart (a ZeroMQ socket's I/O thread is the "other" of a sender and
of the echo; the writer's also holds its allocation and statistics threads, idle here).
The rows side by side show what the store adds to ZeroMQ's own cost (echo -> bare) and
what ``Producer.send`` adds around the socket (bare -> send).

    python bench/senders.py [--senders 1,8] [--seconds 5] [--rounds 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import shutil
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare import BODY, _echo, _round_trips, stop_echo  # noqa: E402
from store_pipeline import STORE_SETTINGS, RunningStore, _proc_cpu_s  # noqa: E402
from rocketstore.client import Producer  # noqa: E402
from rocketstore.shm.positions import PID  # noqa: E402
from rocketstore.wire import protocol  # noqa: E402

TOPIC = "Senders"
STORE_PROCESSES = ("writer", "dispatcher", "flusher")
ROWS = ("echo", "bare", "send")


# ============================================================================ CPU
def thread_cpu_s(pid: int) -> tuple[float, float]:
    """``(main thread, other threads)`` CPU seconds of process ``pid``
    (``store_pipeline._proc_cpu_s`` of the process and of its main thread); zeros once
    it is gone."""
    main = _proc_cpu_s(pid, main_thread=True)
    return main, max(0.0, _proc_cpu_s(pid) - main)


class CpuMeter:
    """CPU spent by named groups of processes between ``start`` and ``stop``."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups
        self.before: dict[str, tuple[float, float]] = {}
        self.spent: dict[str, tuple[float, float]] = {}

    def _now(self) -> dict[str, tuple[float, float]]:
        return {name: tuple(map(sum, zip(*(thread_cpu_s(p) for p in pids))))
                for name, pids in self.groups.items()}

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> None:
        after = self._now()
        self.spent = {name: (after[name][0] - self.before[name][0],
                             after[name][1] - self.before[name][1]) for name in after}


# ============================================================================ senders
def _sender(row: str, where: str, seconds: float, start, out, done) -> None:
    """One sender process: ``row``'s sends to ``where`` for ``seconds`` once ``start``
    is set; puts ``(sent, seconds)``, then stays (its CPU still readable) until
    ``done``."""
    if row == "echo":
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(where)
        out.put(_round_trips(dealer, seconds, start)[:2])
        done.wait()
        dealer.close(0)
        ctx.term()
        return
    with Producer(where) as p:
        for i in range(200):                    # connected, and both sides warm
            p.send(TOPIC, BODY, tags="TagA", keys=[f"warm{i}"])
        start.wait()
        send = _bare_send(p) if row == "bare" else p.send
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            send(TOPIC, BODY, tags="TagA", keys=[f"k{n}"])
            n += 1
        out.put((n, time.perf_counter() - t0))
        done.wait()


def _bare_send(p: Producer):
    """``send``'s frame (``protocol.encode_plain_send``) sent and received on the
    producer's own socket, the answer not read."""
    dealer = p._dealer
    sock_send, sock_recv = dealer.socket.send, dealer.socket.recv

    def send(topic: str, body: bytes, tags: str, keys: list[str]) -> None:
        request_id = dealer.next_id()
        sock_send(protocol.encode_plain_send(request_id, topic, body, tags, keys[0], None,
                                             time.time_ns() // 1_000_000))
        sock_recv()
    return send


def run_row(row: str, where: str, senders: int, seconds: float,
            others: dict[str, list[int]]) -> dict:
    """``senders`` processes sending ``row``'s way; the rate, and each group's CPU per
    message (µs: main thread, other threads)."""
    ctx = multiprocessing.get_context("spawn")
    start, out, done = ctx.Event(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_sender, args=(row, where, seconds, start, out, done))
             for _ in range(senders)]
    for p in procs:
        p.start()
    try:
        time.sleep(2.0 + 0.2 * senders)         # every sender imported and warm
        meter = CpuMeter({**others, "senders": [p.pid for p in procs]})
        meter.start()
        start.set()
        results = [out.get(timeout=seconds + 120) for _ in procs]
        meter.stop()
    finally:
        done.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    sent = sum(n for n, _ in results)
    return {"rate": sent / max(s for _, s in results),
            "cpu": {name: (main / sent * 1e6, other / sent * 1e6)
                    for name, (main, other) in meter.spent.items()}}


# ============================================================================ the ends
def echo_rows(root: str, senders: int, seconds: float) -> dict:
    endpoint = f"ipc://{os.path.abspath(root)}/echo.sock"
    server = multiprocessing.get_context("spawn").Process(target=_echo, args=(endpoint,))
    server.start()
    try:
        return run_row("echo", endpoint, senders, seconds, {"echo server": [server.pid]})
    finally:
        stop_echo(endpoint, server)


def store_row(root: str, row: str, senders: int, seconds: float) -> dict:
    """``row`` against a fresh ASYNC_FLUSH store."""
    path = pathlib.Path(tempfile.mkdtemp(dir=root))
    store = RunningStore(path, flush_disk_type="ASYNC_FLUSH", **STORE_SETTINGS)
    store.start()
    try:
        table = store.table()
        try:
            pids = {name: [table.get_process(name, PID)] for name in STORE_PROCESSES}
        finally:
            table.close()
        return run_row(row, store.store_dir, senders, seconds, pids)
    finally:
        store.stop(timeout=120)
        store.kill_all()


# ============================================================================ table
def print_rows(senders: int, rows: list[tuple[str, dict]]) -> None:
    print(f"\n{senders} sender process{'es' if senders > 1 else ''}, one at a time: "
          "CPU per message, µs (main thread + other threads)")
    print(f"{'row':<6} {'msgs/s':>9}  {'in all':>7}  groups")
    for row, r in rows:
        total = sum(main + other for main, other in r["cpu"].values())
        groups = "  ".join(f"{name} {main:.1f}+{other:.1f}"
                           for name, (main, other) in r["cpu"].items())
        print(f"{row:<6} {r['rate']:>9,.0f}  {total:>7.1f}  {groups}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", default="1,8",
                    help="comma-separated counts of sender processes (1,8)")
    ap.add_argument("--seconds", type=float, default=5.0, help="time per row (5)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="the rows this many times, in turn (1)")
    args = ap.parse_args()
    counts = [int(n) for n in args.senders.split(",")]
    root = tempfile.mkdtemp(prefix="rsbench-senders-", dir=os.getcwd())
    try:
        for senders in counts:
            for round_no in range(args.rounds):
                rows = []
                for row in ROWS:
                    print(f"{senders} senders, round {round_no + 1}: {row}", file=sys.stderr)
                    rows.append((row, echo_rows(root, senders, args.seconds) if row == "echo"
                                 else store_row(root, row, senders, args.seconds)))
                print_rows(senders, rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
