"""What a newcomer's first mistakes get from the ``rocketstore`` command: each is answered
at once with what to do, against real stores and real ``rocketstore`` processes.

A misspelled table or setting stops every command (exit 3, ``UnknownSettingError``,
the nearest known name); relative paths in a settings file are the file's directory's;
a store opens with the file sizes it recorded unless the file sets others (then the
refusal names the recorded ones); TCP ports follow RocketMQ's broker (ingest
``listen_port``, reader ``listen_port - 2``, HA ``listen_port + 1``); a store directory
another process holds is refused naming that process, ``demo`` included; and ``up``'s
banner says how to stop it, which works.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

import pytest

from rocketstore.client import ClientError, Producer, ReaderClient
from rocketstore.storage.config import recorded_geometry
from store_processes import WORK_DIR, RunningStore, cli, free_ports, wait_for

MISSPELLINGS = [
    ("[stor]\nflush_disk_type = 'SYNC_FLUSH'\n", "[stor]: no such table (did you mean "
     "[store]?); a settings file holds [store] and [process.NAME] tables"),
    ("[store]\n[process.writr]\npriority = 3\n",
     "[process.writr]: no such process (did you mean [process.writer]?) (known: flusher, "
     "dispatcher, writer, cleaner, scheduler, reader, ha, controller, dashboard, proxy)"),
    ("[store]\nflushDiskType = 'SYNC_FLUSH'\n",
     "[store] flushDiskType: no such setting (did you mean flush_disk_type?)"),
    ("[process.reader]\nstopwaitsec = 5.0\n",
     "[process.reader] stopwaitsec: no such setting (did you mean stopwaitsecs?)"),
]


def settings(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, said", MISSPELLINGS,
                         ids=["stor", "process.writr", "flushDiskType", "stopwaitsec"])
def test_a_misspelled_table_or_setting_stops_up_naming_the_nearest(tmp_path, text, said):
    """``[stor]`` or ``[process.writr]`` started a store on every default and exited 0."""
    path = settings(tmp_path / "s.toml", text)
    store = str(tmp_path / "store")
    r = cli("up", "--config", path, "--store", store, "--json", timeout=30)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stderr.strip() == f"rocketstore: UnknownSettingError: {path}: {said}"
    assert json.loads(r.stdout) == {"error": "UnknownSettingError", "exit": 3,
                                    "message": f"UnknownSettingError: {path}: {said}"}
    assert not os.path.exists(store)


@pytest.mark.parametrize("command", ["config", "check", "status", "demo"])
def test_every_command_refuses_a_misspelled_process_table(tmp_path, command):
    """``[process.NAME]`` tables were read by ``up`` alone: ``config`` showed a file
    ``up`` would refuse as fine."""
    text, said = MISSPELLINGS[1]
    path = settings(tmp_path / "s.toml", text)
    r = cli(command, "--config", path, "--store", str(tmp_path / "store"), timeout=30)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stderr.strip() == f"rocketstore: UnknownSettingError: {path}: {said}"


def test_relative_paths_in_a_settings_file_are_read_from_its_directory(tmp_path):
    """The store directory and the CURVE key files a settings file names by relative
    paths are found beside the file, whatever directory ``up`` runs in (WORK_DIR)."""
    conf = tmp_path / "conf"
    r = cli("keys", "--dir", str(conf / "keys"), "--client", "app")
    assert r.returncode == 0, r.stderr
    port = free_ports(-2, 0)
    rs = RunningStore(tmp_path)
    rs.config_path = settings(conf / "store.toml", f"""[store]
store_path_root_dir = "data"
mapped_file_size_commit_log = 65536
tcp_listen_address = "127.0.0.1"
listen_port = {port}
curve_server_key = "keys/server.key_secret"
curve_authorized_keys = "keys/app.key"
""")
    rs.store_dir = str(conf / "data")
    with rs:
        assert f"rocketstore up: store {conf / 'data'} " in rs.banner
        app = dict(curve_server_key=str(conf / "keys" / "server.key"),
                   curve_client_key=str(conf / "keys" / "app.key_secret"))
        with Producer(f"tcp://127.0.0.1:{port}", **app) as p:
            assert p.send("Beside", b"found its keys").ok
    assert os.path.isdir(conf / "data" / "commitlog")
    assert not os.path.exists(os.path.join(WORK_DIR, "data"))


def test_a_demo_store_runs_under_a_settings_file_that_sets_no_file_size(tmp_path):
    """``rocketstore demo`` makes a store of 64 MiB files; a settings file that set only
    tcp_listen_address was refused with a mismatch of sizes nobody had set. Now the
    store opens with what it recorded; a file that does set another size is refused
    naming the recorded value and how to keep it."""
    store = tmp_path / "conf" / "store"
    r = cli("demo", "--embedded", "--store", str(store), "--count", "20")
    assert r.returncode == 0, r.stderr
    made = recorded_geometry(str(store))
    assert made["mapped_file_size_commit_log"] == 64 * 1024 * 1024
    port = free_ports(-2, 0)
    tcp_only = f'[store]\nstore_path_root_dir = "store"\ntcp_listen_address = "127.0.0.1"\n' \
               f"listen_port = {port}\n"
    rs = RunningStore(tmp_path)
    rs.config_path = settings(tmp_path / "conf" / "tcp.toml", tcp_only)
    rs.store_dir = str(store)
    r = cli("config", "--config", rs.config_path, "--json")
    assert {k: v for k, v in json.loads(r.stdout).items() if k in made} == made
    with rs:
        with Producer(f"tcp://127.0.0.1:{port}") as p:
            assert p.send("DemoTopic", b"over tcp", queue_id=0).ok
        with ReaderClient(f"tcp://127.0.0.1:{port}") as rc:     # ingest: says where to go
            with pytest.raises(ClientError, match="two ports below"):
                rc.offsets(["DemoTopic"])
        with ReaderClient(f"tcp://127.0.0.1:{port - 2}") as rc:
            wait_for(lambda: {q.queue_id: q.max_offset
                              for q in rc.offsets(["DemoTopic"])}[0] == 6,
                     what="the message dispatched")
    sized = settings(tmp_path / "conf" / "sized.toml",
                     tcp_only + "mapped_file_size_commit_log = 1073741824\n")
    started = time.monotonic()
    r = cli("up", "--config", sized, timeout=30)
    assert r.returncode == 3 and time.monotonic() - started < 10, r.stderr
    assert "GeometryMismatchError" in r.stderr
    assert ("mapped_file_size_commit_log = 1073741824 is set, the store recorded 67108864"
            in r.stderr)
    assert f"remove mapped_file_size_commit_log from {sized} to open it" in r.stderr


def test_tcp_ports_are_rocketmqs_broker_ports_and_hold_ha_beside_the_reader(tmp_path):
    """The reader took listen_port + 1, RocketMQ's HA port: a master with TCP and
    ``ha_listen_port = listen_port + 1`` (RocketMQ's layout) was refused. The reader is
    on RocketMQ's fast port, listen_port - 2, and the three listen together."""
    port = free_ports(-2, 0, 1)
    with RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port,
                      ha_listen_port=port + 1) as rs:
        assert (f"TCP ingest tcp://127.0.0.1:{port}, reader tcp://127.0.0.1:{port - 2} "
                f"(clients name tcp://127.0.0.1:{port}); HA tcp://127.0.0.1:{port + 1}"
                in rs.banner)
        with Producer(f"tcp://127.0.0.1:{port}") as p:
            assert p.send("Ports", b"m", queue_id=1).ok
        with ReaderClient(f"tcp://127.0.0.1:{port - 2}") as rc:
            wait_for(lambda: [q.max_offset for q in rc.offsets(["Ports"])
                              if q.queue_id == 1] == [1], what="the message dispatched")
        status = json.loads(cli("status", "--config", rs.config_path, "--json").stdout)
        assert status["ha"]["listen"] == f"tcp://127.0.0.1:{port + 1}"


def test_the_banner_says_how_to_stop_the_store_and_that_way_stops_it(tmp_path):
    """``up &`` (as the README runs it) is not reached by Ctrl-C: the banner names the
    supervisor's pid to kill, and killing it is a clean stop."""
    with RunningStore(tmp_path) as rs:
        pid = rs.proc.pid
        assert rs.banner.endswith(f"; stop it with Ctrl-C, or kill {pid} from any shell "
                                  "(a clean stop)")
        os.kill(pid, signal.SIGTERM)
        assert rs.proc.wait(60) == 0
    assert not os.path.exists(os.path.join(rs.store_dir, "abort"))


def test_a_store_directory_in_use_names_the_process_holding_it(tmp_path):
    """A second store on a running store's directory (``up``, ``check``, ``demo``) was
    refused naming only the lock file; ``demo`` said "did not start; see the log"."""
    with RunningStore(tmp_path) as rs:
        pid = rs.proc.pid
        said = (f"store directory {rs.store_dir} is in use by pid {pid} ({sys.executable} -m "
                f"rocketstore.cli up --config {rs.config_path}), which holds "
                f"{os.path.join(rs.store_dir, 'lock')}: stop it first (kill {pid}: a clean "
                "stop), or use another store directory")
        for args in (("up", "--config", rs.config_path),
                     ("check", "--config", rs.config_path),
                     ("demo", "--store", rs.store_dir, "--count", "10"),
                     ("demo", "--embedded", "--store", rs.store_dir, "--count", "10")):
            started = time.monotonic()
            r = cli(*args, timeout=60)
            assert time.monotonic() - started < 10, args        # not after a wait
            assert r.returncode == 3, (args, r.stdout, r.stderr)
            assert r.stderr.strip() == f"rocketstore: StoreLockedError: {said}", args
        assert not os.path.exists(os.path.join(rs.store_dir, "demo-up.log"))
        assert rs.proc.poll() is None


def test_a_demo_whose_store_does_not_start_says_why(tmp_path):
    """Whatever stops ``up`` (here a store directory that is a file's place), ``demo``
    repeats what ``up`` said, not only where its log is."""
    store = tmp_path / "store"
    r = cli("demo", "--embedded", "--store", str(store), "--count", "5")
    assert r.returncode == 0, r.stderr
    (store / "consumequeue").rename(store / "cq")
    (store / "consumequeue").write_text("not a directory")
    r = cli("demo", "--store", str(store), "--count", "5", timeout=180)
    assert r.returncode == 3, r.stderr
    log = os.path.join(store, "demo-up.log")
    assert r.stderr.startswith("rocketstore: StoreError: the store did not start: "), r.stderr
    assert r.stderr.rstrip().endswith(f"(see {log})")
    last = [line for line in open(log).read().splitlines() if line.startswith("rocketstore")]
    assert last and last[-1] in r.stderr
