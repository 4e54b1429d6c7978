"""MessageStore: the embedded store (RocketMQ's DefaultMessageStore) in one process.

It owns the CommitLog, the consume queues (``logic_queues``: ``storage.logic_queues``,
the table the dispatcher process uses too, queues created on demand), the index service
and the checkpoint, and runs in the caller's thread what RocketMQ runs in service
threads:

    RocketMQ service            here
    ------------------------    -----------------------------------------------------
    put lock + doAppend         ``put`` / ``put_batch`` (one re-entrant lock)
    GroupCommitService          SYNC_FLUSH: the put flushes before it returns
    FlushRealTimeService        ASYNC_FLUSH: a put flushes when ``flush_interval_commit_log``
                                has passed (least-pages rule, thorough every 10 s)
    ReputMessageService         ``dispatch()``; reads dispatch first, so they see every
                                message put before them
    ScheduleMessageService      ``deliver_delayed_messages()``
    FlushConsumeQueueService    after dispatch, on its interval (``LogicQueues``); persists
                                the checkpoint
    Clean*Service               ``clean_expired_files()``

Lifecycle: ``load()`` takes the ``lock`` file, recovers (abnormal when ``abort``
exists), re-dispatches what the consume queues and index miss, and creates ``abort``;
``close()`` catches dispatch up, flushes everything and the checkpoint, and removes
``abort`` only when all of that succeeded.

Recovery (``load``) runs table R of ``storage/recovery_plan.py``: once the files are
mapped and the consume queues and index loaded, ``recovery_plan.plan`` gets what the load
found (CommitLog files or none, ``abort``, a queue or the index destroyed at load) and
returns one row (R1-R5); the load logs it and does what it says: the scan, then destroy,
catch up or rebuild the consume queues and index, then rewind torn units or not.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Callable, Iterable, Sequence

from rocketstore.storage import expiry
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.commit_log import CommitLog, PutMessageResult, RecoveryResult
from rocketstore.storage.config import StoreConfig, check_geometry, record_geometry
from rocketstore.storage.consume_queue import ConsumeQueue
from rocketstore.storage.logic_queues import LogicQueues
from rocketstore.storage.errors import StoreClosedError, StoreConfigError, StoreError, StoreFileError
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.mapped_file import now_ms
from rocketstore.storage.message import Message, MessageExt
from rocketstore.storage.message_view import view_at
from rocketstore.storage.bulk_read import QueueUnits, read_records
from rocketstore.storage.consume_queue import CQ_STORE_UNIT_SIZE
from rocketstore.storage.read_path import (
    BULK_READ_MIN, GetMessageResult, QueryMessageResult, bulk_result,
    check_unit_record, get_from_queue, look_message_by_id, memory_limit_bytes, query_messages,
    subscription_tags)
from rocketstore.storage import recovery_plan as plan
from rocketstore.storage.record import SCHEDULE_TOPIC
from rocketstore.storage.reput import ArrivingListener, ReputMessageService
from rocketstore.storage.running_flags import Flag, RunningFlags
from rocketstore.storage.schedule_message import ScheduleMessageService
from rocketstore.storage.put_path import (QueueSelector, StoreCondition, put_messages, refusal,
                                          stored_slots)
from rocketstore.storage.check import check_store
from rocketstore.storage.store_services import StoreServices
from rocketstore.storage.status import GetMessageStatus, PutMessageStatus
from rocketstore.storage.store_lock import StoreLock, abort_exists, create_abort, remove_abort
from rocketstore.storage import file_modes

log = logging.getLogger(__name__)



@dataclasses.dataclass
class CleanResult:
    commit_log_files: int = 0
    consume_queue_files: int = 0
    index_files: int = 0
    disk_full: bool = False
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)


class MessageStore:
    def __init__(self, config: StoreConfig, *, take_lock: bool = True,
                 background: bool = True):
        """``take_lock=False`` is for a caller that holds the store's ``lock`` file
        itself (the supervisor, which recovers the store before its processes start).
        ``background=False`` runs no service threads (``storage.store_services``): the
        caller drives flush, dispatch, expiry and delivery by hand.

        Raises ``StoreConfigError`` for ``transient_store_pool_enable``: the pool lives
        in shared memory between the multiprocess store's writer and flusher
        (``rocketstore up``); the embedded store writes through its mappings. And for
        ``broker_role = "SYNC_MASTER"``: replication is the multiprocess store's (its HA
        process); an embedded SYNC_MASTER would acknowledge what no slave holds."""
        if config.transient_store_pool_enable:
            raise StoreConfigError(
                "transient_store_pool_enable is a setting of the multiprocess store "
                "(rocketstore up): the embedded store writes through its mappings")
        if config.broker_role == "SYNC_MASTER":
            raise StoreConfigError(
                'broker_role = "SYNC_MASTER" needs the multiprocess store (rocketstore up), '
                "whose HA process serves the slave its acknowledgements wait for")
        self.config = config
        file_modes.use_umask(config.data_umask)
        self.background = background
        self.services: StoreServices | None = None
        self._take_lock = take_lock
        self.root_dir = config.store_path_root_dir
        self.commit_log = CommitLog(config)
        self.logic_queues = LogicQueues(config)
        self.index_service = IndexService(config.index_dir, config.max_hash_slot_num,
                                          config.max_index_num)
        self.checkpoint: StoreCheckpoint | None = None
        self.schedule_message_service = ScheduleMessageService(
            _EmbeddedDelayQueues(self), self.commit_log.delay_level_ms, config.config_dir)
        self.running_flags = RunningFlags()
        self.reput = ReputMessageService(
            self.commit_log, self.find_consume_queue,
            self.index_service if config.message_index_enable else None,
            lambda: self.running_flags.set(Flag.WRITE_INDEX_FILE_ERROR,
                                           "cannot create an index file"))
        self.last_exit_ok = True
        self.disk_used_ratio: Callable[[str], float] = expiry.disk_partition_used_ratio
        self._lock_file = StoreLock(self.root_dir)
        self._mutex = threading.RLock()
        self._state = "new"
        self._queue_selector = QueueSelector(config.default_topic_queue_nums)
        self._topic_verdicts: dict = {}     # a topic's bytes -> its name or refusal
        self._last_put_ms = 0
        self._last_flush_ms = self._last_thorough_flush_ms = now_ms()
        self._rebuild_logics = False
        self._sizes_recorded = False

    # ================================================================== lifecycle
    def load(self) -> None:
        """Lock the directory, recover, re-dispatch, and mark the run as started.

        Raises ``StoreLockedError`` when another process has the store open,
        ``StoreFileError`` for a file that cannot be used as it is.
        """
        with self._mutex:
            if self._state != "new":
                raise StoreClosedError("load() may be called once per MessageStore")
            file_modes.make_dirs(self.root_dir)
            if self._take_lock:
                self._lock_file.acquire()
            try:
                self.last_exit_ok = not abort_exists(self.root_dir)
                log.info("last shutdown %s", "normally" if self.last_exit_ok else "abnormally")
                sizes_recorded = self._sizes_recorded = check_geometry(self.config)
                self.commit_log.load(sizes_confirmed=sizes_recorded)
                self._load_consume_queues()
                self.checkpoint = StoreCheckpoint(os.path.join(self.root_dir, "checkpoint"))
                self._load_index()
                self._recover()
                self.schedule_message_service.load()
                if not sizes_recorded:
                    record_geometry(self.config)
                create_abort(self.root_dir)
                if self._take_lock:    # the appender (not the supervisor's recovery)
                    self.commit_log.start_allocation()
            except BaseException:
                self._close_files()
                self._lock_file.release()
                self._state = "closed"
                raise
            self._state = "running"
            if self._take_lock and self.background:
                self.services = StoreServices(self)
                self.services.start()

    def close(self, *, remove_abort_file: bool = True) -> None:
        """Clean shutdown: dispatch, flush everything, then remove ``abort``.

        ``abort`` stays when the store was not writeable or a flush failed, so the next
        load runs abnormal recovery, and when ``remove_abort_file`` is False (the
        supervisor hands the recovered files over to its processes: the run goes on).
        """
        if self.services is not None:      # outside the lock: a turn may be waiting on it
            self.services.stop()
            self.services = None
        with self._mutex:
            if self._state != "running":
                return
            clean = True
            try:
                self._dispatch_to(self._confirm_offset())
            except StoreError as e:
                log.error("shutdown dispatch failed, abort file kept: %s", e)
                clean = False
            try:
                self.flush()
                clean = clean and self.running_flags.is_writeable() and \
                    self.dispatch_behind_bytes() == 0
            except (OSError, StoreError) as e:
                log.error("shutdown flush failed, abort file kept: %s", e)
                clean = False
            finally:
                if clean and remove_abort_file:
                    remove_abort(self.root_dir)
                self._close_files()
                self._lock_file.release()
                self._state = "closed"

    def __enter__(self) -> "MessageStore":
        if self._state == "new":
            self.load()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _close_files(self) -> None:
        self.commit_log.close()
        self.logic_queues.close()
        self.index_service.close()
        if self.checkpoint is not None:
            self.checkpoint.close()

    @property
    def reput_from_offset(self) -> int:
        return self.reput.reput_from_offset

    @reput_from_offset.setter
    def reput_from_offset(self, offset: int) -> None:
        self.reput.reput_from_offset = offset

    @property
    def message_arriving_listener(self) -> ArrivingListener | None:
        """Called with (topic, queue id, next offset, tagsCode, store time) per message
        dispatched: RocketMQ's MessageArrivingListener, for long polling."""
        return self.reput.arriving_listener

    @message_arriving_listener.setter
    def message_arriving_listener(self, listener: ArrivingListener | None) -> None:
        self.reput.arriving_listener = listener

    def _check_running(self) -> None:
        if self._state != "running":
            raise StoreClosedError(f"the store at {self.root_dir} is {self._state}, not running")

    # ================================================================== recovery
    def _load_consume_queues(self) -> None:
        """Load every queue; in a store that recorded its file sizes, one that cannot be
        loaded (a damaged file) is rebuilt from the CommitLog. Without that record a
        wrong size may be a configuration mistake, and the load fails instead."""
        for cq in self.logic_queues.discover():
            try:
                cq.load()
            except StoreError as e:
                if not self._sizes_recorded:  # maybe a misconfiguration: touch nothing
                    raise
                log.warning("consume queue %s/%s unusable, rebuilding it from the "
                            "commitlog: %s", cq.topic, cq.queue_id, e)
                cq.destroy()
                self._rebuild_logics = True

    def _load_index(self) -> None:
        """Load the index; an index that cannot be loaded is rebuilt from the CommitLog."""
        try:
            self.index_service.load(self.last_exit_ok, self.checkpoint.index_msg_timestamp)
        except StoreError as e:
            if not self._sizes_recorded:  # maybe a misconfiguration: touch nothing
                raise
            log.warning("index unusable, rebuilding it from the commitlog: %s", e)
            self.index_service.destroy()
            self._rebuild_logics = True

    def _recover(self) -> None:
        """Act on the row ``recovery_plan.plan`` gives for what the load found."""
        max_cq_end = self.logic_queues.recover()
        row = plan.plan(plan.RecoveryInputs(
            abort=not self.last_exit_ok, commit_log=self._commit_log_files(),
            logics=plan.Logics.UNUSABLE if self._rebuild_logics else plan.Logics.LOADED))
        log.info("recovery row %s: %s", row.label, row.action)
        result = self._scan(row.scan)
        end = result.process_offset
        if row.logics is plan.LogicsAction.DESTROY:
            self._destroy_logics_left()
            reput = 0
        else:
            self._cut_logics_at(end, max_cq_end)
            reput = self._redispatch_start(row.logics, max_cq_end, result.redispatch_from,
                                           end)
        if row.rewind_torn_units:
            reput = min(reput, self._rewind_torn_units())
        self.reput_from_offset = reput
        self._dispatch_to(end)
        self._recover_topic_queue_table()

    def _scan(self, scan: plan.Scan) -> RecoveryResult:
        """The row's CommitLog scan; its recovered end is where the files now end."""
        if scan is plan.Scan.NORMAL:
            return self.commit_log.recover_normally()
        if scan is plan.Scan.ABNORMAL:
            return self.commit_log.recover_abnormally(self._recovery_min_timestamp())
        return RecoveryResult(0, 0)           # no files: nothing to scan

    def _destroy_logics_left(self) -> None:
        """No CommitLog file: nothing any consume queue or index entry points to exists."""
        if len(self.logic_queues) or self.index_service.files:
            log.warning("no commitlog files: destroying consume queues and index")
        self.logic_queues.destroy()
        self.index_service.destroy()

    def _cut_logics_at(self, end: int, max_cq_end: int) -> None:
        """Index entries past the recovered ``end`` go, and the units of any consume
        queue that reaches past it (RocketMQ's truncateDirtyLogicFiles)."""
        self.index_service.truncate(
            end, lambda phy: self.commit_log.pickup_store_timestamp(phy, 80))
        if max_cq_end > end:
            log.warning("consume queues reach %d past the commitlog end %d: truncating",
                        max_cq_end, end)
            self.logic_queues.truncate_dirty(end)

    def _rewind_torn_units(self) -> int:
        """After an unclean stop, the last unit of each consume queue against its record.

        A process killed while copying units into a queue leaves a prefix of them: the
        last one may have its offset and size but not (all of) its tags code, and it
        looks valid. A last unit whose record does not give the same queue, queue
        offset, size and tags code is rewound (``rewind_to``) for re-dispatch to write
        again. Returns the earliest record rewound (``2**63`` when none was)."""
        earliest = 2**63
        min_offset = self.commit_log.get_min_offset()
        for cq in self.all_consume_queues():
            last = cq.last_unit()
            if last is None or last[1] < min_offset:      # its record expired: nothing
                continue                                 # to compare it with or rewrite
            index, phy, size, tags_code = last
            found = self.commit_log.get_data(phy)
            req = None if found is None else self.commit_log.check_message_and_return_size(
                found[0], found[1], found[2], False)
            if req is not None and req.success and cq.is_unit_of(req, index, size, tags_code):
                continue
            log.warning("consume queue %s/%d: unit %d (commitlog %d) is torn or stale: "
                        "written again", cq.topic, cq.queue_id, index, phy)
            cq.rewind_to(phy)
            earliest = min(earliest, phy)
        return earliest

    def _commit_log_files(self) -> plan.CommitLogFiles:
        """The ``commit_log`` input as the load left it (a file that cannot be used
        failed the load before recovery decides anything)."""
        if not self.commit_log.mapped_file_queue.mapped_files:
            return plan.CommitLogFiles.NONE
        return plan.CommitLogFiles.PRESENT

    def _recovery_min_timestamp(self) -> int:
        if self.config.message_index_enable and self.config.message_index_safe:
            return self.checkpoint.min_timestamp_index()
        return self.checkpoint.min_timestamp()

    def _redispatch_start(self, logics: plan.LogicsAction, max_cq_end: int,
                          abnormal_start: int, process_offset: int) -> int:
        """Where re-dispatch starts: REBUILD, the first CommitLog byte; CATCH_UP, the
        earliest offset some consume queue or the index may be missing (the furthest
        queue end, the index end, and ``abnormal_start``: the abnormal scan's first
        file, the recovered end after a normal one). Never past ``process_offset``."""
        min_offset = max(self.commit_log.get_min_offset(), 0)
        if logics is plan.LogicsAction.REBUILD:
            return min(min_offset, process_offset)
        starts = [max_cq_end if max_cq_end >= 0 else min_offset, abnormal_start]
        if self.config.message_index_enable:
            files = self.index_service.files
            starts.append(files[-1].end_phy_offset if files else min_offset)
        return min(max(min(starts), min_offset), process_offset)

    def _recover_topic_queue_table(self) -> None:
        table = {}
        min_phy = self.commit_log.get_min_offset()
        for cq in self.all_consume_queues():
            table[(cq.topic, cq.queue_id)] = cq.get_max_offset_in_queue()
            cq.correct_min_offset(min_phy)
        self.commit_log.set_topic_queue_table(table)

    # ================================================================== put
    def put(self, msg: Message) -> PutMessageResult:
        """Store one message; the result's status says whether, and why not."""
        return self.put_batch([msg])[0]

    def put_batch(self, msgs: Sequence[Message]) -> Sequence[PutMessageResult]:
        """Store messages in order, one result each; a refused message stores nothing and
        does not stop the others. Under SYNC_FLUSH it returns once the stored ones are
        flushed, or after ``sync_flush_timeout`` with FLUSH_DISK_TIMEOUT."""
        with self._mutex:
            refused = self._refusal()
            if refused:
                return [refused] * len(msgs)
            now = max(now_ms(), self._last_put_ms)     # store times never go back
            self._last_put_ms = now
            results = put_messages(self.commit_log, self.config, msgs, now,
                                   self._queue_selector, self._topic_verdicts)
            stored = stored_slots(results)
            services = self.services
            if services is None:
                if stored:
                    self._handle_disk_flush(results, stored)
                return results
            end = self.commit_log.get_max_offset()
        if stored:
            services.appended()
            if self.config.sync_flush:
                self._wait_flushed(services, end, results, stored)
        return results

    def _wait_flushed(self, services: StoreServices, end: int, results: list,
                      slots: list[int]) -> None:
        """GroupCommitService's answer: every stored message of the put waits for the
        flush; past ``sync_flush_timeout`` (or a failed flush) it is FLUSH_DISK_TIMEOUT."""
        if services.wait_flushed(end, self.config.sync_flush_timeout):
            return
        error = self.running_flags.detail.get(Flag.FLUSH_ERROR)
        why = f"flush failed: {error}" if error else \
            f"not flushed within sync_flush_timeout {self.config.sync_flush_timeout} ms"
        for i in slots:
            if results[i].ok:
                results[i].status = PutMessageStatus.FLUSH_DISK_TIMEOUT
                results[i].reason = why

    def _refusal(self) -> PutMessageResult | None:
        """``put_path.refusal`` of the store's condition: None at once for a running
        master with no flag raised, the state of nearly every put."""
        if self._state == "running" and not self.running_flags.flag_bits \
                and self.config.broker_role != "SLAVE":
            return None
        return refusal(self._condition())

    def _condition(self) -> StoreCondition:
        """The store's state, as the refusal rules of ``storage.put_path`` read it."""
        flags, detail = self.running_flags.flag_bits, self.running_flags.detail
        logics = flags & (Flag.WRITE_LOGICS_QUEUE_ERROR | Flag.WRITE_INDEX_FILE_ERROR)
        return StoreCondition(
            not_running=None if self._state == "running" else self._state,
            slave=self.config.broker_role == "SLAVE",
            flush_error=detail.get(Flag.FLUSH_ERROR, "fdatasync failed")
            if flags & Flag.FLUSH_ERROR else None,
            logics_error="; ".join(detail.get(f, f.name) for f in Flag if logics & f)
            if logics else None,
            disk_full=bool(flags & Flag.DISK_FULL))

    def _handle_disk_flush(self, results: list, slots: list[int]) -> None:
        try:
            if self.config.sync_flush:
                self.commit_log.mapped_file_queue.flush_all()
            else:
                self._flush_commit_log_on_interval()
        except OSError as e:
            self._flush_failed(e)
            if self.config.sync_flush:
                for i in slots:
                    if results[i].ok:
                        results[i].status = PutMessageStatus.FLUSH_DISK_TIMEOUT
                        results[i].reason = f"flush failed: {e}"

    def _flush_commit_log_on_interval(self) -> None:
        """FlushRealTimeService's turn: least pages on the interval, all of it on the
        thorough interval."""
        now = now_ms()
        if now - self._last_flush_ms < self.config.flush_interval_commit_log:
            return
        self._last_flush_ms = now
        least = self.config.flush_commit_log_least_pages
        if now - self._last_thorough_flush_ms >= self.config.flush_commit_log_thorough_interval:
            self._last_thorough_flush_ms = now
            least = 0
        self.commit_log.mapped_file_queue.flush_dirty(least)

    def flush_commit_log_on_interval(self) -> None:
        """The flush-commit-log service's turn (ASYNC_FLUSH)."""
        with self._mutex:
            self._check_running()
            try:
                self._flush_commit_log_on_interval()
            except OSError as e:
                self._flush_failed(e)

    def flush_commit_log_now(self) -> None:
        """The group commit's turn (SYNC_FLUSH): everything written, now."""
        with self._mutex:
            self._check_running()
            if self.running_flags.flag_bits & Flag.FLUSH_ERROR:
                return                      # never retried into success
            try:
                self.commit_log.mapped_file_queue.flush_all()
            except OSError as e:
                self._flush_failed(e)

    def flush_consume_queues_on_interval(self) -> None:
        """The flush-consume-queue service's turn."""
        with self._mutex:
            self._check_running()
            self.logic_queues.flush_on_interval(self._flush_logics)

    def _flush_failed(self, e: OSError) -> None:
        """A failed fdatasync is never retried into success: writes stop for good and
        ``abort`` stays, so the next start recovers from what is really on disk."""
        log.error("flush failed, refusing writes: %s", e)
        self.running_flags.set(Flag.FLUSH_ERROR, f"fdatasync failed: {e}")

    # ================================================================== dispatch
    def _confirm_offset(self) -> int:
        """Dispatch never passes this: the flushed end under SYNC_FLUSH, else the written."""
        if self.config.sync_flush:
            return self.commit_log.mapped_file_queue.flushed_where
        return self.commit_log.get_max_offset()

    def dispatch_behind_bytes(self) -> int:
        return max(0, self.commit_log.get_max_offset() - self.reput_from_offset)

    def dispatch(self) -> int:
        """Reput everything written so far into consume queues and the index.

        Returns the number of messages dispatched.
        """
        with self._mutex:
            self._check_running()
            n = self._dispatch_to(self._confirm_offset())
            self.logic_queues.flush_on_interval(self._flush_logics)
            return n

    def _dispatch_to(self, end: int) -> int:
        """Dispatch up to ``end``. A consume queue or index file that cannot be created
        (disk full) stops dispatch where it is and refuses puts until it can."""
        try:
            count = self.reput.do_reput(end)
        except StoreFileError as e:
            if self.running_flags.set(Flag.WRITE_LOGICS_QUEUE_ERROR, str(e)):
                log.error("dispatch stopped, refusing writes: %s", e)
            return 0
        self.running_flags.clear(Flag.WRITE_LOGICS_QUEUE_ERROR)
        return count

    def find_consume_queue(self, topic: str, queue_id: int, *, create: bool = True) -> ConsumeQueue | None:
        return self.logic_queues.find(topic, queue_id, create=create)

    def all_consume_queues(self) -> list[ConsumeQueue]:
        return self.logic_queues.all()

    # ================================================================== flush
    def flush(self) -> None:
        """Flush CommitLog, consume queues, index and checkpoint. Raises ``OSError``."""
        with self._mutex:
            self._check_running()
            try:
                self.commit_log.mapped_file_queue.flush_all()
            except OSError as e:
                self._flush_failed(e)
                raise
            self._flush_logics()
            self.schedule_message_service.persist()

    def _flush_logics(self) -> None:
        """FlushConsumeQueueService.doFlush: queues, index, then the checkpoint. A failed
        fdatasync stops writes (``_flush_failed``) and is raised."""
        try:
            self.logic_queues.flush_logics(
                self.index_service, self.checkpoint, self.reput.logics_timestamp,
                physic_ts=self.commit_log.mapped_file_queue.store_timestamp)
        except OSError as e:
            self._flush_failed(e)
            raise

    # ================================================================== reads
    def get_message(self, group: str, topic: str, queue_id: int, offset: int,
                    max_msgs: int = 32, tags: Iterable[str] | str | None = None) -> GetMessageResult:
        """Pull up to ``max_msgs`` messages of one queue from logical ``offset``, under
        RocketMQ's pull limits (``max_transfer_count_on_message_in_memory`` and its
        bytes; fewer for data far behind the CommitLog end, read unit by unit).

        ``tags`` (optional) keeps only messages whose tag is one of them ("*" or "":
        every message, as a RocketMQ subscription; a message without tags matches
        only those). The messages are ``MessageView``s: every ``MessageExt`` field by
        name, decoded when first read (``to_ext()`` for the whole object). Without a tag
        filter, ``BULK_READ_MIN`` messages or more are read as a ``Consumer`` reads them
        (``read_path.bulk_result``). Raises ``CorruptRecordError`` if a consume queue
        unit points at a record that is not the message it should be.
        """
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            cq = self.find_consume_queue(topic, queue_id, create=False)
            if cq is None:
                return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            wanted = [tags] if isinstance(tags, str) else tags
            most = min(max_msgs, self.config.max_transfer_count_on_message_in_memory)
            if lo <= offset and min(hi - offset, most) >= BULK_READ_MIN \
                    and not subscription_tags(wanted):
                found = self._bulk_get(cq, offset, most, lo, hi)
                if found is not None:
                    return found

            def read_unit(index: int, phy: int, size: int, where: tuple[str, int]):
                data = self.commit_log.get_message(phy, size)
                return None if data is None else \
                    check_unit_record(data, topic, queue_id, index, phy, size, where,
                                      decode=view_at)

            return get_from_queue(
                cq, offset, max_msgs, wanted, lo, hi, read_unit,
                config=self.config, max_phy=self.commit_log.get_max_offset(),
                memory_limit=memory_limit_bytes(self.config),
                roll_next_file=self.commit_log.roll_next_file)

    def _bulk_get(self, cq: ConsumeQueue, offset: int, most: int, lo: int,
                  hi: int) -> GetMessageResult | None:
        """Up to ``most`` messages from ``offset`` (``lo <= offset < hi``) in one read of
        their units and one copy per CommitLog span, within the in-memory byte limit;
        None when they must be read unit by unit (``read_path.bulk_result``)."""
        units = cq.read_units(offset, most, hi)
        if not units:
            return None
        count = len(units) // CQ_STORE_UNIT_SIZE
        got = read_records(QueueUnits(units, offset, count, lo, hi),
                           self.config.max_transfer_bytes_on_message_in_memory, True,
                           self.config.mapped_file_size_commit_log, self.commit_log.get_message,
                           joined=True)
        found = bulk_result(got, cq.topic, cq.queue_id)
        return None if found is None else found[0]

    def look_message_by_offset(self, commit_log_offset: int) -> MessageExt | None:
        with self._mutex:
            self._check_running()
            return self.commit_log.look_message_by_offset(commit_log_offset)

    def look_message_by_id(self, msg_id: str) -> MessageExt | None:
        """The message an offset msgId names; None for an id of another store or a
        message that is gone. Raises ``ValueError`` for text that is not a msgId."""
        return look_message_by_id(self.look_message_by_offset, msg_id)

    def query_message(self, topic: str, key: str, max_num: int | None = None, begin_ms: int = 0,
                      end_ms: int = 2**63 - 1) -> QueryMessageResult:
        """Messages of ``topic`` whose key or unique key is ``key``, stored in
        [begin_ms, end_ms], oldest first, at most ``max_num`` (default
        ``default_query_max_num``, capped at ``max_msgs_num_batch``). Every hit is
        re-read and checked, so a hash collision never returns a wrong message."""
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            return query_messages(
                self.index_service.files, self.commit_log.look_message_by_offset,
                self.config.max_msgs_num_batch, topic, key,
                self.config.default_query_max_num if max_num is None else max_num,
                begin_ms, end_ms)

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            cq = self.find_consume_queue(topic, queue_id, create=False)
            if cq is None:
                return 0
            return cq.get_offset_in_queue_by_time(timestamp_ms, self.commit_log.get_min_offset(),
                                                  self.commit_log.pickup_store_timestamp)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            cq = self.find_consume_queue(topic, queue_id, create=False)
            return cq.get_max_offset_in_queue() if cq else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        with self._mutex:
            self._check_running()
            cq = self.find_consume_queue(topic, queue_id, create=False)
            return cq.get_min_offset_in_queue() if cq else -1

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        with self._mutex:
            self._check_running()
            cq = self.find_consume_queue(topic, queue_id, create=False)
            unit = cq.get_unit(cq_offset) if cq else None
            return unit[0] if unit else 0

    def get_min_phy_offset(self) -> int:
        with self._mutex:
            self._check_running()
            return self.commit_log.get_min_offset()

    def get_max_phy_offset(self) -> int:
        with self._mutex:
            self._check_running()
            return self.commit_log.get_max_offset()

    # ================================================================== delayed messages
    def deliver_delayed_messages(self, now: int | None = None) -> int:
        """Put every delayed message due at ``now`` (default: the clock) back to its real
        topic and queue; returns how many went. See ``storage.schedule_message``."""
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            return self.schedule_message_service.deliver_due(now)

    def next_delayed_due_ms(self) -> int | None:
        """When the earliest waiting delayed message falls due, None when none waits."""
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            return self.schedule_message_service.next_due_ms()

    # ================================================================== expiry
    def clean_expired_files(self, force: bool = False, *, now: int | None = None) -> CleanResult:
        """One run of CleanCommitLogService then CleanConsumeQueueService.

        CommitLog files go when the hour is in ``delete_when``, the disk is too full, or
        ``force`` (a manual clean) — each only if unmodified for ``file_reserved_time``
        hours, unless the disk is past the forcible ratio. Consume queue and index files
        then follow the new CommitLog minimum. Also raises or lowers the DISK_FULL flag.
        """
        with self._mutex:
            self._check_running()
            cfg = self.config
            decision = expiry.decide_space(self.disk_used_ratio(cfg.commit_log_dir),
                                           self.disk_used_ratio(cfg.consume_queue_dir
                                                                if os.path.isdir(cfg.consume_queue_dir)
                                                                else self.root_dir), cfg)
            self._apply_disk_decision(decision)
            result = CleanResult(disk_full=bool(decision.disk_full), ratios=decision.ratios)
            if expiry.is_time_to_delete(cfg.delete_when, now) or decision.space_to_delete or force:
                self._dispatch_to(self._confirm_offset())
                self.commit_log.mapped_file_queue.flush_all()
                result.commit_log_files = self.commit_log.delete_expired_file(
                    cfg.file_reserved_time * 3_600_000, cfg.delete_commit_log_files_interval,
                    cfg.destroy_maped_file_interval_forcibly,
                    cfg.clean_file_forcibly_enable and decision.clean_immediately,
                    below_offset=min(self.reput_from_offset,
                                     self.commit_log.mapped_file_queue.flushed_where))
                if result.commit_log_files == 0 and decision.space_to_delete:
                    log.warning("disk space will be full soon, but delete file failed")
            min_offset = self.commit_log.get_min_offset()
            if self.reput_from_offset < min_offset:
                self.reput_from_offset = min_offset
            result.consume_queue_files = self.logic_queues.delete_expired(min_offset)
            result.index_files = self.index_service.delete_expired_file(min_offset)
            return result

    def _apply_disk_decision(self, d: expiry.SpaceDecision) -> None:
        if d.disk_full is True and self.running_flags.get_and_make_disk_full():
            log.error("disk maybe full soon %s, so mark disk full", d.ratios)
        elif d.disk_full is False and not self.running_flags.get_and_make_disk_ok():
            log.info("disk space OK %s, so mark disk ok", d.ratios)

    # ================================================================== checking
    def check(self) -> list[str]:
        """fsck: cross-check consume queues and index against the CommitLog.

        Returns a list of problems, empty when the store is consistent.
        """
        with self._mutex:
            self._check_running()
            self._dispatch_to(self._confirm_offset())
            return check_store(self)

    def status(self) -> dict:
        """Positions and flags, for operators."""
        with self._mutex:
            mfq = self.commit_log.mapped_file_queue
            return {
                "state": self._state,
                "last_exit_ok": self.last_exit_ok,
                "writeable": self.running_flags.is_writeable(),
                "flags": self.running_flags.reasons(),
                "positions": {
                    "min_offset": self.commit_log.get_min_offset(),
                    "written": self.commit_log.get_max_offset(),
                    "flushed": mfq.flushed_where,
                    "dispatched": self.reput_from_offset,
                },
                "checkpoint": self.checkpoint.to_dict() if self.checkpoint else {},
                "queues": {f"{cq.topic}/{cq.queue_id}": [cq.get_min_offset_in_queue(),
                                                          cq.get_max_offset_in_queue()]
                           for cq in self.all_consume_queues()},
            }


class _EmbeddedDelayQueues:
    """The delay queues of an embedded store, for its ScheduleMessageService."""

    def __init__(self, store: MessageStore):
        self.store = store

    def delay_units(self, queue_id: int, start: int):
        cq = self.store.find_consume_queue(SCHEDULE_TOPIC, queue_id, create=False)
        return cq.iter_units(start) if cq is not None else iter(())

    def look_message(self, commit_log_offset: int) -> MessageExt | None:
        return self.store.commit_log.look_message_by_offset(commit_log_offset)

    def put_again_batch(self, msgs: list[Message], identity: tuple[int, int]):
        """In process: no answer can be lost, so ``identity`` is not needed."""
        return [(r.status, r.reason) for r in self.store.put_batch(msgs)]
