"""AllocateMappedFileService (``storage.allocate``): the next CommitLog files made ready
by a thread of the appender, warmed on request, never replacing a file the appender made
itself, and leftovers of a killed allocator removed at the next start."""

from __future__ import annotations

import os
import time

from conftest import msg, small_config
from rocketstore.storage import MessageStore
from rocketstore.storage.allocate import SUFFIX, AllocateMappedFileService, remove_leftovers
from rocketstore.storage.mapped_file import MappedFile, offset_to_file_name

SIZE = 1 << 20


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def path(d, offset: int) -> str:
    return os.path.join(d, offset_to_file_name(offset))


def test_requested_files_are_made_in_order_full_size_and_zero(tmp_path):
    d = str(tmp_path)
    a = AllocateMappedFileService(d, SIZE, warm=True, flush_least_pages=64)
    try:
        a.request(0, SIZE)
        wait_for(lambda: a.allocated == 2)
        assert (a.take(0), a.take(SIZE)) == (path(d, 0), path(d, SIZE))
        assert a.take(0) is None                  # handed over once
        for offset in (0, SIZE):
            with open(path(d, offset), "rb") as f:
                assert f.read() == bytes(SIZE)
        assert not [n for n in os.listdir(d) if n.endswith(SUFFIX)]
        a.request(3 * SIZE)                       # the file before it is missing
        wait_for(lambda: not a._queue and a._busy is None)
        assert not os.path.exists(path(d, 3 * SIZE)) and a.take(3 * SIZE) is None
    finally:
        a.shutdown()


def test_a_file_the_appender_made_meanwhile_is_never_replaced(tmp_path):
    d = str(tmp_path)
    big = 64 << 20                                # slow enough to catch it busy
    a = AllocateMappedFileService(d, big, warm=True, flush_least_pages=1 << 20, wait_ms=0)
    try:
        a.request(0)
        wait_for(lambda: a._busy == 0)
        assert a.take(0) is None                  # not ready in time: make it here
        mine = MappedFile(path(d, 0), big)
        mine.buf[:5] = b"mine!"
        wait_for(lambda: a._busy is None)
        with open(path(d, 0), "rb") as f:
            assert f.read(5) == b"mine!"
        mine.close()
        assert not [n for n in os.listdir(d) if n.endswith(SUFFIX)]
    finally:
        a.shutdown()


def test_leftovers_of_a_killed_allocator_are_removed(tmp_path):
    d = str(tmp_path)
    left = os.path.join(d, f".{offset_to_file_name(SIZE)}{SUFFIX}")
    open(left, "wb").close()
    open(path(d, 0), "wb").close()
    assert remove_leftovers(d) == 1
    assert os.listdir(d) == [offset_to_file_name(0)]


def test_an_embedded_store_with_warm_up_rolls_through_files_made_ahead(tmp_path):
    cfg = small_config(tmp_path / "store", warm_maped_file_enable=True,
                       flush_least_pages_when_warm_maped_file=1)
    with MessageStore(cfg) as store:
        results = [store.put(msg(i)) for i in range(400)]
        assert all(r.ok for r in results)
        files = store.commit_log.mapped_file_queue.mapped_files
        assert len(files) > 5
        wait_for(lambda: os.path.exists(path(cfg.commit_log_dir, files[-1].file_from_offset
                                             + 2 * cfg.mapped_file_size_commit_log)))
        store.dispatch()
        assert store.check() == []
    with MessageStore(cfg) as again:
        assert again.get_max_offset_in_queue("TopicTest", 0) == 400
        last = again.get_message("g", "TopicTest", 0, 399, 1).messages[0]
        assert last.body == msg(399).body


def _resident_pages(file_path: str) -> list[bool]:
    """Which pages of the file are in the page cache (``mincore`` over a mapping)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = os.path.getsize(file_path)
    fd = os.open(file_path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = ctypes.create_string_buffer(size // mmap.PAGESIZE)
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return [b & 1 == 1 for b in vec.raw]
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_the_page_cache_is_read_ahead_of_the_appender_into_the_next_files(tmp_path):
    """``keep_ahead``: the pages from the appender's offset to READ_AHEAD past it come into
    the page cache (across the end of a file), those before it are left alone, and at a
    file not made yet the read waits until it is made."""
    d = str(tmp_path)
    size = 4 << 20
    a = AllocateMappedFileService(d, size)
    try:
        a.request(0, size)
        wait_for(lambda: a.allocated == 2)
        assert not any(_resident_pages(path(d, 0)))      # made, not read
        a.keep_ahead(3 << 20)                             # 1 MiB before the first's end
        wait_for(lambda: a._read_blocked == 2 * size)     # the third is not made
        first, second = _resident_pages(path(d, 0)), _resident_pages(path(d, size))
        page = len(first) // 4                            # pages in 1 MiB
        assert not any(first[:3 * page]) and all(first[3 * page:]) and all(second)
        a.request(2 * size)
        wait_for(lambda: a._read_blocked == 3 * size)     # read the third once made
        assert all(_resident_pages(path(d, 2 * size)))
    finally:
        a.shutdown()
