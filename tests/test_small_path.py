"""The one-message path writes what the batch path writes: ``CommitLog.append_small``
(records as a producer lays them out, stamped in the mapped file) leaves the same bytes,
offsets and queue offsets as ``append_batch``, across file ends too; and the embedded
store's put (``put_path.put_messages``: encode, check as the writer does, copy) leaves
the same CommitLog bytes as encoding message by message (``prepare_batch``)."""

from __future__ import annotations

import os

from rocketstore.storage import Message, StoreConfig
from rocketstore.storage import record_batch
from rocketstore.storage.commit_log import CommitLog
from rocketstore.storage.put_path import QueueSelector, prepare_batch, put_messages

NOW = 1_700_000_000_000


def _commit_log(path, file_size: int = 64 * 1024) -> CommitLog:
    cl = CommitLog(StoreConfig(store_path_root_dir=str(path),
                               mapped_file_size_commit_log=file_size))
    cl.load()
    cl.set_topic_queue_table({})
    return cl


def _bytes(cl: CommitLog) -> bytes:
    out = []
    for name in sorted(os.listdir(cl.config.commit_log_dir)):
        with open(os.path.join(cl.config.commit_log_dir, name), "rb") as f:
            out.append(f.read())
    return b"".join(out)


def _messages(n: int) -> list[Message]:
    return [Message(topic=("Orders", "Refunds")[i % 2], body=os.urandom(50 + i % 300),
                    tags=f"t{i % 3}" if i % 5 else None, keys=[f"k{i}"] if i % 4 else None,
                    properties={"seq": str(i)} if i % 2 else {}, queue_id=i % 3,
                    wait_store_msg_ok=bool(i % 7))
            for i in range(n)]


def test_append_small_leaves_what_append_batch_leaves_across_file_ends(tmp_path):
    msgs = _messages(300)
    small, batch = _commit_log(tmp_path / "small"), _commit_log(tmp_path / "batch")
    cfg = small.config
    for first in range(0, len(msgs), 3):              # frames of three, as senders make
        data, offsets = record_batch.encode_records(msgs[first:first + 3], NOW)
        run = record_batch.check_clean_run(data, offsets, cfg)
        assert run is not None
        a = small.append_small(data, run.starts, run.sizes, run.topics, run.queue_ids,
                               run.consumable, NOW + first)
        checked = record_batch.check_records(data, offsets, cfg)
        b = batch.append_batch(record_batch.from_checked(data, checked, checked.queue_ids),
                               checked.queue_ids, NOW + first)
        assert (a.count, list(a.physical_offsets), list(a.queue_offsets)) == \
            (b.count, list(b.physical_offsets), list(b.queue_offsets))
    assert len(os.listdir(cfg.commit_log_dir)) > 1     # files ended with a BLANK
    assert _bytes(small) == _bytes(batch)
    assert small.topic_queue_table == batch.topic_queue_table
    small.close()
    batch.close()


def test_the_embedded_put_leaves_what_message_by_message_encoding_leaves(tmp_path):
    msgs = _messages(200)
    new, old = _commit_log(tmp_path / "new"), _commit_log(tmp_path / "old")
    cfg = new.config
    verdicts: dict = {}
    for first, size in ((0, 1), (1, 2), (3, 40), (43, 157)):    # small and bulk checks
        part = msgs[first:first + size]
        got = put_messages(new, cfg, part, NOW, QueueSelector(8), verdicts)
        results: list = [None] * len(part)
        prepared = prepare_batch(old, cfg, part, NOW, QueueSelector(8), results)
        want = old.append(prepared.records, NOW)
        assert [(r.wrote_offset, r.wrote_bytes, r.queue_offset, r.msg_id) for r in got] == \
            [(r.wrote_offset, r.wrote_bytes, r.logics_offset, r.msg_id) for r in want]
    assert _bytes(new) == _bytes(old)
    new.close()
    old.close()


def test_a_message_the_fast_put_cannot_take_goes_the_long_way_with_its_answer(tmp_path):
    cl = _commit_log(tmp_path)
    msgs = [Message(topic="T", body=b"ok"), Message(topic="T", body=b"x", keys=["a b"]),
            Message(topic="T", body=b"x", queue_id=-1), Message(topic="T", body=b"late",
                                                                 delay_level=2)]
    got = put_messages(cl, cl.config, msgs, NOW, QueueSelector(8), {})
    assert [r.status.name for r in got] == ["PUT_OK", "MESSAGE_ILLEGAL", "MESSAGE_ILLEGAL",
                                            "PUT_OK"]
    assert "key" in got[1].reason and "queue id" in got[2].reason
    cl.close()
