"""The arrival bells: how the dispatcher wakes the local consumers of a topic.

A ``Consumer`` reads the mapped files itself; all it needs from the dispatcher is to be
woken when its topic has something new. Through the bus (``shm.bus``) that wake is the
dispatcher's PUB send of ARRIVAL, its ZeroMQ I/O thread, the consumer's I/O thread, then
the consumer's poll: three threads to wake on the way, and one I/O thread per consumer.
A bell is a futex word (``shm.futex``) in a small shared memory segment beside the
position table, one word per topic bucket (``BUCKETS`` of them, a topic's bucket the
CRC-32 of its name): the dispatcher's wake reaches the waiting consumer's thread itself.

    dispatcher (after DISPATCHED is published)    consumer (``Consumer.poll``)
    ------------------------------------------    ------------------------------------
    ring(topics): each topic that grew: its       seen = bell(topic) BEFORE reading
    bucket's word + 1, then wake every waiter     DISPATCHED and the queues; nothing
    of that word (a hash lookup in the kernel     new: wait(topic, seen, ms) sleeps
    when nobody waits)                            only while the word is still ``seen``

No wake is lost: the dispatcher changes the word after DISPATCHED covers the messages,
and a consumer reads the word before it reads DISPATCHED, so either its read saw those
messages or the word is no longer what it read and its wait returns at once (the kernel
compares and sleeps atomically). That takes stores seen in the order they were made
and loads made in program order, which x86-64 gives plain moves (``shm.futex`` is
available there only). A dispatcher killed between DISPATCHED and its ring leaves
those topics unrung: its successor rings every bucket once at its start
(``ring_all``), and a waiting consumer looks at its queues then. Two topics in one bucket wake each other's consumers
now and then: a wake only wakes, the consumer looks at its queues and waits again. The
bell never says what arrived (the bus's ARRIVAL does, for the processes that need it:
the reader, the proxy); the position table and the queues are the truth.

Life: the supervisor creates the segment with the position table (``create``, replacing
a dead run's) and removes it with the table at a clean stop (``unlink``); the dispatcher
opens it to write, consumers to read (``ArrivalBells.open``: None where no supervisor
made one, or on a machine without futexes, and the consumer then listens to the bus). A
killed process holds nothing: a bell is a counter, not a lock. Its permissions are the
store's file mode (group readable), like the table's.
"""

from __future__ import annotations

import mmap
import os
import zlib

import numpy as np
import posix_ipc

from rocketstore.shm import futex
from rocketstore.shm.positions import create_segment, segment_name, unlink_segment

BUCKETS = 64                    # words; a topic's is crc32(name) % BUCKETS
SEGMENT_SIZE = BUCKETS * 4


def bells_name(store_dir: str) -> str:
    """The segment's name: the position table's and ``-arrivals``, so every process of
    one store finds the same one and two stores never share one."""
    return f"{segment_name(store_dir)}-arrivals"


def bucket(topic: str) -> int:
    return zlib.crc32(topic.encode()) % BUCKETS


def create(store_dir: str) -> None:
    """Supervisor only (it holds the store's lock): make the bells, every word 0,
    replacing a segment a dead run left."""
    create_segment(bells_name(store_dir), SEGMENT_SIZE).close_fd()


def unlink(store_dir: str) -> None:
    """Remove the bells (a clean stop, or before ``create``); nothing if none."""
    unlink_segment(bells_name(store_dir))


class ArrivalBells:
    """One process's mapping of a store's bells."""

    def __init__(self, mapped: mmap.mmap):
        self._map = mapped
        self._words = np.frombuffer(mapped, np.uint32, BUCKETS)
        self._base = self._words.ctypes.data

    @classmethod
    def open(cls, store_dir: str, writable: bool = False) -> "ArrivalBells | None":
        """The store's bells (the dispatcher opens them ``writable``), or None when no
        supervisor made them, they cannot be opened, or the machine has no futexes."""
        if not futex.AVAILABLE:
            return None
        try:
            memory = posix_ipc.SharedMemory(bells_name(store_dir), read_only=not writable)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
            return None
        try:
            if os.fstat(memory.fd).st_size < SEGMENT_SIZE:
                return None     # made but not sized yet: a supervisor still starting
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            return cls(mmap.mmap(memory.fd, SEGMENT_SIZE, prot=prot))
        finally:
            memory.close_fd()

    def bell(self, topic: str) -> int:
        """The word of ``topic``'s bucket now: read before looking for messages, then
        handed to ``wait``."""
        return int(self._words[bucket(topic)])

    def wait(self, topic: str, seen: int, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a ring of ``topic``'s bucket after ``seen`` was
        read; True when it rang (before the call, or during it) or was woken (``wake``),
        False on the timeout or a signal."""
        return futex.wait(self._base + 4 * bucket(topic), seen, max(0, timeout_ms))

    def wake(self, topic: str) -> None:
        """Wake whoever waits on ``topic``'s bucket without ringing it (a consumer
        closing wakes its own poll): they look at their queues, and wait again. Nothing
        once these bells are closed."""
        if self._words is not None:
            futex.wake(self._base + 4 * bucket(topic))

    def ring_all(self) -> None:
        """Dispatcher only, at its start: ring every bucket once. A predecessor killed
        between DISPATCHED and its ring left some unrung; the consumers then look."""
        self.ring_buckets(range(BUCKETS))

    def ring(self, topics) -> None:
        """Dispatcher only, after DISPATCHED covers what arrived: ring each topic's
        bucket once (``topics``: names, each rung once however often it is named)."""
        self.ring_buckets({bucket(t) for t in topics})

    def ring_buckets(self, buckets) -> None:
        words = self._words
        for b in buckets:
            words[b] = (int(words[b]) + 1) & 0xFFFF_FFFF     # wraps, as a futex word
            futex.wake(self._base + 4 * b)

    def close(self) -> None:
        self._words = None
        self._map.close()
