"""The store's files are the owner's and its group's: directories 0750, files 0640 by
default, exactly (whatever the process's own umask), with ``data_umask`` for another
choice; the socket directory ``run/`` stays 0700; the position table is 0640 and the
consumer groups' membership (``groups/``) group-writable and setgid, 02770."""

from __future__ import annotations

import os
import stat

import pytest

from conftest import msg, small_config
from rocketstore.client import Consumer, Producer
from rocketstore.shm import arrival_bell, doorbell
from rocketstore.shm.positions import segment_name
from rocketstore.storage import MessageStore, StoreConfig
from rocketstore.storage.errors import StoreConfigError
from store_processes import RunningStore


def _modes(root: str) -> dict[str, int]:
    """Every path under ``root`` (but the sockets' ``run`` directory) -> its mode bits."""
    out = {}
    for base, dirs, files in os.walk(root):
        if os.path.basename(base) == "run" or "/run/" in base + "/":
            continue
        for name in dirs + files:
            path = os.path.join(base, name)
            if name == "run":
                continue
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def _expect(modes: dict[str, int], root: str, dir_mode: int, file_mode: int) -> None:
    wrong = {p: oct(m) for p, m in modes.items()
             if m != (dir_mode if os.path.isdir(os.path.join(root, p)) else file_mode)}
    assert not wrong, wrong


@pytest.mark.parametrize("umask, dir_mode, file_mode", [(0o027, 0o750, 0o640),
                                                         (0o022, 0o755, 0o644),
                                                         (0o077, 0o700, 0o600)])
def test_an_embedded_store_makes_its_files_with_the_data_umask(tmp_path, umask, dir_mode,
                                                              file_mode):
    before = os.umask(0o002 if umask == 0o077 else 0o077)   # the process's own: ignored
    try:
        config = small_config(tmp_path / "store", data_umask=umask)
        with MessageStore(config) as store:
            assert all(r.ok for r in store.put_batch([msg(i) for i in range(300)]))
            store.dispatch()
            store.flush()
    finally:
        os.umask(before)
    modes = _modes(config.store_path_root_dir)
    assert any(p.startswith("commitlog/") for p in modes)
    assert any(p.startswith("consumequeue/") for p in modes)
    assert any(p.startswith("index/") for p in modes) and "checkpoint" in modes
    _expect(modes, config.store_path_root_dir, dir_mode, file_mode)
    assert stat.S_IMODE(os.stat(config.store_path_root_dir).st_mode) == dir_mode


def test_a_running_store_and_its_consumers_make_0750_and_0640(tmp_path):
    with RunningStore(tmp_path) as store:
        with Producer(store.store_dir) as p:
            assert all(r.ok for r in p.send_batch([msg(i, topic="Modes") for i in range(50)]))
        with Consumer(store.store_dir, "modes", "Modes") as c:
            c.poll(50, timeout_ms=5000)
            c.commit()
            members = os.listdir(os.path.join(store.store_dir, "groups", "modes", "Modes"))
            assert [stat.S_IMODE(os.stat(os.path.join(store.store_dir, "groups", "modes",
                                                      "Modes", m)).st_mode)
                    for m in members] == [0o640]
        segment = "/dev/shm" + segment_name(store.store_dir)
        assert stat.S_IMODE(os.stat(segment).st_mode) == 0o640
        bell = "/dev/shm/sem." + doorbell.semaphore_name(store.store_dir)[1:]   # Linux's place
        assert stat.S_IMODE(os.stat(bell).st_mode) == 0o640
        bells = "/dev/shm" + arrival_bell.bells_name(store.store_dir)
        assert stat.S_IMODE(os.stat(bells).st_mode) == 0o640
        assert store.stop() == 0
    modes = _modes(store.store_dir)
    shared = {p: m for p, m in modes.items() if p.split("/")[0] == "groups"}
    assert shared == {"groups": 0o2770, "groups/modes": 0o2770, "groups/modes/Modes": 0o2770}
    modes = {p: m for p, m in modes.items() if p not in shared}
    assert "config/consumerOffset.json" in modes and "checkpoint" in modes
    _expect(modes, store.store_dir, 0o750, 0o640)
    run = os.path.join(store.store_dir, "run")
    if os.path.isdir(run):
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o700


def test_a_umask_that_locks_out_the_owner_is_refused():
    with pytest.raises(StoreConfigError, match="data_umask"):
        StoreConfig(data_umask=0o700)
