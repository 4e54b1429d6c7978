"""The CommitLog record codec against golden bytes and an independent decoder."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

import refcodec
from rocketstore.storage import record
from rocketstore.storage.hashing import index_key_hash, java_string_hash, tags_code
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, create_message_id, decode_message_id,
    encode_host, encode_properties)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


fixture = refcodec.load_fixture


def encode_from(inputs: dict) -> bytes:
    return bytes(record.encode(
        topic=inputs["topic"].encode(), body=bytes.fromhex(inputs["body_hex"]),
        properties=encode_properties(inputs["properties"]).encode(),
        queue_id=inputs["queue_id"], flag=inputs["flag"], queue_offset=inputs["queue_offset"],
        physical_offset=inputs["physical_offset"], sys_flag=inputs["sys_flag"],
        born_timestamp=inputs["born_timestamp"], born_host=encode_host(tuple(inputs["born_host"])),
        store_timestamp=inputs["store_timestamp"],
        store_host=encode_host(tuple(inputs["store_host"])),
        reconsume_times=inputs["reconsume_times"],
        prepared_transaction_offset=inputs["prepared_transaction_offset"]))


@pytest.mark.parametrize("name", ["record_v1_ipv4", "record_v2_long_topic", "record_ipv6",
                                  "record_empty_body"])
def test_record_matches_golden_bytes(name):
    inputs, golden = fixture(name)
    assert encode_from(inputs) == golden
    m = record.decode_at(golden, 0, check_crc=True)
    assert m.topic == inputs["topic"] and m.body == bytes.fromhex(inputs["body_hex"])
    assert m.properties == inputs["properties"]
    assert (m.queue_id, m.queue_offset, m.commit_log_offset) == \
        (inputs["queue_id"], inputs["queue_offset"], inputs["physical_offset"])
    assert m.born_host == tuple(inputs["born_host"]) and m.store_host == tuple(inputs["store_host"])
    assert m.msg_id == inputs["derived"]["msg_id"]


def test_v1_length_formula_and_magic():
    inputs, golden = fixture("record_v1_ipv4")
    props = encode_properties(inputs["properties"]).encode()
    assert len(golden) == 91 + len("TopicTest") + len(b"Hello RocketMQ") + len(props)
    assert golden[4:8] == bytes.fromhex("daa320a7")


def test_v2_magic_for_long_topic():
    _, golden = fixture("record_v2_long_topic")
    assert golden[4:8] == bytes.fromhex("daa320ab")


def test_blank_matches_golden_bytes():
    _, golden = fixture("blank_64")
    assert record.encode_blank(64) == golden[:8]
    req = record.check_message_and_return_size(golden, 0, len(golden), 0)
    assert req.success and req.msg_size == 0


def test_java_hash_vectors():
    assert java_string_hash("TAG1") == 2567159
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("FooBar#Hello") == -101609924
    assert tags_code(None) == 0 and tags_code("") == 0
    assert index_key_hash("FooBar#Hello") == 101609924


@given(st.text(max_size=40))
def test_java_hash_agrees_with_reference(s):
    assert java_string_hash(s) == refcodec.java_hash(s)
    assert index_key_hash(s) == refcodec.index_key_hash(s)


def test_msg_ids_match_golden():
    with open(os.path.join(FIXTURES, "msg_ids.json")) as f:
        cases = json.load(f)
    for case in cases:
        host = tuple(case["host"])
        assert create_message_id(host, case["offset"]) == case["msg_id"]
        assert decode_message_id(case["msg_id"]) == (host, case["offset"])


def test_decode_message_id_rejects_bad_text():
    with pytest.raises(ValueError):
        decode_message_id("ABC")
    with pytest.raises(ValueError):
        decode_message_id("Z" * 32)


hosts_v4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
hosts_v6 = st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535))
prop_text = st.text(alphabet=st.characters(blacklist_characters="\x00\x01\x02",
                                           blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=150, deadline=None)
@given(topic=st.text(alphabet="abcXYZ019_%|-", min_size=1, max_size=255),
       body=st.binary(max_size=300), queue_id=st.integers(0, 2**31 - 1),
       flag=st.integers(-2**31, 2**31 - 1), queue_offset=st.integers(0, 2**62),
       physical_offset=st.integers(0, 2**62), sys_flag=st.sampled_from([0, 4, 8, 12, 1, 2]),
       born=st.one_of(hosts_v4, hosts_v6), store=st.one_of(hosts_v4, hosts_v6),
       ts=st.integers(0, 2**50), props=st.dictionaries(prop_text.filter(bool), prop_text,
                                                       max_size=4))
def test_round_trip_and_reference_decoder(topic, body, queue_id, flag, queue_offset,
                                           physical_offset, sys_flag, born, store, ts, props):
    flags = sys_flag | (BORNHOST_V6_FLAG if ":" in born[0] else 0) \
        | (STOREHOSTADDRESS_V6_FLAG if ":" in store[0] else 0)
    data = bytes(record.encode(
        topic=topic.encode(), body=body, properties=encode_properties(props).encode(),
        queue_id=queue_id, flag=flag, queue_offset=queue_offset, physical_offset=physical_offset,
        sys_flag=flags, born_timestamp=ts, born_host=encode_host(born), store_timestamp=ts + 1,
        store_host=encode_host(store), reconsume_times=3, prepared_transaction_offset=7))
    m = record.decode_at(data, 0, check_crc=True)
    readable = {k: v for k, v in props.items() if v}  # an empty value reads as no pair
    assert (m.topic, m.body, m.properties, m.queue_id, m.flag, m.queue_offset,
            m.commit_log_offset, m.born_host, m.store_host) == \
        (topic, body, readable, queue_id, flag, queue_offset, physical_offset, born, store)
    ref = refcodec.decode_record(data, 0)
    assert ref["total_size"] == len(data) and ref["crc_ok"]
    assert (ref["topic"], ref["body"], ref["properties"], ref["store_timestamp"]) == \
        (topic, body, readable, ts + 1)
    assert ref["msg_id"] == m.msg_id
    # the reference encoder writes the same bytes
    assert refcodec.encode_record(
        topic=topic, body=body, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
        physical_offset=physical_offset, sys_flag=flags, born_timestamp=ts, born_host=born,
        store_timestamp=ts + 1, store_host=store, reconsume_times=3,
        prepared_transaction_offset=7, properties=props) == data


def test_every_torn_prefix_is_rejected():
    _, golden = fixture("record_v1_ipv4")
    for cut in range(len(golden)):
        torn = golden[:cut] + bytes(len(golden) - cut)
        req = record.check_message_and_return_size(torn, 0, len(torn), 4096)
        assert not req.success, cut
        with pytest.raises(record.RecordFormatError):
            record.decode_at(golden[:cut], 0)
    assert record.check_message_and_return_size(golden, 0, len(golden), 4096).success


def test_flipped_body_byte_fails_crc_check():
    _, golden = fixture("record_v1_ipv4")
    bad = bytearray(golden)
    bad[90] ^= 0xFF  # inside the body
    assert not record.check_message_and_return_size(bad, 0, len(bad), 4096, True).success
    assert record.check_message_and_return_size(bad, 0, len(bad), 4096, False).success
    with pytest.raises(record.RecordFormatError, match="CRC"):
        record.decode_at(bytes(bad), 0, check_crc=True)


def test_record_at_wrong_place_is_rejected():
    _, golden = fixture("record_v1_ipv4")
    req = record.check_message_and_return_size(golden, 0, len(golden), 0)
    assert not req.success and req.msg_size == len(golden)


def test_dispatch_request_fields():
    inputs, golden = fixture("record_v1_ipv4")
    req = record.check_message_and_return_size(golden, 0, len(golden), 4096)
    assert req.topic == "TopicTest" and req.queue_id == 3 and req.consume_queue_offset == 42
    assert req.tags_code == java_string_hash("TagA")
    assert req.keys == "k1 k2" and req.uniq_key == "0A0000010000000000000001"
    assert req.store_timestamp == inputs["store_timestamp"]
