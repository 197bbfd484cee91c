"""A partition replica's replication state: high watermark, ISR changes, follower appends and truncation.

Partitions here are built by hand over logs of the running broker's storage
(topics the broker itself does not know), with explicit clocks, so every
rule is checked without a cluster; ``integration-tests/test_replication.py``
checks the same rules across broker processes.
"""

import itertools

import pytest
from kio.schema.errors import ErrorCode

from josef.log import LogConfig
from josef.metadata.image import RECOVERING, PartitionImage
from josef.replication.partition import FollowerState, Partition, PartitionError
from josef.protocol.records import CorruptRecordError, InvalidRecordError, build_batch, validate_and_assign
from josef.protocol.topic_partition import TopicPartition

ME, OTHER, THIRD = 1, 2, 3
_names = itertools.count()


@pytest.fixture
def make(josef_broker):
    """``make(leader=..., isr=..., epoch=...)``: a fresh partition of replicas 1, 2, 3 on this broker's storage."""
    storage = josef_broker.broker.storage

    def partition(leader=ME, isr=(ME, OTHER, THIRD), epoch=0, high_watermark=None, **config):
        tp = TopicPartition(f"unit-{next(_names)}", 0)
        p = Partition(tp, "topic-id", ME, storage.open(tp, LogConfig()), {"min.insync.replicas": 2, **config},
                      high_watermark)
        p.update_state(PartitionImage((ME, OTHER, THIRD), tuple(isr), leader, epoch, 0), at_ms=1000)
        return p
    return partition


def batch(count=1, pid=-1, seq=-1):
    return build_batch([(None, b"v", 100 + i) for i in range(count)], producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                       base_sequence=seq)


def leader_batches(offset, epoch, *counts):
    """Batches as a leader stores them: offsets from ``offset``, stamped with ``epoch``."""
    buf = bytearray(b"".join(batch(n) for n in counts))
    validate_and_assign(buf, offset, epoch, 1 << 20)
    return bytes(buf)


def test_the_high_watermark_is_the_smallest_log_end_over_the_isr_and_never_goes_back(make):
    p = make()
    p.append_as_leader(batch(10), -1)
    assert p.high_watermark == 0  # the followers' log ends are unknown
    assert not p.follower_fetched(OTHER, 10, at_ms=1001)
    assert p.follower_fetched(THIRD, 4, at_ms=1001) and p.high_watermark == 4
    assert p.follower_fetched(THIRD, 10, at_ms=1002) and p.high_watermark == 10
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME, OTHER), ME, 0, 1))
    p.follower_fetched(OTHER, 3, at_ms=1003)  # a follower that truncated does not pull it back
    assert p.high_watermark == 10


def test_a_follower_being_added_counts_for_the_high_watermark_before_the_controller_agrees(make):
    p = make(isr=(ME, OTHER))
    p.append_as_leader(batch(5), -1)
    p.follower_fetched(OTHER, 5, at_ms=1001)
    assert p.high_watermark == 5
    p.append_as_leader(batch(5), -1)
    p.follower_fetched(THIRD, 5, at_ms=1001)
    assert p.isr_to_expand(lambda b: True) == (ME, OTHER, THIRD)
    p.pending_isr = (ME, OTHER, THIRD)
    p.follower_fetched(OTHER, 10, at_ms=1002)
    assert p.high_watermark == 5  # broker 3 is waited for: it may be in the ISR already
    p.follower_fetched(THIRD, 10, at_ms=1002)
    assert p.high_watermark == 10


def test_followers_join_the_isr_only_when_caught_up_in_this_epoch_and_eligible(make):
    p = make(isr=(ME,))
    p.append_as_leader(batch(4), 1)
    assert p.high_watermark == 4
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME,), ME, 1, 1))  # a new epoch starting at offset 4
    p.follower_fetched(OTHER, 4, at_ms=1001)
    p.follower_fetched(THIRD, 3, at_ms=1001)
    assert p.isr_to_expand(lambda b: b != OTHER) is None  # 2 is fenced, 3 lacks offset 3
    assert p.isr_to_expand(lambda b: True) == (ME, OTHER)
    p.recovering = True
    assert p.isr_to_expand(lambda b: True) is None  # an unclean leader first reports its recovery


def test_followers_that_stop_catching_up_for_the_lag_time_leave_the_isr(make):
    p = make()
    p.append_as_leader(batch(3), -1)
    p.follower_fetched(OTHER, 3, at_ms=2000)  # caught up at 2000
    p.follower_fetched(THIRD, 1, at_ms=2000)  # behind, last caught up when made leader (1000)
    assert p.isr_to_shrink(30000, at_ms=30900) is None
    assert p.isr_to_shrink(30000, at_ms=31001) == (ME, OTHER)
    assert p.isr_to_shrink(30000, at_ms=90000) == (ME, OTHER)  # with nothing new to fetch, 2 stays in sync
    p.append_as_leader(batch(1), 1)
    assert p.isr_to_shrink(30000, at_ms=32001) == (ME,)
    p.pending_isr = (ME,)
    assert p.isr_to_shrink(30000, at_ms=40000) is None  # one change in flight at a time


def test_a_follower_is_caught_up_if_it_reached_the_end_the_leader_had_at_its_previous_fetch():
    state = FollowerState()
    state.fetched(5, leader_end=8, now_ms=100)
    assert state.last_caught_up_ms == 0
    state.fetched(8, leader_end=12, now_ms=200)  # it has what the leader had at 100
    assert state.last_caught_up_ms == 100
    state.fetched(12, leader_end=12, now_ms=300)
    assert state.last_caught_up_ms == 300 and state.caught_up(12, 10**6, 1)


def test_acks_all_fails_after_the_append_when_the_isr_shrank_below_min_insync(make):
    p = make()
    p.check_enough_replicas()
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME,), ME, 0, 1))
    with pytest.raises(PartitionError) as info:
        p.check_enough_replicas()
    assert info.value.code == ErrorCode.not_enough_replicas_after_append
    with pytest.raises(PartitionError) as info:
        p.append_as_leader(batch(), -1)
    assert info.value.code == ErrorCode.not_enough_replicas
    assert p.log.log_end_offset == 0


def test_older_states_are_ignored_and_a_new_term_resets_what_the_leader_knew(make):
    p = make()
    p.follower_fetched(OTHER, 0, at_ms=1001)
    assert not p.update_state(PartitionImage((ME, OTHER, THIRD), (ME,), ME, 0, -1))
    assert p.isr == (ME, OTHER, THIRD)
    assert p.update_state(PartitionImage((ME, OTHER, THIRD), (ME, OTHER), ME, 1, 2), at_ms=5000)
    assert p.followers[OTHER].log_end_offset == -1 and p.followers[OTHER].last_caught_up_ms == 5000
    assert p.followers[THIRD].last_caught_up_ms == 0
    assert p.log.epoch_entries()[-1].epoch == 1
    assert p.update_state(PartitionImage((ME, OTHER, THIRD), (ME, OTHER), OTHER, 2, 3))
    assert not p.is_leader and p.followers == {}


def test_an_uncleanly_elected_leader_is_recovering_until_the_controller_agrees(make):
    p = make()
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME,), ME, 1, 1, leader_recovery_state=RECOVERING))
    assert p.recovering
    p.isr_committed((ME,), 1, 2, recovering=False)
    assert not p.recovering and p.partition_epoch == 2


def test_followers_append_the_leaders_batches_unchanged_and_learn_its_epochs(make):
    p = make(leader=OTHER)
    first = leader_batches(0, 0, 2, 3)
    p.append_as_follower(first, leader_high_watermark=3, leader_log_start=0)
    assert p.log.log_end_offset == 5 and p.high_watermark == 3
    later = leader_batches(5, 4, 1)
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME, OTHER, THIRD), OTHER, 4, 1))
    p.append_as_follower(later, leader_high_watermark=9, leader_log_start=0)
    assert p.high_watermark == 6  # never past its own log end
    assert [(e.epoch, e.start_offset) for e in p.log.epoch_entries()] == [(0, 0), (4, 5)]
    assert p.log.read(0, 1 << 20, 6) == first + later


def test_followers_rebuild_idempotent_producer_state_from_what_they_append(make):
    p = make(leader=OTHER)
    buf = bytearray(batch(3, pid=9, seq=0))
    validate_and_assign(buf, 0, 0, 1 << 20)
    p.append_as_follower(bytes(buf), 0, 0)
    assert p.producers.get(9).last_seq == 2


def test_followers_refuse_corrupt_or_misplaced_batches_and_keep_their_log(make):
    p = make(leader=OTHER)
    good = leader_batches(0, 0, 2)
    with pytest.raises(InvalidRecordError):
        p.append_as_follower(leader_batches(7, 0, 1), 0, 0)
    with pytest.raises(InvalidRecordError):
        p.append_as_follower(leader_batches(0, 3, 1), 0, 0)  # an epoch above the leader's
    with pytest.raises(CorruptRecordError):
        p.append_as_follower(good[:-1] + bytes([good[-1] ^ 1]), 0, 0)
    assert p.log.log_end_offset == 0


@pytest.mark.parametrize("leader_answer, ours, expected", [
    ((0, 5), [(0, 2, 3)], (5, True)),  # same epoch: the shorter end
    ((0, 2), [(0, 5)], (2, True)),
    ((1, 4), [(0, 4), (2, 2)], (4, False)),  # the leader does not know our epoch 2 and we do not know its 1
    ((-1, -1), [(0, 5)], (3, True)),  # the leader knows no such epoch: back to the high watermark
    ((3, 9), [(0, 5)], (5, True)),
])
def test_truncation_points_follow_kafkas_offset_truncation_state(make, leader_answer, ours, expected):
    p = make(leader=OTHER, epoch=3)
    offset = 0
    for epoch, *counts in ours:
        p.append_as_follower(leader_batches(offset, epoch, *counts), 3, 0)
        offset += sum(counts)
    assert p.truncation_point(*leader_answer) == expected


def test_truncation_rewinds_the_log_and_the_high_watermark(make):
    p = make(leader=OTHER, epoch=1)
    p.append_as_follower(leader_batches(0, 0, 4) + leader_batches(4, 1, 4), 8, 0)
    p.truncate_to(4)
    assert p.log.log_end_offset == 4 and p.high_watermark == 4 and p.latest_epoch() == 0
    p.truncate_fully_and_start_at(20)
    assert (p.log.log_start_offset, p.log.log_end_offset, p.high_watermark) == (20, 20, 20)


def test_a_restarted_replica_starts_from_its_checkpointed_high_watermark(make, josef_broker):
    p = make(leader=OTHER)
    p.append_as_follower(leader_batches(0, 0, 6), 2, 0)
    again = Partition(p.tp, "topic-id", ME, p.log, {}, high_watermark=2)
    assert again.high_watermark == 2
    assert Partition(p.tp, "topic-id", ME, p.log, {}, high_watermark=50).high_watermark == 6


def test_with_eligible_leader_replicas_the_high_watermark_waits_for_min_insync_replicas(make):
    p = make(isr=(ME,))
    p.strict_min_isr = True
    p.append_as_leader(batch(3), 1)
    assert p.high_watermark == 0  # one in sync, min.insync.replicas 2: the ELR must stay complete
    p.update_state(PartitionImage((ME, OTHER, THIRD), (ME, OTHER), ME, 0, 1))
    p.follower_fetched(OTHER, 3, at_ms=1001)
    assert p.high_watermark == 3


def test_a_writable_request_buffer_is_stamped_where_it_lies_and_a_read_only_one_is_copied(make):
    """The network joins a large produce request into a bytearray: its batches get their offsets there, no copy."""
    p = make()
    first = batch(2)
    p.append_as_leader(first, 1)  # bytes: copied, left as sent
    assert first == batch(2)
    frame = bytearray(b"header" + batch(3) + b"tail")
    records = memoryview(frame)[6:-4]
    info, _ = p.append_as_leader(records, 1)
    assert (info.first_offset, info.last_offset) == (2, 4)
    assert bytes(records) == leader_batches(2, 0, 3)  # stamped in the request's own buffer
    assert frame.startswith(b"header") and frame.endswith(b"tail")
