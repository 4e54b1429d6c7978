"""Clients aimed at the wrong place fail at once, naming what is wrong (client.reach).

Each case used to wait the client's whole timeout (10 s; 30 s for Spark's endpoint)
and then call the request's outcome unknown, and a directory or ``host:port`` given by
mistake was left with a ``run/`` directory in it. Here every case must raise a named
``StoreUnreachableError`` (a ``ClientError``) well inside ``AT_ONCE_S``, and make
nothing. Real stores, real sockets; the CURVE store's cases are in tests/test_curve.py.
"""

from __future__ import annotations

import os
import time

import pytest
import zmq

from rocketstore import (
    BadAddressError, ClientError, Consumer, HandshakeRefusedError, NoListenerError,
    NoStoreError, Producer, ReaderClient, RequestTimeout, StoreUnreachableError)
from rocketstore.shm import bus
from rocketstore.shm.positions import PositionTableError, Slot
from rocketstore.spark.access import RemoteStore
from rocketstore.wire import curve
from store_processes import RunningStore, free_port, free_ports, wait_for

AT_ONCE_S = 3.0      # against the clients' 10 s (Spark's 30 s) timeout


def failing(make, *calls):
    """Make a client with ``make()`` and run each of ``calls`` on it (none: making it
    must fail); returns the error and the seconds it took. The client is closed."""
    start = time.monotonic()
    client = None
    try:
        client = make()
        for call in calls:
            call(client)
    except ClientError as e:
        return e, time.monotonic() - start
    finally:
        if client is not None:
            client.close()
    raise AssertionError("no error")


def send(p):
    p.send("T", b"x")


def offsets(rc):
    rc.offsets(["T"])


def bounds(rs):
    rs.bounds(["T"])


def test_a_directory_that_does_not_exist_is_named_and_nothing_is_made(tmp_path):
    stor = str(tmp_path / "stor")
    for make, calls in ((lambda: Producer(stor), (send,)),
                        (lambda: ReaderClient(stor), (offsets,)),
                        (lambda: Consumer(stor, "g", "T"), ()),
                        (lambda: Producer(f"ipc://{stor}"), (send,))):
        e, took = failing(make, *calls)
        assert isinstance(e, NoStoreError) and isinstance(e, StoreUnreachableError)
        assert isinstance(e, PositionTableError)     # what a Consumer raised for it before
        assert took < AT_ONCE_S, took
        assert "no store at" in str(e) and "does not exist" in str(e), e
        assert not os.path.exists(stor)
    assert f"`rocketstore up --store {stor}` makes one there" in str(
        failing(lambda: Producer(stor))[0])


def test_a_stopped_store_is_told_from_a_directory_holding_none(tmp_path):
    """A store's directory whose store is stopped: "no store running", and `up` starts
    it; a directory holding no store says that. Neither gets anything new in it."""
    store = RunningStore(tmp_path)
    with store:
        with Producer(store.store_dir) as p:
            assert p.send("T", b"x").ok
    before = sorted(os.listdir(store.store_dir))
    for make, calls in ((lambda: Producer(store.store_dir), (send,)),
                        (lambda: ReaderClient(store.store_dir), (offsets,)),
                        (lambda: Consumer(store.store_dir, "g", "T"), ())):
        e, took = failing(make, *calls)
        assert isinstance(e, NoStoreError) and took < AT_ONCE_S, (e, took)
        assert f"no store running at {store.store_dir}" in str(e), e
        assert f"`rocketstore up --store {store.store_dir}` starts it" in str(e), e
    assert sorted(os.listdir(store.store_dir)) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    e, took = failing(lambda: Producer(str(empty)), send)
    assert isinstance(e, NoStoreError) and took < AT_ONCE_S
    assert "the directory holds no store" in str(e), e
    assert os.listdir(empty) == []


def test_host_and_port_without_a_scheme_is_not_an_address(tmp_path, monkeypatch):
    """``localhost:10911`` was a store directory to make: it now asks for tcp://."""
    monkeypatch.chdir(tmp_path)
    for make in (lambda: Producer("localhost:10911"),
                 lambda: ReaderClient("localhost:10911"),
                 lambda: RemoteStore("localhost:10911")):
        e, took = failing(make)
        assert isinstance(e, BadAddressError) and isinstance(e, ValueError)
        assert "did you mean tcp://localhost:10911?" in str(e), e
        assert took < AT_ONCE_S
    assert os.listdir(tmp_path) == []
    for bad, why in (("http://h:1", "not supported"), ("tcp://localhost", "Invalid")):
        e, _ = failing(lambda: Producer(bad))
        assert isinstance(e, BadAddressError) and why in str(e), e


def test_nothing_listening_at_a_tcp_port_is_named_at_the_first_request():
    """Refused at once; again at every later call; and what was queued never goes out:
    a socket bound there afterwards gets a raw DEALER's message that waited as the
    Producer's did, and not the Producer's."""
    port = free_ports(-2, 0)
    tcp = f"tcp://127.0.0.1:{port}"
    reader = f"tcp://127.0.0.1:{port - 2}"    # Spark's endpoint: the reader's port
    for make, calls, there in ((lambda: Producer(tcp), (send,), tcp),
                               (lambda: ReaderClient(tcp), (offsets,), tcp),
                               (lambda: RemoteStore(tcp, 30_000), (bounds,), reader)):
        e, took = failing(make, *calls)
        assert isinstance(e, NoListenerError) and took < AT_ONCE_S, (e, took)
        assert f"nothing listening at {there}" in str(e) and "refused" in str(e), e
    ctx = zmq.Context()
    control = ctx.socket(zmq.DEALER)
    control.linger = 0
    control.connect(tcp)
    control.send(b"control")
    producer = Producer(tcp)
    try:
        with pytest.raises(NoListenerError):
            producer.send("T", b"refused")
        start = time.monotonic()
        with pytest.raises(NoListenerError):
            producer.send_async([_message()])
        assert time.monotonic() - start < 0.5
        router = ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.bind(tcp)
        got = wait_for(lambda: router.poll(100) and router.recv_multipart(), 10,
                       what="the control's message")
        assert got[-1] == b"control"
        assert not router.poll(1000), "the refused Producer's request went out later"
        router.close()
    finally:
        producer.close()
        control.close()
        ctx.term()


def _message():
    from rocketstore import Message
    return Message(topic="T", body=b"queued")


def test_a_running_store_still_answers_and_a_slow_one_still_times_out(tmp_path):
    """The checks cost a working client nothing it can see, and silence is still only
    a timeout. A running store whose ingest socket refuses (its file moved away, as
    while the writer restarts) is waited for, not called absent, and answers once the
    socket is back; a peer that takes the connection but never answers (a bare
    ROUTER) gets RequestTimeout."""
    port = free_ports(-2, 0)
    with RunningStore(tmp_path, tcp_listen_address="127.0.0.1", listen_port=port) as store:
        for where in (store.store_dir, f"ipc://{store.store_dir}",
                      f"tcp://127.0.0.1:{port}"):
            with Producer(where) as p:
                assert p.send("T", b"x").ok
        ingest = os.path.join(bus.run_dir(store.store_dir, create=False), "ingest.sock")
        os.rename(ingest, ingest + ".away")
        try:
            with Producer(store.store_dir, timeout_ms=1500) as p:
                with pytest.raises(RequestTimeout, match="no connection to ipc://"):
                    p.send("T", b"waited for")
                os.rename(ingest + ".away", ingest)
                p.timeout_ms = 10_000
                assert p.send("T", b"after").ok
        finally:
            if os.path.exists(ingest + ".away"):
                os.rename(ingest + ".away", ingest)
        wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN),
                 what="dispatch")
        with ReaderClient(f"tcp://127.0.0.1:{port - 2}") as rc:
            assert sum(q.max_offset for q in rc.offsets(["T"])) == 5
        keys = str(tmp_path / "keys")
        curve.make_keys(keys, ["alice"])
        e, took = failing(lambda: Producer(
            f"tcp://127.0.0.1:{port}", curve_server_key=os.path.join(keys, "server.key"),
            curve_client_key=os.path.join(keys, "alice.key_secret")), send)
        assert isinstance(e, HandshakeRefusedError) and took < AT_ONCE_S, (e, took)
        assert f"the store at tcp://127.0.0.1:{port} does not use CURVE" in str(e), e
    silent_port = free_port()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(f"tcp://127.0.0.1:{silent_port}")
    try:
        with Producer(f"tcp://127.0.0.1:{silent_port}", timeout_ms=800) as p, \
                pytest.raises(RequestTimeout, match="outcome is unknown"):
            p.send("T", b"never answered")
    finally:
        router.close()
        ctx.term()
