"""The local storage as the subject of the core's storage contract suite (:mod:`josef.testing.storage`).

Shipped with the package so that a storage composed over the local one
(tiered storage's layer, say) runs the same suite on the same disks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from josef.config import Config
from josef.log import Log
from josef.testing.storage import broker_config
from josef_storage_local.log import LocalLog
from josef_storage_local.storage import LocalLogStorage

#: What a broken disk fails: every call the local storage makes to write, sync, create, rename or read its files.
DISK_CALLS = ("open", "pwrite", "pread", "fsync", "ftruncate", "truncate", "rename", "replace", "unlink", "mkdir")


class LocalHarness:
    """Local disks: two log directories; a crash leaves what the page cache had; the failing disk is a fault hook on ``os``."""

    log_dir_count = 2

    def config(self, keys: Mapping[str, str]) -> Config:
        return broker_config(keys)

    def start(self, config: Config, clock: Callable[[], int]) -> LocalLogStorage:
        return LocalLogStorage(config, clock=clock)

    def crash(self, storage: object, logs: Sequence[Log]) -> None:
        for log in logs:
            self.local_log(log).release()

    def local_log(self, log: Log) -> LocalLog:
        """The local log a contract test opened (a layer over this storage unwraps its own logs here)."""
        assert isinstance(log, LocalLog)
        return log

    def tear_last_batch(self, log_dir: Path) -> None:
        """Cut the last 10 bytes of the newest segment, as a write the kill interrupted leaves it."""
        newest = max(log_dir.glob("*.log"), key=lambda path: int(path.stem))
        os.truncate(newest, newest.stat().st_size - 10)

    @contextlib.contextmanager
    def failing_disk(self, code: int) -> Iterator[None]:
        def fail(*args: object, **kwargs: object) -> None:
            raise OSError(code, os.strerror(code))

        with pytest.MonkeyPatch.context() as patch:
            for name in DISK_CALLS:
                patch.setattr(os, name, fail)
            yield
