"""Benchmark of the multiprocess store (``rocketstore up``): ingest, dispatch lag,
end-to-end latency, mmap consume and reader-socket pull.

Not a test: it prints a table and asserts nothing about time. Run from the project root
(``python bench/store_pipeline.py [--quick]``). Each flush mode gets a freshly started store
(``tests/store_processes.RunningStore``, 256 MiB CommitLog files) in a temporary
directory under the working directory, removed at the end; every process it starts is
stopped however the run ends. ``bench/README.md`` says what each figure means.

1. ingest: 1 and 4 producer processes, 128 B and 1 KiB bodies, each producer pipelining
   ``--batch``-record frames with ``send_async`` (``--window`` frames in flight) for
   ``--seconds``; only PUT_OK replies count, busy and refused ones are reported;
2. dispatch lag: WRITTEN - DISPATCHED sampled from the position table every 50 ms
   during each ingest run, and the time DISPATCHED takes to reach WRITTEN after the
   producers stop; the CPU each store process used during the run;
3. end-to-end latency: send time (``time.time_ns()``, first 8 bytes of the body) to a
   Consumer in another process receiving it, at a fixed moderate rate: p50, p99, p999,
   and with ``--stages`` each stage's (``latency_stages``);
4. mmap consume: one Consumer process reading already-dispatched messages, poll(512);
5. reader socket: ``ReaderClient.pull`` with 32 and 512 messages per pull.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import gc
import multiprocessing as mp
import os
import pathlib
import platform
import queue as queue_mod
import shutil
import struct
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rocketstore.client import Consumer, Producer, ReaderClient  # noqa: E402
from rocketstore.shm.positions import PID, PositionTable, Slot  # noqa: E402
from rocketstore.storage import Message, StoreConfig  # noqa: E402
from rocketstore.storage.config import recorded_geometry  # noqa: E402
from rocketstore.storage.status import PutMessageStatus  # noqa: E402
from store_processes import RunningStore  # noqa: E402

SAMPLE_S = 0.050                   # position-table sampling period under load
STORE_SETTINGS = dict(
    mapped_file_size_commit_log=256 << 20,
    mapped_file_size_consume_queue=300_000 * 20,
    max_hash_slot_num=1_000_000, max_index_num=4_000_000,
    flush_interval_commit_log=500, flush_interval_consume_queue=1000,
    clean_resource_interval=10_000,
    # RocketMQ's defaults cap a pull at 32 messages / 256 KiB; raised so that a pull of
    # 512 (reader socket) and a poll of 512 (Consumer) can return that many
    max_transfer_count_on_message_in_memory=1024,
    max_transfer_bytes_on_message_in_memory=4 << 20)
STORE_PROCESSES = ("writer", "dispatcher", "flusher", "reader", "supervisor")
GOALS = {"ingest ASYNC_FLUSH": 300_000, "ingest SYNC_FLUSH": 50_000, "mmap consume": 1_000_000}
_PUT_OK = PutMessageStatus.PUT_OK
_BUSY = PutMessageStatus.OS_PAGECACHE_BUSY
_STAMP = struct.Struct(">q")


# ============================================================================ children
def _ingest_worker(store_dir: str, topic: str, body_size: int, batch: int, window: int,
                   seconds: float, start, out) -> None:
    """One producer: pipelined frames of ``batch`` records for ``seconds``."""
    body = os.urandom(body_size)
    # queue_id=None: the store spreads them over the topic's 8 queues (round robin), as
    # RocketMQ's producer does (Message's own default)
    msgs = [Message(topic=topic, body=body, tags="TagA", keys=[f"k{i}"], queue_id=None)
            for i in range(batch)]
    ok = busy = 0
    refused: collections.Counter = collections.Counter()
    error = ""
    t0 = t1 = time.monotonic()
    cpu0 = time.process_time()
    try:
        with Producer(store_dir, window=window, timeout_ms=30_000) as p:
            start.ready()
            t0 = time.monotonic()
            cpu0 = time.process_time()
            end = t0 + seconds
            pending: collections.deque = collections.deque()

            def settle(handle) -> None:
                nonlocal ok, busy
                for r in handle.result():
                    if r.status is _PUT_OK:
                        ok += 1
                    elif r.status is _BUSY:
                        busy += 1
                    else:
                        refused[r.status.name] += 1

            while time.monotonic() < end:
                if len(pending) >= window:
                    settle(pending.popleft())
                pending.append(p.send_async(msgs))
            while pending:
                settle(pending.popleft())
            t1 = time.monotonic()
    except Exception as e:  # noqa: BLE001 - reported in the table, not raised
        error = f"{type(e).__name__}: {e}"
        t1 = time.monotonic()
    out.put(dict(ok=ok, busy=busy, refused=dict(refused), t0=t0, t1=t1,
                 cpu=time.process_time() - cpu0, error=error))


def _consumer_config(store_dir: str, raised_limits: bool) -> StoreConfig:
    """The Consumer's config: the store's file sizes, and (``raised_limits``) the
    benchmark store's pull limits instead of RocketMQ's 32 messages / 256 KiB."""
    kw = dict(recorded_geometry(store_dir) or {})
    if raised_limits:
        for name in ("max_transfer_count_on_message_in_memory",
                     "max_transfer_bytes_on_message_in_memory"):
            kw[name] = STORE_SETTINGS[name]
    return StoreConfig(store_path_root_dir=store_dir, **kw)


@contextlib.contextmanager
def collector_frozen():
    """What this process holds once set up kept out of the garbage collector's passes
    (``gc.freeze``) while a latency is measured, as each store process does after its
    setup (``procs.service``). A bench process holds 30-100 thousand objects; a full
    collection of them took 10-25 ms here, every 10-20 s, and was measured as the
    store's send -> visible time (the consumer's, 5.6 s into each 20 s run: 20 ms, a
    p999 of 19 ms). PERFORMANCE.md gives users the same advice for their
    latency-sensitive processes."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _latency_consumer(store_dir: str, topic: str, expected, seconds: float, start,
                      out) -> None:
    """Receive until every message the producer had acknowledged (``expected``, set when
    it finished) arrived, or time runs out: for each message its send time, the CommitLog
    offset its record ends at and the time this process had it (``time.time_ns()``)."""
    got: list[tuple[int, int, int]] = []
    error = ""
    try:
        with Consumer(store_dir, "bench-latency", topic, from_where="latest",
                      config=_consumer_config(store_dir, True),
                      wait_for_topic=True) as c:     # subscribed before the first send
            c.poll(1, 0)  # pins every queue's starting point before anything is sent
            with collector_frozen():
                start.ready()
                deadline = time.monotonic() + seconds + 10
                while time.monotonic() < deadline:
                    msgs = c.poll(512, 50)
                    now = time.time_ns()
                    got += [(_STAMP.unpack_from(m.body)[0],
                             m.commit_log_offset + m.store_size, now) for m in msgs]
                    if len(got) >= expected.value > 0:
                        break  # the producer has finished and published how many it sent
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    out.put(dict(got=got, error=error))


def _latency_tracer(store_dir: str, start, stop, out) -> None:
    """The stage timestamps: when the writer's APPENDED and the dispatcher's DISPATCHED
    announcements reach a listener (another process woken as the dispatcher and a
    Consumer are), each as (offset, ``time.time_ns()``), until ``stop`` is set."""
    import zmq
    from rocketstore.shm import bus
    try:        # woken before anything else, so a mark is when the announcement came
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass    # not permitted: the marks include this process's own wake-up delay
    marks: dict[bytes, list[tuple[int, int]]] = {bus.APPENDED: [], bus.DISPATCHED: []}
    ctx = zmq.Context()     # after: its I/O thread inherits the scheduling
    sub = bus.Subscriber(ctx, store_dir, ["writer", "dispatcher"], list(marks))
    try:
        with collector_frozen():
            start.ready()
            while not stop.is_set():
                for topic, payload in sub.wait(50):
                    marks[topic].append((bus.decode_offset(payload), time.time_ns()))
    finally:
        sub.close()
        ctx.destroy(0)
    out.put({topic.rstrip(b"\0").decode(): v for topic, v in marks.items()})


def _first_at_or_past(marks: list[tuple[int, int]], end: int) -> int | None:
    """The time of the first announcement of an offset at least ``end`` (marks sorted by
    time, their offsets never falling)."""
    i = bisect.bisect_left(marks, end, key=lambda m: m[0])
    return marks[i][1] if i < len(marks) else None


def latency_stages(got: list[tuple[int, int, int]], marks: dict) -> dict:
    """Each message's send -> visible time cut at the announcements a listener saw:
    send -> APPENDED (the producer's frame, the writer's wake and append), APPENDED ->
    DISPATCHED (the dispatcher's wake and dispatch), DISPATCHED -> the consumer has it
    (its wake and read); p50/p99/p999 of each, in milliseconds."""
    stages: dict[str, list[int]] = {"send->appended": [], "appended->dispatched": [],
                                    "dispatched->consumer": []}
    for sent, end, seen in got:
        appended = _first_at_or_past(marks["appended"], end)
        dispatched = _first_at_or_past(marks["dispatched"], end)
        if appended is None or dispatched is None:
            continue
        stages["send->appended"].append(appended - sent)
        stages["appended->dispatched"].append(dispatched - appended)
        stages["dispatched->consumer"].append(seen - dispatched)
    return {name: _percentiles([v // 1000 for v in values])
            for name, values in stages.items()}


def _percentiles(values_us: list[int]) -> dict:
    return {f"{name}_ms": (_pct(values_us, q) or 0) / 1000
            for name, q in (("p50", 0.50), ("p99", 0.99), ("p999", 0.999))}


def _consume_worker(store_dir: str, topic: str, count: int, max_msgs: int,
                    raised_limits: bool, group: str, out) -> None:
    """One Consumer reading ``count`` dispatched messages from the earliest offset."""
    got = nbytes = polls = 0
    error = ""
    t0 = t1 = time.perf_counter()
    cpu0 = time.process_time()
    try:
        with Consumer(store_dir, group, topic,
                      config=_consumer_config(store_dir, raised_limits)) as c:
            c.assignment()
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            while got < count:
                msgs = c.poll(max_msgs, 1000)
                if not msgs:
                    break
                polls += 1
                got += len(msgs)
                nbytes += sum(len(m.body) for m in msgs)
            t1 = time.perf_counter()
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
        t1 = time.perf_counter()
    out.put(dict(got=got, bytes=nbytes, polls=polls, seconds=t1 - t0,
                 cpu=time.process_time() - cpu0, error=error))


# ============================================================================ helpers
class _StartLine:
    """Children say they are ready (connected, warmed up) and wait for the go."""

    def __init__(self, ctx):
        self._ready = ctx.Queue()
        self._go = ctx.Event()

    def ready(self) -> None:
        """In a child."""
        self._ready.put(os.getpid())
        if not self._go.wait(120):
            raise RuntimeError("no start signal")

    def gather(self, procs: list, timeout: float = 120) -> None:
        """In the parent: wait until every child of ``procs`` is ready, then start them
        all; raise as soon as one died."""
        deadline = time.monotonic() + timeout
        n = 0
        while n < len(procs):
            try:
                self._ready.get(timeout=0.2)
                n += 1
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode is not None]
                if dead:
                    raise RuntimeError(f"a benchmark process exited before it started "
                                       f"(exit codes {dead})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark processes did not start") from None
        self._go.set()


def _proc_cpu_s(pid: int, main_thread: bool = False) -> float:
    """utime + stime of ``pid`` in seconds (0 if it is gone); of its main thread alone
    with ``main_thread``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _store_pids(store: RunningStore, table: PositionTable) -> dict[str, int]:
    pids = {name: table.get_process(name, PID) for name in STORE_PROCESSES[:-1]}
    pids["supervisor"] = store.proc.pid if store.proc else 0
    return pids


def _pct(values: list, q: float):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _spawn(ctx, target, *args) -> mp.Process:
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _result(out, procs: list, timeout: float) -> dict:
    """The next result on ``out``; raises when every child of ``procs`` is gone without
    one, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    gone_since = None
    while True:
        try:
            return out.get(timeout=0.2)
        except queue_mod.Empty:
            pass
        now = time.monotonic()
        if all(p.exitcode is not None for p in procs):
            gone_since = gone_since or now
            if now - gone_since > 2:
                raise RuntimeError(f"benchmark process(es) exited without a result (exit "
                                   f"codes {[p.exitcode for p in procs]})")
        if now > deadline:
            raise RuntimeError("no result from a benchmark process in time")


def _reap(procs: list) -> None:
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.ctx = mp.get_context("spawn")
        self.rows: list[dict] = []

    # ------------------------------------------------------------------ 1 + 2 ingest
    def ingest(self, store: RunningStore, flush: str, body: int, producers: int) -> dict:
        a = self.args
        topic = f"Ingest{body}x{producers}"
        table = PositionTable.attach(store.store_dir)
        out = self.ctx.Queue()
        start = _StartLine(self.ctx)
        procs = [_spawn(self.ctx, _ingest_worker, store.store_dir, topic, body, a.batch,
                        a.window, a.seconds, start, out) for _ in range(producers)]
        try:
            start.gather(procs)
            pids = _store_pids(store, table)
            cpu0 = {n: _proc_cpu_s(p) for n, p in pids.items()}
            w0, d0 = table.read_written()[0], table.get(Slot.DISPATCHED)
            go = time.monotonic()
            samples = []          # (t, written, dispatched) under load
            results = []
            next_tick = go
            while len(results) < producers:
                written = table.read_written()[0]
                samples.append((time.monotonic(), written, table.get(Slot.DISPATCHED)))
                next_tick += SAMPLE_S
                try:
                    results.append(out.get(timeout=max(0.0, next_tick - time.monotonic())))
                    while len(results) < producers:
                        results.append(out.get_nowait())
                except queue_mod.Empty:
                    pass
                if time.monotonic() > go + a.seconds + 120:
                    raise RuntimeError("producers did not finish")
                if len(results) < producers and all(p.exitcode is not None for p in procs):
                    results.append(_result(out, procs, 5))
            stop = max(r["t1"] for r in results)
            first = min(r["t0"] for r in results)
            cpu1 = {n: _proc_cpu_s(p) for n, p in pids.items()}
            w_end = table.read_written()[0]
            d_at_stop = table.get(Slot.DISPATCHED)
            caught = None
            limit = time.monotonic() + 120
            while time.monotonic() < limit:
                if table.get(Slot.DISPATCHED) >= w_end:
                    caught = time.monotonic()
                    break
                time.sleep(0.001)
            d_end = table.get(Slot.DISPATCHED)
        finally:
            _reap(procs)
            table.close()
        elapsed = max(1e-9, stop - first)
        ok = sum(r["ok"] for r in results)
        refused: collections.Counter = collections.Counter()
        for r in results:
            refused.update(r["refused"])
        write_rate = (w_end - w0) / elapsed                     # CommitLog bytes/s
        loaded = [w - d for t, w, d in samples if t <= stop]
        run = [(t, d) for t, w, d in samples if t <= stop]
        dispatch_rate = ((run[-1][1] - d0) / (run[-1][0] - go)
                         if len(run) > 1 and run[-1][0] > go else 0.0)
        catch_up = None if caught is None else max(0.0, caught - stop)
        keeping = (catch_up is not None and catch_up <= max(0.5, 0.1 * elapsed))
        row = dict(
            section="ingest", flush=flush, body=body, producers=producers, msgs=ok,
            msgs_s=ok / elapsed, mb_s=ok * body / elapsed / 1e6,
            cl_mb_s=write_rate / 1e6, busy=sum(r["busy"] for r in results),
            refused=dict(refused), errors=[r["error"] for r in results if r["error"]],
            seconds=elapsed,
            lag_max=max(loaded, default=0), lag_p99=_pct(loaded, 0.99) or 0,
            lag_max_s=max(loaded, default=0) / write_rate if write_rate else 0.0,
            lag_p99_s=(_pct(loaded, 0.99) or 0) / write_rate if write_rate else 0.0,
            backlog_at_stop=w_end - d_at_stop,
            dispatch_ratio=dispatch_rate / write_rate if write_rate else 0.0,
            catch_up_s=catch_up, keeping_up=keeping, dispatched_all=d_end >= w_end,
            cpu={n: (cpu1[n] - cpu0[n]) / elapsed for n in pids},
            producer_cpu=sum(r["cpu"] for r in results) / elapsed)
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ 3 latency
    def latency(self, store: RunningStore, flush: str, stages: bool = False) -> dict:
        """Send -> visible at ``latency_rate`` in frames of ``latency_batch``: p50, p99,
        p999 and max; with ``stages``, also each stage's (``latency_stages``), from a
        tracer process listening to the bus (one more process woken twice a frame). The
        producer, the consumer and the tracer measure with the collector frozen
        (``collector_frozen``): their own collections are not the store's time."""
        a = self.args
        topic = "Latency"
        out, traced = self.ctx.Queue(), self.ctx.Queue()
        start = _StartLine(self.ctx)
        expected = self.ctx.Value("q", 0)
        stop = self.ctx.Event()
        procs = [_spawn(self.ctx, _latency_consumer, store.store_dir, topic, expected,
                        a.latency_seconds, start, out)]
        if stages:
            procs.append(_spawn(self.ctx, _latency_tracer, store.store_dir, start, stop,
                                traced))
        sent = refused = late = 0
        acks: list[int] = []      # send -> SEND_REPLY at the producer, us
        pad = b"x" * (128 - _STAMP.size)
        batch = a.latency_batch
        interval = batch / a.latency_rate
        marks = None
        try:
            with Producer(store.store_dir) as p, collector_frozen():
                p.send_batch([Message(topic="LatencyWarmup", body=b"w")])
                start.gather(procs)
                t = time.monotonic()
                end = t + a.latency_seconds
                while t < end:
                    delay = t - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -0.001:
                        late += 1         # the previous reply came after this slot
                    stamp = time.time_ns()
                    body = _STAMP.pack(stamp) + pad
                    # one frame at a time: the producer-side figure is the ack latency;
                    # a late reply delays the next frame, never drops it
                    res = p.send_batch([Message(topic=topic, body=body, queue_id=None)
                                        for _ in range(batch)])
                    acks.append((time.time_ns() - stamp) // 1000)
                    ok = sum(r.status is _PUT_OK for r in res)
                    sent += ok
                    refused += len(res) - ok
                    t += interval
            expected.value = sent
            r = _result(out, procs[:1], a.latency_seconds + 60)
            stop.set()
            if stages:
                marks = _result(traced, procs[1:], 60)
        finally:
            stop.set()
            _reap(procs)
        lat = [(seen - sent_ns) // 1000 for sent_ns, _, seen in r["got"]]
        row = dict(section="latency", flush=flush, rate=a.latency_rate, batch=batch,
                   sent=sent, received=len(lat), refused=refused, error=r["error"],
                   late=late, frames=len(acks), **_percentiles(lat),
                   max_ms=max(lat, default=0) / 1000,
                   ack_p50_ms=(_pct(acks, 0.50) or 0) / 1000,
                   ack_p99_ms=(_pct(acks, 0.99) or 0) / 1000,
                   stages=latency_stages(r["got"], marks) if marks is not None else None)
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ 4-5 fill
    def fill(self, store: RunningStore, topic: str, count: int, body_size: int) -> int:
        """Store ``count`` messages in ``topic`` (one producer, as in ingest) and wait
        until they are all dispatched; the number acknowledged."""
        body = os.urandom(body_size)
        batch = self.args.batch
        msgs = [Message(topic=topic, body=body, tags="TagA", keys=[f"k{i}"], queue_id=None)
                for i in range(batch)]
        ok = sent = 0
        with Producer(store.store_dir, window=self.args.window, timeout_ms=30_000) as p:
            pending: collections.deque = collections.deque()
            while sent < count:
                n = min(batch, count - sent)
                if len(pending) >= self.args.window:
                    ok += sum(r.status is _PUT_OK for r in pending.popleft().result())
                pending.append(p.send_async(msgs[:n]))
                sent += n
            for h in pending:
                ok += sum(r.status is _PUT_OK for r in h.result())
        table = PositionTable.attach(store.store_dir)
        try:
            written = table.read_written()[0]
            deadline = time.monotonic() + 120
            while table.get(Slot.DISPATCHED) < written and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            table.close()
        return ok

    # ------------------------------------------------------------------ 4 mmap consume
    def consume(self, store: RunningStore, topic: str, count: int, max_msgs: int,
                raised_limits: bool) -> dict:
        out = self.ctx.Queue()
        group = f"bench-consume-{max_msgs}-{int(raised_limits)}"
        proc = _spawn(self.ctx, _consume_worker, store.store_dir, topic, count, max_msgs,
                      raised_limits, group, out)
        try:
            r = _result(out, [proc], 600)
        finally:
            _reap([proc])
        secs = max(1e-9, r["seconds"])
        row = dict(section="consume", topic=topic, max_msgs=max_msgs,
                   limits="raised" if raised_limits else "RocketMQ default", msgs=r["got"],
                   msgs_s=r["got"] / secs, mb_s=r["bytes"] / secs / 1e6,
                   per_poll=r["got"] / max(1, r["polls"]), cpu=r["cpu"] / secs,
                   error=r["error"])
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ 5 reader socket
    def pull(self, store: RunningStore, topic: str, count: int, max_msgs: int) -> dict:
        got = nbytes = pulls = 0
        offsets = dict.fromkeys(range(8), 0)
        error = ""
        with ReaderClient(store.store_dir, timeout_ms=30_000) as rc:
            t0 = time.perf_counter()
            try:
                while got < count and offsets:
                    for q in list(offsets):
                        r = rc.pull(topic, q, offsets[q], max_msgs)
                        pulls += 1
                        if not r.messages:
                            del offsets[q]
                            continue
                        offsets[q] = r.next_begin_offset
                        got += len(r.messages)
                        nbytes += sum(len(m.body) for m in r.messages)
                        if got >= count:
                            break
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"
            secs = max(1e-9, time.perf_counter() - t0)
        row = dict(section="pull", topic=topic, max_msgs=max_msgs, msgs=got,
                   msgs_s=got / secs, mb_s=nbytes / secs / 1e6, per_poll=got / max(1, pulls),
                   error=error)
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ one store run
    def run_store(self, root: str, flush: str) -> None:
        a = self.args
        path = pathlib.Path(root) / flush.split("_")[0].lower()
        path.mkdir()
        store = RunningStore(path, flush_disk_type=flush, **STORE_SETTINGS)
        _say(f"{flush}: starting a store in {path}")
        store.start()
        try:
            for body in a.bodies:
                for producers in a.producers:
                    _say(f"{flush}: ingest, {body} B bodies, {producers} producer(s), "
                         f"{a.seconds:g} s")
                    r = self.ingest(store, flush, body, producers)
                    _say(f"   {r['msgs_s']:,.0f} msgs/s, lag max {r['lag_max_s']*1000:.0f} ms, "
                         f"catch-up {_ms(r['catch_up_s'])}")
            _say(f"{flush}: end-to-end latency, {a.latency_rate:,} msgs/s for "
                 f"{a.latency_seconds:g} s")
            self.latency(store, flush, stages=a.stages)
            if flush == "ASYNC_FLUSH":
                topic = "Consume"
                _say(f"{flush}: storing {a.consume_count:,} messages of 128 B in {topic}")
                stored = self.fill(store, topic, a.consume_count, 128)
                for max_msgs, raised in ((512, True), (512, False)):
                    _say(f"{flush}: mmap consume of {stored:,}, poll({max_msgs})")
                    self.consume(store, topic, stored, max_msgs, raised)
                for max_msgs in (32, 512):
                    n = min(stored, a.pull_count if max_msgs > 32 else a.pull_count // 2)
                    _say(f"{flush}: reader pull of {n:,}, {max_msgs} per pull")
                    self.pull(store, topic, n, max_msgs)
        finally:
            _say(f"{flush}: stopping the store")
            try:
                rc = store.stop(timeout=120)
                if rc != 0:
                    _say(f"   the store exited with {rc}; its log:\n{store.log()}")
            finally:
                store.kill_all()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _ms(s) -> str:
    return "never" if s is None else f"{s * 1000:,.0f} ms"


# ============================================================================ the table
def machine() -> list[tuple[str, str]]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return [("cores", f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable"
                      f" ({cpu})"),
            ("memory", f"{mem_kb / 1024 / 1024:.1f} GiB"),
            ("python", f"{platform.python_implementation()} {platform.python_version()}"),
            ("system", f"{platform.system()} {platform.release()}"),
            ("store", "256 MiB CommitLog files, on the working directory's file system")]


def print_table(rows: list[dict], args: argparse.Namespace, wall: float) -> None:
    print()
    print("rocketstore pipeline benchmark" + (" (--quick)" if args.quick else ""))
    for k, v in machine():
        print(f"  {k:<8} {v}")
    print(f"  run      {wall:.0f} s; ingest {args.seconds:g} s per row, frames of "
          f"{args.batch} records, {args.window} in flight per producer")
    print()
    print("1-2. Ingest and dispatch lag (PUT_OK only; lag = WRITTEN - DISPATCHED sampled "
          "every 50 ms under load)")
    hdr = (f"{'flush':<11} {'body':>5} {'prod':>4} {'msgs/s':>9} {'MB/s':>6} {'busy':>5} "
           f"{'refused':>7} {'lag max':>14} {'lag p99':>14} {'disp/ingest':>11} "
           f"{'catch-up':>9} {'keeps up':>8}  {'CPU: writer dispatcher flusher producers':<40}"
           f"  goal")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["section"] != "ingest":
            continue
        cpu = r["cpu"]
        goal = GOALS.get(f"ingest {r['flush']}")
        print(f"{r['flush']:<11} {r['body']:>5} {r['producers']:>4} {r['msgs_s']:>9,.0f} "
              f"{r['mb_s']:>6.1f} {r['busy']:>5} {sum(r['refused'].values()):>7} "
              f"{_lag(r['lag_max'], r['lag_max_s']):>14} {_lag(r['lag_p99'], r['lag_p99_s']):>14} "
              f"{r['dispatch_ratio']:>11.2f} {_ms(r['catch_up_s']):>9} "
              f"{'yes' if r['keeping_up'] else 'NO':>8}  "
              f"{cpu['writer']:>6.0%} {cpu['dispatcher']:>11.0%} {cpu['flusher']:>7.0%} "
              f"{r['producer_cpu']:>9.0%}{'':>6}  "
              f"{goal:,}" + (" keeping up" if r['flush'] == 'ASYNC_FLUSH' else
                             " group commit") + f" ({r['msgs_s'] / goal:.0%})")
        for e in r["errors"]:
            print(f"    error: {e}")
        if r["refused"]:
            print(f"    refused: {r['refused']}")
    print()
    print("3. End-to-end latency (send -> Consumer.poll returns it, another process)")
    hdr = f"{'flush':<11} {'rate/s':>7} {'batch':>5} {'sent':>7} {'received':>8} " \
          f"{'p50 ms':>7} {'p99 ms':>7} {'p999 ms':>7} {'max ms':>7} | {'ack p50':>7} " \
          f"{'ack p99':>7} {'late frames':>11}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["section"] == "latency":
            print(f"{r['flush']:<11} {r['rate']:>7,} {r['batch']:>5} {r['sent']:>7,} "
                  f"{r['received']:>8,} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
                  f"{r['p999_ms']:>7.2f} {r['max_ms']:>7.2f} | {r['ack_p50_ms']:>7.2f} "
                  f"{r['ack_p99_ms']:>7.2f} {r['late']:>5}/{r['frames']:<5}"
                  + (f"  error: {r['error']}" if r["error"] else ""))
            for stage, q in (r["stages"] or {}).items():
                print(f"  {stage:<28} p50 {q['p50_ms']:>6.2f}  p99 {q['p99_ms']:>6.2f}  "
                      f"p999 {q['p999_ms']:>6.2f} ms")
    print()
    print("4-5. Consume (ASYNC_FLUSH store, already-dispatched 128 B messages, 8 queues)")
    hdr = (f"{'how':<44} {'msgs':>8} {'msgs/s':>9} {'MB/s':>6} {'msgs/call':>9} "
           f"{'CPU':>5}  goal")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["section"] == "consume":
            how = f"Consumer.poll({r['max_msgs']}), {r['limits']} limits"
            print(f"{how:<44} {r['msgs']:>8,} {r['msgs_s']:>9,.0f} {r['mb_s']:>6.1f} "
                  f"{r['per_poll']:>9.0f} {r['cpu']:>5.0%}  {GOALS['mmap consume']:,} "
                  f"({r['msgs_s'] / GOALS['mmap consume']:.0%})"
                  + (f"  error: {r['error']}" if r["error"] else ""))
    for r in rows:
        if r["section"] == "pull":
            how = f"ReaderClient.pull(max {r['max_msgs']})"
            print(f"{how:<44} {r['msgs']:>8,} {r['msgs_s']:>9,.0f} {r['mb_s']:>6.1f} "
                  f"{r['per_poll']:>9.0f} {'':>5}  -"
                  + (f"  error: {r['error']}" if r["error"] else ""))
    print()
    print("Goals (the best row of each)")
    for flush, extra in (("ASYNC_FLUSH", "with dispatch keeping up"),
                         ("SYNC_FLUSH", "with group commit")):
        cand = [r for r in rows if r["section"] == "ingest" and r["flush"] == flush]
        if cand:
            best = max(cand, key=lambda r: r["msgs_s"])
            goal = GOALS[f"ingest {flush}"]
            met = best["msgs_s"] >= goal and (best["keeping_up"] or flush != "ASYNC_FLUSH")
            print(f"  ingest {flush:<11} {best['msgs_s']:>11,.0f} msgs/s ({best['body']} B, "
                  f"{best['producers']} producer(s), dispatch keeping up: "
                  f"{'yes' if best['keeping_up'] else 'NO'}) vs {goal:,} {extra}: "
                  f"{'met' if met else 'NOT met'} ({best['msgs_s'] / goal:.0%})")
    cand = [r for r in rows if r["section"] == "consume"]
    if cand:
        best = max(cand, key=lambda r: r["msgs_s"])
        goal = GOALS["mmap consume"]
        print(f"  {'mmap consume':<18} {best['msgs_s']:>11,.0f} msgs/s (one Consumer process) "
              f"vs {goal:,}: {'met' if best['msgs_s'] >= goal else 'NOT met'} "
              f"({best['msgs_s'] / goal:.0%})")


def _lag(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 1e6:.1f}MB/{seconds * 1000:.0f}ms"


# ============================================================================ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter runs (under a minute)")
    p.add_argument("--seconds", type=float, help="ingest time per row (default 5, quick 1.5)")
    p.add_argument("--batch", type=int, default=512, help="records per SEND frame")
    p.add_argument("--window", type=int, default=8, help="frames in flight per producer")
    p.add_argument("--body", default="128,1024", help="body sizes in bytes")
    p.add_argument("--producers", default="1,4", help="producer process counts")
    p.add_argument("--flush", default="ASYNC_FLUSH,SYNC_FLUSH")
    p.add_argument("--stages", action="store_true",
                   help="the latency row's stages too, from a bus tracer process")
    args = p.parse_args()
    args.bodies = [int(b) for b in args.body.split(",")]
    args.producers = [int(n) for n in args.producers.split(",")]
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 5.0
    args.latency_rate = 4000
    args.latency_batch = 20
    args.latency_seconds = 2.0 if args.quick else 5.0
    args.consume_count = 100_000 if args.quick else 500_000
    args.pull_count = 50_000 if args.quick else 200_000
    t0 = time.perf_counter()
    root = tempfile.mkdtemp(prefix="rsbench-", dir=".")
    bench = Bench(args)
    try:
        for flush in args.flush.split(","):
            bench.run_store(root, flush)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(bench.rows, args, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
