"""Kafka's RemoteLogManager: copies rolled segments of tiered partitions to remote storage, deletes expired remote
segments, and serves reads below the local log start.

Every ``remote.log.manager.task.interval.ms`` the manager visits each
tiered partition this broker hosts. As its leader, once this broker has
read the partition's remote log metadata to the end, it

- copies each closed segment past the last copied one whose records are all
  below the last stable offset (so never above the high watermark, never an
  open transaction), with its indexes, producer snapshot and leader-epoch
  checkpoint: COPY_SEGMENT_STARTED is written first, the objects next,
  COPY_SEGMENT_FINISHED last, so a crash at any point leaves either a
  finished segment or a started one that the next leader deletes;
- deletes remote segments past total retention (``retention.ms``,
  ``retention.bytes`` over remote and local-only data together), below
  the log start (DeleteRecords), all of them once ``remote.storage.enable``
  is turned off with ``remote.log.delete.on.disable``, and copies that
  started and never finished: DELETE_SEGMENT_STARTED, the objects,
  DELETE_SEGMENT_FINISHED.

Followers only read the metadata: the local log deletes nothing not copied
(:meth:`next_remote_offset` bounds its retention) on any replica. Copies and
remote reads run in worker threads, bounded by the copier and reader pool
sizes; everything else runs on the event loop. A copy that fails is retried
at the next visit after a growing backoff.

What the manager knows of each partition's remote segments it keeps as an
immutable :class:`RemoteView`, replaced after each metadata record: the
local log's retention asks it from worker threads.
"""

from __future__ import annotations

import collections
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

from josef.config import Config
from josef.log import ClosedSegment, EpochEntry, LogDirError, OffsetOutOfRangeError, RemoteRecords
from josef.metadata.records import uuid_from_text
from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata.cache import RemotePartitionMetadataStore
from josef.remote_log_metadata.records import (
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    metadata_partition,
)
from josef.remote_storage import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)
from josef.segment_files import encode_epoch_checkpoint
from josef.services import BrokerServices
from josef_storage_tiered.metadata_topic import MetadataTopic
from josef_storage_tiered.metrics import (BUILD_AUX_ERRORS, BUILD_AUX_REQUESTS, COPY_BYTES, COPY_ERRORS,
                                          COPY_REQUESTS, DELETE_ERRORS, DELETE_REQUESTS, FETCH_BYTES, FETCH_ERRORS,
                                          FETCH_REQUESTS, remote_counters)
from josef_storage_tiered.remote_reader import IndexCache, aborted_txns, find_timestamp, read_batches
from josef_storage_tiered.tiered_log import TieredLog

logger = logging.getLogger(__name__)

_S = RemoteLogSegmentState
PartitionKey = tuple[uuid.UUID, TopicPartition]


@attrs.frozen
class RemoteView:
    """A partition's readable remote segments (COPY_SEGMENT_FINISHED), by start offset."""

    segments: tuple[RemoteLogSegmentMetadata, ...] = ()

    @property
    def first_offset(self) -> int | None:
        return self.segments[0].start_offset if self.segments else None

    @property
    def next_offset(self) -> int:
        """The offset after the last one copied: where copying goes on, and below which local data may go."""
        return self.segments[-1].end_offset + 1 if self.segments else 0

    @property
    def size_bytes(self) -> int:
        return sum(s.segment_size_in_bytes for s in self.segments)

    def holding(self, offset: int) -> int | None:
        """The index of the segment holding ``offset``."""
        for i, segment in enumerate(self.segments):
            if segment.start_offset <= offset <= segment.end_offset:
                return i
        return None

    def epochs(self) -> list[EpochEntry]:
        """The leader epochs of the remote data, where each begins (Kafka's cache covers remote data too)."""
        entries: list[EpochEntry] = []
        for segment in self.segments:
            for epoch, start in sorted(segment.segment_leader_epochs.items()):
                if not entries or epoch > entries[-1].epoch:
                    entries.append(EpochEntry(epoch, start))
        return entries


class ByteRate:
    """Kafka's remote copy and fetch quotas (``remote.log.manager.copy|fetch.max.bytes.per.second``), measured over
    the last second: a copy waits until the rate is back under the quota, a remote fetch past it is answered empty."""

    def __init__(self, max_bytes_per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = max_bytes_per_second
        self._clock = clock
        self._since = clock()
        self._bytes = 0

    def record(self, size: int) -> None:
        self._roll()
        self._bytes += size

    def exceeded(self) -> bool:
        self._roll()
        return self._bytes >= self.limit

    async def wait(self) -> None:
        while self.exceeded():
            await anyio.sleep(max(self._since + 1 - self._clock(), 0.01))

    def _roll(self) -> None:
        now = self._clock()
        if now - self._since >= 1:
            self._bytes = max(self._bytes - int(self.limit * (now - self._since)), 0)  # spent what the gap allowed
            self._since = now


class RemoteLogManager:
    """The remote log manager of one broker; see the module's docstring."""

    def __init__(self, services: BrokerServices, config: Config, storage: RemoteStorageManager) -> None:
        self._services = services
        self._config = config
        self.storage = storage
        self._logs: dict[TopicPartition, TieredLog] = {}
        self._keys: dict[TopicPartition, PartitionKey] = {}
        self._store = RemotePartitionMetadataStore()
        self._views: dict[TopicPartition, RemoteView] = {}
        #: Logs opened and deleted by the storage in worker threads, for the task to take up on the event loop.
        self._changes: collections.deque[tuple[TopicPartition, TieredLog | None]] = collections.deque()
        self.topic = MetadataTopic(services, config, self._apply, self._caught_up)
        self.indexes = IndexCache(storage, config["remote.log.index.file.cache.total.size.bytes"])
        base = config["remote.log.manager.thread.pool.size"]
        copiers = config["remote.log.manager.copier.thread.pool.size"]
        expirers = config["remote.log.manager.expiration.thread.pool.size"]
        self._readers = anyio.CapacityLimiter(config["remote.log.reader.threads"])
        self._copiers = anyio.CapacityLimiter(copiers if copiers > 0 else base)
        self._expirers = anyio.CapacityLimiter(expirers if expirers > 0 else base)
        self._copy_quota = ByteRate(config["remote.log.manager.copy.max.bytes.per.second"])
        self._fetch_quota = ByteRate(config["remote.log.manager.fetch.max.bytes.per.second"])
        #: When a partition's next copy may be tried, after failures (exponential backoff).
        self._backoff: dict[TopicPartition, tuple[float, float]] = {}
        #: Kafka's remote BrokerTopicMetrics meters, per topic (:mod:`josef_storage_tiered.metrics`).
        self.counters = remote_counters()
        #: (bytes, segments) eligible for copying and not copied yet, of the partitions this broker leads, as of
        #: their last visit (Kafka's RemoteCopyLagBytes and RemoteCopyLagSegments).
        self.copy_lag: dict[TopicPartition, tuple[int, int]] = {}
        #: (bytes, segments) of remote segments due for deletion and not deleted yet (RemoteDeleteLag*).
        self.delete_lag: dict[TopicPartition, tuple[int, int]] = {}

    # Partitions ------------------------------------------------------------------------------

    def register(self, log: TieredLog) -> None:
        """Start managing a tiered log the storage opened (in a worker thread: taken up by the task's next round)."""
        self._changes.append((log.tp, log))

    def unregister(self, tp: TopicPartition) -> None:
        """Stop managing a deleted log (in a worker thread: likewise); a deleted topic's remote data goes too."""
        self._changes.append((tp, None))

    async def _take_changes(self) -> None:
        while self._changes:
            tp, log = self._changes.popleft()
            if log is not None:
                self._logs[tp] = log
                continue
            self._logs.pop(tp, None)
            self._views.pop(tp, None)
            self.copy_lag.pop(tp, None)
            self.delete_lag.pop(tp, None)
            key = self._keys.pop(tp, None)
            if key is None:
                continue
            topic = self._services.image.topics.get(tp.topic)
            deleted = topic is None or uuid_from_text(topic.topic_id) != key[0]
            cache = self._store.cache(*key) if deleted and self._store.is_initialized(*key) else None
            self._store.clear_partition(*key)
            if cache is not None and len(cache):
                await self._delete_partition(key, cache.list_segments())

    async def _delete_partition(self, key: PartitionKey, segments: list[RemoteLogSegmentMetadata]) -> None:
        """Kafka's remote partition deletion: DELETE_PARTITION_MARKED, STARTED, each segment, FINISHED. Every
        replica of a deleted topic does it (deleting twice is harmless), so no orphans stay when one fails."""
        partition = self._metadata_partition(key)
        for state in (RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                      RemotePartitionDeleteState.DELETE_PARTITION_STARTED):
            await self.topic.publish(partition, RemotePartitionDeleteMetadata(*key, state, _now_ms(),
                                                                              self._services.node_id))
        for segment in segments:
            self.counters.add(key[1].topic, DELETE_REQUESTS)
            try:
                await anyio.to_thread.run_sync(self.storage.delete_log_segment_data, segment, limiter=self._expirers)
            except RemoteStorageError as exc:
                self.counters.add(key[1].topic, DELETE_ERRORS)
                logger.warning("deleting remote segment %s of deleted %s failed: %s",
                                                    segment.segment_id.id, key[1], exc)
                return
            self.indexes.forget(segment)
        await self.topic.publish(partition, RemotePartitionDeleteMetadata(
            *key, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, _now_ms(), self._services.node_id))
        logger.info("deleted the %d remote segments of deleted %s", len(segments), key[1])

    def _key(self, tp: TopicPartition) -> PartitionKey | None:
        """The partition's topic id (from the metadata image) with it; following its metadata from then on."""
        key = self._keys.get(tp)
        if key is not None:
            return key
        topic = self._services.image.topics.get(tp.topic)
        if topic is None:
            return None
        key = self._keys[tp] = (uuid_from_text(topic.topic_id), tp)
        self._store.load_partition(*key)
        self.topic.follow(self._metadata_partition(key), key)
        return key

    def _metadata_partition(self, key: PartitionKey) -> int:
        return metadata_partition(key[0], key[1].partition, self.topic.partitions)

    def _apply(self, record: Any, only: set[PartitionKey] | None) -> None:
        key = record_key(record)
        if key is None or (only is not None and key not in only):
            return
        if self._store.handle(record) and self._keys.get(key[1]) == key:
            self._refresh(key[1])

    def _caught_up(self, partition: int) -> None:
        for tp, key in self._keys.items():
            if self._metadata_partition(key) == partition and not self._store.is_initialized(*key):
                self._store.mark_initialized(*key)
                self._refresh(tp)

    def _refresh(self, tp: TopicPartition) -> None:
        key = self._keys[tp]
        if not self._store.is_initialized(*key):
            return
        cache = self._store.cache(*key)
        self._views[tp] = RemoteView(tuple(s for s in cache.list_segments() if s.state is _S.COPY_SEGMENT_FINISHED))
        log = self._logs.get(tp)
        if log is not None:
            log.remember_log_start()

    # What a tiered log asks (from the event loop or worker threads) --------------------------------

    def view(self, tp: TopicPartition) -> RemoteView:
        return self._views.get(tp) or RemoteView()

    def existing_topics(self) -> Container[str]:
        """The topics of the broker's metadata image (a deleted topic's meters are dropped)."""
        return self._services.image.topics

    def led_partitions(self) -> list[tuple[TopicPartition, int | None]]:
        """The tiered partitions this broker leads, with how many remote segments their metadata knows (None: not
        read yet): for the metrics, on the event loop."""
        image, node_id = self._services.image, self._services.node_id
        led = []
        for tp in self._logs:
            topic = image.topics.get(tp.topic)
            state = topic.partitions.get(tp.partition) if topic is not None else None
            if state is None or state.leader != node_id:
                continue
            key = self._keys.get(tp)
            known = key is not None and self._store.is_initialized(*key)
            led.append((tp, len(self._store.cache(*key)) if known else None))  # type: ignore[misc]
        return led

    def is_ready(self, tp: TopicPartition) -> bool:
        """Whether the partition's remote log metadata has been read up to where it was when the broker began
        following it (Kafka's RemoteLogMetadataCache.isInitialized): until then, what is remote is not known."""
        return tp in self._views

    def first_remote_offset(self, tp: TopicPartition) -> int | None:
        return self.view(tp).first_offset

    def next_remote_offset(self, tp: TopicPartition) -> int:
        return self.view(tp).next_offset

    def remote_epochs(self, tp: TopicPartition) -> list[EpochEntry]:
        return self.view(tp).epochs()

    async def read(self, log: TieredLog, offset: int, max_bytes: int, upper: int, min_one_batch: bool,
                   read_committed: bool) -> RemoteRecords:
        """Batches of the remote segment holding ``offset`` (one segment per read, as Kafka's remote fetch)."""
        self._require_ready(log.tp)
        view = self.view(log.tp)
        index = view.holding(offset)
        if index is None:
            raise OffsetOutOfRangeError(f"{log.tp}: no remote segment holds offset {offset}")
        segment = view.segments[index]
        upper = min(upper, segment.end_offset + 1)
        if self._fetch_quota.exceeded():  # Kafka answers such a fetch without records; the consumer asks again
            return RemoteRecords(b"")
        topic = log.tp.topic
        self.counters.add(topic, FETCH_REQUESTS)
        try:
            records = await anyio.to_thread.run_sync(read_batches, self.storage, self.indexes, segment, offset,
                                                     max_bytes, upper, min_one_batch, limiter=self._readers)
        except LogDirError:
            self.counters.add(topic, FETCH_ERRORS)
            raise
        self._fetch_quota.record(len(records))
        self.counters.add(topic, FETCH_BYTES, len(records))
        if not read_committed or not records:
            return RemoteRecords(records)
        try:
            found, complete = await anyio.to_thread.run_sync(aborted_txns, self.indexes, list(view.segments[index:]),
                                                             offset, upper, limiter=self._readers)
        except LogDirError:
            self.counters.add(topic, FETCH_ERRORS)
            raise
        if not complete:  # transactions aborted in local segments may reach back into what was read
            found += [t for t in log.inner.aborted_txns(log.local_log_start_offset, upper) if t not in found]
        return RemoteRecords(records, found)

    async def producer_snapshot(self, tp: TopicPartition, offset: int) -> bytes | None:
        """The producer snapshot of the remote segment ending at ``offset - 1`` (a follower starting at its leader's
        local log start, which is where such a segment ends); RemoteStorageError while none is known or the fetch
        fails, so the follower tries again."""
        self.counters.add(tp.topic, BUILD_AUX_REQUESTS)  # Kafka's BuildRemoteLogAuxState: a follower starting there
        segment = next((s for s in self.view(tp).segments if s.end_offset == offset - 1), None)
        if segment is None:
            self.counters.add(tp.topic, BUILD_AUX_ERRORS)
            raise RemoteStorageError(f"{tp}: no remote segment ending at offset {offset - 1} is known yet")
        try:
            return await anyio.to_thread.run_sync(self.storage.fetch_index, segment, IndexType.PRODUCER_SNAPSHOT,
                                                  limiter=self._readers)
        except RemoteResourceNotFoundError:
            return None  # copied without one: no producer had written there
        except RemoteStorageError:
            self.counters.add(tp.topic, BUILD_AUX_ERRORS)
            raise

    async def offset_for_timestamp(self, log: TieredLog, timestamp: int) -> tuple[int, int] | None:
        """The first remote record at or after the log start stamped >= ``timestamp``: in the first segment
        (by offset) whose max timestamp reaches it, as Kafka's findOffsetByTimestamp searches."""
        self._require_ready(log.tp)
        start = log.log_start_offset
        for segment in self.view(log.tp).segments:
            if segment.end_offset < start or segment.max_timestamp_ms < timestamp:
                continue
            found = await anyio.to_thread.run_sync(find_timestamp, self.storage, self.indexes, segment, timestamp,
                                                   max(start, segment.start_offset), limiter=self._readers)
            if found is not None:
                return found
        return None

    def _require_ready(self, tp: TopicPartition) -> None:
        if not self.is_ready(tp):  # KAFKA_STORAGE_ERROR: clients try again, as after a leader's disk trouble
            raise LogDirError(f"{tp}: the remote log metadata is still being read; try again")

    # The task --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read the metadata topic and visit every tiered partition each task interval, until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.topic.run)
            await self.topic.ready.wait()
            while True:
                await self._take_changes()
                for tp, log in list(self._logs.items()):
                    try:
                        await self._visit(log)
                    except Exception:
                        logger.exception("tiered storage of %s failed; trying again next time", tp)
                await anyio.sleep(self._config["remote.log.manager.task.interval.ms"] / 1000)

    async def _visit(self, log: TieredLog) -> None:
        key = self._key(log.tp)
        if key is None or not self._store.is_initialized(*key):
            return
        state = self._services.image.topics[log.tp.topic].partitions.get(log.tp.partition)
        if state is None or state.leader != self._services.node_id:
            self.copy_lag.pop(log.tp, None)  # a follower's are its leader's to report
            self.delete_lag.pop(log.tp, None)
            return
        epoch = state.leader_epoch
        config = log.config
        if config.remote_storage_enable and not config.remote_log_copy_disable:
            if self._may_copy(log.tp):
                await self._copy(log, key, epoch)
        else:
            self.copy_lag.pop(log.tp, None)
        await self._expire(log, key, epoch)

    def _still_leader(self, tp: TopicPartition, epoch: int) -> bool:
        topic = self._services.image.topics.get(tp.topic)
        state = topic.partitions.get(tp.partition) if topic is not None else None
        return state is not None and state.leader == self._services.node_id and state.leader_epoch == epoch

    # Copying -------------------------------------------------------------------------------------

    def _may_copy(self, tp: TopicPartition) -> bool:
        until, _ = self._backoff.get(tp, (0.0, 0.0))
        return time.monotonic() >= until

    def _failed(self, tp: TopicPartition) -> None:
        _, delay = self._backoff.get(tp, (0.0, 0.0))
        first = self._config["remote.log.manager.task.retry.backoff.ms"] / 1000
        delay = min(max(delay * 2, first), self._config["remote.log.manager.task.retry.backoff.max.ms"] / 1000)
        self._backoff[tp] = (time.monotonic() + delay, delay)

    async def _copy(self, log: TieredLog, key: PartitionKey, epoch: int) -> None:
        copied = self.view(log.tp).next_offset
        stable = log.last_stable_offset
        eligible = []
        for segment in log.inner.closed_segments():
            if segment.next_offset <= copied:
                continue
            if segment.next_offset > stable or segment.base_offset < copied:
                break  # not stable yet; or a segment straddling what is copied (a truncated lineage): not copied
            eligible.append(segment)
            copied = segment.next_offset
        lag_bytes = sum(s.size_bytes for s in eligible)
        self.copy_lag[log.tp] = (lag_bytes, len(eligible))
        for done, segment in enumerate(eligible):
            if not self._still_leader(log.tp, epoch):
                return
            if not await self._copy_segment(log, key, epoch, segment):
                self._failed(log.tp)
                return
            self._backoff.pop(log.tp, None)
            lag_bytes -= segment.size_bytes
            self.copy_lag[log.tp] = (lag_bytes, len(eligible) - done - 1)

    async def _copy_segment(self, log: TieredLog, key: PartitionKey, epoch: int, segment: ClosedSegment) -> bool:
        entries = [e for e in log.epoch_entries() if e.start_offset < segment.next_offset]
        # The epochs written in the segment: the one in force at its base offset, and those that begin inside it.
        in_segment = {e.epoch: max(e.start_offset, segment.base_offset) for i, e in enumerate(entries)
                      if i + 1 == len(entries) or entries[i + 1].start_offset > segment.base_offset}
        if not in_segment:
            in_segment = {epoch: segment.base_offset}
        txn_index = segment.transaction_index
        metadata = RemoteLogSegmentMetadata(
            RemoteLogSegmentId.generate(key[0], log.tp), segment.base_offset, segment.next_offset - 1,
            segment.max_timestamp_ms, self._services.node_id, _now_ms(), segment.size_bytes, in_segment,
            txn_index_empty=txn_index is None or not txn_index.exists() or txn_index.stat().st_size == 0)
        partition = self._metadata_partition(key)
        await self._copy_quota.wait()
        await self.topic.publish(partition, metadata)
        self.counters.add(log.tp.topic, COPY_REQUESTS)
        try:
            custom = await anyio.to_thread.run_sync(self._upload, metadata, segment, entries, limiter=self._copiers)
        except (RemoteStorageError, OSError) as exc:
            self.counters.add(log.tp.topic, COPY_ERRORS)
            logger.warning("copying %s offsets %d-%d to remote storage failed: %s", log.tp, metadata.start_offset,
                        metadata.end_offset, exc)
            return False  # left COPY_SEGMENT_STARTED: deleted as a failed copy at a later visit
        self._copy_quota.record(segment.size_bytes)
        self.counters.add(log.tp.topic, COPY_BYTES, segment.size_bytes)
        if not self._still_leader(log.tp, epoch):
            return False  # the new leader deletes it with the other unfinished copies
        await self.topic.publish(partition, RemoteLogSegmentMetadataUpdate(
            metadata.segment_id, custom, _S.COPY_SEGMENT_FINISHED, _now_ms(), self._services.node_id))
        logger.info("copied %s offsets %d-%d (%d bytes) to remote storage", log.tp,
                                         metadata.start_offset, metadata.end_offset, metadata.segment_size_in_bytes)
        return True

    def _upload(self, metadata: RemoteLogSegmentMetadata, segment: ClosedSegment,
                entries: Sequence[EpochEntry]) -> bytes | None:
        with tempfile.TemporaryDirectory(prefix="josef-upload-") as tmp:
            snapshot = segment.producer_snapshot
            if snapshot is None or not snapshot.exists():  # none was written (a crash): an empty one, as Kafka's
                snapshot = Path(tmp) / "empty.snapshot"
                snapshot.write_bytes(b"")
            data = LogSegmentData(segment.log, segment.offset_index, segment.time_index, segment.transaction_index,
                                  snapshot, encode_epoch_checkpoint(entries))
            return self.storage.copy_log_segment_data(metadata, data)

    # Expiring -------------------------------------------------------------------------------------

    async def _expire(self, log: TieredLog, key: PartitionKey, epoch: int) -> None:
        cache = self._store.cache(*key)
        config = log.config
        doomed: list[RemoteLogSegmentMetadata] = list(cache.copy_in_progress_segments())
        doomed += [s for s in cache.list_segments() if s.state is _S.DELETE_SEGMENT_STARTED]  # deletes to retry
        finished = list(self.view(log.tp).segments)
        if not config.remote_storage_enable:
            if config.remote_log_delete_on_disable:
                doomed += finished
        else:
            now, start, copied = _now_ms(), log.log_start_offset, self.view(log.tp).next_offset
            # retention.bytes counts remote data and what is only local once (copied segments may still be local).
            local_only = log.inner.size_bytes - sum(s.size_bytes for s in log.inner.closed_segments()
                                                    if s.next_offset <= copied)
            excess = (sum(s.segment_size_in_bytes for s in finished) + local_only - config.retention_bytes
                      if config.retention_bytes >= 0 else -1)
            for segment in finished:  # oldest first, as long as each is past one limit
                expired = (segment.end_offset < start  # below the log start (DeleteRecords)
                           or 0 <= config.retention_ms < now - segment.max_timestamp_ms
                           or excess >= segment.segment_size_in_bytes)
                if not expired:
                    break
                doomed.append(segment)
                excess -= segment.segment_size_in_bytes
        partition = self._metadata_partition(key)
        lag_bytes = sum(s.segment_size_in_bytes for s in doomed)
        left = len(doomed)
        self.delete_lag[log.tp] = (lag_bytes, left)
        for segment in doomed:
            if not self._still_leader(log.tp, epoch):
                return
            if await self._delete(partition, segment):
                lag_bytes -= segment.segment_size_in_bytes
                left -= 1
                self.delete_lag[log.tp] = (lag_bytes, left)

    async def _delete(self, partition: int, segment: RemoteLogSegmentMetadata) -> bool:
        """Delete one remote segment; whether it is gone (False: retried at a later visit)."""
        if segment.state is not _S.DELETE_SEGMENT_STARTED:
            await self.topic.publish(partition, RemoteLogSegmentMetadataUpdate(
                segment.segment_id, segment.custom_metadata, _S.DELETE_SEGMENT_STARTED, _now_ms(),
                self._services.node_id))
        topic = segment.segment_id.tp.topic
        self.counters.add(topic, DELETE_REQUESTS)
        try:
            await anyio.to_thread.run_sync(self.storage.delete_log_segment_data, segment, limiter=self._expirers)
        except RemoteStorageError as exc:
            self.counters.add(topic, DELETE_ERRORS)
            logger.warning("deleting remote segment %s failed (retried later): %s",
                                                segment.segment_id.id, exc)
            return False
        self.indexes.forget(segment)
        await self.topic.publish(partition, RemoteLogSegmentMetadataUpdate(
            segment.segment_id, segment.custom_metadata, _S.DELETE_SEGMENT_FINISHED, _now_ms(),
            self._services.node_id))
        return True


def record_key(record: Any) -> PartitionKey | None:
    """The user partition a metadata record is about."""
    if isinstance(record, RemotePartitionDeleteMetadata):
        return record.topic_id, record.tp
    segment_id = getattr(record, "segment_id", None)
    return (segment_id.topic_id, segment_id.tp) if isinstance(segment_id, RemoteLogSegmentId) else None


def _now_ms() -> int:
    return int(time.time() * 1000)
