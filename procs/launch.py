"""Starting a store from a program: create its files with the geometry asked for, and
run ``rocketstore up`` as a child process until it says it is up (its banner line), as
``rocketstore demo`` and the Spark demo do.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import time

from rocketstore.storage import MessageStore, StoreConfig, StoreError


def create_store(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    store.load()
    store.close()


def start_up(store_dir: str, log_path: str) -> subprocess.Popen:
    log = open(log_path, "a")
    up = subprocess.Popen([sys.executable, "-m", "rocketstore.cli", "up", "--store", store_dir],
                          stdout=subprocess.PIPE, stderr=log, text=True)
    sel = selectors.DefaultSelector()
    sel.register(up.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and up.poll() is None:
        if sel.select(timeout=0.5) and up.stdout.readline().startswith("rocketstore up:"):
            return up
    up.kill()
    raise StoreError(f"the store did not start; see {log_path}")
