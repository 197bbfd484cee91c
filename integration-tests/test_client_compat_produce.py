"""What josef's producer writes, confluent-kafka (librdkafka) reads; keys land where the Java partitioner puts them."""

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef_client import Producer as JosefProducer

COUNT = 5_000


def create(broker, topic, partitions):
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    client.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def test_keyed_partitions_match_librdkafkas_java_compatible_partitioner(broker):
    create(broker, "keys-josef", 7)
    create(broker, "keys-librdkafka", 7)
    keys = [f"customer-{i}".encode() for i in range(500)] + [b"", b"\xff\xfe", "ключ".encode()]
    with JosefProducer(bootstrap_servers=broker.bootstrap_servers) as ours:
        ours_placed = [ours.send("keys-josef", b"v", key=k) for k in keys]
        ours.flush()
        ours_partitions = [f.result(10).partition for f in ours_placed]
    theirs_partitions = []
    theirs = Producer({"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random"})
    for k in keys:
        theirs.produce("keys-librdkafka", b"v", key=k, on_delivery=lambda err, msg: theirs_partitions.append(msg.partition()))
        theirs.flush(10)
    assert ours_partitions == theirs_partitions
    assert len(set(ours_partitions)) == 7


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_reads_what_josef_wrote(broker, codec):
    topic = f"from-josef-{codec}"
    create(broker, topic, 1)
    sent = []
    with JosefProducer(bootstrap_servers=broker.bootstrap_servers, compression_type=codec, linger_ms=20) as producer:
        for i in range(COUNT):
            key = None if i % 5 == 0 else f"k{i}".encode()
            value = None if i % 11 == 0 else f"value-{i}".encode() * (i % 4 + 1)
            headers = [("i", str(i).encode()), ("null", None), ("ü", b"\x00")] if i % 3 == 0 else []
            timestamp = 1_650_000_000_000 + i * 7
            producer.send(topic, value, key=key, headers=headers, timestamp_ms=timestamp)
            sent.append((key, value, headers, timestamp))
        producer.flush()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while len(got) < COUNT:
            for msg in consumer.consume(COUNT - len(got), timeout=10):
                assert msg.error() is None, msg.error()
                got.append(msg)
    finally:
        consumer.close()
    assert [m.offset() for m in got] == list(range(COUNT))
    for (key, value, headers, timestamp), msg in zip(sent, got):
        assert (msg.key(), msg.value(), msg.timestamp()) == (key, value, (1, timestamp))
        assert (msg.headers() or []) == headers
