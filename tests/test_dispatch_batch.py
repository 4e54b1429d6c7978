"""The bulk dispatch path gives what the one-record path gives, byte for byte.

* ``parse_run`` (and recovery's ``valid_end``) against ``record.check_message_and_return_size`` on random records (odd
  properties, IPv6 hosts, v2 topics, delayed messages) with random damage: the same
  fields for every record it returns, and it stops before the first record the
  one-record path refuses, never later.
* A real store's CommitLog dispatched twice, one record at a time and in bulk, into two
  empty copies: identical consume-queue files and identical index files, also when the
  dispatch stops and repeats work already done (as after a restart) and when the
  index rolls mid-run.
"""

from __future__ import annotations

import filecmp
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import msg, small_config
from rocketstore.storage import Message, MessageStore, reput as reput_module
from rocketstore.storage import record
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.consume_queue import ConsumeQueue
from rocketstore.storage.dispatch_batch import SmallRecord, parse_run, parse_small, valid_end, walk
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.hashing import index_key_hash, index_key_hash_raw, index_key_hashes
from rocketstore.storage.index_file import IndexFile
from rocketstore.storage.index_service import IndexService
from rocketstore.storage.logic_queues import LogicQueues
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE, encode_host)
from rocketstore.storage.reput import ReputMessageService

DELAYS = [0, 1000, 5000, 10000]

names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "WAIT", "XTAGS", "TAG", ""])
values = st.text(alphabet="ab 1é€😀#\x01", max_size=6)
pairs = st.lists(st.tuples(names, values), max_size=6)


def _props(items, trailing: bool) -> bytes:
    text = "\x02".join(f"{n}\x01{v}" for n, v in items)
    return (text + ("\x02" if trailing and items else "")).encode()


record_specs = st.fixed_dictionaries({
    "topic": st.sampled_from(["T", "Orders", "SCHEDULE_TOPIC_XXXX", "é" * 70, "x" * 130]),
    "body": st.binary(max_size=40),
    "props": pairs, "trailing": st.booleans(),
    "v6": st.booleans(), "queue_id": st.integers(0, 3), "queue_offset": st.integers(0, 99),
})


def _build(specs) -> tuple[bytearray, list[int]]:
    buf, starts = bytearray(), []
    for spec in specs:
        born = ("::1", 7) if spec["v6"] else ("127.0.0.1", 7)
        starts.append(len(buf))
        buf += record.encode(
            topic=spec["topic"].encode(), body=spec["body"],
            properties=_props(spec["props"], spec["trailing"]), queue_id=spec["queue_id"],
            flag=0, queue_offset=spec["queue_offset"], physical_offset=1000 + len(buf),
            sys_flag=BORNHOST_V6_FLAG if spec["v6"] else 0, born_timestamp=5,
            born_host=encode_host(born), store_timestamp=1_700_000_000_000 + len(buf),
            store_host=encode_host(("127.0.0.1", 9)), reconsume_times=0,
            prepared_transaction_offset=0)
    return buf, starts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_specs, min_size=1, max_size=12), st.data())
def test_parse_run_agrees_with_the_one_record_check(specs, data):
    buf, starts = _build(specs)
    if data.draw(st.booleans(), "damage"):
        at = data.draw(st.integers(0, len(buf) - 1), "at")
        buf[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xFF]), "byte")
    buf += bytes(8)
    found, _ = walk(buf, 0, len(buf), 100)
    run = parse_run(bytes(buf), found, 1000, DELAYS) if found else None
    taken = len(run) if run is not None else 0
    for k in range(len(specs)):
        req = record.check_message_and_return_size(buf, starts[k], len(buf), 1000 + starts[k],
                                                   False, DELAYS)
        if k >= taken:
            if k == taken and k < len(found):
                assert not (req.success and req.msg_size > 0), "the run stopped too early"
            break
        assert req.success and req.msg_size > 0
        assert (int(run.sizes[k]), run.topics[k], int(run.queue_ids[k]),
                int(run.physical_offsets[k]), int(run.tags_codes[k]),
                int(run.store_timestamps[k]), int(run.queue_offsets[k]),
                _text(run.keys[k]), _text(run.uniq_keys[k]), int(run.sys_flags[k])) == (
            req.msg_size, req.topic, req.queue_id, req.commit_log_offset, req.tags_code,
            req.store_timestamp, req.consume_queue_offset, req.keys, req.uniq_key, req.sys_flag)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_specs, min_size=1, max_size=12), st.booleans(), st.data())
def test_parse_small_agrees_with_the_one_record_check(specs, as_bytes, data):
    buf, starts = _build(specs)
    if data.draw(st.booleans(), "damage"):
        at = data.draw(st.integers(0, len(buf) - 1), "at")
        buf[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xFF]), "byte")
    buf += bytes(8)
    found, _ = walk(buf, 0, len(buf), 100)
    records = [SmallRecord(*r) for r in parse_small(bytes(buf) if as_bytes else buf, found,
                                                    1000, DELAYS)]
    for k in range(len(specs)):
        req = record.check_message_and_return_size(buf, starts[k], len(buf), 1000 + starts[k],
                                                   False, DELAYS)
        if k >= len(records):
            if k == len(records) and k < len(found) and not specs[k]["v6"]:
                assert not (req.success and req.msg_size > 0), "the run stopped too early"
            break
        assert req.success and req.msg_size > 0 and not specs[k]["v6"]
        r = records[k]
        assert (r.size, r.topic, r.queue_id, r.physical_offset, r.tags_code,
                r.store_timestamp, r.queue_offset, _text(r.keys), _text(r.uniq_key),
                r.sys_flag) == (
            req.msg_size, req.topic, req.queue_id, req.commit_log_offset, req.tags_code,
            req.store_timestamp, req.consume_queue_offset, req.keys, req.uniq_key, req.sys_flag)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_specs, min_size=1, max_size=12), st.booleans(), st.data())
def test_valid_end_is_where_the_one_record_scan_stops(specs, check_crc, data):
    buf, starts = _build(specs)
    at = data.draw(st.integers(0, len(buf) - 1), "at")
    buf[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xFF]), "byte")
    buf += bytes(8)
    found, _ = walk(buf, 0, len(buf), 100)
    pos = 0
    while True:       # the one-record scan of recovery
        req = record.check_message_and_return_size(buf, pos, len(buf), 1000 + pos, check_crc)
        if not (req.success and req.msg_size > 0):
            break
        pos += req.msg_size
    got = valid_end(bytes(buf), found, 1000, check_crc) if found else 0
    assert got == pos


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


@given(st.lists(st.text(alphabet="aZ#09 é€😀\udfff", min_size=1, max_size=20), max_size=30))
def test_index_key_hashes_match_java(keys):
    raw = [k.encode("utf-8", "surrogatepass") for k in keys]
    expected = [index_key_hash(r.decode("utf-8", "replace")) for r in raw]
    assert index_key_hashes(raw).tolist() == expected
    assert [index_key_hash_raw(r) for r in raw] == expected


def test_index_key_hash_raw_of_the_java_int_extremes():
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: abs() leaves it negative, 0
    assert index_key_hash_raw(b"polygenelubricants") == index_key_hash(
        "polygenelubricants") == 0
    assert index_key_hash_raw(b"Aa") == index_key_hash("Aa") == 2112


# ------------------------------------------------------------------ whole stores
def _messages() -> list[Message]:
    out = []
    for i in range(700):
        m = msg(i, topic=("Orders", "Billing", "L" * 130)[i % 3], queue_id=i % 4)
        if i % 7 == 0:
            m.keys = [f"k{i}", "", f"ключ-{i}", "😀"]
        if i % 11 == 0:
            m.tags = None
        if i % 13 == 0:
            m.properties = {"UNIQ_KEY": f"U{i:08d}", "color": "red"}
        if i % 17 == 0:
            m.delay_level = 2
        if i % 19 == 0:
            m.sys_flag = (TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE,
                          TRANSACTION_ROLLBACK_TYPE)[i % 3]
        if i % 23 == 0:
            m.born_host = ("::1", 4000)
        if i % 29 == 0:
            m.body = bytes(range(256)) * 6
        out.append(m)
    return out


def _one_key_messages() -> list[Message]:
    """The common shape: at most one key each, no UNIQ_KEY (the index's one-pass way)."""
    out = []
    for i in range(700):
        m = msg(i, topic=("Orders", "Billing")[i % 2], queue_id=i % 4)
        m.keys = [f"k{i}"] if i % 5 else []
        out.append(m)
    return out


@pytest.fixture(scope="module", params=["every kind", "one key each"])
def written(tmp_path_factory, request):
    """A CommitLog of many files with every kind of message, or with the common shape
    only; no queue or index yet."""
    root = tmp_path_factory.mktemp("written") / "store"
    config = small_config(root, max_index_num=300)
    s = MessageStore(config, background=False)
    s.load()
    for m in (_messages() if request.param == "every kind" else _one_key_messages()):
        assert s.put(m).ok
    end = s.get_max_phy_offset()
    s.close()
    for derived in ("consumequeue", "index"):
        shutil.rmtree(root / derived, ignore_errors=True)
    return config, end


def _dispatch(config, root, monkeypatch, *, bulk: bool, stops=()) -> list[str]:
    """Dispatch ``config``'s CommitLog into empty queues and index under ``root``;
    the index files' paths."""
    config, end = config
    shutil.copytree(config.store_path_root_dir, root)
    cfg = small_config(root, max_index_num=config.max_index_num)
    monkeypatch.setattr(reput_module, "MIN_RUN_RECORDS", 8 if bulk else 10 ** 9)
    commit_log = CommitLog(cfg, read_only=True)
    commit_log.load()
    queues = LogicQueues(cfg)
    index = IndexService(cfg.index_dir, cfg.max_hash_slot_num, cfg.max_index_num)
    index.load(True, 0)
    reput = ReputMessageService(commit_log, queues.find, index)
    for stop in (*stops, end):
        reput.do_reput(stop)
    for back in stops:                     # re-dispatch what is there already
        reput.reput_from_offset = back
        reput.do_reput(end)
    index_files = [f.path for f in index.files]
    for cq in queues.all():
        cq.flush(0)
    index.flush()
    commit_log.close()
    queues.close()
    index.close()
    return index_files


def _same_tree(a, b) -> None:
    left = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    right = sorted(os.path.relpath(os.path.join(d, f), b) for d, _, fs in os.walk(b) for f in fs)
    assert left == right and left
    _, mismatch, errors = filecmp.cmpfiles(a, b, left, shallow=False)
    assert not mismatch and not errors, mismatch


def _record_start(config, file_index: int, k: int) -> int:
    """The CommitLog offset of record ``k`` of CommitLog file ``file_index``."""
    name = sorted(os.listdir(config.commit_log_dir))[file_index]
    with open(os.path.join(config.commit_log_dir, name), "rb") as f:
        starts, _ = walk(f.read(), 0, config.mapped_file_size_commit_log, 1000)
    return int(name) + starts[k]


@pytest.mark.parametrize("stops", [(), ((1, 5), (3, 2))])
def test_bulk_dispatch_writes_the_same_files(written, tmp_path, monkeypatch, stops):
    stops = tuple(_record_start(written[0], f, k) for f, k in stops)
    one = _dispatch(written, tmp_path / "one", monkeypatch, bulk=False, stops=stops)
    bulk = _dispatch(written, tmp_path / "bulk", monkeypatch, bulk=True, stops=stops)
    _same_tree(tmp_path / "one" / "consumequeue", tmp_path / "bulk" / "consumequeue")
    assert len(one) == len(bulk) > 1, "the index must roll during the run"
    for a, b in zip(one, bulk):
        assert filecmp.cmp(a, b, shallow=False), (a, b)


def test_damage_below_the_end_stops_both_paths_at_the_same_record(written, tmp_path,
                                                                  monkeypatch):
    errors = {}
    config, end = written
    for bulk in (False, True):
        root = tmp_path / str(bulk)
        shutil.copytree(config.store_path_root_dir, root)
        cfg = small_config(root)
        first = sorted(os.listdir(cfg.commit_log_dir))[1]
        path = os.path.join(cfg.commit_log_dir, first)
        with open(path, "r+b") as f:           # a NUL in the properties of a record
            data = f.read()
            starts, _ = walk(data, 0, len(data), 1000)
            victim = starts[len(starts) // 2]
            size = int.from_bytes(data[victim:victim + 4], "big")
            f.seek(victim + size - 2)
            f.write(b"\0")
        monkeypatch.setattr(reput_module, "MIN_RUN_RECORDS", 8 if bulk else 10 ** 9)
        commit_log = CommitLog(cfg, read_only=True)
        commit_log.load()
        queues = LogicQueues(cfg)
        reput = ReputMessageService(commit_log, queues.find, None)
        with pytest.raises(CorruptRecordError) as e:
            reput.do_reput(end)
        errors[bulk] = (str(e.value).replace(str(root), ""), sorted((cq.topic, cq.queue_id, cq.get_max_offset_in_queue())
                                             for cq in queues.all()))
        commit_log.close()
        queues.close()
    assert errors[False] == errors[True]


def test_put_units_fills_across_files_and_skips_repeats(tmp_path):
    cq = ConsumeQueue("T", 0, str(tmp_path), 20 * 4)
    n = 11
    offsets = np.arange(n, dtype=np.int64) * 100
    sizes = np.full(n, 90, np.int64)
    codes = np.arange(n, dtype=np.int64) - 5
    cq.put_units(offsets[:3], sizes[:3], codes[:3], np.arange(3))
    cq.put_units(offsets, sizes, codes, np.arange(n))          # the first 3 are repeats
    assert [cq.get_unit(i) for i in range(n)] == [(int(o), 90, int(c))
                                                  for o, c in zip(offsets, codes)]
    assert len(cq.mapped_file_queue.mapped_files) == 3
    cq.close()


def test_put_entries_matches_put_key_with_a_full_file(tmp_path):
    one = IndexFile(str(tmp_path / "one"), 8, 12, 500, 1_700_000_000_000)
    bulk = IndexFile(str(tmp_path / "bulk"), 8, 12, 500, 1_700_000_000_000)
    keys = [f"T#k{i % 5}" for i in range(15)]
    phys = np.arange(15, dtype=np.int64) * 64 + 1000
    stamps = 1_700_000_000_000 + np.arange(15, dtype=np.int64) * 700
    put = sum(one.put_key(k, int(p), int(t)) for k, p, t in zip(keys, phys, stamps))
    hashes = index_key_hashes([k.encode() for k in keys])
    taken = bulk.put_entries(hashes[:4], phys[:4], stamps[:4])
    taken += bulk.put_entries(hashes[4:], phys[4:], stamps[4:])
    assert taken == put == 11
    one.flush()
    bulk.flush()
    assert open(one.path, "rb").read() == open(bulk.path, "rb").read()
    one.close()
    bulk.close()
