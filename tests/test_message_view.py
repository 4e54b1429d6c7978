"""MessageView (``storage.message_view``): every field and property equal to
``decode_at``'s MessageExt for the same record, decoded on demand; bad bytes refused as
``decode_at`` refuses them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from storage import record
from storage.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, encode_host
from storage.message_view import MessageView, view_at

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
