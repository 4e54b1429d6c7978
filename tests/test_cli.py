"""The ``rocketstore`` command line, run as a real subprocess.

Every test runs ``python -m cli.main ...`` with the project root as working directory
and on PYTHONPATH, against store directories under ``tmp_path``; outputs are parsed
from stdout and exit codes checked (0 ok, 1 failed, 2 usage, 3 store unusable). The
lock test starts a second real process that holds a store open.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

import refcodec
from rocketstore.client import group_offsets
from rocketstore.client import ClientError, Consumer, Producer, ReaderClient
from rocketstore.shm.positions import PositionTableError
from rocketstore.storage import Message, StoreConfig
from store_processes import WORK_DIR, RunningStore, wait_for, wait_past_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
ZERO_NAME = "0" * 20

# a small geometry, passed with --config to every command that opens the store
SMALL_TOML = """
[store]
mapped_file_size_commit_log = 65536
mapped_file_size_consume_queue = 20000
max_hash_slot_num = 1000
max_index_num = 4000
"""

HOLDER = r"""
import sys
from rocketstore.storage import MessageStore, StoreConfig
store = MessageStore(StoreConfig.from_toml(sys.argv[1], store_path_root_dir=sys.argv[2]))
store.load()
print("ready", flush=True)
sys.stdin.readline()
store.close()
print("closed", flush=True)
"""


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocketstore.cli", *args], cwd=WORK_DIR, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def sizes(directory: str) -> dict[str, int]:
    out = {}
    for dirpath, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, directory)] = os.path.getsize(path)
    return out


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """A store after two ``demo`` runs with the default (demo) geometry."""
    d = str(tmp_path_factory.mktemp("cli") / "store")
    first = run("demo", "--embedded", "--store", d, "--json")
    second = run("demo", "--embedded", "--store", d, "--json")
    return d, first, second


@pytest.fixture
def small_toml(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_TOML)
    return str(path)


# ------------------------------------------------------------------ demo
def test_demo_writes_reads_back_and_checks(demo_store):
    d, first, _ = demo_store
    assert first.returncode == 0, first.stderr
    s = json.loads(first.stdout)
    assert s["sent"] == 2000 and s["read_back"] == 2000
    assert s["check"] == []
    assert s["store"] == os.path.abspath(d)
    assert s["by_msg_id"] is not None
    assert [m["keys"] for m in s["query_by_key"]] == [["order-1999"]]
    assert s["status"]["queues"] == {f"DemoTopic/{q}": [0, 500] for q in range(4)}
    pos = s["status"]["positions"]
    assert pos["written"] == pos["dispatched"] > 0


def test_second_demo_run_continues_the_queues(demo_store):
    d, first, second = demo_store
    assert second.returncode == 0, second.stderr
    s1, s2 = json.loads(first.stdout), json.loads(second.stdout)
    assert s2["sent"] == 2000 and s2["read_back"] == 2000 and s2["check"] == []
    assert s2["status"]["last_exit_ok"] is True
    assert s2["status"]["queues"] == {f"DemoTopic/{q}": [0, 1000] for q in range(4)}
    assert s2["status"]["positions"]["written"] == 2 * s1["status"]["positions"]["written"]
    # keys restart at order-0 each run: the last key now names one message per run
    assert [m["queue_offset"] for m in s2["query_by_key"]] == [499, 999]


def test_demo_text_output(tmp_path):
    r = run("demo", "--embedded", "--store", str(tmp_path / "s"), "--count", "40")
    assert r.returncode == 0, r.stderr
    assert "sent        40 messages" in r.stdout
    assert "read back   40" in r.stdout
    assert "consistent" in r.stdout


# ------------------------------------------------------------------ dump
def test_dump_commit_log_text_json_and_limit(demo_store):
    d = demo_store[0]
    path = os.path.join(d, "commitlog", ZERO_NAME)
    text = run("dump", path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 4001
    assert lines[0].startswith("@0 size=") and "DemoTopic/0#0" in lines[0]
    assert "records=4000" in lines[-1]

    js = run("dump", path, "--json")
    assert js.returncode == 0, js.stderr
    items = json_lines(js.stdout)
    msgs = [i for i in items if i["kind"] == "message"]
    assert len(msgs) == 4000 and items[-1]["kind"] == "summary"
    assert items[-1]["records"] == 4000 and items[-1]["end"] == sum(m["store_size"] for m in msgs)
    assert msgs[0]["commit_log_offset"] == 0 and msgs[0]["topic"] == "DemoTopic"
    assert msgs[1]["commit_log_offset"] == msgs[0]["store_size"]
    with open(path, "rb") as f:
        data = f.read(items[-1]["end"])
    ref = refcodec.decode_commitlog_file(data)["records"]
    assert [m["msg_id"] for m in msgs] == [r["msg_id"] for r in ref]

    limited = run("dump", path, "--json", "--limit", "3")
    items = json_lines(limited.stdout)
    assert [i["kind"] for i in items] == ["message"] * 3 + ["summary"]
    assert items[-1]["records"] == 3


def _flip(path: str, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0xFF]))


def test_dump_names_a_damaged_record_and_reads_a_quarantined_tail(tmp_path):
    """A flipped body byte in the middle: dump shows the records before it, names the
    bad one (exit 1) instead of ending as if the data did. Recovery then cuts there and
    keeps the tail as ``NAME.from-N``, which dump reads at its true offsets."""
    from conftest import reopen, small_config
    cfg = small_config(str(tmp_path / "store"))
    with reopen(cfg) as s:
        rs = s.put_batch([Message(topic="T", body=b"body%d" % i, keys=[f"k{i}"], queue_id=0)
                          for i in range(10)])
    path = os.path.join(cfg.commit_log_dir, ZERO_NAME)
    with open(path, "rb") as f:
        body_at = f.read().index(b"body3", rs[3].wrote_offset)
    _flip(path, body_at)
    r = run("dump", path, "--json")
    assert r.returncode == 1, r.stderr
    *msgs, summary = json_lines(r.stdout)
    assert len(msgs) == 3 and summary["records"] == 3
    assert summary["bad_record_at"] == rs[3].wrote_offset
    assert "CRC" in summary["why"]
    assert "bad_record_at=" in run("dump", path).stdout
    with reopen(cfg):
        pass                                      # recovery cuts at message 3
    [kept] = [os.path.join(root, n) for root, _, names in
              os.walk(os.path.join(cfg.store_path_root_dir, "quarantine")) for n in names]
    _flip(kept, body_at - rs[3].wrote_offset)    # undone: seven good records
    r = run("dump", kept, "--json")
    assert r.returncode == 0, r.stderr
    *msgs, summary = json_lines(r.stdout)
    assert [m["commit_log_offset"] for m in msgs] == [x.wrote_offset for x in rs[3:]]
    assert [m["keys"] for m in msgs] == [[f"k{i}"] for i in range(3, 10)]
    assert "bad_record_at" not in summary


def test_dump_consume_queue(demo_store):
    d = demo_store[0]
    path = os.path.join(d, "consumequeue", "DemoTopic", "0", ZERO_NAME)
    text = run("dump", path, "--limit", "2")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith("#0 -> @0 size=")
    items = json_lines(run("dump", path, "--json").stdout)
    units = [i for i in items if i["kind"] == "unit"]
    assert len(units) == 1000 and items[-1] == {"kind": "summary", "file": path, "units": 1000}
    with open(path, "rb") as f:
        ref = refcodec.decode_cq_file(f.read())
    assert [(u["commit_log_offset"], u["size"], u["tags_code"]) for u in units] == ref
    assert [u["queue_offset"] for u in units] == list(range(1000))
    assert {u["tags_code"] for u in units} == {refcodec.java_hash("TagA")}
    limited = json_lines(run("dump", path, "--json", "--limit", "5").stdout)
    assert len(limited) == 6 and limited[-1]["units"] == 5


def test_dump_index(demo_store):
    d = demo_store[0]
    names = sorted(os.listdir(os.path.join(d, "index")))
    assert len(names) == 1
    path = os.path.join(d, "index", names[0])
    items = json_lines(run("dump", path, "--json", "--limit", "5").stdout)
    header, entries = items[0], items[1:]
    assert header["kind"] == "header" and len(entries) == 5
    assert header["index_count"] >= 4001
    slots, index_num = header["hash_slot_num"], header["index_num"]
    with open(path, "rb") as f:
        ref = refcodec.decode_index_file(f.read(), slots, index_num)
    assert {k: header[k] for k in ref["header"]} == ref["header"]
    assert [(e["entry"], e["key_hash"], e["phy_offset"], e["time_diff_s"], e["pre_index_no"])
            for e in entries] == ref["entries"][:5]
    assert entries[0]["key_hash"] == refcodec.index_key_hash("DemoTopic#order-0")
    text = run("dump", path, "--limit", "2")
    assert text.returncode == 0, text.stderr
    assert len(text.stdout.splitlines()) == 3
    assert text.stdout.splitlines()[1].startswith("entry 1: hash=")


def test_dump_checkpoint(demo_store):
    d = demo_store[0]
    path = os.path.join(d, "checkpoint")
    with open(path, "rb") as f:
        ref = refcodec.decode_checkpoint(f.read())
    items = json_lines(run("dump", path, "--json").stdout)
    assert items == [{"kind": "checkpoint", "file": path,
                      "physic_msg_timestamp": ref["physic"],
                      "logics_msg_timestamp": ref["logics"],
                      "index_msg_timestamp": ref["index"]}]
    assert ref["physic"] > 0 and ref["logics"] > 0 and ref["index"] > 0
    text = run("dump", path)
    assert text.returncode == 0 and f"physic_msg_timestamp={ref['physic']}" in text.stdout


def test_dump_type_override_and_a_path_that_says_nothing(demo_store, tmp_path):
    d = demo_store[0]
    src = os.path.join(d, "consumequeue", "DemoTopic", "1", ZERO_NAME)
    blob = str(tmp_path / "blob.bin")
    shutil.copyfile(src, blob)
    r = run("dump", blob)
    assert r.returncode == 3
    assert "--type" in r.stderr and "blob.bin" in r.stderr
    assert r.stdout == ""
    r = run("dump", blob, "--type", "consumequeue", "--json")
    assert r.returncode == 0, r.stderr
    units = [i for i in json_lines(r.stdout) if i["kind"] == "unit"]
    assert len(units) == 1000
    cp = str(tmp_path / "cp.bin")
    shutil.copyfile(os.path.join(d, "checkpoint"), cp)
    r = run("dump", cp, "--type", "checkpoint", "--json")
    assert r.returncode == 0 and json_lines(r.stdout)[0]["kind"] == "checkpoint"
    r = run("dump", blob, "--type", "nonsense")
    assert r.returncode == 2


def test_demo_runs_the_multiprocess_store_end_to_end(tmp_path):
    """The README's main command: up, send, consume, query, status, clean stop."""
    d = str(tmp_path / "store")
    for run_no in range(2):
        r = run("demo", "--store", d, "--count", "1000", "--json")
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        assert s["sent"] == s["consumed"] == 1000 and s["in_order"] and s["stopped_cleanly"]
        assert s["status"]["state"] == "RUNNING"
        assert set(s["status"]["processes"]) == {"flusher", "writer", "dispatcher", "cleaner",
                                                 "scheduler", "reader"}
        assert [m["queue_offset"] for m in s["query_by_key"]][-1] == 249 + 250 * run_no
        assert s["group"] in {g["group"] for g in s["status"]["consumer_groups"].values()}
    assert not os.path.exists(os.path.join(d, "abort"))
    # each run deleted its group: none shows the next run's messages as lag for ever
    assert json.load(open(os.path.join(d, "config", "consumerOffset.json")))["offsetTable"] == {}
    assert not os.listdir(os.path.join(d, "groups"))


# ------------------------------------------------------------------ usage
def test_bad_arguments_exit_2_and_say_why_in_json_too(tmp_path):
    """Exit codes as the README says (2 bad usage, 3 the store cannot be opened), and
    with --json a failure is also a JSON object on stdout, argparse's own included."""
    store = str(tmp_path / "store")
    for args in (("send", "--topic", "T", "--body", "x", "--count", "-5"),
                 ("consume", "--group", "g", "--topic", "T", "--max", "0"),
                 ("query", "--offset", "-1")):
        r = run(*args, "--store", store)
        assert r.returncode == 2, (args, r.stderr)
    for args in (("query", "--msg-id", "zz"), ("query", "--msg-id", ""),
                 ("query", "--key", "k"), ("send", "--topic", "a/b", "--body", "x"),
                 ("consume", "--group", "../g", "--topic", "T")):
        r = run(*args, "--store", store, "--json")
        assert r.returncode == 2, (args, r.stderr)
        out = json.loads(r.stdout)
        assert (out["error"], out["exit"]) == ("usage", 2) and out["message"], out
    for args in (("send", "--topic", "T", "--body", "x", "--count", "0"),
                 ("consume", "--group", "g")):                 # argparse's own errors
        r = run(*args, "--store", store, "--json")
        assert r.returncode == 2 and json.loads(r.stdout)["error"] == "usage", r.stdout
    r = run("check", "--store", store, "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"] == "NoStore"
    assert not os.path.exists(store)
    r = run("status", "--store", store, "--json")    # the documented failure shape too
    out = json.loads(r.stdout)
    assert r.returncode == 3 and out["exit"] == 3 and out["state"] == "NOT_RUNNING"
    assert out["error"] == "NoStore" and out["message"] == out["detail"] == \
        f"no store at {store}: the directory does not exist (`rocketstore up --store " \
        f"{store}` makes one there)"
    r = run("status", "--config", str(tmp_path / "missing.toml"), "--json")
    assert r.returncode == 3 and "cannot read the settings file" in r.stderr
    assert json.loads(r.stdout)["error"] == "StoreConfigError"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    r = run("check", "--store", str(a_file))
    assert r.returncode == 3 and "is not a directory" in r.stderr


# ------------------------------------------------------------------ check
def test_check_exits_0_on_a_consistent_store_and_3_on_a_missing_one(tmp_path, small_toml):
    d = str(tmp_path / "store")
    r = run("demo", "--embedded", "--config", small_toml, "--store", d, "--count", "300", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["check"] == []
    r = run("check", "--config", small_toml, "--store", d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "consistent"
    r = run("check", "--config", small_toml, "--store", d, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["problems"] == []
    assert out["status"]["queues"] == {f"DemoTopic/{q}": [0, 75] for q in range(4)}
    missing = str(tmp_path / "missing")
    r = run("check", "--config", small_toml, "--store", missing)
    assert r.returncode == 3
    assert "missing" in r.stderr
    assert not os.path.exists(missing)


def test_check_of_an_empty_directory_finds_no_store_and_makes_none(tmp_path):
    empty = tmp_path / "empty"
    (empty / "run").mkdir(parents=True)      # what a client pointed at it may leave
    r = run("check", "--store", str(empty))
    assert r.returncode == 3 and "no store at" in r.stderr
    assert sorted(os.listdir(empty)) == ["run"]


def test_send_and_query_to_a_store_not_running_say_so_and_leave_nothing(tmp_path):
    """Not the whole request timeout and "its outcome is unknown": nothing was sent.
    A missing directory is told from one holding a store that is not running, and
    each says what `rocketstore up` would do, as the clients say it."""
    missing = tmp_path / "no-such-store"
    stopped = tmp_path / "stopped"
    (stopped / "commitlog").mkdir(parents=True)
    for args in (("send", "--topic", "T", "--body", "x"), ("query", "--topic", "T",
                                                            "--key", "k"), ("status",)):
        r = run(*args, "--store", str(missing))
        assert r.returncode == 3, (args, r.stderr)
        assert f"no store at {missing}: the directory does not exist (`rocketstore up " \
            f"--store {missing}` makes one there)" in r.stderr, (args, r.stderr)
        assert "unknown" not in r.stderr
        r = run(*args, "--store", str(stopped))
        assert r.returncode == 3, (args, r.stderr)
        assert f"no store running at {stopped}: no supervisor runs it" in r.stderr, r.stderr
        assert f"`rocketstore up --store {stopped}` starts it" in r.stderr, r.stderr
    assert not missing.exists() and os.listdir(stopped) == ["commitlog"]


def test_check_says_what_quarantine_holds_after_recovery_cut_records(tmp_path, small_toml):
    """A store recovery cut is consistent, but not whole: check says what was cut."""
    d = str(tmp_path / "store")
    assert run("demo", "--embedded", "--config", small_toml, "--store", d, "--count", "40",
               ).returncode == 0
    r = run("check", "--config", small_toml, "--store", d, "--json")
    assert json.loads(r.stdout)["quarantine"]["files"] == 0
    written = json.loads(r.stdout)["status"]["positions"]["written"]
    files = sorted(os.listdir(os.path.join(d, "commitlog")))
    size = os.path.getsize(os.path.join(d, "commitlog", files[0]))
    with open(os.path.join(d, "commitlog", f"{written - written % size:020d}"), "r+b") as f:
        f.seek(written % size)
        f.write(b"\xfe" * 48)                  # past the last record: a torn tail
    open(os.path.join(d, "abort"), "w").close()
    r = run("check", "--config", small_toml, "--store", d)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "consistent"
    assert second.startswith("quarantine holds ") and "1 cuts" in second
    assert os.path.join(d, "quarantine") in second
    r = run("check", "--config", small_toml, "--store", d, "--json")
    kept = json.loads(r.stdout)["quarantine"]
    assert kept["files"] == 1 and kept["cuts"] == 1 and kept["bytes"] > 0


def test_check_of_a_demo_store_exits_0_and_leaves_it_usable(tmp_path):
    """The documented flow with default settings: ``demo``, ``check``, ``demo`` again.
    The check must pass and must not resize, rebuild or otherwise spoil the store."""
    d = str(tmp_path / "store")
    assert run("demo", "--embedded", "--store", d, "--count", "100").returncode == 0
    before = sizes(d)
    r = run("check", "--store", d)
    after = sizes(d)
    if after != before:
        shutil.rmtree(d)        # do not keep gigabytes of grown files in pytest's tmp
    assert {k: v for k, v in after.items() if k != "lock"} == \
        {k: v for k, v in before.items() if k != "lock"}, r.stderr
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "consistent"
    r = run("demo", "--embedded", "--store", d, "--count", "100", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["read_back"] == 100


def test_a_store_held_by_another_process_cannot_be_opened(tmp_path, small_toml):
    d = str(tmp_path / "store")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, small_toml, d], cwd=WORK_DIR,
                              env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        for args in (("check",), ("demo", "--embedded", "--count", "10")):
            r = run(*args, "--config", small_toml, "--store", d)
            assert r.returncode == 3, (args, r.stdout, r.stderr)
            assert "lock" in r.stderr
            assert os.path.join(d, "lock") in r.stderr
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    r = run("check", "--config", small_toml, "--store", d)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ offsets
def test_offsets_shows_the_lag_and_a_reset_moves_where_the_group_reads_next(tmp_path):
    """``offsets`` of a running store: the group's committed offset beside each queue's
    bounds; ``--reset-to`` refuses while a member is live, writes nothing on
    ``--dry-run``, and what it writes is where the group's next Consumer starts."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            first = p.send_batch([Message(topic="Orders", body=b"a%d" % i, queue_id=i % 2)
                                  for i in range(10)])
            last_first = max(r.store_timestamp for r in first)
            wait_past_ms(last_first)
            second = p.send_batch([Message(topic="Orders", body=b"b%d" % i, queue_id=i % 2)
                                   for i in range(10)])
        assert all(r.ok for r in first + second)
        assert min(r.store_timestamp for r in second) > last_first

        def offsets(*extra: str) -> subprocess.CompletedProcess:
            return run("offsets", "--config", rs.config_path, "--group", "billing",
                       "--topic", "Orders", *extra)

        def table(*extra: str) -> list[tuple]:
            r = offsets("--json", *extra)
            assert r.returncode == 0, r.stderr
            return [(q["queue"], q["committed"], q["min_offset"], q["max_offset"], q["lag"],
                     q.get("new")) for q in json.loads(r.stdout)["queues"]]

        assert table() == [(0, None, 0, 10, None, None), (1, None, 0, 10, None, None)]
        with Consumer(rs.store_dir, "billing", "Orders") as c:
            got = []
            while len(got) < 20:
                batch = c.poll(64, 2000)
                assert batch, "the consumer stopped short"
                got += batch
            c.commit()
            r = offsets("--reset-to", "earliest")
            assert r.returncode == 1 and "live consumer" in r.stderr, r.stderr
        assert table() == [(0, 10, 0, 10, 0, None), (1, 10, 0, 10, 0, None)]

        assert table("--reset-to", "-3", "--dry-run") == [(0, 10, 0, 10, 0, 7), (1, 10, 0, 10, 0, 7)]
        assert table() == [(0, 10, 0, 10, 0, None), (1, 10, 0, 10, 0, None)]   # nothing written
        assert table("--reset-to", "99", "--queue", "1") == [(1, 10, 0, 10, 0, 10)]  # kept in bounds
        r = offsets("--reset-to", f"@{second[0].store_timestamp}")
        assert r.returncode == 0, r.stderr
        by_time = table()
        assert all(5 <= q[1] <= 9 for q in by_time), by_time    # a message of the second batch
        r = offsets("--reset-to", "+2", "--queue", "0")
        assert r.returncode == 0, r.stderr
        assert table()[0][1] == by_time[0][1] + 2

        r = offsets("--reset-to", "earliest")
        assert r.returncode == 0 and "reset group billing of Orders: 2 queue(s)" in r.stderr
        with Consumer(rs.store_dir, "billing", "Orders") as c:
            again = []
            while len(again) < 20:
                batch = c.poll(64, 2000)
                assert batch, "after the reset the group read only %d" % len(again)
                again += batch
        assert sorted(m.body for m in again) == sorted(m.body for m in got)

        assert offsets("--reset-to", "yesterday").returncode == 2
        assert offsets("--queue", "7").returncode == 1
        r = run("offsets", "--config", rs.config_path, "--group", "billing", "--topic", "Nope")
        assert r.returncode == 4 and "no topic Nope in this store (topics: Orders)" in r.stderr


@pytest.mark.parametrize("text, target", [
    ("earliest", ("earliest", 0)), ("latest", ("latest", 0)), ("42", ("offset", 42)),
    ("+5", ("shift", 5)), ("-5", ("shift", -5)), ("@1700000000123", ("time", 1700000000123)),
    ("2023-11-14T22:13:20+00:00", ("time", 1700000000000)),
    ("2023-11-14T22:13:20.5Z", ("time", 1700000000500))])
def test_reset_targets_parse(text, target):
    assert group_offsets.parse_target(text) == target


def test_a_reset_target_without_a_zone_is_local_time():
    kind, ms = group_offsets.parse_target("2023-11-14T22:13:20")
    local = datetime.datetime(2023, 11, 14, 22, 13, 20).astimezone()
    assert (kind, ms) == ("time", int(local.timestamp() * 1000))


# ------------------------------------------------------------------ a group's users
def _reachable_by_the_group(path: str) -> bool:
    """Whether a member of this process's group who is not its user can reach ``path``
    (every directory on the way searchable by that group or by others)."""
    path = os.path.realpath(path)
    while True:
        st = os.stat(path)
        if not (st.st_mode & 0o001 or (st.st_gid == os.getgid() and st.st_mode & 0o010)):
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv")
                    or not all(_reachable_by_the_group(p) for p in (ROOT, sys.prefix)),
                    reason="running a consumer as another user needs root, setpriv, and "
                           "the code and its interpreter where the group can reach them")
def test_a_consumer_run_by_another_member_of_the_owners_group_consumes_and_commits():
    """OPERATIONS "Who can read the files": a member of the store owner's group maps the
    files, reads the position table, joins the consumer group (its membership beside the
    owner's consumers) and, with config/ group-writable, commits. Run here as ``nobody``
    with the owner's group as a supplementary one."""
    base = tempfile.mkdtemp(prefix="rs-group-")
    os.chmod(base, 0o755)                  # pytest's own tmp_path is 0700
    try:
        rs = RunningStore(base)
        with rs:
            with Producer(rs.store_dir) as p:
                assert all(r.ok for r in p.send_batch(
                    [Message("Shared", b"m%d" % i, queue_id=i % 4) for i in range(20)]))
            os.chmod(os.path.join(rs.store_dir, "config"), 0o770)   # the documented g+w
            with Consumer(rs.store_dir, "billing", "Shared", rebalance_interval_ms=100) as mine:
                member = subprocess.run(
                    ["setpriv", "--reuid=nobody", "--regid=nogroup",
                     f"--groups={os.getgid()}", sys.executable, "-m", "rocketstore.cli",
                     "consume", "--config", rs.config_path, "--group", "other",
                     "--topic", "Shared", "--json", "--max", "20"],
                    cwd=WORK_DIR, env=ENV, capture_output=True, text=True, timeout=60)
                assert member.returncode == 0, member.stderr
                bodies = sorted(json.loads(line)["body"] for line in member.stdout.splitlines())
                assert len(bodies) == 20
                assert mine.poll(64, 2000)          # the owner's consumer reads alongside
        offsets = json.load(open(os.path.join(rs.store_dir, "config", "consumerOffset.json")))
        assert sum(offsets["offsetTable"]["Shared@other"].values()) == 20
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ status
def test_a_store_whose_supervisor_was_killed_is_not_running_to_every_command(tmp_path):
    """SIGKILL of the supervisor alone: its processes die with it and its position
    table stays behind. status (text and --json), clean and a Consumer must say the
    store is not running (exit 3), not show the dead run's last positions; up recovers."""
    rs = RunningStore(tmp_path)
    rs.start()
    with Producer(rs.store_dir) as p:
        assert p.send("Gone", b"acked before the kill").ok
    rs.proc.kill()
    rs.proc.wait()
    r = run("status", "--config", rs.config_path, "--json")
    assert r.returncode == 3, r.stdout
    out = json.loads(r.stdout)
    assert out["state"] == "NOT_RUNNING" and "supervisor" in out["detail"] and "gone" in out["detail"]
    r = run("status", "--config", rs.config_path)
    assert r.returncode == 3 and "not running" in r.stderr
    assert run("clean", "--config", rs.config_path).returncode == 3
    with pytest.raises(PositionTableError, match="is gone and left its table behind; "
                       "`rocketstore up --store .*` recovers it"):
        Consumer(rs.store_dir, "g", "Gone")
    rs.kill_all()
    with rs:                                                    # up recovers it
        assert run("status", "--config", rs.config_path).returncode == 0
        with Consumer(rs.store_dir, "g", "Gone") as c:
            assert [m.body for m in c.poll(8, 5000)] == [b"acked before the kill"]


# A command as a shell without job control starts a background job (``cmd &`` in a
# script): with SIGINT ignored, which Python keeps ignored unless the program sets it.
AS_A_BACKGROUND_JOB = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                       "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM])
def test_consume_stopped_while_printing_commits_only_what_it_printed(tmp_path, signo):
    """Ctrl-C (or ``kill``) while ``consume --follow`` writes a batch into a pipe nobody
    reads yet: the commit on its way out used to take the whole batch, the unprinted
    rest lost for the group. Every committed offset must now have been printed. The
    command is started as a background job of a script is, SIGINT ignored: such a
    consume (every one of a suite run in the background) used to go on polling."""
    from rocketstore.client.consumer import read_offsets
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            for k in range(8):
                assert all(r.ok for r in p.send_batch(
                    [Message(topic="T", body=b"m%d" % (k * 500 + i), queue_id=0)
                     for i in range(500)]))
        printed: set = set()
        for attempt in range(2):
            stderr = open(tmp_path / f"consume-{attempt}.err", "w+")
            proc = subprocess.Popen(
                [sys.executable, "-c", AS_A_BACKGROUND_JOB, "-m", "rocketstore.cli", "consume",
                 "--config", rs.config_path, "--group", "g", "--topic", "T", "--follow"],
                cwd=WORK_DIR,
                env={**ENV, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                stderr=stderr, text=True)
            lines = [proc.stdout.readline() for _ in range(100 + 37 * attempt)]
            wait_for(lambda: _writing_to_a_full_pipe(proc.pid), 30,
                     "consume blocked on the full pipe, mid-batch")
            proc.send_signal(signo)
            lines += _rest_of_output(proc, stderr)
            assert proc.wait(30) == 0
            printed |= {int(line.split()[0].split("#")[1]) for line in lines
                        if line.startswith("T/0#")}
            committed = read_offsets(os.path.join(rs.store_dir, "config"))["T@g"]["0"]
            assert 0 < committed <= 4000 and set(range(committed)) <= printed


def _rest_of_output(proc: subprocess.Popen, stderr, timeout: float = 60) -> list[str]:
    """The lines ``proc`` prints until it exits (read from the stream the test has read
    from, whose buffer may hold some). One that has not stopped within ``timeout`` s of
    its stop signal is made to dump every thread's stack (SIGABRT, with PYTHONFAULTHANDLER
    set) and the test fails showing where it hung."""
    import threading
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.extend(proc.stdout.readlines()),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.send_signal(signal.SIGABRT)
        reader.join(30)
        stderr.seek(0)
        pytest.fail(f"consume did not stop within {timeout} s of its stop signal:\n"
                    f"{stderr.read()}")
    return rest


def _writing_to_a_full_pipe(pid: int) -> bool:
    """Whether the main thread of process ``pid`` waits in a write to a full pipe (the
    kernel function it sleeps in, /proc/PID/wchan: ``pipe_write``, ``anon_pipe_write``)."""
    with open(f"/proc/{pid}/wchan") as f:
        return "pipe_write" in f.read()


def test_status_shows_consumer_group_lag(tmp_path):
    """``status`` of a running store lists every ``topic@group`` of consumerOffset.json:
    committed offset, max offset and lag per queue, and the group's total lag."""
    with RunningStore(tmp_path) as rs:
        with Producer(rs.store_dir) as p:
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Orders", body=b"o%d" % i, queue_id=i % 3) for i in range(30)]))
        with Consumer(rs.store_dir, "local", "Orders") as c:   # reads everything, commits
            got = []
            while len(got) < 30:
                batch = c.poll(64, 2000)
                assert batch, "the local consumer stopped short"
                got += batch
        with ReaderClient(rs.store_dir) as rc:
            rc.commit_offsets("remote", "Orders", {0: 4, 1: 10})
            with pytest.raises(ClientError):
                rc.commit_offsets("remote", "Orders", {2: 11})

        def status() -> dict:
            r = run("status", "--config", rs.config_path, "--json")
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)["consumer_groups"]

        groups = status()
        assert set(groups) == {"Orders@local", "Orders@remote"}
        assert groups["Orders@remote"] == {
            "topic": "Orders", "group": "remote", "lag": 6,
            "queues": {"0": {"committed": 4, "max_offset": 10, "lag": 6},
                       "1": {"committed": 10, "max_offset": 10, "lag": 0},
                       "2": {"committed": None, "max_offset": 10, "lag": None}}}
        local = groups["Orders@local"]
        assert local["lag"] == 0
        assert {q: local["queues"][q]["committed"] for q in "012"} == {"0": 10, "1": 10, "2": 10}

        with Producer(rs.store_dir) as p:   # five more in queue 0: both groups fall behind
            assert all(r.ok for r in p.send_batch(
                [Message(topic="Orders", body=b"n", queue_id=0) for _ in range(5)]))
        groups = wait_for(lambda: (g := status())["Orders@remote"]["lag"] == 11 and g,
                          what="lag to grow")
        assert groups["Orders@remote"]["queues"]["0"] == \
            {"committed": 4, "max_offset": 15, "lag": 11}
        assert groups["Orders@local"]["lag"] == 5

        text = run("status", "--config", rs.config_path)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert "groups     2  (total lag 16)" in lines
        assert "  Orders@remote  lag 11" in lines
        assert any(line.split() == ["queue", "0", "committed", "4", "max", "15", "lag", "11"]
                   for line in lines)
        assert any(line.split() == ["queue", "2", "committed", "-", "max", "10", "lag", "-"]
                   for line in lines)


# ------------------------------------------------------------------ config
def test_config_json_prints_every_setting(tmp_path):
    r = run("config", "--json")
    assert r.returncode == 0, r.stderr
    settings = json.loads(r.stdout)
    assert list(settings) == StoreConfig.field_names()
    assert settings == StoreConfig().to_dict()
    r = run("config", "--json", "--store", str(tmp_path / "x"))
    assert json.loads(r.stdout)["store_path_root_dir"] == str(tmp_path / "x")


def test_config_text_and_a_bad_config_file(tmp_path):
    r = run("config")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == len(StoreConfig.field_names())
    assert "flush_disk_type = 'ASYNC_FLUSH'" in lines
    bad = tmp_path / "bad.toml"
    bad.write_text("[store]\nflush_disk_tipe = 'SYNC_FLUSH'\n")
    r = run("config", "--config", str(bad))
    assert r.returncode == 3
    assert "flush_disk_tipe" in r.stderr


def test_usage_errors_exit_2():
    assert run().returncode == 2
    assert run("nonsense").returncode == 2
    assert run("dump").returncode == 2
