"""What every store process shares: how it starts, loops, notices it must stop, and dies.

A service is started by the supervisor with ``run_service(module, store_dir,
config_dict)`` in a fork of the fork server (the forkserver start method: the fork
server imported the modules and made no ZeroMQ context, lock or mapping to inherit).
Then:

1. it asks the kernel to kill it when its parent, the fork server, dies
   (``PR_SET_PDEATHSIG``), and exits at once if it is already gone; then it closes its
   copy of the fork server's "alive" pipe, whose write ends only the supervisor keeps
   now: when the supervisor dies the fork server reads end-of-file, exits, and every
   process dies with it;
2. it stops when its supervisor says so: the supervisor marks the process STOPPING in
   the position table (then sends its ``stopsignal``, as supervisord does), and the
   loop, which reads that mark after every turn, finishes the turn and tears down
   cleanly (flushes, replies, closes). SIGTERM, SIGINT and SIGHUP themselves only
   interrupt a wait: a signal to the whole process group (``kill -TERM -- -PGID``, a
   shell's ``kill %1``, systemd's KillMode=control-group, a terminal's Ctrl-C or
   hang-up) reaches the supervisor too, which stops the processes one by one in
   order, exactly as when it alone is signalled. (A handler, not a blocked mask: a
   thread a library started early, OpenBLAS's say, would take a blocked signal's
   default action and end the process.)
3. it attaches the position table, writing as ``name`` (shm.positions refuses a slot
   another process owns), builds its ZeroMQ context, and calls ``setup``; then it
   freezes what exists (``gc.freeze``: the modules, the mappings' objects, the tables
   setup loaded), so the cyclic collector never walks them again. A full collection of
   an unfrozen store process walks all of it, some milliseconds, inside whichever send
   or dispatch it interrupts; frozen, the send -> visible p99 at 4,000 msgs/s was
   lower in five of five runs in turn (1.34-1.74 ms against 1.63-2.14). Objects are
   still freed when their last reference goes; only cycles made before the freeze are
   never collected;
4. it loops ``turn()`` until stopping; after a turn, when ``TURN_MS`` (10 ms) passed
   since it last did, it writes its heartbeat slot, its statistics about once a second
   (``self.stats``, ``procs.stats``) and reads its stop mark, so a turn of a busy
   process (the writer answering one-message sends) pays one clock read for them.
   ``turn`` must return within ``MAX_TURN_MS`` (wait on sockets with a timeout, never
   spin, never sleep in place of waiting for a condition);
5. ``teardown`` runs on the way out, then the process exits 0. A crash exits non-zero
   and the supervisor restarts the service with back-off.

Each service module defines one ``Service`` subclass named ``SERVICE``.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import signal
import sys
import time

import zmq
from multiprocess import forkserver

from rocketstore.procs import affinity
from rocketstore.wire.curve import Guard, ListenError
from rocketstore.procs.stats import ProcessStats
from rocketstore.shm.positions import PROC_STATE, PositionTable, ProcessState
from rocketstore.storage import file_modes
from rocketstore.storage.config import StoreConfig

MAX_TURN_MS = 200
TURN_MS = 10     # the loop's heartbeat, statistics and stop check come at most this often
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_CANNOT_LISTEN = 78     # EX_CONFIG: the supervisor stops the store at once
_PR_SET_PDEATHSIG = 1

log = logging.getLogger(__name__)


class Service:
    """Base of the store's processes; subclasses set ``name`` and override the hooks."""

    name = "service"

    def __init__(self, store_dir: str, config: StoreConfig):
        self.store_dir = store_dir
        self.config = config
        self.stopping = False
        self.table: PositionTable | None = None
        self.context: zmq.Context | None = None
        self.supervised = False     # True: stop when the table marks this process STOPPING
        self.stats = ProcessStats(self.name)   # published for procs.metrics
        self._guard: Guard | None = None

    def curve_guard(self) -> "Guard | None":
        """This process's CURVE server side (wire.curve), made on first use; None when
        the store has no ``curve_server_key``."""
        cfg = self.config
        if cfg.curve_server_key and self._guard is None:
            self._guard = Guard(self.context, cfg.curve_server_key, cfg.curve_authorized_keys,
                                self.stats)
        return self._guard

    def place(self) -> None:
        """Before ``serve``, in the process's own entry point: where it runs
        (``procs.affinity``). Nothing, for most processes."""

    def setup(self) -> None:
        """Open files and sockets (after the table and context exist)."""

    def turn(self) -> None:
        """One turn of the loop: wait (at most MAX_TURN_MS) for work, then do it."""
        raise NotImplementedError

    def teardown(self) -> None:
        """Finish cleanly: the last flush, the last replies, close everything."""

    # ---------------------------------------------------------------- the loop
    def serve(self) -> None:
        self.table = PositionTable.attach(self.store_dir, process=self.name)
        self.context = zmq.Context()
        try:
            self.setup()
            if self.supervised:
                gc.freeze()     # step 3 of the module's docstring
                self.stats.frozen = gc.get_freeze_count()
            due_ns = 0
            while not self.stopping:
                self.turn()
                now_ns = time.monotonic_ns()
                if now_ns >= due_ns:
                    due_ns = now_ns + TURN_MS * 1_000_000
                    self._housekeeping()
            self.teardown()
            self.stats.publish(self.store_dir)
        finally:
            if self._guard is not None:
                self._guard.close()
            self.context.destroy(linger=0)
            self.table.close()

    def _housekeeping(self) -> None:
        """The heartbeat, the statistics when due, and the supervisor's stop mark."""
        self.table.heartbeat(self.name)
        self.stats.publish_if_due(self.store_dir)
        if self.supervised and self._stop_requested():
            self.stopping = True

    def request_stop(self, *_: object) -> None:
        self.stopping = True

    def _stop_requested(self) -> bool:
        return self.table.get_process(self.name, PROC_STATE) == ProcessState.STOPPING


def _stop_signal_seen(signo: int, _frame: object) -> None:
    log.debug("%s seen: the supervisor stops the store's processes in order",
              signal.Signals(signo).name)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the fork server, or the
    supervisor when it started this process itself) dies; then let go of the fork
    server's "alive" pipe, so that the fork server outlives the supervisor by no more
    than the time it takes to read the pipe's end."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("PR_SET_PDEATHSIG unavailable: this process may outlive the supervisor")
    if os.getppid() != parent or parent == 1:
        os._exit(1)
    server = forkserver._forkserver         # multiprocess's (and CPython's) private state
    if not hasattr(server, "_forkserver_alive_fd"):
        log.warning("multiprocess keeps no fork server alive pipe where this store looks "
                    "for it: the fork server may outlive a killed supervisor")
        return
    alive = server._forkserver_alive_fd     # None unless forked by it
    if alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None


def configure_logging(store_dir: str, name: str) -> None:
    logging.basicConfig(
        level=os.environ.get("ROCKETSTORE_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr)


def run_service(module: str, store_dir: str, config: dict) -> None:
    """Entry point of a service process (the supervisor's forkserver target)."""
    die_with_parent()
    for signo in STOP_SIGNALS:          # step 2: the supervisor's table says when
        signal.signal(signo, _stop_signal_seen)
    service_class = importlib.import_module(module).SERVICE
    configure_logging(store_dir, service_class.name)
    service = service_class(store_dir, StoreConfig(**config))
    affinity.name_process(service.name)
    service.place()
    file_modes.use_umask(service.config.data_umask)
    service.supervised = True
    try:
        service.serve()
    except ListenError as e:
        log.critical("%s: %s", service.name, e)
        sys.exit(EXIT_CANNOT_LISTEN)
