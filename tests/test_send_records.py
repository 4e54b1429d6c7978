"""The batch path: records a producer lays out in CommitLog form (SEND_RECORDS), checked
in bulk by the writer and appended with vectorised stamps.

1. byte identity: the same messages through ``CommitLog.prepare`` + ``append`` (the
   SEND path) and through ``record_batch.encode_records`` + ``check_records`` +
   ``append_batch`` give the same CommitLog, consume-queue and index bytes (one store
   time for both; delays, IPv6 born hosts, v2 topics, transactions, file rolls);
2. the checks: every refusal of ``validation.check_message`` has its twin on the bytes,
   and a frame whose bytes are not records is refused whole, naming the record;
3. end to end through a running writer: good records around bad ones are stored, the
   bad ones named, the writer keeps serving; an idempotent producer's resend over
   SEND_RECORDS is stored once.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

from rocketstore.wire import protocol
from rocketstore.client import Producer
from rocketstore.storage import Message, MessageStore, StoreConfig, record, record_batch
from rocketstore.storage import commit_log as commit_log_module
from rocketstore.storage.commit_log import CommitLog, EncodedMessage
from rocketstore.storage.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE
from rocketstore.storage.put_path import QueueSelector, prepare_batch
from rocketstore.storage.record_batch import RecordsFormatError, check_records, encode_records, same_bytes
from rocketstore.storage.status import PutMessageStatus
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.validation import check_message
from conftest import refuse_next_commit_log_file
from test_writer_flusher import message, running  # noqa: F401  (fixture)

STORE_TS = 1_700_000_000_123
BORN_TS = 1_700_000_000_000
FILE_SIZE = 64 * 1024


def config(root, **kw) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=FILE_SIZE,
                       mapped_file_size_consume_queue=20 * 64, **kw)


def mixed_messages(n: int) -> list[Message]:
    out = []
    for i in range(n):
        kw = {}
        if i % 7 == 3:
            kw["delay_level"] = 2
        if i % 11 == 5:
            kw["born_host"] = ("::1", 4000 + i)
        if i % 13 == 6:
            kw["sys_flag"] = TRANSACTION_PREPARED_TYPE
        if i % 13 == 7:
            kw["sys_flag"] = TRANSACTION_COMMIT_TYPE
        if i % 5 == 1:
            kw["wait_store_msg_ok"] = False
        topic = "T" * 200 if i % 17 == 9 else f"Topic{i % 3}"
        out.append(Message(topic, os.urandom(50 + (i * 37) % 900), tags=f"tag{i % 4}",
                           keys=[f"k{i}", f"o{i % 9}"], properties={"u": str(i)},
                           queue_id=None if i % 2 else i % 4, born_timestamp=BORN_TS + i,
                           flag=i, reconsume_times=i % 3,
                           prepared_transaction_offset=i * 10, **kw))
    return out


def put_through_send_path(store: MessageStore, msgs: list[Message]) -> None:
    results: list = [None] * len(msgs)
    prepared = prepare_batch(store.commit_log, store.config, msgs, STORE_TS,
                             QueueSelector(store.config.default_topic_queue_nums), results)
    assert not any(results), results
    store.commit_log.append(prepared.records, STORE_TS)


def put_through_records_path(store: MessageStore, msgs: list[Message]) -> None:
    data, offsets = encode_records(msgs, BORN_TS)
    checked = check_records(data, np.array(offsets), store.config)
    assert not checked.refusals, checked.refusals
    append_taken(store, data, checked)


def append_taken(store: MessageStore, data: bytes, checked) -> int:
    """Append what ``check_records`` did not refuse, as the writer does (a record sent
    the long way prepared like a SEND message); the number appended."""
    selector = QueueSelector(store.config.default_topic_queue_nums)
    pieces = []
    for i in range(checked.count):
        if i in checked.refusals:
            continue
        msg = checked.long_way.get(i)
        if msg is not None:
            one = prepare_batch(store.commit_log, store.config, [msg], STORE_TS, selector, [None])
            e = one.records[0]
            pieces.append((e.data, e.topic, e.queue_id, e.real_queue_id, e.consumable,
                           e.store_timestamp_pos, False))
        else:
            q = checked.queue_ids[i]
            q = selector.next_queue(checked.topics[i]) if q < 0 else q
            s, n = int(checked.starts[i]), int(checked.sizes[i])
            pieces.append((data[s:s + n], checked.topics[i], q, q, checked.consumable[i],
                           record_batch.STORETIMESTAMP_POS, True))
    if not pieces:
        return 0
    batch = record_batch.from_pieces(pieces)
    return store.commit_log.append_batch(batch, batch.queue_ids, STORE_TS).count


def store_files(root) -> dict[str, bytes]:
    """CommitLog, consume-queue and index files by name (index files, named by the wall
    clock at their creation, by their order)."""
    out = {}
    for base, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), root)
            if rel.split(os.sep)[0] in ("commitlog", "consumequeue", "index"):
                with open(os.path.join(base, name), "rb") as f:
                    data = f.read()
                if data.count(0) != len(data):      # files made ahead hold nothing yet
                    out[rel] = data
    index = sorted(k for k in out if k.startswith("index" + os.sep))
    for n, name in enumerate(index):
        out[f"index #{n}"] = out.pop(name)
    return out


def stored_files(root, msgs: list[Message], put) -> dict[str, bytes]:
    """``store_files`` of a fresh store given ``msgs`` by ``put``, 64 at a time, then
    dispatched and closed (one store time for every put)."""
    with MessageStore(config(root), background=False) as store:
        for lo in range(0, len(msgs), 64):
            put(store, [_copy(m) for m in msgs[lo:lo + 64]])
        store.dispatch()
    return store_files(root)


def assert_same_files(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name


def test_both_paths_write_the_same_bytes(tmp_path):
    msgs = mixed_messages(400)
    a = stored_files(tmp_path / "send", msgs, put_through_send_path)
    b = stored_files(tmp_path / "records", msgs, put_through_records_path)
    assert len([k for k in a if k.startswith("commitlog")]) > 3      # files rolled
    assert_same_files(a, b)


def test_queue_offsets_counted_in_bulk_write_the_same_bytes(tmp_path, monkeypatch):
    """Batches of one topic, queue offsets counted in numpy (what the appender does for
    long batches) or record by record: the same files."""
    msgs = [m for m in mixed_messages(2000) if not m.delay_level and m.topic == "Topic0"]
    files = []
    for name, bulk_from in (("loop", 10 ** 9), ("bulk", 2)):
        monkeypatch.setattr(commit_log_module, "QUEUE_COUNT_BULK", bulk_from)
        files.append(stored_files(tmp_path / name, msgs, put_through_records_path))
    assert any(k.startswith("consumequeue") for k in files[0])
    assert_same_files(*files)


@pytest.mark.parametrize("bulk_from", [10 ** 9, 2])
def test_a_batch_cut_short_by_a_full_disk_advances_its_queues_by_what_it_stored(
        tmp_path, monkeypatch, bulk_from):
    """A batch of one topic the CommitLog takes only in part (no next file can be made):
    each queue goes on from the records stored, the offsets counted record by record
    or in numpy alike, and the next put continues them."""
    monkeypatch.setattr(commit_log_module, "QUEUE_COUNT_BULK", bulk_from)
    cfg = config(tmp_path / "store")
    store = MessageStore(cfg, background=False)
    store.load()
    try:
        assert store.put(Message("T", b"first", queue_id=0)).status is PutMessageStatus.PUT_OK
        refuse_next_commit_log_file(cfg, 0, monkeypatch, store.commit_log)
        msgs = [Message("T", bytes(200), tags="a", keys=[f"k{i}"], queue_id=i % 3)
                for i in range(2 * FILE_SIZE // 200)]
        results = list(store.put_batch(msgs))
        stored = [r for r in results if r.status is PutMessageStatus.PUT_OK]
        assert 0 < len(stored) < len(msgs)
        assert all(r.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
                   for r in results[len(stored):])
        for q in range(3):
            offsets = [r.queue_offset for r in stored if r.queue_id == q]
            assert offsets == list(range(q == 0, (q == 0) + len(offsets)))
            assert store.commit_log.topic_queue_table[("T", q)] == (q == 0) + len(offsets)
    finally:
        store.close()


def _copy(m: Message) -> Message:
    keys = list(m.keys) if isinstance(m.keys, (list, tuple)) else m.keys
    return Message(m.topic, m.body, m.tags, keys,
                   dict(m.properties), m.queue_id, m.flag, m.sys_flag, m.delay_level,
                   m.born_timestamp, m.born_host, m.reconsume_times,
                   m.prepared_transaction_offset, m.wait_store_msg_ok)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300),
                          st.text("abcXYZ_-%|09", min_size=1, max_size=140),
                          st.one_of(st.none(), st.text("abc ", max_size=8)),
                          st.dictionaries(st.text("pqr", min_size=1, max_size=4),
                                          st.text("xyzé", min_size=1, max_size=5), max_size=3),
                          st.one_of(st.none(), st.integers(0, 3)),
                          st.one_of(st.none(), st.text("k1 ", max_size=6),
                                    st.lists(st.text("k2", min_size=1, max_size=3), max_size=3)),
                          st.booleans(), st.sampled_from([0, 0, 3]),
                          st.sampled_from([("127.0.0.1", 5), ("10.1.2.3", 65535), ("::1", 9)])),
                min_size=1, max_size=20))
def test_a_record_encodes_as_prepare_encodes_it(tmp_path_factory, rows):
    """The producer's record is the one ``CommitLog.prepare`` makes (a delayed message:
    before the store's rewrite, so compared with prepare's input laid out as is)."""
    cfg = config(tmp_path_factory.mktemp("p"))
    cl = CommitLog(cfg)
    for body, topic, tags, props, queue_id, keys, wait, delay, host in rows:
        m = Message(topic, body, tags=tags, keys=keys, properties=props, queue_id=queue_id,
                    born_timestamp=BORN_TS, wait_store_msg_ok=wait, born_host=host)
        if delay:
            m.delay_level = delay
            m.properties = dict(props)
        if check_message(m, cfg) is not None:
            continue
        general = record_batch._encode_general(m, BORN_TS, None)
        assert record_batch.encode_message(m, BORN_TS) == general
        m.delay_level = 0
        if check_message(m, cfg) is not None:
            continue
        enc = cl.prepare(_copy(m), -1 if queue_id is None else queue_id, BORN_TS)
        mine = bytearray(record_batch.encode_message(m, BORN_TS))
        checked = check_records(bytes(mine), np.array([0]), cfg)
        if type(enc) is not EncodedMessage:              # too large: refused by both
            assert checked.refusals[0][0] is enc[0]
            continue
        assert checked.refusals == {}
        host_at = record_batch.STOREHOST_POS + (12 if ":" in host[0] else 0)
        mine[host_at:host_at + 8] = cl.store_host_bytes  # the writer's stamp
        assert bytes(enc.data) == bytes(mine)


# ============================================================================ 2. the checks
def frame_records(msgs):
    data, offsets = encode_records(msgs, BORN_TS)
    return bytearray(data), np.array(offsets)


def test_each_content_rule_refuses_one_record_and_names_it(tmp_path):
    cfg = config(tmp_path)
    good = Message("TopicA", b"fine", tags="t", queue_id=0)
    cases = {
        "reserved": Message(record.SCHEDULE_TOPIC, b"x", queue_id=0),
        "must match": Message("bad/topic", b"x", queue_id=0),
        "queue id": Message("TopicA", b"x", queue_id=99),
        "max_message_size": Message("TopicA", b"x" * 5000, queue_id=0),
        "reserved property": Message("TopicA", b"x", properties={"__PID": "1"}, queue_id=0),
        "empty value": Message("TopicA", b"x", properties={"p": ""}, queue_id=0),
    }
    cfg.max_message_size = 4096
    msgs = [good] + list(cases.values()) + [good]
    data, offsets = frame_records(msgs)
    checked = check_records(bytes(data), offsets, cfg)
    assert sorted(checked.refusals) == list(range(1, len(msgs) - 1))
    words = ["reserved", "must match", "queue id", "max_message_size", "__PID", "non-empty"]
    for i, word in enumerate(words, 1):
        status, reason = checked.refusals[i]
        assert status is PutMessageStatus.MESSAGE_ILLEGAL and word in reason, (word, reason)

    # a flipped body byte: the CRC no longer matches
    s = int(offsets[0]) + record_batch.BODY_POS
    data[s] ^= 0xFF
    checked = check_records(bytes(data), offsets, cfg)
    assert "CRC" in checked.refusals[0][1]
    # properties that are not UTF-8
    bad = record_batch.encode_message(Message("TopicA", b"x", properties={"p": "v"}), BORN_TS)
    bad = bytearray(bad)
    bad[bad.index(b"p\x01v") + 2] = 0xFF
    checked = check_records(bytes(bad), np.array([0]), cfg)
    assert "UTF-8" in checked.refusals[0][1]


def test_bytes_that_are_not_records_are_refused_whole(tmp_path):
    cfg = config(tmp_path)
    msgs = [Message("TopicA", b"a" * 10, queue_id=0), Message("TopicA", b"b" * 20, queue_id=0)]
    data, offsets = frame_records(msgs)

    def refused(buf, offs, word, index):
        with pytest.raises(RecordsFormatError) as e:
            check_records(bytes(buf), np.array(offs), cfg)
        assert word in str(e.value) and e.value.index == index, str(e.value)

    refused(data, [0, int(offsets[1]) + 1], "TOTALSIZE", 0)
    refused(data + b"x", offsets, "TOTALSIZE", 1)
    refused(data[:-1], offsets, "TOTALSIZE", 1)
    refused(data, [4, int(offsets[1])], "starts at 4", 0)
    magic = bytearray(data)
    struct.pack_into(">I", magic, int(offsets[1]) + 4, 0x12345678)
    refused(magic, offsets, "magic", 1)
    stamped = bytearray(data)
    struct.pack_into(">q", stamped, record.PHYSICALOFFSET_POS, 99)
    refused(stamped, offsets, "store's to fill", 0)
    host = bytearray(data)                     # STOREHOSTADDRESS: zeros, IPv4-wide
    host[record_batch.STOREHOST_POS + 3] = 1
    refused(host, offsets, "STOREHOSTADDRESS", 0)
    wide = bytearray(data)
    struct.pack_into(">i", wide, int(offsets[1]) + record.SYSFLAG_POS,
                     record_batch.STOREHOSTADDRESS_V6_FLAG)
    refused(wide, offsets, "STOREHOSTADDRESS", 1)
    body = bytearray(data)
    struct.pack_into(">i", body, int(offsets[1]) + record_batch.BODYLENGTH_POS, 10_000)
    refused(body, offsets, "body length", 1)
    topic = bytearray(data)
    topic[record_batch.BODY_POS + 10] = 0      # topic length 0
    refused(topic, offsets, "topic length", 0)


def _verdict_fields(checked) -> tuple:
    return (checked.count, checked.refusals, checked.long_way, checked.topics,
            checked.queue_ids, checked.consumable, checked.waits, checked.starts.tolist(),
            checked.sizes.tolist())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=120), st.sampled_from(["TopicA", "TopicB"]),
                          st.one_of(st.none(), st.sampled_from(["t", "é"])),
                          st.sampled_from([None, 0, 3]), st.booleans(),
                          st.sampled_from([0, 0, TRANSACTION_PREPARED_TYPE])),
                min_size=1, max_size=record_batch.SMALL_CHECK - 1),
       st.sampled_from([0, 7]), st.data())
def test_a_short_run_is_judged_record_by_record_as_in_bulk(tmp_path_factory, rows, producer_id,
                                                           data):
    """A short run goes record by record when every record is taken as it is: then the
    bulk check gives the same verdict. With a byte changed, the frame cut short or an
    offset moved, the record-by-record path either agrees with the bulk check or leaves
    the run to it (never raises another error)."""
    cfg = config(tmp_path_factory.mktemp("s"))
    cfg.max_message_size = data.draw(st.sampled_from([cfg.max_message_size, 130]))
    msgs = [Message(topic, body, tags=tags, queue_id=queue_id, wait_store_msg_ok=wait,
                    sys_flag=sys_flag, born_timestamp=BORN_TS)
            for body, topic, tags, queue_id, wait, sys_flag in rows]
    buf, offsets = encode_records(msgs, BORN_TS, producer_id, 5)
    buf, offsets = bytearray(buf), list(offsets)
    change = data.draw(st.sampled_from(["none", "byte", "byte", "cut", "offset"]))
    changed = change != "none"
    if change == "byte":                # half the time in a record's fixed fields
        start = offsets[data.draw(st.integers(0, len(offsets) - 1))]
        at = data.draw(st.one_of(st.integers(start, start + record_batch.BODY_POS - 1),
                                 st.integers(0, len(buf) - 1)))
        buf[at] ^= data.draw(st.integers(1, 255))
    elif change == "cut":               # a frame cut short (or with bytes past its end)
        cut = data.draw(st.integers(-len(buf) + 1, 40))
        buf = buf[:cut] if cut < 0 else buf + bytes(cut)
    elif change == "offset":            # an offsets table that disagrees with the records
        i = data.draw(st.integers(0, len(offsets) - 1))
        offsets[i] += data.draw(st.integers(-300, 300).filter(bool))
    raw, offs = bytes(buf), np.array(offsets)
    small = record_batch._check_clean_run(raw, offs, cfg, producer_id, 5, {})
    sizes = np.diff(np.append(offsets, len(buf)))
    if not changed and all(m.tags != "é" for m in msgs) and max(sizes) <= cfg.max_message_size:
        assert small is not None
    try:
        bulk = record_batch._check_bulk(raw, offs, cfg, False, producer_id, 5, {})
    except RecordsFormatError:
        assert small is None
        return
    if small is not None:
        assert _verdict_fields(small) == _verdict_fields(bulk)
    elif not bulk.refusals and not bulk.long_way:   # the one clean run it leaves:
        assert not all(record.properties_at(raw, s).isascii() for s in offsets)  # non-ASCII
    assert _verdict_fields(check_records(raw, offs, cfg, producer_id=producer_id,
                                         first_sequence=5)) == _verdict_fields(bulk)


def _insert_byte(buf: bytearray, offsets: list[int], i: int, region: str, at: int,
                 value: int) -> None:
    """Put ``value`` into record ``i``'s topic, body or properties at ``at`` (a fraction
    of the field's length) and make every length, TOTALSIZE, the body CRC and the later
    offsets agree: damage that only the content rules can see."""
    s = offsets[i]
    body_len = struct.unpack_from(">i", buf, s + record_batch.BODYLENGTH_POS)[0]
    topic_len_pos = s + record_batch.BODY_POS + body_len
    topic_len = buf[topic_len_pos]
    props_len_pos = topic_len_pos + 1 + topic_len
    props_len = struct.unpack_from(">H", buf, props_len_pos)[0]
    if region == "topic":
        pos, length_pos, fmt, length = topic_len_pos + 1, topic_len_pos, ">B", topic_len
    elif region == "body":
        pos, length_pos, fmt, length = (s + record_batch.BODY_POS,
                                        s + record_batch.BODYLENGTH_POS, ">i", body_len)
    else:
        pos, length_pos, fmt, length = props_len_pos + 2, props_len_pos, ">H", props_len
    buf.insert(pos + round(at * length), value)
    struct.pack_into(fmt, buf, length_pos, length + 1)
    struct.pack_into(">i", buf, s, struct.unpack_from(">i", buf, s)[0] + 1)
    if region == "body":
        body = bytes(buf[s + record_batch.BODY_POS:s + record_batch.BODY_POS + body_len + 1])
        struct.pack_into(">i", buf, s + 8, record.body_crc(body))
    for k in range(i + 1, len(offsets)):
        offsets[k] += 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.sampled_from(["TopicA", "TopicB"]),
                          st.one_of(st.none(), st.sampled_from(["t", "tag"])),
                          st.dictionaries(st.sampled_from(["a", "bb"]),
                                          st.sampled_from(["x", "yy"]), max_size=2)),
                min_size=1, max_size=12),
       st.data())
def test_every_record_the_check_takes_is_read_back_by_dispatch_and_recovery(
        tmp_path_factory, rows, data):
    """What the writer takes, its readers must read: the dispatcher stops at a record it
    cannot read below WRITTEN, and recovery cuts the CommitLog there (every later message
    lost). So records are damaged, by a byte changed or by a byte put into a field with
    every length, TOTALSIZE, the body CRC and the offsets made to agree (a NUL or \\x01
    after the last property once passed the bulk check, and stopped the dispatcher); the
    records ``check_records`` takes are appended as the writer does, dispatched, and the
    store reopened through abnormal recovery (CRCs checked): every one is still there."""
    msgs = [Message(topic, body, tags=tags, properties=props, queue_id=0,
                    born_timestamp=BORN_TS) for body, topic, tags, props in rows]
    buf, offsets = encode_records(msgs, BORN_TS)
    buf, offsets = bytearray(buf), list(offsets)
    value = data.draw(st.one_of(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]),
                                st.integers(0, 255)))
    i = data.draw(st.integers(0, len(offsets) - 1))
    if data.draw(st.booleans()):
        _insert_byte(buf, offsets, i, data.draw(st.sampled_from(["topic", "body", "props"])),
                     data.draw(st.floats(0, 1)), value)
    else:
        end = offsets[i + 1] if i + 1 < len(offsets) else len(buf)
        buf[data.draw(st.integers(offsets[i], end - 1))] = value
    root = tmp_path_factory.mktemp("s")
    cfg = config(root, max_hash_slot_num=64, max_index_num=256)
    try:
        checked = check_records(bytes(buf), np.array(offsets), cfg)
    except RecordsFormatError:
        event("not records")
        return
    event("refused" if checked.refusals else "all taken")
    with MessageStore(cfg, background=False) as store:
        taken = append_taken(store, bytes(buf), checked)
        written = store.commit_log.get_max_offset()
        store.dispatch()                          # raises on a record it cannot read
        assert store.check() == []
        queues = dict(store.commit_log.topic_queue_table)
        with StoreReader(cfg) as reader:          # a Consumer's read, every field
            for (topic, queue_id), count in queues.items():
                got = reader.get_message(topic, queue_id, 0, count + 1, written)
                assert len(got.messages) == count, got.status
                assert all(m.to_ext() == store.look_message_by_offset(m.commit_log_offset)
                           for m in got.messages)
    assert taken >= sum(queues.values())          # a transaction's half takes no unit
    open(os.path.join(str(root), "abort"), "w").close()
    with MessageStore(cfg, background=False) as store:      # abnormal recovery
        assert store.commit_log.get_max_offset() == written
        assert dict(store.commit_log.topic_queue_table) == queues
        assert {q: store.get_max_offset_in_queue(*q) for q in queues} == queues


def test_a_short_run_leaves_every_record_not_taken_as_it_is_to_the_bulk_check(tmp_path):
    cfg = config(tmp_path)
    cfg.max_message_size = 300
    good = Message("TopicA", b"fine", tags="t", queue_id=0)

    def one(msg=good, patch=None):
        buf, offsets = frame_records([good, msg, good])
        if patch:
            patch(buf, int(offsets[1]))
        return record_batch._check_clean_run(bytes(buf), offsets, cfg, 0, 0, {})

    assert one() is not None
    cases = [Message("TopicA", b"x", queue_id=99), Message("bad/topic", b"x", queue_id=0),
             Message("TopicA", b"x" * 400, queue_id=0), Message("TopicA", b"x", tags="é"),
             Message("TopicA", b"x", delay_level=2), Message("TopicA", b"x", born_host=("::1", 1)),
             Message("T" * 200, b"x")]
    for msg in cases:
        assert one(msg) is None, msg
    patches = [lambda b, s: struct.pack_into(">i", b, s + record_batch.BORNPORT_POS, 70_000),
               lambda b, s: b.__setitem__(s + record_batch.BODY_POS, ord("g")),   # its CRC
               lambda b, s: struct.pack_into(">q", b, s + record_batch.STORETIMESTAMP_POS, 1)]
    for patch in patches:
        assert one(patch=patch) is None
    buf, offsets = frame_records([good, good, good])      # record 1 runs past the frame
    with pytest.raises(RecordsFormatError):
        check_records(bytes(buf[:int(offsets[1]) + 60]), offsets, cfg)


# ============================================================================ 3. end to end
def test_a_running_writer_stores_good_records_around_bad_ones(running):  # noqa: F811
    s = running().start()
    c = s.client()
    msgs = [message(0, queue_id=0), Message("bad/topic", b"x", queue_id=0),
            Message("TopicA", b"y", queue_id=77), message(1, queue_id=0)]
    data, offsets = encode_records(msgs, BORN_TS)
    c.socket.send(protocol.encode_send_records(5, data, offsets))
    frame = c.socket.recv() if c.socket.poll(10_000) else None
    assert frame is not None
    request_id, got = protocol.decode_send_records_reply(frame)
    assert request_id == 5
    assert [r.status for r in got] == [PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL,
                                       PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PUT_OK]
    assert "must match" in got[1].reason and "queue id" in got[2].reason
    assert (got[0].queue_offset, got[3].queue_offset) == (0, 1)
    assert got[3].commit_log_offset == got[0].commit_log_offset + offsets[1]  # back to back
    assert got[0].msg_id and got[0].msg_id.endswith(f"{got[0].commit_log_offset:016X}")
    assert got[3].msg_id[:-16] == got[0].msg_id[:-16] and got[1].msg_id == got[2].msg_id == ""
    # a malformed frame: ERROR naming the record, nothing stored, the writer goes on
    bad = bytearray(data)
    struct.pack_into(">i", bad, int(offsets[1]), 5)
    c.socket.send(protocol.encode_send_records(6, bytes(bad), offsets))
    frame = c.socket.recv() if c.socket.poll(10_000) else None
    err = protocol.decode_error(frame)
    assert err[:2] == (6, protocol.ErrorCode.MALFORMED_FRAME) and "record" in err.message
    # no record at all: an empty reply, as to a SEND of none (it was an INTERNAL error)
    c.socket.send(protocol.encode_send_records(7, b"", []))
    frame = c.socket.recv() if c.socket.poll(10_000) else None
    assert protocol.decode_send_records_reply(frame) == (7, [])
    c.socket.send(protocol.encode_send_records(8, data, []))    # records, but a count of 0
    frame = c.socket.recv() if c.socket.poll(10_000) else None
    err = protocol.decode_error(frame)
    assert err[:2] == (8, protocol.ErrorCode.MALFORMED_FRAME) and "count of 0" in err.message
    for r, m in zip(got, msgs):
        if r.ok:
            s.acks.append((m, r))
            s.expected[(m.topic, r.queue_id)] += 1
    s.reopen_and_verify()


def test_an_idempotent_resend_over_records_is_stored_once(tmp_path):
    from test_idempotent_producer import rows  # the shared row maker
    from store_processes import RunningStore
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir, producer_id=77) as p:
            assert p.wire == "records"
            first = p.send_batch(rows(77, 0, 10))                  # SEND_RECORDS
            again = p.send_batch(rows(77, 0, 10), first_sequence=0)
            assert all(r.status is PutMessageStatus.PUT_OK and r.reason == "" for r in first)
            assert all(r.reason.startswith("duplicate") for r in again)
            gap = p.send_batch(rows(77, 19, 9), first_sequence=19)[0]
            assert gap.status is PutMessageStatus.OUT_OF_ORDER_SEQUENCE
        assert rs.stop() == 0, rs.log()


def test_every_field_survives_the_wire_and_a_delayed_delivery(tmp_path):
    """SEND has no room for reconsume_times and prepared_transaction_offset: a message
    carrying either goes as a SEND_RECORDS record, alone or delayed, and keeps both."""
    from rocketstore.client import Consumer
    from store_processes import RunningStore
    with RunningStore(tmp_path, message_delay_level="1s 2s") as rs:
        with Producer(rs.store_dir) as p:
            now = Message("Fields", b"now", queue_id=0, reconsume_times=12345,
                          prepared_transaction_offset=3)
            later = Message("Fields", b"later", queue_id=0, reconsume_times=7,
                            prepared_transaction_offset=9, delay_level=1)
            assert [r.status for r in p.send_batch([now])] == [PutMessageStatus.PUT_OK]
            assert [r.status for r in p.send_batch([later])] == [PutMessageStatus.PUT_OK]
        got = []
        with Consumer(rs.store_dir, "g", "Fields") as c:
            for _ in range(40):
                got += c.poll(max_msgs=8, timeout_ms=250)
                if len(got) == 2:
                    break
        assert sorted((bytes(m.body), m.reconsume_times, m.prepared_transaction_offset)
                      for m in got) == [(b"later", 7, 9), (b"now", 12345, 3)]
        assert rs.stop() == 0, rs.log()


def test_same_bytes_tells_one_topic_from_several_of_one_length():
    """The bulk topic comparison the writer and the dispatcher share: equal only when
    every slice has the first one's length and bytes."""
    raw = np.frombuffer(b"OrdersOrdersOrdxrsOrders", np.uint8)
    six = np.full(4, 6)
    assert same_bytes(raw, np.array([0, 6, 18]), six[:3])
    assert not same_bytes(raw, np.array([0, 6, 12, 18]), six)      # one byte differs
    assert not same_bytes(raw, np.array([0, 6]), np.array([6, 5]))  # lengths differ
    assert same_bytes(raw, np.array([6]), six[:1])


@pytest.mark.parametrize("properties", [{"a": None}, {"a": 1}, {None: "x"}])
def test_a_property_that_is_not_str_is_refused_before_it_is_sent(properties):
    """A None value went out as the text "None" (the f-string that lays properties out
    took anything); both encodings now refuse what is not a str, and send_async raises
    before sending, as for any message that does not fit the wire."""
    msgs = [Message(topic="T", body=b"x", properties=dict(properties))] * 8
    with pytest.raises(ValueError, match="names and values are str"):
        record_batch.encode_records(msgs, 1)
    with pytest.raises(ValueError, match="names and values are str"):
        protocol.encode_send(1, msgs[:1])
