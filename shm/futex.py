"""Linux futexes on words of shared memory, through ``syscall(2)`` (ctypes).

A futex is a 32-bit word and a kernel wait queue keyed by the word's physical place, so
processes that map the same shared memory wait on and wake through the same word (the
calls here never pass FUTEX_PRIVATE_FLAG, which would key it per process):

    wait(address, expected, timeout_ms)   sleeps only while the word still holds
                                          ``expected`` (checked by the kernel, atomically
                                          with going to sleep): a change made before the
                                          call returns at once (EAGAIN), one made after
                                          wakes it
    wake(address)                         wakes every waiter of the word; with none, a
                                          hash lookup in the kernel and nothing more

The word is the caller's to change (a plain store by its one writer: x86-64 keeps a
32-bit aligned store whole, and keeps stores, and loads, in program order, which the
callers' no-lost-wake arguments rely on). ctypes releases the interpreter lock for the call,
so a waiting thread holds up no other thread of its process; a signal cuts the wait
short (EINTR), and Python then runs its handler as usual.

``AVAILABLE`` is True on x86-64 Linux only: elsewhere (arm64 reorders plain loads and
stores; another system has no futex) callers keep to the bus.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFF_FFFF
_SYS_FUTEX = 202 if sys.platform.startswith("linux") and platform.machine() == "x86_64" \
    else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall = None
if _SYS_FUTEX is not None:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long

AVAILABLE = _syscall is not None


def wait(address: int, expected: int, timeout_ms: int) -> bool:
    """Sleep while the word at ``address`` holds ``expected``, up to ``timeout_ms``;
    True when woken or when the word had changed already, False on the timeout or a
    signal. Raises ``OSError`` for any other failure (a bad address)."""
    timeout = _Timespec(timeout_ms // 1000, (timeout_ms % 1000) * 1_000_000)
    rc = _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT,
                  ctypes.c_uint32(expected), ctypes.byref(timeout), None, 0)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EAGAIN:
        return True
    if err in (errno.ETIMEDOUT, errno.EINTR):
        return False
    raise OSError(err, f"futex wait: {errno.errorcode.get(err, err)}")


def wake(address: int) -> int:
    """Wake every waiter of the word at ``address``; how many there were."""
    rc = _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None,
                  None, 0)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"futex wake: {errno.errorcode.get(err, err)}")
    return rc
