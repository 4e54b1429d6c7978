"""client/line.py alone, with real threads: one owner at a time, turns in order, no turn
left asleep when the socket is freed while it joins the line (the release that skips
``_mutex`` when nobody waits)."""

from __future__ import annotations

import random
import sys
import threading

from rocketstore.client.line import Line, Turn
from store_processes import wait_for
from test_producer_threads import in_threads


def test_one_owner_at_a_time_and_nobody_left_waiting():
    """Threads take the socket every way there is (``try_take(False)`` falling back to
    ``wait`` as a send does, ``take`` as other calls do) and release it, thousands of
    times, with and without work in between: never two owners, and every thread ends.
    The interpreter switches threads every microsecond (not every 5 ms), so they meet
    between any two steps of a take or a release."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        run_many_owners()
    finally:
        sys.setswitchinterval(before)


def run_many_owners() -> None:
    line = Line()
    owners = [0]
    taken = [0]

    def own() -> None:
        owners[0] += 1
        assert owners[0] == 1, "two threads own the socket"
        if random.random() < 0.1:
            threading.Event().wait(0.0001)
        taken[0] += 1
        owners[0] -= 1

    def work(i: int) -> None:
        rng = random.Random(i)
        for _ in range(3000):
            if i % 2:
                line.take()
            elif not line.try_take(False) and not line.wait(Turn()):
                pass                     # passed the socket: it is this thread's
            own()
            line.release()
            if rng.random() < 0.05:
                threading.Event().wait(0.0001)
    in_threads(work, 12)
    assert taken[0] == 12 * 3000
    assert not line.locked() and not line.waiting


def test_turns_get_the_socket_in_the_order_they_came():
    line = Line()
    assert line.try_take(False)
    order: list[int] = []

    def wait_turn(i: int) -> None:
        line.take()
        order.append(i)
        line.release()
    threads = []
    for i in range(6):
        threads.append(threading.Thread(target=wait_turn, args=(i,)))
        threads[-1].start()
        wait_for(lambda: len(line.waiting) == i + 1, 10, "the thread in line")
    line.release()
    for t in threads:
        t.join(10)
    assert order == list(range(6))
    assert not line.locked()


def test_a_group_is_the_send_turns_right_behind_its_head_within_its_bytes():
    line = Line()
    assert line.try_take(False)
    head, a, b = Turn(b"h" * 10), Turn(b"a" * 10), Turn(b"b" * 10)
    other, c = Turn(), Turn(b"c" * 10)
    line.waiting += [head, a, b, other, c]
    line.release()                       # passed to the head, which stays in line
    assert head.leads and line.waiting[0] is head
    assert line.take_group(head, 25) == [head, a]       # b would pass 25 bytes
    assert line.waiting == [b, other, c]
    assert line.take_group(b, 10 ** 6) == [b]           # stops at a turn that is no send
    assert line.waiting == [other, c]


def test_a_turn_joining_as_the_socket_is_freed_is_never_left_asleep():
    """The owner frees the socket while another thread is joining the line, and then
    takes no more turns (no later release would wake a turn left behind): thousands of
    times, threads switching every microsecond. The joining thread always gets it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        line = Line()
        for _ in range(3000):
            assert line.try_take(False)
            joiner = threading.Thread(target=lambda: (line.take(), line.release()))
            joiner.start()
            line.release()
            joiner.join(10)
            assert not joiner.is_alive(), "a turn was left asleep"
    finally:
        sys.setswitchinterval(before)
    assert not line.locked() and not line.waiting
