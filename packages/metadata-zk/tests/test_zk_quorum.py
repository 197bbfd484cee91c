"""The ZooKeeper quorum on a real ZooKeeper server, beyond the contract: Kafka 3.x's znodes, a deposed controller that
cannot write, a second node taking over, large commits, and the errors a node stops with."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import anyio
import pytest
from kazoo.client import KazooClient

from josef.config import ConfigError
from josef.metadata.quorum import NotControllerError
from josef.metadata.records import TopicRecord
from josef.node.server_properties import load_config
from josef.testing import free_ports
from josef.testing.metadata_quorum import RecordingListener, controller_batches, running, topic_records
from josef_metadata_zk.commits import CorruptCommitError
from josef_metadata_zk.znodes import METADATA_LOG, METADATA_PARTS, split_connect
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum

pytestmark = pytest.mark.anyio
TIMEOUT_S = 60


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def quorum(connect: str, node_id: int = 1, **extra: str) -> ZooKeeperQuorum:
    return ZooKeeperQuorum(load_config(None, {"node.id": str(node_id), "metadata.quorum": "zookeeper",
                                              "zookeeper.connect": connect, "log.dirs": "/nonexistent", **extra}))



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
            tx.create(admin.root + "/controller", b'{"version":1,"brokerid":2,"timestamp":"0"}')
            tx.set_data(admin.root + "/controller_epoch", str(int(data) + 1).encode(), version=stat.version)
            assert not any(isinstance(r, Exception) for r in tx.commit())
            with pytest.raises(NotControllerError):
                await q.append(topic_records("after"))
            assert admin.children(METADATA_LOG) == before
            with anyio.fail_after(10):
                while q.controller_id != 2:
                    await anyio.sleep(0.05)  # polling a property the watch updates: no event to await here


async def test_a_second_node_takes_over_and_numbers_on_from_the_log_s_end(zk_connect):
    with anyio.fail_after(TIMEOUT_S):
        first, second = quorum(zk_connect, 1), quorum(zk_connect, 2)
        async with anyio.create_task_group() as tg:
            try:
                one = await started(first, tg)
                two = await started(second, tg)
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


async def test_a_corrupt_commit_stops_the_node_naming_the_znode(zk_connect, admin):
    with anyio.fail_after(TIMEOUT_S):
        async with running(Node(connect=zk_connect), Path()) as (q, _):
            await q.append(topic_records("fine"))
        path = admin.zk.create(admin.root + METADATA_LOG + "/commit-", b"JZ\x00garbage", sequence=True)
        q = quorum(zk_connect)
        try:
            with pytest.raises(BaseException) as raised:
                async with anyio.create_task_group() as tg:
                    await started(q, tg)
        finally:
            await q.close()
        assert isinstance(innermost(raised.value), CorruptCommitError)
        assert f"ZooKeeper znode {path}: " in str(innermost(raised.value))


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
        second = ZooKeeperQuorum(load_config(None, {**config, "log.dirs": str(other)}))
        with pytest.raises(BaseException) as raised:
            async with anyio.create_task_group() as tg:
                await started(second, tg)
        await second.close()
    assert isinstance(innermost(raised.value), ConfigError)
    assert "belong to cluster BBBBBBBBBBBBBBBBBBBBBB" in str(innermost(raised.value))
    assert "holds cluster AAAAAAAAAAAAAAAAAAAAAA" in str(innermost(raised.value))


async def test_one_server_of_a_three_server_ensemble_killed_stops_nothing(tmp_path):
    from josef_metadata_zk.testing import ZooKeeperEnsemble

    with ZooKeeperEnsemble(tmp_path / "ensemble", servers=3) as ensemble, anyio.fail_after(TIMEOUT_S):
        assert sorted(s.mode() for s in ensemble.servers) == ["follower", "follower", "leader"]
        async with running(Node(connect=f"{ensemble.connect}/josef"), Path()) as (q, listener):
            before = await q.append(topic_records("before"))
            next(s for s in ensemble.servers if s.mode() == "leader").kill()  # by PID
            after = await q.append(topic_records("after"))
            assert after > before and {"before", "after"} <= listener.image.topics.keys()
