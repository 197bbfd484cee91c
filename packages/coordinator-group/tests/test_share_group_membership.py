"""ShareGroupHeartbeat and ShareGroupDescribe over a socket (KIP-932): joining, the simple assignment, epochs,
leaving, session expiry, group types, and the records a restart loads."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

E = ErrorCode


def create(client: RawClient, name: str, partitions: int) -> None:
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none


def heartbeat(client: RawClient, member: str, epoch: int, topics=None, group: str = "sg"):
    return client.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member,
                                                         "member_epoch": epoch, "rack_id": None,
                                                         "subscribed_topic_names": topics})


def assigned(answer) -> dict[str, list[int]]:
    assert answer.error_code == E.none, answer
    assert answer.assignment is not None, answer
    return {str(t.topic_id): sorted(t.partitions) for t in answer.assignment.topic_partitions}


def describe(client: RawClient, group: str = "sg"):
    [described] = client.call(ApiKey.SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group],
                                                              "include_authorized_operations": False}).groups
    return described


@pytest.fixture
def client(josef_broker):
    client = RawClient(josef_broker.port)
    create(client, "jobs", 4)
    yield client
    client.close()


def test_members_join_get_the_simple_assignment_and_share_partitions_when_there_are_more(client):
    a = heartbeat(client, "member-a", 0, ["jobs"])
    assert a.member_epoch == 1 and [len(p) for p in assigned(a).values()] == [4]
    b = heartbeat(client, "member-b", 0, ["jobs"])
    assert b.member_epoch == 2 and [len(p) for p in assigned(b).values()] == [2]
    # a learns of its new, smaller assignment at its next heartbeat, in the new epoch.
    a = heartbeat(client, "member-a", 1)
    assert a.member_epoch == 2 and [len(p) for p in assigned(a).values()] == [2]
    assert heartbeat(client, "member-a", 2).assignment is None  # nothing changed: no assignment sent
    for i in range(3):
        heartbeat(client, f"member-{i}", 0, ["jobs"])
    for m in describe(client).members:  # everyone catches up with the latest assignment epoch
        heartbeat(client, m.member_id, m.member_epoch)
    described = describe(client)
    assert {m.member_epoch for m in described.members} == {described.assignment_epoch}
    assert (described.error_code, described.group_state, described.assignor_name) == (E.none, "Stable", "simple")
    assert len(described.members) == 5
    # Five members, four partitions: each member has one, and one partition is shared by two.
    counts: dict[int, int] = {}
    for m in described.members:
        assert len(m.assignment.topic_partitions) == 1 and m.assignment.topic_partitions[0].topic_name == "jobs"
        for p in m.assignment.topic_partitions[0].partitions:
            counts[p] = counts.get(p, 0) + 1
    assert sorted(counts.values()) == [1, 1, 1, 2]


def test_epochs_are_checked_and_a_member_leaves(client):
    assert heartbeat(client, "m", 0, ["jobs"]).member_epoch == 1
    assert heartbeat(client, "m", 5).error_code == E.fenced_member_epoch
    assert heartbeat(client, "stranger", 1).error_code == E.unknown_member_id
    assert heartbeat(client, "", 0, ["jobs"]).error_code == E.invalid_request
    assert heartbeat(client, "n", 0, None).error_code == E.invalid_request
    left = heartbeat(client, "m", -1)
    assert (left.error_code, left.member_epoch) == (E.none, -1)
    assert describe(client).group_state == "Empty"


def test_share_groups_are_their_own_kind_of_group(client):
    heartbeat(client, "m", 0, ["jobs"], group="shared")
    consumer = client.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, {
        "group_id": "shared", "member_id": "c", "member_epoch": 0, "instance_id": None, "rack_id": None,
        "rebalance_timeout": 30000, "subscribed_topic_names": ["jobs"], "subscribed_topic_regex": None,
        "server_assignor": None, "topic_partitions": []})
    assert consumer.error_code == E.group_id_not_found
    listed = client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
    assert [(g.group_id, g.group_type, g.group_state, g.protocol_type) for g in listed.groups] == [
        ("shared", "share", "Stable", "share")]
    assert client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]}).groups == ()
    classic = client.call(ApiKey.DESCRIBE_GROUPS, 6, {"groups": ["shared"], "include_authorized_operations": False})
    assert classic.groups[0].error_code == E.group_id_not_found
    assert describe(client, "nobody").error_code == E.group_id_not_found
    # Deleting: refused while it has members, done once it is empty.
    deleted = client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["shared"]})
    assert deleted.results[0].error_code == E.non_empty_group
    heartbeat(client, "m", -1, group="shared")
    assert client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["shared"]}).results[0].error_code == E.none
    assert describe(client, "shared").error_code == E.group_id_not_found


@pytest.mark.josef_config(**{"group.share.session.timeout.ms": "500", "group.share.heartbeat.interval.ms": "100"})
def test_a_member_that_stops_heartbeating_is_removed_and_its_partitions_reassigned(client):
    heartbeat(client, "quiet", 0, ["jobs"])
    assert assigned(heartbeat(client, "busy", 0, ["jobs"]))

    def busy_has_all() -> bool:
        epoch = next(m.member_epoch for m in describe(client).members if m.member_id == "busy")
        answer = heartbeat(client, "busy", epoch)  # heartbeating keeps busy in; quiet is silent
        return answer.assignment is not None and [len(p) for p in assigned(answer).values()] == [4]

    assert eventually(busy_has_all, 10, what="the quiet member to expire")
    assert [m.member_id for m in describe(client).members] == ["busy"]


def test_the_group_survives_a_restart(josef_broker, client):
    heartbeat(client, "a", 0, ["jobs"])
    b = heartbeat(client, "b", 0, ["jobs"])
    before = describe(client)
    client.close()
    josef_broker.restart()
    again = RawClient(josef_broker.port)
    try:
        after = eventually(lambda: (d := describe(again)).error_code == E.none and d, 30, what="the group")
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert sorted((m.member_id, m.member_epoch) for m in after.members) == \
            sorted((m.member_id, m.member_epoch) for m in before.members)
        assert heartbeat(again, "b", b.member_epoch).error_code == E.none
    finally:
        again.close()


@pytest.mark.josef_config(**{"group.share.max.size": "2"})
def test_a_full_share_group_refuses_another_member(client):
    heartbeat(client, "a", 0, ["jobs"])
    heartbeat(client, "b", 0, ["jobs"])
    assert heartbeat(client, "c", 0, ["jobs"]).error_code == E.group_max_size_reached


def test_share_version_turns_share_groups_on_and_off(josef_broker, client):
    def finalized() -> dict[str, int]:
        answer = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        return {f.name: f.max_version_level for f in answer.finalized_features}

    assert finalized().get("share.version") == 1  # a new cluster's level
    off = client.call(ApiKey.UPDATE_FEATURES, 1, {"timeout": 30000, "validate_only": False, "feature_updates": [
        {"feature": "share.version", "max_version_level": 0, "upgrade_type": 2}]})
    assert off.error_code == E.none, off
    eventually(lambda: finalized().get("share.version", 0) == 0, 10, what="share.version 0")
    refused = heartbeat(client, "m", 0, ["jobs"])
    assert refused.error_code == E.unsupported_version
    assert describe(client).error_code == E.unsupported_version


def test_a_groups_own_heartbeat_interval_is_what_its_members_are_told(client):
    altered = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
        {"resource_type": 32, "resource_name": "tuned", "configs": [
            {"name": "share.heartbeat.interval.ms", "config_operation": 0, "value": "1234"}]}]})
    assert altered.responses[0].error_code == E.none
    tuned = eventually(lambda: (a := heartbeat(client, "m", 0, ["jobs"], group="tuned")).heartbeat_interval
                       .total_seconds() * 1000 == 1234 and a, 10, what="the group's interval")
    assert tuned.error_code == E.none
    assert heartbeat(client, "m", 0, ["jobs"]).heartbeat_interval.total_seconds() * 1000 == 5000  # the broker's
