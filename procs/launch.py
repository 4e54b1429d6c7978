"""Starting a store from a program: create its files with the geometry asked for, and
run ``rocketstore up`` as a child process until it says it is up (its banner line), as
``rocketstore demo`` and the Spark demo do. A store directory another process holds is
refused before anything starts, naming that process (``StoreLockedError``); a start that
fails otherwise says what ``up`` said.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time

from rocketstore.storage import MessageStore, StoreConfig, StoreError
from rocketstore.storage.store_lock import StoreLockedError, holder, locked_message


def create_store(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    store.load()
    store.close()


def start_up(store_dir: str, log_path: str) -> subprocess.Popen:
    """``rocketstore up --store store_dir``, its stderr appended to ``log_path``, once it
    runs. Raises ``StoreLockedError`` at once when another process holds the store, and
    ``StoreError`` with ``up``'s own last words when it does not start."""
    pid = holder(store_dir)
    if pid is not None:
        raise StoreLockedError(locked_message(store_dir, pid))
    start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    with open(log_path, "a") as log:            # the child keeps its own descriptor
        up = subprocess.Popen([sys.executable, "-m", "rocketstore.cli", "up", "--store",
                               store_dir], stdout=subprocess.PIPE, stderr=log, text=True)
    sel = selectors.DefaultSelector()
    sel.register(up.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and up.poll() is None:
        if sel.select(timeout=0.5) and up.stdout.readline().startswith("rocketstore up:"):
            return up
    up.kill()
    up.wait()
    why = _last_words(log_path, start)
    raise StoreError(f"the store did not start{': ' + why if why else ''} (see {log_path})")


def _last_words(log_path: str, start: int) -> str:
    """The last line ``up`` said of itself (``rocketstore: ...``) in the log after
    ``start``, or its last line at all; empty if it said nothing."""
    with open(log_path, "rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()
                 if line.strip()]
    own = [line for line in lines if line.startswith("rocketstore")]
    return (own or lines or [""])[-1]
