"""The local storage tests' harness: a storage on a temporary directory, restarted cleanly or after a crash.

Building and inspecting batches is shared with the storage contract suite (:mod:`josef.testing.storage`).
A module of its own (not the conftest), so that tests import it by a name no other package's tests use.
"""

from __future__ import annotations

from pathlib import Path


from josef.node.broker_config import CORE_KEYS
from josef.config import Config, ConfigDef
from josef.log import LogConfig
from josef.protocol.topic_partition import TopicPartition
from josef.testing import ManualClock
from josef.testing.storage import SMALL, TP, append_batch, batches, records
from josef_storage_local.log import LocalLog
from josef_storage_local.storage import LocalLogStorage



class Harness:
    """A storage on ``root``, restarted cleanly or after a simulated crash, with helpers to append and inspect."""

    tp = TP
    config = SMALL
    append = staticmethod(append_batch)
    batches = staticmethod(batches)
    records = staticmethod(records)

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root = root
        self.clock = clock
        self.logs: list[LocalLog] = []
        self.storage = self.start()

    def start(self, **keys: str) -> LocalLogStorage:
        config = Config.build(ConfigDef(CORE_KEYS), {"log.dir": str(self.root), **keys})
        self.storage = LocalLogStorage(config, clock=self.clock)
        return self.storage

    def open(self, config: LogConfig = SMALL, tp: TopicPartition = TP) -> LocalLog:
        log = self.storage.open(tp, config)
        self.logs.append(log)
        return log

    def reopen(self, config: LogConfig = SMALL, tp: TopicPartition = TP) -> LocalLog:
        """Start a new storage on the same directory and open the log."""
        self.start()
        return self.open(config, tp)

    def restart(self, config: LogConfig = SMALL, tp: TopicPartition = TP) -> LocalLog:
        """Close cleanly, then reopen."""
        self.storage.close()
        return self.reopen(config, tp)

    def crash(self) -> None:
        """Drop every file handle without closing anything: no trim, no flush, no checkpoint, no marker."""
        for log in self.logs:
            log.release()

    def path(self, tp: TopicPartition = TP) -> Path:
        return self.root / str(tp)

    def segment_file(self, base_offset: int, suffix: str, tp: TopicPartition = TP) -> Path:
        return self.path(tp) / f"{base_offset:020d}{suffix}"
