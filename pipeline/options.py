"""The options of the ``rocketstore`` Spark format, checked once on the driver.

    option                 read  write  meaning
    ---------------------  ----  -----  ----------------------------------------------------
    store                  yes   yes    a store directory on this host: executors map its
                                        files (reads) and use its ingest socket (writes)
    endpoint               yes   yes    the store's sockets, for executors anywhere:
                                        ``ipc:///path/store/run`` or ``tcp://host:port``
                                        (the store's listen_port, with tcp_listen_address
                                        set; the reader is on port - 2: both must be
                                        reachable; ``wire.endpoints``), or a broker
                                        group's ``zk://host:port/BROKER_NAME`` (its
                                        master, followed across a failover); exactly
                                        one of store/endpoint
    topic / topics         yes   yes    one topic / a comma list (write: the default topic
                                        of rows without a ``topic`` column value)
    topicPattern           yes          a regular expression matched against every topic
    startingOffsets        yes          earliest | latest | JSON (batch default earliest,
                                        streaming default latest)
    endingOffsets          yes          earliest | latest | JSON (batch only; default latest)
    startingTimestamp      yes          ms since the epoch; wins over startingOffsets
    maxOffsetsPerTrigger   yes          streaming: at most this many offsets per micro-batch
    minPartitions          yes          split large queue ranges to at least this many tasks
    failOnDataLoss         yes          true (default): expired offsets the query needs are
                                        an error; false: skip them with a warning
    group                  yes          streaming: consumer group whose committed offsets
                                        record the query's progress (default
                                        ``spark-rocketstore``); `rocketstore status` shows lag
    batchSize              yes   yes    reading: rows per Arrow batch (default 65536, and
                                        at most 16 MiB of records); writing: messages per
                                        SEND frame (default 500, at most 65536; a frame is
                                        cut sooner where its records would pass 32 MiB)
    timeoutMs                    yes    how long a send waits for the store (default 30000)
    tags                   yes          RocketMQ's subscription, ``TagA || TagB`` (``*``, the
                                        default: every message): only rows with one of
                                        these tags leave the source, as a Consumer filters

Unknown options are refused with the list of known ones, as a misspelt option would
otherwise be silently ignored; so are reading options given to a write.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from rocketstore.storage.read_path import subscription_tags
from rocketstore.storage.validation import check_topic

DEFAULT_GROUP = "spark-rocketstore"
KNOWN = {"store", "endpoint", "topic", "topics", "topicpattern", "startingoffsets",
         "endingoffsets", "startingtimestamp", "maxoffsetspertrigger", "minpartitions",
         "failondataloss", "group", "batchsize", "timeoutms", "tags", "curveserverkey",
         "curveclientkey"}
SPARKS_OWN = {"path", "checkpointlocation", "queryname"}  # options Spark itself passes on
READ_ONLY = ("topicPattern", "startingOffsets", "endingOffsets", "startingTimestamp",
             "maxOffsetsPerTrigger", "minPartitions", "failOnDataLoss", "group", "tags")
MAX_WRITE_BATCH = 65536       # records a SEND frame may carry (wire.protocol)


@dataclasses.dataclass(frozen=True)
class Options:
    """What the driver resolved; pickled to every task (plain values only)."""

    store: str | None
    endpoint: str | None
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting_offsets: str | None
    ending_offsets: str | None
    starting_timestamp: int | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    group: str
    batch_size: int | None
    timeout_ms: int
    tags: tuple[str, ...] = ()       # the subscription's tags; empty: every message
    # CURVE over TCP (wire.curve): the store's public and this client's secret key files
    curve: tuple[str | None, str | None] = (None, None)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this query reads."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def parse(options: Mapping[str, str], *, reading: bool) -> Options:
    """Options from Spark's (case-insensitive) option map. Raises ``ValueError``
    naming the option for every mistake."""
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - KNOWN - SPARKS_OWN)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for format rocketstore; "
                         f"known: {', '.join(sorted(KNOWN))}")
    misplaced = [] if reading else [name for name in READ_ONLY if name.lower() in opts]
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)}: for reading only (a write names its topic "
                         "with the topic option or a topic column, and its tags in a tags "
                         "column)")
    store = opts.get("store") or opts.get("path") or None
    endpoint = opts.get("endpoint") or None
    if (store is None) == (endpoint is None):
        raise ValueError("give exactly one of the options store (a store directory on this "
                         "host) and endpoint (the store's sockets, e.g. tcp://host:10911)")
    topics = tuple(t.strip() for t in (opts.get("topics") or opts.get("topic") or "").split(",")
                   if t.strip())
    if "topic" in opts and "topics" in opts:
        raise ValueError("give the option topic or topics, not both")
    for t in topics:
        reason = check_topic(t, internal=True)
        if reason:
            raise ValueError(f"option topic(s): {reason}")
    pattern = opts.get("topicpattern") or None
    if pattern is not None:
        if topics:
            raise ValueError("give topic(s) or topicPattern, not both")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"option topicPattern {pattern!r} is not a regular expression: "
                             f"{e}") from None
    elif reading and not topics:
        raise ValueError("name what to read with the option topic, topics or topicPattern")
    tags = tuple(sorted(subscription_tags(opts.get("tags"))))
    curve = (opts.get("curveserverkey") or None, opts.get("curveclientkey") or None)
    if any(curve) and not (all(curve) and endpoint):
        raise ValueError("curveServerKey and curveClientKey go together, with endpoint: the "
                         "store's public key file and this client's secret key file")
    group = opts.get("group") or DEFAULT_GROUP
    if check_topic(group, internal=True):
        raise ValueError(f"option group {group!r} must match [A-Za-z0-9_%|-]{{1,255}}")
    return Options(
        store=store, endpoint=endpoint, topics=topics, topic_pattern=pattern,
        starting_offsets=opts.get("startingoffsets"), ending_offsets=opts.get("endingoffsets"),
        starting_timestamp=_int(opts, "startingtimestamp", "startingTimestamp", minimum=0),
        max_offsets_per_trigger=_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger",
                                     minimum=1),
        min_partitions=_int(opts, "minpartitions", "minPartitions", minimum=1),
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        group=group,
        batch_size=_int(opts, "batchsize", "batchSize", minimum=1,
                        maximum=None if reading else MAX_WRITE_BATCH),
        timeout_ms=_int(opts, "timeoutms", "timeoutMs", minimum=1) or 30_000,
        tags=tags, curve=curve,
    )


def _int(opts: dict, key: str, name: str, *, minimum: int,
         maximum: int | None = None) -> int | None:
    text = opts.get(key)
    if text is None or str(text).strip() == "":
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"option {name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"option {name} must be at most {maximum}, got {value}")
    return value


def _bool(opts: dict, key: str, name: str, default: bool) -> bool:
    text = opts.get(key)
    if text is None:
        return default
    word = str(text).strip().lower()
    if word in ("true", "false"):
        return word == "true"
    raise ValueError(f"option {name} must be true or false, got {text!r}")
