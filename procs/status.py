"""What ``rocketstore status`` and the metrics endpoint report of a running store:
positions, processes (state, pid, heartbeat age, the CPUs each may use), disk (the file
system, what the store's files reserve, quarantine), the error flags, each consumer
group's lag and the replication (a master's slaves, a slave's master).

Read from the position table, the processes' published statistics (``stats``) and the
store's files; it writes nothing.
"""

from __future__ import annotations

import os
import shutil

from rocketstore.client.consumer import read_offsets, store_config
from rocketstore.procs.stats import read_published
from rocketstore.storage.clock import monotonic_ms
from rocketstore.shm.positions import HEARTBEAT_MS, PositionTable, StoreState, now_ms
from rocketstore.storage import replication
from rocketstore.storage.config import BROKER_ROLES
from rocketstore.storage.reservation import store_reservation
from rocketstore.storage.store_reader import StoreReader
from rocketstore.wire.ha_protocol import error_name


def store_status(store_dir: str) -> dict:
    """Positions, processes, disk, flags and consumer group lag of a running store.

    Raises ``PositionTableError`` when the store is not running.
    """
    table = PositionTable.attach(store_dir)
    try:
        snap = table.snapshot()
        written = snap["written"]
        now = now_ms()
        for name, proc in snap["processes"].items():
            beat = table.get_process(name, HEARTBEAT_MS)
            proc["heartbeat_age_ms"] = now - beat if beat else None
            proc["cpus"] = _cpus(proc["pid"])
        usage = shutil.disk_usage(store_dir)
        positions = {"min_offset": snap["min_offset"], "written": written,
                     "flushed": snap["flushed"], "dispatched": snap["dispatched"],
                     "confirm": table.confirm_offset()}
        if snap["transient_pool"]:
            positions["committed"] = snap["committed"]
        status = {
            "store": os.path.abspath(store_dir),
            "state": StoreState(snap["state"]).name,
            "role": BROKER_ROLES[snap["role"]],
            "writeable": not not_writeable(snap),
            "not_writeable": not_writeable(snap),
            "positions": positions,
            "transient_pool_buffers": snap["transient_pool"],
            "dispatch_lag_bytes": written - snap["dispatched"],
            "flush_lag_bytes": written - snap["flushed"],
            "errors": {"flush": snap["flush_error"], "dispatch": snap["dispatch_error"],
                       "disk_full": bool(snap["disk_full"])},
            "disk": {"total": usage.total, "used": usage.used,
                     "used_ratio": round(usage.used / usage.total, 4),
                     "reserved": store_reservation(store_config(store_dir), written),
                     "quarantine": quarantine_usage(store_dir)},
            "processes": snap["processes"],
            "generation": snap["generation"],
            "supervisor_pid": snap["supervisor_pid"],
            "consumer_groups": consumer_groups(store_dir, snap["dispatched"]),
            "ha": replication_status(store_dir, snap, now),
        }
        group = controller_status(store_dir, snap)
        if group is not None:
            status["controller"] = group
        return status
    finally:
        table.close()


def _cpus(pid: int) -> list[int] | None:
    """The CPUs process ``pid`` may run on (one, for a writer kept on its CPU); None
    when it is not running."""
    if not pid:
        return None
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return None


def not_writeable(snap: dict) -> list[str]:
    """Why the store takes no sends now, empty when it takes them: ``"SLAVE"`` (a slave
    takes only its master's bytes), ``"flush_error"``, ``"disk_full"``."""
    why = ["SLAVE"] if BROKER_ROLES[snap["role"]] == "SLAVE" else []
    if snap["flush_error"]:
        why.append("flush_error")
    if snap["disk_full"]:
        why.append("disk_full")
    return why


def reserved_text(reserved: dict) -> str:
    """``storage.reservation.store_reservation`` in one line: what the files hold now,
    by kind, and the steps they grow by."""
    cl, ahead, steps = reserved["commit_log"], reserved["commit_log_ahead"], reserved["steps"]
    return (f"{size_text(reserved['bytes'])} reserved now (CommitLog {size_text(cl)}: "
            f"{size_text(ahead)} ahead of writes; index "
            f"{size_text(reserved['index'])}; consume queues "
            f"{size_text(reserved['consume_queues'])}); grows as it fills, a step at a time "
            f"(CommitLog {size_text(steps['commit_log'])}, index entries "
            f"{size_text(steps['index_entries'])}, consume queue "
            f"{size_text(steps['consume_queue'])})")


def size_text(n: int) -> str:
    """``0 B``, ``12 KiB``, ``1.5 MiB``, ``64 MiB``, ``3.2 GiB``."""
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / (1 << 10):.0f} KiB"
    if n < 10 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.0f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def quarantine_usage(store_dir: str) -> dict:
    """What ``quarantine/`` holds: the bytes recovery or a replica's cut moved there
    (kept for an operator to inspect; nothing removes them), as disk blocks used, the
    number of cuts (one directory each) and the files."""
    root = os.path.join(store_dir, "quarantine")
    used = files = 0
    cuts = set()
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                used += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue                      # removed meanwhile, or not ours to read
            files += 1
            cuts.add(os.path.relpath(directory, root).split(os.sep)[0])
    return {"path": root, "bytes": used, "cuts": len(cuts - {"."}), "files": files}


def replication_status(store_dir: str, snap: dict, now: int) -> dict:
    """The store's role and its replication: a master's slaves (each one's ack and lag,
    as the HA process last published them, about once a second), or a slave's master
    (its end, the lag, a refusal) and the cuts a divergence made. A slave's lag is None
    (unknown) until its master has spoken, and while the master refuses it."""
    role = BROKER_ROLES[snap["role"]]
    written = snap["written"]
    if role == "SLAVE":
        published = (read_published(store_dir, "writer") or {}).get("ha", {})
        master_end, heard = snap["master_end"], snap["master_heard_ms"]
        known = heard and not snap["replica_error"]
        lag = max(0, master_end - written) if known else None
        caught_up = published.get("caught_up_ms", 0)
        return {"role": role, "master": published.get("master"),
                "master_end": master_end if heard else None, "written": written,
                "lag_bytes": lag,
                "lag_ms": None if lag is None else 0 if not lag else
                (now - caught_up if caught_up else None),
                "master_heard_ms_ago": now - heard if heard else None,
                "error": error_name(snap["replica_error"]) if snap["replica_error"] else None,
                "cuts": replication.cuts_made(os.path.join(store_dir, "config"))}
    published = (read_published(store_dir, "ha") or {}).get("ha", {})
    slaves = published.get("slaves", [])
    for s in slaves:               # each its own ack (SLAVE_ACKED is any slave's, ever)
        s["lag_bytes"] = max(0, written - s["acked"])
        if not s["lag_bytes"]:
            s["lag_ms"] = 0
    return {"role": role, "listen": published.get("listen"),
            "slave_acked": snap["slave_acked"], "slaves_connected": snap["slaves"],
            "slaves": slaves}


def controller_status(store_dir: str, snap: dict) -> dict | None:
    """Controller mode: the broker group as this member's controller last published it
    (procs.controller), with the epoch and the lease left now; None without one."""
    published = (read_published(store_dir, "controller") or {}).get("controller")
    if "controller" not in snap["processes"] or not published:
        return None
    return {**published, "epoch": snap["epoch"],
            "lease_ms": max(0, snap["master_lease_ms"] - monotonic_ms())}


def consumer_groups(store_dir: str, dispatched: int) -> dict:
    """Every ``topic@group`` of ``config/consumerOffset.json``: per queue the committed
    offset, the queue's max offset within ``dispatched`` and the lag (max - committed,
    never below 0), and the group's total lag. A queue of the topic that the group never
    committed is listed with ``committed`` and ``lag`` None and adds nothing to the total.
    """
    config = store_config(store_dir)
    groups: dict[str, dict] = {}
    with StoreReader(config) as reader:
        queues_of = reader.topics()
        for key, committed in sorted(read_offsets(config.config_dir).items()):
            if not isinstance(committed, dict):
                continue  # not RocketMQ's shape: nothing to show
            topic, _, group = key.partition("@")
            offsets = {int(q): o for q, o in committed.items()
                       if q.isdigit() and isinstance(o, int)}
            queues = {}
            for q in sorted(set(offsets) | set(queues_of.get(topic, ()))):
                max_offset = reader.get_max_offset_in_queue(topic, q, dispatched)
                done = offsets.get(q)
                queues[str(q)] = {"committed": done, "max_offset": max_offset,
                                  "lag": None if done is None else max(0, max_offset - done)}
            groups[key] = {"topic": topic, "group": group, "queues": queues,
                           "lag": sum(v["lag"] for v in queues.values() if v["lag"] is not None)}
    return groups
