"""A SEND's results as columns, so a batch of records is answered without a Python object
per record: status, queue id, queue offset, CommitLog offset, size and store time are
arrays; reasons and the rare explicit msg ids are kept by index.

The writer fills them in bulk (``stored``, ``fill``, ``time_out``) and, where one record
has its own story (an idempotent producer's duplicate), one at a time through
``results[i] = PutMessageResult(...)``; ``results[i]`` reads one back. The reply is built
from the columns: SEND_RECORDS_REPLY directly, SEND_REPLY record by record.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rocketstore.wire import protocol
from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.status import PutMessageStatus

_STATUS = {s.value: s for s in PutMessageStatus}
_UNSET = 255
_PUT_OK = PutMessageStatus.PUT_OK.value


class SendResults:
    __slots__ = ("prefix", "status", "queue_id", "queue_offset", "offset", "size",
                 "store_timestamp", "reasons", "msg_ids")

    def __init__(self, count: int, msg_id_prefix: str):
        self.prefix = msg_id_prefix          # the store host's bytes, hex
        self.status = np.full(count, _UNSET, np.uint8)
        self.queue_id = np.full(count, -1, np.int64)
        self.queue_offset = np.full(count, -1, np.int64)
        self.offset = np.full(count, -1, np.int64)
        self.size = np.zeros(count, np.int64)
        self.store_timestamp = np.zeros(count, np.int64)
        self.reasons: dict[int, str] = {}
        self.msg_ids: dict[int, str] = {}    # ids that are not the store host's + offset

    def __len__(self) -> int:
        return len(self.status)

    def __setitem__(self, i: int, r: PutMessageResult) -> None:
        self.status[i] = r.status.value
        self.queue_id[i] = r.queue_id
        self.queue_offset[i] = r.queue_offset
        self.offset[i] = r.wrote_offset
        self.size[i] = r.wrote_bytes
        self.store_timestamp[i] = r.store_timestamp
        self._reason(i, r.reason)
        if r.msg_id and r.msg_id != self._derived_id(r.wrote_offset):
            self.msg_ids[i] = r.msg_id
        else:
            self.msg_ids.pop(i, None)

    def __getitem__(self, i: int) -> PutMessageResult:
        offset = int(self.offset[i])
        return PutMessageResult(_STATUS[int(self.status[i])],
                                self.msg_ids.get(i) or self._derived_id(offset), offset,
                                int(self.size[i]), int(self.queue_id[i]),
                                int(self.queue_offset[i]), int(self.store_timestamp[i]),
                                self.reasons.get(i, ""))

    def _derived_id(self, offset: int) -> str:
        return f"{self.prefix}{offset:016X}" if offset >= 0 else ""

    def _reason(self, i: int, reason: str) -> None:
        if reason:
            self.reasons[i] = reason
        else:
            self.reasons.pop(i, None)

    def fill(self, r: PutMessageResult) -> None:
        """Every record gets ``r`` (a refusal of the whole request)."""
        for i in range(len(self)):
            self[i] = r

    def unset(self) -> np.ndarray:
        """Indexes of the records not answered yet."""
        return np.nonzero(self.status == _UNSET)[0]

    def stored(self, slots: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
               queue_ids, queue_offsets, store_timestamp: int) -> None:
        """Records ``slots`` were appended where ``offsets`` say."""
        self.status[slots] = _PUT_OK
        self.offset[slots] = offsets
        self.size[slots] = sizes
        self.queue_id[slots] = queue_ids
        self.queue_offset[slots] = queue_offsets
        self.store_timestamp[slots] = store_timestamp

    def refuse(self, slots, status: PutMessageStatus, reason: str) -> None:
        for i in np.asarray(slots, np.int64).tolist():
            self[i] = PutMessageResult.refused(status, reason)

    def time_out(self, reason: str,
                 status: PutMessageStatus = PutMessageStatus.FLUSH_DISK_TIMEOUT) -> None:
        """Every PUT_OK (stored records and duplicates of stored ones) becomes
        ``status``: FLUSH_DISK_TIMEOUT (stored, but not known to be on disk),
        FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE (stored, not known to be on a slave)."""
        ok = np.nonzero(self.status == _PUT_OK)[0]
        self.status[ok] = status.value
        for i in ok.tolist():
            self.reasons[i] = reason

    def reply(self, kind: protocol.Kind, request_id: int, store_host: bytes) -> bytes:
        """The reply frame for a request of ``kind`` (SEND or SEND_RECORDS). A
        SEND_RECORDS_REPLY carries no msg ids: the client derives each from the store
        host and the record's offset, as the store does."""
        if kind is protocol.Kind.SEND_RECORDS:
            return protocol.encode_send_records_reply(
                request_id, store_host,
                {"status": self.status, "queue_id": self.queue_id,
                 "queue_offset": self.queue_offset, "commit_log_offset": self.offset,
                 "store_timestamp": self.store_timestamp}, self.reasons)
        return protocol.encode_send_reply(request_id, [self[i] for i in range(len(self))])


class SmallResults:
    """The results of a small SEND_RECORDS request (the writer's small path), as plain
    lists: below ``protocol.SMALL_COLUMNS`` records, numpy's columns cost more than the
    values. The same interface as ``SendResults`` where the writer answers or parks a
    request: ``status`` (values), ``time_out``, ``reply``."""

    __slots__ = ("status", "queue_id", "queue_offset", "offset", "store_timestamp", "reasons",
                 "failed_append")

    def __init__(self, status: list[int], queue_id: list[int], queue_offset: list[int],
                 offset: list[int], store_timestamp: list[int], reasons: dict[int, str],
                 failed_append: bool = False):
        self.status, self.queue_id, self.queue_offset = status, queue_id, queue_offset
        self.offset, self.store_timestamp, self.reasons = offset, store_timestamp, reasons
        self.failed_append = failed_append   # the append raised: the bytes past WRITTEN

    @classmethod
    def stored(cls, done, sizes: list[int], queue_ids: list[int], store_timestamp: int,
               failure: Callable[[], str]) -> "SmallResults":
        """The first ``done.count`` records stored where ``done`` (``Appended``, None
        when the append raised) says, the others CREATE_MAPEDFILE_FAILED for the reason
        ``failure()`` gives (asked only then)."""
        n = len(sizes)
        count = done.count if done is not None else 0
        if count == n:
            return cls([_PUT_OK] * n, queue_ids, done.queue_offsets, done.physical_offsets,
                       [store_timestamp] * n, {})
        failure = failure()
        failed = PutMessageStatus.CREATE_MAPEDFILE_FAILED.value
        return cls([_PUT_OK] * count + [failed] * (n - count),
                   list(queue_ids[:count]) + [-1] * (n - count),
                   list(done.queue_offsets) + [-1] * (n - count) if count else [-1] * n,
                   list(done.physical_offsets) + [-1] * (n - count) if count else [-1] * n,
                   [store_timestamp] * count + [0] * (n - count),
                   {i: failure for i in range(count, n)}, done is None)

    def time_out(self, reason: str,
                 status: PutMessageStatus = PutMessageStatus.FLUSH_DISK_TIMEOUT) -> None:
        """``SendResults.time_out``: every PUT_OK becomes ``status``, with ``reason``."""
        for i, value in enumerate(self.status):
            if value == _PUT_OK:
                self.status[i] = status.value
                self.reasons[i] = reason

    def reply(self, kind: protocol.Kind, request_id: int, store_host: bytes) -> bytes:
        """The SEND_RECORDS_REPLY (the small path takes no other kind)."""
        if len(self.status) == 1 and not self.reasons:
            return protocol.encode_one_send_records_reply(
                request_id, store_host, self.status[0], self.queue_id[0],
                self.queue_offset[0], self.offset[0], self.store_timestamp[0])
        return protocol.encode_send_records_reply(
            request_id, store_host,
            {"status": self.status, "queue_id": self.queue_id,
             "queue_offset": self.queue_offset, "commit_log_offset": self.offset,
             "store_timestamp": self.store_timestamp}, self.reasons)
