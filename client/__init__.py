"""rocketstore's client library: what an application imports to use a running store.

``Producer`` sends to the writer's ingest socket, ``Consumer`` reads the store's mapped
files directly as a member of a consumer group, ``ReaderClient`` reads through the reader
socket (another host, Spark executors elsewhere), ``topics`` says which topics and
groups a store has (``TopicNotExistError``, ``GroupNotExistError``), ``group_offsets``
reads, moves and deletes a group's offsets. ``errors`` is what they raise; ``reach``
finds a socket and tells at once when no store is there. Clients build on ``wire`` (the
socket protocols), ``shm`` and ``storage``; they never import the store's processes.
"""

from rocketstore.client.consumer import Consumer
from rocketstore.client.errors import (
    BadAddressError, ClientError, ConnectionLost, HandshakeRefusedError, NoListenerError,
    NoStoreError, RequestTimeout, StoreUnreachableError)
from rocketstore.client.producer import PendingSend, Producer, message_batches
from rocketstore.client.reader_client import ReaderClient
from rocketstore.client.topics import GroupNotExistError, TopicNotExistError

__all__ = ["BadAddressError", "ClientError", "ConnectionLost", "Consumer",
           "GroupNotExistError", "HandshakeRefusedError", "NoListenerError", "NoStoreError",
           "PendingSend", "Producer", "ReaderClient", "RequestTimeout",
           "StoreUnreachableError", "TopicNotExistError", "message_batches"]
