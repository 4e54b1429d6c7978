"""``rocketstore demo``: the main job, end to end, on a store under the working directory.

By default it runs the multiprocess store: it starts ``rocketstore up`` as a child
process, sends a few thousand messages through a Producer (pipelined batches), consumes
every one of them with a Consumer reading the mapped files, looks one up by key through
the reader socket, prints the store's status, deletes its consumer group (each run
reads as a group of its own, from what it sends: left behind, each would show the
next run's messages as lag for ever), and stops the store cleanly.
``--embedded`` does the same in one process with ``storage.MessageStore``.

Both create the store with 64 MiB CommitLog files (not RocketMQ's 1 GiB) when it does
not exist yet, and reuse whatever store is there otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

from rocketstore.client import Consumer, Producer, ReaderClient, group_offsets
from rocketstore.procs.launch import create_store, start_up
from rocketstore.procs.status import store_status
from rocketstore.storage import Message, MessageStore, StoreConfig, StoreError

DEMO_FILE_SIZES = dict(mapped_file_size_commit_log=64 * 1024 * 1024,
                       max_hash_slot_num=50_000, max_index_num=200_000)
TOPIC = "DemoTopic"
EXIT_OK, EXIT_FAILED = 0, 1


def demo_messages(count: int, first: int = 0) -> list[Message]:
    return [Message(topic=TOPIC, body=f"hello rocketstore #{i}".encode(),
                    tags=("TagA", "TagB")[i % 2], keys=[f"order-{i}"], queue_id=i % 4,
                    properties={"seq": str(i)}) for i in range(first, first + count)]


# ------------------------------------------------------------------ the multiprocess store
def run_pipeline(args: argparse.Namespace, cfg: StoreConfig) -> int:
    store_dir = cfg.store_path_root_dir
    if not os.path.exists(os.path.join(store_dir, "config", "storeGeometry.json")):
        create_store(cfg)  # records the demo's file sizes, which ``up`` then adopts
    log_path = os.path.join(store_dir, "demo-up.log")
    up = start_up(store_dir, log_path)
    started = time.perf_counter()
    try:
        summary = _exchange(store_dir, args.count)
    finally:
        up.send_signal(signal.SIGTERM)
        rc = up.wait(120)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    summary["stopped_cleanly"] = rc == 0 and not os.path.exists(os.path.join(store_dir, "abort"))
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print_pipeline(summary, log_path)
    ok = summary["consumed"] == summary["sent"] and summary["stopped_cleanly"]
    return EXIT_OK if ok else EXIT_FAILED


def _exchange(store_dir: str, count: int) -> dict:
    group = f"demo-{os.getpid()}"
    # the first run subscribes before the topic's first message: it waits for the topic
    with Consumer(store_dir, group, TOPIC, from_where="latest",
                  wait_for_topic=True) as consumer, Producer(store_dir) as producer:
        consumer.poll(1, 0)  # pins each queue's starting point before anything is sent
        t = time.perf_counter()
        pending = [producer.send_async(batch) for batch in _chunks(demo_messages(count), 256)]
        results = [r for p in pending for r in p.result()]
        send_s = time.perf_counter() - t
        sent = sum(r.ok for r in results)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < sent and time.monotonic() < deadline:
            got += consumer.poll(512, 500)
        consume_s = time.perf_counter() - t - send_s
        consumer.commit()
    with ReaderClient(store_dir) as reader:
        by_key = reader.query_by_key(TOPIC, f"order-{count - 1}")
    status = store_status(store_dir)
    group_offsets.delete_group(store_dir, group)
    return {"store": os.path.abspath(store_dir), "sent": sent, "consumed": len(got),
            "group": group,
            "in_order": _in_order(got), "send_per_s": round(sent / send_s) if send_s else None,
            "consume_per_s": round(len(got) / consume_s) if consume_s > 0 else None,
            "query_by_key": [m.to_dict() for m in by_key], "status": status}


def _chunks(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def _in_order(messages: list) -> bool:
    last: dict[int, int] = {}
    for m in messages:
        if last.get(m.queue_id, m.queue_offset - 1) != m.queue_offset - 1:
            return False
        last[m.queue_id] = m.queue_offset
    return True


def _print_pipeline(s: dict, log_path: str) -> None:
    print(f"store       {s['store']}  (processes' log: {log_path})")
    print(f"sent        {s['sent']} messages to {TOPIC} (4 queues), {s['send_per_s']}/s")
    print(f"consumed    {s['consumed']} of them from the mapped files, "
          f"{'each queue in order' if s['in_order'] else 'OUT OF ORDER'}, {s['consume_per_s']}/s"
          f" (group {s['group']}, deleted when done)")
    for m in s["query_by_key"]:
        print(f"by key      {m['keys']} -> {m['msg_id']} queue {m['queue_id']} "
              f"offset {m['queue_offset']}: {m.get('body')!r}")
    st = s["status"]
    pos = st["positions"]
    print(f"status      {st['state']}, written {pos['written']}, flushed {pos['flushed']}, "
          f"dispatched {pos['dispatched']}, disk {st['disk']['used_ratio']:.1%} used")
    for name, p in st["processes"].items():
        print(f"            {name:<11} pid {p['pid']:<8} {p['state']}")
    print(f"stopped     {'cleanly' if s['stopped_cleanly'] else 'UNCLEANLY'} "
          f"after {s['seconds']} s")


# ------------------------------------------------------------------ the embedded store
def run_embedded(args: argparse.Namespace, cfg: StoreConfig) -> int:
    """Write through the embedded store, read back by queue, key and msgId, check."""
    started = time.perf_counter()
    with MessageStore(cfg) as store:
        results = []
        for batch in _chunks(demo_messages(args.count), 256):
            results += store.put_batch(batch)
        bad = [r for r in results if not r.ok]
        if bad:
            raise StoreError(f"put failed: {bad[0].status.name} {bad[0].reason}")
        read = _read_back(store, results)
        by_key = store.query_message(TOPIC, f"order-{args.count - 1}", 4).messages
        by_id = store.look_message_by_id(results[0].msg_id)
        problems = store.check()
        store.flush()
        status = store.status()
    summary = {"store": os.path.abspath(cfg.store_path_root_dir), "sent": len(results),
               "read_back": read, "query_by_key": [m.to_dict() for m in by_key],
               "by_msg_id": by_id.to_dict() if by_id else None, "check": problems,
               "seconds": round(time.perf_counter() - started, 3), "status": status}
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print_embedded(summary)
    return EXIT_OK if not problems and read == len(results) and by_id else EXIT_FAILED


def _read_back(store: MessageStore, results: list) -> int:
    expected = {(r.queue_id, r.queue_offset): r.msg_id for r in results}
    matched = 0
    for queue_id in range(4):
        offsets = sorted(o for q, o in expected if q == queue_id)
        offset = offsets[0] if offsets else 0
        while offsets and offset <= offsets[-1]:
            got = store.get_message("demo-group", TOPIC, queue_id, offset, 32)
            for m in got.messages:
                matched += expected.get((queue_id, m.queue_offset)) == m.msg_id
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset
    return matched


def _print_embedded(s: dict) -> None:
    print(f"store       {s['store']}")
    print(f"sent        {s['sent']} messages to {TOPIC} (4 queues) in {s['seconds']} s")
    print(f"read back   {s['read_back']} of them by queue and offset")
    for m in s["query_by_key"]:
        print(f"by key      {m['keys']} -> {m['msg_id']} queue {m['queue_id']} "
              f"offset {m['queue_offset']}: {m.get('body')!r}")
    if s["by_msg_id"]:
        m = s["by_msg_id"]
        print(f"by msgId    {m['msg_id']} -> {m.get('body')!r} tags={m['tags']}")
    pos = s["status"]["positions"]
    print(f"positions   min={pos['min_offset']} written={pos['written']} "
          f"flushed={pos['flushed']} dispatched={pos['dispatched']}")
    print(f"check       {'consistent' if not s['check'] else s['check']}")
