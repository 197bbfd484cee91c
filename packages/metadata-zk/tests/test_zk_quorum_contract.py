"""The core's metadata quorum contract suite (:mod:`josef.metadata.quorum`) run against the ZooKeeper quorum, on a real
ZooKeeper server (a chroot of its own per test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from josef.metadata.records import random_uuid
from josef.node.server_properties import load_config
from josef.testing.metadata_quorum import MetadataQuorumContract
from josef_metadata_zk.znodes import CLUSTER_ID, cluster_id_json, split_connect
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum


#: Small enough that the suite's longer runs write snapshots and trim the log under them.
SNAPSHOT_BYTES = "2048"


class ZooKeeperHarness:
    """A single node on its own chroot of the session's ZooKeeper server; ``format`` writes ``/cluster/id`` there.
    It writes a snapshot every 2 KB of commits, so restarts load a snapshot and the commits after it."""

    node_id = 1

    def __init__(self, connect: str) -> None:
        self.connect = connect

    def format(self, directory: Path) -> str:
        hosts, chroot = split_connect(self.connect)
        zk = KazooClient(hosts=hosts)
        zk.start(timeout=30)
        try:
            cluster_id = random_uuid()
            zk.create(chroot + CLUSTER_ID, cluster_id_json(cluster_id), makepath=True)
            return cluster_id
        finally:
            zk.stop()
            zk.close()

    def build(self, directory: Path) -> ZooKeeperQuorum:
        return ZooKeeperQuorum(load_config(None, {"node.id": str(self.node_id), "log.dirs": str(directory),
                                                  "metadata.quorum": "zookeeper", "zookeeper.connect": self.connect,
                                                  "metadata.log.max.record.bytes.between.snapshots": SNAPSHOT_BYTES}))

    def release(self, quorum: ZooKeeperQuorum) -> None:
        pass  # the quorum's session ended with close(); nothing else was opened

    async def settle(self, quorum: ZooKeeperQuorum) -> None:
        await quorum.snapshot_written()


class TestZooKeeperQuorumContract(MetadataQuorumContract):
    @pytest.fixture
    def quorum_harness(self, zk_connect: str) -> ZooKeeperHarness:
        return ZooKeeperHarness(zk_connect)
