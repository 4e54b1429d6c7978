"""The consistency checker (fsck): every structure cross-checked against the CommitLog.

``check_store(store)`` returns a list of problems, empty when the store is consistent.
It reads everything and changes nothing. What it verifies:

1. CommitLog: every file follows the one before; every record from the first file to
   the written end is whole (magic, length, PHYSICALOFFSET, body CRC); a file that is
   not the last ends exactly at its size or with a BLANK; queue offsets of each
   (topic, queue) rise by exactly one in CommitLog order.
2. Consume queues: every unit from the queue's min offset points at the record that
   holds that (topic, queue, queue offset), with the right size and tagsCode; every
   dispatched NOT/COMMIT record is in its queue; the topic-queue table's next offset is
   the queue's max offset.
3. Index: every entry whose message still exists points at a record start and carries
   the hash of ``topic#key`` for one of that record's keys or its unique key; every
   dispatched, indexable record's keys are in the index.
4. Checkpoint: no timestamp lies in the future.
"""

from __future__ import annotations

import time

from rocketstore.storage import record
from rocketstore.storage.consume_queue import BLANK_UNIT_SIZE
from rocketstore.storage.hashing import index_key_hash
from rocketstore.storage.message import TRANSACTION_ROLLBACK_TYPE, is_consumable, transaction_value

MAX_PROBLEMS = 100
CLOCK_SKEW_MS = 60_000


class _Report(list):
    def add(self, text: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(text)


def check_store(store) -> list[str]:
    """The problems of ``store`` (a loaded ``MessageStore``, dispatched to its confirm
    offset), at most ``MAX_PROBLEMS`` of them; empty when it is consistent."""
    report = _Report()
    records = _check_commit_log(store, report)
    _check_consume_queues(store, records, report)
    if store.config.message_index_enable:
        _check_index(store, records, report)
    _check_checkpoint(store, report)
    return list(report)


def _check_commit_log(store, report: _Report) -> dict[int, record.DispatchRequest]:
    """Walk every record; returns them by CommitLog offset."""
    cl = store.commit_log
    files = cl.mapped_file_queue.mapped_files
    records: dict[int, record.DispatchRequest] = {}
    next_queue_offset: dict[tuple[str, int], int] = {}
    for i, mf in enumerate(files):
        if i and mf.file_from_offset != files[i - 1].file_from_offset + mf.file_size:
            report.add(f"{mf.path}: does not follow {files[i - 1].file_name}")
        last = i == len(files) - 1
        pos, end = 0, mf.wrote_position
        while pos < end:
            req = record.check_message_and_return_size(
                mf.buf, pos, end, mf.file_from_offset + pos, True, cl.delay_level_ms)
            if not req.success:
                report.add(f"{mf.path} at {pos}: bad record below the written position")
                break
            if req.msg_size == 0:
                pos = mf.file_size
                break
            _check_queue_order(mf.path, pos, req, next_queue_offset, report)
            records[req.commit_log_offset] = req
            pos += req.msg_size
        if not last and pos != mf.file_size:
            report.add(f"{mf.path}: ends at {pos}, neither full nor closed by a BLANK")
    for key, nxt in next_queue_offset.items():
        table = cl.topic_queue_table.get(key)
        if table is not None and table != nxt:
            report.add(f"topic-queue table says {key[0]}/{key[1]} continues at {table}, "
                       f"the commitlog at {nxt}")
    return records


def _check_queue_order(path: str, pos: int, req, next_queue_offset: dict, report: _Report) -> None:
    if not is_consumable(req.sys_flag):
        return
    key = (req.topic, req.queue_id)
    expected = next_queue_offset.get(key)
    if expected is not None and req.consume_queue_offset != expected:
        report.add(f"{path} at {pos}: {req.topic}/{req.queue_id} queue offset "
                   f"{req.consume_queue_offset}, expected {expected}")
    next_queue_offset[key] = req.consume_queue_offset + 1


def _check_consume_queues(store, records: dict, report: _Report) -> None:
    cl = store.commit_log
    min_phy = cl.get_min_offset()
    dispatched = store.reput_from_offset
    seen: set[int] = set()
    for cq in store.all_consume_queues():
        where = f"consumequeue/{cq.topic}/{cq.queue_id}"
        for index, phy, size, tags_code in cq.iter_units():
            if size == BLANK_UNIT_SIZE or phy < min_phy:
                continue
            req = records.get(phy)
            if req is None:
                report.add(f"{where} unit {index}: commitlog offset {phy} is not a record start")
                continue
            if not cq.is_unit_of(req, index, size, tags_code):
                report.add(f"{where} unit {index}: points at {req.topic}/{req.queue_id}@"
                           f"{req.consume_queue_offset} size {req.msg_size}, unit says size "
                           f"{size} tags {tags_code}")
            seen.add(phy)
        table = cl.topic_queue_table.get((cq.topic, cq.queue_id), 0)
        if table != cq.get_max_offset_in_queue():
            report.add(f"{where}: max offset {cq.get_max_offset_in_queue()}, topic-queue "
                       f"table {table}")
    for phy, req in records.items():
        if phy < dispatched and is_consumable(req.sys_flag) and phy not in seen:
            report.add(f"commitlog offset {phy} ({req.topic}/{req.queue_id}@"
                       f"{req.consume_queue_offset}) is in no consume queue")


def _keys_of(req) -> list[str]:
    keys = [k for k in (req.keys or "").split(" ") if k]
    if req.uniq_key:
        keys.append(req.uniq_key)
    return keys


def _check_index(store, records: dict, report: _Report) -> None:
    min_phy = store.commit_log.get_min_offset()
    entries: set[tuple[int, int]] = set()      # what queries reach
    cut_off: list[tuple[str, int, int, int]] = []
    for f in store.index_service.files:
        reached = f.reachable()
        for entry_no, key_hash, phy, _, _ in f.iter_entries():
            if phy < min_phy:
                continue
            if reached[entry_no]:
                entries.add((phy, key_hash))
            else:
                cut_off.append((f.file_name, entry_no, phy, key_hash))
            req = records.get(phy)
            if req is None:
                report.add(f"index {f.file_name} entry {entry_no}: offset {phy} is not a "
                           "record start")
            elif key_hash not in {index_key_hash(f"{req.topic}#{k}") for k in _keys_of(req)}:
                report.add(f"index {f.file_name} entry {entry_no}: hash {key_hash} is no key "
                           f"of the record at {phy}")
    # an entry cut off is harmless where another that queries reach says the same (a
    # kill in the middle of a put leaves one; the put is made again)
    for name, entry_no, phy, key_hash in cut_off:
        if (phy, key_hash) not in entries:
            report.add(f"index {name} entry {entry_no} (offset {phy}): no query reaches "
                       "it (its slot's chain does not lead there)")
    for phy, req in records.items():
        if phy >= store.reput_from_offset or \
                transaction_value(req.sys_flag) == TRANSACTION_ROLLBACK_TYPE:
            continue
        for key in _keys_of(req):
            if (phy, index_key_hash(f"{req.topic}#{key}")) not in entries:
                report.add(f"commitlog offset {phy}: key {key!r} is not indexed")


def _check_checkpoint(store, report: _Report) -> None:
    limit = time.time_ns() // 1_000_000 + CLOCK_SKEW_MS
    for name, value in store.checkpoint.to_dict().items():
        if value > limit:
            report.add(f"checkpoint {name}={value} lies in the future")
