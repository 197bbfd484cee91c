"""What ``__remote_log_metadata`` says about each partition's remote segments, in memory (Kafka's
``RemoteLogMetadataCache``, ``RemoteLogLeaderEpochState`` and ``RemotePartitionMetadataStore``).

Every replica of a tiered partition consumes that partition's records from
``__remote_log_metadata`` into a :class:`RemoteLogMetadataCache`, and the
tiered storage asks it, rather than the remote store, what is remote: a
fetch below the local log start looks up the segment holding an offset for
its leader epoch, a follower learns how far the leader has copied, the
leader's retention lists segments epoch by epoch to delete them, and a new
leader finds the copies the last one left half done.

Segments are indexed per leader epoch, not by offset alone, because after an
unclean election or a lagging leader two remote segments can hold the same
offsets written in different epochs; only the one of the epoch a reader
asks for is right. The states decide what each answer sees, as in Kafka:

===================================  =======  ========  ==============  ===============
                                     COPY     COPY      DELETE          DELETE
                                     STARTED  FINISHED  STARTED         FINISHED
===================================  =======  ========  ==============  ===============
remote_log_segment_metadata()        no       yes       no              no (forgotten)
highest_offset_for_epoch()           no       yes       still counted   still counted
list_segments() / list_segments(e)   yes      yes       yes             no (forgotten)
===================================  =======  ========  ==============  ===============

Segments not yet (or no longer) readable stay listed so that their owner can
clean them up: a copy that never finished, or a delete to retry.

Pure data, no I/O, no locking: its owner applies records and answers
questions from one thread (or under its own lock).
"""

from __future__ import annotations

import bisect
import logging
import uuid

from josef.metadata.records import uuid_to_text
from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata.records import (
    RemoteLogMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    with_update,
)
from josef.remote_storage import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)

log = logging.getLogger(__name__)

_S = RemoteLogSegmentState

#: The states a segment may move to from each state (Kafka's ``RemoteLogSegmentState.isValidTransition``); a
#: state may always be repeated, so that a retried or replayed event is harmless.
_NEXT_STATES: dict[RemoteLogSegmentState | None, frozenset[RemoteLogSegmentState]] = {
    None: frozenset({_S.COPY_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),  # finished, or failed
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_FINISHED}),
    _S.DELETE_SEGMENT_FINISHED: frozenset(),
}


def is_valid_segment_transition(current: RemoteLogSegmentState | None, target: RemoteLogSegmentState) -> bool:
    """Whether a segment in ``current`` (None: not known yet) may move to ``target``."""
    return current is target or target in _NEXT_STATES[current]


class IllegalStateTransitionError(ValueError):
    """A segment or partition cannot move from its state to the one asked: the event is out of order or stale."""

    def __init__(self, subject: object, current: object, target: object) -> None:
        super().__init__(f"{subject}: state {getattr(current, 'name', current)} can not be transitioned to "
                         f"{getattr(target, 'name', target)}")
        self.subject = subject
        self.current = current
        self.target = target


class RemoteLogMetadataNotReadyError(RemoteStorageError):
    """The partition's metadata is still being read from ``__remote_log_metadata``: ask again later (Kafka answers
    REPLICA_NOT_AVAILABLE, which clients retry)."""


class _EpochState:
    """The segments of one leader epoch (Kafka's ``RemoteLogLeaderEpochState``).

    Readable segments are indexed by the offset at which the epoch starts
    within them. A later copy that starts at or before an indexed segment
    and reaches at least as far replaces it (a new leader re-copying what a
    lagging one had copied); replaced, unfinished and deleting segments are
    kept as *unreferenced* so that listings still return them for cleanup.
    """

    __slots__ = ("by_offset", "highest_offset", "offsets", "unreferenced")

    def __init__(self) -> None:
        self.offsets: list[int] = []  # sorted keys of by_offset
        self.by_offset: dict[int, RemoteLogSegmentId] = {}
        self.unreferenced: dict[RemoteLogSegmentId, None] = {}  # an ordered set: listings stay deterministic
        self.highest_offset: int | None = None

    def copy_started(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced[segment_id] = None

    def copy_finished(self, start_offset: int, segment_id: RemoteLogSegmentId, epoch_end_offset: int) -> None:
        while (self.offsets and self.offsets[-1] >= start_offset and self.highest_offset is not None
               and self.highest_offset <= epoch_end_offset):
            self.unreferenced[self.by_offset.pop(self.offsets.pop())] = None
        replaced = self.by_offset.get(start_offset)
        if replaced is not None and replaced != segment_id:
            # Kafka overwrites the mapping and loses the older segment from this epoch's listing (it is still in
            # the partition's); keeping it unreferenced lets retention find and delete it epoch by epoch too.
            self.unreferenced[replaced] = None
        if start_offset not in self.by_offset:
            bisect.insort(self.offsets, start_offset)
        self.by_offset[start_offset] = segment_id
        self.unreferenced.pop(segment_id, None)
        if self.highest_offset is None or epoch_end_offset > self.highest_offset:
            self.highest_offset = epoch_end_offset

    def delete_started(self, start_offset: int, segment_id: RemoteLogSegmentId) -> None:
        if self.by_offset.get(start_offset) == segment_id:
            del self.by_offset[start_offset]
            self.offsets.remove(start_offset)
        self.unreferenced[segment_id] = None

    def delete_finished(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced.pop(segment_id, None)

    def floor(self, offset: int) -> RemoteLogSegmentId | None:
        """The readable segment whose part of the epoch starts at the greatest offset <= ``offset``."""
        i = bisect.bisect_right(self.offsets, offset)
        return self.by_offset[self.offsets[i - 1]] if i else None

    def segment_ids(self) -> list[RemoteLogSegmentId]:
        return [self.by_offset[o] for o in self.offsets] + list(self.unreferenced)


class RemoteLogMetadataCache:
    """The remote segments of one partition and their states, as its ``__remote_log_metadata`` records say.

    Records are applied with :meth:`add_copy_in_progress_segment` (a
    COPY_SEGMENT_STARTED record), :meth:`update_segment` and
    :meth:`apply_partition_delete`; a record that cannot follow the state it
    finds raises :class:`IllegalStateTransitionError` and changes nothing (a
    consumer replaying the topic drops it, see
    :meth:`RemotePartitionMetadataStore.handle`). A segment that reaches
    DELETE_SEGMENT_FINISHED is forgotten.
    """

    def __init__(self) -> None:
        self._segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self._epochs: dict[int, _EpochState] = {}
        self._initialized = False
        self._partition_delete: RemotePartitionDeleteMetadata | None = None

    # Catching up ------------------------------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        """Whether the partition's records have been read up to the end of the metadata partition seen when it was
        assigned: before that, answers may be stale."""
        return self._initialized

    def mark_initialized(self) -> None:
        self._initialized = True

    # Applying records -------------------------------------------------------------------------------------------

    def add_copy_in_progress_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        """A copy has started: the segment is listed (so it can be cleaned up) but not readable until it finishes."""
        if metadata.state is not _S.COPY_SEGMENT_STARTED:
            raise ValueError(f"{metadata.segment_id} is added in state {metadata.state.name}: only "
                             "COPY_SEGMENT_STARTED segments are added, later states are updates")
        existing = self._segments.get(metadata.segment_id)
        self._check(metadata.segment_id, None if existing is None else existing.state, metadata.state)
        for epoch in metadata.segment_leader_epochs:
            self._epoch(epoch).copy_started(metadata.segment_id)
        self._segments[metadata.segment_id] = metadata

    def update_segment(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata | None:
        """Move a segment to ``update.state``; returns the segment as updated, or None if the update was dropped.

        An update of a segment this cache never saw is dropped while it is
        catching up (the segment's first record went with the topic's
        retention, or its delete already finished) and raises
        :class:`RemoteResourceNotFoundError` once it is initialized.
        """
        if update.state is _S.COPY_SEGMENT_STARTED:
            raise ValueError(f"{update.segment_id} is updated to COPY_SEGMENT_STARTED: a copy is started by adding "
                             "the segment (add_copy_in_progress_segment)")
        existing = self._segments.get(update.segment_id)
        if existing is None:
            if not self._initialized:
                log.debug("Dropping %s: the segment's first record is gone", update)
                return None
            raise RemoteResourceNotFoundError(f"No remote log segment metadata found for {update.segment_id}")
        self._check(update.segment_id, existing.state, update.state)
        metadata = with_update(existing, update)
        epochs = metadata.segment_leader_epochs
        if update.state is _S.COPY_SEGMENT_FINISHED:
            for epoch, start in epochs.items():
                self._epoch(epoch).copy_finished(start, metadata.segment_id, _epoch_end_offset(metadata, epoch))
            self._segments[metadata.segment_id] = metadata
        elif update.state is _S.DELETE_SEGMENT_STARTED:
            for epoch, start in epochs.items():
                self._epoch(epoch).delete_started(start, metadata.segment_id)
            self._segments[metadata.segment_id] = metadata
        else:
            for epoch in epochs:
                self._epoch(epoch).delete_finished(metadata.segment_id)
            del self._segments[metadata.segment_id]
        return metadata

    def apply_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None:
        """Record a step of deleting the whole partition (marked, started, finished, in that order)."""
        current = None if self._partition_delete is None else self._partition_delete.state
        if not RemotePartitionDeleteState.is_valid_transition(current, metadata.state):
            raise IllegalStateTransitionError(f"{uuid_to_text(metadata.topic_id)}:{metadata.tp}", current,
                                              metadata.state)
        self._partition_delete = metadata

    # Questions --------------------------------------------------------------------------------------------------

    @property
    def partition_delete(self) -> RemotePartitionDeleteMetadata | None:
        """The last step of the partition's deletion, None while the partition is not being deleted."""
        return self._partition_delete

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        """A known segment (in any state but DELETE_SEGMENT_FINISHED): what an update must carry on."""
        return self._segments.get(segment_id)

    def remote_log_segment_metadata(self, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The readable (COPY_SEGMENT_FINISHED) segment holding ``offset`` as written in ``leader_epoch``, if any."""
        state = self._epochs.get(leader_epoch)
        segment_id = None if state is None else state.floor(offset)
        if segment_id is None:
            return None
        metadata = self._segments[segment_id]
        return metadata if offset <= _epoch_end_offset(metadata, leader_epoch) else None

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` ever copied (COPY_SEGMENT_FINISHED), even if since deleted.

        How far the remote log reaches in that epoch: a follower keeps its
        local segments until then, and a new leader resumes copying after it.
        """
        state = self._epochs.get(leader_epoch)
        return None if state is None else state.highest_offset

    def list_segments(self, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Every known segment (in every state but DELETE_SEGMENT_FINISHED), by start offset; with ``leader_epoch``,
        only those holding records of that epoch (readable ones first among equal start offsets)."""
        if leader_epoch is None:
            return sorted(self._segments.values(), key=_start_offset)
        state = self._epochs.get(leader_epoch)
        if state is None:
            return []
        segments = [self._segments[segment_id] for segment_id in state.segment_ids()]
        if state.unreferenced:  # the readable ones are in offset order already
            segments.sort(key=_start_offset)
        return segments

    def copy_in_progress_segments(self) -> list[RemoteLogSegmentMetadata]:
        """Segments whose copy started and never finished, by start offset.

        A new leader deletes those it is not copying itself: a leader that
        failed or moved mid-copy may have left part of them in the store.
        """
        return [m for m in self.list_segments() if m.state is _S.COPY_SEGMENT_STARTED]

    def leader_epochs(self) -> list[int]:
        """The leader epochs the listed segments hold records of, ascending: what retention walks through."""
        return sorted(epoch for epoch, state in self._epochs.items() if state.offsets or state.unreferenced)

    def remote_log_size(self, leader_epoch: int | None = None) -> int:
        """Bytes of the listed segments (of ``leader_epoch``), as Kafka's ``RemoteLogMetadataManager.remoteLogSize``."""
        return sum(m.segment_size_in_bytes for m in self.list_segments(leader_epoch))

    def __len__(self) -> int:
        return len(self._segments)

    # Internals --------------------------------------------------------------------------------------------------

    def _epoch(self, leader_epoch: int) -> _EpochState:
        state = self._epochs.get(leader_epoch)
        if state is None:
            state = self._epochs[leader_epoch] = _EpochState()
        return state

    @staticmethod
    def _check(segment_id: RemoteLogSegmentId, current: RemoteLogSegmentState | None,
               target: RemoteLogSegmentState) -> None:
        if not is_valid_segment_transition(current, target):
            raise IllegalStateTransitionError(segment_id, current, target)


def _epoch_end_offset(metadata: RemoteLogSegmentMetadata, leader_epoch: int) -> int:
    """The last offset of ``leader_epoch`` within the segment: before the next epoch's first, or the segment's end."""
    epochs = metadata.segment_leader_epochs
    later = [epoch for epoch in epochs if epoch > leader_epoch]
    return epochs[min(later)] - 1 if later else metadata.end_offset


def _start_offset(metadata: RemoteLogSegmentMetadata) -> int:
    return metadata.start_offset


#: A user partition as ``__remote_log_metadata`` names it: a re-created topic's partitions are new ones.
PartitionKey = tuple[uuid.UUID, TopicPartition]


class RemotePartitionMetadataStore:
    """The caches of the partitions one broker follows (Kafka's ``RemotePartitionMetadataStore``).

    The consumer of ``__remote_log_metadata`` :meth:`load_partition`\\ s each
    partition the broker becomes a replica of, feeds every record to
    :meth:`handle`, and marks a partition initialized once it has read up
    to the end it saw on assignment; questions before that are refused with
    :class:`RemoteLogMetadataNotReadyError`, since the answer could be stale.
    """

    def __init__(self) -> None:
        self._caches: dict[PartitionKey, RemoteLogMetadataCache] = {}

    def load_partition(self, topic_id: uuid.UUID, tp: TopicPartition) -> RemoteLogMetadataCache:
        """The partition's cache, created empty (not initialized) if it has none yet."""
        cache = self._caches.get((topic_id, tp))
        if cache is None:
            cache = self._caches[(topic_id, tp)] = RemoteLogMetadataCache()
        return cache

    def mark_initialized(self, topic_id: uuid.UUID, tp: TopicPartition) -> None:
        self.load_partition(topic_id, tp).mark_initialized()

    def is_initialized(self, topic_id: uuid.UUID, tp: TopicPartition) -> bool:
        cache = self._caches.get((topic_id, tp))
        return cache is not None and cache.initialized

    def clear_partition(self, topic_id: uuid.UUID, tp: TopicPartition) -> None:
        """Forget a partition this broker no longer follows."""
        self._caches.pop((topic_id, tp), None)

    def partitions(self) -> list[PartitionKey]:
        return list(self._caches)

    def cache(self, topic_id: uuid.UUID, tp: TopicPartition) -> RemoteLogMetadataCache:
        """The initialized cache of a partition, to ask it questions."""
        cache = self._caches.get((topic_id, tp))
        if cache is None:
            raise RemoteResourceNotFoundError(f"No resource found for partition: {uuid_to_text(topic_id)}:{tp}")
        if not cache.initialized:
            raise RemoteLogMetadataNotReadyError(
                f"Remote log metadata cache is not initialized for partition: {uuid_to_text(topic_id)}:{tp}")
        return cache

    def handle(self, record: RemoteLogMetadata) -> bool:
        """Apply one record read from ``__remote_log_metadata``; False if it was skipped or dropped.

        Records of partitions this broker does not follow are skipped (a
        metadata partition holds many user partitions). A record that
        cannot apply (an illegal transition, an update of a segment unknown
        after catch-up, an update to COPY_SEGMENT_STARTED) is logged and
        dropped, as Kafka has done since KAFKA-15632: one bad or stale
        record must not stop a broker from reading the rest of the topic.
        DELETE_PARTITION_FINISHED forgets the partition.
        """
        if isinstance(record, RemoteLogSegmentMetadata):
            key: PartitionKey = (record.segment_id.topic_id, record.segment_id.tp)
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            key = (record.segment_id.topic_id, record.segment_id.tp)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            key = (record.topic_id, record.tp)
        else:
            log.warning("Skipping %s: not a record the remote log metadata is built from", type(record).__name__)
            return False
        cache = self._caches.get(key)
        if cache is None:
            return False
        try:
            if isinstance(record, RemoteLogSegmentMetadata):
                cache.add_copy_in_progress_segment(record)
            elif isinstance(record, RemoteLogSegmentMetadataUpdate):
                return cache.update_segment(record) is not None
            elif record.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                del self._caches[key]  # whatever came before, a finished delete leaves nothing to know
            else:
                cache.apply_partition_delete(record)
        except (ValueError, RemoteResourceNotFoundError) as exc:
            log.error("Dropping %s: %s", record, exc)
            return False
        return True
