"""DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets: the group coordinator checks the
share group and asks the share coordinator (josef-coordinator-share, installed with the workspace)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

E = ErrorCode


@pytest.fixture
def client(josef_broker):
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "jobs", "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    yield client
    client.close()


def heartbeat(client: RawClient, member: str, epoch: int):
    answer = client.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {"group_id": "sg", "member_id": member,
                                                           "member_epoch": epoch, "rack_id": None,
                                                           "subscribed_topic_names": ["jobs"] if epoch == 0 else None})
    assert answer.error_code == E.none, answer
    return answer


def starts(client: RawClient, group: str = "sg") -> tuple[ErrorCode, dict[int, int]]:
    [described] = client.call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, {"groups": [
        {"group_id": group, "topics": [{"topic_name": "jobs", "partitions": [0, 1]}]}]}).groups
    parts = {p.partition_index: p.start_offset for t in described.topics for p in t.partitions}
    return described.error_code, parts


def alter(client: RawClient, offsets: dict[int, int]):
    return client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {"group_id": "sg", "topics": [
        {"topic_name": "jobs", "partitions": [{"partition_index": p, "start_offset": o} for p, o in offsets.items()]}]})


def test_offsets_are_described_altered_while_empty_and_deleted(client):
    heartbeat(client, "m", 0)
    assert starts(client) == (E.none, {0: -1, 1: -1})  # never initialized
    assert alter(client, {0: 5}).error_code == E.non_empty_group
    heartbeat(client, "m", -1)
    altered = alter(client, {0: 5, 1: 0})
    assert altered.error_code == E.none
    assert [p.error_code for t in altered.responses for p in t.partitions] == [E.none, E.none]
    assert starts(client) == (E.none, {0: 5, 1: 0})
    assert alter(client, {0: 7}).error_code == E.none  # again: a newer state epoch
    assert starts(client)[1][0] == 7
    deleted = client.call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, {"group_id": "sg", "topics": [{"topic_name": "jobs"}]})
    assert (deleted.error_code, [t.error_code for t in deleted.responses]) == (E.none, [E.none])
    assert starts(client) == (E.none, {0: -1, 1: -1})


def test_groups_that_are_not_share_groups_are_refused(client):
    committed = client.call(ApiKey.OFFSET_COMMIT, 9, {
        "group_id": "classic", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": "jobs", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                    "committed_leader_epoch": -1, "committed_metadata": None}]}]})
    assert committed.topics[0].partitions[0].error_code == E.none
    assert starts(client, "classic")[0] == E.group_id_not_found
    assert starts(client, "nobody")[0] == E.group_id_not_found
    classic = client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {"group_id": "classic", "topics": []})
    assert classic.error_code == E.group_id_not_found
    # An unused group id becomes an empty share group, whose offsets are then its own (as in Kafka).
    created = client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {"group_id": "nobody", "topics": [
        {"topic_name": "jobs", "partitions": [{"partition_index": 1, "start_offset": 0}]}]})
    assert created.error_code == E.none
    [described] = client.call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, {"groups": [
        {"group_id": "nobody", "topics": None}]}).groups  # all topics it has state for
    assert [(t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions]) for t in described.topics] \
        == [("jobs", [(0, -1), (1, 0)])]


def test_deleting_a_share_group_deletes_its_share_partition_state(client):
    heartbeat(client, "m", 0)
    heartbeat(client, "m", -1)
    assert alter(client, {0: 3, 1: 4}).error_code == E.none
    metadata = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "jobs", "topic_id": None}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    topic_id = metadata.topics[0].topic_id

    def summary() -> list[int]:
        answer = client.call(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, {"group_id": "sg", "topics": [
            {"topic_id": topic_id, "partitions": [{"partition": p, "leader_epoch": -1} for p in (0, 1)]}]})
        return [p.start_offset for p in answer.results[0].partitions]

    assert summary() == [3, 4]
    deleted = client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["sg"]})
    assert deleted.results[0].error_code == E.none
    assert summary() == [-1, -1], "the share-partition state outlived its group"
    assert starts(client)[0] == E.group_id_not_found
