"""Idempotent producers within one batch of the writer: who claims which sequence, and
what a duplicate or an out-of-order record is answered (``storage.producer_state`` holds
the table and the rules it judges by).

A record whose SEND carries a ``producer_id`` is judged (``admission``) against the
table and against what earlier records of the same batch claimed:

    verdict        stored   answer
    -------------  -------  -----------------------------------------------------------
    NEW            yes      its own result; its identity goes into its properties
                            (``__PID``/``__SEQ``) unless it carries it already
                            (SEND_RECORDS)
    DUPLICATE      no       PUT_OK, reason "duplicate: ...", with the original's msg id
                            and offsets when the table kept them or the original is in
                            this batch (whose fate it then shares, a refusal included)
    OUT_OF_ORDER   no       OUT_OF_ORDER_SEQUENCE, the expected sequence in
                            ``queue_offset`` and the reason

The table learns (``BatchClaims.settle``) only records the append stored, which form a
prefix of the batch, so no gap can enter it. A request answering a duplicate waits, like
its original, for the original's end to be flushed under SYNC_FLUSH: ``settle`` returns,
per request, the ``Cover`` its duplicates add (the end of their originals, and whether
one of them waits), and the writer applies it to its request.

Requests are the writer's. This module holds one only as a key (``claims.drop(request)``,
the keys ``settle`` returns) and never reads or sets anything on it; the answers go into
the request's ``results`` the writer hands over (index -> ``PutMessageResult``, as
``put_path.prepare_batch`` fills them).
"""

from __future__ import annotations

from typing import NamedTuple

from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.message import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE
from rocketstore.storage.producer_state import (
    ProducerEntry, ProducerStateTable, Verdict, expected_sequence, judge)
from rocketstore.storage.status import PutMessageStatus


class Cover(NamedTuple):
    """What a request's duplicates add to it: it answers only once the CommitLog covers
    ``end`` (the end of their originals), after the flush too when ``wait``."""
    end: int
    wait: bool


def admission(request: object, results, pids, seqs, claims: "BatchClaims", waits=None):
    """The ``admit`` and ``encoded`` steps (``put_path.prepare_batch``) of ``request``'s
    records, whose answers go into ``results``. A SEND_RECORDS record carries its
    identity already (``msg`` None; ``waits[i]`` says whether it waits)."""

    def admit(i: int, msg) -> bool:
        pid = pids[i]
        if not pid:
            return True
        seq = seqs[i]
        last = claims.last_sequence(pid)
        verdict = judge(last, seq)
        if verdict is Verdict.NEW:
            if msg is not None:
                msg.properties[PROPERTY_PRODUCER_ID] = str(pid)
                msg.properties[PROPERTY_PRODUCER_SEQUENCE] = str(seq)
            return True
        if verdict is Verdict.DUPLICATE:
            claims.duplicate(request, results, i, pid, seq,
                             waits[i] if msg is None else msg.wait_store_msg_ok)
        else:
            results[i] = out_of_order(pid, seq, last)
        return False

    def encoded(i: int) -> None:
        if pids[i]:
            claims.claim(pids[i], seqs[i], request, results, i)

    return admit, encoded


class BatchClaims:
    """One batch's records with producer ids: the sequences claimed by records handed
    to the append (so later records of the batch are judged against them), the
    duplicates of those claims, answered once the append told their fate, and what
    every request's duplicates add to it (``covers``)."""

    __slots__ = ("table", "last", "claimed", "order", "pending", "covers")

    def __init__(self, table: ProducerStateTable):
        self.table = table
        self.last: dict[int, int] = {}                         # producer -> last claimed
        self.claimed: dict[tuple[int, int], tuple[object, int]] = {}   # -> (results, i)
        self.order: list[tuple[int, int, object, object, int]] = []   # claims, in order
        self.pending: list[tuple[object, object, int, int, int, bool]] = []
        self.covers: dict[object, Cover] = {}                 # request -> its Cover

    def last_sequence(self, pid: int) -> int | None:
        last = self.last.get(pid)
        return self.table.last_sequence(pid) if last is None else last

    def claim(self, pid: int, seq: int, request: object, results, i: int) -> None:
        self.last[pid] = seq
        self.claimed[(pid, seq)] = (results, i)
        self.order.append((pid, seq, request, results, i))

    def duplicate(self, request: object, results, i: int, pid: int, seq: int,
                  wait: bool) -> None:
        """A duplicate of a record stored before this batch is answered now; one of
        a record of this batch after the append (``settle``)."""
        entry = self.table.get(pid)
        if entry is None or seq > entry.sequence:
            self.pending.append((request, results, i, pid, seq, wait))
            return
        if seq == entry.sequence:
            results[i] = PutMessageResult(
                PutMessageStatus.PUT_OK, entry.msg_id, entry.commit_log_offset, entry.size, entry.queue_id,
                entry.queue_offset, entry.store_timestamp,
                f"duplicate: producer {pid} sequence {seq} is stored already")
        else:
            results[i] = PutMessageResult(
                PutMessageStatus.PUT_OK, reason=f"duplicate: producer {pid} sequence {seq} is stored already "
                                f"(the last stored is {entry.sequence}; only its offsets "
                                "are kept)")
        self._cover(request, entry.end, wait)

    def drop(self, request: object) -> None:
        """Forget the claims of a request that failed before the append."""
        self.order = [c for c in self.order if c[2] is not request]
        self.pending = [d for d in self.pending if d[0] is not request]
        self.claimed = {(pid, seq): (results, i) for pid, seq, _, results, i in self.order}
        self.last = {}
        for pid, seq, _, _, _ in self.order:
            self.last[pid] = seq
        self.covers.pop(request, None)

    def settle(self) -> dict[object, Cover]:
        """After the append: the table learns what was stored; pending duplicates take
        their original's result. Returns what each request's duplicates add to it: a
        request answers only once its originals are covered too."""
        record = self.table.record
        for pid, seq, _, results, i in self.order:
            r = results[i]
            if r.status is PutMessageStatus.PUT_OK:
                record(pid, ProducerEntry(seq, r.store_timestamp, r.wrote_offset,
                                          r.wrote_bytes, r.queue_id, r.queue_offset,
                                          r.msg_id))
        for request, results, i, pid, seq, wait in self.pending:
            owner_results, k = self.claimed[(pid, seq)]
            r = owner_results[k]
            if r.status is PutMessageStatus.PUT_OK:
                results[i] = PutMessageResult(
                    PutMessageStatus.PUT_OK, r.msg_id, r.wrote_offset, r.wrote_bytes, r.queue_id,
                    r.queue_offset, r.store_timestamp,
                    f"duplicate: producer {pid} sequence {seq} was stored by this batch")
                self._cover(request, r.wrote_offset + r.wrote_bytes, wait)
            else:
                results[i] = PutMessageResult.refused(
                    r.status, f"{r.reason} (producer {pid} sequence {seq} came twice in one "
                              "batch; neither copy was stored)")
        return self.covers

    def _cover(self, request: object, end: int, wait: bool) -> None:
        """``request`` answers a duplicate whose original ends at ``end``."""
        old = self.covers.get(request)
        if old is not None:
            end, wait = max(end, old.end), wait or old.wait
        self.covers[request] = Cover(end, wait)


def out_of_order(pid: int, seq: int, last: int | None) -> PutMessageResult:
    expected = expected_sequence(last)
    if last is None:
        why = (f"producer {pid} is unknown (never seen, or idle longer than "
               f"producer_id_expiration_ms) and must start at 0")
    else:
        why = (f"a gap after sequence {last}: resend from the first unacknowledged "
               f"sequence")
    return PutMessageResult(PutMessageStatus.OUT_OF_ORDER_SEQUENCE, queue_offset=expected,
                            reason=f"out of order: producer {pid} sent sequence {seq}, "
                                   f"expected sequence {expected}; {why}")
