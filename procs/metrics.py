"""The Prometheus endpoint: the store's statistics as text, served by the supervisor.

With ``metrics_port`` set (0, the default, is off), ``rocketstore up`` serves
``http://{metrics_address}:{metrics_port}/metrics`` (loopback by default) from a
thread of the supervisor (prometheus_client's server). Every scrape is read fresh:

* the position table and disk (``procs.status.store_status``): positions, lags,
  error flags, per-process state, restarts, watchdog kills and heartbeat age, disk
  use, and every consumer group's lag;
* the store's directories: mapped-file counts and bytes per kind;
* what each process published (``procs.stats``): per-topic put counts and bytes, put
  latency and refusals (writer), flush latency and bytes (flusher), dispatched
  messages and the delay from store time to dispatch (dispatcher), get hits, misses
  and messages sent (reader), deleted files (cleaner).

docs/OPERATIONS.md lists every metric with its labels. A scrape that fails to read a
part (a process not yet published, the store stopping) leaves that part out and never
fails the scrape. Consumers that read mapped files in their own processes are counted
in the consumer group lag only (their reads cost the store nothing).
"""

from __future__ import annotations

import logging
import os

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)

from rocketstore.procs.stats import read_published
from rocketstore.procs.status import store_status
from rocketstore.shm.positions import PROCESS_NAMES, ProcessState, StoreState
from rocketstore.storage.config import BROKER_ROLES

log = logging.getLogger(__name__)

PREFIX = "rocketstore_"
_STATS_HELP = {
    "controller_elections_total": "Elections this store won as its broker group's master.",
    "ha_sent_bytes_total": "CommitLog bytes streamed to slaves.",
    "ha_received_bytes_total": "CommitLog bytes received from the master.",
    "ha_refused_total": "HA frames refused, by HAError.",
    "ha_sessions_total": "Slave sessions opened (HELLOs accepted).",
    "curve_refused_total": "Connections CURVE refused, by reason.",
    "put_messages_total": "Messages stored, by topic (putMessageTopicTimesTotal).",
    "put_bytes_total": "Record bytes stored, by topic (putMessageTopicSizeTotal).",
    "put_refused_total": "Messages refused, by PutMessageStatus.",
    "put_latency_seconds": "From a SEND's arrival at the writer to its answer "
                           "(putMessageDistributeTime; includes the SYNC_FLUSH wait).",
    "flush_latency_seconds": "Duration of one CommitLog flush (fdatasync of its files).",
    "flushed_bytes_total": "CommitLog bytes made durable.",
    "dispatched_messages_total": "Messages dispatched into consume queues and the index.",
    "dispatch_delay_seconds": "From a message's store time to its dispatch (ms resolution).",
    "get_requests_total": "PULL and FETCH answers, by result (getMessageTimesTotalFound/Miss).",
    "get_transferred_messages_total": "Messages sent by the reader (getMessageTransferedMsgCount).",
    "cleaner_deleted_files_total": "Expired files deleted, by kind.",
}
_KINDS = {"commitlog": "commitlog", "consumequeue": "consumequeue", "index": "index"}


class StoreCollector:
    """A prometheus_client collector reading one store's state at every scrape."""

    def __init__(self, store_dir: str):
        self.store_dir = store_dir

    def collect(self):
        try:
            status = store_status(self.store_dir)
        except Exception as e:  # noqa: BLE001 - a scrape must not fail on a stopping store
            log.debug("metrics: no status (%s)", e)
            status = None
        if status is not None:
            yield from _status_metrics(status)
        yield from _file_metrics(self.store_dir)
        yield from _published_metrics({p: read_published(self.store_dir, p)
                                       for p in PROCESS_NAMES})


def _gauge(name: str, help_: str, value: float, **labels: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(PREFIX + name, help_, labels=list(labels))
    g.add_metric(list(labels.values()), value)
    return g


def _status_metrics(st: dict):
    state = GaugeMetricFamily(PREFIX + "store_state", "1 for the store's current state.",
                              labels=["state"])
    for s in StoreState:
        state.add_metric([s.name], 1.0 if st["state"] == s.name else 0.0)
    yield state
    yield _gauge("writeable",
                 "1 while puts are accepted (not a slave, no flush error, disk not full).",
                 1.0 if st["writeable"] else 0.0)
    positions = GaugeMetricFamily(PREFIX + "position_bytes",
                                  "CommitLog positions from the position table.",
                                  labels=["position"])
    for name, value in st["positions"].items():
        positions.add_metric([name], value)
    yield positions
    yield _gauge("dispatch_lag_bytes", "WRITTEN - DISPATCHED.", st["dispatch_lag_bytes"])
    yield _gauge("flush_lag_bytes", "WRITTEN - FLUSHED.", st["flush_lag_bytes"])
    errors = GaugeMetricFamily(PREFIX + "error", "The errno of a stopped flush or dispatch, "
                               "1 for a full disk; 0 when clear.", labels=["kind"])
    for kind, value in st["errors"].items():
        errors.add_metric([kind], float(value))
    yield errors
    disk = GaugeMetricFamily(PREFIX + "disk_bytes", "The store's file system.", labels=["kind"])
    disk.add_metric(["total"], st["disk"]["total"])
    disk.add_metric(["used"], st["disk"]["used"])
    yield disk
    yield _gauge("disk_used_ratio", "Used / total of the store's file system.",
                 st["disk"]["used_ratio"])
    yield from _process_table_metrics(st["processes"])
    yield from _replication_metrics(st["ha"])
    if "controller" in st:
        yield from _controller_metrics(st["controller"])
    lag = GaugeMetricFamily(PREFIX + "consumer_group_lag_messages",
                            "Messages dispatched and not yet committed by the group.",
                            labels=["topic", "group"])
    for group in st["consumer_groups"].values():
        lag.add_metric([group["topic"], group["group"]], group["lag"])
    yield lag


def _controller_metrics(c: dict):
    """Controller mode: the group's epoch, and whether this member is its master now."""
    yield _gauge("controller_epoch", "The broker group's epoch this store last saw.",
                 c["epoch"])
    yield _gauge("controller_master",
                 "1 while this store is its group's master, holding the lease.",
                 1.0 if c["master"] == c["broker_id"] and c["lease_ms"] > 0 else 0.0)


def _replication_metrics(ha: dict):
    role = GaugeMetricFamily(PREFIX + "ha_role", "1 for the store's broker role.",
                             labels=["role"])
    for name in BROKER_ROLES:
        role.add_metric([name], 1.0 if ha["role"] == name else 0.0)
    yield role
    lag = GaugeMetricFamily(PREFIX + "ha_lag_bytes", "A master: each slave's lag behind "
                            "it; a slave: its lag behind its master.", labels=["peer"])
    if ha["role"] == "SLAVE":
        yield _gauge("ha_slaves", "Slaves connected (a master's).", 0)
        if ha["lag_bytes"] is not None:         # unknown: no sample
            lag.add_metric([ha["master"] or "?"], ha["lag_bytes"])
    else:
        yield _gauge("ha_slaves", "Slaves connected (a master's).", ha["slaves_connected"])
        for s in ha["slaves"]:
            lag.add_metric([s["address"]], s["lag_bytes"])
    yield lag


def _process_table_metrics(processes: dict):
    up = GaugeMetricFamily(PREFIX + "process_state", "1 for each process's current state.",
                           labels=["process", "state"])
    restarts = CounterMetricFamily(PREFIX + "process_restarts",
                                   "Restarts since the supervisor started.", labels=["process"])
    kills = CounterMetricFamily(PREFIX + "process_watchdog_kills",
                                "Kills for a heartbeat older than heartbeat_timeout_s.",
                                labels=["process"])
    age = GaugeMetricFamily(PREFIX + "process_heartbeat_age_seconds",
                            "Time since the process's loop last turned.", labels=["process"])
    for name, p in processes.items():
        for s in ProcessState:
            up.add_metric([name, s.name], 1.0 if p["state"] == s.name else 0.0)
        restarts.add_metric([name], p["restarts"])
        kills.add_metric([name], p["watchdog_kills"])
        if p.get("heartbeat_age_ms") is not None:
            age.add_metric([name], p["heartbeat_age_ms"] / 1000)
    yield from (up, restarts, kills, age)


def _file_metrics(store_dir: str):
    files = GaugeMetricFamily(PREFIX + "mapped_files", "Store files, by kind.", labels=["kind"])
    size = GaugeMetricFamily(PREFIX + "mapped_file_bytes", "Bytes of the store files, by kind.",
                             labels=["kind"])
    for kind, directory in _KINDS.items():
        count = total = 0
        for root, _, names in os.walk(os.path.join(store_dir, directory)):
            for name in names:
                if name.isdigit():
                    try:
                        total += os.stat(os.path.join(root, name)).st_size
                        count += 1
                    except OSError:
                        pass     # deleted while listed
        files.add_metric([kind], count)
        size.add_metric([kind], total)
    yield from (files, size)


def _published_metrics(published: dict[str, dict | None]):
    """One family per statistic, with a ``process`` label, over every process's
    published snapshot (a name two processes publish becomes one family)."""
    families: dict[str, CounterMetricFamily | HistogramMetricFamily] = {}
    for process, snap in published.items():
        if snap is None:
            continue
        for name, counter in snap.get("counters", {}).items():
            family = families.get(name)
            if family is None:
                family = families[name] = CounterMetricFamily(
                    PREFIX + name.removesuffix("_total"), _STATS_HELP.get(name, name),
                    labels=["process", *counter["labels"]])
            for labels, value in counter["values"]:
                family.add_metric([process, *labels], value)
        for name, h in snap.get("histograms", {}).items():
            family = families.get(name)
            if family is None:
                family = families[name] = HistogramMetricFamily(
                    PREFIX + name, _STATS_HELP.get(name, name), labels=["process"])
            cumulative, buckets = 0, []
            for bound, count in zip([*h["bounds"], float("inf")], h["counts"]):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric([process], buckets, h["sum"])
    yield from families.values()


def serve(store_dir: str, address: str, port: int):
    """Start the endpoint on a daemon thread; returns the HTTP server (``shutdown()``
    stops it). Raises ``OSError`` when the address cannot be bound."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_dir))
    server, _thread = start_http_server(port, addr=address, registry=registry)
    log.info("metrics on http://%s:%d/metrics", address, port)
    return server
