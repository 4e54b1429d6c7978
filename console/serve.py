"""Running the dashboard: ``rocketstore dashboard`` in the foreground
(``serve_forever``), or the supervised ``dashboard`` process of ``rocketstore up`` when
``dashboard_port`` is set (``DashboardService``, which the supervisor starts by its
module name, as it starts every process).

Either way uvicorn serves the application on ``dashboard_address:dashboard_port``,
loopback by default (``StoreConfig`` refuses any other address without
``dashboard_auth``). The server runs in its own thread of the dashboard's own process:
the store's processes only ever see it read the files and the position table, as
``rocketstore status`` does.

Restart decision table of the supervised process:

    on start        it rebuilds             from
    --------------  ----------------------  --------------------------------------------
    any             the rates' history      nothing: the charts start empty and fill as
                                            the processes publish (every 5 s a point)
    port taken, or  nothing                 the error is logged and the process idles:
    a bad auth                              the store runs without a dashboard (as
    file                                    without metrics), ``status`` shows it RUNNING
"""

from __future__ import annotations

import logging
import signal
import socket
import threading

import uvicorn

from rocketstore.console.app import create_app
from rocketstore.console.safety import AuthFileError
from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.storage import StoreConfig

log = logging.getLogger(__name__)


def listening_socket(address: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (IPv4 or IPv6 by the address). Raises ``OSError``
    when it cannot be bound (the port taken, the address not this host's)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and a
    # response's header and body, written apart, would wait out the client's delayed
    # ACK (40 ms a request on a kept-alive connection)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_server(config: StoreConfig) -> uvicorn.Server:
    """uvicorn's server of the dashboard of ``config``'s store (not started)."""
    return uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning",
                                         access_log=False, lifespan="on",
                                         timeout_graceful_shutdown=2))


def serve_forever(config: StoreConfig, ready=None) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's own handlers). Raises ``OSError`` when
    the address cannot be bound; ``ready(url)`` is called once it is."""
    sock = listening_socket(config.dashboard_address, config.dashboard_port)
    server = make_server(config)
    if ready:
        ready(url(config.dashboard_address, sock.getsockname()[1]))
    # uvicorn stops on the signal, then raises it again under the handlers it found:
    # these make that second delivery a no-op, so a stop asked for is a clean exit (0)
    for signo in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signo, lambda *_: None)
    server.run(sockets=[sock])


def url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/"


class DashboardService(Service):
    """The supervised process: uvicorn on a thread; the loop's turn waits on that
    thread, so a server that stopped by itself ends the process (and the supervisor
    restarts it)."""

    name = "dashboard"

    def setup(self) -> None:
        cfg = self.config
        self._thread = None
        self._idle = threading.Event()
        try:
            self._server = make_server(cfg)
            sock = listening_socket(cfg.dashboard_address, cfg.dashboard_port)
        except (OSError, AuthFileError) as e:
            log.error("no dashboard on %s:%d: %s; the store runs without it",
                      cfg.dashboard_address, cfg.dashboard_port, e)
            return
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="dashboard-server", daemon=True)
        self._thread.start()
        log.info("dashboard on %s", url(cfg.dashboard_address, cfg.dashboard_port))

    def turn(self) -> None:
        if self._thread is None:
            self._idle.wait(MAX_TURN_MS / 2000)
            return
        self._thread.join(MAX_TURN_MS / 2000)
        if not self._thread.is_alive():
            raise RuntimeError("the dashboard's server stopped by itself")

    def teardown(self) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)


SERVICE = DashboardService
