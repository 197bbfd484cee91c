"""The partitions this broker leads, as a plugin may read them (plugin API 1.5): the data path of share groups.

Share partitions (KIP-932) live on the partition leader, beside the log they
deliver: they read its batches, wait for new ones, and must let go of their
in-memory state (acquisition locks) the moment the broker stops leading.
:class:`LedPartitions` (``BrokerServices.partitions``) is that much of the
broker's replica manager, and no more:

- :meth:`LedPartitions.state`: a led partition's leader epoch and offsets,
  or :class:`PartitionUnavailable` with the code a client is told
  (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION);
- :meth:`LedPartitions.read`: whole batches from an offset, below the high
  watermark, or the last stable offset with the aborted transactions among
  them for ``read_committed``, remote storage included for tiered topics;
- :meth:`LedPartitions.offset_for_timestamp`: ListOffsets by timestamp;
- :meth:`LedPartitions.wait_for_data`: the long poll, woken when a high
  watermark moves or a partition's state changes;
- :meth:`LedPartitions.watch`: a callback for every change of a partition's
  state (leadership, epoch, ISR, deletion), to drop what was built on it.

Records are handed over as the log holds them (bytes of whole batches): a
reader never decodes records it does not need to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import attrs
from kio.schema.errors import ErrorCode

from josef.log import OffsetMovedToTieredStorageError, OffsetOutOfRangeError
from josef.protocol.topic_partition import TopicPartition

if TYPE_CHECKING:
    from josef.node.broker import Broker
    from josef.replication.partition import Partition

#: A callback of :meth:`LedPartitions.watch`, given the partition whose state changed.
Watcher = Callable[[TopicPartition], None]


class PartitionUnavailable(Exception):
    """A partition cannot be read here; ``code`` is the Kafka error a client is told."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class AbortedTransaction:
    producer_id: int
    first_offset: int


@attrs.frozen
class LeaderState:
    """A led partition at one moment."""

    leader_epoch: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


@attrs.frozen
class LedRead:
    """What :meth:`LedPartitions.read` read: batches, with the partition's offsets when it read them."""

    records: bytes
    state: LeaderState
    #: Transactions aborted among the records (``read_committed`` only): their data records are to be skipped.
    aborted: tuple[AbortedTransaction, ...] = ()


class LedPartitions:
    """Reads of the partitions this broker leads, for its plugins."""

    __slots__ = ("_broker",)

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def _leader(self, tp: TopicPartition) -> Partition:
        partition = self._broker.replicas.get(tp)
        if partition is None or not partition.is_leader:
            topic = self._broker.image.topics.get(tp.topic)
            if topic is None or tp.partition not in topic.partitions:
                raise PartitionUnavailable(ErrorCode.unknown_topic_or_partition, f"{tp} does not exist")
            raise PartitionUnavailable(ErrorCode.not_leader_or_follower, f"{tp} is not led by this broker")
        return partition

    @staticmethod
    def _state(partition: Partition) -> LeaderState:
        return LeaderState(partition.leader_epoch, partition.log.log_start_offset, partition.high_watermark,
                           partition.last_stable_offset)

    def state(self, tp: TopicPartition) -> LeaderState:
        """``tp``'s leader epoch and offsets; :class:`PartitionUnavailable` unless this broker leads it."""
        return self._state(self._leader(tp))

    async def read(self, tp: TopicPartition, offset: int, max_bytes: int, *, read_committed: bool,
                   min_one_batch: bool = True) -> LedRead:
        """Batches of ``tp`` from the one holding ``offset``, at most ``max_bytes`` (but one whole batch with
        ``min_one_batch``), below the high watermark or (``read_committed``) the last stable offset.

        Offsets below the local log start of a tiered partition are read from
        remote storage. Raises :class:`PartitionUnavailable`:
        OFFSET_OUT_OF_RANGE below the log start or past the readable end,
        KAFKA_STORAGE_ERROR when the log cannot be read.
        """
        from josef.replication.partition import READ_COMMITTED, READ_UNCOMMITTED
        from josef.server.apis.common import error_of

        partition = self._leader(tp)
        state = self._state(partition)
        end = state.last_stable_offset if read_committed else state.high_watermark
        if offset == end:
            return LedRead(b"", state)
        try:
            if not state.log_start_offset <= offset < end:
                raise OffsetOutOfRangeError(f"offset {offset} is outside {state.log_start_offset}-{end} of {tp}")
            try:
                records = bytes(partition.read(offset, max_bytes, min_one_batch,
                                               READ_COMMITTED if read_committed else READ_UNCOMMITTED))
                aborted = partition.log.aborted_txns(offset, end) if read_committed and records else ()
            except OffsetMovedToTieredStorageError:
                remote = await partition.read_remote(offset, max_bytes, min_one_batch, read_committed)
                records, aborted = bytes(remote.records), remote.aborted_txns if read_committed else ()
        except Exception as exc:
            code, message = error_of(exc)
            if code == ErrorCode.unknown_server_error:
                raise
            raise PartitionUnavailable(code, message) from exc
        return LedRead(records, state, tuple(AbortedTransaction(t.producer_id, t.first_offset) for t in aborted))

    async def offset_for_timestamp(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The first offset whose batch's timestamp is at least ``timestamp_ms`` (ListOffsets), else the high
        watermark; remote storage is searched first for a tiered partition."""
        partition = self._leader(tp)
        log = partition.log
        hit = None
        if getattr(log, "local_log_start_offset", log.log_start_offset) > log.log_start_offset:  # plugin API 1.3+
            hit = await log.remote_offset_for_timestamp(timestamp_ms)
        if hit is None:
            hit = log.offset_for_timestamp(timestamp_ms)
        high_watermark = partition.high_watermark
        return high_watermark if hit is None or hit[0] < 0 or hit[0] >= high_watermark else hit[0]

    async def wait_for_data(self, tps: Iterable[TopicPartition], timeout_ms: int) -> set[TopicPartition]:
        """Wait until the high watermark of one of ``tps`` moves or its state changes, at most ``timeout_ms``;
        the partitions that changed (none on timeout). Wake-ups may be spurious: read again to know."""
        return await self._broker.replicas.wait_for_data(tps, timeout_ms)

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(tp)`` on the event loop whenever ``tp``'s state changes on this broker: it became
        leader or follower, its leader epoch or ISR changed, it was deleted or moved away. Returns the function
        that stops the watching."""
        return self._broker.replicas.watch(watcher)
