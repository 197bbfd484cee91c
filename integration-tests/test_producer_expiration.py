"""producer.id.expiration.ms against a broker process: a silent idempotent producer is forgotten, a busy one is not."""

from __future__ import annotations

import threading

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually
from josef_storage_local import snapshots

TOPIC = "expiring"


def producer_ids(broker) -> set[int]:
    """The producers DescribeProducers lists for the topic's only partition."""
    answer = RawClient(broker.port).call(ApiKey.DESCRIBE_PRODUCERS, 0, {
        "topics": [{"name": TOPIC, "partition_indexes": [0]}]})
    (partition,) = answer.topics[0].partitions
    assert partition.error_code == ErrorCode.none
    return {p.producer_id for p in partition.active_producers}


def idempotent(broker) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True, "linger.ms": 0})


def set_cluster_expiration(broker, ms: int) -> None:
    """The dynamic cluster-wide value, as ``kafka-configs --entity-type brokers --entity-default`` sets it."""
    answer = RawClient(broker.port).call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
        {"resource_type": 4, "resource_name": "", "configs": [
            {"name": "producer.id.expiration.ms", "config_operation": 0, "value": str(ms)}]}]})
    assert answer.responses[0].error_code == ErrorCode.none, answer.responses[0].error_message


def test_a_silent_producer_expires_and_a_busy_one_stays(broker_factory):
    broker = broker_factory(**{"producer.id.expiration.check.interval.ms": "200"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    silent = idempotent(broker)
    silent.produce(TOPIC, b"once", partition=0)
    assert silent.flush(30) == 0
    (silent_id,) = producer_ids(broker)

    stop = threading.Event()
    busy = idempotent(broker)

    def keep_writing() -> None:
        while not stop.is_set():
            busy.produce(TOPIC, b"again", partition=0)
            busy.flush(30)
            stop.wait(0.2)

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        (busy_id,) = eventually(lambda: producer_ids(broker) - {silent_id}, what="the busy producer listed")
        # The default keeps both for a day; a cluster-wide change takes effect at the next check.
        set_cluster_expiration(broker, 3000)
        eventually(lambda: silent_id not in producer_ids(broker), what="the silent producer forgotten")
        assert busy_id in producer_ids(broker)
    finally:
        stop.set()
        writer.join(30)
    assert busy.flush(30) == 0

    # The snapshot written at a clean stop holds what is left, not the forgotten producer.
    assert broker.stop() == 0
    (partition_dir,) = broker.data_dir.rglob(f"{TOPIC}-0")
    latest = snapshots.list_snapshots(partition_dir)[-1]
    assert {e.producer_id for e in snapshots.read_snapshot(partition_dir, latest)} == {busy_id}
