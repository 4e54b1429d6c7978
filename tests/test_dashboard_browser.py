"""The web console in a real browser: Chromium headless (Debian's chromium and
chromium-driver, which .ci/run installs) driven by Selenium, over a real store whose
``rocketstore up`` serves the dashboard. Each page is opened and what it shows is
checked against the store; the overview refreshes itself without reloading; a reset is
clicked through its confirmation; a message is found by key through the form and
opened. Screenshots of the overview and a consumer group are taken (into
``$ROCKETSTORE_SCREENSHOTS`` when set, as docs/ holds them, else the test's directory).

The tests skip, saying why, only where Chromium or its driver is not installed."""

from __future__ import annotations

import os
import shutil

import pytest

from rocketstore.client import Consumer, Producer, ReaderClient, group_offsets
from rocketstore.storage import Message
from store_processes import RunningStore, free_port, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(
    not CHROMIUM or not os.path.exists(DRIVER),
    reason="Chromium and chromium-driver are not installed (apt-get install chromium "
           "chromium-driver)")

TOPIC, GROUP, COUNT, READ = "Orders", "billing", 64, 24


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    port = free_port()
    with RunningStore(tmp_path_factory.mktemp("dashboard-browser"), dashboard_port=port,
                      dashboard_allow_writes=True,
                      mapped_file_size_commit_log=1 << 20) as s:
        s.url = f"http://127.0.0.1:{port}"
        with Producer(s.store_dir) as producer:
            for n in range(4):
                producer.send_batch([Message(TOPIC, f"order {i}: 3 items, paid".encode(),
                                             tags="paid", keys=[f"order-{i}"])
                                     for i in range(n * 16, n * 16 + 16)])
            producer.send_batch([Message("Refunds", b"refund %d" % i) for i in range(5)])
        with Consumer(s.store_dir, GROUP, TOPIC) as consumer:
            got = []
            while len(got) < READ:
                got += consumer.poll(READ - len(got), 1000)
            consumer.commit()
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--window-size=1200,900",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return os.environ.get("ROCKETSTORE_SCREENSHOTS") or str(tmp_path_factory.mktemp("shots"))


def _text(browser, css: str) -> str:
    from selenium.webdriver.common.by import By
    return browser.find_element(By.CSS_SELECTOR, css).text


def _shown(browser, css: str, words: str) -> str:
    """The text of ``css`` once it holds ``words`` (a click's page may still be loading)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def look():
        try:
            text = _text(browser, css)
        except (NoSuchElementException, StaleElementReferenceException):
            return None
        return text if words in text else None
    return wait_for(look, timeout=15, what=f"{words!r} in {css}", interval=0.05)


def _shoot(browser, shots: str, name: str) -> None:
    path = os.path.join(shots, name)
    assert browser.save_screenshot(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_overview_shows_every_process_and_refreshes_without_reloading(store, browser,
                                                                           shots):
    browser.get(store.url + "/")
    assert "Overview" in browser.title
    processes = _text(browser, "#processes")
    for name in ("flusher", "dispatcher", "writer", "cleaner", "reader", "dashboard"):
        assert name in processes
    assert "RUNNING" in _text(browser, "#store-state")
    browser.execute_script("window.notReloaded = true")
    first = browser.find_element("id", "live").get_attribute("data-refreshed")
    wait_for(lambda: browser.find_element("id", "live").get_attribute("data-refreshed")
             not in (None, first), timeout=15, what="the live part to refresh",
             interval=0.2)
    assert browser.execute_script("return window.notReloaded") is True
    with Producer(store.store_dir) as producer:          # a point on the puts chart
        producer.send_batch([Message("Refunds", b"late") for _ in range(50)])
    wait_for(lambda: "no data yet" not in _text(browser, "#live svg"), timeout=20,
             what="the puts chart to draw", interval=0.3)
    _shoot(browser, shots, "dashboard-overview.png")


def test_the_topics_page_shows_the_right_max_offsets(store, browser):
    browser.get(store.url + "/topics")
    rows = {r.split()[0]: r.split() for r in _text(browser, "#topics").splitlines()[1:]}
    assert rows[TOPIC][3] == str(COUNT)                  # the sum of the max offsets
    browser.find_element("link text", TOPIC).click()
    _shown(browser, "h1", f"Topic {TOPIC}")
    with ReaderClient(store.store_dir) as reader:
        maxes = {q.queue_id: q.max_offset for q in reader.offsets([TOPIC])}
    shown = {int(r.split()[0]): int(r.split()[2])
             for r in _text(browser, "#queues").splitlines()[1:]}
    assert shown == maxes


def test_a_group_shows_its_lag_and_a_reset_is_clicked_through_its_confirmation(
        store, browser, shots):
    browser.get(store.url + "/groups")
    assert f"{GROUP} {TOPIC}" in _text(browser, "#groups")
    browser.find_element("link text", GROUP).click()
    _shown(browser, "h1", f"Group {GROUP}")
    assert _text(browser, "#group-lag") == str(COUNT - READ)
    _shoot(browser, shots, "dashboard-group.png")
    browser.find_element("css selector", "input[value=earliest]").click()
    browser.find_element("id", "reset-button").click()
    _shown(browser, "h1", "Reset group")                  # asked first: nothing written
    assert group_offsets.describe(store.store_dir, GROUP, TOPIC)[0]["committed"] is not None
    assert sum(r["lag"] for r in group_offsets.describe(store.store_dir, GROUP, TOPIC)) \
        == COUNT - READ
    browser.find_element("id", "confirm-reset").click()
    _shown(browser, "#reset-done", "earliest")
    assert _text(browser, "#group-lag") == str(COUNT)
    assert sum(r["lag"] for r in group_offsets.describe(store.store_dir, GROUP, TOPIC)) == COUNT


def test_a_message_is_found_by_key_and_opened_with_its_body(store, browser):
    browser.get(store.url + "/messages")
    form = browser.find_element("id", "by-key")
    form.find_element("name", "topic").send_keys(TOPIC)
    form.find_element("name", "key").send_keys("order-42")
    form.find_element("tag name", "button").click()
    _shown(browser, "#found", "order 42: 3 items, paid")
    browser.find_element("css selector", "#found a").click()
    assert _shown(browser, "#body", "order 42") == "order 42: 3 items, paid"
    assert _text(browser, "#keys") == "order-42" and _text(browser, "#tags") == "paid"


def test_bad_input_shows_a_sentence_not_a_stack_trace(store, browser):
    browser.get(store.url + "/messages?msg_id=not-an-id")
    assert "is not a message id" in _text(browser, "#error")
    assert "Traceback" not in browser.page_source
