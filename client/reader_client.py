"""``ReaderClient``: pulls, queries, queue offsets, bulk fetches and group commits
through a store's reader socket, for clients that cannot map the store's files (another
host, Spark executors elsewhere).

    with ReaderClient("store") as rc:              # or "tcp://host:port" (the reader's)
        for q in rc.offsets(["Orders"]):           # protocol.QueueOffsets
            r = rc.fetch(q.topic, q.queue_id, q.min_offset, 4096, 8 << 20)
            ...                                    # r.records: raw CommitLog records
            rc.commit_offsets("billing", q.topic, {q.queue_id: r.next_begin_offset})
"""

from __future__ import annotations

from typing import Iterable, Sequence

from rocketstore.client import group_address
from rocketstore.client.dealer import ClientError, raise_if_error
from rocketstore.storage.read_path import subscription_tags
from rocketstore.wire import protocol

__all__ = ["ReaderClient"]


class ReaderClient:
    """Pulls, queries, queue offsets, bulk fetches and group commits through the reader
    socket (no file access needed).

    ``dispatched`` and ``generation`` are those of the last OFFSETS reply (None before
    the first): offsets are bounded by that DISPATCHED, and a new generation means the
    store restarted in between.

    Over TCP to a store with CURVE, ``curve_server_key`` (its public certificate) and
    ``curve_client_key`` (this client's secret one) are needed, as for ``Producer``.
    Where no store can be reached it raises a ``StoreUnreachableError`` at once, as a
    ``Producer`` does (``client.reach``). A request in flight when the reader went away
    (killed, or restarting) is sent again once, to the reader that takes its place
    (every request here is idempotent: a read, or a commit of the same offsets); a
    second loss raises ``ConnectionLost``.
    """

    def __init__(self, store_dir_or_endpoint: str, *, timeout_ms: int = 10_000,
                 curve_server_key: str | None = None, curve_client_key: str | None = None):
        self._dealer = group_address.dealer(store_dir_or_endpoint, "reader", timeout_ms,
                                            curve_server_key, curve_client_key)
        self.address = self._dealer.target.address
        self.dispatched: int | None = None
        self.generation: int | None = None

    def _ask(self, frame: bytes, request_id: int) -> bytes:
        self._dealer.send(frame, request_id, resends=1)
        return self._answer(request_id)

    def _answer(self, request_id: int) -> bytes:
        reply = self._dealer.receive(request_id)
        try:
            raise_if_error(reply)
        except ClientError as e:
            if "UNKNOWN_KIND" in str(e) and "expected SEND" in str(e):
                raise ClientError(f"{self.address} is a store's ingest socket, not its "
                                  "reader: the reader listens two ports below it "
                                  "(wire.endpoints.resolve gives both)") from e
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
        return self.fetch_reply(self.fetch_request(topic, queue_id, offset, max_msgs,
                                                  max_bytes, tags))

    def fetch_request(self, topic: str, queue_id: int, offset: int,
                      max_msgs: int = protocol.MAX_FETCH_MSGS,
                      max_bytes: int = protocol.MAX_FETCH_BYTES,
                      tags: str | Sequence[str] = "*") -> int:
        """``fetch`` sent without waiting for its answer: the request's id, for
        ``fetch_reply``. A reader of a queue asks for its next range before it decodes
        the last one, so the reader reads while the client decodes."""
        rid = self._dealer.next_id()
        expression = " || ".join(sorted(subscription_tags(tags))) or "*"
        self._dealer.send(protocol.encode_fetch(rid, topic, queue_id, offset, max_msgs,
                                                max_bytes, expression), rid, resends=1)
        return rid

    def fetch_reply(self, request_id: int) -> protocol.FetchReply:
        """The answer to ``fetch_request``'s request ``request_id``, as ``fetch``
        returns it (and raises what it raises)."""
        return protocol.decode_fetch_reply(self._answer(request_id))

    def forget(self, request_id: int) -> None:
        """Drop the answer to ``fetch_request``'s request ``request_id``, which will not
        be asked for (``fetch_reply``)."""
        self._dealer.forget(request_id)

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Record consumer ``group``'s next offset per queue of ``topic`` in the store's
        consumerOffset.json (merged with what local ``Consumer``s commit), all or
        nothing.

        Raises ``ClientError`` (BAD_REQUEST) for a group or topic name outside
        ``[A-Za-z0-9_%|-]{1,255}``, a topic the store does not have ("no topic T in this
        store ..."), a negative queue id or offset, or an offset past the queue's max
        offset.
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
