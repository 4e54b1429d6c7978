"""Shared fixtures: tiny stores in temporary directories.

RocketMQ's own tests use 8 KiB-10 MiB commitlog files; ``small_config`` does the same so
roll-over, expiry and recovery across many files happen with a few hundred messages.
"""

from __future__ import annotations

import errno
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from rocketstore.storage import GetMessageStatus, Message, MessageStore, StoreConfig  # noqa: E402

SMALL = dict(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=20 * 32,
             max_hash_slot_num=64, max_index_num=256, flush_interval_commit_log=0,
             flush_interval_consume_queue=0)


def small_config(root, **overrides) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), **{**SMALL, **overrides})


@pytest.fixture(autouse=True, scope="session")
def neutral_working_directory():
    """Every test runs in an empty directory: none may depend on what the directory the
    suite was started from holds (a ``./store`` the README's first command leaves)."""
    from store_processes import WORK_DIR
    before = os.getcwd()
    os.chdir(WORK_DIR)
    yield
    os.chdir(before)


@pytest.fixture
def config(tmp_path):
    return small_config(tmp_path / "store")


@pytest.fixture
def store(config):
    s = MessageStore(config)
    s.load()
    yield s
    s.close()


def msg(i: int = 0, topic: str = "TopicTest", queue_id: int | None = 0, **kw) -> Message:
    """A message whose body, tag and key are derived from ``i``."""
    kw.setdefault("tags", f"Tag{i % 3}")
    kw.setdefault("keys", [f"key-{i}"])
    return Message(topic=topic, body=f"body-{i}".encode() * (1 + i % 4), queue_id=queue_id,
                   **kw)


def mount_tmpfs(path, size: str):
    """A real small file system to fill: a tmpfs of ``size`` (``48m``) mounted at
    ``path``; yields the path and unmounts it. Needs root: skipped otherwise, with the
    reason (the ENOSPC injections of other tests stay for the cases a real disk cannot
    produce on demand)."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root: the real full disk is not tried here")
    os.makedirs(path)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def take_every_byte(path: str) -> None:
    """Another program fills the file system, to its last block."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    f.write(b"\xff" * chunk)
            except OSError:
                pass


def reopen(config: StoreConfig) -> MessageStore:
    s = MessageStore(config)
    s.load()
    return s


def crash(s: MessageStore) -> None:
    """Leave the store as a killed process would: files unflushed, abort file kept,
    nothing closed cleanly (the lock goes with the descriptor, the file-allocating thread
    with the process)."""
    if s.services is not None:
        s.services.stop()
    s.commit_log.stop_allocation()
    s._lock_file.release()
    s._state = "crashed"


def refuse_space(monkeypatch) -> None:
    """Every new mapped file fails to allocate with ENOSPC: injected through
    ``storage.mapped_file.FILE_OPS``, as a real disk cannot be filled on demand."""
    from rocketstore.storage.mapped_file import FILE_OPS

    def enospc(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(FILE_OPS, "fallocate", enospc)


def refuse_next_commit_log_file(config: StoreConfig, offset: int, monkeypatch,
                                commit_log=None) -> None:
    """The CommitLog cannot grow past the file holding ``offset``: its appender's
    allocation thread (``commit_log``'s) is stopped, files named past it (the ones made
    ahead) are removed and creating one fails with ENOSPC (``refuse_space``)."""
    if commit_log is not None:
        commit_log.stop_allocation()
    for name in os.listdir(config.commit_log_dir):
        if name.isdigit() and int(name) > offset:
            os.unlink(os.path.join(config.commit_log_dir, name))
    refuse_space(monkeypatch)


def destroy_context(context) -> None:
    """Close a ZeroMQ context's sockets at once and end it; a term() that does not
    return within 5 s (seen once under a loaded machine) is left to the daemon thread
    instead of hanging the test run."""
    import threading
    worker = threading.Thread(target=context.destroy, kwargs={"linger": 0}, daemon=True)
    worker.start()
    worker.join(5)


def read_queue(store: MessageStore, topic: str, queue_id: int) -> list:
    """Every message of a queue through ``get_message``, from offset 0."""
    out, offset = [], 0
    while True:
        r = store.get_message("g", topic, queue_id, offset, 32)
        if r.status is not GetMessageStatus.FOUND:
            assert r.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE,
                                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE), (topic, queue_id, r)
            return out
        out += r.messages
        offset = r.next_begin_offset


@pytest.fixture(scope="module")
def spark():
    """A local Spark session for a module's Spark tests (local[2], up to 4 attempts per
    task so a task whose worker is killed is retried), with the rocketstore format. It
    ends with the module, and py4j's gateway with it (``stop_spark``): the tests after
    it run in a worker without the gateway's JVM and threads."""
    session = start_spark()
    yield session
    stop_spark(session)


def start_spark(attempts: int = 2):
    """``spark_session`` for the tests; a JVM that exits before it sends the gateway's
    port (pyspark's JAVA_GATEWAY_EXITED, with nothing printed: seen once in a full
    suite run on a busy machine) is launched again, once, with a warning in the test
    summary. Any other failure, or a second exit, fails the module's tests."""
    import warnings
    from rocketstore.spark.demo import spark_session
    for attempt in range(1, attempts + 1):
        try:
            return spark_session("rocketstore-tests", master="local[2,4]")
        except Exception as e:
            if "JAVA_GATEWAY_EXITED" not in str(e) or attempt == attempts:
                raise
            warnings.warn(f"Spark's JVM exited before its gateway started ({e}); "
                          "launching it again")


def stop_spark(session, timeout_s: float = 30) -> None:
    """Stop ``session``, then py4j's gateway, which ``SparkSession.stop`` leaves running:
    its finalizer thread sleeps in a loop (a second a turn) for as long as the process
    lives, in every test after (one patching ``time.sleep`` saw it), and its JVM exits
    only when its stdin closes. The next session launches a gateway of its own."""
    import subprocess
    import threading
    from py4j.clientserver import FinalizerWorker
    from pyspark import SparkContext
    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    for thread in threading.enumerate():
        if isinstance(thread, FinalizerWorker):
            thread.join(timeout_s)      # it reads the gateway's end after its sleep
    jvm = getattr(gateway, "proc", None)
    if jvm is not None:
        jvm.stdin.close()
        try:
            jvm.wait(timeout_s)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait()
