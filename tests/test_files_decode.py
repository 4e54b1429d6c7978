"""Files the store writes, decoded by the independent reference codec (tests/refcodec.py).

A store puts a varied set of messages (several topics, a 200-character topic, an IPv6
born host, an empty body, user properties, keys and a unique key, a delayed message, a
prepared transaction message), rolls over several CommitLog files and is closed. Then
every CommitLog, ConsumeQueue, index and checkpoint file is read from disk and decoded
with ``refcodec`` only, and compared field by field with what was put. The store is
built once per store-host flavour (IPv4, IPv6).
"""

from __future__ import annotations

import os

import pytest

import refcodec
from conftest import SMALL, small_config
from rocketstore.storage import Message, MessageStore

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
LONG_TOPIC = "L" * 200
DELAY_LEVEL = 3                     # "10s" in the default message_delay_level
DELAY_MS = 10_000
PREPARED = 0x4
BORN_V6 = 0x10
STORE_V6 = 0x20
SLOTS, ENTRIES = SMALL["max_hash_slot_num"], SMALL["max_index_num"]
FILE = SMALL["mapped_file_size_commit_log"]


def messages() -> list[Message]:
    out = []
    for i in range(60):
        out.append(Message(topic=("TopicA", "TopicB", "Topic_c-1")[i % 3],
                           body=f"body {i} ".encode() * (5 + i % 40),
                           tags=f"Tag{i % 4}", keys=[f"key-{i}"], queue_id=i % 4,
                           properties={"seq": str(i)}))
    out += [
        Message(topic=LONG_TOPIC, body=b"long topic body", tags="TagL", keys=["long-1"],
                queue_id=1),
        Message(topic="TopicA", body=b"from ipv6", tags="TagV6", keys=["v6-key"],
                born_host=("::1", 1234), queue_id=2),
        Message(topic="TopicA", body=b"", tags="TagEmpty", keys=["empty-body"], queue_id=3),
        Message(topic="TopicB", body=b"props", keys=["p1", "p2"], queue_id=0,
                properties={"color": "red", "size": "XL", "UNIQ_KEY": "0A0B0C0D0E0F"}),
        Message(topic="TopicB", body=b"no tags no keys", queue_id=1),
        Message(topic="TopicA", body=b"later, please", tags="TagD", keys=["delayed-1"],
                delay_level=DELAY_LEVEL, queue_id=1),
        Message(topic="TopicA", body=b"half a transaction", tags="TagT", keys=["tx-1"],
                sys_flag=PREPARED, queue_id=0),
        Message(topic="TopicB", body=b"\x00\x01\x02\xff binary", tags="TagBin",
                keys=["bin-1"], queue_id=2, flag=7, reconsume_times=3,
                born_timestamp=1_600_000_000_123, prepared_transaction_offset=4242),
    ]
    for i in range(60, 90):
        out.append(Message(topic="TopicA", body=bytes([i]) * 200, tags=f"Tag{i % 4}",
                           keys=[f"key-{i}"], queue_id=i % 4))
    return out


class Written:
    """What was put (message, result) and the store's directories."""

    def __init__(self, cfg, puts):
        self.cfg = cfg
        self.puts = puts
        self.by_offset = {r.wrote_offset: (m, r) for m, r in puts}


@pytest.fixture(scope="module", params=["127.0.0.1", "::1"], ids=["store-v4", "store-v6"])
def written(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("decode") / "store"
    cfg = small_config(root, broker_ip1=request.param)
    store = MessageStore(cfg)
    store.load()
    batch = messages()
    results = store.put_batch(batch[:40]) + [store.put(m) for m in batch[40:]]
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
    assert len(store.commit_log.mapped_file_queue.mapped_files) >= 3
    store.close()
    return Written(cfg, list(zip(batch, results)))


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def commit_log_files(cfg) -> list[tuple[int, bytes]]:
    d = cfg.commit_log_dir
    return [(int(n), read(os.path.join(d, n))) for n in sorted(os.listdir(d)) if n.isdigit()]


def decoded_records(w: Written) -> dict[int, dict]:
    records = {}
    for base, data in commit_log_files(w.cfg):
        for rec in refcodec.decode_commitlog_file(data, base)["records"]:
            records[rec["physical_offset"]] = rec
    return records


def expected_destination(m: Message, r) -> tuple[str, int, dict]:
    props = m.all_properties()
    if m.delay_level:
        props.update(REAL_TOPIC=m.topic, REAL_QID=str(m.queue_id), DELAY=str(m.delay_level))
        return SCHEDULE_TOPIC, m.delay_level - 1, props
    return m.topic, r.queue_id, props


def keys_of(rec: dict) -> list[str]:
    props = rec["properties"]
    keys = [k for k in props.get("KEYS", "").split(" ") if k]
    if props.get("UNIQ_KEY"):
        keys.append(props["UNIQ_KEY"])
    return keys


def is_consumable(rec: dict) -> bool:
    return rec["sys_flag"] & 0xC in (0x0, 0x8)


# ------------------------------------------------------------------ commitlog
def test_every_record_decodes_to_what_was_put(written):
    w = written
    records = decoded_records(w)
    assert sorted(records) == sorted(w.by_offset)
    v6_store = ":" in w.cfg.broker_ip1
    for offset, rec in records.items():
        m, r = w.by_offset[offset]
        topic, queue_id, props = expected_destination(m, r)
        assert rec["topic"] == topic
        assert rec["queue_id"] == queue_id
        assert rec["properties"] == props
        assert rec["body"] == m.body
        assert rec["crc_ok"] and rec["body_crc"] == refcodec.body_crc(m.body)
        assert rec["physical_offset"] == r.wrote_offset == r.commit_log_offset
        assert rec["total_size"] == r.wrote_bytes
        assert rec["queue_offset"] == r.queue_offset
        assert rec["store_timestamp"] == r.store_timestamp
        assert rec["msg_id"] == r.msg_id
        assert r.msg_id == refcodec.make_msg_id((w.cfg.broker_ip1, w.cfg.listen_port), offset)
        assert rec["store_host"] == (w.cfg.broker_ip1, w.cfg.listen_port)
        assert rec["born_host"] == m.born_host
        want_flag = m.sys_flag | (BORN_V6 if ":" in m.born_host[0] else 0) \
            | (STORE_V6 if v6_store else 0)
        assert rec["sys_flag"] == want_flag
        assert rec["flag"] == m.flag
        assert rec["reconsume_times"] == m.reconsume_times
        assert rec["prepared_transaction_offset"] == m.prepared_transaction_offset
        if m.born_timestamp is not None:
            assert rec["born_timestamp"] == m.born_timestamp
        else:
            assert 0 < rec["born_timestamp"] <= rec["store_timestamp"]
        want_magic = refcodec.MESSAGE_MAGIC_CODE_V2 if len(topic.encode()) > 127 \
            else refcodec.MESSAGE_MAGIC_CODE
        assert rec["magic"] == want_magic
        assert rec["total_size"] == refcodec.record_length(
            len(m.body), len(topic.encode()), len(refcodec.encode_properties(props)),
            v2=want_magic == refcodec.MESSAGE_MAGIC_CODE_V2,
            born_v6=bool(want_flag & BORN_V6), store_v6=v6_store)


def test_special_messages_are_laid_out_as_rocketmq_does(written):
    records = decoded_records(written)
    by_body = {rec["body"]: rec for rec in records.values()}
    assert by_body[b"long topic body"]["topic"] == LONG_TOPIC
    assert by_body[b"from ipv6"]["born_host"] == ("::1", 1234)
    assert by_body[b"from ipv6"]["sys_flag"] & BORN_V6
    assert by_body[b""]["properties"]["TAGS"] == "TagEmpty"
    props = by_body[b"props"]["properties"]
    assert props["KEYS"] == "p1 p2" and props["color"] == "red" and props["size"] == "XL"
    delayed = by_body[b"later, please"]
    assert delayed["topic"] == SCHEDULE_TOPIC and delayed["queue_id"] == DELAY_LEVEL - 1
    assert delayed["properties"]["REAL_TOPIC"] == "TopicA"
    assert delayed["properties"]["REAL_QID"] == "1"
    assert delayed["properties"]["DELAY"] == str(DELAY_LEVEL)
    prepared = by_body[b"half a transaction"]
    assert prepared["sys_flag"] & 0xC == PREPARED and prepared["queue_offset"] == 0


def test_queue_offsets_count_up_per_queue_in_commit_log_order(written):
    records = decoded_records(written)
    next_offset: dict[tuple[str, int], int] = {}
    for offset in sorted(records):
        rec = records[offset]
        if not is_consumable(rec):
            continue
        key = (rec["topic"], rec["queue_id"])
        assert rec["queue_offset"] == next_offset.get(key, 0)
        next_offset[key] = rec["queue_offset"] + 1


def test_rolled_files_end_with_a_blank_and_the_last_with_zeros(written):
    files = commit_log_files(written.cfg)
    walks = [(base, data, refcodec.decode_commitlog_file(data, base)) for base, data in files]
    with_records = [i for i, (_, _, walk) in enumerate(walks) if walk["records"]]
    last = with_records[-1]
    assert with_records == list(range(last + 1))
    assert [base for base, _, _ in walks[:last + 1]] == [i * FILE for i in range(last + 1)]
    for base, data, walk in walks[:last]:
        assert len(data) == FILE
        assert walk["blank"] is not None and walk["blank"] >= refcodec.END_FILE_MIN_BLANK_LENGTH
        assert walk["end"] + walk["blank"] == FILE
        assert data[walk["end"]:walk["end"] + 8] == \
            refcodec.encode_blank(walk["blank"])[:8]
    base, data, walk = walks[last]
    assert walk["blank"] is None
    assert data[walk["end"]:] == bytes(FILE - walk["end"])
    for base, data, walk in walks[last + 1:]:        # the preallocated next file
        assert data == bytes(FILE)


# ------------------------------------------------------------------ consume queues
def test_every_consume_queue_unit_points_at_its_record(written):
    records = decoded_records(written)
    root = written.cfg.consume_queue_dir
    seen = set()
    for topic in sorted(os.listdir(root)):
        for qid in sorted(os.listdir(os.path.join(root, topic))):
            d = os.path.join(root, topic, qid)
            for name in sorted(os.listdir(d)):
                data = read(os.path.join(d, name))
                assert len(data) == written.cfg.consume_queue_file_size
                units = refcodec.decode_cq_file(data)
                assert data[len(units) * 20:] == bytes(len(data) - len(units) * 20)
                for i, (phy, size, tags_code) in enumerate(units):
                    rec = records[phy]
                    assert rec["topic"] == topic and rec["queue_id"] == int(qid)
                    assert rec["queue_offset"] == int(name) // 20 + i
                    assert rec["total_size"] == size
                    if topic == SCHEDULE_TOPIC:
                        assert tags_code == rec["store_timestamp"] + DELAY_MS
                    else:
                        tags = rec["properties"].get("TAGS")
                        assert tags_code == (refcodec.java_hash(tags) if tags else 0)
                    assert phy not in seen
                    seen.add(phy)
    consumable = {off for off, rec in records.items() if is_consumable(rec)}
    assert seen == consumable
    assert len(records) - len(consumable) == 1          # only the prepared message


def test_long_topic_has_its_own_consume_queue_directory(written):
    assert os.path.isdir(os.path.join(written.cfg.consume_queue_dir, LONG_TOPIC, "1"))
    assert os.path.isdir(os.path.join(written.cfg.consume_queue_dir, SCHEDULE_TOPIC,
                                      str(DELAY_LEVEL - 1)))


# ------------------------------------------------------------------ index
def index_files(cfg) -> list[bytes]:
    d = cfg.index_dir
    return [read(os.path.join(d, n)) for n in sorted(os.listdir(d))]


def test_index_files_decode_and_every_key_is_found(written):
    records = decoded_records(written)
    files = index_files(written.cfg)
    assert files
    decoded = [refcodec.decode_index_file(data, SLOTS, ENTRIES) for data in files]
    entries = [e for d in decoded for e in d["entries"]]
    want = {(off, refcodec.index_key_hash(f"{rec['topic']}#{k}"))
            for off, rec in records.items() for k in keys_of(rec)}
    assert sorted((phy, h) for _, h, phy, _, _ in entries) == sorted(want)
    for off, rec in records.items():
        for key in keys_of(rec):
            found = [p for data in files
                     for p in refcodec.ref_query(data, SLOTS, ENTRIES, f"{rec['topic']}#{key}",
                                                 0, 2**62)]
            assert off in found, (rec["topic"], key)
            for p in found:                              # collisions hit real records only
                assert p in records
    for d in decoded:
        h = d["header"]
        assert h["index_count"] - 1 == len(d["entries"]) == h["hash_slot_count"]
        phys = [phy for _, _, phy, _, _ in d["entries"]]
        assert (h["begin_phy_offset"], h["end_phy_offset"]) == (phys[0], phys[-1])
        assert h["end_timestamp"] == records[phys[-1]]["store_timestamp"]
        assert h["begin_timestamp"] == records[phys[0]]["store_timestamp"]


def test_unique_key_and_each_key_are_indexed(written):
    files = index_files(written.cfg)
    off = next(r.wrote_offset for m, r in written.puts if m.body == b"props")
    for key in ("p1", "p2", "0A0B0C0D0E0F"):
        assert off in [p for data in files
                       for p in refcodec.ref_query(data, SLOTS, ENTRIES, f"TopicB#{key}",
                                                   0, 2**62)]
    assert [p for data in files for p in refcodec.ref_query(
        data, SLOTS, ENTRIES, "TopicA#p1", 0, 2**62)] == []


# ------------------------------------------------------------------ checkpoint
def test_checkpoint_decodes_to_the_last_store_times(written):
    cp = refcodec.decode_checkpoint(read(os.path.join(written.cfg.store_path_root_dir,
                                                      "checkpoint")))
    records = decoded_records(written)
    ordered = [records[o] for o in sorted(records)]
    assert cp["physic"] == ordered[-1]["store_timestamp"]
    assert cp["logics"] == [r for r in ordered if is_consumable(r)][-1]["store_timestamp"]
    assert cp["index"] == [r for r in ordered if keys_of(r)][-1]["store_timestamp"]
    assert not os.path.exists(os.path.join(written.cfg.store_path_root_dir, "abort"))
