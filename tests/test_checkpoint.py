"""StoreCheckpoint: the 4096-byte file against its golden bytes, the recovery time
points, reopening, and what the store leaves in it after a clean close().

Real files in ``tmp_path``; the file is read back with the independent reference codec.
"""

from __future__ import annotations

import json
import os

import pytest

import refcodec
from conftest import small_config
from rocketstore.storage import Message, MessageStore
from rocketstore.storage import checkpoint as checkpoint_module
from rocketstore.storage.checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def golden() -> tuple[bytes, dict]:
    with open(os.path.join(FIXTURES, "checkpoint.hex")) as f:
        data = refcodec.parse_hex_fixture(f.read())
    with open(os.path.join(FIXTURES, "checkpoint.json")) as f:
        return data, json.load(f)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_layout_constants():
    assert (checkpoint_module.PHYSIC_POS, checkpoint_module.LOGICS_POS,
            checkpoint_module.INDEX_POS) == (0, 8, 16)
    assert CHECKPOINT_FILE_SIZE == 4096
    assert checkpoint_module.RECOVERY_SLACK_MS == 3000


def test_encode_matches_the_golden_fixture():
    data, inputs = golden()
    assert len(data) == 4096
    assert checkpoint_module.encode(inputs["physic"], inputs["logics"], inputs["index"]) == data
    assert checkpoint_module.decode(data) == (inputs["physic"], inputs["logics"], inputs["index"])
    assert data[0:8] == inputs["physic"].to_bytes(8, "big")
    assert data[8:16] == inputs["logics"].to_bytes(8, "big")
    assert data[16:24] == inputs["index"].to_bytes(8, "big")
    assert data[24:] == bytes(4096 - 24)


def test_flushed_file_matches_the_golden_fixture(tmp_path):
    data, inputs = golden()
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (0, 0, 0)
    assert os.path.getsize(path) == 4096
    cp.physic_msg_timestamp = inputs["physic"]
    cp.logics_msg_timestamp = inputs["logics"]
    cp.index_msg_timestamp = inputs["index"]
    cp.flush()
    cp.close()
    assert read_file(path) == data
    assert refcodec.decode_checkpoint(read_file(path)) == inputs


def test_reopen_reads_back(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 111, 222, 333
    cp.flush()
    cp.close()
    again = StoreCheckpoint(path)
    try:
        assert (again.physic_msg_timestamp, again.logics_msg_timestamp,
                again.index_msg_timestamp) == (111, 222, 333)
        assert again.to_dict() == {"physic_msg_timestamp": 111, "logics_msg_timestamp": 222,
                                   "index_msg_timestamp": 333}
    finally:
        again.close()
    ro = StoreCheckpoint(path, read_only=True)
    assert (ro.physic_msg_timestamp, ro.logics_msg_timestamp, ro.index_msg_timestamp) == \
        (111, 222, 333)
    ro.close()
    assert os.path.getsize(path) == 4096


def test_unflushed_values_are_not_on_disk(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp = 999
    cp.close()
    assert read_file(path) == bytes(4096)


@pytest.mark.parametrize("physic, logics, index, min_ts, min_ts_index", [
    (10_000, 20_000, 30_000, 7_000, 7_000),
    (20_000, 10_000, 30_000, 7_000, 7_000),
    (20_000, 10_000, 5_000, 7_000, 5_000),
    (3_000, 10_000, 1, 0, 0),
    (2_999, 10_000, 100, 0, 0),
    (0, 0, 0, 0, 0),
    (1_700_000_000_456, 1_700_000_000_400, 1_700_000_000_000,
     1_699_999_997_400, 1_699_999_997_400),
    (1_700_000_000_456, 1_700_000_000_400, 1_699_999_990_000,
     1_699_999_997_400, 1_699_999_990_000),
])
def test_min_timestamp_and_min_timestamp_index(tmp_path, physic, logics, index, min_ts,
                                                min_ts_index):
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    try:
        cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = \
            physic, logics, index
        assert cp.min_timestamp() == min_ts == max(0, min(physic, logics) - 3000)
        assert cp.min_timestamp_index() == min_ts_index == min(min_ts, index)
    finally:
        cp.close()


# ------------------------------------------------------------------ through the store
STORE_CASES = {
    # the conftest's 8 KiB commitlog files: only full files meet the least-pages rule
    "small-files": {},
    # 1 MiB files, least pages 1: a put's own flush already reaches the written end, so
    # close() finds nothing left to flush
    "least-pages-caught-up": dict(mapped_file_size_commit_log=1 << 20,
                                  flush_commit_log_least_pages=1),
    "sync-flush": dict(flush_disk_type="SYNC_FLUSH"),
}


@pytest.mark.parametrize("case", sorted(STORE_CASES))
def test_store_checkpoint_after_close_holds_the_last_store_time(tmp_path, case):
    cfg = small_config(tmp_path / "store", **STORE_CASES[case])
    store = MessageStore(cfg)
    store.load()
    results = []
    for i in range(6):
        results += store.put_batch([
            Message(topic="TopicTest", body=bytes([65 + i]) * 5000, tags="TagA",
                    keys=[f"k{i}"], queue_id=0)])
    assert all(r.ok for r in results)
    last = results[-1].store_timestamp
    store.close()
    cp = refcodec.decode_checkpoint(read_file(os.path.join(cfg.store_path_root_dir,
                                                           "checkpoint")))
    assert cp["physic"] == last, "physicMsgTimestamp must be the last flushed message's"
    assert cp["logics"] == last
    assert cp["index"] == last


def test_store_checkpoint_is_read_back_on_reopen(tmp_path):
    cfg = small_config(tmp_path / "store")
    with MessageStore(cfg) as store:
        r = store.put(Message(topic="TopicTest", body=b"x", keys=["k"], queue_id=0))
    with MessageStore(cfg) as store:
        assert store.checkpoint.logics_msg_timestamp == r.store_timestamp
        assert store.status()["checkpoint"]["logics_msg_timestamp"] == r.store_timestamp


def test_prepared_messages_do_not_advance_the_logics_time(tmp_path):
    """Only messages that enter a consume queue move logicsMsgTimestamp."""
    cfg = small_config(tmp_path / "store")
    store = MessageStore(cfg)
    store.load()
    first = store.put(Message(topic="TopicTest", body=b"a", queue_id=0))
    while True:
        prepared = store.put(Message(topic="TopicTest", body=b"b", queue_id=0, sys_flag=0x4))
        if prepared.store_timestamp > first.store_timestamp:
            break
    store.close()
    cp = refcodec.decode_checkpoint(read_file(os.path.join(cfg.store_path_root_dir,
                                                           "checkpoint")))
    assert cp["logics"] == first.store_timestamp
    assert cp["physic"] == prepared.store_timestamp
