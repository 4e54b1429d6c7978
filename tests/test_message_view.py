"""MessageView (``storage.message_view``): every field and property equal to
``decode_at``'s MessageExt for the same record, decoded on demand; bad bytes refused as
``decode_at`` refuses them; the bulk checks (numpy's ``views_at``, struct's
``plain_views``) take what ``view_at`` takes, and the same records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rocketstore.storage import record
from rocketstore.storage.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, encode_host
from rocketstore.storage.consume_queue import BLANK_UNIT, CQ_UNIT
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message_view import (
    MessageView, _plain_run, plain_views, view_at, views_at)
from rocketstore.storage.record_batch import BODYLENGTH_POS
from rocketstore.storage.read_path import check_unit_views

HOSTS = [("127.0.0.1", 10911), ("10.1.2.3", 0), ("::1", 9876), ("fe80::1", 65535)]


def make(body: bytes, topic: str, props: str, born, store, **kw) -> bytes:
    flags = (BORNHOST_V6_FLAG if ":" in born[0] else 0) | \
        (STOREHOSTADDRESS_V6_FLAG if ":" in store[0] else 0)
    return bytes(record.encode(
        topic=topic.encode(), body=body, properties=props.encode(), queue_id=kw.get("q", 3),
        flag=kw.get("flag", 7), queue_offset=kw.get("qo", 11), physical_offset=kw.get("po", 99),
        sys_flag=flags | kw.get("sys", 0), born_timestamp=123, born_host=encode_host(born),
        store_timestamp=456, store_host=encode_host(store), reconsume_times=kw.get("rt", 2),
        prepared_transaction_offset=kw.get("pto", 5)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.text("abcXYZ_%|-09", min_size=1, max_size=200),
       st.dictionaries(st.text("pq", min_size=1, max_size=3), st.text("vé w", max_size=4),
                       max_size=4),
       st.sampled_from(HOSTS), st.sampled_from(HOSTS), st.integers(-(1 << 31), (1 << 31) - 1))
def test_a_view_equals_the_decoded_message(body, topic, props, born, store, rt):
    raw = "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    data = make(body, topic, raw, born, store, rt=rt)
    ext = record.decode_at(data, 0)
    view = view_at(data)
    assert view == ext and ext == view.to_ext()
    for name in ("msg_id", "tags", "keys", "uniq_key", "body", "born_host", "store_host",
                 "properties", "topic", "store_size", "reconsume_times"):
        assert getattr(view, name) == getattr(ext, name), name
    assert view.to_dict() == ext.to_dict()


def test_bad_bytes_are_refused_as_decode_at_refuses_them():
    good = make(b"body", "TopicA", "TAGS\x01t\x02", HOSTS[0], HOSTS[0])
    cases = {
        "truncated header": good[:20],
        "illegal magic": good[:4] + b"\x00\x00\x00\x01" + good[8:],
        "runs past": good[:-1],
        "disagrees": good[:-9] + b"\x00\x09" + good[-7:],  # PROPERTIESLENGTH wrong
    }
    for word, data in cases.items():
        with pytest.raises(record.RecordFormatError):
            record.decode_at(data, 0)
        with pytest.raises(record.RecordFormatError) as e:
            view_at(data)
        assert word.split()[0] in str(e.value) or "size" in str(e.value), (word, e.value)
    torn = bytearray(good)
    torn[good.index(b"TopicA")] = 0
    with pytest.raises(record.RecordFormatError, match="NUL"):
        view_at(bytes(torn))


def test_a_view_keeps_its_own_bytes():
    data = bytearray(make(b"body", "TopicA", "", HOSTS[0], HOSTS[0]))
    view = view_at(bytes(data))
    data[:] = bytes(len(data))                          # the source is gone or reused
    assert view.body == b"body" and view.topic == "TopicA"
    assert isinstance(view, MessageView)


record_args = st.tuples(st.binary(max_size=60), st.sampled_from(["T", "Other", "x" * 130]),
                        st.sampled_from(["", "TAGS\x01t\x02", "KEYS\x01a b\x02W\x01x\x02"]),
                        st.sampled_from(HOSTS), st.sampled_from(HOSTS))


# What the common run is made of (v1, IPv4 hosts, the topic read for): views_at's
# plain path takes such a run whole, or leaves it to the general path when damaged.
plain_args = st.tuples(st.binary(max_size=60), st.just("T"),
                       st.sampled_from(["", "TAGS\x01t\x02", "KEYS\x01a b\x02W\x01x\x02"]),
                       st.sampled_from(HOSTS[:2]), st.sampled_from(HOSTS[:2]))


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.lists(record_args, min_size=1, max_size=10),
                 st.lists(plain_args, min_size=1, max_size=10)), st.data())
def test_views_at_checks_as_view_at_does(records, data):
    """The bulk ``views_at`` against ``view_at`` record by record, with damage: the same
    views, or the same refusal of the first bad record (its index). Half the runs are
    plain ones (``plain_args``), damaged or not."""
    raws = [make(*args, po=i) for i, args in enumerate(records)]
    buf = bytearray(b"".join(raws))
    for _ in range(data.draw(st.integers(0, 2), "damage")):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(
            st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    _agree(bytes(buf), [len(r) for r in raws])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 40), st.lists(plain_args, min_size=1, max_size=10), st.data())
def test_a_plain_run_of_one_body_length_is_checked_as_any(body_len, records, data):
    """Bodies of one length (``plain_views`` reads each record's head and tail in one
    unpack then): damaged or not, the same views or refusal as ``view_at``'s, also when
    the damage changes a BODYLENGTH."""
    raws = [make(bytes([i % 251]) * body_len, *args[1:], po=i)
            for i, args in enumerate(records)]
    buf = bytearray(b"".join(raws))
    for _ in range(data.draw(st.integers(0, 2), "damage")):
        at = data.draw(st.sampled_from([None, BODYLENGTH_POS, BODYLENGTH_POS + 3]), "where")
        pos = data.draw(st.integers(0, len(buf) - 1)) if at is None else \
            sum(map(len, raws[:data.draw(st.integers(0, len(raws) - 1))])) + at
        buf[pos] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    _agree(bytes(buf), [len(r) for r in raws])


def _agree(buf: bytes, sizes: list[int]) -> None:
    """``views_at`` over the records of ``buf`` (topic "T") against ``view_at`` one by
    one: the same views and columns, or the same refusal of the first bad record (its
    index); and ``decode_at`` refusing what ``view_at`` refuses."""
    sizes = np.array(sizes, np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    expected = []
    for s, n in zip(starts.tolist(), sizes.tolist()):
        try:
            expected.append(view_at(buf[s:s + n]))
        except record.RecordFormatError as e:
            expected.append(e)
            with pytest.raises(record.RecordFormatError):     # never a struct.error
                record.decode_at(buf[s:s + n], 0)
            break
    _plain_agrees(buf, starts, sizes, expected)
    try:
        views, columns = views_at(buf, starts, sizes, "T")
    except record.RecordFormatError as e:
        assert isinstance(expected[-1], record.RecordFormatError), e
        assert e.index == len(expected) - 1 and str(e) == str(expected[-1])
        return
    assert views == expected
    assert columns.topic_matches.tolist() == [v.topic == "T" for v in views]
    assert columns.commit_log_offsets.tolist() == [v.commit_log_offset for v in views]
    assert columns.queue_offsets.tolist() == [v.queue_offset for v in views]


def _field(message, name: str):
    """A field's value, or the kind of error reading it raises (a damaged PHYSICALOFFSET
    has no msgId)."""
    try:
        return getattr(message, name)
    except (ValueError, OverflowError) as e:
        return type(e)


def _plain_agrees(buf: bytes, starts: np.ndarray, sizes: np.ndarray, expected: list) -> None:
    """``plain_views`` (struct) takes a run exactly when ``views_at``'s numpy plain path
    does, and then every view equals ``view_at``'s, field by field, with the columns the
    caller checks against its units."""
    plain = plain_views(buf, starts.tolist(), tuple(sizes.tolist()), "T")
    numpy_plain = _plain_run(buf, np.frombuffer(buf, np.uint8), starts, sizes, "T")
    assert (plain is None) == (numpy_plain is None)
    if plain is None:
        return
    views, queue_ids, queue_offsets, commit_log_offsets = plain
    assert views == expected and all(isinstance(v, MessageView) for v in views)
    for view, ext in zip(views, expected):
        for name in ("msg_id", "tags", "keys", "uniq_key", "delay_level", "born_host",
                     "store_host", "body", "properties", "flag", "body_crc"):
            assert _field(view, name) == _field(ext, name), name
    assert list(queue_ids) == [v.queue_id for v in expected]
    assert list(queue_offsets) == [v.queue_offset for v in expected]
    assert list(commit_log_offsets) == [v.commit_log_offset for v in expected]


@settings(max_examples=150, deadline=None)
@given(st.lists(plain_args, min_size=1, max_size=12), st.lists(st.integers(0, 40), max_size=12),
       st.data())
def test_plain_views_over_records_with_gaps_between_them(records, gaps, data):
    """The records of a queue between other queues' (a joined read): ``plain_views`` at
    their starts agrees with ``view_at`` for each, whole or damaged, and refuses starts
    or sizes that run past the bytes."""
    raws = [make(*args, po=i, qo=i) for i, args in enumerate(records)]
    buf, starts = bytearray(), []
    for i, raw in enumerate(raws):
        buf += b"\xAA" * (gaps[i] if i < len(gaps) else 3)
        starts.append(len(buf))
        buf += raw
    damage = data.draw(st.integers(0, 2), "damage")
    for _ in range(damage):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(
            st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    buf = bytes(buf)
    sizes = [len(r) for r in raws]
    assert damage or plain_views(buf, starts, tuple(sizes), "T") is not None
    expected = []
    for s, n in zip(starts, sizes):
        try:
            expected.append(view_at(buf[s:s + n]))
        except record.RecordFormatError:
            expected = None
            break
    plain = plain_views(buf, starts, tuple(sizes), "T")
    if expected is None or not all(v.topic == "T" for v in expected):
        assert plain is None
    else:
        _plain_agrees(buf, np.array(starts, np.int64), np.array(sizes, np.int64), expected)
    assert plain_views(buf[:starts[-1] + sizes[-1] - 1], starts, tuple(sizes), "T") is None
    assert plain_views(buf, [-1] + starts[1:], tuple(sizes), "T") is None


def test_views_at_over_a_plain_run_damaged_at_every_byte():
    """A plain run (what ``views_at`` takes in two gathers) with each of its bytes
    changed in turn, to values that set the IPv6 host bits, a negative length or a
    NUL: the same views, or the same refusal, as ``view_at``'s."""
    raws = [make(b"body%d" % i, "T", "TAGS\x01t\x02" * i, HOSTS[0], HOSTS[1], po=i)
            for i in range(3)]
    good = b"".join(raws)
    sizes = [len(r) for r in raws]
    _agree(good, sizes)
    for at in range(len(good)):
        for value in {0, 0x10, 0x20, 0x80, 0xFF} - {good[at]}:
            _agree(good[:at] + bytes((value,)) + good[at + 1:], sizes)


def test_views_at_refuses_a_negative_body_length_that_fits_elsewhere():
    """BODYLENGTH -8 puts TOPICLENGTH back inside PREPARED TRANSACTION OFFSET, whose
    last four bytes read as a length-1 topic "T" and a PROPERTIESLENGTH that ends the
    record where its TOTALSIZE says: everything adds up but the length itself."""
    head = bytearray(make(b"", "T", "", HOSTS[0], HOSTS[0]))[:BODYLENGTH_POS]
    size = BODYLENGTH_POS + 4 + 10
    head[0:4] = size.to_bytes(4, "big")
    head[80:84] = bytes((1, ord("T"))) + (size - 84).to_bytes(2, "big")
    raw = bytes(head) + (-8).to_bytes(4, "big", signed=True) + b"p" * 10
    with pytest.raises(record.RecordFormatError, match="body length -8"):
        view_at(raw)
    _agree(raw, [size])


def test_views_at_refuses_a_properties_length_over_a_signed_short():
    """PROPERTIESLENGTH is a Java short: 0x8000 properties bytes read as -32768, even
    where the record holds that many."""
    props = "k\x01" + "v" * 32764 + "\x02"
    raw = bytearray(make(b"", "T", props, HOSTS[0], HOSTS[0]))
    assert len(props) == 32767
    raw += b"w"
    raw[0:4] = len(raw).to_bytes(4, "big")
    at = len(raw) - 32768 - 2
    raw[at:at + 2] = b"\x80\x00"
    with pytest.raises(record.RecordFormatError, match="disagrees"):
        view_at(bytes(raw))
    _agree(bytes(raw), [len(raw)])


def test_check_unit_views_in_bulk_agrees_with_one_by_one():
    """``read_path.check_unit_views`` over 120 units (the numpy path) and 20 (one by
    one): the same views, and the same CorruptRecordError for a unit that points at
    another message."""
    raws = [make(b"b%d" % i, "T", "TAGS\x01t\x02", HOSTS[0], HOSTS[2], q=1, qo=i,
                 po=1000 + 200 * i) for i in range(120)]
    units = b"".join(CQ_UNIT.pack(1000 + 200 * i, len(r), 0) for i, r in enumerate(raws))
    pieces = [memoryview(b"".join(raws[:50])), memoryview(b"".join(raws[50:]))]
    bulk = check_unit_views(units, pieces, "T", 1, 0)
    small = check_unit_views(units[:20 * 20], [b"".join(raws[:20])], "T", 1, 0)
    assert bulk == [view_at(r) for r in raws] and small == bulk[:20]
    wrong = units[:20 * 7] + CQ_UNIT.pack(999, len(raws[7]), 0) + units[20 * 8:]
    errors = []
    for n in (120, 20):
        with pytest.raises(CorruptRecordError) as e:
            check_unit_views(wrong[:n * 20], [b"".join(raws[:n])], "T", 1, 0)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "unit 7" in errors[0]


def test_a_unit_longer_than_its_record_is_a_corrupt_unit_in_bulk_and_one_by_one():
    """A unit whose size runs 8 bytes past its record's TOTALSIZE (into the next
    record): the same CorruptRecordError from the bulk check as from the one-by-one
    one, never an AssertionError."""
    raws = [make(b"b%d" % i, "T", "", HOSTS[0], HOSTS[0], q=1, qo=i, po=1000 + 200 * i)
            for i in range(120)]
    data = b"".join(raws) + bytes(8)
    starts = np.concatenate([[0], np.cumsum([len(r) for r in raws])[:-1]]).astype(np.int64)
    sizes = [len(r) + (8 if i == 7 else 0) for i, r in enumerate(raws)]
    units = b"".join(CQ_UNIT.pack(1000 + 200 * i, n, 0) for i, n in enumerate(sizes))
    errors = []
    for n in (120, 20):
        with pytest.raises(CorruptRecordError) as e:
            check_unit_views(units[:n * 20], [data], "T", 1, 0, starts[:n])
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "unit 7" in errors[0] and "size" in errors[0]


def test_views_keep_their_own_starts_and_refuse_a_negative_one():
    raws = [make(b"b%d" % i, "T", "", HOSTS[0], HOSTS[0], qo=i) for i in range(3)]
    buf = b"".join(raws)
    sizes = np.array([len(r) for r in raws], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    views, _ = views_at(buf, starts, sizes, "T")
    starts[:] = 0                                   # the caller's array, reused
    assert [v.queue_offset for v in views] == [0, 1, 2]
    # a start of -5 would read the window 5 from the end (numpy's negative index): built
    # so that what lies there reads as a whole record of topic "T"
    raw = bytearray(make(b"", "T", "", HOSTS[0], HOSTS[0], pto=0))
    raw[79:83] = b"\x01T\x00\x00"       # TOPICLENGTH 1, "T", PROPERTIESLENGTH 0
    buf = b"\x01T\x00\x00" + bytes(raw)
    with pytest.raises(record.RecordFormatError, match="truncated"):
        views_at(buf, np.array([91 - len(buf)], np.int64), np.array([len(raw)], np.int64), "T")


def test_check_unit_views_short_with_struct_agrees_with_numpy_and_one_by_one():
    """A joined read of fewer than ``BULK_VIEWS_MIN`` plain records (checked with
    struct), of more (numpy) and the same records one by one: the same views; a unit
    naming another offset, queue or PHYSICALOFFSET, or a blank unit, gives what the
    one-by-one check gives."""
    raws = [make(b"b%d" % i, "T", "TAGS\x01t\x02", HOSTS[0], HOSTS[1], q=1, qo=i,
                 po=1000 + 300 * i) for i in range(120)]
    gap = b"\x00" * 7                                   # another queue's bytes between
    data = gap.join(raws)
    starts = [sum(len(r) + len(gap) for r in raws[:i]) for i in range(120)]
    units = b"".join(CQ_UNIT.pack(1000 + 300 * i, len(r), 0) for i, r in enumerate(raws))
    bulk = check_unit_views(units, [data], "T", 1, 0, np.array(starts, np.int64))
    short = check_unit_views(units[:20 * 20], [data], "T", 1, 0, starts[:20])
    assert bulk == [view_at(r) for r in raws] and short == bulk[:20]
    assert type(short[0]) is not MessageView and type(bulk[0]) is MessageView
    pieces = [memoryview(data)[s:s + len(r)] for s, r in zip(starts[:20], raws)]
    for wrong, first, queue_id in [
            (units[:20 * 7] + CQ_UNIT.pack(999, len(raws[7]), 0) + units[20 * 8:], 0, 1),
            (units, 1, 1), (units, 0, 2)]:
        errors = []
        for n, with_starts in ((120, True), (20, True), (20, False)):
            with pytest.raises(CorruptRecordError) as e:
                check_unit_views(wrong[:n * 20], [data] if with_starts else pieces, "T",
                                 queue_id, first, starts[:n] if with_starts else None)
            errors.append(str(e.value))
        assert errors[0] == errors[1] == errors[2], errors
    blank = units[:20 * 3] + BLANK_UNIT + units[20 * 4:20 * 20]    # unit 3 a filler
    got = check_unit_views(blank, [data], "T", 1, 0, starts[:3] + starts[4:20])
    assert got == short[:3] + short[4:]
