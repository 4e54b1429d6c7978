"""Expiry: the disk-space decision table, the time-of-day trigger, and
MessageStore.clean_expired_files end to end (CommitLog files, then consume queue and
index files following the new minimum, reads of deleted ranges, the DISK_FULL flag).

Real files in ``tmp_path``; files are made old with ``os.utime`` (a real file
operation). The disk's fullness is the one thing a test cannot set on a real disk, so
``MessageStore.disk_used_ratio`` (a path -> ratio callable) is replaced where a test
needs a particular ratio; the tests that do so say so.
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import small_config
from rocketstore.storage import GetMessageStatus, Message, MessageStore, PutMessageStatus
from rocketstore.storage import expiry
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.mapped_file import offset_to_file_name

HOUR_MS = 3_600_000
FILE = 8192


def local_ms(hour: int, minute: int = 30) -> int:
    """A timestamp (ms) whose local hour is ``hour``."""
    return int(time.mktime((2024, 1, 15, hour, minute, 0, 0, 0, -1)) * 1000)


# ====================================================================== decide_space
# (commitlog ratio, consumequeue ratio) -> (space_to_delete, clean_immediately, disk_full)
# Thresholds: disk_max_used_space_ratio 75 %, clean forcibly 0.85, warning level 0.90.
DECISIONS = [
    (0.10, 0.10, False, False, False),
    (0.74, 0.74, False, False, False),
    (0.75, 0.75, False, False, False),   # "above", not "at"
    (0.76, 0.10, True, False, False),    # past 75 %: delete expired files, disk OK
    (0.85, 0.10, True, False, False),
    (0.86, 0.10, True, True, None),      # past 0.85: clean now; the DISK_FULL flag is kept
    (0.90, 0.10, True, True, None),
    (0.91, 0.10, True, True, True),      # past 0.90: refuse writes too
    (1.00, 0.10, True, True, True),
    (0.10, 0.76, True, False, False),    # the consume queue partition counts the same
    (0.10, 0.86, True, True, False),     # commitlog said OK first
    (0.10, 0.91, True, True, True),
    (0.80, 0.95, True, False, False),    # commitlog past 75 %: the other is not looked at
    (0.86, 0.95, True, True, None),
    (0.91, 0.10, True, True, True),
    (-1.0, 0.10, True, False, False),    # unknown usage: delete, as RocketMQ does
    (0.10, -1.0, True, False, False),
]


@pytest.mark.parametrize("physic, logics, space, clean, full", DECISIONS)
def test_decide_space_table(physic, logics, space, clean, full):
    d = expiry.decide_space(physic, logics, StoreConfig())
    assert (d.space_to_delete, d.clean_immediately, d.disk_full) == (space, clean, full)
    assert d.ratios == {"commitlog": physic, "consumequeue": logics}


def test_decide_space_follows_the_configured_thresholds():
    cfg = StoreConfig(disk_max_used_space_ratio=50, disk_space_clean_forcibly_ratio=0.6,
                      disk_space_warning_level_ratio=0.7)
    assert expiry.decide_space(0.55, 0.1, cfg).space_to_delete
    d = expiry.decide_space(0.65, 0.1, cfg)
    assert (d.clean_immediately, d.disk_full) == (True, None)
    assert expiry.decide_space(0.71, 0.1, cfg).disk_full is True


def test_disk_partition_used_ratio_is_a_fraction(tmp_path):
    ratio = expiry.disk_partition_used_ratio(str(tmp_path))
    assert 0.0 <= ratio <= 1.0
    assert expiry.disk_partition_used_ratio(str(tmp_path / "missing")) == -1.0


# ====================================================================== time of day
@pytest.mark.parametrize("delete_when, hour, due", [
    ("04", 4, True),
    ("04", 3, False),
    ("04", 5, False),
    ("04", 16, False),
    ("03;04", 3, True),
    ("03;04", 4, True),
    ("03;04", 5, False),
    ("00", 0, True),
    ("23", 23, True),
    ("23", 0, False),
    ("", 4, False),
])
def test_is_time_to_delete(delete_when, hour, due):
    assert expiry.is_time_to_delete(delete_when, local_ms(hour)) is due
    assert expiry.is_time_to_delete(delete_when, local_ms(hour, 0)) is due
    assert expiry.is_time_to_delete(delete_when, local_ms(hour, 59)) is due


def test_is_time_to_delete_defaults_to_now():
    before = time.localtime().tm_hour
    due = expiry.is_time_to_delete(f"{before:02d}")
    if time.localtime().tm_hour == before:           # not across an hour boundary
        assert due
    assert not expiry.is_time_to_delete(f"{(before + 12) % 24:02d}")


# ====================================================================== the store
def expiry_config(root, **kw) -> StoreConfig:
    # 8 KiB commitlog files (7 messages each), consume queue files of 32 units, index
    # files of 15 entries: expiry crosses many files of every kind
    return small_config(root, delete_commit_log_files_interval=0, max_hash_slot_num=8,
                        max_index_num=16, **kw)


def fill_store(store: MessageStore, files: int) -> list:
    """Put 1000-byte messages to two queues until the CommitLog has ``files`` files."""
    results = []
    i = 0
    while len(store.commit_log.mapped_file_queue.mapped_files) < files:
        r = store.put(Message(topic="TopicTest", body=bytes([i % 256]) * 1000,
                              tags=f"Tag{i % 3}", keys=[f"key-{i}"], queue_id=i % 2))
        assert r.ok, r.reason
        results.append(r)
        i += 1
    for j in range(i, i + 3):                 # both queues have messages in the last file
        results.append(store.put(Message(topic="TopicTest", body=b"tail", tags="TagT",
                                         keys=[f"key-{j}"], queue_id=j % 2)))
    assert all(r.ok for r in results)
    assert len(store.commit_log.mapped_file_queue.mapped_files) == files
    store.dispatch()
    return results


def age_commit_log(store: MessageStore, count: int | None = None, hours: int = 100) -> None:
    files = store.commit_log.mapped_file_queue.mapped_files
    old_ns = (time.time_ns() // 1_000_000 - hours * HOUR_MS) * 1_000_000
    for mf in files[:-1] if count is None else files[:count]:
        os.utime(mf.path, ns=(old_ns, old_ns))


def commit_log_names(cfg: StoreConfig) -> list[str]:
    """The CommitLog files on disk that hold records (the ones made ahead of need, still
    zeros, are the allocator's business and may or may not be there yet)."""
    names = []
    for n in sorted(n for n in os.listdir(cfg.commit_log_dir) if n.isdigit()):
        with open(os.path.join(cfg.commit_log_dir, n), "rb") as f:
            if f.read(4) != bytes(4):
                names.append(n)
    return names


def file_names(first: int, last: int) -> list[str]:
    """Names of files ``first`` .. ``last`` inclusive."""
    return [offset_to_file_name(i * FILE) for i in range(first, last + 1)]


def fixed_ratio(ratio: float):
    return lambda path: ratio


@pytest.fixture
def cfg(tmp_path):
    return expiry_config(tmp_path / "store")


@pytest.fixture
def full_store(cfg):
    """A store with 15 CommitLog files; the disk looks half full (injected ratio)."""
    s = MessageStore(cfg)
    s.load()
    s.disk_used_ratio = fixed_ratio(0.5)
    s.results = fill_store(s, 15)
    yield s
    s.close()


def first_kept(results, queue_id: int, min_phy: int):
    return next(r for r in results if r.queue_id == queue_id and r.wrote_offset >= min_phy)


def test_manual_clean_deletes_expired_files_oldest_first_and_logics_follow(full_store, cfg):
    """disk_used_ratio is injected (0.5): the real disk's usage must not decide."""
    store = full_store
    results = store.results
    age_commit_log(store)
    cq_files_before = {q: len(os.listdir(os.path.join(cfg.consume_queue_dir, "TopicTest", str(q))))
                       for q in (0, 1)}
    assert cq_files_before == {0: 2, 1: 2}
    index_before = store.index_service.files
    assert len(index_before) > 4
    min_phy = 10 * FILE
    expected_index = 0
    while expected_index < len(index_before) - 1 and \
            index_before[expected_index].end_phy_offset < min_phy:
        expected_index += 1

    r = store.clean_expired_files(force=True, now=local_ms(12))
    assert r.commit_log_files == 10                              # at most 10 per run
    assert commit_log_names(cfg) == file_names(10, 14)
    assert store.get_min_phy_offset() == min_phy
    # every queue's first file pointed only at deleted messages
    assert r.consume_queue_files == 2
    assert r.index_files == expected_index > 0
    assert len(store.index_service.files) == len(index_before) - expected_index
    assert all(f.end_phy_offset >= min_phy for f in store.index_service.files)
    assert not r.disk_full
    for q in (0, 1):
        assert len(os.listdir(os.path.join(cfg.consume_queue_dir, "TopicTest", str(q)))) == 1
        kept = first_kept(results, q, min_phy)
        assert store.get_min_offset_in_queue("TopicTest", q) == kept.queue_offset
        g = store.get_message("g", "TopicTest", q, 0, 32)
        assert g.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert g.next_begin_offset == kept.queue_offset
        g = store.get_message("g", "TopicTest", q, g.next_begin_offset, 1)
        assert g.status is GetMessageStatus.FOUND
        assert g.messages[0].msg_id == kept.msg_id
        # a time search never lands on a unit whose message is gone
        assert store.get_offset_in_queue_by_time("TopicTest", q, 0) == kept.queue_offset
        mine = [x for x in results if x.queue_id == q]
        assert store.get_offset_in_queue_by_time("TopicTest", q, mine[-1].store_timestamp
                                                 + 60_000) == mine[-1].queue_offset
    assert store.look_message_by_offset(0) is None
    assert store.query_message("TopicTest", "key-0").messages == []
    last = results[-1]
    assert [m.msg_id for m in store.query_message("TopicTest", f"key-{len(results) - 1}")
            .messages] == [last.msg_id]
    assert store.check() == []

    r = store.clean_expired_files(force=True, now=local_ms(12))
    assert r.commit_log_files == 4                               # never the current file
    assert commit_log_names(cfg) == file_names(14, 14)
    assert store.check() == []
    assert store.clean_expired_files(force=True, now=local_ms(12)).commit_log_files == 0
    assert store.put(Message(topic="TopicTest", body=b"after", queue_id=0)).ok
    assert store.check() == []


def test_clean_stops_at_the_first_unexpired_file(full_store, cfg):
    """disk_used_ratio is injected (0.5)."""
    store = full_store
    age_commit_log(store, count=4)
    assert store.clean_expired_files(force=True, now=local_ms(12)).commit_log_files == 4
    assert store.get_min_phy_offset() == 4 * FILE
    assert store.clean_expired_files(force=True, now=local_ms(12)).commit_log_files == 0
    assert commit_log_names(cfg) == file_names(4, 14)
    assert store.check() == []


def test_clean_without_a_trigger_deletes_nothing(full_store, cfg):
    """disk_used_ratio is injected (0.5); the hour is not delete_when's."""
    store = full_store
    age_commit_log(store)
    r = store.clean_expired_files(now=local_ms(12))
    assert (r.commit_log_files, r.consume_queue_files, r.index_files) == (0, 0, 0)
    assert commit_log_names(cfg) == file_names(0, 14)
    r = store.clean_expired_files(now=local_ms(4))            # delete_when "04"
    assert r.commit_log_files == 10


@pytest.mark.parametrize("ratio, deleted", [(0.5, 0), (0.80, 0), (0.85, 0), (0.86, 10)])
def test_unexpired_files_are_kept_unless_the_disk_passes_the_forcible_ratio(full_store, cfg,
                                                                             ratio, deleted):
    """disk_used_ratio is injected: a real disk cannot be filled on demand."""
    store = full_store
    store.disk_used_ratio = fixed_ratio(ratio)
    r = store.clean_expired_files(force=True, now=local_ms(12))
    assert r.commit_log_files == deleted
    assert commit_log_names(cfg) == file_names(deleted, 14)
    assert store.put(Message(topic="TopicTest", body=b"x", queue_id=0)).ok
    assert store.check() == []


def test_a_full_consume_queue_partition_also_forces_cleaning(full_store, cfg):
    """disk_used_ratio is injected per path: only the consume queue partition is full."""
    store = full_store
    store.disk_used_ratio = lambda path: 0.87 if "consumequeue" in path else 0.3
    r = store.clean_expired_files(now=local_ms(12))
    assert r.commit_log_files == 10
    assert r.ratios["consumequeue"] == 0.87 and r.ratios["commitlog"] == 0.3


def test_clean_file_forcibly_disabled_keeps_unexpired_files(tmp_path):
    """disk_used_ratio is injected (0.87)."""
    cfg = expiry_config(tmp_path / "store", clean_file_forcibly_enable=False)
    with MessageStore(cfg) as store:
        store.disk_used_ratio = fixed_ratio(0.87)
        fill_store(store, 4)
        assert store.clean_expired_files(force=True, now=local_ms(12)).commit_log_files == 0


def test_disk_full_refuses_puts_until_usage_falls_below_the_forcible_ratio(full_store, cfg):
    """disk_used_ratio is injected: 0.95, then 0.88, then 0.5."""
    store = full_store
    ok = store.put(Message(topic="TopicTest", body=b"before", queue_id=0))
    assert ok.ok
    store.disk_used_ratio = fixed_ratio(0.95)
    r = store.clean_expired_files(now=local_ms(12))
    assert r.disk_full
    assert r.commit_log_files == 10                  # past 0.85: unexpired files go too
    refused = store.put(Message(topic="TopicTest", body=b"refused", queue_id=0))
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "disk" in refused.reason.lower() and "DISK_FULL" in refused.reason
    assert not store.status()["writeable"]
    assert any("DISK_FULL" in f for f in store.status()["flags"])
    batch = store.put_batch([Message(topic="TopicTest", body=b"b", queue_id=0)] * 2)
    assert [b.status for b in batch] == [PutMessageStatus.SERVICE_NOT_AVAILABLE] * 2
    g = store.get_message("g", "TopicTest", 0, ok.queue_offset, 1)   # reads still work
    assert g.status is GetMessageStatus.FOUND and g.messages[0].body == b"before"

    store.disk_used_ratio = fixed_ratio(0.88)        # between 0.85 and 0.90: flag kept
    store.clean_expired_files(now=local_ms(12))
    assert store.put(Message(topic="TopicTest", body=b"x", queue_id=0)).status \
        is PutMessageStatus.SERVICE_NOT_AVAILABLE

    store.disk_used_ratio = fixed_ratio(0.5)         # below 0.85: writes come back
    r = store.clean_expired_files(now=local_ms(12))
    assert not r.disk_full
    after = store.put(Message(topic="TopicTest", body=b"after", queue_id=0))
    assert after.ok
    assert after.queue_offset == ok.queue_offset + 1  # the refused ones took no offset
    assert store.status()["writeable"]
    assert store.check() == []


def test_deleted_files_stay_deleted_after_reopen(cfg):
    """disk_used_ratio is injected (0.5)."""
    store = MessageStore(cfg)
    store.load()
    store.disk_used_ratio = fixed_ratio(0.5)
    results = fill_store(store, 6)
    age_commit_log(store)
    assert store.clean_expired_files(force=True, now=local_ms(12)).commit_log_files == 5
    store.close()
    with MessageStore(cfg) as again:
        assert again.get_min_phy_offset() == 5 * FILE
        for q in (0, 1):
            kept = first_kept(results, q, 5 * FILE)
            g = again.get_message("g", "TopicTest", q, 0, 32)
            assert g.status is GetMessageStatus.OFFSET_TOO_SMALL
            assert g.next_begin_offset == kept.queue_offset
        assert again.check() == []
