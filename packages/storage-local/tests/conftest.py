"""A harness for the local storage tests: a storage on a temporary directory, a settable clock, real batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from josef.broker_config import CORE_KEYS
from josef.config import Config, ConfigDef
from josef.log import LogConfig
from josef.protocol.records import (
    AppendInfo,
    build_batch,
    iter_batches,
    iter_records,
    validate_and_assign,
)
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.log import LocalLog
from josef_storage_local.storage import LocalLogStorage

TP = TopicPartition("orders", 0)
#: Small enough that a few dozen batches roll several segments and fill several index entries each.
SMALL = LogConfig(
    segment_bytes=2000, index_interval_bytes=200, segment_index_bytes=1024, retention_ms=-1
)


@attrs.define
class Clock:
    """Milliseconds that only move when a test says so."""

    now: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


class Harness:
    """A storage on ``root``, restarted cleanly or after a simulated crash, with helpers to append and inspect."""

    tp = TP
    config = SMALL

    def __init__(self, root: Path, clock: Clock) -> None:
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

    def append(
        self,
        log: LocalLog,
        count: int = 1,
        *,
        timestamp: int = 1000,
        timestamps: Sequence[int] | None = None,
        epoch: int = 0,
        value_size: int = 20,
    ) -> AppendInfo:
        """Append one batch of ``count`` records (or one per timestamp), validated and numbered as the broker does."""
        stamps = list(timestamps) if timestamps is not None else [timestamp] * count
        buf = bytearray(build_batch([(None, b"v" * value_size, ts) for ts in stamps]))
        info = validate_and_assign(buf, log.log_end_offset, epoch, 1 << 30)
        log.append(buf, info)
        return info

    def path(self, tp: TopicPartition = TP) -> Path:
        return self.root / str(tp)

    def segment_file(self, base_offset: int, suffix: str, tp: TopicPartition = TP) -> Path:
        return self.path(tp) / f"{base_offset:020d}{suffix}"

    @staticmethod
    def batches(data: bytes) -> list[tuple[int, int]]:
        """``(base offset, last offset)`` of each batch in a read's answer, which must hold whole batches only."""
        found = list(iter_batches(data))
        assert sum(header.size for _, header in found) == len(data), (
            "a read returned a partial batch"
        )
        return [(header.base_offset, header.last_offset) for _, header in found]

    @staticmethod
    def records(data: bytes) -> list[tuple[int, int]]:
        """``(offset, timestamp)`` of every record in a read's answer."""
        return [
            (record.offset, record.timestamp)
            for position, header in iter_batches(data)
            for record in iter_records(data[position : position + header.size])
        ]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def harness(tmp_path: Path, clock: Clock) -> Iterator[Harness]:
    h = Harness(tmp_path / "logs", clock)
    yield h
    h.crash()  # release whatever the test left open
