"""Exactly once through crashes: a consume-transform-produce application and a transaction coordinator, killed.

The application (``txn_workers.py``) runs in its own process and is
SIGKILLed by PID at random points, mid-transaction or between transactions,
then restarted with the same transactional id. The output topic, read with
``read_committed``, must then hold every input record exactly once: the
restarted worker fences its predecessor, its open transaction is aborted,
and it resumes from the offsets committed atomically with its last
committed transaction. It runs against one broker and against three
(``brokers``), where the coordinators and the data partitions are spread
over different brokers.

On three brokers the transaction coordinator's broker is also SIGKILLed
in the middle of a transaction: the producer finds the new coordinator,
which loaded the transaction from the replicated ``__transaction_state``,
and commits; nothing is lost or doubled.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.coordinator.hashing import partition_for
from josef.testing import eventually
from txn_workers import TransformWorker

PARTITIONS = 3
RECORDS = 3000
TXN_FAST = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


def create_topics(bootstrap: str, *names: str, replication: int = -1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, PARTITIONS, replication) for name in names])
    for future in futures.values():
        future.result(30)


def produce_input(bootstrap: str, topic: str, count: int) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    values = [b"record-%05d" % i for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(topic, value, key=str(i).encode(), partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    return values


def read_committed(bootstrap: str, topic: str, expected: int, timeout: float = 120) -> list[bytes]:
    """Every value of ``topic`` a read_committed consumer sees, once at least ``expected`` arrived and the LSO is reached."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"checker-{time.monotonic_ns()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.queue.backoff.ms": 10})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []

        def done() -> bool:
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                values.append(message.value())
            if len(values) < expected:
                return False
            positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
            stable = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)]
            return all(tp.offset >= end for tp, end in zip(positions, stable))
        eventually(done, timeout=timeout, what=f"{expected} committed records in {topic}")
        return values
    finally:
        consumer.close()


def check_exactly_once(inputs: list[bytes], outputs: list[bytes]) -> None:
    doubled = [value for value, n in Counter(outputs).items() if n > 1]
    assert not doubled, f"{len(doubled)} records were written twice, e.g. {doubled[:3]}"
    assert sorted(outputs) == sorted(value.upper() for value in inputs)


@pytest.mark.timeout(420)
def test_consume_transform_produce_killed_at_random_points_writes_every_record_once(brokers_factory):
    brokers = brokers_factory(**TXN_FAST)
    bootstrap = brokers.bootstrap_servers
    create_topics(bootstrap, "ctp-in", "ctp-out")
    inputs = produce_input(bootstrap, "ctp-in", RECORDS)
    rng = random.Random(12)
    kills = 0
    for _ in range(5):
        worker = TransformWorker(bootstrap, "ctp-in", "ctp-out")
        try:
            worker.wait_for_commits(rng.randint(1, 6))
            time.sleep(rng.uniform(0, 0.3))  # not synchronisation: where in a transaction the kill lands is random
        finally:
            worker.kill()
            kills += 1
    worker = TransformWorker(bootstrap, "ctp-in", "ctp-out")
    try:
        outputs = read_committed(bootstrap, "ctp-out", RECORDS)
    finally:
        assert worker.stop() == 0, "".join(worker.stderr[-30:])
    assert kills == 5
    check_exactly_once(inputs, outputs)
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "raw", "isolation.level": "read_uncommitted"})
    try:
        highs = [uncommitted.get_watermark_offsets(TopicPartition("ctp-out", p), timeout=10)[1] for p in range(PARTITIONS)]
    finally:
        uncommitted.close()
    # The aborted attempts and the markers are in the log, hidden from read_committed consumers.
    assert sum(highs) > RECORDS


def transaction_coordinator(cluster, transactional_id: str) -> int:
    """The broker leading the ``__transaction_state`` partition of ``transactional_id`` (50 partitions by default)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
    return topic.partitions[partition_for(transactional_id, len(topic.partitions))].leader


@pytest.mark.timeout(300)
def test_a_transaction_survives_its_coordinators_broker_being_killed(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **{
        "default.replication.factor": "3", "min.insync.replicas": "2", "offsets.topic.replication.factor": "3",
        "broker.session.timeout.ms": "4000", "broker.heartbeat.interval.ms": "200",
        "replica.lag.time.max.ms": "2000", **TXN_FAST})
    bootstrap = cluster.bootstrap_servers
    create_topics(bootstrap, "coord-kill", replication=3)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "survivor", "linger.ms": 5,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    coordinator = transaction_coordinator(cluster, "survivor")
    expected = []
    for round_ in range(3):
        producer.begin_transaction()
        for i in range(200):
            value = b"r%d-%d" % (round_, i)
            producer.produce("coord-kill", value, partition=i % PARTITIONS)
            expected.append(value)
        assert producer.flush(60) == 0
        if round_ == 1:
            cluster.node(coordinator).kill()  # mid-transaction: its partitions are added, its records written
            eventually(lambda: transaction_coordinator(cluster, "survivor") not in (coordinator, -1), timeout=60,
                       what="a new transaction coordinator")
        producer.commit_transaction(120)
    producer.begin_transaction()
    producer.produce("coord-kill", b"aborted", partition=0)
    assert producer.flush(60) == 0
    producer.abort_transaction(60)
    cluster.node(coordinator).start()
    outputs = read_committed(bootstrap, "coord-kill", len(expected))
    assert sorted(outputs) == sorted(expected)
