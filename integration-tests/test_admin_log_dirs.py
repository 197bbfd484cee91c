"""DescribeLogDirs and AlterReplicaLogDirs from kafka-python's admin client against a broker process with two log dirs."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import LogDirNotFoundError, NoError
from kafka.structs import TopicPartitionReplica

pytestmark = pytest.mark.storage

TOPIC = "moving"
COUNT = 300


def placement(admin: KafkaAdminClient) -> tuple[int, dict[int, str], dict[str, int]]:
    """The broker id, the dir of each partition of TOPIC, and each dir's reported partition sizes (summed)."""
    [answer] = admin.describe_log_dirs()
    where, sizes = {}, {}
    for log_dir in answer["log_dirs"]:
        assert log_dir["error_code"] == 0
        assert log_dir["total_bytes"] > 0 and 0 <= log_dir["usable_bytes"] <= log_dir["total_bytes"]
        sizes[log_dir["log_dir"]] = 0
        for topic in log_dir["topics"]:
            for p in topic["partitions"]:
                if topic["name"] == TOPIC:
                    assert p["partition_index"] not in where, "a partition is in two log dirs"
                    where[p["partition_index"]] = log_dir["log_dir"]
                    sizes[log_dir["log_dir"]] += p["partition_size"]
    return answer["broker"], where, sizes


def test_describe_then_move_a_partition_and_consume_it(broker_factory, tmp_path):
    dirs = [str(tmp_path / "dirA"), str(tmp_path / "dirB")]
    broker = broker_factory(**{"log.dirs": ",".join(dirs)})
    creator = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    creator.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    node, where, sizes = placement(admin)
    assert sorted(where) == [0, 1] and sorted(sizes) == dirs and sum(sizes.values()) == 0

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    for i in range(COUNT):
        producer.send(TOPIC, value=f"v{i}".encode(), partition=0)
    producer.flush()
    _, _, grown = placement(admin)
    assert sum(grown.values()) > 0

    target = next(d for d in dirs if d != where[0])
    replica = TopicPartitionReplica(TOPIC, 0, node)
    assert admin.alter_replica_log_dirs({replica: target}) == {replica: NoError}
    assert placement(admin)[1] == {0: target, 1: where[1]}
    assert admin.alter_replica_log_dirs({replica: str(tmp_path / "not-a-log-dir")}) == {replica: LogDirNotFoundError}

    for i in range(COUNT, COUNT + 10):
        producer.send(TOPIC, value=f"v{i}".encode(), partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(TOPIC, 0)])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append((message.offset, message.value))
        if len(got) == COUNT + 10:
            break
    consumer.close()
    admin.close()
    assert got == [(i, f"v{i}".encode()) for i in range(COUNT + 10)]
