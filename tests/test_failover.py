"""Automatic failover (controller mode): a broker group elects its master in a real
ZooKeeper (Debian's package, one server for the module, on a free loopback port in a
temporary directory), real stores (``rocketstore up``) follow it, and the master that
lost its session answers no PUT_OK (procs.controller, procs.fencing)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from rocketstore.client import Producer
from rocketstore.client.errors import ClientError
from rocketstore.client.group_address import master as group_master
from rocketstore.procs.controller import NOT_IN_SYNC, NOT_REGISTERED, OTHER_BETTER, STAND, stands
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message, StoreConfig, epoch_file
from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.status import PutMessageStatus
from rocketstore.wire import group_nodes as nodes
from store_processes import RunningStore, cli, free_port, free_ports, wait_for
from test_replication import HA_TIMERS, consume_all, files, slot
from zookeeper_server import ZooKeeperServer, missing as zookeeper_missing

SESSION_MS = 2000
OK = PutMessageStatus.PUT_OK


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("settings, message", [
    (dict(), "enable_controller_mode needs cluster_address"),
    (dict(cluster_address="127.0.0.1:2181"), "needs broker_name"),
    (dict(cluster_address="127.0.0.1:2181", broker_name="g"), "needs tcp_listen_address"),
    (dict(cluster_address="127.0.0.1:2181", broker_name="g", tcp_listen_address="127.0.0.1"),
     "needs ha_listen_port"),
    (dict(cluster_address="127.0.0.1:2181", broker_name="g", tcp_listen_address="127.0.0.1",
          ha_listen_port=10912, broker_role="SLAVE", ha_master_address="127.0.0.1:1"),
     'needs broker_role = "SYNC_MASTER"'),
])
def test_controller_mode_settings_that_cannot_work_are_refused(settings, message):
    config = StoreConfig(enable_controller_mode=True, **settings)
    with pytest.raises(StoreConfigError) as e:
        config.check_replication()
    assert message in str(e.value)


@pytest.mark.parametrize("settings", [dict(broker_id=-1), dict(broker_name="a/b"),
                                      dict(cluster_address="zk1"),
                                      dict(cluster_session_timeout_ms=0),
                                      dict(ha_max_time_slave_not_catchup=0)])
def test_controller_mode_values_are_checked(settings):
    with pytest.raises(StoreConfigError):
        StoreConfig(**settings)


def test_promote_refuses_a_group_member(tmp_path):
    store = RunningStore(tmp_path, enable_controller_mode=True, cluster_address="127.0.0.1:1",
                         broker_name="g", tcp_listen_address="127.0.0.1",
                         ha_listen_port=free_port(), broker_role="SYNC_MASTER")
    r = cli("promote", "--config", store.config_path)
    assert r.returncode == 1 and "the group elects its master" in r.stderr, r.stderr


@pytest.mark.parametrize("me, ends, in_sync, unclean, verdict", [
    (2, {0: 5, 1: 5}, [0, 1], False, NOT_REGISTERED),
    (1, {0: 9, 1: 5}, [0], False, NOT_IN_SYNC),         # out of sync, however much it holds
    (1, {1: 5}, [0], False, NOT_IN_SYNC),               # alone, out of sync: the group waits
    (1, {1: 5}, [0], True, STAND),                      # ... unless unclean is allowed
    (1, {0: 9, 1: 5}, [0, 1], False, OTHER_BETTER),     # the in-sync member holding more
    (1, {0: 9, 1: 5}, [1], False, STAND),               # 0 holds more, but out of sync
    (0, {0: 5, 1: 5}, [0, 1], False, STAND),            # a tie: the lowest broker_id
    (1, {0: 5, 1: 5}, [0, 1], False, OTHER_BETTER),
    (1, {0: 0, 1: 0}, None, False, OTHER_BETTER),       # a new group: anyone may stand
    (0, {0: 0, 1: 0}, None, False, STAND),
])
def test_who_stands_for_election(me, ends, in_sync, unclean, verdict):
    members = {b: {"broker_id": b, "end": end} for b, end in ends.items()}
    assert stands(me, members, in_sync, unclean) == verdict


def test_epochs_only_go_up(tmp_path):
    d = str(tmp_path)
    assert epoch_file.current(d) == 0
    assert epoch_file.record(d, 1, 0) and epoch_file.record(d, 3, 4096)
    assert not epoch_file.record(d, 2, 8192)
    assert epoch_file.load(d) == [(1, 0), (3, 4096)] and epoch_file.current(d) == 3


# ------------------------------------------------------------------ a real ZooKeeper
@pytest.fixture(scope="module")
def zookeeper_server(tmp_path_factory):
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    server = ZooKeeperServer(str(tmp_path_factory.mktemp("zookeeper"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zookeeper(zookeeper_server) -> str:
    """``host:port`` of the module's ZooKeeper server, running."""
    if zookeeper_server.proc is None:
        zookeeper_server.start()
    return zookeeper_server.address


def member(tmp_path, zookeeper: str, group: str, broker_id: int, **settings) -> RunningStore:
    where = tmp_path / f"m{broker_id}"
    where.mkdir(exist_ok=True)
    return RunningStore(where, enable_controller_mode=True, cluster_address=zookeeper,
                        broker_name=group, broker_id=broker_id, broker_role="SYNC_MASTER",
                        tcp_listen_address="127.0.0.1", listen_port=free_ports(-2, 0),
                        ha_listen_port=free_port(), cluster_session_timeout_ms=SESSION_MS,
                        ha_max_time_slave_not_catchup=3000, **HA_TIMERS, **settings)


def master_of(zookeeper: str, group: str) -> dict | None:
    try:
        return group_master(f"zk://{zookeeper}/{group}")
    except ClientError:
        return None


def is_master(zookeeper: str, group: str, store: RunningStore, broker_id: int) -> bool:
    """The group names ``broker_id`` master and its store runs as a master with its lease."""
    doc = master_of(zookeeper, group)
    return bool(doc) and doc["broker_id"] == broker_id and slot(store, Slot.ROLE) == 1 and \
        slot(store, Slot.MASTER_LEASE_MS) > 0


def follows(store: RunningStore, master: RunningStore) -> bool:
    return slot(store, Slot.ROLE) == 2 and slot(master, Slot.SLAVES) == 1


def in_sync_set(zookeeper: str, group: str) -> list[int] | None:
    from kazoo.client import KazooClient
    zk = KazooClient(zookeeper)
    zk.start(5)
    try:
        data, _ = zk.get(nodes.sync_state_set_path(group))
        return nodes.decode(data).get("members")
    finally:
        zk.stop()
        zk.close()


def group_status(store: RunningStore) -> dict:
    r = cli("status", "--config", store.config_path, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout).get("controller") or {}


def pair(tmp_path, zookeeper: str, group: str) -> tuple[RunningStore, RunningStore]:
    """Member 0 elected master, member 1 its slave, in the in-sync set. Each member
    picks its ports once the one before holds its own (two picked together may be
    the same)."""
    a = member(tmp_path, zookeeper, group, 0).start()
    b = None
    try:
        wait_for(lambda: is_master(zookeeper, group, a, 0), 30, what="member 0 to be master")
        b = member(tmp_path, zookeeper, group, 1).start()
        wait_for(lambda: follows(b, a), 30, what="member 1 to follow member 0")
        wait_for(lambda: in_sync_set(zookeeper, group) == [0, 1], 15,
                 what="an in-sync set of both")
    except BaseException:
        for store in (b, a):
            if store is not None:
                store.kill_all()
        raise
    return a, b


class IdempotentLoad(threading.Thread):
    """Sends numbered batches through the group's address with one producer id, each
    until every message is PUT_OK (resent with its own sequences to whichever store is
    master); keeps every body acknowledged."""

    def __init__(self, address: str, topic: str, batch: int = 10):
        super().__init__(daemon=True)
        self.address, self.topic, self.batch = address, topic, batch
        self.producer_id = 1 + (os.getpid() << 8) + int(time.monotonic() * 1000) % 255
        self.acked: list[bytes] = []
        self.resends = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                bodies = [f"{self.topic} {n + i}".encode() for i in range(self.batch)]
                if not self._until_ok(n, bodies):
                    return
                self.acked += bodies
                n += self.batch
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _until_ok(self, first: int, bodies: list[bytes]) -> bool:
        """True once every message is PUT_OK; False when told to stop first."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.stop.is_set():
                return False
            try:
                with Producer(self.address, producer_id=self.producer_id,
                              timeout_ms=2000) as p:
                    while time.monotonic() < deadline:
                        results = p.send_async([Message(self.topic, b) for b in bodies],
                                               first_sequence=first).result()
                        if all(r.status is OK for r in results):
                            return True
                        if self.stop.is_set():
                            return False
                        self.resends += 1
                        if any(r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
                               for r in results):
                            break       # not the master (any more): ask the group again
                        time.sleep(0.05)
            except ClientError:
                self.resends += 1
            time.sleep(0.1)
        raise AssertionError(f"batch from {first} never acknowledged")

    def count(self) -> int:
        return len(self.acked)


def test_masters_killed_twice_are_replaced_and_every_acknowledged_message_survives_once(
        tmp_path, zookeeper):
    """SYNC_MASTER group of three under an idempotent load through the group's address.
    The master's whole process group is SIGKILLed: a slave is elected (epoch 2), the
    other follows it, and the producer goes on by itself; the old master, started
    again, rejoins as a slave. Then the second master is killed too: a member of the
    in-sync set is elected (epoch 3). Every message ever answered PUT_OK is on the last
    master exactly once, and its slaves end byte-identical to it."""
    group = "kill"
    stores = []
    load = IdempotentLoad(f"zk://{zookeeper}/{group}", "Kill")

    def elected(epoch: int, not_id: int) -> int:
        wait_for(lambda: (master_of(zookeeper, group) or {}).get("epoch") == epoch,
                 SESSION_MS / 1000 + 20, what=f"an election (epoch {epoch})")
        new = master_of(zookeeper, group)["broker_id"]
        assert new != not_id
        wait_for(lambda: is_master(zookeeper, group, stores[new], new), 30,
                 what=f"member {new} to take puts")
        return new

    def in_sync(members: list[int]) -> None:
        wait_for(lambda: sorted(in_sync_set(zookeeper, group)) == sorted(members), 30,
                 what=f"an in-sync set of {members}")
    try:
        stores.append(member(tmp_path, zookeeper, group, 0).start())
        wait_for(lambda: is_master(zookeeper, group, stores[0], 0), 30,
                 what="member 0 to be master")
        for i in (1, 2):        # each picks its ports once the one before holds its own
            stores.append(member(tmp_path, zookeeper, group, i).start())
        in_sync([0, 1, 2])
        load.start()
        wait_for(lambda: load.count() >= 100 or load.error, 30, what="load on member 0")

        stores[0].kill_all()
        second = elected(2, not_id=0)
        other = 3 - second
        assert [e for e, _ in epoch_file.load(
            os.path.join(stores[second].store_dir, "config"))] == [1, 2]
        stores[0].start()
        wait_for(lambda: slot(stores[second], Slot.SLAVES) == 2 and
                 slot(stores[0], Slot.ROLE) == slot(stores[other], Slot.ROLE) == 2, 30,
                 what="the other members to follow the second master")
        wait_for(lambda: [m["broker_id"] for m in group_status(stores[second]).get("members")
                          or []] == [0, 1, 2], 15, what="status to show the three members")
        shown = group_status(stores[second])
        assert (shown["group"], shown["master"], shown["epoch"]) == (group, second, 2)
        assert shown["lease_ms"] > 0
        wait_for(lambda: group_status(stores[0]).get("master") == second, 15,
                 what="the old master's status to name the new one")
        assert group_status(stores[0])["lease_ms"] == 0
        in_sync([0, 1, 2])
        killed_at = load.count()
        wait_for(lambda: load.count() >= killed_at + 100 or load.error, 60,
                 what="acknowledgements from the second master")

        stores[second].kill_all()
        third = elected(3, not_id=second)
        last = 3 - third - second           # the slave left
        wait_for(lambda: slot(stores[last], Slot.ROLE) == 2 and
                 slot(stores[third], Slot.SLAVES) == 1, 30, what="the last slave to follow")
        killed_at = load.count()
        wait_for(lambda: load.count() >= killed_at + 100 or load.error, 60,
                 what="acknowledgements from the third master")
        load.stop.set()
        load.join(70)
        assert load.error is None, load.error
        assert load.resends > 0
        stored = consume_all(stores[third], "Kill")
        assert sorted(stored) == sorted(set(stored)), "a message stored twice"
        assert set(load.acked) <= set(stored)
        wait_for(lambda: slot(stores[last], Slot.WRITTEN) == slot(stores[third], Slot.WRITTEN)
                 == slot(stores[last], Slot.DISPATCHED), 30, what="the slave to catch up")
        assert files(stores[last], "commitlog") == files(stores[third], "commitlog")
    finally:
        load.stop.set()
        for store in reversed(stores):
            store.__exit__(None, None, None)


def test_a_paused_master_answers_no_put_ok_after_waking_and_rejoins_as_a_slave(
        tmp_path, zookeeper):
    """The master is paused (SIGSTOP of its process group) longer than its session:
    the slave is elected. The puts sent to the paused master meanwhile are answered,
    once it wakes, with anything but PUT_OK; then it follows the new master."""
    group = "pause"
    a, b = pair(tmp_path, zookeeper, group)
    try:
        with Producer(a.store_dir) as p:
            assert p.send("Pause", b"before").status is OK
            os.killpg(a.proc.pid, signal.SIGSTOP)
            try:
                pending = [p.send_async([Message("Pause", f"paused {i}".encode())])
                           for i in range(5)]
                wait_for(lambda: is_master(zookeeper, group, b, 1), SESSION_MS / 1000 + 20,
                         what="member 1 to be elected")
            finally:
                os.killpg(a.proc.pid, signal.SIGCONT)
            answers = []
            for handle in pending:
                try:
                    answers += [r.status for r in handle.result()]
                except ClientError as e:
                    answers.append(type(e).__name__)
        assert OK not in answers, answers
        wait_for(lambda: follows(a, b), 30, what="the paused master to rejoin as a slave")
        with Producer(f"zk://{zookeeper}/{group}") as p:
            assert p.send("Pause", b"after").status is OK
        assert b"before" in consume_all(b, "Pause")
    finally:
        for store in (b, a):
            store.__exit__(None, None, None)


def test_a_slave_out_of_the_in_sync_set_is_never_elected(tmp_path, zookeeper):
    """The slave stops; the master drops it from the in-sync set and takes more puts;
    the master dies. The slave, started again, is not elected (the group waits without
    a master) while enable_elect_unclean_master is off; the old master, back, is
    elected again (a new epoch) and the slave follows it and catches up."""
    group = "unsynced"
    a, b = pair(tmp_path, zookeeper, group)
    try:
        assert b.stop() == 0
        wait_for(lambda: in_sync_set(zookeeper, group) == [0], 15,
                 what="the stopped slave to leave the in-sync set")
        with Producer(a.store_dir) as p:
            p.send_batch([Message("Unsynced", f"only on 0: {i}".encode()) for i in range(20)])
        a.kill_all()
        b.start()
        wait_for(lambda: "not electable" in b.log(), SESSION_MS / 1000 + 20,
                 what="member 1 to find itself out of the in-sync set")
        assert master_of(zookeeper, group) is None
        assert slot(b, Slot.MASTER_LEASE_MS) == 0
        a.start()
        wait_for(lambda: is_master(zookeeper, group, a, 0), 30, what="member 0 elected again")
        assert master_of(zookeeper, group)["epoch"] == 2
        wait_for(lambda: follows(b, a), 30, what="member 1 to follow member 0")
        wait_for(lambda: slot(b, Slot.WRITTEN) == slot(a, Slot.WRITTEN), 30,
                 what="member 1 to catch up")
        assert len(consume_all(b, "Unsynced")) == 20
    finally:
        for store in (b, a):
            store.__exit__(None, None, None)


def test_with_zookeeper_down_the_group_refuses_puts_and_goes_on_when_it_is_back(
        tmp_path, zookeeper_server, zookeeper):
    """No election can happen without ZooKeeper, and no master can renew its lease: the
    master refuses puts (SERVICE_NOT_AVAILABLE, NOT_MASTER) once it lost ZooKeeper.
    ZooKeeper back (same data, same port): the group has a master again, taking puts,
    and nothing acknowledged before is lost."""
    group = "zkdown"
    a, b = pair(tmp_path, zookeeper, group)
    try:
        with Producer(f"zk://{zookeeper}/{group}") as p:
            assert p.send("Down", b"before").status is OK
            zookeeper_server.stop()
            wait_for(lambda: slot(a, Slot.MASTER_LEASE_MS) == 0, 10,
                     what="the master to lose its lease")
            refused = p.send("Down", b"while down")
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert refused.reason.startswith("NOT_MASTER"), refused.reason
        zookeeper_server.start()
        wait_for(lambda: is_master(zookeeper, group, a, 0) or is_master(zookeeper, group, b, 1),
                 30, what="a master again")
        wait_for(lambda: in_sync_set(zookeeper, group) in ([0, 1], [1, 0]), 30,
                 what="both members in sync again")
        with Producer(f"zk://{zookeeper}/{group}") as p:
            assert p.send("Down", b"after").status is OK
        master = a if master_of(zookeeper, group)["broker_id"] == 0 else b
        assert {b"before", b"after"} <= set(consume_all(master, "Down"))
    finally:
        for store in (b, a):
            store.__exit__(None, None, None)
