"""The core's metadata quorum contract suite (:mod:`josef.testing.metadata_quorum`) run against the KRaft quorum."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from josef.config import Config
from josef.log import LogStorage
from josef.metadata.meta_properties import check
from josef.node.server_properties import load_config
from josef.plugins import collect, get_plugin_manager
from josef.testing.metadata_quorum import MetadataQuorumContract, controller_batches, running, topic_records
from josef_metadata_kraft.kraft_quorum import KRaftQuorum


class KRaftHarness:
    """A lone in-process voter (no ``controller.quorum.voters``), its log on the configured log storage.

    Snapshots are written every few KB of committed log, so the suite's
    restarts load snapshots as well as the log behind them.
    """

    node_id = 1

    def __init__(self) -> None:
        self._storages: dict[int, LogStorage] = {}

    def config(self, directory: Path) -> Config:
        return load_config(None, {"log.dirs": str(directory), "node.id": str(self.node_id),
                                  "metadata.log.max.record.bytes.between.snapshots": "4096"})

    def format(self, directory: Path) -> str:
        return check(self.config(directory), auto_format=True)

    def build(self, directory: Path) -> KRaftQuorum:
        config = self.config(directory)
        storage = collect(get_plugin_manager(), "register_log_storage", "log storage").get(config["log.storage"])(config)
        quorum = KRaftQuorum(config, storage)
        self._storages[id(quorum)] = storage
        return quorum

    def release(self, quorum: KRaftQuorum) -> None:
        self._storages.pop(id(quorum)).close()

    async def settle(self, quorum: KRaftQuorum) -> None:
        await quorum.snapshot_written()


class TestKRaftQuorumContract(MetadataQuorumContract):
    @pytest.fixture
    def quorum_harness(self) -> KRaftHarness:
        return KRaftHarness()

    @pytest.mark.anyio
    async def test_the_suite_s_restarts_go_through_kraft_s_snapshots(self, quorum_harness, quorum_storage):
        """Not part of the contract: the restarts of the suite load a snapshot and the log behind it here."""
        directory = quorum_storage[0]
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, directory) as (quorum, _):
                for batch in controller_batches(60, quorum_harness.node_id):
                    await quorum.append(batch)
                    await anyio.lowlevel.checkpoint()
                await quorum_harness.settle(quorum)
                last = await quorum.append(topic_records("after-the-snapshot"))
            assert list(directory.rglob("*.checkpoint")), "no snapshot was written"
            async with running(quorum_harness, directory) as (_, listener):
                assert listener.deliveries[0].kind == "snapshot"
                assert listener.deliveries[-1].kind == "commit" and listener.offset == last
