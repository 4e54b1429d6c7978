"""``StoreConfig``: RocketMQ's MessageStoreConfig, field for field, in snake_case.

Every field carries RocketMQ's default (SPEC §3.1); units are those of the Java field
(milliseconds unless the name says otherwise, ``file_reserved_time`` in hours, ratios in
percent or as fractions exactly as RocketMQ reads them). A few BrokerConfig values the
store needs (``broker_ip1``, ``listen_port``, ``default_topic_queue_nums``,
``long_polling_enable``, the ``transaction_*`` settings of the gRPC endpoint's
transactional messages) sit here too, under their BrokerConfig names.

Warm-up (``warm_maped_file_enable``, ``flush_least_pages_when_warm_maped_file``) acts
on the files the appender's allocation thread makes ahead (``storage.allocate``). The
TransientStorePool (``transient_store_pool_*``, ``commit_*_commit_log``,
``fast_fail_if_no_buffer_in_store_pool``) is the multiprocess store's
(``shm.transient_pool``): ASYNC_FLUSH on a master only, as in RocketMQ; the embedded
store refuses it. ``os_page_cache_busy_time_out_mills`` is the writer's: requests that
waited behind an append that held the CommitLog longer are refused with
OS_PAGECACHE_BUSY (RocketMQ's PCBUSY_CLEAN_QUEUE).

Every setting acts as RocketMQ's does, or is refused with the reason when set to what
this store cannot do (``REFUSED_WHEN_SET``), or works as ``NOTES`` says where processes
change its meaning; ``rocketstore config`` prints each mark beside its setting.

Some settings are rocketstore's own: ``tcp_listen_address`` (TCP sockets beside the
Unix ones, loopback only for now), ``producer_id_expiration_ms`` (Kafka's
``producer.id.expiration.ms``, default one day), how long the writer remembers an
idempotent producer that stores nothing (``storage.producer_state``), and
``metrics_port`` / ``metrics_address`` (the Prometheus endpoint, ``procs.metrics``;
port 0, the default, is off; loopback unless set otherwise) and the ``dashboard_*``
settings (the web console, ``rocketstore.console``: off by default, loopback unless
``dashboard_auth`` is set, read-only unless ``dashboard_allow_writes``).

The same settings load from the ``[store]`` table of ``supervisor.toml``
(``StoreConfig.from_toml``); tests build tiny stores in Python
(``StoreConfig(store_path_root_dir=d, mapped_file_size_commit_log=8192)``), the way
RocketMQ's own tests use 8 KiB-10 MiB commitlog files.

A settings file (``read_settings_file``) holds ``[store]`` and the supervisor's
``[process.NAME]`` tables and nothing else: an unknown table or setting is refused
(``UnknownSettingError``) with the nearest known name, since a misspelling would leave
the default in force without a word. Relative paths in a file (``PATH_SETTINGS``) are
read from the file's own directory (``resolve_paths``). A store keeps the file sizes it
was created with (``GEOMETRY_FIELDS``, recorded in ``config/storeGeometry.json``):
``with_recorded_geometry`` opens it with them unless the settings file sets another
value, which is refused (``GeometryMismatchError``) naming the recorded one.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import tomllib
from typing import Any, Collection

from rocketstore.storage.consume_queue import CQ_STORE_UNIT_SIZE
from rocketstore.storage.errors import (
    GeometryMismatchError, StoreConfigError, UnknownSettingError)

MIN_COMMIT_LOG_FILE_SIZE = 4096
# The reader's TCP port, from listen_port: RocketMQ's fast (VIP) port, 10909 beside 10911
# (ingest) and 10912 (RocketMQ's HA port, listen_port + 1).
READER_PORT_OFFSET = -2

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
SLAVE = "SLAVE"
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", SLAVE)


def _check_type(name: str, value: Any) -> None:
    """Raise ``StoreConfigError`` when ``value`` is not of the setting's type."""
    default = next(f.default for f in dataclasses.fields(StoreConfig) if f.name == name)
    if default is None:
        ok = value is None or isinstance(value, str)
    elif isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default)) and not isinstance(value, bool)
    if not ok:
        raise StoreConfigError(f"{name} must be a {type(default).__name__ if default is not None else 'str'}, "
                               f"not {value!r}")


# The settings that fix the size of the files: a store keeps them for life.
GEOMETRY_FIELDS = ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
                   "max_hash_slot_num", "max_index_num")
GEOMETRY_FILE = "storeGeometry.json"


def _loopback_unless_gated(setting: str, address: str, gated: bool, gate: str) -> None:
    """Every listener of the store binds loopback unless its gate is configured (CURVE
    for ZeroMQ over TCP, the access key for gRPC, dashboard_auth for the web console):
    raise ``StoreConfigError`` naming ``setting`` for an address that is not an IP
    address, or one beyond loopback without its gate (``gate`` says what is needed)."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        raise StoreConfigError(f"{setting} {address!r} is not an IP address") from None
    if not loopback and not gated:
        raise StoreConfigError(f"{setting} {address} is not a loopback address: {gate}")


@dataclasses.dataclass
class StoreConfig:
    # --- paths and file sizes -------------------------------------------------------
    store_path_root_dir: str = "store"
    store_path_commit_log: str | None = None  # None: {store_path_root_dir}/commitlog
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CQ_STORE_UNIT_SIZE
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    max_message_size: int = 1024 * 1024 * 4
    # --- flush and commit ----------------------------------------------------------
    flush_disk_type: str = ASYNC_FLUSH
    sync_flush_timeout: int = 5000
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    flush_commit_log_timed: bool = False
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    warm_maped_file_enable: bool = False
    flush_least_pages_when_warm_maped_file: int = 4096  # pages (16 MiB)
    # --- expiry -------------------------------------------------------------------------
    file_reserved_time: int = 72  # hours
    delete_when: str = "04"
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_maped_file_interval_forcibly: int = 1000 * 120
    redelete_hanged_file_interval: int = 1000 * 120
    clean_resource_interval: int = 10_000
    disk_max_used_space_ratio: int = 75  # percent
    disk_space_warning_level_ratio: float = 0.90
    disk_space_clean_forcibly_ratio: float = 0.85
    clean_file_forcibly_enable: bool = True
    # --- recovery, index, dispatch --------------------------------------------------
    check_crc_on_recover: bool = True
    message_index_enable: bool = True
    message_index_safe: bool = False
    duplication_enable: bool = False
    enable_consume_queue_ext: bool = False
    broker_role: str = "ASYNC_MASTER"
    # --- replication (procs.ha, procs.replica; docs/OPERATIONS.md) ------------------------
    # the master's HA socket (TCP, on tcp_listen_address or loopback); 0: none, the store
    # serves no slave (RocketMQ's default is 10912; a TCP port is opt-in here, as ingest's)
    ha_listen_port: int = 0
    ha_master_address: str = ""             # a SLAVE's master, "host:port"
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    ha_send_heartbeat_interval: int = 5000
    ha_housekeeping_interval: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_max_time_slave_not_catchup: int = 15_000   # out of the in-sync set after this long behind
    # --- controller mode (procs.controller; docs/OPERATIONS.md "Failover") ---------------
    # a broker group elects its master through ZooKeeper (cluster_address, a connect
    # string "host:port[,host:port...]"); every member has the same master broker_role
    enable_controller_mode: bool = False
    cluster_address: str = ""
    broker_name: str = ""                   # the group
    broker_id: int = 0                      # this member, unique in its group
    enable_elect_unclean_master: bool = False
    cluster_session_timeout_ms: int = 6000  # rocketstore's: the ZooKeeper session's timeout
    # --- delayed messages ---------------------------------------------------------
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flush_delay_offset_interval: int = 10_000
    # --- idempotent producers (rocketstore's; Kafka's producer.id.expiration.ms) ---------
    producer_id_expiration_ms: int = 86_400_000
    # --- read path limits -----------------------------------------------------------
    max_msgs_num_batch: int = 64
    default_query_max_num: int = 32
    max_transfer_bytes_on_message_in_memory: int = 1024 * 256
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 1024 * 64
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    # --- locking and diagnostics ----------------------------------------------------
    os_page_cache_busy_time_out_mills: int = 1000
    use_reentrant_lock_when_put_message: bool = False
    debug_lock_enable: bool = False
    # --- BrokerConfig values the store needs -------------------------------------------
    broker_ip1: str = "127.0.0.1"
    listen_port: int = 10911
    # rocketstore's: also listen on TCP at this address (ingest on listen_port, reader on
    # listen_port - 2, RocketMQ's fast port); empty = Unix sockets only. Beyond loopback
    # only with CURVE.
    tcp_listen_address: str = ""
    # rocketstore's: CURVE on every TCP socket (wire.curve; rocketstore keys makes the
    # files): this store's secret certificate, and the client public certificates (files
    # or directories, comma-separated) it lets in
    curve_server_key: str = ""
    curve_authorized_keys: str = ""
    # a SLAVE's side of CURVE: its own secret certificate and its master's public one
    curve_client_key: str = ""
    ha_master_server_key: str = ""
    default_topic_queue_nums: int = 8
    long_polling_enable: bool = True
    # rocketstore's: the Prometheus endpoint (procs.metrics) on this port; 0 = off
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    # rocketstore's: the web console (rocketstore.console) served by `up` on this port;
    # 0 = off. Beyond loopback only with dashboard_auth (a token file or a basic-auth
    # users file); offset resets and test sends only with dashboard_allow_writes
    dashboard_port: int = 0
    dashboard_address: str = "127.0.0.1"
    dashboard_auth: str = ""
    dashboard_allow_writes: bool = False
    # rocketstore's: keep the writer process on one CPU (procs.affinity): writer_cpu, or
    # with -1 the one the fewest other stores' writers are kept on; nothing is pinned
    # where the writer may use a single CPU
    writer_cpu_affinity: bool = True
    writer_cpu: int = -1
    # rocketstore's: the writer's ZeroMQ I/O thread runs SCHED_BATCH while requests come
    # in together (procs.io_thread)
    writer_io_batching: bool = True
    # rocketstore's: the store's files are 0666 & ~data_umask, its directories
    # 0777 & ~data_umask (storage.file_modes): owner and group by default
    data_umask: int = 0o027
    # rocketstore's: RocketMQ 5's gRPC MessagingService (procs.proxy) on this port
    # (RocketMQ's proxy listens on 8081); 0 = off. Beyond loopback only with an access key
    # check: clients sign each call with grpc_access_key and grpc_secret_key (RocketMQ's
    # AK/SK credentials)
    grpc_listen_port: int = 0
    grpc_listen_address: str = "127.0.0.1"
    grpc_access_key: str = ""
    grpc_secret_key: str = ""
    # RocketMQ ProxyConfig's: the shortest invisible duration a ReceiveMessage may ask
    min_invisible_time_mills_for_recv: int = 10000
    # RocketMQ SubscriptionGroupConfig's default, for every pop group: a message handed
    # out retry_max_times + 1 times and never acked goes to %DLQ%<group>
    retry_max_times: int = 16
    # RocketMQ BrokerConfig's, for the gRPC endpoint's transactional messages
    # (procs.transaction_service): a half message neither committed nor rolled back
    # transaction_timeout ms after its birth (or its CHECK_IMMUNITY_TIME_IN_SECONDS) is
    # checked with a live producer of its topic, a check every transaction_check_interval
    # ms, at most transaction_check_max times; then it is discarded (logged, a copy kept in
    # TRANS_CHECK_MAX_TIME_TOPIC)
    transaction_timeout: int = 6000
    transaction_check_max: int = 15
    transaction_check_interval: int = 30000

    def __post_init__(self) -> None:
        self.validate()

    # ---------------------------------------------------------------------------------
    @property
    def commit_log_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "consumequeue")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "index")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "config")

    @property
    def consume_queue_file_size(self) -> int:
        """The ConsumeQueue file size rounded up to a whole number of 20-byte units."""
        units = -(-self.mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE)
        return units * CQ_STORE_UNIT_SIZE

    @property
    def index_file_size(self) -> int:
        return 40 + self.max_hash_slot_num * 4 + self.max_index_num * 20

    @property
    def reader_port(self) -> int:
        """The reader's TCP port (with ``tcp_listen_address``): RocketMQ's fast (VIP)
        port, ``listen_port - 2``, leaving ``listen_port + 1`` to the HA socket as in
        RocketMQ (10909, 10911 and 10912 by default)."""
        return self.listen_port + READER_PORT_OFFSET

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == SYNC_FLUSH

    @property
    def slave(self) -> bool:
        return self.broker_role == SLAVE

    def ha_master_endpoint(self) -> tuple[str, int]:
        """``ha_master_address`` as (host, port). Raises ``StoreConfigError``."""
        host, sep, port = self.ha_master_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreConfigError(f"ha_master_address {self.ha_master_address!r} is not "
                                   '"host:port"')
        return host.strip("[]"), int(port)

    # ---------------------------------------------------------------------------------
    def _validate_grpc(self) -> None:
        """The gRPC endpoint's settings: a port, an IP address, and beyond loopback an
        access key check (both keys)."""
        if not 0 <= self.grpc_listen_port < 65536:
            raise StoreConfigError(f"grpc_listen_port {self.grpc_listen_port} is not a port "
                                   "(0: no gRPC endpoint)")
        if bool(self.grpc_access_key) != bool(self.grpc_secret_key):
            raise StoreConfigError("grpc_access_key and grpc_secret_key go together: the "
                                   "clients sign each call with the pair")
        if self.retry_max_times < 0:
            raise StoreConfigError("retry_max_times must not be negative")
        if self.transaction_timeout < 0 or self.transaction_check_max < 0:
            raise StoreConfigError("transaction_timeout and transaction_check_max must not "
                                   "be negative")
        if self.transaction_check_interval < 100:
            raise StoreConfigError("transaction_check_interval must be at least 100 ms")
        if self.min_invisible_time_mills_for_recv < 1000:
            raise StoreConfigError("min_invisible_time_mills_for_recv must be at least 1000 "
                                   "(clients ask invisible durations in whole seconds)")
        if not self.grpc_listen_port:
            return
        _loopback_unless_gated(
            "grpc_listen_address", self.grpc_listen_address, bool(self.grpc_access_key),
            "serving gRPC beyond this host needs an access key check (grpc_access_key "
            "and grpc_secret_key, the credentials the clients sign with)")

    def validate(self) -> None:
        """Raise ``StoreConfigError`` naming the first setting that cannot work."""
        for name, why in REFUSED_WHEN_SET.items():
            if getattr(self, name) != _DEFAULTS[name]:
                raise StoreConfigError(f"{name} = {getattr(self, name)!r} is not supported: "
                                       f"{why}")
        if self.mapped_file_size_commit_log < MIN_COMMIT_LOG_FILE_SIZE:
            raise StoreConfigError(
                f"mapped_file_size_commit_log={self.mapped_file_size_commit_log} is below "
                f"{MIN_COMMIT_LOG_FILE_SIZE} bytes")
        if self.mapped_file_size_consume_queue < CQ_STORE_UNIT_SIZE:
            raise StoreConfigError("mapped_file_size_consume_queue must hold at least one unit")
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise StoreConfigError(f"flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, "
                                   f"not {self.flush_disk_type!r}")
        if self.broker_role not in BROKER_ROLES:
            raise StoreConfigError(f"broker_role must be one of {BROKER_ROLES}")
        self._validate_replication()
        for name in ("max_hash_slot_num", "max_index_num", "max_message_size",
                     "default_topic_queue_nums", "sync_flush_timeout",
                     "producer_id_expiration_ms"):
            if getattr(self, name) <= 0:
                raise StoreConfigError(f"{name} must be positive")
        if self.writer_cpu < -1:
            raise StoreConfigError(f"writer_cpu must be a CPU number or -1 (the store "
                                   f"chooses), not {self.writer_cpu}")
        if self.tcp_listen_address:
            _loopback_unless_gated(
                "tcp_listen_address", self.tcp_listen_address, bool(self.curve_server_key),
                "listening beyond this host needs CURVE (curve_server_key and "
                "curve_authorized_keys; rocketstore keys makes them)")
        if self.transient_store_pool_enable:
            if self.sync_flush or self.broker_role == "SLAVE":
                raise StoreConfigError(
                    "transient_store_pool_enable needs ASYNC_FLUSH on a master, as in "
                    "RocketMQ (isTransientStorePoolEnable): a SYNC_FLUSH ack waits for the "
                    "disk, which the pool's commit step would only delay")
            if not 2 <= self.transient_store_pool_size <= 64:
                raise StoreConfigError(
                    "transient_store_pool_size must be in 2..64: the next file's buffer "
                    "comes back only once the file before it is wholly committed, and its "
                    "last bytes (the BLANK that ends it) are committed only when the writer "
                    "has gone on into the next file, so one buffer waits for itself")
        self._validate_grpc()
        if not 0 <= self.data_umask <= 0o777 or self.data_umask & 0o700:
            raise StoreConfigError(f"data_umask {self.data_umask:#o} must be in 0..0o077: "
                                   "the store's own processes must read and write its files")
        if not 0 <= self.metrics_port <= 65535:
            raise StoreConfigError("metrics_port must be in 0..65535 (0: no metrics endpoint)")
        taken = {self.ha_listen_port: "the HA socket (ha_listen_port)"}
        if self.tcp_listen_address:
            taken[self.listen_port] = "ingest (listen_port)"
            taken[self.reader_port] = "the reader (listen_port - 2)"
        if self.metrics_port and self.metrics_port in taken:
            raise StoreConfigError(f"metrics_port {self.metrics_port} is taken by "
                                   f"{taken[self.metrics_port]}")
        taken[self.metrics_port] = "the metrics endpoint (metrics_port)"
        if self.grpc_listen_port and self.grpc_listen_port in taken:
            raise StoreConfigError(f"grpc_listen_port {self.grpc_listen_port} is taken by "
                                   f"{taken[self.grpc_listen_port]}")
        if self.grpc_listen_port:
            taken[self.grpc_listen_port] = "the gRPC endpoint (grpc_listen_port)"
        try:
            ipaddress.ip_address(self.metrics_address)
        except ValueError:
            raise StoreConfigError(f"metrics_address {self.metrics_address!r} is not an IP "
                                   "address") from None
        self._validate_dashboard(taken)
        if not 1 - READER_PORT_OFFSET <= self.listen_port <= 65535:
            raise StoreConfigError(f"listen_port must be in {1 - READER_PORT_OFFSET}..65535 "
                                   "(the reader listens on listen_port - 2)")
        if self.max_index_num < 2:
            raise StoreConfigError("max_index_num must be at least 2 (entry 0 is never used)")
        if not 0 < self.disk_max_used_space_ratio <= 100:
            raise StoreConfigError("disk_max_used_space_ratio is a percent in (0, 100]")
        for name in ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise StoreConfigError(f"{name} is a fraction in (0, 1], not {getattr(self, name)}")

    # ---------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, table: dict[str, Any], **overrides: Any) -> "StoreConfig":
        """Build from a ``[store]`` table; an unknown key is an error, not ignored."""
        known = cls.field_names()
        merged = {**table, **{k: v for k, v in overrides.items() if v is not None}}
        unknown = sorted(set(merged) - set(known))
        if unknown:
            raise UnknownSettingError("; ".join(f"[store] {name}: no such setting"
                                                f"{did_you_mean(name, known)}"
                                                for name in unknown))
        for name, value in merged.items():
            _check_type(name, value)
        return cls(**merged)

    @classmethod
    def from_toml(cls, path: str, *, base_dir: str | None = None,
                  **overrides: Any) -> "StoreConfig":
        """Load the ``[store]`` table of a supervisor.toml-style file, its relative paths
        read from ``base_dir`` (default: the file's own directory; ``""``: the working
        directory). Raises ``OSError``, ``tomllib.TOMLDecodeError`` and
        ``StoreConfigError`` (``UnknownSettingError`` for a table or setting that does
        not exist)."""
        doc = read_settings_file(path)
        base = os.path.dirname(path) if base_dir is None else base_dir
        return cls.from_mapping(resolve_paths(doc.get("store", {}), base), **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def _validate_dashboard(self, taken: dict[int, str]) -> None:
        """The web console's port and address: beyond loopback only with
        ``dashboard_auth``, as TCP beyond loopback only with CURVE."""
        if not 0 <= self.dashboard_port <= 65535:
            raise StoreConfigError("dashboard_port must be in 0..65535 (0: no dashboard)")
        taken = {**taken, self.metrics_port: "the metrics endpoint (metrics_port)"}
        if self.dashboard_port and self.dashboard_port in taken:
            raise StoreConfigError(f"dashboard_port {self.dashboard_port} is taken by "
                                   f"{taken[self.dashboard_port]}")
        _loopback_unless_gated(
            "dashboard_address", self.dashboard_address, bool(self.dashboard_auth),
            "serving the dashboard beyond this host needs dashboard_auth (a file holding "
            "a token, or basic-auth users as name:password lines)")

    # ---------------------------------------------------------------------------------
    def check_replication(self) -> None:
        """What a replicating store (the multiprocess one) needs on top of ``validate``:
        a SLAVE its master's address, a SYNC_MASTER an HA socket for its slave."""
        if self.slave and not self.ha_master_address:
            raise StoreConfigError('broker_role = "SLAVE" needs ha_master_address '
                                   '("host:port" of its master\'s HA socket)')
        if self.broker_role == "SYNC_MASTER" and not self.ha_listen_port:
            raise StoreConfigError('broker_role = "SYNC_MASTER" needs ha_listen_port: its '
                                   "acknowledgements wait for a slave")
        if self.enable_controller_mode:
            self._check_controller_mode()

    def _check_controller_mode(self) -> None:
        """A group member needs ZooKeeper, its group, TCP sockets the others can reach and
        a master role (which member is master is the group's choice)."""
        for name in ("cluster_address", "broker_name", "tcp_listen_address"):
            if not getattr(self, name):
                raise StoreConfigError(f"enable_controller_mode needs {name}")
        if not self.ha_listen_port:
            raise StoreConfigError("enable_controller_mode needs ha_listen_port: any member "
                                   "may become the master its slaves follow")
        if self.slave:
            raise StoreConfigError('enable_controller_mode needs broker_role = "SYNC_MASTER" '
                                   'or "ASYNC_MASTER" (how the master acknowledges): the group '
                                   "chooses which member is master")

    def _validate_replication(self) -> None:
        if self.ha_master_address:
            self.ha_master_endpoint()
        if bool(self.curve_server_key) != bool(self.curve_authorized_keys):
            raise StoreConfigError("curve_server_key and curve_authorized_keys go together: "
                                   "a CURVE server without authorized clients lets no one in")
        if bool(self.curve_client_key) != bool(self.ha_master_server_key):
            raise StoreConfigError("curve_client_key and ha_master_server_key go together: "
                                   "a slave needs its own secret key and its master's public "
                                   "one")
        if not 0 <= self.ha_listen_port < 65536:
            raise StoreConfigError("ha_listen_port must be in 0..65535 (0: no HA socket)")
        if self.tcp_listen_address and self.ha_listen_port in (self.listen_port,
                                                               self.reader_port):
            raise StoreConfigError(f"ha_listen_port {self.ha_listen_port} is taken by ingest "
                                   "(listen_port) or the reader (listen_port - 2)")
        for name in ("ha_slave_fallbehind_max", "ha_send_heartbeat_interval",
                     "ha_housekeeping_interval", "ha_transfer_batch_size",
                     "ha_max_time_slave_not_catchup", "cluster_session_timeout_ms"):
            if getattr(self, name) <= 0:
                raise StoreConfigError(f"{name} must be positive")
        if self.ha_transfer_batch_size > 16 << 20:
            raise StoreConfigError("ha_transfer_batch_size must be at most 16 MiB (a slave "
                                   "takes HA frames of up to 64 MiB)")
        if self.ha_housekeeping_interval <= self.ha_send_heartbeat_interval:
            raise StoreConfigError("ha_housekeeping_interval must exceed "
                                   "ha_send_heartbeat_interval: a quiet but live peer "
                                   "would be dropped between heartbeats")
        if self.broker_id < 0:
            raise StoreConfigError("broker_id must not be negative")
        if "/" in self.broker_name:
            raise StoreConfigError(f"broker_name {self.broker_name!r} must not hold '/' (it "
                                   "names a ZooKeeper node)")
        for host in filter(None, self.cluster_address.split(",")):
            name, sep, port = host.strip().rpartition(":")
            if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
                raise StoreConfigError(f"cluster_address {self.cluster_address!r} is not "
                                       '"host:port[,host:port...]" (ZooKeeper\'s servers)')

    def geometry(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in GEOMETRY_FIELDS}

    def geometry_path(self) -> str:
        return os.path.join(self.config_dir, GEOMETRY_FILE)


STORE_PARTS = ("commitlog", "checkpoint", "consumequeue", "config")


def holds_store(root_dir: str) -> bool:
    """Whether ``root_dir`` holds anything of a store (one of ``STORE_PARTS``): an empty
    directory, or one with only ``run/``, does not, and opening it would make a store
    there."""
    return any(os.path.exists(os.path.join(root_dir, name)) for name in STORE_PARTS)


def recorded_geometry(root_dir: str) -> dict[str, int] | None:
    """The file sizes a store at ``root_dir`` was created with (None if unrecorded)."""
    from rocketstore.storage import json_file
    doc = json_file.load(os.path.join(root_dir, "config", GEOMETRY_FILE))
    if doc is None:
        return None
    return {k: doc[k] for k in GEOMETRY_FIELDS if isinstance(doc.get(k), int)}


def check_geometry(config: StoreConfig) -> bool:
    """True when the store recorded its file sizes and they equal ``config``'s.

    Raises ``GeometryMismatchError`` naming each setting that differs and the value the
    store recorded: opening a store with other file sizes would make every file look
    damaged.
    """
    recorded = recorded_geometry(config.store_path_root_dir)
    if recorded is None:
        return False
    wrong = [f"{k} = {v} (configured {getattr(config, k)})" for k, v in recorded.items()
             if getattr(config, k) != v]
    if wrong:
        raise GeometryMismatchError(
            f"the store at {config.store_path_root_dir} was created with "
            + ", ".join(wrong) + "; a store keeps its file sizes for life: open it with "
            f"the recorded ones ({os.path.join(config.config_dir, GEOMETRY_FILE)})")
    return True


def record_geometry(config: StoreConfig) -> None:
    from rocketstore.storage import json_file
    json_file.persist(config.geometry_path(), config.geometry())


# ------------------------------------------------------------------ settings files
SECTIONS = ("store", "process")     # [store], and the supervisor's [process.NAME] tables

# Settings that name files or directories: a relative one in a settings file is read
# from the file's own directory. curve_authorized_keys is a comma-separated list of them.
PATH_SETTINGS = ("store_path_root_dir", "store_path_commit_log", "curve_server_key",
                 "curve_authorized_keys", "curve_client_key", "ha_master_server_key",
                 "dashboard_auth")


def nearest_name(name: str, known: Collection[str]) -> str | None:
    """The known name ``name`` most likely misspells, or None. RocketMQ's camelCase
    spelling of a setting (``flushDiskType``) finds its snake_case one."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    if snake in known:
        return snake
    close = difflib.get_close_matches(snake, known, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, known: Collection[str], form: str = "{}") -> str:
    """`` (did you mean X?)`` for the nearest known name, ``form`` shaping it; empty
    when none is near."""
    near = nearest_name(name, known)
    return f" (did you mean {form.format(near)}?)" if near else ""


def read_settings_file(path: str) -> dict[str, Any]:
    """The TOML document of a settings file whose tables and ``[store]`` settings all
    exist (``[process.NAME]`` tables are the supervisor's to check).

    Raises ``OSError``, ``tomllib.TOMLDecodeError``, and ``UnknownSettingError`` naming
    the file, what it does not know, and the nearest known name.
    """
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    fields = StoreConfig.field_names()
    for name, value in doc.items():
        if name in SECTIONS:
            if not isinstance(value, dict):
                raise StoreConfigError(f"{path}: {name} must be a table: [{name}]")
            continue
        if not isinstance(value, dict):
            raise UnknownSettingError(f"{path}: {name} is above every table: "
                                      + _outside_tables(name, fields))
        sub = next(iter(value), None)     # [proces.writer] reads as {"proces": {"writer"...
        tail = f".{sub}" if sub is not None and isinstance(value[sub], dict) else ""
        hint = did_you_mean(name, SECTIONS, "[{}" + tail + "]")
        raise UnknownSettingError(f"{path}: [{name}{tail}]: no such table{hint}; a settings "
                                  "file holds [store] and [process.NAME] tables")
    unknown = sorted(set(doc.get("store", {})) - set(fields))
    if unknown:
        raise UnknownSettingError(f"{path}: " + "; ".join(
            f"[store] {name}: no such setting{did_you_mean(name, fields)}" for name in unknown))
    return doc


def _outside_tables(name: str, fields: Collection[str]) -> str:
    """What to do with a setting written above every table."""
    if name in fields:
        return "it is a [store] setting: write it below a [store] line"
    near = nearest_name(name, fields)
    return (f"did you mean [store] {near}?" if near else
            "settings go in [store] or [process.NAME] tables")


def resolve_paths(table: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """``table`` (a ``[store]`` table) with every relative path of ``PATH_SETTINGS``
    joined to ``base_dir`` (the settings file's directory; ``""`` leaves them relative
    to the working directory). Values of other types are left for validation."""
    out = dict(table)
    for name in PATH_SETTINGS:
        value = out.get(name)
        if base_dir and isinstance(value, str) and value:
            parts = [p.strip() for p in value.split(",")] if name == "curve_authorized_keys" \
                else [value]
            out[name] = ",".join(os.path.join(base_dir, p) if p else p for p in parts)
    return out


def with_recorded_geometry(config: StoreConfig, set_in_file: Collection[str] = (),
                           settings_file: str = "", new_store_sizes: dict | None = None
                           ) -> StoreConfig:
    """``config`` with the file sizes the store at its root recorded when it was created,
    for every one ``set_in_file`` (the ``[store]`` settings the settings file names)
    does not name; a store not created yet takes ``new_store_sizes`` for those.

    Raises ``GeometryMismatchError`` when the settings file sets a size other than the
    recorded one, naming the recorded value and how to keep it.
    """
    recorded = recorded_geometry(config.store_path_root_dir)
    if recorded is None:
        sizes = {k: v for k, v in (new_store_sizes or {}).items() if k not in set_in_file}
        return dataclasses.replace(config, **sizes) if sizes else config
    adopted = dataclasses.replace(config, **{k: v for k, v in recorded.items()
                                             if k not in set_in_file})
    wrong = [k for k, v in recorded.items() if getattr(adopted, k) != v]
    if not wrong:
        return adopted
    sets = "; ".join(f"{k} = {getattr(adopted, k)} is set, the store recorded {recorded[k]}"
                     for k in wrong)
    raise GeometryMismatchError(
        f"the store at {config.store_path_root_dir} was created with other file sizes "
        f"({sets} in {os.path.join(config.config_dir, GEOMETRY_FILE)}); a store keeps "
        f"them for life: remove {' and '.join(wrong)} from {settings_file or 'the settings'}"
        " to open it with the recorded ones, or set another store_path_root_dir for a new "
        "store of these sizes")


# ------------------------------------------------------------------ what each setting does
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StoreConfig)}

REFUSED_WHEN_SET: dict[str, str] = {
    "duplication_enable": "it would change what is stored",
    "enable_consume_queue_ext": "it would change what is stored",
    "use_reentrant_lock_when_put_message": "the writer is one single-threaded process: no "
                                           "lock is taken around a put",
    "debug_lock_enable": "the writer takes no put lock; an append that holds the CommitLog "
                         "over 500 ms is always logged",
    "long_polling_enable": "PULL and Consumer.poll always wait for new messages (long "
                           "polling); short polling is not built",
    "redelete_hanged_file_interval": "files are unlinked at once and every process unmaps "
                                     "them itself (following MIN_OFFSET): no file can hang",
}

NOTES: dict[str, str] = {
    "destroy_maped_file_interval_forcibly": "the embedded store's; the multiprocess cleaner "
                                            "unlinks at once, readers keep their mappings "
                                            "until they follow MIN_OFFSET",
    "transient_store_pool_enable": "the multiprocess store's, ASYNC_FLUSH only",
    "os_page_cache_busy_time_out_mills": "the writer refuses what waited behind a longer "
                                         "append (OS_PAGECACHE_BUSY)",
    "tcp_listen_address": "rocketstore's",
    "curve_server_key": "rocketstore's: CURVE on every TCP socket",
    "curve_authorized_keys": "rocketstore's",
    "curve_client_key": "rocketstore's: a SLAVE's CURVE key",
    "ha_master_server_key": "rocketstore's: the master's CURVE public key",
    "ha_listen_port": "0 (the default): no HA socket, no slave; RocketMQ listens on 10912",
    "ha_transfer_batch_size": "the largest block the HA process sends; blocks end at a "
                              "file's end, never cross it",
    "producer_id_expiration_ms": "rocketstore's",
    "cluster_address": "a ZooKeeper connect string (RocketMQ's controller is DLedger's)",
    "cluster_session_timeout_ms": "rocketstore's: the ZooKeeper session's timeout",
    "metrics_port": "rocketstore's",
    "writer_cpu_affinity": "rocketstore's: the writer is kept on one CPU (off: it runs "
                           "on any)",
    "writer_cpu": "rocketstore's: the writer's CPU; -1, the default: the store chooses",
    "writer_io_batching": "rocketstore's: the writer's ZeroMQ I/O thread does not preempt "
                          "the writer while requests come in together (SCHED_BATCH)",
    "metrics_address": "rocketstore's",
    "data_umask": "rocketstore's (default 0o027: files 0640, directories 0750)",
    "grpc_listen_port": "rocketstore's: RocketMQ 5's gRPC MessagingService (the proxy "
                        "process); 0, the default: off; RocketMQ's proxy listens on 8081",
    "grpc_listen_address": "rocketstore's: beyond loopback only with grpc_access_key",
    "grpc_access_key": "rocketstore's: the AK the gRPC clients sign with",
    "grpc_secret_key": "rocketstore's: the SK the gRPC clients sign with",
    "min_invisible_time_mills_for_recv": "RocketMQ ProxyConfig's",
    "retry_max_times": "RocketMQ's subscription group setting, here every pop group's",
    **dict.fromkeys(("transaction_timeout", "transaction_check_max",
                     "transaction_check_interval"),
                    "RocketMQ BrokerConfig's (transactionTimeOut, transactionCheckMax, "
                    "transactionCheckInterval), for the gRPC endpoint's transactions"),
    "dashboard_port": "rocketstore's: the web console (rocketstore dashboard)",
    "dashboard_address": "rocketstore's: beyond loopback only with dashboard_auth",
    "dashboard_auth": "rocketstore's: a token file, or name:password lines (basic auth)",
    "dashboard_allow_writes": "rocketstore's: offset resets and test sends from the dashboard",
    **dict.fromkeys(("max_transfer_count_on_message_in_memory",
                     "max_transfer_bytes_on_message_in_memory",
                     "max_transfer_count_on_message_in_disk",
                     "max_transfer_bytes_on_message_in_disk"),
                    "bounds the reader's PULL and the embedded get_message, as a broker's "
                    "pull; a Consumer reading the files returns what poll asks for, up to "
                    "its max_poll_bytes"),
}


def setting_mark(name: str) -> str:
    """What ``rocketstore config`` says beside a setting: empty when it acts as
    RocketMQ's does."""
    if name in REFUSED_WHEN_SET:
        return f"refused unless {_DEFAULTS[name]!r}: {REFUSED_WHEN_SET[name]}"
    return NOTES.get(name, "")
