"""Describing the cluster, topics, offsets and producers of a real broker process.

confluent-kafka's AdminClient (librdkafka 2.x answers describe_cluster and
describe_topics from Metadata) for what a client sees, and raw requests for
the APIs it does not send: DescribeCluster's controller endpoints,
DescribeTopicPartitions and DescribeProducers.
"""

import re

import pytest
from confluent_kafka import KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient


def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def create(client, topic, partitions):
    client.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(broker, topic, values, **config):
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0, **config})
    for partition, value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def test_describe_cluster_and_controller_endpoint(broker_factory):
    broker = broker_factory(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")
    client = admin(broker)  # kept: a collected AdminClient fails its pending futures
    cluster = client.describe_cluster(include_authorized_operations=True).result(30)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(1, "127.0.0.1", broker.port)]
    assert cluster.controller.id == 1 and len(cluster.cluster_id) == 22
    # The authorizer's answer (allow-all here): every operation Kafka defines on the cluster.
    assert sorted(op.name for op in cluster.authorized_operations) == sorted(
        ["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE"])

    # KIP-919: the controller listener (controller.listener.names) answers for controllers only.
    controller_port = int(re.search(r"CONTROLLER://[^:\s]+:(\d+)", "".join(broker.log)).group(1))
    body = {"include_cluster_authorized_operations": False, "endpoint_type": 2, "include_fenced_brokers": False}
    controllers = RawClient(controller_port).call(ApiKey.DESCRIBE_CLUSTER, 1, body)
    assert (controllers.error_code, controllers.cluster_id) == (ErrorCode.none, cluster.cluster_id)
    assert [(n.broker_id, n.port) for n in controllers.brokers] == [(1, controller_port)]
    refused = RawClient(broker.port).call(ApiKey.DESCRIBE_CLUSTER, 2, body)
    assert refused.error_code == ErrorCode.mismatched_endpoint_type


def test_describe_topics(broker):
    client = admin(broker)
    create(client, "described", 3)
    futures = client.describe_topics(TopicCollection(["described", "absent"]))
    topic = futures["described"].result(30)
    assert (topic.name, topic.is_internal) == ("described", False) and topic.topic_id is not None
    assert [(p.id, p.leader.id, [r.id for r in p.replicas], [r.id for r in p.isr]) for p in topic.partitions] == [
        (i, 1, [1], [1]) for i in range(3)]
    assert all((p.leader.host, p.leader.port) == ("127.0.0.1", broker.port) for p in topic.partitions)
    with pytest.raises(KafkaException, match="UNKNOWN_TOPIC"):
        futures["absent"].result(30)


def test_list_offsets_earliest_and_latest(broker):
    client = admin(broker)
    create(client, "offsets", 2)
    produce(broker, "offsets", [(0, b"a"), (0, b"b"), (0, b"c"), (1, b"d")])
    latest = client.list_offsets({TopicPartition("offsets", p): OffsetSpec.latest() for p in (0, 1)})
    assert {tp.partition: f.result(30).offset for tp, f in latest.items()} == {0: 3, 1: 1}
    earliest = client.list_offsets({TopicPartition("offsets", 0): OffsetSpec.earliest()})
    assert [f.result(30).offset for f in earliest.values()] == [0]


def test_describe_topic_partitions_pages_through_a_real_broker(broker):
    create(admin(broker), "paged", 3)
    raw = RawClient(broker.port)
    pages, cursor = [], None
    while True:
        answer = raw.call(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {
            "topics": [{"name": "paged"}], "response_partition_limit": 2, "cursor": cursor})
        pages.append([(t.name, p.partition_index, p.leader_id) for t in answer.topics for p in t.partitions])
        if answer.next_cursor is None:
            break
        cursor = {"topic_name": answer.next_cursor.topic_name, "partition_index": answer.next_cursor.partition_index}
    assert pages == [[("paged", 0, 1), ("paged", 1, 1)], [("paged", 2, 1)]]


def test_describe_producers_of_an_idempotent_confluent_producer(broker):
    create(admin(broker), "idempotent", 1)
    produce(broker, "idempotent", [(0, b"%d" % i) for i in range(5)], **{"enable.idempotence": True})
    answer = RawClient(broker.port).call(ApiKey.DESCRIBE_PRODUCERS, 0, {
        "topics": [{"name": "idempotent", "partition_indexes": [0, 1]}]})
    found, absent = answer.topics[0].partitions
    assert (found.error_code, absent.error_code) == (ErrorCode.none, ErrorCode.unknown_topic_or_partition)
    (producer,) = found.active_producers
    # librdkafka numbers its batches from 0: five records end at sequence 4, whatever the batching.
    assert producer.producer_id >= 0 and producer.producer_epoch >= 0 and producer.last_sequence == 4
    assert producer.last_timestamp > 0 and producer.current_txn_start_offset == -1
