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
    with ReaderClient("store") as rc:              # or "tcp://host:port" (see below)
        for q in rc.offsets(["Orders"]):           # protocol.QueueOffsets
            r = rc.fetch(q.topic, q.queue_id, q.min_offset, 4096, 8 << 20)
            ...                                    # r.records: raw CommitLog records
            rc.commit_offsets("billing", q.topic, {q.queue_id: r.next_begin_offset})

Where: a store directory, or ``ipc://`` naming a store or its socket directory
(``procs.endpoints``), finds the right socket for each client. A ``tcp://host:port`` (or
an ``ipc://...sock``) address is the socket's own: the store's ``listen_port`` for a
Producer, ``listen_port + 1`` for a ReaderClient (``endpoints.resolve`` gives both
from the store's address, as the Spark format does).

A Producer or ReaderClient owns its ZeroMQ context and sockets and must be used from
one thread (a Consumer may be shared: its calls take turns). A request that gets no
answer within ``timeout_ms`` raises ``RequestTimeout``: its outcome
is unknown (the store may have stored it); send it again only if duplicates are fine,
or from an idempotent producer, whose resends the store stores once:

    with Producer("store", idempotent=True) as p:   # or producer_id=<your u64 != 0>
        first = p.next_sequence
        handle = p.send_async(batch)                # sequences first .. first+len-1
        ...                                         # a timeout, or OUT_OF_ORDER_SEQUENCE:
        p.send_async(unacknowledged, first_sequence=first_unacknowledged)
"""

from __future__ import annotations

import itertools
import secrets
import struct
import time
from typing import Iterable, Sequence

import zmq

from procs import curve, endpoints, protocol
from procs.consumer import Consumer
from shm import bus
from storage import record_batch
from storage.message import Message, now_ms
from storage.read_path import subscription_tags

__all__ = ["ClientError", "Consumer", "PendingSend", "Producer", "ReaderClient", "RequestTimeout"]


class ClientError(Exception):
    """The store answered with an error frame, or could not be reached."""


class RequestTimeout(ClientError):
    """No answer in time: the request's outcome is unknown."""


def _endpoint(store_or_endpoint: str, socket_name: str) -> str:
    """The address of socket ``socket_name`` (``ingest`` or ``reader``): of a store
    directory, or of an ``ipc://`` store or socket directory; any other address (a
    ``tcp://`` one, an ``ipc://`` socket file) as it is."""
    where = store_or_endpoint
    if where.startswith("ipc://") and not where.endswith(".sock"):
        return getattr(endpoints.resolve(where), socket_name)
    if "://" in where:
        return where
    return bus.endpoint(where, socket_name)


class _Dealer:
    """A DEALER socket with request ids and a window of requests in flight."""

    def __init__(self, endpoint: str, timeout_ms: int, curve_server_key: str | None = None,
                 curve_client_key: str | None = None):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        curve.client_options(self.socket, curve_server_key, curve_client_key)
        endpoints.allow_ipv6(self.socket, endpoint)
        self.socket.connect(endpoint)
        self._poller = zmq.Poller()          # one for every wait
        self._poller.register(self.socket, zmq.POLLIN)
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
            if left <= 0 or not self._poller.poll(int(left * 1000) + 1):
                raise RequestTimeout(f"no answer to request {request_id} within "
                                     f"{self.timeout_ms} ms; its outcome is unknown")
            frame = self.socket.recv()
            self.replies[protocol.peek_header(frame).request_id] = frame
        return self.replies.pop(request_id)

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def _beyond_send(m: Message) -> bool:
    """A message with a field a SEND record does not carry."""
    return bool(getattr(m, "reconsume_times", 0) or getattr(m, "prepared_transaction_offset", 0))


def _raise_if_error(frame: bytes) -> None:
    if protocol.peek_header(frame).kind == protocol.Kind.ERROR:
        err = protocol.decode_error(frame)
        raise ClientError(f"{err.code.name}: {err.message}")


MAX_PRODUCER_ID = (1 << 64) - 1
WIRE_FORMATS = ("records", "messages")   # SEND_RECORDS, SEND
RECORDS_MIN_BATCH = 8                    # smaller batches go as SEND: cheaper to check
# what a message that cannot be laid out as a record raises while being encoded
_UNENCODABLE = (ValueError, TypeError, AttributeError, OverflowError, struct.error,
                UnicodeError, KeyError)


class Producer:
    """Sends messages to the store's writer.

    ``window`` bounds the batches in flight for ``send_async``; the writer answers
    OS_PAGECACHE_BUSY ("busy") to a client that sends more than it accepts.

    Idempotent (exactly-once) sending: with ``producer_id`` (a u64 other than 0, e.g.
    one every attempt of a Spark task derives alike) or ``idempotent=True`` (a random
    non-zero 63-bit id), every record carries the id and the next sequence, the first
    being 0 (``next_sequence``). The writer stores each (id, sequence) once, in sequence
    order (``storage.producer_state``): a record sent again is answered PUT_OK with a
    reason starting ``"duplicate:"``; one after a gap (an earlier batch was lost or
    refused) is answered OUT_OF_ORDER_SEQUENCE, nothing stored, with the expected
    sequence in the result's ``queue_offset`` and reason. After a ``RequestTimeout`` or
    an OUT_OF_ORDER_SEQUENCE, wait for the batches in flight, then resend from the
    first unacknowledged sequence with ``send_async(messages, first_sequence=n)``. A
    record the store refused (MESSAGE_ILLEGAL, ...) was not stored and took no
    sequence: the next record must take its sequence. ``send`` and ``send_batch`` see
    to that themselves: when nothing was sent after their batch, ``next_sequence`` goes
    back to its first record not stored (a refused one would otherwise have every later
    send answered OUT_OF_ORDER_SEQUENCE). The store forgets a producer that
    stored nothing for ``producer_id_expiration_ms`` (a day by default); it then
    expects sequence 0 again: set ``next_sequence = 0`` and resend the unacknowledged
    records from there.

    A store that serves TCP with CURVE (procs.curve) lets in only authorized clients:
    pass ``curve_server_key`` (the store's public certificate file) and
    ``curve_client_key`` (this client's secret certificate file); a client it refuses
    sees its requests time out (``RequestTimeout``), and the store logs the refusal.
    """

    def __init__(self, store_dir_or_endpoint: str, *, timeout_ms: int = 10_000,
                 window: int = 16, producer_id: int | None = None, idempotent: bool = False,
                 wire: str = "records", curve_server_key: str | None = None,
                 curve_client_key: str | None = None):
        if producer_id is None:
            producer_id = secrets.randbelow((1 << 63) - 1) + 1 if idempotent else 0
        elif isinstance(producer_id, bool) or not isinstance(producer_id, int) or \
                not 0 < producer_id <= MAX_PRODUCER_ID:
            raise ValueError(f"producer_id {producer_id!r} is not a u64 other than 0")
        if wire not in WIRE_FORMATS:
            raise ValueError(f"wire {wire!r} is not one of {', '.join(WIRE_FORMATS)}")
        self._dealer = _Dealer(_endpoint(store_dir_or_endpoint, "ingest"), timeout_ms,
                               curve_server_key, curve_client_key)
        self.wire = wire
        self.window = window
        self.producer_id = producer_id   # 0: not idempotent
        self._next_sequence = 0
        self._in_flight: list[int] = []
        self._done: dict[int, list[protocol.SendResult] | Exception] = {}

    @property
    def idempotent(self) -> bool:
        return self.producer_id != 0

    @property
    def next_sequence(self) -> int:
        """The sequence the next record sent without ``first_sequence`` carries."""
        return self._next_sequence

    @next_sequence.setter
    def next_sequence(self, value: int) -> None:
        if not self.producer_id:
            raise ValueError("only an idempotent producer numbers its records")
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 0 <= value <= MAX_PRODUCER_ID:
            raise ValueError(f"sequence {value!r} is not a u64")
        self._next_sequence = value

    def send(self, topic: str, body: bytes, tags: str | None = None,
             keys: Sequence[str] | None = None, properties: dict[str, str] | None = None,
             queue_id: int | None = None, delay_level: int = 0) -> protocol.SendResult:
        """Send one message and wait for its result."""
        msg = Message(topic=topic, body=body, tags=tags, keys=list(keys) if keys else None,
                      properties=dict(properties or {}), queue_id=queue_id,
                      delay_level=delay_level)
        return self.send_batch([msg])[0]

    def send_batch(self, messages: Sequence[Message],
                   first_sequence: int | None = None) -> list[protocol.SendResult]:
        """Send messages in one frame; one result each, in order. A message's
        ``queue_id`` is honoured; set it to None to let the store choose."""
        pending = self.send_async(messages, first_sequence)
        results = pending.result()
        if self.producer_id:
            self._take_back(pending.first_sequence, results)
        return results

    def _take_back(self, first: int, results: list[protocol.SendResult]) -> None:
        """``next_sequence`` back to the first record of the last batch sent that the
        store did not store (refused, or out of order), so the next record takes it."""
        if self._next_sequence != first + len(results):
            return      # a later batch went out meanwhile (send_async): its own business
        for i, r in enumerate(results):
            if not r.ok:
                self._next_sequence = first + i
                return

    def send_async(self, messages: Sequence[Message],
                   first_sequence: int | None = None) -> "PendingSend":
        """Send without waiting; at most ``window`` batches stay unanswered (older
        ones are waited for first). ``result()`` on the returned handle waits.

        An idempotent producer numbers the messages from ``first_sequence`` (a resend),
        by default from ``next_sequence``; ``next_sequence`` then becomes at least one
        past the last. Raises ``ValueError`` for ``first_sequence`` without a producer
        id, or for a message that does not fit the wire (nothing is sent, no sequence
        is taken).
        """
        messages = list(messages)
        seq = 0
        if self.producer_id:
            seq = self._next_sequence if first_sequence is None else first_sequence
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or \
                    seq + len(messages) - 1 > MAX_PRODUCER_ID:
                raise ValueError(f"first sequence {seq!r} does not leave room for "
                                 f"{len(messages)} u64 sequences")
        elif first_sequence is not None:
            raise ValueError("first_sequence needs a producer id (idempotent=True)")
        request_id = self._dealer.next_id()
        frame = self._encode(request_id, messages, seq)
        while len(self._in_flight) >= self.window:
            self._settle(self._in_flight[0])
        self._dealer.send(frame)
        self._in_flight.append(request_id)
        if self.producer_id:
            self._next_sequence = max(self._next_sequence, seq + len(messages))
        return PendingSend(self, request_id, seq if self.producer_id else None)

    def _encode(self, request_id: int, messages: list[Message], seq: int) -> bytes:
        """A SEND_RECORDS frame (records in CommitLog layout, checked by the writer in
        bulk); a SEND frame when ``wire="messages"``, for a batch of fewer than
        ``RECORDS_MIN_BATCH`` messages (the writer's bulk checks cost a fixed ~50 µs a
        frame, more than checking a few messages field by field) unless one carries a
        field SEND cannot (``reconsume_times``, ``prepared_transaction_offset``), or when
        a message cannot be laid out as a record at all (the store then answers it with
        the status it earns)."""
        if self.wire == "records" and (len(messages) >= RECORDS_MIN_BATCH
                                       or any(_beyond_send(m) for m in messages)):
            try:
                data, offsets = record_batch.encode_records(messages, now_ms(),
                                                            self.producer_id, seq)
                return protocol.encode_send_records(request_id, data, offsets,
                                                    self.producer_id, seq)
            except _UNENCODABLE:
                pass
        return protocol.encode_send(request_id, messages, self.producer_id, seq)

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
        if protocol.peek_header(frame).kind is protocol.Kind.SEND_RECORDS_REPLY:
            return protocol.decode_send_records_reply(frame)[1]
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
    """A batch sent by ``Producer.send_async``; ``first_sequence`` is its first record's
    sequence (None when the producer is not idempotent)."""

    def __init__(self, producer: Producer, request_id: int,
                 first_sequence: int | None = None):
        self._producer, self.request_id = producer, request_id
        self.first_sequence = first_sequence
        self._results: list[protocol.SendResult] | None = None

    def result(self) -> list[protocol.SendResult]:
        if self._results is None:
            self._results = self._producer._result(self.request_id)
        return self._results


class ReaderClient:
    """Pulls, queries, queue offsets, bulk fetches and group commits through the reader
    socket (no file access needed).

    ``dispatched`` and ``generation`` are those of the last OFFSETS reply (None before
    the first): offsets are bounded by that DISPATCHED, and a new generation means the
    store restarted in between.

    Over TCP to a store with CURVE, ``curve_server_key`` (its public certificate) and
    ``curve_client_key`` (this client's secret one) are needed, as for ``Producer``.
    """

    def __init__(self, store_dir_or_endpoint: str, *, timeout_ms: int = 10_000,
                 curve_server_key: str | None = None, curve_client_key: str | None = None):
        self.address = _endpoint(store_dir_or_endpoint, "reader")
        self._dealer = _Dealer(self.address, timeout_ms, curve_server_key, curve_client_key)
        self.dispatched: int | None = None
        self.generation: int | None = None

    def _ask(self, frame: bytes, request_id: int) -> bytes:
        self._dealer.send(frame)
        reply = self._dealer.receive(request_id)
        try:
            _raise_if_error(reply)
        except ClientError as e:
            if "UNKNOWN_KIND" in str(e) and "expected SEND" in str(e):
                raise ClientError(f"{self.address} is a store's ingest socket, not its "
                                  "reader: the reader listens on the next port "
                                  "(procs.endpoints.resolve gives both)") from e
            raise
        return reply

    def pull(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
             timeout_ms: int = 0, tags: str | Sequence[str] = "*") -> protocol.PullReply:
        """Up to ``max_msgs`` messages of a queue from ``offset`` whose tags ``tags``
        takes (RocketMQ's expression, ``"TagA || TagB"``, or a list; ``"*"``: all), the
        filter applied in the reader as a local Consumer applies it: ``next_begin_offset``
        passes the messages it skipped. Raises ``ValueError`` for a filter that is not
        text."""
        rid = self._dealer.next_id()
        expression = " || ".join(sorted(subscription_tags(tags))) or "*"
        return protocol.decode_pull_reply(self._ask(
            protocol.encode_pull(rid, topic, queue_id, offset, max_msgs, timeout_ms,
                                 expression), rid))

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

    def offsets(self, topics: Iterable[str] | None = None, timestamp_ms: int | None = None,
                *, nearest: bool = False) -> list[protocol.QueueOffsets]:
        """``QueueOffsets(topic, queue_id, min_offset, max_offset, time_offset)`` of every
        queue of ``topics`` (None or empty: every topic the store has, less the reserved
        ones; a topic without queues yet has no entry). With ``timestamp_ms``,
        ``time_offset`` is each queue's first offset stored at or after it (``max_offset``
        when none was; Kafka's offsetsForTimes), or with ``nearest`` the offset of the
        message stored nearest it, as ``Consumer.seek_to_time`` finds it locally
        (RocketMQ's getOffsetInQueueByTime); else -1. Sets ``dispatched`` and
        ``generation``.

        Raises ``ClientError`` (BAD_REQUEST) for a topic name outside the rule.
        """
        return self.offsets_reply(topics, timestamp_ms, nearest=nearest).queues

    def offsets_reply(self, topics: Iterable[str] | None = None,
                      timestamp_ms: int | None = None, *,
                      nearest: bool = False) -> protocol.OffsetsReply:
        """``offsets`` with the reply's ``dispatched`` and ``generation`` beside the
        queues."""
        rid = self._dealer.next_id()
        ts = protocol.NO_TIMESTAMP if timestamp_ms is None else timestamp_ms
        rule = protocol.TIME_NEAREST if nearest else protocol.TIME_FIRST_AT_OR_AFTER
        reply = protocol.decode_offsets_reply(self._ask(
            protocol.encode_offsets(rid, list(topics or ()), ts, rule), rid))
        self.dispatched, self.generation = reply.dispatched, reply.generation
        return reply

    def fetch(self, topic: str, queue_id: int, offset: int,
              max_msgs: int = protocol.MAX_FETCH_MSGS,
              max_bytes: int = protocol.MAX_FETCH_BYTES,
              tags: str | Sequence[str] = "*") -> protocol.FetchReply:
        """A bulk read from ``offset``: up to ``max_msgs`` consume queue units (the
        reader takes at most 65536) and their records, no more than ``max_bytes`` of
        them (at most 16 MiB) except that a first record larger than that still comes.
        Answered at once, never long-polled; status and offsets are ``pull``'s.

        The reply holds the units (``first_offset`` is the first one's logical offset)
        and the records' raw CommitLog bytes back to back, unchecked: ``r.records``
        slices one memoryview per record, ``storage.record.decode_at(x, 0,
        check_crc=True)`` decodes and checks one, ``pipeline.access`` checks a whole
        reply against its units in bulk. With ``tags`` (a subscription, as ``pull``'s),
        the units of messages with other tags come back blank, without their records.
        """
        rid = self._dealer.next_id()
        expression = " || ".join(sorted(subscription_tags(tags))) or "*"
        return protocol.decode_fetch_reply(self._ask(
            protocol.encode_fetch(rid, topic, queue_id, offset, max_msgs, max_bytes,
                                  expression), rid))

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Record consumer ``group``'s next offset per queue of ``topic`` in the store's
        consumerOffset.json (merged with what local ``Consumer``s commit), all or
        nothing.

        Raises ``ClientError`` (BAD_REQUEST) for a group or topic name outside
        ``[A-Za-z0-9_%|-]{1,255}``, a negative queue id or offset, or an offset past the
        queue's max offset.
        """
        rid = self._dealer.next_id()
        protocol.decode_commit_reply(self._ask(
            protocol.encode_commit(rid, group, topic, offsets), rid))

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
