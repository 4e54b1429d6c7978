"""Benchmark: rocketstore side by side with Redis Streams on this machine, in one run.

Not a test: it prints a table (or ``--json``) and asserts nothing. Both sides get the
same messages: 128-byte bodies, a tag and a key each.

    figure                                rocketstore                     Redis 7 Streams
    ------------------------------------  ------------------------------  ---------------------------
    ingest, ASYNC_FLUSH                   send_async, 512 a frame, 8 in   XADD pipelines of 1000,
                                          flight, one producer            appendfsync everysec
    ingest, SYNC_FLUSH                    the same, acked after fdatasync XADD pipelines of 1000,
                                                                          appendfsync always
    consume, one process                  Consumer(store, group, topic),  XREAD COUNT 1000, each
                                          no settings, poll(512), each    body's length read
                                          body's length read
    one-at-a-time send                    Producer.send, each waits       XADD, each waits
      its floor                           a bare ZeroMQ DEALER/ROUTER echo
                                          of a SEND-sized frame between two
                                          Python processes (no store work)
      the store's CPU per send            the writer's and dispatcher's
                                          main threads, per message
    8 senders one at a time               8 producer processes, each      8 client processes, each
                                          Producer.send                   XADD, each waits
    8 threads one at a time               8 threads sharing one           8 threads sharing one
                                          Producer, each Producer.send    redis-py client, each
                                                                          XADD
      its floor                           8 bare DEALERs through one
                                          ROUTER echo process
      CPU per message                     the senders, writer,            the clients, redis-server
                                          dispatcher, flusher (all
                                          threads); the echo's too
    send -> visible p99, 4,000 msgs/s     frames of 20, a Consumer in     (not measured)
                                          another process; measured once
                                          right after the ingest and once
                                          after its write-back finished
    the two ASYNC rows again with the     transient_store_pool_enable      -
    TransientStorePool

and, for the stores' side, the CPU of each store process per message of the ASYNC
ingest. Redis runs when ``redis-server`` is installed (``apt-get install redis-server``;
the client is ``pip install redis hiredis``); without it only rocketstore's column is
filled. The rocketstore side reuses ``bench/store_pipeline.py``'s measurements.

When the grpc extra is installed, a table of RocketMQ's official Python client through
the proxy process follows (``grpc_rows``, with ``bench/grpc_proxy.py``'s measurements):
``Producer.send`` one at a time, ``send_async`` with 64 futures in flight, and a
SimpleConsumer's receive + ack, each with the proxy's and the writer's CPU per message.

    python bench/compare.py [--quick] [--seconds 5] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from store_pipeline import (  # noqa: E402
    STORE_SETTINGS, Bench, RunningStore, _proc_cpu_s, _store_pids)
from store_processes import free_port, wait_for  # noqa: E402
from rocketstore.client import Consumer, Producer  # noqa: E402
from rocketstore.shm.positions import Slot  # noqa: E402

BODY = os.urandom(128)
GOALS = {"ingest ASYNC_FLUSH": 2.5, "ingest SYNC_FLUSH": 1.9, "consume": 2.5,
         "one-at-a-time": 0.8, "one-at-a-time x8": 1.0}   # one-at-a-time: of the echo floor
SENDERS = 8
THREADS = 8


# ============================================================================ rocketstore
def rocketstore_rows(args: argparse.Namespace, root: str) -> dict:
    bench = Bench(args)
    out: dict = {}
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        path = os.path.join(root, flush.lower())
        os.makedirs(path)
        store = RunningStore(pathlib.Path(path), flush_disk_type=flush, **STORE_SETTINGS)
        store.start()
        try:
            row = bench.ingest(store, flush, 128, 1)
            out[f"ingest {flush}"] = row["msgs_s"]
            if flush == "ASYNC_FLUSH":
                out["cpu_us_per_msg"] = {n: c / row["msgs_s"] * 1e6 for n, c in row["cpu"].items()}
                out["cpu_us_per_msg"]["producer"] = row["producer_cpu"] / row["msgs_s"] * 1e6
                out["latency p99 ms, right after"] = bench.latency(store, flush)["p99_ms"]
                out["flush settle s"] = flushed_everything(store)
                settled = bench.latency(store, flush)
                out["latency p99 ms"], out["latency p50 ms"] = settled["p99_ms"], settled["p50_ms"]
                out["latency p999 ms"] = settled["p999_ms"]
                out["one-at-a-time"], out["cpu_us_per_send"] = one_at_a_time_cpu(
                    store, args.seconds)
                out["zeromq echo"] = zeromq_echo(root, args.seconds)
                out["zeromq echo x8"], out["echo cpu_us_per_msg x8"] = zeromq_echo_many(
                    root, args.seconds)
                out["one-at-a-time x8"], out["cpu_us_per_msg x8"] = many_one_at_a_time(
                    lambda: _senders(store.store_dir, args.seconds), store_processes(store))
                with Producer(store.store_dir) as p:
                    p.send("Threads", BODY, tags="TagA", keys=["warm"])
                    out["threads x8"] = threads_one_at_a_time(
                        lambda n: p.send("Threads", BODY, tags="TagA", keys=[f"k{n}"]),
                        args.seconds)
                stored = bench.fill(store, "Consume", args.consume_count, 128)
                out["consume"], out["consumer cpu_us_per_msg"] = default_consume(
                    store.store_dir, "Consume", stored)
        finally:
            store.stop(timeout=120)
            store.kill_all()
    out.update(pool_rows(bench, root))
    return out


def pool_rows(bench: "Bench", root: str) -> dict:
    """The ASYNC ingest and send->visible p99 again, with the TransientStorePool (256 MiB
    buffers, RocketMQ's commit every 200 ms): what the pool costs and buys."""
    path = os.path.join(root, "transient_pool")
    os.makedirs(path)
    store = RunningStore(pathlib.Path(path), flush_disk_type="ASYNC_FLUSH",
                         transient_store_pool_enable=True, transient_store_pool_size=3,
                         **STORE_SETTINGS)
    store.start()
    try:
        row = bench.ingest(store, "ASYNC_FLUSH", 128, 1)
        return {"pool ingest ASYNC_FLUSH": row["msgs_s"],
                "pool cpu_us_per_msg": {n: c / row["msgs_s"] * 1e6
                                        for n, c in row["cpu"].items()},
                "pool latency p99 ms": bench.latency(store, "ASYNC_FLUSH")["p99_ms"]}
    finally:
        store.stop(timeout=120)
        store.kill_all()


def flushed_everything(store: RunningStore, timeout: float = 120.0) -> float:
    """Wait until FLUSHED reaches WRITTEN (the page cache holds nothing dirty of the
    CommitLog); the seconds it took. The ingest before leaves hundreds of MB for the
    flusher: measured right after, the latency row shows that write-back as much as the
    send->visible path (p99 25-140 ms against 4-6 ms once it is done)."""
    table = store.table()
    try:
        t0 = time.monotonic()
        while (table.get(Slot.FLUSHED) < table.read_written()[0]
               and time.monotonic() - t0 < timeout):
            time.sleep(0.05)
        return time.monotonic() - t0
    finally:
        table.close()


def store_processes(store: RunningStore) -> dict[str, int]:
    """The pids of the store processes on a send's way: writer, dispatcher, flusher."""
    table = store.table()
    try:
        pids = _store_pids(store, table)
    finally:
        table.close()
    return {name: pids[name] for name in ("writer", "dispatcher", "flusher")}


def one_at_a_time_cpu(store: RunningStore, seconds: float) -> tuple[float, dict]:
    """``one_at_a_time``, and the CPU the writer's and the dispatcher's main threads
    spent per send meanwhile (microseconds)."""
    pids = {name: pid for name, pid in store_processes(store).items() if name != "flusher"}
    before = {name: _proc_cpu_s(pid, main_thread=True) for name, pid in pids.items()}
    rate, sent = one_at_a_time(store.store_dir, seconds, with_count=True)
    cpu = {name: (_proc_cpu_s(pid, main_thread=True) - before[name]) / sent * 1e6
           for name, pid in pids.items()}
    return rate, cpu


def _consume(store_dir: str, topic: str, count: int, out) -> None:
    """What a user writes: ``Consumer(store, group, topic)``, no settings, ``poll(512)``
    until ``count`` messages came, each body's length read."""
    got = nbytes = 0
    with Consumer(store_dir, "compare-consume", topic) as c:
        c.assignment()                      # membership settled before the clock starts
        t0, cpu0 = time.perf_counter(), time.process_time()
        while got < count:
            msgs = c.poll(512, 1000)
            if not msgs:
                break
            got += len(msgs)
            nbytes += sum(len(m.body) for m in msgs)
        out.put((got, time.perf_counter() - t0, time.process_time() - cpu0))


def default_consume(store_dir: str, topic: str, count: int) -> tuple[float, float]:
    """Messages a second of a default Consumer reading ``count`` dispatched messages
    from the start, in a process of its own, and its CPU per message (us)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(store_dir, topic, count, out))
    proc.start()
    try:
        got, secs, cpu = out.get(timeout=600)
    finally:
        proc.join(60)
    return got / max(1e-9, secs), cpu / max(1, got) * 1e6


def _sender(store_dir: str, seconds: float, start, out) -> None:
    with Producer(store_dir) as p:
        p.send("Senders", BODY, tags="TagA", keys=["warm"])
        start.wait()
        n, t0, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            p.send("Senders", BODY, tags="TagA", keys=[f"k{n}"])
            n += 1
        out.put((n, time.perf_counter() - t0, time.process_time() - cpu0))


def _senders(store_dir: str, seconds: float) -> list:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    return [ctx, start, out, [ctx.Process(target=_sender, args=(store_dir, seconds, start, out))
                              for _ in range(SENDERS)]]


def many_one_at_a_time(make, servers: dict[str, int]) -> tuple[float, dict[str, float]]:
    """Messages a second of ``SENDERS`` processes each sending one at a time (each waits
    for its answer), started together; and the CPU per message (us, all threads) of the
    senders together and of each process of ``servers`` (name: pid) meanwhile, with
    their ``total``: on two cores both sides of this row are bound by CPU, so where a
    message's CPU goes is what sets the rate. Each sender puts ``(messages, seconds,
    its CPU seconds)`` when done."""
    _, start, out, procs = make()
    for p in procs:
        p.start()
    time.sleep(2.0)                 # every process imported and connected
    before = {name: _proc_cpu_s(pid) for name, pid in servers.items()}
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    cpu = {name: _proc_cpu_s(pid) - before[name] for name, pid in servers.items()}
    for p in procs:
        p.join(60)
    sent = sum(n for n, _, _ in results)
    cpu = {"senders": sum(c for _, _, c in results), **cpu}
    per_msg = {name: seconds / max(1, sent) * 1e6 for name, seconds in cpu.items()}
    per_msg["total"] = sum(per_msg.values())
    return sent / max(secs for _, secs, _ in results), per_msg


def threads_one_at_a_time(send, seconds: float) -> float:
    """Messages a second of ``THREADS`` threads of this process each calling
    ``send(n)`` one at a time (a client they share: rocketstore's ``Producer`` groups
    what they send together, redis-py's client gives each its own connection)."""
    stop, go = threading.Event(), threading.Barrier(THREADS + 1)
    counts = [0] * THREADS

    def work(i: int) -> None:
        go.wait()
        n = 0
        while not stop.is_set():
            send(n)
            n += 1
        counts[i] = n
    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def one_at_a_time(store_dir: str, seconds: float, with_count: bool = False):
    with Producer(store_dir) as p:
        p.send("OneByOne", BODY, tags="TagA", keys=["warm"])
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            p.send("OneByOne", BODY, tags="TagA", keys=[f"k{n}"])
            n += 1
        rate = n / (time.perf_counter() - t0)
        return (rate, n) if with_count else rate


def _echo(endpoint: str) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    while True:
        parts = router.recv_multipart()
        if parts[-1] == b"stop":
            break
        router.send_multipart(parts)
    ctx.destroy(0)


def zeromq_echo(root: str, seconds: float) -> float:
    """Round trips a second of a bare DEALER -> ROUTER -> DEALER echo of a 200-byte
    frame (a one-message SEND is about that) between two Python processes over ipc://:
    what any one-at-a-time send through pyzmq can reach on this machine, store work
    aside."""
    endpoint = f"ipc://{os.path.abspath(root)}/echo.sock"
    proc = multiprocessing.get_context("spawn").Process(target=_echo, args=(endpoint,))
    proc.start()
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        n, secs, _ = _round_trips(dealer, seconds)
        rate = n / secs
        dealer.send(b"stop")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        dealer.close(0)
        ctx.term()
    return rate


def _round_trips(dealer: zmq.Socket, seconds: float,
                 start=None) -> tuple[int, float, float]:
    """Echo round trips of a 200-byte frame one at a time for ``seconds``, after 200
    untimed ones (connected, both sides warm) and ``start``'s go when given: how many,
    the seconds they took and this process's CPU seconds meanwhile."""
    frame = b"x" * 200
    for _ in range(200):
        dealer.send(frame)
        dealer.recv()
    if start is not None:
        start.wait()
    n, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        dealer.send(frame)
        dealer.recv()
        n += 1
    return n, time.perf_counter() - t0, time.process_time() - cpu0


def _echo_sender(endpoint: str, seconds: float, start, out) -> None:
    """One of ``zeromq_echo_many``'s clients: round trips one at a time, as ``_sender``."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    out.put(_round_trips(dealer, seconds, start))
    dealer.close(0)
    ctx.term()


def zeromq_echo_many(root: str, seconds: float) -> tuple[float, dict[str, float]]:
    """Round trips a second of ``SENDERS`` client processes each echoing one at a time
    through one ROUTER echo process (``zeromq_echo``'s): the floor of the eight-sender
    row, store work aside; and ``many_one_at_a_time``'s CPU per message."""
    endpoint = f"ipc://{os.path.abspath(root)}/echo-many.sock"
    proc = multiprocessing.get_context("spawn").Process(target=_echo, args=(endpoint,))
    proc.start()

    def make() -> list:
        ctx = multiprocessing.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        return [ctx, start, out, [ctx.Process(target=_echo_sender,
                                              args=(endpoint, seconds, start, out))
                                  for _ in range(SENDERS)]]
    try:
        return many_one_at_a_time(make, {"echo": proc.pid})
    finally:
        stop_echo(endpoint, proc)


def stop_echo(endpoint: str, proc) -> None:
    """Tell the ``_echo`` process ``proc`` at ``endpoint`` to stop, and wait for it
    (killed after 10 s)."""
    ctx = zmq.Context()
    stopper = ctx.socket(zmq.DEALER)
    stopper.connect(endpoint)
    stopper.send(b"stop")
    proc.join(10)
    if proc.is_alive():
        proc.kill()
    stopper.close(0)
    ctx.term()


# ============================================================================ Redis
class RedisServer:
    def __init__(self, root: str, fsync: str):
        import redis
        self.dir = tempfile.mkdtemp(dir=root)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", fsync, "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


def xadd_pipelined(r, seconds: float, stream: str = "s", pipe_size: int = 1000) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pipe = r.pipeline(transaction=False)
        for i in range(pipe_size):
            pipe.xadd(stream, {"body": BODY, "tag": "TagA", "key": f"k{n + i}"})
        pipe.execute()
        n += pipe_size
    return n / (time.perf_counter() - t0)


def xadd_one_by_one(r, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        r.xadd("one", {"body": BODY, "tag": "TagA", "key": f"k{n}"})
        n += 1
    return n / (time.perf_counter() - t0)


def _xadd_client(port: int, seconds: float, start, out) -> None:
    import redis
    r = redis.Redis(port=port)
    r.ping()
    start.wait()
    n, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        r.xadd("many", {"body": BODY, "tag": "TagA", "key": f"k{n}"})
        n += 1
    out.put((n, time.perf_counter() - t0, time.process_time() - cpu0))
    r.close()


def _xadd_clients(port: int, seconds: float) -> list:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    return [ctx, start, out, [ctx.Process(target=_xadd_client, args=(port, seconds, start, out))
                              for _ in range(SENDERS)]]


def xread_all(r, stream: str = "s", count: int = 1000) -> float:
    """Every entry, reading each body's length once: the same work per message as the
    rocketstore consumer, which takes each polled message's ``body``."""
    total, nbytes, last, t0 = 0, 0, "0-0", time.perf_counter()
    while True:
        got = r.xread({stream: last}, count=count)
        if not got:
            break
        entries = got[0][1]
        total += len(entries)
        nbytes += sum(len(fields[b"body"]) for _, fields in entries)
        last = entries[-1][0]
    return total / (time.perf_counter() - t0)


def redis_rows(args: argparse.Namespace, root: str) -> dict:
    out: dict = {}
    server = RedisServer(root, "everysec")
    try:
        out["ingest ASYNC_FLUSH"] = xadd_pipelined(server.client, args.seconds)
        out["consume"] = xread_all(server.client)
        out["one-at-a-time"] = xadd_one_by_one(server.client, args.seconds)
        out["one-at-a-time x8"], out["cpu_us_per_msg x8"] = many_one_at_a_time(
            lambda: _xadd_clients(server.port, args.seconds), {"redis-server": server.proc.pid})
        out["threads x8"] = threads_one_at_a_time(
            lambda n: server.client.xadd("threads", {"body": BODY, "tag": "TagA", "key": f"k{n}"}),
            args.seconds)
    finally:
        server.close()
    server = RedisServer(root, "always")
    try:
        out["ingest SYNC_FLUSH"] = xadd_pipelined(server.client, args.seconds)
    finally:
        server.close()
    return out


def redis_available() -> str:
    """Empty when Redis can run here, else what is missing."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client is not installed (pip install redis hiredis)"
    return ""


# ============================================================================ gRPC proxy
GRPC_WINDOW = 64            # send_async futures in flight
GRPC_BATCH = 32             # a SimpleConsumer receive's batch (the proxy's bound)
GRPC_ROWS = ("Producer.send, one at a time", f"send_async, {GRPC_WINDOW} in flight",
             f"SimpleConsumer receive({GRPC_BATCH}) + ack")


def grpc_available() -> str:
    """Empty when the official client's rows can run here, else what is missing."""
    try:
        import grpc  # noqa: F401
        import rocketmq  # noqa: F401
    except ImportError as e:
        return f"the grpc extra is not installed ({e.name}): pip install 'rocketstore[grpc]'"
    return ""


def grpc_rows(args: argparse.Namespace, root: str) -> dict:
    """RocketMQ's official Python client (rocketmq-python-client) through the proxy
    process of an ASYNC_FLUSH store: per row, messages per second and the CPU per message
    of the proxy and of the writer (all their threads, from /proc; the client's own CPU,
    in this process, is not counted). The receive row pops and acks the messages the two
    send rows stored, until all are acked or ``args.seconds`` end."""
    import grpc_proxy
    from rocketmq import ClientConfiguration, Credentials
    path = os.path.join(root, "grpc")
    os.makedirs(path)
    port = free_port()
    store = RunningStore(pathlib.Path(path), grpc_listen_port=port, **STORE_SETTINGS)
    store.start()
    try:
        wait_for(lambda: store.child_pid("proxy"), what="the proxy")
        config = ClientConfiguration(f"127.0.0.1:{port}", Credentials())
        one = grpc_proxy.grpc_sends(config, store, args.seconds, 1)
        many = grpc_proxy.grpc_sends(config, store, args.seconds, GRPC_WINDOW)
        acked = grpc_receive_acks(config, store, one["count"] + many["count"], args.seconds)
        return dict(zip(GRPC_ROWS, (one, many, acked)))
    finally:
        store.stop(timeout=120)
        store.kill_all()


def grpc_receive_acks(config, store: RunningStore, count: int, seconds: float) -> dict:
    """A SimpleConsumer's receives of ``GRPC_BATCH``, each message acked, until ``count``
    are acked or ``seconds`` end (no trailing empty long poll is counted)."""
    import grpc_proxy
    from rocketmq import FilterExpression, SimpleConsumer
    consumer = SimpleConsumer(config, "compare-group", {grpc_proxy.TOPIC: FilterExpression()},
                              await_duration=1)
    consumer.startup()
    try:
        with grpc_proxy.Meter(store) as m:
            deadline = time.monotonic() + seconds
            while m.count < count and time.monotonic() < deadline:
                for message in consumer.receive(GRPC_BATCH, 30):
                    consumer.ack(message)
                    m.count += 1
    finally:
        consumer.shutdown()
    return m.row()


def grpc_summary(rounds: list[tuple[dict, dict]]) -> dict:
    """Per row of the official client's, each round's figures: msgs/s and the proxy's
    and the writer's CPU per message (us)."""
    out: dict = {}
    for name in GRPC_ROWS:
        rows = [rs["grpc"][name] for rs, _ in rounds if name in rs.get("grpc", {})]
        out[name] = {k: [r[k] for r in rows] for k in ("msgs_s", "proxy_cpu_us",
                                                        "writer_cpu_us")}
    return out


def print_grpc_table(s: dict) -> None:
    print("RocketMQ's official Python client through the gRPC proxy (rocketmq-python-client, "
          "ASYNC_FLUSH):")
    print(f"  {'row':<36} {'msgs/s':>19} {'proxy CPU us/msg':>22} {'writer CPU us/msg':>22}")
    for name, row in s.items():
        if not row["msgs_s"]:
            continue
        print(f"  {name:<36} {_spread(row['msgs_s'], ',.0f'):>19} "
              f"{_spread(row['proxy_cpu_us'], ',.0f'):>22} "
              f"{_spread(row['writer_cpu_us'], ',.0f'):>22}")


# ============================================================================ table
ROWS = ("ingest ASYNC_FLUSH", "ingest SYNC_FLUSH", "consume", "one-at-a-time",
        "one-at-a-time x8", "threads x8")


def _spread(values: list[float], fmt: str) -> str:
    """The median, and the range when there is more than one value."""
    text = format(statistics.median(values), fmt)
    if len(values) > 1:
        text += f" ({format(min(values), fmt)}-{format(max(values), fmt)})"
    return text


def summary(rounds: list[tuple[dict, dict]]) -> dict:
    """Per figure, its values in each round and each round's ratio (rocketstore's
    figure over Redis's of the same round: the two sides ran minutes apart at most)."""
    out: dict = {}
    for name in ROWS:
        mine = [rs[name] for rs, _ in rounds if name in rs]
        theirs = [rd[name] for _, rd in rounds if name in rd]
        ratios = [rs[name] / rd[name] for rs, rd in rounds if name in rs and rd.get(name)]
        out[name] = {"rocketstore": mine, "redis": theirs, "ratio": ratios}
    for key in ("zeromq echo", "zeromq echo x8", "consumer cpu_us_per_msg", "latency p99 ms", "latency p50 ms",
                "latency p999 ms", "latency p99 ms, right after", "flush settle s",
                "pool ingest ASYNC_FLUSH", "pool latency p99 ms"):
        out[key] = [rs[key] for rs, _ in rounds if key in rs]
    out["floor ratio"] = [rs["one-at-a-time"] / rs["zeromq echo"] for rs, _ in rounds
                          if rs.get("zeromq echo")]
    out["floor ratio x8"] = [rs["one-at-a-time x8"] / rs["zeromq echo x8"]
                             for rs, _ in rounds if rs.get("zeromq echo x8")]
    for key in ("cpu_us_per_msg", "pool cpu_us_per_msg", "cpu_us_per_send",
                "cpu_us_per_msg x8", "echo cpu_us_per_msg x8"):
        out[key] = _by_name([rs.get(key, {}) for rs, _ in rounds])
    out["redis cpu_us_per_msg x8"] = _by_name([rd.get("cpu_us_per_msg x8", {})
                                               for _, rd in rounds])
    return out


def _by_name(dicts: list[dict[str, float]]) -> dict[str, list[float]]:
    """Each name's values over rounds' dicts (a round without it adds none)."""
    names = dict.fromkeys(n for d in dicts for n in d)
    return {n: [d[n] for d in dicts if n in d] for n in names}


def print_x8_notes(s: dict) -> None:
    """The eight-sender row's floor, and each side's CPU per message."""
    if s["zeromq echo x8"]:
        print(f"  (the eight-sender row's floor, {SENDERS} DEALER clients echoing one at a "
              f"time through one ROUTER: {_spread(s['zeromq echo x8'], ',.0f')} round "
              f"trips/s; rocketstore is {_spread(s['floor ratio x8'], '.2f')}x of it)")
    sides = [(label, s[key]) for label, key in (
        ("rocketstore", "cpu_us_per_msg x8"), ("Redis", "redis cpu_us_per_msg x8"),
        ("the echo", "echo cpu_us_per_msg x8")) if s[key]]
    if sides:
        print("  (CPU per message of the eight-sender row, all threads, us: " + "; ".join(
            f"{label} {_spread(cpu['total'], '.1f')} = " + ", ".join(
                f"{n} {_spread(v, '.1f')}" for n, v in cpu.items() if n != "total")
            for label, cpu in sides) + ")")


def print_table(s: dict, rounds: int, missing: str) -> None:
    if rounds > 1:
        print(f"{rounds} rounds, each side in turn: the median of each figure, its range in "
              "brackets; each ratio is of one round's two figures")
    print(f"{'figure':<28} {'rocketstore':>31} {'Redis':>27} {'ratio':>18} {'goal':>5}")
    for name in ROWS:
        row = s[name]
        mine = _spread(row["rocketstore"], ",.0f") if row["rocketstore"] else "-"
        theirs = _spread(row["redis"], ",.0f") if row["redis"] else "-"
        ratio = _spread(row["ratio"], ".2f") + "x" if row["ratio"] else "-"
        goal = f"{GOALS[name]}x" if name in GOALS else "-"
        print(f"{name + ' (msgs/s)':<28} {mine:>31} {theirs:>27} {ratio:>18} {goal:>5}")
        if name == "consume" and s["consumer cpu_us_per_msg"]:
            print(f"  (the consumer's CPU per message: "
                  f"{_spread(s['consumer cpu_us_per_msg'], '.2f')} us)")
        if name == "one-at-a-time" and s["zeromq echo"]:
            print(f"  (its floor, a bare ZeroMQ DEALER/ROUTER echo between two Python "
                  f"processes: {_spread(s['zeromq echo'], ',.0f')} round trips/s; "
                  f"rocketstore is {_spread(s['floor ratio'], '.2f')}x of it, goal "
                  f"{GOALS[name]}x; the goal column of this row is of the floor)")
            cpu = s["cpu_us_per_send"]
            if cpu:
                print("  (CPU per send of the store's main threads, us: " + ", ".join(
                    f"{n} {_spread(v, '.1f')}" for n, v in cpu.items()) + ")")
        if name == "one-at-a-time x8":
            print_x8_notes(s)
    print(f"{'send->visible p99 (ms)':<28} {_spread(s['latency p99 ms'], '.2f'):>31} "
          f"{'-':>27} {'-':>18} {'< 2':>5}   (p50 {_spread(s['latency p50 ms'], '.2f')} ms, "
          f"p999 {_spread(s['latency p999 ms'], '.2f')} ms)")
    print(f"  (right after the ingest, while its {_spread(s['flush settle s'], '.1f')} s of "
          f"write-back ran: p99 {_spread(s['latency p99 ms, right after'], '.2f')} ms)")
    for key, label in (("cpu_us_per_msg", "ASYNC ingest"),
                       ("pool cpu_us_per_msg", "ASYNC ingest, transient pool")):
        cpu = sorted(s[key].items(), key=lambda kv: -statistics.median(kv[1]))
        print(f"CPU per message of the {label} (us): "
              + ", ".join(f"{n} {_spread(v, '.1f')}" for n, v in cpu))
    print(f"{'with the transient pool:':<28} ingest ASYNC "
          f"{_spread(s['pool ingest ASYNC_FLUSH'], ',.0f')} msgs/s, send->visible p99 "
          f"{_spread(s['pool latency p99 ms'], '.1f')} ms")
    if missing:
        print(f"Redis not run: {missing}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--seconds", type=float, help="time per throughput row (5; quick 1.5)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure both sides this many times, in turn (the machine's speed "
                         "drifts: 3 gives a median and a range)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 5.0
    args.batch, args.window = 512, 8
    args.latency_rate, args.latency_batch = 4000, 20   # 200 frames of 20 a second
    args.latency_seconds = 2.0 if args.quick else 5.0
    args.consume_count = 100_000 if args.quick else 500_000
    missing = redis_available()
    grpc_missing = grpc_available()
    if grpc_missing:
        print(f"the official RocketMQ client's rows not run: {grpc_missing}", file=sys.stderr,
              flush=True)
    if missing:
        print(f"Redis not run: {missing}; only rocketstore's column is filled",
              file=sys.stderr, flush=True)
    rounds = []
    for k in range(max(1, args.rounds)):
        root = tempfile.mkdtemp(prefix="rscompare-", dir=".")
        try:
            rs = rocketstore_rows(args, root)
            if not grpc_missing:
                rs["grpc"] = grpc_rows(args, root)
            rd = {} if missing else redis_rows(args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rounds.append((rs, rd))
        if args.rounds > 1 and not args.json:
            print(f"round {k + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"rounds": [{"rocketstore": rs, "redis": rd} for rs, rd in rounds],
                          "summary": summary(rounds), "redis_missing": missing,
                          "grpc": grpc_summary(rounds), "grpc_missing": grpc_missing}))
    else:
        print_table(summary(rounds), len(rounds), missing)
        if not grpc_missing:
            print_grpc_table(grpc_summary(rounds))


if __name__ == "__main__":
    main()
