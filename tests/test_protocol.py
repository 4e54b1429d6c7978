"""The wire protocol (procs/protocol.py): round trips, golden bytes, and every bad frame.

Decoders must answer bad bytes with ``ProtocolError`` and the right ``ErrorCode``, never
with ``struct.error``, ``IndexError`` or ``UnicodeDecodeError``: a server turns the error
into an ERROR reply, and anything else would kill the writer's loop.
"""

from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from rocketstore.wire import protocol as P
from rocketstore.wire import ha_protocol
from rocketstore.wire.protocol import ErrorCode, Kind, ProtocolError, QueryMode
from rocketstore.storage import record
from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.consume_queue import BLANK_UNIT, CQ_UNIT
from rocketstore.storage.message import Message, create_message_id, encode_host, encode_properties
from rocketstore.storage.status import GetMessageStatus, PutMessageStatus

DOC = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "PROTOCOL.md")

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
U64 = st.integers(0, (1 << 64) - 1)

# the worked example of docs/PROTOCOL.md §8, kept here too so a change to either shows
EXAMPLE_MESSAGE = Message(topic="TopicTest", body=b"hello", tags="TagA", keys=["k1"],
                          properties={"color": "red"}, queue_id=None,
                          born_timestamp=1700000000000)
EXAMPLE_RESULT = PutMessageResult(PutMessageStatus.PUT_OK,
                                  create_message_id(("127.0.0.1", 10911), 4096),
                                  wrote_offset=4096, wrote_bytes=120, queue_id=2, queue_offset=7,
                                  store_timestamp=1700000000005)
EXAMPLE_SEND_HEX = (
    "5253 01 01 0000000000000001 00000001"
    " 0000000000000000 0000000000000000 0009 546f70696354657374"
    " ffffffff 00000000 00000000 00000000 0000018bcfe56800 00"
    " 0004 54616741 0002 6b31 0000000a 636f6c6f720172656402 00000005 68656c6c6f")
EXAMPLE_SEND_REPLY_HEX = (
    "5253 01 02 0000000000000001 00000001"
    " 00 00000002 0000000000000007 0000000000001000 0000018bcfe56805"
    " 20 3746303030303031303030303241394630303030303030303030303031303030 0000")


# ---------------------------------------------------------------------------- strategies
def _text(min_size=0, max_size=20, exclude=""):
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=exclude),
                   min_size=min_size, max_size=max_size)


hosts = st.one_of(
    st.just(P.DEFAULT_BORN_HOST),
    st.tuples(st.ip_addresses().map(str), st.integers(0, 65535)))
properties = st.dictionaries(
    _text(0, 12, "\x01\x02").filter(lambda k: k != "WAIT"), _text(0, 20, "\x01\x02"),
    max_size=5)
messages = st.builds(
    Message,
    topic=_text(0, 40),
    body=st.binary(max_size=300),
    tags=st.none() | _text(1, 20),
    keys=st.none() | st.lists(_text(1, 10, " "), min_size=1, max_size=4),
    properties=properties,
    queue_id=st.none() | INT32.filter(lambda q: q != -1),
    flag=INT32, sys_flag=INT32, delay_level=INT32,
    born_timestamp=st.none() | INT64.filter(bool),
    born_host=hosts,
    wait_store_msg_ok=st.booleans(),
)
put_results = st.builds(
    PutMessageResult,
    status=st.sampled_from(PutMessageStatus),
    msg_id=st.text(st.characters(max_codepoint=127), max_size=60),
    wrote_offset=INT64, wrote_bytes=st.just(0), queue_id=INT32, queue_offset=INT64,
    store_timestamp=INT64, reason=_text(0, 40))


def raw_record(m: Message, queue_offset: int = 0, physical_offset: int = 0) -> bytes:
    """A CommitLog record of ``m``, as the store writes it (store host 127.0.0.1:10911)."""
    sys_flag = (m.sys_flag & ~0x30) | (0x10 if ":" in m.born_host[0] else 0)
    return bytes(record.encode(
        topic=m.topic.encode(), body=m.body,
        properties=encode_properties(m.all_properties()).encode(),
        queue_id=m.queue_id or 0, flag=m.flag, queue_offset=queue_offset,
        physical_offset=physical_offset, sys_flag=sys_flag,
        born_timestamp=m.born_timestamp or 0, born_host=encode_host(m.born_host),
        store_timestamp=1700000000000, store_host=encode_host(("127.0.0.1", 10911)),
        reconsume_times=0, prepared_transaction_offset=0))


record_messages = st.builds(
    Message, topic=_text(1, 140, "\x00").filter(lambda t: len(t.encode()) <= 255),
    body=st.binary(max_size=200), tags=st.none() | _text(1, 10, "\x00\x01\x02"),
    keys=st.none() | st.lists(_text(1, 8, " \x00\x01\x02"), min_size=1, max_size=3),
    properties=st.dictionaries(
        _text(1, 8, "\x00\x01\x02").filter(lambda k: k not in ("TAGS", "KEYS", "DELAY", "WAIT")),
        _text(0, 12, "\x00\x01\x02"), max_size=3),
    queue_id=st.integers(0, 1000), flag=INT32, born_timestamp=INT64.filter(bool),
    born_host=hosts)


def sample_records() -> list[bytes]:
    return [raw_record(Message(topic="TopicTest", body=b"body %d" % i, tags="TagA",
                               keys=[f"k{i}"], queue_id=1), i, 1000 * i) for i in range(3)]


def units_of(records: list[bytes], first_phy: int = 0) -> list[bytes]:
    """Consume queue units pointing at ``records`` laid back to back from ``first_phy``."""
    units, phy = [], first_phy
    for r in records:
        units.append(CQ_UNIT.pack(phy, len(r), 0))
        phy += len(r)
    return units


def valid_frames() -> dict[str, tuple[bytes, object]]:
    """One valid frame of every kind (and mode) with the decoder that takes it."""
    recs = sample_records()
    return {
        "send": (P.encode_send(11, [EXAMPLE_MESSAGE, Message("T2", b"x" * 40, queue_id=3,
                                                             born_host=("::1", 9))], 5, 9),
                 P.decode_send),
        "send_empty": (P.encode_send(12, []), P.decode_send),
        "send_reply": (P.encode_send_reply(13, [EXAMPLE_RESULT, PutMessageResult.refused(
            PutMessageStatus.MESSAGE_ILLEGAL, "topic 'a/b' must match")]), P.decode_send_reply),
        "pull": (P.encode_pull(14, "TopicTest", 1, 42, 32, 500), P.decode_pull),
        "pull_reply": (P.encode_pull_reply(15, GetMessageStatus.FOUND, 3, 0, 3, recs),
                       P.decode_pull_reply),
        "query_key": (P.encode_query_by_key(16, "TopicTest", "k1", 32, 5, 10), P.decode_query),
        "query_id": (P.encode_query_by_msg_id(17, EXAMPLE_RESULT.msg_id), P.decode_query),
        "query_offset": (P.encode_query_by_offset(18, 4096), P.decode_query),
        "query_reply": (P.encode_query_reply(19, recs[:2]), P.decode_query_reply),
        "error": (P.encode_error(20, ErrorCode.INTERNAL, "disk on fire"), P.decode_error),
        "fetch_reply": (P.encode_fetch_reply(21, GetMessageStatus.FOUND, 3, 0, 3, 0,
                                             units_of(recs), recs), P.decode_fetch_reply),
        "offsets": (P.encode_offsets(22, ["TopicTest", "Other"], 1700000000000),
                    P.decode_offsets),
        "offsets_all": (P.encode_offsets(23), P.decode_offsets),
        "offsets_reply": (P.encode_offsets_reply(24, 4216, 1699999990000, [
            P.QueueOffsets("TopicTest", 0, 0, 8, 7), P.QueueOffsets("Other", 3, 5, 9, -1)]),
            P.decode_offsets_reply),
        "fetch": (P.encode_fetch(25, "TopicTest", 1, 42, 65536, 1 << 24), P.decode_fetch),
        "commit": (P.encode_commit(26, "billing", "TopicTest", {0: 8, 3: 1}), P.decode_commit),
        "commit_reply": (P.encode_commit_reply(27, [(0, 8), (3, 1)]), P.decode_commit_reply),
    }


VALID = valid_frames()
DECODER_KINDS = {P.decode_send: Kind.SEND, P.decode_send_reply: Kind.SEND_REPLY,
                 P.decode_pull: Kind.PULL, P.decode_pull_reply: Kind.PULL_REPLY,
                 P.decode_fetch_reply: Kind.FETCH_REPLY, P.decode_query: Kind.QUERY,
                 P.decode_query_reply: Kind.QUERY_REPLY, P.decode_offsets: Kind.OFFSETS,
                 P.decode_offsets_reply: Kind.OFFSETS_REPLY, P.decode_fetch: Kind.FETCH,
                 P.decode_commit: Kind.COMMIT, P.decode_commit_reply: Kind.COMMIT_REPLY,
                 P.decode_error: Kind.ERROR}
DECODERS = list(DECODER_KINDS)


def raises(code: ErrorCode, fn, frame, request_id: int | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(frame)
    assert info.value.code is code, info.value
    if request_id is not None:
        assert info.value.request_id == request_id
    return info.value


def set_header(frame: bytes, **fields) -> bytes:
    magic, version, kind, request_id, count = P.HEADER.unpack_from(frame, 0)
    values = dict(magic=magic, version=version, kind=kind, request_id=request_id, count=count)
    values.update(fields)
    return P.HEADER.pack(*values.values()) + frame[P.HEADER_SIZE:]


# ---------------------------------------------------------------------------- golden bytes
def doc_hex(name: str) -> bytes:
    """The bytes of the ``<!-- golden:NAME -->`` block in PROTOCOL.md; the first column
    (the decimal offset) is checked against the bytes before it."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    m = re.search(rf"<!-- golden:{name} -->\n```\n(.*?)```", text, re.S)
    assert m, f"no golden:{name} block in PROTOCOL.md"
    out = bytearray()
    for line in m.group(1).splitlines():
        offset, *digits = line.split("|")[0].split()
        assert int(offset) == len(out), f"PROTOCOL.md golden:{name}: offset {offset} is wrong"
        out += bytes.fromhex("".join(digits))
    return bytes(out)


def test_golden_send_matches_doc_and_encoder():
    golden = doc_hex("send")
    assert golden == bytes.fromhex(EXAMPLE_SEND_HEX)
    assert P.encode_send(1, [EXAMPLE_MESSAGE]) == golden
    req = P.decode_send(golden)
    assert req == P.SendRequest(1, [EXAMPLE_MESSAGE], [0], [0])
    assert req.messages[0].queue_id is None and req.messages[0].born_host == ("127.0.0.1", 0)


def test_golden_send_reply_matches_doc_and_encoder():
    golden = doc_hex("send_reply")
    assert golden == bytes.fromhex(EXAMPLE_SEND_REPLY_HEX)
    assert P.encode_send_reply(1, [EXAMPLE_RESULT]) == golden
    request_id, [r] = P.decode_send_reply(golden)
    assert request_id == 1 and r.ok
    assert r == P.SendResult(PutMessageStatus.PUT_OK, "7F00000100002A9F0000000000001000",
                             2, 7, 4096, 1700000000005, "")


def test_doc_busy_example_matches_encoder():
    busy = P.encode_send_reply(1, [PutMessageResult.refused(PutMessageStatus.OS_PAGECACHE_BUSY,
                                                             P.BUSY_REASON)])
    assert busy[P.HEADER_SIZE:] == bytes.fromhex("08 ffffffff" + "ff" * 16 + "00" * 8
                                                  + "00 0004 62757379")


@pytest.mark.parametrize("enum_cls", [PutMessageStatus, GetMessageStatus, ErrorCode, Kind,
                                      ha_protocol.Kind, ha_protocol.HAError])
def test_doc_tables_list_every_code_with_its_value(enum_cls):
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    for member in enum_cls:
        assert re.search(rf"^\| {member.value} \| {member.name} \|", text, re.M) or \
            re.search(rf"^\| {member.name} \| {member.value} \|", text, re.M), member


def test_header_layout():
    frame = VALID["pull"][0]
    assert frame[:2] == b"RS" and frame[2] == 1 and frame[3] == Kind.PULL
    assert P.peek_header(frame) == P.Header(1, Kind.PULL, 14, 0)
    assert P.peek_header(VALID["send"][0]) == P.Header(1, Kind.SEND, 11, 2)


# ---------------------------------------------------------------------------- round trips
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, max_size=8), U64, U64, st.integers(0, 1 << 40))
def test_send_round_trip(batch, request_id, producer_id, first_sequence):
    frame = P.encode_send(request_id, batch, producer_id, first_sequence)
    req = P.decode_send(frame)
    assert req.request_id == request_id
    assert req.messages == batch
    if producer_id:
        assert req.producer_ids == [producer_id] * len(batch)
        assert req.sequences == [first_sequence + i for i in range(len(batch))]
    else:
        assert req.producer_ids == req.sequences == [0] * len(batch)


def test_send_normalises_keys_tags_and_defaults():
    m = Message("T", keys="a  b c", tags="", queue_id=-1, born_timestamp=0)
    [d] = P.decode_send(P.encode_send(1, [m])).messages
    assert d.keys == ["a", "b", "c"] and d.tags is None
    assert d.queue_id is None and d.born_timestamp is None
    assert d.key_list() == m.key_list()
    [d] = P.decode_send(P.encode_send(1, [Message("T", keys=())])).messages
    assert d.keys is None


def test_send_carries_wait_store_msg_ok_as_rocketmq_property():
    m = Message("T", wait_store_msg_ok=False, properties={"a": "1"})
    frame = P.encode_send(1, [m])
    assert b"WAIT\x01false\x02" in frame
    [d] = P.decode_send(frame).messages
    assert d == m and d.all_properties() == m.all_properties()
    kept = Message("T", properties={"WAIT": "true"})
    assert P.decode_send(P.encode_send(1, [kept])).messages == [kept]


def test_send_sequences_only_with_a_producer_id():
    frame = P.encode_send(1, [Message("T")] * 3, producer_id=0, first_sequence=50)
    assert P.decode_send(frame).sequences == [0, 0, 0]
    frame = P.encode_send(1, [Message("T")] * 3, producer_id=7, first_sequence=50)
    assert P.decode_send(frame)[2:] == ([7, 7, 7], [50, 51, 52])


def test_send_accepts_any_buffer():
    import zmq
    frame = VALID["send"][0]
    expected = P.decode_send(frame)
    for buf in (bytearray(frame), memoryview(frame), zmq.Frame(frame)):
        assert P.decode_send(buf) == expected


def test_send_body_may_be_a_memoryview():
    m = Message("T", body=memoryview(b"abcdef")[1:4])
    assert P.decode_send(P.encode_send(1, [m])).messages[0].body == b"bcd"


@settings(max_examples=200)
@given(st.lists(put_results, max_size=8), U64)
def test_send_reply_round_trip(results, request_id):
    got_id, got = P.decode_send_reply(P.encode_send_reply(request_id, results))
    assert got_id == request_id
    assert got == [P.SendResult(r.status, r.msg_id, r.queue_id, r.queue_offset,
                                r.commit_log_offset, r.store_timestamp, r.reason)
                   for r in results]
    assert [g.ok for g in got] == [r.ok for r in results]
    # a client may echo SendResults too (duck-typed like PutMessageResult)
    assert P.decode_send_reply(P.encode_send_reply(request_id, got))[1] == got


def test_send_reply_cuts_an_overlong_reason_at_a_character_boundary():
    r = PutMessageResult.refused(PutMessageStatus.MESSAGE_ILLEGAL, "é" * 40000)
    [got] = P.decode_send_reply(P.encode_send_reply(1, [r]))[1]
    assert got.reason == "é" * 32767


@given(U64, _text(0, 300), INT32, INT64, INT32, INT32)
def test_pull_round_trip(request_id, topic, queue_id, offset, max_msgs, timeout_ms):
    frame = P.encode_pull(request_id, topic, queue_id, offset, max_msgs, timeout_ms)
    assert P.decode_pull(frame) == P.PullRequest(request_id, topic, queue_id, offset,
                                                 max_msgs, timeout_ms)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(U64, st.sampled_from(GetMessageStatus), INT64, INT64, INT64,
       st.lists(record_messages, max_size=5), st.booleans())
def test_pull_reply_round_trip(request_id, status, next_begin, lo, hi, msgs, as_views):
    raws = [raw_record(m, i, 10_000 * i) for i, m in enumerate(msgs)]
    records = [memoryview(r) for r in raws] if as_views else raws
    reply = P.decode_pull_reply(P.encode_pull_reply(request_id, status, next_begin, lo, hi,
                                                    records))
    assert reply[:5] == (request_id, status, next_begin, lo, hi)
    assert reply.messages == [record.decode_at(r, 0) for r in raws]
    for got, m in zip(reply.messages, msgs):
        assert (got.topic, got.body, got.tags, got.keys) == (m.topic, m.body, m.tags, m.key_list())


@given(U64, _text(0, 100), _text(0, 100), INT32, INT64, INT64)
def test_query_by_key_round_trip(request_id, topic, key, max_num, begin_ms, end_ms):
    q = P.decode_query(P.encode_query_by_key(request_id, topic, key, max_num, begin_ms, end_ms))
    assert q == P.QueryRequest(request_id, QueryMode.BY_KEY, topic, key, max_num, begin_ms,
                               end_ms)


def test_query_by_key_defaults_to_all_time():
    q = P.decode_query(P.encode_query_by_key(1, "T", "k", 32))
    assert (q.begin_ms, q.end_ms) == (0, (1 << 63) - 1)


@given(U64, st.text(st.characters(max_codepoint=127), max_size=255))
def test_query_by_msg_id_round_trip(request_id, msg_id):
    q = P.decode_query(P.encode_query_by_msg_id(request_id, msg_id))
    assert q == P.QueryRequest(request_id, QueryMode.BY_MSG_ID, msg_id=msg_id)


@given(U64, INT64)
def test_query_by_offset_round_trip(request_id, offset):
    q = P.decode_query(P.encode_query_by_offset(request_id, offset))
    assert q == P.QueryRequest(request_id, QueryMode.BY_OFFSET, commit_log_offset=offset)


@settings(max_examples=50)
@given(U64, st.lists(record_messages, max_size=4))
def test_query_reply_round_trip(request_id, msgs):
    raws = [raw_record(m, i, 500 * i) for i, m in enumerate(msgs)]
    got_id, got = P.decode_query_reply(P.encode_query_reply(request_id, raws))
    assert got_id == request_id and got == [record.decode_at(r, 0) for r in raws]


@given(U64, st.sampled_from(ErrorCode), _text(0, 200))
def test_error_round_trip(request_id, code, message):
    assert P.decode_error(P.encode_error(request_id, code, message)) == \
        P.ErrorReply(request_id, code, message)


def test_error_message_is_cut_to_fit():
    assert P.decode_error(P.encode_error(1, 6, "x" * 70000)).message == "x" * 65535


# ---------------------------------------------------------------------------- malformed
@pytest.mark.parametrize("name", sorted(VALID))
def test_every_valid_frame_decodes(name):
    frame, decode = VALID[name]
    decode(frame)


@pytest.mark.parametrize("name", sorted(VALID))
def test_truncated_at_every_byte_is_malformed(name):
    frame, decode = VALID[name]
    for n in range(len(frame)):
        e = raises(ErrorCode.MALFORMED_FRAME, decode, frame[:n])
        if n >= P.HEADER_SIZE:
            assert e.request_id == P.peek_header(frame).request_id


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("garbage", [b"\x00", b"\xff" * 7, b"RS\x01\x01" + bytes(12)])
def test_trailing_garbage_is_malformed(name, garbage):
    frame, decode = VALID[name]
    raises(ErrorCode.MALFORMED_FRAME, decode, frame + garbage, P.peek_header(frame).request_id)


@pytest.mark.parametrize("name", sorted(VALID))
def test_wrong_magic_is_malformed_without_request_id(name):
    frame, decode = VALID[name]
    for magic in (b"rs", b"SR", b"\x00\x00", b"RT"):
        raises(ErrorCode.MALFORMED_FRAME, decode, magic + frame[2:], 0)
        raises(ErrorCode.MALFORMED_FRAME, P.peek_header, magic + frame[2:], 0)


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_unsupported_and_keeps_request_id(name, version):
    frame, decode = VALID[name]
    bad = set_header(frame, version=version)
    rid = P.peek_header(frame).request_id
    raises(ErrorCode.UNSUPPORTED_VERSION, decode, bad, rid)
    raises(ErrorCode.UNSUPPORTED_VERSION, P.peek_header, bad, rid)


@pytest.mark.parametrize("kind", [0, 16, 255])
def test_unknown_kind(kind):
    frame = set_header(VALID["send"][0], kind=kind)
    raises(ErrorCode.UNKNOWN_KIND, P.peek_header, frame, 11)
    for decode in DECODERS:
        raises(ErrorCode.UNKNOWN_KIND, decode, frame, 11)


@pytest.mark.parametrize("name", sorted(VALID))
def test_a_kind_the_decoder_does_not_take(name):
    frame, decode = VALID[name]
    for other in DECODERS:
        if DECODER_KINDS[other] is not P.peek_header(frame).kind:
            e = raises(ErrorCode.UNKNOWN_KIND, other, frame, P.peek_header(frame).request_id)
            assert P.peek_header(frame).kind.name in e.detail


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("count", [P.MAX_RECORDS_PER_FRAME + 1, 1 << 31, (1 << 32) - 1])
def test_huge_counts(name, count):
    frame, decode = VALID[name]
    bad = set_header(frame, count=count)
    raises(ErrorCode.TOO_MANY_RECORDS, decode, bad, P.peek_header(frame).request_id)
    raises(ErrorCode.TOO_MANY_RECORDS, P.peek_header, bad)


def _wrong_counts():
    """For every valid frame: a count one more than its records, one fewer (a frame of
    none has no such count: the field is unsigned, and its wrap-around, 2**32 - 1, is
    test_huge_counts'), and the largest a header may hold."""
    for name, (frame, _) in sorted(VALID.items()):
        count = P.peek_header(frame).count
        yield pytest.param(name, count + 1, id=f"{name}-one-more")
        if count:
            yield pytest.param(name, count - 1, id=f"{name}-one-fewer")
        yield pytest.param(name, P.MAX_RECORDS_PER_FRAME, id=f"{name}-most")


@pytest.mark.parametrize("name, count", list(_wrong_counts()))
def test_count_that_disagrees_with_the_body(name, count):
    frame, decode = VALID[name]
    assert count != P.peek_header(frame).count
    raises(ErrorCode.MALFORMED_FRAME, decode, set_header(frame, count=count),
           P.peek_header(frame).request_id)


def test_max_records_is_allowed_in_the_header():
    frame = set_header(P.encode_query_reply(1, []), count=P.MAX_RECORDS_PER_FRAME)
    assert P.peek_header(frame).count == P.MAX_RECORDS_PER_FRAME
    raises(ErrorCode.MALFORMED_FRAME, P.decode_query_reply, frame)


class _Huge:
    """Pretends to be a frame of ``n`` bytes; only its length is ever looked at."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def test_frame_size_limit():
    P.check_frame_size(P.MAX_FRAME_BYTES)
    with pytest.raises(ProtocolError) as info:
        P.check_frame_size(P.MAX_FRAME_BYTES + 1)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    for decode in [P.peek_header] + DECODERS:
        raises(ErrorCode.FRAME_TOO_LARGE, decode, _Huge(P.MAX_FRAME_BYTES + 1))


def test_a_real_oversized_frame():
    frame = VALID["send"][0] + bytes(P.MAX_FRAME_BYTES + 1 - len(VALID["send"][0]))
    raises(ErrorCode.FRAME_TOO_LARGE, P.decode_send, frame)


def test_encoders_refuse_what_a_server_would_refuse():
    with pytest.raises(ProtocolError) as info:
        P.encode_send(3, [Message("T")] * (P.MAX_RECORDS_PER_FRAME + 1))
    assert info.value.code is ErrorCode.TOO_MANY_RECORDS and info.value.request_id == 3
    half = memoryview(bytes(P.MAX_FRAME_BYTES // 2))
    with pytest.raises(ProtocolError) as info:
        P.encode_query_reply(4, [half, half])
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE and info.value.request_id == 4


@pytest.mark.parametrize("message", [
    Message("T", queue_id=1 << 31), Message("T", flag=-(1 << 31) - 1),
    Message("T", sys_flag=1 << 40), Message("T", delay_level=1 << 31),
    Message("T", born_timestamp=1 << 63), Message("x" * 65536),
    Message("T", tags="t" * 65536), Message("T", keys=["k" * 65536]),
    Message("\ud800"),
])
def test_encode_send_refuses_values_that_do_not_fit(message):
    with pytest.raises(ValueError):
        P.encode_send(1, [message])


@pytest.mark.parametrize("call", [
    lambda: P.encode_send(-1, []), lambda: P.encode_send(1 << 64, []),
    lambda: P.encode_send(1, [Message("T")] * 2, producer_id=1, first_sequence=(1 << 64) - 1),
    lambda: P.encode_pull(1, "T", 1 << 31, 0, 1), lambda: P.encode_pull(1, "T" * 65536, 0, 0, 1),
    lambda: P.encode_query_by_msg_id(1, "é"), lambda: P.encode_query_by_msg_id(1, "A" * 256),
    lambda: P.encode_query_by_offset(1, 1 << 63),
    lambda: P.encode_query_by_key(1, "T", "k", 1 << 31),
    lambda: P.encode_send_reply(1, [PutMessageResult(PutMessageStatus.PUT_OK, "A" * 256)]),
    lambda: P.encode_send_reply(1, [PutMessageResult(PutMessageStatus.PUT_OK, queue_id=1 << 31)]),
    lambda: P.encode_pull_reply(1, GetMessageStatus.FOUND, 1 << 63, 0, 0, []),
    lambda: P.encode_error(1, 99, "no such code"),
])
def test_encoders_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def _send_with(**fields) -> bytes:
    """A one-record SEND frame whose raw text fields are the given bytes."""
    f = dict(topic=b"T", host=b"", tags=b"", keys=b"", props=b"", body=b"")
    f.update(fields)
    rec = (struct.pack(">QQH", 0, 0, len(f["topic"])) + f["topic"]
           + struct.pack(">iiiiqB", -1, 0, 0, 0, 0, len(f["host"])) + f["host"]
           + struct.pack(">H", len(f["tags"])) + f["tags"]
           + struct.pack(">H", len(f["keys"])) + f["keys"]
           + struct.pack(">I", len(f["props"])) + f["props"]
           + struct.pack(">I", len(f["body"])) + f["body"])
    return P.HEADER.pack(b"RS", 1, Kind.SEND, 9, 1) + rec


def test_hand_built_send_frame_decodes():
    [m] = P.decode_send(_send_with(topic=b"T", host=b"[::1]:80", tags=b"a", keys=b"k1 k2",
                                   props=b"x\x01y\x02", body=b"b")).messages
    assert m == Message("T", b"b", "a", ["k1", "k2"], {"x": "y"}, None, born_host=("::1", 80))


BAD_UTF8 = [b"\xff", b"\xc3", b"a\xed\xa0\x80", b"\xe2\x82"]


@pytest.mark.parametrize("field", ["topic", "tags", "keys", "props"])
@pytest.mark.parametrize("raw", BAD_UTF8)
def test_send_bad_utf8_is_malformed(field, raw):
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send, _send_with(**{field: raw}), 9)


@pytest.mark.parametrize("host", [b"nothost", b"1.2.3.4", b"1.2.3.4:", b"1.2.3.4:99999",
                                  b"1.2.3.4:-1", b"::1:5", b"[1.2.3.4]:5", b"300.1.1.1:5",
                                  b"host.example:80", b"\xff:1", b":80", b"[]:80",
                                  b"[::1]]:5", b"[[::1]:5", b"[::1:5", b"::1]:5"])
def test_send_bad_born_host_is_malformed(host):
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send, _send_with(host=host), 9)


def test_send_lengths_running_past_the_frame():
    good = _send_with(body=b"abc")
    huge_body = good[:-7] + struct.pack(">I", 1 << 31) + b"abc"
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send, huge_body, 9)
    for field_len_pos, width in ((32, 2), (P.HEADER_SIZE + 18 + 1 + 24, 1)):
        bad = bytearray(good)
        bad[field_len_pos:field_len_pos + width] = b"\xff" * width
        raises(ErrorCode.MALFORMED_FRAME, P.decode_send, bytes(bad), 9)


def test_send_reply_bad_fields():
    frame = P.encode_send_reply(5, [EXAMPLE_RESULT])
    body = P.HEADER_SIZE
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send_reply,
           frame[:body] + b"\xff" + frame[body + 1:], 5)  # status 255 does not exist
    bad_id = bytearray(frame)
    bad_id[body + 30] = 0xC3
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send_reply, bytes(bad_id), 5)
    refused = PutMessageResult.refused(PutMessageStatus.UNKNOWN_ERROR, "ab")
    reason = P.encode_send_reply(5, [refused])
    raises(ErrorCode.MALFORMED_FRAME, P.decode_send_reply, reason[:-2] + b"\xff\xfe", 5)


def test_pull_bad_topic_utf8():
    frame = P.encode_pull(6, "TT", 0, 0, 1)
    raises(ErrorCode.MALFORMED_FRAME, P.decode_pull,
           frame[:P.HEADER_SIZE + 2] + b"\xff\xff" + frame[P.HEADER_SIZE + 4:], 6)


def test_pull_reply_bad_status_crc_and_length():
    recs = sample_records()
    frame = P.encode_pull_reply(7, GetMessageStatus.FOUND, 3, 0, 3, recs[:1])
    raises(ErrorCode.MALFORMED_FRAME, P.decode_pull_reply,
           frame[:P.HEADER_SIZE] + b"\x09" + frame[P.HEADER_SIZE + 1:], 7)
    rec_start = P.HEADER_SIZE + P.PULL_REPLY_FIXED.size + 4
    body_pos = rec_start + 88
    torn = bytearray(frame)
    torn[body_pos] ^= 0x01
    e = raises(ErrorCode.MALFORMED_FRAME, P.decode_pull_reply, bytes(torn), 7)
    assert "CRC" in e.detail
    # the record's TOTALSIZE says one byte more than its length prefix
    extra = P.encode_pull_reply(7, GetMessageStatus.FOUND, 3, 0, 3, [recs[0] + b"\x00"])
    raises(ErrorCode.MALFORMED_FRAME, P.decode_pull_reply, extra, 7)
    not_a_record = P.encode_pull_reply(7, GetMessageStatus.FOUND, 3, 0, 3, [bytes(100)])
    raises(ErrorCode.MALFORMED_FRAME, P.decode_pull_reply, not_a_record, 7)


def test_query_bad_mode_and_ascii():
    for mode in (0, 4, 255):
        frame = P.HEADER.pack(b"RS", 1, Kind.QUERY, 8, 0) + bytes([mode]) + bytes(8)
        raises(ErrorCode.MALFORMED_FRAME, P.decode_query, frame, 8)
    frame = P.encode_query_by_msg_id(8, "AB")
    raises(ErrorCode.MALFORMED_FRAME, P.decode_query, frame[:-1] + b"\xc9", 8)


def test_error_bad_code_and_utf8():
    frame = P.encode_error(9, ErrorCode.INTERNAL, "ok")
    raises(ErrorCode.MALFORMED_FRAME, P.decode_error,
           frame[:P.HEADER_SIZE] + b"\x00\xc8" + frame[P.HEADER_SIZE + 2:], 9)
    raises(ErrorCode.MALFORMED_FRAME, P.decode_error, frame[:-2] + b"\xe2\x82", 9)


def test_protocol_error_is_a_value_error_naming_its_code():
    e = raises(ErrorCode.MALFORMED_FRAME, P.decode_send, b"")
    assert isinstance(e, ValueError) and str(e).startswith("MALFORMED_FRAME:")


# ---------------------------------------------------------------------------- batch readers
# OFFSETS, FETCH, COMMIT (docs/PROTOCOL.md §4.8-4.12, worked example §9)
GOLDEN_BATCH = {
    "offsets": (lambda: P.encode_offsets(2, ["TopicTest"], 1700000000000),
                P.OffsetsRequest(2, ["TopicTest"], 1700000000000), P.decode_offsets),
    "offsets_reply": (lambda: P.encode_offsets_reply(2, 4216, 1699999990000,
                                                     [P.QueueOffsets("TopicTest", 2, 0, 8, 7)]),
                      P.OffsetsReply(2, 4216, 1699999990000,
                                     [P.QueueOffsets("TopicTest", 2, 0, 8, 7)]),
                      P.decode_offsets_reply),
    "fetch": (lambda: P.encode_fetch(3, "TopicTest", 2, 7, 65536, 16777216),
              P.FetchRequest(3, "TopicTest", 2, 7, 65536, 16777216), P.decode_fetch),
    "commit": (lambda: P.encode_commit(4, "billing", "TopicTest", {2: 8}),
               P.CommitRequest(4, "billing", "TopicTest", [(2, 8)]), P.decode_commit),
    "commit_reply": (lambda: P.encode_commit_reply(4, {2: 8}), P.CommitReply(4, [(2, 8)]),
                     P.decode_commit_reply),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_BATCH))
def test_golden_batch_frames_match_doc_encoder_and_decoder(name):
    encode, value, decode = GOLDEN_BATCH[name]
    golden = doc_hex(name)
    assert encode() == golden
    assert decode(golden) == value


def test_golden_offsets_bytes_by_hand():
    # the fields at the offsets PROTOCOL.md §4.8/§4.9 give, independently of the codec
    req = doc_hex("offsets")
    assert req[3] == 7 and struct.unpack_from(">I", req, 12) == (1,)
    assert struct.unpack_from(">qH9s", req, 16) == (1700000000000, 9, b"TopicTest")
    reply = doc_hex("offsets_reply")
    assert struct.unpack_from(">qq", reply, 16) == (4216, 1699999990000)
    assert struct.unpack_from(">H9siqqq", reply, 32) == (9, b"TopicTest", 2, 0, 8, 7)
    assert len(reply) == 32 + 2 + 9 + 28


def test_fetch_has_pull_layout_with_max_bytes_in_place_of_timeout():
    fetch = P.encode_fetch(9, "T", 1, 2, 3, 4)
    pull = P.encode_pull(9, "T", 1, 2, 3, 4)
    assert fetch[3] == Kind.FETCH and fetch[4:] == pull[4:]
    assert P.REPLY_KIND[Kind.FETCH] is Kind.FETCH_REPLY


@given(U64, st.lists(_text(0, 60), max_size=6), INT64)
def test_offsets_round_trip(request_id, topics, timestamp_ms):
    frame = P.encode_offsets(request_id, topics, timestamp_ms)
    assert P.peek_header(frame).count == len(topics)
    assert P.decode_offsets(frame) == P.OffsetsRequest(request_id, topics, timestamp_ms)


def test_offsets_defaults_to_every_topic_and_no_timestamp():
    assert P.decode_offsets(P.encode_offsets(1)) == P.OffsetsRequest(1, [], -1)


queue_offsets = st.builds(P.QueueOffsets, _text(0, 40), INT32, INT64, INT64, INT64)


@settings(max_examples=200)
@given(U64, INT64, INT64, st.lists(queue_offsets, max_size=8))
def test_offsets_reply_round_trip(request_id, dispatched, generation, queues):
    reply = P.decode_offsets_reply(P.encode_offsets_reply(request_id, dispatched, generation,
                                                          queues))
    assert reply == P.OffsetsReply(request_id, dispatched, generation, queues)
    assert all(type(q) is P.QueueOffsets for q in reply.queues)


@given(U64, _text(0, 300), INT32, INT64, INT32, INT32)
def test_fetch_round_trip(request_id, topic, queue_id, offset, max_msgs, max_bytes):
    frame = P.encode_fetch(request_id, topic, queue_id, offset, max_msgs, max_bytes)
    assert P.decode_fetch(frame) == P.FetchRequest(request_id, topic, queue_id, offset,
                                                   max_msgs, max_bytes)


@settings(max_examples=200)
@given(U64, _text(0, 60), _text(0, 60), st.lists(st.tuples(INT32, INT64), max_size=20))
def test_commit_round_trip(request_id, group, topic, pairs):
    req = P.decode_commit(P.encode_commit(request_id, group, topic, pairs))
    assert req == P.CommitRequest(request_id, group, topic, pairs)
    got_id, got = P.decode_commit_reply(P.encode_commit_reply(request_id, pairs))
    assert (got_id, got) == (request_id, pairs)


def test_commit_takes_a_mapping_or_pairs():
    assert P.encode_commit(1, "g", "T", {3: 10, 1: 2}) == \
        P.encode_commit(1, "g", "T", [(3, 10), (1, 2)])
    assert P.decode_commit(P.encode_commit(1, "g", "T", {})).offsets == []


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(U64, st.sampled_from(GetMessageStatus), INT64, INT64, INT64, INT64,
       st.lists(record_messages, max_size=5), st.integers(0, 2))
def test_fetch_reply_gives_the_units_and_records_without_copying(request_id, status, nb, lo,
                                                                 hi, first, msgs, blanks):
    raws = [raw_record(m, i, 10_000 * i) for i, m in enumerate(msgs)]
    units = [BLANK_UNIT] * blanks + units_of(raws)
    frame = P.encode_fetch_reply(request_id, status, nb, lo, hi, first, units, raws)
    reply = P.decode_fetch_reply(frame)
    assert reply[:6] == (request_id, status, nb, lo, hi, first)
    assert bytes(reply.units) == b"".join(units) and bytes(reply.data) == b"".join(raws)
    assert [bytes(r) for r in reply.records] == raws
    assert all(isinstance(r, memoryview) and r.obj is frame for r in reply.records)
    assert [record.decode_at(r, 0, check_crc=True) for r in reply.records] == \
        [record.decode_at(r, 0, check_crc=True) for r in raws]


def test_fetch_reply_takes_any_buffer():
    import zmq
    frame = VALID["fetch_reply"][0]
    expected = [bytes(r) for r in P.decode_fetch_reply(frame).records]
    for buf in (bytearray(frame), memoryview(frame), zmq.Frame(frame)):
        assert [bytes(r) for r in P.decode_fetch_reply(buf).records] == expected


def test_fetch_reply_checks_its_layout_but_leaves_the_records_to_the_caller():
    recs = sample_records()
    units = units_of(recs)
    frame = P.encode_fetch_reply(7, GetMessageStatus.FOUND, 3, 0, 3, 0, units, recs)
    torn = bytearray(frame)
    torn[len(frame) - len(recs[-1]) + 88] ^= 0x01  # a body byte: the CRC is the caller's
    [_, _, r] = P.decode_fetch_reply(bytes(torn)).records
    with pytest.raises(record.RecordFormatError):
        record.decode_at(r, 0, check_crc=True)
    for bad_units, bad_data in ((units, recs[:2]), (units[:2], recs), (units, recs + [b"x"]),
                                ([CQ_UNIT.pack(0, 4, 0)], [b"\x00" * 4])):
        e = raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch_reply,
                   P.encode_fetch_reply(7, GetMessageStatus.FOUND, 3, 0, 3, 0, bad_units,
                                        bad_data), 7)
        assert "FETCH_REPLY" in e.detail
    header = P.HEADER.pack(P.MAGIC, P.VERSION, Kind.FETCH_REPLY, 7, 3)
    body = frame[P.HEADER_SIZE:P.HEADER_SIZE + P.FETCH_REPLY_FIXED.size + 40]
    raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch_reply, header + body, 7)  # 2 of 3 units
    raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch_reply, frame[:P.HEADER_SIZE + 20], 7)
    raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch_reply,
           frame[:P.HEADER_SIZE] + b"\x09" + frame[P.HEADER_SIZE + 1:], 7)  # status 9


@pytest.mark.parametrize("count", [P.SMALL_COLUMNS - 1, P.SMALL_COLUMNS, 3 * P.SMALL_COLUMNS])
def test_fetch_reply_checks_few_and_many_units_alike(count):
    """A reply's unit sizes are checked with struct for a few units and with numpy for
    many: the same replies pass (blanks included) and the same ones are refused."""
    recs = [raw_record(Message(topic="T", body=b"b" * i), i, 1000 * i) for i in range(count)]
    units = units_of(recs)
    blanks = [BLANK_UNIT] + units[:count // 2] + [BLANK_UNIT] + units[count // 2:]
    reply = P.decode_fetch_reply(P.encode_fetch_reply(7, GetMessageStatus.FOUND, 3, 0, 3, 0,
                                                      blanks, recs))
    assert [bytes(r) for r in reply.records] == recs
    all_blank = P.encode_fetch_reply(7, GetMessageStatus.FOUND, 3, 0, 3, 0,
                                     [BLANK_UNIT] * count, [])
    assert bytes(P.decode_fetch_reply(all_blank).data) == b""
    for bad_units, bad_data in ((units, recs[:-1]), (units[:-1], recs),
                                (units[:-1] + [CQ_UNIT.pack(0, 4, 0)], recs[:-1] + [b"\0" * 4])):
        e = raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch_reply,
                   P.encode_fetch_reply(7, GetMessageStatus.FOUND, 3, 0, 3, 0, bad_units,
                                        bad_data), 7)
        assert "FETCH_REPLY" in e.detail


def test_batch_frames_bad_utf8_and_lengths_past_the_frame():
    offsets = P.encode_offsets(5, ["TT"])
    raises(ErrorCode.MALFORMED_FRAME, P.decode_offsets, offsets[:-2] + b"\xff\xfe", 5)
    raises(ErrorCode.MALFORMED_FRAME, P.decode_offsets, offsets[:-4] + b"\xff\xff" + b"TT", 5)
    reply = P.encode_offsets_reply(5, 0, 0, [P.QueueOffsets("TT", 0, 0, 0, 0)])
    topic_at = P.HEADER_SIZE + 16
    bad = bytearray(reply)
    bad[topic_at + 2] = 0xC3
    raises(ErrorCode.MALFORMED_FRAME, P.decode_offsets_reply, bytes(bad), 5)
    bad[topic_at:topic_at + 2] = b"\x01\x00"
    raises(ErrorCode.MALFORMED_FRAME, P.decode_offsets_reply, bytes(bad), 5)
    fetch = P.encode_fetch(5, "TT", 0, 0, 1, 1)
    raises(ErrorCode.MALFORMED_FRAME, P.decode_fetch,
           fetch[:P.HEADER_SIZE] + b"\x00\x30" + fetch[P.HEADER_SIZE + 2:], 5)
    commit = P.encode_commit(5, "gg", "TT", {0: 1})
    for pos, raw in ((P.HEADER_SIZE + 2, b"\xff"), (P.HEADER_SIZE + 6, b"\xed")):
        bad = bytearray(commit)
        bad[pos] = raw[0]
        raises(ErrorCode.MALFORMED_FRAME, P.decode_commit, bytes(bad), 5)
    for pos in (P.HEADER_SIZE, P.HEADER_SIZE + 4):   # group length, topic length
        bad = bytearray(commit)
        bad[pos:pos + 2] = b"\xff\xff"
        raises(ErrorCode.MALFORMED_FRAME, P.decode_commit, bytes(bad), 5)


@pytest.mark.parametrize("call", [
    lambda: P.encode_offsets(1, ["T"], 1 << 63),
    lambda: P.encode_offsets(1, ["x" * 65536]),
    lambda: P.encode_offsets_reply(1, 1 << 63, 0, []),
    lambda: P.encode_offsets_reply(1, 0, 0, [P.QueueOffsets("T", 1 << 31, 0, 0, 0)]),
    lambda: P.encode_fetch(1, "T", 0, 0, 1 << 31, 1),
    lambda: P.encode_fetch(1, "T", 0, 1 << 63, 1, 1),
    lambda: P.encode_commit(1, "g" * 65536, "T", {}),
    lambda: P.encode_commit(1, "g", "T", {0: 1 << 63}),
    lambda: P.encode_commit(1, "g", "T", {1 << 31: 0}),
    lambda: P.encode_commit_reply(1, [(0, -(1 << 63) - 1)]),
])
def test_batch_encoders_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_batch_encoders_refuse_too_many_records():
    for call in (lambda: P.encode_offsets(3, ["T"] * (P.MAX_RECORDS_PER_FRAME + 1)),
                 lambda: P.encode_commit(3, "g", "T", [(0, 0)] * (P.MAX_RECORDS_PER_FRAME + 1))):
        with pytest.raises(ProtocolError) as info:
            call()
        assert info.value.code is ErrorCode.TOO_MANY_RECORDS and info.value.request_id == 3


def test_fetch_limits_keep_a_reply_under_the_frame_limit():
    worst = (P.HEADER_SIZE + P.PULL_REPLY_FIXED.size + 4 * P.MAX_FETCH_MSGS + P.MAX_FETCH_BYTES)
    assert P.MAX_FETCH_MSGS == P.MAX_RECORDS_PER_FRAME
    assert worst * 3 < P.MAX_FRAME_BYTES


# ---------------------------------------------------------------------------- fuzzing
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(VALID)), st.data())
def test_mutated_frames_decode_or_raise_protocol_error(name, data):
    frame, decode = VALID[name]
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(P.HEADER_SIZE, len(buf) - 1)) if len(buf) > P.HEADER_SIZE \
            else data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(buf))
    except ProtocolError:
        pass


@settings(max_examples=400)
@given(st.sampled_from(list(Kind)), st.integers(0, 70000), st.binary(max_size=200))
@example(Kind.SEND, 1, bytes(55))
@example(Kind.PULL_REPLY, 1, bytes(25) + b"\x00\x00\x00\x08" + bytes(8))
def test_random_bodies_decode_or_raise_protocol_error(kind, count, body):
    frame = P.HEADER.pack(b"RS", 1, kind, 1, count) + body
    for decode in DECODERS:
        try:
            decode(frame)
        except ProtocolError:
            pass


@given(st.binary(max_size=40))
def test_random_bytes_never_leak_other_exceptions(frame):
    for decode in [P.peek_header, P.reply_request_id, P.decode_one_send_result] + DECODERS:
        try:
            decode(frame)
        except ProtocolError:
            pass


@given(U64, st.lists(st.tuples(st.sampled_from(list(PutMessageStatus)), st.integers(-1, 99),
                               INT64, st.integers(-1, 2**62), INT64,
                               st.one_of(st.just(""), _text(1, 20))), max_size=40),
       st.sampled_from([bytes(8), bytes([10, 0, 0, 1, 0, 0, 0x27, 0x1F]), bytes(range(20))]))
def test_send_records_reply_round_trip(request_id, rows, host):
    columns = {name: [row[k] for row in rows] for k, name in enumerate(
        ("status", "queue_id", "queue_offset", "commit_log_offset", "store_timestamp"))}
    columns["status"] = [s.value for s in columns["status"]]
    reasons = {i: row[5] for i, row in enumerate(rows) if row[5]}
    frame = P.encode_send_records_reply(request_id, host, columns, reasons)
    got_id, got = P.decode_send_records_reply(frame)
    assert got_id == request_id
    assert got == [P.SendResult(status, f"{host.hex().upper()}{off:016X}" if off >= 0 else "",
                                qid, qoff, off, ts, reason)
                   for status, qid, qoff, off, ts, reason in rows]


@given(U64, st.sampled_from(list(PutMessageStatus)), st.integers(-1, 99), INT64,
       st.integers(-1, 2**62), INT64, st.one_of(st.just(""), _text(1, 20)),
       st.sampled_from([bytes(0), bytes(8), bytes(range(20))]))
def test_one_send_result_reads_what_the_general_decoder_reads(request_id, status, qid, qoff,
                                                             off, ts, reason, host):
    columns = {"status": [status.value], "queue_id": [qid], "queue_offset": [qoff],
               "commit_log_offset": [off], "store_timestamp": [ts]}
    frame = P.encode_send_records_reply(request_id, host, columns, {0: reason} if reason else {})
    one = P.decode_one_send_result(frame)
    assert P.reply_request_id(frame) == request_id
    if reason:
        assert one is None                  # the general decoder reads a reason
    else:
        assert one == P.decode_send_records_reply(frame)[1][0]


def test_one_send_result_leaves_other_frames_to_the_general_decoders():
    columns = {"status": [0, 0], "queue_id": [0, 1], "queue_offset": [0, 1],
               "commit_log_offset": [0, 100], "store_timestamp": [1, 1]}
    two = P.encode_send_records_reply(3, bytes(8), columns, {})
    one = P.encode_one_send_records_reply(4, bytes(8), 0, 1, 2, 3, 4)
    error = P.encode_error(5, ErrorCode.MALFORMED_FRAME, "bad")
    for frame in (two, error, one[:-1], one + b"\0", b"RS\x02" + one[3:], b"XX" + one[2:]):
        assert P.decode_one_send_result(frame) is None
    assert P.reply_request_id(error) == 5
    with pytest.raises(ProtocolError):
        P.reply_request_id(b"XX" + one[2:])
    with pytest.raises(ProtocolError):
        P.reply_request_id(one[:10])


@given(U64, st.one_of(st.just(0), st.integers(1, 2**64 - 1)), U64, st.binary(max_size=300))
def test_one_send_record_frame_is_a_send_records_frame_of_one(request_id, producer_id,
                                                              sequence, record):
    frame = P.encode_one_send_record(request_id, record, producer_id, sequence)
    assert frame == P.encode_send_records(request_id, record, [0], producer_id, sequence)
    got = P.decode_send_records(frame)
    assert (got.request_id, got.producer_id, list(got.offsets), bytes(got.records)) == \
        (request_id, producer_id, [0], record)
    with pytest.raises(ValueError):
        P.encode_one_send_record(2**64, record)


def test_send_records_reply_with_an_unknown_status_is_malformed():
    columns = {"status": [0, 250], "queue_id": [0, 0], "queue_offset": [0, 1],
               "commit_log_offset": [0, 100], "store_timestamp": [1, 1]}
    frame = P.encode_send_records_reply(3, bytes(8), columns, {})
    with pytest.raises(ProtocolError, match="record 1: unknown status 250"):
        P.decode_send_records_reply(frame)


# ---------------------------------------------------------------------------- the HA frames
# docs/PROTOCOL.md §10 is where the HA frames' layouts are written; wire/ha_protocol.py
# only implements them. These tests read §10's two layout tables and hold the codec to
# them: the head's bytes, each kind's number and name, its fixed fields' struct, and a
# frame built from the table alone, which the codec must decode and encode alike.
HA_TYPES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
HA_HEAD_ROW = re.compile(r"^\| (\d+) \| (\d+) \| (.+) \|$", re.M)
HA_KIND_ROW = re.compile(r"^\| (\d+) \| ([A-Z]+) \| (slave|master|either) \| (.+) \|$", re.M)
HA_FIELD = re.compile(r"`(\w+) (u8|u16|u32|u64|str8)`")
HA_TAILS = {"CommitLog bytes": b"\x00\x01\xfe\xff", "UTF-8 text": "why: é".encode(),
            "the file's bytes": b'{"offsetTable":{}}'}
HA_ENCODERS = {
    ha_protocol.Kind.HELLO: lambda f, tail: ha_protocol.encode_hello(**f),
    ha_protocol.Kind.REPORT: lambda f, tail: ha_protocol.encode_report(**f),
    ha_protocol.Kind.DATA: lambda f, tail: ha_protocol.data_head(**f) + tail,
    ha_protocol.Kind.ERROR: lambda f, tail: ha_protocol.encode_error(f["code"], tail.decode()),
    ha_protocol.Kind.PROBE: lambda f, tail: ha_protocol.encode_probe(**f),
    ha_protocol.Kind.RANGE: lambda f, tail: ha_protocol.range_head(**f) + tail,
    ha_protocol.Kind.FILE: lambda f, tail: ha_protocol.encode_file(f["name"], tail),
}


class HAFrameDoc(NamedTuple):
    """One row of §10's kind table."""
    value: int
    sender: str
    fields: list[tuple[str, str]]   # (name, type) of the fixed fields, in order
    tail: bytes | None              # sample bytes for what follows them ("then ...")


def ha_doc_section(text: str | None = None) -> str:
    if text is None:
        with open(DOC, encoding="utf-8") as f:
            text = f.read()
    start = text.index("\n## 10. ")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def ha_doc_frames(section: str) -> dict[str, HAFrameDoc]:
    frames = {}
    for value, name, sender, body in HA_KIND_ROW.findall(section):
        fixed, then, tail = body.partition("then ")
        assert not then or tail.split(" (")[0] in HA_TAILS, f"§10 {name}: what is {tail!r}?"
        frames[name] = HAFrameDoc(int(value), sender, HA_FIELD.findall(fixed),
                                  HA_TAILS[tail.split(" (")[0]] if then else None)
    return frames


def ha_doc_frame(section: str, kind: ha_protocol.Kind, frame: HAFrameDoc) -> tuple[dict, bytes]:
    """Distinct field values, and the frame ``section`` says carries them (no codec used)."""
    fields = {}
    out = bytearray(ha_doc_head(section).pack(*ha_doc_head_values(section), frame.value))
    for k, (name, kind_of) in enumerate(frame.fields):
        if kind_of == "str8":
            fields[name] = ha_protocol.SYNCED_FILES[0]
            out += bytes((len(fields[name]),)) + fields[name].encode("ascii")
        else:
            width = struct.calcsize(HA_TYPES[kind_of])
            fields[name] = int.from_bytes(bytes(range(k + 1, k + 1 + width)), "big")
            out += struct.pack(">" + HA_TYPES[kind_of], fields[name])
    return fields, bytes(out) + (frame.tail or b"")


def ha_doc_head(section: str) -> struct.Struct:
    """The 4-byte head from §10's first table: each row's offset follows the one before."""
    rows = HA_HEAD_ROW.findall(section)[:3]
    fmt, at = ">", 0
    for offset, size, _ in rows:
        assert int(offset) == at, f"§10 head: offset {offset} after {at} bytes"
        fmt += {1: "B", 2: f"{size}s"}[int(size)]
        at += int(size)
    return struct.Struct(fmt)


def ha_doc_head_values(section: str) -> tuple[bytes, int]:
    """(magic, version) as §10's head table writes them."""
    (_, _, magic), (_, _, version) = HA_HEAD_ROW.findall(section)[:2]
    return (bytes.fromhex(re.search(r"`([0-9a-f ]+)`", magic).group(1)),
            int(re.fullmatch(r"version: (\d+)", version).group(1)))


def check_ha_layouts(section: str) -> None:
    """Everything §10's tables say about the frames, against the codec."""
    head = ha_doc_head(section)
    assert head.format == ha_protocol.HEAD.format
    assert ha_doc_head_values(section) == (ha_protocol.MAGIC, ha_protocol.VERSION)
    frames = ha_doc_frames(section)
    assert sorted(frames) == sorted(k.name for k in ha_protocol.Kind)
    for kind in ha_protocol.Kind:
        frame = frames[kind.name]
        assert frame.value == kind.value, kind
        fixed = [(n, t) for n, t in frame.fields if t != "str8"]
        if len(fixed) == len(frame.fields):        # every kind but FILE has a struct
            layout = getattr(ha_protocol, kind.name)
            assert layout.format == ">" + "".join(HA_TYPES[t] for _, t in fixed), kind
        fields, wire = ha_doc_frame(section, kind, frame)
        assert HA_ENCODERS[kind](fields, frame.tail or b"") == wire, kind
        decoded = ha_protocol.decode(wire)
        if kind is ha_protocol.Kind.REPORT:
            assert decoded == fields["offset"]
            continue
        got = decoded._asdict()
        tail = got.pop(decoded._fields[-1]) if frame.tail is not None else None
        assert got == fields, kind
        assert tail is None or bytes(tail.encode() if isinstance(tail, str) else tail) \
            == frame.tail, kind


def test_the_ha_frames_are_laid_out_as_protocol_md_section_10_says():
    check_ha_layouts(ha_doc_section())


@pytest.mark.parametrize("old, new", [
    ("`tail_crc u32` |", "`tail_crc u64` |"),                   # a field's width
    ("`offset u64`, `length u32` |", "`length u32`, `offset u64` |"),  # the order
    ("| 2 | REPORT | slave | `offset u64` |", "| 2 | REPORT | slave | `offset u32` |"),
    ("| 7 | FILE |", "| 8 | FILE |"),                            # a kind's number
    ("`code u16`, then UTF-8 text", "`code u16`"),               # a tail dropped
    ("| 2 | 1 | version: 2 |", "| 2 | 1 | version: 3 |"),
])
def test_the_section_10_check_sees_a_drifted_table(old, new):
    section = ha_doc_section()
    assert old in section
    with pytest.raises(AssertionError):
        check_ha_layouts(section.replace(old, new))
