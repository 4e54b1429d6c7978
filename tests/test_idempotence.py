"""storage.idempotence on its own: one batch's verdicts, the answers it writes into the
results it is handed, and the ``Cover`` it returns per request.

The writer's requests are stood in for by keys with no attributes and no room for any
(``__slots__ = ()``): the module holds a request only as a key, so reading or setting
anything on one raises here. The end-to-end behaviour (SYNC_FLUSH waits, restarts) is
tests/test_idempotent_producer.py's.
"""

from __future__ import annotations

from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.idempotence import BatchClaims, Cover, admission
from rocketstore.storage.producer_state import ProducerEntry, ProducerStateTable
from rocketstore.storage.status import PutMessageStatus

PID = 7
T0 = 1_700_000_000_000
OK = PutMessageStatus.PUT_OK


class Request:
    """A writer's request as this module may see it: a key, nothing more."""
    __slots__ = ()


def table_with_sequence_4() -> ProducerStateTable:
    """Producer 7 stored sequence 4 before the batch: 100 bytes at 1000."""
    table = ProducerStateTable(expiration_ms=60_000)
    table.record(PID, ProducerEntry(4, T0, 1000, 100, 0, 4, "ID4"))
    return table


def judge_all(request, results, seqs, claims, waits) -> list[bool]:
    """``prepare_batch``'s part: admit each record in order, tell each one admitted."""
    admit, encoded = admission(request, results, [PID] * len(seqs), seqs, claims, waits)
    admitted = []
    for i in range(len(seqs)):
        admitted.append(admit(i, None))
        if admitted[-1]:
            encoded(i)
    return admitted


def stored(seq: int, offset: int, size: int) -> PutMessageResult:
    return PutMessageResult(OK, f"ID{seq}", offset, size, 0, seq, T0 + seq)


def test_answers_go_into_results_and_covers_come_back_per_request():
    table = table_with_sequence_4()
    claims = BatchClaims(table)
    first, second = Request(), Request()
    r1, r2 = [None] * 3, [None] * 3
    assert judge_all(first, r1, [5, 6, 8], claims, [False, False, False]) == [True, True, False]
    assert r1[2].status is PutMessageStatus.OUT_OF_ORDER_SEQUENCE and r1[2].queue_offset == 7
    # a duplicate of what was stored before (answered now), then two of this batch's
    assert judge_all(second, r2, [4, 6, 5], claims, [True, False, False]) == [False] * 3
    assert r2[0] == PutMessageResult(OK, "ID4", 1000, 100, 0, 4, T0,
                                     f"duplicate: producer {PID} sequence 4 is stored already")
    assert r2[1] is None and r2[2] is None            # they wait for the append
    r1[0], r1[1] = stored(5, 1100, 50), stored(6, 1150, 60)   # the append stored both
    covers = claims.settle()
    assert covers == {second: Cover(1210, True)}     # the latest original's end; one waits
    assert (r2[1].msg_id, r2[1].wrote_offset) == ("ID6", 1150) and r2[1].status is OK
    assert (r2[2].msg_id, r2[2].wrote_offset) == ("ID5", 1100)
    assert "was stored by this batch" in r2[1].reason
    assert table.get(PID).sequence == 6 and table.get(PID).msg_id == "ID6"


def test_a_duplicate_of_a_refused_original_is_refused_and_adds_no_cover():
    claims = BatchClaims(table_with_sequence_4())
    first, second = Request(), Request()
    r1, r2 = [None], [None]
    judge_all(first, r1, [5], claims, [False])
    judge_all(second, r2, [5], claims, [True])
    r1[0] = PutMessageResult.refused(PutMessageStatus.CREATE_MAPEDFILE_FAILED, "disk full")
    assert claims.settle() == {}
    assert r2[0].status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
    assert "neither copy was stored" in r2[0].reason
    assert claims.table.get(PID).sequence == 4        # nothing learnt


def test_a_dropped_request_leaves_no_claim_and_no_cover():
    claims = BatchClaims(table_with_sequence_4())
    failed, later = Request(), Request()
    judge_all(failed, [None, None], [4, 5], claims, [True, False])   # a duplicate, a claim
    claims.drop(failed)
    r = [None]
    assert judge_all(later, r, [5], claims, [False]) == [True]   # 5 is free again
    r[0] = stored(5, 1100, 50)
    assert claims.settle() == {}
    assert claims.table.get(PID).sequence == 5
