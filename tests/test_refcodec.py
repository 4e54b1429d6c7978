"""Self-consistency of the reference codec (tests/refcodec.py) and its fixtures.

The store is cross-checked against refcodec elsewhere; these tests make sure
the reference itself agrees with the format description and with the golden
fixtures in tests/fixtures/.
"""

import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import refcodec  # noqa: E402

RECORD_FIXTURES = ["record_v1_ipv4", "record_v2_long_topic", "record_ipv6",
                   "record_empty_body"]
ALL_TIME = (0, 2**63 - 1)


def load_fixture(name):
    data = refcodec.parse_hex_fixture((FIXTURES / f"{name}.hex").read_text())
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    return data, doc


def record_kwargs_from_json(doc):
    kwargs = {k: v for k, v in doc.items() if k != "derived"}
    kwargs["body"] = bytes.fromhex(kwargs.pop("body_hex"))
    kwargs["born_host"] = tuple(kwargs["born_host"])
    kwargs["store_host"] = tuple(kwargs["store_host"])
    return kwargs


def sample_record(**overrides):
    kwargs = dict(
        topic="TopicTest", body=b"Hello RocketMQ", queue_id=3, flag=7,
        queue_offset=42, physical_offset=4096, sys_flag=0,
        born_timestamp=1700000000123, born_host=("192.168.1.10", 54321),
        store_timestamp=1700000000456, store_host=("10.0.0.1", 10911),
        reconsume_times=2, prepared_transaction_offset=0,
        properties={"TAGS": "TagA", "KEYS": "k1 k2"})
    kwargs.update(overrides)
    return kwargs


# --- Java hash codes -------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("TAG1", 2567159),
    ("TagA", 2598919),
    ("FooBar#Hello", -101609924),
    ("", 0),
    ("hello", 99162322),
])
def test_java_hash_vectors(text, expected):
    assert refcodec.java_hash(text) == expected


def test_java_hash_counts_utf16_code_units():
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16.
    assert refcodec.java_hash("\U0001F600") == 0xD83D * 31 + 0xDE00


def test_index_key_hash_is_abs_and_maps_min_int_to_zero():
    assert refcodec.index_key_hash("FooBar#Hello") == 101609924
    assert refcodec.java_hash("polygenelubricants") == -(2**31)
    assert refcodec.index_key_hash("polygenelubricants") == 0


# --- CommitLog records -----------------------------------------------------

@pytest.mark.parametrize("topic, sys_flag, born, store, extra", [
    ("TopicTest", 0, ("1.2.3.4", 1), ("5.6.7.8", 2), 0),
    ("x" * 127, 0, ("1.2.3.4", 1), ("5.6.7.8", 2), 0),
    ("x" * 128, 0, ("1.2.3.4", 1), ("5.6.7.8", 2), 1),
    ("TopicTest", 0x10, ("::1", 1), ("5.6.7.8", 2), 12),
    ("TopicTest", 0x20, ("1.2.3.4", 1), ("::2", 2), 12),
    ("x" * 300, 0x30, ("::1", 1), ("::2", 2), 25),
])
def test_record_length_formula(topic, sys_flag, born, store, extra):
    kwargs = sample_record(topic=topic, sys_flag=sys_flag, born_host=born,
                           store_host=store)
    data = refcodec.encode_record(**kwargs)
    properties_len = len(refcodec.encode_properties(kwargs["properties"]))
    expected = 91 + len(topic.encode()) + len(kwargs["body"]) + properties_len + extra
    assert len(data) == expected
    assert struct.unpack(">i", data[:4])[0] == expected


@pytest.mark.parametrize("topic, magic", [
    ("x" * 127, refcodec.MESSAGE_MAGIC_CODE),
    ("x" * 128, refcodec.MESSAGE_MAGIC_CODE_V2),
    ("\u00e9" * 63, refcodec.MESSAGE_MAGIC_CODE),      # 126 UTF-8 bytes
    ("\u00e9" * 64, refcodec.MESSAGE_MAGIC_CODE_V2),   # 128 UTF-8 bytes
])
def test_magic_version_follows_utf8_topic_length(topic, magic):
    data = refcodec.encode_record(**sample_record(topic=topic))
    assert struct.unpack(">I", data[4:8])[0] == magic
    assert refcodec.decode_record(data, 0)["topic"] == topic


@pytest.mark.parametrize("overrides", [
    {},
    {"body": b"", "properties": {}},
    {"topic": "T" * 200, "physical_offset": 8192},
    {"sys_flag": 0x30 | 0x8, "born_host": ("2001:db8::1", 4000),
     "store_host": ("::1", 10911)},
    {"sys_flag": 0x10, "born_host": ("fe80::1", 65535)},
    {"queue_offset": -1, "flag": -5, "prepared_transaction_offset": 2**63 - 1},
    {"properties": {"TAGS": "\u6807\u7b7e", "KEYS": "a b c", "DELAY": "3"}},
    {"body": bytes(range(256)) * 10},
])
def test_record_round_trip(overrides):
    kwargs = sample_record(**overrides)
    data = refcodec.encode_record(**kwargs)
    rec = refcodec.decode_record(b"\xee" * 5 + data + b"\xee" * 3, 5)
    for name, value in kwargs.items():
        assert rec[name] == value, name
    assert rec["total_size"] == len(data)
    assert rec["crc_ok"] is True
    assert rec["body_crc"] == refcodec.body_crc(kwargs["body"])
    assert rec["msg_id"] == refcodec.make_msg_id(kwargs["store_host"],
                                                 kwargs["physical_offset"])


@pytest.mark.parametrize("sys_flag, born, store", [
    (0, ("::1", 1), ("1.2.3.4", 2)),
    (0, ("1.2.3.4", 1), ("::1", 2)),
    (0x10, ("1.2.3.4", 1), ("1.2.3.4", 2)),
    (0x20, ("1.2.3.4", 1), ("1.2.3.4", 2)),
])
def test_host_family_must_match_sys_flag(sys_flag, born, store):
    with pytest.raises(ValueError):
        refcodec.encode_record(**sample_record(sys_flag=sys_flag, born_host=born,
                                               store_host=store))


def test_properties_over_short_max_are_rejected():
    with pytest.raises(ValueError):
        refcodec.encode_record(**sample_record(properties={"K": "v" * 32766}))


def test_properties_encoding_is_name_x01_value_x02_in_order():
    raw = refcodec.encode_properties({"B": "2", "A": "1"})
    assert raw == b"B\x012\x02A\x011\x02"
    assert list(refcodec.decode_properties(raw).items()) == [("B", "2"), ("A", "1")]


def test_msg_id_lengths_and_parse():
    v4 = refcodec.make_msg_id(("10.0.0.1", 10911), 4096)
    v6 = refcodec.make_msg_id(("::1", 10911), 4096)
    assert len(v4) == 32 and v4 == v4.upper()
    assert len(v6) == 56
    assert refcodec.parse_msg_id(v4) == (("10.0.0.1", 10911), 4096)
    assert refcodec.parse_msg_id(v6) == (("::1", 10911), 4096)
    with pytest.raises(ValueError):
        refcodec.parse_msg_id(v4[:-2])


def test_decode_record_rejects_bad_input():
    data = refcodec.encode_record(**sample_record())
    with pytest.raises(ValueError, match="magic"):
        refcodec.decode_record(data[:4] + b"\x00\x00\x00\x01" + data[8:], 0)
    with pytest.raises(ValueError):
        refcodec.decode_record(data[:-1], 0)                  # truncated
    longer = struct.pack(">i", len(data) + 4) + data[4:] + bytes(4)
    with pytest.raises(ValueError, match="TOTALSIZE"):
        refcodec.decode_record(longer, 0)


def test_decode_record_reports_bad_crc():
    data = bytearray(refcodec.encode_record(**sample_record()))
    data[88] ^= 0xFF                                          # first body byte
    assert refcodec.decode_record(bytes(data), 0)["crc_ok"] is False


# --- CommitLog files -------------------------------------------------------

def build_commitlog_file(file_from_offset, bodies):
    out = b""
    for i, body in enumerate(bodies):
        out += refcodec.encode_record(**sample_record(
            body=body, queue_offset=i, physical_offset=file_from_offset + len(out)))
    return out


def test_commitlog_walk_until_blank():
    base, size = 3 * 1024, 1024
    records = build_commitlog_file(base, [b"a" * 10, b"", b"b" * 300])
    data = records + refcodec.encode_blank(size - len(records))
    walk = refcodec.decode_commitlog_file(data, base)
    assert [r["queue_offset"] for r in walk["records"]] == [0, 1, 2]
    assert walk["end"] == len(records)
    assert walk["blank"] == size - len(records)
    assert refcodec.decode_record(data, len(records)) == {
        "blank": True, "total_size": size - len(records)}


def test_commitlog_walk_stops_at_zeroes():
    records = build_commitlog_file(0, [b"x", b"y"])
    walk = refcodec.decode_commitlog_file(records + bytes(1024 - len(records)))
    assert len(walk["records"]) == 2
    assert walk["end"] == len(records)
    assert walk["blank"] is None


def test_commitlog_walk_checks_physical_offset():
    records = build_commitlog_file(0, [b"x"])
    with pytest.raises(ValueError, match="PHYSICALOFFSET"):
        refcodec.decode_commitlog_file(records, 1024)


def test_commitlog_walk_torn_record_strict_and_lenient():
    records = build_commitlog_file(0, [b"x", b"y" * 50])
    first = refcodec.decode_record(records, 0)["total_size"]
    torn = records[:first + 60] + bytes(1024 - first - 60)
    with pytest.raises(ValueError):
        refcodec.decode_commitlog_file(torn)
    walk = refcodec.decode_commitlog_file(torn, strict=False)
    assert len(walk["records"]) == 1 and walk["end"] == first


def test_commitlog_blank_must_cover_the_rest():
    data = refcodec.encode_blank(64) + bytes(8)
    with pytest.raises(ValueError, match="blank"):
        refcodec.decode_commitlog_file(data)


def test_encode_blank():
    data = refcodec.encode_blank(8)
    assert data == struct.pack(">iI", 8, 0xCBD43194)
    with pytest.raises(ValueError):
        refcodec.encode_blank(7)


# --- ConsumeQueue ----------------------------------------------------------

def test_cq_round_trip_and_stop_rule():
    units = [(0, 100, 5), (100, 92, -3), (192, 2**31 - 1, 0)]
    data = b"".join(refcodec.encode_cq_unit(*u) for u in units)
    assert len(data) == 60
    assert refcodec.decode_cq_file(data + bytes(40)) == units
    assert refcodec.decode_cq_file(data + refcodec.encode_cq_unit(-1, 10, 0)
                                   + refcodec.encode_cq_unit(300, 10, 0)) == units
    assert refcodec.decode_cq_file(refcodec.encode_cq_unit(5, 0, 0)) == []
    with pytest.raises(ValueError):
        refcodec.decode_cq_file(data[:-1])


# --- IndexFile -------------------------------------------------------------

def test_index_chain_queries_fixture():
    data, doc = load_fixture("index_small")
    slots, num = doc["hash_slot_num"], doc["index_num"]
    assert refcodec.ref_query(data, slots, num, "TopicTest#k1", *ALL_TIME) == [400, 0]
    assert refcodec.ref_query(data, slots, num, "TopicTest#k2", *ALL_TIME) == [200]
    assert refcodec.ref_query(data, slots, num, "TopicTest#k3", *ALL_TIME) == []
    # entry 3 is at begin + 2 s; the chain stops once it passes below begin_ms
    assert refcodec.ref_query(data, slots, num, "TopicTest#k1",
                              1700000002000, 1700000003000) == [400]
    assert refcodec.ref_query(data, slots, num, "TopicTest#k1",
                              1700000000000, 1700000001000) == [0]


def test_index_same_slot_different_hash_share_a_chain():
    k1 = "TopicTest#k1"
    slot = refcodec.index_key_hash(k1) % 8
    other = next(f"TopicTest#x{i}" for i in range(1000)
                 if refcodec.index_key_hash(f"TopicTest#x{i}") % 8 == slot
                 and refcodec.index_key_hash(f"TopicTest#x{i}") != refcodec.index_key_hash(k1))
    data = refcodec.encode_index_file(8, 8, [(k1, 10, 5000), (other, 20, 6000),
                                             (k1, 30, 7000)])
    decoded = refcodec.decode_index_file(data, 8, 8)
    assert decoded["slots"] == {slot: 3}
    assert [e[4] for e in decoded["entries"]] == [0, 1, 2]
    assert refcodec.ref_query(data, 8, 8, k1, *ALL_TIME) == [30, 10]
    assert refcodec.ref_query(data, 8, 8, other, *ALL_TIME) == [20]


def test_index_capacity_is_index_num_minus_one():
    buf = refcodec.new_index_file(4, 4)
    assert all(refcodec.index_put_key(buf, 4, 4, f"k{i}", i, 1000 + i) for i in range(3))
    assert refcodec.index_put_key(buf, 4, 4, "k3", 3, 1003) is False
    assert refcodec.decode_index_file(bytes(buf), 4, 4)["header"]["index_count"] == 4


def test_index_second_file_time_diff_uses_previous_end():
    # The constructor copies the previous file's end values into begin/end;
    # the first put computes timeDiff against them, then replaces begin.
    buf = refcodec.new_index_file(4, 4, prev_end_phy_offset=500,
                                  prev_end_timestamp=1_000_000)
    refcodec.index_put_key(buf, 4, 4, "k", 600, 1_005_500)
    decoded = refcodec.decode_index_file(bytes(buf), 4, 4)
    assert decoded["header"]["begin_timestamp"] == 1_005_500
    assert decoded["header"]["begin_phy_offset"] == 600
    assert decoded["entries"][0][3] == 5


def test_index_file_size_is_checked():
    with pytest.raises(ValueError):
        refcodec.decode_index_file(bytes(100), 8, 8)


# --- Checkpoint ------------------------------------------------------------

def test_checkpoint_round_trip():
    data = refcodec.encode_checkpoint(3, -1, 2**62)
    assert len(data) == 4096 and data[24:] == bytes(4072)
    assert refcodec.decode_checkpoint(data) == {"physic": 3, "logics": -1, "index": 2**62}
    with pytest.raises(ValueError):
        refcodec.decode_checkpoint(data[:24])


# --- Golden fixtures -------------------------------------------------------

def test_parse_hex_fixture_ignores_comments_and_whitespace():
    assert refcodec.parse_hex_fixture("# c\n00 01\n  # x 99\n\t0203 \n") == b"\x00\x01\x02\x03"
    text = refcodec.format_hex_fixture(bytes(range(40)), ["note"])
    assert text.splitlines()[0] == "# note"
    assert len(text.splitlines()[1]) == 64
    assert refcodec.parse_hex_fixture(text) == bytes(range(40))


@pytest.mark.parametrize("name", RECORD_FIXTURES)
def test_record_fixture_decodes_to_its_inputs(name):
    data, doc = load_fixture(name)
    kwargs = record_kwargs_from_json(doc)
    rec = refcodec.decode_record(data, 0)
    for field, value in kwargs.items():
        assert rec[field] == value, field
    assert rec["total_size"] == len(data) == doc["derived"]["total_size"]
    assert rec["msg_id"] == doc["derived"]["msg_id"]
    assert rec["body_crc"] == doc["derived"]["body_crc"]
    assert f"0x{rec['magic']:08X}" == doc["derived"]["magic"]
    assert rec["crc_ok"] is True
    assert refcodec.encode_record(**kwargs) == data


def test_record_fixture_headline_values():
    assert load_fixture("record_v1_ipv4")[0][4:8] == bytes.fromhex("daa320a7")
    assert load_fixture("record_v2_long_topic")[0][4:8] == bytes.fromhex("daa320ab")
    assert len(load_fixture("record_ipv6")[0]) == 91 + 9 + 2 + 24
    assert len(load_fixture("record_empty_body")[0]) == 92


def test_blank_fixture():
    data, doc = load_fixture("blank_64")
    assert data == refcodec.encode_blank(doc["size"])
    assert refcodec.decode_record(data, 0) == {"blank": True, "total_size": 64}
    assert refcodec.decode_commitlog_file(data) == {"records": [], "end": 0, "blank": 64}


def test_cq_unit_fixture():
    data, doc = load_fixture("cq_unit")
    assert doc["tags_code"] == refcodec.java_hash(doc["tags"])
    expected = (doc["commit_log_offset"], doc["size"], doc["tags_code"])
    assert refcodec.decode_cq_file(data) == [expected]
    assert refcodec.encode_cq_unit(*expected) == data


def test_index_fixture_decodes_to_its_inputs():
    data, doc = load_fixture("index_small")
    slots, num = doc["hash_slot_num"], doc["index_num"]
    puts = [(p["key"], p["phy_offset"], p["store_timestamp"]) for p in doc["puts"]]
    assert refcodec.encode_index_file(slots, num, puts) == data
    decoded = refcodec.decode_index_file(data, slots, num)
    assert decoded["header"] == doc["derived"]["header"]
    assert decoded["header"]["index_count"] == len(puts) + 1
    assert decoded["header"]["hash_slot_count"] == len(puts)
    begin = decoded["header"]["begin_timestamp"]
    for (n, key_hash, phy, diff, _), (key, want_phy, t) in zip(decoded["entries"], puts):
        assert key_hash == refcodec.index_key_hash(key)
        assert phy == want_phy
        assert diff == (t - begin) // 1000
    for q in doc["derived"]["queries"]:
        assert refcodec.ref_query(data, slots, num, q["key"], q["begin_ms"],
                                  q["end_ms"]) == q["phy_offsets"]


def test_checkpoint_fixture():
    data, doc = load_fixture("checkpoint")
    assert refcodec.decode_checkpoint(data) == doc
    assert refcodec.encode_checkpoint(doc["physic"], doc["logics"], doc["index"]) == data


def test_msg_id_fixture():
    cases = json.loads((FIXTURES / "msg_ids.json").read_text())
    assert {len(c["msg_id"]) for c in cases} == {32, 56}
    for case in cases:
        host = tuple(case["host"])
        assert refcodec.make_msg_id(host, case["offset"]) == case["msg_id"]
        assert refcodec.parse_msg_id(case["msg_id"]) == (host, case["offset"])


def test_fixture_files_match_generator():
    spec = importlib.util.spec_from_file_location("make_fixtures",
                                                  FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for file_name, text in module.render().items():
        assert (FIXTURES / file_name).read_text() == text, file_name
