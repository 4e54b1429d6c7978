"""Properties with an empty name or value, read and written as RocketMQ does.

RocketMQ's ``MessageDecoder.string2messageProperties`` keeps a pair only when its name and
its value are both non-empty, so the ``TAGS\\x01\\x02`` its producer writes for
``setTags("")`` reads back as no tags, and an empty ``UNIQ_KEY`` gives its index builder no
key. Both directions, over golden bytes (tests/fixtures/record_empty_*.hex, built by the
independent tests/refcodec.py):

* bytes written as RocketMQ writes them decode with those pairs gone, on every read path:
  ``record.decode_at`` (consumers, queries, remote reads), ``check_message_and_return_size``
  (dispatch: tagsCode, keys, UNIQ_KEY), the Arrow codec (Spark) and refcodec; a store whose
  CommitLog holds them indexes no ``topic#`` key;
* what rocketstore writes: ``tags=""`` and empty keys store no TAGS or KEYS pair at all, and
  a property with an empty value is refused (MESSAGE_ILLEGAL, naming it), embedded and over
  the SEND frame, before anything is stored.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import refcodec
from conftest import small_config
from rocketstore.spark.arrow_codec import records_to_batch
from rocketstore.wire import protocol
from rocketstore.storage import Message, MessageStore, PutMessageStatus, record
from rocketstore.storage.message import read_properties
from rocketstore.storage.validation import check_message

fixture = refcodec.load_fixture


def reencode(inputs: dict, **overrides) -> bytes:
    """The fixture's record re-encoded by refcodec with some inputs changed."""
    args = {k: v for k, v in inputs.items() if k not in ("body_hex", "derived")}
    args.update(body=bytes.fromhex(inputs["body_hex"]), born_host=tuple(inputs["born_host"]),
                store_host=tuple(inputs["store_host"]))
    args.update(overrides)
    return refcodec.encode_record(**args)


# ============================================================================ RocketMQ's bytes
def test_set_tags_empty_bytes_read_as_no_tags():
    inputs, data = fixture("record_empty_tags")
    assert data.endswith(bytes.fromhex("0006" "544147530102"))  # PROPERTIESLENGTH 6, TAGS\1\2
    assert reencode(inputs) == data
    m = record.decode_at(data, 0, check_crc=True)
    assert m.properties == {} and m.tags is None and m.keys == [] and m.uniq_key is None
    req = record.check_message_and_return_size(data, 0, len(data), 0)
    assert req.success and req.tags_code == 0 and req.keys is None and req.uniq_key is None
    assert refcodec.decode_record(data, 0)["properties"] == {}


def test_empty_values_are_dropped_and_the_rest_kept():
    _, data = fixture("record_empty_values")
    m = record.decode_at(data, 0, check_crc=True)
    assert m.properties == {"KEYS": "k1  k2", "size": "XL"}
    assert m.tags is None and m.keys == ["k1", "k2"] and m.uniq_key is None
    req = record.check_message_and_return_size(data, 0, len(data), 0)
    assert req.success and req.tags_code == 0
    assert req.keys == "k1  k2" and req.uniq_key is None
    assert refcodec.decode_record(data, 0)["properties"] == m.properties


@pytest.mark.parametrize("raw,expected", [
    ("TAGS\x01\x02", {}),
    ("\x01v\x02", {}),                                  # an empty name
    ("a\x011\x02a\x01\x02", {"a": "1"}),                # an empty later value replaces nothing
    ("a\x01\x02a\x012\x02", {"a": "2"}),
    ("a\x01x\x01y\x02b", {"a": "x\x01y"}),              # a value runs to the next \x02
    ("ab\x02c\x01d", {"c": "d"}),                       # no \x01; no final \x02
    ("\x02\x02\x01\x02z\x01", {}),
])
def test_read_properties_is_string2message_properties(raw, expected):
    assert read_properties(raw) == expected
    assert refcodec.decode_properties(raw.encode()) == expected
    props = raw.encode()
    for name in ("a", "TAGS", "c"):
        assert record.find_property(props, name) == expected.get(name)


def test_the_arrow_codec_reads_them_the_same():
    parts = [fixture("record_empty_tags")[1], fixture("record_empty_values")[1]]
    buf = b"".join(parts)
    starts = np.array([0, len(parts[0])], np.int64)
    rows = records_to_batch(buf, starts).to_pylist()
    assert [r["tags"] for r in rows] == [None, None]
    assert [r["keys"] for r in rows] == [[], ["k1", "k2"]]
    assert [dict(r["properties"]) for r in rows] == [{}, {"size": "XL"}]


def test_a_store_over_rocketmq_files_indexes_no_empty_key(tmp_path):
    """A CommitLog file holding the two fixtures (as RocketMQ wrote them): recovery
    dispatches them, tagsCode 0 in the consume queue, index entries only for k1, k2."""
    config = small_config(tmp_path / "store")
    a_inputs, a = fixture("record_empty_tags")
    b = reencode(fixture("record_empty_values")[0], physical_offset=len(a))
    os.makedirs(config.commit_log_dir)
    with open(os.path.join(config.commit_log_dir, f"{0:020d}"), "wb") as f:
        f.write((a + b).ljust(config.mapped_file_size_commit_log, b"\0"))
    with MessageStore(config) as store:
        assert store.get_max_phy_offset() == len(a) + len(b)
        got = store.get_message("g", a_inputs["topic"], 0, 0)
        assert [m.tags for m in got.messages] == [None, None]
        for tags in ("", [""], "*"):                    # an empty filter is every message
            assert len(store.get_message("g", a_inputs["topic"], 0, 0, tags=tags)
                       .messages) == 2
        assert store.get_message("g", a_inputs["topic"], 0, 0, tags="TagA").messages == []
        for key, found in (("k1", 1), ("k2", 1), ("", 0)):
            assert len(store.query_message(a_inputs["topic"], key, 10).messages) == found
    units = refcodec.decode_cq_file(open(os.path.join(
        config.consume_queue_dir, a_inputs["topic"], "0", f"{0:020d}"), "rb").read())
    assert [u[2] for u in units] == [0, 0]                  # no tags: tagsCode 0
    keys = {refcodec.index_key_hash(f"{a_inputs['topic']}#{k}") for k in ("k1", "k2")}
    entries = []
    for name in os.listdir(config.index_dir):
        decoded = refcodec.decode_index_file(open(os.path.join(config.index_dir, name), "rb")
                                             .read(), config.max_hash_slot_num,
                                             config.max_index_num)
        entries += [key_hash for _, key_hash, _, _, _ in decoded["entries"]]
    assert sorted(entries) == sorted(keys)
    assert refcodec.index_key_hash(f"{a_inputs['topic']}#") not in entries


# ============================================================================ what we write
def test_empty_tags_and_keys_store_no_pair(tmp_path):
    config = small_config(tmp_path / "store")
    with MessageStore(config) as store:
        r = store.put_batch([
            Message("TopicTest", b"x", tags="", keys="", queue_id=0,
                    properties={"size": "XL"}),
            Message("TopicTest", b"x", tags="", keys=["", "k1", ""], queue_id=0),
            Message("TopicTest", b"x", keys=" ", queue_id=0)])
        assert [x.status for x in r] == [PutMessageStatus.PUT_OK] * 3
        offsets = [(x.wrote_offset, x.wrote_bytes) for x in r]
    with open(os.path.join(config.commit_log_dir, f"{0:020d}"), "rb") as f:
        data = f.read()
    props = [record.properties_at(data, off) for off, _ in offsets]
    assert props == [refcodec.encode_properties({"size": "XL"}),
                     refcodec.encode_properties({"KEYS": "k1"}), b""]
    for off, _ in offsets:                                 # and RocketMQ reads them so
        assert "TAGS" not in refcodec.decode_record(data, off)["properties"]


def test_an_empty_property_value_is_refused_by_name(tmp_path):
    config = small_config(tmp_path / "store")
    bad = Message("TopicTest", b"x", queue_id=0, properties={"size": "XL", "color": ""})
    status, reason = check_message(bad, config)
    assert status is PutMessageStatus.MESSAGE_ILLEGAL and "'color'" in reason
    assert check_message(Message("TopicTest", b"x", queue_id=0, properties={"u": " "}),
                         config) is None              # spaces read back: stored
    for name in ("UNIQ_KEY", "TAGS"):
        refused = check_message(Message("TopicTest", b"x", queue_id=0,
                                        properties={name: ""}), config)
        assert refused and name in refused[1]
    with MessageStore(config) as store:
        r = store.put_batch([bad])
        assert r[0].status is PutMessageStatus.MESSAGE_ILLEGAL and "'color'" in r[0].reason
        assert store.get_max_phy_offset() == 0


def test_an_empty_value_survives_the_send_frame_to_be_refused(tmp_path):
    """The SEND frame carries the pair as sent, so the writer's ``check_message`` names
    it instead of the pair vanishing on the way."""
    config = small_config(tmp_path / "store")
    frame = protocol.encode_send(1, [Message("TopicTest", b"x", queue_id=0, tags="",
                                             properties={"color": ""})])
    m = protocol.decode_send(frame).messages[0]
    assert m.properties == {"color": ""} and m.tags is None
    status, reason = check_message(m, config)
    assert status is PutMessageStatus.MESSAGE_ILLEGAL and "'color'" in reason
