"""Acknowledged writes, topics and configs survive a clean stop and a kill -9."""

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

pytestmark = [pytest.mark.metadata, pytest.mark.storage]

COUNT = 20_000


def produce_acked(bootstrap, topic):
    acked = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})

    def delivered(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    for i in range(COUNT):
        producer.produce(topic, value=f"record-{i}".encode(), partition=i % 2, on_delivery=delivered)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return acked


def read_all(bootstrap, topic):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got = []
    try:
        while len(got) < COUNT:
            messages = consumer.consume(min(5000, COUNT - len(got)), timeout=10)
            assert messages, f"only {len(got)} records after restart"
            got.extend((m.partition(), m.offset(), m.value()) for m in messages if m.error() is None)
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("how", ["clean", "kill-9"])
def test_restart_keeps_acknowledged_records_topics_and_configs(broker, how):
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    client.create_topics([NewTopic("durable", 2, 1, config={"retention.ms": "86400001"})])["durable"].result(30)
    acked = produce_acked(broker.bootstrap_servers, "durable")
    if how == "clean":
        assert broker.stop() == 0
    else:
        broker.kill()
    broker.start()
    assert sorted(read_all(broker.bootstrap_servers, "durable")) == sorted(acked)
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    configs = next(iter(client.describe_configs([ConfigResource(ResourceType.TOPIC, "durable")]).values())).result(30)
    assert configs["retention.ms"].value == "86400001"
    # The log continues where it stopped: new records get the next offsets.
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
    offsets = []
    producer.produce("durable", value=b"after", partition=0, on_delivery=lambda e, m: offsets.append(m.offset()))
    producer.flush(30)
    assert offsets == [COUNT // 2]
