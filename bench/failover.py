"""Failover, measured: how long producers go without PUT_OK when a group's master dies,
and what a planned hand-over (``rocketstore promote`` on a member) costs them.

    python bench/failover.py [--rounds 3] [--handovers 3] [--producers 2]
                             [--session-ms 2000] [--role ASYNC_MASTER]

Starts a real ZooKeeper (Debian's package, tests/zookeeper_server.py) and a broker group
of two stores in controller mode.

Kills (``--rounds``): puts through the group's address from one producer (one message
at a time), SIGKILLs the master's whole process group, and reports the time from the
kill to the first PUT_OK from the member elected after it; then starts the old master
again (it rejoins as a slave) for the next round, which kills the other member. With
``--role SYNC_MASTER`` the new master answers PUT_OK only once a slave follows it, so
the time then includes the old master's return.

Hand-overs (``--handovers``): ``--producers`` idempotent producers put one message at a
time through the group's address (each send resent with its sequence until PUT_OK)
while ``rocketstore promote`` hands the group to the slave. Reported per hand-over: the
sends' p50, p99 and max latency among those begun while the command ran (a send's
latency: from its first try to its PUT_OK), the longest time no producer got a PUT_OK
(the group took no puts) while the command ran, and the command's own time (its
start included, and until the old master follows the new one).
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

import subprocess  # noqa: E402
import threading  # noqa: E402

from rocketstore.client import ClientError, Producer  # noqa: E402
from rocketstore.storage import Message  # noqa: E402
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


class Sender(threading.Thread):
    """One idempotent producer sending one message at a time, each resent with its
    sequence until PUT_OK; keeps ``(begun, acknowledged)`` monotonic times of each."""

    def __init__(self, address: str, topic: str):
        super().__init__(daemon=True)
        self.address, self.topic = address, topic
        self.sends: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.address, idempotent=True, timeout_ms=60_000) as p:
                n = 0
                while not self.stop.is_set():
                    begun = time.monotonic()
                    message = [Message(self.topic, b"h" * 128)]
                    while p.send_batch(message, first_sequence=n)[0].status \
                            is not PutMessageStatus.PUT_OK:
                        time.sleep(0.005)
                    self.sends.append((begun, time.monotonic()))
                    n += 1
        except BaseException as e:  # noqa: BLE001 - reported by main
            self.error = e


def hand_over(stores, address: str, producers: int) -> dict:
    """One planned hand-over under ``producers`` senders: its figures."""
    senders = [Sender(address, f"HandOver{i}") for i in range(producers)]
    for sender in senders:
        sender.start()
    wait_for(lambda: all(len(s.sends) >= 200 for s in senders), 60, what="warm senders")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rocketstore.cli", "promote", "--config",
                        stores[0].config_path, "--json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=180)
    t1 = time.monotonic()
    if r.returncode != 0:
        raise AssertionError(f"promote failed: {r.stderr}")
    wait_for(lambda: all(s.sends and s.sends[-1][1] > t1 + 1 for s in senders), 60,
             what="PUT_OK after the hand-over")
    for sender in senders:
        sender.stop.set()
    for sender in senders:
        sender.join(70)
        if sender.error:
            raise sender.error
    during = sorted(done - begun for s in senders for begun, done in s.sends
                    if t0 <= begun <= t1)
    acks = sorted(done for s in senders for _, done in s.sends)
    gaps = [b - a for a, b in zip(acks, acks[1:]) if b >= t0 and a <= t1]
    doc = json.loads(r.stdout)
    return {"from": doc["from"], "to": doc["to"], "command_s": round(t1 - t0, 2),
            "no_puts_s": round(max(gaps), 3),
            "sends": len(during),
            "p50_ms": round(1000 * during[len(during) // 2], 1),
            "p99_ms": round(1000 * during[min(len(during) - 1, int(len(during) * 0.99))], 1),
            "max_ms": round(1000 * during[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handovers", type=int, default=3)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--role", default="ASYNC_MASTER", choices=("ASYNC_MASTER", "SYNC_MASTER"))
    args = ap.parse_args()
    if missing():
        sys.exit(missing())
    root = tempfile.mkdtemp(prefix="rocketstore-failover-")
    zk = ZooKeeperServer(root).start()
    address = f"zk://{zk.address}/bench"
    stores = [member(root, zk.address, i, args.role, args.session_ms) for i in (0, 1)]
    times, elections, handed = [], [], []
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
        for _ in range(args.handovers):
            wait_for(lambda: both_in_sync(zk.address), 60, what="both members in sync",
                     interval=0.2)
            handed.append(hand_over(stores, address, args.producers))
            print(f"hand-over: {json.dumps(handed[-1])}", flush=True)
    finally:
        for s in stores:
            s.kill_all()
        zk.stop()
    print(json.dumps({"role": args.role, "session_ms": args.session_ms,
                      "seconds_to_election": [round(t, 2) for t in elections],
                      "seconds_to_first_put_ok": [round(t, 2) for t in times],
                      "median_s": round(statistics.median(times), 2) if times else None,
                      "handovers": handed}))


if __name__ == "__main__":
    main()
