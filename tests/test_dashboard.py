"""The web console (rocketstore.console) over HTTP, against a real store whose
``rocketstore up`` serves it as its supervised ``dashboard`` process: every page and its
JSON checked against what the store holds (``rocketstore status``, the group offsets,
the reader), an offset reset asked for and confirmed, a test send, each write logged with
who made it; a second dashboard (``rocketstore dashboard``) read-only behind a token; and
bad input answered 4xx with a sentence, never a stack trace."""

from __future__ import annotations

import datetime
import http.client
import json
import os
import subprocess
import sys

import httpx
import pytest

from rocketstore.client import Consumer, Producer, ReaderClient, group_offsets
from rocketstore.shm.positions import Slot
from rocketstore.storage import Message
from store_processes import ROOT, WORK_DIR, RunningStore, cli, free_port, wait_for, write_config

TOPIC, GROUP, COUNT, READ = "Orders", "billing", 40, 10
BIG = ("0123456789abcdef" * 640).encode()          # 10 KiB of text: shown cut at 4 KiB


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    port = free_port()
    with RunningStore(tmp_path_factory.mktemp("dashboard"), dashboard_port=port,
                      dashboard_allow_writes=True,
                      mapped_file_size_commit_log=1 << 20) as s:
        s.url = f"http://127.0.0.1:{port}"
        with Producer(s.store_dir) as producer:
            results = producer.send_batch(
                [Message(TOPIC, f"order {i}".encode(), tags="created", keys=[f"order-{i}"])
                 for i in range(COUNT)]
                + [Message("Blobs", bytes(range(256)) * 2, keys=["binary"]),
                   Message("Blobs", BIG, keys=["big"])])
        assert all(r.ok for r in results)
        s.sent = results
        with Consumer(s.store_dir, GROUP, TOPIC) as consumer:
            got = []
            while len(got) < READ:
                got += consumer.poll(READ - len(got), 1000)
            consumer.commit()
        wait_for(lambda: _status(s.url) == 200, what="the dashboard to answer")
        yield s


def _status(url: str) -> int:
    try:
        return httpx.get(url + "/api/overview", timeout=5).status_code
    except httpx.TransportError:
        return 0


def _json(s, path: str, status: int = 200) -> dict:
    r = httpx.get(s.url + path, timeout=10)
    assert r.status_code == status, r.text
    return r.json()


def _max_offsets(store_dir: str, topic: str) -> dict[int, int]:
    with ReaderClient(store_dir) as reader:
        return {q.queue_id: q.max_offset for q in reader.offsets([topic])}


def test_up_runs_the_dashboard_as_one_more_supervised_process(store):
    r = cli("status", "--config", store.config_path, "--json")
    processes = json.loads(r.stdout)["processes"]
    assert processes["dashboard"]["state"] == "RUNNING"
    page = httpx.get(store.url + "/", timeout=10)
    assert page.status_code == 200 and "<svg" in page.text
    for name in ("writer", "flusher", "dispatcher", "dashboard"):
        assert f"<td>{name}</td>" in page.text


def test_the_overview_shows_the_store_status_and_disk_lines(store):
    wait_for(lambda: _json(store, "/api/overview")["dispatch_lag_bytes"] == 0,
             what="dispatch to catch up")
    st = _json(store, "/api/overview")
    assert st["positions"]["written"] == store.slot(Slot.WRITTEN) > 0
    assert st["distances"]["written - dispatched"] == 0
    assert [pct for _, pct in st["disk"]["lines"]] == [75.0, 85.0, 90.0]
    assert st["processes"]["writer"]["state"] == "RUNNING"
    assert set(st["series"]) == {"puts_per_s", "gets_per_s", "put_latency_ms"}
    fragment = httpx.get(store.url + "/", headers={"X-Fragment": "live"}, timeout=10).text
    assert "<html" not in fragment and 'id="processes"' in fragment


def test_topics_show_each_queue_with_its_max_offset(store):
    maxes = _max_offsets(store.store_dir, TOPIC)
    t = _json(store, f"/api/topics/{TOPIC}")
    assert {q["queue"]: q["max_offset"] for q in t["queues"]} == maxes
    assert t["messages"] == COUNT and t["groups"] == [GROUP]
    assert all(q["last_store_ms"] for q in t["queues"] if q["max_offset"])
    listed = {t["topic"]: t for t in _json(store, "/api/topics")["topics"]}
    assert listed[TOPIC]["max_offset"] == COUNT and listed["Blobs"]["messages"] == 2
    page = httpx.get(store.url + "/topics", timeout=10).text
    assert f">{TOPIC}</a>" in page and "<svg" in page


def test_a_group_shows_its_lag_per_queue_after_a_consumer_read_part(store):
    g = _json(store, f"/api/groups/{GROUP}/{TOPIC}")
    rows = group_offsets.describe(store.store_dir, GROUP, TOPIC)
    assert g["queues"] == rows and g["lag"] == COUNT - READ and g["members"] == []
    listed = _json(store, "/api/groups")["groups"]
    assert [(x["group"], x["topic"], x["lag"]) for x in listed] == [(GROUP, TOPIC, COUNT - READ)]
    page = httpx.get(f"{store.url}/groups/{GROUP}/{TOPIC}", timeout=10).text
    assert f'id="group-lag">{COUNT - READ}<' in page


def test_a_message_is_found_by_key_by_msg_id_and_by_time_range(store):
    sent = store.sent[7]
    found = _json(store, f"/api/messages?topic={TOPIC}&key=order-7")["messages"]
    assert [m["msg_id"] for m in found] == [sent.msg_id]
    assert found[0]["body_preview"] == "order 7"
    m = _json(store, f"/api/messages/{sent.msg_id}")
    assert (m["body_text"], m["tags"], m["keys"]) == ("order 7", "created", ["order-7"])
    assert (m["queue_id"], m["queue_offset"]) == (sent.queue_id, sent.queue_offset)
    assert m["commit_log_file"].endswith("commitlog/" + "0" * 20)
    assert m["position_in_file"] == sent.commit_log_offset
    page = httpx.get(f"{store.url}/messages?topic={TOPIC}&key=order-7", timeout=10).text
    assert sent.msg_id in page and "order 7" in page
    first, last = _json(store, f"/api/messages/{store.sent[0].msg_id}"), m
    ranged = _json(store, f"/api/messages?topic={TOPIC}&begin=@{first['store_timestamp']}"
                          f"&end=@{last['store_timestamp']}")["messages"]
    stamps = [x["store_timestamp"] for x in ranged]
    assert stamps == sorted(stamps) and sent.msg_id in {x["msg_id"] for x in ranged}
    assert all(first["store_timestamp"] <= t <= last["store_timestamp"] for t in stamps)


def test_a_binary_body_shows_as_hex_and_a_long_one_is_cut_with_a_download(store):
    binary, big = store.sent[COUNT], store.sent[COUNT + 1]
    m = _json(store, f"/api/messages/{binary.msg_id}")
    assert not m["body_is_text"] and m["body_text"].startswith("00 01 02")
    m = _json(store, f"/api/messages/{big.msg_id}")
    assert m["body_cut"] and m["body_text"] == BIG[:4096].decode()
    page = httpx.get(f"{store.url}/messages/{big.msg_id}", timeout=10).text
    assert f"/messages/{big.msg_id}/body" in page
    body = httpx.get(f"{store.url}/messages/{big.msg_id}/body", timeout=10)
    assert body.status_code == 200 and body.content == BIG


def test_a_reset_asks_first_then_moves_the_offsets_and_is_logged_with_who(store):
    url = f"{store.url}/api/groups/{GROUP}/{TOPIC}/reset"
    before = group_offsets.describe(store.store_dir, GROUP, TOPIC)
    asked = httpx.post(url, data={"target": "earliest"}, timeout=10)
    assert asked.status_code == 200 and asked.json()["confirmed"] is False
    assert [r["new"] for r in asked.json()["queues"]] == [r["min_offset"] for r in before]
    assert group_offsets.describe(store.store_dir, GROUP, TOPIC) == before    # nothing yet
    first = _json(store, f"/api/messages/{store.sent[0].msg_id}")
    when = datetime.datetime.fromtimestamp(first["store_timestamp"] / 1000).isoformat(
        timespec="milliseconds")                       # as the page's datetime field sends it
    to_time = httpx.post(url, data={"target": "time", "time": when}, timeout=10).json()
    assert to_time["target"] == f"@{first['store_timestamp']}"
    dry_run = group_offsets.describe(store.store_dir, GROUP, TOPIC,     # offsets --dry-run
                                     ("time", first["store_timestamp"]))
    assert [r["new"] for r in to_time["queues"]] == [r["new"] for r in dry_run]
    r = httpx.post(url, data={"target": "time", "time": ""}, timeout=10)
    assert r.status_code == 400 and "needs the time" in r.json()["error"]
    done = httpx.post(url, data={"target": "earliest", "confirmed": "yes"}, timeout=10)
    assert done.status_code == 200 and done.json()["confirmed"] is True
    after = group_offsets.describe(store.store_dir, GROUP, TOPIC)
    assert [r["committed"] for r in after] == [r["min_offset"] for r in before]
    assert sum(r["lag"] for r in after) == COUNT
    wait_for(lambda: "dashboard write by anonymous@127.0.0.1: reset" in store.log(),
             what="the reset in the log")


def test_a_group_with_a_live_consumer_shows_it_and_refuses_a_reset(store):
    before = group_offsets.describe(store.store_dir, GROUP, TOPIC)
    with Consumer(store.store_dir, GROUP, TOPIC):
        g = _json(store, f"/api/groups/{GROUP}/{TOPIC}")
        assert len(g["members"]) == 1
        r = httpx.post(f"{store.url}/api/groups/{GROUP}/{TOPIC}/reset",
                       data={"target": "latest", "confirmed": "yes"}, timeout=10)
        assert r.status_code == 409 and "live consumer" in r.json()["error"]
    assert group_offsets.describe(store.store_dir, GROUP, TOPIC) == before


def test_a_test_message_is_sent_and_logged(store):
    r = httpx.post(store.url + "/api/send", data={"topic": "Tests", "body": "hello",
                                                   "keys": "t-1"}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "PUT_OK"
    m = _json(store, f"/api/messages/{r.json()['msg_id']}")
    assert (m["topic"], m["body_text"], m["keys"]) == ("Tests", "hello", ["t-1"])
    wait_for(lambda: f'"msg_id": "{r.json()["msg_id"]}"' in store.log(),
             what="the send in the log")


@pytest.mark.parametrize("path, status, words", [
    ("/api/topics/NoSuchTopic", 404, "no topic NoSuchTopic"),
    ("/api/messages?topic=NoSuchTopic&key=k", 404, "no topic NoSuchTopic"),
    ("/api/messages/XYZ", 400, "is not a message id"),
    ("/api/messages?msg_id=12AB", 400, "is not a message id"),
    ("/api/messages/" + "0" * 32, 404, "no message"),
    (f"/api/messages?topic={TOPIC}&begin=@2000&end=@1000", 400, "ends"),
    (f"/api/messages?topic={TOPIC}&begin=yesterday", 400, "is not a time"),
    (f"/api/groups/nobody/{TOPIC}", 404, "no consumer group nobody"),
    (f"/groups/{GROUP}/NoSuchTopic", 404, "no topic NoSuchTopic"),
])
def test_bad_input_is_a_4xx_with_a_sentence(store, path, status, words):
    r = httpx.get(store.url + path, timeout=10)
    assert r.status_code == status and words in r.text and "Traceback" not in r.text


def test_what_a_page_repeats_of_its_input_is_escaped(store):
    r = httpx.get(f"{store.url}/messages", params={"topic": TOPIC, "key": "<script>k</script>"},
                  timeout=10)
    assert r.status_code == 200 and "<script>k" not in r.text and "&lt;script&gt;k" in r.text


def test_a_reset_to_no_target_and_a_10_mib_body_are_refused(store):
    r = httpx.post(f"{store.url}/api/groups/{GROUP}/{TOPIC}/reset", data={"target": "soon"},
                   timeout=10)
    assert r.status_code == 400 and "is not earliest, latest" in r.json()["error"]
    r = httpx.post(store.url + "/api/send", content=b"x" * (10 << 20), timeout=30,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "over the dashboard's limit" in r.json()["error"]


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/%2e%2e/app.py",
                                  "/messages/../../etc/passwd"])
def test_a_path_with_dot_dot_is_refused(store, path):
    host, port = store.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)                       # sent as written, not normalised
    r = conn.getresponse()
    body = r.read().decode()
    conn.close()
    assert r.status == 400 and "'..'" in body


def test_a_dashboard_behind_a_token_is_read_only_unless_writes_are_allowed(store, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    config = write_config(str(tmp_path / "ro.toml"), store.store_dir, dashboard_auth=str(token),
                          mapped_file_size_commit_log=1 << 20)
    port = free_port()
    log = open(tmp_path / "dashboard.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rocketstore.cli", "dashboard", "--config",
                             config, "--port", str(port)], cwd=WORK_DIR,
                            env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        assert proc.stdout.readline().startswith("rocketstore dashboard: http://127.0.0.1:")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), what="the second dashboard")
        assert httpx.get(url + "/api/topics", timeout=10).status_code == 401
        bearer = {"Authorization": "Bearer s3cret-token"}
        assert httpx.get(url + "/api/topics", headers=bearer, timeout=10).status_code == 200
        assert httpx.get(url + "/", auth=("ops", "s3cret-token"), timeout=10).status_code == 200
        assert httpx.get(url + "/", auth=("ops", "wrong"), timeout=10).status_code == 401
        r = httpx.post(f"{url}/api/groups/{GROUP}/{TOPIC}/reset", headers=bearer,
                       data={"target": "latest", "confirmed": "yes"}, timeout=10)
        assert r.status_code == 403 and "dashboard_allow_writes" in r.json()["error"]
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        log.close()
    assert proc.returncode == 0


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=5).status_code == 401
    except httpx.TransportError:
        return False


def test_an_address_beyond_loopback_without_auth_ends_the_command_at_once(store):
    r = cli("dashboard", "--config", store.config_path, "--address", "0.0.0.0", "--port",
            str(free_port()), timeout=30)
    assert r.returncode == 3 and "dashboard_auth" in r.stderr and "0.0.0.0" in r.stderr


def test_a_write_from_another_site_is_refused(store):
    r = httpx.post(store.url + "/api/send", data={"topic": "Tests", "body": "x"},
                   headers={"Origin": "http://evil.example"}, timeout=10)
    assert r.status_code == 403 and "another site" in r.json()["error"]


# ------------------------------------------------------------------------------ pure parts
def test_a_rate_has_no_point_where_a_counter_restarted(tmp_path):
    from rocketstore.console.history import History
    h = History(str(tmp_path))
    for t, puts, gets, latency_sum, answered in [(0, 0, 0, 0.0, 0), (5, 50, 10, 0.1, 50),
                                                 (10, 20, 12, 0.1, 50), (15, 70, 22, 0.2, 60)]:
        h.samples.append((t, puts, gets, latency_sum, answered, {"A": puts}))
    series = h.series()
    assert [v for _, v in series["puts_per_s"]] == [10.0, None, 10.0]
    assert [v for _, v in series["gets_per_s"]] == [2.0, 0.4, 2.0]
    assert series["put_latency_ms"][0][1] == pytest.approx(2.0)
    assert series["put_latency_ms"][1][1] is None              # nothing answered: no mean
    assert h.topic_rates() == {"A": [10.0, None, 10.0]}


def test_a_chart_leaves_a_gap_draws_a_lone_point_and_escapes_its_title():
    from rocketstore.console import charts
    svg = charts.line_chart([(0, 1.0), (5, 2.0), (10, None), (15, 4.0)], "<b>puts", "msg/s")
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1
    assert "&lt;b&gt;puts: 4.00 msg/s" in svg
    assert "no data yet" in charts.line_chart([], "puts", "msg/s")
    bar = charts.disk_bar(0.87, [("a", 75.0), ("b", 85.0), ("c", 90.0)])
    assert 'class="fill high"' in bar and "87.0% used" in bar


def test_the_auth_file_holds_a_token_or_users(tmp_path):
    import base64
    from rocketstore.console.safety import Authority, AuthFileError

    def basic(name, password):
        return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()
    token = tmp_path / "token"
    token.write_text("# the ops token\nabc123\n")
    a = Authority.from_file(str(token))
    assert a.who("Bearer abc123") == "token" and a.who("Bearer abc") is None
    assert a.who(basic("ann", "abc123")) == "ann (token)" and a.who(None) is None
    users = tmp_path / "users"
    users.write_text("ann:pw:with:colons\nbob:b0b\n")
    a = Authority.from_file(str(users))
    assert a.who(basic("ann", "pw:with:colons")) == "ann" and a.who(basic("bob", "x")) is None
    assert a.who("Bearer b0b") is None and a.who("Basic !!!") is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AuthFileError, match="holds no token and no user"):
        Authority.from_file(str(tmp_path / "empty"))
    with pytest.raises(AuthFileError, match="cannot read it"):
        Authority.from_file(str(tmp_path / "missing"))
