"""Topics and consumer groups a store does not have, deleting a group, and what ``send``
prints: against one real store (``rocketstore up``) and the real command line.

Every test uses topics and groups of its own on the module's store. A topic exists once
a message of it is dispatched (``client.topics``); every command that names one the
store does not have says so alike ("no topic T in this store (topics: ...)") with exit 4,
and records nothing of a group for it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading

import pytest

from rocketstore.client import ClientError, Consumer, Producer, ReaderClient, group_offsets
from rocketstore.client.consumer import read_offsets
from rocketstore.client.topics import GroupNotExistError, TopicNotExistError, require_topic
from rocketstore.shm.positions import PositionTable, Slot
from rocketstore.storage import Message
from store_processes import ROOT, WORK_DIR, RunningStore, cli, wait_for

EXIT_NOT_FOUND = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A running store holding Orders (3 queues) and Payments (1 queue)."""
    with RunningStore(tmp_path_factory.mktemp("names")) as rs:
        with Producer(rs.store_dir) as p:
            assert all(r.ok for r in p.send_batch(
                [Message("Orders", b"o%d" % i, queue_id=i % 3) for i in range(9)]
                + [Message("Payments", b"p%d" % i, queue_id=0) for i in range(4)]))
        wait_for(lambda: rs.slot(Slot.DISPATCHED) == rs.slot(Slot.WRITTEN), what="dispatch")
        yield rs


def run(store: RunningStore, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return cli(*args, "--config", store.config_path, timeout=timeout)


def offset_keys(store: RunningStore) -> set[str]:
    return set(read_offsets(os.path.join(store.store_dir, "config")))


def test_the_errors_name_what_there_is_and_guess_a_misspelling():
    assert str(TopicNotExistError("orders", ["Orders", "Payments"])) == \
        "no topic orders in this store (topics: Orders, Payments; did you mean Orders?)"
    assert str(TopicNotExistError("Nothing", [])) == \
        "no topic Nothing in this store (it has no topics yet)"
    many = [f"T{i:02d}" for i in range(12)]
    assert str(TopicNotExistError("T5", many)) == (
        "no topic T5 in this store (topics: T00, T01, T02, T03, T04, T05, T06, T07, T08, T09 "
        "and 2 more; did you mean T05?)")
    assert str(GroupNotExistError("biling", None, ["billing", "audit"])) == \
        "no consumer group biling in this store (groups: billing, audit; did you mean billing?)"
    assert str(GroupNotExistError("g", "T", [])) == \
        "no consumer group g of topic T in this store (it has no groups of T)"


def test_every_command_names_a_topic_the_store_does_not_have_alike(store):
    """consume (was: "consumed 0", exit 0, and 8 queues of NoSuchTopic@g1 in status for
    good), offsets (was: "has no queues", exit 1) and query (was: "no message found")
    now all say the same, exit 4, and record nothing of the group."""
    said = "no topic NoSuchTopic in this store (topics: Orders, Payments)"
    for args in (("consume", "--group", "g1", "--topic", "NoSuchTopic"),
                 ("offsets", "--group", "g1", "--topic", "NoSuchTopic"),
                 ("offsets", "--group", "g1", "--topic", "NoSuchTopic", "--reset-to", "earliest"),
                 ("query", "--topic", "NoSuchTopic", "--key", "k")):
        r = run(store, *args)
        assert r.returncode == EXIT_NOT_FOUND, (args, r.stderr)
        assert r.stderr.strip() == f"rocketstore {args[0]}: {said}", args
        assert r.stdout == ""
    for command in ("consume", "offsets"):
        r = run(store, command, "--group", "g1", "--topic", "NoSuchTopic", "--json")
        assert r.returncode == EXIT_NOT_FOUND
        assert json.loads(r.stdout) == {"error": "TopicNotExistError", "message": said,
                                        "exit": EXIT_NOT_FOUND}
    r = run(store, "consume", "--group", "g1", "--topic", "Oders")
    assert r.stderr.strip() == ("rocketstore consume: no topic Oders in this store (topics: "
                                "Orders, Payments; did you mean Orders?)")
    assert not {k for k in offset_keys(store) if k.startswith(("NoSuchTopic@", "Oders@"))}
    assert not os.path.exists(os.path.join(store.store_dir, "groups", "g1", "NoSuchTopic"))
    st = json.loads(run(store, "status", "--json").stdout)
    assert not [k for k in st["consumer_groups"] if k.startswith("NoSuchTopic@")]
    r = run(store, "query", "--topic", "Orders", "--key", "no-such-key")
    assert r.returncode == 1 and "no message found" in r.stderr    # the topic is there


def test_a_consumer_of_a_topic_the_store_does_not_have(store):
    """The Python Consumer raises TopicNotExistError at once, leaving nothing behind;
    with wait_for_topic it subscribes ahead, records nothing until the topic appears,
    then reads it from its first message even from "latest"; the reader's COMMIT
    refuses offsets of a topic the store does not have."""
    with pytest.raises(TopicNotExistError) as raised:
        Consumer(store.store_dir, "early", "Later")
    assert (raised.value.topic, raised.value.topics) == ("Later", ["Orders", "Payments"])
    assert not os.path.exists(os.path.join(store.store_dir, "groups", "early"))
    with Consumer(store.store_dir, "early", "Later", from_where="latest",
                  wait_for_topic=True) as c:
        assert str(c.topic_missing) == str(raised.value)
        assert c.poll(8, 100) == []
        c.commit()
        assert "Later@early" not in offset_keys(store)
        with Producer(store.store_dir) as p:
            assert all(r.ok for r in p.send_batch(
                [Message("Later", b"l%d" % i, queue_id=0) for i in range(3)]))
        got = []
        while len(got) < 3:
            batch = c.poll(8, 5000)
            assert batch, f"the waiting consumer read {len(got)} of 3"
            got += batch
        assert [m.body for m in got] == [b"l0", b"l1", b"l2"]
    assert read_offsets(os.path.join(store.store_dir, "config"))["Later@early"]["0"] == 3
    with ReaderClient(store.store_dir) as rc:
        with pytest.raises(ClientError, match="no topic Nowhere in this store"):
            rc.commit_offsets("remote", "Nowhere", {0: 0})
    assert "Nowhere@remote" not in offset_keys(store)


def test_a_topic_sent_to_before_the_look_is_found_though_dispatch_lags(store):
    """With the dispatcher stopped, an acknowledged send's topic has no consume queue
    yet: the look waits for dispatch (bounded) instead of calling the topic missing."""
    dispatcher = store.child_pid("dispatcher")
    os.kill(dispatcher, signal.SIGSTOP)
    try:
        with Producer(store.store_dir) as p:
            assert p.send("Fresh", b"f0").ok
        table = PositionTable.attach(store.store_dir)
        try:
            cq_dir = os.path.join(store.store_dir, "consumequeue")
            with pytest.raises(TopicNotExistError):
                require_topic(cq_dir, table, "Fresh", wait_ms=200)   # dispatch never came
        finally:
            table.close()
        resume = threading.Timer(0.5, os.kill, (dispatcher, signal.SIGCONT))
        resume.start()
        with Consumer(store.store_dir, "fresh", "Fresh") as c:   # waits for dispatch
            assert [m.body for m in c.poll(8, 5000)] == [b"f0"]
    finally:
        os.kill(dispatcher, signal.SIGCONT)


def test_consume_follow_waits_for_the_topic_and_says_so(store):
    """``consume --follow`` of a topic not there yet says it waits for it, then reads
    it when it appears (before: it waited without a word, for a typo as well)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocketstore.cli", "consume", "--config", store.config_path,
         "--group", "follower", "--topic", "Announced", "--follow", "--max", "2", "--json"],
        cwd=WORK_DIR, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        assert sel.select(timeout=30), "consume --follow said nothing"
        line = proc.stderr.readline()
        assert line.startswith("rocketstore consume: no topic Announced in this store (topics: ")
        assert line.endswith("; waiting for it to appear (Ctrl-C stops)\n")
        with Producer(store.store_dir) as p:
            assert all(r.ok for r in p.send_batch(
                [Message("Announced", b"a%d" % i, queue_id=0) for i in range(2)]))
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert [json.loads(x)["body"] for x in out.splitlines()] == ["a0", "a1"]


def test_delete_group(store):
    """``delete-group`` (RocketMQ's deleteSubGroup): refuses a group it does not have
    (exit 4) and one with a live consumer (exit 1, nothing deleted); otherwise its
    offsets and membership go, status no longer lists it, the other groups stay, and a
    consumer of it starts afresh."""
    for group, topic in (("gone", "Orders"), ("gone", "Payments"), ("kept", "Orders")):
        with Consumer(store.store_dir, group, topic) as c:
            c.poll(16, 0)                          # the first poll commits where it starts
    assert {"Orders@gone", "Payments@gone", "Orders@kept"} <= offset_keys(store)

    r = run(store, "delete-group", "--group", "gones")
    assert r.returncode == EXIT_NOT_FOUND
    assert r.stderr.startswith("rocketstore delete-group: no consumer group gones in this "
                               "store (groups: ") and r.stderr.endswith("did you mean gone?)\n")
    r = run(store, "delete-group", "--group", "kept", "--topic", "Payments", "--json")
    assert r.returncode == EXIT_NOT_FOUND
    assert json.loads(r.stdout)["message"] == ("no consumer group kept of topic Payments in "
                                               "this store (groups of Payments: gone)")

    with Consumer(store.store_dir, "gone", "Orders"):
        r = run(store, "delete-group", "--group", "gone")
        assert r.returncode == 1, r.stderr
        assert "group 'gone' has live consumers (1 of Orders)" in r.stderr
        assert "stop them first" in r.stderr
        assert {"Orders@gone", "Payments@gone"} <= offset_keys(store)

    r = run(store, "delete-group", "--group", "gone", "--topic", "Payments", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"group": "gone", "deleted": ["Payments@gone"]}
    assert "Orders@gone" in offset_keys(store) and "Payments@gone" not in offset_keys(store)
    r = run(store, "delete-group", "--group", "gone")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "deleted consumer group gone of Orders (its offsets and membership)\n"
    assert not {k for k in offset_keys(store) if k.endswith("@gone")}
    assert "Orders@kept" in offset_keys(store)
    assert not os.path.exists(os.path.join(store.store_dir, "groups", "gone"))
    st = json.loads(run(store, "status", "--json").stdout)["consumer_groups"]
    assert "Orders@kept" in st and not [k for k in st if k.endswith("@gone")]
    with Consumer(store.store_dir, "gone", "Orders") as c:       # afresh: from earliest
        got = []
        while len(got) < 9:
            batch = c.poll(16, 5000)
            assert batch, f"the new member of the deleted group read {len(got)} of 9"
            got += batch
    with pytest.raises(GroupNotExistError):
        group_offsets.delete_group(store.store_dir, "never")


def test_delete_group_forgets_offsets_of_a_topic_the_store_does_not_have(store):
    """What an earlier version recorded (NoSuchTopic@g1 with 8 queues, for good) can
    be deleted: the group's offsets exist though the topic does not."""
    config_dir = os.path.join(store.store_dir, "config")
    from rocketstore.client.consumer import update_offsets
    update_offsets(config_dir, "NoSuchTopic@old", {str(q): 0 for q in range(8)})
    r = run(store, "delete-group", "--group", "old", "--topic", "NoSuchTopic")
    assert r.returncode == 0, r.stderr
    assert "NoSuchTopic@old" not in offset_keys(store)


def test_send_prints_each_message_id_queue_and_offset_on_stdout(store):
    r = run(store, "send", "--topic", "Sent", "--body", "hello", "--count", "2",
            "--queue-id", "1", "--keys", "sent-key")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["PUT_OK", "PUT_OK"]
    assert [line.split()[2].split("@")[0] for line in lines] == ["Sent/1#0", "Sent/1#1"]
    assert r.stderr == "sent 2 message(s), 0 refused\n"
    msg_ids = [line.split()[1].removeprefix("msgId=") for line in lines]
    with ReaderClient(store.store_dir) as rc:
        found = sorted(rc.query_by_key("Sent", "sent-key"), key=lambda m: m.queue_offset)
    assert [m.msg_id for m in found] == msg_ids
    assert [f"@{m.commit_log_offset}" for m in found] == [line.split()[3] for line in lines]
    r = run(store, "send", "--topic", "Sent", "--body", "again", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "PUT_OK" and doc["topic"] == "Sent" and doc["msg_id"]
    assert isinstance(doc["queue_id"], int) and isinstance(doc["queue_offset"], int)


def test_producer_refuses_what_is_not_a_message_at_once(store):
    """A body where a batch goes (bytes iterate as ints: an AttributeError deep in the
    encoder, before), a single Message, a list holding something else: a TypeError
    naming what is expected, and nothing sent."""
    written = store.slot(Slot.WRITTEN)
    with Producer(store.store_dir) as p:
        cases = [(p.send_async, b"payload", "send_async takes a list of Messages, not bytes"),
                 (p.send_batch, "text", "send_batch takes a list of Messages, not str"),
                 (p.send_async, Message("Typed", b"x"),
                  "send_async takes a list of Messages, not one Message: pass [message]"),
                 (p.send_batch, [Message("Typed", b"x"), b"y"],
                  "send_batch and send_async take a list of Messages; item 1 is bytes"),
                 (p.send_async, [Message("Typed", b"x"), 3],
                  "send_batch and send_async take a list of Messages; item 1 is int"),
                 (p.send_async, 7, "send_async takes a list of Messages, not int")]
        for call, arg, said in cases:
            with pytest.raises(TypeError) as raised:
                call(arg)
            assert str(raised.value).startswith(said), raised.value
        with pytest.raises(TypeError, match=r"takes the body as bytes, not str"):
            p.send("Typed", "text")
        assert store.slot(Slot.WRITTEN) == written
        r = p.send_batch(iter([Message("Typed", b"x", queue_id=0)]))[0]  # any iterable
        assert r.ok and r.queue_offset == 0
