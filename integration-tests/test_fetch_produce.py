"""Produce and fetch semantics clients rely on: long polling, size limits, topic-level settings."""

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

pytestmark = pytest.mark.storage


def create(broker, topic, partitions=1, **config):
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    client.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)


def produce(broker, topic, values, **extra):
    results = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0, **extra})
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: results.append((err, msg)))
    assert producer.flush(30) == 0
    return results


def test_long_poll_is_woken_by_an_append(broker):
    create(broker, "poll")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused",
                         "fetch.wait.max.ms": 10_000, "fetch.min.bytes": 1, "enable.auto.commit": False})
    consumer.assign([TopicPartition("poll", 0, 0)])
    consumer.consume(1, timeout=1)  # the consumer is now parked in a long-poll fetch
    sent_at = []

    def later():
        sent_at.append(time.monotonic())
        produce(broker, "poll", [b"wake"])

    threading.Timer(0.5, later).start()
    try:
        [msg] = consumer.consume(1, timeout=9)
        arrived = time.monotonic()
    finally:
        consumer.close()
    assert msg.value() == b"wake"
    # Woken by the append, not by fetch.wait.max.ms (10 s) running out.
    assert arrived - sent_at[0] < 5


def test_batches_larger_than_fetch_limits_still_progress(broker):
    create(broker, "big")
    values = [bytes([i]) * 50_000 for i in range(5)]
    produce(broker, "big", values)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, max_partition_fetch_bytes=1024,
                             fetch_max_bytes=1024, enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([KTP("big", 0)])
    consumer.seek(KTP("big", 0), 0)
    got = [m.value for _, m in zip(range(5), consumer)]
    consumer.close()
    assert got == values


def test_message_max_bytes_rejects_oversized_batches(broker):
    create(broker, "small", **{"max.message.bytes": "2000"})
    [(err, _)] = produce(broker, "small", [b"x" * 5000], **{"message.max.bytes": 100_000})
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    [(err, msg)] = produce(broker, "small", [b"x" * 100])
    assert err is None and msg.offset() == 0


def test_log_append_time_topic(broker):
    create(broker, "appended", **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    [(err, msg)] = produce(broker, "appended", [b"v"], **{"acks": "all"})
    assert err is None
    kind, stamp = msg.timestamp()
    assert kind == 2 and before - 1000 <= stamp <= int(time.time() * 1000) + 1000  # TIMESTAMP_LOG_APPEND_TIME


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_topic_compression_type_recompresses(broker, codec):
    create(broker, f"forced-{codec}", **{"compression.type": codec})
    produce(broker, f"forced-{codec}", [f"v{i}".encode() for i in range(100)], **{"compression.type": "lz4", "linger.ms": 50})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(f"forced-{codec}", 0, 0)])
    got = []
    try:
        while len(got) < 100:
            got.extend(m.value() for m in consumer.consume(100 - len(got), timeout=10))
    finally:
        consumer.close()
    assert got == [f"v{i}".encode() for i in range(100)]
    segment = next((broker.data_dir / f"forced-{codec}-0").glob("*.log")).read_bytes()
    assert segment[22] & 0x07 == {"gzip": 1, "zstd": 4}[codec]  # attributes of the first stored batch


def test_auto_create_can_be_disabled(broker_factory):
    broker = broker_factory(**{"auto.create.topics.enable": "false"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "message.timeout.ms": 3000})
    errors = []
    producer.produce("missing", value=b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    assert "missing" not in client.list_topics(timeout=10).topics


@pytest.mark.parametrize("partitions", ["3"])
def test_auto_create_uses_num_partitions(broker_factory, partitions):
    broker = broker_factory(**{"num.partitions": partitions})
    produce(broker, "auto", [b"x"])
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    assert len(client.list_topics(timeout=10).topics["auto"].partitions) == int(partitions)


def test_dynamic_broker_config_changes_topic_defaults(broker):
    create(broker, "dyn")
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    resource = ConfigResource(ResourceType.BROKER, "1", set_config={"log.retention.ms": "7777"})
    client.alter_configs([resource])[resource].result(30)
    topic = ConfigResource(ResourceType.TOPIC, "dyn")
    configs = next(iter(client.describe_configs([topic]).values())).result(30)
    assert configs["retention.ms"].value == "7777"
    assert configs["retention.ms"].source == 2  # DYNAMIC_BROKER_CONFIG
    broker_configs = next(iter(client.describe_configs([ConfigResource(ResourceType.BROKER, "1")]).values())).result(30)
    assert broker_configs["log.retention.ms"].value == "7777"
    static = ConfigResource(ResourceType.BROKER, "1", set_config={"node.id": "5"})
    with pytest.raises(Exception, match="dynamically"):
        client.alter_configs([static])[static].result(30)
