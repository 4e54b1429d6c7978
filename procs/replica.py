"""A SLAVE store's writer following its master's CommitLog (RocketMQ's HAClient).

On a slave the CommitLog still has exactly one appender, the writer process: instead of
producers' records it appends its master's bytes, verbatim, at the same offsets, so the
slave's files are byte-identical to the master's. Its ingest socket stays bound and
refuses every put with SERVICE_NOT_AVAILABLE (``storage.put_path``). Everything
downstream runs as on a master: the flusher syncs, the dispatcher builds the consume
queues and the index, readers and consumers read.

The follower (``Replica``) holds a DEALER socket to ``tcp://{ha_master_address}`` and
speaks ``wire.ha_protocol``:

1. HELLO opens a session: the slave's end (WRITTEN) and the crc32 of its last bytes
   (``storage.replication.tail_check``), so the master streams from exactly what this
   store holds and notices when it holds something else. Each HELLO has a new session
   number; DATA of an older session (frames already on the way) is dropped unseen.
   HELLO carries this store's EPOCH (its broker group's, 0 outside one); DATA of a
   master whose epoch is below it (a master replaced by a later election that does not
   know it yet) is refused: nothing appended, nothing reported, ERROR STALE_EPOCH sent
   (that master then stops taking puts, procs.ha), REPLICA_ERROR set, HELLO again after
   ``ha_housekeeping_interval`` ms. So a SYNC_MASTER cut off from its group can have
   none of its puts acknowledged by a slave that knows of the newer epoch.
2. DATA is appended (``CommitLog.append_verbatim``) when it continues the received end;
   anything else starts a new session from WRITTEN. After each drain the writer
   publishes WRITTEN up to the last record that arrived whole
   (``storage.replication.whole_records_end``: blocks are blind to message boundaries,
   WRITTEN promises whole records) with its store time, announces APPENDED (and PAGES)
   as a master's writer does, and REPORTs the new WRITTEN: the master's ack. Bytes of a
   record still incomplete sit in the mapping past WRITTEN; a restart cuts them
   (``CommitLog.reopen_at``) and asks for them again.
3. A REPORT every ``ha_send_heartbeat_interval`` ms keeps the session alive; no frame
   from the master for ``ha_housekeeping_interval`` ms closes the socket, opens a new
   one and says HELLO (a restarted master, a network that dropped everything).
4. A frame no master sends (the address is some other socket: a store's ingest or
   reader port, another slave) is not answered: REPLICA_ERROR is set (MALFORMED) and
   HELLO is tried again every ``ha_housekeeping_interval`` ms.
   ERROR from the master: NO_SESSION (a restarted master) says HELLO again; DIVERGED
   starts the search below; any other refusal (FILE_SIZE_MISMATCH, OFFSET_UNAVAILABLE,
   UNSUPPORTED_VERSION) is logged, set in the REPLICA_ERROR slot for ``rocketstore status``, and HELLO
   is tried again every ``ha_housekeeping_interval`` ms; nothing is appended meanwhile.
5. Divergence (the master lost an unflushed tail in a crash and wrote other messages
   there, or this slave runs past the master's end) is never mixed in. The follower
   PROBEs the master's bytes window by window (``PROBE_WINDOW``, within one file)
   backwards from its end until a window is the same on both sides; the first differing
   byte after it (or the master's end) is where they part. It cuts at the last record
   boundary at or before it (``storage.replication``): it asks the supervisor for the
   cut (``request_cut``), which stops the processes, moves the cut bytes to
   ``quarantine/``, recovers (consume queues and index follow the CommitLog) and starts
   them again; the new writer says HELLO from the common prefix. The cut is logged and
   listed in ``rocketstore status``. A slave that shares no record with the master (the
   wrong master, most likely) is never cut: it stays refused (DIVERGED) for an operator.
   Nor is a slave cut of bytes a SYNC_MASTER sent it (SYNC_DIVERGED; those from
   ``replication.followed_from`` on): the master may have acknowledged them on this
   slave's word and then lost them with its unflushed tail, so this slave may be the
   only store that holds them. It stays refused (SYNC_DIVERGED) for an operator, who
   promotes it (the old master then rejoins as its slave and cuts what only it held:
   its own bytes, written as a master) or empties it.

MASTER_END and MASTER_HEARD_MS (the master's end and when it last spoke) are what the
slave's status shows as its lag. FILE frames carry the master's ``delayOffset.json``,
kept in this store's ``config/``: a promoted slave's scheduler goes on from where the
master's was (at most one heartbeat interval behind: those few delayed messages may be
delivered twice, RocketMQ's at-least-once). Consumer offsets are not copied: a slave's
own consumer groups commit in its own ``consumerOffset.json``.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import zmq

from rocketstore.wire import curve, endpoints, ha_protocol as hp
from rocketstore.shm.positions import Slot, now_ms
from rocketstore.storage import epoch_file, json_file, replication
from rocketstore.storage.clock import monotonic_ms
from rocketstore.storage.errors import StoreFileError

log = logging.getLogger(__name__)

FRAMES_PER_TURN = 256        # DATA frames appended before WRITTEN is published (~8 MiB)
PROBE_WINDOW = hp.MAX_PROBE  # bytes compared per PROBE


class _Search:
    """A diverged slave looking, window by window backwards from its end, for where its
    CommitLog and its master's part."""

    __slots__ = ("end", "sync", "lo", "hi", "first_difference")

    def __init__(self, end: int, sync: bool = False):
        self.end = end                   # this slave's end when the search began
        self.sync = sync                 # the master is a SYNC_MASTER
        self.lo = self.hi = end          # the window being compared: [lo, hi)
        self.first_difference: int | None = None


class Replica:
    """The follower inside a SLAVE's writer (``writer`` is the WriterService)."""

    def __init__(self, writer):
        self.writer = writer
        cfg = writer.config
        host, port = cfg.ha_master_endpoint()
        self.address = endpoints.tcp_address(host, port)
        self.file_size = cfg.mapped_file_size_commit_log
        self.socket: zmq.Socket | None = None
        self.session = 0
        self.received = writer.table.read_written()[0]   # bytes held, whole or not
        self.retry_at = 0            # after a refusal: when to say HELLO again (0: not waiting)
        self.heard = monotonic_ms()
        self.next_report = 0
        self.search: _Search | None = None
        self.kept_end = -1           # the end at which a SYNC_DIVERGED cut was refused
        self.epoch_floor = epoch_file.current(cfg.config_dir) if cfg.enable_controller_mode \
            else 0                   # the slot's, until the controller sets a new table's
        writer.stats.extra["ha"] = {"master": self.address}
        self.connect()

    def close(self) -> None:
        if self.socket is not None:
            self.writer.poller.unregister(self.socket)
            self.socket.close(0)
            self.socket = None

    def connect(self) -> None:
        """A new socket to the master, and HELLO."""
        self.close()
        s = self.writer.context.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, hp.MAX_FRAME)
        cfg = self.writer.config
        curve.client_options(s, cfg.ha_master_server_key, cfg.curve_client_key)
        endpoints.allow_ipv6(s, self.address)
        s.connect(self.address)
        self.socket = s
        self.writer.poller.register(s, zmq.POLLIN)
        self.heard = monotonic_ms()
        self.hello()

    def hello(self) -> None:
        """Open a new session from WRITTEN (a partial record past it is cut first)."""
        w = self.writer
        written = w.table.read_written()[0]
        if self.received != written:
            w.reset_to_written()
            self.received = written
        n, crc = replication.tail_check(w.config.commit_log_dir, self.file_size, written)
        self.session = (self.session + 1) & 0xFFFFFFFF
        self._send(hp.encode_hello(self.session, self.file_size, written, n, crc,
                                   self.epoch()))
        self.next_report = monotonic_ms() + w.config.ha_send_heartbeat_interval
        self.retry_at = 0
        self.search = None

    # ================================================================== inbound
    def receive(self) -> None:
        """Drain the socket: append what continues the end, then publish and report."""
        appended = False
        for _ in range(FRAMES_PER_TURN):
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.heard = monotonic_ms()
            try:
                message = hp.decode(frame.buffer)
            except hp.HAProtocolError as e:
                self._not_a_master(f"a frame that is not HA: {e}", e.code)
                break
            if isinstance(message, hp.Data):
                appended = self._data(message) or appended
            elif isinstance(message, hp.Error):
                self._refused(message)
            elif isinstance(message, hp.Range):
                self._compare(message)
            elif isinstance(message, hp.File):
                self._keep_file(message)
            else:
                self._not_a_master(f"a {type(message).__name__.upper()}, which only a "
                                   "slave sends", hp.HAError.MALFORMED)
                break
        if appended:
            self._publish()

    def _data(self, d: hp.Data) -> bool:
        """Append one DATA frame; True when bytes were appended."""
        if d.session != self.session or self.retry_at:
            return False
        table = self.writer.table
        if d.epoch < self.epoch():
            self._stale(d.epoch, self.epoch())
            return False
        table.set(Slot.MASTER_END, d.master_end)
        table.set(Slot.MASTER_HEARD_MS, now_ms())
        self._note_caught_up(d.master_end)
        if table.get(Slot.REPLICA_ERROR):
            table.set(Slot.REPLICA_ERROR, 0)
        if not len(d.payload):
            return False
        if d.offset != self.received:
            log.warning("master sent %d, this slave holds up to %d: new session", d.offset,
                        self.received)
            self.hello()
            return False
        try:
            self.writer.commit_log.append_verbatim(d.offset, d.payload)
        except (ValueError, StoreFileError) as e:
            log.error("cannot append the master's bytes at %d: %s", d.offset, e)
            self._wait_and_retry()
            return False
        self.received += len(d.payload)
        self.writer.stats.add("ha_received_bytes_total", len(d.payload))
        return True

    def _publish(self) -> None:
        """WRITTEN up to the last whole record received; REPORT it."""
        w = self.writer
        written, ts = w.table.read_written()
        try:
            end, ts = self._whole_end(written, ts)
        except ValueError as e:
            log.error("the master's bytes are not records: %s; cut back to %d", e, written)
            self._wait_and_retry()
            return
        if end > written:     # LAST_STORE_TS never goes back (clocks of two hosts differ)
            w.publish_written(end, max(ts, w.table.read_written()[1]))
            self._note_caught_up(w.table.get(Slot.MASTER_END))
        self._send(hp.encode_report(end))
        self.next_report = monotonic_ms() + w.config.ha_send_heartbeat_interval

    def _keep_file(self, f: hp.File) -> None:
        """A configuration file of the master's (``SYNCED_FILES``), kept as it is."""
        try:
            doc = json.loads(f.content)
            if isinstance(doc, dict):
                json_file.persist(os.path.join(self.writer.config.config_dir, f.name), doc)
        except (ValueError, OSError) as e:
            log.warning("the master's %s not kept: %s", f.name, e)

    def _note_caught_up(self, master_end: int) -> None:
        """Remember when this slave last held all its master had (its lag in ms)."""
        if self.writer.table.read_written()[0] >= master_end:
            self.writer.stats.extra["ha"]["caught_up_ms"] = now_ms()

    def _whole_end(self, written: int, ts: int) -> tuple[int, int]:
        mfq = self.writer.commit_log.mapped_file_queue
        pos = written
        while pos < self.received:
            mf = mfq.find_mapped_file_by_offset(pos)
            if mf is None:
                break
            base = mf.file_from_offset
            limit = min(self.received - base, mf.file_size)
            end, ts = replication.whole_records_end(mf.buf, base, pos - base, limit, ts)
            if base + end == pos:
                break
            pos = base + end
        return pos, ts

    def epoch(self) -> int:
        """This store's group epoch (0 outside a broker group)."""
        return max(self.epoch_floor, self.writer.table.get(Slot.EPOCH))

    def _stale(self, theirs: int, mine: int) -> None:
        """The master streams at an older epoch than this store's: refused."""
        why = (f"the master's epoch {theirs} is older than this store's {mine}: another "
               "member was elected since; its stream is refused")
        log.error("the master at %s: %s (retrying in %d ms)", self.address, why,
                  self.writer.config.ha_housekeeping_interval)
        self._send(hp.encode_error(hp.HAError.STALE_EPOCH, why))
        self.writer.table.set(Slot.REPLICA_ERROR, hp.HAError.STALE_EPOCH)
        self._wait_and_retry()

    def _not_a_master(self, what: str, code: int) -> None:
        """The peer sent what no master sends: not answered (an error answered with an
        error would go on forever), set in REPLICA_ERROR, retried after the
        housekeeping interval."""
        log.error("the peer at %s sent %s: is ha_master_address its master's "
                  "ha_listen_port? (retrying in %d ms)", self.address, what,
                  self.writer.config.ha_housekeeping_interval)
        self.search = None
        self.writer.table.set(Slot.REPLICA_ERROR, code)
        self._wait_and_retry()

    def _refused(self, e: hp.Error) -> None:
        if e.code == hp.HAError.NO_SESSION:
            if self.search is None:    # a search needs no session: PROBEs go on
                self.hello()
            return
        diverged = e.code in (hp.HAError.DIVERGED, hp.HAError.SYNC_DIVERGED)
        if diverged and self.search is not None:
            return          # a second HELLO's answer (one queued while the master was away)
        if e.code == hp.HAError.SYNC_DIVERGED and self.received == self.kept_end:
            self._wait_and_retry()      # compared already at this end: not cut, said so
            return
        if diverged and not self.retry_at:
            log.warning("the master says this slave diverged (%s): comparing the two "
                        "CommitLogs backwards from %d", e.text, self.received)
            self.search = _Search(self.received, e.code == hp.HAError.SYNC_DIVERGED)
            self._probe_next()
            return
        self.search = None
        log.error("the master at %s refuses this slave: %s: %s", self.address,
                  hp.error_name(e.code), e.text)
        self.writer.table.set(Slot.REPLICA_ERROR, e.code)
        self._wait_and_retry()

    # ================================================================== divergence
    def _probe_next(self) -> None:
        """Ask for the master's bytes of the window before the last one compared. At
        this store's first file (0, or where its expired files ended) the search ends:
        they part at the first difference found (a cut at that file's start is
        refused by ``_found``: no common record can be shown)."""
        s = self.search
        hi = s.lo
        first = self._first_file()
        if hi <= first:
            self._found(first if s.first_difference is None else s.first_difference, s.end)
            return
        s.hi = hi
        s.lo = max(hi - PROBE_WINDOW, hi - ((hi - 1) % self.file_size + 1))
        self._send(hp.encode_probe(self.session, s.lo, s.hi - s.lo))

    def _compare(self, r: hp.Range) -> None:
        """One window compared: go on backwards while it differs."""
        s = self.search
        if s is None or r.session != self.session or r.offset != s.lo:
            return
        try:
            mine = np.frombuffer(replication.read_range(
                self.writer.config.commit_log_dir, self.file_size, s.lo, s.hi - s.lo),
                np.uint8)
        except FileNotFoundError:                  # expired here meanwhile
            self._found(self._first_file(), s.end)
            return
        theirs = np.frombuffer(r.payload, np.uint8)
        n = min(len(mine), len(theirs))
        differ = np.flatnonzero(mine[:n] != theirs[:n])
        if len(differ):
            s.first_difference = s.lo + int(differ[0])
        elif n < s.hi - s.lo:
            s.first_difference = s.lo + n          # one side ends inside the window
        elif mine.any():                           # the same records: they part later
            self._found(s.end if s.first_difference is None else s.first_difference,
                        r.master_end)
            return
        # zeros on both sides (a file's filler) prove nothing: look further back
        self._probe_next()

    def _first_file(self) -> int:
        """Where this store's oldest CommitLog file starts."""
        names = [n for n in os.listdir(self.writer.config.commit_log_dir) if n.isdigit()]
        return int(min(names)) if names else 0

    def _found(self, difference: int, master_end: int) -> None:
        """They part at ``difference``: ask for the cut at the record boundary there."""
        s, w = self.search, self.writer
        self.search = None
        if difference >= s.end:
            log.info("no byte differs from the master's up to %d: HELLO again", s.end)
            self.hello()
            return
        first = self._first_file()
        cut = first if difference <= first else replication.last_boundary_at_or_before(
            w.config.commit_log_dir, self.file_size, difference)
        if cut <= first:
            log.error("this slave's CommitLog shares no record with the master at %s (they "
                      "part at byte %d): not cut. Is it this slave's master? If so, empty "
                      "the slave's directory and start it again", self.address, difference)
            w.table.set(Slot.REPLICA_ERROR, hp.HAError.DIVERGED)
            self._wait_and_retry()
            return
        followed = replication.followed_from(w.config.config_dir)
        if s.sync and s.end > max(cut, 0 if followed is None else followed):
            log.error("this slave holds %d bytes its SYNC_MASTER at %s sent it and no "
                      "longer has (they part at %d; slave end %d, master end %d): the "
                      "master may have acknowledged them before a crash took its "
                      "unflushed tail. Not cut: promote this slave (rocketstore promote) "
                      "and bring the old master back as its slave; or, to keep the "
                      "master's history instead, empty this slave's directory",
                      s.end - cut, self.address, difference, s.end, master_end)
            w.table.set(Slot.REPLICA_ERROR, hp.HAError.SYNC_DIVERGED)
            self.kept_end = s.end
            self._wait_and_retry()
            return
        log.error("this slave's CommitLog parts from its master's at %d (slave end %d, "
                  "master end %d): cutting it back to %d; the cut bytes are kept in "
                  "quarantine/", difference, s.end, master_end, cut)
        replication.request_cut(w.config.config_dir, cut, slave_end=s.end,
                                first_difference=difference, master_end=master_end,
                                master=self.address)
        w.table.set(Slot.REPLICA_ERROR, hp.HAError.DIVERGED)
        self._wait_and_retry()      # the supervisor restarts the store with the cut

    def _wait_and_retry(self) -> None:
        self.retry_at = monotonic_ms() + self.writer.config.ha_housekeeping_interval

    # ================================================================== timers
    def tick(self) -> None:
        """Heartbeat reports, silence and retries (once per writer turn)."""
        now = monotonic_ms()
        cfg = self.writer.config
        if self.retry_at:
            if now >= self.retry_at:
                self.connect()
            return
        if now - self.heard > cfg.ha_housekeeping_interval:
            log.warning("no frame from the master at %s for %d ms: reconnecting",
                        self.address, now - self.heard)
            self.connect()
        elif now >= self.next_report and self.search is None:
            self._send(hp.encode_report(self.writer.table.read_written()[0]))
            self.next_report = now + cfg.ha_send_heartbeat_interval

    def _send(self, frame: bytes) -> None:
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            pass        # not connected yet, or the master reads nothing: the timers retry
