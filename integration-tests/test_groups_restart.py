"""Groups and committed offsets survive a broker restart: they are records in __consumer_offsets, replayed on load."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from group_workers import consume_committing
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.structs import OffsetAndMetadata

from josef.testing import free_ports

pytestmark = pytest.mark.metadata

DEADLINE_S = 60
PARTITIONS = 3


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def group_consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    """Kafka's default session timeout: librdkafka forgets its member id when no heartbeat succeeds for that long,
    and a restart on a loaded machine can take longer than a short one."""
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 45_000, "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "range", **extra})


def test_committed_offsets_and_groups_survive_a_restart(broker_factory):
    [port] = free_ports(1)  # kept across the restarts, so the member stays connected
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0", "listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("durable", PARTITIONS, 1)])["durable"].result(30)
    produce(bootstrap, "durable", 0, 90)

    # A member that stays connected across the restart, and a group that only commits (no membership).
    member = group_consumer(bootstrap, "live")
    member.subscribe(["durable"])
    assert sorted(consume_committing(member, 90), key=lambda v: int(v[1:])) == [f"v{i}" for i in range(90)]
    member_id = member.memberid()
    manual = KafkaConsumer(bootstrap_servers=bootstrap, group_id="manual", enable_auto_commit=False)
    manual.assign([KpTopicPartition("durable", p) for p in range(PARTITIONS)])
    manual.commit({KpTopicPartition("durable", p): OffsetAndMetadata(10 + p, "note", -1) for p in range(PARTITIONS)})
    manual.close()

    broker.restart()
    assert broker.port == port

    # The member carries on in its generation: no new member id, and it reads on from where it was.
    produce(bootstrap, "durable", 90, 30)
    assert sorted(consume_committing(member, 30), key=lambda v: int(v[1:])) == [f"v{i}" for i in range(90, 120)]
    assert member.memberid() == member_id
    described = admin.describe_consumer_groups(["live"])["live"].result(30)
    assert [m.member_id for m in described.members] == [member_id]
    member.close()

    offsets = {tp.partition: tp.offset for tp in group_consumer(bootstrap, "live").committed(
        [TopicPartition("durable", p) for p in range(PARTITIONS)], timeout=10)}
    assert offsets == {p: 40 for p in range(PARTITIONS)}

    broker.restart()
    checker = KafkaConsumer(bootstrap_servers=bootstrap, group_id="manual", enable_auto_commit=False)
    try:
        for p in range(PARTITIONS):
            assert checker.committed(KpTopicPartition("durable", p), metadata=True).offset == 10 + p
    finally:
        checker.close()
    # A new member of "manual" starts at the committed offsets, not at the beginning.
    resumed = group_consumer(bootstrap, "manual")
    resumed.subscribe(["durable"])
    try:
        got = consume_committing(resumed, 120 - 33)
    finally:
        resumed.close()
    assert {int(v[1:]) for v in got} == {i for i in range(120) if i // PARTITIONS >= 10 + i % PARTITIONS}
