"""``put_path.PutResults``: a put's results as columns, each ``PutMessageResult`` made when
a caller takes it, the same object each time (a flush timeout written into one stays), and
read as the list of results it stands for (index, negative index, slice, iteration,
equality)."""

from __future__ import annotations

import pytest

from rocketstore.storage import Message, MessageStore, StoreConfig
from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.put_path import PutResults, stored_slots
from rocketstore.storage.status import PutMessageStatus


def _results() -> PutResults:
    return PutResults(4, 3, [100, 200, 300], [100, 100, 120], [0, 1, 0], [7, 3, 8], 1234,
                      "0A000001000026B5", "cannot create or write a commitlog file")


def test_a_stored_result_is_read_off_the_columns():
    r = _results()
    assert len(r) == 4
    assert r[1] == PutMessageResult(PutMessageStatus.PUT_OK, "0A000001000026B5" + f"{200:016X}",
                                    200, 100, 1, 3, 1234)
    assert r[-1].status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
    assert r[-1].reason == "cannot create or write a commitlog file"
    assert [x.wrote_offset for x in r[:3]] == [100, 200, 300]
    assert list(stored_slots(r)) == [0, 1, 2]
    with pytest.raises(IndexError):
        r[4]


def test_a_result_taken_twice_is_one_object_and_keeps_a_change():
    r = _results()
    r[0].status = PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert r[0] is r[0]
    assert r[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert [x.status.name for x in r] == ["FLUSH_DISK_TIMEOUT", "PUT_OK", "PUT_OK",
                                          "CREATE_MAPEDFILE_FAILED"]


def test_put_batch_answers_as_a_list_of_its_results(tmp_path):
    cfg = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log=1 << 20)
    with MessageStore(cfg, background=False) as store:
        msgs = [Message("TopicA", b"body %d" % i, tags="t", keys=[f"k{i}"], queue_id=i % 2)
                for i in range(40)]
        got = store.put_batch(msgs)
        assert len(got) == 40 and all(r.ok for r in got)
        assert list(got) == got and got == list(got)
        both = got + [store.put(msgs[0])]
        assert type(both) is list and len(both) == 41 and both[:40] == got
        front = [store.put(msgs[1])] + got
        assert type(front) is list and front[0].ok and front[1:] == list(got)
        assert [r.queue_offset for r in got[:4]] == [0, 0, 1, 1]
        for i in (0, 39):
            ext = store.look_message_by_offset(got[i].wrote_offset)
            assert ext.body == msgs[i].body
            assert ext.msg_id == got[i].msg_id
