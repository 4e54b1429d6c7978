"""The store's own producer inside the proxy's services: the dead letters of pop
consumption (``procs.pop_service``), a transaction's records
(``procs.transaction_service``). It is made at its first send; a send the writer did not
answer (``ClientError``: the writer away, or slower than the timeout) closes it, and the
next send makes a new one, so an answer that comes late reaches no later request."""

from __future__ import annotations

from typing import Sequence

from rocketstore.client.dealer import ClientError
from rocketstore.client.producer import Producer
from rocketstore.storage.message import Message
from rocketstore.wire.protocol import SendResult

__all__ = ["ClientError", "InternalProducer"]


class InternalProducer:
    def __init__(self, store_dir: str, timeout_ms: int):
        self.store_dir = store_dir
        self.timeout_ms = timeout_ms
        self._producer: Producer | None = None

    def send_batch(self, messages: Sequence[Message],
                   timeout_ms: int | None = None) -> list[SendResult]:
        """``Producer.send_batch``, waiting ``timeout_ms`` (by default the constructor's)
        for the answer. Raises ``ClientError`` when none came (the producer is closed
        then: the outcome is unknown)."""
        if self._producer is None:
            self._producer = Producer(self.store_dir, timeout_ms=self.timeout_ms)
        self._producer.timeout_ms = timeout_ms or self.timeout_ms
        try:
            return self._producer.send_batch(messages)
        except ClientError:
            self.close()
            raise

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
