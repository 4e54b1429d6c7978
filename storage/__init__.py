"""rocketstore's storage engine: RocketMQ's broker message store, byte-compatible.

Pure on-disk structures and their algorithms, usable alone in one process::

    from rocketstore.storage import MessageStore, StoreConfig, Message
    store = MessageStore(StoreConfig(store_path_root_dir="/tmp/rs"))
    store.load()
    r = store.put(Message(topic="T", body=b"hello", tags="TagA", keys=["k1"]))
    g = store.get_message("group", "T", r.queue_id, r.queue_offset, 32)
    store.close()

Modules, one structure each: ``record`` (the CommitLog record), ``mapped_file`` and
``mapped_file_queue``, ``reservation`` (the disk blocks reserved ahead of the writes into
mapped files), ``commit_log``, ``consume_queue``, ``index_file`` and
``index_service``, ``checkpoint``, ``delay_level``, ``expiry``, ``validation``,
``check`` (fsck), and ``message_store`` (the facade). This package never imports
``shm`` or ``procs``.
"""

from rocketstore.storage.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from rocketstore.storage.errors import (
    CorruptRecordError, StoreClosedError, StoreConfigError, StoreError, StoreFileError)
from rocketstore.storage.message import Message, MessageExt
from rocketstore.storage.message_store import (
    CleanResult, GetMessageResult, MessageStore, QueryMessageResult)
from rocketstore.storage.commit_log import PutMessageResult
from rocketstore.storage.status import AppendMessageStatus, GetMessageStatus, PutMessageStatus
from rocketstore.storage.store_lock import StoreLockedError

__all__ = [
    "ASYNC_FLUSH", "SYNC_FLUSH", "AppendMessageStatus", "CleanResult", "CorruptRecordError",
    "GetMessageResult", "GetMessageStatus", "Message", "MessageExt", "MessageStore",
    "PutMessageResult", "PutMessageStatus", "QueryMessageResult", "StoreClosedError",
    "StoreConfig", "StoreConfigError", "StoreError", "StoreFileError", "StoreLockedError",
]
