"""The supervisor: one store's processes, started, watched and stopped in order.

``rocketstore up`` runs ``Supervisor(...).run()`` in the foreground:

1. read the configuration (``[store]`` and ``[process.NAME]`` of supervisor.toml,
   ``load_settings``: no unknown table or setting, relative paths from the file's
   directory, the store's recorded file sizes unless the file sets them);
2. raise the soft open-files limit to the hard one (``raise_open_files_limit``: every
   file mapped for writing holds two descriptors), take the store's ``lock`` (a second
   ``up`` on the same directory fails at once), recover the files (abnormal recovery
   when ``abort`` exists) and create the position table from them (``procs.recovery``);
3. start the processes by ascending ``priority``, each a fork of the fork server
   (multiprocess's forkserver: a fresh interpreter, started by the first start, that
   imported the processes' modules, ``PRELOAD``, and nothing else: no ZeroMQ context,
   lock, mapping or descriptor of the supervisor), so a process starts in milliseconds
   instead of importing numpy and ZeroMQ again; and mark the store RUNNING once every
   one of them has turned its loop. A fork server that dies takes the processes with it
   (``procs.service``): they are restarted as after any crash, the next start making a
   new fork server;
4. watch them: a process that exits when it should not, after running ``startsecs``
   or longer, is started again at once (supervisord's autorestart: its clients wait for
   the new one); one that dies sooner is restarted after a back-off that doubles with
   each consecutive failure (``backoff_s`` .. ``backoff_max_s``), and one that dies
   within ``startsecs`` more than ``startretries`` times in a row is FATAL and the store
   stops;
5. on SIGTERM or SIGINT, stop them by descending priority (reader, scheduler, cleaner,
   writer — which answers everything it accepted —, dispatcher — which catches up —,
   flusher — which flushes the rest), each with ``stopsignal`` and SIGKILL after
   ``stopwaitsecs``; then remove ``abort`` only if every process stopped cleanly and
   WRITTEN == FLUSHED == DISPATCHED; unlink the shared memory; release the lock.

If the supervisor itself is killed, its children die with it (the fork server, their
parent, sees the supervisor's end of its pipe close and exits; PR_SET_PDEATHSIG), the
lock goes with its descriptor, ``abort`` stays, and the next ``up`` recovers.

In controller mode (``enable_controller_mode``) a seventh process, the controller
(``procs.controller``), keeps the store's membership of its broker group in ZooKeeper;
it is started first, stopped last, and kept running (not restarted) when the other
processes restart in another role, so its ZooKeeper session outlives a role change.
A group member starts in its settings' master role but answers no PUT_OK until the
controller grants it the master's lease (``procs.fencing``).

A SLAVE runs no scheduler, no HA process and no proxy; a master runs the HA process only
with ``ha_listen_port`` and the proxy only with ``grpc_listen_port`` (``runs``). Two requests from a SLAVE make the supervisor stop its
processes and start them again (steps 5, then 2-3, in the same run): a cut of a
CommitLog that diverged from its master's (``config/haCutRequest.json``, written by the
writer's follower; recovery makes the cut, ``storage.replication``), and a promotion
(``config/haPromoteRequest.json``, ``procs.promotion``: the processes start again in
the master role asked for); in controller mode also a request to follow the group's
master (the processes start again as a SLAVE of it).

    process     priority  owns
    ----------  --------  ------------------------------------------------------------
    flusher     10        fdatasync of the CommitLog, FLUSHED, the checkpoint's physic time
    dispatcher  20        consume queues, index, DISPATCHED, checkpoint logics/index times
    writer      30        CommitLog appends, WRITTEN, the ingest socket
    cleaner     40        expiry: unlinks old files, MIN_OFFSET, DISK_FULL
    scheduler   50        delayed messages, config/delayOffset.json
    reader      60        the reader socket for remote pulls and queries
    proxy       65        with grpc_listen_port: RocketMQ 5's gRPC MessagingService for
                          RocketMQ's own clients, config/popState.*
    ha          25        a master's: streams the CommitLog to slaves, SLAVE_ACKED, SLAVES
                          (it stops after the writer, whose last SYNC_MASTER replies wait
                          for SLAVE_ACKED)
    controller  5         controller mode: the group in ZooKeeper, MASTER_LEASE_MS, EPOCH
    dashboard   70        with dashboard_port: the web console (rocketstore.console.serve,
                          started by module name); it reads as ``status`` does, owns nothing
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import signal
import time
from typing import Any

import multiprocess
import multiprocess.connection

from rocketstore.procs import metrics, promotion
from rocketstore.procs.recovery import recover_and_publish, unlink_shared
from rocketstore.procs.service import EXIT_CANNOT_LISTEN, run_service
from rocketstore.procs.stats import clear_published
from rocketstore.shm.transient_pool import TransientStorePool, copy_into_files
from rocketstore.shm.positions import (
    HEARTBEAT_MS, PID, PROC_STATE, RESTARTS, STARTED_MS, WATCHDOG_KILLS, PositionTable,
    ProcessState, Slot, StoreState, now_ms)
from rocketstore.storage import StoreConfig, replication
from rocketstore.storage.config import (
    did_you_mean, read_settings_file, resolve_paths, with_recorded_geometry)
from rocketstore.storage.errors import StoreConfigError, UnknownSettingError
from rocketstore.storage.store_lock import remove_abort

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ProcessConfig:
    """supervisord's vocabulary for one process."""

    priority: int
    autorestart: bool = True
    startsecs: float = 1.0
    startretries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    stopsignal: str = "TERM"
    stopwaitsecs: float = 20.0
    heartbeat_timeout_s: float = 60.0   # no loop turn for this long: killed, restarted
    enabled: bool = True


DEFAULT_PROCESSES = {
    "flusher": ProcessConfig(priority=10),
    "dispatcher": ProcessConfig(priority=20),
    "writer": ProcessConfig(priority=30),
    "cleaner": ProcessConfig(priority=40),
    "scheduler": ProcessConfig(priority=50),
    "reader": ProcessConfig(priority=60),
    "ha": ProcessConfig(priority=25),     # stops after the writer: SYNC_MASTER acks
    "controller": ProcessConfig(priority=5),   # stops last: the group's lease ends with it
    "dashboard": ProcessConfig(priority=70),   # stops first: it only reads
    "proxy": ProcessConfig(priority=65),       # stops next: its clients' last calls end
}
# a SLAVE runs no delay scheduler, serves no slave and takes no RocketMQ client's sends
MASTER_ONLY = ("scheduler", "ha", "proxy")


def runs(name: str, config: StoreConfig) -> bool:
    """Whether the store runs process ``name``: a SLAVE no delay scheduler, no HA
    process and no proxy; a master the HA process only with ``ha_listen_port`` set and
    the proxy only with ``grpc_listen_port``; the controller only in controller mode;
    the dashboard only with ``dashboard_port``."""
    if name == "controller":
        return config.enable_controller_mode
    if name == "dashboard":
        return bool(config.dashboard_port)
    if config.slave and name in MASTER_ONLY:
        return False
    if name == "proxy":
        return bool(config.grpc_listen_port)
    return name != "ha" or bool(config.ha_listen_port)
MODULES = {name: f"rocketstore.procs.{name}" for name in DEFAULT_PROCESSES}
# the web console is a room above this one (and an extra): started by its module's name
MODULES["dashboard"] = "rocketstore.console.serve"
# What the fork server imports once for every process it forks: first procs.fork_server
# (it ignores a stop signal to the group), then the processes' modules. Importing them
# makes no ZeroMQ context, opens no file and maps no shared memory; numpy's OpenBLAS
# starts its thread pool, which OpenBLAS itself stops before a fork (pthread_atfork). A
# module that cannot be imported (an extra not installed) is skipped: its process
# imports it.
PRELOAD = ["rocketstore.procs.fork_server", "rocketstore.procs.service", *MODULES.values()]


def load_process_configs(doc: dict[str, Any], where: str = "") -> dict[str, ProcessConfig]:
    """``[process.NAME]`` tables over the defaults. Raises ``UnknownSettingError`` for a
    process or setting that does not exist, naming the nearest known one, and
    ``StoreConfigError`` for a value the supervisor could not use; ``where`` (the
    settings file) leads each message."""
    out = {name: dataclasses.replace(cfg) for name, cfg in DEFAULT_PROCESSES.items()}
    known = [f.name for f in dataclasses.fields(ProcessConfig)]
    lead = f"{where}: " if where else ""
    for name, table in doc.get("process", {}).items():
        if name not in out:
            raise UnknownSettingError(
                f"{lead}[process.{name}]: no such process"
                f"{did_you_mean(name, list(out), '[process.{}]')} (known: {', '.join(out)})")
        if not isinstance(table, dict):
            raise StoreConfigError(f"{lead}process.{name} must be a table: [process.{name}]")
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise UnknownSettingError(lead + "; ".join(
                f"[process.{name}] {key}: no such setting{did_you_mean(key, known)}"
                for key in unknown))
        for key, value in table.items():
            _check_process_setting(name, key, value)
        out[name] = dataclasses.replace(out[name], **table)
    return out


def load_settings(path: str, *, defaults: bool = False, new_store_sizes: dict | None = None,
                  **overrides: Any) -> tuple[StoreConfig, dict[str, ProcessConfig]]:
    """The store's settings and its processes' from a settings file: every table and
    setting checked (``storage.config.read_settings_file``, ``load_process_configs``),
    relative paths read from the file's directory, and the file sizes the store
    recorded wherever the file sets none (``with_recorded_geometry``;
    ``new_store_sizes`` for a store not made yet). ``defaults``: the file is the
    embedded one, RocketMQ's defaults written out: its paths are the working
    directory's and it sets no file size.

    Raises ``OSError``, ``tomllib.TOMLDecodeError`` and ``StoreConfigError``.
    """
    doc = read_settings_file(path)
    processes = load_process_configs(doc, path)
    table = doc.get("store", {})
    config = StoreConfig.from_mapping(
        resolve_paths(table, "" if defaults else os.path.dirname(path)), **overrides)
    return (with_recorded_geometry(config, () if defaults else set(table), path,
                                   new_store_sizes), processes)


_PROCESS_TYPES = {f.name: f.type for f in dataclasses.fields(ProcessConfig)}


def _check_process_setting(process: str, key: str, value: Any) -> None:
    """Raise ``StoreConfigError`` for a value the supervisor could not use: the wrong
    type, a negative number, a stop signal that is no signal."""
    where = f"[process.{process}] {key} = {value!r}"
    kind = _PROCESS_TYPES[key]
    if kind == "bool":
        if not isinstance(value, bool):
            raise StoreConfigError(f"{where}: must be true or false")
    elif kind in ("int", "float"):
        numbers = (int,) if kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, numbers):
            raise StoreConfigError(
                f"{where}: must be {'an integer' if kind == 'int' else 'a number'}")
        if value < 0 or not math.isfinite(value):
            raise StoreConfigError(f"{where}: must be finite and not negative")
    elif key == "stopsignal":
        if not isinstance(value, str) or not isinstance(getattr(signal, f"SIG{value}", None),
                                                        signal.Signals):
            raise StoreConfigError(f"{where}: not a signal name (TERM, INT, QUIT, ...)")


@dataclasses.dataclass
class Child:
    name: str
    config: ProcessConfig
    process: Any = None
    started_at: float = 0.0
    failures: int = 0
    restarts: int = 0
    next_start_at: float = 0.0
    state: ProcessState = ProcessState.STOPPED
    watchdog_kills: int = 0
    ran: bool = False          # RUNNING once under this supervisor


FORK_SERVER_GONE = 255    # the exit code multiprocess gives a process whose fork server died


def _wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until process ``pid`` is gone or a zombie. A process whose fork server died
    (SIGKILLed) is reported at once, though its own SIGKILL (PR_SET_PDEATHSIG) may not
    have ended it yet: its successor must not start beside it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.01)
    log.warning("pid %d, whose fork server died, is still there after %.0f s", pid, timeout_s)


NR_OPEN = "/proc/sys/fs/nr_open"     # the kernel's ceiling for RLIMIT_NOFILE


def raise_open_files_limit() -> None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (which the store's
    processes inherit), saying so in the log.

    Every store file mapped for writing holds two descriptors, the store's (to flush
    it) and the one the mapping keeps (Python's mmap duplicates it). The dispatcher
    maps every consume-queue and index file, so a store of a thousand queues needs some
    thousands: past the soft limit (often 1024) it stops with EMFILE, and every put is
    refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(NR_OPEN) as f:
                target = int(f.read())
        except (OSError, ValueError):
            return
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as e:
            log.warning("open files limit stays %d (hard %s): %s", soft, hard, e)
            return
        log.info("open files limit raised from %d to %d (the hard limit)", soft, target)


class Supervisor:
    def __init__(self, config: StoreConfig, processes: dict[str, ProcessConfig] | None = None):
        config.check_replication()
        self.config = config
        self.member_config = config     # the settings' own (the controller's), whatever role
        self.store_dir = config.store_path_root_dir
        self._processes = processes or DEFAULT_PROCESSES
        self.children = self._children()
        self.table: PositionTable | None = None
        self._lock = None
        self._stopping = False
        self._fatal = ""
        self._context = multiprocess.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        self._metrics = None        # the Prometheus endpoint's server, when serving
        self._pool = None           # the TransientStorePool, when enabled (kept locked)
        self._cut_request_path = os.path.join(config.config_dir, replication.CUT_REQUEST_FILE)

    @classmethod
    def from_toml(cls, path: str, **overrides: Any) -> "Supervisor":
        """A supervisor of the store a settings file describes (``load_settings``)."""
        return cls(*load_settings(path, **overrides))

    # ------------------------------------------------------------------ run
    def run(self, ready=None) -> int:
        """Start, watch until told to stop, stop. Returns 0 after a clean stop.

        ``ready`` (optional) is called once every process is running.
        """
        for signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):   # all: a clean stop
            signal.signal(signo, self._request_stop)
        self._join_group()
        self.start()
        try:
            announced = False
            while not self._stopping and not self._fatal:
                self._watch(timeout_s=0.1)
                if self._restart_if_asked():
                    announced = False
                if not announced and self.all_running():
                    self.table.set(Slot.STATE, StoreState.RUNNING)
                    announced = True
                    if ready:
                        ready()
        finally:
            clean = self.stop()
        return 0 if clean and not self._fatal else 1

    def start(self) -> None:
        raise_open_files_limit()
        recovered = recover_and_publish(self.config)      # the store's lock held from here
        self.table, self._lock, self._pool = recovered.table, recovered.lock, recovered.pool
        # the statistics an earlier run published: a process that does not run now (a
        # promoted slave's, the HA process of a master started without it) would show
        # its last ones for ever, a slave's lag growing with every write
        clear_published(self.store_dir)
        if not self.config.slave:       # done, or left by a promotion cut short
            promotion.clear_request(self.config.config_dir)
        for child in self.children.values():
            if child.process is not None and child.process.is_alive():
                self._adopt(child)         # kept through a restart in another role
            else:
                self._spawn(child)
        self._serve_metrics()

    def _serve_metrics(self) -> None:
        """The Prometheus endpoint, when ``metrics_port`` is set. One that cannot bind is
        logged and the store runs without it: metrics never stop the store."""
        cfg = self.config
        if not cfg.metrics_port:
            return
        try:
            self._metrics = metrics.serve(self.store_dir, cfg.metrics_address, cfg.metrics_port)
        except OSError as e:
            log.error("no metrics endpoint on %s:%d: %s", cfg.metrics_address,
                      cfg.metrics_port, e)

    def _children(self) -> dict[str, Child]:
        return {name: Child(name, cfg) for name, cfg in
                sorted(self._processes.items(), key=lambda kv: kv[1].priority)
                if cfg.enabled and runs(name, self.config)}

    def _restart_if_asked(self) -> bool:
        """Stop and start the processes again when a SLAVE was asked to cut its diverged
        CommitLog or to become a master (procs.promotion), or, in controller mode, a
        store to follow another master. True when it did."""
        role = promotion.requested_role(self.config.config_dir) if self.config.slave else None
        master = self._requested_master()
        if not role and not master and not self._cut_requested():
            return False
        self.stop(keep=("controller",))
        if role:
            log.warning("promoted: restarting the store's processes as %s", role)
            self._change_role(broker_role=role)
        elif master:
            log.warning("the group's master is at %s: restarting the store's processes as "
                        "its SLAVE", master)
            self._change_role(broker_role="SLAVE", ha_master_address=master)
            promotion.clear_request(self.config.config_dir)
        self.start()
        return True

    def _join_group(self) -> None:
        """Controller mode: a group that has a master already is joined as its SLAVE."""
        if not self.config.enable_controller_mode:
            return
        from rocketstore.procs.controller import current_master   # kazoo: an extra
        master = current_master(self.config)
        if master is not None:
            log.info("member %s is master of %s: starting as its SLAVE", master["broker_id"],
                     self.config.broker_name)
            self._change_role(broker_role="SLAVE", ha_master_address=master["ha"])

    def _requested_master(self) -> str | None:
        """The master a controller asked this store to follow, unless it follows it."""
        if not self.config.enable_controller_mode:
            return None
        master = promotion.requested_master(self.config.config_dir)
        if master is not None and self.config.slave and \
                master == self.config.ha_master_address:
            promotion.clear_request(self.config.config_dir)
            return None
        return master

    def _change_role(self, **settings: Any) -> None:
        """The processes of the new role (not started yet); counters since this
        supervisor started, and a process kept running (the controller), carried over."""
        self.config = dataclasses.replace(self.config, **settings)
        before, self.children = self.children, self._children()
        for name, child in self.children.items():
            if name in before:
                child.restarts = before[name].restarts
                child.watchdog_kills = before[name].watchdog_kills
                child.process = before[name].process
                child.started_at = before[name].started_at

    def _cut_requested(self) -> bool:
        """A SLAVE's writer found its CommitLog diverged from its master's and asked for
        a cut (``storage.replication``): the processes are stopped, the cut is made by
        the recovery of the next start, and they start again."""
        if not self.config.slave or not os.path.exists(self._cut_request_path):
            return False
        log.error("replication diverged: restarting the store's processes to cut the "
                  "CommitLog back to what the master holds")
        return True

    def all_running(self) -> bool:
        return all(self._is_up(c) for c in self.children.values())

    def _request_stop(self, *_: object) -> None:
        self._stopping = True

    # ------------------------------------------------------------------ children
    def _spawn(self, child: Child) -> None:
        config = self.member_config if child.name == "controller" else self.config
        child.process = self._context.Process(
            target=run_service, name=f"rocketstore-{child.name}",
            args=(MODULES[child.name], self.store_dir, config.to_dict()))
        child.process.start()
        child.started_at = time.monotonic()
        self._adopt(child)
        log.info("started %s (pid %d)", child.name, child.process.pid)

    def _adopt(self, child: Child) -> None:
        """A process started, or kept running through a restart, entered in the position
        table (STARTING until it attaches the table and turns its loop)."""
        child.state = ProcessState.STARTING
        t = self.table
        t.set_process(child.name, PID, child.process.pid)
        t.set_process(child.name, STARTED_MS, now_ms())
        t.set_process(child.name, PROC_STATE, ProcessState.STARTING)
        t.set_process(child.name, RESTARTS, child.restarts)
        t.set_process(child.name, WATCHDOG_KILLS, child.watchdog_kills)

    def _is_up(self, child: Child) -> bool:
        if child.process is None or not child.process.is_alive():
            return False
        beat = self.table.get_process(child.name, HEARTBEAT_MS)
        return beat >= self.table.get_process(child.name, STARTED_MS)

    def _watch(self, timeout_s: float) -> None:
        """Wait for a child to exit (or ``timeout_s``), then restart what must be."""
        sentinels = [c.process.sentinel for c in self.children.values()
                     if c.process is not None and c.process.is_alive()]
        if sentinels:
            multiprocess.connection.wait(sentinels, timeout=timeout_s)
        else:
            time.sleep(timeout_s)
        now = time.monotonic()
        for child in self.children.values():
            if child.state == ProcessState.STARTING and self._is_up(child):
                child.state = ProcessState.RUNNING
                child.ran = True
                self.table.set_process(child.name, PROC_STATE, ProcessState.RUNNING)
            if child.state == ProcessState.RUNNING and not self._stopping:
                self._watchdog(child)
            if child.process is not None and not child.process.is_alive() and not self._stopping:
                self._exited(child, now)
            if child.state == ProcessState.BACKOFF and now >= child.next_start_at:
                child.restarts += 1
                self._spawn(child)

    def _watchdog(self, child: Child) -> None:
        """A running process whose loop has not turned for ``heartbeat_timeout_s`` is
        hung (stopped by SIGSTOP, deadlocked, stuck in the kernel): SIGKILL it, and the
        exit is handled like any crash (restart with back-off)."""
        timeout_ms = child.config.heartbeat_timeout_s * 1000
        if timeout_ms <= 0 or not child.process.is_alive():
            return
        age_ms = now_ms() - self.table.get_process(child.name, HEARTBEAT_MS)
        if age_ms <= timeout_ms:
            return
        child.watchdog_kills += 1
        self.table.set_process(child.name, WATCHDOG_KILLS, child.watchdog_kills)
        log.error("%s (pid %d) made no progress for %.1f s (heartbeat_timeout_s %s): killing "
                  "it to restart it", child.name, child.process.pid, age_ms / 1000,
                  child.config.heartbeat_timeout_s)
        child.process.kill()
        child.process.join(5)

    def _exited(self, child: Child, now: float) -> None:
        code = child.process.exitcode
        ran = now - child.started_at
        child.process.join()
        if code == FORK_SERVER_GONE:
            _wait_gone(child.process.pid)
        child.process = None
        self.table.set_process(child.name, PID, 0)
        log.warning("%s exited with code %s after %.1f s", child.name, code, ran)
        if not child.config.autorestart:
            child.state = ProcessState.EXITED
            self.table.set_process(child.name, PROC_STATE, child.state)
            return
        child.failures = child.failures + 1 if ran < child.config.startsecs else 1
        if code == EXIT_CANNOT_LISTEN and not child.ran:   # the settings: no retry helps
            self._give_up(child, f"{child.name} cannot listen where the settings say (its "
                                 "log says why): no restart can help")
            return
        if ran < child.config.startsecs and child.failures > child.config.startretries:
            self._give_up(child, f"{child.name} failed {child.failures} times in a row")
            return
        delay = 0.0 if ran >= child.config.startsecs else min(
            child.config.backoff_max_s, child.config.backoff_s * 2 ** (child.failures - 1))
        child.state = ProcessState.BACKOFF
        child.next_start_at = now + delay
        self.table.set_process(child.name, PROC_STATE, child.state)

    def _give_up(self, child: Child, why: str) -> None:
        """``child`` is FATAL: the store stops, saying ``why``."""
        child.state = ProcessState.FATAL
        self.table.set_process(child.name, PROC_STATE, child.state)
        self._fatal = why
        log.error("%s; stopping the store", why)

    # ------------------------------------------------------------------ stop
    def stop(self, keep: tuple[str, ...] = ()) -> bool:
        """Stop every child in reverse order, but those named in ``keep`` (left
        running through a restart); remove ``abort`` only after a clean stop.

        Returns whether the stop was clean.
        """
        if self.table is None:
            return False
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics = None
        self.table.set(Slot.STATE, StoreState.STOPPING)
        clean = not self._fatal
        for child in reversed(list(self.children.values())):
            if child.name not in keep:
                clean &= self._stop_child(child)
        t = self.table
        written = t.get(Slot.WRITTEN)
        caught_up = (t.get(Slot.FLUSHED) == written == t.get(Slot.DISPATCHED)
                     and not t.get(Slot.FLUSH_ERROR) and not t.get(Slot.DISPATCH_ERROR))
        if clean and caught_up:
            remove_abort(self.store_dir)
            log.info("stopped cleanly at %d", written)
        else:
            log.warning("stopped uncleanly (clean=%s, written %d flushed %d dispatched %d): "
                        "the next start recovers", clean, written, t.get(Slot.FLUSHED),
                        t.get(Slot.DISPATCHED))
        self._release_pool()
        t.set(Slot.STATE, StoreState.STOPPED)
        unlink_shared(self.store_dir)
        t.close()
        self.table = None
        self._lock.release()
        return clean and caught_up

    def _release_pool(self) -> None:
        """Every process is stopped: copy into the files whatever the pool still holds
        uncommitted (a flusher that could not finish), then remove the buffers."""
        pool, t = self._pool, self.table
        if pool is None:
            return
        committed, written = t.get(Slot.COMMITTED), t.get(Slot.WRITTEN)
        if written > committed:
            log.warning("committing [%d, %d) the flusher left in the transient store pool",
                        committed, written)
            try:
                copy_into_files(pool, committed, written, self.config.commit_log_dir, sync=True)
            except OSError as e:
                log.error("cannot commit the transient store pool: %s; its buffers are kept "
                          "for the next start", e)
                pool.close()
                return
        pool.close()
        TransientStorePool.unlink(self.store_dir, pool.size)
        self._pool = None

    def _stop_child(self, child: Child) -> bool:
        proc = child.process
        if proc is None:
            return child.state in (ProcessState.STOPPED, ProcessState.EXITED, ProcessState.BACKOFF)
        was_running = self._is_up(child)
        child.state = ProcessState.STOPPING
        self.table.set_process(child.name, PROC_STATE, child.state)
        if proc.is_alive():
            os.kill(proc.pid, getattr(signal, f"SIG{child.config.stopsignal}"))
        proc.join(child.config.stopwaitsecs)
        if proc.is_alive():
            log.error("%s did not stop within %s s: killing it", child.name,
                      child.config.stopwaitsecs)
            proc.kill()
            proc.join()
        code = proc.exitcode
        child.process = None
        child.state = ProcessState.STOPPED
        self.table.set_process(child.name, PROC_STATE, child.state)
        self.table.set_process(child.name, PID, 0)
        # A process stopped before its loop ever turned had opened nothing yet: its
        # default SIGTERM death harms nothing.
        return code == 0 or (not was_running and code == -signal.SIGTERM)
