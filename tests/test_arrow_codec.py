"""pipeline.arrow_codec against the scalar decoder: every column of every record equals
what ``record.decode_at`` and ``MessageExt`` give, and every check names the first bad
record."""

from __future__ import annotations

import mmap
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rocketstore.spark.arrow_codec import SCHEMA, SPARK_SCHEMA_DDL, records_to_batch
from rocketstore.storage import record
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE,
    STOREHOSTADDRESS_V6_FLAG, encode_host, encode_properties)

HIDDEN = {"TAGS", "KEYS", PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE}
V4_BORN, V4_STORE = ("10.0.0.7", 53120), ("192.168.1.20", 10911)
V6_BORN, V6_STORE = ("2001:db8::7", 443), ("fe80::1:2", 10912)


def make(*, topic: str | bytes = "TopicTest", body: bytes = b"hello",
         props: dict | bytes | None = None, queue_id: int = 1, queue_offset: int = 0,
         physical_offset: int = 0, born=V4_BORN, store=V4_STORE,
         born_ts: int = 1_700_000_000_123, store_ts: int = 1_700_000_000_456,
         sys_flag: int = 0, flag: int = 0) -> bytes:
    """One record from ``storage.record.encode``; the IPv6 bits follow the hosts."""
    raw_props = props if isinstance(props, bytes) else encode_properties(props or {}).encode()
    flags = sys_flag | (BORNHOST_V6_FLAG if ":" in born[0] else 0) \
        | (STOREHOSTADDRESS_V6_FLAG if ":" in store[0] else 0)
    return bytes(record.encode(
        topic=topic if isinstance(topic, bytes) else topic.encode(), body=body,
        properties=raw_props, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
        physical_offset=physical_offset, sys_flag=flags, born_timestamp=born_ts,
        born_host=encode_host(born), store_timestamp=store_ts, store_host=encode_host(store),
        reconsume_times=0, prepared_transaction_offset=0))


def expected(buf, pos: int) -> dict:
    """The row ``decode_at`` and ``MessageExt`` give (timestamps in microseconds)."""
    m = record.decode_at(buf, pos)
    return {"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "commit_log_offset": m.commit_log_offset, "msg_id": m.msg_id, "tags": m.tags,
            "keys": m.keys,
            "properties": [(k, v) for k, v in m.properties.items() if k not in HIDDEN],
            "body": m.body, "born_timestamp": us(m.born_timestamp),
            "store_timestamp": us(m.store_timestamp)}


def us(ms: int) -> int | None:
    """Microseconds, or None (null) where they overflow int64."""
    return ms * 1000 if -2**63 <= ms * 1000 < 2**63 else None


def rows(batch: pa.RecordBatch) -> list[dict]:
    batch.validate(full=True)
    assert batch.schema.equals(SCHEMA)
    columns = {}
    for name in batch.schema.names:
        col = batch.column(name)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        columns[name] = col.to_pylist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def pack(records: list[bytes], *, seed: int = 0, max_gap: int = 0) -> tuple[bytes, np.ndarray]:
    """The records in one buffer, each after 0..max_gap-1 bytes of random garbage."""
    rng = random.Random(seed)
    out, starts = bytearray(), []
    for rec in records:
        out += rng.randbytes(rng.randrange(max_gap)) if max_gap else b""
        starts.append(len(out))
        out += rec
    out += rng.randbytes(max_gap)
    return bytes(out), np.array(starts, np.int64)


def assert_matches(buf, starts, **kw) -> pa.RecordBatch:
    batch = records_to_batch(buf, starts, **kw)
    assert rows(batch) == [expected(buf, int(p)) for p in starts]
    return batch


def variety() -> list[bytes]:
    """Records covering every layout and property shape the codec distinguishes."""
    long_topic = "L" * 128
    recs = [
        make(props={"TAGS": "TagA", "KEYS": "k1", "user": "v"}),
        make(born=V6_BORN, store=V4_STORE, props={"TAGS": "b6"}),
        make(born=V4_BORN, store=V6_STORE, props={"KEYS": "a b  c "}),
        make(born=V6_BORN, store=V6_STORE, props={"UNIQ_KEY": "0A0000", "TAGS": "both6"}),
        make(topic=long_topic, props={"TAGS": "long"}),
        make(topic="T" * 255, body=b"", born=V6_BORN, store=V6_STORE),
        make(topic="x", body=b""),
        make(props={}),
        make(props={"TAGS": "only"}),
        make(props={"KEYS": "k1 k2 k3 k4", "TAGS": ""}),
        make(topic="主题-Ünïcode", props={"TAGS": "标签", "名": "値 with spaces",
                                         "emoji": "😀"}),
        make(props={"eq": "a=b=c", "colon": "host:port:x", "both": "=:="}),
        make(props={PROPERTY_PRODUCER_ID: "p-1", PROPERTY_PRODUCER_SEQUENCE: "42",
                    "DELAY": "3", "TAGS": "t"}),
        make(props={"a_name_longer_than_8": "v1", "KEYS": "  ", "WAIT": "false"}),
        make(body=bytes(range(256)) * 3, props={"TAGS": "big"}, sys_flag=0x4),
        make(body=b"\x00\x01\x02", props={"K": "\x03"}, queue_id=2**31 - 1, flag=-1),
        make(queue_offset=2**62, physical_offset=2**40 + 5, born_ts=0, store_ts=-5),
        make(born_ts=2**63 // 1000 + 1, store_ts=-(2**63 // 1000) - 1),  # out of us range
        make(born_ts=2**63 // 1000, store_ts=-(2**63 // 1000)),
        make(topic="t12bytes_abc", props={"TAGS": "exactly12byt"}),
        make(topic="t13bytes_abcd", props={"TAGS": "thirteen_byte"}),
    ]
    return recs


def test_schema_and_spark_ddl_agree():
    from pyspark.sql.pandas.types import from_arrow_schema
    ddl = SPARK_SCHEMA_DDL.replace(" long", " bigint")
    fields = [f.split(" ", 1) for f in ddl.split(", ")]
    assert from_arrow_schema(SCHEMA).simpleString() == \
        "struct<" + ",".join(f"{n}:{t}" for n, t in fields) + ">"
    assert SCHEMA.names == ["topic", "queue_id", "queue_offset", "commit_log_offset", "msg_id",
                            "tags", "keys", "properties", "body", "born_timestamp",
                            "store_timestamp"]
    assert SCHEMA.field("born_timestamp").type == pa.timestamp("us", tz="UTC")


def test_variety_adjacent():
    buf, starts = pack(variety())
    batch = assert_matches(buf, starts)
    assert batch.num_rows == len(variety())
    row = rows(batch)[0]
    assert (row["tags"], row["keys"], row["properties"]) == ("TagA", ["k1"], [("user", "v")])
    assert len(rows(batch)[3]["msg_id"]) == 56 and len(row["msg_id"]) == 32


@pytest.mark.parametrize("seed", range(3))
def test_variety_with_garbage_between_and_any_order(seed):
    recs = variety() * 3
    buf, starts = pack(recs, seed=seed, max_gap=40)
    assert_matches(buf, starts)
    order = np.random.default_rng(seed).permutation(len(starts))
    assert_matches(buf, starts[order])
    assert_matches(buf, starts[::-1].copy())


def test_one_layout_per_batch():
    """All-IPv6 and all-v2 batches take no mixed path."""
    assert_matches(*pack([make(born=V6_BORN, store=V6_STORE, physical_offset=i)
                          for i in range(5)]))
    assert_matches(*pack([make(topic="V" * (128 + i)) for i in range(5)]))
    assert_matches(*pack([make(props={}) for _ in range(5)]))


def test_memoryview_bytearray_and_mmap_inputs(tmp_path):
    buf, starts = pack(variety(), seed=5, max_gap=17)
    want = rows(records_to_batch(buf, starts))
    arr = bytearray(b"#" * 100 + buf)
    view = memoryview(arr)[100:]
    assert rows(records_to_batch(view, starts)) == want
    batch = records_to_batch(arr, starts + 100)
    arr[:] = bytes(len(arr))  # the batch owns its memory
    assert rows(batch) == want
    path = tmp_path / "00000000000000000000"
    path.write_bytes(b"\x00" * 4096 + buf)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    batch = records_to_batch(mm, starts + 4096)
    mm.close()  # would raise BufferError if the batch still pointed into the mapping
    assert rows(batch) == want
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        records_to_batch(mm, starts)  # 4096 bytes early: zeros, not records
    except CorruptRecordError:
        mm.close()  # the traceback holds no export of the mapping either
    assert mm.closed
    words = memoryview(np.frombuffer(buf[:len(buf) // 4 * 4], np.int32))  # format "i"
    inside = starts[starts + 1200 < len(buf) // 4 * 4]
    assert rows(records_to_batch(words, inside)) == [expected(buf, int(p)) for p in inside]


def test_buffer_over_2_gib(tmp_path):
    """A mapped file of more than 2 GiB (sparse): views reach it through 1 GiB steps."""
    size = (2 << 30) + (300 << 20)
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.truncate(size)
    positions = [10, (1 << 30) - 50, (2 << 30) - 7, size - 1000]
    with open(path, "r+b") as f:
        for i, pos in enumerate(positions):
            f.seek(pos)
            f.write(make(body=bytes([i]) * (300 + i), props={"TAGS": f"t{i}"},
                         physical_offset=pos))
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        starts = np.array(positions, np.int64)
        batch = records_to_batch(mm, starts)
        assert rows(batch) == [expected(mm, p) for p in positions]
        del batch
    finally:
        mm.close()


@pytest.mark.parametrize("columns", [["body"], ["queue_offset", "body"], ["tags", "topic"],
                                     ["store_timestamp", "keys", "msg_id"], list(SCHEMA.names)])
def test_columns_builds_only_those_in_that_order(columns):
    buf, starts = pack(variety() * 2)
    whole = records_to_batch(buf, starts)
    part = records_to_batch(buf, starts, columns=columns)
    assert part.schema.names == columns
    assert part.equals(whole.select(columns))
    empty = records_to_batch(b"", [], columns=columns)
    assert empty.num_rows == 0 and empty.schema.names == columns


def test_columns_leave_every_check_in_place():
    buf, starts = pack([make(), make(props=b"TAGS\x01a\x00\x02")])
    raises_at(1, "NUL byte in properties", buf, starts, columns=["body"])
    with pytest.raises(ValueError, match="'partition'"):
        records_to_batch(*pack([make()]), columns=["body", "partition"])


def test_no_records():
    batch = records_to_batch(b"", np.zeros(0, np.int64))
    assert batch.num_rows == 0 and batch.schema.equals(SCHEMA)
    assert records_to_batch(make(), []).num_rows == 0


@pytest.mark.parametrize("raw", [
    # no final \x02, an item without \x01, a value with \x01
    b"a\x01b\x02junk\x02c\x01d\x01e",
    b"TAGS\x01x\x02TAGS\x01y\x02k\x011\x02z\x01\x02k\x012\x02",  # names stored twice
    b"\x01empty name\x02KEYS\x01\x02",        # an empty name, an empty KEYS
    b"\x02\x02\x01\x02KEYS\x01 a  b \x02",    # empty items
    b"no separators at all",
    b"KEYS\x01k1\x02KEYS\x01k2 k3\x02TAGS\x01t\x02",
    b"abcdefgh_1_ijklmnop\x01one\x02abcdefgh_2_ijklmnop\x01two\x02abcdefgh_1_ijklmnop\x01three\x02",
    b"__PID\x01p\x02__SEQ\x01s\x02__PIDX\x01shown\x02TAG\x01shown\x02TAGSS\x01shown\x02",
])
def test_properties_written_by_hand(raw):
    """Shapes ``encode_properties`` never writes, decoded as ``decode_properties`` does."""
    recs = [make(props={"TAGS": "plain"}), make(props=raw), make(props=raw + b"\x02"),
            make(props={"KEYS": "after"})]
    assert_matches(*pack(recs))
    assert_matches(*pack([make(props=raw)]))


def test_many_properties_with_duplicates():
    """More than 16 pairs in a record: duplicates found by sorting."""
    pairs = b"".join(b"n%d\x01v%d\x02" % (i % 7, i) for i in range(40))
    recs = [make(props=pairs + b"TAGS\x01a\x02TAGS\x01b\x02"), make(props={"TAGS": "c"}),
            make(props=pairs)]
    batch = assert_matches(*pack(recs))
    assert rows(batch)[0]["tags"] == "b"
    assert [k for k, _ in rows(batch)[0]["properties"]] == [f"n{i}" for i in range(7)]
    # names alike in length, first and last 8 bytes, the first one different
    a, b = b"abcdefgh_1_ijklmnop", b"abcdefgh_2_ijklmnop"
    filler = b"".join(b"f%02d\x01x\x02" % i for i in range(20))
    for raw in (b + b"\x01b\x02" + a + b"\x01a1\x02" + a + b"\x01a2\x02" + filler,
                b + b"\x01b\x02" + a + b"\x01a1\x02" + a + b"\x01a2\x02"):
        batch = assert_matches(*pack([make(props=raw)]))
        assert rows(batch)[0]["properties"][:2] == [(b.decode(), "b"), (a.decode(), "a2")]


def test_bytes_that_are_not_utf8_decode_as_replace():
    recs = [make(topic=b"bad\xfftopic", props=b"TAGS\x01t\xc3\x02k\xff\x01v\xe2\x82\x02"),
            make(props={"TAGS": "fine"})]
    batch = assert_matches(*pack(recs))
    assert rows(batch)[0]["topic"] == "bad\ufffdtopic"


def test_spaces_in_keys_and_values():
    recs = [make(props={"KEYS": "one"}), make(props={"KEYS": " two  three "}),
            make(props={"KEYS": "four", "user": "a b"}), make(props={"user": "x y"})]
    batch = assert_matches(*pack(recs))
    assert [r["keys"] for r in rows(batch)] == [["one"], ["two", "three"], ["four"], []]


hosts_v4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
hosts_v6 = st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535))
text = st.text(alphabet=st.characters(blacklist_characters="\x00\x01\x02",
                                      blacklist_categories=("Cs",)), max_size=12)
names = st.one_of(text.filter(bool), st.sampled_from(sorted(HIDDEN) + ["UNIQ_KEY", "TAG"]))
record_args = st.fixed_dictionaries({
    "topic": st.text(alphabet="abcXYZ019_%|-é", min_size=1, max_size=140).filter(
        lambda t: len(t.encode()) <= 255),
    "body": st.binary(max_size=40),
    "props": st.dictionaries(names, st.one_of(text, st.just(" a  b ")), max_size=5),
    "queue_id": st.integers(0, 2**31 - 1),
    "queue_offset": st.integers(0, 2**62),
    "physical_offset": st.integers(0, 2**62),
    "born": st.one_of(hosts_v4, hosts_v6),
    "store": st.one_of(hosts_v4, hosts_v6),
    "born_ts": st.integers(-2**40, 2**50),
    "store_ts": st.integers(0, 2**50),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_args, min_size=1, max_size=12), st.integers(0, 50), st.randoms())
def test_matches_decode_at(args, max_gap, rnd):
    recs = [make(**a) for a in args]
    buf, starts = pack(recs, seed=rnd.randrange(2**32), max_gap=max_gap)
    rnd.shuffle(order := list(range(len(starts))))
    assert_matches(buf, starts[order])


# ------------------------------------------------------------------------------- checks
def corrupt_at(index: int, count: int = 5, edit=None, **kw) -> tuple[bytes, np.ndarray]:
    """``count`` good records with gaps; ``edit(bytearray)`` changes record ``index``."""
    recs = [bytearray(make(props={"TAGS": f"t{i}"}, queue_offset=i, physical_offset=1000 * i,
                           **kw)) for i in range(count)]
    if edit is not None:
        edit(recs[index])
    return pack([bytes(r) for r in recs], seed=index, max_gap=9)


def raises_at(index: int, match: str, buf, starts, **kw) -> CorruptRecordError:
    with pytest.raises(CorruptRecordError, match=match) as info:
        records_to_batch(buf, starts, **kw)
    err = info.value
    assert err.record_index == index and f"record {index}:" in err.detail
    assert err.offset == kw.get("buf_offset", 0) + int(starts[index])
    return err


def set_int(offset: int, value: int, fmt: str = ">i"):
    import struct
    return lambda r: struct.pack_into(fmt, r, offset, value)


@pytest.mark.parametrize("index", [0, 2, 4])
def test_wrong_magic(index):
    buf, starts = corrupt_at(index, edit=set_int(record.MAGICCODE_POS, 0x12345678, ">I"))
    err = raises_at(index, "illegal magic code 0x12345678", buf, starts, source="cl/0",
                    buf_offset=1 << 30)
    assert err.path == "cl/0"


def test_blank_magic_is_not_a_message():
    buf, starts = corrupt_at(1, edit=set_int(record.MAGICCODE_POS, record.BLANK_MAGIC_CODE, ">I"))
    raises_at(1, "magic", buf, starts)


@pytest.mark.parametrize("delta", [1, -1, 10**6, -10**6])
def test_total_size_mismatch(delta):
    def edit(r):
        size = int.from_bytes(r[:4], "big")
        r[:4] = (size + delta).to_bytes(4, "big", signed=True)
    buf, starts = corrupt_at(2, edit=edit)
    raises_at(2, "record size", buf, starts)


@pytest.mark.parametrize("size", [0, -5, 91, 2**31 - 1])
def test_total_size_out_of_range(size):
    buf, starts = corrupt_at(3, edit=set_int(0, size))
    raises_at(3, "record size", buf, starts)


def test_body_and_topic_lengths_out_of_range():
    body_len_pos = 84  # BODYLENGTH with IPv4 hosts (storage.record's table)
    for value, match in ((-1, "body length -1"), (10**6, "body length"), (200, "body length 200")):
        raises_at(1, match, *corrupt_at(1, edit=set_int(body_len_pos, value)))
    topic_len_pos = body_len_pos + 4 + len(b"hello")
    raises_at(1, "topic length 0", *corrupt_at(1, edit=lambda r: r.__setitem__(topic_len_pos, 0)))
    raises_at(1, "topic length -1",
              *corrupt_at(1, edit=lambda r: r.__setitem__(topic_len_pos, 0xFF)))
    raises_at(1, "topic length 100",
              *corrupt_at(1, edit=lambda r: r.__setitem__(topic_len_pos, 100)))


def test_v2_magic_needs_a_long_topic():
    raises_at(2, "topic length 2388", *corrupt_at(
        2, edit=set_int(record.MAGICCODE_POS, record.MESSAGE_MAGIC_CODE_V2, ">I")))


def test_start_outside_the_buffer():
    buf, starts = corrupt_at(0)
    for bad in (-1, len(buf) - 50, len(buf) + 10):
        s = starts.copy()
        s[3] = bad
        raises_at(3, "cannot fit", buf, s)
    raises_at(1, "runs past", buf[:starts[1] + 100], starts[:2])
    end = int(starts[4]) + len(make(props={"TAGS": "t4"}))
    assert records_to_batch(buf[:end], starts).num_rows == 5
    raises_at(4, "runs past", buf[:end - 1], starts)  # one byte short


@pytest.mark.parametrize("name", ["expect_sizes", "expect_queue_offsets",
                                  "expect_commit_log_offsets"])
def test_unexpected_size_queue_offset_physical_offset(name):
    buf, starts = corrupt_at(0)
    good = {"expect_sizes": [len(make(props={"TAGS": f"t{i}"})) for i in range(5)],
            "expect_queue_offsets": list(range(5)),
            "expect_commit_log_offsets": [1000 * i for i in range(5)]}
    assert_matches(buf, starts, **good)
    for index in (0, 3):
        bad = {**good, name: np.array(good[name]) + (np.arange(5) == index)}
        word = {"expect_sizes": "TOTALSIZE", "expect_queue_offsets": "QUEUEOFFSET",
                "expect_commit_log_offsets": "PHYSICALOFFSET"}[name]
        err = raises_at(index, word, buf, starts, **bad)
        assert f"expected {good[name][index] + 1}" in str(err)
    with pytest.raises(ValueError):
        records_to_batch(buf, starts, **{name: good[name][:4]})


def test_nul_in_topic_or_properties():
    buf, starts = pack([make(topic="ok"), make(topic=b"a\x00b"), make()])
    raises_at(1, "NUL byte in topic", buf, starts)
    buf, starts = pack([make(), make(), make(props=b"TAGS\x01a\x00\x02")])
    raises_at(2, "NUL byte in properties", buf, starts)


def test_the_first_bad_record_is_named_whatever_the_check():
    recs = [make(), make(props=b"A\x01\x00"), make(), bytearray(make())]
    recs[3][4:8] = b"\x00\x00\x00\x00"
    buf, starts = pack([bytes(r) for r in recs])
    raises_at(1, "NUL", buf, starts)
    raises_at(0, "QUEUEOFFSET", buf, starts, expect_queue_offsets=[9, 0, 0, 0])
    raises_at(1, "TOTALSIZE", buf, starts,
              expect_sizes=[len(recs[0]), 1, len(recs[2]), len(recs[3])])


def test_every_torn_tail_is_rejected():
    """A record whose tail was never written (zeros from any byte on) fails a check."""
    good = make(props={"TAGS": "TagA", "KEYS": "k1 k2"}, physical_offset=4096)
    for cut in range(len(good)):
        torn = good[:cut] + bytes(len(good) - cut)
        buf = good + torn + bytes(16)
        with pytest.raises(CorruptRecordError) as info:
            records_to_batch(buf, [0, len(good)])
        assert info.value.record_index == 1, cut
        with pytest.raises(CorruptRecordError):  # and a buffer that ends inside it
            records_to_batch(good + good[:cut], [0, len(good)])


def test_values_that_end_the_buffer():
    """The last record's short values end exactly where the buffer ends."""
    recs = [make(props={"TAGS": "a long enough tag value"}), make(body=b"", props={}),
            make(topic="t", body=b"", props=b"A\x01b")]
    for last in range(1, 4):
        buf, starts = pack(recs[:last])
        assert_matches(buf, starts)
        assert_matches(buf, starts[::-1].copy())


@pytest.mark.parametrize("seed", range(4))
def test_random_byte_damage_is_caught_like_decode_at(seed):
    """Bytes flipped anywhere: the batch equals decode_at's records, or the error names
    the first record decode_at rejects."""
    import struct
    rng = random.Random(seed)
    base = variety()
    for it in range(300):
        buf, starts = pack(rng.sample(base, 4), seed=it, max_gap=rng.choice([0, 8]))
        buf = bytearray(buf)
        for _ in range(rng.choice([1, 1, 2, 3])):
            i = rng.randrange(len(buf))
            buf[i] = rng.choice([0, 1, 2, 0x80, 0xFF, rng.randrange(256),
                                 buf[i] ^ (1 << rng.randrange(8))])
        buf = bytes(buf)
        first_bad, unshowable = None, False
        for j, start in enumerate(starts):
            try:
                m = record.decode_at(buf, int(start))
            except (record.RecordFormatError, struct.error):  # struct.error: a v6 flag
                first_bad = j                                # pushing fields past buf
                break
            unshowable |= m.commit_log_offset < 0  # MessageExt.msg_id cannot show it
        if first_bad is not None:
            raises_at(first_bad, "record", buf, starts)
        elif not unshowable:
            assert_matches(buf, starts)
