"""Who may read the store's files: the owner reads and writes, the group reads.

Every directory the store makes is ``0777 & ~data_umask`` and every file
``0666 & ~data_umask``: with the default ``data_umask`` 0o027, directories 0750 and
files 0640, so a reader group (consumers, backup, Spark executors on this host) can map
the files and nobody else can. The modes are set exactly (``fchmod``/``chmod`` after
creation), whatever the process's own umask; the socket directory ``run/`` stays 0700
(its sockets take puts). Consumer group membership (``groups/``) is the exception the
other way: its directories are group-writable and setgid (``shared_dir_mode``), so
consumers run by other members of the group join the owner's.

``data_umask`` is a store setting; ``use_umask`` makes it the one this process applies
(the store's processes, the supervisor and an embedded store call it as they open the
store), so one process serves one store's modes at a time.
"""

from __future__ import annotations

import os

DEFAULT_UMASK = 0o027
_umask = DEFAULT_UMASK


def use_umask(mask: int) -> None:
    global _umask
    _umask = mask


def file_mode() -> int:
    return 0o666 & ~_umask


def dir_mode() -> int:
    return 0o777 & ~_umask


def shared_dir_mode() -> int:
    """A directory every member of the owner's group may make files in (consumer group
    membership): ``dir_mode()`` plus group write and setgid (files made in it get the
    owner's group, whoever makes them) when the group may read at all."""
    mode = dir_mode()
    return mode | 0o2020 if mode & 0o040 else mode


def make_shared_dirs(path: str) -> None:
    """``make_dirs`` with every directory made ``shared_dir_mode()``."""
    for directory in make_dirs(path):
        os.chmod(directory, shared_dir_mode())


def make_dirs(path: str) -> list[str]:
    """``os.makedirs(path, exist_ok=True)`` with every directory it makes set to
    ``dir_mode()``; directories that exist keep their mode. Returns the directories it
    made, outermost first (their entries are durable only once their parents are
    fsynced: ``storage.dir_sync``)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    made = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, dir_mode())
        except FileExistsError:
            continue
        os.chmod(directory, dir_mode())
        made.append(directory)
    return made


def create(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with the file made ``file_mode()`` when this
    call created it (an existing file keeps its mode)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, file_mode())
    except FileExistsError:
        if flags & os.O_EXCL:
            raise
        return os.open(path, flags & ~os.O_CREAT)
    os.fchmod(fd, file_mode())
    return fd
