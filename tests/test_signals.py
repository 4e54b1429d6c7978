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

from procs.client import Consumer, Producer
from storage import Message, MessageStore, StoreConfig
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
