"""One partition's log on local disk, in Kafka's layout: :class:`LocalLog` implements :class:`josef.log.Log`."""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from josef.log import (
    AbortedTxn,
    CleanerStats,
    ClosedSegment,
    EpochEntry,
    FileRegion,
    LogConfig,
    LogDirError,
    OffsetOutOfRangeError,
    RemoteRecords,
)
from josef.producer.producer_state import ProducerEntry, ProducerSnapshot
from josef.protocol.records import AppendInfo, BatchHeader, BatchInfo, CorruptRecordError
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local import cleaner_checkpoint, snapshots, swap
from josef_storage_local.compaction import (
    CleanedSegment,
    CleanedTxns,
    CleanerOptions,
    CleaningAborted,
    CleaningPlan,
    Counters,
    SourceSegment,
    build_offset_map,
    clean_group,
    group_segments,
    remove_cleaned,
)
from josef_storage_local.offset_map import OffsetMap
from josef_storage_local.epochs import FILE_NAME as EPOCH_FILE
from josef_storage_local.epochs import LeaderEpochCache
from josef_storage_local.files import dir_error, fsync_dir
from josef_storage_local.logdir import LogDir
from josef_storage_local.scheduler import Scheduler, remove_files
from josef_storage_local.segment import DELETED_SUFFIX, SUFFIXES, Segment

if TYPE_CHECKING:
    from josef_storage_local.metrics import FlushStats

logger = logging.getLogger(__name__)

Clock = Callable[[], int]
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_AT = 12
#: Reads from this size on are answered with a :class:`FileRegion` (sent with ``os.sendfile``).
ZERO_COPY_MIN_BYTES = 64 * 1024


F = TypeVar("F", bound=Callable[..., Any])


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _serialised(method: F) -> F:
    """Serialise a public method with the others: the broker runs retention and
    flushes in worker threads while appends and reads happen on its event loop."""

    @functools.wraps(method)
    def wrapper(self: LocalLog, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _offline_rule(method: F) -> F:
    """The offline rule of :class:`josef.log.LogStorage`: a log whose directory is offline
    fails at once, and a disk error takes the directory offline."""

    @functools.wraps(method)
    def wrapper(self: LocalLog, *args: Any, **kwargs: Any) -> Any:
        self._log_dir.check_online()
        try:
            return method(self, *args, **kwargs)
        except LogDirError as exc:
            self._log_dir.fail(exc)
            raise

    return wrapper  # type: ignore[return-value]


def _locked(method: F) -> F:
    """:func:`_serialised` under :func:`_offline_rule`: what every public method that touches the disk is."""
    return _serialised(_offline_rule(method))


def _checkpoint_epochs_of(logs: Sequence[LocalLog]) -> None:
    for log in logs:
        log._checkpoint_epochs()


class LocalLog:
    """Segments of one partition, oldest first; the last one is active (appended to).

    Holds the leader-epoch cache, the log start offset and the recovery
    point (everything below it has been fsynced, so recovery after a crash
    starts there), writes the broker's producer-state snapshots
    (:mod:`josef_storage_local.snapshots`) and indexes the aborted
    transactions it reports (:mod:`josef_storage_local.txn_index`, one index
    per segment). Public methods take a lock because housekeeping runs
    in worker threads while the event loop appends and reads (the contract).
    """

    def __init__(
        self,
        tp: TopicPartition,
        dir: Path,
        config: LogConfig,
        log_dir: LogDir,
        *,
        recover: bool,
        clock: Clock = wall_clock_ms,
        flush_stats: FlushStats | None = None,
    ) -> None:
        """Open the log in ``dir``, creating it if new; ``recover`` after an unclean shutdown; its flushes are
        timed in ``flush_stats`` (the storage's LogFlushStats)."""
        self.tp = tp
        self.dir = dir
        self.config = config
        self.closed = False
        self._lock = threading.RLock()
        self._log_dir = log_dir
        self._clock = clock
        self._flush_stats = flush_stats
        #: How far past max.compaction.lag.ms the log's dirty section was at the last cleaning_priority (ms, 0: not).
        self.compaction_delay_ms = 0
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._producer_source: Callable[[], Sequence[ProducerEntry]] | None = None
        self._stable_offset_source: Callable[[], int] | None = None
        #: Tiered storage's bound on retention (:meth:`attach_retention_limit`); None: unbounded.
        self._retention_limit: Callable[[], int] | None = None
        #: The lowest marker indexed since the last flush below the recovery point (a replay after a
        #: rebuild): flush must reach its segment, which the recovery point alone would skip.
        self._unflushed_txn_offset: int | None = None
        #: Counts truncations and moves: a cleaning planned before one must not swap its rewrite in.
        self._generation = 0
        #: The lowest offset truncated to since the last cleaning: the dirty section starts there at the latest.
        self._dirty_floor: int | None = None
        #: Where the dirty section starts, from the cleaner-offset-checkpoint once read; None before.
        self._first_dirty: int | None = None
        #: The earliest delete horizon of a tombstone or marker the last cleaning kept; -1 when none.
        self._delete_horizon = -1
        #: One cleaning of this log at a time (cleaner threads and direct calls).
        self._cleaning = threading.Lock()
        #: The storage's background thread once it runs (:meth:`attach_scheduler`); without it
        #: (tests, the metadata log) rolled segments wait for the next full flush and deleted files go at once.
        self._scheduler: Scheduler | None = None
        #: A leader-epoch checkpoint is queued on the scheduler (:meth:`assign_epoch`).
        self._epoch_checkpoint_due = False
        #: Counts truncations: a flush outside the lock must not advance the recovery point over data
        #: a truncation replaced while it ran.
        self._truncations = 0
        try:
            self._load(recover)
        except OSError as exc:
            raise dir_error(exc, "loading the log in", dir) from exc

    # Loading -------------------------------------------------------------------------

    def _load(self, recover: bool) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        swap.recover(self.dir)
        bases = self._segment_files()
        now = self._clock()
        log_start = self._log_dir.log_start_offset(self.tp)
        self._segments = [
            Segment(self.dir, base, self.config, now) for base in bases or [log_start]
        ]
        try:
            self._epochs = LeaderEpochCache(self.dir / EPOCH_FILE)
        except ValueError as exc:
            raise LogDirError(f"corrupt leader-epoch checkpoint in {self.dir}: {exc}") from exc
        recovery_point = self._log_dir.recovery_point(self.tp)
        first_unflushed = self._segment_index(recovery_point) if recover else len(self._segments)
        first_unindexed = min(first_unflushed, self._load_txn_indexes())
        self._end_offset = self._check_or_recover(first_unflushed)
        self._forget_aborted_txns_from(first_unindexed)
        for segment in self._segments[:-1]:
            segment.seal()
        self._segments[-1].activate()
        self._log_start_offset = max(log_start, self._segments[0].base_offset)
        self._recovery_point = min(recovery_point, self._end_offset)
        if self._log_start_offset > self._end_offset:
            # A crash lost data above the log start offset: nothing left is readable.
            self._start_empty_at(self._log_start_offset)
        self._epochs.truncate_from_end(self._end_offset)
        self._epochs.truncate_from_start(self._log_start_offset)
        self._epochs.checkpoint()
        self._record_offsets()
        self._clean_snapshots()

    def _load_txn_indexes(self) -> int:
        """Read every segment's aborted transactions; returns the index of the first segment whose file was corrupt.

        A corrupt file (torn, unknown version) does not fail the log: it is
        deleted with a warning by :meth:`_forget_aborted_txns_from`, and
        rebuilt by the broker's replay. Returns the segment count when every
        file was sound.
        """
        first_corrupt = len(self._segments)
        for i, segment in enumerate(self._segments):
            try:
                segment.txn_index.load()
            except ValueError as exc:
                logger.warning("%s: deleting a corrupt transaction index, the broker rebuilds it: %s", self.tp, exc)
                first_corrupt = min(first_corrupt, i)
        return first_corrupt

    def _forget_aborted_txns_from(self, first: int) -> None:
        """Drop the aborted transactions of segment ``first`` and after, and the producer snapshots above its base.

        For segments whose index cannot be trusted: those recovered after an
        unclean shutdown (unflushed entries may be missing, as unflushed
        batches may; Kafka resets the index of every segment it recovers)
        and those from a corrupt file on. The broker rebuilds them: it replays
        the batch headers after the latest producer snapshot and reports
        every ABORT marker it finds (:meth:`append_aborted_txn`), so no
        snapshot may remain past the first of these segments (Kafka too
        deletes the snapshots above the segment it recovers). Later segments
        are cleared too, since :meth:`append_aborted_txn` ignores markers
        below the last one indexed. Snapshots at or below that base stay: a
        snapshot at N describes only batches below N.

        Without this, the snapshot of the last roll (or of a clean close)
        would survive an unclean shutdown, as it does for the producer state
        alone, and the broker would replay only the active segment.

        The snapshots go first, durably: a crash before the indexes are
        cleared then repeats all this at the next start, where the other
        order could leave the indexes cleared and the snapshots that skip
        their replay.
        """
        if first >= len(self._segments):
            return
        self._delete_snapshots(above=self._segments[first].base_offset)
        fsync_dir(self.dir)
        for segment in self._segments[first:]:
            segment.txn_index.reset()

    def _clean_snapshots(self) -> None:
        """Remove producer snapshots that can no longer be used, as Kafka does when it loads a log.

        Those outside [log start, log end] (a crash lost the data they
        describe, or retention passed them) and those that are neither at a
        segment's base offset nor the newest (written at a clean close that
        later appends made stale), plus half-written ``.tmp`` files.
        """
        snapshots.remove_leftovers(self.dir)
        offsets = [
            o for o in snapshots.list_snapshots(self.dir)
            if self._log_start_offset <= o <= self._end_offset
        ]
        keep = {segment.base_offset for segment in self._segments} | set(offsets[-1:])
        for offset in snapshots.list_snapshots(self.dir):
            if offset not in keep or offset not in offsets:
                snapshots.delete_snapshot(self.dir, offset)

    def _segment_files(self) -> list[int]:
        """Base offsets of the segments in the directory, after removing what a crash left behind.

        ``.deleted`` files are finished deletions; index files without a
        ``.log`` belong to no segment (Kafka removes both).
        """
        bases = []
        for path in self.dir.iterdir():
            stem, suffix = path.name.split(".", 1)[0], path.suffix
            if path.name.endswith(DELETED_SUFFIX):
                path.unlink()
            elif suffix == ".log" and stem.isdigit():
                bases.append(int(stem))
            elif suffix in SUFFIXES and not path.with_suffix(".log").exists():
                path.unlink()
        return sorted(bases)

    def _check_or_recover(self, first_unflushed: int) -> int:
        """Check the indexes of segments below the recovery point, recover the rest; returns the log end offset.

        A segment whose indexes fail the check is rebuilt even after a clean
        shutdown. When recovery cuts a segment, the later ones cannot be
        trusted and are deleted (as Kafka does).
        """
        end_offset = self._segments[0].base_offset
        for i, segment in enumerate(self._segments):
            is_last = i == len(self._segments) - 1
            next_base = None if is_last else self._segments[i + 1].base_offset
            if i < first_unflushed and segment.indexes_ok(next_base):
                if not is_last:
                    continue
                tail = segment.load_tail()
                if tail is not None:
                    return tail
            if i >= first_unflushed:
                logger.info("%s: recovering unflushed segment %d", self.tp, segment.base_offset)
            else:
                logger.info("%s: rebuilding the indexes of segment %d", self.tp, segment.base_offset)
            end_offset, truncated = segment.recover(self.config.index_interval_bytes, self._epochs)
            if truncated and not is_last:
                self._delete_segments(self._segments[i + 1 :])
                del self._segments[i + 1 :]
                break
        return end_offset

    def _segment_index(self, offset: int) -> int:
        """Index of the segment that holds ``offset`` (the first one for offsets below it)."""
        return max(bisect.bisect_right(self._segments, offset, key=lambda s: s.base_offset) - 1, 0)

    def _record_offsets(self) -> None:
        self._log_dir.update(
            self.tp, recovery_point=self._recovery_point, log_start_offset=self._log_start_offset
        )

    # Offsets ---------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def local_log_start_offset(self) -> int:
        """The log start: a local log holds everything it serves (tiered storage wraps it to hold more)."""
        return self._log_start_offset

    @property
    def highest_offset_in_remote_storage(self) -> int:
        return -1

    @property
    def log_end_offset(self) -> int:
        return self._end_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segment_count(self) -> int:
        """How many segments the log has (read without the lock: for metrics)."""
        return len(self._segments)

    @property
    def log_dir_path(self) -> Path:
        """The log directory (of ``log.dirs``) holding the log."""
        return self._log_dir.path

    @property
    def recovery_point(self) -> int:
        """Offsets below this are on disk (fsynced); recovery after a crash starts at its segment."""
        return self._recovery_point

    @property
    def segment_base_offsets(self) -> list[int]:
        """Base offsets of the segments, oldest first."""
        return [segment.base_offset for segment in self._segments]

    # Appending and reading -----------------------------------------------------------

    @_locked
    def append(self, records: bytes | bytearray | memoryview, info: AppendInfo) -> None:
        if info.first_offset != self._end_offset:
            raise ValueError(
                f"{self.tp}: batches start at offset {info.first_offset} but the log ends at {self._end_offset}"
            )
        now = self._clock()
        try:
            segment = self._segments[-1]
            if segment.should_roll(
                self.config, len(records), info.max_timestamp, info.last_offset, now
            ):
                segment = self._roll(now)
            segment.append(records, info.batches, self.config.index_interval_bytes)
        except OSError as exc:
            raise dir_error(exc, "appending to the log in", self.dir) from exc
        self._end_offset = info.last_offset + 1
        self._learn_epochs(records, info.batches)
        self._unflushed_messages += info.record_count
        if (
            self._unflushed_messages >= self.config.flush_messages
            or now - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush()

    def _roll(self, now: int) -> Segment:
        """Start a new active segment at the log end, then seal the old one.

        The producer state is snapshotted at the new base offset first, as
        Kafka does, so a restart replays at most the active segment. As in
        Kafka, the storage's background thread then flushes the segments
        below the new one (:meth:`flush_up_to`), so that a crash recovers only
        the active segment; an append never waits for that fsync.
        """
        self._write_producer_snapshot()
        segment = Segment(self.dir, self._end_offset, self.config, now)
        segment.activate()
        self._segments.append(segment)
        self._segments[-2].seal()
        if self._scheduler is not None:
            base = segment.base_offset
            self._scheduler.schedule(lambda: self.flush_up_to(base))
        return segment

    def _learn_epochs(
        self, records: bytes | bytearray | memoryview, batches: Sequence[BatchInfo]
    ) -> None:
        """Add the leader epochs of appended batches to the cache, as Kafka does on every append.

        This is how a follower's cache follows its leader's. Memory only: a
        crash loses nothing, because recovery learns epochs from the batches
        again, and :meth:`flush` checkpoints before the recovery point moves.
        """
        latest = self._epochs.latest_epoch
        for batch in batches:
            epoch = _LEADER_EPOCH.unpack_from(records, batch.position + _LEADER_EPOCH_AT)[0]
            if epoch > latest:
                self._epochs.assign(epoch, batch.base_offset)
                latest = epoch

    @_locked
    def read(
        self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True
    ) -> bytes:
        found = self._locate(offset, max_bytes, max_offset, min_one_batch)
        if found is None:
            return b""
        segment, start, size = found
        try:
            return os.pread(segment.fd, size, start)
        except OSError as exc:
            raise dir_error(exc, "reading the log in", self.dir) from exc

    @_locked
    def read_region(
        self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True
    ) -> bytes | FileRegion:
        """A region of the segment file from :data:`ZERO_COPY_MIN_BYTES` on; below that, a
        copy costs less than the descriptor and the extra send."""
        found = self._locate(offset, max_bytes, max_offset, min_one_batch)
        if found is None:
            return b""
        segment, start, size = found
        try:
            if size < ZERO_COPY_MIN_BYTES:
                return os.pread(segment.fd, size, start)
            return FileRegion(os.dup(segment.fd), start, size)
        except OSError as exc:
            raise dir_error(exc, "reading the log in", self.dir) from exc

    async def read_remote(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int,
        min_one_batch: bool = True,
        read_committed: bool = False,
    ) -> RemoteRecords:
        raise OffsetOutOfRangeError(f"{self.tp}: offset {offset} is not in remote storage: the log is not tiered")

    async def remote_offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        return None  # nothing of this log is remote

    def _locate(
        self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool
    ) -> tuple[Segment, int, int] | None:
        """The segment, position and size a read answers with; None for an empty answer."""
        if offset < self._log_start_offset or offset > self._end_offset:
            raise OffsetOutOfRangeError(
                f"{self.tp}: offset {offset} is outside the log [{self._log_start_offset}, {self._end_offset}]"
            )
        if offset >= min(self._end_offset, max_offset):
            return None
        ends_below_max_offset = max_offset >= self._end_offset
        try:
            # Segments are contiguous, so the first one normally answers; the next is
            # asked only when a segment ends before ``offset`` (never an empty answer then).
            for segment in itertools.islice(self._segments, self._segment_index(offset), None):
                found = segment.locate(
                    offset, max_bytes, max_offset, min_one_batch, ends_below_max_offset
                )
                if found is not None:
                    return (segment, *found) if found[1] else None
        except OSError as exc:
            raise dir_error(exc, "reading the log in", self.dir) from exc
        return None

    @_locked
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        try:
            for i, segment in enumerate(self._segments):
                if segment.max_timestamp < timestamp or self._below_log_start(i):
                    continue
                found = segment.find_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
        except OSError as exc:
            raise dir_error(exc, "searching the log in", self.dir) from exc
        return None

    @_locked
    def max_timestamp(self) -> tuple[int, int]:
        best = None
        for i, segment in enumerate(self._segments):
            if not self._below_log_start(i) and segment.max_timestamp > (
                best.max_timestamp if best else -1
            ):
                best = segment
        if best is None:
            return -1, -1
        try:
            return best.max_timestamp_record()
        except OSError as exc:
            raise dir_error(exc, "searching the log in", self.dir) from exc

    def _below_log_start(self, i: int) -> bool:
        """Whether segment ``i`` ends below the log start offset (retention has yet to delete it)."""
        return (
            i + 1 < len(self._segments)
            and self._segments[i + 1].base_offset <= self._log_start_offset
        )

    # Leader epochs -------------------------------------------------------------------

    def epoch_entries(self) -> Sequence[EpochEntry]:
        return self._epochs.entries

    @_locked
    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """Start ``epoch`` at ``start_offset`` (a new leader's term); the checkpoint is written on the background thread.

        A broker that gains the leadership of thousands of partitions at once
        (a peer's shutdown, a preferred-leader election) otherwise wrote and
        fsynced thousands of checkpoint files on the event loop. Until the
        task runs the epoch is in memory only, as epochs learnt from appends
        are: a crash meanwhile loses an epoch that no batch carries yet (one
        that does is relearnt by recovery, and :meth:`flush` checkpoints
        before the recovery point moves), and the restarted broker's replicas
        get a newer epoch from the controller anyway. Without a background
        thread (start-up, tests) it is written at once.
        """
        self._epochs.assign(epoch, start_offset)
        if self._scheduler is None:
            try:
                self._epochs.checkpoint()
            except OSError as exc:
                raise dir_error(exc, "writing the leader-epoch checkpoint in", self.dir) from exc
        elif not self._epoch_checkpoint_due:
            self._epoch_checkpoint_due = True
            self._scheduler.add_to_batch("leader-epoch-checkpoints", self, _checkpoint_epochs_of)

    def _checkpoint_epochs(self) -> None:
        """The background half of :meth:`assign_epoch` (a closed or deleted log is left alone)."""
        with self._lock:
            self._epoch_checkpoint_due = False
            if self.closed or self._log_dir.error is not None:
                return
            try:
                self._epochs.checkpoint()
            except OSError as exc:
                self._log_dir.fail(dir_error(exc, "writing the leader-epoch checkpoint in", self.dir))

    @_locked
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self._epochs.end_offset_for(epoch, self._end_offset)

    @_locked
    def truncate_to(self, offset: int) -> None:
        if offset >= self._end_offset:
            return
        self._truncated(offset)
        try:
            if offset < self._segments[0].base_offset:
                self._start_empty_at(offset)
            else:
                keep = self._segment_index(offset) + 1
                self._delete_segments(self._segments[keep:])
                del self._segments[keep:]
                active = self._segments[-1]
                self._end_offset = active.truncate_to(offset, self._clock())
                self._truncations += 1
                active.activate()
                self._log_start_offset = min(self._log_start_offset, self._end_offset)
                self._recovery_point = min(self._recovery_point, self._end_offset)
                self._epochs.truncate_from_end(self._end_offset)
                self._delete_snapshots(above=self._end_offset)
            self._epochs.checkpoint()
        except OSError as exc:
            raise dir_error(exc, "truncating the log in", self.dir) from exc
        self._record_offsets()

    @_locked
    def truncate_fully_and_start_at(self, offset: int, log_start_offset: int | None = None) -> None:
        # A local log holds nothing below ``offset``: it starts there whatever lies in remote storage below.
        try:
            self._start_empty_at(offset)
            self._epochs.checkpoint()
            self._log_dir.checkpoint()
        except OSError as exc:
            raise dir_error(exc, "truncating the log in", self.dir) from exc
        self._record_offsets()

    def _start_empty_at(self, offset: int) -> None:
        """Delete every segment and start empty at ``offset`` (Kafka's truncateFullyAndStartAt)."""
        self._truncated(offset)
        self._truncations += 1
        self._delete_segments(self._segments)
        self._segments = [Segment(self.dir, offset, self.config, self._clock())]
        self._segments[0].activate()
        self._end_offset = self._log_start_offset = self._recovery_point = offset
        self._epochs.clear()
        self._delete_snapshots(above=-1)  # every one: they describe batches that are gone

    # Producer state --------------------------------------------------------------------

    def attach_producer_state(self, source: Callable[[], Sequence[ProducerEntry]]) -> None:
        self._producer_source = source

    def _write_producer_snapshot(self) -> None:
        """Snapshot the broker's producer state at the log end (nothing without an attached source)."""
        if self._producer_source is not None:
            snapshots.write_snapshot(self.dir, self._end_offset, self._producer_source())

    # Compaction ------------------------------------------------------------------------

    def attach_last_stable_offset(self, source: Callable[[], int]) -> None:
        self._stable_offset_source = source

    def _truncated(self, offset: int) -> None:
        self._generation += 1
        self._dirty_floor = offset if self._dirty_floor is None else min(self._dirty_floor, offset)

    def _cleanable_range(self, now_ms: int) -> tuple[int, int]:
        """``(first dirty offset, first uncleanable offset)``, Kafka's ``cleanableOffsets``; under the lock.

        Cleaning stops at the last stable offset, the active segment and the
        first dirty segment holding a record newer than min.compaction.lag.ms.
        """
        if self._first_dirty is None:
            self._first_dirty = cleaner_checkpoint.first_dirty_offset(self._log_dir.path, self.tp)
        first_dirty = self._first_dirty
        if self._dirty_floor is not None:
            first_dirty = min(first_dirty, self._dirty_floor)
        if not self._log_start_offset <= first_dirty <= self._end_offset:
            first_dirty = self._log_start_offset
        assert self._stable_offset_source is not None
        end = min(self._stable_offset_source(), self._segments[-1].base_offset)
        lag = self.config.min_compaction_lag_ms
        if lag > 0:
            for segment in self._segments[self._segment_index(first_dirty) : -1]:
                if segment.largest_timestamp() > now_ms - lag:
                    end = min(end, segment.base_offset)
                    break
        return min(first_dirty, end), end

    @_locked
    def cleaning_priority(self, now_ms: int) -> tuple[float, bool] | None:
        """``(dirty ratio, due)`` for the cleaner threads' choice (Kafka's ``LogToClean``); None when there is nothing to clean.

        Due: records older than max.compaction.lag.ms are dirty, or a kept
        tombstone's delete horizon has passed.
        """
        self.compaction_delay_ms = 0
        if self.closed or not self.config.compact or self._stable_offset_source is None:
            return None
        first_dirty, end = self._cleanable_range(now_ms)
        dirty_from = self._segment_index(first_dirty)
        clean_bytes = sum(segment.size for segment in self._segments[:dirty_from])
        dirty_bytes = sum(s.size for s in self._segments[dirty_from:] if s.base_offset < end)
        tombstones_due = 0 <= self._delete_horizon <= now_ms
        if dirty_bytes == 0 and not tombstones_due:
            return None
        due = tombstones_due
        if dirty_bytes and self.config.max_compaction_lag_ms < now_ms:
            first_timestamp = self._segments[dirty_from].first_batch_timestamp()
            overdue = now_ms - self.config.max_compaction_lag_ms - first_timestamp
            if first_timestamp >= 0 and overdue > 0:
                due, self.compaction_delay_ms = True, overdue
        return dirty_bytes / max(clean_bytes + dirty_bytes, 1), due

    @_offline_rule
    def clean(self, now_ms: int, options: CleanerOptions | None = None) -> CleanerStats:
        """One pass of the cleaner (:mod:`josef_storage_local.compaction`), the log lock held only to plan and to swap.

        A pass given up (the log closed, truncated or moved, the storage
        stopping) changes nothing and returns empty stats.
        """
        if not self.config.compact or self._stable_offset_source is None:
            return CleanerStats()
        with self._cleaning:
            started = time.monotonic()
            plan = self._plan_cleaning(now_ms)
            if plan is None:
                return CleanerStats()
            try:
                return self._run_cleaning(plan, options or CleanerOptions(), started)
            except CleaningAborted as exc:
                logger.info("%s: cleaning given up: %s", self.tp, exc)
                return CleanerStats()
            except (OSError, CorruptRecordError) as exc:
                if self.closed or self._generation != plan.generation:
                    # Files deleted, moved or cut under the pass: what it read or wrote no longer matters.
                    logger.info("%s: cleaning given up, the log was closed or changed: %s", self.tp, exc)
                    return CleanerStats()
                if isinstance(exc, CorruptRecordError):
                    raise
                raise dir_error(exc, "cleaning the log in", self.dir) from exc
            finally:
                plan.close()

    @_locked
    def _plan_cleaning(self, now_ms: int) -> CleaningPlan | None:
        if self.closed:
            return None
        first_dirty, end = self._cleanable_range(now_ms)
        tombstones_due = 0 <= self._delete_horizon <= now_ms
        if first_dirty >= end and not tombstones_due:
            return None
        sources = []
        try:
            for i, segment in enumerate(self._segments[:-1]):
                if segment.base_offset >= end:
                    break
                sources.append(SourceSegment(segment, os.open(segment.path, os.O_RDONLY), segment.size,
                                             segment.base_offset, self._segments[i + 1].base_offset,
                                             len(segment.txn_index.entries)))
        except OSError as exc:
            for source in sources:
                os.close(source.fd)
            raise dir_error(exc, "opening segments to clean in", self.dir) from exc
        producers = {}
        if self._producer_source is not None:
            for entry in self._producer_source():
                last_data = entry.batches[-1].last_offset if entry.batches else None
                producers[entry.producer_id] = (last_data, entry.epoch)
        config = self.config
        return CleaningPlan(
            dir=self.dir, segments=sources, first_dirty=first_dirty, end=end, now_ms=now_ms,
            delete_retention_ms=config.delete_retention_ms, segment_bytes=config.segment_bytes,
            segment_index_bytes=config.segment_index_bytes, index_interval_bytes=config.index_interval_bytes,
            aborted=[txn for source in sources for txn in source.segment.txn_index.entries if txn.last_offset < end],
            producers=producers, generation=self._generation,
        )

    def _run_cleaning(self, plan: CleaningPlan, options: CleanerOptions, started: float) -> CleanerStats:
        counters = Counters()
        offsets = OffsetMap(options.map_capacity)
        clean_end = max(build_offset_map(plan, offsets, options, Counters()), plan.first_dirty)
        options.map_used(len(offsets), offsets.capacity)
        offsets.latest_offset = clean_end - 1
        horizon = -1
        todo = [source for source in plan.segments if source.base_offset < clean_end]
        txns = CleanedTxns(plan.aborted)
        for group in group_segments(todo, plan.segment_bytes, plan.segment_index_bytes):
            cleaned = clean_group(plan, group, offsets, txns, options, counters)
            if not self._swap_in(cleaned, plan.generation):
                remove_cleaned(plan.dir, cleaned.base_offset)
                raise CleaningAborted("the log changed under the cleaner")
            if cleaned.delete_horizon >= 0 and (horizon < 0 or cleaned.delete_horizon < horizon):
                horizon = cleaned.delete_horizon
        with self._lock:
            if self.closed or self._generation != plan.generation:
                raise CleaningAborted("the log changed under the cleaner")
            cleaner_checkpoint.update(self._log_dir.path, self.tp, clean_end)
            self._first_dirty = clean_end
            self._delete_horizon = horizon
            self._dirty_floor = None
        return counters.stats(clean_end, started)

    @_locked
    def _swap_in(self, cleaned: CleanedSegment, generation: int) -> bool:
        """Replace the segments a rewrite covers, crash-safely (:mod:`josef_storage_local.swap`); False if they changed."""
        if self.closed or self._generation != generation:
            return False
        old = cleaned.replaces
        first = next((i for i, s in enumerate(self._segments) if s is old[0].segment), None)
        if first is None or first + len(old) >= len(self._segments):
            return False
        for source, segment in zip(old, self._segments[first:]):
            if segment is not source.segment or segment.size != source.size or (
                    len(segment.txn_index.entries) != source.txn_entries):
                return False
        base = cleaned.base_offset
        try:
            swap.commit(self.dir, base)
            self._delete_segments([source.segment for source in old])
            swap.finish(self.dir, base)
            segment = Segment(self.dir, base, self.config, self._clock())
            segment.txn_index.load()
            segment.seal()
        except (OSError, ValueError) as exc:
            raise LogDirError(f"{self.tp}: swapping in the cleaned segment {base} failed: {exc}") from exc
        self._segments[first : first + len(old)] = [segment]
        return True

    # Aborted transactions -------------------------------------------------------------

    @_locked
    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Index ``txn`` in the segment holding its marker: the active one, except while the broker replays after a load."""
        if txn.last_offset <= self._last_aborted_offset():
            return
        if txn.last_offset >= self._end_offset:
            raise ValueError(
                f"{self.tp}: an aborted transaction's marker at {txn.last_offset} is past the log end {self._end_offset}"
            )
        if txn.last_offset < self._segments[0].base_offset:
            return  # retention already deleted the marker's segment
        try:
            self._segments[self._segment_index(txn.last_offset)].txn_index.append(txn)
        except OSError as exc:
            raise dir_error(exc, "indexing an aborted transaction in", self.dir) from exc
        if txn.last_offset < self._recovery_point and (
            self._unflushed_txn_offset is None or txn.last_offset < self._unflushed_txn_offset
        ):
            self._unflushed_txn_offset = txn.last_offset

    def _last_aborted_offset(self) -> int:
        """The marker offset of the last indexed aborted transaction; -1 when there is none."""
        for segment in reversed(self._segments):
            if segment.txn_index.entries:
                return segment.txn_index.entries[-1].last_offset
        return -1

    @_locked
    def aborted_txns(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Kafka's ``collectAbortedTransactions``: from the segment holding ``start_offset``, until an entry says the search is complete.

        In memory, per segment; segments without aborted transactions cost a
        length check each.
        """
        found: list[AbortedTxn] = []
        for segment in itertools.islice(self._segments, self._segment_index(start_offset), None):
            if segment.txn_index.collect(start_offset, upper_offset, found):
                break
        return found

    @_locked
    def install_producer_snapshot(self, offset: int, data: bytes) -> None:
        producers = snapshots.decode(data)  # ValueError: not a snapshot, nothing written
        try:
            snapshots.write_snapshot(self.dir, offset, producers)
        except OSError as exc:
            raise dir_error(exc, "writing a producer snapshot in", self.dir) from exc

    async def remote_producer_snapshot(self, offset: int) -> bytes | None:
        return None  # nothing of this log is anywhere but here

    @_locked
    def latest_producer_snapshot(self) -> ProducerSnapshot | None:
        try:
            for offset in reversed(snapshots.list_snapshots(self.dir)):
                if not self._log_start_offset <= offset <= self._end_offset:
                    continue
                try:
                    return ProducerSnapshot(offset, snapshots.read_snapshot(self.dir, offset))
                except ValueError as exc:
                    logger.warning("deleting unreadable producer snapshot: %s", exc)
                    snapshots.delete_snapshot(self.dir, offset)
        except OSError as exc:
            raise dir_error(exc, "reading producer snapshots in", self.dir) from exc
        return None

    def batch_headers(self, start_offset: int) -> Iterator[BatchHeader]:
        with self._lock:
            segments = self._segments[self._segment_index(start_offset) :]
        try:
            for segment in segments:
                for fields in segment.batch_headers(start_offset):
                    yield BatchHeader(*fields)
        except OSError as exc:
            raise dir_error(exc, "reading batch headers in", self.dir) from exc

    def _delete_snapshots(self, below: int = -1, above: int | None = None) -> None:
        """Remove producer snapshots below ``below`` (retention) or above ``above`` (truncation)."""
        for offset in snapshots.list_snapshots(self.dir):
            if offset < below or (above is not None and offset > above):
                snapshots.delete_snapshot(self.dir, offset)

    # Segments --------------------------------------------------------------------------

    @_serialised
    def closed_segments(self) -> list[ClosedSegment]:
        segments = self._segments
        closed = []
        for i in range(self._segment_index(self._log_start_offset), len(segments) - 1):
            segment, next_offset = segments[i], segments[i + 1].base_offset
            snapshot = snapshots.snapshot_path(self.dir, next_offset)
            txn_index = segment.txn_index.path if segment.txn_index.entries else None
            closed.append(
                ClosedSegment(
                    base_offset=segment.base_offset,
                    next_offset=next_offset,
                    size_bytes=segment.size,
                    max_timestamp_ms=segment.max_timestamp,
                    log=segment.path,
                    offset_index=segment.offset_index.path,
                    time_index=segment.time_index.path,
                    transaction_index=txn_index,
                    producer_snapshot=snapshot if snapshot.exists() else None,
                )
            )
        return closed

    def attach_retention_limit(self, source: Callable[[], int]) -> None:
        self._retention_limit = source

    # Housekeeping ----------------------------------------------------------------------

    @_locked
    def delete_records_before(self, offset: int) -> int:
        if offset > self._end_offset:
            raise OffsetOutOfRangeError(
                f"{self.tp}: cannot delete records before {offset}, past the log end {self._end_offset}"
            )
        if offset > self._log_start_offset:
            self._log_start_offset = offset
            self._epochs.truncate_from_start(offset)
            self._record_offsets()
            try:
                self._delete_snapshots(below=offset)
                self._epochs.checkpoint()
                self._log_dir.checkpoint()
            except OSError as exc:
                raise dir_error(exc, "writing checkpoints for", self.dir) from exc
        return self._log_start_offset

    @_locked
    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest segments while they end below the log start, are past retention.ms or exceed retention.bytes.

        The active segment is never deleted. Files are renamed to
        ``.deleted`` and removed after file.delete.delay.ms (:meth:`_delete_segments`).
        """
        segments, config = self._segments, self.config
        count = 0
        while (
            count < len(segments) - 1 and segments[count + 1].base_offset <= self._log_start_offset
        ):
            count += 1
        if "delete" in config.cleanup_policy:
            # Segments retention may take: all but the active one, and with a limit only those wholly below it.
            limit = len(segments) - 1
            if self._retention_limit is not None:
                bound = self._retention_limit()
                while limit > 0 and segments[limit].base_offset > bound:
                    limit -= 1
            if config.retention_ms >= 0:
                while (
                    count < limit
                    and now_ms - segments[count].largest_timestamp() > config.retention_ms
                ):
                    count += 1
            if config.retention_bytes >= 0:
                excess = (
                    self.size_bytes - config.retention_bytes - sum(s.size for s in segments[:count])
                )
                while count < limit and excess >= segments[count].size:
                    excess -= segments[count].size
                    count += 1
        if count == 0:
            return 0
        doomed = segments[:count]
        del segments[:count]
        self._log_start_offset = max(self._log_start_offset, segments[0].base_offset)
        self._epochs.truncate_from_start(self._log_start_offset)
        self._record_offsets()
        try:
            self._delete_segments(doomed)
            self._delete_snapshots(below=self._log_start_offset)
            self._epochs.checkpoint()
            self._log_dir.checkpoint()
        except OSError as exc:
            raise dir_error(exc, "deleting old segments in", self.dir) from exc
        return count

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    def attach_scheduler(self, scheduler: Scheduler) -> None:
        """Hand rolled segments' flushes and deleted files to the storage's background thread."""
        self._scheduler = scheduler

    def _delete_segments(self, segments: Sequence[Segment]) -> None:
        """Take ``segments``' files out of the log (renamed ``.deleted``) and remove them after file.delete.delay.ms.

        Retention, truncation and the cleaner's swaps all delete through
        here. Without a background thread the files go at once.
        """
        doomed = [path for segment in segments for path in segment.delete()]
        if self._scheduler is None:
            remove_files(doomed)
        elif doomed:
            self._scheduler.delete_later(doomed, self.config.file_delete_delay_ms)

    @_offline_rule
    def flush_up_to(self, offset: int) -> None:
        """fsync the segments below ``offset`` and move the recovery point there (Kafka's flushUptoOffsetExclusive).

        The background thread calls this after a roll with the new
        segment's base offset: only sealed segments are written, and the
        fsyncs run outside the log's lock, so appends and reads go on
        meanwhile. A segment deleted during its fsync (retention,
        truncation, the log deleted) is skipped; a truncation meanwhile
        leaves the recovery point alone.
        """
        with self._lock:
            if self.closed or offset <= self._recovery_point or offset > self._end_offset:
                return
            flush_from = self._recovery_point
            if self._unflushed_txn_offset is not None:
                flush_from = min(flush_from, self._unflushed_txn_offset)
            pending_txn, truncations = self._unflushed_txn_offset, self._truncations
            segments = [
                segment
                for segment in itertools.islice(self._segments, self._segment_index(flush_from), None)
                if segment.base_offset < offset
            ]
            try:
                self._epochs.checkpoint()
            except OSError as exc:
                raise dir_error(exc, "writing the leader-epoch checkpoint in", self.dir) from exc
        started = time.monotonic()
        try:
            for segment in segments:
                try:
                    segment.flush()
                except (OSError, ValueError):
                    if not segment.closed:
                        raise
            fsync_dir(self.dir)
        except OSError as exc:
            if self.closed:
                return
            raise dir_error(exc, "flushing the log in", self.dir) from exc
        if self._flush_stats is not None:
            self._flush_stats.record(started)
        with self._lock:
            if self.closed or truncations != self._truncations or offset <= self._recovery_point:
                return
            self._recovery_point = offset
            if self._unflushed_txn_offset == pending_txn:
                self._unflushed_txn_offset = None
            self._last_flush_ms = self._clock()
            self._record_offsets()

    @_locked
    def flush_if_due(self, now_ms: int) -> None:
        """Flush if flush.ms has passed since the last flush (Kafka's kafka-log-flusher task).

        A full :meth:`flush`, under the lock: it writes the active segment,
        which appends change; rolls have already flushed what lies below it.
        """
        if not self.closed and now_ms - self._last_flush_ms >= self.config.flush_ms:
            self.flush()

    @_locked
    def flush(self) -> None:
        """fsync every segment from the one holding the recovery point, then move the recovery point to the end.

        Segment files include the transaction index; one written below the
        recovery point (a replay) is reached too.

        The epoch cache is checkpointed first: epochs learnt from appends are
        only in memory, and recovery relearns them only above the recovery point.
        """
        end_offset = self._end_offset
        flush_from = self._recovery_point
        if self._unflushed_txn_offset is not None:
            flush_from = min(flush_from, self._unflushed_txn_offset)
        started = time.monotonic()
        try:
            for segment in itertools.islice(
                self._segments, self._segment_index(flush_from), None
            ):
                segment.flush()
            self._epochs.checkpoint()
            self._recovery_point = end_offset
            self._unflushed_txn_offset = None
            self._unflushed_messages = 0
            self._last_flush_ms = self._clock()
            self._record_offsets()
            self._log_dir.checkpoint_if_due()
        except OSError as exc:
            raise dir_error(exc, "flushing the log in", self.dir) from exc
        if self._flush_stats is not None:
            self._flush_stats.record(started)

    @_serialised
    def close(self) -> None:
        """Close cleanly; in an offline directory only release the files, since the disk may not be touched."""
        if self.closed:
            return
        if self._log_dir.error is not None:
            self.release()
            return
        self._close_files()
        self.closed = True

    def _close_files(self) -> None:
        """What :meth:`close` does to the files, without marking the log closed (:meth:`relocate` reopens it)."""
        try:
            self._write_producer_snapshot()
            self._segments[-1].seal()
            self.flush()
            for segment in self._segments:
                segment.close()
        except OSError as exc:
            raise dir_error(exc, "closing the log in", self.dir) from exc

    @_serialised
    def relocate(self, finish: Callable[[], tuple[Path, LogDir]]) -> None:
        """Close the files, let ``finish`` complete the copy and return the new place, then reopen there.

        The lock is held throughout, so appends and reads from the event loop
        wait for the switch instead of failing on closed files or landing in
        the old directory; the log is never marked closed, so the storage
        does not open a second copy meanwhile. When ``finish`` fails the log
        reopens where it was. Producer state and callers' references survive:
        this object stays the log.
        """
        if self.closed:
            raise LogDirError(f"{self.tp}: the log was closed (deleted?) during its move")
        self._generation += 1
        self._close_files()
        old_dir = self._log_dir.path
        try:
            self.dir, self._log_dir = finish()
            if self._first_dirty is not None and self._first_dirty >= 0:  # the cleaner's checkpoint moves along
                cleaner_checkpoint.update(self._log_dir.path, self.tp, self._first_dirty)
                cleaner_checkpoint.update(old_dir, self.tp, None)
        finally:
            try:
                self._load(recover=False)
            except OSError as exc:
                raise dir_error(exc, "reopening the log in", self.dir) from exc

    @_serialised
    def release(self) -> None:
        """Close the files without flushing or trimming anything: the log is about to be deleted (or, in tests, to "crash")."""
        if not self.closed:
            for segment in self._segments:
                segment.close()
            self.closed = True
