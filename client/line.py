"""Threads taking turns at one socket (a ZeroMQ socket is not thread-safe), and the
one-message sends that wait together going in one frame: ``Producer``'s "Threads".

    Line          the socket is one thread's at a time: ``try_take(False)`` (no wait),
                  ``take`` or ``wait(turn)`` (in line, in order), ``release`` (passed to
                  the first turn waiting, else free)
    Turn          a thread in line: a send's record, or None for a call that takes the
                  socket to itself; its ``result`` or ``error`` once its group was sent

Passing, not freeing: a thread done with the socket passes it to the first turn in
line (that turn ``leads``); only an empty line frees it, so no thread that comes later
overtakes one waiting. A send turn passed the socket heads a group (``take_group``):
the send turns from the head of the line on, up to the first turn that is no send or
the group's byte limit; the rest keep their places. The thread heading a group sends
it, fills each member's outcome, wakes them (``wake``) and releases the socket.

Interruptions: a signal handler that raises (Ctrl-C's KeyboardInterrupt, in the main
thread) while a thread waits in line takes its turn out of the line, and passes the
socket on if it had just been passed to it (``leave``). That wait, and the head's wait
for its frame's answer (``Producer._send_group``), are where a thread spends its time
here; between two bytecodes Python may raise anywhere, as it may inside ``with lock:``.
"""

from __future__ import annotations

import threading
from _thread import allocate_lock


class Turn:
    """A thread waiting for the socket: a ``send``'s, with its ``record`` (None for a
    send that goes alone, and for any other call); ``leads`` once passed the socket; a
    grouped send's ``result`` or ``error`` once its frame was answered. ``woken``: a
    lock taken when made, which the thread waits to take again and another releases to
    wake it (CPython's cheapest wake-up: ``threading.Event`` is a ``Condition`` written
    in Python, about ten times its cost)."""

    __slots__ = ("record", "woken", "leads", "result", "error")

    def __init__(self, record: bytes | None = None):
        self.record = record
        self.woken = allocate_lock()
        self.woken.acquire()
        self.leads = False
        self.result = None
        self.error: BaseException | None = None

    def outcome(self):
        """The result its group's frame got for it; raises the frame's error."""
        if self.error is not None:
            raise self.error
        return self.result


class Line:
    """One socket's owner and the turns waiting for it, in order.

    Invariants: ``_lock`` is held while any thread owns the socket (it is passed from
    thread to thread without being freed); ``waiting`` holds the turns not yet passed
    the socket nor taken into a group, plus a send turn passed it until it takes its
    group; both change only under ``_mutex``, so a turn that finds the socket taken
    is in line before its owner can look for a next."""

    def __init__(self):
        self._lock = threading.Lock()
        self._mutex = threading.Lock()
        self.waiting: list[Turn] = []

    @property
    def try_take(self):
        """``try_take(False)``: the socket for this thread if nobody has it. The lock's
        own ``acquire`` (no Python frame: every send takes the socket)."""
        return self._lock.acquire

    def locked(self) -> bool:
        return self._lock.locked()

    def take(self) -> None:
        """The socket for this thread, in its turn."""
        if not self._lock.acquire(False):
            self.wait(Turn())

    def wait(self, turn: Turn) -> bool:
        """True when the socket came free and is this thread's; else wait in line until
        ``turn`` is passed the socket (``leads``) or taken into a group and answered.
        An interrupted wait leaves the line (``leave``) and raises."""
        try:
            with self._mutex:
                if self._lock.acquire(False):
                    return True
                self.waiting.append(turn)
                if self._lock.acquire(False):   # freed by a ``release`` that saw no line
                    self.waiting.pop()
                    return True
            turn.woken.acquire()         # released when passed the socket, or answered
        except BaseException:
            self.leave(turn)
            raise
        return False

    def leave(self, turn: Turn) -> None:
        """``turn`` out of the line (its thread no longer waits); the socket passed on
        if it had been passed to it. A send already taken into a group goes on without
        it."""
        with self._mutex:
            queued = turn in self.waiting
            if queued:
                self.waiting.remove(turn)
            passed = turn.leads and (queued or turn.record is None)
        if passed:
            self.release()

    def discard(self, turn: Turn) -> None:
        """``turn`` out of the line if it is still there (a head whose group was never
        taken); the socket stays where it is."""
        with self._mutex:
            if turn in self.waiting:
                self.waiting.remove(turn)

    def release(self) -> None:
        """Done with the socket: passed to the first turn waiting, else free. A send
        turn passed it stays in line until it takes its group.

        With nobody in line it is freed without ``_mutex`` (the common case, one
        thread: a lock's release, not a lock's acquire and two releases), and the line
        looked at again: a turn that joined meanwhile either took the freed socket
        itself (``wait`` tries again once in line) or is passed it here, unless a
        third thread took it first, whose release passes it on."""
        if not self.waiting:
            self._lock.release()
            if not self.waiting or not self._lock.acquire(False):
                return
        with self._mutex:
            if not self.waiting:
                self._lock.release()
                return
            first = self.waiting[0]
            first.leads = True
            if first.record is None:
                del self.waiting[0]
        first.woken.release()

    def take_group(self, own: Turn, max_bytes: int) -> list[Turn]:
        """``own`` (passed the socket, at the head) and the send turns right behind it,
        while their records stay within ``max_bytes`` together (``own``'s counts
        whatever its size): out of the line, in order."""
        with self._mutex:
            waiting = self.waiting
            assert waiting and waiting[0] is own, "a group is taken by its head"
            size, n = len(own.record), 1
            while n < len(waiting) and waiting[n].record is not None and \
                    size + len(waiting[n].record) <= max_bytes:
                size += len(waiting[n].record)
                n += 1
            group = waiting[:n]
            del waiting[:n]
        return group

    @staticmethod
    def wake(group: list[Turn], own: Turn) -> None:
        """Every member of ``group`` but ``own``, its outcome filled."""
        for turn in group:
            if turn is not own:
                turn.woken.release()
