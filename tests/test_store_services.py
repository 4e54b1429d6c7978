"""The embedded store's service threads (``storage.store_services``): an idle store
flushes, dispatches, delivers delayed messages and watches its disk by itself; a
SYNC_FLUSH put that the disk does not answer in time gets FLUSH_DISK_TIMEOUT; with
``background=False`` nothing happens unless the caller asks."""

from __future__ import annotations

import os
import threading
import time

from conftest import msg, small_config
from rocketstore.storage import MessageStore, mapped_file
from rocketstore.storage.status import PutMessageStatus

FAST = dict(flush_interval_commit_log=20, flush_commit_log_thorough_interval=40,
            flush_interval_consume_queue=20, flush_consume_queue_thorough_interval=40,
            clean_resource_interval=20)


def eventually(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_idle_store_flushes_and_dispatches_by_itself(tmp_path):
    with MessageStore(small_config(tmp_path, **FAST)) as store:
        results = store.put_batch([msg(i) for i in range(20)])
        end = results[-1].wrote_offset + results[-1].wrote_bytes
        mfq = store.commit_log.mapped_file_queue
        eventually(lambda: mfq.flushed_where == end, "the CommitLog flush")
        eventually(lambda: store.reput_from_offset == end, "dispatch")
        eventually(lambda: store.checkpoint.physic_msg_timestamp > 0 and
                   store.checkpoint.logics_msg_timestamp > 0, "the checkpoint")


def test_delayed_messages_are_delivered_without_being_asked(tmp_path):
    with MessageStore(small_config(tmp_path, message_delay_level="1s 2s", **FAST)) as store:
        assert store.put(msg(0, delay_level=1)).ok
        eventually(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 1,
                   "the delayed delivery", timeout_s=15)
        got = store.get_message("g", "TopicTest", 0, 0, 1).messages
        assert got[0].body == msg(0).body


def test_the_clean_service_watches_the_disk(tmp_path):
    """The disk's usage is injected (the real disk's must not decide)."""
    with MessageStore(small_config(tmp_path, **FAST)) as store:
        store.disk_used_ratio = lambda path: 0.99
        eventually(lambda: store.put(msg(0)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE,
                   "the DISK_FULL flag")
        assert "DISK_FULL" in store.put(msg(1)).reason
        store.disk_used_ratio = lambda path: 0.10
        eventually(lambda: store.put(msg(2)).ok, "puts again")


def test_a_sync_put_the_disk_does_not_answer_times_out(tmp_path, monkeypatch):
    """Injected fault: an fdatasync that does not return until the test lets it (a disk
    that stops answering cannot be had on demand). The put answers FLUSH_DISK_TIMEOUT
    while the fdatasync still hangs: before the disk did."""
    store = MessageStore(small_config(tmp_path, flush_disk_type="SYNC_FLUSH",
                                      sync_flush_timeout=100, **FAST))
    store.load()
    assert store.put(msg(0)).status is PutMessageStatus.PUT_OK
    real = mapped_file.FILE_OPS.fdatasync
    hanging, answer = threading.Event(), threading.Event()

    def hang(fd):
        hanging.set()
        answer.wait(60)
        real(fd)
    monkeypatch.setattr(mapped_file.FILE_OPS, "fdatasync", hang)
    try:
        r = store.put(msg(1))
        assert hanging.is_set() and not answer.is_set()    # answered before the disk
    finally:
        answer.set()
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "sync_flush_timeout" in r.reason
    assert r.wrote_offset > 0
    monkeypatch.undo()
    store.close()
    with MessageStore(store.config, background=False) as again:   # it was stored
        assert [m.body for m in again.get_message("g", "TopicTest", 0, 0, 8).messages] == \
            [msg(0).body, msg(1).body]


def test_driven_by_hand_nothing_happens_unasked(tmp_path):
    """No service thread (``store-*``) is started, so nothing can flush, dispatch or
    clean unasked (a wait would show only that nothing happened yet); the CommitLog's
    file-making thread is not one of them."""
    with MessageStore(small_config(tmp_path, **FAST), background=False) as store:
        assert store.put(msg(0)).ok
        assert not [t.name for t in threading.enumerate() if t.name.startswith("store-")]
        assert store.reput_from_offset == 0
        assert store.services is None
        store.dispatch()
        assert store.reput_from_offset > 0


def test_close_stops_every_service_thread(tmp_path):
    before = {t.name for t in __import__("threading").enumerate()}
    store = MessageStore(small_config(tmp_path, **FAST))
    store.load()
    assert {f"store-{n}" for n in ("flush-commit-log", "reput", "clean", "schedule",
                                   "flush-consume-queue")} <= \
        {t.name for t in __import__("threading").enumerate()}
    store.close()
    assert {t.name for t in __import__("threading").enumerate()} <= before
    assert not os.path.exists(os.path.join(store.root_dir, "abort"))
