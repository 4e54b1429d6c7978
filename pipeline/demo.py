"""``rocketstore pipeline demo``: a Spark job over the store, end to end.

1. Uses the store running at ``--store`` (or starts one there, and stops it at the end).
2. Sends ``--count`` sentences to topic ``Sentences``, tagged ``news``, ``sports`` or
   ``tech``.
3. Spark (local[2]) reads the sentences sent by this run (``startingTimestamp``),
   counts words per tag per minute of store time, and writes one message per
   (tag, minute, word) to topic ``WordCounts``: the count as a JSON body, the tag as
   tags, the word as key (exactly once per task, even if Spark retries one).
4. Spark reads back what it wrote and the demo prints both sides.

``--endpoint`` makes the executors use the store's sockets instead of its files (the
remote path). Needs the spark extra: ``pip install -e '.[spark]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from rocketstore.client import Producer
from rocketstore.procs.launch import create_store, start_up
from rocketstore.procs.status import store_status
from rocketstore.shm.positions import PositionTable, PositionTableError
from rocketstore.storage import Message, StoreConfig

SOURCE_TOPIC = "Sentences"
RESULT_TOPIC = "WordCounts"
TAGS = ("news", "sports", "tech")
WORDS = ("store", "message", "queue", "spark", "flush", "index", "offset", "commit",
         "rocket", "stream", "batch", "disk")
EXIT_OK, EXIT_FAILED = 0, 1


def sentences(count: int) -> list[Message]:
    """Sentences of 3 to 8 words from WORDS, the same for the same ``count``."""
    rng = random.Random(count)
    out = []
    for i in range(count):
        words = rng.choices(WORDS, k=rng.randint(3, 8))
        out.append(Message(topic=SOURCE_TOPIC, body=" ".join(words).encode(),
                           tags=TAGS[i % len(TAGS)], keys=[f"sentence-{i}"], queue_id=None))
    return out


def spark_session(app: str = "rocketstore-pipeline-demo", master: str = "local[2]"):
    """A quiet local SparkSession whose Python workers use this interpreter, with the
    rocketstore format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from rocketstore.spark import register
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def count_words(spark, where: dict, since_ms: int):
    """Word counts per tag per minute of the sentences stored since ``since_ms``."""
    from pyspark.sql import functions as F
    sentences_df = (spark.read.format("rocketstore").options(**where)
                    .option("topic", SOURCE_TOPIC).option("startingTimestamp", since_ms).load())
    words = sentences_df.select(
        "tags", F.window("store_timestamp", "1 minute").start.alias("minute"),
        F.explode(F.split(F.lower(F.col("body").cast("string")), r"\s+")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("tags", "minute", "word").count()
    return sentences_df, counts


def run(args: argparse.Namespace, cfg: StoreConfig) -> int:
    store_dir = cfg.store_path_root_dir
    up = None
    if not _running(store_dir):
        if not os.path.exists(os.path.join(store_dir, "config", "storeGeometry.json")):
            create_store(cfg)  # records the demo's file sizes, which ``up`` then adopts
        up = start_up(store_dir, os.path.join(store_dir, "demo-up.log"))
    try:
        summary = _job(args, store_dir)
    finally:
        if up is not None:
            up.terminate()
            up.wait(120)
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print(summary)
    return EXIT_OK if summary["read"] == summary["sent"] and summary["read_back"] == \
        summary["written"] else EXIT_FAILED


def _running(store_dir: str) -> bool:
    try:
        PositionTable.attach(store_dir).close()
        return True
    except PositionTableError:
        return False


def _job(args: argparse.Namespace, store_dir: str) -> dict:
    from pyspark.sql import functions as F
    where = {"endpoint": args.endpoint} if args.endpoint else {"store": store_dir}
    since_ms = int(time.time() * 1000) - 1
    with Producer(store_dir) as producer:
        results = [r for batch in _chunks(sentences(args.count), 500)
                   for r in producer.send_batch(batch)]
    sent = sum(r.ok for r in results)
    t0 = time.perf_counter()
    spark = spark_session()
    started_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    sentences_df, counts = count_words(spark, where, since_ms)
    read = sentences_df.count()
    out = counts.select(
        F.col("tags"), F.array(F.col("word")).alias("keys"),
        F.to_json(F.struct(F.col("minute").cast("string").alias("minute"), "word",
                           "count")).alias("body"))
    write_ms = int(time.time() * 1000) - 1
    out.write.format("rocketstore").options(**where).option("topic", RESULT_TOPIC) \
        .mode("append").save()
    written = out.count()
    back = (spark.read.format("rocketstore").options(**where).option("topic", RESULT_TOPIC)
            .option("startingTimestamp", write_ms).load())
    rows = [json.loads(r.body) | {"tag": r.tags} for r in back.select("tags", "body").collect()]
    job_s = time.perf_counter() - t1
    spark.stop()
    rows.sort(key=lambda r: (-r["count"], r["tag"], r["word"]))
    return {"store": os.path.abspath(store_dir), "path": "remote" if args.endpoint else "local",
            "sent": sent, "read": read, "written": written, "read_back": len(rows),
            "top": rows[:8], "spark_start_s": round(started_s, 1), "job_s": round(job_s, 1),
            "status": store_status(store_dir)}


def _chunks(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def _print(s: dict) -> None:
    print(f"store       {s['store']}  ({s['path']} path)")
    print(f"sent        {s['sent']} sentences to {SOURCE_TOPIC}")
    print(f"spark read  {s['read']} of them, counted words per tag per minute")
    print(f"spark wrote {s['written']} counts to {RESULT_TOPIC}; read back {s['read_back']}")
    for r in s["top"]:
        print(f"            {r['tag']:<7} {r['minute']}  {r['word']:<8} {r['count']}")
    print(f"timings     Spark start {s['spark_start_s']} s, jobs {s['job_s']} s")
    lag = s["status"].get("dispatch_lag_bytes")
    print(f"status      {s['status']['state']}, dispatch lag {lag} bytes")
