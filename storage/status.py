"""Outcome enums, spelled exactly as RocketMQ's Java enums print.

``PutMessageStatus`` is what a put returns to its caller, ``AppendMessageStatus`` what
the append into a mapped file returned inside the CommitLog, ``GetMessageStatus`` what a
pull returns. Expected outcomes are statuses; faults are exceptions (``storage.errors``).

``PutMessageStatus.OUT_OF_ORDER_SEQUENCE`` is rocketstore's, not RocketMQ's (its name is
Kafka's): an idempotent producer's record whose sequence leaves a gap after the last one
the store holds (``storage.producer_state``). It is not stored.
"""

from __future__ import annotations

import enum


class PutMessageStatus(enum.Enum):
    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPEDFILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGECACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    OUT_OF_ORDER_SEQUENCE = 10

    @property
    def ok(self) -> bool:
        """True when the message is stored (a flush timeout still stored it)."""
        return self in _STORED


_STORED = {PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
           PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE}


class AppendMessageStatus(enum.Enum):
    PUT_OK = 0
    END_OF_FILE = 1
    MESSAGE_SIZE_EXCEEDED = 2
    PROPERTIES_SIZE_EXCEEDED = 3
    UNKNOWN_ERROR = 4


class GetMessageStatus(enum.Enum):
    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8
