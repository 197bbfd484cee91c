"""confluent-kafka (librdkafka) produces 100,000 records per codec and reads them back byte-exact."""

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

COUNT = 100_000


def produce(bootstrap, topic, codec, count):
    sent = []
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                         "acks": "all", "enable.idempotence": False})

    def delivered(err, msg):
        if err is not None:
            errors.append(err)

    for i in range(count):
        key = None if i % 10 == 0 else f"key-{i}".encode()
        value = None if i % 97 == 0 else (f"value-{i}-" * (i % 7 + 1)).encode()
        headers = [("n", str(i).encode()), ("empty", b"")] if i % 3 == 0 else None
        timestamp = 1_700_000_000_000 + i
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=timestamp, on_delivery=delivered)
        sent.append((key, value, headers or [], timestamp))
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors
    return sent


def consume_all(bootstrap, topic, count):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while len(got) < count:
            for msg in consumer.consume(min(10_000, count - len(got)), timeout=10):
                assert msg.error() is None, msg.error()
                got.append(msg)
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_byte_exact(broker, codec):
    topic = f"codec-{codec}"
    sent = produce(broker.bootstrap_servers, topic, codec, COUNT)
    got = consume_all(broker.bootstrap_servers, topic, COUNT)
    assert [m.offset() for m in got] == list(range(COUNT))
    for (key, value, headers, timestamp), msg in zip(sent, got):
        assert msg.key() == key
        assert msg.value() == value
        assert (msg.headers() or []) == headers
        assert msg.timestamp() == (1, timestamp)  # (TIMESTAMP_CREATE_TIME, ts)
