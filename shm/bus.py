"""The notification bus: ZeroMQ PUB/SUB wake-ups between the store's processes.

Each announcing process binds one PUB socket, ``ipc://{run_dir}/bus-{process}.sock``;
listeners connect a SUB socket to the ones they care about. A message is one frame,
the topic (which ends with a NUL) and then the payload: one send for the publisher and
one receive for each listener (two frames cost the publisher several times one):

    topic             publisher    payload                       meaning
    ----------------  -----------  ----------------------------  ----------------------------
    b"appended\0"     writer       int64 WRITTEN                 new bytes in the CommitLog
    b"pages\0"        writer       int64 WRITTEN                 WRITTEN crossed a multiple
                                                                 of ``pages_span`` bytes (the
                                                                 flusher's least pages)
    b"flushed\0"      flusher      int64 FLUSHED                 new bytes are durable
    b"committed\0"    flusher      int64 COMMITTED               the commit step moved
                                                                 COMMITTED (transient pool)
    b"dispatched\0"   dispatcher   int64 DISPATCHED              consume queues grew
    b"slave_acked\0"  ha           int64 SLAVE_ACKED             a slave stored more (a
                                                                 SYNC_MASTER's writer waits)
    b"arrival/T\0"    dispatcher   topic, then each queue id     queues of topic T have new
                                   and its next offset           messages (``arrival_topic``):
                                   (``encode_arrival``)          one announcement a topic per
                                                                 dispatch step, however many
                                                                 of its queues grew

The dispatcher and the flusher are not woken through the bus when the supervisor made
the store's doorbells (``shm.doorbell``): a semaphore the writer (or, for the
dispatcher under SYNC_FLUSH or with the pool, the flusher) posts costs neither side a
ZeroMQ hop. The announcements still go out for the others (HA, the writer's parked
requests); PUB sends nothing where no one subscribed.

ZeroMQ filters by prefix, so a listener wakes only for what it asked:
``b"arrival"`` is every arrival, ``arrival_topic("Orders")`` only Orders' (the NUL ends
the name, so Orders2's do not match). A wake-up costs the woken process tens of
microseconds of CPU, which on a small machine is the producer's and the writer's.

The bus carries wake-ups, never data that must arrive: PUB drops when a subscriber is
slow, so every listener also wakes on its own interval and reads the position table (the
truth) when it wakes. Sockets are created in the process that uses them, after it
started (never before a fork).
"""

from __future__ import annotations

import hashlib
import os
import struct

import zmq

from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.shm.zmq_flags import EVENTS, NOBLOCK, POLLIN, backend

APPENDED = b"appended\0"
PAGES = b"pages\0"
FLUSHED = b"flushed\0"
COMMITTED = b"committed\0"     # the flusher's commit step moved COMMITTED (transient pool)
DISPATCHED = b"dispatched\0"
SLAVE_ACKED = b"slave_acked\0"
ARRIVAL = b"arrival"         # a subscription to every arrival (``arrival_topic`` names one)

_OFFSET = struct.Struct(">q")
_ARRIVAL_HEAD = struct.Struct(">H")
_ARRIVAL_QUEUE = struct.Struct(">iq")
_MAX_IPC_PATH = 100  # sun_path holds 108 bytes on Linux


def run_dir(store_dir: str, create: bool = True) -> str:
    """Where the store's sockets live: ``{store}/run`` (mode 0700), or a short private
    directory under /tmp when that path is too long for a Unix socket name. Made when
    missing unless ``create`` is false (a client's lookup, which leaves nothing behind
    where no store is)."""
    path = os.path.join(os.path.realpath(store_dir), "run")
    if len(path) + 24 > _MAX_IPC_PATH:
        digest = hashlib.sha1(path.encode()).hexdigest()[:16]
        path = f"/tmp/rocketstore-{digest}"
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def endpoint(store_dir: str, name: str, create: bool = True) -> str:
    """The address of the store's socket ``name``; ``create``: as ``run_dir``'s."""
    return f"ipc://{run_dir(store_dir, create)}/{name}.sock"


def encode_offset(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def decode_offset(payload: bytes) -> int:
    return _OFFSET.unpack(payload)[0]


def arrival_topic(topic: str) -> bytes:
    """The topic of an ARRIVAL of ``topic``, and the subscription to only those."""
    return ARRIVAL + b"/" + topic.encode() + b"\0"


def pages_span(least_pages: int) -> int:
    """Bytes between two PAGES announcements: ``least_pages`` OS pages (0: every append,
    announced as APPENDED)."""
    return least_pages * 4096


def flusher_wake_topic(sync_flush: bool, least_pages: int) -> bytes:
    """What wakes the flusher: GroupCommitService (``sync_flush``) every append;
    FlushRealTimeService only when enough pages may be dirty for its least-pages rule
    (PAGES), so an append of a few bytes does not cost a wake-up that would find nothing
    to flush. The writer rings the flusher's doorbell on the same rule."""
    return APPENDED if sync_flush or not pages_span(least_pages) else PAGES


def confirm_announcement(table: PositionTable) -> tuple[list[str], list[bytes]]:
    """Who announces the dispatcher's confirm offset's moves, and with what
    (``Subscriber``'s processes and topics): the flusher's FLUSHED under SYNC_FLUSH, its
    COMMITTED with the transient pool, else the writer's APPENDED (the store's mode is
    fixed before its processes start, as ``PositionTable.confirm_offset`` reads it). That
    process also rings the dispatcher's doorbell."""
    if table.get(Slot.FLUSH_DISK_TYPE) == 1:
        return ["flusher"], [FLUSHED]
    if table.get(Slot.TRANSIENT_POOL):
        return ["flusher"], [COMMITTED]
    return ["writer"], [APPENDED]


def encode_arrival(topic: str, queues: dict[int, int]) -> bytes:
    """The topic, then ``queue id -> next offset`` for each queue of it that grew."""
    raw = topic.encode()
    return b"".join([_ARRIVAL_HEAD.pack(len(raw)), raw,
                     *(_ARRIVAL_QUEUE.pack(q, offset) for q, offset in queues.items())])


def decode_arrival(payload: bytes) -> tuple[str, dict[int, int]]:
    (n,) = _ARRIVAL_HEAD.unpack_from(payload)
    topic = payload[2:2 + n].decode()
    return topic, dict(_ARRIVAL_QUEUE.iter_unpack(payload[2 + n:]))


class Publisher:
    """One process's announcements. Sends never block: a full subscriber drops."""

    def __init__(self, context: zmq.Context, store_dir: str, process: str):
        self.socket = context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 10_000)
        self.socket.bind(endpoint(store_dir, f"bus-{process}"))
        self._send = backend(self.socket).send

    def publish(self, topic: bytes, payload: bytes = b"") -> None:
        """``topic`` is one of this module's (it ends with a NUL)."""
        try:
            self._send(topic + payload, NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.socket.close(0)


class Subscriber:
    """Wake-ups from some processes' announcements."""

    def __init__(self, context: zmq.Context, store_dir: str, processes: list[str],
                 topics: list[bytes], conflate: bool = False):
        """``conflate``: keep only the newest announcement of each process (ZMQ_CONFLATE;
        publishers filter by topic, so it is the newest of those subscribed to), for a
        listener that only needs to know that something came."""
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        if conflate:
            self.socket.setsockopt(zmq.CONFLATE, 1)
        for topic in topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        for process in processes:
            self.socket.connect(endpoint(store_dir, f"bus-{process}"))
        self._poller = zmq.Poller()          # one for every wait
        self._poller.register(self.socket, zmq.POLLIN)
        raw = backend(self.socket)
        self._recv, self._option = raw.recv, raw.get

    def subscribe(self, topic: bytes) -> None:
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)

    def unsubscribe(self, topic: bytes) -> None:
        self.socket.setsockopt(zmq.UNSUBSCRIBE, topic)

    def wait(self, timeout_ms: int) -> list[tuple[bytes, bytes]]:
        """Messages that arrive within ``timeout_ms`` (all that are queued once one
        does); an empty list on timeout. After each message the socket's EVENTS says
        whether another is queued (cheaper than a receive that fails)."""
        if not self._poller.poll(max(0, timeout_ms)):
            return []
        out = []
        recv, option = self._recv, self._option
        while True:
            try:
                frame = recv(NOBLOCK)
            except zmq.Again:
                return out
            end = frame.find(b"\0") + 1
            out.append((frame[:end], frame[end:]))
            if not option(EVENTS) & POLLIN:
                return out

    def close(self) -> None:
        self.socket.close(0)
