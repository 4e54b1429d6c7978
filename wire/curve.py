"""CURVE on the store's TCP sockets: ZeroMQ's own encryption and client authentication.

A store with ``curve_server_key`` (its secret certificate, made by ``rocketstore keys``)
serves every TCP endpoint it binds (ingest, reader, HA) as a CURVE server: traffic is
encrypted, and a client is let in only when its public key is one of
``curve_authorized_keys`` (certificate files, or directories of ``*.key`` files,
comma-separated), checked by a ZAP handler in each process (``Guard``). Unix sockets
stay plain: the run directory's permissions (0700) guard them. Without CURVE the store
binds TCP to a loopback address only (``StoreConfig.validate``).

Refusals are logged at WARNING in the process that refused: an unknown key by the ZAP
handler (the key is named), a plain or otherwise failed handshake by the socket's
monitor (the endpoint and ZeroMQ's reason). A refused peer never reaches the loop: its
connection is closed during the handshake, and nothing else changes.

Clients (``Producer``, ``ReaderClient``, a slave's HA follower, the Spark source and
sink) take two files: the server's public certificate and their own secret one
(``client_options``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Iterable

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from rocketstore.wire import endpoints
from rocketstore.storage.errors import StoreConfigError

log = logging.getLogger(__name__)

ZAP_DOMAIN = b"rocketstore"
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
           zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def load_secret(path: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` z85 keys of a secret certificate. Raises
    ``StoreConfigError`` when the file cannot be read or holds no secret key."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise StoreConfigError(f"cannot read the CURVE certificate {path}: {e}") from None
    if not secret:
        raise StoreConfigError(f"{path} holds no secret key (the .key_secret file is needed)")
    return public, secret


def load_public(path: str) -> bytes:
    try:
        return zmq.auth.load_certificate(path)[0]
    except (OSError, ValueError) as e:
        raise StoreConfigError(f"cannot read the CURVE certificate {path}: {e}") from None


def authorized_keys(spec: str) -> frozenset[bytes]:
    """The public keys of ``spec``: comma-separated certificate files or directories
    (every ``*.key`` in them)."""
    keys = set()
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        paths: Iterable[str] = [item]
        if os.path.isdir(item):
            paths = [os.path.join(item, n) for n in sorted(os.listdir(item)) if n.endswith(".key")]
        keys.update(load_public(p) for p in paths)
    return frozenset(keys)


def client_options(socket: zmq.Socket, server_key: str | None, client_key: str | None) -> None:
    """Make ``socket`` a CURVE client of the server whose public certificate is
    ``server_key``, as the owner of the secret certificate ``client_key`` (both or
    neither). Call before ``connect``."""
    if not server_key and not client_key:
        return
    if not (server_key and client_key):
        raise ValueError("CURVE needs both the server's public key file and the client's "
                         "secret key file")
    public, secret = load_secret(client_key)
    socket.curve_serverkey = load_public(server_key)
    socket.curve_publickey = public
    socket.curve_secretkey = secret


class Guard:
    """One process's CURVE server side: ZAP authentication of client keys (a thread of
    pyzmq's), and a thread logging every refused handshake of the sockets it secured."""

    def __init__(self, context: zmq.Context, server_key: str, authorized: str, stats=None):
        self.public, self.secret = load_secret(server_key)
        self.allowed = authorized_keys(authorized)
        self.stats = stats
        self.auth = ThreadAuthenticator(context, log=logging.getLogger(__name__ + ".zap"))
        self.auth.start()
        self.auth.configure_curve_callback(ZAP_DOMAIN.decode(), credentials_provider=self)
        self.context = context
        self._monitors: list[zmq.Socket] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP: is this client's (z85) key authorized?"""
        if client_key in self.allowed:
            return True
        log.warning("CURVE: refused a client with key %s (not in curve_authorized_keys)",
                    client_key.decode(errors="replace"))
        if self.stats is not None:
            self.stats.add("curve_refused_total", 1, reason="unknown key")
        return False

    def bind(self, socket: zmq.Socket, address: str) -> None:
        """Bind ``socket`` to the TCP ``address`` as a CURVE server (endpoints bound
        before stay plain: options are taken at bind time), watching its handshakes."""
        socket.curve_server = True
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.zap_domain = ZAP_DOMAIN
        if not any(m is socket for m in self._monitors):
            self._monitors.append(socket.get_monitor_socket(_FAILED))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="curve-monitor",
                                                daemon=True)
                self._thread.start()
        socket.bind(address)

    def _watch(self) -> None:
        poller = zmq.Poller()
        for m in self._monitors:
            poller.register(m, zmq.POLLIN)
        while not self._stop.is_set():
            for m, _ in poller.poll(200):
                try:
                    event = recv_monitor_message(m, zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                log.warning("CURVE: a handshake on %s failed (%s, %s): connection refused",
                            event["endpoint"].decode(errors="replace"),
                            _event_name(event["event"]), event["value"])
                if self.stats is not None:
                    self.stats.add("curve_refused_total", 1, reason="handshake")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)
        for m in self._monitors:
            m.close(0)
        self.auth.stop()


def _event_name(event: int) -> str:
    for name in ("HANDSHAKE_FAILED_PROTOCOL", "HANDSHAKE_FAILED_AUTH",
                 "HANDSHAKE_FAILED_NO_DETAIL"):
        if event == getattr(zmq, f"EVENT_{name}"):
            return name
    return str(event)


class ListenError(Exception):
    """A socket cannot listen where the store's settings say (a port in use, an
    address this host does not have): no restart can help."""


def bind_all(socket: zmq.Socket, addresses: list[str], guard: Guard | None) -> None:
    """Bind every address; TCP ones through ``guard`` when the store has CURVE.
    Raises ``ListenError`` naming the address a bind refused."""
    for address in addresses:
        endpoints.allow_ipv6(socket, address)
        try:
            if guard is not None and address.startswith("tcp://"):
                guard.bind(socket, address)
            else:
                socket.bind(address)
        except zmq.ZMQError as e:
            hint = ("check tcp_listen_address, listen_port (the reader takes "
                    "listen_port - 2) and ha_listen_port" if address.startswith("tcp://")
                    else "check the store's run directory")
            raise ListenError(f"cannot listen on {address}: {e.strerror} ({hint})") from None


def make_keys(directory: str, clients: list[str]) -> list[str]:
    """``rocketstore keys``: a server key pair (``server.key``, ``server.key_secret``)
    and one pair per client name in ``directory`` (made 0700), every file 0600. Refuses
    (``FileExistsError``) to overwrite a key file. Returns the files written."""
    names = ["server"] + list(clients)
    bad = [n for n in names if not n or "/" in n or n.startswith(".")]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"client names must be distinct plain file names, not 'server': {bad or names}")
    existing = [os.path.join(directory, n + ext) for n in names for ext in (".key", ".key_secret")
                if os.path.exists(os.path.join(directory, n + ext))]
    if existing:
        raise FileExistsError(f"{existing[0]} exists: keys are never overwritten")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    written = []
    old = os.umask(0o077)
    try:
        for name in names:
            for path in zmq.auth.create_certificates(directory, name):
                os.chmod(path, 0o600)
                written.append(path)
    finally:
        os.umask(old)
    return written


def key_settings(directory: str, clients: list[str]) -> dict:
    """The settings that use the keys ``make_keys`` made in ``directory``, as absolute
    paths (a settings file reads relative ones from its own directory): ``store``, the
    store's ``curve_server_key`` and ``curve_authorized_keys`` naming every client's
    public key; ``clients``, per client name, the ``curve_server_key`` and
    ``curve_client_key`` it passes (Producer, ReaderClient; Spark's curveServerKey and
    curveClientKey)."""
    d = os.path.abspath(directory)
    public = ",".join(os.path.join(d, f"{name}.key") for name in clients)
    return {"store": {"curve_server_key": os.path.join(d, "server.key_secret"),
                      "curve_authorized_keys": public},
            "clients": {name: {"curve_server_key": os.path.join(d, "server.key"),
                               "curve_client_key": os.path.join(d, f"{name}.key_secret")}
                        for name in clients}}
