"""The core's storage contract suite (:mod:`josef.testing.storage`) against tiered storage composed over the local
storage, as a broker with ``remote.log.storage.system.enable`` builds it (``register_log_storage_layers``).

A tiered log obeys the contract of the log under it: what remote storage
adds (copies, remote reads, two log starts) is exercised by the remote log
manager's tests and by the integration tests on a real S3 server. The local
storage is the one a broker composes over by default; the layer itself
reaches it only through :mod:`josef.log`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import pytest

from josef.config import Config
from josef.log import Log, LogDirError, OffsetMovedToTieredStorageError
from josef.testing.storage import LogStorageContract, append_batch, broker_config
from josef_storage_local.log import LocalLog
from josef_storage_local.storage import LocalLogStorage
from josef_storage_local.testing import LocalHarness
from josef_storage_tiered.broker_config import CONFIG_KEYS
from josef_storage_tiered.layer import TieredLogStorage
from josef_storage_tiered.manager import RemoteLogManager
from josef_storage_tiered.plugin import local_dir
from josef_storage_tiered.tiered_log import TieredLog


class TieredHarness(LocalHarness):
    """The local storage's disks under the tiered layer, with a remote directory. The remote log manager is built
    as the layer's factory builds it but not started: with no metadata topic read, nothing is remote."""

    def __init__(self, remote: Path) -> None:
        self.remote = remote

    def config(self, keys: Mapping[str, str]) -> Config:
        return broker_config({"remote.log.storage.system.enable": "true",
                              "remote.log.storage.manager.class.name": "local-dir", **keys}, CONFIG_KEYS)

    def start(self, config: Config, clock: Callable[[], int]) -> TieredLogStorage:
        manager = RemoteLogManager(None, config, local_dir({"storage.root": str(self.remote)}))  # type: ignore[arg-type]
        return TieredLogStorage(LocalLogStorage(config, clock=clock), manager)

    def local_log(self, log: Log) -> LocalLog:
        assert isinstance(log, TieredLog)
        return super().local_log(log.inner)


class TestTieredStorageContract(LogStorageContract):
    @pytest.fixture
    def storage_harness(self, tmp_path_factory: pytest.TempPathFactory) -> TieredHarness:
        return TieredHarness(tmp_path_factory.mktemp("remote"))

    def test_a_replica_starting_at_its_leaders_local_log_start_keeps_the_leaders_log_start(self, subject):
        # The harness's remote log manager never reads __remote_log_metadata: what is remote stays unknown, as on
        # a replica that has just started over, or a broker that has just restarted.
        log = subject.open()
        for _ in range(3):
            append_batch(log)
        log.truncate_fully_and_start_at(500, log_start_offset=100)
        assert (log.log_start_offset, log.local_log_start_offset, log.log_end_offset) == (100, 500, 500)
        with pytest.raises(OffsetMovedToTieredStorageError):
            log.read(200, 1 << 20, 500)
        with pytest.raises(LogDirError, match="still being read"):  # KAFKA_STORAGE_ERROR: consumers try again
            anyio.run(log.read_remote, 200, 1 << 20, 500)
        log = subject.restart()
        assert (log.log_start_offset, log.local_log_start_offset) == (100, 500)
        log.truncate_fully_and_start_at(800)  # starting over without remote data below
        assert log.log_start_offset == log.local_log_start_offset == 800
