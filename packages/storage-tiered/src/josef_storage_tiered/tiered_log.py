"""One partition's log with tiered storage: the local log underneath, and its older segments in remote storage.

:class:`TieredLog` wraps the :class:`josef.log.Log` of whatever local
storage the broker runs, through the contract alone (Kafka's UnifiedLog over
its LocalLog). The local log keeps doing everything it did; the wrapper
adds what remote storage changes:

- two log starts: the local log's start is the *local* log start; the log
  start is the first offset still in remote storage (or a DeleteRecords
  above it). The log start last known is kept in ``remote-log-start-offset``
  beside the local files (Kafka's log-start-offset checkpoint): a restart
  does not forget a DeleteRecords that reached only remote data, and until
  the broker has read what ``__remote_log_metadata`` says of the partition
  (after a restart; on a replica that just started at its leader's local
  log start, which then gave its log start) the log start is that one,
  not the local one, and remote reads fail with KAFKA_STORAGE_ERROR, which
  clients retry;
- local retention: the local log obeys ``local.retention.ms``/``.bytes``
  and may delete only what is already in remote storage
  (:meth:`josef.log.Log.attach_retention_limit`); total retention of remote
  segments is the remote log manager's;
- reads between the two starts raise OffsetMovedToTieredStorageError and
  are served, awaited, by :meth:`read_remote`;
- the leader-epoch cache of the local log starts at the local log start;
  the epochs of remote segments are prepended from their metadata, so
  OffsetForLeaderEpoch answers as Kafka's, whose cache covers remote data.

Everything else goes to the local log unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from josef.log import (
    EpochEntry,
    Log,
    LogConfig,
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    RemoteRecords,
    end_offset_for_epoch,
)

if TYPE_CHECKING:
    from josef_storage_tiered.manager import RemoteLogManager

#: Where a log start that only remote data saw (DeleteRecords below the local log start) survives restarts.
LOG_START_FILE = "remote-log-start-offset"


def local_config(config: LogConfig) -> LogConfig:
    """What the local log obeys: for a tiered topic, ``local.retention.*`` (-2: the total retention) instead of
    ``retention.*``."""
    if not config.remote_storage_enable:
        return config
    ms = config.retention_ms if config.local_retention_ms == -2 else config.local_retention_ms
    size = config.retention_bytes if config.local_retention_bytes == -2 else config.local_retention_bytes
    return attrs.evolve(config, retention_ms=ms, retention_bytes=size)


class TieredLog:
    """A :class:`josef.log.Log` over a local log and remote segments; see the module's docstring."""

    def __init__(self, inner: Log, config: LogConfig, manager: RemoteLogManager) -> None:
        self._inner = inner
        self._manager = manager
        self.tp = inner.tp
        self.dir: Path = inner.dir
        self.config = config
        self._stable_offset: Callable[[], int] | None = None
        #: The log start last known (a floor: it only moves up, but for a replica starting over), -1 for none.
        self._known_start = _read_log_start(inner.dir / LOG_START_FILE)
        inner.attach_retention_limit(self._retention_limit)

    def __getattr__(self, name: str) -> Any:
        # Everything remote storage does not change is the local log's (appends, truncation, producer
        # snapshots, aborted transactions, flushes...).
        return getattr(self._inner, name)

    # Offsets ---------------------------------------------------------------------------------

    @property
    def local_log_start_offset(self) -> int:
        return self._inner.log_start_offset

    @property
    def log_start_offset(self) -> int:
        local = self._inner.log_start_offset
        if not self._manager.is_ready(self.tp):  # what remote storage holds is not known yet
            return local if self._known_start < 0 else min(self._known_start, local)
        first = self._manager.first_remote_offset(self.tp)
        start = local if first is None else min(first, local)
        return max(start, min(self._known_start, local))

    def remember_log_start(self) -> None:
        """Keep the log start remote storage's metadata now gives, for after a restart (the manager calls it when
        that metadata changes)."""
        if self._manager.first_remote_offset(self.tp) is None:
            return  # nothing remote: the local log start is the log start, and the local log keeps that
        start = self.log_start_offset
        if start > self._known_start:
            self._set_known_start(start)

    def _set_known_start(self, offset: int) -> None:
        self._known_start = offset
        _write_log_start(self.dir / LOG_START_FILE, offset)

    @property
    def highest_offset_in_remote_storage(self) -> int:
        return self._manager.next_remote_offset(self.tp) - 1

    @property
    def last_stable_offset(self) -> int:
        """The partition's last stable offset (never above its high watermark): what may be copied below."""
        return self._stable_offset() if self._stable_offset is not None else self._inner.log_end_offset

    def attach_last_stable_offset(self, source: Callable[[], int]) -> None:
        self._stable_offset = source
        self._inner.attach_last_stable_offset(source)

    def _retention_limit(self) -> int:
        """The local log deletes only segments below the end of what remote storage holds, while tiered."""
        if not self.config.remote_storage_enable:
            return 2**63 - 1
        return self._manager.next_remote_offset(self.tp)

    # Reading ---------------------------------------------------------------------------------

    def _check_local(self, offset: int) -> None:
        if offset < self._inner.log_start_offset:
            if offset >= self.log_start_offset:
                raise OffsetMovedToTieredStorageError(
                    f"{self.tp}: offset {offset} is in remote storage (local log start {self._inner.log_start_offset})")
            raise OffsetOutOfRangeError(f"{self.tp}: offset {offset} is below the log start {self.log_start_offset}")

    def read(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True) -> bytes:
        self._check_local(offset)
        return self._inner.read(offset, max_bytes, max_offset, min_one_batch)

    def read_region(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True) -> Any:
        self._check_local(offset)
        return self._inner.read_region(offset, max_bytes, max_offset, min_one_batch)

    async def read_remote(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True,
                          read_committed: bool = False) -> RemoteRecords:
        if not self.log_start_offset <= offset < self._inner.log_start_offset:
            raise OffsetOutOfRangeError(f"{self.tp}: offset {offset} is not in remote storage")
        return await self._manager.read(self, offset, max_bytes, min(max_offset, self._inner.log_start_offset),
                                        min_one_batch, read_committed)

    async def remote_offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        if self.log_start_offset >= self._inner.log_start_offset:
            return None  # nothing readable is only remote
        return await self._manager.offset_for_timestamp(self, timestamp)

    async def remote_producer_snapshot(self, offset: int) -> bytes | None:
        return await self._manager.producer_snapshot(self.tp, offset)

    # Leader epochs ---------------------------------------------------------------------------

    def epoch_entries(self) -> Sequence[EpochEntry]:
        local = list(self._inner.epoch_entries())
        start = self._inner.log_start_offset
        remote = [e for e in self._manager.remote_epochs(self.tp) if e.start_offset < start]
        if not remote:
            return local
        if local and local[0].epoch == remote[-1].epoch:
            local = local[1:]  # the local cache starts it at the local log start; remote data knows where it began
        return remote + [e for e in local if e.epoch > remote[-1].epoch]

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return end_offset_for_epoch(self.epoch_entries(), epoch, self._inner.log_end_offset)

    # Housekeeping ----------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        if offset >= self._inner.log_start_offset:
            self._inner.delete_records_before(offset)  # past the log end: OffsetOutOfRangeError, nothing changed
        if offset > self._known_start:
            self._set_known_start(offset)
        return self.log_start_offset

    def truncate_fully_and_start_at(self, offset: int, log_start_offset: int | None = None) -> None:
        self._inner.truncate_fully_and_start_at(offset)
        self._set_known_start(offset if log_start_offset is None else min(log_start_offset, offset))

    def update_config(self, config: LogConfig) -> None:
        self.config = config
        self._inner.update_config(local_config(config))

    @property
    def inner(self) -> Log:
        """The local log underneath (the remote log manager copies its closed segments)."""
        return self._inner


def _read_log_start(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return -1


def _write_log_start(path: Path, offset: int) -> None:
    """Atomically, so a crash leaves the old value or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{offset}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
