"""rocketstore: Apache RocketMQ's broker message store in Python, byte-compatible with
RocketMQ's files, run as a pipeline of OS processes or embedded in one.

The names an application uses::

    from rocketstore import Producer, Consumer, Message

    with Producer("store") as producer:                    # a running store (rocketstore up)
        r = producer.send("Orders", b"order 42", tags="created", keys=["order-42"])
    with Consumer("store", "billing", "Orders") as consumer:
        for m in consumer.poll(max_msgs=512, timeout_ms=1000):
            print(m.queue_id, m.queue_offset, m.body)
        consumer.commit()

    from rocketstore import MessageStore, StoreConfig      # the store in this process
    store = MessageStore(StoreConfig(store_path_root_dir="/tmp/rs")); store.load()

Spark's data source is ``rocketstore.spark`` (``register(spark)``; needs the ``spark``
extra). The rooms below this name, from the bottom floor up: ``storage`` (the files and
their algorithms), ``shm`` (the position table, the bus, lock and abort), ``wire`` (the
socket protocols), ``client`` (what applications import), ``procs`` (the store's OS
processes and their supervisor), ``spark`` and ``cli`` (the ``rocketstore`` command);
``docs/ARCHITECTURE.md`` draws them.
"""

from rocketstore.client import (
    BadAddressError, ClientError, ConnectionLost, Consumer, GroupNotExistError,
    HandshakeRefusedError, NoListenerError, NoStoreError, PendingSend, Producer, ReaderClient,
    RequestTimeout, StoreUnreachableError, TopicNotExistError)
from rocketstore.storage import (
    ASYNC_FLUSH, SYNC_FLUSH, AppendMessageStatus, CleanResult, CorruptRecordError,
    GetMessageResult, GetMessageStatus, Message, MessageExt, MessageStore, PutMessageResult,
    PutMessageStatus, QueryMessageResult, StoreClosedError, StoreConfig, StoreConfigError,
    StoreError, StoreFileError, StoreLockedError)

__version__ = "0.1.0"

__all__ = [
    "ASYNC_FLUSH", "SYNC_FLUSH", "AppendMessageStatus", "BadAddressError", "CleanResult",
    "ClientError", "ConnectionLost", "Consumer", "CorruptRecordError", "GetMessageResult",
    "GetMessageStatus", "GroupNotExistError", "HandshakeRefusedError", "Message", "MessageExt",
    "MessageStore",
    "NoListenerError", "NoStoreError", "PendingSend", "Producer", "PutMessageResult",
    "PutMessageStatus", "QueryMessageResult", "ReaderClient", "RequestTimeout",
    "StoreClosedError", "StoreConfig", "StoreConfigError", "StoreError", "StoreFileError",
    "StoreLockedError", "StoreUnreachableError", "TopicNotExistError",
]
