"""The remote log manager's own arithmetic: its quotas and what it knows of a partition's remote segments."""

import uuid

from josef.log import EpochEntry
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

from josef_storage_tiered.manager import ByteRate, RemoteView

TP = TopicPartition("t", 0)


def segment(start: int, end: int, epochs: dict[int, int]) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(uuid.uuid4(), TP), start, end, 1000, 1, 1000,
                                    (end - start + 1) * 100, epochs, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)


def test_a_quota_is_exceeded_by_a_second_s_worth_and_recovers_as_time_passes():
    now = [100.0]
    rate = ByteRate(1000, clock=lambda: now[0])
    rate.record(999)
    assert not rate.exceeded()
    rate.record(1)
    assert rate.exceeded()
    rate.record(4000)  # a large copy overshoots: the next ones wait until what it took is paid back
    now[0] += 1.0
    assert rate.exceeded()
    now[0] += 4.0
    assert not rate.exceeded()


def test_an_empty_view_copies_from_zero_and_reads_nothing():
    view = RemoteView()
    assert (view.first_offset, view.next_offset, view.size_bytes, view.holding(0), view.epochs()) == (None, 0, 0,
                                                                                                        None, [])


def test_a_view_finds_segments_and_the_epochs_of_remote_data():
    view = RemoteView((segment(0, 99, {0: 0}), segment(100, 249, {0: 100, 2: 180}), segment(250, 299, {3: 250})))
    assert (view.first_offset, view.next_offset, view.size_bytes) == (0, 300, 30000)
    assert [view.holding(o) for o in (0, 99, 100, 249, 250, 299, 300)] == [0, 0, 1, 1, 2, 2, None]
    assert view.epochs() == [EpochEntry(0, 0), EpochEntry(2, 180), EpochEntry(3, 250)]
