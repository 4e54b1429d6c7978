"""Test support: run a real store (``rocketstore up``) in a child process.

``RunningStore`` writes a small configuration (8 KiB-64 KiB files, quick restarts),
starts ``python -m cli.main up`` in its own process group, waits for its ready line,
and stops it (SIGTERM, then SIGKILL of the whole group) however the test ends. As a
context manager it fails the test whose store does not stop cleanly: one that hangs
past the timeout, or exits with a non-zero code.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pathlib
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from rocketstore.shm.positions import HEARTBEAT_MS, PID, RESTARTS, PositionTable, Slot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where every process a test starts runs: an empty directory of its own, so that no test
# depends on what the working directory holds (a ``./store`` left by ``rocketstore demo``
# would otherwise be the default store of a command given no ``--store``).
WORK_DIR = tempfile.mkdtemp(prefix="rocketstore-tests-")
atexit.register(shutil.rmtree, WORK_DIR, True)


def write_config(path: str, store_dir: str, processes: dict | None = None,
                 **store: object) -> str:
    """A toml config for ``rocketstore up``: small files, quick restarts; ``processes``
    sets settings of a ``[process.NAME]`` table (``{"cleaner": {...}}``: that one), over
    the quick restarts' own."""
    settings = dict(store_path_root_dir=store_dir, mapped_file_size_commit_log=64 * 1024,
                    mapped_file_size_consume_queue=20 * 512, max_hash_slot_num=1024,
                    max_index_num=4096, flush_interval_commit_log=50,
                    flush_interval_consume_queue=100, clean_resource_interval=200)
    settings.update(store)
    lines = ["[store]"]
    for k, v in settings.items():
        lines.append(f"{k} = " + ("true" if v is True else "false" if v is False else
                                  f'"{v}"' if isinstance(v, str) else repr(v)))
    quick = {"backoff_s": 0.1, "backoff_max_s": 1.0, "startsecs": 0.5, "startretries": 5,
             "stopwaitsecs": 20.0}
    for name in ("flusher", "dispatcher", "writer", "cleaner", "scheduler", "reader", "ha",
                 "proxy"):
        lines.append(f"[process.{name}]")
        lines += [f"{k} = {v!r}" for k, v in {**quick, **(processes or {}).get(name, {})}.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# Ports for the stores of the tests: below the kernel's ephemeral range (32768 on), so
# that no outgoing connection of another test takes one between the look and the
# store's bind; a share of them for each xdist worker (gw0, gw1, ...), so that two
# workers never hand out the same; blocks of PORT_BLOCK, one a call, so that one test's
# ports never overlap (a block holds a store's reader, ingest and HA ports: p - 2, p,
# p + 1). The free port a kernel's bind to 0 gives is in the ephemeral range: two tests
# once got a port an outgoing connection or the other worker's store took meanwhile.
PORT_BASE, PORT_SHARE, PORT_BLOCK = 20_000, 3_000, 8


def _port_blocks():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    low = PORT_BASE + (int(worker) if worker.isdigit() else 0) % 4 * PORT_SHARE
    blocks = PORT_SHARE // PORT_BLOCK - 2
    first = random.randrange(blocks)   # two test runs at once start apart
    for i in itertools.count():
        yield low + (1 + (first + i) % blocks) * PORT_BLOCK + PORT_BLOCK // 2


_PORT_BLOCKS = _port_blocks()


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for a store's TCP or HA socket)."""
    return free_ports(0)


def free_ports(*offsets: int) -> int:
    """A loopback TCP port p such that p + o is free now for every o of ``offsets``
    (``free_ports(-2, 0, 1)``: a store's reader, ingest and HA ports, as RocketMQ lays
    them out), each within ``PORT_BLOCK // 2`` of p, from this worker's share."""
    for _ in range(PORT_SHARE // PORT_BLOCK):
        port = next(_PORT_BLOCKS)
        wanted = [port + o for o in offsets]
        held = []
        try:
            for p in wanted:
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError(f"no free ports at offsets {offsets}")


def cli(*args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocketstore.cli", *args], cwd=WORK_DIR,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=timeout, input=input)


class RunningStore:
    def __init__(self, tmp_path, processes: dict | None = None, **store: object):
        tmp_path = pathlib.Path(os.path.abspath(tmp_path))   # its processes run elsewhere
        self.store_dir = str(tmp_path / "store")
        self.config_path = write_config(str(tmp_path / "store.toml"), self.store_dir,
                                        processes, **store)
        self.log_path = str(tmp_path / "up.log")
        self.proc: subprocess.Popen | None = None
        self.banner = ""            # the line ``up`` printed once every process ran

    def start(self, timeout: float = 60, preexec_fn=None) -> "RunningStore":
        """``preexec_fn`` runs in the supervisor's process before it starts."""
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketstore.cli", "up", "--config", self.config_path],
            cwd=WORK_DIR, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
            stderr=log, text=True, start_new_session=True, preexec_fn=preexec_fn)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = self.proc.stdout.readline()
                if line.startswith("rocketstore up:"):
                    self.banner = line.strip()
                    return self
                if not line and self.proc.poll() is not None:
                    break
            elif self.proc.poll() is not None:
                break
        raise AssertionError(f"store did not start (rc {self.proc.poll()}):\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-6000:]

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM the supervisor and wait; returns its exit code (that of a supervisor
        which had already exited, too). One that does not exit within ``timeout`` is
        killed with its whole group, and ``AssertionError`` is raised."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_all()
                raise AssertionError(f"store did not stop in {timeout} s:\n{self.log()}")
        rc = self.proc.returncode
        self.proc.stdout.close()
        self.proc = None
        return rc

    def kill_all(self) -> None:
        """SIGKILL the supervisor and every process of its group."""
        if self.proc is not None:
            _kill_group(self.proc.pid)
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None

    def table(self) -> PositionTable:
        return PositionTable.attach(self.store_dir)

    def child_pid(self, name: str) -> int:
        t = self.table()
        try:
            return t.get_process(name, PID)
        finally:
            t.close()

    def heartbeat_ms(self, name: str) -> int:
        """When process ``name`` last ended a loop turn (ms since the epoch)."""
        t = self.table()
        try:
            return t.get_process(name, HEARTBEAT_MS)
        finally:
            t.close()

    def restarts(self, name: str) -> int:
        t = self.table()
        try:
            return t.get_process(name, RESTARTS)
        finally:
            t.close()

    def slot(self, slot: Slot) -> int:
        t = self.table()
        try:
            return t.get(slot)
        finally:
            t.close()

    def expire_commit_log(self, keep: int = 2) -> list[str]:
        """Make every CommitLog file but the last ``keep`` look long expired (mtime 0),
        have the running cleaner delete them (``rocketstore clean``) and wait until
        MIN_OFFSET moves. Returns the file names there were before."""
        commit_dir = os.path.join(self.store_dir, "commitlog")
        names = sorted(n for n in os.listdir(commit_dir) if n.isdigit())
        for name in names[:len(names) - keep]:
            os.utime(os.path.join(commit_dir, name), (0, 0))
        r = cli("clean", "--config", self.config_path)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: self.slot(Slot.MIN_OFFSET) > 0, what="min offset to move")
        return names

    def __enter__(self) -> "RunningStore":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        """Stop the store the test leaves running and kill whatever is left of its
        process group. A store that does not stop within the timeout, or stops with a
        non-zero code (a process that did not stop cleanly, WRITTEN, FLUSHED and
        DISPATCHED apart), fails the test, and so does a supervisor that exited by
        itself with one and was not collected (``stop()``, ``kill_all()``) by the test.
        When the test already failed, its own error goes on, with this one noted."""
        if self.proc is None:
            return
        pid = self.proc.pid
        try:
            rc = self.stop()
            failure = f"store stopped with code {rc}:\n{self.log()}" if rc else ""
        except AssertionError as e:
            failure = str(e)
        finally:
            _kill_group(pid)
        if not failure:
            return
        if exc is None:
            raise AssertionError(failure)
        exc.add_note(failure)


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group ``pgid`` (none is no error)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(condition, timeout: float = 30, what: str = "condition", interval: float = 0.02):
    """``condition()``'s first true value, asked every ``interval`` s; AssertionError
    naming ``what`` when none came within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_past_ms(stamp_ms: int) -> None:
    """Wait until the wall clock reads past ``stamp_ms`` (a store time): a message
    stored from now on has a later store time than every one stamped up to it."""
    wait_for(lambda: time.time_ns() // 1_000_000 > stamp_ms, 5,
             f"the clock past {stamp_ms}", interval=0.001)
