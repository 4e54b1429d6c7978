"""The embedded store's service threads: what RocketMQ's DefaultMessageStore runs in the
background, each on its own interval, so an idle store still flushes, dispatches,
expires and delivers.

    thread               RocketMQ service             runs                     does
    -------------------  ---------------------------  -----------------------  ---------------------------
    flush-commit-log     FlushRealTimeService         every flush_interval_    least pages; all of it every
                         (ASYNC_FLUSH)                commit_log ms            flush_commit_log_thorough_
                                                                               interval ms
                         GroupCommitService           when a put waits         flush everything written;
                         (SYNC_FLUSH)                                          wake the waiting puts
    reput                ReputMessageService          on every put, else       dispatch to the confirm
                                                      every 200 ms             offset
    flush-consume-queue  FlushConsumeQueueService     every flush_interval_    queues, index, checkpoint
                                                      consume_queue ms
    clean                Clean*Service                every clean_resource_    ``clean_expired_files``
                                                      interval ms
    schedule             ScheduleMessageService       when the next delayed    ``deliver_delayed_messages``
                                                      message falls due (at
                                                      most 100 ms apart)

Each takes the store's lock for its work, as the caller's calls do, so the threads and
the caller never interleave inside the store. A SYNC_FLUSH put appends under the lock,
then waits without it until the group commit covers its last record, at most
``sync_flush_timeout`` ms (then FLUSH_DISK_TIMEOUT: stored, not known to be on disk).
A fault in a service is logged and the service goes on at its next turn (a failed flush
stops writes through the store's running flags, as when the caller flushes).

``MessageStore(config, background=False)`` starts none of them: the caller drives the
store by hand (``dispatch``, ``flush``, ``clean_expired_files``,
``deliver_delayed_messages``), and a put then flushes inline as the services would.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from rocketstore.storage.errors import StoreClosedError

log = logging.getLogger(__name__)

REPUT_IDLE_S = 0.2
SCHEDULE_MAX_WAIT_S = 0.1


class StoreServices:
    def __init__(self, store):
        """The services of ``store`` (a ``MessageStore``, which owns them: it starts them
        after loading and stops them before closing)."""
        self.store = store
        self.config = store.config
        self._stopping = threading.Event()
        self._reput_wanted = threading.Event()
        self._flush_wanted = threading.Event()
        self._flushed = threading.Condition()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        cfg = self.config
        loops: list[tuple[str, Callable[[], None]]] = [
            ("flush-commit-log", self._group_commit if cfg.sync_flush else self._flush_real_time),
            ("reput", self._reput),
            ("flush-consume-queue", self._every(cfg.flush_interval_consume_queue,
                                                self.store.flush_consume_queues_on_interval)),
            ("clean", self._every(cfg.clean_resource_interval, self.store.clean_expired_files)),
            ("schedule", self._schedule),
        ]
        for name, loop in loops:
            t = threading.Thread(target=self._guard(name, loop), name=f"store-{name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop every thread and wait for it (a turn in progress finishes first)."""
        self._stopping.set()
        self._reput_wanted.set()
        self._flush_wanted.set()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout=10)
        self._threads.clear()

    # ---------------------------------------------------------------- what puts call
    def appended(self) -> None:
        """A put stored something: dispatch soon."""
        self._reput_wanted.set()

    def wait_flushed(self, end: int, timeout_ms: int) -> bool:
        """Wait (without the store's lock) until the group commit covers ``end``."""
        deadline = time.monotonic() + timeout_ms / 1000
        mfq = self.store.commit_log.mapped_file_queue
        with self._flushed:
            while mfq.flushed_where < end:
                self._flush_wanted.set()
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    return False
                self._flushed.wait(min(left, 0.05))
        return True

    # ---------------------------------------------------------------- the loops
    def _guard(self, name: str, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self._stopping.is_set():
                try:
                    loop()
                except StoreClosedError:
                    return
                except Exception:  # noqa: BLE001 - a service must outlive one fault
                    log.exception("store service %s failed; it goes on", name)
                    self._stopping.wait(1.0)
        return run

    def _every(self, interval_ms: int, work: Callable[[], object]) -> Callable[[], None]:
        def turn() -> None:
            if not self._stopping.wait(max(interval_ms, 1) / 1000):
                work()
        return turn

    def _flush_real_time(self) -> None:
        if not self._stopping.wait(max(self.config.flush_interval_commit_log, 1) / 1000):
            self.store.flush_commit_log_on_interval()

    def _group_commit(self) -> None:
        self._flush_wanted.wait(0.01)
        if self._stopping.is_set():
            return
        self._flush_wanted.clear()
        try:
            self.store.flush_commit_log_now()
        finally:
            with self._flushed:
                self._flushed.notify_all()

    def _reput(self) -> None:
        self._reput_wanted.wait(REPUT_IDLE_S)
        if self._stopping.is_set():
            return
        self._reput_wanted.clear()
        self.store.dispatch()

    def _schedule(self) -> None:
        due = self.store.next_delayed_due_ms()
        wait_s = SCHEDULE_MAX_WAIT_S if due is None else \
            min(SCHEDULE_MAX_WAIT_S, max(0.0, due / 1000 - time.time()))
        if not self._stopping.wait(wait_s) and due is not None and due <= time.time() * 1000:
            self.store.deliver_delayed_messages()
