"""kafka-python and aiokafka produce and consume with manually assigned partitions."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

pytestmark = pytest.mark.storage

COUNT = 2_000


def create(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def test_kafka_python(broker):
    create(broker.bootstrap_servers, "kp", 3)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all", linger_ms=5,
                             compression_type="gzip")
    futures = [producer.send("kp", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 3,
                             headers=[("i", str(i).encode())]) for i in range(COUNT)]
    producer.flush()
    metadata = [f.get(timeout=30) for f in futures]
    assert sorted((m.partition, m.offset) for m in metadata) == sorted(
        (p, o) for p in range(3) for o in range(len(range(p, COUNT, 3))))
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition("kp", p) for p in range(3)])
    consumer.seek_to_beginning()
    got = {}
    for msg in consumer:
        got[msg.value] = (msg.key, msg.partition, msg.headers)
        if len(got) == COUNT:
            break
    consumer.close()
    assert len(got) == COUNT
    assert got[b"v7"] == (b"k7", 1, [("i", b"7")])


def test_aiokafka(broker):
    async def main():
        create(broker.bootstrap_servers, "aio", 2)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all", linger_ms=5,
                                    compression_type="lz4")
        await producer.start()
        try:
            results = await asyncio.gather(*[
                await producer.send("aio", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
                for i in range(COUNT)])
        finally:
            await producer.stop()
        assert {r.partition for r in results} == {0, 1}
        assert max(r.offset for r in results) == COUNT // 2 - 1

        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioTP("aio", 0), AioTP("aio", 1)])
            await consumer.seek_to_beginning()
            got = []
            while len(got) < COUNT:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                for messages in batches.values():
                    got.extend((m.key, m.value) for m in messages)
        finally:
            await consumer.stop()
        assert sorted(got) == sorted((f"k{i}".encode(), f"v{i}".encode()) for i in range(COUNT))

    asyncio.run(main())
