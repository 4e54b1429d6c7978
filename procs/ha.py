"""The HA process: a master's CommitLog, streamed to its slaves (RocketMQ's HAService).

It runs on a master (ASYNC_MASTER or SYNC_MASTER) with ``ha_listen_port`` set. Slaves
connect DEALER sockets to its ROUTER at
``tcp://{tcp_listen_address or 127.0.0.1}:{ha_listen_port}`` and speak
``wire.ha_protocol``. For each slave (a *session*, opened by its HELLO):

1. HELLO is checked against this store's files: the same ``mapped_file_size_commit_log``
   (else FILE_SIZE_MISMATCH), an end inside what this store holds, and the slave's last
   bytes (``storage.replication.tail_check``) equal to its own there (else DIVERGED:
   the slave holds bytes this master does not, and cuts them itself, procs.replica; a
   SYNC_MASTER says SYNC_DIVERGED, and the slave keeps what it was sent, which this
   master may have acknowledged before a crash took its unflushed tail).
   A slave whose epoch (HELLO) is above this store's EPOCH was elected after this
   master, or follows one that was: it is refused (STALE_EPOCH), and so is an ERROR
   STALE_EPOCH from a slave that refused this master's DATA; either way this store
   stops taking puts (``_newer_epoch`` announces NEWER_EPOCH on the bus; the controller
   ends the lease, ``procs.fencing``). DATA carries this store's epoch (0 outside a
   broker group).
   An empty slave is sent everything from offset 0: a full copy, where RocketMQ starts
   a new slave at its master's last file. A slave end below MIN_OFFSET (those files
   expired here; an empty slave of a master whose file 0 expired, too) is
   OFFSET_UNAVAILABLE.
2. DATA frames carry the CommitLog from the slave's end up to what is readable here
   (WRITTEN; COMMITTED with the TransientStorePool, whose bytes past it are not in the
   files yet), at most ``ha_transfer_batch_size`` bytes each, never across a file's end
   (RocketMQ's CommitLog.getData), and at most ``WINDOW_BYTES`` past the slave's last
   report. A full send queue (ROUTER_MANDATORY's EAGAIN) pauses that slave's stream
   until the next turn; nothing is dropped unseen.
3. Each REPORT is the slave's ack: the bytes below it are stored there. An ack counts
   only for bytes the slave has shown it holds: what this session sent it, and below
   its HELLO's end only when its last bytes matched this store's there (a HELLO whose
   tail cannot be compared proves nothing, so a peer that merely claims an end cannot
   make a SYNC_MASTER acknowledge what no slave holds). SLAVE_ACKED
   (RocketMQ's push2SlaveMaxOffset) is the highest ack of any slave, never lowered,
   kept after the slave leaves; a rise is announced on the bus (``bus.SLAVE_ACKED``) so
   a SYNC_MASTER writer parked on it wakes. A REPORT past what this session was sent is
   refused (ACK_BEYOND_END) and the session dropped: an ack must mean bytes the slave
   was given.
4. A session not heard from for ``ha_housekeeping_interval`` ms is dropped; SLAVES
   counts the live ones. Every ``ha_send_heartbeat_interval`` ms a slave gets the
   configuration files it keeps as this master's when they changed (FILE: the delay
   scheduler's ``delayOffset.json``, as RocketMQ's SlaveSynchronize copies it). Every ``ha_send_heartbeat_interval`` ms without data a session
   gets an empty DATA (a heartbeat carrying this store's end, which the slave shows as
   its lag).

Garbage on the socket (no HA head, an unknown version or kind, a frame over
``MAX_INBOUND`` bytes, which ZeroMQ refuses by disconnecting) gets a named ERROR or a
disconnect; it never reaches the files. The sessions, with each slave's ack and lag,
are published for ``rocketstore status`` in this process's statistics (``ha``).

Restart decision table (``setup``):

    what               rebuilt from              how
    -----------------  ------------------------  ------------------------------------------
    sessions           nothing                   slaves time out (no frame for the
                                                 housekeeping interval), reconnect and say
                                                 HELLO; a REPORT without a session gets
                                                 NO_SESSION, which makes the slave say HELLO
    SLAVE_ACKED        the table                 kept: acks never go back
    SLAVES             live sessions             0 until slaves say HELLO again
    files              the directory             mapped read-only, refreshed as they come
"""

from __future__ import annotations

import logging
import os

import zmq

from rocketstore.wire import curve, endpoints, ha_protocol as hp
from rocketstore.procs import fencing
from rocketstore.procs.service import MAX_TURN_MS, Service
from rocketstore.shm import bus
from rocketstore.shm.positions import Slot, now_ms
from rocketstore.storage import epoch_file, replication
from rocketstore.storage.clock import monotonic_ms
from rocketstore.storage.commit_log import CommitLog

log = logging.getLogger(__name__)

WINDOW_BYTES = 16 * 1024 * 1024   # sent past a slave's last report, at most (or more:
                                  # two of the largest records, so that one always fits)
MAX_INBOUND = 64 * 1024           # a slave's frames are tiny; bigger ones disconnect it
BLOCKS_PER_TURN = 64              # blocks sent to one slave in one turn (turns stay short)
SNDHWM = 1000
STATUS_INTERVAL_MS = 250          # how often the sessions' table is refreshed for status


class _Session:
    """One slave, from its HELLO on."""

    __slots__ = ("peer", "address", "session", "start", "proven", "next", "acked",
                 "started_ms", "heard", "last_sent", "caught_up_ms", "files", "files_due")

    def __init__(self, peer: bytes, address: str, session: int, start: int, acked: int,
                 proven: bool):
        self.peer, self.address, self.session = peer, address, session
        self.start = start           # the slave's end at its HELLO
        self.proven = proven         # its bytes below ``start`` matched this store's
        self.next = start            # the next byte to send
        self.acked = acked           # the slave's last report
        self.started_ms = now_ms()
        self.heard = monotonic_ms()
        self.last_sent = 0
        self.caught_up_ms = now_ms()  # when its ack last reached this store's end
        self.files: dict[str, bytes] = {}   # the SYNCED_FILES it has, as sent
        self.files_due = 0

    @property
    def shown_acked(self) -> int:
        """The ack status shows: 0 while it rests on an end the slave did not prove."""
        return self.acked if self.proven or self.acked > self.start else 0


class HAService(Service):
    name = "ha"

    def setup(self) -> None:
        cfg = self.config
        self.file_size = cfg.mapped_file_size_commit_log
        self.commit_log = CommitLog(cfg, read_only=True)
        self.min_offset = self.table.get(Slot.MIN_OFFSET)
        self.commit_log.mapped_file_queue.refresh(self.min_offset)
        self.sessions: dict[bytes, _Session] = {}
        self.acked = self.table.get(Slot.SLAVE_ACKED)
        self.epoch_floor = epoch_file.current(cfg.config_dir) if cfg.enable_controller_mode \
            else 0
        self.pooled = bool(self.table.get(Slot.TRANSIENT_POOL))
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, SNDHWM)
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_INBOUND)
        self.address = endpoints.tcp_address(cfg.tcp_listen_address or "127.0.0.1",
                                             cfg.ha_listen_port)
        curve.bind_all(self.router, [self.address], self.curve_guard())
        self.publisher = bus.Publisher(self.context, self.store_dir, "ha")
        self.wakeups = bus.Subscriber(self.context, self.store_dir,
                                      ["writer", "flusher"], [bus.APPENDED, bus.COMMITTED])
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.wakeups.socket, zmq.POLLIN)
        self.more = False            # a turn stopped with bytes still to send
        self.window = max(WINDOW_BYTES, 2 * cfg.max_message_size + (1 << 20) +
                          cfg.ha_transfer_batch_size)
        self.next_status = 0
        log.info("HA listening on %s (acked %d)", self.address, self.acked)

    def teardown(self) -> None:
        self.router.close(0)
        self.wakeups.close()
        self.publisher.close()
        self.commit_log.close()

    # ================================================================== the loop
    def turn(self) -> None:
        events = dict(self.poller.poll(0 if self.more else self._timeout()))
        if self.wakeups.socket in events:
            self.wakeups.wait(0)
        if self.router in events:
            self._receive()
        end = self._readable()
        self.more = False
        for s in list(self.sessions.values()):
            self._stream(s, end)
        self._tend_sessions(end)

    def _timeout(self) -> int:
        if not self.sessions:
            return MAX_TURN_MS
        due = min(s.last_sent for s in self.sessions.values()) + \
            self.config.ha_send_heartbeat_interval
        return max(0, min(MAX_TURN_MS, due - monotonic_ms()))

    def _readable(self) -> int:
        """What the files hold: WRITTEN, or COMMITTED with the TransientStorePool."""
        if self.pooled:
            return self.table.get(Slot.COMMITTED)
        return self.table.read_written()[0]

    # ================================================================== inbound
    def _receive(self) -> None:
        while True:
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            peer = parts[0].bytes
            try:
                if len(parts) != 2:
                    raise hp.HAProtocolError(hp.HAError.MALFORMED,
                                             f"{len(parts) - 1} message parts, expected 1")
                frame = hp.decode(parts[1].buffer)
                if isinstance(frame, hp.Hello):
                    self._hello(peer, _address(parts[1]), frame)
                elif isinstance(frame, int):
                    self._report(peer, frame)
                elif isinstance(frame, hp.Probe):
                    self._probe(peer, frame)
                elif isinstance(frame, hp.Error):
                    log.warning("slave %s says %s: %s", peer.hex(), hp.error_name(frame.code),
                                frame.text)
                    if frame.code == hp.HAError.STALE_EPOCH:
                        self.sessions.pop(peer, None)
                        self._newer_epoch(self._epoch() + 1,
                                          f"slave {peer.hex()} refused this master's stream")
                else:
                    raise hp.HAProtocolError(hp.HAError.MALFORMED,
                                             "DATA and RANGE go to slaves")
            except hp.HAProtocolError as e:
                log.warning("HA frame from %s refused: %s", peer.hex(), e)
                self.stats.add("ha_refused_total", 1, error=e.code.name)
                self._send(peer, hp.encode_error(e.code, e.detail))

    def _hello(self, peer: bytes, address: str, hello: hp.Hello) -> None:
        """Open (or reopen) the session of ``peer`` at the slave's end, or refuse it."""
        self.sessions.pop(peer, None)
        start, proven = self._start_for(hello)
        s = self.sessions[peer] = _Session(peer, address, hello.session, start,
                                           hello.offset, proven)
        log.info("slave %s (%s) session %d: its end %d%s, streaming from %d", peer.hex(),
                 address, hello.session, hello.offset,
                 "" if proven else " (its last bytes not compared: no ack below it)", start)
        self.stats.add("ha_sessions_total")
        if proven:
            self._note_ack(s, s.acked)

    def _start_for(self, hello: hp.Hello) -> tuple[int, bool]:
        """Where a session starts, and whether the slave's bytes below it are shown to
        be this store's (at 0, or its last bytes matched). Raises ``HAProtocolError``
        when it cannot start."""
        mine = self._epoch()
        if hello.epoch > mine:
            self._newer_epoch(hello.epoch, f"a slave of epoch {hello.epoch} said HELLO")
            raise hp.HAProtocolError(
                hp.HAError.STALE_EPOCH,
                f"the slave's epoch {hello.epoch} is newer than this master's {mine}: "
                "another member was elected since; this store takes no more puts")
        if hello.file_size != self.file_size:
            raise hp.HAProtocolError(
                hp.HAError.FILE_SIZE_MISMATCH,
                f"the slave's mapped_file_size_commit_log is {hello.file_size}, the "
                f"master's {self.file_size}: the files could not be the same")
        first = self.table.get(Slot.MIN_OFFSET)
        if hello.offset == 0 and first > 0:
            raise hp.HAProtocolError(
                hp.HAError.OFFSET_UNAVAILABLE,
                f"the master's first file starts at {first} (the ones before expired): an "
                "empty slave can only follow a master that still has its file 0; copy the "
                "master's commitlog directory to the slave while both are stopped")
        end = self._readable()
        if hello.offset < first:
            raise hp.HAProtocolError(
                hp.HAError.OFFSET_UNAVAILABLE,
                f"the slave ends at {hello.offset}, below the master's first file "
                f"({first}): the bytes it needs are gone here; copy the master's "
                "commitlog directory to the slave while both are stopped")
        diverged = hp.HAError.SYNC_DIVERGED if self.config.broker_role == "SYNC_MASTER" \
            else hp.HAError.DIVERGED
        if hello.offset > end:
            raise hp.HAProtocolError(
                diverged,
                f"the slave ends at {hello.offset}, past the master's end {end}")
        try:
            mine = replication.tail_check(self.config.commit_log_dir, self.file_size,
                                          hello.offset)
        except (OSError, ValueError) as e:
            raise hp.HAProtocolError(hp.HAError.OFFSET_UNAVAILABLE,
                                     f"cannot read the bytes before {hello.offset}: {e}") \
                from None
        if hello.offset > 0 and not hello.tail_len and mine != (0, 0):
            raise hp.HAProtocolError(
                hp.HAError.MALFORMED,
                f"a HELLO at {hello.offset} without the check of its last bytes, where the "
                "master has bytes to compare: a slave that holds them has one")
        if hello.tail_len and mine != (0, 0) and mine != (hello.tail_len, hello.tail_crc):
            raise hp.HAProtocolError(
                diverged,
                f"the slave's {hello.tail_len} bytes before {hello.offset} differ from the "
                f"master's (master end {end})")
        proven = hello.offset == 0 or (hello.tail_len > 0 and
                                       mine == (hello.tail_len, hello.tail_crc))
        return hello.offset, proven

    def _epoch(self) -> int:
        """This store's group epoch: EPOCH, or the epoch file's while the controller has
        not set the slot of a table made since (a role switch starts a new one)."""
        return max(self.epoch_floor, self.table.get(Slot.EPOCH))

    def _newer_epoch(self, epoch: int, why: str) -> None:
        """Another member was elected after this store: the controller is told, and
        ends the lease (``procs.fencing``); reading the group, it makes this store a
        slave."""
        log.error("%s: epoch %d is newer than this master's %d; it takes no more puts",
                  why, epoch, self._epoch())
        self.publisher.publish(fencing.NEWER_EPOCH, bus.encode_offset(epoch))
        self.stats.add("ha_newer_epoch_total", 1)

    def _probe(self, peer: bytes, probe: hp.Probe) -> None:
        """A diverged slave comparing: this store's bytes at ``probe.offset``."""
        end = self._readable()
        if probe.offset < self.table.get(Slot.MIN_OFFSET):
            raise hp.HAProtocolError(hp.HAError.OFFSET_UNAVAILABLE,
                                     f"a probe at {probe.offset}, below the master's first "
                                     f"file ({self.table.get(Slot.MIN_OFFSET)})")
        limit = min(end, probe.offset + min(probe.length, hp.MAX_PROBE))
        block = self._block(probe.offset, limit) if limit > probe.offset else b""
        self._send(peer, hp.range_head(probe.session, probe.offset, end) + (block or b""))

    def _report(self, peer: bytes, offset: int) -> None:
        s = self.sessions.get(peer)
        if s is None:
            raise hp.HAProtocolError(hp.HAError.NO_SESSION,
                                     "no session: say HELLO (the master restarted?)")
        s.heard = monotonic_ms()
        if offset > s.next:
            del self.sessions[peer]
            raise hp.HAProtocolError(hp.HAError.ACK_BEYOND_END,
                                     f"a report of {offset} past what this session was "
                                     f"sent ({s.next}; the master's end {self._readable()})")
        if s.proven or offset > s.start:
            self._note_ack(s, offset)

    def _note_ack(self, s: _Session, offset: int) -> None:
        if offset >= s.acked:
            s.acked = offset
        if offset >= self._readable():
            s.caught_up_ms = now_ms()
        if offset > self.acked:
            self.acked = offset
            self.table.set(Slot.SLAVE_ACKED, offset)
            self.publisher.publish(bus.SLAVE_ACKED, bus.encode_offset(offset))

    # ================================================================== outbound
    def _stream(self, s: _Session, end: int) -> None:
        """Send ``s`` its next blocks, up to ``end``, the window and the turn's share."""
        batch = self.config.ha_transfer_batch_size
        for _ in range(BLOCKS_PER_TURN):
            if s.next >= end or s.next - s.acked >= self.window:
                return
            block = self._block(s.next, min(end, s.next + batch))
            if block is None:
                self._drop(s, hp.HAError.OFFSET_UNAVAILABLE,
                           f"the master's CommitLog has no file holding {s.next} any more")
                return
            if not self._send(s.peer, hp.data_head(s.session, s.next, end,
                                                   self._epoch()) + block):
                return
            s.next += len(block)
            s.last_sent = monotonic_ms()
            self.stats.add("ha_sent_bytes_total", len(block))
        self.more = True

    def _block(self, offset: int, limit: int):
        """The bytes from ``offset`` to ``limit`` or the end of their file (a view of the
        mapping); None when no file holds ``offset``."""
        mfq = self.commit_log.mapped_file_queue
        mf = mfq.find_mapped_file_by_offset(offset)
        if mf is None:
            mfq.refresh(self.table.get(Slot.MIN_OFFSET))
            mf = mfq.find_mapped_file_by_offset(offset)
            if mf is None:
                return None
        pos = offset - mf.file_from_offset
        return mf.buf[pos:min(limit - mf.file_from_offset, mf.file_size)]

    def _send(self, peer: bytes, frame) -> bool:
        """False when the peer's queue is full (try again next turn) or it is gone."""
        try:
            self.router.send_multipart([peer, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:
            if e.errno in (zmq.EAGAIN, zmq.EHOSTUNREACH):
                return False
            raise

    def _drop(self, s: _Session, code: hp.HAError, why: str) -> None:
        log.warning("slave %s (%s) dropped: %s: %s", s.peer.hex(), s.address, code.name, why)
        self._send(s.peer, hp.encode_error(code, why))
        self.sessions.pop(s.peer, None)

    def _tend_sessions(self, end: int) -> None:
        now = monotonic_ms()
        min_offset = self.table.get(Slot.MIN_OFFSET)
        if min_offset != self.min_offset:     # the cleaner deleted files: let them go
            self.min_offset = min_offset
            self.commit_log.mapped_file_queue.refresh(min_offset)
        quiet = self.config.ha_housekeeping_interval
        for s in list(self.sessions.values()):
            if now - s.heard > quiet:
                log.warning("slave %s (%s) silent for %d ms: session closed", s.peer.hex(),
                            s.address, now - s.heard)
                del self.sessions[s.peer]
            elif now - s.last_sent >= self.config.ha_send_heartbeat_interval:
                self._send(s.peer, hp.data_head(s.session, s.next, end, self._epoch()))
                s.last_sent = now     # sent or not (a full queue, a gone peer): no spin
            if now >= s.files_due:
                s.files_due = now + self.config.ha_send_heartbeat_interval
                self._send_files(s)
        if self.table.get(Slot.SLAVES) != len(self.sessions):
            self.table.set(Slot.SLAVES, len(self.sessions))
        if now >= self.next_status:
            self.next_status = now + STATUS_INTERVAL_MS
            self.stats.extra["ha"] = self.status(end)

    def _send_files(self, s: _Session) -> None:
        """The configuration files a slave keeps as its master's (``SYNCED_FILES``: the
        delay scheduler's offsets, so a promoted slave does not deliver again what this
        master delivered), when they changed since this session last got them."""
        for name in hp.SYNCED_FILES:
            try:
                with open(os.path.join(self.config.config_dir, name), "rb") as f:
                    content = f.read()
            except OSError:
                continue
            if s.files.get(name) != content and \
                    self._send(s.peer, hp.encode_file(name, content)):
                s.files[name] = content

    def status(self, end: int) -> dict:
        """The sessions as ``rocketstore status`` shows them."""
        now = now_ms()
        return {"listen": self.address, "slave_acked": self.acked, "slaves": [
            {"address": s.address, "session": s.session, "acked": s.shown_acked,
             "lag_bytes": max(0, end - s.shown_acked),
             "lag_ms": 0 if s.shown_acked >= end else now - s.caught_up_ms,
             "connected_ms": s.started_ms, "heard_ms_ago": monotonic_ms() - s.heard}
            for s in self.sessions.values()]}


def _address(frame: zmq.Frame) -> str:
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return "?"


SERVICE = HAService
