"""IndexService: the list of IndexFiles under ``{root}/index`` and the index's verbs.

The service owns the ``index/`` directory: it builds the index from dispatched messages
(``build_index``), answers key queries (``query_offset``), flushes (``flush``), and
deletes files whose messages the CommitLog no longer holds (``delete_expired_file``).
Files are kept oldest first; only the last one is written. The layout of one file is in
``storage.index_file``.

Single writer: one dispatching process owns an IndexService and is the only one that
builds, flushes or deletes. Nothing here locks; callers in one process that query from
another thread serialise access themselves. ``flush`` alone may run on another thread
beside puts (the dispatcher's flush thread): it reads the endTimestamp before the
fdatasync, and a put moves that time only once its entry, header and slot are written.

Durability and the checkpoint. The index is flushed when its last file is full and the
next one is created (RocketMQ's FlushIndexFileThread, done here synchronously), and
whenever the owner calls ``flush()``. After each flush ``durable_timestamp`` holds the
flushed file's endTimestamp: every entry put before that flush is on disk. The owner
copies it into the checkpoint's ``indexMsgTimestamp``; the service never writes the
checkpoint itself. After ``load`` it starts at the checkpoint value it was given.

Crash story, as a decision table for ``load(last_exit_ok, index_checkpoint_ms)``:

    last_exit_ok  file's endTimestamp          action
    True          any                          keep (a clean stop left it whole)
    False         <= index_checkpoint_ms       keep (flushed before the crash)
    False         >  index_checkpoint_ms       destroy; abnormal recovery re-dispatches
                                               the CommitLog and rebuilds the entries of
                                               messages after its start point (all of
                                               them when message_index_safe puts the
                                               start at or before the index time)
    any           name not all digits          skip (not an index file), leave on disk

Re-dispatch is nearly idempotent: ``build_index`` skips a message whose offset is below
the last file's endPhyOffset. As in RocketMQ the message *at* endPhyOffset is indexed a
second time, so a query can return one offset twice; callers drop duplicates. Entries
are only hashes, so every query result is a candidate the caller verifies against the
CommitLog; a stale or torn entry can hide a message from a query but never return a
wrong one.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Sequence

import numpy as np

from rocketstore.storage.errors import StoreError
from rocketstore.storage.hashing import index_key_hash, index_key_hash_raw, index_key_hashes
from rocketstore.storage.index_file import (
    IndexFile, human_string_to_time_millis, time_millis_to_human_string)
from rocketstore.storage.mapped_file import now_ms, unlink_quietly
from rocketstore.storage.message import KEY_SEPARATOR, TRANSACTION_ROLLBACK_TYPE

log = logging.getLogger(__name__)
_RAW_SEPARATOR = KEY_SEPARATOR.encode()


class QueryOffsetResult(NamedTuple):
    """``QueryOffsetResult``: candidate offsets, newest file first, and the last file's
    end values at the time of the query."""
    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


def build_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``: ``topic#key``."""
    return topic + "#" + key


def query_offset(files: Sequence, topic: str, key: str, max_num: int, begin_ms: int,
                 end_ms: int) -> QueryOffsetResult:
    """``IndexService.queryOffset`` over index files given oldest first (IndexFile or
    anything with ``begin_timestamp``, ``end_timestamp``, ``end_phy_offset``,
    ``is_time_matched`` and ``select_phy_offset``): candidates, newest file first."""
    phy_offsets: list[int] = []
    if not files:
        return QueryOffsetResult(phy_offsets, 0, 0)
    last = files[-1]
    last_timestamp, last_phy_offset = last.end_timestamp, last.end_phy_offset
    index_key = build_key(topic, key)
    for f in reversed(files):
        if f.is_time_matched(begin_ms, end_ms):
            phy_offsets.extend(f.select_phy_offset(
                index_key, max_num - len(phy_offsets), begin_ms, end_ms))
        if f.begin_timestamp < begin_ms or len(phy_offsets) >= max_num:
            break
    return QueryOffsetResult(phy_offsets, last_timestamp, last_phy_offset)


class IndexService:
    """The index files of one store, oldest first; the last one is written."""

    def __init__(self, index_dir: str, hash_slot_num: int, index_num: int):
        assert hash_slot_num > 0 and index_num > 1, (hash_slot_num, index_num)
        self.index_dir = index_dir
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.durable_timestamp = 0
        self._files: list[IndexFile] = []
        self.create_error: BaseException | None = None   # why the last file was not made

    @property
    def files(self) -> list[IndexFile]:
        """The open index files, oldest first (a copy of the list)."""
        return list(self._files)

    # ----------------------------------------------------------------- load
    def load(self, last_exit_ok: bool, index_checkpoint_ms: int) -> None:
        """``IndexService.load(lastExitOK)``: open every index file, in name order.

        After an abnormal exit a file whose endTimestamp is newer than
        ``index_checkpoint_ms`` is destroyed (see the module's decision table), and so
        is every file after it: re-dispatch rebuilds the index from the last file kept,
        so what is kept must be a prefix, never one with a hole. Names that are not all
        digits are skipped. Raises ``StoreFileError`` (wrong size,
        unreadable) or ``CorruptRecordError`` (impossible header) for a file that cannot
        be loaded; files opened before it are closed again.
        """
        assert not self._files, "load() on a service that already has files"
        try:
            names = sorted(os.listdir(self.index_dir))
        except FileNotFoundError:
            names = []
        try:
            for i, name in enumerate(names):
                if not self._load_one(name, last_exit_ok, index_checkpoint_ms):
                    for later in names[i + 1:]:
                        if later.isdigit():
                            log.info("destroy index file %s: it follows one destroyed", later)
                            unlink_quietly(os.path.join(self.index_dir, later))
                    break
        except BaseException:
            self.close()
            raise
        self.durable_timestamp = index_checkpoint_ms

    def _load_one(self, name: str, last_exit_ok: bool, index_checkpoint_ms: int) -> bool:
        """Load one file; False when it was destroyed instead."""
        path = os.path.join(self.index_dir, name)
        if not name.isdigit() or not os.path.isfile(path):
            log.warning("skip %s: not an index file", path)
            return True
        f = IndexFile(path, self.hash_slot_num, self.index_num)
        if not last_exit_ok and f.end_timestamp > index_checkpoint_ms:
            log.info("destroy index file %s: endTimestamp %d is newer than the "
                     "checkpoint's %d", name, f.end_timestamp, index_checkpoint_ms)
            f.destroy()
            return False
        log.info("load index file OK, %s", name)
        self._files.append(f)
        return True

    # ----------------------------------------------------------------- build
    def build_index(self, topic: str, commit_log_offset: int, store_timestamp: int,
                    sys_flag: int, uniq_key: str | None, keys: str | None) -> bool:
        """``IndexService.buildIndex``: index ``topic#uniq_key`` and ``topic#k`` for each
        non-empty space-separated ``k`` in ``keys``, all pointing at
        ``commit_log_offset``.

        Skips (returning True) a message below the last file's endPhyOffset (already
        indexed: re-dispatch after recovery) and ROLLBACK messages. Of the message at
        endPhyOffset (the last one put, which re-dispatch passes again) it puts only the
        keys not there yet (``_held``): every start would otherwise add its keys once
        more. Rolls to a new file
        whenever the last one is full. Returns False only when no index file could be
        created (the caller stops building the index and marks the store's index
        error). Raises ``OSError`` when flushing a full file fails.
        """
        index_file = self._file_to_index(commit_log_offset, sys_flag)
        if not isinstance(index_file, IndexFile):
            return index_file
        names = [] if uniq_key is None else [uniq_key]
        if keys:
            names += [key for key in keys.split(KEY_SEPARATOR) if key]
        return self._put_hashes(index_file, [index_key_hash(topic + "#" + name)
                                             for name in names],
                                commit_log_offset, store_timestamp)

    def build_index_raw(self, topic: str, commit_log_offset: int, store_timestamp: int,
                        sys_flag: int, uniq_key: bytes | None, keys: bytes | None) -> bool:
        """``build_index`` with UNIQ_KEY and KEYS as raw property bytes (as
        ``dispatch_batch.parse_small`` finds them): the same entries. Dispatch's common
        message (one key, no UNIQ_KEY, not a ROLLBACK, past the last file's end) goes
        straight into the last file while it has room."""
        files = self._files
        if uniq_key is None and keys is not None and files and \
                sys_flag & TRANSACTION_ROLLBACK_TYPE != TRANSACTION_ROLLBACK_TYPE and \
                _RAW_SEPARATOR not in keys:
            last = files[-1]
            if commit_log_offset > last.end_phy_offset and last.put_hash(
                    index_key_hash_raw(_key_prefix(topic) + keys), commit_log_offset,
                    store_timestamp):
                return True
        index_file = self._file_to_index(commit_log_offset, sys_flag)
        if not isinstance(index_file, IndexFile):
            return index_file
        prefix = _key_prefix(topic)
        if uniq_key is None and keys is not None and _RAW_SEPARATOR not in keys:
            hashes = [index_key_hash_raw(prefix + keys)]          # the common case
        else:
            names = [] if uniq_key is None else [uniq_key]
            if keys is not None:
                names += [key for key in keys.split(_RAW_SEPARATOR) if key]
            hashes = [index_key_hash_raw(prefix + name) for name in names]
        return self._put_hashes(index_file, hashes, commit_log_offset, store_timestamp)

    def _file_to_index(self, commit_log_offset: int, sys_flag: int) -> IndexFile | bool:
        """The file a message's keys go to; True when the message is not to be indexed
        (below the last file's endPhyOffset, or ROLLBACK), False when no file could be
        created."""
        index_file = self._get_and_create_last_index_file()
        if index_file is None:
            log.error("build index error, stop building index")
            return False
        if commit_log_offset < index_file.end_phy_offset:
            return True
        if sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE:
            return True
        return index_file

    def _put_hashes(self, index_file: IndexFile, key_hashes: list[int],
                    commit_log_offset: int, store_timestamp: int) -> bool:
        """Put one message's keys, rolling to new files while the last is full; of the
        message at endPhyOffset only the keys not there yet (``_held``). False when no
        new file could be created."""
        again = commit_log_offset == index_file.end_phy_offset   # the last record put
        for key_hash in key_hashes:
            if again and self._held(key_hash, commit_log_offset):
                continue
            while not index_file.put_hash(key_hash, commit_log_offset, store_timestamp):
                log.warning("Index file [%s] is full, trying to create another one",
                            index_file.file_name)
                index_file = self._get_and_create_last_index_file()
                if index_file is None:
                    log.error("putKey error commitlog %d", commit_log_offset)
                    return False
        return True

    def build_index_run(self, topics: Sequence[str], phy_offsets: np.ndarray,
                        store_timestamps: np.ndarray, sys_flags: np.ndarray,
                        uniq_keys: Sequence[bytes | None], keys: Sequence[bytes | None]) -> bool:
        """``build_index`` for a run of messages in CommitLog order, with their UNIQ_KEY
        and KEYS as raw property bytes: the same entries, in the same order and bytes,
        hashed in one numpy pass and written a block per file (``IndexFile.put_entries``).
        Returns False only when no index file could be created."""
        index_file = self._get_and_create_last_index_file()
        if index_file is None:
            log.error("build index error, stop building index")
            return False
        wanted = (phy_offsets >= index_file.end_phy_offset) & (
            sys_flags & TRANSACTION_ROLLBACK_TYPE != TRANSACTION_ROLLBACK_TYPE)
        names, owners = _index_keys(topics, uniq_keys, keys, np.flatnonzero(wanted).tolist())
        if not names:
            return True
        hashes = index_key_hashes(names)
        owner = np.asarray(owners, np.int64)
        phys, stamps = phy_offsets[owner], store_timestamps[owner]
        again = np.flatnonzero(phys == index_file.end_phy_offset)    # the last record put
        if len(again):
            held = [i for i in again.tolist() if self._held(int(hashes[i]), int(phys[i]))]
            if held:
                hashes, phys, stamps = (np.delete(a, held) for a in (hashes, phys, stamps))
                if not len(hashes):
                    return True
        done = 0
        while True:
            done += index_file.put_entries(hashes[done:], phys[done:], stamps[done:])
            if done == len(hashes):
                return True
            log.warning("Index file [%s] is full, trying to create another one",
                        index_file.file_name)
            index_file = self._get_and_create_last_index_file()
            if index_file is None:
                log.error("putKey error commitlog %d", int(phys[done]))
                return False

    def _held(self, key_hash: int, phy_offset: int) -> bool:
        """Whether the record at ``phy_offset``, the last one put, has an entry for
        ``key_hash``: in the last file, or in the files before it that end with that
        record (its keys may have filled one file and gone on in the next)."""
        for f in reversed(self._files):
            if f.end_phy_offset != phy_offset:
                return False
            if f.holds_newest(key_hash, phy_offset):
                return True
        return False

    def _get_and_create_last_index_file(self) -> IndexFile | None:
        """``getAndCreateLastIndexFile``: the last file if it has room, else a new one
        that starts at the previous file's end offset and time.

        The full previous file is flushed first and its endTimestamp becomes
        ``durable_timestamp``. Returns None (logged) when the new file cannot be
        created; raises ``OSError`` when the flush fails.
        """
        files = self._files
        prev = files[-1] if files else None
        if prev is not None and not prev.is_write_full():
            return prev
        if prev is not None:
            prev.flush()
            self.durable_timestamp = prev.end_timestamp
        try:
            f = IndexFile(self._next_file_path(), self.hash_slot_num, self.index_num,
                          prev.end_phy_offset if prev else 0, prev.end_timestamp if prev else 0)
        except (StoreError, OSError) as e:
            log.error("cannot create an index file in %s: %s", self.index_dir, e)
            self.create_error = e
            return None
        self.create_error = None
        files.append(f)
        return f

    def _next_file_path(self) -> str:
        """A new file's path, named by the current time (``yyyyMMddHHmmssSSS``).

        The name is unique (1 ms is added while it exists) and sorts after the last
        file's, even if the clock went back; only a daylight-saving fall-back hour can
        still produce an earlier name, as in RocketMQ.
        """
        timestamp_ms = now_ms()
        if self._files:
            last_name = self._files[-1].file_name
            if time_millis_to_human_string(timestamp_ms) <= last_name:
                try:
                    timestamp_ms = max(timestamp_ms,
                                       human_string_to_time_millis(last_name) + 1)
                except ValueError:
                    pass  # a loaded file with an odd digit name: uniqueness suffices
        while True:
            path = os.path.join(self.index_dir, time_millis_to_human_string(timestamp_ms))
            if not os.path.exists(path):
                return path
            timestamp_ms += 1

    # ----------------------------------------------------------------- flush
    def flush(self) -> int:
        """Flush the last file; return its endTimestamp and record it as
        ``durable_timestamp``. Returns 0, changing nothing, when there is no file.
        Raises ``OSError`` when fdatasync fails.
        """
        if not self._files:
            return 0
        last = self._files[-1]
        end_timestamp = last.end_timestamp    # read first: a put may come during the flush
        last.flush()
        self.durable_timestamp = end_timestamp
        return end_timestamp

    # ----------------------------------------------------------------- query
    def query_offset(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> QueryOffsetResult:
        """``queryOffset``: candidate CommitLog offsets of messages indexed under
        ``topic#key`` and stored in ``[begin_ms, end_ms]``, at most ``max_num``.

        Files are searched newest first, only those whose time range overlaps, until
        ``max_num`` offsets are found or a file begins before ``begin_ms``. Offsets are
        raw: the caller re-reads each message and checks topic and key (and caps
        ``max_num``, at 64 in RocketMQ). Raises ``StoreClosedError`` after close.
        """
        return query_offset(self._files, topic, key, max_num, begin_ms, end_ms)

    def delete_expired_file(self, min_commit_log_offset: int, *, unlink: bool = True) -> int:
        """``deleteExpiredFile(offset)``: destroy the index files every entry of which
        points below ``min_commit_log_offset`` (the CommitLog's new min offset).

        Oldest first, never the last (written) file, stopping at the first file kept.
        Without ``unlink`` the files are only unmapped (a process that follows the
        cleaner, which unlinks them: the dispatcher). Returns how many files went.
        Raises nothing.
        """
        files = self._files
        if not files or files[0].end_phy_offset >= min_commit_log_offset:
            return 0
        count = 0
        while count < len(files) - 1 and files[count].end_phy_offset < min_commit_log_offset:
            count += 1
        expired, self._files = files[:count], files[count:]
        for f in expired:
            if not unlink:
                f.close()
                continue
            log.info("destroy expired index file %s (endPhyOffset %d < %d)",
                     f.file_name, f.end_phy_offset, min_commit_log_offset)
            f.destroy()
        return count

    # ----------------------------------------------------------------- lifecycle
    def truncate(self, commit_log_offset: int, store_timestamp_of) -> int:
        """Forget every entry for a CommitLog offset >= ``commit_log_offset`` (recovery
        cut the CommitLog there): newer files whose first entry lies past the cut are
        destroyed, the file holding the cut is truncated. Returns the entries dropped."""
        dropped = 0
        while self._files:
            last = self._files[-1]
            if last.index_count <= 1:  # no entry: drop it if it claims to lie past the cut
                if len(self._files) > 1 and last.end_phy_offset >= commit_log_offset:
                    last.destroy()
                    self._files.pop()
                    continue
                break
            if last.end_phy_offset < commit_log_offset:
                break
            if last.first_entry_at_or_after(commit_log_offset) <= 1:
                dropped += last.index_count - 1
                log.warning("destroy index file %s: it starts past the recovered "
                            "commitlog end %d", last.file_name, commit_log_offset)
                last.destroy()
                self._files.pop()
                continue
            dropped += last.truncate(commit_log_offset, store_timestamp_of)
            break
        return dropped

    def close(self) -> None:
        """Close every file, keeping them on disk. Raises nothing."""
        files, self._files = self._files, []
        for f in files:
            f.close()

    def destroy(self) -> None:
        """Destroy every index file and unlink every other file in the directory (the
        directory and any subdirectories stay); ``durable_timestamp`` returns to 0.
        Raises ``OSError`` when a file cannot be removed.
        """
        files, self._files = self._files, []
        for f in files:
            f.destroy()
        try:
            names = os.listdir(self.index_dir)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.index_dir, name)
            if os.path.isfile(path) or os.path.islink(path):
                os.unlink(path)
        self.durable_timestamp = 0


_KEY_PREFIXES: dict[str, bytes] = {}


def _key_prefix(topic: str) -> bytes:
    prefix = _KEY_PREFIXES.get(topic)
    if prefix is None:
        prefix = (topic + "#").encode("utf-8")
        if len(_KEY_PREFIXES) < 4096:
            _KEY_PREFIXES[topic] = prefix
    return prefix


def _index_keys(topics: Sequence[str], uniq_keys: Sequence[bytes | None],
                keys: Sequence[bytes | None], which: list[int]) -> tuple[list[bytes], list[int]]:
    """The index keys (``topic#key``, UTF-8) of messages ``which``, each message's
    UNIQ_KEY first, then its non-empty space-separated KEYS, with each key's message.
    Messages with at most one key each (no UNIQ_KEY, no separator in KEYS: the common
    case) take one comprehension."""
    separator = KEY_SEPARATOR.encode()
    prefix_of = {t: _key_prefix(t) for t in dict.fromkeys(topics)}
    more = [keys[i] for i in which]
    if not any(uniq_keys[i] for i in which) and \
            separator not in b"".join(k for k in more if k):
        owners = [i for i, k in zip(which, more) if k]
        names = [prefix_of[topics[i]] + keys[i] for i in owners]
        return names, owners
    names: list[bytes] = []
    owners = []
    for i in which:
        prefix = prefix_of[topics[i]]
        uniq, more_keys = uniq_keys[i], keys[i]
        if uniq:
            names.append(prefix + uniq)
            owners.append(i)
        if more_keys:
            for key in more_keys.split(separator):
                if key:
                    names.append(prefix + key)
                    owners.append(i)
    return names, owners
