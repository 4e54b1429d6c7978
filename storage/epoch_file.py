"""``config/controllerEpoch.json``: the broker group's epochs this store has seen
(RocketMQ's ``epochFileCheckpoint``, EpochFileCache).

In controller mode (``procs.controller``) every election raises the group's epoch, kept
in ZooKeeper; each store keeps the ones it saw, with where each began in the CommitLog:

    {"epochs": [[epoch, start_offset], ...]}     epochs strictly ascending

``start_offset`` is the elected master's CommitLog end when it was elected: its bytes
from there on are that epoch's. A store records an epoch when it is elected, or when it
first follows a master of that epoch. Lower or equal epochs are never recorded after a
higher one (RocketMQ refuses them too). The file is replaced atomically
(``json_file.persist``); a missing or unreadable one is no epoch seen (0).
"""

from __future__ import annotations

import os

from rocketstore.storage import json_file

EPOCH_FILE = "controllerEpoch.json"


def path(config_dir: str) -> str:
    return os.path.join(config_dir, EPOCH_FILE)


def load(config_dir: str) -> list[tuple[int, int]]:
    """The epochs seen, ``(epoch, start_offset)``, ascending; entries that are not two
    integers are left out."""
    doc = json_file.load(path(config_dir)) or {}
    epochs = doc.get("epochs") if isinstance(doc, dict) else None
    return [(e[0], e[1]) for e in epochs or []
            if isinstance(e, list) and len(e) == 2 and all(type(v) is int for v in e)]


def current(config_dir: str) -> int:
    """The highest epoch seen; 0 for none."""
    epochs = load(config_dir)
    return epochs[-1][0] if epochs else 0


def record(config_dir: str, epoch: int, start_offset: int) -> bool:
    """Note ``epoch``, begun at ``start_offset``; False (nothing written) when it is not
    above the last one noted."""
    epochs = load(config_dir)
    if epochs and epoch <= epochs[-1][0]:
        return False
    json_file.persist(path(config_dir),
                      {"epochs": [list(e) for e in epochs] + [[epoch, start_offset]]})
    return True
