"""A store whose proxy serves RocketMQ 5's gRPC API, for the test modules that talk to it
with the official client (one store per module: a start costs seconds)."""

from __future__ import annotations

import contextlib

import grpc

from store_processes import RunningStore, free_port, wait_for


@contextlib.contextmanager
def proxied_store(path, **settings):
    """A RunningStore at ``path`` with ``settings`` and a free ``grpc_listen_port``
    (``grpc_port`` on it), once its proxy serves; stopped when the block ends."""
    port = free_port()
    rs = RunningStore(path, grpc_listen_port=port, **settings)
    rs.grpc_port = port
    with rs:
        wait_for(lambda: serving(port), what="the proxy to serve gRPC")
        yield rs


def serving(port: int) -> bool:
    """Whether a gRPC server answers on loopback ``port`` now."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=0.5)
            return True
        except grpc.FutureTimeoutError:
            return False
