"""MessagingService: RocketMQ 5's gRPC API (``apache.rocketmq.v2.MessagingService``)
served on the store, for RocketMQ's own clients (the proxy process, ``procs.proxy``).

Every answer is gRPC OK with RocketMQ's ``status{code, message}`` in its body, as
RocketMQ's proxy answers; the clients read the code.

    RPC                       served as
    ------------------------  ---------------------------------------------------------
    QueryRoute                every topic exists (autoCreateTopicEnable): its
                              ``default_topic_queue_nums`` queues, READ_WRITE, on one
                              broker (id 0) at the endpoints the client asked, NORMAL,
                              FIFO, DELAY and TRANSACTION messages (no group is orderly:
                              the settings say fifo false, and groups pop concurrently)
    Telemetry                 each settings command answered with the settings echoed
                              and the server's (publishing: max_body_size, backoff;
                              subscription: batch size, polling time, retry backoff);
                              the stream stays open until the client or the proxy ends it,
                              and carries to a producer the checks of its topics' open
                              transactions (RecoverOrphanedTransactionCommand)
    Heartbeat                 OK
    NotifyClientTermination   OK; the client's auto-renewed messages visible again soon
    QueryAssignment           one assignment of the whole broker (queue id -1), as for a
                              non-FIFO group
    SendMessage               ``procs.grpc_convert`` makes store messages; one Producer
                              a thread sends them to the writer's ingest socket; the
                              entry carries the message id (UNIQ_KEY) and the queue
                              offset the store assigned; a TRANSACTION message is
                              stored as a half message (``procs.transaction_service``),
                              its entry's transaction id the half's offset msgId
    EndTransaction            ``procs.transaction_service``: COMMIT puts the message in
                              its topic and an op record, ROLLBACK the op record;
                              INVALID_TRANSACTION_ID for an id blank, malformed, naming no
                              half of the topic, or of a transaction ended already;
                              resolution UNSPECIFIED (the checker does not know yet) is
                              OK and changes nothing: the check asks again; a put the
                              store refused, its code (SendMessage's), one the writer
                              did not answer, PROXY_TIMEOUT
    ReceiveMessage            ``procs.pop_service``: status, the messages, the delivery
                              timestamp; MESSAGE_NOT_FOUND when the polling time ends
                              with nothing; with auto_renew (a PushConsumer's) the
                              messages are renewed until acked or nacked
    AckMessage,               ``procs.pop_service``; per entry status for ack
    ChangeInvisibleDuration,
    ForwardMessageToDead-     a copy in %DLQ%<group>, and the message acked
    LetterQueue
    anything else             NOT_IMPLEMENTED, saying what is not served

Checks on every call, before anything is done: the ``x-mq-client-id`` header
(CLIENT_ID_REQUIRED), and with ``grpc_access_key`` set the ``authorization`` header's
signature, RocketMQ's ``MQv2-HMAC-SHA1`` of ``x-mq-date-time`` with the secret key
(UNAUTHORIZED).
"""

from __future__ import annotations

import hmac
import logging
import queue
import re
import threading
from hashlib import sha1

from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from rocketstore.client.dealer import ClientError
from rocketstore.client.producer import Producer
from rocketstore.procs.grpc_convert import (
    ACCEPTED_TYPES, PUT_STATUS_CODES, Code, Refused, checked_message, delivered_message,
    put_status, status, store_message)
from rocketstore.procs.pop_service import AUTO_RENEW_INVISIBLE_MS, PopService
from rocketstore.procs.transaction_service import (
    TransactionalMessageService, TransactionStoreError)
from rocketstore.storage.clock import now_ms
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.delay_level import parse_delay_levels
from rocketstore.storage.message import (
    PROPERTY_REAL_TOPIC, TRANSACTION_PREPARED_TYPE, transaction_value)
from rocketstore.storage.message_view import MessageView
from rocketstore.storage.pop_state import InvalidReceiptHandle, ReceiptHandle
from rocketstore.storage.transactional_message import InvalidTransactionId
from rocketstore.storage.validation import TOPIC_PATTERN, check_topic

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 3000          # the clients' own request timeout
MIN_SEND_TIMEOUT_MS = 100       # a send's wait when the client's deadline is that near
MAX_BATCH_SIZE = 32             # the proxy's receive batch bound
MAX_POLLING_S = 20.0            # the proxy's longest long polling
MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEADLINE_MARGIN_S = 1.0         # a receive or send answers this long before the client
                                # gives up
TELEMETRY_POLL_S = 0.5          # a Telemetry stream looks this often whether it is over
RETRY_BACKOFF = ("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h").split()
_AUTHORIZATION = re.compile(r"MQv2-HMAC-SHA1 Credential=([^,]*), SignedHeaders=([^,]*), "
                            r"Signature=([0-9a-fA-F]*)")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def _backoff_s(text: str) -> int:
    return int(text[:-1]) * _UNIT_S[text[-1]]


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, store_dir: str, config: StoreConfig, pop: PopService):
        self.store_dir = store_dir
        self.config = config
        self.pop = pop
        self._local = threading.local()
        self._producers: list[Producer] = []
        self._producers_lock = threading.Lock()
        self.stopping = threading.Event()
        self.delay_levels = parse_delay_levels(config.message_delay_level)
        self.transactions = TransactionalMessageService(config, pop.table,
                                                        self._recover_orphaned)
        self._streams: dict[str, _TelemetryStream] = {}     # client id -> its stream
        self._streams_lock = threading.Lock()

    def close(self) -> None:
        with self._producers_lock:
            for producer in self._producers:
                producer.close()
            self._producers.clear()
        self.transactions.close()

    # ------------------------------------------------------------------ every call
    def _refusal(self, context) -> pb.Status | None:
        """CLIENT_ID_REQUIRED or UNAUTHORIZED, or None when the call may go on."""
        headers = dict(context.invocation_metadata())
        client_id = headers.get("x-mq-client-id")
        if not client_id:
            return status(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
        if self.config.grpc_access_key and not self._signed(headers):
            return status(Code.UNAUTHORIZED, "the call is not signed with this store's "
                                             "access key (grpc_access_key)")
        self.pop.seen(client_id)
        return None

    @staticmethod
    def _client_id(context) -> str:
        return dict(context.invocation_metadata()).get("x-mq-client-id", "")

    def _signed(self, headers: dict) -> bool:
        m = _AUTHORIZATION.fullmatch(headers.get("authorization", ""))
        date_time = headers.get("x-mq-date-time", "")
        if not m or m[1] != self.config.grpc_access_key or not date_time:
            return False
        expected = hmac.new(self.config.grpc_secret_key.encode(), date_time.encode(),
                            sha1).hexdigest()
        return hmac.compare_digest(expected, m[3].lower())

    # ------------------------------------------------------------------ route, session
    def QueryRoute(self, request, context):
        refused = self._refusal(context) or self._topic_refusal(request.topic.name)
        if refused:
            return rpc.QueryRouteResponse(status=refused)
        return rpc.QueryRouteResponse(status=status(Code.OK), message_queues=[
            self._queue(request.topic, queue_id, request.endpoints)
            for queue_id in range(self.config.default_topic_queue_nums)])

    def _queue(self, topic: pb.Resource, queue_id: int, endpoints: pb.Endpoints) -> pb.MessageQueue:
        return pb.MessageQueue(
            topic=topic, id=queue_id, permission=pb.Permission.READ_WRITE,
            broker=pb.Broker(name=self.pop.broker_name, id=0, endpoints=endpoints),
            accept_message_types=ACCEPTED_TYPES)

    @staticmethod
    def _topic_refusal(topic: str) -> pb.Status | None:
        why = check_topic(topic)
        return status(Code.ILLEGAL_TOPIC, why) if why else None

    def QueryAssignment(self, request, context):
        refused = self._refusal(context) or self._topic_refusal(request.topic.name)
        if refused:
            return rpc.QueryAssignmentResponse(status=refused)
        return rpc.QueryAssignmentResponse(status=status(Code.OK), assignments=[
            pb.Assignment(message_queue=self._queue(request.topic, -1, request.endpoints))])

    def Heartbeat(self, request, context):
        return rpc.HeartbeatResponse(status=self._refusal(context) or status(Code.OK))

    def NotifyClientTermination(self, request, context):
        refused = self._refusal(context)
        if refused:
            return rpc.NotifyClientTerminationResponse(status=refused)
        try:
            self.pop.client_terminated(self._client_id(context))
        except OSError as e:
            return rpc.NotifyClientTerminationResponse(status=status(
                Code.INTERNAL_SERVER_ERROR, f"the pop state could not be written: {e}"))
        return rpc.NotifyClientTerminationResponse(status=status(Code.OK))

    def Telemetry(self, request_iterator, context):
        refused = self._refusal(context)
        if refused:
            yield rpc.TelemetryCommand(status=refused)
            return
        stream = _TelemetryStream(self._client_id(context))
        threading.Thread(target=self._read_telemetry, args=(request_iterator, stream),
                         name="telemetry", daemon=True).start()
        try:
            while not self.stopping.is_set() and context.is_active():
                try:
                    command = stream.outbox.get(timeout=TELEMETRY_POLL_S)
                except queue.Empty:
                    continue
                if command is None:         # the client ended its side
                    return
                yield command
        finally:
            with self._streams_lock:
                if self._streams.get(stream.client_id) is stream:
                    del self._streams[stream.client_id]

    def _read_telemetry(self, request_iterator, stream: "_TelemetryStream") -> None:
        """The client's side of a Telemetry stream: settings answered (through the
        stream's outbox) and a producer's topics noted for the checks."""
        try:
            for command in request_iterator:
                if command.HasField("settings"):
                    stream.topics = {t.name for t in command.settings.publishing.topics}
                    with self._streams_lock:
                        self._streams[stream.client_id] = stream
                    stream.outbox.put(rpc.TelemetryCommand(
                        status=status(Code.OK), settings=self._settings(command.settings)))
        except Exception as e:       # grpc.RpcError: the call ended, cancelled
            log.debug("telemetry of %s ended: %s", stream.client_id, e)
        stream.outbox.put(None)

    def _recover_orphaned(self, half: MessageView, transaction_id: str) -> bool:
        """Ask a live producer of the half's topic to end its transaction (the
        transaction service's check); False when none is connected."""
        topic = half.properties[PROPERTY_REAL_TOPIC]
        with self._streams_lock:
            streams = [s for s in self._streams.values() if topic in s.topics]
        if not streams:
            return False
        streams[-1].outbox.put(rpc.TelemetryCommand(
            recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
                message=checked_message(half), transaction_id=transaction_id)))
        return True

    def _settings(self, asked: pb.Settings) -> pb.Settings:
        """The client's settings echoed, with the server's added (RocketMQ's
        GrpcClientSettingsManager)."""
        settings = pb.Settings()
        settings.CopyFrom(asked)
        if asked.HasField("publishing"):
            settings.publishing.max_body_size = self.config.max_message_size
            settings.publishing.validate_message_type = True
            backoff = settings.backoff_policy
            backoff.max_attempts = 3
            backoff.exponential_backoff.initial.FromMilliseconds(10)
            backoff.exponential_backoff.max.FromMilliseconds(1000)
            backoff.exponential_backoff.multiplier = 2.0
        elif asked.HasField("subscription"):
            sub = settings.subscription
            sub.fifo = False
            sub.receive_batch_size = MAX_BATCH_SIZE
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.seconds = int(MAX_POLLING_S)
            settings.backoff_policy.max_attempts = self.config.retry_max_times + 1
            for step in RETRY_BACKOFF:
                settings.backoff_policy.customized_backoff.next.add(seconds=_backoff_s(step))
        return settings

    # ------------------------------------------------------------------ send
    def SendMessage(self, request, context):
        refused = self._refusal(context)
        if refused:
            return rpc.SendMessageResponse(status=refused)
        try:
            now = now_ms()
            messages = [store_message(m, self.config.max_message_size, self.delay_levels, now,
                                      self.config.default_topic_queue_nums)
                        for m in request.messages]
        except Refused as e:
            return rpc.SendMessageResponse(status=status(e.code, e.text))
        if not messages:
            return rpc.SendMessageResponse(status=status(Code.BAD_REQUEST, "no message"))
        halves = [transaction_value(m.sys_flag) == TRANSACTION_PREPARED_TYPE for m in messages]
        messages = [self.transactions.half(m) if h else m for m, h in zip(messages, halves)]
        try:
            producer = self._producer()
            producer.timeout_ms = self._send_timeout_ms(context)
            results = producer.send_batch(messages)
        except ClientError as e:
            self._drop_producer()
            log.warning("send of %d messages failed: %s", len(messages), e)
            return rpc.SendMessageResponse(status=status(
                Code.PROXY_TIMEOUT, f"the store's writer did not answer: {e}"))
        entries = []
        for m, r, half in zip(messages, results, halves):
            uniq = m.properties["UNIQ_KEY"]
            entries.append(rpc.SendResultEntry(status=put_status(r.status, r.reason),
                                               message_id=uniq,
                                               transaction_id=r.msg_id if half else uniq,
                                               offset=max(0, r.queue_offset)))
        codes = {e.status.code for e in entries}
        top = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS,
                                                               "the entries differ")
        return rpc.SendMessageResponse(status=top, entries=entries)

    @staticmethod
    def _send_timeout_ms(context) -> int:
        """How long a send waits for the writer: SEND_TIMEOUT_MS, and never past
        DEADLINE_MARGIN_S before the client gives up, so that a client whose store has
        no writer (killed, restarting) is answered PROXY_TIMEOUT, which it retries,
        instead of seeing its own deadline pass (tests/test_grpc_kills.py)."""
        remaining = context.time_remaining()
        if remaining is None:
            return SEND_TIMEOUT_MS
        return max(MIN_SEND_TIMEOUT_MS,
                   min(SEND_TIMEOUT_MS, int((remaining - DEADLINE_MARGIN_S) * 1000)))

    def _producer(self) -> Producer:
        """This thread's Producer (a Producer is used from one thread only)."""
        producer = getattr(self._local, "producer", None)
        if producer is None:
            producer = self._local.producer = Producer(self.store_dir,
                                                       timeout_ms=SEND_TIMEOUT_MS)
            with self._producers_lock:
                self._producers.append(producer)
        return producer

    def _drop_producer(self) -> None:
        """After a timeout or a lost writer the thread's Producer is made again."""
        producer = getattr(self._local, "producer", None)
        if producer is None:            # it could not be made
            return
        self._local.producer = None
        with self._producers_lock:
            self._producers.remove(producer)
        producer.close()

    # ------------------------------------------------------------------ pop
    def ReceiveMessage(self, request, context):
        refused = self._refusal(context) or self._receive_refusal(request)
        if refused:
            yield rpc.ReceiveMessageResponse(status=refused)
            return
        polling_s = (request.long_polling_timeout.ToMilliseconds() / 1000
                     if request.HasField("long_polling_timeout") else MAX_POLLING_S)
        remaining = context.time_remaining()
        if remaining is not None:
            polling_s = min(polling_s, remaining - DEADLINE_MARGIN_S)
        invisible_ms = (AUTO_RENEW_INVISIBLE_MS if request.auto_renew
                        else request.invisible_duration.ToMilliseconds())
        try:
            popped = self.pop.receive(
                request.message_queue.topic.name, request.group.name,
                _tags(request.filter_expression), min(request.batch_size, MAX_BATCH_SIZE),
                invisible_ms, max(0.0, min(polling_s, MAX_POLLING_S)),
                renew_for=self._client_id(context) if request.auto_renew else "")
        except OSError as e:
            log.error("pop of %s by %s not written: %s", request.message_queue.topic.name,
                      request.group.name, e)
            yield rpc.ReceiveMessageResponse(status=status(
                Code.INTERNAL_SERVER_ERROR, f"the pop state could not be written: {e}"))
            return
        if popped:
            yield rpc.ReceiveMessageResponse(status=status(Code.OK))
            for view, handle, entry in popped:
                yield rpc.ReceiveMessageResponse(message=delivered_message(view, handle, entry))
        else:
            yield rpc.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND,
                                                           "no new message"))
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        yield rpc.ReceiveMessageResponse(delivery_timestamp=now)

    def _receive_refusal(self, request) -> pb.Status | None:
        topic, group = request.message_queue.topic.name, request.group.name
        if not TOPIC_PATTERN.fullmatch(group):
            return status(Code.ILLEGAL_CONSUMER_GROUP, f"group {group!r} must match "
                                                       "[A-Za-z0-9_%|-]{1,255}")
        if request.filter_expression.type == pb.FilterType.SQL:
            return status(Code.NOT_IMPLEMENTED, "SQL92 filters are not served: filter by tag")
        if request.batch_size <= 0:
            return status(Code.BAD_REQUEST, "batch_size must be positive")
        if request.auto_renew:          # the proxy's own duration, renewed until the ack
            return self._topic_refusal(topic)
        return self._topic_refusal(topic) or self._invisible_refusal(
            request.invisible_duration.ToMilliseconds(),
            self.config.min_invisible_time_mills_for_recv)

    @staticmethod
    def _invisible_refusal(invisible_ms: int, low: int = 0) -> pb.Status | None:
        """An invisible duration out of ``low`` .. 12 h (the proxy's bounds: a receive's
        ``low`` is min_invisible_time_mills_for_recv, a change's 0, as a nack asks 1 s)."""
        if not low <= invisible_ms <= MAX_INVISIBLE_MS:
            return status(Code.ILLEGAL_INVISIBLE_TIME,
                          f"the invisible duration must be {low} ms .. 12 h, not "
                          f"{invisible_ms} ms" + (" (min_invisible_time_mills_for_recv)"
                                                  if low else ""))
        return None

    def AckMessage(self, request, context):
        refused = self._refusal(context) or self._topic_refusal(request.topic.name)
        if refused:
            return rpc.AckMessageResponse(status=refused)
        entries = [self._ack_one(request.topic.name, request.group.name, e)
                   for e in request.entries]
        codes = {e.status.code for e in entries}
        top = (entries[0].status if len(codes) == 1 else
               status(Code.MULTIPLE_RESULTS, "the entries differ")) if entries else \
            status(Code.BAD_REQUEST, "no entry")
        return rpc.AckMessageResponse(status=top, entries=entries)

    def _ack_one(self, topic: str, group: str, entry) -> rpc.AckMessageResultEntry:
        _, failed = _by_handle(lambda: self.pop.ack(
            topic, group, ReceiptHandle.decode(entry.receipt_handle)), "ack")
        return rpc.AckMessageResultEntry(message_id=entry.message_id,
                                         receipt_handle=entry.receipt_handle,
                                         status=failed or status(Code.OK))

    def ChangeInvisibleDuration(self, request, context):
        invisible_ms = request.invisible_duration.ToMilliseconds()
        refused = (self._refusal(context) or self._topic_refusal(request.topic.name)
                   or self._invisible_refusal(invisible_ms))
        if refused:
            return rpc.ChangeInvisibleDurationResponse(status=refused)
        handle, failed = _by_handle(lambda: self.pop.change_invisible(
            request.topic.name, request.group.name,
            ReceiptHandle.decode(request.receipt_handle), invisible_ms), "change")
        if failed:
            return rpc.ChangeInvisibleDurationResponse(status=failed)
        return rpc.ChangeInvisibleDurationResponse(status=status(Code.OK),
                                                   receipt_handle=handle.encode())

    # ------------------------------------------------------------------ transactions, dead letters
    def EndTransaction(self, request, context):
        refused = self._refusal(context) or self._topic_refusal(request.topic.name)
        if refused:
            return rpc.EndTransactionResponse(status=refused)
        if not request.transaction_id.strip():
            return rpc.EndTransactionResponse(status=status(
                Code.INVALID_TRANSACTION_ID, "the transaction id is blank"))
        if request.resolution not in (pb.TransactionResolution.COMMIT,
                                      pb.TransactionResolution.ROLLBACK):
            return rpc.EndTransactionResponse(status=status(
                Code.OK, "the resolution is not known yet: the check asks again"))
        try:
            self.transactions.end_transaction(
                request.transaction_id, request.message_id, request.topic.name,
                commit=request.resolution == pb.TransactionResolution.COMMIT,
                timeout_ms=self._send_timeout_ms(context))
        except InvalidTransactionId as e:
            return rpc.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID,
                                                            str(e)))
        except TransactionStoreError as e:
            log.warning("end of transaction %s not stored: %s", request.transaction_id, e)
            code = (PUT_STATUS_CODES.get(e.status, Code.INTERNAL_SERVER_ERROR)
                    if e.status is not None else Code.PROXY_TIMEOUT)
            return rpc.EndTransactionResponse(status=status(code, str(e)))
        return rpc.EndTransactionResponse(status=status(Code.OK))

    def ForwardMessageToDeadLetterQueue(self, request, context):
        refused = self._refusal(context) or self._topic_refusal(request.topic.name)
        if refused:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=refused)
        forwarded, failed = _by_handle(lambda: self.pop.forward_to_dead_letters(
            request.topic.name, request.group.name,
            ReceiptHandle.decode(request.receipt_handle)), "forward")
        if failed:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=failed)
        if not forwarded:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(
                Code.INTERNAL_SERVER_ERROR, "the store did not take the dead letter (its log "
                                            "says why)"))
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(Code.OK))

    # ------------------------------------------------------------------ not served
    def _not_served(self, what: str) -> pb.Status:
        return status(Code.NOT_IMPLEMENTED, f"{what} is not served by this store")

    def RecallMessage(self, request, context):
        return rpc.RecallMessageResponse(status=self._not_served("RecallMessage (delay "
                                                                 "messages)"))

    def PullMessage(self, request, context):
        yield rpc.PullMessageResponse(status=self._not_served("PullMessage"))

    def UpdateOffset(self, request, context):
        return rpc.UpdateOffsetResponse(status=self._not_served("UpdateOffset"))

    def GetOffset(self, request, context):
        return rpc.GetOffsetResponse(status=self._not_served("GetOffset"))

    def QueryOffset(self, request, context):
        return rpc.QueryOffsetResponse(status=self._not_served("QueryOffset"))

    def SyncLiteSubscription(self, request, context):
        return rpc.SyncLiteSubscriptionResponse(status=self._not_served(
            "SyncLiteSubscription (lite topics)"))


class _TelemetryStream:
    """One client's open Telemetry stream: the commands waiting to go out (None ends
    it) and, for a producer, the topics its settings named."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.outbox: queue.Queue = queue.Queue()
        self.topics: set[str] = set()


def _by_handle(change, what: str) -> tuple[object, pb.Status | None]:
    """``change()`` (a change of the pop state a receipt handle names: an ack, a new
    invisible duration, a forward) and None; or None and the status of its failure:
    INVALID_RECEIPT_HANDLE for a handle that names nothing in flight,
    INTERNAL_SERVER_ERROR when the state could not be written."""
    try:
        return change(), None
    except InvalidReceiptHandle as e:
        return None, status(Code.INVALID_RECEIPT_HANDLE, str(e))
    except OSError as e:
        return None, status(Code.INTERNAL_SERVER_ERROR,
                            f"the {what} could not be written: {e}")


def _tags(expression: pb.FilterExpression) -> list[str] | None:
    """The tags a TAG filter takes, None for every message ("*" or none)."""
    text = expression.expression.strip()
    if not text or text == "*":
        return None
    return [t.strip() for t in text.split("||") if t.strip()]
