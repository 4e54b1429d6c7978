"""Clients of a running store: ``Producer`` (the writer's ingest socket), ``Consumer``
(the mapped files, directly) and ``ReaderClient`` (the reader socket, for clients that
cannot map the files).

    from procs.client import Producer, Consumer
    with Producer("store") as p:
        r = p.send("Orders", b"order 42", tags="created", keys=["order-42"])
        r.status.name, r.msg_id, r.queue_id, r.queue_offset, r.commit_log_offset
    with Consumer("store", "billing", "Orders") as c:
        for m in c.poll(max_msgs=32, timeout_ms=1000):
            ...
        c.commit()

Each client owns its ZeroMQ context and sockets and must be used from one thread. A
request that gets no answer within ``timeout_ms`` raises ``RequestTimeout``: its outcome
is unknown (the store may have stored it); send it again only if duplicates are fine.
"""

from __future__ import annotations

import itertools
import time
from typing import Iterable, Sequence

import zmq

from procs import protocol
from procs.consumer import Consumer
from shm import bus
from storage.message import Message

__all__ = ["ClientError", "Consumer", "PendingSend", "Producer", "ReaderClient", "RequestTimeout"]


class ClientError(Exception):
    """The store answered with an error frame, or could not be reached."""


class RequestTimeout(ClientError):
    """No answer in time: the request's outcome is unknown."""


def _endpoint(store_or_endpoint: str, socket_name: str) -> str:
    if "://" in store_or_endpoint:
        return store_or_endpoint
    return bus.endpoint(store_or_endpoint, socket_name)


class _Dealer:
    """A DEALER socket with request ids and a window of requests in flight."""

    def __init__(self, endpoint: str, timeout_ms: int):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self.replies: dict[int, bytes] = {}

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: bytes) -> None:
        self.socket.send(frame, copy=len(frame) < 65536)

    def receive(self, request_id: int) -> bytes:
        """The reply to ``request_id`` (others that arrive first are kept)."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while request_id not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000) + 1):
                raise RequestTimeout(f"no answer to request {request_id} within "
                                     f"{self.timeout_ms} ms; its outcome is unknown")
            frame = self.socket.recv()
            self.replies[protocol.peek_header(frame).request_id] = frame
        return self.replies.pop(request_id)

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def _raise_if_error(frame: bytes) -> None:
    if protocol.peek_header(frame).kind == protocol.Kind.ERROR:
        err = protocol.decode_error(frame)
        raise ClientError(f"{err.code.name}: {err.message}")


class Producer:
    """Sends messages to the store's writer.

    ``window`` bounds the batches in flight for ``send_async``; the writer answers
    OS_PAGECACHE_BUSY ("busy") to a client that sends more than it accepts.
    """

    def __init__(self, store_dir_or_endpoint: str, *, timeout_ms: int = 10_000,
                 window: int = 16):
        self._dealer = _Dealer(_endpoint(store_dir_or_endpoint, "ingest"), timeout_ms)
        self.window = window
        self._in_flight: list[int] = []
        self._done: dict[int, list[protocol.SendResult] | Exception] = {}

    def send(self, topic: str, body: bytes, tags: str | None = None,
             keys: Sequence[str] | None = None, properties: dict[str, str] | None = None,
             queue_id: int | None = None, delay_level: int = 0) -> protocol.SendResult:
        """Send one message and wait for its result."""
        msg = Message(topic=topic, body=body, tags=tags, keys=list(keys) if keys else None,
                      properties=dict(properties or {}), queue_id=queue_id,
                      delay_level=delay_level)
        return self.send_batch([msg])[0]

    def send_batch(self, messages: Sequence[Message]) -> list[protocol.SendResult]:
        """Send messages in one frame; one result each, in order. A message's
        ``queue_id`` is honoured; set it to None to let the store choose."""
        return self.send_async(messages).result()

    def send_async(self, messages: Sequence[Message]) -> "PendingSend":
        """Send without waiting; at most ``window`` batches stay unanswered (older
        ones are waited for first). ``result()`` on the returned handle waits."""
        while len(self._in_flight) >= self.window:
            self._settle(self._in_flight[0])
        request_id = self._dealer.next_id()
        self._dealer.send(protocol.encode_send(request_id, list(messages)))
        self._in_flight.append(request_id)
        return PendingSend(self, request_id)

    def _settle(self, request_id: int) -> None:
        """Wait for one batch and keep its outcome for its handle's ``result()``."""
        try:
            self._done[request_id] = self._complete(request_id)
        except ClientError as e:
            self._done[request_id] = e

    def _result(self, request_id: int) -> list[protocol.SendResult]:
        outcome = self._done.pop(request_id) if request_id in self._done \
            else self._complete(request_id)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _complete(self, request_id: int) -> list[protocol.SendResult]:
        try:
            frame = self._dealer.receive(request_id)
        finally:
            if request_id in self._in_flight:
                self._in_flight.remove(request_id)
        _raise_if_error(frame)
        return protocol.decode_send_reply(frame)[1]

    def flush(self) -> None:
        """Wait for every batch in flight (their handles still give their results)."""
        for request_id in list(self._in_flight):
            self._settle(request_id)

    def close(self) -> None:
        self._dealer.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PendingSend:
    def __init__(self, producer: Producer, request_id: int):
        self._producer, self.request_id = producer, request_id
        self._results: list[protocol.SendResult] | None = None

    def result(self) -> list[protocol.SendResult]:
        if self._results is None:
            self._results = self._producer._result(self.request_id)
        return self._results


class ReaderClient:
    """Pulls and queries through the reader socket (no file access needed)."""

    def __init__(self, store_dir_or_endpoint: str, *, timeout_ms: int = 10_000):
        self._dealer = _Dealer(_endpoint(store_dir_or_endpoint, "reader"), timeout_ms)

    def _ask(self, frame: bytes, request_id: int) -> bytes:
        self._dealer.send(frame)
        reply = self._dealer.receive(request_id)
        _raise_if_error(reply)
        return reply

    def pull(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
             timeout_ms: int = 0) -> protocol.PullReply:
        rid = self._dealer.next_id()
        return protocol.decode_pull_reply(self._ask(
            protocol.encode_pull(rid, topic, queue_id, offset, max_msgs, timeout_ms), rid))

    def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                     end_ms: int = protocol.INT64_MAX) -> list:
        rid = self._dealer.next_id()
        return protocol.decode_query_reply(self._ask(
            protocol.encode_query_by_key(rid, topic, key, max_num, begin_ms, end_ms), rid))[1]

    def query_by_msg_id(self, msg_id: str) -> list:
        rid = self._dealer.next_id()
        return protocol.decode_query_reply(self._ask(
            protocol.encode_query_by_msg_id(rid, msg_id), rid))[1]

    def query_by_offset(self, commit_log_offset: int) -> list:
        rid = self._dealer.next_id()
        return protocol.decode_query_reply(self._ask(
            protocol.encode_query_by_offset(rid, commit_log_offset), rid))[1]

    def close(self) -> None:
        self._dealer.close()

    def __enter__(self) -> "ReaderClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def message_batches(messages: Iterable[Message], size: int) -> Iterable[list[Message]]:
    batch: list[Message] = []
    for m in messages:
        batch.append(m)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
