"""``storage.producer_state``: the idempotent producers' table, its snapshot file and its
rebuild from the CommitLog, on real files (8 KiB CommitLog files, so a few dozen records
cross files). No processes here: records with an identity are appended straight
through ``CommitLog.prepare``/``append`` with the ``__PID``/``__SEQ`` properties the
writer would add (``tests/test_idempotent_producer.py`` runs the writer itself).

The rebuild decision table of the module docstring is run case by case against the
truth: the table a scan of the whole CommitLog gives.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import small_config
from rocketstore.storage import Message, PutMessageStatus
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.delay_level import restore_real_destination
from rocketstore.storage.errors import CorruptRecordError
from rocketstore.storage.message import (
    PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE, STOREHOSTADDRESS_V6_FLAG)
from rocketstore.storage.producer_state import (
    FIELDS, LastRecord, ProducerEntry, ProducerStateTable, Verdict, expected_sequence, judge,
    read_snapshot, rebuild, snapshot_path, write_snapshot)
from rocketstore.storage import producer_state
from rocketstore.storage.record import SCHEDULE_TOPIC, decode_at, find_property, properties_at
from rocketstore.storage.status import AppendMessageStatus
from rocketstore.storage.validation import check_message

DAY_MS = 86_400_000
T0 = 1_700_000_000_000


# ============================================================================ the rule
@pytest.mark.parametrize("last, sequence, verdict", [
    (None, 0, Verdict.NEW),            # unknown producer: starts at 0
    (None, 1, Verdict.OUT_OF_ORDER),   # unknown producer: anything else is a gap
    (None, 7, Verdict.OUT_OF_ORDER),
    (4, 5, Verdict.NEW),
    (4, 4, Verdict.DUPLICATE),
    (4, 0, Verdict.DUPLICATE),
    (4, 6, Verdict.OUT_OF_ORDER),
    (4, 1 << 63, Verdict.OUT_OF_ORDER),
    (0, 1, Verdict.NEW),
    (0, 0, Verdict.DUPLICATE),
])
def test_judge_is_the_documented_rule(last, sequence, verdict):
    assert judge(last, sequence) is verdict


def test_expected_sequence():
    assert expected_sequence(None) == 0 and expected_sequence(41) == 42


def entry(seq: int, ts: int = T0, offset: int = 0) -> ProducerEntry:
    return ProducerEntry(seq, ts, offset, 200, 1, seq, f"{offset:032X}")


def test_table_check_record_and_expire():
    t = ProducerStateTable(expiration_ms=1000)
    assert t.check(9, 0) is Verdict.NEW and t.check(9, 3) is Verdict.OUT_OF_ORDER
    assert not t.changed
    t.record(9, entry(0, ts=T0))
    t.record(10, entry(5, ts=T0 + 500))
    assert t.changed and len(t) == 2
    assert [t.check(9, s) for s in (0, 1, 2)] == [Verdict.DUPLICATE, Verdict.NEW,
                                                 Verdict.OUT_OF_ORDER]
    t.changed = False
    assert t.expire(T0 + 999) == 0 and not t.changed          # idle 999 ms: kept
    assert t.expire(T0 + 1000) == 1 and t.changed             # idle 1000 ms: forgotten
    assert t.get(9) is None and t.check(9, 1) is Verdict.OUT_OF_ORDER
    assert t.check(9, 0) is Verdict.NEW                        # ... and may start over
    assert t.last_sequence(10) == 5 and t.get(10).end == 200


# ============================================================================ the snapshot
def test_snapshot_round_trip_and_file_format(tmp_path):
    t = ProducerStateTable(DAY_MS)
    t.record(1, entry(3, offset=4000))
    t.record((1 << 64) - 1, entry((1 << 64) - 2, offset=4200))
    path = str(tmp_path / "config" / "producerState.json")
    write_snapshot(path, t, 4400, LastRecord(4200, T0))
    assert not t.changed
    text = open(path).read()
    assert "\n" not in text.strip()                       # one line: large tables stay small
    doc = json.loads(text)
    assert doc["fields"] == FIELDS and doc["version"] == 1
    assert (doc["commitLogOffset"], doc["lastRecordOffset"],
            doc["lastRecordStoreTimestamp"]) == (4400, 4200, T0)
    snap = read_snapshot(path, DAY_MS)
    assert (snap.offset, snap.last_record) == (4400, LastRecord(4200, T0))
    assert snap.table.producers == t.producers and not snap.table.changed
    write_snapshot(path, t, 4400, LastRecord(4200, T0))   # the previous one becomes .bak
    assert read_snapshot(path + ".bak", DAY_MS).offset == 4400


def test_an_empty_store_snapshot_has_no_last_record(tmp_path):
    path = str(tmp_path / "s.json")
    write_snapshot(path, ProducerStateTable(DAY_MS), 0, None)
    snap = read_snapshot(path, DAY_MS)
    assert (snap.offset, snap.last_record, len(snap.table)) == (0, None, 0)


GOOD = {"version": 1, "commitLogOffset": 500, "lastRecordOffset": 300,
        "lastRecordStoreTimestamp": T0, "fields": FIELDS,
        "producers": [[7, 2, T0, 300, 200, 0, 2, "AB"]]}


@pytest.mark.parametrize("change", [
    {"version": 2},
    {"fields": FIELDS[:-1]},
    {"commitLogOffset": -1},
    {"commitLogOffset": "500"},
    {"lastRecordOffset": 500},                  # a record cannot end where it starts
    {"lastRecordOffset": -1},                   # offset > 0 needs its last record
    {"commitLogOffset": 0},                     # offset 0 has no record below it
    {"producers": {"7": 2}},
    {"producers": [[0, 2, T0, 300, 200, 0, 2, "AB"]]},       # producer id 0
    {"producers": [[7, -1, T0, 300, 200, 0, 2, "AB"]]},      # negative sequence
    {"producers": [[7, 2, T0, 300, 200, 0, 2]]},             # a field short
    {"producers": [[7, True, T0, 300, 200, 0, 2, "AB"]]},    # a bool is not a number
    {"producers": [[7, 2, T0, 300, 200, 0, 2, 5]]},          # msg id not text
], ids=lambda c: json.dumps(c)[:40])
def test_a_malformed_snapshot_is_not_read(tmp_path, change):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**GOOD, **change}))
    assert read_snapshot(str(path), DAY_MS) is None
    path.write_text(json.dumps(GOOD))
    assert read_snapshot(str(path), DAY_MS).table.last_sequence(7) == 2


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", "\x00\x00"])
def test_an_unreadable_snapshot_is_not_read(tmp_path, text):
    path = tmp_path / "s.json"
    path.write_text(text)
    assert read_snapshot(str(path), DAY_MS) is None
    assert read_snapshot(str(tmp_path / "missing.json"), DAY_MS) is None


# ============================================================================ CommitLog
class Log:
    """A CommitLog in a temporary store, appended to as the writer would."""

    def __init__(self, root, **overrides):
        self.config = small_config(root, **overrides)
        self.cl = CommitLog(self.config)
        self.cl.load()
        self.truth: dict[int, int] = {}     # producer -> last sequence stored

    def put(self, items, ts: int = T0) -> list:
        """``items``: ``(producer_id, sequence)`` pairs, ``(0, 0)`` for a plain record."""
        batch = []
        for k, (pid, seq) in enumerate(items):
            props = {"color": "red"}
            if pid:
                props[PROPERTY_PRODUCER_ID] = str(pid)
                props[PROPERTY_PRODUCER_SEQUENCE] = str(seq)
                self.truth[pid] = seq
            m = Message(topic="TopicA", body=f"{pid}-{seq}-{k}".encode().ljust(60, b"."),
                        tags="T", properties=props, queue_id=pid % 3)
            batch.append(self.cl.prepare(m, m.queue_id, ts))
        results = self.cl.append(batch, ts)
        assert all(r.status is AppendMessageStatus.PUT_OK for r in results)
        return results

    @property
    def written(self) -> int:
        return self.cl.get_max_offset()

    def scan_all(self, now: int = T0) -> ProducerStateTable:
        t = ProducerStateTable(self.config.producer_id_expiration_ms)
        t.apply_commit_log(self.cl, 0, self.written, now)
        return t

    def close(self) -> None:
        self.cl.close()


@pytest.fixture
def log_(tmp_path):
    lg = Log(tmp_path / "store")
    yield lg
    lg.close()


def test_properties_at_finds_the_identity_the_writer_stamped(log_):
    r = log_.put([(77, 5)])[0]
    mf = log_.cl.mapped_file_queue.find_mapped_file_by_offset(r.wrote_offset)
    props = properties_at(mf.buf, r.wrote_offset - mf.file_from_offset)
    assert find_property(props, PROPERTY_PRODUCER_ID) == "77"
    assert find_property(props, PROPERTY_PRODUCER_SEQUENCE) == "5"
    assert find_property(props, "color") == "red" and find_property(props, "nope") is None


def test_a_scan_gives_each_producer_its_last_record(log_):
    results = log_.put([(1, 0), (0, 0), (2, 0), (1, 1)])
    results += log_.put([(1, 2), (0, 0)] * 1 + [(2, 1)])
    for i in range(100):                                     # across several 8 KiB files
        results += log_.put([(3, i), (0, 0)])
    assert len(log_.cl.mapped_file_queue.mapped_files) > 3
    t = ProducerStateTable(DAY_MS)
    last = t.apply_commit_log(log_.cl, 0, log_.written, T0)
    assert {pid: e.sequence for pid, e in t.producers.items()} == log_.truth == \
        {1: 2, 2: 1, 3: 99}
    final = results[-1]
    assert last == LastRecord(final.wrote_offset, T0)
    e = t.get(3)
    stored = log_.cl.look_message_by_offset(e.commit_log_offset)
    assert (e.size, e.queue_id, e.queue_offset, e.msg_id, e.store_timestamp) == \
        (stored.store_size, stored.queue_id, stored.queue_offset, stored.msg_id, T0)
    assert stored.properties[PROPERTY_PRODUCER_SEQUENCE] == "99"


def test_the_last_record_wins_when_a_producer_started_over(log_):
    log_.put([(5, 0), (5, 1), (5, 2)])
    log_.put([(5, 0)], ts=T0 + 10)                          # after its state expired
    assert log_.scan_all(T0 + 10).last_sequence(5) == 0


def test_a_record_whose_body_spells_the_marker_is_not_an_identity(log_):
    m = Message(topic="TopicA", body=b"__PID\x01123", queue_id=0)
    log_.cl.append([log_.cl.prepare(m, 0, T0)], T0)
    t = log_.scan_all()
    assert len(t) == 0


def test_a_delayed_record_is_remembered_in_the_queue_it_was_sent_to(log_):
    """A delayed message waits in SCHEDULE_TOPIC_XXXX, queue ``level - 1``; its
    producer entry names the queue it was sent to (REAL_QID), as the writer answered it
    and as a snapshot keeps it: a rebuild from the CommitLog named the schedule queue."""
    m = Message(topic="TopicA", body=b"later", queue_id=1, delay_level=3,
                properties={PROPERTY_PRODUCER_ID: "9", PROPERTY_PRODUCER_SEQUENCE: "0"})
    [r] = log_.cl.append([log_.cl.prepare(m, 1, T0)], T0)
    stored = log_.cl.look_message_by_offset(r.wrote_offset)
    assert stored.topic == SCHEDULE_TOPIC and stored.queue_id == 2
    e = log_.scan_all().get(9)
    assert (e.queue_id, e.queue_offset, e.commit_log_offset) == (1, r.logics_offset,
                                                                 r.wrote_offset)


def test_a_malformed_identity_is_ignored(log_):
    m = Message(topic="TopicA", body=b"x", queue_id=0,
                properties={PROPERTY_PRODUCER_ID: "12x", PROPERTY_PRODUCER_SEQUENCE: "1"})
    log_.cl.append([log_.cl.prepare(m, 0, T0)], T0)
    log_.put([(4, 0)])
    assert log_.scan_all().producers.keys() == {4}


def test_a_range_that_is_not_whole_records_raises(log_):
    r = log_.put([(1, 0), (1, 1)])
    t = ProducerStateTable(DAY_MS)
    with pytest.raises(CorruptRecordError) as e:
        t.apply_commit_log(log_.cl, r[0].wrote_offset + 10, log_.written, T0)
    assert "not a whole record" in str(e.value)
    with pytest.raises(CorruptRecordError):
        t.apply_commit_log(log_.cl, 0, log_.written + 8192 * 3, T0)


def test_files_without_identities_and_expired_files_are_not_walked(tmp_path, monkeypatch):
    lg = Log(tmp_path / "store", producer_id_expiration_ms=1000)
    try:
        nine = []
        for i in range(60):
            nine += lg.put([(9, i), (0, 0)], ts=T0)  # old: expired by T0 + 5000
        for i in range(60):
            lg.put([(0, 0), (0, 0)], ts=T0 + 4500)   # plain records only
        eight = lg.put([(8, 0)], ts=T0 + 4600)[0]
        for i in range(60):
            lg.put([(0, 0)], ts=T0 + 4700)           # the last files: plain again
        files = [mf.file_from_offset for mf in lg.cl.mapped_file_queue.mapped_files]
        holder = {r.wrote_offset // 8192 * 8192 for r in nine}
        plain_only = [f for f in files if f not in holder and f != eight.wrote_offset // 8192
                      * 8192 and f != files[-1]]
        assert len(holder) >= 3 and len(plain_only) >= 2
        walked = []
        real = ProducerStateTable._apply_file

        def spy(self, mf, pos, limit):
            walked.append(mf.file_from_offset)
            return real(self, mf, pos, limit)
        monkeypatch.setattr(ProducerStateTable, "_apply_file", spy)
        t = ProducerStateTable(1000)
        last = t.apply_commit_log(lg.cl, 0, lg.written, T0 + 5000)
        # of 9's files only the one where the newer records start is read (its
        # successor's first record is not expired); files of plain records are not read
        assert walked == sorted({max(holder), eight.wrote_offset // 8192 * 8192, files[-1]})
        assert last.store_timestamp == T0 + 4700
        t.expire(T0 + 5000)
        assert t.producers.keys() == {8}              # 9 would have expired anyway
    finally:
        lg.close()


# ============================================================================ rebuild
def _truth_after(lg: Log, now: int = T0) -> dict:
    t = lg.scan_all(now)
    t.expire(now)
    return t.producers


def _snapshot_now(lg: Log) -> tuple[int, LastRecord]:
    """Write the snapshot a writer would write now; returns its offset and last record."""
    t = lg.scan_all()
    written = lg.written
    last = t.apply_commit_log(lg.cl, 0, written, T0)   # for the last record only
    write_snapshot(snapshot_path(lg.config), t, written, last)
    return written, last


def _damage(path: str, **change) -> None:
    doc = json.load(open(path))
    doc.update(change)
    json.dump(doc, open(path, "w"))


CASES = ["missing", "valid", "valid_at_written", "past_written", "cut_and_rewritten",
         "fingerprint_time_differs", "malformed_main_valid_bak", "past_main_valid_bak"]


@pytest.mark.parametrize("case", CASES)
def test_rebuild_decision_table(tmp_path, case):
    lg = Log(tmp_path / "store")
    path = snapshot_path(lg.config)
    try:
        results = []
        for i in range(20):
            results += lg.put([(1, i), (0, 0), (2, i)])
        used, deleted = None, []
        if case != "missing":
            first, _ = _snapshot_now(lg)
        if case in ("malformed_main_valid_bak", "past_main_valid_bak"):
            for i in range(20, 25):
                lg.put([(1, i)])
            _snapshot_now(lg)                      # main; the first one is now .bak
            if case == "malformed_main_valid_bak":
                open(path, "w").write("{garbage")
            else:
                _damage(path, commitLogOffset=lg.written + 4096)
                deleted = [path]
            used = path + ".bak"
        elif case == "valid":
            used = path
        elif case == "valid_at_written":
            used = path
        elif case == "past_written":
            _damage(path, commitLogOffset=lg.written + 100)
            deleted = [path]
        elif case == "fingerprint_time_differs":
            _damage(path, lastRecordStoreTimestamp=T0 - 1)
            deleted = [path]
        elif case == "cut_and_rewritten":
            # a recovery cut below the snapshot, then other producers' records of the
            # same sizes: a record boundary lands on the snapshot's offset again
            lg.cl.mapped_file_queue.truncate_dirty_files(results[30].wrote_offset,
                                                         keep_files=True)
            for i in range(10, 20):
                lg.put([(4, i), (0, 0), (5, i)], ts=T0 + 5)
            assert lg.written == first                 # the same boundary...
            deleted = [path]                           # ... and still not trusted
        if case in ("valid", "malformed_main_valid_bak", "past_main_valid_bak",
                    "past_written", "fingerprint_time_differs"):
            for i in range(20, 40):
                lg.put([(1, i + 5), (3, i - 20)], ts=T0 + 1)
        got = rebuild(lg.config, lg.cl, lg.written, T0 + 2)
        assert got.table.producers == _truth_after(lg, T0 + 2)
        assert got.last_record is not None
        assert got.last_record.offset + lg.cl.look_message_by_offset(
            got.last_record.offset).store_size == lg.written
        if used is None:
            assert "no snapshot" in got.source and got.table.changed
        else:
            assert got.source.startswith(used + " (")
        for p in deleted:
            assert not os.path.exists(p)
        if case == "valid_at_written":
            assert not got.table.changed               # nothing new: no snapshot to write
    finally:
        lg.close()


def test_rebuild_of_an_empty_store(tmp_path):
    lg = Log(tmp_path / "store")
    try:
        got = rebuild(lg.config, lg.cl, 0, T0)
        assert (len(got.table), got.last_record) == (0, None)
        write_snapshot(snapshot_path(lg.config), got.table, 0, None)
        lg.put([(1, 0)])
        got = rebuild(lg.config, lg.cl, lg.written, T0)
        assert got.table.last_sequence(1) == 0 and got.source.endswith(f"[0, {lg.written})")
    finally:
        lg.close()


def test_rebuild_expires_idle_producers(tmp_path):
    lg = Log(tmp_path / "store", producer_id_expiration_ms=1000)
    try:
        lg.put([(1, 0), (1, 1)], ts=T0)
        lg.put([(2, 0)], ts=T0 + 900)
        got = rebuild(lg.config, lg.cl, lg.written, T0 + 1500)
        assert got.table.producers.keys() == {2}
    finally:
        lg.close()


def test_rebuild_starts_at_the_min_offset_when_the_snapshot_is_older(tmp_path):
    lg = Log(tmp_path / "store")
    try:
        lg.put([(1, 0)])
        _snapshot_now(lg)
        for i in range(1, 80):
            lg.put([(1, i), (0, 0)])
        mfq = lg.cl.mapped_file_queue
        first = mfq.mapped_files.pop(0)                 # the cleaner took the first file
        first.close()
        got = rebuild(lg.config, lg.cl, lg.written, T0)
        assert got.table.last_sequence(1) == 79
        assert f"[{mfq.get_min_offset()}, " in got.source
    finally:
        lg.close()


# ============================================================================ around it
def test_a_client_may_not_set_the_identity_properties(config):
    for name in (PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQUENCE):
        status, reason = check_message(Message(topic="T", body=b"x", properties={name: "1"}),
                                       config)
        assert status is PutMessageStatus.MESSAGE_ILLEGAL
        assert PROPERTY_PRODUCER_ID in reason and PROPERTY_PRODUCER_SEQUENCE in reason
    assert check_message(Message(topic="T", body=b"x", properties={"PID": "1"}), config) is None


def test_a_delivered_delayed_message_drops_the_identity(log_):
    m = Message(topic="Real", body=b"later", queue_id=2, delay_level=1, tags="T",
                properties={PROPERTY_PRODUCER_ID: "5", PROPERTY_PRODUCER_SEQUENCE: "0",
                            "color": "red"})
    r = log_.cl.append([log_.cl.prepare(m, 2, T0)], T0)[0]
    held = log_.cl.look_message_by_offset(r.wrote_offset)
    assert held.topic == "SCHEDULE_TOPIC_XXXX" and held.properties[PROPERTY_PRODUCER_ID] == "5"
    again = restore_real_destination(held)
    assert (again.topic, again.queue_id, again.tags) == ("Real", 2, "T")
    assert again.properties == {"color": "red"}
    assert check_message(again, log_.config) is None        # the re-put is not refused


def test_ipv6_store_host_gives_the_msg_id_of_the_record(tmp_path):
    lg = Log(tmp_path / "store", broker_ip1="::1")
    try:
        r = lg.put([(6, 0)])[0]
        e = lg.scan_all().get(6)
        assert e.msg_id == r.msg_id and len(e.msg_id) == 56
        flags = decode_at(lg.cl.get_message(r.wrote_offset, r.wrote_bytes), 0).sys_flag
        assert flags & STOREHOSTADDRESS_V6_FLAG
    finally:
        lg.close()


def test_module_constants():
    assert producer_state.SNAPSHOT_FILE == "producerState.json"
    assert producer_state._PID_MARK == b"__PID\x01"
