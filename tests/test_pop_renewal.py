"""procs.pop_service's auto-renewal of a PushConsumer's messages, on a store's files
(no store running: renewal reads no message, it moves in-flight entries' ends), and its
pause of dead letters while the writer does not take them (a store running)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from store_processes import RunningStore

from rocketstore.procs import pop_service
from rocketstore.procs.pop_service import AUTO_RENEW_INVISIBLE_MS, PopService
from rocketstore.shm.positions import PID
from rocketstore.storage.clock import now_ms
from rocketstore.storage import record_batch
from rocketstore.storage.config import StoreConfig
from rocketstore.storage.message import Message
from rocketstore.storage.message_view import view_at
from rocketstore.storage.pop_state import PopState, ReceiptHandle


@pytest.fixture
def pop(tmp_path):
    service = PopService(StoreConfig(store_path_root_dir=str(tmp_path)), None, "b")
    yield service
    service.close()


def handed_out(pop: PopService, unit, client: str, invisible_ms: int):
    """``unit`` handed out to ``client`` with auto-renewal, as ``receive`` records it."""
    entry = pop.state.group("T", "G").hand_out(unit, now_ms(), invisible_ms)
    pop._renewed[("T@G", unit)] = (client, entry.pop_time_ms)
    pop.seen(client)
    return entry


def test_a_message_due_soon_is_renewed_under_the_same_handle_and_survives_a_restart(pop, tmp_path):
    soon = handed_out(pop, (0, 1), "c1", 5_000)           # within RENEW_AHEAD_MS
    later = handed_out(pop, (0, 2), "c1", 50_000)         # not yet
    pop_time, later_end = soon.pop_time_ms, later.visible_at_ms
    pop.renew()
    assert soon.visible_at_ms >= now_ms() + AUTO_RENEW_INVISIBLE_MS - 1000
    assert soon.pop_time_ms == pop_time and later.visible_at_ms == later_end
    g = PopState(str(tmp_path / "config")).group("T", "G")     # committed
    assert g.inflight[(0, 1)].visible_at_ms == soon.visible_at_ms
    assert pop.ack("T", "G", ReceiptHandle(0, 1, pop_time, 5_000, 0, "b")) is True


def test_acked_nacked_and_unheard_of_messages_are_no_longer_renewed(pop, monkeypatch):
    acked = handed_out(pop, (0, 1), "c1", 5_000)
    nacked = handed_out(pop, (0, 2), "c1", 5_000)
    orphan = handed_out(pop, (0, 3), "c2", 5_000)
    pop.ack("T", "G", ReceiptHandle(0, 1, acked.pop_time_ms, 5_000, 0, "b"))
    pop.change_invisible("T", "G", ReceiptHandle(0, 2, nacked.pop_time_ms, 5_000, 0, "b"),
                         1_000)
    nacked_end = nacked.visible_at_ms
    pop._clients_seen["c2"] = time.monotonic() - pop_service.CLIENT_EXPIRY_S - 1
    orphan_end = orphan.visible_at_ms
    pop.renew()
    assert nacked.visible_at_ms == nacked_end and orphan.visible_at_ms == orphan_end
    assert pop._renewed == {}


def test_a_terminated_clients_messages_come_back_soon(pop):
    mine = handed_out(pop, (1, 0), "c1", AUTO_RENEW_INVISIBLE_MS)
    other = handed_out(pop, (1, 1), "c2", AUTO_RENEW_INVISIBLE_MS)
    other_end = other.visible_at_ms
    pop.client_terminated("c1")
    assert mine.visible_at_ms <= now_ms() + pop_service.TERMINATED_VISIBLE_MS
    assert other.visible_at_ms == other_end
    assert list(pop._renewed) == [("T@G", (1, 1))]



def test_a_dead_letter_the_store_does_not_take_pauses_dead_letters_instead_of_every_pop(
        tmp_path, monkeypatch, caplog):
    """The writer is stopped (SIGSTOP): the first dead letter waits out its send's timeout
    and fails; the ones after it, within DEAD_LETTER_BACKOFF_S, are not even tried (each
    would run under the lock every receive and ack takes); once the pause is over one is
    tried again."""
    monkeypatch.setattr(pop_service, "SEND_TIMEOUT_MS", 300)
    m = view_at(record_batch.encode_message(Message(topic="T", body=b"x"), now_ms()))
    with RunningStore(tmp_path) as store:
        table = store.table()
        writer = table.get_process("writer", PID)
        service = PopService(StoreConfig(store_path_root_dir=store.store_dir), table, "b")
        os.kill(writer, signal.SIGSTOP)
        try:
            with caplog.at_level("WARNING", logger=pop_service.__name__):
                assert service._dead_letter("T", "G", m) is False
                assert service._producer._producer is None  # the failed one was closed
                assert service._dead_letter("T", "G", m) is False
                assert service._producer._producer is None  # and no other was made
                assert len(caplog.records) == 1
                service._dead_letters_after = time.monotonic()   # the pause is over
                assert service._dead_letter("T", "G", m) is False
        finally:
            os.kill(writer, signal.SIGCONT)
            service.close()
            table.close()
    assert len(caplog.records) == 2 and "dead letters wait" in caplog.records[-1].getMessage()
