"""A broker group's address, ``zk://host:port[,host:port...]/BROKER_NAME``: the store
its members elected master, found in ZooKeeper (``wire.group_nodes``), and followed
from one master to the next.

    Producer("zk://127.0.0.1:2181/broker-a", idempotent=True)
    ReaderClient("zk://127.0.0.1:2181/broker-a")

``client.group_lookup`` finds the master's sockets (``master``, ``endpoint``); when the
group has no master (an election under way, ZooKeeper unreachable) a client made from
the group's address raises ``NoStoreError`` at once.

A client made from the group's address talks through a ``GroupDealer``: a ``Dealer``
to the master's socket that looks the master up again and resends when the master it
talks to fails it, all within the request's ``timeout_ms``:

    the master it talks to                  a request that may be resent   one that may not
    --------------------------------------  -----------------------------  ----------------
    answers nothing within half the time    resent to the master found     RequestTimeout
    left, or its connection is lost         then                           or ConnectionLost
                                                                           at once; the
                                                                           next request
                                                                           looks first
    is not reached (nothing listens there)  resent to the master found     the same
    refuses every record of a put with      resent to the next master      the same
    SERVICE_NOT_AVAILABLE, nothing stored:
    ``NOT_MASTER`` (``procs.fencing``), a
    slave's refusal, or a store restarting
    in its new role (``NOT_MASTER_REASONS``)
    answers some records ``NOT_MASTER``     resent to the next master      the reply as it is
    after storing them (its lease ended)

A request may be resent when its sender passes ``resends``: an idempotent Producer's
puts (the new master holds every record the old one acknowledged and answers their
resends as duplicates, so each is stored once; it stores those the old one stored
without vouching for them) and every ReaderClient request (reads, and commits of the
same offsets). A plain Producer's put is resent only when the old master refused all
of it before storing anything. So a plain producer sees a message stored twice only
when it sends it again itself after a ``RequestTimeout`` or ``ConnectionLost``, or
after a SERVICE_NOT_AVAILABLE result that carries a CommitLog offset (stored by a
master that was no longer sure to be one; quarantined if the new master lacks it).

After such a refusal the dealer looks the master up again and resends, every
``FOLLOW_INTERVAL_S`` at most; when the time is up it returns the last refusal
(ZooKeeper down: the group refuses puts, ``procs.controller``).
"""
from __future__ import annotations

import itertools
import time
from typing import NamedTuple

from rocketstore.client.dealer import Dealer
from rocketstore.client.errors import (
    ClientError, ConnectionLost, NoStoreError, RequestTimeout, StoreUnreachableError)
from rocketstore.client.group_lookup import CONNECT_TIMEOUT_S, SCHEME, master
from rocketstore.client.reach import Target, locate
from rocketstore.storage.status import PutMessageStatus
from rocketstore.wire import protocol

FOLLOW_INTERVAL_S = 0.1    # between two looks for the next master
MIN_ATTEMPT_S = 0.5        # the shortest wait for an answer before looking again
# reasons of a put refused whole, nothing stored, by a member that is not the master:
# procs.fencing's, a slave's and a store restarting in its new role (storage.put_path)
NOT_MASTER_REASONS = ("NOT_MASTER", "a SLAVE store does not accept puts", "the store is ")
_REFUSALS = tuple(reason.encode() for reason in NOT_MASTER_REASONS)


def dealer(where: str, socket_name: str, timeout_ms: int, curve_server_key: str | None = None,
           curve_client_key: str | None = None) -> "Dealer | GroupDealer":
    """The request side of a client aimed at ``where``: a ``GroupDealer`` for a group's
    address, else a ``Dealer`` to the socket ``client.reach.locate`` finds."""
    if where.startswith(SCHEME):
        return GroupDealer(where, socket_name, timeout_ms, curve_server_key, curve_client_key)
    return Dealer(locate(where, socket_name), timeout_ms, curve_server_key, curve_client_key)


class _Sent(NamedTuple):
    """A request in flight through a ``GroupDealer``: its frame, whether it may be
    resent after a failure, and its deadline (monotonic seconds)."""

    frame: bytes
    resendable: bool
    deadline: float


class GroupDealer:
    """``Dealer``'s calls (``next_id``, ``send``, ``receive``, ``close``, ``target``) on
    a group's address, following its master (the module's table).

    Invariants: ``_sent`` holds every request sent and not yet returned or raised; each
    is pending on ``_dealer`` (the current master's), answered in ``_dealer.replies``,
    or ended with its error in ``_ended``.
    """

    def __init__(self, address: str, socket_name: str, timeout_ms: int,
                 curve_server_key: str | None = None, curve_client_key: str | None = None):
        self.address, self.socket_name, self.timeout_ms = address, socket_name, timeout_ms
        self._keys = (curve_server_key, curve_client_key)
        self._ids = itertools.count(1)
        self._sent: dict[int, _Sent] = {}
        self._ended: dict[int, ClientError] = {}
        self._stale = False     # a request that may not be resent failed: look again
        self._master = master(address)
        self._dealer = self._dealer_to(self._master)

    @property
    def target(self) -> Target:
        return self._dealer.target

    def _dealer_to(self, node: dict) -> Dealer:
        found = node.get(self.socket_name)
        if not isinstance(found, str):
            raise NoStoreError(f"the master node of {self.address} names no "
                               f"{self.socket_name} socket")
        return Dealer(Target(found), self.timeout_ms, *self._keys)

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: bytes, request_id: int, resends: int = 0) -> None:
        """Send ``request_id`` to the master; with ``resends`` it may be resent to the
        next one (the module's table). A master found unreachable is left to
        ``receive``: nothing reached it."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        if self._stale:
            self._stale = False
            self._follow(deadline, refused=False)
        self._sent[request_id] = _Sent(frame, resends > 0, deadline)
        try:
            self._dealer.send(frame, request_id)
        except StoreUnreachableError:
            pass        # the next wait raises it again, and follows

    def request(self, frame: bytes, request_id: int) -> bytes:
        """``send`` then ``receive`` (``Dealer.request``'s caller: nothing else in
        flight); what each does, as they do it."""
        self.send(frame, request_id)
        return self.receive(request_id)

    def receive(self, request_id: int) -> bytes:
        """The reply to ``request_id``, from whichever master answered it."""
        sent = self._sent[request_id]
        try:
            while True:
                if request_id in self._ended:
                    raise self._ended.pop(request_id)
                left = sent.deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(f"no answer to request {request_id} from the "
                                         f"masters of {self.address} within "
                                         f"{self.timeout_ms} ms; its outcome is unknown")
                wait = max(left / 2, MIN_ATTEMPT_S) if sent.resendable else left
                self._dealer.timeout_ms = max(1, int(min(wait, left) * 1000))
                try:
                    reply = self._dealer.receive(request_id)
                except StoreUnreachableError:     # nothing reached it: resent
                    self._follow(sent.deadline, refused=False, also=request_id)
                    continue
                except RequestTimeout:
                    if not sent.resendable:
                        self._stale = True        # the next request looks first
                        raise
                    self._follow(sent.deadline, refused=False)
                    continue
                if self.socket_name != "ingest" or not _not_master(reply, sent.resendable):
                    return reply
                if not self._follow(sent.deadline, refused=True, also=request_id):
                    return reply        # no other master in time: the refusal stands
        finally:
            self._sent.pop(request_id, None)

    def _follow(self, deadline: float, refused: bool, also: int | None = None) -> bool:
        """Talk to the group's master from now on, looked up again (after
        ``FOLLOW_INTERVAL_S`` when it is the same one: a dead master stays named until
        its session expires, a refusing one may get its lease back). The same master
        after a refusal: ``also`` is resent to it. Else a new connection (a process of
        the same master may have restarted): requests in flight to the old one (and
        ``also``, which nothing reached or which was refused before being stored) are
        resent to the new one when they may be, else ended (``ConnectionLost``). False
        when no master was found by ``deadline``."""
        old = self._master
        while True:
            try:
                node = master(self.address, min(CONNECT_TIMEOUT_S,
                                                max(0.1, deadline - time.monotonic())))
                same = (node.get(self.socket_name), node.get("epoch")) == \
                    (old.get(self.socket_name), old.get("epoch"))
                if same:
                    time.sleep(FOLLOW_INTERVAL_S)
                break
            except NoStoreError:
                pass
            if time.monotonic() + FOLLOW_INTERVAL_S >= deadline:
                return False
            time.sleep(FOLLOW_INTERVAL_S)
        if same and refused:
            self._resend(also, self._sent[also])
            return True
        answered = self._dealer.replies
        self._dealer.close()
        self._master, self._dealer = node, self._dealer_to(node)
        self._dealer.replies.update(answered)
        for request_id, sent in self._sent.items():
            if request_id in answered or request_id in self._ended:
                continue
            if sent.resendable or request_id == also:
                self._resend(request_id, sent)
            else:
                self._ended[request_id] = _lost(request_id, old)
        return True

    def _resend(self, request_id: int, sent: _Sent) -> None:
        try:
            self._dealer.send(sent.frame, request_id)
        except StoreUnreachableError:
            pass        # the next wait raises it again, and follows

    def close(self) -> None:
        self._dealer.close()


def _lost(request_id: int, node: dict) -> ClientError:
    return ConnectionLost(f"request {request_id} was in flight to {node.get('ingest')}, "
                          "the group's master then, when it failed; its outcome is unknown")


def _not_master(reply: bytes, resendable: bool) -> bool:
    """A put reply to resend to the next master: every record refused as by a member
    that is not the master, nothing stored, or (``resendable``) any record so
    answered (``NOT_MASTER`` after being stored, too)."""
    if not any(reason in reply for reason in _REFUSALS):
        return False        # no such reason anywhere in the frame (a search in C)
    kind = protocol.peek_header(reply).kind
    if kind is protocol.Kind.SEND_RECORDS_REPLY:
        results = protocol.decode_send_records_reply(reply)[1]
    elif kind is protocol.Kind.SEND_REPLY:
        results = protocol.decode_send_reply(reply)[1]
    else:
        return False
    refused = [r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and
               r.reason.startswith(NOT_MASTER_REASONS) for r in results]
    if resendable:
        return any(refused)
    return all(refused) and all(r.commit_log_offset < 0 for r in results)
