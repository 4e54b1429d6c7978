"""MappedFile and MappedFileQueue: preallocation, naming, sizes, append, the flush
least-pages rule, reference counting and destroy, roll-over with next-next
preallocation, lookups by offset and by time, expiry, truncation, load, and faults.

Real files in ``tmp_path``. The only substitutes are the fault-injection seams of
``storage.mapped_file.FILE_OPS`` (fallocate, fdatasync), used where a test says so,
because a real disk cannot be made to fail with ENOSPC or EIO on demand.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from conftest import refuse_space
from rocketstore.storage import mapped_file as mapped_file_module
from rocketstore.storage.errors import StoreError, StoreFileError
from rocketstore.storage.mapped_file import (
    OS_PAGE_SIZE, MappedFile, MappedFilePositionError, offset_to_file_name)
from rocketstore.storage.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileQueue

SIZE = 4 * OS_PAGE_SIZE        # 16 KiB files: four pages each
HOUR_MS = 3_600_000


def path_of(directory, offset: int) -> str:
    return os.path.join(str(directory), offset_to_file_name(offset))


def names(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.isdigit())


def make_files(directory, offsets, size: int = SIZE) -> None:
    """Create closed, preallocated store files at ``offsets``."""
    for off in offsets:
        MappedFile(path_of(directory, off), size).close()


def fill(mf: MappedFile, byte: int = 0xAB) -> None:
    """Append until the file is full."""
    assert mf.append(bytes([byte]) * (mf.file_size - mf.wrote_position))
    assert mf.is_full()


def set_mtime_ms(path: str, mtime_ms: int) -> None:
    os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def mf(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    yield f
    f.close()


# ====================================================================== MappedFile
def test_file_is_named_by_its_20_digit_start_offset(tmp_path):
    assert offset_to_file_name(0) == "00000000000000000000"
    assert offset_to_file_name(1073741824) == "00000000001073741824"
    f = MappedFile(path_of(tmp_path, 3 * SIZE), SIZE)
    try:
        assert f.file_name == "00000000000000049152"
        assert f.file_from_offset == 3 * SIZE
        assert names(tmp_path) == ["00000000000000049152"]
    finally:
        f.close()


def test_new_file_is_preallocated_to_full_size_not_sparse(mf):
    st = os.stat(mf.path)
    assert st.st_size == SIZE
    assert st.st_blocks * 512 >= SIZE, "the file must be allocated, not sparse"
    assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (0, 0, 0)
    with open(mf.path, "rb") as f:
        assert f.read() == bytes(SIZE)


def test_name_that_is_not_an_offset_is_refused(tmp_path):
    with pytest.raises(StoreFileError) as e:
        MappedFile(str(tmp_path / "commitlog.dat"), SIZE)
    assert "commitlog.dat" in str(e.value)
    assert not (tmp_path / "commitlog.dat").exists()


def test_missing_file_without_create_is_refused(tmp_path):
    with pytest.raises(StoreFileError):
        MappedFile(path_of(tmp_path, 0), SIZE, create=False)
    assert names(tmp_path) == []


@pytest.mark.parametrize("actual", [SIZE - 100, SIZE + 100])
def test_wrong_size_file_raises_and_is_left_untouched(tmp_path, actual):
    path = path_of(tmp_path, 0)
    with open(path, "wb") as f:
        f.write(b"\x11" * actual)
    with pytest.raises(StoreFileError) as e:
        MappedFile(path, SIZE, create=False)
    assert str(actual) in str(e.value) and path in str(e.value)
    assert os.path.getsize(path) == actual


def test_short_file_is_grown_back_only_with_extend_short(tmp_path):
    path = path_of(tmp_path, 0)
    with open(path, "wb") as f:
        f.write(b"\x11" * 1000)
    with pytest.raises(StoreFileError):
        MappedFile(path, SIZE, create=False)
    with pytest.raises(StoreFileError):
        MappedFile(path, SIZE, create=False, read_only=True, extend_short=True)
    assert os.path.getsize(path) == 1000
    f = MappedFile(path, SIZE, create=False, extend_short=True)
    try:
        assert f.was_extended
        st = os.stat(path)
        assert st.st_size == SIZE and st.st_blocks * 512 < SIZE    # grown sparse
        assert f.buf[:1000] == b"\x11" * 1000
        assert f.buf[1000:] == bytes(SIZE - 1000)
        f.set_positions(1000)
        assert f.append(b"\x22" * 100)              # reserved before it is written
        assert os.stat(path).st_blocks * 512 >= SIZE
    finally:
        f.close()


def test_long_file_is_refused_even_with_extend_short(tmp_path):
    path = path_of(tmp_path, 0)
    with open(path, "wb") as f:
        f.write(bytes(SIZE + 1))
    with pytest.raises(StoreFileError):
        MappedFile(path, SIZE, create=False, extend_short=True)
    assert os.path.getsize(path) == SIZE + 1


def test_append_that_fits_moves_wrote_and_committed(mf):
    assert mf.append(b"a" * 100)
    assert mf.append(b"b" * 50)
    assert (mf.wrote_position, mf.committed_position, mf.read_position) == (150, 150, 150)
    assert mf.flushed_position == 0
    with open(mf.path, "rb") as f:
        assert f.read(151) == b"a" * 100 + b"b" * 50 + b"\0"


def test_append_that_does_not_fit_writes_nothing(mf):
    assert mf.append(b"x" * (SIZE - 10))
    assert not mf.append(b"y" * 11)
    assert mf.wrote_position == SIZE - 10
    assert mf.buf[SIZE - 10:] == bytes(10)
    assert mf.append(b"z" * 10)                  # exactly the rest fits
    assert mf.is_full()
    assert not mf.append(b"!")


def test_appended_publishes_bytes_copied_into_the_mapping(mf):
    mf.buf[0:30] = b"c" * 30
    mf.appended(30)
    assert (mf.wrote_position, mf.committed_position, mf.read_position) == (30, 30, 30)
    assert mf.read(0, 30) == b"c" * 30


def test_rewind_moves_wrote_and_committed_back_and_flushed_with_them(mf):
    mf.append(b"r" * 200)
    mf.flush(0)
    mf.append(b"s" * 100)
    mf.rewind(250)
    assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (250, 250, 200)
    mf.rewind(120)
    assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (120, 120, 120)
    assert mf.buf[120:300] == b"r" * 80 + b"s" * 100   # the bytes stay: they are written again


def positions(mf: MappedFile) -> tuple[int, int, int]:
    return mf.flushed_position, mf.committed_position, mf.wrote_position


@pytest.mark.parametrize("move, to", [
    ("rewind", 31),                 # past the wrote position
    ("rewind", -1),
    ("appended", SIZE - 29),        # wrote past the end of the file
    ("appended", -11),              # wrote below flushed
    ("set_positions", SIZE + 1),
    ("set_positions", -1),
])
def test_a_move_that_breaks_the_position_order_is_refused_and_moves_nothing(mf, move, to):
    """``0 <= flushed <= committed <= wrote <= file_size`` is checked by code: the move
    raises the named error and the three positions stay as they were."""
    mf.append(b"x" * 20)
    mf.flush(0)
    mf.append(b"y" * 10)
    assert positions(mf) == (20, 30, 30)
    with pytest.raises(MappedFilePositionError) as e:
        getattr(mf, move)(to)
    assert e.value.path == mf.path and mf.file_name in str(e.value)
    assert positions(mf) == (20, 30, 30)
    assert isinstance(e.value, StoreError)


def test_the_position_check_survives_python_O(tmp_path):
    """An ``assert`` would vanish under ``python -O``; the check must not."""
    script = (
        "import sys\n"
        "from rocketstore.storage.mapped_file import MappedFile, MappedFilePositionError\n"
        "assert False, 'asserts are on'\n"
        f"mf = MappedFile({path_of(tmp_path, 0)!r}, {SIZE})\n"
        "mf.append(b'x' * 10)\n"
        "try:\n"
        "    mf.rewind(11)\n"
        "except MappedFilePositionError:\n"
        "    sys.exit(7)\n")
    done = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 7, done.stderr


def test_read_beyond_the_read_position_returns_none(mf):
    mf.append(b"0123456789")
    assert mf.read(0, 10) == b"0123456789"
    assert mf.read(4, 6) == b"456789"
    assert mf.read(4, 7) is None
    assert mf.read(10, 1) is None
    assert mf.read(SIZE - 1, 1) is None
    assert mf.read(-1, 2) is None


# ------------------------------------------------------------------ flush least pages
@pytest.mark.parametrize("flushed, written, least_pages, able", [
    (0, 0, 0, False),                               # nothing dirty
    (0, 1, 0, True),                                # 0: any dirty byte
    (0, 1, -1, True),                               # <= 0 behaves like 0
    (100, 100, 0, False),
    (0, OS_PAGE_SIZE - 1, 1, False),                # not one whole page yet
    (0, OS_PAGE_SIZE, 1, True),
    (OS_PAGE_SIZE - 10, OS_PAGE_SIZE + 10, 1, True),  # pages counted by index, not bytes
    (0, 2 * OS_PAGE_SIZE + 5, 3, False),
    (0, 3 * OS_PAGE_SIZE, 3, True),
    (OS_PAGE_SIZE, 3 * OS_PAGE_SIZE + 1, 3, False),
    (0, SIZE, 100, True),                           # a full file always flushes
    (SIZE - 1, SIZE, 4, True),
])
def test_is_able_to_flush_least_pages_rule(mf, flushed, written, least_pages, able):
    if written:
        mf.append(b"\x01" * written)
    mf.flushed_position = flushed
    assert mf.is_able_to_flush(least_pages) is able


def test_flush_respects_least_pages_and_returns_flushed_position(mf):
    mf.append(b"x" * (OS_PAGE_SIZE + 1))
    assert mf.flush(2) == 0                         # one page: below the threshold
    assert mf.flush(1) == OS_PAGE_SIZE + 1          # flushes everything readable
    assert mf.flushed_position == OS_PAGE_SIZE + 1
    mf.append(b"y")
    assert mf.flush(1) == OS_PAGE_SIZE + 1          # same page: nothing to do
    assert mf.flush(0) == OS_PAGE_SIZE + 2


def test_flush_failure_raises_and_never_counts_as_flushed(mf, monkeypatch):
    """fdatasync is replaced to raise EIO: a real disk cannot fail on demand."""
    mf.append(b"x" * 100)

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(mapped_file_module.FILE_OPS, "fdatasync", eio)
    with pytest.raises(OSError) as e:
        mf.flush(0)
    assert e.value.errno == errno.EIO
    assert mf.flushed_position == 0
    assert mf.hold()                                # the failed flush released its hold
    mf.release()
    monkeypatch.undo()
    assert mf.flush(0) == 100


# ------------------------------------------------------------------ hold, release, destroy
def test_destroy_without_holders_unlinks(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    f.append(b"abc")
    assert f.destroy(120_000)
    assert not os.path.exists(f.path)
    assert not f.available and f.is_cleanup_over()
    assert not f.hold()
    assert f.read(0, 3) is None


def test_destroy_refused_while_held_then_forced_after_interval(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    f.append(b"abc")
    assert f.hold()
    interval_ms = 150
    assert not f.destroy(interval_ms)               # first attempt: shut down, refused
    assert os.path.exists(f.path)
    assert not f.available
    assert not f.hold(), "a shut-down file takes no new holders"
    assert not f.destroy(interval_ms)               # still inside the interval
    assert os.path.exists(f.path)
    time.sleep(interval_ms / 1000 + 0.05)
    assert f.destroy(interval_ms)                   # forced
    assert not os.path.exists(f.path)
    f.release()                                     # the late holder's release is harmless
    assert f.is_cleanup_over()


def test_release_of_last_holder_lets_destroy_succeed(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    assert f.hold()
    assert not f.destroy(120_000)
    f.release()
    assert f.is_cleanup_over()
    assert f.destroy(120_000)
    assert not os.path.exists(f.path)


def test_destroy_unlinks_but_never_truncates(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    f.append(b"keep me" * 10)
    other = os.open(f.path, os.O_RDONLY)            # as another process that still has it
    try:
        assert f.destroy(0)
        assert not os.path.exists(f.path)
        st = os.fstat(other)
        assert st.st_nlink == 0
        assert st.st_size == SIZE, "destroy must not truncate a file others may map"
        assert st.st_blocks * 512 >= SIZE
        assert os.pread(other, 70, 0) == b"keep me" * 10
    finally:
        os.close(other)


def test_close_keeps_the_file(tmp_path):
    f = MappedFile(path_of(tmp_path, 0), SIZE)
    f.append(b"data")
    f.close()
    assert os.path.getsize(f.path) == SIZE
    g = MappedFile(f.path, SIZE, create=False)
    try:
        assert g.buf[:4] == b"data"
    finally:
        g.close()


# ====================================================================== MappedFileQueue
def test_roll_over_creates_next_and_preallocates_next_next(tmp_path):
    q = MappedFileQueue(str(tmp_path), SIZE, preallocate_next=True)
    try:
        first = q.get_or_create_last_mapped_file(0)
        assert first.file_from_offset == 0 and first.first_create_in_queue
        assert names(tmp_path) == [offset_to_file_name(0), offset_to_file_name(SIZE)]
        st = os.stat(path_of(tmp_path, SIZE))
        assert st.st_size == SIZE and st.st_blocks == 0     # made ahead: nothing reserved
        assert len(q.mapped_files) == 1             # preallocated, not yet in the queue
        assert q.get_or_create_last_mapped_file(0) is first   # not full: same file
        fill(first)
        second = q.get_or_create_last_mapped_file(0)
        assert second.file_from_offset == SIZE and not second.first_create_in_queue
        assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE]
        assert names(tmp_path) == [offset_to_file_name(o) for o in (0, SIZE, 2 * SIZE)]
        st = os.stat(path_of(tmp_path, 2 * SIZE))
        assert st.st_size == SIZE and st.st_blocks == 0
        assert second.append(b"x") and os.stat(second.path).st_blocks * 512 >= SIZE
    finally:
        q.close()


def test_without_preallocation_only_the_needed_file_is_created(tmp_path):
    q = MappedFileQueue(str(tmp_path), SIZE)
    try:
        q.get_or_create_last_mapped_file(0)
        assert names(tmp_path) == [offset_to_file_name(0)]
    finally:
        q.close()


@pytest.mark.parametrize("start, window", [(5, 0), (SIZE, SIZE), (3 * SIZE + 7, 3 * SIZE)])
def test_first_file_is_the_window_holding_the_start_offset(tmp_path, start, window):
    q = MappedFileQueue(str(tmp_path), SIZE)
    try:
        assert q.get_or_create_last_mapped_file(start).file_from_offset == window
    finally:
        q.close()


def test_a_file_made_ahead_reserves_nothing_until_it_is_written(tmp_path, monkeypatch):
    """fallocate is replaced to fail (ENOSPC) once the first file is full: the file
    made ahead needed none, and an append into it then fails cleanly, writing nothing."""
    q = MappedFileQueue(str(tmp_path), SIZE, preallocate_next=True)
    try:
        fill(q.get_or_create_last_mapped_file(0))
        refuse_space(monkeypatch)
        second = q.get_or_create_last_mapped_file(0)          # made ahead: only mapped
        assert second.file_from_offset == SIZE
        with pytest.raises(StoreFileError, match="No space left on device"):
            second.append(b"x")
        assert second.wrote_position == 0 and os.stat(second.path).st_blocks == 0
        assert q.get_first_mapped_file().buf[:SIZE] == b"\xAB" * SIZE
    finally:
        q.close()


@pytest.fixture
def queue_from_8(tmp_path):
    """A loaded queue whose files start at 2*SIZE (older ones deleted): 2, 3, 4."""
    make_files(tmp_path, [2 * SIZE, 3 * SIZE, 4 * SIZE])
    q = MappedFileQueue(str(tmp_path), SIZE)
    q.load()
    yield q
    q.close()


def test_load_maps_every_file_with_positions_at_the_size(queue_from_8):
    q = queue_from_8
    assert [m.file_from_offset for m in q.mapped_files] == [2 * SIZE, 3 * SIZE, 4 * SIZE]
    assert all(m.wrote_position == SIZE for m in q.mapped_files)
    assert q.get_min_offset() == 2 * SIZE
    assert q.get_max_offset() == 5 * SIZE


def test_a_read_only_view_hides_files_past_its_bound_until_shown_again(tmp_path):
    make_files(tmp_path, [2 * SIZE, 3 * SIZE, 4 * SIZE])
    q = MappedFileQueue(str(tmp_path), SIZE, read_only=True)
    q.load()
    try:
        every = list(q.mapped_files)
        q.show_first(1)
        assert q.mapped_files == every[:1] and q.all_mapped_files() == every
        assert q.get_max_offset() == 3 * SIZE
        assert q.find_mapped_file_by_offset(3 * SIZE) is None
        q.refresh()                                  # maps and unmaps over every file
        assert q.mapped_files == every
        q.show_first(2)
        q.close()                                    # hidden files are closed too
        assert all(mf.fd == -1 for mf in every)
    finally:
        q.close()


def test_only_a_read_only_queue_hides_files(queue_from_8):
    with pytest.raises(AssertionError):
        queue_from_8.show_first(1)


@pytest.mark.parametrize("offset, expected", [
    (2 * SIZE, 2 * SIZE), (2 * SIZE + 1, 2 * SIZE), (3 * SIZE - 1, 2 * SIZE),
    (3 * SIZE, 3 * SIZE), (4 * SIZE + 123, 4 * SIZE), (5 * SIZE - 1, 4 * SIZE),
    (0, None), (2 * SIZE - 1, None), (5 * SIZE, None),
])
def test_find_mapped_file_by_offset_with_first_file_not_at_zero(queue_from_8, offset, expected):
    found = queue_from_8.find_mapped_file_by_offset(offset)
    assert (found.file_from_offset if found else None) == expected
    first = queue_from_8.find_mapped_file_by_offset(offset, return_first_on_not_found=True)
    assert first.file_from_offset == (2 * SIZE if expected is None else expected)


def test_find_mapped_file_by_offset_on_an_empty_queue(tmp_path):
    q = MappedFileQueue(str(tmp_path / "none"), SIZE)
    q.load()
    assert q.find_mapped_file_by_offset(0, True) is None
    assert q.get_min_offset() == -1 and q.get_max_offset() == 0


# ------------------------------------------------------------------ expiry by time
def loaded_queue(directory, count: int, old_indexes=(), age_h: int = 100) -> MappedFileQueue:
    """``count`` files; those in ``old_indexes`` last modified ``age_h`` hours ago."""
    make_files(directory, [i * SIZE for i in range(count)])
    for i in old_indexes:
        set_mtime_ms(path_of(directory, i * SIZE), now_ms() - age_h * HOUR_MS)
    q = MappedFileQueue(str(directory), SIZE)
    q.load()
    return q


def test_delete_expired_by_time_oldest_first_at_most_ten_never_the_last(tmp_path):
    q = loaded_queue(tmp_path, 14, old_indexes=range(14))
    try:
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == DELETE_FILES_BATCH_MAX
        assert DELETE_FILES_BATCH_MAX == 10
        assert [m.file_from_offset // SIZE for m in q.mapped_files] == [10, 11, 12, 13]
        assert names(tmp_path) == [offset_to_file_name(i * SIZE) for i in (10, 11, 12, 13)]
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 3
        assert [m.file_from_offset // SIZE for m in q.mapped_files] == [13]
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 0
        assert names(tmp_path) == [offset_to_file_name(13 * SIZE)]
    finally:
        q.close()


def test_delete_expired_by_time_stops_at_the_first_unexpired(tmp_path):
    q = loaded_queue(tmp_path, 6, old_indexes=[0, 1, 3, 4])
    try:
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 2
        assert [m.file_from_offset // SIZE for m in q.mapped_files] == [2, 3, 4, 5]
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 0
        assert len(names(tmp_path)) == 4
    finally:
        q.close()


def test_delete_expired_by_time_keeps_files_younger_than_the_reserved_time(tmp_path):
    q = loaded_queue(tmp_path, 3, old_indexes=[0, 1], age_h=71)
    try:
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 0
        assert q.delete_expired_file_by_time(70 * HOUR_MS, 0, 1000, False) == 2
    finally:
        q.close()


def test_clean_immediately_deletes_unexpired_files_but_not_the_last(tmp_path):
    q = loaded_queue(tmp_path, 4)
    try:
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, False) == 0
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 1000, True) == 3
        assert names(tmp_path) == [offset_to_file_name(3 * SIZE)]
    finally:
        q.close()


def test_a_held_file_stops_expiry_until_the_forcible_interval(tmp_path):
    q = loaded_queue(tmp_path, 4, old_indexes=range(4))
    try:
        held = q.mapped_files[1]
        assert held.hold()
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 100, False) == 1
        assert [m.file_from_offset // SIZE for m in q.mapped_files] == [1, 2, 3]
        assert os.path.exists(held.path)
        time.sleep(0.15)
        assert q.delete_expired_file_by_time(72 * HOUR_MS, 0, 100, False) == 2
        assert not os.path.exists(held.path)
    finally:
        q.close()


# ------------------------------------------------------------------ truncation, load
def test_truncate_dirty_files_zeroes_the_tail_and_unlinks_later_files(tmp_path):
    q = MappedFileQueue(str(tmp_path), SIZE)
    try:
        for byte in (0xA1, 0xA2, 0xA3):
            fill(q.get_or_create_last_mapped_file(0), byte)
        cut = SIZE + 100
        q.truncate_dirty_files(cut)
        assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE]
        assert names(tmp_path) == [offset_to_file_name(0), offset_to_file_name(SIZE)]
        holder = q.mapped_files[1]
        assert (holder.wrote_position, holder.committed_position, holder.flushed_position) \
            == (100, 100, 100)
        assert q.get_max_offset() == cut and q.get_max_wrote_position() == cut
        assert q.flushed_where <= cut
        with open(path_of(tmp_path, 0), "rb") as f:
            assert f.read() == b"\xA1" * SIZE
        st = os.stat(path_of(tmp_path, SIZE))
        assert st.st_size == SIZE and st.st_blocks * 512 < SIZE    # the cut tail punched
        with open(path_of(tmp_path, SIZE), "rb") as f:
            assert f.read() == b"\xA2" * 100 + bytes(SIZE - 100)
        assert holder.reserved_position <= 100
        assert holder.append(b"new")                 # appends continue at the cut,
        assert holder.buf[100:103] == b"new"         # reserved again first
        assert os.stat(path_of(tmp_path, SIZE)).st_blocks * 512 >= SIZE
    finally:
        q.close()


def test_truncate_at_a_file_boundary_keeps_the_next_file_empty(tmp_path):
    """As RocketMQ's truncateDirtyFiles: the file starting at the cut holds the offset,
    so it stays, emptied; only files wholly after it go."""
    q = MappedFileQueue(str(tmp_path), SIZE)
    try:
        for byte in (0xB1, 0xB2, 0xB3):
            fill(q.get_or_create_last_mapped_file(0), byte)
        q.truncate_dirty_files(SIZE)
        assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE]
        assert q.mapped_files[1].wrote_position == 0
        assert q.get_max_offset() == SIZE
        with open(path_of(tmp_path, 0), "rb") as f:
            assert f.read() == b"\xB1" * SIZE
        with open(path_of(tmp_path, SIZE), "rb") as f:
            assert f.read() == bytes(SIZE)
        assert names(tmp_path) == [offset_to_file_name(0), offset_to_file_name(SIZE)]
    finally:
        q.close()


def test_load_with_a_missing_middle_file_raises(tmp_path):
    make_files(tmp_path, [0, 2 * SIZE])
    q = MappedFileQueue(str(tmp_path), SIZE)
    with pytest.raises(StoreFileError) as e:
        q.load()
    assert offset_to_file_name(2 * SIZE) in str(e.value)
    q.close()


def test_load_with_a_wrong_size_file_raises(tmp_path):
    make_files(tmp_path, [0])
    with open(path_of(tmp_path, SIZE), "wb") as f:
        f.write(bytes(SIZE // 2))
    q = MappedFileQueue(str(tmp_path), SIZE)
    with pytest.raises(StoreFileError):
        q.load()
    q.close()
    assert os.path.getsize(path_of(tmp_path, SIZE)) == SIZE // 2


def write_short(directory, offset: int, length: int = 1000) -> str:
    path = path_of(directory, offset)
    with open(path, "wb") as f:
        f.write(b"\x11" * length)
    return path


def test_load_grows_a_short_last_file_back_for_recovery(tmp_path):
    make_files(tmp_path, [0, SIZE])
    path = write_short(tmp_path, 2 * SIZE)
    q = MappedFileQueue(str(tmp_path), SIZE)
    q.load(extend_short=True)
    try:
        assert q.mapped_files[2].was_extended and not q.mapped_files[1].was_extended
        assert os.path.getsize(path) == SIZE
        assert q.mapped_files[2].buf[:1000] == b"\x11" * 1000
    finally:
        q.close()


def test_load_refuses_a_short_file_and_leaves_it_alone(tmp_path):
    """Without confirmation that the configured size is the store's own, a file of
    another size is reported (SPEC 4.10.3), never grown."""
    make_files(tmp_path, [0, 2 * SIZE])
    path = write_short(tmp_path, SIZE)
    q = MappedFileQueue(str(tmp_path), SIZE)
    with pytest.raises(StoreFileError):
        q.load()
    q.close()
    assert os.path.getsize(path) == 1000


def test_load_refuses_a_short_file_followed_by_data(tmp_path):
    """Files are preallocated before use, so only the last written file can be short
    after a crash; a short file that data follows is damage to report, not to grow."""
    make_files(tmp_path, [0, 2 * SIZE])
    with open(path_of(tmp_path, 2 * SIZE), "r+b") as f:
        f.write(b"\x01")
    path = write_short(tmp_path, SIZE)
    q = MappedFileQueue(str(tmp_path), SIZE)
    with pytest.raises(StoreFileError):
        q.load(extend_short=True)
    q.close()
    assert os.path.getsize(path) == 1000


def test_load_grows_a_short_file_followed_only_by_a_preallocated_one(tmp_path):
    make_files(tmp_path, [0, 2 * SIZE])
    write_short(tmp_path, SIZE)
    q = MappedFileQueue(str(tmp_path), SIZE)
    q.load(extend_short=True)
    try:
        assert q.short_file_index == 1
        assert [os.path.getsize(m.path) for m in q.mapped_files] == [SIZE] * 3
    finally:
        q.close()


def test_load_ignores_names_that_are_not_offsets(tmp_path):
    make_files(tmp_path, [0])
    (tmp_path / "notes.txt").write_text("x")
    q = MappedFileQueue(str(tmp_path), SIZE)
    q.load()
    try:
        assert [m.file_from_offset for m in q.mapped_files] == [0]
    finally:
        q.close()


# ------------------------------------------------------------------ fault injection
def test_fallocate_enospc_fails_creation_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """fallocate is replaced to raise ENOSPC: a real disk cannot be filled on demand."""
    refuse_space(monkeypatch)
    with pytest.raises(StoreFileError) as e:
        MappedFile(path_of(tmp_path, 0), SIZE)
    assert "No space left" in str(e.value) or "ENOSPC" in str(e.value)
    assert names(tmp_path) == []


def test_queue_creation_under_enospc_raises_and_leaves_the_queue_unchanged(tmp_path, monkeypatch):
    """fallocate is replaced to raise ENOSPC once the first file exists."""
    q = MappedFileQueue(str(tmp_path), SIZE, preallocate_next=True)
    try:
        first = q.get_or_create_last_mapped_file(0)
        fill(first)
        os.unlink(path_of(tmp_path, SIZE))           # the preallocated next file is gone
        refuse_space(monkeypatch)
        with pytest.raises(StoreFileError):
            q.get_or_create_last_mapped_file(0)
        assert q.mapped_files == [first]
        assert names(tmp_path) == [offset_to_file_name(0)]
        monkeypatch.undo()
        assert q.get_or_create_last_mapped_file(0).file_from_offset == SIZE
    finally:
        q.close()


def test_refresh_maps_new_files_and_drops_deleted_ones(tmp_path):
    writer = MappedFileQueue(str(tmp_path), SIZE, preallocate_next=True)
    writer.get_or_create_last_mapped_file(0)
    reader = MappedFileQueue(str(tmp_path), SIZE, read_only=True)
    reader.load()
    try:
        assert [m.file_from_offset for m in reader.mapped_files] == [0, SIZE]
        fill(writer.mapped_files[0])
        writer.get_or_create_last_mapped_file(0)  # maps SIZE, preallocates 2*SIZE
        reader.refresh()
        assert [m.file_from_offset for m in reader.mapped_files] == [0, SIZE, 2 * SIZE]
        with open(path_of(tmp_path, 3 * SIZE), "wb"):  # being created: not full size yet
            pass
        reader.refresh(min_offset=SIZE)
        assert [m.file_from_offset for m in reader.mapped_files] == [SIZE, 2 * SIZE]
    finally:
        reader.close()
        writer.close()


def test_refresh_after_the_cleaner_passed_every_file_mapped_and_the_next(tmp_path):
    """A view that looked away while the log rolled on and the cleaner deleted every
    file it mapped and those after it: it used to keep its last file (gone) and wait for
    one named right after it, which never came again, so every read of the live files
    was "expired" for good (the reader process's remote reads). It starts again from
    the files there are."""
    writer = MappedFileQueue(str(tmp_path), SIZE)
    writer.get_or_create_last_mapped_file(0)
    reader = MappedFileQueue(str(tmp_path), SIZE, read_only=True)
    reader.load()
    try:
        assert [m.file_from_offset for m in reader.mapped_files] == [0]
        for _ in range(4):
            fill(writer.get_last_mapped_file())
            writer.get_or_create_last_mapped_file(0)
        assert writer.delete_expired_file_by_time(-1, 0, 0, True) == 4   # 0 .. 3*SIZE
        reader.refresh(min_offset=4 * SIZE)
        assert [m.file_from_offset for m in reader.mapped_files] == [4 * SIZE]
        fill(writer.get_last_mapped_file())
        writer.get_or_create_last_mapped_file(0)
        reader.refresh(min_offset=4 * SIZE)
        assert [m.file_from_offset for m in reader.mapped_files] == [4 * SIZE, 5 * SIZE]
    finally:
        reader.close()
        writer.close()


def test_truncate_keeping_files_zeroes_later_files_in_place(tmp_path):
    """A restarting writer must not unlink files other processes map: the next file
    is zeroed and closed, keeping its inode, and comes back when the log reaches it."""
    q = MappedFileQueue(str(tmp_path), SIZE)
    first = q.get_or_create_last_mapped_file(0)
    fill(first)
    second = q.get_or_create_last_mapped_file(0)
    assert second.append(b"\x07" * 100)
    inode = os.stat(second.path).st_ino
    q.truncate_dirty_files(SIZE - 500, keep_files=True)
    try:
        assert [m.file_from_offset for m in q.mapped_files] == [0]
        assert os.stat(path_of(tmp_path, SIZE)).st_ino == inode
        with open(path_of(tmp_path, SIZE), "rb") as f:
            assert f.read() == bytes(SIZE)
        fill(q.mapped_files[0])
        again = q.get_or_create_last_mapped_file(0)
        assert os.stat(again.path).st_ino == inode
    finally:
        q.close()


def test_a_read_only_file_holds_one_descriptor_its_mapping_s(tmp_path):
    """Python's mmap keeps a descriptor of its own; a read-only file needs no other."""
    path = str(tmp_path / "00000000000000000000")
    MappedFile(path, 8192).close()
    fds = lambda: len(os.listdir("/proc/self/fd"))      # noqa: E731
    before = fds()
    writable = MappedFile(path, 8192)
    assert fds() == before + 2          # its own (fdatasync) and the mapping's
    readers = [MappedFile(path, 8192, read_only=True) for _ in range(3)]
    assert fds() == before + 2 + 3
    assert readers[0].may_hold_data() is False and fds() == before + 5
    writable.append(b"x")
    assert readers[0].may_hold_data() is True and bytes(readers[0].buf[:1]) == b"x"
    for mf in readers + [writable]:
        mf.close()
    assert fds() == before
