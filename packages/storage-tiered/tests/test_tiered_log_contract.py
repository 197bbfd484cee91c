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

import pytest

from josef.config import Config
from josef.log import Log
from josef.testing.storage import LogStorageContract, broker_config
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
