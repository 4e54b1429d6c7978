"""Where a client finds a store's sockets, from one address a user can write down.

    endpoint                       ingest (writer)                 reader
    -----------------------------  ------------------------------  ------------------------------
    ipc:///path/to/store           ipc://{run_dir(store)}/ingest   ipc://{run_dir(store)}/reader
                                   .sock                           .sock
    ipc:///path/to/store/run       ipc:///path/to/store/run/       ipc:///path/to/store/run/
    (a directory holding the       ingest.sock                     reader.sock
    sockets)
    tcp://host:port                tcp://host:port                 tcp://host:port-2

A store's TCP ports follow RocketMQ's broker: ingest on ``listen_port`` (10911), the
reader on RocketMQ's fast port ``listen_port - 2`` (10909), and a master's HA socket,
when set, on RocketMQ's ``listen_port + 1`` (10912); a client names the ingest port
alone. A store directory is told from a socket directory by its ``config`` or ``commitlog``
subdirectory; ``shm.bus.run_dir`` decides where a store's sockets live (a short
directory under /tmp when the store's path is too long for a Unix socket name). An
IPv6 host is written in brackets (``tcp://[::1]:10911``); a socket binds or connects to
one only after ``allow_ipv6`` (ZeroMQ will not use IPv6 by default, and a socket that
may would show its IPv4 peers as ``::ffff:a.b.c.d``, so it is set only where needed).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import zmq

from rocketstore.shm import bus
from rocketstore.storage.config import READER_PORT_OFFSET


class Endpoints(NamedTuple):
    ingest: str
    reader: str


def resolve(endpoint: str) -> Endpoints:
    """The ingest and reader addresses ``endpoint`` names. Raises ``ValueError`` for
    an address of another form."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):].rstrip("/") or "/"
        if is_store_dir(path):
            return Endpoints(bus.endpoint(path, "ingest", create=False),
                             bus.endpoint(path, "reader", create=False))
        return Endpoints(f"ipc://{path}/ingest.sock", f"ipc://{path}/reader.sock")
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not host or not port.isdigit() or \
                not 1 - READER_PORT_OFFSET <= int(port) <= 65535:
            raise ValueError(f"endpoint {endpoint!r}: expected tcp://host:port, the store's "
                             f"listen_port, in {1 - READER_PORT_OFFSET}..65535 (the reader "
                             "listens on port - 2)")
        return Endpoints(f"tcp://{host}:{port}",
                         f"tcp://{host}:{int(port) + READER_PORT_OFFSET}")
    meant = tcp_meant(endpoint)
    raise ValueError(f"endpoint {endpoint!r}: expected ipc://DIR (a store or its socket "
                     "directory) or tcp://host:port"
                     + (f"; did you mean {meant}?" if meant else ""))


_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")


def tcp_meant(text: str) -> str | None:
    """``tcp://host:port`` for a ``host:port`` written without its scheme (ZeroMQ
    takes no address without one); None for anything else."""
    return f"tcp://{text}" if _HOST_PORT.fullmatch(text) else None


def tcp_address(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def allow_ipv6(socket: zmq.Socket, address: str) -> None:
    """Let ``socket`` use IPv6 when ``address`` (to bind or connect) is an IPv6 one;
    call it first."""
    if address.startswith("tcp://["):
        socket.setsockopt(zmq.IPV6, 1)


def bind_addresses(store_dir: str, name: str, tcp_listen_address: str,
                   listen_port: int) -> list[str]:
    """Where the store's ``ingest`` or ``reader`` socket listens: its Unix socket, and
    ``tcp://{tcp_listen_address}:{port}`` too when that is set (``listen_port`` for
    ingest, ``listen_port - 2`` for the reader), the addresses ``resolve`` gives."""
    addresses = [bus.endpoint(store_dir, name)]
    if tcp_listen_address:
        port = listen_port + (READER_PORT_OFFSET if name == "reader" else 0)
        addresses.append(tcp_address(tcp_listen_address, port))
    return addresses


def is_store_dir(path: str) -> bool:
    """Whether ``path`` is a store's directory rather than a socket directory."""
    return any(os.path.isdir(os.path.join(path, sub)) for sub in ("config", "commitlog"))
