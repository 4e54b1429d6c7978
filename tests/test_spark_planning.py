"""The Spark format's planning, without Spark: options, offset specs, ranges, limits,
endpoints."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, strategies as st

from rocketstore.spark import offsets as off
from rocketstore.spark.options import DEFAULT_GROUP, READ_ONLY, parse
from rocketstore.wire import endpoints
from rocketstore.shm import bus

B = off.QueueBounds


# ------------------------------------------------------------------------------ options
def test_options_read_with_kafka_vocabulary():
    o = parse({"store": "s", "topics": "A, B", "startingOffsets": "earliest",
               "maxOffsetsPerTrigger": "100", "minPartitions": "4", "failOnDataLoss": "false"},
              reading=True)
    assert (o.store, o.endpoint, o.topics) == ("s", None, ("A", "B"))
    assert (o.max_offsets_per_trigger, o.min_partitions, o.fail_on_data_loss) == (100, 4, False)
    assert o.group == DEFAULT_GROUP and o.matches("A") and not o.matches("C")


def test_curve_options_are_the_key_files_for_an_endpoint():
    o = parse({"endpoint": "tcp://h:1", "topic": "A", "curveServerKey": "keys/server.key",
               "CURVECLIENTKEY": "keys/app.key_secret"}, reading=True)
    assert o.curve == ("keys/server.key", "keys/app.key_secret")
    assert parse({"store": "s", "topic": "A"}, reading=True).curve == (None, None)


def test_options_are_case_insensitive_and_path_names_the_store():
    o = parse({"PATH": "dir", "TOPIC": "A", "FAILONDATALOSS": "TRUE"}, reading=True)
    assert o.store == "dir" and o.topics == ("A",) and o.fail_on_data_loss


def test_topic_pattern_matches_whole_names():
    o = parse({"endpoint": "tcp://h:1", "topicPattern": "Or.*s"}, reading=True)
    assert o.matches("Orders") and not o.matches("XOrders") and not o.matches("Order")


@pytest.mark.parametrize("options, words", [
    ({"topic": "A"}, "exactly one of"),
    ({"store": "s", "endpoint": "tcp://h:1", "topic": "A"}, "exactly one of"),
    ({"store": "s"}, "topic, topics or topicPattern"),
    ({"store": "s", "topic": "A", "topics": "B"}, "not both"),
    ({"store": "s", "topic": "A", "topicPattern": "A.*"}, "not both"),
    ({"store": "s", "topicPattern": "(("}, "not a regular expression"),
    ({"store": "s", "topic": "../etc"}, "must match"),
    ({"store": "s", "topic": "A", "maxOffsetsPerTrigger": "0"}, "at least 1"),
    ({"store": "s", "topic": "A", "minPartitions": "x"}, "must be an integer"),
    ({"store": "s", "topic": "A", "failOnDataLoss": "maybe"}, "true or false"),
    ({"store": "s", "topic": "A", "group": "a b"}, "group"),
    ({"store": "s", "topic": "A", "startingOffset": "earliest"}, "unknown option"),
    ({"endpoint": "tcp://h:1", "topic": "A", "curveServerKey": "k"}, "go together"),
    ({"store": "s", "topic": "A", "curveServerKey": "k", "curveClientKey": "c"},
     "go together"),
])
def test_bad_read_options_are_named(options, words):
    with pytest.raises(ValueError, match=words):
        parse(options, reading=True)


def test_the_tags_option_is_a_subscription_for_reading_only():
    assert parse({"store": "s", "topic": "T", "tags": " b ||a|| "}, reading=True).tags == ("a", "b")
    assert parse({"store": "s", "topic": "T", "tags": "*"}, reading=True).tags == ()
    assert parse({"store": "s", "topic": "T"}, reading=True).tags == ()
    with pytest.raises(ValueError, match="tags: for reading only"):
        parse({"store": "s", "topic": "T", "tags": "a"}, reading=False)


@pytest.mark.parametrize("name", READ_ONLY)
def test_write_options_refuse_what_only_a_read_uses(name):
    """A reading option given to a write would be silently ignored: it is refused."""
    with pytest.raises(ValueError, match=f"{name}: for reading only"):
        parse({"store": "s", name.upper(): "1"}, reading=False)
    assert parse({"store": "s"}, reading=False).topics == ()


def test_a_write_batch_is_at_most_a_frame_of_records():
    assert parse({"store": "s", "batchSize": "65536"}, reading=False).batch_size == 65536
    with pytest.raises(ValueError, match="batchSize must be at most 65536"):
        parse({"store": "s", "batchSize": "70000"}, reading=False)
    assert parse({"store": "s", "topic": "T", "batchSize": "70000"}, reading=True).batch_size \
        == 70000


# ------------------------------------------------------------------------------ specs
def test_parse_spec_words_and_json():
    assert off.parse_spec("o", None, "latest") == "latest"
    assert off.parse_spec("o", " Earliest ", "latest") == "earliest"
    assert off.parse_spec("o", '{"A": {"0": 5, "1": -2}, "B": {"3": -1}}', "x") == \
        {("A", 0): 5, ("A", 1): -2, ("B", 3): -1}


@pytest.mark.parametrize("text, words", [
    ("{", "expected 'earliest'"), ("[1]", "object of topics"), ('{"A": 3}', "map queue ids"),
    ('{"A": {"x": 1}}', "queue id"), ('{"A": {"0": -3}}', ">= -2"),
    ('{"A": {"0": 1.5}}', ">= -2"), ('{"A": {"0": true}}', ">= -2"),
])
def test_parse_spec_refuses_bad_json(text, words):
    with pytest.raises(ValueError, match=words):
        off.parse_spec("startingOffsets", text, "earliest")


def test_resolve_uses_bounds_and_defaults():
    bounds = [B("A", 0, 3, 10), B("A", 1, 0, 7), B("B", 0, 5, 5)]
    assert off.resolve("earliest", bounds, "latest") == {("A", 0): 3, ("A", 1): 0, ("B", 0): 5}
    assert off.resolve("latest", bounds, "earliest") == {("A", 0): 10, ("A", 1): 7, ("B", 0): 5}
    spec = {("A", 0): 4, ("A", 1): -1}
    assert off.resolve(spec, bounds, "earliest") == {("A", 0): 4, ("A", 1): 7, ("B", 0): 5}


def test_resolve_timestamp_takes_the_first_offset_since_or_the_end():
    bounds = [B("A", 0, 0, 10, 4), B("A", 1, 0, 7, -1)]
    assert off.resolve_timestamp(bounds) == {("A", 0): 4, ("A", 1): 7}


def test_offset_maps_round_trip_with_string_queue_ids():
    m = off.to_offset_map({("A", 0): 1, ("A", 10): 2, ("B", 3): 0})
    assert m == {"A": {"0": 1, "10": 2}, "B": {"3": 0}}
    assert off.from_offset_map(m) == {("A", 0): 1, ("A", 10): 2, ("B", 3): 0}
    with pytest.raises(ValueError, match="offset map"):
        off.from_offset_map({"A": 3})


def test_check_no_loss_names_expired_and_overrun_queues():
    bounds = [B("A", 0, 3, 10), B("A", 1, 0, 7)]
    problems = off.check_no_loss({("A", 0): 1, ("A", 1): 9}, bounds)
    assert problems == ["A/0: offsets 1..2 expired (the queue now starts at 3)",
                        "A/1: offset 9 is past the queue's end 7"]
    assert off.check_no_loss({("A", 0): 3, ("A", 1): 7}, bounds) == []


# ------------------------------------------------------------------------------ ranges
def test_ranges_between_skips_empty_queues_and_starts_new_ones_at_zero():
    r = off.ranges_between({("A", 0): 5, ("A", 1): 7}, {("A", 0): 9, ("A", 1): 7, ("A", 2): 3})
    assert r == [off.QueueRange("A", 0, 5, 9), off.QueueRange("A", 2, 0, 3)]


def test_split_ranges_reaches_min_partitions_in_proportion():
    ranges = [off.QueueRange("A", 0, 0, 900), off.QueueRange("A", 1, 100, 200)]
    split = off.split_ranges(ranges, 10)
    assert len(split) == 10
    assert [r for r in split if r.queue_id == 1] == [off.QueueRange("A", 1, 100, 200)]
    assert sum(r.size for r in split) == 1000
    zero = [r for r in split if r.queue_id == 0]
    assert zero[0].start == 0 and zero[-1].end == 900
    assert all(a.end == b.start for a, b in zip(zero, zero[1:]))
    assert off.split_ranges(ranges, None) == ranges
    assert off.split_ranges([off.QueueRange("A", 0, 0, 2)], 8) == \
        [off.QueueRange("A", 0, 0, 1), off.QueueRange("A", 0, 1, 2)]


@given(st.lists(st.integers(0, 500), min_size=1, max_size=6), st.integers(1, 40))
def test_split_ranges_covers_each_range_exactly(sizes, want):
    ranges = [off.QueueRange("T", i, 10, 10 + n) for i, n in enumerate(sizes) if n]
    split = off.split_ranges(ranges, want)
    for r in ranges:
        parts = [p for p in split if p.queue_id == r.queue_id]
        assert parts[0].start == r.start and parts[-1].end == r.end
        assert all(p.size > 0 for p in parts)
        assert all(a.end == b.start for a, b in zip(parts, parts[1:]))


def test_limit_offsets_shares_in_proportion_to_what_waits():
    start = {("A", 0): 0, ("A", 1): 100, ("A", 2): 5}
    latest = {("A", 0): 300, ("A", 1): 200, ("A", 2): 5}
    cut = off.limit_offsets(start, latest, 40)
    assert cut == {("A", 0): 30, ("A", 1): 110, ("A", 2): 5}
    assert off.limit_offsets(start, latest, 10_000) == latest


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
                       min_size=1), st.integers(1, 3000))
def test_limit_offsets_never_exceeds_the_limit_nor_the_latest(queues, limit):
    start = {("T", q): a for q, (a, _) in queues.items()}
    latest = {("T", q): a + n for q, (a, n) in queues.items()}
    cut = off.limit_offsets(start, latest, limit)
    taken = sum(cut[q] - start[q] for q in latest)
    assert taken == min(limit, sum(latest[q] - start[q] for q in latest))
    assert all(start[q] <= cut[q] <= latest[q] for q in latest)


# ------------------------------------------------------------------------------ endpoints
def test_endpoints_from_a_store_dir_a_socket_dir_and_tcp(tmp_path):
    store = tmp_path / "store"
    os.makedirs(store / "config")
    e = endpoints.resolve(f"ipc://{store}")
    assert e == (bus.endpoint(str(store), "ingest"), bus.endpoint(str(store), "reader"))
    assert endpoints.resolve("ipc:///x/run") == ("ipc:///x/run/ingest.sock",
                                                 "ipc:///x/run/reader.sock")
    assert endpoints.resolve("tcp://db1:10911") == ("tcp://db1:10911", "tcp://db1:10909")
    assert endpoints.resolve("tcp://db1:65535").reader == "tcp://db1:65533"
    for bad in ("db1:10911", "tcp://db1", "tcp://:1", "tcp://h:2", "tcp://h:65536",
                "http://h:1"):
        with pytest.raises(ValueError, match="endpoint"):
            endpoints.resolve(bad)


# ------------------------------------------------------------------------------ projection
def struct(ddl: str):
    """A StructType of "name type[ not null], ..." (our column types only: fromDDL needs
    a running session)."""
    from pyspark.sql import types as T
    kinds = {"int": T.IntegerType(), "long": T.LongType(), "string": T.StringType(),
             "binary": T.BinaryType(), "timestamp": T.TimestampType(),
             "array<string>": T.ArrayType(T.StringType()),
             "map<string,string>": T.MapType(T.StringType(), T.StringType())}
    fields = []
    for col in ddl.split(", "):
        name, kind = col.split(" ", 1)
        nullable = not kind.endswith(" not null")
        fields.append(T.StructField(name, kinds[kind.removesuffix(" not null")], nullable))
    return T.StructType(fields)


def test_a_user_schema_is_a_projection_checked_column_by_column():
    from rocketstore.spark.arrow_codec import SPARK_SCHEMA_DDL
    from rocketstore.spark.source import projection
    assert projection(struct(SPARK_SCHEMA_DDL)) is None
    assert projection(SPARK_SCHEMA_DDL) is None
    assert projection(struct("body binary, queue_offset long")) == ("body", "queue_offset")
    whole_reordered = ", ".join(reversed(SPARK_SCHEMA_DDL.split(", ")))
    assert projection(struct(whole_reordered))[0] == "store_timestamp"
    bad = [("partition int", "'partition' is not one of"),
           ("Body binary", "'Body' is not one of"),
           (SPARK_SCHEMA_DDL.replace("queue_id int", "queue_id long"), "'queue_id' is int"),
           ("queue_offset long not null", "'queue_offset' may be null")]
    for schema, words in bad:
        with pytest.raises(ValueError, match=words):
            projection(struct(schema))


@pytest.mark.parametrize("options, option", [
    ({"topic": "Orders", "startingOffsets": '{"orders": {"0": 5}}'}, "startingOffsets"),
    ({"topics": "A,B", "endingOffsets": '{"A": {"0": 1}, "C": {"0": 1}}'}, "endingOffsets"),
    ({"topicPattern": "Or.*", "startingOffsets": '{"Sales": {"0": 1}}'}, "startingOffsets"),
])
def test_offsets_for_a_topic_the_query_does_not_read_are_refused(options, option):
    """A misspelt topic in an offsets JSON left every queue at the default, silently."""
    from rocketstore.spark.source import _spec
    opts = parse({"store": "s", **options}, reading=True)
    text = options[option]
    with pytest.raises(ValueError, match=f"option {option}: topic"):
        _spec(opts, option, text, "earliest")
    fine = parse({"store": "s", "topic": "Orders"}, reading=True)
    assert _spec(fine, option, '{"Orders": {"3": 7}}', "earliest") == {("Orders", 3): 7}
