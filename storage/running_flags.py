"""RunningFlags: why the store refuses writes, if it does.

Each bit is a reason a put returns SERVICE_NOT_AVAILABLE. ``reasons()`` names them so
the refusal can say why (``rocketstore status`` shows them).
"""

from __future__ import annotations

import enum


class Flag(enum.IntFlag):
    NOT_READABLE = 0x1
    NOT_WRITEABLE = 0x2
    WRITE_LOGICS_QUEUE_ERROR = 0x4
    WRITE_INDEX_FILE_ERROR = 0x8
    DISK_FULL = 0x10
    FLUSH_ERROR = 0x20


_NOT_WRITEABLE = (Flag.NOT_WRITEABLE | Flag.WRITE_LOGICS_QUEUE_ERROR
                  | Flag.WRITE_INDEX_FILE_ERROR | Flag.DISK_FULL | Flag.FLUSH_ERROR)
_NOT_CQ_WRITEABLE = Flag.NOT_WRITEABLE | Flag.WRITE_LOGICS_QUEUE_ERROR


class RunningFlags:
    """The flags raised. Every put and read asks; a flag is rarely raised, so each
    question first looks whether any is (an int's truth, where an ``IntFlag``
    operation is a Python call)."""

    def __init__(self) -> None:
        self.flag_bits = Flag(0)
        self.detail: dict[Flag, str] = {}

    def is_writeable(self) -> bool:
        return not self.flag_bits or not self.flag_bits & _NOT_WRITEABLE

    def is_cq_writeable(self) -> bool:
        return not self.flag_bits or not self.flag_bits & _NOT_CQ_WRITEABLE

    def set(self, flag: Flag, detail: str = "") -> bool:
        """Raise ``flag``; returns True if it was clear before."""
        was_clear = not self.flag_bits & flag
        self.flag_bits |= flag
        if detail:
            self.detail[flag] = detail
        return was_clear

    def clear(self, flag: Flag) -> bool:
        """Lower ``flag``; returns True if it was set before."""
        if not self.flag_bits:
            return False
        was_set = bool(self.flag_bits & flag)
        self.flag_bits &= ~flag
        self.detail.pop(flag, None)
        return was_set

    def get_and_make_disk_full(self) -> bool:
        """True if the disk was OK before (RocketMQ's ``getAndMakeDiskFull``)."""
        return self.set(Flag.DISK_FULL, "disk usage above disk_space_warning_level_ratio")

    def get_and_make_disk_ok(self) -> bool:
        """True if the disk was OK before (RocketMQ's ``getAndMakeDiskOK``)."""
        return not self.clear(Flag.DISK_FULL)

    def reasons(self) -> list[str]:
        return [f"{f.name}: {self.detail.get(f, '')}".rstrip(": ")
                for f in Flag if self.flag_bits & f]
