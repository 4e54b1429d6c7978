"""``Producer``: sends messages to a running store's writer over its ingest socket.

    from rocketstore import Producer
    with Producer("store") as p:                    # a store directory, ipc:// or tcp://
        r = p.send("Orders", b"order 42", tags="created", keys=["order-42"])
        r.status.name, r.msg_id, r.queue_id, r.queue_offset, r.commit_log_offset
        pending = p.send_async([Message("Orders", b"..."), ...])   # .result() waits

``send`` takes a topic and a body (bytes); ``send_batch`` and ``send_async`` take a list
(any iterable) of ``Message`` objects, one frame for all of them. Anything else raises
``TypeError`` at once, before anything is sent.

Where: a store directory, or ``ipc://`` naming a store or its socket directory
(``wire.endpoints``), finds the ingest socket. A ``tcp://host:port`` (or an
``ipc://...sock``) address is the socket's own: the store's ``listen_port``. Nothing is
made there, and a place where no store can be reached is named at once
(``client.reach``).

A Producer may be shared by threads, as RocketMQ's and Kafka's are: one thread at a
time uses its socket (ZeroMQ sockets are not thread-safe), and the one-message sends
made while another thread is using it wait together and go in one frame, sent by the
first of them whose turn comes (the module's "Threads"). A
request that gets no answer within ``timeout_ms`` raises ``RequestTimeout``: its outcome
is unknown (the store may have stored it); send it again only if duplicates are fine,
or from an idempotent producer, whose resends the store stores once. A request in flight
when the writer went away (killed, or restarting) raises ``ConnectionLost`` (a
``RequestTimeout``) at once instead; an idempotent producer sends it again by itself
to the writer that takes its place (``RESENDS`` times at most, within ``timeout_ms``):

    with Producer("store", idempotent=True) as p:   # or producer_id=<your u64 != 0>
        first = p.next_sequence
        handle = p.send_async(batch)                # sequences first .. first+len-1
        ...                                         # a timeout, or OUT_OF_ORDER_SEQUENCE:
        p.send_async(unacknowledged, first_sequence=first_unacknowledged)

Threads. The socket is one thread's at a time, in the order threads asked for it
(``client.line``). A ``send`` that waits carries its record, encoded in its own thread
(an argument that is wrong raises there, and harms nobody's send); the first such send
whose turn comes sends the sends waiting right behind it with its own in one
SEND_RECORDS frame (up to GROUP_MAX_BYTES), and each thread gets its own record's
result from the one answer, or its own copy of the error the frame met (a timeout, a
lost connection: each record's outcome is unknown, as for any frame). So N threads
sending one at a time pay about one round trip a group, not one a message. The writer
stores a frame's records in order, together: a message is acknowledged only once it is
stored, as when sent alone. Not grouped, but sent alone in their turn: the sends of an
idempotent producer (its records carry sequences, numbered when sent), of
``wire="messages"``, and messages that cannot be laid out as a record; and every other
call (``send_batch``, ``send_async``, ``result``, ``flush``, ``close``). A call made
after ``close`` (or waiting while it ran) raises ``StoreClosedError``. A signal handler
must not call the producer its own thread is inside of: it would wait for itself.
"""

from __future__ import annotations

import copy
import itertools
import secrets
import struct
import time
from typing import Iterable, Sequence

from rocketstore.client import group_address
from rocketstore.client.dealer import ClientError, raise_if_error
from rocketstore.client.line import Line, Turn
from rocketstore.storage import record_batch
from rocketstore.storage.errors import StoreClosedError
from rocketstore.storage.message import Message, now_ms
from rocketstore.wire import protocol

__all__ = ["PendingSend", "Producer", "message_batches"]


def _beyond_send(m: Message) -> bool:
    """A message with a field a SEND record does not carry."""
    return bool(getattr(m, "reconsume_times", 0) or getattr(m, "prepared_transaction_offset", 0))


MAX_PRODUCER_ID = (1 << 64) - 1
# times an idempotent producer sends a batch again on its own after the writer went
# away with it in flight (each time to the writer that took its place; within timeout_ms)
RESENDS = 8
WIRE_FORMATS = ("records", "messages")   # SEND_RECORDS, SEND
# what a message that cannot be laid out as a record raises while being encoded
_UNENCODABLE = (ValueError, TypeError, AttributeError, OverflowError, struct.error,
                UnicodeError, KeyError)
GROUP_MAX_BYTES = 1 << 20    # the records of one group frame, at most (one record at least)


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

    A store that serves TCP with CURVE (wire.curve) lets in only authorized clients:
    pass ``curve_server_key`` (the store's public certificate file) and
    ``curve_client_key`` (this client's secret certificate file); a client it refuses
    gets ``HandshakeRefusedError`` at its first request, and the store logs the refusal.

    Aimed where no store can be reached, a Producer raises a ``StoreUnreachableError``
    at once instead of timing out (``client.reach``): ``NoStoreError`` when made, for
    a directory where no store runs; ``BadAddressError`` for ``host:port`` without
    ``tcp://``; ``NoListenerError`` or ``HandshakeRefusedError`` at the first
    request. Nothing it sent reached a store then, and every later call raises the
    same error.
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
        self._dealer = group_address.dealer(store_dir_or_endpoint, "ingest", timeout_ms,
                                            curve_server_key, curve_client_key)
        self.wire = wire
        self.window = window
        self.producer_id = producer_id   # 0: not idempotent
        self._next_sequence = 0
        self._in_flight: dict[int, None] = {}    # request ids in the order sent
        self._done: dict[int, list[protocol.SendResult] | Exception] = {}
        self._line = Line()                 # the socket and the state above: one thread's
        self._try_take = self._line.try_take
        self._closed = False

    @property
    def idempotent(self) -> bool:
        return self.producer_id != 0

    @property
    def timeout_ms(self) -> int:
        """How long a request sent from now on waits for its answer before it raises
        ``RequestTimeout`` (the constructor's ``timeout_ms``; may be changed between
        requests, as a server bounds each by its own caller's deadline)."""
        return self._dealer.timeout_ms

    @timeout_ms.setter
    def timeout_ms(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"timeout_ms {value!r} is not a positive int")
        self._dealer.timeout_ms = value

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
        """Send one message and wait for its result. Raises ``TypeError`` for a body
        that is not bytes (bytearray, memoryview).

        A plain message (no properties nor delay, at most one key) from a producer
        that is not idempotent, with nothing else in flight, is encoded from the
        arguments (``protocol.encode_plain_send``) and sent without the window's
        bookkeeping (``Dealer.request``); any other as a batch of one ``Message``. The
        frame is the same. While another thread uses the socket, the send waits and
        goes with the others waiting then (the module's "Threads")."""
        if not self._try_take(False):
            turn = self._join(topic, body, tags, keys, properties, queue_id, delay_level)
            if turn is not None:
                return turn.outcome()
        try:
            if self._closed:
                raise self._closed_error()
            if not (properties or delay_level or self.producer_id or self._in_flight) and \
                    self.wire == "records":
                key = keys[0] if keys and type(keys) in _KEY_LISTS and len(keys) == 1 else None
                if key is not None or not keys:
                    dealer = self._dealer
                    request_id = dealer.next_id()
                    frame = protocol.encode_plain_send(request_id, topic, body, tags, key,
                                                       queue_id, time.time_ns() // 1_000_000)
                    if frame is not None:
                        answer = dealer.request(frame, request_id)
                        return protocol.decode_one_send_result(answer) or \
                            _decode_reply(answer)[0]
            msg = _message(topic, body, tags, keys, properties, queue_id, delay_level)
            return self._send_batch([msg], None)[0]
        finally:
            self._line.release()

    # ============================================================ threads
    def _join(self, topic: str, body: bytes, tags: str | None, keys: Sequence[str] | None,
              properties: dict[str, str] | None, queue_id: int | None,
              delay_level: int) -> Turn | None:
        """Wait for the socket as a ``send`` (its record encoded first, here): the turn
        with its outcome once a group frame carried it, or None when the socket is
        this thread's to send alone (its message goes in no group, or the socket came
        free meanwhile)."""
        turn = Turn(self._record(topic, body, tags, keys, properties, queue_id, delay_level))
        if self._line.wait(turn):
            return None
        if turn.leads and turn.record is not None:
            self._send_group(turn)
        return turn if turn.record is not None else None

    def _record(self, topic: str, body: bytes, tags: str | None, keys: Sequence[str] | None,
                properties: dict[str, str] | None, queue_id: int | None,
                delay_level: int) -> bytes | None:
        """The message as a record that can go in a group frame (``send``'s own bytes:
        ``protocol.encode_plain_send``'s, else ``record_batch.encode_message``'s);
        None for one sent alone (the module's "Threads"). Raises what ``send`` raises
        for its arguments."""
        if self.producer_id or self.wire != "records":
            return None
        born = time.time_ns() // 1_000_000
        if not (properties or delay_level):
            key = keys[0] if keys and type(keys) in _KEY_LISTS and len(keys) == 1 else None
            if key is not None or not keys:      # at most one key: ``send``'s plain rule
                frame = protocol.encode_plain_send(0, topic, body, tags, key, queue_id, born)
                if frame is not None:
                    return frame[protocol.ONE_RECORD_AT:]
        msg = _message(topic, body, tags, keys, properties, queue_id, delay_level)
        try:
            return record_batch.encode_message(msg, born)
        except _UNENCODABLE:
            return None      # sent alone: the store answers it with the status it earns

    def _take(self) -> None:
        """The socket for this thread, in its turn; ``StoreClosedError`` (the socket
        given back) once the producer is closed."""
        self._line.take()
        if self._closed:
            self._line.release()
            raise self._closed_error()

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(f"the producer to {self._dealer.target.address} is closed")

    def _send_group(self, own: Turn) -> None:
        """``own`` was passed the socket: it and the sends right behind it in line go
        in one frame (``Line.take_group``); each gets its result or its own copy of
        the frame's error, is woken, and the socket passes on."""
        group = [own]
        try:
            group = self._line.take_group(own, GROUP_MAX_BYTES)
            if self._closed:
                raise self._closed_error()
            results = self._send_records([t.record for t in group])
            for turn, result in zip(group, results):
                turn.result = result
        except BaseException as e:       # each record's outcome is unknown alike
            self._line.discard(own)      # still at the head if it took no group
            for turn in group:
                turn.error = e if turn is own else _error_for_another(e)
        finally:
            self._line.wake(group, own)
            self._line.release()

    def _send_records(self, records: list[bytes]) -> list[protocol.SendResult]:
        """One SEND_RECORDS frame of ``records`` (without a producer id), waited for;
        their results, in order."""
        dealer = self._dealer
        request_id = dealer.next_id()
        if len(records) == 1:
            frame = protocol.encode_one_send_record(request_id, records[0])
        else:
            starts = list(itertools.accumulate(map(len, records[:-1]), initial=0))
            frame = protocol.encode_send_records(request_id, b"".join(records), starts)
        if self._in_flight:
            self._put_in_flight(frame, request_id)
            results = self._result(request_id)
        else:
            results = _decode_reply(dealer.request(frame, request_id))
        if len(results) != len(records):
            raise ClientError(f"the store answered {len(results)} results for a frame of "
                              f"{len(records)} records")
        return results

    def send_batch(self, messages: Iterable[Message],
                   first_sequence: int | None = None) -> list[protocol.SendResult]:
        """Send a list of ``Message`` in one frame; one result each, in order. A
        message's ``queue_id`` is honoured; set it to None to let the store choose.
        Raises ``TypeError`` for anything but an iterable of ``Message``."""
        messages = message_list(messages, "send_batch")
        self._take()
        try:
            return self._send_batch(messages, first_sequence)
        finally:
            self._line.release()

    def _send_batch(self, messages: list[Message],
                    first_sequence: int | None) -> list[protocol.SendResult]:
        request_id, seq = self._send_frame(messages, first_sequence)
        results = self._result(request_id)
        if self.producer_id:
            self._take_back(seq, results)
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

    def send_async(self, messages: Iterable[Message],
                   first_sequence: int | None = None) -> "PendingSend":
        """Send a list of ``Message`` in one frame without waiting; at most ``window``
        batches stay unanswered (older ones are waited for first). ``result()`` on the
        returned handle waits.

        An idempotent producer numbers the messages from ``first_sequence`` (a resend),
        by default from ``next_sequence``; ``next_sequence`` then becomes at least one
        past the last. Raises ``TypeError`` for anything but an iterable of
        ``Message``, ``ValueError`` for ``first_sequence`` without a producer id, or for
        a message that does not fit the wire (nothing is sent, no sequence is taken).
        """
        messages = message_list(messages, "send_async")
        self._take()
        try:
            request_id, seq = self._send_frame(messages, first_sequence)
        finally:
            self._line.release()
        return PendingSend(self, request_id, seq if self.producer_id else None)

    def _send_frame(self, messages: list[Message], first_sequence: int | None
                    ) -> tuple[int, int]:
        """Send ``messages`` in one frame, at most ``window`` frames unanswered; the
        request id and the first record's sequence (0 when not idempotent)."""
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
        self._put_in_flight(self._encode(request_id, messages, seq), request_id)
        if self.producer_id:
            self._next_sequence = max(self._next_sequence, seq + len(messages))
        return request_id, seq

    def _put_in_flight(self, frame: bytes, request_id: int) -> None:
        """Send ``frame`` once fewer than ``window`` frames are unanswered."""
        in_flight = self._in_flight
        while len(in_flight) >= self.window:
            self._settle(next(iter(in_flight)))
        self._dealer.send(frame, request_id, RESENDS if self.producer_id else 0)
        in_flight[request_id] = None

    def _encode(self, request_id: int, messages: list[Message], seq: int) -> bytes:
        """A SEND_RECORDS frame: records in CommitLog layout, which the writer checks
        in bulk, or record by record for a frame of a few (its small path), and copies
        as they are. A SEND frame (field by field) when ``wire="messages"``, unless a
        message carries a field SEND cannot (``reconsume_times``,
        ``prepared_transaction_offset``), and when a message cannot be laid out as a
        record at all (the store then answers it with the status it earns). An item
        that is no ``Message`` fails both: ``TypeError`` naming it (looked for only
        then, so a batch of Messages pays nothing for the look). A frame of one record
        (``send``) is packed with one ``struct`` before its record."""
        if self.wire == "records" or any(_beyond_send(m) for m in messages):
            try:
                if len(messages) == 1:
                    identity = (self.producer_id, seq) if self.producer_id else None
                    record = record_batch.encode_message(messages[0], now_ms(), identity)
                    return protocol.encode_one_send_record(request_id, record,
                                                           self.producer_id, seq)
                data, offsets = record_batch.encode_records(messages, now_ms(),
                                                            self.producer_id, seq)
                return protocol.encode_send_records(request_id, data, offsets,
                                                    self.producer_id, seq)
            except _UNENCODABLE:
                pass
        try:
            return protocol.encode_send(request_id, messages, self.producer_id, seq)
        except Exception:
            _refuse_other_items(messages)
            raise

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
            self._in_flight.pop(request_id, None)
        return _decode_reply(frame)

    def flush(self) -> None:
        """Wait for every batch in flight (their handles still give their results)."""
        self._take()
        try:
            for request_id in list(self._in_flight):
                self._settle(request_id)
        finally:
            self._line.release()

    def close(self) -> None:
        """Close the socket, in its turn (once no other thread is using it); the calls
        waiting then, and every later one, raise ``StoreClosedError``. Closing again
        does nothing."""
        self._line.take()
        try:
            if not self._closed:
                self._closed = True
                self._dealer.close()
        finally:
            self._line.release()

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
        self._outcome: list[protocol.SendResult] | ClientError | None = None

    def result(self) -> list[protocol.SendResult]:
        """The batch's results, waited for once (by the first thread that asks: others
        asking meanwhile get the same, or the same error)."""
        if self._outcome is None:
            producer = self._producer
            producer._take()
            try:
                if self._outcome is None:
                    try:
                        self._outcome = producer._result(self.request_id)
                    except ClientError as e:
                        self._outcome = e
            finally:
                producer._line.release()
        if isinstance(self._outcome, Exception):
            raise self._outcome
        return self._outcome


def _decode_reply(frame: bytes) -> list[protocol.SendResult]:
    """The results a SEND or SEND_RECORDS reply carries (a one-message send's answer
    read at once: ``protocol.decode_one_send_result``); ``ClientError`` for an ERROR
    frame."""
    one = protocol.decode_one_send_result(frame)
    if one is not None:
        return [one]
    raise_if_error(frame)
    if protocol.peek_header(frame).kind is protocol.Kind.SEND_RECORDS_REPLY:
        return protocol.decode_send_records_reply(frame)[1]
    return protocol.decode_send_reply(frame)[1]


BODY_TYPES = (bytes, bytearray, memoryview)
_KEY_LISTS = (list, tuple)        # keys that ``send`` reads as one key when they hold one
_NOT_A_BATCH = (Message, *BODY_TYPES, str)


def _error_for_another(e: BaseException) -> BaseException:
    """What a group member whose frame met ``e`` in another thread raises: its own copy
    of ``e`` (an exception raised in several threads would gather all their
    tracebacks), or a ``ClientError`` saying its outcome is unknown when ``e`` was an
    interruption of that thread (Ctrl-C) or cannot be copied."""
    if isinstance(e, Exception):
        try:
            mine = copy.copy(e)
            mine.__traceback__ = None
            return mine
        except Exception:  # noqa: BLE001 - an exception whose arguments do not rebuild it
            pass
    return ClientError(f"the frame carrying this send failed in the thread that sent it "
                       f"({type(e).__name__}: {e}): its outcome is unknown")


def _message(topic: str, body: bytes, tags: str | None, keys: Sequence[str] | None,
             properties: dict[str, str] | None, queue_id: int | None,
             delay_level: int) -> Message:
    """``send``'s arguments as a ``Message``; ``TypeError`` for a body that is not bytes."""
    if not isinstance(body, BODY_TYPES):
        raise TypeError(f"send(topic, body) takes the body as bytes, not "
                        f"{type(body).__name__} (a Message goes to send_batch([message]))")
    return Message(topic=topic, body=body, tags=tags, keys=list(keys) if keys else None,
                   properties=dict(properties) if properties else {}, queue_id=queue_id,
                   delay_level=delay_level)


def message_list(messages: Iterable[Message], call: str) -> list[Message]:
    """``messages`` as a list; ``TypeError`` naming what ``call`` expects when it is
    no iterable, or one Message, or a body (bytes and str are iterables too, of the
    wrong things: a body given where a batch goes). One ``isinstance``: the items are
    looked at only if the batch cannot be encoded (``Producer._encode``)."""
    if isinstance(messages, _NOT_A_BATCH):
        what = "one Message: pass [message]" if isinstance(messages, Message) else \
            f"{type(messages).__name__}: a body goes in Message(topic, body), or to " \
            "send(topic, body)"
        raise TypeError(f"{call} takes a list of Messages, not {what}")
    try:
        return list(messages)
    except TypeError:
        raise TypeError(f"{call} takes a list of Messages, not "
                        f"{type(messages).__name__}") from None


def _refuse_other_items(messages: list) -> None:
    """``TypeError`` naming the first item of a batch that is no ``Message``."""
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise TypeError(f"send_batch and send_async take a list of Messages; item {i} "
                            f"is {type(m).__name__}")


def message_batches(messages: Iterable[Message], size: int) -> Iterable[list[Message]]:
    batch: list[Message] = []
    for m in messages:
        batch.append(m)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
