"""Migrating a running ZooKeeper-backed cluster to KRaft (KIP-866): ``josef metadata migrate``.

Three combined ZooKeeper-mode nodes hold topics, a topic config, a client quota, a consumer group's offsets, a
transactional producer's state, ACLs and SCRAM credentials; three new KRaft controllers take the metadata over under a running producer and consumer,
the brokers are restarted one at a time as KRaft brokers, then the controllers without the migration. Every
acknowledged record is read back, the producer never fails a delivery, and everything the cluster held is there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from josef_client import Admin as JosefAdmin
from josef_metadata_zk.testing import read_znode
from test_replication import (
    FAST,
    Load,
    admin,
    check_every_acknowledged_record,
    create_topic,
    full_isr,
    read_all,
    zookeeper_settings,
)

from josef.node.cluster import NodeProcess, free_ports
from josef.testing import eventually

AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:ANONYMOUS"}
KRAFT_IDS = (3000, 3001, 3002)
QUOTA_ENTITY = (("user", "alice"),)


def controller_in_zookeeper(zk_connect: str) -> int:
    data = read_znode(zk_connect, "/controller")
    return json.loads(data)["brokerid"] if data else -1


def josef(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=120)


def producer_id(bootstrap: str, transactional_id: str) -> int:
    described = josef("transactions", "--bootstrap-server", bootstrap, "describe", "--transactional-id",
                      transactional_id)
    assert described.returncode == 0, described.stderr
    header, row = described.stdout.splitlines()[:2]
    return int(row.split()[header.split().index("ProducerId")])


def kraft_controllers(tmp_path, zk_connect: str) -> tuple[list[NodeProcess], str, list[str]]:
    """The new KRaft controllers as an operator writes them, migrating from ``zk_connect``: the nodes (not started),
    ``controller.quorum.voters``, and their properties files."""
    ports = dict(zip(KRAFT_IDS, free_ports(len(KRAFT_IDS))))
    voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in ports.items())
    controllers = [NodeProcess(i, ("controller",), {
        "node.id": str(i), "process.roles": "controller", "listeners": f"CONTROLLER://127.0.0.1:{ports[i]}",
        "controller.listener.names": "CONTROLLER", "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
        "controller.quorum.voters": voters, "log.dirs": str(tmp_path / f"kraft-{i}" / "data"),
        "zookeeper.connect": zk_connect, "zookeeper.metadata.migration.enable": "true", **FAST, **AUTHORIZER},
        tmp_path / f"kraft-{i}") for i in KRAFT_IDS]
    return controllers, voters, [str(node.write_properties()) for node in controllers]


def migrate(*paths: str, rollback: bool = False) -> subprocess.CompletedProcess[str]:
    return josef("metadata", "migrate", *(arg for path in paths for arg in ("-c", path)),
                 *(["--rollback"] if rollback else []))


def start_kraft_controllers(controllers: list[NodeProcess], zk_connect: str) -> None:
    """Start them together (a quorum needs its voters up) and wait until the active one holds ZooKeeper's /controller."""
    for node in controllers:
        node.start(wait=False)
    for node in controllers:
        node.wait_ready()
    eventually(lambda: controller_in_zookeeper(zk_connect) in KRAFT_IDS, 60, what="a KRaft controller in /controller")


class LiveConsumer:
    """A group member consuming the topic with auto-commit until stopped; counts what it got, keeps any error."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "live", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": True, "auto.commit.interval.ms": 200})
        self.consumer.subscribe([topic])
        self.count = 0
        self.fatal: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self.consumer.consume(500, timeout=0.2):
                error = message.error()
                if error is None:
                    self.count += 1
                elif error.fatal():
                    self.fatal.append(str(error))

    def progress(self, more: int = 200) -> None:
        target = self.count + more
        eventually(lambda: self.count >= target, 60, what=f"the live consumer to get {more} more records")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def test_a_zookeeper_cluster_migrates_to_kraft_under_load_and_loses_nothing(josef_cluster, zk_connect, tmp_path):
    cluster = josef_cluster(combined=3, **FAST, **AUTHORIZER, **zookeeper_settings(zk_connect))
    bootstrap = cluster.bootstrap_servers
    client = admin(cluster)
    create_topic(cluster, "orders")
    create_topic(cluster, "payments")
    full_isr(cluster, "orders")
    # What the cluster holds besides data: ACLs, a SCRAM user, a group's offsets, a transactional producer's state.
    acl = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                     AclPermissionType.ALLOW)
    client.create_acls([acl])[acl].result(30)
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          b"alice-secret")
    client.alter_user_scram_credentials([upsert])["alice"].result(30)
    retention = ConfigResource("topic", "orders", incremental_configs=[
        ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([retention])[retention].result(30)
    with JosefAdmin({"bootstrap.servers": bootstrap}) as josef_admin:
        josef_admin.alter_client_quotas({QUOTA_ENTITY: {"producer_byte_rate": 1048576.0}})
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": "committed", "enable.auto.commit": False})
    committed = [TopicPartition("orders", p, 10 + p) for p in range(3)]
    committer.commit(offsets=committed, asynchronous=False)
    committer.close()
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": "payments"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce("payments", b"paid", partition=0)
    transactional.commit_transaction(30)
    first_producer_id = producer_id(bootstrap, "payments")

    controllers, voters, paths = kraft_controllers(tmp_path, zk_connect)
    load = Load(cluster, "orders")
    live = LiveConsumer(bootstrap, "orders")
    try:
        with load:
            live.progress()
            migrated = migrate(*paths)
            assert migrated.returncode == 0, migrated.stderr + migrated.stdout
            assert "is the first snapshot of KRaft controllers 3000, 3001, 3002" in migrated.stdout
            again = migrate(*paths)
            assert again.returncode != 0 and "already" in again.stderr, again.stderr
            start_kraft_controllers(controllers, zk_connect)
            load.progress()
            # Metadata changes go on through the KRaft controller while the brokers are still on ZooKeeper.
            create_topic(cluster, "during")
            full_isr(cluster, "during")
            # ... and are mirrored into ZooKeeper, Kafka's layout included: the rollback point.
            eventually(lambda: read_znode(zk_connect, "/brokers/topics/during") is not None,
                       what="the new topic in ZooKeeper's layout")
            # The active KRaft controller killed: another takes /controller and the mirroring over.
            active = next(node for node in controllers if node.node_id == controller_in_zookeeper(zk_connect))
            active.kill()
            eventually(lambda: controller_in_zookeeper(zk_connect) in set(KRAFT_IDS) - {active.node_id}, 60,
                       what="another KRaft controller named in /controller")
            create_topic(cluster, "after-failover")
            eventually(lambda: read_znode(zk_connect, "/brokers/topics/after-failover") is not None,
                       what="the next topic in ZooKeeper's layout")
            active.start()
            load.progress()
            # The brokers, one at a time, restarted as KRaft brokers: the same ports, data and node ids.
            for node in cluster.nodes:
                node.stop()
                for key in ("metadata.quorum", "zookeeper.connect", "zookeeper.session.timeout.ms"):
                    node.properties.pop(key, None)
                node.properties.update({"process.roles": "broker", "controller.quorum.voters": voters,
                                        "listeners": f"PLAINTEXT://{node.bootstrap_server}"})
                node.roles = ("broker",)
                node.start()
                full_isr(cluster, "orders")
                load.progress()
                live.progress()
            # Finalized: the controllers without the migration; ZooKeeper is no longer written.
            for node in controllers:
                node.stop()
                node.properties.pop("zookeeper.metadata.migration.enable")
                node.properties.pop("zookeeper.connect")
                node.start()
            full_isr(cluster, "orders")
            create_topic(cluster, "after")
            load.progress()
            live.progress()
            assert read_znode(zk_connect, "/brokers/topics/after") is None
        assert not load.failed, f"the producer saw errors: {load.failed[:3]}"
        assert not live.fatal, live.fatal
        acknowledged = check_every_acknowledged_record(load, read_all(cluster, "orders"))
        client = admin(cluster)
        assert {"orders", "payments", "during", "after-failover", "after"} <= set(client.list_topics(timeout=10).topics)
        assert [b for b in client.describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
            AclPermissionType.ANY)).result(30)] == [acl]
        orders = ConfigResource("topic", "orders")
        assert client.describe_configs([orders])[orders].result(30)["retention.ms"].value == "86400000"
        with JosefAdmin({"bootstrap.servers": bootstrap}) as josef_admin:
            assert josef_admin.describe_client_quotas()[QUOTA_ENTITY] == {"producer_byte_rate": 1048576.0}
        described = client.describe_user_scram_credentials(["alice"])["alice"].result(30)
        assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
            (ScramMechanism.SCRAM_SHA_512, 8192)]
        checker = Consumer({"bootstrap.servers": bootstrap, "group.id": "committed"})
        try:
            assert [(tp.partition, tp.offset) for tp in checker.committed(
                [TopicPartition("orders", p) for p in range(3)], timeout=30)] == [(p, 10 + p) for p in range(3)]
        finally:
            checker.close()
        # The transactional id keeps its producer id (its epoch goes up); a new one gets an id from a later block.
        resumed = Producer({"bootstrap.servers": bootstrap, "transactional.id": "payments"})
        resumed.init_transactions(30)
        assert producer_id(bootstrap, "payments") == first_producer_id
        fresh = Producer({"bootstrap.servers": bootstrap, "transactional.id": "refunds"})
        fresh.init_transactions(30)
        fresh.begin_transaction()
        fresh.produce("payments", b"refunded", partition=1)
        fresh.commit_transaction(30)
        assert producer_id(bootstrap, "refunds") > first_producer_id
        print(f"\nmigrated to KRaft under load: {acknowledged} acknowledged records read back, none failed; "
              f"the live consumer got {live.count}")
    finally:
        live.close()
        for node in controllers:
            node.stop()


def test_migrate_refuses_controllers_that_do_not_ask_for_the_migration(tmp_path):
    path = tmp_path / "controller.properties"
    path.write_text("node.id=3000\nprocess.roles=controller\ncontroller.quorum.voters=3000@127.0.0.1:9093\n"
                    "listeners=CONTROLLER://127.0.0.1:9093\ncontroller.listener.names=CONTROLLER\n"
                    f"log.dirs={tmp_path / 'data'}\n")
    refused = josef("metadata", "migrate", "-c", str(path))
    assert refused.returncode == 1
    assert "zookeeper.metadata.migration.enable=true" in refused.stderr, refused.stderr
    assert not (tmp_path / "data").exists()


def test_migrate_names_an_unreachable_zookeeper(tmp_path):
    [port] = free_ports(1)
    path = tmp_path / "controller.properties"
    path.write_text("node.id=3000\nprocess.roles=controller\ncontroller.quorum.voters=3000@127.0.0.1:9093\n"
                    "listeners=CONTROLLER://127.0.0.1:9093\ncontroller.listener.names=CONTROLLER\n"
                    f"log.dirs={tmp_path / 'data'}\nzookeeper.metadata.migration.enable=true\n"
                    f"zookeeper.connect=127.0.0.1:{port}/josef\nzookeeper.connection.timeout.ms=1000\n")
    refused = josef("metadata", "migrate", "-c", str(path))
    assert refused.returncode == 1
    assert f"zookeeper.connect=127.0.0.1:{port}/josef" in refused.stderr, refused.stderr


def test_until_it_is_finalized_a_migration_rolls_back_to_zookeeper(josef_cluster, zk_connect, tmp_path):
    """What the KRaft controllers committed was mirrored into ZooKeeper: rolled back, a ZooKeeper-mode node is
    elected again from that log and the cluster goes on."""
    cluster = josef_cluster(combined=3, **FAST, **zookeeper_settings(zk_connect))
    create_topic(cluster, "before")
    controllers, _, paths = kraft_controllers(tmp_path, zk_connect)
    try:
        assert migrate(*paths).returncode == 0
        start_kraft_controllers(controllers, zk_connect)
        create_topic(cluster, "under-kraft")
        full_isr(cluster, "under-kraft")
    finally:
        for node in controllers:
            node.stop()
    rolled_back = migrate(paths[0], rollback=True)
    assert rolled_back.returncode == 0, rolled_back.stderr
    eventually(lambda: controller_in_zookeeper(zk_connect) in {n.node_id for n in cluster.nodes}, 60,
               what="a ZooKeeper-mode node elected again")
    create_topic(cluster, "after-rollback")
    for topic in ("before", "under-kraft", "after-rollback"):
        full_isr(cluster, topic)
    assert migrate(paths[0], rollback=True).returncode == 1  # nothing left to roll back
