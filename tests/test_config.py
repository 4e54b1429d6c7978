"""StoreConfig: supervisor.toml's [store] table against the dataclass, loading from
TOML with overrides, unknown keys, and validate()'s refusals."""

from __future__ import annotations

import dataclasses
import os
import tomllib

import pytest

from rocketstore.storage import StoreConfig, StoreConfigError
from rocketstore.storage.config import ASYNC_FLUSH, SYNC_FLUSH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOML_FILES = [p for p in (os.path.join(ROOT, "rocketstore", "supervisor.toml"),
                          os.path.join(ROOT, "supervisor.toml")) if os.path.exists(p)]
OPTIONAL_IN_TOML = {"store_path_commit_log"}


def store_table(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)["store"]


def write_toml(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(StoreConfig)}


# ------------------------------------------------------------------ supervisor.toml
def test_embedded_supervisor_toml_exists():
    assert os.path.join(ROOT, "rocketstore", "supervisor.toml") in TOML_FILES


@pytest.mark.parametrize("path", TOML_FILES, ids=os.path.relpath)
def test_toml_store_table_has_exactly_the_store_config_fields(path):
    table = store_table(path)
    fields = set(StoreConfig.field_names())
    assert set(table) - fields == set(), "keys that StoreConfig does not know"
    assert fields - set(table) <= OPTIONAL_IN_TOML, "settings missing from the table"


@pytest.mark.parametrize("path", TOML_FILES, ids=os.path.relpath)
def test_toml_store_table_holds_the_store_config_defaults(path):
    table = store_table(path)
    want = defaults()
    for key, value in table.items():
        assert value == want[key], f"{key}: toml {value!r} != default {want[key]!r}"
        assert type(value) is type(want[key]) or want[key] is None, key


@pytest.mark.parametrize("path", TOML_FILES, ids=os.path.relpath)
def test_from_toml_of_the_shipped_file_equals_the_defaults(path):
    """The embedded file's paths are the working directory's (``base_dir=""``)."""
    assert StoreConfig.from_toml(path, base_dir="") == StoreConfig()


def test_defaults_are_rocketmqs():
    c = StoreConfig()
    assert c.mapped_file_size_commit_log == 1_073_741_824
    assert c.mapped_file_size_consume_queue == 6_000_000 == c.consume_queue_file_size
    assert c.index_file_size == 420_000_040
    assert (c.max_hash_slot_num, c.max_index_num) == (5_000_000, 20_000_000)
    assert c.flush_disk_type == ASYNC_FLUSH and not c.sync_flush
    assert (c.flush_interval_commit_log, c.flush_commit_log_least_pages,
            c.flush_commit_log_thorough_interval) == (500, 4, 10_000)
    assert (c.file_reserved_time, c.delete_when, c.disk_max_used_space_ratio) == (72, "04", 75)
    assert (c.disk_space_warning_level_ratio, c.disk_space_clean_forcibly_ratio) == (0.90, 0.85)
    assert c.destroy_maped_file_interval_forcibly == 120_000
    assert c.max_message_size == 4 * 1024 * 1024
    assert c.store_path_commit_log is None
    assert c.commit_log_dir == os.path.join("store", "commitlog")


# ------------------------------------------------------------------ from_toml
def test_from_toml_reads_the_table_and_applies_overrides(tmp_path):
    path = write_toml(tmp_path / "s.toml", """
[process.writer]
priority = 30

[store]
store_path_root_dir = "/data/rs"
mapped_file_size_commit_log = 8192
flush_disk_type = "SYNC_FLUSH"
file_reserved_time = 48
delete_when = "03;04"
""")
    c = StoreConfig.from_toml(path)
    assert c.store_path_root_dir == "/data/rs"
    assert c.mapped_file_size_commit_log == 8192
    assert c.flush_disk_type == SYNC_FLUSH and c.sync_flush
    assert (c.file_reserved_time, c.delete_when) == (48, "03;04")
    assert c.max_message_size == StoreConfig().max_message_size           # untouched
    c = StoreConfig.from_toml(path, store_path_root_dir="/elsewhere", file_reserved_time=1,
                              max_message_size=None)
    assert c.store_path_root_dir == "/elsewhere"                         # override wins
    assert c.file_reserved_time == 1
    assert c.max_message_size == StoreConfig().max_message_size           # None: ignored
    assert c.mapped_file_size_commit_log == 8192


def test_from_toml_without_a_store_table_gives_the_defaults(tmp_path):
    path = write_toml(tmp_path / "s.toml", "[process.writer]\npriority = 3\n")
    assert StoreConfig.from_toml(path) == StoreConfig()


def test_store_path_commit_log_may_be_set(tmp_path):
    path = write_toml(tmp_path / "s.toml",
                      '[store]\nstore_path_root_dir = "r"\nstore_path_commit_log = "/cl"\n')
    c = StoreConfig.from_toml(path)
    assert c.commit_log_dir == "/cl"
    assert c.consume_queue_dir == os.path.join(str(tmp_path), "r", "consumequeue")


def test_unknown_key_raises_naming_it(tmp_path):
    path = write_toml(tmp_path / "s.toml",
                      '[store]\nflush_disk_type = "ASYNC_FLUSH"\nflushDiskTypo = 1\n')
    with pytest.raises(StoreConfigError) as e:
        StoreConfig.from_toml(path)
    assert "flushDiskTypo" in str(e.value)
    with pytest.raises(StoreConfigError) as e:
        StoreConfig.from_mapping({}, no_such_setting=3)
    assert "no_such_setting" in str(e.value)


def test_bad_value_in_toml_raises_store_config_error(tmp_path):
    path = write_toml(tmp_path / "s.toml", '[store]\nflush_disk_type = "FAST"\n')
    with pytest.raises(StoreConfigError) as e:
        StoreConfig.from_toml(path)
    assert "flush_disk_type" in str(e.value)


def test_wrong_type_in_toml_raises_store_config_error_naming_it(tmp_path):
    """A string where a number belongs is a configuration fault, not a TypeError."""
    path = write_toml(tmp_path / "s.toml", '[store]\nmapped_file_size_commit_log = "1g"\n')
    with pytest.raises(StoreConfigError) as e:
        StoreConfig.from_toml(path)
    assert "mapped_file_size_commit_log" in str(e.value)


def test_malformed_toml_raises(tmp_path):
    path = write_toml(tmp_path / "s.toml", "[store\nx = \n")
    with pytest.raises(tomllib.TOMLDecodeError):
        StoreConfig.from_toml(path)


# ------------------------------------------------------------------ validate
@pytest.mark.parametrize("field, value", [
    ("flush_disk_type", "FAST_FLUSH"),
    ("flush_disk_type", "sync_flush"),
    ("flush_disk_type", ""),
    ("mapped_file_size_commit_log", 4095),
    ("mapped_file_size_commit_log", 0),
    ("mapped_file_size_commit_log", -1),
    ("mapped_file_size_consume_queue", 19),
    ("mapped_file_size_consume_queue", 0),
    ("broker_role", "MASTER"),
    ("max_hash_slot_num", 0),
    ("max_index_num", 1),
    ("max_message_size", 0),
    ("default_topic_queue_nums", 0),
    ("sync_flush_timeout", -5),
    ("disk_max_used_space_ratio", 0),
    ("disk_max_used_space_ratio", 101),
    ("disk_max_used_space_ratio", -75),
    ("disk_space_warning_level_ratio", 90),      # a percent where a fraction belongs
    ("disk_space_warning_level_ratio", 1.5),
    ("disk_space_clean_forcibly_ratio", 85),
    ("disk_space_clean_forcibly_ratio", -0.1),
])
def test_validate_rejects_bad_values(field, value):
    with pytest.raises(StoreConfigError) as e:
        StoreConfig(**{field: value})
    assert field in str(e.value)
    c = StoreConfig()
    setattr(c, field, value)
    with pytest.raises(StoreConfigError):
        c.validate()


@pytest.mark.parametrize("field, value", [
    ("flush_disk_type", SYNC_FLUSH),
    ("mapped_file_size_commit_log", 4096),
    ("mapped_file_size_consume_queue", 20),
    ("mapped_file_size_consume_queue", 1001),
    ("broker_role", "SLAVE"),
    ("broker_role", "SYNC_MASTER"),
    ("max_index_num", 2),
    ("disk_max_used_space_ratio", 1),
    ("disk_max_used_space_ratio", 100),
    ("disk_space_warning_level_ratio", 1.0),
    ("disk_space_clean_forcibly_ratio", 0.5),
])
def test_validate_accepts_edge_values(field, value):
    assert getattr(StoreConfig(**{field: value}), field) == value


def test_to_dict_has_every_field():
    d = StoreConfig().to_dict()
    assert list(d) == StoreConfig.field_names()
    assert d == defaults()


def test_tcp_listening_is_loopback_only_until_curve_is_built():
    assert StoreConfig(tcp_listen_address="127.0.0.1").tcp_listen_address == "127.0.0.1"
    assert StoreConfig(tcp_listen_address="::1").tcp_listen_address == "::1"
    with pytest.raises(StoreConfigError, match="CURVE"):
        StoreConfig(tcp_listen_address="0.0.0.0")
    with pytest.raises(StoreConfigError, match="not an IP address"):
        StoreConfig(tcp_listen_address="db1")
    with pytest.raises(StoreConfigError, match="listen_port must be in 3..65535"):
        StoreConfig(listen_port=2)      # the reader would listen on port 0
    assert StoreConfig(listen_port=65535).reader_port == 65533


@pytest.mark.parametrize("settings, owner", [
    (dict(tcp_listen_address="127.0.0.1", listen_port=10911), "ingest"),
    (dict(tcp_listen_address="127.0.0.1", listen_port=10913), "the reader"),
    (dict(ha_listen_port=10911), "the HA socket"),
])
def test_the_metrics_port_may_not_be_another_sockets(settings, owner):
    """The metrics endpoint binds first: a port another socket needs made that process
    fail at every start until the store stopped."""
    with pytest.raises(StoreConfigError, match=f"metrics_port 10911 is taken by {owner}"):
        StoreConfig(metrics_port=10911, **settings)
    assert StoreConfig(metrics_port=10911, listen_port=10911).metrics_port == 10911  # no TCP


def test_the_dashboard_beyond_loopback_needs_dashboard_auth():
    """As TCP beyond loopback needs CURVE: the message names the setting."""
    with pytest.raises(StoreConfigError, match="dashboard_address 0.0.0.0 is not a loopback "
                                               "address: .* needs dashboard_auth"):
        StoreConfig(dashboard_port=8080, dashboard_address="0.0.0.0")
    assert StoreConfig(dashboard_address="::1").dashboard_address == "::1"
    assert StoreConfig(dashboard_address="0.0.0.0", dashboard_auth="/etc/rs/users").dashboard_auth
    with pytest.raises(StoreConfigError, match="dashboard_port 9100 is taken by the metrics"):
        StoreConfig(dashboard_port=9100, metrics_port=9100)
    with pytest.raises(StoreConfigError, match="'dash' is not an IP address"):
        StoreConfig(dashboard_address="dash")


@pytest.mark.parametrize("table, message", [
    ({"writer": {"stopsignal": "NOPE"}}, "not a signal name"),
    ({"writer": {"stopsignal": 15}}, "not a signal name"),
    ({"writer": {"startsecs": "x"}}, "must be a number"),
    ({"dispatcher": {"heartbeat_timeout_s": "60"}}, "must be a number"),
    ({"flusher": {"startretries": 1.5}}, "must be an integer"),
    ({"flusher": {"startretries": -1}}, "not negative"),
    ({"dispatcher": {"heartbeat_timeout_s": float("nan")}}, "must be finite"),
    ({"writer": {"backoff_s": float("inf")}}, "must be finite"),
    ({"reader": {"autorestart": "yes"}}, "must be true or false"),
    ({"nosuch": {}}, "no such process"),
    ({"writer": {"restart": True}}, "restart: no such setting"),
])
def test_process_tables_that_the_supervisor_could_not_use_are_refused(table, message):
    """``[process.NAME]`` values are checked when the file is read, as ``[store]``'s are:
    a bad stop signal used to surface only at the stop, a bad number only at a restart."""
    from rocketstore.procs.supervisor import load_process_configs
    with pytest.raises(StoreConfigError, match=message):
        load_process_configs({"process": table})


def test_process_tables_take_what_supervisord_takes():
    from rocketstore.procs.supervisor import load_process_configs
    out = load_process_configs({"process": {"writer": {"stopsignal": "INT", "startsecs": 2,
                                                       "backoff_s": 0.1, "enabled": False}}})
    assert (out["writer"].stopsignal, out["writer"].startsecs, out["writer"].enabled) == \
        ("INT", 2, False)


@pytest.mark.parametrize("size", [0, 1, 65])
def test_a_transient_store_pool_of_fewer_than_two_buffers_is_refused(size):
    """One buffer waits for itself: file 1's buffer is file 0's, free only once file 0
    is wholly committed, and the BLANK that ends file 0 is committed only after the
    writer went on into file 1 (a store that took puts up to its first file's end, then
    refused every one for good)."""
    with pytest.raises(StoreConfigError, match="transient_store_pool_size must be in 2..64"):
        StoreConfig(transient_store_pool_enable=True, transient_store_pool_size=size)


def test_a_transient_store_pool_of_two_buffers_is_taken():
    assert StoreConfig(transient_store_pool_enable=True,
                       transient_store_pool_size=2).transient_store_pool_size == 2


# ------------------------------------------------------------------ settings files
@pytest.mark.parametrize("text, message", [
    ('[stor]\nflush_disk_type = "SYNC_FLUSH"\n', r"\[stor\]: no such table \(did you mean \[store\]\?\)"),
    ("[process.writr]\npriority = 3\n",
     r"\[process.writr\]: no such process \(did you mean \[process.writer\]\?\)"),
    ("[proces.writer]\npriority = 3\n",
     r"\[proces.writer\]: no such table \(did you mean \[process.writer\]\?\)"),
    ("[store]\nflushDiskType = 'SYNC_FLUSH'\n",
     r"\[store\] flushDiskType: no such setting \(did you mean flush_disk_type\?\)"),
    ("[store]\nfile_reserve_time = 1\n",
     r"\[store\] file_reserve_time: no such setting \(did you mean file_reserved_time\?\)"),
    ("[process.cleaner]\nstartsec = 1.0\n",
     r"\[process.cleaner\] startsec: no such setting \(did you mean startsecs\?\)"),
    ('flush_disk_type = "SYNC_FLUSH"\n[store]\n',
     r"flush_disk_type is above every table: it is a \[store\] setting"),
    ("[store]\n[nonsense]\nx = 1\n", r"\[nonsense\]: no such table; a settings file holds"),
])
def test_every_table_and_setting_of_a_settings_file_must_exist(tmp_path, text, message):
    """A misspelled table was read as no table: the store ran on every default and said
    nothing. Each unknown name is refused, naming the file and the nearest known one."""
    from rocketstore.procs.supervisor import load_settings
    from rocketstore.storage.errors import UnknownSettingError
    path = write_toml(tmp_path / "s.toml", text)
    with pytest.raises(UnknownSettingError, match=message) as e:
        load_settings(path)
    assert str(e.value).startswith(f"{path}: ")


def test_relative_paths_in_a_settings_file_are_read_from_its_directory(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    path = write_toml(conf / "s.toml", """[store]
store_path_root_dir = "data"
store_path_commit_log = "/abs/commitlog"
curve_server_key = "keys/server.key_secret"
curve_authorized_keys = "keys/a.key, /abs/b.key,keys/more"
""")
    c = StoreConfig.from_toml(path)
    assert c.store_path_root_dir == str(conf / "data")
    assert c.store_path_commit_log == "/abs/commitlog"
    assert c.curve_server_key == str(conf / "keys" / "server.key_secret")
    assert c.curve_authorized_keys == ",".join([str(conf / "keys" / "a.key"), "/abs/b.key",
                                                str(conf / "keys" / "more")])
    assert StoreConfig.from_toml(path, base_dir="").store_path_root_dir == "data"
    assert StoreConfig.from_toml(path, store_path_root_dir="here").store_path_root_dir == "here"


def test_a_store_opens_with_its_recorded_sizes_unless_the_file_sets_others(tmp_path):
    """A store made with 64 MiB files was refused under a settings file that set only
    tcp_listen_address: the defaults (1 GiB) were taken for a choice."""
    from rocketstore.storage import MessageStore
    from rocketstore.storage.config import with_recorded_geometry
    from rocketstore.storage.errors import GeometryMismatchError
    root = str(tmp_path / "store")
    made = dict(mapped_file_size_commit_log=65536, max_hash_slot_num=100, max_index_num=400)
    assert with_recorded_geometry(StoreConfig(store_path_root_dir=root), (), "f",
                                  made).mapped_file_size_commit_log == 65536   # a new store
    with MessageStore(StoreConfig(store_path_root_dir=root, **made)):
        pass
    plain = StoreConfig(store_path_root_dir=root, tcp_listen_address="127.0.0.1")
    opened = with_recorded_geometry(plain, {"tcp_listen_address"}, "f.toml")
    assert opened.geometry() == {**StoreConfig().geometry(), **made}
    assert opened.tcp_listen_address == "127.0.0.1"
    same = dataclasses.replace(plain, max_index_num=400)
    assert with_recorded_geometry(same, {"max_index_num"}, "f.toml").geometry() == \
        opened.geometry()
    with pytest.raises(GeometryMismatchError) as e:
        with_recorded_geometry(plain, {"mapped_file_size_commit_log"}, "f.toml")
    assert str(e.value) == (
        f"the store at {root} was created with other file sizes "
        "(mapped_file_size_commit_log = 1073741824 is set, the store recorded 65536 in "
        f"{os.path.join(root, 'config', 'storeGeometry.json')}); a store keeps them for "
        "life: remove mapped_file_size_commit_log from f.toml to open it with the recorded "
        "ones, or set another store_path_root_dir for a new store of these sizes")
    with pytest.raises(GeometryMismatchError, match=r"mapped_file_size_commit_log = 65536 "
                                                    r"\(configured 1073741824\)"):
        MessageStore(plain).load()
