"""ReputMessageService: tails the CommitLog and dispatches every message it finds.

From ``reput_from_offset`` up to an end the caller gives (the confirm offset: flushed
under SYNC_FLUSH, written under ASYNC_FLUSH), each whole record becomes a
``DispatchRequest`` handed to the dispatchers, in order:

1. CommitLogDispatcherBuildConsumeQueue: NOT and COMMIT messages get their unit in the
   consume queue of (topic, queue id); PREPARED and ROLLBACK messages do not;
2. CommitLogDispatcherBuildIndex (when an index service is given): the unique key and
   each key, except for ROLLBACK messages;
3. the arriving listener (long polling), with the queue's next offset.

A BLANK moves on to the next file. Dispatch is idempotent: the consume queue skips units
it holds already, the index skips offsets below its end, so re-dispatching after a
crash or a restart is safe. A record that cannot be read below the end is a fault on
disk: ``CorruptRecordError`` stops dispatch loudly instead of skipping data.

Single-writer: one process dispatches (the dispatcher, or the embedded store's caller).
"""

from __future__ import annotations

import bisect

from typing import Callable

import numpy as np

from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.consume_queue import ConsumeQueue
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.dispatch_batch import RecordRun, parse_run, parse_small, walk
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE, is_consumable)
from rocketstore.storage.record import DispatchRequest

ArrivingListener = Callable[[str, int, int, int, int], None]
QueueListener = Callable[[str, int, int], None]  # topic, queue id, next offset

RUN_RECORDS = 4096      # records parsed together on the bulk path
MIN_RUN_RECORDS = 240   # fewer take the small path: the bulk path's numpy costs about
#                         0.3 ms a run however short (measured, 8 queues, a key each: 80
#                         records 4.3 us each one by one, 7.1 in bulk; 150 4.0 against 5.0;
#                         equal near 230; 500 3.3 against 2.1)
_CONSUMABLE = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


class ReputMessageService:
    def __init__(self, commit_log: CommitLog,
                 find_consume_queue: Callable[[str, int], ConsumeQueue],
                 index_service: IndexService | None,
                 on_index_error: Callable[[], None] = lambda: None):
        self.commit_log = commit_log
        self.find_consume_queue = find_consume_queue
        self.index_service = index_service
        self.on_index_error = on_index_error
        self.arriving_listener: ArrivingListener | None = None  # per message
        self.queue_listener: QueueListener | None = None  # per queue and dispatch step
        self.reput_from_offset = 0
        self.logics_timestamp = 0  # store time of the last message given a queue unit

    def behind(self, end: int) -> int:
        return max(0, end - self.reput_from_offset)

    def do_reput(self, end: int, known_starts: list[int] | None = None) -> int:
        """Dispatch every record below ``end``; returns how many messages went.

        Runs of at least ``MIN_RUN_RECORDS`` whole records go through the bulk path
        (``dispatch_batch.parse_run``, ``dispatch_run``), shorter ones through the small
        path (``parse_small``, ``dispatch_small``: struct, no numpy); a record either
        path stops before (an IPv6 host, damage, the end-of-file blank) goes one by one,
        with the same outcome. ``known_starts``:
        what ``dispatch_batch.walk`` gives from ``reput_from_offset`` in its file, up to
        ``end`` at most (a caller that walked already), taken instead of walking again."""
        count = 0
        cl = self.commit_log
        while self.reput_from_offset < end:
            min_offset = cl.get_min_offset()
            if self.reput_from_offset < min_offset:
                self.reput_from_offset = min_offset
                continue
            data = cl.get_data(self.reput_from_offset)
            if data is None:
                break
            mf, pos, limit = data
            limit = min(limit, pos + end - self.reput_from_offset)
            while pos < limit:
                starts = _known_run(known_starts, pos)
                if starts is None:
                    starts, _ = walk(mf.buf, pos, limit, RUN_RECORDS)
                if len(starts) >= MIN_RUN_RECORDS:
                    run = parse_run(mf.buf, starts, mf.file_from_offset, cl.delay_level_ms)
                    if run is not None:
                        self.dispatch_run(run)
                        pos = run.end
                        count += len(run)
                        continue
                elif starts:
                    records = parse_small(mf.buf, starts, mf.file_from_offset,
                                          cl.delay_level_ms)
                    if records:
                        self.dispatch_small(records)
                        pos = starts[len(records) - 1] + records[-1][0]
                        count += len(records)
                        continue
                step = self._dispatch_one(mf, pos, limit)
                if step == 0:
                    pos = mf.file_size
                    break
                pos += step
                count += 1
            self.reput_from_offset = mf.file_from_offset + pos
            known_starts = None             # positions in the first file only
        return count

    def _dispatch_one(self, mf, pos: int, limit: int) -> int:
        """Dispatch the record at ``pos``; its size, 0 for the end-of-file blank."""
        req = self.commit_log.check_message_and_return_size(mf, pos, limit, False)
        if not req.success:
            raise CorruptRecordError(mf.path, mf.file_from_offset + pos,
                                     "unreadable record below the confirmed position")
        if req.msg_size > 0:
            self.dispatch(req)
        return req.msg_size

    def dispatch(self, req: DispatchRequest) -> None:
        if is_consumable(req.sys_flag):
            cq = self.find_consume_queue(req.topic, req.queue_id)
            cq.put_message_position_info(req.commit_log_offset, req.msg_size, req.tags_code,
                                         req.consume_queue_offset)
            self.logics_timestamp = req.store_timestamp
            if self.arriving_listener is not None:
                self.arriving_listener(req.topic, req.queue_id, req.consume_queue_offset + 1,
                                       req.tags_code, req.store_timestamp)
            if self.queue_listener is not None:
                self.queue_listener(req.topic, req.queue_id, req.consume_queue_offset + 1)
        if self.index_service is not None and not self.index_service.build_index(
                req.topic, req.commit_log_offset, req.store_timestamp, req.sys_flag,
                req.uniq_key, req.keys):
            self.on_index_error()

    def dispatch_small(self, records: list[tuple]) -> None:
        """``dispatch`` for each record of ``parse_small`` (``SmallRecord``'s order), its
        keys raw."""
        find = self.find_consume_queue
        index = self.index_service
        arriving, listener = self.arriving_listener, self.queue_listener
        for size, topic, queue_id, phys, code, store_ts, queue_offset, keys, uniq_key, \
                sys_flag in records:
            if sys_flag & TRANSACTION_ROLLBACK_TYPE in _CONSUMABLE:
                find(topic, queue_id).put_message_position_info(phys, size, code, queue_offset)
                self.logics_timestamp = store_ts
                if arriving is not None:
                    arriving(topic, queue_id, queue_offset + 1, code, store_ts)
                if listener is not None:
                    listener(topic, queue_id, queue_offset + 1)
            if index is not None and not index.build_index_raw(topic, phys, store_ts, sys_flag,
                                                               uniq_key, keys):
                self.on_index_error()

    def dispatch_run(self, run: RecordRun) -> None:
        """``dispatch`` for every record of ``run``: each queue's units as one block, the
        index entries as one block per index file."""
        kind = run.sys_flags & TRANSACTION_ROLLBACK_TYPE
        consumable = np.flatnonzero((kind == TRANSACTION_NOT_TYPE)
                                    | (kind == TRANSACTION_COMMIT_TYPE))
        if len(consumable):
            for (topic, queue_id), members in _by_queue(run, consumable):
                cq = self.find_consume_queue(topic, queue_id)
                cq.put_units(run.physical_offsets[members], run.sizes[members],
                             run.tags_codes[members], run.queue_offsets[members])
                if self.queue_listener is not None:
                    self.queue_listener(topic, queue_id,
                                        int(run.queue_offsets[members[-1]]) + 1)
            if self.arriving_listener is not None:
                for i in consumable.tolist():
                    self.arriving_listener(run.topics[i], int(run.queue_ids[i]),
                                           int(run.queue_offsets[i]) + 1,
                                           int(run.tags_codes[i]), int(run.store_timestamps[i]))
            self.logics_timestamp = int(run.store_timestamps[consumable[-1]])
        if self.index_service is not None and not self.index_service.build_index_run(
                run.topics, run.physical_offsets, run.store_timestamps, run.sys_flags,
                run.uniq_keys, run.keys):
            self.on_index_error()


def _known_run(known: list[int] | None, pos: int) -> list[int] | None:
    """The next run's starts from ``known`` when it holds a record starting at ``pos``."""
    if not known or pos > known[-1]:
        return None
    k = bisect.bisect_left(known, pos)
    return known[k:k + RUN_RECORDS] if known[k] == pos else None


def _by_queue(run: RecordRun, which: np.ndarray) -> list[tuple[tuple[str, int], np.ndarray]]:
    """The records ``which`` grouped by (topic, queue id), each group in CommitLog order."""
    ids = {t: i for i, t in enumerate(dict.fromkeys(run.topics))}
    topic_ids = np.fromiter(map(ids.__getitem__, run.topics), np.int64,
                            len(run.topics))[which]
    queue_keys = (topic_ids << 32) | (run.queue_ids[which] & 0xFFFF_FFFF)
    order = np.argsort(queue_keys, kind="stable")
    ranked = queue_keys[order]
    cuts = np.flatnonzero(ranked[1:] != ranked[:-1]) + 1
    groups = []
    for members in np.split(which[order], cuts):
        i = int(members[0])
        groups.append(((run.topics[i], int(run.queue_ids[i])), members))
    return groups
