"""The console's application as the node mounts it, on a test server, over a stand-in for the node's services."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from josef.protocol.api_keys import ApiKey
from josef.security import KafkaPrincipal
from josef.server.http import AUTHORIZATION_CONTEXT, PRINCIPAL, HttpRequestContext
from josef_console.app import CSP, console_app
from josef_console.configs import ACTIONS_ENABLE
from josef_console.html import FRAGMENT_HEADER

from console_fakes import FakeServices, ns

pytestmark = pytest.mark.anyio

ENDS = {("orders", 0): 150, ("orders", 1): 20, ("moving", 0): 0}


def answer_like_a_cluster(services: FakeServices) -> None:
    services.answers[ApiKey.DESCRIBE_QUORUM] = lambda node, body: ns(error_code=0, topics=[ns(
        topic_name="__cluster_metadata", partitions=[ns(
            partition_index=0, error_code=0, leader_id=1, leader_epoch=3, high_watermark=100,
            current_voters=[ns(replica_id=1, log_end_offset=100, last_caught_up_timestamp=5000),
                            ns(replica_id=2, log_end_offset=93, last_caught_up_timestamp=3500)],
            observers=[ns(replica_id=3, log_end_offset=-1, last_caught_up_timestamp=-1)])])])
    services.answers[ApiKey.LIST_GROUPS] = lambda node, body: ns(error_code=0, groups=[
        ns(group_id="readers", group_type="classic", group_state="Empty", protocol_type="consumer")] if node == 2
        else [])
    services.answers[ApiKey.DESCRIBE_GROUPS] = lambda node, body: ns(groups=[ns(
        group_id="readers", error_code=0, group_state="Empty", protocol_type="consumer", members=[])])
    services.answers[ApiKey.OFFSET_FETCH] = lambda node, body: ns(groups=[ns(group_id="readers", error_code=0, topics=[
        ns(name="orders", partitions=[ns(partition_index=0, committed_offset=100, error_code=0),
                                      ns(partition_index=1, committed_offset=20, error_code=0)])])])
    services.answers[ApiKey.LIST_OFFSETS] = lambda node, body: ns(topics=[ns(name=t["name"], partitions=[
        ns(partition_index=p["partition_index"], error_code=0,
           offset=0 if p["timestamp"] == -2 else ENDS[(t["name"], p["partition_index"])])
        for p in t["partitions"]]) for t in body["topics"]])
    services.answers[ApiKey.DESCRIBE_LOG_DIRS] = lambda node, body: ns(error_code=0, results=[ns(
        error_code=0, log_dir="/data", topics=[ns(name="orders", partitions=[
            ns(partition_index=0, partition_size=1000 * node, is_future_key=False)])])])
    services.answers[ApiKey.DESCRIBE_CONFIGS] = lambda node, body: ns(results=[ns(
        error_code=0, error_message=None, configs=[
            ns(name="min.insync.replicas", value="2", config_source=1, is_sensitive=False, read_only=False),
            ns(name="remote.storage.enable", value="false", config_source=5, is_sensitive=False, read_only=False)])])
    services.answers[ApiKey.LIST_TRANSACTIONS] = lambda node, body: ns(error_code=0, transaction_states=[])


class Authorizer:
    """Grants everything but what ``denied`` names: (operation, resource type, name)."""

    def __init__(self, denied: set[tuple[str, str, str]]) -> None:
        self.denied = denied

    def authorize(self, context: Any, actions: list[Any]) -> list[bool]:
        return [(a.operation, a.resource_type, a.resource_name) not in self.denied for a in actions]


async def mounted(services: FakeServices) -> TestClient:
    """The console mounted as the node's HTTP listener mounts it, behind a stand-in of its authentication."""

    @web.middleware
    async def authenticated(request: web.Request, handler: Any) -> web.StreamResponse:
        principal = KafkaPrincipal("User", "alice")
        request[PRINCIPAL] = principal
        request[AUTHORIZATION_CONTEXT] = HttpRequestContext(principal, "127.0.0.1", "PLAINTEXT")
        return await handler(request)

    app = web.Application(middlewares=[authenticated])
    app.add_subapp("/console/", console_app(services))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(services):
    answer_like_a_cluster(services)
    client = await mounted(services)
    yield client
    await client.close()


def main_of(page: str) -> str:
    return re.search(r'<main id="main">(.*)</main>', page, re.S).group(1)


async def test_a_refresh_gets_the_main_section_alone_the_same_as_in_the_whole_page(client):
    whole = await client.get("/console/topics/orders")
    assert whole.status == 200 and whole.content_type == "text/html"
    page = await whole.text()
    assert page.startswith("<!doctype html>") and '<script src="/console/static/console.js">' in page
    fragment = await (await client.get("/console/topics/orders", headers={FRAGMENT_HEADER: "1"})).text()
    assert "<html" not in fragment and fragment.startswith("<h1>Topic orders</h1>")
    assert fragment == main_of(page)
    assert whole.headers["Content-Security-Policy"] == CSP
    assert whole.headers["Cache-Control"] == "no-store" and whole.headers["Vary"] == FRAGMENT_HEADER


async def test_every_page_answers(client, services):
    for path, expected in [("", "Controller quorum"), ("topics", "orders"), ("topics/orders", "1,2,3"),
                           ("groups", "readers"), ("groups/readers", "Lag per partition"),
                           ("transactions", "no transactional ids"), ("reassignments", "moving"),
                           ("throughput", "Throughput")]:
        answer = await client.get(f"/console/{path}")
        assert answer.status == 200, path
        assert expected in await answer.text(), path
    assert len(services.spawned) == 1  # the throughput sampler, started with the broker's background work


async def test_the_overview_shows_the_quorum_and_each_voters_lag(client):
    page = await (await client.get("/console/", headers={FRAGMENT_HEADER: "1"})).text()
    assert "Leader 1, epoch 3, high watermark 100" in page
    assert re.search(r'<tr data-key="2"><td class="node">2</td><td class="role">Follower</td>'
                     r'<td class="offset">93</td><td class="lag">7</td><td class="lag-time">1.5 s ago</td>', page)
    assert '<td class="lag">-</td>' in page  # the observer never fetched from this leader


async def test_a_groups_lag_is_the_end_offset_minus_the_committed_offset(client, services):
    page = await (await client.get("/console/groups/readers")).text()
    assert re.search(r'data-key="orders-0">.*?<td class="lag">50</td>', page)
    assert "Total lag</dt><dd>50" in page
    assert all(node == 2 for node, key, _ in services.calls if key in (ApiKey.DESCRIBE_GROUPS, ApiKey.OFFSET_FETCH))


async def test_what_the_user_may_not_describe_is_not_listed(services):
    answer_like_a_cluster(services)
    services.authorizer = Authorizer({("DESCRIBE", "TOPIC", "moving"), ("DESCRIBE", "GROUP", "readers")})
    client = await mounted(services)
    try:
        topics = await (await client.get("/console/topics")).text()
        assert 'data-key="orders"' in topics and 'data-key="moving"' not in topics
        assert (await client.get("/console/topics/moving")).status == 404
        assert 'data-key="readers"' not in await (await client.get("/console/groups")).text()
        assert (await client.get("/console/groups/readers")).status == 404
    finally:
        await client.close()


async def test_unknown_pages_and_files_are_not_found(client):
    assert (await client.get("/console/topics/nope")).status == 404
    assert (await client.get("/console/static/secrets.txt")).status == 404
    css = await client.get("/console/static/console.css")
    assert css.status == 200 and css.content_type == "text/css"


async def test_actions_are_refused_while_the_console_is_read_only(client, services):
    answer = await client.post("/console/topics", data={"name": "new"}, allow_redirects=False,
                               headers={"Origin": str(client.make_url("")).rstrip("/")})
    assert answer.status == 403
    assert ApiKey.CREATE_TOPICS not in {key for _, key, _ in services.calls}
    assert 'id="create-topic"' not in await (await client.get("/console/topics")).text()


async def test_creating_a_topic_sends_create_topics_from_the_consoles_own_page_only(client, services):
    services.config[ACTIONS_ENABLE] = True
    created = []

    def create(node: int, body: Any) -> Any:
        created.append(body)
        [topic] = body["topics"]
        return ns(topics=[ns(name=topic["name"], error_code=0, error_message=None, num_partitions=6,
                             replication_factor=3)])

    services.answers[ApiKey.CREATE_TOPICS] = create
    assert 'id="create-topic"' in await (await client.get("/console/topics")).text()
    form = {"name": "payments", "partitions": "6", "replication_factor": "-1"}
    elsewhere = await client.post("/console/topics", data=form, allow_redirects=False,
                                  headers={"Origin": "http://evil.example"})
    assert elsewhere.status == 403 and not created
    origin = str(client.make_url("")).rstrip("/")
    bad = await client.post("/console/topics", data={"name": "no spaces"}, allow_redirects=False,
                            headers={"Origin": origin})
    assert bad.status == 303 and "is+not+a+legal+topic+name" in bad.headers["Location"] and not created
    services.image = services.image.__class__(**{**{f: getattr(services.image, f) for f in (
        "offset", "brokers", "topic_names", "configs", "features")}, "topics": {
        **services.image.topics, "payments": services.image.topics["orders"]}})
    done = await client.post("/console/topics", data=form, allow_redirects=False, headers={"Origin": origin})
    assert done.status == 303
    assert done.headers["Location"].startswith("/console/topics/payments?notice=Created+topic+payments")
    assert created[0]["topics"][0] == {"name": "payments", "num_partitions": 6, "replication_factor": -1,
                                       "assignments": [], "configs": []}


async def test_creating_a_topic_needs_the_authorizers_consent(services):
    answer_like_a_cluster(services)
    services.config[ACTIONS_ENABLE] = True
    services.authorizer = Authorizer({("CREATE", "CLUSTER", "kafka-cluster"), ("CREATE", "TOPIC", "payments")})
    client = await mounted(services)
    try:
        answer = await client.post("/console/topics", data={"name": "payments"}, allow_redirects=False,
                                   headers={"Origin": str(client.make_url("")).rstrip("/")})
        assert answer.status == 303 and "User:alice+may+not+create+topic+payments" in answer.headers["Location"]
        assert ApiKey.CREATE_TOPICS not in {key for _, key, _ in services.calls}
    finally:
        await client.close()


async def test_resetting_offsets_commits_the_latest_offsets_of_an_empty_group(client, services):
    services.config[ACTIONS_ENABLE] = True
    commits = []

    def commit(node: int, body: Any) -> Any:
        commits.append((node, body))
        return ns(topics=[ns(name=t["name"], partitions=[ns(partition_index=p["partition_index"], error_code=0)
                                                         for p in t["partitions"]]) for t in body["topics"]])

    services.answers[ApiKey.OFFSET_COMMIT] = commit
    origin = str(client.make_url("")).rstrip("/")
    done = await client.post("/console/groups/readers/reset-offsets", data={"to": "latest"}, allow_redirects=False,
                             headers={"Origin": origin})
    assert done.status == 303 and "Reset+the+offsets+of+group+readers+to+latest" in done.headers["Location"]
    [(node, body)] = commits
    assert node == 2 and body["generation_id_or_member_epoch"] == -1
    assert body["topics"] == [{"name": "orders", "partitions": [
        {"partition_index": 0, "committed_offset": 150, "committed_leader_epoch": -1, "committed_metadata": ""},
        {"partition_index": 1, "committed_offset": 20, "committed_leader_epoch": -1, "committed_metadata": ""}]}]


async def test_a_group_id_with_any_characters_has_a_page(client, services):
    answer = services.answers[ApiKey.LIST_GROUPS]
    services.answers[ApiKey.LIST_GROUPS] = lambda node, body: ns(error_code=0, groups=[
        *answer(node, body).groups, ns(group_id="team/a b?#%", group_type="classic", group_state="Empty",
                                       protocol_type="consumer")] if node == 2 else [])
    groups = await (await client.get("/console/groups")).text()
    href = re.search(r'<a href="([^"]+)">team/a b\?#%</a>', groups).group(1)
    assert href == "/console/groups/team%2Fa%20b%3F%23%25"
    page = await client.get(href)
    assert page.status == 200 and "<h1>Group team/a b?#%</h1>" in await page.text()
