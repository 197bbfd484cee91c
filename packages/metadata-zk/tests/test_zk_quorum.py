"""The ZooKeeper quorum on a real ZooKeeper server, beyond the contract: Kafka 3.x's znodes, a deposed controller that
cannot write, a second node taking over, large commits, and the errors a node stops with."""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from pathlib import Path

import anyio
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from josef.config import ConfigError
from josef.metadata.quorum import NotControllerError
from josef.metadata.records import BrokerEndpoint, BrokerFeature, Endpoint, RegisterBrokerRecord, TopicRecord
from josef.node.server_properties import load_config
from josef.testing import free_ports
from josef.testing.metadata_quorum import RecordingListener, controller_batches, running, topic_records
from josef.testing.tls import TlsFiles
from josef_metadata_zk.commits import CorruptCommitError, read_snapshot_header
from josef_metadata_zk.testing import ZooKeeperEnsemble
from josef_metadata_zk.znodes import COMMIT_PREFIX, METADATA_LOG, METADATA_PARTS, METADATA_SNAPSHOT, split_connect
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum

pytestmark = pytest.mark.anyio
TIMEOUT_S = 60


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def quorum(connect: str, node_id: int = 1, **extra: str) -> ZooKeeperQuorum:
    return ZooKeeperQuorum(load_config(None, {"node.id": str(node_id), "metadata.quorum": "zookeeper",
                                              "zookeeper.connect": connect, "log.dirs": "/nonexistent",
                                              "listeners": "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093",
                                              **extra}))



class Admin:
    """A plain kazoo session on the test's chroot: what an operator's zookeeper-shell sees and does."""

    def __init__(self, connect: str) -> None:
        hosts, self.root = split_connect(connect)
        self.zk = KazooClient(hosts=hosts)
        self.zk.start(timeout=30)

    def get(self, path: str) -> bytes:
        return self.zk.get(self.root + path)[0]

    def children(self, path: str) -> list[str]:
        return sorted(self.zk.get_children(self.root + path))

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


@pytest.fixture
def admin(zk_connect: str):
    admin = Admin(zk_connect)
    yield admin
    admin.close()


def innermost(exc: BaseException) -> BaseException:
    """What a task group raised, out of the exception groups anyio wraps it in."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Node:
    """One node for :func:`josef.testing.metadata_quorum.running`, which starts it as the broker does and closes it."""

    def __init__(self, connect: str, node_id: int = 1, **extra: str) -> None:
        self.connect, self.node_id, self.extra = connect, node_id, extra

    def build(self, directory: Path) -> ZooKeeperQuorum:
        return quorum(self.connect, self.node_id, **self.extra)

    def release(self, quorum: ZooKeeperQuorum) -> None:
        pass


async def start_fails(q: ZooKeeperQuorum) -> BaseException:
    """What starting ``q`` raised (out of anyio's exception groups); it is closed after. Fails if it started."""
    try:
        with pytest.raises(BaseException) as raised:
            async with anyio.create_task_group() as tg:
                await started(q, tg)
    finally:
        await q.close()
    return innermost(raised.value)


class Listening(RecordingListener):
    """A node whose controller listener is bound, as the broker's is when it starts its quorum."""

    def endpoints(self):
        return [Endpoint("CONTROLLER", "127.0.0.1", 29093), Endpoint("PLAINTEXT", "127.0.0.1", 29092)]


async def started(q: ZooKeeperQuorum, tg, listener: RecordingListener | None = None) -> RecordingListener:
    listener = listener or RecordingListener()
    listener.loop_thread = threading.get_ident()
    await q.start(listener, tg)
    return listener


async def test_the_controller_s_znodes_are_kafka_s(zk_connect, admin):
    with anyio.fail_after(TIMEOUT_S):
        for expected_epoch in (1, 2):  # each election bumps /controller_epoch
            async with running(Node(connect=zk_connect, node_id=3), Path()) as (q, _):
                controller = json.loads(admin.get("/controller"))
                assert controller["version"] == 1 and controller["brokerid"] == 3 and controller["timestamp"].isdigit()
                assert admin.get("/controller_epoch") == str(expected_epoch).encode()
                assert q.controller_epoch == expected_epoch
                cluster = json.loads(admin.get("/cluster/id"))
                assert cluster["version"] == "1" and cluster["id"] == q.cluster_id
            assert not admin.zk.exists(admin.root + "/controller"), "a closed node's session and /controller are gone"


async def test_a_deposed_controller_cannot_append_and_leaves_nothing_in_the_log(zk_connect, admin):
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect), Path()) as (q, _):
            await q.append(topic_records("before"))
            before = admin.children(METADATA_LOG)
            # Another node's election, as a ZooKeeper-mode controller makes it once our session is gone.
            data, stat = admin.zk.get(admin.root + "/controller_epoch")
            tx = admin.zk.transaction()
            tx.delete(admin.root + "/controller")
            tx.create(admin.root + "/controller",
                      b'{"version":1,"brokerid":2,"timestamp":"0","endpoints":["CONTROLLER://127.0.0.1:19093"]}')
            tx.set_data(admin.root + "/controller_epoch", str(int(data) + 1).encode(), version=stat.version)
            assert not any(isinstance(r, Exception) for r in tx.commit())
            with pytest.raises(NotControllerError):
                await q.append(topic_records("after"))
            assert admin.children(METADATA_LOG) == before
            with anyio.fail_after(10):
                while q.controller_id != 2:
                    await anyio.sleep(0.05)  # polling a property the watch updates: no event to await here
            assert q.controller_endpoint(2) == ("127.0.0.1", 19093)
            assert dict(q.controllers()) == {2: ("127.0.0.1", 19093)}


async def test_a_second_node_takes_over_and_numbers_on_from_the_log_s_end(zk_connect):
    with anyio.fail_after(TIMEOUT_S):
        first, second = quorum(zk_connect, 1), quorum(zk_connect, 2)
        async with anyio.create_task_group() as tg:
            try:
                one = await started(first, tg, Listening())
                two = await started(second, tg, Listening())
                assert (first.controller_id, second.controller_id) == (1, 1)
                offsets = [await first.append(batch) for batch in controller_batches(5, 1)]
                with pytest.raises(NotControllerError):
                    await second.append(topic_records("not-mine"))
                await first.close()  # its session ends: /controller is free and the second node stands
                with anyio.fail_after(20):
                    while not second.is_controller:
                        await anyio.sleep(0.05)
                more = await second.append(topic_records("after-failover"))
                assert more == offsets[-1] + 2  # the new topic's two records follow the first node's last offset
                assert two.offset == more and "after-failover" in two.image.topics
                assert [d.records for d in two.deliveries[:len(one.deliveries)]] == [d.records for d in one.deliveries]
                assert one.problems == [] and two.problems == []
            finally:
                tg.cancel_scope.cancel()
                await first.close()
                await second.close()


async def test_a_commit_larger_than_a_znode_is_delivered_whole_and_replayed(zk_connect, admin):
    big = [TopicRecord(name=f"big-{i}-" + "x" * 200, topic_id=uuid.uuid4()) for i in range(12_000)]
    with anyio.fail_after(TIMEOUT_S):
        for round_ in range(2):
            async with running(Node(connect=zk_connect), Path()) as (q, listener):
                if round_ == 0:
                    offset = await q.append(big)
                    assert list(listener.deliveries[-1].records) == big and offset == len(big) - 1
                    assert len(admin.children(METADATA_PARTS)) >= 3
                else:
                    assert listener.offset == len(big) - 1 and len(listener.image.topics) == len(big)


async def test_snapshots_trim_the_log_and_nodes_that_were_away_start_from_them(zk_connect, admin):
    """Every 4 KB of commits the controller snapshots the image and deletes the commits it covers; a node starting
    later loads the snapshot (in part znodes when it is larger than one znode) and only the commits after it."""
    small = {"metadata.log.max.record.bytes.between.snapshots": "4096"}
    big = [TopicRecord(name=f"big-{i}-" + "x" * 200, topic_id=uuid.uuid4()) for i in range(6_000)]  # ~1.3 MB
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect, **small), Path()) as (q, one):
            for batch in controller_batches(60, 1):
                await q.append(batch)
            await q.snapshot_written()
            assert len(admin.children(METADATA_LOG)) < 30, "the commits a snapshot covers are deleted"
            snapshot = read_snapshot_header(admin.get(METADATA_SNAPSHOT), "snapshot")
            assert 0 < snapshot.offset <= one.offset and not snapshot.records.parts
            last = await q.append(big)
            await q.snapshot_written()
            snapshot = read_snapshot_header(admin.get(METADATA_SNAPSHOT), "snapshot")
            assert snapshot.offset == last and len(snapshot.records.parts) >= 2
            async with running(Node(connect=zk_connect, node_id=2, **small), Path()) as (_, two):
                assert two.deliveries[0].kind == "snapshot" and two.deliveries[0].offset == last
                assert two.offset == one.offset and two.image.topics.keys() == one.image.topics.keys()
                assert one.problems == [] and two.problems == []
            more = await q.append(topic_records("after-the-snapshot"))
        async with running(Node(connect=zk_connect, **small), Path()) as (_, again):  # a restart: snapshot, then log
            assert [d.kind for d in again.deliveries][:1] == ["snapshot"] and again.offset == more
            assert again.image.topics.keys() == one.image.topics.keys()


async def test_a_corrupt_snapshot_stops_the_node_naming_the_znode(zk_connect, admin):
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect, **{"metadata.log.max.record.bytes.between.snapshots": "1"}),
                           Path()) as (q, _):
            await q.append(topic_records("fine"))
            await q.snapshot_written()
        data = bytearray(admin.get(METADATA_SNAPSHOT))
        data[-1] ^= 0xFF  # a flipped bit in the records: their CRC fails
        admin.zk.set(admin.root + METADATA_SNAPSHOT, bytes(data))
        raised = await start_fails(quorum(zk_connect))
        assert isinstance(raised, CorruptCommitError)
        assert f"ZooKeeper znode {admin.root}{METADATA_SNAPSHOT}: the records fail their CRC-32C" in str(raised)


async def test_a_registered_broker_has_kafka_s_ephemeral_brokers_ids_znode(zk_connect, admin):
    registration = RegisterBrokerRecord(
        broker_id=1, incarnation_id=uuid.uuid4(), broker_epoch=7, rack="r1",
        end_points=(BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=39092, security_protocol=0),
                    BrokerEndpoint(name="SECURE", host="127.0.0.1", port=39093, security_protocol=3)),
        features=(BrokerFeature(name="metadata.version", min_supported_version=7, max_supported_version=27),))
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect), Path()) as (q, _):
            await q.append([registration])
            with anyio.fail_after(10):
                while not admin.zk.exists(admin.root + "/brokers/ids/1"):
                    await anyio.sleep(0.05)  # written by a background task: no event to await from here
            data, stat = admin.zk.get(admin.root + "/brokers/ids/1")
            assert stat.ephemeralOwner != 0, "ephemeral: it goes with the broker's session"
            znode = json.loads(data)
            assert znode["version"] == 5 and znode["rack"] == "r1" and znode["jmx_port"] == -1
            assert znode["endpoints"] == ["PLAINTEXT://127.0.0.1:39092", "SECURE://127.0.0.1:39093"]
            assert znode["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT", "SECURE": "SASL_SSL"}
            assert (znode["host"], znode["port"]) == ("127.0.0.1", 39092)
            assert znode["features"] == {"metadata.version": {"min_version": 7, "max_version": 27}}
        assert not admin.zk.exists(admin.root + "/brokers/ids/1"), "a closed node's session and registration are gone"


async def test_the_controller_hears_of_a_broker_whose_session_ended_and_only_of_its_registration(zk_connect, admin):
    """A /brokers/ids/<id> znode gone with its session ends that broker's registration on the active controller; one
    that appeared before the broker's current registration (the same broker restarted) names the older epoch."""
    registration = RegisterBrokerRecord(
        broker_id=5, incarnation_id=uuid.uuid4(), broker_epoch=3,
        end_points=(BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=39092, security_protocol=0),))
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect), Path()) as (q, listener):
            hosts, root = split_connect(zk_connect)
            broker_session = KazooClient(hosts=hosts)
            broker_session.start(timeout=30)
            # The znode may be seen before the registration it was written from: its epoch comes with the commit.
            broker_session.create(root + "/brokers/ids/5", b"{}", ephemeral=True, makepath=True)
            with anyio.fail_after(10):
                while 5 not in q._broker_sessions:
                    await anyio.sleep(0.05)  # a watch's callback on kazoo's thread
            await q.append([registration])
            await q.append([dataclasses.replace(registration, broker_epoch=9)])  # registered again in the same session
            broker_session.stop()  # the session ends, and the znode with it
            broker_session.close()
            with anyio.fail_after(10):
                while not listener.sessions_ended:
                    await anyio.sleep(0.05)  # a watch's callback on kazoo's thread: no event to await from here
            assert listener.sessions_ended == [(5, 3)], "the epoch the broker had when its znode appeared"
            assert listener.problems == []


async def test_a_corrupt_commit_stops_the_node_naming_the_znode(zk_connect, admin):
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect), Path()) as (q, _):
            await q.append(topic_records("fine"))
        path = admin.zk.create(admin.root + METADATA_LOG + "/commit-", b"JZ\x00garbage", sequence=True)
        raised = await start_fails(quorum(zk_connect))
        assert isinstance(raised, CorruptCommitError)
        assert f"ZooKeeper znode {path}: " in str(raised)


async def test_an_unreachable_zookeeper_is_a_clear_error_naming_zookeeper_connect():
    [port] = free_ports(1)
    q = quorum(f"127.0.0.1:{port}/josef", **{"zookeeper.connection.timeout.ms": "1000"})
    with anyio.fail_after(TIMEOUT_S), pytest.raises(BaseException) as raised:
        async with anyio.create_task_group() as tg:
            await q.start(RecordingListener(), tg)
    await q.close()
    assert isinstance(innermost(raised.value), ConfigError)
    assert f"zookeeper.connect=127.0.0.1:{port}/josef within 1000 ms" in str(innermost(raised.value))


def test_a_bad_zookeeper_connect_is_refused_at_once():
    with pytest.raises(ConfigError, match="host:port"):
        quorum("localhost/josef")
    with pytest.raises(ConfigError, match="needs zookeeper.connect"):
        ZooKeeperQuorum(load_config(None, {"node.id": "1", "metadata.quorum": "zookeeper"}))


async def test_log_directories_of_another_cluster_are_refused(zk_connect, tmp_path):
    from josef.metadata.meta_properties import format_dirs

    config = {"node.id": "1", "metadata.quorum": "zookeeper", "zookeeper.connect": zk_connect, "log.dirs": str(tmp_path)}
    format_dirs(load_config(None, config), "AAAAAAAAAAAAAAAAAAAAAA")
    first = ZooKeeperQuorum(load_config(None, config))
    with anyio.fail_after(TIMEOUT_S):
        try:
            async with anyio.create_task_group() as tg:
                await started(first, tg)
                assert first.cluster_id == "AAAAAAAAAAAAAAAAAAAAAA", "the first node defines the cluster with its id"
                tg.cancel_scope.cancel()
        finally:
            await first.close()
        other = tmp_path / "other"
        format_dirs(load_config(None, {**config, "log.dirs": str(other)}), "BBBBBBBBBBBBBBBBBBBBBB")
        raised = await start_fails(ZooKeeperQuorum(load_config(None, {**config, "log.dirs": str(other)})))
    assert isinstance(raised, ConfigError)
    assert "belong to cluster BBBBBBBBBBBBBBBBBBBBBB" in str(raised)
    assert "holds cluster AAAAAAAAAAAAAAAAAAAAAA" in str(raised)


async def test_one_server_of_a_three_server_ensemble_killed_stops_nothing(tmp_path):
    with ZooKeeperEnsemble(tmp_path / "ensemble", servers=3) as ensemble, anyio.fail_after(TIMEOUT_S):
        assert sorted(s.mode() for s in ensemble.servers) == ["follower", "follower", "leader"]
        async with running(Node(connect=f"{ensemble.connect}/josef"), Path()) as (q, listener):
            before = await q.append(topic_records("before"))
            next(s for s in ensemble.servers if s.mode() == "leader").kill()  # by PID
            while True:
                # While the other two elect a leader, a write may be lost with the connection: its outcome unknown,
                # the node gives the controllership up and stands again. The broker's channel asks again, as here.
                try:
                    after = await q.append(topic_records("after"))
                    break
                except NotControllerError:
                    await anyio.sleep(0.1)
            assert after > before and {"before", "after"} <= listener.image.topics.keys()


async def test_brokers_reach_the_controller_at_the_listener_controller_names_and_only_controllers_stand(zk_connect,
                                                                                                      admin):
    with anyio.fail_after(TIMEOUT_S):
        first, broker = quorum(zk_connect, 1), quorum(zk_connect, 2, **{"process.roles": "broker"})
        async with anyio.create_task_group() as tg:
            try:
                await started(first, tg, Listening())
                controller = json.loads(admin.get("/controller"))
                assert controller["brokerid"] == 1 and controller["endpoints"] == ["CONTROLLER://127.0.0.1:29093"]
                await started(broker, tg)
                assert broker.controller_id == 1 and broker.controller_endpoint(1) == ("127.0.0.1", 29093)
                assert first.controller_endpoint(1) is None, "the controller's own broker calls it in-process"
                await first.close()  # /controller is free: the broker-only node must not take it
                with anyio.fail_after(10):
                    while broker.controller_id != -1:
                        await anyio.sleep(0.05)
                with pytest.raises(NotControllerError):
                    await broker.append(topic_records("from-a-broker"))
                assert not admin.zk.exists(admin.root + "/controller") and not broker.is_controller
            finally:
                await first.close()
                await broker.close()
                tg.cancel_scope.cancel()


def tls_settings(tls, node_cert=None, **extra: str) -> dict[str, str]:
    settings = {"zookeeper.ssl.client.enable": "true", "zookeeper.ssl.truststore.type": "PEM",
                "zookeeper.ssl.truststore.location": str(tls.ca_pem), **extra}
    if node_cert is not None:
        settings.update({"zookeeper.ssl.keystore.type": "PEM", "zookeeper.ssl.keystore.location": str(node_cert.combined)})
    return settings


async def test_over_tls_a_node_s_certificate_owns_what_it_writes_and_others_only_read_it(tmp_path):
    """zookeeper.ssl.* to the ensemble's secureClientPort; with zookeeper.set.acl the node's znodes carry Kafka's
    secure ACL: all rights to the node's certificate (ZooKeeper's x509 identity), read to the world."""
    tls = TlsFiles.create(tmp_path / "tls")
    node_cert = tls.client("josef-node", unit="brokers", organization="josef")
    with ZooKeeperEnsemble(tmp_path / "zookeeper", tls=tls) as ensemble, anyio.fail_after(TIMEOUT_S):
        connect = f"{ensemble.secure_connect}/secured"
        node = Node(connect, **tls_settings(tls, node_cert, **{"zookeeper.set.acl": "true"}))
        async with running(node, Path()) as (q, listener):
            await q.append(topic_records("over-tls"))
            assert "over-tls" in listener.current_image().topics
            outsider = KazooClient(hosts=ensemble.connect)  # the plain port, no identity: the world
            outsider.start(timeout=30)
            try:
                [commit] = outsider.get_children("/secured" + METADATA_LOG)
                assert outsider.get(f"/secured{METADATA_LOG}/{commit}")[0], "the world reads"
                acls, _ = outsider.get_acls(f"/secured{METADATA_LOG}/{commit}")
                assert {(a.id.scheme, a.perms) for a in acls} == {("x509", 31), ("world", 1)}
                owner = next(a.id.id for a in acls if a.id.scheme == "x509")
                assert "CN=josef-node" in owner, owner
                with pytest.raises(NoAuthError):
                    outsider.set("/secured/controller_epoch", b"99")
                with pytest.raises(NoAuthError):
                    outsider.create(f"/secured{METADATA_LOG}/{COMMIT_PREFIX}", b"forged", sequence=True)
            finally:
                outsider.stop()
                outsider.close()
        # TLS without a client certificate reaches the ensemble too (no secure ACLs then).
        async with running(Node(f"{ensemble.secure_connect}/anonymous", **tls_settings(tls)), Path()) as (q, _):
            await q.append(topic_records("anonymous"))


async def test_tls_misconfigurations_are_refused_with_the_key_to_fix(tmp_path, zk_connect):
    def refused(**settings: str) -> str:
        with pytest.raises(ConfigError) as error:
            quorum(zk_connect, **settings)
        return str(error.value)

    assert "zookeeper.set.acl=true needs an authenticated ZooKeeper session" in refused(**{"zookeeper.set.acl": "true"})
    assert "zookeeper.ssl.truststore.location" in refused(**{"zookeeper.ssl.client.enable": "true"})
    assert "zookeeper.ssl.keystore.type=JKS" in refused(**{
        "zookeeper.ssl.client.enable": "true", "zookeeper.ssl.truststore.location": "/ca.pem",
        "zookeeper.ssl.keystore.location": "/node.jks", "zookeeper.ssl.keystore.type": "JKS"})
    # TLS to the plain port: no handshake, a clear error naming zookeeper.connect.
    tls = TlsFiles.create(tmp_path / "tls")
    error = await start_fails(quorum(zk_connect, **tls_settings(tls, **{"zookeeper.connection.timeout.ms": "2000"})))
    assert isinstance(error, ConfigError) and "over TLS" in str(error) and zk_connect in str(error), error
