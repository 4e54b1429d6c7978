"""Failover, measured: how long producers go without PUT_OK when a group's master dies.

    python bench/failover.py [--rounds 3] [--session-ms 2000] [--role ASYNC_MASTER]

Starts a real ZooKeeper (Debian's package, tests/zookeeper_server.py) and a broker group
of two stores in controller mode, puts through the group's address from one producer
(one message at a time), SIGKILLs the master's whole process group, and reports the
time from the kill to the first PUT_OK from the member elected after it; then starts
the old master again (it rejoins as a slave) for the next round, which kills the other
member. With ``--role SYNC_MASTER`` the new master answers PUT_OK only once a slave
follows it, so the time then includes the old master's return.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rocketstore.client import ClientError, Producer  # noqa: E402
from rocketstore.client.group_lookup import master  # noqa: E402
from rocketstore.storage.status import PutMessageStatus  # noqa: E402
from store_processes import RunningStore, free_port, free_ports, wait_for  # noqa: E402
from zookeeper_server import ZooKeeperServer, missing  # noqa: E402


def member(root: str, zk: str, broker_id: int, role: str, session_ms: int) -> RunningStore:
    where = os.path.join(root, f"m{broker_id}")
    os.makedirs(where, exist_ok=True)
    return RunningStore(where, enable_controller_mode=True, cluster_address=zk,
                        broker_name="bench", broker_id=broker_id, broker_role=role,
                        tcp_listen_address="127.0.0.1", listen_port=free_ports(-2, 0),
                        ha_listen_port=free_port(), cluster_session_timeout_ms=session_ms,
                        ha_send_heartbeat_interval=300, ha_housekeeping_interval=1500)


def master_id(address: str) -> int | None:
    try:
        return master(address)["broker_id"]
    except ClientError:
        return None


def both_in_sync(zk: str) -> bool:
    from kazoo.client import KazooClient
    from rocketstore.wire import group_nodes as nodes
    client = KazooClient(zk)
    client.start(5)
    try:
        data, _ = client.get(nodes.sync_state_set_path("bench"))
        return sorted(nodes.decode(data).get("members", [])) == [0, 1]
    finally:
        client.stop()
        client.close()


def first_ok_after(address: str, killed: int, deadline_s: float = 120) -> tuple[float, float]:
    """Seconds until another member is named master, and until a put through the
    group's address is PUT_OK from it."""
    t0 = time.monotonic()
    elected = None
    while time.monotonic() - t0 < deadline_s:
        if master_id(address) not in (None, killed):
            elected = elected or time.monotonic() - t0
            try:
                with Producer(address, timeout_ms=1000) as p:
                    if p.send("Bench", b"x").status is PutMessageStatus.PUT_OK:
                        return elected, time.monotonic() - t0
            except ClientError:
                pass
        time.sleep(0.01)
    raise AssertionError("no PUT_OK from a new master")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--role", default="ASYNC_MASTER", choices=("ASYNC_MASTER", "SYNC_MASTER"))
    args = ap.parse_args()
    if missing():
        sys.exit(missing())
    root = tempfile.mkdtemp(prefix="rocketstore-failover-")
    zk = ZooKeeperServer(root).start()
    address = f"zk://{zk.address}/bench"
    stores = [member(root, zk.address, i, args.role, args.session_ms) for i in (0, 1)]
    times, elections = [], []
    try:
        stores[0].start()
        wait_for(lambda: master_id(address) == 0, 60, what="member 0 elected")
        stores[1].start()
        for _ in range(args.rounds):
            wait_for(lambda: both_in_sync(zk.address), 60, what="both members in sync",
                     interval=0.2)
            current = master_id(address)
            with Producer(address) as p:
                for _ in range(100):
                    p.send("Bench", b"warm")
            stores[current].kill_all()
            if args.role == "SYNC_MASTER":
                stores[current].start()
            elected, first_ok = first_ok_after(address, current)
            elections.append(elected)
            times.append(first_ok)
            if args.role != "SYNC_MASTER":
                stores[current].start()
            print(f"master {current} killed: another elected after {elected:.2f} s, its "
                  f"first PUT_OK after {first_ok:.2f} s", flush=True)
    finally:
        for s in stores:
            s.kill_all()
        zk.stop()
    print(json.dumps({"role": args.role, "session_ms": args.session_ms,
                      "seconds_to_election": [round(t, 2) for t in elections],
                      "seconds_to_first_put_ok": [round(t, 2) for t in times],
                      "median_s": round(statistics.median(times), 2)}))


if __name__ == "__main__":
    main()
