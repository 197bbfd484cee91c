"""A failed log directory goes offline alone (KIP-858): its partitions stop, the others keep serving, leaders move away.

One controller and three brokers as separate processes (``josef_cluster``).
Broker 2 has two log directories: its usual one and a 3 MB tmpfs that the
test mounts (root is needed to mount; CI runs as root) and then fills up
with a topic moved there by AlterReplicaLogDirs. The full disk (ENOSPC)
takes the tmpfs directory offline: broker 2 stops serving its partitions
there and names the directory in its heartbeat; the controller, which knows
the directory of every replica (AssignReplicasToDirs), takes exactly those
replicas out of leadership and the ISR, so an ``acks=all`` producer goes on.
The partitions in broker 2's other directory keep serving, leaders included.
A checker then reads every acknowledged record back.
"""

from __future__ import annotations

import os

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually
from test_replication import FAST, Load, check_every_acknowledged_record, read_all

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")

#: Replicas of the replicated topic: broker 2 leads partitions 0 (on the tmpfs) and 3 (on its healthy disk).
SPREAD = [[2, 3, 4], [3, 2, 4], [4, 3, 2], [2, 4, 3], [3, 4, 2], [4, 2, 3]]
ON_TMPFS = [0, 1, 2]


def create(cluster, topic, assignment, **config):
    # Small preallocated indexes: a move copies them whole, and the tmpfs is small.
    config = {"segment.index.bytes": "65536", **config}
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    client.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment, config=config)])[topic].result(30)


def partitions_of(cluster, topic):
    """``{partition: (leader, isr)}`` as the brokers' Metadata tells it."""
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(topic, timeout=10)
    return {p.id: (p.leader, tuple(sorted(p.isrs))) for p in metadata.topics[topic].partitions.values()}


def move(client, path, topic, partitions):
    """AlterReplicaLogDirs on one broker, until it hosts the partitions (they appear there soon after creation)."""
    codes = []

    def moved():
        response = client.call(ApiKey.ALTER_REPLICA_LOG_DIRS, 2, {"dirs": [
            {"path": str(path), "topics": [{"name": topic, "partitions": partitions}]}]})
        codes[:] = [p.error_code for t in response.results for p in t.partitions]
        return codes == [ErrorCode.none] * len(partitions)
    try:
        eventually(moved, what=f"moving {topic} {partitions} into {path}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {codes}") from None


def log_dirs(client):
    """``{log dir: (error code, {(topic, partition)...})}`` from DescribeLogDirs."""
    response = client.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
    return {r.log_dir: (r.error_code, {(t.name, p.partition_index) for t in r.topics for p in t.partitions})
            for r in response.results}


def produce_one(cluster, topic, partition, value, acks="all"):
    """The error of one delivery, or None."""
    results = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": acks, "retries": 0,
                         "linger.ms": 0, "message.timeout.ms": 20000, "message.max.bytes": 1_000_000})
    producer.produce(topic, value, partition=partition, on_delivery=lambda err, msg: results.append(err))
    producer.flush(30)
    assert len(results) == 1
    return results[0]


def test_a_full_disk_takes_its_log_dir_offline_alone_and_leaders_move_away(small_disk, tmp_path, josef_cluster):
    # small_disk first: it is unmounted after the cluster stops
    healthy = tmp_path / "broker-2-data"
    cluster = josef_cluster(controllers=1, brokers=3, **FAST,
                            node_overrides={2: {"log.dirs": f"{healthy},{small_disk}"}})
    broker = cluster.node(2)
    create(cluster, "spread", SPREAD, **{"min.insync.replicas": "2"})
    create(cluster, "local", [[2], [2]])
    create(cluster, "filler", [[2]], **{"segment.bytes": "100000000"})
    client = RawClient(broker.bound_port)
    try:
        move(client, healthy, "spread", [3, 4, 5])
        move(client, small_disk, "spread", ON_TMPFS)
        move(client, healthy, "local", [0])
        move(client, small_disk, "local", [1])
        move(client, small_disk, "filler", [0])
        eventually(lambda: all(len(isr) == 3 for _, isr in partitions_of(cluster, "spread").values()),
                   what="every replica of spread in sync")
        assert partitions_of(cluster, "spread")[0][0] == 2

        with Load(cluster, "spread", len(SPREAD)) as load:
            # Fill the tmpfs: appends fail with KAFKA_STORAGE_ERROR once it is full.
            for i in range(12):  # 4.8 MB into 3 MB
                error = produce_one(cluster, "filler", 0, bytes([i]) * 400_000, acks="1")
                if error is not None:
                    break
            assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR
            assert broker.wait_for_log(f"log directory {small_disk} is offline")

            # Broker 2 leaves the leadership and ISRs of its replicas on the tmpfs, and only those.
            eventually(lambda: all(leader in (3, 4) and 2 not in isr for p, (leader, isr)
                                   in partitions_of(cluster, "spread").items() if p in ON_TMPFS),
                       what="broker 2 leaving the leadership and ISRs of its partitions on the failed disk")
            spread = partitions_of(cluster, "spread")
            assert spread[3][0] == 2 and all(2 in spread[p][1] for p in (3, 4, 5))
            load.progress(100, on=range(len(SPREAD)))  # acks=all producers go on, on every partition

            # On broker 2 itself: the healthy directory serves; a partition of the failed one with no other
            # replica is left without a leader, as Kafka leaves it.
            assert produce_one(cluster, "local", 0, b"still here") is None
            local = partitions_of(cluster, "local")
            assert (local[0][0], local[1][0]) == (2, -1)
            dirs = log_dirs(client)
            assert dirs[str(small_disk)] == (ErrorCode.kafka_storage_error, set())
            code, hosted = dirs[str(healthy)]
            assert code == ErrorCode.none
            assert {("local", 0), ("spread", 3), ("spread", 4), ("spread", 5)} <= hosted
            load.progress(100, on=range(len(SPREAD)))
        assert broker.running
        acknowledged = check_every_acknowledged_record(load, read_all(cluster, load.topic, load.partitions))
        assert acknowledged >= 600
        print(f"\n{acknowledged} acknowledged records read back; {len(load.failed)} deliveries failed")
    finally:
        client.close()
