"""josef's consumer reads what confluent-kafka (librdkafka) wrote, byte-exact, and agrees with librdkafka's consumer.

librdkafka batches the way real producers do (linger, several codecs,
xerial-framed snappy, idempotent producer ids), so this is the consumer's
decoding path against data josef's own code did not encode.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef_client import AsyncConsumer, Consumer, ConsumerRecord, TopicPartition

pytestmark = pytest.mark.storage

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
COUNT = 2_000


def create(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)


def produce(bootstrap: str, topic: str, count: int, partitions: int = 1, **extra: object) -> list[tuple]:
    """Records with every shape a record can have; returns (partition, offset, key, value, headers, timestamp)."""
    rng = random.Random(count)
    delivered: list[tuple] = []
    errors = []
    producer = RdProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", **extra})

    def report(err, msg, headers):
        # Delivery reports carry no headers: take what was sent.
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value(), headers or [], msg.timestamp()[1]))

    for i in range(count):
        key = None if i % 10 == 0 else rng.randbytes(rng.randrange(0, 40))
        value = None if i % 97 == 0 else rng.randbytes(rng.choice((0, 1, 100, 100, 100, 1_000, 20_000)))
        headers = None
        if i % 3 == 0:
            headers = [("n", str(i).encode()), ("empty", b""), ("null", None), ("\u00fcnicode", rng.randbytes(5))]
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=1_700_000_000_000 + i * 7,
                         partition=i % partitions,
                         on_delivery=lambda err, msg, h=headers: report(err, msg, h))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors
    return sorted(delivered)


def as_tuples(records: list[ConsumerRecord]) -> list[tuple]:
    return sorted((r.partition, r.offset, r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp) for r in records)


async def consume(bootstrap: str, tps: list[TopicPartition], count: int, **config: object) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    async with AsyncConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **config) as consumer:
        consumer.assign(tps)
        deadline = asyncio.get_running_loop().time() + 60
        while len(got) < count:
            assert asyncio.get_running_loop().time() < deadline, f"only {len(got)} of {count} records"
            for records in (await consumer.poll(timeout_ms=1000)).values():
                got += records
        assert await consumer.poll(timeout_ms=200) == {}
    return got


@pytest.mark.parametrize("codec", CODECS)
def test_reads_every_codec_byte_exact(broker, codec):
    topic = f"codec-{codec}"
    create(broker.bootstrap_servers, topic, partitions=2)
    sent = produce(broker.bootstrap_servers, topic, COUNT, partitions=2, **{"compression.type": codec,
                                                                           "enable.idempotence": False})
    got = asyncio.run(consume(broker.bootstrap_servers, [TopicPartition(topic, 0), TopicPartition(topic, 1)], COUNT))
    assert as_tuples(got) == sent
    assert {(r.topic, r.timestamp_type) for r in got} == {(topic, 0)}
    for partition in (0, 1):
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == list(range(len(offsets)))  # in order, none missing, none repeated


def test_reads_an_idempotent_producers_batches(broker):
    create(broker.bootstrap_servers, "idem")
    sent = produce(broker.bootstrap_servers, "idem", COUNT, **{"enable.idempotence": True, "compression.type": "lz4"})
    got = asyncio.run(consume(broker.bootstrap_servers, [TopicPartition("idem", 0)], COUNT,
                              isolation_level="read_committed"))
    assert as_tuples(got) == sent


def test_log_append_time_and_offset_lookups_agree_with_librdkafka(broker):
    bootstrap = broker.bootstrap_servers
    create(bootstrap, "appended", **{"message.timestamp.type": "LogAppendTime"})
    create(bootstrap, "created")
    produce(bootstrap, "appended", 300, **{"compression.type": "zstd"})
    sent = produce(bootstrap, "created", 300, **{"compression.type": "snappy"})

    rd = RdConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    rd.assign([RdTopicPartition("appended", 0, 0)])
    theirs = []
    try:
        while len(theirs) < 300:
            for msg in rd.consume(300 - len(theirs), timeout=10):
                assert msg.error() is None, msg.error()
                theirs.append((msg.offset(), msg.timestamp()))
        probes = [sent[0][5], sent[150][5], sent[150][5] - 3, sent[-1][5], sent[-1][5] + 1]
        rd_found = [rd.offsets_for_times([RdTopicPartition("created", 0, ts)], 10)[0].offset for ts in probes]
        rd_marks = rd.get_watermark_offsets(RdTopicPartition("created", 0), timeout=10)
    finally:
        rd.close()

    tp, created = TopicPartition("appended", 0), TopicPartition("created", 0)
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        ours = []
        while len(ours) < 300:
            ours += consumer.poll(timeout_ms=5000).get(tp, [])
        found = [consumer.offsets_for_times({created: ts})[created] for ts in probes]
        marks = (consumer.beginning_offsets([created])[created], consumer.end_offsets([created])[created])
    assert [(r.offset, (r.timestamp_type, r.timestamp)) for r in ours] == [
        (offset, (1, ts)) for offset, (kind, ts) in theirs if kind == TIMESTAMP_LOG_APPEND_TIME]
    assert [f[0] if f else -1 for f in found] == rd_found
    assert found[1] == (sent[150][1], sent[150][5])
    assert found[-1] is None
    assert marks == rd_marks == (0, 300)


def test_large_records_and_many_partitions(josef_broker):
    """The in-process broker fixture, with records larger than max.partition.fetch.bytes."""
    bootstrap = josef_broker.bootstrap_servers
    create(bootstrap, "large", partitions=3)
    producer = RdProducer({"bootstrap.servers": bootstrap, "compression.type": "gzip", "linger.ms": 5,
                           "message.max.bytes": 5_000_000})
    payloads = {p: [os.urandom(600_000) for _ in range(3)] for p in range(3)}
    for p, values in payloads.items():
        for value in values:
            producer.produce("large", value=value, partition=p)
    assert producer.flush(60) == 0
    got = asyncio.run(consume(bootstrap, [TopicPartition("large", p) for p in range(3)], 9,
                              max_partition_fetch_bytes=100_000, fetch_max_bytes=200_000))
    for p in range(3):
        assert [r.value for r in got if r.partition == p] == payloads[p]
