"""The ``offsets`` record decoder (``josef dump-log --offsets-decoder``), reached through the plugin hook."""

from __future__ import annotations

import struct
import uuid

import pytest

from josef.metadata.records import uuid_to_text
from josef.plugins import collect, get_plugin_manager
from josef.protocol.consumer_protocol import Subscription, encode_assignment, encode_subscription
from josef.protocol.topic_partition import TopicPartition
from josef_coordinator_group import records
from josef_coordinator_group.records import ConsumerKey, GroupKey, GroupValue, MemberValue, OffsetKey, OffsetValue

TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def decode():
    return collect(get_plugin_manager(), "register_record_decoders", "record decoder").get("offsets")


def test_an_offset_commit_and_its_tombstone(decode):
    key = records.encode_key(OffsetKey("g", "orders", 3))
    decoded_key, value = decode(key, records.encode_offset(OffsetValue(42, "meta", TS, leader_epoch=5)))
    assert decoded_key == {"type": "1", "data": {"group": "g", "topic": "orders", "partition": 3}}
    assert value == {"version": "3", "data": {"offset": 42, "leaderEpoch": 5, "metadata": "meta", "commitTimestamp": TS}}
    assert decode(key, None) == (decoded_key, None)


def test_an_offset_with_its_own_expiry_is_version_1(decode):
    _, value = decode(records.encode_key(OffsetKey("g", "t", 0)),
                      records.encode_offset(OffsetValue(7, "", TS, expire_timestamp=TS + 1000)))
    assert value == {"version": "1", "data": {"offset": 7, "metadata": "", "commitTimestamp": TS,
                                              "expireTimestamp": TS + 1000}}


def test_a_consumer_group_has_its_members_protocol_decoded(decode):
    subscription = encode_subscription(Subscription(("orders",), owned_partitions=(TopicPartition("orders", 1),)))
    assignment = encode_assignment([TopicPartition("orders", 0), TopicPartition("orders", 1)])
    member = MemberValue("m-1", None, "client", "/127.0.0.1", 30000, 10000, subscription, assignment)
    key, value = decode(records.encode_key(GroupKey("g")),
                        records.encode_group(GroupValue("consumer", 4, "range", "m-1", TS, (member,))))
    assert key == {"type": "2", "data": {"group": "g"}}
    data = value["data"]
    assert value["version"] == "3"
    assert list(data) == ["protocolType", "generation", "protocol", "leader", "currentStateTimestamp", "members"]
    assert (data["protocolType"], data["generation"], data["protocol"], data["leader"]) == ("consumer", 4, "range", "m-1")
    (decoded,) = data["members"]
    assert list(decoded) == ["memberId", "groupInstanceId", "clientId", "clientHost", "rebalanceTimeout",
                             "sessionTimeout", "subscription", "assignment"]
    assert decoded["subscription"].topics == ("orders",)
    assert [(t.topic, t.partitions) for t in decoded["subscription"].owned_partitions] == [("orders", (1,))]
    assert [(t.topic, t.partitions) for t in decoded["assignment"].assigned_partitions] == [("orders", (0, 1))]


def test_another_protocol_keeps_its_bytes(decode):
    member = MemberValue("m-1", None, "c", "/h", 1, 1, b"\x01\x02", b"")
    _, value = decode(records.encode_key(GroupKey("g")),
                      records.encode_group(GroupValue("connect", 1, "default", "m-1", TS, (member,))))
    assert value["data"]["members"][0]["subscription"] == b"\x01\x02"


def test_consumer_group_records(decode):
    topic = uuid.uuid4()
    key, value = decode(records.encode_key(ConsumerKey(records.CONSUMER_GROUP_METADATA, "g")), records.encode_epoch(9))
    assert key == {"type": "3", "data": {"groupId": "g"}} and value == {"version": "0", "data": {"epoch": 9}}
    key, value = decode(records.encode_key(ConsumerKey(records.CONSUMER_TARGET_MEMBER, "g", "m")),
                        records.encode_target_member({str(topic): frozenset({2, 0})}))
    assert key == {"type": "7", "data": {"groupId": "g", "memberId": "m"}}
    assert value["data"] == {"topicPartitions": [{"topicId": uuid_to_text(topic), "partitions": [0, 2]}]}


def test_share_group_records(decode):
    topic = uuid.uuid4()
    key, value = decode(records.encode_key(ConsumerKey(records.SHARE_GROUP_METADATA, "q")), records.encode_epoch(4))
    assert key == {"type": "11", "data": {"groupId": "q"}} and value["data"] == {"epoch": 4}
    key, value = decode(records.encode_key(ConsumerKey(records.SHARE_MEMBER_METADATA, "q", "m")),
                        records.encode_share_member(records.ShareMemberValue(None, "c", "/h", ("jobs",))))
    assert key == {"type": "10", "data": {"groupId": "q", "memberId": "m"}}
    assert value["data"] == {"rackId": None, "clientId": "c", "clientHost": "/h", "subscribedTopicNames": ["jobs"]}
    _, value = decode(records.encode_key(ConsumerKey(records.SHARE_CURRENT_ASSIGNMENT, "q", "m")),
                      records.encode_share_assignment(records.ShareAssignmentValue(4, 3, 0, {str(topic): frozenset({1})})))
    assert value["data"] == {"memberEpoch": 4, "previousMemberEpoch": 3, "state": 0,
                             "assignedPartitions": [{"topicId": uuid_to_text(topic), "partitions": [1]}]}
    _, value = decode(records.encode_key(ConsumerKey(records.SHARE_TARGET_METADATA, "q")), records.encode_epoch(4))
    assert value["data"] == {"assignmentEpoch": 4}


def test_the_share_groups_state_partitions_record(decode):
    topic = uuid.uuid4()
    value = records.encode_share_state_partitions(records.ShareStatePartitionsValue(
        {str(topic): ("jobs", frozenset({0, 1}))}, {}))
    key, decoded = decode(records.encode_key(ConsumerKey(records.SHARE_STATE_PARTITIONS, "q")), value)
    assert key == {"type": "15", "data": {"groupId": "q"}}
    assert decoded["data"] == {"initializedTopics": [{"topicId": uuid_to_text(topic), "topicName": "jobs",
                                                      "partitions": [0, 1]}], "deletingTopics": []}
    assert records.decode_share_state_partitions(value).initialized == {str(topic): ("jobs", frozenset({0, 1}))}


def test_unknown_types_and_bad_bytes(decode):
    with pytest.raises(LookupError) as info:
        decode(struct.pack(">h", 9) + b"\x00\x01g", None)
    assert info.value.args == (9,)
    with pytest.raises(ValueError):
        decode(records.encode_key(OffsetKey("g", "t", 0)), b"\x00\x03\x00")
