"""The proxy process: RocketMQ 5's gRPC endpoint, so RocketMQ's own clients (Java, Go,
C#, C++, Rust, Python) produce to and consume from the store unchanged but for their
endpoint (RocketMQ's proxy, ``procs.messaging_service``).

The supervisor runs it when ``grpc_listen_port`` is set (on a master only). It listens
on ``grpc_listen_address:grpc_listen_port`` (loopback unless an access key check is
configured, ``storage.config``), in plaintext, with RocketMQ's message size limit
(130 MiB) instead of gRPC's 4 MiB. Sends go to the writer's ingest socket as any
Producer's do; receives read the mapped files (``procs.pop_service``), the group's pop
state in ``config/popState.json`` and ``config/popState.journal``. Transactional
messages are half messages and op records in the store's own topics
(``procs.transaction_service``); the check of those left open runs in the loop.

Its loop turns on the dispatcher's ARRIVAL announcements: each wakes the receives
waiting for messages; every turn also renews a PushConsumer's messages due soon
(``PopService.renew``) and runs a transaction check when one is due
(``TransactionalMessageService.check_if_due``, every ``transaction_check_interval``).
gRPC calls run on ``WORKERS`` threads; a Telemetry stream holds
one for as long as its client runs (and a thread of its own reading the client's side),
so at most ``WORKERS`` clients and waiting receives are served at once (more wait their
turn).

Restart (decision table):

    state at start                     what the proxy does
    ---------------------------------  ------------------------------------------------
    no config/popState.*               every group pops each queue from its first message
    popState.json (or its .bak) and    the snapshot, then the journal's records replayed
    popState.journal                   (a torn last one cut away): in-flight messages
                                       stay invisible until their time, acked ones stay
                                       done; pops go on at the offsets committed
    half messages and op records       the ended transactions known by their op records,
    (RMQ_SYS_TRANS_*)                  the open ones checked from the check's offset
                                       (procs.transaction_service's own table)
    the port is taken, or the grpc     exits EXIT_CANNOT_LISTEN: the supervisor stops the
    extra is missing                   store, saying why (no restart can help)

Stopping: the server stops taking calls, waiting receives return what they have, and
calls in progress get ``STOP_GRACE_S`` to finish.
"""

from __future__ import annotations

import logging

from rocketstore.procs.service import Service
from rocketstore.shm import bus
from rocketstore.wire.curve import ListenError

log = logging.getLogger(__name__)

WORKERS = 64
MAX_MESSAGE_BYTES = 130 * 1024 * 1024       # RocketMQ's proxy takes 130 MiB
STOP_GRACE_S = 2.0
WAKE_WAIT_MS = 100
DEFAULT_BROKER_NAME = "rocketstore"


class Proxy(Service):
    name = "proxy"

    def setup(self) -> None:
        try:
            import grpc
            from rocketmq.grpc_protocol import service_pb2_grpc
            from rocketstore.procs.messaging_service import MessagingService
            from rocketstore.procs.pop_service import PopService
        except ImportError as e:
            raise ListenError(f"grpc_listen_port is set but the gRPC endpoint needs the "
                              f"grpc extra (pip install 'rocketstore[grpc]'): {e}") from None
        from concurrent import futures
        cfg = self.config
        self.pop = PopService(cfg, self.table, cfg.broker_name or DEFAULT_BROKER_NAME)
        self.service = MessagingService(self.store_dir, cfg, self.pop)
        self.arrivals = bus.Subscriber(self.context, self.store_dir, ["dispatcher"],
                                       [bus.ARRIVAL], conflate=True)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="grpc"),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0)])
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.server)
        address = f"{cfg.grpc_listen_address}:{cfg.grpc_listen_port}"
        if ":" in cfg.grpc_listen_address:
            address = f"[{cfg.grpc_listen_address}]:{cfg.grpc_listen_port}"
        try:
            self.server.add_insecure_port(address)
        except RuntimeError as e:
            raise ListenError(f"cannot serve gRPC on {address} (grpc_listen_port): "
                              f"{str(e).split(';')[0]}") from None
        self.server.start()
        log.info("serving RocketMQ's gRPC MessagingService on %s", address)

    def turn(self) -> None:
        if self.arrivals.wait(WAKE_WAIT_MS):
            self.pop.wake()
        try:
            self.pop.renew()
        except OSError as e:        # tried again next turn; the message may come back
            log.error("auto-renewal not written: %s", e)
        self.service.transactions.check_if_due()

    def teardown(self) -> None:
        self.service.stopping.set()
        self.pop.stop()
        self.server.stop(STOP_GRACE_S).wait()
        self.service.close()
        self.arrivals.close()
        self.pop.close()


SERVICE = Proxy
