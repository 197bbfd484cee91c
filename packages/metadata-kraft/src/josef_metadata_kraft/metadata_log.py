"""``__cluster_metadata-0`` on disk: the Raft core's :class:`RaftLog` over josef's log storage.

The batches live in an ordinary partition log of the broker's
:class:`josef.log.LogStorage` (segments, indexes, leader-epoch checkpoint),
and snapshots beside them as Kafka names them,
``<end offset, 20 digits>-<epoch, 10 digits>.checkpoint``, each holding the
same record batches (SnapshotHeader, the records, SnapshotFooter). A snapshot
is written to a ``.checkpoint.part`` file, synced, then renamed, so a crash
leaves either the whole snapshot or none; leftover parts are removed when the
log opens. A snapshot that fails its checks is logged and set aside
(renamed ``.checkpoint.deleted``); if the log no longer holds what it
covered, opening fails with one line saying so, rather than silently
starting from an incomplete state.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from josef.config import ConfigError
from josef.log import Log, OffsetOutOfRangeError
from josef.protocol.records import AppendInfo, describe_batches
from josef_metadata_kraft.raft import AppendResult, OffsetAndEpoch, RaftLogError
from josef_metadata_kraft.raft.log import end_offset_for_epoch, epoch_cache_end_offset
from josef_metadata_kraft.snapshots import SnapshotError, check_snapshot

log = logging.getLogger(__name__)

_SNAPSHOT = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_READ_LIMIT = 8 * 1024 * 1024


def _order(snapshot_id: OffsetAndEpoch) -> tuple[int, int]:
    return snapshot_id.offset, snapshot_id.epoch


def snapshot_name(snapshot_id: OffsetAndEpoch) -> str:
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}.checkpoint"


def _append_info(buf: bytes, expected_base: int, max_epoch: int | None) -> AppendInfo:
    """Check batches that already carry their offsets (fetched, or built by the leader) and describe them."""
    try:
        return describe_batches(buf, expected_base, max_epoch)
    except ValueError as exc:
        raise RaftLogError(str(exc)) from exc


class MetadataLog:
    """The Raft log of one node; every method runs on the node's event loop thread."""

    def __init__(self, partition_log: Log) -> None:
        self._log = partition_log
        self.dir: Path = partition_log.dir
        self._snapshots: list[OffsetAndEpoch] = []
        for part in self.dir.glob("*.checkpoint.part"):
            part.unlink()
        for path in sorted(self.dir.iterdir()):
            match = _SNAPSHOT.match(path.name)
            if match:
                self._snapshots.append(OffsetAndEpoch(int(match.group(1)), int(match.group(2))))
        self._snapshots.sort(key=_order)
        self._check_snapshots()

    def _check_snapshots(self) -> None:
        """Set aside unreadable snapshots, newest first; fail if the log cannot stand without them."""
        while self._snapshots:
            latest = self._snapshots[-1]
            path = self.dir / snapshot_name(latest)
            try:
                check_snapshot(path.read_bytes())
                break
            except SnapshotError as exc:
                log.error("metadata snapshot %s is unreadable (%s); set aside as %s.deleted", path, exc, path.name)
                os.replace(path, path.with_name(path.name + ".deleted"))
                self._snapshots.pop()
        covered = self._snapshots[-1].offset if self._snapshots else 0
        if self._log.log_start_offset > covered:
            raise ConfigError(
                f"metadata log {self.dir} starts at offset {self._log.log_start_offset}, but no readable snapshot "
                f"covers the offsets before it: this node cannot rebuild the metadata; move the directory away "
                f"so that it fetches the metadata from the quorum leader again")

    # RaftLog -----------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def last_fetched_epoch(self) -> int:
        entries = self._log.epoch_entries()
        if entries:
            return entries[-1].epoch
        return self._snapshots[-1].epoch if self._snapshots else 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        entries = [(e.epoch, e.start_offset) for e in self._log.epoch_entries()]
        found = epoch_cache_end_offset(entries, epoch, self.end_offset)
        return end_offset_for_epoch(found, self.earliest_snapshot_id(), self.end_offset, self.last_fetched_epoch)

    def append_as_leader(self, batch: bytes, epoch: int) -> AppendResult:
        return self._append(batch, epoch)

    def append_as_follower(self, batches: bytes, epoch: int) -> AppendResult:
        return self._append(batches, epoch)

    def _append(self, batches: bytes, epoch: int) -> AppendResult:
        info = _append_info(batches, self.end_offset, epoch)
        self._log.append(batches, info)
        return AppendResult(info.first_offset, info.last_offset)

    def read(self, offset: int, max_bytes: int) -> bytes:
        try:
            return self._log.read(offset, max_bytes, self.end_offset)
        except OffsetOutOfRangeError as exc:
            raise RaftLogError(str(exc)) from exc

    def truncate_to(self, offset: int) -> None:
        self._log.truncate_to(offset)

    def flush(self) -> None:
        self._log.flush()

    # Snapshots -------------------------------------------------------------------------

    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        return self._snapshots[-1] if self._snapshots else None

    def earliest_snapshot_id(self) -> OffsetAndEpoch | None:
        return self._snapshots[0] if self._snapshots else None

    def snapshot_size(self, snapshot_id: OffsetAndEpoch) -> int | None:
        path = self.dir / snapshot_name(snapshot_id)
        return path.stat().st_size if snapshot_id in self._snapshots else None

    def read_snapshot(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> bytes | None:
        if snapshot_id not in self._snapshots:
            return None
        with open(self.dir / snapshot_name(snapshot_id), "rb") as f:
            f.seek(position)
            return f.read(max_bytes)

    def _write_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self.write_snapshot_file(snapshot_id, data)
        self.add_snapshot(snapshot_id)

    def write_snapshot_file(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Check ``data`` and write it durably as the snapshot's file; :meth:`add_snapshot` makes it known.

        Touches only the file: it may run in a worker thread (as
        :class:`josef_metadata_kraft.kraft_quorum.KRaftQuorum` writes its
        snapshots), unlike the other methods.
        """
        try:
            check_snapshot(data)
        except SnapshotError as exc:
            raise RaftLogError(f"snapshot {snapshot_name(snapshot_id)}: {exc}") from exc
        path = self.dir / snapshot_name(snapshot_id)
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def add_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """Make a snapshot written by :meth:`write_snapshot_file` known; one below the log start is removed instead."""
        if snapshot_id.offset < self.start_offset:
            (self.dir / snapshot_name(snapshot_id)).unlink(missing_ok=True)
            return
        if snapshot_id not in self._snapshots:
            self._snapshots.append(snapshot_id)
            self._snapshots.sort(key=_order)

    def create_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        if snapshot_id.offset > self.end_offset:
            raise RaftLogError(f"snapshot at {snapshot_id.offset} is past the log end {self.end_offset}")
        self._write_snapshot(snapshot_id, data)

    def delete_before_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self._log.delete_records_before(min(snapshot_id.offset, self.end_offset))
        for older in [s for s in self._snapshots if _order(s) < _order(snapshot_id)]:
            (self.dir / snapshot_name(older)).unlink(missing_ok=True)
            self._snapshots.remove(older)

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self._write_snapshot(snapshot_id, data)
        self._log.truncate_fully_and_start_at(snapshot_id.offset)
        self.delete_before_snapshot(snapshot_id)

    def close(self) -> None:
        self._log.close()

