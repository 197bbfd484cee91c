"""Eligible leader replicas (KIP-966), on by default as in Kafka 4.1, across real broker processes.

A new cluster finalizes ``eligible.leader.replicas.version=1`` and records a
cluster-level ``min.insync.replicas``. Then one partition on brokers 2, 3, 4
(``min.insync.replicas=2``) loses broker 4 to a pause while an idempotent
``acks=all`` producer writes: 4 falls behind and out of the ISR, which is
still at min ISR, so 4 is not eligible. Broker 3 is paused next: the ISR
falls below min ISR, the high watermark stops, and 3 joins the ELR with
every committed record. The last ISR member, 2, is SIGKILLed. Broker 4
comes back first and must not lead (it lacks acknowledged records); 3 comes
back and is elected from the ELR. Every acknowledged record is then read.
"""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

pytestmark = pytest.mark.metadata

FAST = {
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1000",
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "1000",
    "replica.fetch.backoff.ms": "200",
    "auto.leader.rebalance.enable": "false",
    "min.insync.replicas": "2",
}
TOPIC = "elr"
ELR = "eligible.leader.replicas.version"


def call(cluster, node_id, api, version, body):
    """One request to broker ``node_id`` (one that is not paused: a paused one would never answer)."""
    raw = RawClient(cluster.node(node_id).listener("PLAINTEXT")[1])
    try:
        return raw.call(api, version, body)
    finally:
        raw.close()


def partition_state(cluster, node_id):
    """``(leader, isr, elr)`` of the topic's partition, as broker ``node_id``'s DescribeTopicPartitions tells it;
    None while the broker has not learnt of the topic (the controller answered its creation, the broker may lag)."""
    [described] = call(cluster, node_id, ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {
        "topics": [{"name": TOPIC}], "response_partition_limit": 10, "cursor": None}).topics
    if not described.partitions:
        return None
    p = described.partitions[0]
    return p.leader_id, tuple(sorted(p.isr_nodes)), tuple(sorted(p.eligible_leader_replicas or ()))


class Writer:
    """An idempotent acks=all producer writing numbered values to partition 0 until stopped; keeps what was acked."""

    def __init__(self, cluster) -> None:
        self.producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 120000})
        self.acked: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, error, message) -> None:
        if error is None:
            with self._lock:
                self.acked.append(message.value())

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.producer.produce(TOPIC, f"v-{n}".encode(), partition=0, on_delivery=self._delivered)
            n += 1
            self.producer.poll(0.01)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def acked_more(self, than: int) -> bool:
        self.producer.poll(0)
        return self.count() > than

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(150) == 0, "records left unacknowledged"
        return list(self.acked)


def read_all(cluster) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "checker",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    try:
        end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1]
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        values: list[tuple[int, bytes]] = []

        def done() -> bool:
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                values.append((message.offset(), message.value()))
            return (values[-1][0] + 1 if values else 0) >= end
        eventually(done, timeout=120, what="reading the partition to its end")
        return [value for _, value in values]
    finally:
        consumer.close()


def test_a_new_cluster_elects_from_the_elr_and_never_an_out_of_sync_replica(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **FAST)
    answer = call(cluster, 2, ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    finalized = {f.name: f.max_version_level for f in answer.finalized_features}
    assert finalized[ELR] == 1 and finalized["metadata.version"] == 26
    [resource] = call(cluster, 3, ApiKey.DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": ["min.insync.replicas"]}],
        "include_synonyms": False, "include_documentation": False}).results
    assert resource.error_code == ErrorCode.none
    assert [(c.name, c.value) for c in resource.configs] == [("min.insync.replicas", "2")]  # the static value

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[2, 3, 4]])])[TOPIC].result(30)
    eventually(lambda: partition_state(cluster, 2) == (2, (2, 3, 4), ()), what="every replica in sync")
    writer = Writer(cluster)
    try:
        eventually(lambda: writer.acked_more(100), what="writes acknowledged")
        cluster.node(4).pause()  # falls behind: out of the ISR, which is still at min ISR, so not eligible
        eventually(lambda: partition_state(cluster, 2) == (2, (2, 3), ()), what="broker 4 out of the ISR")
        before = writer.count()
        eventually(lambda: writer.acked_more(before + 100), what="writes acknowledged without broker 4")
        cluster.node(3).pause()  # below min ISR: 3 holds every committed record and is eligible
        eventually(lambda: partition_state(cluster, 2) == (2, (2,), (3,)), what="broker 3 in the ELR")
        cluster.node(2).kill()  # the last ISR member, SIGKILLed
        cluster.node(4).resume()  # back and unfenced, but it lacks acknowledged records: it must not lead

        def fenced_2_and_unfenced_4():
            answer = call(cluster, 4, ApiKey.METADATA, 12, {
                "topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False})
            brokers = {b.node_id for b in answer.brokers}
            if 4 in brokers and 2 not in brokers:
                return (answer.topics[0].partitions[0].leader_id,)
            return None

        # One Metadata answer: 2 fenced, 4 unfenced and, in the same image, the partition still without a leader.
        assert eventually(fenced_2_and_unfenced_4, what="broker 2 fenced and broker 4 unfenced") == (-1,)
        # 2 joined the ELR as it left the ISR (the controller cannot tell a SIGKILL from a pause); restarted
        # uncleanly, it would leave the ELR at its registration.
        assert partition_state(cluster, 4) == (-1, (), (2, 3))
        cluster.node(3).resume()
        eventually(lambda: partition_state(cluster, 4)[0] == 3, what="broker 3 elected from the ELR")
        before = writer.count()
        # 4 truncates to 3's log and catches up: the ISR is back at min ISR and writes are acknowledged again.
        eventually(lambda: writer.acked_more(before + 100), timeout=60, what="writes acknowledged by 3 and 4")
    finally:
        acked = writer.stop()
    stored = read_all(cluster)
    assert len(stored) == len(set(stored)), "a record is stored twice"
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    assert len(acked) > 300
