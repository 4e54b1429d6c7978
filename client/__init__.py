"""rocketstore's client library: what an application imports to use a running store.

``Producer`` sends to the writer's ingest socket, ``Consumer`` reads the store's mapped
files directly as a member of a consumer group, ``ReaderClient`` reads through the reader
socket (another host, Spark executors elsewhere), ``group_offsets`` reads and moves a
group's offsets. Clients build on ``wire`` (the socket protocols), ``shm`` and
``storage``; they never import the store's processes.
"""

from rocketstore.client.consumer import Consumer
from rocketstore.client.dealer import ClientError, RequestTimeout
from rocketstore.client.producer import PendingSend, Producer, message_batches
from rocketstore.client.reader_client import ReaderClient

__all__ = ["ClientError", "Consumer", "PendingSend", "Producer", "ReaderClient",
           "RequestTimeout", "message_batches"]
