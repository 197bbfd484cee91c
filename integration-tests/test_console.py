"""The web console (josef-console) of a 3-node cluster, in a real browser: headless Chromium driven by Selenium.

Chromium and its WebDriver are Debian's (``chromium``, ``chromium-driver``;
.ci/run installs them). Without them the test fails, saying what to
install: a browser test that skips is a check nobody notices is gone.

The test loads every page from node 1, asserts on what the page shows (a
partition's ISR, a group's lag, the quorum's voters, an open transaction),
waits for the page to update itself in place after more records are
produced, creates a topic and resets a group's offsets through the forms,
and checks that no page asked for anything outside the node (the browser's
resource timing entries, and the URLs in the HTML). A screenshot of each page
is saved in ``$JOSEF_TEST_ARTIFACTS/test_console/`` when that variable is set
(CI can keep that folder), else in the test's tmp_path (``screenshots/``).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from josef.node.cluster import free_ports

CHROMIUM = os.environ.get("JOSEF_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("JOSEF_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
PER_PARTITION = 100
#: Committed by the group "readers": orders-0 lags 40 records, the other two partitions none.
COMMITTED = {0: 60, 1: 100, 2: 100}
MORE = 25
#: What a commit to a new cluster's group coordinator may meet while its partition is elected and loaded.
COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                      KafkaError.COORDINATOR_NOT_AVAILABLE}
WAIT_S = 30


@pytest.fixture
def screenshots(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    root = os.environ.get("JOSEF_TEST_ARTIFACTS")
    folder = Path(root) / request.node.name if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser():
    """Headless Chromium through chromedriver; the test fails, naming what is missing, when either is."""
    missing = [f"{what} ({path})" for what, path in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
               if not (os.path.exists(path) or shutil.which(path))]
    if missing:
        pytest.fail(f"the console's browser test needs Debian's {' and '.join(missing)}: "
                    "apt-get install chromium chromium-driver (or set JOSEF_TEST_CHROMIUM, JOSEF_TEST_CHROMEDRIVER)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("the console's browser test needs selenium (the dev dependency group, nox's TEST_DEPS)")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(CHROMIUM) or CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                     "--disable-background-networking", "--disable-component-update"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which(CHROMEDRIVER) or CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def cell(driver, table_id: str, row: str, column: str) -> str:
    """The text a person sees in one cell: table ``table_id``, the row keyed ``row``, the column ``column``."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'#{table_id} tr[data-key="{row}"] td.{column}').text


def until(driver, condition, what: str):
    """Wait (polling, never sleeping blindly) until ``condition(driver)`` is true; stale elements (the main section
    was just replaced by a refresh) only mean: look again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
        condition, f"timed out waiting until {what}")


def only_the_node(driver, origin: str) -> None:
    """Nothing the page loaded, and no URL in it, is outside the node (no CDN, web font, remote image)."""
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".concat(performance.getEntriesByType('navigation').map(e => e.name));")
    assert loaded and all(url.startswith(origin + "/") for url in loaded), loaded
    page = driver.page_source
    linked = re.findall(r"""\b(?:src|href|action|srcset|poster)\s*=\s*["']([^"']*)""", page) + re.findall(
        r"url\(([^)]*)\)", page)
    elsewhere = [url for url in linked if re.match(r"\s*([a-z][a-z0-9+.-]*:|//)", url, re.I)
                 and not url.startswith(origin + "/")]
    elsewhere += [url for url in re.findall(r"https?://[^\s\"'<>)]+", page) if not url.startswith(origin + "/")]
    assert elsewhere == [], elsewhere


def commit(bootstrap: str, group_id: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` of orders for the group, as a consumer that read that far would; retried while the
    coordinator of a new cluster is still loading (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS are retriable)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False})
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            try:
                consumer.commit(offsets=[TopicPartition("orders", p, o) for p, o in offsets.items()],
                                asynchronous=False)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in COORDINATOR_MOVING) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # a retry's back-off, as a client's retry.backoff.ms
    finally:
        consumer.close()


def test_the_console_shows_a_3_node_cluster_and_updates_itself(josef_cluster, browser, screenshots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    started = time.monotonic()
    ports = dict(zip((1, 2, 3), free_ports(3)))
    cluster = josef_cluster(combined=3, node_overrides={
        n: {"http.listeners": f"http://127.0.0.1:{port}"} for n, port in ports.items()},
        **{"offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
           "default.replication.factor": "3", "min.insync.replicas": "2", "console.refresh.ms": "1000",
           "console.throughput.sample.ms": "1000", "console.actions.enable": "true"})
    bootstrap = cluster.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic("orders", -1, -1, replica_assignments={0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})])
    admin.close()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for partition in range(3):
        for i in range(PER_PARTITION):
            producer.produce("orders", b"v" * 100, key=str(i).encode(), partition=partition)
    assert producer.flush(WAIT_S) == 0
    commit(bootstrap, "readers", COMMITTED)

    origin = f"http://127.0.0.1:{ports[1]}"
    driver = browser

    def visit(path: str, shot: str) -> None:
        driver.get(f"{origin}/console/{path}")
        until(driver, lambda d: d.find_element(By.ID, "main").is_displayed(), f"{path or 'the overview'} shows")
        only_the_node(driver, origin)
        driver.save_screenshot(str(screenshots / f"{shot}.png"))

    # The overview: three running brokers, one of them the active controller, and the quorum's three voters.
    visit("", "overview")
    assert {cell(driver, "brokers", str(n), "state") for n in (1, 2, 3)} == {"running"}
    assert [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#brokers td.role")].count("active controller") == 1
    roles = sorted(cell(driver, "quorum", str(n), "role") for n in (1, 2, 3))
    assert roles == ["Follower", "Follower", "Leader"]
    assert "healthy" in driver.find_element(By.CSS_SELECTOR, "dl.facts").text

    # Topics, and one topic's partitions as the image has them.
    visit("topics", "topics")
    assert cell(driver, "topics", "orders", "partitions") == "3"
    assert cell(driver, "topics", "orders", "rf") == "3"
    visit("topics/orders", "topic-orders")
    assert cell(driver, "partitions", "0", "isr") == "1,2,3"
    assert cell(driver, "partitions", "1", "replicas") == "2,3,1"
    assert cell(driver, "partitions", "0", "end") == str(PER_PARTITION)
    assert cell(driver, "partitions", "0", "size") != "-"  # DescribeLogDirs of the leader
    assert cell(driver, "configs", "min.insync.replicas", "value") == "2"

    # Groups: the lag is the end offset minus what the group committed.
    visit("groups", "groups")
    assert cell(driver, "groups", "readers", "lag") == "40"
    visit("groups/readers", "group-readers")
    assert cell(driver, "offsets", "orders-0", "lag") == "40"
    assert cell(driver, "offsets", "orders-2", "lag") == "0"

    # More records arrive: the page updates itself (no reload: a mark left on the window survives).
    driver.execute_script("window.notReloaded = true;")
    for i in range(MORE):
        producer.produce("orders", b"more", partition=0)
    assert producer.flush(WAIT_S) == 0
    until(driver, lambda d: cell(d, "offsets", "orders-0", "lag") == str(40 + MORE),
          f"the group page shows a lag of {40 + MORE} by itself")
    assert driver.execute_script("return window.notReloaded === true;")
    assert driver.find_element(By.ID, "main").get_attribute("data-refreshed")

    # A phone's screen: the page fits its width (wide tables scroll inside their own box).
    driver.set_window_size(390, 844)
    visit("groups/readers", "group-readers-phone")
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1;")
    driver.set_window_size(1280, 900)

    # A transaction left open (its record moves orders-1's end, so only now that the lag was checked).
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": "console-tx"})
    transactional.init_transactions(WAIT_S)
    transactional.begin_transaction()
    transactional.produce("orders", b"in a transaction", partition=1)
    assert transactional.flush(WAIT_S) == 0
    visit("transactions", "transactions")
    assert cell(driver, "transactions", "console-tx", "state") == "Ongoing"
    assert cell(driver, "transactions", "console-tx", "partitions") == "orders-1"
    transactional.abort_transaction(WAIT_S)

    visit("reassignments", "reassignments")
    assert "no reassignment in progress" in driver.find_element(By.ID, "reassignments").text

    visit("throughput", "throughput")
    until(driver, lambda d: cell(d, "throughput", "orders", "offset") not in ("", "-"),
          "the throughput page has sampled orders")
    assert driver.find_elements(By.CSS_SELECTOR, '#throughput tr[data-key="orders"] svg polyline')

    # Actions (console.actions.enable=true): a topic created through the form, then the group's offsets reset.
    visit("topics", "topics-form")
    driver.find_element(By.CSS_SELECTOR, '#create-topic input[name="name"]').send_keys("made-in-a-browser")
    partitions = driver.find_element(By.CSS_SELECTOR, '#create-topic input[name="partitions"]')
    partitions.clear()
    partitions.send_keys("2")
    driver.find_element(By.CSS_SELECTOR, "#create-topic button").click()
    until(driver, lambda d: "/console/topics/made-in-a-browser" in d.current_url, "the new topic's page opens")
    assert "Created topic made-in-a-browser" in driver.find_element(By.CSS_SELECTOR, ".notice").text
    assert len(driver.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) == 2
    driver.save_screenshot(str(screenshots / "topic-created.png"))

    visit("groups/readers", "group-before-reset")
    Select(driver.find_element(By.CSS_SELECTOR, '#reset-offsets select[name="to"]')).select_by_value("latest")
    driver.find_element(By.CSS_SELECTOR, "#reset-offsets button").click()
    until(driver, lambda d: "Reset the offsets" in d.find_element(By.CSS_SELECTOR, ".notice").text,
          "the reset is reported")
    until(driver, lambda d: cell(d, "offsets", "orders-0", "lag") == "0", "the group no longer lags")
    driver.save_screenshot(str(screenshots / "group-after-reset.png"))

    assert sorted(p.name for p in screenshots.glob("*.png")) == sorted([
        "overview.png", "topics.png", "topic-orders.png", "groups.png", "group-readers.png",
        "group-readers-phone.png", "transactions.png", "reassignments.png", "throughput.png", "topics-form.png",
        "topic-created.png", "group-before-reset.png", "group-after-reset.png"])
    print(f"console test: {time.monotonic() - started:.1f}s; screenshots in {screenshots}")
