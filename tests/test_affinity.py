"""Where the store's processes run (procs.affinity): their names, and the writer kept on
one CPU. Real stores under ``rocketstore up``; the CPUs are read from /proc."""

from __future__ import annotations

import ast
import json
import os
import re
from collections import Counter

import pytest
from store_processes import RunningStore, cli

from rocketstore.procs import affinity
from rocketstore.storage import StoreConfig
from rocketstore.storage.errors import StoreConfigError

ALLOWED = os.sched_getaffinity(0)
needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="the writer is pinned only "
                                    "where it may use two CPUs or more")


def store_in(path, **store) -> RunningStore:
    path.mkdir()
    return RunningStore(path, **store)


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def thread_cpus(pid: int) -> dict[int, set[int]]:
    """Every thread of ``pid`` and the CPUs it may run on."""
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_choose_cpu_takes_the_cpu_fewest_writers_are_kept_on_the_highest_first():
    assert affinity.choose_cpu({0, 1, 2, 3}, -1, Counter()) == 3
    assert affinity.choose_cpu({0, 1, 2, 3}, -1, Counter({3: 1})) == 2
    assert affinity.choose_cpu({0, 1}, -1, Counter({0: 1, 1: 2})) == 0
    assert affinity.choose_cpu({0, 1}, -1, Counter({5: 4})) == 1   # not ours to use
    assert affinity.choose_cpu({4}, -1, Counter()) is None          # one CPU: none pinned
    assert affinity.choose_cpu({0, 1}, 0, Counter({0: 3})) == 0     # writer_cpu wins


def test_process_names_fit_the_kernel_limit():
    assert affinity.process_name("writer") == affinity.WRITER_NAME == "rs-writer"
    assert affinity.process_name("transaction_service") == "rs-transaction_"


def test_writer_cpu_below_minus_one_is_refused():
    with pytest.raises(StoreConfigError, match="writer_cpu"):
        StoreConfig(writer_cpu=-2)


@needs_two_cpus
def test_the_writer_and_its_threads_but_the_allocator_keep_one_cpu_and_processes_are_named(
        tmp_path):
    """The writer's ZeroMQ threads inherit its CPU; the allocation thread, whose
    read-ahead takes up to 18 ms of CPU at once, runs on the others
    (``affinity.free_thread``)."""
    store = RunningStore(tmp_path).start()
    try:
        writer = store.child_pid("writer")
        assert comm(writer) == "rs-writer"
        assert comm(store.child_pid("dispatcher")) == "rs-dispatcher"
        threads = thread_cpus(writer)
        assert len(threads) > 2                     # ZeroMQ's I/O thread, the allocation's
        cpus = os.sched_getaffinity(writer)
        assert len(cpus) == 1 and cpus <= ALLOWED
        freed = [tid for tid, c in threads.items() if c != cpus]
        assert len(freed) == 1 and threads[freed[0]] == ALLOWED - cpus, threads
        assert os.sched_getaffinity(store.child_pid("dispatcher")) == ALLOWED
        assert f"the writer is kept on CPU {next(iter(cpus))}" in store.log()
        status = json.loads(cli("status", "--store", store.store_dir, "--json").stdout)
        assert status["processes"]["writer"]["cpus"] == sorted(cpus)
        assert status["processes"]["dispatcher"]["cpus"] == sorted(ALLOWED)
        text = cli("status", "--store", store.store_dir).stdout
        assert f"kept on CPU {next(iter(cpus))}" in text and text.count("kept on CPU") == 1
    finally:
        store.stop()


@needs_two_cpus
def test_a_second_store_keeps_its_writer_where_the_fewest_other_writers_are(tmp_path):
    """The second store's writer sees the first's, and takes the CPU fewest other
    writers are kept on (the highest of those). Other stores may run beside this test
    (the suite's other worker): the rule is checked against what the writer saw, as its
    log says."""
    first = store_in(tmp_path / "a").start()
    second = store_in(tmp_path / "b")
    try:
        second.start()
        a = os.sched_getaffinity(first.child_pid("writer"))
        b = os.sched_getaffinity(second.child_pid("writer"))
        assert len(a) == len(b) == 1
        seen = re.search(r"the writer is kept on CPU (\d+) \(other stores' writers kept on "
                         r"each CPU: (\{.*?\})\)", second.log())
        chosen, kept = int(seen[1]), Counter(ast.literal_eval(seen[2]))
        assert {chosen} == b and kept[next(iter(a))] >= 1
        assert chosen == min(ALLOWED, key=lambda cpu: (kept[cpu], -cpu))
    finally:
        second.stop()
        first.stop()


@needs_two_cpus
def test_writer_cpu_names_the_cpu_and_affinity_off_leaves_the_writer_free(tmp_path):
    lowest = min(ALLOWED)
    store = store_in(tmp_path / "set", writer_cpu=lowest).start()
    try:
        assert os.sched_getaffinity(store.child_pid("writer")) == {lowest}
    finally:
        store.stop()
    store = store_in(tmp_path / "off", writer_cpu_affinity=False).start()
    try:
        assert os.sched_getaffinity(store.child_pid("writer")) == ALLOWED
        assert "kept on CPU" not in store.log()
    finally:
        store.stop()


def test_a_writer_cpu_the_store_may_not_use_is_logged_and_the_writer_runs_free(tmp_path):
    store = RunningStore(tmp_path, writer_cpu=max(ALLOWED) + 1000).start()
    try:
        assert os.sched_getaffinity(store.child_pid("writer")) == ALLOWED
        assert f"writer_cpu {max(ALLOWED) + 1000} cannot be used here" in store.log()
    finally:
        store.stop()
