"""The reader socket reads as local reads do: PULL takes RocketMQ's tag expression and
filters as a local Consumer does; OFFSETS finds a time by either rule, the nearest one
being exactly what a local ``Consumer.seek_to_time`` finds; frames of older clients are
still taken; bad filters and rules get named errors."""

from __future__ import annotations

import time

import pytest

from rocketstore.wire import protocol
from rocketstore.client import Consumer, Producer, ReaderClient
from rocketstore.shm.positions import Slot
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE, CQ_UNIT
from rocketstore.storage.read_path import subscription_tags
from rocketstore.storage.record import decode_at
from rocketstore.storage.store_reader import StoreReader
from rocketstore.storage.config import StoreConfig, recorded_geometry
from store_processes import RunningStore, wait_for, wait_past_ms

TAGS = ["paid", "refunded", None, "paid", "shipped", "refunded", "", "other"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with RunningStore(tmp_path_factory.mktemp("filters")) as s:
        stamps = []
        with Producer(s.store_dir) as p:
            for i in range(48):
                r = p.send("Orders", b"order-%02d" % i, tags=TAGS[i % len(TAGS)], queue_id=0)
                assert r.status.name == "PUT_OK"
                stamps.append(r.store_timestamp)
                if i % 12 == 11:
                    wait_past_ms(r.store_timestamp)   # store times that differ between groups
        wait_for(lambda: s.slot(Slot.DISPATCHED) == s.slot(Slot.WRITTEN), what="dispatch")
        s.stamps = stamps
        yield s


def _local(store, tags) -> list[bytes]:
    with Consumer(store.store_dir, f"g{time.monotonic_ns()}", "Orders", tags=tags) as c:
        got, deadline = [], time.monotonic() + 10
        while len(got) < 48 and time.monotonic() < deadline:
            batch = c.poll(64, timeout_ms=200)
            if not batch:
                break
            got += batch
    return [m.body for m in got]


def _remote(store, tags) -> list[bytes]:
    with ReaderClient(store.store_dir) as reader:
        out, offset = [], 0
        while True:
            reply = reader.pull("Orders", 0, offset, 7, tags=tags)
            out += [m.body for m in reply.messages]
            if reply.next_begin_offset >= reply.max_offset:
                return out
            offset = reply.next_begin_offset


@pytest.mark.parametrize("tags", ["paid || refunded", ["shipped"], "*", " other || ",
                                  "nothing"])
def test_remote_pull_filters_as_a_local_consumer(store, tags):
    expected = [b"order-%02d" % i for i in range(48)
                if not subscription_tags(tags) or TAGS[i % len(TAGS)] in subscription_tags(tags)]
    assert _remote(store, tags) == expected == _local(store, tags)


def test_a_pull_without_a_filter_is_the_older_clients_frame():
    plain = protocol.encode_pull(7, "Orders", 1, 0, 32, 0)
    assert plain == protocol.encode_pull(7, "Orders", 1, 0, 32, 0, "*") and len(plain) == 44
    assert protocol.decode_pull(plain).subscription == "*"
    filtered = protocol.encode_pull(7, "Orders", 1, 0, 32, 0, "paid || refunded")
    assert len(filtered) == 62
    assert protocol.decode_pull(filtered).subscription == "paid || refunded"
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.decode_pull(plain + b"\x00")               # a cut subscription
    assert e.value.code is protocol.ErrorCode.MALFORMED_FRAME


def test_bad_filters_and_time_rules_are_refused(store):
    with ReaderClient(store.store_dir) as reader:
        with pytest.raises(ValueError, match="subscription"):
            reader.pull("Orders", 0, 0, 8, tags=[1, 2])
    with pytest.raises(ValueError, match="time_rule"):
        protocol.encode_offsets(1, ["Orders"], 5, time_rule=7)
    frame = protocol.encode_offsets(1, ["Orders"], 5, protocol.TIME_NEAREST)[:-1] + b"\x07"
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.decode_offsets(frame)
    assert e.value.code is protocol.ErrorCode.MALFORMED_FRAME
    with pytest.raises(ValueError, match="subscription"):
        subscription_tags([None])


def test_offsets_by_time_follow_either_rule_as_local_reads_do(store):
    config = StoreConfig(store_path_root_dir=store.store_dir,
                         **recorded_geometry(store.store_dir))
    stamps = store.stamps
    probes = sorted({stamps[0] - 1000, stamps[0], stamps[11] + 1, stamps[12] - 1, stamps[30],
                     stamps[-1], stamps[-1] + 1000})
    dispatched = store.slot(Slot.DISPATCHED)
    with ReaderClient(store.store_dir) as remote, StoreReader(config) as local:
        for ts in probes:
            nearest = {q.queue_id: q.time_offset
                       for q in remote.offsets(["Orders"], ts, nearest=True)}
            after = {q.queue_id: q.time_offset for q in remote.offsets(["Orders"], ts)}
            assert nearest[0] == local.get_offset_in_queue_by_time("Orders", 0, ts, dispatched)
            assert after[0] == local.first_offset_stored_since("Orders", 0, ts, dispatched)
            with Consumer(store.store_dir, f"t{ts}", "Orders") as c:
                c.poll(1, timeout_ms=100)             # joins the group: queue 0 assigned
                c.seek_to_time(ts)
                assert c.position(0) == nearest[0]
            first_after = next((i for i, s in enumerate(stamps) if s >= ts), 48)
            assert after[0] == first_after


def test_a_filtered_fetch_blanks_the_units_of_other_tags(store):
    """FETCH with a subscription: every unit in place, those of other tags blank and
    without a record; the records it does carry are exactly a filtered PULL's."""
    with ReaderClient(store.store_dir) as reader:
        whole = reader.fetch("Orders", 0, 0, 48)
        some = reader.fetch("Orders", 0, 0, 48, tags="paid || refunded")
        pulled = reader.pull("Orders", 0, 0, 48, tags="paid || refunded")
    assert len(some.units) == len(whole.units) == 48 * 20
    assert some.next_begin_offset == whole.next_begin_offset == 48
    units = [CQ_UNIT.unpack_from(some.units, i * 20) for i in range(48)]
    blank = [u[1] == BLANK_UNIT_SIZE for u in units]
    assert blank == [TAGS[i % len(TAGS)] not in ("paid", "refunded") for i in range(48)]
    assert [decode_at(bytes(r), 0).body for r in some.records] == [m.body for m in
                                                                   pulled.messages]


def test_a_filtered_fetch_of_the_schedule_topic_keeps_the_tags_asked(store):
    """In SCHEDULE_TOPIC_XXXX a unit's tagsCode is the delivery time, not the tags'
    hash: a filtered FETCH reads every record there (it blanked them all), and keeps
    what a filtered PULL returns."""
    with Producer(store.store_dir) as p:
        sent = [p.send("Later", b"late-%d" % i, tags=("TagA", "TagB")[i % 2],
                       delay_level=18) for i in range(4)]          # two hours
    wait_for(lambda: store.slot(Slot.DISPATCHED) == store.slot(Slot.WRITTEN), what="dispatch")
    queue = 18 - 1                                  # delay level 18 -> schedule queue 17
    with ReaderClient(store.store_dir) as reader:
        pulled = reader.pull("SCHEDULE_TOPIC_XXXX", queue, 0, 32, tags="TagA")
        fetched = reader.fetch("SCHEDULE_TOPIC_XXXX", queue, 0, 32, tags="TagA")
    assert all(r.ok for r in sent)
    assert [m.body for m in pulled.messages] == [b"late-0", b"late-2"]
    assert [decode_at(bytes(r), 0).body for r in fetched.records] == [b"late-0", b"late-2"]
