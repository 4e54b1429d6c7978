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

from typing import Callable

from storage.commit_log import CommitLog
from storage.consume_queue import ConsumeQueue
from storage.errors import CorruptRecordError
from storage.index_service import IndexService
from storage.message import is_consumable
from storage.record import DispatchRequest

ArrivingListener = Callable[[str, int, int, int, int], None]


class ReputMessageService:
    def __init__(self, commit_log: CommitLog,
                 find_consume_queue: Callable[[str, int], ConsumeQueue],
                 index_service: IndexService | None,
                 on_index_error: Callable[[], None] = lambda: None):
        self.commit_log = commit_log
        self.find_consume_queue = find_consume_queue
        self.index_service = index_service
        self.on_index_error = on_index_error
        self.arriving_listener: ArrivingListener | None = None
        self.reput_from_offset = 0
        self.logics_timestamp = 0  # store time of the last message given a queue unit

    def behind(self, end: int) -> int:
        return max(0, end - self.reput_from_offset)

    def do_reput(self, end: int) -> int:
        """Dispatch every record below ``end``; returns how many messages went."""
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
                req = cl.check_message_and_return_size(mf, pos, limit, False)
                if req.success and req.msg_size > 0:
                    self.dispatch(req)
                    pos += req.msg_size
                    count += 1
                elif req.success:
                    pos = mf.file_size
                    break
                else:
                    raise CorruptRecordError(mf.path, mf.file_from_offset + pos,
                                             "unreadable record below the confirmed position")
            self.reput_from_offset = mf.file_from_offset + pos
        return count

    def dispatch(self, req: DispatchRequest) -> None:
        if is_consumable(req.sys_flag):
            cq = self.find_consume_queue(req.topic, req.queue_id)
            cq.put_message_position_info(req.commit_log_offset, req.msg_size, req.tags_code,
                                         req.consume_queue_offset)
            self.logics_timestamp = req.store_timestamp
            if self.arriving_listener is not None:
                self.arriving_listener(req.topic, req.queue_id, req.consume_queue_offset + 1,
                                       req.tags_code, req.store_timestamp)
        if self.index_service is not None and not self.index_service.build_index(
                req.topic, req.commit_log_offset, req.store_timestamp, req.sys_flag,
                req.uniq_key, req.keys):
            self.on_index_error()
