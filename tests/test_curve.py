"""CURVE on the store's TCP sockets: real key files, a real store, real clients.

A store serving TCP with CURVE lets in clients whose public key it lists and no one
else: an unlisted key and a plain (NULL mechanism) client get nothing, and learn so at
once from their own side of the failed handshake (HandshakeRefusedError, not a
timeout); the refusal is in the store's log, and the store goes on serving everyone
else. Unix sockets stay plain.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from rocketstore.spark.access import RemoteStore
from rocketstore.client import ClientError, HandshakeRefusedError, Producer, ReaderClient
from rocketstore.shm.positions import Slot
from rocketstore.storage import StoreConfig
from rocketstore.storage.errors import StoreConfigError
from rocketstore.storage.status import PutMessageStatus
from store_processes import RunningStore, cli, free_ports, wait_for


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("keys") / "keys")
    r = cli("keys", "--dir", d, "--client", "alice", "--client", "mallory")
    assert r.returncode == 0, r.stderr
    return d


def test_keys_are_private_files_never_overwritten(keys):
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
    names = sorted(os.listdir(keys))
    assert names == ["alice.key", "alice.key_secret", "mallory.key", "mallory.key_secret",
                     "server.key", "server.key_secret"]
    assert all(stat.S_IMODE(os.stat(os.path.join(keys, n)).st_mode) == 0o600 for n in names)
    before = open(os.path.join(keys, "server.key_secret")).read()
    r = cli("keys", "--dir", keys)
    assert r.returncode == 1 and "never overwritten" in r.stderr
    assert open(os.path.join(keys, "server.key_secret")).read() == before


def test_the_settings_keys_prints_let_every_client_in(tmp_path):
    """``keys --client slave --client app`` printed curve_authorized_keys naming the
    first client only: the second was refused with nothing but a timeout. The store
    lines it prints, pasted as they are, let in every client made."""
    d = str(tmp_path / "keys")
    r = cli("keys", "--dir", d, "--client", "slave", "--client", "app")
    assert r.returncode == 0, r.stderr
    pasted = dict(line.split(" = ", 1) for line in r.stdout.splitlines()
                  if line.startswith(("curve_server_key = ", "curve_authorized_keys = ")))
    assert set(pasted) == {"curve_server_key", "curve_authorized_keys"}
    store = {k: v.strip('"') for k, v in pasted.items()}
    assert store["curve_authorized_keys"] == f"{d}/slave.key,{d}/app.key"
    as_json = cli("keys", "--dir", str(tmp_path / "more"), "--client", "a", "--json")
    settings = json.loads(as_json.stdout)
    assert settings["clients"]["a"] == {"curve_server_key": str(tmp_path / "more/server.key"),
                                        "curve_client_key": str(tmp_path / "more/a.key_secret")}
    port = free_ports(-2, 0)
    with RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port, **store):
        for name in ("slave", "app"):
            with Producer(f"tcp://127.0.0.1:{port}", timeout_ms=5000,
                          curve_server_key=f"{d}/server.key",
                          curve_client_key=f"{d}/{name}.key_secret") as p:
                assert p.send("Both", name.encode()).ok, name


def test_only_listed_keys_get_in(tmp_path, keys):
    port = free_ports(-2, 0)
    k = lambda name: os.path.join(keys, name)    # noqa: E731
    with RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port,
                      curve_server_key=k("server.key_secret"),
                      curve_authorized_keys=k("alice.key")) as store:
        tcp = f"tcp://127.0.0.1:{port}"
        alice = dict(curve_server_key=k("server.key"), curve_client_key=k("alice.key_secret"))
        with Producer(tcp, **alice) as p:
            assert p.send("Safe", b"from alice").status is PutMessageStatus.PUT_OK
        with Producer(store.store_dir) as p:                   # the Unix socket: plain
            assert p.send("Safe", b"from this host").status is PutMessageStatus.PUT_OK
        mallory = dict(curve_server_key=k("server.key"),
                       curve_client_key=k("mallory.key_secret"))
        reader = f"tcp://127.0.0.1:{port - 2}"
        refused = f"the store at {tcp} refused this client's key"
        requires = "requires CURVE: give curve_server_key"
        for make, ask, words in (
                (lambda: Producer(tcp, **mallory), _send, refused),
                (lambda: Producer(tcp), _send, f"the store at {tcp} {requires}"),
                (lambda: ReaderClient(reader), _offsets, f"the store at {reader} {requires}"),
                (lambda: RemoteStore(tcp, 30_000), _bounds, f"the store at {reader} {requires}"),
                (lambda: Producer(tcp, curve_server_key=k("mallory.key"),    # not the store's
                                  curve_client_key=k("alice.key_secret")), _send,
                 "is curve_server_key that store's public certificate?")):
            error, took = _refused(make, ask)
            assert isinstance(error, HandshakeRefusedError) and words in str(error), error
            assert took < 3, (took, error)            # the timeout is 10 s (Spark's 30 s)
        wait_for(lambda: "not in curve_authorized_keys" in store.log()
                 and "handshake on tcp://127.0.0.1" in store.log(), 10,
                 what="both refusals in the log")
        with ReaderClient(reader, **alice) as rc:
            offsets = {q.queue_id: q.max_offset for q in rc.offsets(["Safe"])}
        assert sum(offsets.values()) == 2
        with RemoteStore(tcp, 5000, (alice["curve_server_key"], alice["curve_client_key"])) as rs:
            assert sum(b.max_offset for b in rs.bounds(["Safe"])) == 2
        assert store.restarts("writer") == store.restarts("reader") == 0


def _send(p):
    p.send("Safe", b"refused")


def _offsets(rc):
    rc.offsets(["Safe"])


def _bounds(rs):
    rs.bounds(["Safe"])


def _refused(make, ask) -> tuple[ClientError, float]:
    """The error a client made by ``make()`` meets at its first request ``ask``, and
    the seconds from making it."""
    start = time.monotonic()
    with make() as client:
        with pytest.raises(ClientError) as caught:
            ask(client)
    return caught.value, time.monotonic() - start


def test_listening_beyond_loopback_needs_curve(keys):
    with pytest.raises(StoreConfigError, match="needs CURVE"):
        StoreConfig(tcp_listen_address="10.1.2.3")
    cfg = StoreConfig(tcp_listen_address="10.1.2.3",
                      curve_server_key=os.path.join(keys, "server.key_secret"),
                      curve_authorized_keys=keys)
    assert cfg.tcp_listen_address == "10.1.2.3"
    with pytest.raises(StoreConfigError, match="go together"):
        StoreConfig(curve_server_key=os.path.join(keys, "server.key_secret"))



def _ipv6_loopback() -> bool:
    import socket
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_store_listens_on_ipv6_and_clients_find_every_socket(tmp_path):
    """``tcp_listen_address = "::1"`` was accepted, but no socket allowed IPv6 and the
    address had no brackets: the writer and reader failed at every start and the store
    stopped. Clients find the right socket from a store's address; a ReaderClient
    given the ingest socket's own address says so by name."""
    if not _ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback: listening on ::1 not tried")
    from rocketstore.wire import endpoints
    from rocketstore.client import ClientError
    port = free_ports(-2, 0)
    with RunningStore(tmp_path, tcp_listen_address="::1", listen_port=port) as store:
        where = endpoints.resolve(f"tcp://[::1]:{port}")
        assert where == (f"tcp://[::1]:{port}", f"tcp://[::1]:{port - 2}")
        with Producer(where.ingest) as p:
            assert p.send("Six", b"over ::1").ok
        with Producer(f"ipc://{store.store_dir}") as p:            # a store's directory
            assert p.send("Six", b"over its Unix socket").ok
        # dispatch is asynchronous (as RocketMQ's reput): a PUT_OK message is in the
        # CommitLog, and in the queue's offsets once DISPATCHED passes it
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        with ReaderClient(where.reader) as rc:
            assert sum(q.max_offset for q in rc.offsets(["Six"])) == 2
        with ReaderClient(where.ingest) as rc, pytest.raises(ClientError, match="ingest"):
            rc.offsets(["Six"])
        assert store.restarts("writer") == store.restarts("reader") == 0
