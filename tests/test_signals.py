"""A stop signal to the whole process group (``kill -TERM -- -PGID``, a shell's
``kill %1``, systemd's KillMode=control-group, a terminal's Ctrl-C or hang-up) stops the
store as cleanly as one to the supervisor alone: the processes stop in order, ``abort``
goes, and the next start recovers normally with every acknowledged message.

``RunningStore`` starts ``rocketstore up`` in a session of its own, so its process
group holds the supervisor and every store process and nothing of the test's."""

from __future__ import annotations

import json
import os
import signal

import pytest

from rocketstore.client import Consumer, Producer
from rocketstore.storage import Message, MessageStore, StoreConfig
from store_processes import RunningStore, cli, wait_for

TOPIC = "Signals"


def send(rs: RunningStore, n: int, first: int) -> list:
    with Producer(rs.store_dir) as p:
        results = p.send_batch([Message(TOPIC, f"m{first + i}".encode(), queue_id=i % 2)
                                for i in range(n)])
    assert all(r.ok for r in results)
    return results


def bodies(rs: RunningStore, n: int) -> list[bytes]:
    """The bodies of the topic's first ``n`` messages, read by a new group, sorted."""
    got = []
    with Consumer(rs.store_dir, "g", TOPIC) as c:
        for _ in range(40):
            got += c.poll(max_msgs=64, timeout_ms=250)
            if len(got) >= n:
                break
    return sorted(bytes(m.body) for m in got)


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_whole_group_stops_the_store_cleanly(tmp_path, signo):
    rs = RunningStore(tmp_path)
    with rs:
        send(rs, 50, 0)
        children = [rs.child_pid(n) for n in ("writer", "flusher", "dispatcher", "reader")]
        os.killpg(rs.proc.pid, signo)
        assert rs.proc.wait(60) == 0, rs.log()
        log = rs.log()
        assert "uncleanly" not in log, log
        assert not os.path.exists(os.path.join(rs.store_dir, "abort"))
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        rs.proc.stdout.close()
        rs.proc = None
    with MessageStore(StoreConfig.from_toml(rs.config_path), background=False) as s:
        assert s.last_exit_ok and s.check() == []        # a normal start, consistent
    with RunningStore(tmp_path) as again:                # nothing lost, it goes on
        send(again, 10, 50)
        assert bodies(again, 60) == sorted(f"m{i}".encode() for i in range(60))
        assert again.stop() == 0


def test_a_hung_process_is_killed_and_restarted_by_the_watchdog(tmp_path):
    """A SIGSTOPped dispatcher stops making progress: after its heartbeat_timeout_s the
    supervisor kills and restarts it, counts it, and no acknowledged message is lost."""
    with RunningStore(tmp_path, processes={"dispatcher": {"heartbeat_timeout_s": 1.0}}) as rs:
        send(rs, 20, 0)
        hung = rs.child_pid("dispatcher")
        os.kill(hung, signal.SIGSTOP)
        send(rs, 20, 20)                                # the writer still takes puts
        wait_for(lambda: rs.child_pid("dispatcher") not in (0, hung), what="a new dispatcher",
                 timeout=30)
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)
        st = json.loads(cli("status", "--json", "--config", rs.config_path).stdout)
        assert st["processes"]["dispatcher"]["watchdog_kills"] == 1
        assert st["processes"]["dispatcher"]["restarts"] >= 1
        assert "made no progress" in rs.log()
        assert bodies(rs, 40) == sorted(f"m{i}".encode() for i in range(40))
        assert rs.stop() == 0, rs.log()


def test_a_long_cleaner_pass_keeps_its_heartbeat_and_stops_when_asked(tmp_path):
    """A consume-queue pass with RocketMQ's pause after each queue that lost files
    outlasts many turns (thousands of queues: minutes). It wrote no heartbeat, so the
    watchdog killed the cleaner; and a stop during it waited stopwaitsecs, then killed
    it and left abort behind. The pauses now write the heartbeat and end the pass on a
    stop: no watchdog kill, and a clean stop."""
    from rocketstore.shm.positions import Slot
    queues = 16                            # a pass of 15 pauses of 0.7 s: 10.5 s
    with RunningStore(tmp_path, processes={"cleaner": {"heartbeat_timeout_s": 1.5}},
                      mapped_file_size_consume_queue=40,      # two units a file
                      delete_consume_queue_files_interval=700,
                      default_topic_queue_nums=queues) as rs:
        with Producer(rs.store_dir) as p:
            for q in range(queues):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic="Many", body=b"x" * 2000, queue_id=q) for _ in range(6)]))
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Last", body=b"y" * 30000) for _ in range(3)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        rs.expire_commit_log(keep=1)       # every queue loses files
        wait_for(lambda: _queues_cleaned(rs) >= 6, 60,
                 "six queues cleaned: five pauses, past the watchdog's 1.5 s twice")
        assert rs.restarts("cleaner") == 0
        assert rs.stop() == 0
        assert _queues_cleaned(rs) < queues, "the pass ended before the stop came"
    assert not os.path.exists(os.path.join(rs.store_dir, "abort"))
    with open(rs.log_path) as f:
        assert "did not stop" not in f.read()


def _queues_cleaned(rs: RunningStore) -> int:
    """How many queues the cleaner has deleted consume-queue files of (its log)."""
    with open(rs.log_path) as f:
        return f.read().count("expired consume queue file(s)")


def test_a_port_in_use_stops_the_start_at_once_naming_it(tmp_path):
    """Another program holds the store's TCP port: the writer failed at every start,
    each time with a traceback, until the supervisor gave up without saying why. A
    socket that cannot listen is not retried: the start ends with the address named."""
    import socket
    from store_processes import free_ports
    port = free_ports(-2, 0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        rs = RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port)
        with pytest.raises(AssertionError, match="did not start"):
            rs.start()
        assert rs.proc.wait(30) == 1
    log = rs.log()
    assert f"cannot listen on tcp://127.0.0.1:{port}: Address already in use" in log
    assert "no restart can help" in log and "Traceback" not in log
    assert log.count("started writer") == 1


def test_a_grpc_port_in_use_stops_the_start_at_once_naming_it(tmp_path):
    """The proxy cannot serve gRPC where the settings say: no restart can help, so the
    start ends with the setting named instead of the proxy failing until FATAL."""
    import socket
    from store_processes import free_port
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        rs = RunningStore(tmp_path, grpc_listen_port=port)
        with pytest.raises(AssertionError, match="did not start"):
            rs.start()
        assert rs.proc.wait(30) == 1
    log = rs.log()
    assert f"cannot serve gRPC on 127.0.0.1:{port} (grpc_listen_port): Failed to bind" in log
    assert "no restart can help" in log and "Traceback" not in log
    assert log.count("started proxy") == 1
