"""ZeroMQ's flags as plain ints, and sockets past pyzmq's Python wrapper, for the loops
that pass them on every message.

pyzmq 27's constants are ``enum.IntFlag`` members: ``&`` and ``|`` on them run
``enum``'s Python code, about 0.5 us of CPU each against 0.03 us for ints (measured
with ``time.thread_time`` on this machine), paid on every receive, send and EVENTS
test of a wake-up, a request or a reply. The bus, the writer and the dealer take these
instead; code that passes a flag once (a setup, a poller registration) may keep
pyzmq's names.

    name              zmq flags                 used for
    ----------------  ------------------------  ---------------------------------------
    NOBLOCK           zmq.NOBLOCK (DONTWAIT)    a send or receive that must not wait
    SNDMORE_NOBLOCK   zmq.SNDMORE | NOBLOCK     a frame of a multipart reply, not the last
    EVENTS            zmq.EVENTS                ``getsockopt``: what the socket can do now
    RCVMORE           zmq.RCVMORE               ``getsockopt``: more parts of a message wait
    POLLIN            zmq.POLLIN                EVENTS bit (and poll item): one is queued
"""

from __future__ import annotations

import zmq

NOBLOCK = int(zmq.NOBLOCK)
SNDMORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
EVENTS = int(zmq.EVENTS)
RCVMORE = int(zmq.RCVMORE)
POLLIN = int(zmq.POLLIN)


def backend(socket: zmq.Socket):
    """``socket`` as pyzmq's Cython socket (the same socket): its ``send``, ``recv`` and
    ``get`` skip the Python wrapper (``send``'s DRAFT-socket arguments,
    ``recv_multipart``'s loop). Measured warm: 1.9 against 1.0 us to receive a request's
    two parts, 0.6 against 0.3 us to send a reply's part. The writer, the bus and the
    dealer take their per-message calls from it."""
    return super(zmq.Socket, socket)
