"""The embedded MessageStore: put, pull, lookups, validation, delays, transactions,
flush modes and injected disk faults. Real files in temporary directories."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os

import pytest

from conftest import msg, refuse_next_commit_log_file, reopen, small_config
from rocketstore.storage import json_file
from rocketstore.storage import (
    GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreClosedError,
    StoreLockedError)
from rocketstore.storage import mapped_file
from rocketstore.storage.consume_queue import encode_unit
from rocketstore.storage.hashing import java_string_hash
from rocketstore.storage.message import (
    PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
from rocketstore.storage.clock import now_ms
from rocketstore.storage.record import MESSAGE_MAGIC_CODE_V2, SCHEDULE_TOPIC


def pull_all(store, topic, queue_id, offset=0):
    out = []
    while True:
        g = store.get_message("g", topic, queue_id, offset, 32)
        if not g.messages:
            return out
        out.extend(g.messages)
        offset = g.next_begin_offset


# --------------------------------------------------------------------------- put and get
def test_put_then_get_every_field(store):
    m = Message(topic="TopicTest", body=b"hello", tags="TagA", keys=["k1", "k2"],
                properties={"a": "b"}, queue_id=2, flag=7, born_timestamp=123,
                born_host=("192.168.0.9", 4242), reconsume_times=1)
    r = store.put(m)
    assert r.status is PutMessageStatus.PUT_OK and r.ok
    assert (r.wrote_offset, r.queue_id, r.queue_offset) == (0, 2, 0)
    assert len(r.msg_id) == 32 and r.store_timestamp > 0
    g = store.get_message("g", "TopicTest", 2, 0, 10)
    assert g.status is GetMessageStatus.FOUND and g.next_begin_offset == 1
    (got,) = g.messages
    assert (got.topic, got.body, got.tags, got.keys, got.queue_id, got.queue_offset) == \
        ("TopicTest", b"hello", "TagA", ["k1", "k2"], 2, 0)
    assert got.properties["a"] == "b" and got.flag == 7 and got.born_timestamp == 123
    assert got.born_host == ("192.168.0.9", 4242) and got.reconsume_times == 1
    assert (got.commit_log_offset, got.store_size, got.msg_id) == (0, r.wrote_bytes, r.msg_id)
    assert got.store_timestamp == r.store_timestamp
    assert store.check() == []


def test_queue_offsets_and_wrote_offsets_are_contiguous(store):
    results = store.put_batch([msg(i, queue_id=i % 3) for i in range(300)])
    assert all(r.ok for r in results)
    for q in range(3):
        assert [r.queue_offset for r in results if r.queue_id == q] == list(range(100))
        assert [m.body for m in pull_all(store, "TopicTest", q)] == \
            [msg(i).body for i in range(300) if i % 3 == q]
    assert store.check() == []


def test_roll_over_across_many_tiny_files(store):
    results = store.put_batch([msg(i, queue_id=i % 4) for i in range(1000)])
    files = store.commit_log.mapped_file_queue.mapped_files
    assert len(files) > 10
    for r in results:
        assert store.look_message_by_offset(r.wrote_offset).msg_id == r.msg_id
        assert r.wrote_offset // 8192 == (r.wrote_offset + r.wrote_bytes - 1) // 8192
    for f in files[:-1]:
        assert f.is_full()
    # the next-next file is preallocated on disk, full size
    nxt = os.path.join(store.config.commit_log_dir, f"{files[-1].file_from_offset + 8192:020d}")
    assert os.path.getsize(nxt) == 8192
    assert sum(len(pull_all(store, "TopicTest", q)) for q in range(4)) == 1000
    assert store.check() == []


def test_queue_chosen_round_robin_when_unset(store):
    results = [store.put(msg(i, queue_id=None)) for i in range(16)]
    assert [r.queue_id for r in results] == [i % 8 for i in range(16)]


def test_put_continues_after_reopen(config):
    s = reopen(config)
    s.put_batch([msg(i, queue_id=1) for i in range(10)])
    s.close()
    s = reopen(config)
    assert s.last_exit_ok
    assert s.put(msg(10, queue_id=1)).queue_offset == 10
    assert len(pull_all(s, "TopicTest", 1)) == 11
    assert s.check() == []
    s.close()


def test_clean_reopens_and_checks_add_no_index_entry(config):
    """Each start passes the last indexed message again; its keys are not put again
    (every load and every check used to add them once more)."""
    s = reopen(config)
    s.put_batch([msg(i, queue_id=1) for i in range(5)])
    s.close()
    counts = []
    for _ in range(3):
        s = reopen(config)
        assert s.check() == []
        counts.append(sum(1 for f in s.index_service.files for _ in f.iter_entries()))
        s.close()
    assert counts[0] > 0 and counts == [counts[0]] * 3


@pytest.mark.parametrize("damage", ["slot", "link"])
def test_check_names_keys_no_query_reaches(config, damage):
    """A zeroed hash slot, or a link that points forwards, loses keys to every query;
    check walks the chains as queries do and names the entries cut off and the keys."""
    from rocketstore.storage.index_file import (
        HASH_SLOT_SIZE, INDEX_HEADER_SIZE, INDEX_SIZE, PRE_INDEX_NO_POS)
    s = reopen(config)
    s.put_batch([msg(i, queue_id=0) for i in range(40)])
    s.dispatch()
    [f] = s.index_service.files
    entries = list(f.iter_entries())
    # an entry with an older one behind it in its chain
    no, key_hash, phy, _, prev = next(e for e in entries if e[4] > 0)
    path, slots = f.path, f.hash_slot_num
    s.close()
    with open(path, "r+b") as out:
        if damage == "slot":
            out.seek(INDEX_HEADER_SIZE + key_hash % slots * HASH_SLOT_SIZE)
            out.write(bytes(4))
        else:
            out.seek(INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE + no * INDEX_SIZE
                     + PRE_INDEX_NO_POS)
            out.write((no + 1).to_bytes(4, "big"))
    s = reopen(config)
    try:
        problems = s.check()
        lost = [e for e in entries if f"entry {e[0]} (offset {e[2]}): no query" in
                " ".join(problems)]
        assert lost and (prev in [e[0] for e in lost])
        assert all(f"commitlog offset {e[2]}: key" in " ".join(problems) for e in lost)
    finally:
        s.close()


def test_long_topic_uses_v2_layout(store):
    topic = "T" * 200
    r = store.put(Message(topic=topic, body=b"x", queue_id=0))
    raw = store.commit_log.get_message(r.wrote_offset, r.wrote_bytes)
    assert int.from_bytes(raw[4:8], "big") == MESSAGE_MAGIC_CODE_V2
    assert pull_all(store, topic, 0)[0].topic == topic
    assert store.check() == []


def test_ipv6_hosts(tmp_path):
    s = MessageStore(small_config(tmp_path, broker_ip1="::1"))
    s.load()
    r = s.put(Message(topic="T", body=b"6", born_host=("2001:db8::7", 99)))
    assert len(r.msg_id) == 56
    got = s.look_message_by_id(r.msg_id)
    assert got.born_host == ("2001:db8::7", 99) and got.store_host == ("::1", 10911)
    assert s.check() == []
    s.close()


# --------------------------------------------------------------------------- validation
BAD = [
    (dict(topic="bad topic"), PutMessageStatus.MESSAGE_ILLEGAL, "topic"),
    (dict(topic="../../etc"), PutMessageStatus.MESSAGE_ILLEGAL, "topic"),
    (dict(topic="x" * 256), PutMessageStatus.MESSAGE_ILLEGAL, "topic"),
    (dict(topic=""), PutMessageStatus.MESSAGE_ILLEGAL, "topic"),
    (dict(topic=SCHEDULE_TOPIC), PutMessageStatus.MESSAGE_ILLEGAL, "reserved"),
    (dict(topic="RMQ_SYS_TRACE"), PutMessageStatus.MESSAGE_ILLEGAL, "reserved"),
    (dict(body="text"), PutMessageStatus.MESSAGE_ILLEGAL, "body"),
    (dict(body=b"x" * 9000), PutMessageStatus.MESSAGE_ILLEGAL, "CommitLog file"),
    (dict(queue_id=8), PutMessageStatus.MESSAGE_ILLEGAL, "queue id"),
    (dict(queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL, "queue id"),
    (dict(delay_level=-1), PutMessageStatus.MESSAGE_ILLEGAL, "delay"),
    (dict(flag=2**31), PutMessageStatus.MESSAGE_ILLEGAL, "flag"),
    (dict(properties={"a\x01": "b"}), PutMessageStatus.MESSAGE_ILLEGAL, "reserved byte"),
    (dict(properties={"a": "b\x02"}), PutMessageStatus.MESSAGE_ILLEGAL, "reserved byte"),
    (dict(properties={"a": "b\x00"}), PutMessageStatus.MESSAGE_ILLEGAL, "reserved byte"),
    (dict(properties={"": "b"}), PutMessageStatus.MESSAGE_ILLEGAL, "property"),
    (dict(properties={"a": 1}), PutMessageStatus.MESSAGE_ILLEGAL, "property"),
    (dict(tags="a\x01"), PutMessageStatus.MESSAGE_ILLEGAL, "tags"),
    (dict(keys=["has space"]), PutMessageStatus.MESSAGE_ILLEGAL, "key"),
    (dict(properties={"p": "v" * 33000}), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, "32767"),
]


@pytest.mark.parametrize("fields,status,reason", BAD)
def test_bad_input_is_refused_and_stores_nothing(store, fields, status, reason):
    store.put(msg(0))
    before = store.commit_log.get_max_offset()
    m = Message(**{"topic": "TopicTest", "body": b"ok", **fields})
    results = store.put_batch([msg(1), m, msg(2)])
    assert results[1].status is status and reason in results[1].reason
    assert results[0].ok and results[2].ok  # a refusal does not stop the others
    assert store.commit_log.get_max_offset() == before + results[0].wrote_bytes + results[2].wrote_bytes
    assert not os.path.exists(os.path.join(store.config.consume_queue_dir, "bad topic"))
    assert store.check() == []


def test_max_message_size(tmp_path):
    s = MessageStore(small_config(tmp_path, max_message_size=200))
    s.load()
    r = s.put(Message(topic="T", body=b"x" * 150))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "max_message_size" in r.reason
    assert s.put(Message(topic="T", body=b"x" * 50)).ok
    s.close()


def test_not_a_message_is_refused(store):
    assert store.put("hello").status is PutMessageStatus.MESSAGE_ILLEGAL


def test_slave_refuses_puts(tmp_path):
    s = MessageStore(small_config(tmp_path, broker_role="SLAVE"))
    s.load()
    r = s.put(msg(0))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SLAVE" in r.reason
    s.close()


def test_closed_store(config):
    s = reopen(config)
    s.close()
    assert s.put(msg(0)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    for call in (lambda: s.get_message("g", "TopicTest", 0, 0, 1), s.get_min_phy_offset,
                 s.get_max_phy_offset, lambda: s.query_message("TopicTest", "k"),
                 lambda: s.look_message_by_offset(0)):
        with pytest.raises(StoreClosedError):
            call()


def test_second_store_on_same_directory_is_refused(store, config):
    with pytest.raises(StoreLockedError, match="in use"):
        MessageStore(config).load()


# --------------------------------------------------------------------------- delays
def test_delayed_message_goes_to_schedule_topic(store):
    r = store.put(Message(topic="Orders", body=b"later", tags="T", queue_id=3, delay_level=3))
    assert r.ok and r.queue_id == 3
    assert pull_all(store, "Orders", 3) == []
    (held,) = pull_all(store, SCHEDULE_TOPIC, 2)
    assert held.properties[PROPERTY_REAL_TOPIC] == "Orders"
    assert held.properties[PROPERTY_REAL_QUEUE_ID] == "3" and held.delay_level == 3
    unit = store.find_consume_queue(SCHEDULE_TOPIC, 2).get_unit(0)
    assert unit[2] == held.store_timestamp + 10_000  # tagsCode = delivery time
    assert store.check() == []


def test_delay_level_is_clamped(store):
    store.put(Message(topic="Orders", body=b"x", delay_level=99))
    (held,) = pull_all(store, SCHEDULE_TOPIC, 17)
    assert held.delay_level == 18


# --------------------------------------------------------------------------- transactions
def test_transaction_types(store):
    prepared = store.put(Message(topic="Tx", body=b"p", keys=["kp"], queue_id=0,
                                 sys_flag=TRANSACTION_PREPARED_TYPE))
    rollback = store.put(Message(topic="Tx", body=b"r", keys=["kr"], queue_id=0,
                                 sys_flag=TRANSACTION_ROLLBACK_TYPE))
    commit = store.put(Message(topic="Tx", body=b"c", keys=["kc"], queue_id=0,
                               sys_flag=TRANSACTION_COMMIT_TYPE))
    plain = store.put(Message(topic="Tx", body=b"n", keys=["kn"], queue_id=0))
    assert (prepared.queue_offset, rollback.queue_offset) == (0, 0)
    assert (commit.queue_offset, plain.queue_offset) == (0, 1)
    assert [m.body for m in pull_all(store, "Tx", 0)] == [b"c", b"n"]
    assert [m.body for m in store.query_message("Tx", "kp").messages] == [b"p"]
    assert store.query_message("Tx", "kr").messages == []
    assert [m.body for m in store.query_message("Tx", "kc").messages] == [b"c"]
    assert store.check() == []


# --------------------------------------------------------------------------- reads
def test_get_message_statuses(store):
    assert store.get_message("g", "Nope", 0, 0, 1).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    store.put_batch([msg(i) for i in range(5)])
    g = store.get_message("g", "TopicTest", 0, 5, 1)
    assert (g.status, g.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 5)
    g = store.get_message("g", "TopicTest", 0, 9, 1)
    assert (g.status, g.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0)
    g = store.get_message("g", "TopicTest", 0, 1, 2)
    assert [m.queue_offset for m in g.messages] == [1, 2] and g.next_begin_offset == 3
    assert (g.min_offset, g.max_offset) == (0, 5)
    store.find_consume_queue("Empty", 0)
    assert store.get_message("g", "Empty", 0, 0, 1).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE


def test_get_message_caps_batch_at_in_memory_count(store):
    store.put_batch([msg(i) for i in range(100)])
    g = store.get_message("g", "TopicTest", 0, 0, 1000)
    assert len(g.messages) == store.config.max_transfer_count_on_message_in_memory


def test_get_message_tag_filter(store):
    store.put_batch([msg(i) for i in range(9)])
    g = store.get_message("g", "TopicTest", 0, 0, 32, tags=["Tag1"])
    assert [m.queue_offset for m in g.messages] == [1, 4, 7] and g.next_begin_offset == 9


def test_look_message_by_offset_and_id(store):
    r = store.put_batch([msg(i) for i in range(3)])[1]
    assert store.look_message_by_offset(r.wrote_offset).body == msg(1).body
    assert store.look_message_by_offset(r.wrote_offset + 1) is None
    assert store.look_message_by_offset(10**9) is None
    assert store.look_message_by_id(r.msg_id).queue_offset == 1
    other_host = "0A000001" + r.msg_id[8:]
    assert store.look_message_by_id(other_host) is None


def test_query_by_key_and_uniq_key(store):
    store.put(Message(topic="Q", body=b"1", keys=["order-1"], properties={"UNIQ_KEY": "U1"}))
    store.put(Message(topic="Q", body=b"2", keys=["order-1", "order-2"]))
    store.put(Message(topic="Other", body=b"3", keys=["order-1"]))
    assert [m.body for m in store.query_message("Q", "order-1").messages] == [b"1", b"2"]
    assert [m.body for m in store.query_message("Q", "U1").messages] == [b"1"]
    assert [m.body for m in store.query_message("Q", "order-1", max_num=1).messages] == [b"2"]
    assert store.query_message("Q", "missing").messages == []


def test_query_never_returns_a_hash_collision(store):
    assert java_string_hash("Q#Aa") == java_string_hash("Q#BB")
    store.put(Message(topic="Q", body=b"aa", keys=["Aa"]))
    assert store.query_message("Q", "BB").messages == []
    assert [m.body for m in store.query_message("Q", "Aa").messages] == [b"aa"]


def test_query_time_range(store):
    r = store.put(Message(topic="Q", body=b"1", keys=["k"]))
    ts = r.store_timestamp
    assert len(store.query_message("Q", "k", 10, ts, ts).messages) == 1
    assert store.query_message("Q", "k", 10, ts + 1, ts + 10_000).messages == []
    assert store.query_message("Q", "k", 10, 0, ts - 1).messages == []


def test_offset_in_queue_by_time(store):
    rs = store.put_batch([msg(i) for i in range(20)])
    ts = rs[10].store_timestamp
    off = store.get_offset_in_queue_by_time("TopicTest", 0, ts)
    assert rs[off].store_timestamp == ts
    assert store.get_offset_in_queue_by_time("Nope", 0, ts) == 0
    assert store.get_max_offset_in_queue("TopicTest", 0) == 20
    assert store.get_min_offset_in_queue("TopicTest", 0) == 0
    assert store.get_commit_log_offset_in_queue("TopicTest", 0, 3) == rs[3].wrote_offset


def test_index_disabled(tmp_path):
    s = MessageStore(small_config(tmp_path, message_index_enable=False))
    s.load()
    s.put(msg(1))
    assert s.query_message("TopicTest", "key-1").messages == []
    assert not os.listdir(s.config.index_dir) if os.path.isdir(s.config.index_dir) else True
    assert s.check() == []
    s.close()


def test_arriving_listener(store):
    seen = []
    store.message_arriving_listener = lambda *a: seen.append(a[:3])
    store.put_batch([msg(i, queue_id=1) for i in range(3)])
    store.dispatch()
    assert seen == [("TopicTest", 1, 1), ("TopicTest", 1, 2), ("TopicTest", 1, 3)]


# --------------------------------------------------------------------------- flush modes, faults
def test_sync_flush_flushes_before_returning(tmp_path):
    s = MessageStore(small_config(tmp_path, flush_disk_type="SYNC_FLUSH"))
    s.load()
    for i in range(50):
        s.put(msg(i))
        assert s.commit_log.mapped_file_queue.flushed_where == s.commit_log.get_max_offset()
    s.close()


def test_async_flush_on_close(config):
    s = reopen(config)
    s.put_batch([msg(i) for i in range(40)])
    s.close()
    assert not os.path.exists(os.path.join(config.store_path_root_dir, "abort"))


def test_fsync_error_stops_writes_loudly(tmp_path, monkeypatch):
    """Injected fault: fdatasync raising EIO (a real disk cannot be made to on demand)."""
    s = MessageStore(small_config(tmp_path, flush_disk_type="SYNC_FLUSH"))
    s.load()
    assert s.put(msg(0)).ok

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mapped_file.FILE_OPS, "fdatasync", eio)
    r = s.put(msg(1))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "flush failed" in r.reason
    r = s.put(msg(2))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "FLUSH_ERROR" in r.reason
    s.close()
    monkeypatch.undo()
    assert os.path.exists(os.path.join(s.root_dir, "abort"))  # next load recovers abnormally
    s = MessageStore(s.config)
    s.load()
    assert not s.last_exit_ok and s.check() == []
    assert [m.body for m in pull_all(s, "TopicTest", 0)] == [msg(0).body, msg(1).body]
    s.close()


def test_disk_full_at_roll_over(config, monkeypatch):
    """Injected fault: fallocate raising ENOSPC when the next file is created. Driven by
    hand, so the full disk meets the CommitLog's roll first (the background dispatch
    would meet it at an index file and stop writes there)."""
    store = MessageStore(config, background=False)
    store.load()
    i = 0
    while len(store.commit_log.mapped_file_queue.mapped_files) < 2:
        assert store.put(msg(i)).ok
        i += 1
    before = store.commit_log.get_max_offset()
    refuse_next_commit_log_file(
        store.config, store.commit_log.mapped_file_queue.mapped_files[-1].file_from_offset,
        monkeypatch, store.commit_log)
    statuses = {store.put(msg(j)).status for j in range(i, i + 200)}
    assert PutMessageStatus.CREATE_MAPEDFILE_FAILED in statuses
    assert store.commit_log.get_max_offset() >= before
    monkeypatch.undo()
    assert store.put(msg(999)).ok
    assert store.check() == []
    store.close()


def test_status_reports_positions(store):
    store.put_batch([msg(i) for i in range(5)])
    store.dispatch()
    st = store.status()
    assert st["writeable"] and st["positions"]["written"] == st["positions"]["dispatched"] > 0
    assert st["queues"]["TopicTest/0"] == [0, 5]


def test_delayed_messages_are_delivered_when_due(config):
    s = reopen(config)
    r = s.put(Message(topic="Orders", body=b"later", tags="T", keys=["o1"], queue_id=3,
                      delay_level=2, properties={"x": "y"}))
    s.put(Message(topic="Orders", body=b"much later", queue_id=3, delay_level=5))
    assert s.next_delayed_due_ms() == r.store_timestamp + 5_000
    assert s.deliver_delayed_messages(r.store_timestamp + 4_999) == 0
    assert s.deliver_delayed_messages(r.store_timestamp + 5_000) == 1
    (m,) = pull_all(s, "Orders", 3)
    assert (m.body, m.tags, m.keys, m.properties["x"], m.delay_level) == \
        (b"later", "T", ["o1"], "y", 0)
    assert PROPERTY_REAL_TOPIC not in m.properties
    assert s.deliver_delayed_messages(r.store_timestamp + 5_000) == 0  # not twice
    s.close()
    s = reopen(config)  # progress survives a restart
    assert s.deliver_delayed_messages(r.store_timestamp + 5_000) == 0
    assert s.deliver_delayed_messages(r.store_timestamp + 61_000) == 1
    assert [m.body for m in pull_all(s, "Orders", 3)] == [b"later", b"much later"]
    assert s.check() == []
    s.close()


def test_a_backlog_of_delayed_messages_goes_out_a_batch_at_a_time(config):
    """With its deadline passed, a call delivers one batch and writes its progress, so
    a crash re-delivers at most that batch and a process's loop keeps turning."""
    from rocketstore.storage.schedule_message import BATCH
    s = MessageStore(config, background=False)
    s.load()
    results = s.put_batch([Message(topic="Later", body=b"d%03d" % i, queue_id=0, delay_level=1)
                           for i in range(BATCH * 2 + 5)])
    s.dispatch()
    service, due = s.schedule_message_service, results[-1].store_timestamp + 60_000
    assert service.deliver_due(due, deadline=0) == BATCH                 # already past
    assert json_file.load(service.path)["offsetTable"] == {"1": BATCH}   # written at once
    assert service.deliver_due(due, deadline=0) == BATCH
    assert service.deliver_due(due) == 5
    s.dispatch()
    assert [m.body for m in pull_all(s, "Later", 0)] == [b"d%03d" % i for i in range(BATCH * 2 + 5)]
    s.close()


@pytest.mark.parametrize("value", ["abc", "-1", "1_0", "\uff12", "", " 2"])
def test_a_delay_property_that_is_no_level_is_refused(store, value):
    r = store.put(Message(topic="T", body=b"x", properties={"DELAY": value}))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL, r


def test_a_delay_property_delays_as_the_field_does(config):
    """RocketMQ's setDelayTimeLevel is the DELAY property: a Message that carries it
    (SEND, as SEND_RECORDS always did) waits in SCHEDULE_TOPIC_XXXX."""
    s = reopen(config)
    r = s.put(Message(topic="Later", body=b"x", queue_id=0, properties={"DELAY": "2"}))
    s.dispatch()
    assert pull_all(s, "Later", 0) == []
    assert s.deliver_delayed_messages(r.store_timestamp + 5_000) == 1
    (m,) = pull_all(s, "Later", 0)
    assert m.body == b"x" and m.delay_level == 0
    s.close()


def test_a_stored_delay_property_that_is_no_level_reads_as_none():
    from rocketstore.storage.message import parse_delay_property
    assert [parse_delay_property(v) for v in ("3", "abc", "1_0", "\uff12", None, "")] == \
        [3, 0, 0, 0, 0, 0]


def test_a_delayed_message_the_store_will_never_take_holds_back_nothing(config, caplog):
    """Its queue went away (default_topic_queue_nums came down across a restart): it is
    passed over with an ERROR, and the level's later messages go out."""
    s = reopen(config)
    stuck = s.put(Message(topic="Shrunk", body=b"to queue 7", queue_id=7, delay_level=1))
    s.put(Message(topic="Shrunk", body=b"to queue 1", queue_id=1, delay_level=1))
    s.close()
    s = reopen(dataclasses.replace(config, default_topic_queue_nums=4))
    with caplog.at_level(logging.ERROR, logger="rocketstore.storage.schedule_message"):
        assert s.deliver_delayed_messages(stuck.store_timestamp + 60_000) == 1
    assert f"delayed message at {stuck.wrote_offset} (level 1) passed over" in caplog.text
    assert [m.body for m in pull_all(s, "Shrunk", 1)] == [b"to queue 1"]
    assert s.schedule_message_service.held_levels == {}
    assert s.deliver_delayed_messages(stuck.store_timestamp + 60_000) == 0
    s.close()


def test_a_level_refused_for_now_waits_and_says_so_once(config, caplog):
    """A full disk: the level is held for RETRY_MS (no retry, no log line, before),
    next_delayed_due_ms says when it is tried again, and it goes out once writeable."""
    from rocketstore.storage import schedule_message
    s = reopen(config)
    r = s.put(Message(topic="Held", body=b"waits", queue_id=0, delay_level=1))
    s.dispatch()
    due = r.store_timestamp + 60_000
    s.running_flags.get_and_make_disk_full()
    with caplog.at_level(logging.WARNING, logger="rocketstore.storage.schedule_message"):
        for _ in range(5):
            assert s.deliver_delayed_messages(due) == 0
    assert caplog.text.count("delayed messages of level 1 held") == 1
    assert s.next_delayed_due_ms() >= now_ms() + schedule_message.RETRY_MS - 100
    s.running_flags.get_and_make_disk_ok()
    assert s.deliver_delayed_messages(due) == 0                 # still held
    s.schedule_message_service.held_levels[1] = (0.0, "DISK_FULL")   # the wait, over
    assert s.deliver_delayed_messages(due) == 1
    assert [m.body for m in pull_all(s, "Held", 0)] == [b"waits"]
    s.close()


def test_unusable_consume_queue_and_index_are_rebuilt(config, caplog):
    s = reopen(config)
    rs = s.put_batch([msg(i, queue_id=i % 2) for i in range(120)])
    s.close()
    cq_file = os.path.join(config.consume_queue_dir, "TopicTest", "0", f"{0:020d}")
    os.truncate(cq_file, 100)  # not a multiple of the file size any more
    index_dir = config.index_dir
    for name in os.listdir(index_dir):
        os.truncate(os.path.join(index_dir, name), 1000)
    with caplog.at_level(logging.INFO, logger="rocketstore.storage.message_store"):
        s = reopen(config)
    assert "recovery row R4: scan normal, rebuild" in caplog.text
    assert [m.msg_id for m in pull_all(s, "TopicTest", 0)] == \
        [r.msg_id for r in rs if r.queue_id == 0]
    assert [m.body for m in s.query_message("TopicTest", "key-7").messages] == [msg(7).body]
    assert s.check() == []
    s.close()


def test_unit_pointing_at_the_wrong_record_raises(store):
    from rocketstore.storage import CorruptRecordError
    rs = store.put_batch([msg(i, queue_id=i % 2) for i in range(4)])
    store.dispatch()
    cq = store.find_consume_queue("TopicTest", 0)
    mf = cq.mapped_file_queue.mapped_files[0]
    other = rs[1]  # a queue-1 message
    mf.buf[20:40] = encode_unit(
        other.wrote_offset, other.wrote_bytes, 0)
    with pytest.raises(CorruptRecordError) as e:
        store.get_message("g", "TopicTest", 0, 1, 1)
    assert e.value.path == mf.path and e.value.offset == 20


@pytest.mark.parametrize("fields", [
    dict(keys="a\x00b"), dict(keys="k\x02UNIQ_KEY\x01forged"), dict(keys={"a"}),
    dict(keys=["ok", 5]), dict(born_host=("not-an-ip", 1)), dict(born_host=("1.2.3.4", 2**40)),
    dict(born_host="1.2.3.4:5"), dict(tags="\udc80"), dict(properties={"a": "\ud800"}),
    dict(tags=7)])
def test_more_bad_input_is_refused_without_stopping_the_batch(store, fields):
    results = store.put_batch([msg(1), Message(topic="TopicTest", body=b"x", **fields), msg(2)])
    assert results[1].status is PutMessageStatus.MESSAGE_ILLEGAL, results[1]
    assert results[0].ok and results[2].ok
    assert store.check() == []


def test_keys_as_one_string_are_split(store):
    store.put(Message(topic="Q", body=b"1", keys="a b"))
    assert [m.keys for m in store.query_message("Q", "b").messages] == [["a", "b"]]


def test_fastjson_delay_offsets_are_read(config):
    s = reopen(config)
    s.close()
    os.makedirs(config.config_dir, exist_ok=True)
    with open(os.path.join(config.config_dir, "delayOffset.json"), "w") as f:
        f.write('{"offsetTable":{1:3,2:0}}')
    s = reopen(config)
    assert s.schedule_message_service.offset_table == {1: 3, 2: 0}
    s.close()


def test_flush_moves_past_deleted_files_and_reaches_the_end(tmp_path):
    s = MessageStore(small_config(tmp_path, flush_interval_commit_log=10**9))
    s.load()
    s.put_batch([msg(i) for i in range(300)])
    mfq = s.commit_log.mapped_file_queue
    assert mfq.flushed_where == 0
    for f in mfq.mapped_files[:-1]:
        os.utime(f.path, (0, 0))
    s.disk_used_ratio = lambda path: 0.5
    assert s.clean_expired_files(force=True).commit_log_files > 0
    s.flush()
    assert mfq.flushed_where == mfq.get_max_wrote_position()
    s.close()


def test_a_message_without_a_queue_is_spread_round_robin(store):
    """``Message.queue_id`` defaults to None: the store picks, round robin per topic over
    ``default_topic_queue_nums`` queues, as RocketMQ's producer spreads a topic."""
    n = store.config.default_topic_queue_nums
    one = [store.put(Message(topic="Spread", body=b"%d" % i)).queue_id for i in range(n)]
    batch = [r.queue_id for r in store.put_batch([Message(topic="Spread", body=b"b")] * n)]
    assert one == batch == list(range(n))
