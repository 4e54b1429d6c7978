"""The Prometheus endpoint of a real store: every family docs/OPERATIONS.md lists is
served, and the values follow what was done (puts per topic, refusals, gets, flushes,
dispatch, restarts, files), read with prometheus_client's own parser."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rocketstore.client import Consumer, Producer, ReaderClient
from rocketstore.procs.stats import Histogram, ProcessStats, read_published
from store_processes import RunningStore, cli, free_port, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scrape(port: int) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _value(metrics, name: str, **labels) -> float:
    return metrics[name][tuple(sorted(labels.items()))]


def _wait_for(port: int, check, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        metrics = _scrape(port)
        try:
            if check(metrics):
                return metrics
        except KeyError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never satisfied the check: {sorted(metrics)}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    port = free_port()
    with RunningStore(tmp_path_factory.mktemp("metrics"), metrics_port=port,
                      mapped_file_size_commit_log=1 << 20) as s:
        s.port = port
        yield s


@pytest.fixture(scope="module")
def exercised(store):
    """The store after puts to two topics, a refused put, pulls that find and miss, and
    a consumer group's commit."""
    with Producer(store.store_dir) as p:
        for topic, n in (("Orders", 30), ("Billing", 12)):
            for r in p.send_batch([_message(topic, i) for i in range(n)]):
                assert r.status.name == "PUT_OK"
        refused = p.send("Bad Topic!", b"x")
        assert refused.status.name == "MESSAGE_ILLEGAL"
        p.send("Lagging", b"one", queue_id=0)
    with ReaderClient(store.store_dir) as reader:
        _wait_for(store.port, lambda m: _value(m, "rocketstore_dispatched_messages_total",
                                               process="dispatcher") >= 43)
        assert reader.pull("Orders", 0, 0, 32, timeout_ms=0).messages
        assert not reader.pull("Nobody", 0, 0, 32, timeout_ms=0).messages
    with Consumer(store.store_dir, "billing", "Lagging") as c:
        c.poll(1, timeout_ms=5000)
        c.commit()
    return store


def test_puts_gets_and_positions_are_counted(exercised):
    store = exercised
    # each process publishes its counters on its own turn, and a scrape reads the
    # positions live: the snapshot checked is the first one holding every process's part
    m = _wait_for(store.port, lambda m: _value(
        m, "rocketstore_get_requests_total", process="reader", result="miss") >= 1
        and _value(m, "rocketstore_put_latency_seconds_count", process="writer") >= 4
        and _value(m, "rocketstore_position_bytes", position="dispatched")
        == _value(m, "rocketstore_position_bytes", position="written"))
    assert _value(m, "rocketstore_put_messages_total", process="writer", topic="Orders") == 30
    assert _value(m, "rocketstore_put_messages_total", process="writer", topic="Billing") == 12
    # a one-message send (the writer's one-record lane counts it aside until a snapshot)
    assert _value(m, "rocketstore_put_messages_total", process="writer", topic="Lagging") == 1
    assert _value(m, "rocketstore_put_bytes_total", process="writer", topic="Lagging") > 3
    assert _value(m, "rocketstore_put_bytes_total", process="writer", topic="Orders") > 30 * 64
    assert _value(m, "rocketstore_put_refused_total", process="writer",
                  status="MESSAGE_ILLEGAL") == 1
    assert _value(m, "rocketstore_put_latency_seconds_count", process="writer") == 4
    assert _value(m, "rocketstore_get_requests_total", process="reader", result="found") >= 1
    assert _value(m, "rocketstore_get_transferred_messages_total", process="reader") >= 1
    written = _value(m, "rocketstore_position_bytes", position="written")
    assert written > 0
    assert _value(m, "rocketstore_position_bytes", position="dispatched") == written
    assert _value(m, "rocketstore_mapped_files", kind="commitlog") >= 1
    assert _value(m, "rocketstore_mapped_file_bytes", kind="commitlog") >= 1 << 20
    assert _value(m, "rocketstore_mapped_files", kind="consumequeue") >= 2
    assert _value(m, "rocketstore_store_state", state="RUNNING") == 1
    assert _value(m, "rocketstore_writeable") == 1
    assert _value(m, "rocketstore_process_state", process="writer", state="RUNNING") == 1
    flushes = _wait_for(store.port, lambda m: _value(
        m, "rocketstore_flushed_bytes_total", process="flusher") >= written)
    assert _value(flushes, "rocketstore_flush_latency_seconds_count", process="flusher") >= 1
    assert _value(m, "rocketstore_dispatch_delay_seconds_count", process="dispatcher") >= 1
    assert 0 < _value(m, "rocketstore_disk_used_ratio") < 1


def test_every_documented_metric_is_served(exercised):
    store = exercised
    rows = [line for line in open(os.path.join(ROOT, "docs", "OPERATIONS.md"))
            if line.startswith("| `rocketstore_") and "(served only" not in line
            and "10 minutes in" not in line]
    documented = {re.match(r"\| `(rocketstore_[a-z_]+)`", row).group(1) for row in rows}
    assert len(documented) > 20
    m = _wait_for(store.port, lambda m: "rocketstore_flush_latency_seconds_bucket" in m
                  and "rocketstore_get_requests_total" in m)
    served = {re.sub(r"_(bucket|count|sum|total)$", "", name) for name in m}
    missing = {name for name in documented
               if re.sub(r"_(bucket|count|sum|total)$", "", name) not in served}
    assert not missing, f"documented, not served: {sorted(missing)}"


def test_a_restart_is_counted(store):
    before = _value(_scrape(store.port), "rocketstore_process_restarts_total",
                    process="cleaner")
    os.kill(_pid(store, "cleaner"), signal.SIGKILL)
    _wait_for(store.port, lambda m: _value(m, "rocketstore_process_restarts_total",
                                           process="cleaner") == before + 1
              and _value(m, "rocketstore_process_state", process="cleaner",
                         state="RUNNING") == 1, timeout=30)


def _pid(store, process: str) -> int:
    from rocketstore.shm.positions import PID, PositionTable
    table = PositionTable.attach(store.store_dir)
    try:
        return table.get_process(process, PID)
    finally:
        table.close()


def _message(topic: str, i: int):
    from rocketstore.storage import Message
    return Message(topic=topic, body=b"metrics body %d" % i + bytes(48), tags="T",
                   keys=[f"k{i}"])


def test_the_endpoint_is_off_by_default(tmp_path):
    with RunningStore(tmp_path) as s:
        wait_for(lambda: read_published(s.store_dir, "writer") is not None, 10,
                 "the writer's statistics")
        assert "metrics on" not in s.log()


def test_every_store_process_freezes_what_its_setup_made(tmp_path):
    """procs.service: after setup the cyclic collector never walks the modules and
    tables again (a full collection would pause a send or a dispatch); each process's
    published statistics say how many objects it froze and its collections."""
    with RunningStore(tmp_path) as s:
        for name in ("writer", "dispatcher", "flusher", "reader"):
            wait_for(lambda: read_published(s.store_dir, name) is not None, 10,
                     f"the {name}'s statistics")
            gc_state = read_published(s.store_dir, name)["gc"]
            assert gc_state["frozen"] > 10_000, (name, gc_state)
            assert len(gc_state["collections"]) == 3


def test_histogram_buckets_and_snapshot():
    h = Histogram((0.001, 0.01))
    for v in (0.0005, 0.001, 0.002, 5.0):
        h.observe(v)
    assert h.counts == [2, 1, 1] and h.count == 4
    stats = ProcessStats("writer")
    stats.add("put_messages_total", 3, topic="A")
    stats.add("put_messages_total", 2, topic="A")
    snap = stats.snapshot()
    assert snap["counters"]["put_messages_total"] == {"labels": ["topic"],
                                                      "values": [[["A"], 5]]}


def test_the_loop_only_encodes_the_snapshot_and_a_stop_writes_the_last_itself(
        tmp_path, monkeypatch):
    """``publish_if_due`` hands the snapshot to a thread: a rename over the last one
    that hangs (a discard waited for behind a write-back) holds up that thread, not the
    process's loop, and the newest snapshot handed over meanwhile is written once it
    ends. ``publish`` (a clean stop) waits for the thread, then writes the last one."""
    from rocketstore.procs.stats import remove_published, stats_path
    store_dir = str(tmp_path)
    path = stats_path(store_dir, "writer")
    inside, release = threading.Event(), threading.Event()
    replace = os.replace

    def hanging(src, dst):
        if dst == path and not inside.is_set():
            inside.set()
            assert release.wait(30), "the rename was never let go"
        replace(src, dst)
    monkeypatch.setattr(os, "replace", hanging)

    def published() -> int | None:
        snap = read_published(store_dir, "writer")
        return snap and snap["counters"]["put_messages_total"]["values"][0][1]

    stats = ProcessStats("writer")
    stats.add("put_messages_total", 1, topic="A")
    stats.publish_if_due(store_dir)
    assert inside.wait(30), "no thread renamed the snapshot"
    stats.add("put_messages_total", 2, topic="A")
    stats._next_publish = 0.0          # due again while the first rename hangs
    stats.publish_if_due(store_dir)    # returns: the loop never waits for the rename
    assert published() is None
    release.set()
    wait_for(lambda: published() == 3, 30, "the newest snapshot handed over")
    stats.add("put_messages_total", 4, topic="A")
    stats.publish(store_dir)
    assert published() == 7
    assert not any(t.name == "stats-snapshot" for t in threading.enumerate())
    remove_published(store_dir)
    assert not os.path.exists(os.path.dirname(path))


def test_statistics_live_in_memory_and_an_earlier_run_s_are_not_shown(tmp_path):
    """Each process publishes its statistics in memory (``stats_dir``: /dev/shm beside
    the position table's segment, not the store's disk, whose journal commits held the
    writer's page faults behind a rename a second); a clean stop removes them. A store
    started again without a process (a master without its HA socket) went on showing
    that process's last ones, a slave's lag growing with every write (an unclean stop
    leaves them): a start clears them."""
    import json
    from rocketstore.procs.stats import stats_path
    from rocketstore.shm.positions import SHM_DIR
    s = RunningStore(tmp_path).start()
    wait_for(lambda: read_published(s.store_dir, "writer") is not None, 10,
             "the writer's statistics")
    published = os.path.dirname(stats_path(s.store_dir, "writer", create=False))
    assert published.startswith(SHM_DIR + "/") and not published.startswith(s.store_dir)
    assert s.stop() == 0, s.log()
    assert not os.path.exists(published)
    stale = stats_path(s.store_dir, "ha")      # as an unclean stop leaves it
    with open(stale, "w") as f:
        json.dump({"pid": 1, "ha": {"listen": "tcp://127.0.0.1:1", "slaves": [
            {"address": "127.0.0.1", "acked": 0}]}}, f)
    with s:
        assert not os.path.exists(stale)
        r = cli("status", "--config", s.config_path, "--json")
        assert r.returncode == 0 and "127.0.0.1:1" not in r.stdout, r.stdout
