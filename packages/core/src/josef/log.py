"""The contract between the broker and a log storage backend.

A :class:`LogStorage` owns the partition logs of one broker. A :class:`Log`
is one partition's append-only sequence of record batches, stored exactly as
they travel on the wire. The broker (through :mod:`josef.replication.partition`)
validates batches and assigns offsets before calling :meth:`Log.append`, so a
backend never parses records; it keeps the offset and time indexes, the
leader-epoch cache, the log start offset and snapshots of the broker's
producer state, recovers after a crash, and applies retention.

Methods are called from the broker's event loop and must not block for long:
appends and reads go to the page cache; fsync and file deletion belong in
:meth:`Log.flush`, :meth:`Log.apply_retention` and :meth:`LogStorage.delete`,
which the broker runs in worker threads. Those may overlap with appends and
reads of the same log from the event loop, so a backend must make them safe
(a per-log lock held briefly is enough); calls from the loop never overlap.

A storage may spread logs over several directories (``log.dirs``, often one
per disk). DescribeLogDirs reports them (:meth:`LogStorage.log_dirs`,
:meth:`LogStorage.dir_of`) and AlterReplicaLogDirs moves a log between them
(:meth:`LogStorage.move`), which also runs in a worker thread. New logs go
to the online directory holding the fewest partitions (Kafka's
``LogManager.nextLogDirs``).

Tiered storage (KIP-405) composes over a local storage rather than
replacing it: a plugin's ``wrap_log_storage`` hook layers its own
:class:`LogStorage` over the one ``log.storage`` selected, and its logs
wrap the local ones. Everything the layer needs of the local log is in this
contract, whatever backend it is: the closed segments and their companion
files (:meth:`Log.closed_segments`), a bound on what retention may delete
(:meth:`Log.attach_retention_limit`), and two log starts
(:attr:`Log.log_start_offset`, :attr:`Log.local_log_start_offset`). Reads
below the local log start go to remote storage and are awaited
(:meth:`Log.read_remote`): :meth:`Log.read` and :meth:`Log.read_region`
stay synchronous and as fast as before for everything held locally.
These members came with plugin API 1.3; the broker treats a log without
them (a storage written for 1.2) as one that is not tiered.

A failed disk takes its directory offline, alone (Kafka's
LogDirFailureChannel): the first :class:`LogDirError` raised by a log, or
by the storage about a directory, marks that directory offline until the
storage is started again. From then on every call on a log in it raises
:class:`LogDirError` at once without touching the disk (``close`` only
releases it), :meth:`LogStorage.log_dirs` reports the directory with its
error, :meth:`LogStorage.offline_dirs` names it, and no new log goes there;
logs in the other directories are not affected. The broker polls
:meth:`LogStorage.offline_dirs` to stop serving the directory's partitions
and tell the controller; when every directory is offline it stops, as
Kafka does.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import attrs

from josef.config import Config
from josef.producer.producer_state import ProducerEntry, ProducerSnapshot
from josef.protocol.records import AppendInfo, BatchHeader
from josef.protocol.topic_partition import TopicPartition


@attrs.frozen
class LogConfig:
    """The topic-level settings a log obeys, resolved from broker defaults and topic overrides."""

    segment_bytes: int = 1073741824
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    file_delete_delay_ms: int = 60000
    cleanup_policy: tuple[str, ...] = ("delete",)
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    min_cleanable_dirty_ratio: float = 0.5
    #: Tiered storage: on for the topic, and how much stays local (-2: as much as ``retention_*``).
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @classmethod
    def from_topic_config(cls, values: Mapping[str, Any]) -> LogConfig:
        """Build from topic-level keys (``segment.bytes``...) as :meth:`josef.config.Config.topic_config` gives them."""
        names = {f.name: f.name.replace("_", ".") for f in attrs.fields(cls)}
        kwargs = {field: values[key] for field, key in names.items() if key in values and values[key] is not None}
        if "cleanup_policy" in kwargs:
            kwargs["cleanup_policy"] = tuple(kwargs["cleanup_policy"])
        return cls(**kwargs)


def remote_storage_enabled(topic: str, explicit: bool | None, default: bool, cleanup_policy: Sequence[str]) -> bool:
    """Whether ``topic`` is tiered: its own ``remote.storage.enable`` (``explicit``, None when unset), else the
    brokers' ``log.remote.storage.enable`` (josef's default of it; Kafka has none) for a topic that may be tiered.

    Kafka refuses remote storage to internal and compacted topics, so the
    default leaves them local rather than refusing them.
    """
    if explicit is not None:
        return explicit
    return default and not topic.startswith("__") and "compact" not in cleanup_policy


@attrs.frozen
class AbortedTxn:
    """One aborted transaction of a partition (an entry of Kafka's ``.txnindex``).

    ``first_offset`` is the producer's first offset in the transaction,
    ``last_offset`` the offset of its ABORT marker, ``last_stable_offset``
    the partition's last stable offset once the marker was written: the
    first offset of the oldest transaction still open then, or
    ``last_offset + 1`` when none is (Kafka's
    ``ProducerStateManager.lastStableOffset(completedTxn)``). It must not be
    larger: :meth:`Log.aborted_txns` stops searching at it, as Kafka does. A
    ``read_committed`` fetch sends the ``(producer_id, first_offset)`` of
    every aborted transaction overlapping the range it returns, so the
    consumer drops those batches.
    """

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@attrs.frozen
class CleanerStats:
    """What one cleaning of a log did (Kafka's ``CleanerStats``): for the cleaner's log line, metrics and benchmarks.

    ``cleaned_to`` is the first offset the cleaning did not reach (the
    start of the log's dirty section from then on); -1 when nothing was
    cleanable.
    """

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    cleaned_to: int = -1
    elapsed_s: float = 0.0


@attrs.frozen
class EpochEntry:
    """First offset written under a leader epoch (one line of leader-epoch-checkpoint)."""

    epoch: int
    start_offset: int


def end_offset_for_epoch(entries: Sequence[EpochEntry], epoch: int, log_end_offset: int) -> tuple[int, int]:
    """Kafka's ``LeaderEpochFileCache.endOffsetFor``: ``(largest known epoch <= epoch, start offset of the next
    epoch)`` over a log's epoch entries, oldest first.

    The latest epoch ends at the log end offset; an epoch above the latest,
    or no entries, is unknown: ``(-1, -1)``. An epoch below the first known
    one answers ``(epoch, first start offset)``.
    """
    if epoch < 0 or not entries or epoch > entries[-1].epoch:
        return -1, -1
    if epoch == entries[-1].epoch:
        return epoch, log_end_offset
    higher = bisect.bisect_right(entries, epoch, key=lambda e: e.epoch)
    floor_epoch = entries[higher - 1].epoch if higher else epoch
    return floor_epoch, entries[higher].start_offset


class FileRegion:
    """Bytes ``[offset, offset + size)`` of an open file: record data a response sends with ``os.sendfile`` (Kafka's
    ``FileRecords``).

    The region owns ``fd`` (a duplicate of the segment's), so the bytes stay
    readable whatever happens to the segment meanwhile; it is closed once
    sent, or when the region is dropped unsent. ``bytes(region)`` reads them
    (for paths that need a copy: TLS, in-process callers).
    """

    __slots__ = ("fd", "offset", "size")

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self.fd = fd
        self.offset = offset
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return self.read(self.offset, self.size)

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` of the file (short reads continued)."""
        parts = []
        while size > 0:
            chunk = os.pread(self.fd, size, offset)
            if not chunk:
                raise OSError(f"file ends {size} bytes before the region does")
            parts.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, size={self.size})"


class OffsetOutOfRangeError(Exception):
    """A read asked for an offset below the log start offset or above the log end offset."""


class OffsetMovedToTieredStorageError(Exception):
    """A read asked for an offset that is no longer held locally but in remote storage (between
    :attr:`Log.log_start_offset` and :attr:`Log.local_log_start_offset`): consumers read it with
    :meth:`Log.read_remote`; a follower is answered OFFSET_MOVED_TO_TIERED_STORAGE, as in Kafka."""


class LogDirError(Exception):
    """The disk under a log failed (full, read-only, gone): KAFKA_STORAGE_ERROR to clients."""


class LogDirNotFoundError(Exception):
    """A path that is not one of the storage's log directories: LOG_DIR_NOT_FOUND to clients."""


@attrs.frozen
class LogDirInfo:
    """One log directory as DescribeLogDirs reports it: where, how big its volume is, whether it works.

    Sizes are of the volume (what an operator balancing disks needs), -1
    when unknown; ``error`` says why an offline directory cannot be used.
    """

    path: str
    total_bytes: int = -1
    usable_bytes: int = -1
    error: str | None = None


@attrs.frozen
class ClosedSegment:
    """A segment that takes no more appends, with the files tiered storage copies (Kafka's ``LogSegmentData``).

    ``next_offset`` is the offset after its last batch: the next segment's
    base offset. ``producer_snapshot`` is the broker's producer state at
    ``next_offset`` (written when the segment rolled), None when the log
    keeps none there (the metadata log; a snapshot lost in a crash).
    ``transaction_index`` is None when the segment holds no aborted
    transaction. A local backend that keeps no such files gives the bytes
    in files it writes for the purpose; the paths stay valid until
    retention deletes the segment.
    """

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int
    log: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot: Path | None


@attrs.frozen
class RemoteRecords:
    """What :meth:`Log.read_remote` answers: whole batches as :meth:`Log.read` gives them, and for a
    ``read_committed`` read the aborted transactions overlapping them (from the remote transaction indexes)."""

    records: bytes
    aborted_txns: list[AbortedTxn] = attrs.Factory(list)


@runtime_checkable
class Log(Protocol):
    tp: TopicPartition
    config: LogConfig
    #: Directory of this log (``<log.dir>/<topic>-<partition>``).
    dir: Path

    @property
    def log_start_offset(self) -> int:
        """First offset a consumer can read; raised by retention and DeleteRecords."""

    @property
    def local_log_start_offset(self) -> int:
        """First offset held locally, which :meth:`read` and :meth:`read_region` serve.

        Equal to :attr:`log_start_offset` for a log that is not tiered; above
        it once segments were copied to remote storage and deleted locally
        (``local.retention.ms``/``local.retention.bytes``).
        """

    @property
    def highest_offset_in_remote_storage(self) -> int:
        """The last offset copied to remote storage (ListOffsets LATEST_TIERED, -5); -1 when nothing is, or the log
        is not tiered."""

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended batch gets (LEO)."""

    @property
    def size_bytes(self) -> int:
        """Bytes of all segments."""

    def append(self, records: bytes | bytearray | memoryview, info: AppendInfo) -> None:
        """Append validated batches whose offsets start at :attr:`log_end_offset`.

        Rolls a new segment first when the active one is full
        (``segment.bytes``) or old (``segment.ms``), adds index entries every
        ``index.interval.bytes`` and time-index entries for new max
        timestamps, and flushes when ``flush.messages``/``flush.ms`` say so.
        Raises :class:`LogDirError` when the disk fails, leaving the log as
        it was before the call.
        """

    def read(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True) -> bytes:
        """Whole batches holding ``offset`` and after, below ``max_offset`` (exclusive), up to ``max_bytes``.

        The first batch may start before ``offset`` (clients skip the
        records they did not ask for). With ``min_one_batch`` the first batch
        is returned even when it is larger than ``max_bytes`` (KIP-74).
        Returns ``b""`` at the end of the log. Raises
        :class:`OffsetOutOfRangeError` below the log start or above the end,
        and :class:`OffsetMovedToTieredStorageError` between the log start
        and the local log start.
        """

    def read_region(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True) -> bytes | FileRegion:
        """What :meth:`read` returns, or a :class:`FileRegion` of the same bytes, for the network to send zero-copy.

        A storage that keeps the batches in a file returns a region when
        that saves copying (large reads), and bytes otherwise; one that
        does not may always return bytes. The region stays readable after
        its segment is deleted (retention, cleaning, a deleted or moved
        partition): it holds its own descriptor until it is closed. A
        segment cut short in place (a follower truncating) can make it
        fail to read, as Kafka's ``FileRecords`` does.
        """

    async def read_remote(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True,
                          read_committed: bool = False) -> RemoteRecords:
        """What :meth:`read` answers for an offset below :attr:`local_log_start_offset`, read from remote storage.

        Awaited on the event loop; the remote I/O runs in the storage's
        reader threads (``remote.log.reader.threads``). Answers from one
        remote segment at most, like Kafka's remote fetch, so a client asks
        again from where it ended. With ``read_committed`` it also gives the
        aborted transactions overlapping the batches. Raises
        :class:`OffsetOutOfRangeError` outside ``[log_start_offset,
        local_log_start_offset)`` (always, for a log that is not tiered) and
        :class:`LogDirError` when remote storage fails or holds corrupt data
        (KAFKA_STORAGE_ERROR for that read; the log goes on serving).
        """

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record whose timestamp is >= ``timestamp``, or None.

        Searches what is held locally, from :attr:`local_log_start_offset`.
        """

    async def remote_offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """:meth:`offset_for_timestamp` over remote storage, below :attr:`local_log_start_offset`; None when no
        remote record qualifies (always, for a log that is not tiered).

        ListOffsets asks it first, then the local log. Awaited on the event
        loop; remote I/O runs in the storage's reader threads; raises
        :class:`LogDirError` when remote storage fails.
        """

    def max_timestamp(self) -> tuple[int, int]:
        """``(timestamp, offset)`` of the record with the largest timestamp; ``(-1, -1)`` when empty."""

    # Leader epochs -------------------------------------------------------------

    def epoch_entries(self) -> Sequence[EpochEntry]:
        """The leader-epoch cache, oldest first."""

    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (ignored if not newer than the latest); checkpointed."""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """``(largest epoch <= epoch, end offset of that epoch)``, Kafka's OffsetsForLeaderEpoch; ``(-1, -1)`` if unknown."""

    def truncate_fully_and_start_at(self, offset: int, log_start_offset: int | None = None) -> None:
        """Delete every batch and start empty at ``offset``, which may be past the end (Kafka's truncateFullyAndStartAt).

        What a replica does when its leader's log starts after everything it
        holds: it continues from a snapshot (the metadata log) or the leader's
        log start. ``log_start_offset`` (plugin API 1.4), below ``offset``, is
        given only to a tiered log whose replica starts at its leader's local
        log start: what lies between is in remote storage, and the log starts
        there. A log that keeps everything locally starts at ``offset``.
        """

    def truncate_to(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (a follower diverging from its leader).

        Producer snapshots above the new log end go too; the broker then
        reloads its producer state (:meth:`josef.replication.partition.Partition.truncate_to`).
        """

    # Segments -------------------------------------------------------------------

    def closed_segments(self) -> list[ClosedSegment]:
        """Every segment but the active one, from the local log start on, oldest first (what tiered storage copies).

        Cheap: no disk reads. Read the files in a worker thread.
        """

    def attach_retention_limit(self, source: Callable[[], int]) -> None:
        """Bound time and size retention by ``source()``: :meth:`apply_retention` deletes a segment for
        ``retention.ms``/``retention.bytes`` only when its ``next_offset`` is at most ``source()``.

        Tiered storage gives the offset after the last segment it copied,
        so nothing leaves the disk before it is in remote storage; segments
        wholly below the log start (DeleteRecords) go regardless. Called
        from worker threads. A log without a source is not bounded.
        """

    # Producer state -----------------------------------------------------------
    #
    # The broker owns the idempotent-producer state machine
    # (:mod:`josef.producer.producer_state`); the log stores its snapshots beside the
    # segments, as Kafka's ``<offset>.snapshot`` files, so a restart does not
    # replay the whole log. A snapshot at offset N holds the state after every
    # batch below N. The backend chooses the file format.

    def attach_producer_state(self, source: Callable[[], Sequence[ProducerEntry]]) -> None:
        """Give the log the broker's producer state, which it snapshots from then on.

        The log calls ``source()`` when it rolls a segment (before the append
        that rolled it, so the entries are the state at the new segment's base
        offset: the broker updates its state only after :meth:`append`
        returns) and in :meth:`close`, and stores the entries as a snapshot at
        that offset. Called on the thread that calls :meth:`append` and
        :meth:`close`, and by cleaner threads, which keep the last batch of
        every producer it names: ``source()`` must be safe to call from
        another thread (a copy of the state, taken without yielding, as
        :meth:`josef.producer.producer_state.ProducerStateManager.snapshot` is). A log
        without a source (the metadata log) writes no snapshots.
        """

    def install_producer_snapshot(self, offset: int, data: bytes) -> None:
        """Store ``data``, a producer snapshot in this storage's own format (the bytes of a
        :attr:`ClosedSegment.producer_snapshot` file), as the snapshot at ``offset``.

        What a follower starting at its leader's local log start does with
        the snapshot that remote storage kept (:meth:`remote_producer_snapshot`).
        :class:`ValueError` when ``data`` cannot be a snapshot; nothing is stored then.
        """

    async def remote_producer_snapshot(self, offset: int) -> bytes | None:
        """The producer snapshot, as remote storage keeps it, of the remote segment ending just below ``offset``.

        A follower whose leader answered OFFSET_MOVED_TO_TIERED_STORAGE
        starts empty at the leader's local log start; everything below is
        only in remote storage, and so is the producer state there, which
        the broker needs to keep idempotence and transactions whole (Kafka's
        ``buildRemoteLogAuxState``). None for a log without remote storage,
        or a segment copied without a snapshot. Raises
        :class:`josef.remote_storage.RemoteStorageError` when remote storage
        cannot answer yet (no such segment known, a failed fetch): the
        follower tries again later.
        """

    def latest_producer_snapshot(self) -> ProducerSnapshot | None:
        """The newest readable snapshot between the log start and end offsets, or None.

        Unreadable (corrupt) snapshots are skipped and removed. The broker
        loads this, then replays :meth:`batch_headers` from its offset.
        """

    def batch_headers(self, start_offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one holding ``start_offset`` to the log end, oldest first.

        Reads headers only, never records: what the broker rebuilds producer
        state from. Consume the iterator at once, on the thread that appends,
        before appending again.
        """

    # Aborted transactions -----------------------------------------------------
    #
    # The broker decides what was aborted (it owns the producer state and
    # sees every ABORT marker, as leader and as follower) and tells the log,
    # which keeps the entries with the segment holding the marker, so they
    # go with it on retention and truncation.

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Index an aborted transaction whose ABORT marker (``txn.last_offset``) is already in the log.

        Ignored when an entry for a marker at or after ``txn.last_offset``
        is already indexed: the broker re-reports the markers of the batches
        it replays after a restart (from the producer snapshot on), so this
        must be idempotent. Entries above the log end are dropped by
        :meth:`truncate_to` with their batches. A marker at or past the log
        end is a ``ValueError``.

        Durable once :meth:`flush` returns (or the log is closed). After an
        unclean shutdown the log may lose entries whose batches it keeps; it
        then removes the producer snapshots past them, so that the broker's
        replay from :meth:`latest_producer_snapshot` reports them again.
        """

    def aborted_txns(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping ``[start_offset, upper_offset)``, by marker offset.

        That is every entry with ``last_offset >= start_offset`` and
        ``first_offset < upper_offset`` (Kafka's ``collectAbortedTransactions``):
        what a ``read_committed`` fetch from ``start_offset`` needs, with
        ``upper_offset`` the end of what it returns. Like Kafka, the search
        walks the markers from ``start_offset`` on and ends after the first
        entry whose ``last_stable_offset >= upper_offset`` (no transaction
        begun below ``upper_offset`` was open after that marker), else at
        the log end. Called for every ``read_committed`` fetch: no disk reads.
        """

    # Compaction ---------------------------------------------------------------
    #
    # Logs whose cleanup.policy holds ``compact`` are cleaned in the
    # background by the storage (:meth:`LogStorage.startup`), as Kafka's log
    # cleaner does: the latest record of each key is kept, offsets never
    # change, aborted transactional data goes, tombstones and transaction
    # markers go ``delete.retention.ms`` after the cleaning that first kept
    # them (their batch's delete horizon, KIP-534). The cleaner never passes
    # the partition's last stable offset, which only the broker knows.

    def attach_last_stable_offset(self, source: Callable[[], int]) -> None:
        """Give the log the partition's last stable offset (never above the high watermark), which cleaning never reaches.

        ``source()`` is called from cleaner threads; a log without a source
        (the metadata log) is never compacted.
        """

    def clean(self, now_ms: int) -> CleanerStats:
        """Compact the log now, as far as its settings and the last stable offset allow; blocking.

        What the storage's cleaner threads do to the dirtiest log, callable
        directly (tests, tools). Appends and reads from the event loop go on
        meanwhile and always see a valid, offset-ordered log; a crash at any
        point leaves either the old segments or the cleaned ones at the next
        start. A log that is not compacted is left alone.
        """

    # Housekeeping ---------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Raise the log start offset to ``offset`` (DeleteRecords); returns the new log start offset.

        Producer snapshots below the new log start offset are deleted.
        """

    def apply_retention(self, now_ms: int) -> int:
        """Delete whole segments past ``retention.ms``/``retention.bytes`` or below the log start; returns how many.

        Producer snapshots below the new log start offset go with them.
        """

    def update_config(self, config: LogConfig) -> None:
        """Apply new topic settings (from AlterConfigs) from the next append on."""

    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point."""

    def close(self) -> None:
        """Snapshot the producer state at the log end, flush indexes and checkpoints and release files; the log stays on disk."""


@runtime_checkable
class LogStorage(Protocol):
    """All partition logs of one broker, under ``log.dirs``.

    A storage layered over another (``wrap_log_storage``) keeps every
    method's contract and forwards what it does not change.
    """

    def open(self, tp: TopicPartition, config: LogConfig) -> Log:
        """The log of ``tp``, created if new, loaded (and recovered after an unclean stop) if on disk."""

    def stored(self) -> list[TopicPartition]:
        """Partitions that have a log on disk, opened or not."""

    def delete(self, tp: TopicPartition) -> None:
        """Close and remove ``tp``'s log and its files."""

    def startup(self) -> None:
        """Start the storage's background work, once the broker has opened its logs; :meth:`close` stops it.

        Local storage runs ``log.cleaner.threads`` cleaner threads, flushes
        rolled segments (advancing the recovery point), checkpoints recovery
        points and log start offsets, and removes deleted segments after
        ``file.delete.delay.ms``.
        """

    def update_config(self, config: Config) -> None:
        """Apply a new broker configuration (dynamic ``log.cleaner.*`` settings) to the background work."""

    def log_dirs(self) -> list[LogDirInfo]:
        """Every log directory, in configured order, with its volume's sizes or why it is offline."""

    def offline_dirs(self) -> list[str]:
        """Paths (as in :meth:`log_dirs`) of the directories a disk error took offline, in configured order; cheap, no disk access."""

    def dir_of(self, tp: TopicPartition) -> str:
        """The path (as in :meth:`log_dirs`) of the directory holding ``tp``'s log; KeyError if not stored."""

    def move(self, tp: TopicPartition, log_dir: str) -> None:
        """Move ``tp``'s log into ``log_dir`` while the broker runs (AlterReplicaLogDirs); blocking, so run in a worker thread.

        Every record, offset, index, epoch and producer snapshot survives, in
        order. An open log stays the same object and stays usable: appends
        and reads issued during the move wait for it (briefly) and never
        fail or land in the old place. A crash at any point leaves exactly
        one copy at the next start, the old or the new. Moving to the
        directory the log is in does nothing. Raises
        :class:`LogDirNotFoundError` for a path not in :meth:`log_dirs`,
        KeyError when ``tp`` has no log, :class:`LogDirError` when the disk
        fails (the log then stays where it was).
        """

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """The high watermarks written by the last :meth:`checkpoint_high_watermarks`, of every directory.

        A restarted replica starts from these, never from its log end: what
        is past its high watermark may not be replicated, and must not be
        shown to consumers before the ISR has it.
        """

    def checkpoint_high_watermarks(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the high watermarks of the hosted partitions (Kafka's ``replication-offset-checkpoint``).

        Each entry goes with the log it belongs to (one file per log
        directory for local storage); partitions missing from ``offsets``
        are dropped. Atomic per file; blocking, so run in a worker thread.
        """

    def clean_shutdown_epoch(self) -> int:
        """The broker epoch the previous :meth:`close` recorded; -1 when that stop was not clean.

        Read once, at start, before anything is written. The broker sends it
        as BrokerRegistration's ``previous_broker_epoch`` (KIP-966): a broker
        that stopped uncleanly may have lost unflushed records, so the
        controller takes it out of every ISR and ELR.
        """

    def close(self, broker_epoch: int = -1) -> None:
        """Close every open log and mark the shutdown clean with ``broker_epoch``, so the next start skips recovery.

        Local storage writes Kafka's ``.kafka_cleanshutdown`` in each log
        directory, ``{"version":0,"brokerEpoch":N}``.
        """
