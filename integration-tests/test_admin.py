"""Admin APIs through confluent-kafka's AdminClient: topics, partitions, configs, records, cluster."""

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

pytestmark = [pytest.mark.metadata, pytest.mark.storage]


def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def produce(broker, topic, records, partition=0):
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0, "acks": "all"})
    for value, timestamp in records:
        producer.produce(topic, value=value, timestamp=timestamp, partition=partition)
        producer.flush(30)  # one batch per record: timestamps land in distinct batches too
    assert producer.flush(30) == 0


def consumer(broker):
    return Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})


def test_create_describe_delete_topics(broker):
    client = admin(broker)
    futures = client.create_topics([NewTopic("t1", 3, 1, config={"retention.ms": "60000"}), NewTopic("bad topic", 1, 1)])
    futures["t1"].result(30)
    with pytest.raises(KafkaException, match="INVALID_TOPIC|illegal|only contain"):
        futures["bad topic"].result(30)
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS|already exists"):
        client.create_topics([NewTopic("t1", 1, 1)])["t1"].result(30)
    with pytest.raises(KafkaException, match="REPLICATION_FACTOR|replication factor"):
        client.create_topics([NewTopic("t2", 1, 3)])["t2"].result(30)
    metadata = client.list_topics(timeout=30)
    assert len(metadata.topics["t1"].partitions) == 3
    client.create_partitions([NewPartitions("t1", 5)])["t1"].result(30)
    assert len(client.list_topics(timeout=30).topics["t1"].partitions) == 5
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS|must be larger"):
        client.create_partitions([NewPartitions("t1", 2)])["t1"].result(30)
    client.delete_topics(["t1"])["t1"].result(30)
    assert "t1" not in client.list_topics(timeout=30).topics
    with pytest.raises(KafkaException, match="UNKNOWN_TOPIC"):
        client.delete_topics(["t1"])["t1"].result(30)


def test_describe_cluster(broker):
    client = admin(broker)
    cluster = client.describe_cluster().result(30)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(1, "127.0.0.1", broker.port)]
    assert cluster.controller.id == 1
    assert len(cluster.cluster_id) == 22


def test_list_offsets_by_timestamp(broker):
    client = admin(broker)
    client.create_topics([NewTopic("times", 1, 1)])["times"].result(30)
    produce(broker, "times", [(f"v{i}".encode(), 1_000_000 + i * 1000) for i in range(10)])
    c = consumer(broker)
    try:
        for ts, expected in [(1_000_000, 0), (1_004_500, 5), (1_005_000, 5), (1_009_000, 9), (1_009_001, -1), (0, 0)]:
            [found] = c.offsets_for_times([TopicPartition("times", 0, ts)], timeout=30)
            assert found.offset == expected, (ts, found)
        low, high = c.get_watermark_offsets(TopicPartition("times", 0), timeout=30)
        assert (low, high) == (0, 10)
    finally:
        c.close()
    from confluent_kafka.admin import OffsetSpec

    result = client.list_offsets({TopicPartition("times", 0): OffsetSpec.max_timestamp()})
    info = result[TopicPartition("times", 0)].result(30)
    assert (info.offset, info.timestamp) == (9, 1_009_000)


def test_delete_records(broker):
    client = admin(broker)
    client.create_topics([NewTopic("del", 1, 1)])["del"].result(30)
    produce(broker, "del", [(b"x", 1000 + i) for i in range(5)])
    [result] = client.delete_records([TopicPartition("del", 0, 3)]).values()
    assert result.result(30).low_watermark == 3
    c = consumer(broker)
    try:
        assert c.get_watermark_offsets(TopicPartition("del", 0), timeout=30) == (3, 5)
    finally:
        c.close()


@pytest.mark.default_broker_config
def test_configs_alter_describe(broker):
    client = admin(broker)
    client.create_topics([NewTopic("cfg", 1, 1)])["cfg"].result(30)
    resource = ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
        ConfigEntry("retention.ms", "12345", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(30)
    described = client.describe_configs([ConfigResource(ResourceType.TOPIC, "cfg")])
    configs = next(iter(described.values())).result(30)
    assert configs["retention.ms"].value == "12345"
    assert configs["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.bytes"].value == "1073741824" and configs["segment.bytes"].is_default
    bad = ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException, match="INVALID_CONFIG|retention.ms"):
        client.incremental_alter_configs([bad])[bad].result(30)
    broker_resource = ConfigResource(ResourceType.BROKER, "1")
    broker_configs = next(iter(client.describe_configs([broker_resource]).values())).result(30)
    assert broker_configs["num.partitions"].value == "1"
    assert broker_configs["node.id"].is_read_only
