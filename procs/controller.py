"""The controller: this store's membership of its broker group, kept in ZooKeeper
(RocketMQ 5's controller mode, with ZooKeeper, through kazoo, in place of DLedger).

It runs in controller mode only (``enable_controller_mode``), one per store, and is
kept running when the supervisor restarts the other processes in another role (its
ZooKeeper session, and the master node with it, outlive the change). The nodes it
reads and writes are ``wire.group_nodes``'. Each turn:

1. **Membership.** Once per session it creates ``members/{broker_id}`` (ephemeral)
   with its addresses, role, end and epoch, and rewrites it every ``REPORT_MS`` when
   the end (WRITTEN) or role changed. A node left by its own earlier session (a
   restarted controller) is waited out: it goes when that session expires.
2. **Who is master.** Every ``READ_INTERVAL_MS`` it reads the master node
   (asynchronously: a turn never blocks on ZooKeeper).
   - It names this store, under this session: the lease is renewed
     (``procs.fencing``: MASTER_LEASE_MS = when the read was sent + a part of the
     session timeout), and a store still running as a SLAVE asks its supervisor for
     its master role (``procs.promotion.request``: the same restart as
     ``rocketstore promote``, the settings file left as it is).
   - It names another member: the lease is 0 (no PUT_OK here), the epoch is noted
     (``storage.epoch_file``, EPOCH), and a store not following that master asks to
     (``procs.promotion.request_follow``: the processes restart as its SLAVE; what
     only this store held is cut into ``quarantine/`` by the divergence rule,
     ``procs.replica``).
   - There is none: the lease is 0 and, once none has been seen for ``SETTLE_MS``
     (members report their last end meanwhile), it stands for election.
3. **Election.** Only a member of the in-sync set (``syncStateSet``) may stand,
   unless ``enable_elect_unclean_master`` (then it says so at ERROR and in status); a
   group without a set (never had a master) lets anyone stand. Of those standing and
   registered, the one with the greatest end (then the lowest ``broker_id``) tries: in
   one transaction it creates the master node and raises ``epoch`` (a version check:
   two members can never both raise it), and writes a new in-sync set of itself alone.
4. **The master keeps the in-sync set** (``SYNC_SET_INTERVAL_MS``): a slave is in it
   while its end is within ``ha_slave_fallbehind_max`` bytes of the master's and it
   caught up (its end reached what the master held ``CATCH_UP_SLACK_MS`` earlier)
   within ``ha_max_time_slave_not_catchup`` ms; a member gone from ZooKeeper is out.
5. **Planned hand-over** (``procs.handover``: the request node, its states and the
   invariant). It watches the ``handover`` node (a kazoo DataWatch, handed to the loop).
   As the master named ``from``, it accepts a request to a member of its in-sync set
   (else REFUSED), holds the lease at ``fencing.HANDING_OVER``, waits for its writer's
   next turn and writes FENCED with its end; ABORTED when the bound passes first. As
   the member named ``to``, once it holds that end it takes over in one transaction.

Sessions (PITFALLS): SUSPENDED (connection lost, session maybe alive) and LOST
(expired) end the lease at once, from kazoo's thread (a single slot store); a new
session registers again. A store whose controller cannot reach ZooKeeper answers no
PUT_OK: with ZooKeeper down no election can happen, and the group waits, refusing
puts (SERVICE_NOT_AVAILABLE, ``NOT_MASTER``), until it is back.

Restart decision table (``setup``):

    what             rebuilt from                       how
    ---------------  ---------------------------------  -------------------------------
    session          nothing                            a new one; the old one's nodes
                                                        go when it expires
    epoch            config/controllerEpoch.json        the highest noted
    lease            the next master read               0 until then
    what to follow   the master node                    asked again; the supervisor
                                                        ignores a request for the
                                                        master it follows
"""

from __future__ import annotations

import collections
import logging
import os
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch

from rocketstore.procs import fencing, handover, promotion
from rocketstore.procs.service import Service
from rocketstore.shm import bus
from rocketstore.shm.positions import (
    HEARTBEAT_MS, PositionTable, PositionTableError, Slot, StoreState, now_ms)
from rocketstore.storage import epoch_file
from rocketstore.storage.clock import monotonic_ms
from rocketstore.storage.config import BROKER_ROLES, StoreConfig
from rocketstore.wire import group_nodes as nodes

log = logging.getLogger(__name__)

READ_INTERVAL_MS = 250        # how often the master node is read (the lease's renewal)
REPORT_MS = 500               # how often this member's end is rewritten (when it moved)
SETTLE_MS = REPORT_MS + 2 * READ_INTERVAL_MS   # no master seen this long: stand (the
                                              # others have reported their last ends)
SYNC_SET_INTERVAL_MS = 1000   # how often the master reviews the in-sync set
CATCH_UP_SLACK_MS = 2 * REPORT_MS
TURN_S = 0.1


STAND, NOT_REGISTERED, NOT_IN_SYNC, OTHER_BETTER = "STAND", "NOT_REGISTERED", \
    "NOT_IN_SYNC", "OTHER_BETTER"


def stands(me: int, members: dict[int, dict], in_sync: list[int] | None,
           unclean_allowed: bool) -> str:
    """Whether member ``me`` stands for election, as a decision table:

        registered  in the set (or no set,   the greatest end among    verdict
                    or unclean allowed)      those eligible (then the
                                             lowest broker_id)
        ----------  -----------------------  ------------------------  --------------
        no          -                        -                         NOT_REGISTERED
        yes         no                       -                         NOT_IN_SYNC
        yes         yes                      no                        OTHER_BETTER
        yes         yes                      yes                       STAND

    ``members``: the registered members' documents by broker_id (``end`` each);
    ``in_sync``: the group's in-sync set, None when it never had one."""
    def eligible(broker_id: int) -> bool:
        return in_sync is None or broker_id in in_sync or unclean_allowed

    if me not in members:
        return NOT_REGISTERED
    if not eligible(me):
        return NOT_IN_SYNC
    best = max((b for b in members if eligible(b)),
               key=lambda b: (members[b].get("end", 0), -b))
    return STAND if best == me else OTHER_BETTER


def current_master(config: StoreConfig, timeout_s: float = 2.0) -> dict | None:
    """The group's master node when another member is master now (the supervisor's
    first start joins as its SLAVE at once, rather than starting as a master without
    the lease and restarting); None when this member is, none is, or ZooKeeper cannot
    be reached within ``timeout_s``."""
    zk = KazooClient(hosts=config.cluster_address, timeout=config.cluster_session_timeout_ms
                     / 1000)
    try:
        zk.start(timeout=timeout_s)
        data, _ = zk.get(nodes.master_path(config.broker_name))
    except (KazooException, KazooTimeoutError) as e:
        log.info("no master of %s found at start: %s", config.broker_name,
                 type(e).__name__)
        return None
    finally:
        zk.stop()
        zk.close()
    doc = nodes.decode(data)
    if doc.get("broker_id") == config.broker_id or not isinstance(doc.get("ha"), str):
        return None
    return doc


class ControllerService(Service):
    name = "controller"

    def setup(self) -> None:
        cfg = self.config
        self.group = cfg.broker_name
        self.me = cfg.broker_id
        self.session_timeout_ms = cfg.cluster_session_timeout_ms
        self.epoch = epoch_file.current(cfg.config_dir)
        self.table.set(Slot.EPOCH, self.epoch)
        host = cfg.tcp_listen_address
        self.addresses = {"ingest": f"tcp://{host}:{cfg.listen_port}",
                          "reader": f"tcp://{host}:{cfg.reader_port}",
                          "ha": f"{host}:{cfg.ha_listen_port}"}
        self.wake = threading.Event()
        self.session_id = None
        self.connected_ms = monotonic_ms()   # when ZooKeeper was last seen connected
        self.registered = False
        self.reported: dict = {}
        self.next_report = 0
        self.read = None              # the master read in flight, and when it was sent
        self.read_sent = 0
        self.next_read = 0
        self.master: dict | None = None
        self.followed: str | None = None   # the HA address this store was asked to follow
        self.absent_since: int | None = None
        self.said: set[str] = set()   # one-time log lines already written
        self.in_sync: list[int] = []
        self.members_seen: list[dict] = []    # the master's view, for status
        self.caught_up_ms: dict[int, int] = {}
        self.samples: collections.deque = collections.deque()   # (ms, WRITTEN), master
        self.next_sync_review = 0
        self.unclean = False
        self.fenced_until = 0         # no lease before (a slave showed a newer epoch)
        self.handover_node: tuple[dict, int] | None = None   # (document, version), watched
        self.handover_watch: DataWatch | None = None
        self.handing_over: dict | None = None    # this master's hand-over under way
        self.epoch_news = bus.Subscriber(self.context, self.store_dir, ["ha"],
                                         [fencing.NEWER_EPOCH])
        self.zk = KazooClient(hosts=cfg.cluster_address,
                              timeout=self.session_timeout_ms / 1000,
                              connection_retry={"max_tries": -1, "delay": 0.1,
                                                "max_delay": 1.0})
        self.zk.add_listener(self._state_changed)
        self.zk.start_async()
        self._publish_status()
        log.info("member %d of broker group %s at %s (epoch %d)", self.me, self.group,
                 cfg.cluster_address, self.epoch)

    def teardown(self) -> None:
        self.table.set(Slot.MASTER_LEASE_MS, 0)
        self.epoch_news.close()
        try:
            self.zk.stop()       # closes the session: its nodes go at once
            self.zk.close()
        except KazooException as e:
            log.warning("closing the ZooKeeper session: %s", e)

    def _state_changed(self, state: str) -> None:
        """kazoo's thread: never block here. SUSPENDED or LOST ends the lease now."""
        if state != KazooState.CONNECTED:
            try:
                self.table.set(Slot.MASTER_LEASE_MS, 0)
            except (TypeError, ValueError):   # the table being swapped (_follow_table):
                pass                          # the new one starts at 0
        self.wake.set()

    # ================================================================== the loop
    def turn(self) -> None:
        self._follow_table()
        self._hear_newer_epochs()
        if self.zk.connected:
            self.connected_ms = monotonic_ms()
            self._session()
            if self.registered:
                self._master_read()
                self._report()
                self._hand_over()
                if self._is_master():
                    self._review_in_sync_set()
        elif monotonic_ms() - self.connected_ms > self.session_timeout_ms:
            self._say("disconnected", logging.WARNING,
                      "ZooKeeper at %s not reachable: no PUT_OK until it is",
                      self.config.cluster_address)
        self._publish_status()
        self.wake.wait(TURN_S)
        self.wake.clear()

    def _hear_newer_epochs(self) -> None:
        """The HA process heard of a newer epoch than this store's: no lease for a
        session timeout from now (``procs.fencing``)."""
        for _, payload in self.epoch_news.wait(0):
            epoch = bus.decode_offset(payload)
            if epoch > self.epoch:
                if monotonic_ms() >= self.fenced_until:
                    log.error("a slave holds epoch %d, newer than this store's %d: no "
                              "lease until the group names its master", epoch, self.epoch)
                self.fenced_until = monotonic_ms() + self.session_timeout_ms
                self.table.set(Slot.MASTER_LEASE_MS, 0)

    def _follow_table(self) -> None:
        """After the supervisor restarted the other processes (a new role), write into
        the position table it made for them."""
        if self.table.get(Slot.STATE) != StoreState.STOPPED:
            return
        try:
            table = PositionTable.attach(self.store_dir, process=self.name)
        except PositionTableError:
            return
        if table.get(Slot.GENERATION) == self.table.get(Slot.GENERATION):
            table.close()
            return
        self.table.close()
        self.table = table
        table.set(Slot.EPOCH, self.epoch)
        self.next_read = 0

    def _session(self) -> None:
        session = self.zk.client_id[0] if self.zk.client_id else None
        if session != self.session_id:
            self.session_id = session
            self.registered = False
            self.read = None
            if self.handing_over is not None:       # the master node went with the session
                self._end_hand_over("its ZooKeeper session ended")
            self.said.discard("disconnected")
            log.info("ZooKeeper session %#x", session or 0)
        if not self.registered:
            self._register()

    def _register(self) -> None:
        g = self.group
        try:
            self.zk.ensure_path(nodes.members_path(g))
            self.zk.create(nodes.member_path(g, self.me), nodes.encode(self._member_doc()),
                           ephemeral=True)
        except NodeExistsError:
            self._say("registered", logging.WARNING,
                      "broker_id %d of %s is registered by another session (this "
                      "store's before a restart, or another store with the same id): "
                      "waiting for it to go", self.me, g)
            return
        except (KazooException, KazooTimeoutError) as e:
            log.warning("cannot register in ZooKeeper: %s", e)
            return
        self.registered = True
        self.said.discard("registered")
        log.info("registered as member %d of broker group %s", self.me, g)
        if self.handover_watch is None:         # kazoo keeps it across sessions
            self.handover_watch = DataWatch(self.zk, nodes.handover_path(g),
                                            self._handover_changed)

    def _member_doc(self) -> dict:
        return {"broker_id": self.me, **self.addresses, "role": self._role(),
                "end": self.table.read_written()[0], "epoch": self.epoch}

    def _report(self) -> None:
        now = monotonic_ms()
        if now < self.next_report:
            return
        self.next_report = now + REPORT_MS
        doc = self._member_doc()
        if doc != self.reported:
            self.zk.set_async(nodes.member_path(self.group, self.me), nodes.encode(doc))
            self.reported = doc

    def _role(self) -> str:
        return BROKER_ROLES[self.table.get(Slot.ROLE)]

    def _is_master(self) -> bool:
        return bool(self.master) and self.master.get("broker_id") == self.me and \
            self.table.get(Slot.MASTER_LEASE_MS) > monotonic_ms()

    # ================================================================== master node
    def _master_read(self) -> None:
        now = monotonic_ms()
        if self.read is None:
            if now >= self.next_read:
                self.read_sent = now
                self.read = self.zk.get_async(nodes.master_path(self.group))
                self.next_read = now + READ_INTERVAL_MS
            return
        if not self.read.ready():
            if now - self.read_sent > self.session_timeout_ms:
                self.read = None        # lost with its connection: ask again
            return
        read, sent, self.read = self.read, self.read_sent, None
        try:
            data, stat = read.get(timeout=0)
        except NoNodeError:
            self._no_master()
            return
        except (KazooException, KazooTimeoutError) as e:
            log.debug("master read failed: %s", e)
            return
        doc = nodes.decode(data)
        self.absent_since = None
        self.master = doc
        if doc.get("broker_id") == self.me and stat.ephemeralOwner == self.session_id:
            if self.handing_over is not None:
                lease = fencing.HANDING_OVER
            elif sent < self.fenced_until:
                lease = 0
            else:
                lease = fencing.lease_until(sent, self.session_timeout_ms)
            self.table.set(Slot.MASTER_LEASE_MS, lease)
            self._lead(doc)
        elif doc.get("broker_id") == self.me:     # an earlier session's: it expires soon
            self.table.set(Slot.MASTER_LEASE_MS, 0)
            self._say("old master node", logging.WARNING, "the master node of %s is this "
                      "member's earlier session's: waiting for it to expire", self.group)
        else:
            self.table.set(Slot.MASTER_LEASE_MS, 0)
            self._follow(doc)

    def _lead(self, doc: dict) -> None:
        """This store is the master: a SLAVE asks its supervisor for its master role."""
        if self._role() == "SLAVE" and not self._request_pending():
            log.warning("elected master of %s at epoch %s: taking the %s role", self.group,
                        doc.get("epoch"), self.config.broker_role)
            promotion.request(self.config.config_dir, self.config.broker_role)

    def _follow(self, doc: dict) -> None:
        """Another member is master: note its epoch, and follow it."""
        epoch, ha = doc.get("epoch"), doc.get("ha")
        if not isinstance(epoch, int) or not isinstance(ha, str):
            self._say("bad master", logging.ERROR, "the master node of %s holds %r: not "
                      "followed", self.group, doc)
            return
        self._note_epoch(epoch, doc.get("start", 0))
        following = self._role() == "SLAVE" and self.followed == ha
        if not following and not self._request_pending():
            log.warning("member %s is master of %s (epoch %d): following it at %s",
                        doc.get("broker_id"), self.group, epoch, ha)
            promotion.request_follow(self.config.config_dir, ha)
            self.followed = ha

    def _request_pending(self) -> bool:
        return os.path.exists(promotion.request_path(self.config.config_dir))

    def _note_epoch(self, epoch: int, start: int) -> None:
        if epoch > self.epoch:
            epoch_file.record(self.config.config_dir, epoch, start if isinstance(start, int)
                              else 0)
            self.epoch = epoch
            self.table.set(Slot.EPOCH, epoch)

    # ================================================================== election
    def _no_master(self) -> None:
        self.table.set(Slot.MASTER_LEASE_MS, 0)
        self.master = None
        now = monotonic_ms()
        if self.absent_since is None:
            self.absent_since = now
            log.warning("broker group %s has no master", self.group)
        if now - self.absent_since >= SETTLE_MS:
            try:
                self._stand()
            except (KazooException, KazooTimeoutError) as e:
                log.warning("election: %s", e)

    def _stand(self) -> None:
        """Try to become master, if this member may and is the best placed."""
        g, zk = self.group, self.zk
        members = self._members()
        sync, sync_stat = self._get(nodes.sync_state_set_path(g))
        in_sync = sync.get("members") if sync_stat is not None else None
        allowed = self.config.enable_elect_unclean_master
        verdict = stands(self.me, members, in_sync, allowed)
        if verdict == NOT_IN_SYNC:
            self._say("not in sync", logging.WARNING,
                      "not in the in-sync set %s of %s: not electable (an election needs a "
                      "member of it; enable_elect_unclean_master allows any)", in_sync, g)
        if verdict != STAND:
            return
        last, epoch_stat = self._get(nodes.epoch_path(g))
        epoch = max(last.get("epoch", 0) if epoch_stat else 0, self.epoch) + 1
        end = self.table.read_written()[0]
        master = {"broker_id": self.me, "epoch": epoch, "start": end, **self.addresses}
        tx = zk.transaction()
        tx.create(nodes.master_path(g), nodes.encode(master), ephemeral=True)
        election = nodes.encode({"epoch": epoch, "broker_id": self.me, "start": end})
        if epoch_stat is None:
            tx.create(nodes.epoch_path(g), election)
        else:
            tx.set_data(nodes.epoch_path(g), election, version=epoch_stat.version)
        new_set = nodes.encode({"epoch": epoch, "members": [self.me]})
        if sync_stat is None:
            tx.create(nodes.sync_state_set_path(g), new_set)
        else:
            tx.set_data(nodes.sync_state_set_path(g), new_set, version=sync_stat.version)
        if any(isinstance(r, Exception) for r in tx.commit()):
            return                          # another member was quicker
        self.unclean = in_sync is not None and self.me not in in_sync
        if self.unclean:
            log.error("elected master of %s at epoch %d OUT OF SYNC (in-sync set was %s; "
                      "enable_elect_unclean_master): messages acknowledged by the last "
                      "master and not copied here are lost", g, epoch, in_sync)
        else:
            log.warning("elected master of %s at epoch %d (end %d)", g, epoch, end)
        self._note_epoch(epoch, end)
        self.stats.add("controller_elections_total")
        self.in_sync, self.caught_up_ms = [self.me], {}
        self.samples.clear()
        self.next_read = 0

    def _members(self) -> dict[int, dict]:
        """The registered members' documents, by broker_id."""
        out = {}
        for child in self.zk.get_children(nodes.members_path(self.group)):
            doc, stat = self._get(nodes.member_path(self.group, int(child)))
            if stat is not None and isinstance(doc.get("broker_id"), int):
                out[doc["broker_id"]] = doc
        return out

    def _get(self, path: str):
        """``(document, stat)``; ``({}, None)`` when the node does not exist."""
        try:
            data, stat = self.zk.get(path)
        except NoNodeError:
            return {}, None
        return nodes.decode(data), stat

    # ================================================================== in-sync set
    def _review_in_sync_set(self) -> None:
        now = monotonic_ms()
        written = self.table.read_written()[0]
        self.samples.append((now, written))
        while len(self.samples) > 1 and self.samples[1][0] <= now - CATCH_UP_SLACK_MS:
            self.samples.popleft()
        if now < self.next_sync_review:
            return
        self.next_sync_review = now + SYNC_SET_INTERVAL_MS
        cfg = self.config
        try:
            members = self._members()
            reference = self.samples[0][1]       # what this master held a while ago
            in_sync = [self.me]
            for broker_id, doc in sorted(members.items()):
                if broker_id == self.me:
                    continue
                end = doc.get("end", 0)
                if end >= reference:
                    self.caught_up_ms[broker_id] = now
                since = self.caught_up_ms.get(broker_id)
                if since is not None and written - end < cfg.ha_slave_fallbehind_max and \
                        now - since < cfg.ha_max_time_slave_not_catchup:
                    in_sync.append(broker_id)
            self.members_seen = [
                {"broker_id": i, "role": d.get("role"), "end": d.get("end", 0),
                 "lag_bytes": max(0, written - d.get("end", 0)), "in_sync": i in in_sync}
                for i, d in sorted(members.items())]
            if in_sync != self.in_sync:
                log.info("in-sync set of %s: %s (was %s)", self.group, in_sync, self.in_sync)
                self.zk.set(nodes.sync_state_set_path(self.group),
                            nodes.encode({"epoch": self.epoch, "members": in_sync}))
                self.in_sync = in_sync
        except (KazooException, KazooTimeoutError) as e:
            log.warning("in-sync set not reviewed: %s", e)

    # ================================================================== hand-over
    def _handover_changed(self, data, stat, *_) -> None:
        """kazoo's thread (the DataWatch): note the request node, wake the loop."""
        self.handover_node = None if stat is None else (nodes.decode(data), stat.version)
        self.wake.set()

    def _hand_over(self) -> None:
        """This member's part in a planned hand-over (``procs.handover``), if any."""
        if self.handing_over is not None:
            self._keep_handing_over()
            return
        if self.handover_node is None:
            return
        doc, version = self.handover_node
        epoch = doc.get("epoch")
        try:
            if isinstance(epoch, int) and epoch < self.epoch:
                if self._is_master():       # stale: its master was replaced since
                    handover.withdraw(self.zk, self.group, version)
            elif epoch != self.epoch:
                return
            elif doc.get("from") == self.me and doc.get("state") == handover.REQUESTED:
                self._accept_hand_over(doc, version)
            elif doc.get("to") == self.me and doc.get("state") == handover.FENCED:
                self._take_over(doc, version)
        except (KazooException, KazooTimeoutError) as e:
            log.warning("hand-over: %s", e)

    def _accept_hand_over(self, doc: dict, version: int) -> None:
        """The master: refuse a request to a member outside its in-sync set; else take
        no more puts (the writer's reason says why) and wait for the writer's next turn
        (``_keep_handing_over``)."""
        if not self._is_master():
            return          # no lease now (not heard from ZooKeeper yet): asked again
        to = doc.get("to")
        if to == self.me or to not in self.in_sync:
            why = (f"member {to} is not in the in-sync set {self.in_sync} of member "
                   f"{self.me}, the master")
            log.warning("hand-over of %s refused: %s", self.group, why)
            self._write_request({**doc, "state": handover.REFUSED, "why": why}, version)
            return
        self.table.set(Slot.MASTER_LEASE_MS, fencing.HANDING_OVER)
        self.handing_over = {"to": to, "doc": doc, "version": version, "fenced": False,
                             "since": monotonic_ms(), "quiet_after": now_ms()}
        log.warning("handing broker group %s over to member %s: no more puts taken here",
                    self.group, to)

    def _keep_handing_over(self) -> None:
        """The master, handing over: FENCED once its writer turned since it stopped
        taking puts; ABORTED once the bound passed without a take-over; over when the
        node went (taken over, or withdrawn: the master read that follows says which)
        or was changed by another."""
        h = self.handing_over
        node = self.handover_node
        if node is None or node[1] > h["version"]:
            self._end_hand_over("the request was taken over or withdrawn")
            return
        if node[1] < h["version"]:
            return          # the watch has not caught up with this store's own write
        try:
            if not h["fenced"]:
                self._fence_when_quiet(h)
            elif monotonic_ms() - h["since"] > h["doc"].get("timeout_ms",
                                                            handover.DEFAULT_TIMEOUT_MS):
                self._abort_hand_over(h)
        except (KazooException, KazooTimeoutError) as e:
            log.warning("hand-over: %s (tried again)", e)

    def _fence_when_quiet(self, h: dict) -> None:
        """FENCED, with this store's CommitLog end, once the writer turned after the
        lease became HANDING_OVER (every put it accepted before is appended by then)."""
        beat = self.table.get_process("writer", HEARTBEAT_MS)
        if beat <= h["quiet_after"] and \
                monotonic_ms() - h["since"] < handover.WRITER_QUIET_MS:
            return
        end = self.table.read_written()[0]
        doc = {**h["doc"], "state": handover.FENCED, "end": end}
        version = self._write_request(doc, h["version"])
        if version is None:
            self._end_hand_over("the request was withdrawn")
            return
        h.update(doc=doc, version=version, fenced=True, since=monotonic_ms())
        log.warning("broker group %s: member %s to take over at CommitLog end %d",
                    self.group, h["to"], end)

    def _abort_hand_over(self, h: dict) -> None:
        doc = h["doc"]
        taker, _ = self._get(nodes.member_path(self.group, h["to"]))
        why = (f"member {h['to']} did not take over within {doc.get('timeout_ms')} ms of "
               f"member {self.me} stopping puts at CommitLog end {doc.get('end')} (it "
               + (f"reported end {taker['end']})" if "end" in taker else
                  "is not registered)"))
        if self._write_request({**doc, "state": handover.ABORTED, "why": why},
                               h["version"]) is None:
            self._end_hand_over("the request was taken over or withdrawn")
            return
        log.warning("hand-over of %s aborted, taking puts again: %s", self.group, why)
        self._end_hand_over("aborted")

    def _end_hand_over(self, why: str) -> None:
        """No lease until a master read sent from now on names this store (one sent
        before may predate a take-over)."""
        log.info("hand-over of %s over: %s", self.group, why)
        self.handing_over = None
        self.table.set(Slot.MASTER_LEASE_MS, 0)
        self.read = None
        self.next_read = 0

    def _write_request(self, doc: dict, version: int) -> int | None:
        """The request node rewritten if still at ``version``: its new version, else
        None."""
        from kazoo.exceptions import BadVersionError
        try:
            return self.zk.set(nodes.handover_path(self.group), nodes.encode(doc),
                               version=version).version
        except (BadVersionError, NoNodeError):
            return None

    def _take_over(self, doc: dict, version: int) -> None:
        """The member named ``to``: once it holds the master's end, in one transaction
        the request goes, the master node becomes its own, the epoch rises and the
        in-sync set is itself (an election's writes, conditional on the request and the
        master node being as they were)."""
        end = doc.get("end")
        if self._role() != "SLAVE" or not isinstance(end, int) or \
                self.table.read_written()[0] < end:
            return
        g, zk = self.group, self.zk
        master, master_stat = self._get(nodes.master_path(g))
        if master_stat is None or master.get("broker_id") != doc.get("from") or \
                master.get("epoch") != doc.get("epoch"):
            return
        last, epoch_stat = self._get(nodes.epoch_path(g))
        _, sync_stat = self._get(nodes.sync_state_set_path(g))
        epoch = max(last.get("epoch", 0) if epoch_stat else 0, self.epoch) + 1
        start = self.table.read_written()[0]
        tx = zk.transaction()
        tx.delete(nodes.handover_path(g), version=version)
        tx.delete(nodes.master_path(g), version=master_stat.version)
        tx.create(nodes.master_path(g), nodes.encode(
            {"broker_id": self.me, "epoch": epoch, "start": start, **self.addresses}),
            ephemeral=True)
        self._tx_write(tx, nodes.epoch_path(g), epoch_stat,
                       {"epoch": epoch, "broker_id": self.me, "start": start})
        self._tx_write(tx, nodes.sync_state_set_path(g), sync_stat,
                       {"epoch": epoch, "members": [self.me]})
        if any(isinstance(r, Exception) for r in tx.commit()):
            return              # aborted, withdrawn, or the group changed meanwhile
        log.warning("took broker group %s over from member %s at epoch %d (end %d): a "
                    "planned hand-over", g, doc.get("from"), epoch, start)
        self._note_epoch(epoch, start)
        self.stats.add("controller_elections_total")
        self.in_sync, self.caught_up_ms = [self.me], {}
        self.samples.clear()
        self.next_read = 0

    @staticmethod
    def _tx_write(tx, path: str, stat, doc: dict) -> None:
        if stat is None:
            tx.create(path, nodes.encode(doc))
        else:
            tx.set_data(path, nodes.encode(doc), version=stat.version)

    # ================================================================== status
    def _publish_status(self) -> None:
        self.stats.extra["controller"] = {
            "group": self.group, "broker_id": self.me, "cluster": self.config.cluster_address,
            "connected": bool(self.zk.connected), "registered": self.registered,
            "epoch": self.epoch,
            "master": None if not self.master else self.master.get("broker_id"),
            "lease_ms": max(0, self.table.get(Slot.MASTER_LEASE_MS) - monotonic_ms()),
            "in_sync": self.in_sync if self._is_master() else None,
            "members": self.members_seen if self._is_master() else None,
            "unclean": self.unclean,
            "handing_over_to": None if self.handing_over is None else self.handing_over["to"]}

    def _say(self, key: str, level: int, text: str, *args) -> None:
        """Log ``text`` once until ``key`` is forgotten."""
        if key not in self.said:
            self.said.add(key)
            log.log(level, text, *args)


SERVICE = ControllerService
