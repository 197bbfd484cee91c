"""Admin clients on consumer groups (list, describe, offsets, delete) and static membership with librdkafka."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KpTopicPartition
from kafka import errors as Errors
from kafka.admin import KafkaAdminClient, MemberToRemove

DEADLINE_S = 60


def setup(bootstrap: str, topic: str, partitions: int, records: int) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(records):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(30) == 0
    return admin


def member(bootstrap: str, group: str, **extra: object) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 30_000, "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "range", "fetch.wait.max.ms": 100, **extra})


def poll_until(consumers: list[Consumer], condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for consumer in consumers:
            consumer.poll(0.05)


def test_confluent_admin_lists_describes_alters_and_deletes_groups(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    admin = setup(bootstrap, "admin-t", 2, 20)
    consumer = member(bootstrap, "watched", **{"client.id": "watcher"})
    consumer.subscribe(["admin-t"])
    poll_until([consumer], lambda: len(consumer.assignment()) == 2, "the assignment")
    consumer.commit(offsets=[TopicPartition("admin-t", 0, 3), TopicPartition("admin-t", 1, 4)], asynchronous=False)

    listed = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(30)
    assert [(g.group_id, g.state) for g in listed.valid] == [("watched", ConsumerGroupState.STABLE)]
    described = admin.describe_consumer_groups(["watched"])["watched"].result(30)
    assert (described.state, described.partition_assignor, described.is_simple_consumer_group) == (
        ConsumerGroupState.STABLE, "range", False)
    [m] = described.members
    assert m.client_id == "watcher" and m.host == "/127.0.0.1"
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1]
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("watched")])["watched"].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 3), (1, 4)]

    # Offsets of a group with members can only be changed by the members.
    try:
        refused = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            "watched", [TopicPartition("admin-t", 0, 0)])])["watched"].result(30)
        assert refused.topic_partitions[0].error is not None
    except KafkaException as exc:
        assert "UNKNOWN_MEMBER_ID" in str(exc) or "member" in str(exc).lower()
    deleting = admin.delete_consumer_groups(["watched"])["watched"]
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP|not empty"):
        deleting.result(30)

    consumer.close()
    assert admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(30).valid[0].group_id == "watched"
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        "watched", [TopicPartition("admin-t", 0, 1)])])["watched"].result(30)
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("watched")])["watched"].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 1), (1, 4)]

    admin.delete_consumer_groups(["watched"])["watched"].result(30)
    assert admin.list_consumer_groups().result(30).valid == []
    with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND|does not exist"):
        admin.delete_consumer_groups(["watched"])["watched"].result(30)


def test_kafka_python_admin_deletes_offsets_and_removes_static_members(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    setup(bootstrap, "kp-admin", 2, 10)
    consumer = member(bootstrap, "statics", **{"group.instance.id": "box-1"})
    consumer.subscribe(["kp-admin"])
    poll_until([consumer], lambda: len(consumer.assignment()) == 2, "the assignment")
    consumer.commit(offsets=[TopicPartition("kp-admin", 0, 2), TopicPartition("kp-admin", 1, 2)], asynchronous=False)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_groups(["statics"])["statics"]
        assert described["group_state"] == "Stable" and described["error"] is None
        assert [m["group_instance_id"] for m in described["members"]] == ["box-1"]
        # The group reads the topic: its offsets may not be deleted yet.
        tp0 = KpTopicPartition("kp-admin", 0)
        assert admin.delete_group_offsets("statics", [tp0])[tp0] is Errors.GroupSubscribedToTopicError
        removed = admin.remove_group_members("statics", [MemberToRemove(group_instance_id="box-1")])
        assert list(removed.values()) == [Errors.NoError]
        assert admin.describe_groups(["statics"])["statics"]["group_state"] == "Empty"
        assert admin.delete_group_offsets("statics", [tp0])[tp0] is Errors.NoError
        remaining = admin.list_group_offsets({"statics": None})["statics"]
        assert {tp.partition: o.offset for tp, o in remaining.items()} == {1: 2}
    finally:
        admin.close()
        consumer.close()


def test_a_static_member_that_restarts_keeps_its_partitions_without_a_rebalance(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    setup(bootstrap, "static-t", 4, 0)
    revoked: list[list[int]] = []

    def on_revoke(consumer, partitions):
        revoked.append(sorted(tp.partition for tp in partitions))

    stays = member(bootstrap, "static-g", **{"group.instance.id": "stays"})
    stays.subscribe(["static-t"], on_revoke=on_revoke)
    restarts = member(bootstrap, "static-g", **{"group.instance.id": "restarts"})
    restarts.subscribe(["static-t"])
    poll_until([stays, restarts], lambda: len(stays.assignment()) == 2 and len(restarts.assignment()) == 2,
               "two partitions each")
    before = {tp.partition for tp in restarts.assignment()}
    revoked.clear()
    restarts.close()  # a static member leaves no LeaveGroup behind: its seat waits for the session timeout

    again = member(bootstrap, "static-g", **{"group.instance.id": "restarts"})
    again.subscribe(["static-t"])
    poll_until([stays, again], lambda: len(again.assignment()) == 2, "the restarted member's partitions")
    assert {tp.partition for tp in again.assignment()} == before
    for _ in range(10):
        stays.poll(0.05)
    assert revoked == []  # the other member never had to give anything up
    stays.close()
    again.close()
