"""``record_batch.encode_batch`` lays out a batch of messages exactly as
``record_batch.encode_message`` lays out each: for any message (tags, keys, properties,
delay level, unicode, empty properties, IPv6 hosts, long topics, transactions) the bytes
are the same, and a message one refuses the other refuses too. Batches mix the common
shape (one pack a message) with every other, in any order, so the per-batch caches (the
born host, the topic, the joined properties check) are held to it as well.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from rocketstore.storage import Message, record_batch
from rocketstore.storage.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE

BORN_TS = 1_700_000_000_000
SHARED_HOST = ("10.1.2.3", 9876)         # one tuple, as a producer's messages share it

texts = st.text(min_size=0, max_size=12)            # any unicode, reserved bytes included
plain = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1,
                max_size=10)
topics = st.one_of(st.sampled_from(["TopicA", "TopicB", "主题"]),
                   st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1,
                           max_size=200))
hosts = st.one_of(st.just(SHARED_HOST), st.just(("127.0.0.1", 0)),
                  st.tuples(st.sampled_from(["192.168.0.9", "::1", "fe80::2"]),
                            st.integers(0, 65535)))
keys = st.one_of(st.none(), st.lists(plain, min_size=1, max_size=1),
                 st.lists(texts, max_size=3), texts,
                 st.tuples(plain, plain))
properties = st.one_of(st.just({}), st.dictionaries(plain, texts, max_size=3),
                       st.dictionaries(st.sampled_from(["TAGS", "KEYS", "DELAY", "WAIT",
                                                        "__PID", "user"]),
                                       plain, max_size=2))


@st.composite
def messages(draw) -> Message:
    common = draw(st.booleans())         # half the draws are of the common shape
    return Message(
        topic=draw(topics), body=draw(st.binary(max_size=300)),
        tags=draw(st.one_of(st.none(), st.just(""), plain, texts)),
        keys=draw(st.lists(plain, min_size=1, max_size=1)) if common else draw(keys),
        properties={} if common else draw(properties),
        queue_id=draw(st.one_of(st.none(), st.integers(0, 15),
                                st.integers(-3, -1))) if not common else draw(
            st.one_of(st.none(), st.integers(0, 7))),
        flag=draw(st.integers(-2**31, 2**31 - 1)),
        sys_flag=draw(st.sampled_from([0, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE,
                                       0x10, 0x20])),
        delay_level=0 if common else draw(st.integers(0, 18)),
        born_timestamp=draw(st.one_of(st.none(), st.integers(0, 2**62))),
        born_host=SHARED_HOST if common else draw(hosts),
        reconsume_times=draw(st.integers(0, 16)),
        prepared_transaction_offset=draw(st.integers(0, 2**40)),
        wait_store_msg_ok=True if common else draw(st.booleans()))


def _one_by_one(batch: list[Message]) -> list[bytes] | type:
    """``encode_message`` of each, or the kind of error the first refused one raised."""
    try:
        return [record_batch.encode_message(m, BORN_TS) for m in batch]
    except Exception as e:          # noqa: BLE001  the kind is what is compared
        return _kind(e)


def _kind(e: Exception) -> type:
    return ValueError if isinstance(e, ValueError) else type(e)


@settings(max_examples=400, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=12))
def test_a_batch_encodes_as_each_message_alone(batch):
    expected = _one_by_one(batch)
    try:
        got = record_batch.encode_batch(batch, BORN_TS)
    except Exception as e:          # noqa: BLE001
        got = _kind(e)
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["Tag0", "标签", "", None]),
                          st.text(max_size=6), st.sampled_from([None, 0, 3])),
                min_size=1, max_size=40))
def test_a_run_of_the_common_shape_encodes_as_each_message_alone(rows):
    """One topic, one host, a tag and one key each (unicode, empty, or holding a
    reserved byte or the key separator): the path a producer's batch takes."""
    body = bytes(range(128))
    batch = [Message("TopicA", body, tags=tags, keys=[key], queue_id=queue_id,
                     born_host=SHARED_HOST) for tags, key, queue_id in rows]
    expected = _one_by_one(batch)
    try:
        got = record_batch.encode_batch(batch, BORN_TS)
    except Exception as e:          # noqa: BLE001
        got = _kind(e)
    assert got == expected


def test_encode_records_is_the_batch_back_to_back():
    batch = [Message("TopicA", b"x" * i, tags="t", keys=[f"k{i}"], born_host=SHARED_HOST)
             for i in range(5)]
    data, offsets = record_batch.encode_records(batch, BORN_TS)
    parts = [record_batch.encode_message(m, BORN_TS) for m in batch]
    assert data == b"".join(parts)
    assert offsets == [sum(map(len, parts[:i])) for i in range(5)]


def test_a_message_encode_message_refuses_is_refused_in_a_batch():
    """Properties over 32767 bytes and a negative queue id, amid the common shape."""
    ok = Message("TopicA", b"x", tags="t", keys=["k"], born_host=SHARED_HOST)
    for bad in (Message("TopicA", b"x", tags="t" * 40000, keys=["k"], born_host=SHARED_HOST),
                Message("TopicA", b"x", tags="t", keys=["k" * 40000], queue_id=2,
                        born_host=SHARED_HOST),
                Message("TopicA", b"x", tags="t", keys=["k"], queue_id=-2,
                        born_host=SHARED_HOST)):
        for batch in ([bad], [ok, bad, ok]):
            try:
                record_batch.encode_message(bad, BORN_TS)
            except ValueError as e:
                want = str(e)
            try:
                record_batch.encode_batch(batch, BORN_TS)
            except ValueError as e:
                assert str(e) == want
            else:
                raise AssertionError("encode_batch took what encode_message refuses")
