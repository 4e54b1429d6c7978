"""Automatic failover (controller mode): a broker group elects its master in a real
ZooKeeper (Debian's package, one server for the module, on a free loopback port in a
temporary directory), real stores (``rocketstore up``) follow it, and the master that
lost its session answers no PUT_OK (procs.controller, procs.fencing)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from rocketstore.client import Producer
from rocketstore.client.errors import ClientError, ConnectionLost
from rocketstore.procs import fencing, handover
from rocketstore.procs.controller import NOT_IN_SYNC, NOT_REGISTERED, OTHER_BETTER, STAND, stands
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage import Message, StoreConfig, epoch_file
from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.status import PutMessageStatus
from rocketstore.wire import group_nodes as nodes
from rocketstore.wire import ha_protocol as hp
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


@pytest.mark.parametrize("wanted, in_sync, chosen_or_refusal", [
    (None, [0, 1, 2], 2),                      # the in-sync slave holding the most
    (None, [0, 1], 1),
    (None, [0, 1, 3], 1),                      # 3 is not registered
    (None, [0], "no slave of broker group g is in its in-sync set [0]"),
    (1, [0, 1, 2], 1),
    (0, [0, 1], "member 0 is the master of broker group g already"),
    (3, [0, 1], "member 3 is not a registered member"),
    (2, [0, 1], "member 2 is not in the in-sync set [0, 1] of broker group g (5 bytes "
                "behind member 0)"),
])
def test_who_takes_over_in_a_planned_hand_over(wanted, in_sync, chosen_or_refusal):
    members = {b: {"broker_id": b, "end": end} for b, end in {0: 90, 1: 80, 2: 85}.items()}
    if isinstance(chosen_or_refusal, int):
        assert handover.choose("g", 0, members, in_sync, wanted) == chosen_or_refusal
    else:
        with pytest.raises(handover.HandOverRefused, match=re.escape(chosen_or_refusal)):
            handover.choose("g", 0, members, in_sync, wanted)


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
        reader = _readers.pop(server.address, None)
        if reader is not None:
            reader.stop()
            reader.close()
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


_readers: dict = {}      # one ZooKeeper session per server for the tests' reads


def read_node(zookeeper: str, path: str) -> dict | None:
    """A group node as the tests' shared session reads it; None when absent or when
    ZooKeeper does not answer within 2 s."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError
    zk = _readers.get(zookeeper)
    if zk is None:
        zk = _readers[zookeeper] = KazooClient(zookeeper, timeout=5, connection_retry={
            "max_tries": -1, "delay": 0.1, "max_delay": 0.5})
        zk.start(10)
    try:
        data, _ = zk.get_async(path).get(timeout=2)
    except (KazooException, KazooTimeoutError):
        return None
    return nodes.decode(data)


def master_of(zookeeper: str, group: str) -> dict | None:
    return read_node(zookeeper, nodes.master_path(group))


def is_master(zookeeper: str, group: str, store: RunningStore, broker_id: int) -> bool:
    """The group names ``broker_id`` master and its store runs as a master with its lease."""
    doc = master_of(zookeeper, group)
    return bool(doc) and doc["broker_id"] == broker_id and slot(store, Slot.ROLE) == 1 and \
        fencing.holds_lease(slot(store, Slot.MASTER_LEASE_MS))


def follows(store: RunningStore, master: RunningStore) -> bool:
    return slot(store, Slot.ROLE) == 2 and slot(master, Slot.SLAVES) == 1


def in_sync_set(zookeeper: str, group: str) -> list[int] | None:
    return (read_node(zookeeper, nodes.sync_state_set_path(group)) or {}).get("members")


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


SHARED = "shared"


@pytest.fixture(scope="module")
def shared_pair(zookeeper_server, tmp_path_factory):
    """One group of two (members 0 and 1, by index) for the tests that leave it as they
    found it: a master and a slave following it in sync, whichever is which."""
    if zookeeper_server.proc is None:
        zookeeper_server.start()
    stores = pair(tmp_path_factory.mktemp("pair"), zookeeper_server.address, SHARED)
    try:
        yield stores
    finally:
        for store in reversed(stores):
            store.__exit__(None, None, None)


def roles(zookeeper: str, stores) -> tuple[int, int]:
    """(master, slave) of the shared pair, once the slave follows in sync."""
    def settled():
        m = (master_of(zookeeper, SHARED) or {}).get("broker_id")
        if m not in (0, 1):
            return None
        return (m, 1 - m) if is_master(zookeeper, SHARED, stores[m], m) and \
            follows(stores[1 - m], stores[m]) and \
            sorted(in_sync_set(zookeeper, SHARED) or []) == [0, 1] else None
    return wait_for(settled, 30, what="the shared pair: a master, its slave in sync")


class IdempotentLoad(threading.Thread):
    """Sends numbered batches through the group's address from one idempotent Producer,
    which follows the master by itself: no batch may raise or come back NOT_MASTER
    (``timeout_ms`` covers an election). A batch stored but not yet on a slave
    (SLAVE_NOT_AVAILABLE while the new master has none) is sent again with its
    sequences until PUT_OK. Keeps every body acknowledged."""

    def __init__(self, address: str, topic: str, batch: int = 10):
        super().__init__(daemon=True)
        self.address, self.topic, self.batch = address, topic, batch
        self.acked: list[bytes] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.address, idempotent=True, timeout_ms=30_000) as p:
                n = 0
                while not self.stop.is_set():
                    bodies = [f"{self.topic} {n + i}".encode() for i in range(self.batch)]
                    wait_for(lambda: self._stored(p, n, bodies), 60, interval=0.05,
                             what=f"batch {n} acknowledged")
                    self.acked += bodies
                    n += self.batch
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _stored(self, p: Producer, first: int, bodies: list[bytes]) -> bool:
        results = p.send_batch([Message(self.topic, b) for b in bodies], first_sequence=first)
        refused = [r.reason for r in results if r.reason.startswith("NOT_MASTER")]
        assert not refused, refused
        return all(r.status is OK for r in results)

    def count(self) -> int:
        return len(self.acked)


def send_after_failover(p: Producer, topic: str, body: bytes):
    """A plain producer's send after its master died: the first may raise
    ConnectionLost at once (sent before the loss was seen: its outcome unknown, here
    stored nowhere, the master being dead), the next goes to the new master."""
    try:
        return p.send(topic, body)
    except ConnectionLost:
        return p.send(topic, body)


def test_masters_killed_twice_are_replaced_and_every_acknowledged_message_survives_once(
        tmp_path, zookeeper):
    """SYNC_MASTER group of three under an idempotent load through the group's address.
    The master's whole process group is SIGKILLed: a slave is elected (epoch 2), the
    other follows it, and the producers go on by themselves (the idempotent one's
    batches each answered PUT_OK once sent, a plain one's next send stored on the new
    master); the old master, started
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

        with Producer(f"zk://{zookeeper}/{group}", timeout_ms=30_000) as plain:
            assert plain.send("Kill", b"plain before").status is OK
            stores[0].kill_all()
            second = elected(2, not_id=0)
            other = 3 - second
            assert [e for e, _ in epoch_file.load(
                os.path.join(stores[second].store_dir, "config"))] == [1, 2]
            stores[0].start()
            wait_for(lambda: slot(stores[second], Slot.SLAVES) == 2 and
                     slot(stores[0], Slot.ROLE) == slot(stores[other], Slot.ROLE) == 2, 30,
                     what="the other members to follow the second master")
            assert send_after_failover(plain, "Kill", b"plain after").status is OK
        wait_for(lambda: [m["broker_id"] for m in group_status(stores[second]).get("members")
                          or []] == [0, 1, 2], 15, what="status to show the three members",
                 interval=0.25)     # each look runs `rocketstore status`
        shown = group_status(stores[second])
        assert (shown["group"], shown["master"], shown["epoch"]) == (group, second, 2)
        assert shown["lease_ms"] > 0
        wait_for(lambda: group_status(stores[0]).get("master") == second, 15,
                 what="the old master's status to name the new one", interval=0.25)
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
        stored = consume_all(stores[third], "Kill")
        assert sorted(stored) == sorted(set(stored)), "a message stored twice"
        assert set(load.acked) | {b"plain before", b"plain after"} <= set(stored)
        wait_for(lambda: slot(stores[last], Slot.WRITTEN) == slot(stores[third], Slot.WRITTEN)
                 == slot(stores[last], Slot.DISPATCHED), 30, what="the slave to catch up")
        assert files(stores[last], "commitlog") == files(stores[third], "commitlog")
    finally:
        load.stop.set()
        for store in reversed(stores):
            store.__exit__(None, None, None)


def test_a_paused_master_answers_no_put_ok_after_waking_and_rejoins_as_a_slave(
        zookeeper, shared_pair):
    """The master is paused (SIGSTOP of its process group) longer than its session:
    the slave is elected. The puts sent to the paused master meanwhile are answered,
    once it wakes, with anything but PUT_OK; then it follows the new master."""
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    with Producer(master.store_dir) as p:
        assert p.send("Pause", b"before").status is OK
        os.killpg(master.proc.pid, signal.SIGSTOP)
        try:
            pending = [p.send_async([Message("Pause", f"paused {i}".encode())])
                       for i in range(5)]
            wait_for(lambda: is_master(zookeeper, SHARED, slave, s), SESSION_MS / 1000 + 20,
                     what=f"member {s} to be elected")
        finally:
            os.killpg(master.proc.pid, signal.SIGCONT)
        answers = []
        for handle in pending:
            try:
                answers += [r.status for r in handle.result()]
            except ClientError as e:
                answers.append(type(e).__name__)
    assert OK not in answers, answers
    wait_for(lambda: follows(master, slave), 30, what="the paused master to rejoin as a slave")
    with Producer(f"zk://{zookeeper}/{SHARED}") as p:
        assert p.send("Pause", b"after").status is OK
    assert b"before" in consume_all(slave, "Pause")


def test_a_slave_out_of_the_in_sync_set_is_never_elected(zookeeper, shared_pair):
    """The slave stops; the master drops it from the in-sync set and takes more puts;
    the master dies. The slave, started again, is not elected (the group waits without
    a master) while enable_elect_unclean_master is off; the old master, back, is
    elected again (a new epoch) and the slave follows it and catches up."""
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    epoch = master_of(zookeeper, SHARED)["epoch"]
    assert slave.stop() == 0
    wait_for(lambda: in_sync_set(zookeeper, SHARED) == [m], 15,
             what="the stopped slave to leave the in-sync set")
    with Producer(master.store_dir) as p:
        p.send_batch([Message("Unsynced", f"only on {m}: {i}".encode()) for i in range(20)])
    master.kill_all()
    mark = os.path.getsize(slave.log_path)
    slave.start()
    wait_for(lambda: "not electable" in logged_since(slave, mark), SESSION_MS / 1000 + 20,
             what=f"member {s} to find itself out of the in-sync set")
    assert master_of(zookeeper, SHARED) is None
    assert slot(slave, Slot.MASTER_LEASE_MS) == 0
    master.start()
    wait_for(lambda: is_master(zookeeper, SHARED, master, m), 30,
             what=f"member {m} elected again")
    assert master_of(zookeeper, SHARED)["epoch"] == epoch + 1
    wait_for(lambda: follows(slave, master), 30, what=f"member {s} to follow member {m}")
    wait_for(lambda: slot(slave, Slot.WRITTEN) == slot(master, Slot.WRITTEN), 30,
             what=f"member {s} to catch up")
    assert len(consume_all(slave, "Unsynced")) == 20


def test_with_zookeeper_down_the_group_refuses_puts_and_goes_on_when_it_is_back(
        zookeeper_server, zookeeper, shared_pair):
    """No election can happen without ZooKeeper, and no master can renew its lease: the
    master refuses puts (SERVICE_NOT_AVAILABLE, NOT_MASTER) once it lost ZooKeeper.
    ZooKeeper back (same data, same port): the group has a master again, taking puts,
    and nothing acknowledged before is lost."""
    m, _ = roles(zookeeper, shared_pair)
    with Producer(f"zk://{zookeeper}/{SHARED}", timeout_ms=3000) as p:
        assert p.send("Down", b"before").status is OK
        zookeeper_server.stop()
        wait_for(lambda: slot(shared_pair[m], Slot.MASTER_LEASE_MS) == 0, 10,
                 what="the master to lose its lease")
        refused = p.send("Down", b"while down")
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert refused.reason.startswith("NOT_MASTER"), refused.reason
    zookeeper_server.start()
    m, _ = roles(zookeeper, shared_pair)
    with Producer(f"zk://{zookeeper}/{SHARED}") as p:
        assert p.send("Down", b"after").status is OK
    assert {b"before", b"after"} <= set(consume_all(shared_pair[m], "Down"))


def test_a_slave_of_a_newer_epoch_refuses_its_master_which_then_takes_no_puts(
        zookeeper, shared_pair):
    """The epoch in HA frames. The slave is made to hold a newer epoch than its master
    (its EPOCH slot set as its controller sets it on hearing of an election the master
    missed: the one fault a live group cannot be put in on demand). It refuses the
    master's DATA (STALE_EPOCH, nothing appended); the master, told so, takes no more
    puts. Back at the group's epoch, the slave follows again and puts are taken."""
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    epoch = master_of(zookeeper, SHARED)["epoch"]
    with Producer(master.store_dir, timeout_ms=5000) as p:
        assert p.send("Epoch", b"before").status is OK
        wait_for(lambda: slot(slave, Slot.WRITTEN) == slot(master, Slot.WRITTEN), 15,
                 what="the slave to hold all")
        mark = os.path.getsize(master.log_path)
        set_epoch(slave, epoch + 1)
        wait_for(lambda: slot(slave, Slot.REPLICA_ERROR) == hp.HAError.STALE_EPOCH, 15,
                 what="the slave to refuse its master's stream")
        wait_for(lambda: f"holds epoch {epoch + 1}, newer than this store's {epoch}"
                 in logged_since(master, mark), 15,
                 what="the master's controller to end its lease")
        held = slot(slave, Slot.WRITTEN)
        refused = p.send("Epoch", b"refused")
        assert refused.status is not OK, refused
        assert slot(slave, Slot.WRITTEN) == held
        set_epoch(slave, epoch)
        wait_for(lambda: follows(slave, master) and slot(slave, Slot.REPLICA_ERROR) == 0
                 and fencing.holds_lease(slot(master, Slot.MASTER_LEASE_MS)), 30,
                 what="the pair to go on")
        assert p.send("Epoch", b"after").status is OK
    wait_for(lambda: slot(slave, Slot.WRITTEN) == slot(master, Slot.WRITTEN), 15,
             what="the slave to catch up")
    assert {b"before", b"after"} <= set(consume_all(slave, "Epoch"))


def logged_since(store: RunningStore, offset: int) -> str:
    """What a store's log gained past byte ``offset`` (it is kept across restarts)."""
    with open(store.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def set_epoch(store: RunningStore, epoch: int) -> None:
    """Write a store's EPOCH slot as its controller does."""
    table = PositionTable.attach(store.store_dir, process="controller")
    try:
        table.set(Slot.EPOCH, epoch)
    finally:
        table.close()


def test_a_planned_hand_over_under_idempotent_producers_loses_and_doubles_nothing(
        zookeeper, shared_pair):
    """``rocketstore promote`` on a member: the master stops taking puts, the slave
    (the in-sync one holding the most, by default) catches up to its end and takes
    over at the next epoch, the old master follows it. Two idempotent producers on
    the group's address go on by themselves; every message ever answered PUT_OK is on
    the new master exactly once; the old master ends a byte-identical slave, nothing
    of it cut into quarantine."""
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    epoch = master_of(zookeeper, SHARED)["epoch"]
    loads = [IdempotentLoad(f"zk://{zookeeper}/{SHARED}", f"HandOver{i}") for i in (0, 1)]
    try:
        for load in loads:
            load.start()
        wait_for(lambda: all(load.count() >= 50 or load.error for load in loads), 30,
                 what="load on the master")
        r = cli("promote", "--config", slave.config_path, "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout)
        assert (done["from"], done["to"], done["epoch"]) == (m, s, epoch + 1), done
        assert f"member {m} takes no puts; its CommitLog ends at {done['end']}" in r.stderr
        assert f"member {m} follows member {s} as its SLAVE" in r.stderr
        assert is_master(zookeeper, SHARED, slave, s)
        handed_at = [load.count() for load in loads]
        wait_for(lambda: all(load.count() >= at + 50 or load.error
                             for load, at in zip(loads, handed_at)), 60,
                 what="acknowledgements from the new master")
    finally:
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(70)
    for load in loads:
        assert load.error is None, load.error
        stored = consume_all(slave, load.topic)
        assert sorted(stored) == sorted(set(stored)), "a message stored twice"
        assert set(load.acked) <= set(stored)
    wait_for(lambda: slot(master, Slot.WRITTEN) == slot(slave, Slot.WRITTEN)
             == slot(master, Slot.DISPATCHED), 30, what="the old master to catch up")
    assert files(master, "commitlog") == files(slave, "commitlog")
    assert not os.path.exists(os.path.join(master.store_dir, "quarantine"))
    assert read_node(zookeeper, nodes.handover_path(SHARED)) is None


def test_a_hand_over_to_a_slave_out_of_sync_is_refused_and_changes_nothing(
        zookeeper, shared_pair):
    """The slave's writer is stopped (SIGSTOP: it appends nothing, its controller goes
    on reporting its end) while the master takes puts, until the master drops it from
    the in-sync set. A hand-over to it is refused, and one to whichever slave is best
    finds none: the master is the same at the same epoch, takes puts, no request is
    left. Its writer woken, the slave catches up."""
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    epoch = master_of(zookeeper, SHARED)["epoch"]
    writer = slave.child_pid("writer")
    os.kill(writer, signal.SIGSTOP)
    try:
        with Producer(master.store_dir, timeout_ms=10_000) as p:
            p.send_batch([Message("Refused", f"unsynced {i}".encode()) for i in range(5)])
            wait_for(lambda: in_sync_set(zookeeper, SHARED) == [m], 20,
                     what="the master to drop the stopped slave from the in-sync set")
            r = cli("promote", "--config", master.config_path, "--broker-id", str(s),
                    "--json")
            assert r.returncode == 1, r.stderr
            assert f"member {s} is not in the in-sync set [{m}]" in r.stderr
            assert json.loads(r.stdout)["error"] == "NotHandedOver"
            r = cli("promote", "--config", master.config_path)
            assert r.returncode == 1 and "no slave of broker group" in r.stderr, r.stderr
            assert "nothing changed" in r.stderr
            assert master_of(zookeeper, SHARED)["epoch"] == epoch
            assert is_master(zookeeper, SHARED, master, m)
            assert read_node(zookeeper, nodes.handover_path(SHARED)) is None
            assert slot(slave, Slot.ROLE) == 2
    finally:
        os.kill(writer, signal.SIGCONT)
    roles(zookeeper, shared_pair)
    assert len(consume_all(slave, "Refused")) == 5


def test_a_hand_over_the_slave_cannot_finish_gives_the_puts_back_to_the_master(
        zookeeper, shared_pair, capsys):
    """The slave's controller is stopped (SIGSTOP: it can take nothing over, and its
    ZooKeeper session runs out) just before ``promote`` (run in this process, to ask
    before the session does run out). The master stops taking puts, refusing them as
    handing over, and, no take-over within --handover-timeout, takes them again: the
    command says so, exit 1, the same master at the same epoch. Its controller woken,
    the slave follows again."""
    from rocketstore.cli.main import main
    m, s = roles(zookeeper, shared_pair)
    master, slave = shared_pair[m], shared_pair[s]
    epoch = master_of(zookeeper, SHARED)["epoch"]
    controller = slave.child_pid("controller")
    capsys.readouterr()
    exit_code: list[int] = []
    command = threading.Thread(target=lambda: exit_code.append(main(
        ["promote", "--config", master.config_path, "--handover-timeout", "3"])))
    os.kill(controller, signal.SIGSTOP)
    try:
        command.start()
        wait_for(lambda: slot(master, Slot.MASTER_LEASE_MS) == fencing.HANDING_OVER, 10,
                 what="the master to stop taking puts")
        with Producer(master.store_dir, timeout_ms=10_000) as p:
            refused = p.send("Aborted", b"while handing over")
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert refused.reason.startswith("NOT_MASTER: this store is handing its group's "
                                         "mastership over"), refused.reason
        command.join(30)
        err = capsys.readouterr().err
        assert exit_code == [1], err
        assert f"member {m} takes no puts" in err
        assert f"the hand-over was aborted: member {s} did not take over within 3000 ms" \
            in err and f"member {m} takes puts again" in err
        assert read_node(zookeeper, nodes.handover_path(SHARED))["state"] == handover.ABORTED
        wait_for(lambda: is_master(zookeeper, SHARED, master, m), 10,
                 what="the master to take puts again")
        assert master_of(zookeeper, SHARED)["epoch"] == epoch
        with Producer(master.store_dir, timeout_ms=10_000) as p:
            assert p.send("Aborted", b"after").status is OK
    finally:
        os.kill(controller, signal.SIGCONT)
    roles(zookeeper, shared_pair)
    stored = consume_all(slave, "Aborted")
    assert b"after" in stored and b"while handing over" not in stored


def test_promote_asks_a_group_without_a_master_for_nothing(tmp_path, zookeeper):
    """A member's settings file whose group has no master now (none of it runs):
    nothing to hand over, exit 1, no request left."""
    store = member(tmp_path, zookeeper, "masterless", 0)
    r = cli("promote", "--config", store.config_path)
    assert r.returncode == 1 and "broker group masterless has no master now" in r.stderr, \
        r.stderr
    assert read_node(zookeeper, nodes.handover_path("masterless")) is None


def test_spark_endpoint_takes_the_group_address(zookeeper, shared_pair):
    """Spark's ``endpoint`` option takes ``zk://host:port/BROKER_NAME``: the sink's
    producer and the source's reader find the group's master (and follow it)."""
    from rocketstore.spark.access import RemoteStore, socket_of
    from rocketstore.client.errors import BadAddressError
    address = f"zk://{zookeeper}/{SHARED}"
    assert socket_of(address, "ingest") == socket_of(address, "reader") == address
    with pytest.raises(BadAddressError):
        socket_of(f"zk://{zookeeper}", "reader")
    roles(zookeeper, shared_pair)
    with Producer(socket_of(address, "ingest"), idempotent=True) as p:
        assert all(r.status is OK for r in
                   p.send_batch([Message("Spark", b"one"), Message("Spark", b"two")]))
    remote = RemoteStore(address, timeout_ms=10_000)
    try:
        wait_for(lambda: sum(b.max_offset for b in remote.bounds(["Spark"])) == 2, 15,
                 what="the master's reader to show both")
    finally:
        remote.close()
