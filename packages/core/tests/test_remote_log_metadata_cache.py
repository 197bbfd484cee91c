"""The remote log metadata cache: Kafka's RemoteLogMetadataCache answers, state by state and epoch by epoch.

Scenarios follow Kafka's RemoteLogMetadataCacheTest, RemoteLogLeaderEpochStateTest
and RemoteLogSegmentLifecycleTest.
"""

from __future__ import annotations

import itertools
import uuid

import attrs
import pytest

from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata.cache import (
    IllegalStateTransitionError,
    RemoteLogMetadataCache,
    RemoteLogMetadataNotReadyError,
    RemotePartitionMetadataStore,
    is_valid_segment_transition,
)
from josef.remote_log_metadata.records import (
    RemoteLogSegmentMetadataSnapshot,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    decode,
    encode,
)
from josef.remote_storage import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
)

S = RemoteLogSegmentState
D = RemotePartitionDeleteState
TOPIC_ID = uuid.UUID("aa8dc1af-80b7-4d55-915f-52663d41796c")
TP = TopicPartition("foo", 0)

LEGAL = {(None, S.COPY_SEGMENT_STARTED),
         (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_STARTED), (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED),
         (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED), (S.DELETE_SEGMENT_FINISHED, S.DELETE_SEGMENT_FINISHED),
         (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED), (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED),
         (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
         (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED)}  # a failed copy is cleaned up


def segment(start: int, end: int, epochs: dict[int, int], size: int = 100) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(TOPIC_ID, TP, uuid.uuid4()), start, end, -1, 0, 1, size, epochs)


def update(metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, custom: bytes | None = None,
           ) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(metadata.segment_id, custom, state, 2, 1)


def cache_with(*segments: RemoteLogSegmentMetadata, state: RemoteLogSegmentState = S.COPY_SEGMENT_FINISHED,
               ) -> RemoteLogMetadataCache:
    cache = RemoteLogMetadataCache()
    cache.mark_initialized()
    for metadata in segments:
        move(cache, metadata, state)
    return cache


def move(cache: RemoteLogMetadataCache, metadata: RemoteLogSegmentMetadata,
         state: RemoteLogSegmentState) -> RemoteLogSegmentMetadata:
    """Add the segment and walk it along the happy path to ``state``."""
    cache.add_copy_in_progress_segment(metadata)
    path = [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
    current = metadata
    for step in path[: path.index(state) + 1] if state in path else []:
        current = cache.update_segment(update(metadata, step))
    return current


def ids(segments):
    return [m.segment_id for m in segments]


# Transitions --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "target"), list(itertools.product([None, *S], S)))
def test_segment_transitions_are_kafkas(current, target):
    assert is_valid_segment_transition(current, target) == ((current, target) in LEGAL)


@pytest.mark.parametrize(("current", "target"), list(itertools.product([None, *D], D)))
def test_partition_delete_transitions_are_kafkas(current, target):
    legal = {(None, D.DELETE_PARTITION_MARKED), (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED),
             (D.DELETE_PARTITION_STARTED, D.DELETE_PARTITION_FINISHED)} | {(s, s) for s in D}
    assert D.is_valid_transition(current, target) == ((current, target) in legal)


@pytest.mark.parametrize("path", [
    [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED],
    [S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED],  # the copy failed
    [S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED,
     S.DELETE_SEGMENT_FINISHED],  # replayed events
], ids=["copied-then-deleted", "failed-copy-cleaned-up", "repeated-states"])
def test_every_legal_transition_applies(path):
    cache = cache_with()
    metadata = segment(0, 99, {0: 0})
    cache.add_copy_in_progress_segment(metadata)
    cache.add_copy_in_progress_segment(metadata)  # STARTED again: a replay, harmless
    for step in path:
        custom = b"handle" if step is not S.DELETE_SEGMENT_FINISHED else None
        updated = cache.update_segment(update(metadata, step, custom))
        assert updated == attrs.evolve(metadata, state=step, custom_metadata=custom, broker_id=1,
                                       event_timestamp_ms=2)
        if step is not S.DELETE_SEGMENT_FINISHED:
            assert cache.segment(metadata.segment_id) == updated
            assert cache.list_segments(0) == [updated]
    assert cache.segment(metadata.segment_id) is None
    assert cache.list_segments() == cache.list_segments(0) == [] and len(cache) == 0


ILLEGAL_UPDATES = [(current, target) for current, target in itertools.product(
    [S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED],
    [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]) if (current, target) not in LEGAL]


@pytest.mark.parametrize(("current", "target"), ILLEGAL_UPDATES)
def test_an_illegal_update_raises_and_changes_nothing(current, target):
    metadata = segment(0, 99, {0: 0})
    cache = cache_with()
    before = move(cache, metadata, current)
    snapshot = (cache.list_segments(), cache.list_segments(0), cache.remote_log_segment_metadata(0, 5),
                cache.highest_offset_for_epoch(0))
    with pytest.raises(IllegalStateTransitionError, match=f"state {current.name} can not be transitioned to "
                                                          f"{target.name}") as raised:
        cache.update_segment(update(metadata, target))
    assert (raised.value.current, raised.value.target) == (current, target)
    assert cache.segment(metadata.segment_id) == before
    assert snapshot == (cache.list_segments(), cache.list_segments(0), cache.remote_log_segment_metadata(0, 5),
                        cache.highest_offset_for_epoch(0))


@pytest.mark.parametrize("current", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED])
def test_adding_a_known_segment_again_is_an_illegal_transition(current):
    metadata = segment(0, 99, {0: 0})
    cache = cache_with()
    move(cache, metadata, current)
    with pytest.raises(IllegalStateTransitionError, match=f"{current.name} can not be transitioned to "
                                                          "COPY_SEGMENT_STARTED"):
        cache.add_copy_in_progress_segment(metadata)
    assert cache.segment(metadata.segment_id).state is current


@pytest.mark.parametrize("state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED])
def test_only_copy_started_segments_are_added(state):
    with pytest.raises(ValueError, match="only COPY_SEGMENT_STARTED segments are added"):
        cache_with().add_copy_in_progress_segment(attrs.evolve(segment(0, 9, {0: 0}), state=state))


@pytest.mark.parametrize("current", [S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED])
def test_no_update_goes_back_to_copy_started(current):
    metadata = segment(0, 99, {0: 0})
    cache = cache_with()
    move(cache, metadata, current)
    with pytest.raises(ValueError, match="add_copy_in_progress_segment"):
        cache.update_segment(update(metadata, S.COPY_SEGMENT_STARTED))
    assert cache.segment(metadata.segment_id).state is current


def test_an_update_of_an_unknown_segment_is_dropped_while_catching_up_and_refused_after():
    cache = RemoteLogMetadataCache()
    orphan = segment(0, 9, {0: 0})
    for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        assert cache.update_segment(update(orphan, state)) is None
    assert not cache.initialized and len(cache) == 0
    cache.mark_initialized()
    for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        with pytest.raises(RemoteResourceNotFoundError, match="No remote log segment metadata found"):
            cache.update_segment(update(orphan, state))


def test_a_deleted_segment_is_forgotten():
    metadata = segment(0, 99, {0: 0})
    cache = cache_with(metadata, state=S.DELETE_SEGMENT_FINISHED)
    with pytest.raises(RemoteResourceNotFoundError):
        cache.update_segment(update(metadata, S.DELETE_SEGMENT_FINISHED))
    assert cache.list_segments() == [] and cache.copy_in_progress_segments() == []


# Lookups across leader epochs ---------------------------------------------------------------------------------


def lifecycle() -> tuple[RemoteLogMetadataCache, list[RemoteLogSegmentMetadata]]:
    """Kafka's RemoteLogSegmentLifecycleTest: four copied segments, epochs changing inside three of them."""
    segments = [segment(0, 100, {0: 0, 1: 20, 2: 80}),  # spans epochs 0, 1 and 2
                segment(101, 200, {2: 101}),
                segment(201, 300, {2: 201, 3: 240}),
                segment(250, 400, {3: 250, 4: 370})]    # overlaps the previous one from 250 in epoch 3
    cache = cache_with()
    return cache, [move(cache, m, S.COPY_SEGMENT_FINISHED) for m in segments]


@pytest.mark.parametrize(("epoch", "offset", "expected"), [
    (0, 0, 0), (0, 19, 0), (1, 20, 0), (1, 40, 0), (1, 79, 0), (2, 80, 0), (2, 100, 0),
    (2, 101, 1), (2, 110, 1), (2, 200, 1), (2, 201, 2), (2, 239, 2), (3, 240, 2), (3, 249, 2),
    (3, 250, 3), (3, 369, 3), (4, 370, 3), (4, 375, 3), (4, 400, 3),
    (0, 20, None),    # offset 20 was written in epoch 1, not 0
    (1, 110, None),   # past the end of epoch 1 (79)
    (1, 19, None),    # before epoch 1 starts
    (2, 240, None),   # epoch 3 had started
    (4, 401, None),   # past the last segment
    (4, 369, None),   # epoch 4 starts at 370
    (5, 301, None),   # an epoch with no segment
    (-1, 0, None),
])
def test_remote_log_segment_metadata_finds_the_segment_of_the_epoch(epoch, offset, expected):
    cache, segments = lifecycle()
    found = cache.remote_log_segment_metadata(epoch, offset)
    assert found == (None if expected is None else segments[expected])


def test_highest_offset_for_epoch_counts_copied_segments_and_survives_their_deletion():
    cache, segments = lifecycle()
    highest = {0: 19, 1: 79, 2: 239, 3: 369, 4: 400}
    assert {epoch: cache.highest_offset_for_epoch(epoch) for epoch in range(6)} == {**highest, 5: None}
    cache.update_segment(update(segments[0], S.DELETE_SEGMENT_STARTED))
    assert cache.remote_log_segment_metadata(0, 10) is None and cache.remote_log_segment_metadata(1, 40) is None
    assert ids(cache.list_segments(0)) == [segments[0].segment_id]  # listed, for the delete to be retried
    cache.update_segment(update(segments[0], S.DELETE_SEGMENT_FINISHED))
    assert cache.list_segments(0) == cache.list_segments(1) == []
    assert ids(cache.list_segments(2)) == ids(segments[1:3])
    assert {epoch: cache.highest_offset_for_epoch(epoch) for epoch in range(6)} == {**highest, 5: None}


def test_a_copy_in_progress_is_listed_but_neither_readable_nor_counted():
    cache = cache_with()
    metadata = segment(0, 50, {0: 0, 1: 30})
    cache.add_copy_in_progress_segment(metadata)
    assert cache.remote_log_segment_metadata(0, 0) is None
    assert cache.highest_offset_for_epoch(0) is None and cache.highest_offset_for_epoch(1) is None
    assert cache.list_segments(0) == cache.list_segments(1) == cache.list_segments() == [metadata]


def test_listings_are_in_offset_order_and_per_epoch():
    cache = cache_with()
    s2 = move(cache, segment(201, 400, {0: 201, 1: 301}), S.COPY_SEGMENT_FINISHED)
    s0 = move(cache, segment(0, 100, {0: 0}), S.COPY_SEGMENT_FINISHED)
    started = move(cache, segment(401, 500, {1: 401}), S.COPY_SEGMENT_STARTED)
    s1 = move(cache, segment(101, 200, {0: 101}), S.COPY_SEGMENT_FINISHED)
    deleting = move(cache, segment(50, 60, {0: 50}), S.DELETE_SEGMENT_STARTED)
    move(cache, segment(60, 70, {0: 60}), S.DELETE_SEGMENT_FINISHED)
    assert cache.list_segments() == [s0, deleting, s1, s2, started]
    assert cache.list_segments(0) == [s0, deleting, s1, s2]
    assert cache.list_segments(1) == [s2, started]
    assert cache.list_segments(2) == []
    assert cache.leader_epochs() == [0, 1]
    assert cache.remote_log_size() == 500 and cache.remote_log_size(1) == 200 and cache.remote_log_size(7) == 0
    assert len(cache) == 5


def test_epochs_without_segments_in_between():
    cache = cache_with()
    a = move(cache, segment(0, 9, {3: 0}), S.COPY_SEGMENT_FINISHED)
    b = move(cache, segment(10, 19, {6: 10, 8: 15}), S.COPY_SEGMENT_FINISHED)
    assert cache.leader_epochs() == [3, 6, 8]
    assert [cache.highest_offset_for_epoch(e) for e in range(3, 9)] == [9, None, None, 14, None, 19]
    assert cache.remote_log_segment_metadata(3, 9) == a
    assert cache.remote_log_segment_metadata(6, 14) == b and cache.remote_log_segment_metadata(8, 15) == b
    assert cache.remote_log_segment_metadata(7, 12) is None and cache.remote_log_segment_metadata(6, 15) is None


def test_a_leaders_recopy_of_a_lagging_leaders_segments_replaces_them_for_reads():
    # Kafka's case 1 and 2: L0 copied 10-100; L1 copies 5-150 in the same epoch, then 4-200.
    cache = cache_with()
    first = move(cache, segment(10, 100, {0: 10}), S.COPY_SEGMENT_FINISHED)
    second = move(cache, segment(5, 150, {0: 5}), S.COPY_SEGMENT_FINISHED)
    assert cache.remote_log_segment_metadata(0, 11) == second
    third = move(cache, segment(148, 155, {0: 148}), S.COPY_SEGMENT_FINISHED)
    fourth = move(cache, segment(4, 200, {0: 4}), S.COPY_SEGMENT_FINISHED)
    assert cache.remote_log_segment_metadata(0, 11) == cache.remote_log_segment_metadata(0, 150) == fourth
    assert cache.highest_offset_for_epoch(0) == 200
    # The replaced ones stay listed, by start offset, so that retention deletes them.
    assert cache.list_segments(0) == [fourth, second, first, third]


def test_a_shorter_copy_at_the_same_start_offset_keeps_the_older_segment_listed():
    cache = cache_with()
    longer = move(cache, segment(10, 150, {0: 10}), S.COPY_SEGMENT_FINISHED)
    shorter = move(cache, segment(10, 100, {0: 10}), S.COPY_SEGMENT_FINISHED)
    assert cache.remote_log_segment_metadata(0, 50) == shorter  # Kafka's: the latest copy at that offset reads
    assert cache.remote_log_segment_metadata(0, 120) is None
    assert set(ids(cache.list_segments(0))) == {longer.segment_id, shorter.segment_id}


def test_a_copy_that_reaches_less_far_does_not_replace_the_segments_after_its_start():
    cache = cache_with()
    longer = move(cache, segment(20, 150, {0: 20}), S.COPY_SEGMENT_FINISHED)
    earlier = move(cache, segment(10, 100, {0: 10}), S.COPY_SEGMENT_FINISHED)
    assert cache.remote_log_segment_metadata(0, 15) == earlier
    assert cache.remote_log_segment_metadata(0, 50) == longer  # still indexed: it holds offsets up to 150
    assert cache.remote_log_segment_metadata(0, 150) == longer
    assert cache.list_segments(0) == [earlier, longer] and cache.highest_offset_for_epoch(0) == 150


def test_copies_stuck_in_copy_started_are_what_a_new_leader_cleans_up():
    cache = cache_with()
    move(cache, segment(0, 99, {0: 0}), S.COPY_SEGMENT_FINISHED)
    stuck_late = move(cache, segment(200, 299, {1: 200}), S.COPY_SEGMENT_STARTED)
    stuck_early = move(cache, segment(100, 199, {0: 100, 1: 150}), S.COPY_SEGMENT_STARTED)
    move(cache, segment(300, 399, {1: 300}), S.DELETE_SEGMENT_STARTED)
    assert cache.copy_in_progress_segments() == [stuck_early, stuck_late]
    cache.update_segment(update(stuck_early, S.DELETE_SEGMENT_STARTED))  # the new leader's cleanup
    cache.update_segment(update(stuck_early, S.DELETE_SEGMENT_FINISHED))
    assert cache.copy_in_progress_segments() == [stuck_late]


# The partition's deletion -------------------------------------------------------------------------------------


def delete_record(state: RemotePartitionDeleteState, topic_id: uuid.UUID = TOPIC_ID) -> RemotePartitionDeleteMetadata:
    return RemotePartitionDeleteMetadata(topic_id, TP, state, 5, 0)


def test_a_partition_is_marked_then_started_then_finished():
    cache = cache_with()
    assert cache.partition_delete is None
    for state in (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED,
                  D.DELETE_PARTITION_FINISHED):
        cache.apply_partition_delete(delete_record(state))
        assert cache.partition_delete == delete_record(state)


@pytest.mark.parametrize(("before", "target"), [
    ((), D.DELETE_PARTITION_STARTED), ((), D.DELETE_PARTITION_FINISHED),
    ((D.DELETE_PARTITION_MARKED,), D.DELETE_PARTITION_FINISHED),
    ((D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED), D.DELETE_PARTITION_MARKED),
    ((D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED, D.DELETE_PARTITION_FINISHED), D.DELETE_PARTITION_MARKED),
])
def test_an_illegal_partition_delete_step_raises(before, target):
    cache = cache_with()
    for state in before:
        cache.apply_partition_delete(delete_record(state))
    with pytest.raises(IllegalStateTransitionError, match=f"can not be transitioned to {target.name}"):
        cache.apply_partition_delete(delete_record(target))
    assert cache.partition_delete == (delete_record(before[-1]) if before else None)


# The store the metadata consumer feeds ---------------------------------------------------------------------------


def test_the_store_replays_records_of_the_partitions_it_follows():
    store = RemotePartitionMetadataStore()
    store.load_partition(TOPIC_ID, TP)
    other_topic = uuid.uuid4()
    metadata = segment(0, 99, {0: 0})
    foreign = RemoteLogSegmentMetadata(RemoteLogSegmentId(other_topic, TP, uuid.uuid4()), 0, 9, -1, 0, 1, 1, {0: 0})
    records = [metadata, update(metadata, S.COPY_SEGMENT_FINISHED, b"x"), foreign]
    applied = [store.handle(decode(encode(r))) for r in records]  # as read from __remote_log_metadata
    assert applied == [True, True, False]
    assert store.partitions() == [(TOPIC_ID, TP)]

    with pytest.raises(RemoteLogMetadataNotReadyError, match="not initialized"):
        store.cache(TOPIC_ID, TP)
    with pytest.raises(RemoteResourceNotFoundError, match="No resource found"):
        store.cache(other_topic, TP)
    assert not store.is_initialized(TOPIC_ID, TP)
    store.mark_initialized(TOPIC_ID, TP)
    assert store.is_initialized(TOPIC_ID, TP)
    cache = store.cache(TOPIC_ID, TP)
    assert cache.remote_log_segment_metadata(0, 50).custom_metadata == b"x"


def test_the_store_drops_records_that_cannot_apply_and_goes_on(caplog):
    store = RemotePartitionMetadataStore()
    store.mark_initialized(TOPIC_ID, TP)
    metadata = segment(0, 99, {0: 0})
    assert store.handle(metadata)
    assert not store.handle(update(metadata, S.DELETE_SEGMENT_FINISHED))        # illegal: STARTED -> DELETE_FINISHED
    assert not store.handle(update(metadata, S.COPY_SEGMENT_STARTED))           # not an update
    assert not store.handle(update(segment(0, 1, {0: 0}), S.COPY_SEGMENT_FINISHED))  # unknown segment
    assert not store.handle(delete_record(D.DELETE_PARTITION_STARTED))          # never marked
    assert not store.handle(RemoteLogSegmentMetadataSnapshot.of(metadata))      # not a topic record
    assert "Dropping" in caplog.text
    assert store.handle(update(metadata, S.COPY_SEGMENT_FINISHED))
    assert store.cache(TOPIC_ID, TP).list_segments()[0].state is S.COPY_SEGMENT_FINISHED


def test_a_finished_partition_delete_forgets_the_partition():
    store = RemotePartitionMetadataStore()
    store.mark_initialized(TOPIC_ID, TP)
    assert store.handle(segment(0, 99, {0: 0}))
    assert store.handle(delete_record(D.DELETE_PARTITION_MARKED))
    assert store.cache(TOPIC_ID, TP).partition_delete.state is D.DELETE_PARTITION_MARKED
    assert store.handle(delete_record(D.DELETE_PARTITION_STARTED))
    assert store.handle(delete_record(D.DELETE_PARTITION_FINISHED))
    assert store.partitions() == [] and not store.is_initialized(TOPIC_ID, TP)
    assert not store.handle(segment(0, 9, {0: 0}))  # a late record of the deleted partition is skipped


def test_clear_partition_forgets_one_partition_only():
    store = RemotePartitionMetadataStore()
    other = TopicPartition("foo", 1)
    store.load_partition(TOPIC_ID, TP)
    store.load_partition(TOPIC_ID, other)
    assert store.load_partition(TOPIC_ID, TP) is store.load_partition(TOPIC_ID, TP)
    store.clear_partition(TOPIC_ID, TP)
    store.clear_partition(TOPIC_ID, TP)
    assert store.partitions() == [(TOPIC_ID, other)]
