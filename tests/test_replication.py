"""Replication: a master and a slave store on this machine, real processes, loopback TCP.

Each test runs two stores (``RunningStore``: ``rocketstore up`` in its own process group)
with small files, so that a few thousand messages roll many files, and quick HA timers
(heartbeat 300 ms, housekeeping 1.5 s).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import zlib

import pytest
import zmq

from rocketstore.wire import ha_protocol as hp
from rocketstore.client import Producer
from rocketstore.client.consumer import Consumer
from rocketstore.procs.supervisor import Supervisor
from rocketstore.shm.positions import PositionTableError, Slot
from rocketstore.storage import Message, StoreConfig, replication
from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.status import PutMessageStatus
from store_processes import RunningStore, cli, free_port, wait_for

HA_TIMERS = dict(ha_send_heartbeat_interval=300, ha_housekeeping_interval=1500)
FILE_SIZE = 64 * 1024


# ------------------------------------------------------------------ the pieces, alone
def test_ha_frames_round_trip_and_bad_ones_are_named():
    assert hp.decode(hp.encode_hello(7, 4096, 123, 12, 99)) == hp.Hello(7, 4096, 123, 12, 99)
    assert hp.decode(hp.encode_report(1 << 40)) == 1 << 40
    d = hp.decode(hp.data_head(3, 10, 20) + b"abc")
    assert (d.session, d.offset, d.master_end, bytes(d.payload)) == (3, 10, 20, b"abc")
    assert hp.decode(hp.encode_probe(2, 5, 9)) == hp.Probe(2, 5, 9)
    assert hp.decode(hp.encode_file("delayOffset.json", b"{}")) == \
        hp.File("delayOffset.json", b"{}")
    r = hp.decode(hp.range_head(2, 5, 30) + b"xy")
    assert (r.session, r.offset, r.master_end, bytes(r.payload)) == (2, 5, 30, b"xy")
    e = hp.decode(hp.encode_error(hp.HAError.DIVERGED, "why"))
    assert e == hp.Error(hp.HAError.DIVERGED, "why")
    for bad, code in [(b"R", hp.HAError.MALFORMED), (b"XX\x01\x01", hp.HAError.MALFORMED),
                      (b"RH\x01\x01" + bytes(28), hp.HAError.UNSUPPORTED_VERSION),
                      (hp.encode_hello(1, 2, 3, 4, 5)[:-1], hp.HAError.MALFORMED),
                      (hp.encode_report(1) + b"x", hp.HAError.MALFORMED),
                      (b"RH\x02\x09", hp.HAError.MALFORMED),
                      (hp.encode_file("../../etc/passwd", b"x"), hp.HAError.MALFORMED)]:
        with pytest.raises(hp.HAProtocolError) as info:
            hp.decode(bad)
        assert info.value.code == code


def test_whole_records_end_tail_check_and_boundaries(tmp_path):
    """On a real CommitLog file: the walk stops before a partial record, crosses a
    BLANK only once the file's zeros are all there; the tail crc sees any changed byte;
    the boundary at or before an offset is a record's start."""
    from conftest import small_config
    from rocketstore.storage import MessageStore
    cfg = small_config(tmp_path, mapped_file_size_commit_log=4096)
    with MessageStore(cfg) as store:
        results = store.put_batch([Message("W", b"x" * 300) for _ in range(20)])
    starts = [r.wrote_offset for r in results if r.ok]
    size = results[0].wrote_bytes
    path = os.path.join(cfg.commit_log_dir, "00000000000000000000")
    data = open(path, "rb").read()
    in_first = [s for s in starts if s < 4096]
    last_end = in_first[-1] + size
    assert replication.whole_records_end(data, 0, 0, last_end, 0)[0] == last_end
    assert replication.whole_records_end(data, 0, 0, last_end - 1, 0)[0] == in_first[-2] + size
    assert replication.whole_records_end(data, 0, 0, 4095, 0)[0] == last_end   # BLANK: wait
    assert replication.whole_records_end(data, 0, 0, 4096, 0)[0] == 4096
    with pytest.raises(ValueError, match="no record at CommitLog offset 5"):
        replication.whole_records_end(data, 0, 5, 4096, 0)
    records = data[:last_end].rstrip(b"\0")       # a record may end in zero bytes
    assert replication.tail_check(cfg.commit_log_dir, 4096, last_end) == \
        (len(records), zlib.crc32(records))
    assert replication.tail_check(cfg.commit_log_dir, 4096, 0) == (0, 0)
    second = open(os.path.join(cfg.commit_log_dir, "00000000000000004096"), "rb").read()
    assert replication.tail_check(cfg.commit_log_dir, 4096, 4096 + size)[0] == \
        len(second[:size].rstrip(b"\0"))
    # at a file's start, the previous file's zero filler is passed over: the bytes
    # compared end with its BLANK's header, after the records
    blank_end = last_end + 8
    assert data[blank_end:].count(0) == 4096 - blank_end
    assert replication.tail_check(cfg.commit_log_dir, 4096, 4096) == \
        (blank_end, zlib.crc32(data[:blank_end]))
    for s in in_first:
        assert replication.last_boundary_at_or_before(cfg.commit_log_dir, 4096, s + 7) == s
    assert replication.last_boundary_at_or_before(cfg.commit_log_dir, 4096, 4096) == 4096


class Pair:
    """A master and its slave, started and stopped together."""

    def __init__(self, tmp_path, role: str = "ASYNC_MASTER", slave_ha_port: int = 0,
                 slave: dict | None = None, **master: object):
        self.port = free_port()
        for side in ("master", "slave"):
            (tmp_path / side).mkdir()
        self.master = RunningStore(tmp_path / "master", ha_listen_port=self.port,
                                   broker_role=role, listen_port=free_port(), **HA_TIMERS,
                                   **master)
        self.slave = RunningStore(tmp_path / "slave", broker_role="SLAVE",
                                  ha_master_address=f"127.0.0.1:{self.port}",
                                  ha_listen_port=slave_ha_port, listen_port=free_port(),
                                  **HA_TIMERS, **(slave or {}))

    def __enter__(self) -> "Pair":
        self.master.start()
        self.slave.start()
        wait_for(lambda: self.master.slot(Slot.SLAVES) == 1, what="the slave to connect")
        return self

    def __exit__(self, *exc) -> None:
        for store in (self.slave, self.master):
            store.__exit__(*exc)

    def old_master_rejoins(self, tmp_path, port: int) -> RunningStore:
        """The dead master, started again as a SLAVE of the promoted one (its HA socket
        at ``port``), once it holds and has dispatched all the new master wrote."""
        old = RunningStore(tmp_path / "master", broker_role="SLAVE", listen_port=free_port(),
                           ha_master_address=f"127.0.0.1:{port}", **HA_TIMERS)
        self.master = old
        old.start()
        wait_for(lambda: slot(old, Slot.WRITTEN) == self.slave.slot(Slot.WRITTEN) ==
                 slot(old, Slot.DISPATCHED), 60, what="the old master to follow")
        return old

    def caught_up(self, timeout: float = 30) -> int:
        """Wait until the slave holds and has dispatched all the master wrote."""
        def done() -> bool:
            end = self.master.slot(Slot.WRITTEN)
            return slot(self.slave, Slot.WRITTEN) == end == slot(self.slave, Slot.DISPATCHED)
        wait_for(done, timeout, what="the slave to catch up")
        return self.master.slot(Slot.WRITTEN)


def slot(store: RunningStore, which: Slot) -> int:
    """A slot of a store that may be restarting its processes (-1 meanwhile)."""
    try:
        return store.slot(which)
    except PositionTableError:
        return -1


def files(store: RunningStore, sub: str) -> dict[str, bytes]:
    """Every file under the store's ``sub`` directory, by relative path."""
    root = os.path.join(store.store_dir, sub)
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def assert_same_commit_log(pair: Pair) -> None:
    """The two CommitLogs hold the same bytes, file by file. A file that only one side has
    must be all zeros: the next file made ahead of need (the allocator runs on its own
    time on each store), which holds nothing yet."""
    master, slave = files(pair.master, "commitlog"), files(pair.slave, "commitlog")
    for name in set(master) ^ set(slave):
        made_ahead = master.get(name, slave.get(name))
        assert made_ahead.count(0) == len(made_ahead), f"{name} is on one side only"
    differing = [name for name in set(master) & set(slave) if master[name] != slave[name]]
    assert not differing, f"files differ: {differing}"


def consume_all(store: RunningStore, topic: str) -> list[bytes]:
    """Every message of ``topic``, read by a new consumer group from the start."""
    out = []
    group = f"check-{time.monotonic_ns()}"
    with Consumer(store.store_dir, group, topic) as c:
        while True:
            batch = c.poll(512, timeout_ms=300)
            if not batch:
                return out
            out += [m.body for m in batch]


def test_slave_files_are_the_masters_after_a_mixed_load(tmp_path):
    """Batches, one-at-a-time sends, delayed messages and large bodies over many file
    rolls: the slave's CommitLog and consume queues are byte-identical to the master's,
    a consumer reads the same messages through both, status shows both sides, and the
    slave refuses puts."""
    with Pair(tmp_path) as pair, Producer(pair.master.store_dir) as p:
        sent = []
        for i in range(40):
            batch = [Message("Mixed", f"batch {i} msg {k}".encode() * (1 + k % 7),
                             keys=[f"b{i}-{k}"]) for k in range(50)]
            sent += [m.body for m in batch]
            assert all(r.status is PutMessageStatus.PUT_OK for r in p.send_batch(batch))
        for i in range(30):
            body = bytes([i]) * (20_000 + i * 97)        # large: a third of a file
            assert p.send("Mixed", body).status is PutMessageStatus.PUT_OK
            sent.append(body)
        for i in range(5):
            r = p.send_batch([Message("Mixed", f"delayed {i}".encode(), delay_level=1)])
            assert r[0].status is PutMessageStatus.PUT_OK
            sent.append(f"delayed {i}".encode())
        wait_for(lambda: len(consume_all(pair.master, "Mixed")) == len(sent), 20,
                 what="the delayed messages to be delivered on the master")
        delay_offsets = os.path.join("config", "delayOffset.json")
        wait_for(lambda: files(pair.slave, "config").get("delayOffset.json") is not None and
                 json.loads(files(pair.slave, "config")["delayOffset.json"]) ==
                 json.loads(files(pair.master, "config")["delayOffset.json"]), 10,
                 what=f"the slave to keep the master's {delay_offsets}")
        pair.caught_up()
        assert len(files(pair.master, "commitlog")) > 10                 # rolled files
        assert_same_commit_log(pair)
        assert files(pair.master, "consumequeue") == files(pair.slave, "consumequeue")
        assert sorted(consume_all(pair.slave, "Mixed")) == sorted(sent)
        assert_status_shows_the_pair(pair)
        with Producer(pair.slave.store_dir, timeout_ms=5000) as to_slave:
            r = to_slave.send("Mixed", b"to the slave")
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SLAVE" in r.reason


def assert_status_shows_the_pair(pair: Pair) -> None:
    """``rocketstore status``: the master lists its slave with its ack and no lag, the
    slave its master; both in text and under ``ha`` in --json."""
    end = pair.master.slot(Slot.WRITTEN)

    def status(store: RunningStore) -> dict:
        r = cli("status", "--config", store.config_path, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["ha"]
    wait_for(lambda: [s["acked"] for s in status(pair.master)["slaves"]] == [end], 10,
             what="the HA process to publish its slave's ack")
    master = status(pair.master)
    assert master["role"] == "ASYNC_MASTER" and master["slaves_connected"] == 1
    assert master["slaves"][0]["lag_bytes"] == master["slaves"][0]["lag_ms"] == 0
    assert master["listen"] == f"tcp://127.0.0.1:{pair.port}"
    slave = status(pair.slave)
    assert slave["role"] == "SLAVE" and slave["master"] == f"tcp://127.0.0.1:{pair.port}"
    assert slave["master_end"] == slave["written"] == end and slave["lag_bytes"] == 0
    assert slave["error"] is None and slave["cuts"] == []
    text = cli("status", "--config", pair.slave.config_path).stdout
    assert f"role       SLAVE of tcp://127.0.0.1:{pair.port}" in text
    assert "slaves 1" in cli("status", "--config", pair.master.config_path).stdout


def test_sync_master(tmp_path):
    """SYNC_MASTER: a PUT_OK means the slave has the bytes. The slave stopped (SIGSTOP on
    its whole process group): sends get FLUSH_SLAVE_TIMEOUT while its session lives,
    SLAVE_NOT_AVAILABLE once the master dropped it; every message stays stored on the
    master. After SIGCONT the slave catches up and sends are PUT_OK again; the master
    killed (SIGKILL, every process) right after an acknowledgement: the slave holds that
    message."""
    with Pair(tmp_path, "SYNC_MASTER", sync_flush_timeout=500) as pair, \
            Producer(pair.master.store_dir) as p:
        assert p.send("Stop", b"before").status is PutMessageStatus.PUT_OK
        os.killpg(pair.slave.proc.pid, signal.SIGSTOP)
        try:
            r = p.send("Stop", b"while stopped 1")
            assert r.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT, r
            wait_for(lambda: pair.master.slot(Slot.SLAVES) == 0, 10,
                     what="the master to drop the silent slave")
            r = p.send("Stop", b"while stopped 2")
            assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE, r
            assert "no slave is connected" in r.reason
        finally:
            os.killpg(pair.slave.proc.pid, signal.SIGCONT)
        wait_for(lambda: pair.master.slot(Slot.SLAVES) == 1, 15, what="the slave to return")
        r = p.send("Stop", b"after")
        assert r.status is PutMessageStatus.PUT_OK, r
        pair.caught_up()
        assert_same_commit_log(pair)
        assert sorted(consume_all(pair.master, "Stop")) == sorted(consume_all(pair.slave, "Stop")) \
            == sorted([b"before", b"while stopped 1", b"while stopped 2", b"after"])
        for i in range(100):
            assert p.send("Stop", b"m%d" % i).status is PutMessageStatus.PUT_OK
        last = p.send("Stop", b"the last one")
        assert last.status is PutMessageStatus.PUT_OK
        pair.master.kill_all()
        end = pair.slave.slot(Slot.WRITTEN)
        assert end > last.commit_log_offset
        wait_for(lambda: pair.slave.slot(Slot.DISPATCHED) == end, what="slave dispatch")
        assert b"the last one" in consume_all(pair.slave, "Stop")


def test_killed_slave_and_master_catch_up_with_nothing_missing_or_doubled(tmp_path):
    """Under load, the slave's writer (its CommitLog appender) and the master's HA
    process SIGKILLed at random moments, then the whole master killed and restarted: the
    slave reconnects, catches up, and holds every acknowledged message exactly once."""
    rng = __import__("random").Random(7)
    with Pair(tmp_path) as pair:
        acked = []

        def load(n: int) -> None:
            with Producer(pair.master.store_dir) as p:
                for i in range(n):
                    batch = [Message("Load", f"{len(acked)}-{k}".encode() * 3)
                             for k in range(20)]
                    if all(r.status is PutMessageStatus.PUT_OK for r in p.send_batch(batch)):
                        acked.extend(m.body for m in batch)
                    victim = rng.choice([pair.slave.child_pid("writer"),
                                         pair.master.child_pid("ha")])
                    if victim and rng.random() < 0.05:       # 0 while it restarts
                        try:
                            os.kill(victim, signal.SIGKILL)
                        except ProcessLookupError:
                            pass                             # it had just died
        load(300)
        # the kills took: each victim is restarted after its back-off (0.5 s), which can
        # outlast the rest of the load (300 batches take well under a second)
        wait_for(lambda: pair.slave.restarts("writer") + pair.master.restarts("ha") > 0,
                 10, "a killed process restarted")
        pair.master.kill_all()
        pair.master.start()
        load(100)
        pair.caught_up(60)
        assert_same_commit_log(pair)
        got = consume_all(pair.slave, "Load")
        assert len(got) == len(set(got)) and sorted(got) == sorted(acked)


def _dealer(port: int) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 3000)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def test_garbage_on_the_ha_socket_gets_named_errors_and_harms_nothing(tmp_path):
    with Pair(tmp_path) as pair:
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("G", b"x" * 100) for _ in range(100)])
        pair.caught_up()            # the real slave's ack is in before the garbage starts
        bad = _dealer(pair.port)
        try:
            bad.send(b"GET / HTTP/1.0\r\n\r\n")
            assert hp.decode(bad.recv()).code == hp.HAError.MALFORMED
            bad.send(hp.encode_report(10))
            assert hp.decode(bad.recv()).code == hp.HAError.NO_SESSION
            bad.send(hp.encode_hello(1, FILE_SIZE * 2, 0, 0, 0))
            assert hp.decode(bad.recv()).code == hp.HAError.FILE_SIZE_MISMATCH
            bad.send(b"RH\x09\x01" + bytes(28))
            assert hp.decode(bad.recv()).code == hp.HAError.UNSUPPORTED_VERSION
            bad.send(hp.encode_hello(2, FILE_SIZE, 1 << 40, 0, 0))
            assert hp.decode(bad.recv()).code == hp.HAError.DIVERGED
            acked = pair.master.slot(Slot.SLAVE_ACKED)
            end = pair.master.slot(Slot.WRITTEN)       # a peer claiming the master's end
            bad.send(hp.encode_hello(4, FILE_SIZE, end, 0, 0))      # with nothing to show
            assert hp.decode(bad.recv()).code == hp.HAError.MALFORMED
            bad.send(hp.encode_hello(5, FILE_SIZE, end, 40, 12345))  # or a wrong tail
            assert hp.decode(bad.recv()).code == hp.HAError.DIVERGED
            assert pair.master.slot(Slot.SLAVE_ACKED) == acked     # no ack came of either
            bad.send(hp.encode_hello(3, FILE_SIZE, 0, 0, 0))   # a real session ...
            first = hp.decode(bad.recv())
            assert isinstance(first, hp.Data) and first.session == 3
            bad.send(hp.encode_report(1 << 40))                # ... acking the impossible
            while not isinstance(reply := hp.decode(bad.recv()), hp.Error):
                pass
            assert reply.code == hp.HAError.ACK_BEYOND_END
        finally:
            bad.close()
        with socket.create_connection(("127.0.0.1", pair.port)) as raw:   # not ZeroMQ
            raw.sendall(os.urandom(4096))
        assert pair.master.slot(Slot.SLAVE_ACKED) <= pair.master.slot(Slot.WRITTEN)
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("G", b"y" * 100) for _ in range(100)])
        pair.caught_up()
        assert_same_commit_log(pair)
        assert pair.master.restarts("ha") == 0
        assert len(consume_all(pair.slave, "G")) == 200


@pytest.mark.parametrize("settings, message", [
    (dict(broker_role="SLAVE"), "needs ha_master_address"),
    (dict(broker_role="SLAVE", ha_master_address="nohost"), "is not \"host:port\""),
    (dict(broker_role="SYNC_MASTER"), "needs ha_listen_port"),
    (dict(ha_send_heartbeat_interval=5000, ha_housekeeping_interval=5000), "must exceed"),
])
def test_replication_settings_that_cannot_work_are_refused(settings, message):
    """Refused when the settings load, or when a supervisor is made for them."""
    with pytest.raises(StoreConfigError, match=message):
        Supervisor(StoreConfig(**settings))


def _lose_tail(store: RunningStore, offset: int) -> None:
    """What a master's power loss does to its unflushed tail: every CommitLog byte
    from ``offset`` (a record boundary) gone. The store must be down."""
    from rocketstore.storage.commit_log import CommitLog
    config = StoreConfig(store_path_root_dir=store.store_dir,
                         mapped_file_size_commit_log=FILE_SIZE)
    cl = CommitLog(config)
    cl.load()
    cl.mapped_file_queue.truncate_dirty_files(offset)
    cl.mapped_file_queue.flush_all()
    cl.close()


def test_a_slave_cuts_its_tail_when_the_restarted_master_lost_it(tmp_path):
    """The master loses an unflushed tail the slave already holds, restarts and stores
    other messages at those offsets while the slave is stopped. The slave finds where
    they part, cuts back there (the cut bytes in quarantine/, the cut in status), and
    follows the master again: identical files, the master's messages only."""
    with Pair(tmp_path) as pair:
        with Producer(pair.master.store_dir) as p:
            first = p.send_batch([Message("Div", f"kept {i}".encode()) for i in range(300)])
            lost = p.send_batch([Message("Div", f"lost {i}".encode() * 5) for i in range(300)])
        pair.caught_up()
        os.killpg(pair.slave.proc.pid, signal.SIGSTOP)
        try:
            pair.master.kill_all()
            _lose_tail(pair.master, lost[0].commit_log_offset)
            pair.master.start()
            with Producer(pair.master.store_dir) as p:
                p.send_batch([Message("Div", f"new {i}".encode() * 7) for i in range(400)])
        finally:
            os.killpg(pair.slave.proc.pid, signal.SIGCONT)
        end = pair.caught_up(60)
        assert end > lost[-1].commit_log_offset       # the new messages cover the lost ones
        assert_same_commit_log(pair)
        got = consume_all(pair.slave, "Div")
        assert sorted(got) == sorted([f"kept {i}".encode() for i in range(300)] +
                                     [f"new {i}".encode() * 7 for i in range(400)])
        cut = replication.cuts_made(os.path.join(pair.slave.store_dir, "config"))[-1]
        assert cut["offset"] == lost[0].commit_log_offset <= cut["first_difference"]
        quarantined = files(pair.slave, "quarantine")
        assert any(b"lost 0" in data for data in quarantined.values())
        assert first[-1].ok and pair.slave.slot(Slot.REPLICA_ERROR) == 0


def test_a_slave_longer_than_its_restarted_master_cuts_back_to_it(tmp_path):
    """The master lost its tail and came back with nothing new: the slave, longer than
    the master, cuts back to the master's end and goes on from there."""
    with Pair(tmp_path) as pair:
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("Long", f"kept {i}".encode()) for i in range(200)])
            lost = p.send_batch([Message("Long", b"lost") for _ in range(200)])
        pair.caught_up()
        pair.master.kill_all()
        _lose_tail(pair.master, lost[0].commit_log_offset)
        pair.master.start()
        wait_for(lambda: slot(pair.slave, Slot.WRITTEN) == lost[0].commit_log_offset, 30,
                 what="the slave to cut back")
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("Long", b"after") for _ in range(10)])
        pair.caught_up()
        assert_same_commit_log(pair)
        assert b"lost" not in consume_all(pair.slave, "Long")


def test_promotion_then_the_old_master_rejoins_as_a_slave(tmp_path):
    """The master dies holding messages its slave never got (its HA process was stopped);
    the slave is promoted while running and takes puts, its queues continuing; the old
    master comes back as a slave of it, cuts what only it held (kept in quarantine/)
    and follows."""
    new_port = free_port()
    with Pair(tmp_path, slave_ha_port=new_port) as pair:
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("Promo", f"before {i}".encode(), queue_id=0)
                          for i in range(100)])
        pair.caught_up()
        os.kill(pair.master.child_pid("ha"), signal.SIGSTOP)    # streams nothing more
        with Producer(pair.master.store_dir) as p:
            p.send_batch([Message("Promo", b"only on the old master", queue_id=0)
                          for _ in range(50)])
        pair.master.kill_all()
        reader = pair.slave.child_pid("reader")
        os.kill(reader, signal.SIGKILL)          # a restart the supervisor counts
        wait_for(lambda: pair.slave.restarts("reader") == 1, what="the reader's restart")
        r = cli("promote", "--config", pair.slave.config_path, "--json")
        assert r.returncode == 0, r.stderr
        assert pair.slave.restarts("reader") == 1     # counted since the supervisor began
        assert json.loads(r.stdout) == {"store": pair.slave.store_dir, "role": "ASYNC_MASTER",
                                        "running": True}
        with open(pair.slave.config_path) as f:
            assert 'broker_role = "ASYNC_MASTER"' in f.read()
        with Producer(pair.slave.store_dir) as p:
            after = p.send_batch([Message("Promo", f"after {i}".encode(), queue_id=0)
                                  for i in range(100)])
        assert [r.status for r in after] == [PutMessageStatus.PUT_OK] * 100
        assert [r.queue_offset for r in after] == list(range(100, 200))
        old = pair.old_master_rejoins(tmp_path, new_port)
        assert files(old, "commitlog") == files(pair.slave, "commitlog")
        expected = [f"before {i}".encode() for i in range(100)] + \
            [f"after {i}".encode() for i in range(100)]
        assert consume_all(old, "Promo") == expected
        assert any(b"only on the old master" in data for data in files(old, "quarantine").values())


def test_promote_a_stopped_slave_and_refuse_what_cannot_be_promoted(tmp_path):
    (tmp_path / "s").mkdir()
    store = RunningStore(tmp_path / "s", broker_role="SLAVE",
                         ha_master_address="127.0.0.1:1", ha_listen_port=0)
    with open(store.config_path, "a") as f:
        f.write("# the end\n")
    r = cli("promote", "--config", store.config_path, "--role", "SYNC_MASTER")
    assert r.returncode == 2 and "needs ha_listen_port" in r.stderr
    r = cli("promote", "--config", store.config_path)
    assert r.returncode == 0 and "at its next start" in r.stdout, r.stderr
    with open(store.config_path) as f:
        text = f.read()
    assert 'broker_role = "ASYNC_MASTER"' in text and "SLAVE" not in text
    assert text.endswith("# the end\n")
    r = cli("promote", "--config", store.config_path)
    assert r.returncode == 1 and "not a SLAVE" in r.stderr
    r = cli("promote")
    assert r.returncode == 2 and "needs --config" in r.stderr


def test_replication_over_curve_lets_in_only_the_listed_slave(tmp_path):
    """The master's HA socket with CURVE: its slave, with a listed key, follows; a
    second slave with an unlisted key is refused and logged, and changes nothing."""
    keys = str(tmp_path / "keys")
    assert cli("keys", "--dir", keys, "--client", "slave", "--client", "rogue").returncode == 0
    k = lambda name: os.path.join(keys, name)    # noqa: E731
    secured = dict(curve_server_key=k("server.key_secret"), curve_authorized_keys=k("slave.key"))
    with Pair(tmp_path, slave=dict(curve_client_key=k("slave.key_secret"),
                                   ha_master_server_key=k("server.key")), **secured) as pair:
        (tmp_path / "rogue").mkdir()
        rogue = RunningStore(tmp_path / "rogue", broker_role="SLAVE", listen_port=free_port(),
                             ha_master_address=f"127.0.0.1:{pair.port}",
                             curve_client_key=k("rogue.key_secret"),
                             ha_master_server_key=k("server.key"), **HA_TIMERS)
        with rogue:
            with Producer(pair.master.store_dir) as p:
                p.send_batch([Message("Curve", b"secret %d" % i) for i in range(100)])
            pair.caught_up()
            wait_for(lambda: "not in curve_authorized_keys" in pair.master.log(), 10,
                     what="the rogue slave's refusal in the master's log")
            assert rogue.slot(Slot.WRITTEN) == 0 and pair.master.slot(Slot.SLAVES) == 1
        assert_same_commit_log(pair)


def test_a_slave_pointed_at_a_stranger_is_never_cut(tmp_path):
    """A store that shares no record with the master it is told to follow (the wrong
    master, most likely) keeps all it has and stays refused, for an operator."""
    (tmp_path / "other").mkdir()
    port = free_port()
    other = RunningStore(tmp_path / "other", listen_port=free_port())
    with other, Producer(other.store_dir) as p:
        p.send_batch([Message("Mine", b"not the master's %d" % i) for i in range(50)])
    before = files(other, "commitlog")
    (tmp_path / "master").mkdir()
    with RunningStore(tmp_path / "master", ha_listen_port=port, listen_port=free_port(),
                      **HA_TIMERS) as master:
        with Producer(master.store_dir) as p:
            p.send_batch([Message("Theirs", b"the master's %d" % i) for i in range(50)])
        stranger = RunningStore(tmp_path / "other", broker_role="SLAVE",
                                ha_master_address=f"127.0.0.1:{port}",
                                listen_port=free_port(), **HA_TIMERS)
        with stranger:
            wait_for(lambda: "shares no record with the master" in stranger.log(), 20,
                     what="the refusal to cut")
            assert stranger.slot(Slot.REPLICA_ERROR) == hp.HAError.DIVERGED
    assert files(other, "commitlog") == before
    assert replication.cuts_made(os.path.join(other.store_dir, "config")) == []


def test_a_slave_pointed_at_a_socket_that_is_no_ha_port_says_so_and_waits(tmp_path):
    """A peer that answers every frame with something no master sends (as a store's
    ingest or reader port answers an HA frame with its own ERROR): the slave answers
    none of it (an error for an error would go on forever), shows MALFORMED and says
    HELLO again only every housekeeping interval."""
    port = free_port()
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{port}")
    (tmp_path / "slave").mkdir()
    slave = RunningStore(tmp_path / "slave", broker_role="SLAVE",
                         ha_master_address=f"127.0.0.1:{port}", listen_port=free_port(),
                         **HA_TIMERS)
    arrivals: list[float] = []

    def answer_frames(until: float) -> None:
        """Answer every frame the slave sends, as a port that is no HA port does."""
        while time.monotonic() < until:
            if router.poll(50):
                peer, _ = router.recv_multipart()
                arrivals.append(time.monotonic())
                router.send_multipart([peer, b"RS\x01\x0f not an HA frame"])

    try:
        with slave:
            # the first HELLO comes once the slave's writer runs, however busy the machine
            deadline = time.monotonic() + 60
            while not arrivals and time.monotonic() < deadline:
                answer_frames(time.monotonic() + 0.1)
            assert arrivals, "the slave never said HELLO"
            answer_frames(arrivals[0] + 4)
            wait_for(lambda: slave.slot(Slot.REPLICA_ERROR) == hp.HAError.MALFORMED, 30,
                     "the slave to show MALFORMED")
            assert "is ha_master_address its master's ha_listen_port?" in slave.log()
            # a HELLO at the start and one after each 1.5 s wait: a handful in the 4 s
            # after the first, not thousands
            assert 1 <= len(arrivals) <= 5, arrivals
    finally:
        router.close()


def test_a_slave_is_not_writeable_in_status_and_says_why(tmp_path):
    """A SLAVE refuses every send (SERVICE_NOT_AVAILABLE): ``status`` said
    ``writeable: true`` of it. It now says false, with the role and the reason, and
    the metrics gauge follows it."""
    (tmp_path / "slave").mkdir()
    slave = RunningStore(tmp_path / "slave", broker_role="SLAVE", listen_port=free_port(),
                         ha_master_address=f"127.0.0.1:{free_port()}", **HA_TIMERS)
    with slave:
        r = cli("status", "--config", slave.config_path, "--json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert (st["role"], st["writeable"], st["not_writeable"]) == ("SLAVE", False, ["SLAVE"])
        first = cli("status", "--config", slave.config_path).stdout.splitlines()[0]
        assert "  RUNNING  SLAVE  NOT WRITEABLE (a slave takes only its master's bytes)  " \
            in first, first
        with Producer(slave.store_dir, timeout_ms=5000) as p:
            assert p.send("T", b"x").status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_status_of_replication_shows_each_slave_its_own_ack_and_an_unknown_lag_as_unknown(
        tmp_path):
    """A new, empty slave of a master whose earlier slave acked everything is not
    shown caught up; a slave its master refuses, or that never heard from it, shows no
    lag rather than 0."""
    from rocketstore.procs.status import replication_status
    from rocketstore.procs.stats import stats_path
    store = str(tmp_path)
    os.makedirs(os.path.dirname(stats_path(store, "ha")), exist_ok=True)
    with open(stats_path(store, "ha"), "w") as f:
        json.dump({"ha": {"listen": "tcp://127.0.0.1:1", "slave_acked": 900, "slaves": [
            {"address": "10.0.0.2:5", "session": 1, "acked": 0, "lag_bytes": 1000,
             "lag_ms": 50, "connected_ms": 1, "heard_ms_ago": 1}]}}, f)
    master = replication_status(store, {"role": 0, "written": 1000, "slave_acked": 900,
                                        "slaves": 1}, now=10)
    assert master["slaves"][0]["acked"] == 0 and master["slaves"][0]["lag_bytes"] == 1000
    snap = {"role": 2, "written": 500, "master_end": 0, "master_heard_ms": 0,
            "replica_error": 0}
    assert replication_status(store, snap, now=10)["lag_bytes"] is None   # never heard
    snap.update(master_end=800, master_heard_ms=5)
    assert replication_status(store, snap, now=10)["lag_bytes"] == 300
    snap.update(replica_error=int(hp.HAError.OFFSET_UNAVAILABLE))
    refused = replication_status(store, snap, now=10)
    assert refused["lag_bytes"] is None and refused["lag_ms"] is None
    assert refused["error"] == "OFFSET_UNAVAILABLE"


def test_a_sync_masters_acknowledged_messages_outlive_its_crash_on_its_slave(tmp_path):
    """SYNC_MASTER: a put is PUT_OK once the slave holds it. The master's machine
    crashes and loses its unflushed tail, and it is started again: its slave does not cut
    what the master sent it (SYNC_DIVERGED; the master may have acknowledged it), so the
    acknowledged messages stay served. The slave is promoted (a SYNC_MASTER itself) and
    the old master rejoins as its slave: it cuts what only it held (its own messages,
    written after its restart, answered SLAVE_NOT_AVAILABLE) and follows."""
    new_port = free_port()
    with Pair(tmp_path, role="SYNC_MASTER", slave_ha_port=new_port) as pair:
        with Producer(pair.master.store_dir) as p:
            kept = p.send_batch([Message("Sync", f"kept {i}".encode()) for i in range(100)])
            acked = p.send_batch([Message("Sync", f"acked {i}".encode() * 3)
                                  for i in range(100)])
        assert {r.status for r in kept + acked} == {PutMessageStatus.PUT_OK}
        pair.caught_up()
        pair.master.kill_all()
        _lose_tail(pair.master, acked[0].commit_log_offset)     # the crash took them
        pair.master.start()
        with Producer(pair.master.store_dir) as p:
            alone = p.send_batch([Message("Sync", f"alone {i}".encode() * 5)
                                  for i in range(50)])
        assert PutMessageStatus.PUT_OK not in {r.status for r in alone}
        wait_for(lambda: slot(pair.slave, Slot.REPLICA_ERROR) == hp.HAError.SYNC_DIVERGED,
                 30, what="the slave to refuse the cut")
        assert "Not cut: promote this slave" in pair.slave.log()
        assert replication.cuts_made(os.path.join(pair.slave.store_dir, "config")) == []
        everything_acked = sorted(f"kept {i}".encode() for i in range(100)) + \
            sorted(f"acked {i}".encode() * 3 for i in range(100))
        assert sorted(consume_all(pair.slave, "Sync")) == sorted(everything_acked)

        pair.master.kill_all()
        r = cli("promote", "--config", pair.slave.config_path, "--role", "SYNC_MASTER")
        assert r.returncode == 0, r.stderr
        old = pair.old_master_rejoins(tmp_path, new_port)
        assert files(old, "commitlog") == files(pair.slave, "commitlog")
        assert sorted(consume_all(old, "Sync")) == sorted(everything_acked)
        assert any(b"alone 0" in data for data in files(old, "quarantine").values())
        with Producer(pair.slave.store_dir) as p:
            assert p.send("Sync", b"after").status is PutMessageStatus.PUT_OK


def test_where_a_slaves_bytes_from_its_master_begin_only_ever_comes_down(tmp_path):
    """``note_following`` at each start as a SLAVE: the first note, then lower ones only
    (a lost tail, a cut: what comes again is the master's); a master start forgets."""
    config_dir = str(tmp_path)
    assert replication.followed_from(config_dir) is None
    replication.note_following(config_dir, 5_000)         # a former master joins: its own
    replication.note_following(config_dir, 9_000)         # restarted, having followed
    assert replication.followed_from(config_dir) == 5_000
    replication.note_following(config_dir, 3_000)         # its tail was lost or cut
    assert replication.followed_from(config_dir) == 3_000
    replication.forget_following(config_dir)
    assert replication.followed_from(config_dir) is None


def test_a_cut_asked_twice_is_made_once(tmp_path):
    """A replica that asked for a cut again before the supervisor made the first one:
    once made, neither request is left (``json_file.load`` falls back to the ``.bak``
    the second request left, and the next start would cut again)."""
    from conftest import msg, small_config
    from rocketstore.storage import MessageStore
    config = small_config(tmp_path / "store")
    with MessageStore(config) as store:
        results = store.put_batch([msg(i) for i in range(20)])
    cut_at = results[10].wrote_offset
    replication.request_cut(config.config_dir, results[12].wrote_offset, why="first")
    replication.request_cut(config.config_dir, cut_at, why="second")
    made = replication.apply_cut(config, replication.requested_cut(config.config_dir))
    assert made["offset"] == cut_at
    assert replication.requested_cut(config.config_dir) is None   # the next start: S1
