"""ZooKeeper's side of a migration to KRaft on a real ZooKeeper server: the take-over fences ZooKeeper's controller
for good and reads its whole log; a KRaft controller mirrors its commits (gaps where Raft's control records are)
and ZooKeeper-mode nodes follow them; a rollback lets them be elected again, numbering on after the mirror."""

from __future__ import annotations

import json
import threading

import anyio
import pytest
from test_zk_quorum import Admin, Listening, quorum, started

from josef.config import ConfigError
from josef.metadata.image import MetadataImage
from josef.metadata.migration import MigrationError
from josef.metadata.quorum import NotControllerError
from josef.node.server_properties import load_config
from josef.testing.metadata_quorum import topic_records
from josef_metadata_zk.migration import ZooKeeperMigration, migration_from_zookeeper
from josef_metadata_zk.commits import read_snapshot_header
from josef_metadata_zk.znodes import METADATA_SNAPSHOT, MIGRATION

pytestmark = pytest.mark.anyio
TIMEOUT_S = 60


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def kraft_controller(connect: str, **extra: str) -> ZooKeeperMigration:
    migration = migration_from_zookeeper(load_config(None, {
        "node.id": "3000", "process.roles": "controller", "controller.quorum.voters": "3000@127.0.0.1:29093",
        "zookeeper.connect": connect, "zookeeper.metadata.migration.enable": "true", "log.dirs": "/nonexistent",
        **extra}))
    assert migration is not None
    return migration


async def until(check, what: str) -> None:
    """Wait until ``check()`` holds: a property a ZooKeeper watch updates, with no event to await."""
    try:
        with anyio.fail_after(20):
            while not check():
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what} did not happen within 20 s") from None


def test_only_a_controller_that_asks_for_it_migrates():
    assert migration_from_zookeeper(load_config(None, {"node.id": "3000", "zookeeper.connect": "127.0.0.1:1/x"})) is None
    with pytest.raises(ConfigError, match="zookeeper.connect"):
        migration_from_zookeeper(load_config(None, {"node.id": "3000", "zookeeper.metadata.migration.enable": "true"}))


async def test_take_over_mirror_and_roll_back(zk_connect):
    admin = Admin(zk_connect)
    node = quorum(zk_connect, 1, **{"process.roles": "broker,controller"})
    # Every mirrored commit is followed by a snapshot that trims the mirrored log.
    mirror = kraft_controller(zk_connect, **{"metadata.log.max.record.bytes.between.snapshots": "1"})
    try:
        with anyio.fail_after(TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                follower = await started(node, tg, Listening())
                last = await node.append(topic_records("before"))
                state = await anyio.to_thread.run_sync(kraft_controller(zk_connect).take_over)
                assert (state.cluster_id, state.offset) == (node.cluster_id, last)
                image, _ = MetadataImage().apply(state.offset, state.records)
                assert "before" in image.topics
                assert json.loads(admin.get(MIGRATION))["state"] == "migrating"
                # ZooKeeper's controller is fenced, and no ZooKeeper-mode node stands while the migration lasts.
                with pytest.raises(NotControllerError):
                    await node.append(topic_records("refused"))
                with pytest.raises(MigrationError, match="already migrating"):
                    await anyio.to_thread.run_sync(kraft_controller(zk_connect).take_over)

                # The KRaft controller: its image starts from the take-over's snapshot; Raft's LeaderChange takes
                # the next offset, so its first commit follows a gap.
                kraft = Listening()
                kraft.image = image
                kraft.loop_thread = threading.get_ident()
                await mirror.start(kraft, tg, active=lambda: True)
                await until(lambda: node.controller_id == 3000, "ZooKeeper's nodes to name the KRaft controller")
                assert node.controller_endpoint(3000) == ("127.0.0.1", 29093)
                records = topic_records("under-kraft")
                after, _ = image.apply(state.offset + 1 + len(records), records)
                mirror.on_commit(after.offset, records, image, after)
                await until(lambda: "under-kraft" in follower.image.topics, "the mirrored commit to be followed")
                assert follower.offset == state.offset + 3 and follower.problems == []
                await until(lambda: admin.zk.exists(admin.root + "/brokers/topics/under-kraft"),
                            "Kafka's layout for the mirrored topic")
                await until(lambda: admin.zk.exists(admin.root + METADATA_SNAPSHOT) is not None
                            and read_snapshot_header(admin.get(METADATA_SNAPSHOT), "").offset == after.offset,
                            "a snapshot of the mirrored log")

                # Rolled back: the mirror is fenced, the ZooKeeper-mode node is elected and numbers on.
                await mirror.close()
                epoch = await anyio.to_thread.run_sync(kraft_controller(zk_connect).roll_back)
                assert admin.get("/controller_epoch") == str(epoch).encode()
                await until(lambda: node.is_controller, "the ZooKeeper-mode node elected again")
                assert await node.append(topic_records("after-rollback")) == follower.offset
                assert {"before", "under-kraft", "after-rollback"} <= set(follower.image.topics)
                with pytest.raises(MigrationError, match="not migrating"):
                    await anyio.to_thread.run_sync(kraft_controller(zk_connect).roll_back)
                tg.cancel_scope.cancel()
    finally:
        await mirror.close()
        await node.close()
        admin.close()
