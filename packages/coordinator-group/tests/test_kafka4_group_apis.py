"""The group API versions Kafka 4.x added, over a real socket: FindCoordinator v5-v6, DescribeGroups v6,
OffsetCommit/OffsetFetch v10 (topic ids), and OffsetDelete of a KIP-848 consumer group."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from test_consumer_group_apis import CG_HEARTBEAT, hb_body
from test_group_apis import (
    COMMIT,
    DESCRIBE,
    FETCH,
    FIND,
    OFFSET_DELETE,
    commit_body,
    create_topic,
    fetch_body,
    stable_member,
    topic_ids,
)

from josef.testing import RawClient

E = ErrorCode
GROUP_KEY, TRANSACTION_KEY, SHARE_KEY = 0, 1, 2

pytestmark = pytest.mark.josef_config(**{"group.initial.rebalance.delay.ms": "0", "num.partitions": "2"})


def find(client: RawClient, version: int, key_type: int, key: str = "g") -> tuple[int, int, ErrorCode]:
    """(node id, port, error) of one key, from the batched (v4+) or the single-key answer."""
    answer = client.call(FIND, version, {"key": key, "key_type": key_type, "coordinator_keys": [key]})
    found = answer.coordinators[0] if version >= 4 else answer
    if version >= 4:
        assert found.key == key
    return found.node_id, found.port, found.error_code


def describe(client: RawClient, version: int, group: str) -> Any:
    return client.call(DESCRIBE, version, {"groups": [group], "include_authorized_operations": False}).groups[0]


def consumer_group_member(client: RawClient, group: str, topics: tuple[str, ...] = ("orders",)) -> tuple[str, int]:
    """A KIP-848 member that joined ``group`` (ConsumerGroupHeartbeat): its member id and epoch."""
    joined = client.call(CG_HEARTBEAT, 1, hb_body(group, "", 0, topics=topics))
    assert joined.error_code == E.none, joined
    return joined.member_id, joined.member_epoch


def test_find_coordinator_v0_to_v6_for_groups(josef_broker):
    client = RawClient(josef_broker.port)
    assert josef_broker.broker.dispatcher.apis[FIND].max_version == 6
    for version in range(0, 7):
        assert find(client, version, GROUP_KEY) == (1, josef_broker.port, E.none), version
    client.close()


@pytest.fixture
def without_other_coordinators(monkeypatch):
    """The broker started after this fixture loads no transaction or share coordinator (both plugins are blocked)."""
    monkeypatch.setenv("JOSEF_BLOCK_PLUGINS", "coordinator-txn,coordinator-share")


def test_find_coordinator_v6_key_types(without_other_coordinators, josef_broker):
    """Groups are found; no transaction or share coordinator is installed here."""
    client = RawClient(josef_broker.port)
    runtime = josef_broker.broker.coordinators
    assert runtime.by_key_type(TRANSACTION_KEY) is None and runtime.by_key_type(SHARE_KEY) is None
    assert find(client, 6, GROUP_KEY) == (1, josef_broker.port, E.none)
    assert find(client, 6, TRANSACTION_KEY) == (-1, -1, E.invalid_request)
    # A share key is a valid v6 question this broker cannot answer (retriable), but malformed before v6.
    assert find(client, 6, SHARE_KEY, "g:AAAAAAAAAAAAAAAAAAAAAA:0") == (-1, -1, E.coordinator_not_available)
    assert find(client, 5, SHARE_KEY) == (-1, -1, E.invalid_request)
    assert find(client, 3, SHARE_KEY) == (-1, -1, E.invalid_request)
    client.close()


def test_describe_groups_v6_reports_missing_groups(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    stable_member(client, "classic")
    found = describe(client, 6, "classic")
    assert (found.error_code, found.error_message, found.group_state) == (E.none, None, "Stable")
    missing = describe(client, 6, "nobody-here")
    assert (missing.error_code, missing.error_message, missing.group_state, missing.members) == (
        E.group_id_not_found, "Group nobody-here not found.", "Dead", ())
    older = describe(client, 5, "nobody-here")
    assert (older.error_code, older.group_state, older.members) == (E.none, "Dead", ())
    client.close()


def test_describe_groups_of_a_consumer_protocol_group(josef_broker):
    """Like Kafka's GroupMetadataManager, DescribeGroups describes classic groups only: a KIP-848 group is
    Dead up to v5 and "not a classic group" from v6 on (ConsumerGroupDescribe is what describes it)."""
    client = RawClient(josef_broker.port)
    create_topic(client)
    consumer_group_member(client, "kip848")
    newest = describe(client, 6, "kip848")
    assert (newest.error_code, newest.error_message, newest.group_state, newest.members) == (
        E.group_id_not_found, "Group kip848 is not a classic group.", "Dead", ())
    for version in range(0, 6):
        older = describe(client, version, "kip848")
        assert (older.error_code, older.group_state, older.protocol_type, older.members) == (
            E.none, "Dead", "", ()), version
    client.close()


def test_offset_commit_and_fetch_v10_by_topic_id(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    ids = topic_ids(josef_broker)
    orders, unknown = ids["orders"], uuid.uuid4()
    ids_with_unknown = {**ids, "ghost": unknown}
    committed = client.call(COMMIT, 10, commit_body("by-id", -1, "", {("orders", 0): 42, ("ghost", 1): 7},
                                                    ids=ids_with_unknown))
    assert [(t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions]) for t in committed.topics] == [
        (orders, [(0, E.none)]), (unknown, [(1, E.unknown_topic_id)])]

    fetched = client.call(FETCH, 10, fetch_body("by-id", {"orders": [0, 1], "ghost": [1]}, ids_with_unknown))
    group = fetched.groups[0]
    assert group.error_code == E.none
    assert [(t.topic_id, [(p.partition_index, p.committed_offset, p.error_code) for p in t.partitions])
            for t in group.topics] == [(orders, [(0, 42, E.none), (1, -1, E.none)]),
                                       (unknown, [(1, -1, E.unknown_topic_id)])]
    everything = client.call(FETCH, 10, fetch_body("by-id", None)).groups[0]
    assert [(t.topic_id, [p.committed_offset for p in t.partitions]) for t in everything.topics] == [
        (orders, [42])]

    # Offsets are stored by name: a v9 client reads what a v10 one committed, and the other way round.
    by_name = client.call(FETCH, 9, fetch_body("by-id", {"orders": [0]})).groups[0].topics[0]
    assert (by_name.name, by_name.partitions[0].committed_offset) == ("orders", 42)
    client.call(COMMIT, 9, commit_body("by-id", -1, "", {("orders", 1): 5}))
    by_id = client.call(FETCH, 10, fetch_body("by-id", {"orders": [1]}, ids)).groups[0].topics[0]
    assert (by_id.topic_id, by_id.partitions[0].committed_offset) == (orders, 5)
    client.close()


def test_fetch_all_v10_leaves_out_deleted_topics(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client, "kept")
    create_topic(client, "doomed")
    ids = topic_ids(josef_broker)
    answer = client.call(COMMIT, 10, commit_body("deleting", -1, "", {("kept", 0): 1, ("doomed", 0): 2}, ids=ids))
    assert {p.error_code for t in answer.topics for p in t.partitions} == {E.none}
    deleted = client.call(20, 6, {"topics": [{"name": "doomed", "topic_id": ids["doomed"]}], "topic_names": ["doomed"],
                                  "timeout": 5000})
    assert deleted.responses[0].error_code == E.none
    assert "doomed" not in josef_broker.broker.image.topics
    by_name = client.call(FETCH, 9, fetch_body("deleting", None)).groups[0]
    assert {t.name for t in by_name.topics} == {"kept", "doomed"}
    by_id = client.call(FETCH, 10, fetch_body("deleting", None)).groups[0]
    assert [t.topic_id for t in by_id.topics] == [ids["kept"]]
    client.close()


def test_offset_delete_of_a_consumer_protocol_group(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client, "orders")
    create_topic(client, "archive")
    member, epoch = consumer_group_member(client, "kip848-delete")
    committed = client.call(COMMIT, 9, commit_body("kip848-delete", epoch, member,
                                                   {("orders", 0): 3, ("archive", 0): 4}))
    assert {p.error_code for t in committed.topics for p in t.partitions} == {E.none}

    answer = client.call(OFFSET_DELETE, 0, {"group_id": "kip848-delete", "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0}]},
        {"name": "archive", "partitions": [{"partition_index": 0}]},
        {"name": "missing", "partitions": [{"partition_index": 0}]}]})
    assert answer.error_code == E.none
    assert [(t.name, t.partitions[0].error_code) for t in answer.topics] == [
        ("orders", E.group_subscribed_to_topic), ("archive", E.none), ("missing", E.unknown_topic_or_partition)]
    left = client.call(FETCH, 9, fetch_body("kip848-delete", None)).groups[0]
    assert [(t.name, [p.committed_offset for p in t.partitions]) for t in left.topics] == [("orders", [3])]

    nobody = client.call(OFFSET_DELETE, 0, {"group_id": "no-such-group", "topics": []})
    assert nobody.error_code == E.group_id_not_found
    client.close()
