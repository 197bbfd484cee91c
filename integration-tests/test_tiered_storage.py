"""Tiered storage (KIP-405) end to end: segments copied to remote storage, deleted locally, and read back from there by
real clients."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

#: A broker with tiered storage in a directory, visiting its partitions every 200 ms.
TIERED = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "local-dir",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
}
#: Tiny segments, and locally only what is not yet copied plus about one segment.
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": "16384", "local.retention.bytes": "16384",
                "file.delete.delay.ms": "0"}


def wait_for(condition, timeout: float = 60, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # the broker's background work has no event a client can await


def produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    values = [b"%06d-" % i + bytes([i % 251]) * 200 for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096})
    for value in values:
        producer.produce(topic, value, key=b"k%d" % (len(value) % 7))
    assert producer.flush(60) == 0
    return values


def read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None:
            assert message.error() is None, message.error()
            values.append(message.value())
    consumer.close()
    return values


def offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return low, high


def local_start(broker, topic: str) -> int:
    """ListOffsets EARLIEST_LOCAL (-4), as ``kafka-get-offsets.sh --time -4`` asks it."""
    from josef.protocol.api_keys import ApiKey
    from josef.testing import RawClient

    client = RawClient(broker.port)
    try:
        answer = client.call(ApiKey.LIST_OFFSETS, 8, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -4}]}]})
    finally:
        client.close()
    return answer.topics[0].partitions[0].offset


@pytest.fixture
def tiered_broker(broker_factory, tmp_path: Path):
    remote = tmp_path / "remote"
    remote.mkdir()
    return broker_factory(**TIERED, **{"rsm.config.storage.root": str(remote)}), remote


def test_old_segments_move_to_remote_storage_and_are_read_back_from_there(tiered_broker):
    broker, remote = tiered_broker
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("tiered", 1, 1, config=TOPIC_CONFIG)])["tiered"].result(30)
    values = produce(broker.bootstrap_servers, "tiered", 2000)
    # Copied, then deleted locally: the local log starts well above the log start, which stays 0.
    start = wait_for(lambda: local_start(broker, "tiered") > 1000 and local_start(broker, "tiered"),
                     what="old segments to leave the local disk")
    assert offsets(broker.bootstrap_servers, "tiered") == (0, 2000)
    assert any(remote.rglob("*.log")), "segments in the remote directory"
    local = broker.data_dir / "tiered-0"
    assert sum(p.stat().st_size for p in local.glob("*.log")) < 2000 * 200 / 2
    assert read_all(broker.bootstrap_servers, "tiered", 2000) == values
    assert start <= local_start(broker, "tiered")
