"""A broker on the ZooKeeper metadata quorum (josef-metadata-zk), on a real ZooKeeper server: it serves real clients,
keeps its metadata across kill -9, and goes on serving while ZooKeeper is down."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from josef.metadata.meta_properties import read
from josef.testing import eventually
from josef_metadata_zk.testing import read_znode
from test_zookeeper_cluster import quorum_tool


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 3)
    assert producer.flush(60) == 0


def read_back(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """Every partition from offset 0, by kafka-python without a group: a group's coordinator may need __consumer_offsets
    created, a metadata change, which cannot commit while ZooKeeper is down (in Kafka neither)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             consumer_timeout_ms=30_000)
    consumer.assign([KafkaTopicPartition(topic, p) for p in range(3)])
    for p in range(3):
        consumer.seek(KafkaTopicPartition(topic, p), 0)
    values: list[bytes] = []
    try:
        for message in consumer:
            values.append(message.value)
            if len(values) >= count:
                break
    finally:
        consumer.close()
    return sorted(values)


def create_topic(bootstrap: str, name: str, timeout: float = 30) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(timeout)


@pytest.fixture
def zk_broker(broker_factory, zk_connect):
    def make(data_dir=None):
        return broker_factory(data_dir, **{"metadata.quorum": "zookeeper", "zookeeper.connect": zk_connect})
    return make


def test_a_broker_on_zookeeper_serves_clients_and_keeps_everything_across_kill_9(zk_broker, zk_connect):
    broker = zk_broker()
    create_topic(broker.bootstrap_servers, "on-zk")
    values = [b"record-%04d" % i for i in range(300)]
    produce(broker.bootstrap_servers, "on-zk", values)
    assert json.loads(read_znode(zk_connect, "/controller"))["brokerid"] == 1
    assert json.loads(read_znode(zk_connect, "/cluster/id"))["id"] == read(broker.data_dir).cluster_id
    broker.kill()
    broker.start()  # after kill -9 its old session holds /controller until it expires: the restart waits for it
    assert read_znode(zk_connect, "/controller_epoch") == b"2"
    assert read_back(broker.bootstrap_servers, "on-zk", len(values)) == sorted(values)
    create_topic(broker.bootstrap_servers, "after-restart")  # the restarted node is the controller again
    status = quorum_tool(broker.bootstrap_servers, "--status")  # answered by the node's own controller
    assert "LeaderId:               1\n" in status and "LeaderEpoch:            2\n" in status, status


def test_the_broker_goes_on_serving_while_zookeeper_is_down_and_metadata_changes_resume(zk_broker, zookeeper):
    broker = zk_broker()
    create_topic(broker.bootstrap_servers, "through-outage")
    before = [b"before-%04d" % i for i in range(100)]
    produce(broker.bootstrap_servers, "through-outage", before)
    [server] = zookeeper.servers
    server.stop()  # by PID
    try:
        during = [b"during-%04d" % i for i in range(100)]
        produce(broker.bootstrap_servers, "through-outage", during)  # existing partitions need no metadata change
        assert read_back(broker.bootstrap_servers, "through-outage", 200) == sorted(before + during)
        with pytest.raises(Exception):  # a metadata change cannot commit while ZooKeeper is away
            create_topic(broker.bootstrap_servers, "during-outage", timeout=5)
    finally:
        server.start()
        server.wait_serving()
    create_topic(broker.bootstrap_servers, "after-outage", timeout=60)
    after = [b"after-%04d" % i for i in range(100)]
    produce(broker.bootstrap_servers, "after-outage", after)
    assert read_back(broker.bootstrap_servers, "after-outage", 100) == sorted(after)


def test_a_cluster_of_kafka_3_zookeeper_mode_server_properties_runs_on_zookeeper(josef_cluster, zk_connect):
    """Three Kafka 3.x ZooKeeper-mode ``server.properties``: ``broker.id``, ``zookeeper.connect``, one PLAINTEXT
    listener; no ``process.roles``, ``metadata.quorum`` nor controller listener. Every node may be elected, as in
    Kafka 3.x, and the others reach the controller on its broker listener, which ``/controller`` names."""
    cluster = josef_cluster(combined=3, start=False)
    for node in cluster.nodes:
        plaintext = node.listener("PLAINTEXT")
        for key in ("node.id", "process.roles", "controller.quorum.voters", "controller.listener.names",
                    "listener.security.protocol.map", "metadata.quorum"):
            node.properties.pop(key, None)
        node.properties.update({"broker.id": str(node.node_id), "zookeeper.connect": zk_connect,
                                "zookeeper.session.timeout.ms": "6000",
                                "listeners": f"PLAINTEXT://{plaintext[0]}:{plaintext[1]}"})
    cluster.start()
    controller = json.loads(read_znode(zk_connect, "/controller"))
    first = cluster.node(controller["brokerid"])
    assert controller["endpoints"] == [f"PLAINTEXT://{first.bootstrap_server}"]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("kafka-3", 3, 3)])["kafka-3"].result(30)
    values = [b"record-%04d" % i for i in range(300)]
    produce(cluster.bootstrap_servers, "kafka-3", values)
    first.kill()  # its session expires, another node is elected and the brokers follow it there
    eventually(lambda: json.loads(read_znode(zk_connect, "/controller") or b'{"brokerid": -1}')["brokerid"]
               not in (-1, first.node_id), 60, what="another node elected controller")
    survivors = ",".join(n.bootstrap_server for n in cluster.nodes if n is not first)
    create_topic(survivors, "after-failover", timeout=60)
    first.start()
    assert read_back(cluster.bootstrap_servers, "kafka-3", len(values)) == sorted(values)
