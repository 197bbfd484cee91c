"""Rolled segments are flushed in the background: after kill -9 the broker recovers only the active segment."""

from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.testing import eventually

pytestmark = pytest.mark.storage

COUNT = 30_000
TOPIC = "rolled"
SEGMENT_BYTES = 100_000
#: The producer's requests stay well below segment.bytes, so an append always fits an empty segment and the
#: broker rolls before any append that would take a segment past SEGMENT_BYTES: no segment exceeds it.
MAX_REQUEST_BYTES = 50_000


def value(i: int) -> bytes:
    return f"record-{i:06d}".encode() * 5


def checkpointed_recovery_point(data_dir: Path) -> int | None:
    path = data_dir / "recovery-point-offset-checkpoint"
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:
        topic, partition, offset = line.split()
        if (topic, partition) == (TOPIC, "0"):
            return int(offset)
    return None


def segment_bases(data_dir: Path) -> list[int]:
    return sorted(int(path.stem) for path in (data_dir / f"{TOPIC}-0").glob("*.log"))


def test_kill_9_after_many_rolls_recovers_only_the_active_segment_and_loses_no_acked_record(broker_factory):
    broker = broker_factory(**{"log.flush.offset.checkpoint.interval.ms": "200"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"segment.bytes": str(SEGMENT_BYTES)})])[TOPIC].result(30)
    acked = []
    # However the client batches, the records land uncompressed in requests of at most MAX_REQUEST_BYTES.
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 5,
                         "compression.type": "none", "batch.size": 16_384, "message.max.bytes": MAX_REQUEST_BYTES})

    def delivered(err, msg):
        assert err is None, err
        acked.append((msg.offset(), msg.value()))

    for i in range(COUNT):
        producer.produce(TOPIC, value=value(i), partition=0, on_delivery=delivered)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert len(acked) == COUNT

    bases = segment_bases(broker.data_dir)
    # The values alone take this many bytes of log; in segments of at most SEGMENT_BYTES that is at least
    # ceil(written / SEGMENT_BYTES) segments (20 here), whatever the batching.
    written = sum(len(value(i)) for i in range(COUNT))
    sizes = {base: (broker.data_dir / f"{TOPIC}-0" / f"{base:020d}.log").stat().st_size for base in bases}
    assert all(size <= SEGMENT_BYTES for size in sizes.values()), sizes
    assert len(bases) >= -(-written // SEGMENT_BYTES) >= 10, sizes
    # Without any flush.ms or clean stop, the background thread moved the recovery point to the last roll.
    eventually(lambda: checkpointed_recovery_point(broker.data_dir) == bases[-1], timeout=30,
               what=f"the recovery point checkpoint reaching the active segment {bases[-1]}")
    broker.kill()

    broker.start()
    recovered = [line for line in broker.log if f"{TOPIC}-0: recovering unflushed segment" in line]
    assert [line.split("segment ")[1].split()[0] for line in recovered] == [str(bases[-1])], recovered
    assert not any(f"{TOPIC}-0: rebuilding" in line for line in broker.log)

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got = []
    try:
        while len(got) < COUNT:
            messages = consumer.consume(5000, timeout=10)
            assert messages, f"only {len(got)} records after restart"
            got.extend((m.offset(), m.value()) for m in messages if m.error() is None)
    finally:
        consumer.close()
    assert sorted(got) == sorted(acked)
