"""DirSyncs: the directory fsyncs a consume-queue file creation owes, paid by the
thorough flush before the checkpoint's logics time covers the file's units."""

from __future__ import annotations

import os

import pytest

from rocketstore.storage import file_modes
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.dir_sync import DirSyncs, owed_by_creation
from rocketstore.storage.logic_queues import LogicQueues
from rocketstore.storage.mapped_file import MappedFile


def test_make_dirs_returns_what_it_made_outermost_first(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert file_modes.make_dirs(str(deep)) == [str(tmp_path / "a"), str(tmp_path / "a" / "b"),
                                               str(deep)]
    assert file_modes.make_dirs(str(deep)) == []
    assert file_modes.make_dirs(str(deep / "d")) == [str(deep / "d")]


def test_a_creation_owes_its_own_directory_and_the_parent_of_each_one_made(tmp_path):
    (tmp_path / "consumequeue").mkdir()
    syncs = DirSyncs()
    path = tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000"
    mf = MappedFile(str(path), 4096, dir_syncs=syncs)
    mf.close()
    assert syncs.owed() == {str(tmp_path / "consumequeue"),
                            str(tmp_path / "consumequeue" / "TopicA"),
                            str(path.parent)}
    again = MappedFile(str(path.parent / "00000000000000004096"), 4096, dir_syncs=syncs)
    again.close()
    assert len(syncs.owed()) == 3          # the same directories, owed once
    opened = MappedFile(str(path), 4096, create=False, dir_syncs=DirSyncs())
    opened.close()                          # opening an existing file owes nothing


def test_owed_by_creation_of_a_file_in_an_existing_directory_is_that_directory(tmp_path):
    assert owed_by_creation(str(tmp_path / "f"), []) == [str(tmp_path)]


def test_pay_fsyncs_every_owed_directory_once_and_skips_ones_gone(tmp_path):
    syncs = DirSyncs()
    (tmp_path / "kept").mkdir()
    syncs.owe([str(tmp_path), str(tmp_path / "kept"), str(tmp_path / "gone")])
    assert syncs.pay() == 3
    assert syncs.owed() == set()
    assert syncs.pay() == 0


def test_a_failed_fsync_keeps_what_was_not_paid_owed(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    syncs = DirSyncs()
    syncs.owe([str(tmp_path), str(not_a_dir)])
    with pytest.raises(NotADirectoryError):
        syncs.pay()
    assert str(not_a_dir) in syncs.owed()
    not_a_dir.unlink()
    assert syncs.pay() >= 1 and syncs.owed() == set()


def test_the_thorough_flush_pays_before_it_writes_the_checkpoint(config):
    queues = LogicQueues(config)
    cp = StoreCheckpoint(os.path.join(config.store_path_root_dir, "checkpoint"))
    owed_at_checkpoint = []
    flush_one = cp.flush_one

    def watched(name):
        owed_at_checkpoint.append(queues.dir_syncs.owed())
        flush_one(name)

    cp.flush_one = watched
    try:
        queues.find("NewTopic", 0).put_message_position_info(0, 100, 7, 0)
        assert os.path.join(config.consume_queue_dir, "NewTopic", "0") in queues.dir_syncs.owed()
        queues.flush_logics(None, cp, 1_000)
        assert owed_at_checkpoint == [set()]
    finally:
        cp.close()
        queues.close()


def test_discover_owes_the_directories_of_queues_an_earlier_process_made(config):
    first = LogicQueues(config)
    first.find("TopicA", 1).put_message_position_info(0, 100, 7, 0)
    first.close()                       # as if killed: nothing paid
    again = LogicQueues(config)
    try:
        list(again.discover())
        root = config.consume_queue_dir
        assert again.dir_syncs.owed() == {root, os.path.join(root, "TopicA"),
                                          os.path.join(root, "TopicA", "1")}
    finally:
        again.close()


def _vm_flags(path: str) -> str:
    """The VmFlags of this process's mapping of ``path`` (proc(5) smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(" " + path):
            for after in lines[i + 1:]:
                if after.startswith("VmFlags:"):
                    return after
    raise AssertionError(f"{path} is not mapped")


def test_a_consume_queue_file_made_here_faults_a_page_at_a_time_and_a_loaded_one_reads_ahead(
        config):
    queues = LogicQueues(config)
    try:
        cq = queues.find("TopicA", 0)
        cq.put_message_position_info(0, 100, 7, 0)
        made = cq.mapped_file_queue.get_last_mapped_file()
        assert made.created and " rr" in _vm_flags(made.path)
    finally:
        queues.close()
    again = LogicQueues(config)
    try:
        (cq,) = again.discover()
        cq.load()
        loaded = cq.mapped_file_queue.get_last_mapped_file()
        assert not loaded.created and " rr" not in _vm_flags(loaded.path)
    finally:
        again.close()
