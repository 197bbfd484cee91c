"""The contract between tiered storage and a remote storage backend (Kafka's ``RemoteStorageManager``, KIP-405).

Tiered storage copies each rolled segment of a tiered topic, with its
companion files, to a remote store (S3, a local or NFS directory, ...), and
later reads ranges of it back and deletes it. The backend only moves bytes:
which segments are remote, and in what state, is kept by the remote log
metadata (``__remote_log_metadata``), never by the backend. Backends are
offered through the ``register_remote_storage`` hook and selected by
``remote.log.storage.manager.class.name``; their settings are the broker's
keys under ``remote.log.storage.manager.impl.prefix`` (``rsm.config.``).

Every method blocks and is called from the tiered storage's worker threads
(``remote.log.manager.copier.thread.pool.size``,
``remote.log.reader.threads``...), never from the event loop, and may be
called concurrently for different segments. A failure raises
:class:`RemoteStorageError` (retried later by the caller); a segment or
index that is not there raises :class:`RemoteResourceNotFoundError`.
"""

from __future__ import annotations

import enum
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import attrs

from josef.protocol.topic_partition import TopicPartition


class RemoteStorageError(Exception):
    """The remote store failed (unreachable, refused, corrupt): the copy, read or delete can be tried again."""


class RemoteResourceNotFoundError(RemoteStorageError):
    """What was asked for is not in the remote store (never copied, or deleted)."""


class IndexType(enum.Enum):
    """The companion files of a segment, as Kafka's ``RemoteStorageManager.IndexType`` names them."""

    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    PRODUCER_SNAPSHOT = "producer_snapshot"
    TRANSACTION = "transaction"
    LEADER_EPOCH = "leader_epoch"


class RemoteLogSegmentState(enum.IntEnum):
    """Where a remote segment is in its life (Kafka's ids, as ``__remote_log_metadata`` stores them)."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


@attrs.frozen
class RemoteLogSegmentId:
    """A remote segment's identity: its partition (with the topic id, so a re-created topic never meets the old
    one's objects) and a random id, new for every copy attempt, so a retried copy never overwrites another's objects."""

    topic_id: uuid.UUID
    tp: TopicPartition
    id: uuid.UUID

    @classmethod
    def generate(cls, topic_id: uuid.UUID, tp: TopicPartition) -> RemoteLogSegmentId:
        return cls(topic_id, tp, uuid.uuid4())


@attrs.frozen
class RemoteLogSegmentMetadata:
    """One remote segment as the remote log metadata records it (Kafka's ``RemoteLogSegmentMetadata``).

    ``start_offset`` and ``end_offset`` are both inclusive, as in Kafka;
    ``segment_leader_epochs`` maps each leader epoch in the segment to the
    first offset it wrote there; ``custom_metadata`` is what the backend's
    :meth:`RemoteStorageManager.copy_log_segment_data` returned, handed back
    on every later call. ``txn_index_empty`` (KIP-1058) says the segment has
    no aborted transaction, so that a ``read_committed`` fetch searching the
    transaction indexes of the segments after the one it reads skips it
    without a request to remote storage.
    """

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int]
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    custom_metadata: bytes | None = None
    txn_index_empty: bool = False

    def __attrs_post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"a remote segment spans offsets {self.start_offset}..{self.end_offset}")
        self.check_leader_epochs(self.segment_leader_epochs)

    @staticmethod
    def check_leader_epochs(segment_leader_epochs: Mapping[int, int]) -> None:
        """Kafka's rule for a remote segment's metadata in every form (this, and the snapshot of it the remote log
        metadata keeps): it names at least one leader epoch."""
        if not segment_leader_epochs:
            raise ValueError("a remote segment names at least one leader epoch")


@attrs.frozen
class LogSegmentData:
    """The files of one rolled segment to copy (Kafka's ``LogSegmentData``).

    Paths of the local files, which stay put while the copy runs; the
    transaction index is None when the segment has none. The leader-epoch
    checkpoint is given as bytes: the entries up to the segment's end, in
    ``leader-epoch-checkpoint``'s text format.
    """

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot: Path
    leader_epoch_index: bytes


@runtime_checkable
class RemoteStorageManager(Protocol):
    """A remote store of segments; see the module's docstring for threads and errors."""

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Store the segment and its companion files under ``metadata.segment_id``; returns custom metadata or None.

        Once it returns, every later fetch of this segment id succeeds. A
        copy that fails part way may leave objects behind: the caller then
        deletes the segment id (:meth:`delete_log_segment_data`) and copies
        again under a new one.
        """

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        """Bytes ``[start_position, end_position]`` (inclusive, as Kafka's) of the segment's ``.log``; to its end when
        ``end_position`` is None, or when it is past the end."""

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """One companion file of the segment, whole. :class:`RemoteResourceNotFoundError` for a transaction index
        the segment was copied without."""

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete every object of the segment id; deleting one that is (partly or wholly) gone is not an error."""

    def close(self) -> None:
        """Release connections and threads; no call follows."""


#: What ``register_remote_storage`` registers: builds a backend from its ``rsm.config.`` settings (prefix removed).
RemoteStorageFactory = Callable[[Mapping[str, Any]], RemoteStorageManager]
