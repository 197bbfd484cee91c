"""Kafka 3.x's ZooKeeper layout (josef_metadata_zk.kafka_layout) as the active controller writes it, read back with a
plain kazoo session as zookeeper-shell would, on a real ZooKeeper server."""

from __future__ import annotations

import json
import threading
import uuid

import anyio
import pytest
from kazoo.client import KazooClient

from josef.acls import AclOperation, AclPermissionType, PatternType, ResourceType
from josef.metadata.records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ConfigRecord,
    EntityData,
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UserScramCredentialRecord,
)
from josef.node.server_properties import load_config
from josef.testing.metadata_quorum import RecordingListener
from josef_metadata_zk.znodes import split_connect
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum

pytestmark = pytest.mark.anyio
TIMEOUT_S = 60


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def shell(zk_connect):
    hosts, chroot = split_connect(zk_connect)
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)

    def get(path: str):
        """The znode's JSON, None while it does not exist: what ``zookeeper-shell get`` shows."""
        data = zk.exists(chroot + path) and zk.get(chroot + path)[0]
        return json.loads(data) if data else None
    get.exists = lambda path: zk.exists(chroot + path) is not None
    yield get
    zk.stop()
    zk.close()


async def eventually(check, what: str) -> None:
    """Until ``check()`` holds, for 10 s: the controller writes the layout in a background task, which nothing
    outside the quorum can await."""
    with anyio.move_on_after(10):
        while not check():
            await anyio.sleep(0.05)
        return
    raise AssertionError(f"not within 10 s: {what}")


def node(connect: str, node_id: int) -> ZooKeeperQuorum:
    return ZooKeeperQuorum(load_config(None, {"node.id": str(node_id), "metadata.quorum": "zookeeper",
                                              "zookeeper.connect": connect, "log.dirs": "/nonexistent"}))


async def started(q: ZooKeeperQuorum, tg) -> RecordingListener:
    listener = RecordingListener()
    listener.loop_thread = threading.get_ident()
    await q.start(listener, tg)
    return listener


async def test_the_controller_keeps_kafka_s_znodes_current_and_a_new_one_rewrites_them(zk_connect, shell):
    exists = shell.exists
    topic_id, acl_id = uuid.uuid4(), uuid.uuid4()
    with anyio.fail_after(TIMEOUT_S):
        first, second = node(zk_connect, 1), node(zk_connect, 2)
        async with anyio.create_task_group() as tg:
            try:
                await started(first, tg)
                await first.append([
                    TopicRecord(name="orders", topic_id=topic_id),
                    *(PartitionRecord(partition_id=p, topic_id=topic_id, replicas=(1, 2), isr=(1, 2), leader=1,
                                    leader_epoch=0, partition_epoch=0)
                      for p in range(2)),
                    ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value="1000"),
                    ConfigRecord(resource_type=4, resource_name="", name="log.cleaner.threads", value="2"),
                    AccessControlEntryRecord(id=acl_id, resource_type=ResourceType.TOPIC, resource_name="orders",
                                             pattern_type=PatternType.LITERAL, principal="User:alice", host="*",
                                             operation=AclOperation.READ, permission_type=AclPermissionType.ALLOW),
                    AccessControlEntryRecord(id=uuid.uuid4(), resource_type=ResourceType.TRANSACTIONAL_ID,
                                             resource_name="tx-", pattern_type=PatternType.PREFIXED,
                                             principal="User:bob", host="*", operation=AclOperation.WRITE,
                                             permission_type=AclPermissionType.DENY),
                    FeatureLevelRecord(name="metadata.version", feature_level=27),
                    ClientQuotaRecord(entity=(EntityData(entity_type="user", entity_name="alice"),),
                                      key="producer_byte_rate", value=1024.0),
                    ClientQuotaRecord(entity=(EntityData(entity_type="user", entity_name="alice"),
                                              EntityData(entity_type="client-id", entity_name="app")),
                                      key="consumer_byte_rate", value=2048.0),
                    ClientQuotaRecord(entity=(EntityData(entity_type="client-id", entity_name=None),),
                                      key="request_percentage", value=50.0),
                    UserScramCredentialRecord(name="alice", mechanism=1, salt=b"salt", stored_key=b"stored",
                                              server_key=b"server", iterations=4096),
                    ProducerIdsRecord(broker_id=2, broker_epoch=5, next_producer_id=3000)])
                await eventually(lambda: shell("/latest_producer_id_block") is not None, "the last znode")
                assert shell("/brokers/topics/orders") == {
                    "version": 3, "topic_id": first._listener.current_image().topics["orders"].topic_id,
                    "partitions": {"0": [1, 2], "1": [1, 2]}, "adding_replicas": {}, "removing_replicas": {}}
                assert shell("/brokers/topics/orders/partitions/1/state") == {
                    "controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0, "isr": [1, 2]}
                assert shell("/config/topics/orders") == {"version": 1, "config": {"retention.ms": "1000"}}
                assert shell("/config/brokers/<default>") == {"version": 1, "config": {"log.cleaner.threads": "2"}}
                assert shell("/kafka-acl/Topic/orders") == {"version": 1, "acls": [
                    {"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "*"}]}
                assert shell("/kafka-acl-extended/prefixed/TransactionalId/tx-")["acls"][0]["permissionType"] == "Deny"
                assert shell("/feature")["features"]["metadata.version"]["max_version_level"] == 27
                assert shell("/latest_producer_id_block") == {"version": 1, "broker": 2, "block_start": "2000",
                                                               "block_end": "2999"}
                assert shell("/config/users/alice") == {"version": 1, "config": {
                    "producer_byte_rate": "1024.0",
                    "SCRAM-SHA-256": "salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=4096"}}
                assert shell("/config/users/alice/clients/app") == {"version": 1,
                                                                    "config": {"consumer_byte_rate": "2048.0"}}
                assert shell("/config/clients/<default>") == {"version": 1, "config": {"request_percentage": "50.0"}}
                assert all(exists(path) for path in ("/admin/delete_topics", "/config/changes", "/brokers/seqid",
                                                     "/isr_change_notification", "/kafka-acl-extended-changes"))

                # A leader change rewrites the partition's state; the first node goes, the second is elected and
                # writes the whole view again under its controller epoch.
                await first.append([PartitionChangeRecord(partition_id=0, topic_id=topic_id, leader=2, isr=(2,))])
                await eventually(lambda: shell("/brokers/topics/orders/partitions/0/state")["leader"] == 2, "leader 2")
                assert shell("/brokers/topics/orders/partitions/0/state")["isr"] == [2]
                await started(second, tg)
                await first.close()
                await eventually(lambda: shell("/brokers/topics/orders/partitions/1/state")["controller_epoch"] == 2,
                                 "the new controller's epoch in every partition state")
                await second.append([RemoveTopicRecord(topic_id=topic_id)])
                await eventually(lambda: shell("/brokers/topics/orders") is None and shell("/config/topics/orders") is None,
                                 "the deleted topic and its configs gone")
                assert shell("/kafka-acl/Topic/orders") is not None, "ACLs outlive topics, as in Kafka"
                await second.append([RemoveAccessControlEntryRecord(id=acl_id)])
                await eventually(lambda: shell("/kafka-acl/Topic/orders") is None, "the resource's last ACL removed")
                await second.append([RemoveUserScramCredentialRecord(name="alice", mechanism=1),
                                     ClientQuotaRecord(entity=(EntityData(entity_type="user", entity_name="alice"),),
                                                       key="producer_byte_rate", value=0.0, remove=True)])
                await eventually(lambda: shell("/config/users/alice") == {"version": 1, "config": {}},
                                 "alice's znode without its credential and quota, kept for its client's quota")
                assert shell("/config/users/alice/clients/app")["config"] == {"consumer_byte_rate": "2048.0"}
                assert shell("/kafka-acl-extended/prefixed/TransactionalId/tx-") is not None
            finally:
                tg.cancel_scope.cancel()
                await first.close()
                await second.close()
