"""The in-flight window of one share partition (SharePartition): acquisition, acknowledgement, locks, the start."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from josef_coordinator_share.share_partition import (ACCEPT, ACQUIRED, GAP, RELEASE, REJECT, RENEW, Acquired,
                                                     BatchInfo, SharePartition, ShareError)
from josef_coordinator_share.state import ACKNOWLEDGED, ARCHIVED, AVAILABLE, StateBatch

LOCK = 1_000


def batches(*ranges: tuple[int, int]) -> list[BatchInfo]:
    return [BatchInfo(first, last) for first, last in ranges]


def states(sp: SharePartition) -> list[tuple[int, int, int, int]]:
    return [(s.first, s.last, s.state, s.delivery_count) for s in sp.spans]


def test_new_batches_are_acquired_whole_up_to_the_record_budget():
    sp = SharePartition(0)
    got = sp.acquire("a", batches((0, 4), (5, 9), (10, 14)), (), max_records=7, deadline=LOCK)
    assert got == [Acquired(0, 9, 1)]  # the second batch goes over 7, but a batch is never split
    assert (sp.start, sp.end, sp.next_fetch_offset()) == (0, 10, 10)


def test_the_record_limit_mode_splits_a_batch_at_the_budget():
    sp = SharePartition(0)
    assert sp.acquire("a", batches((0, 4), (5, 9)), (), 7, LOCK, strict=True) == [Acquired(0, 6, 1)]
    assert (sp.end, sp.next_fetch_offset()) == (7, 7)
    assert sp.acquire("b", batches((5, 9)), (), 7, LOCK, strict=True) == [Acquired(7, 9, 1)]


def test_two_members_get_different_records():
    sp = SharePartition(0)
    assert sp.acquire("a", batches((0, 4)), (), 100, LOCK) == [Acquired(0, 4, 1)]
    assert sp.acquire("b", batches((0, 4)), (), 100, LOCK) == []  # all acquired already
    assert sp.acquire("b", batches((0, 4), (5, 6)), (), 100, LOCK) == [Acquired(5, 6, 1)]


def test_accepting_moves_the_start_and_a_release_redelivers_to_someone_else():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 9)), (), 100, LOCK)
    changed = sp.acknowledge("a", [(0, 9, [ACCEPT] * 3 + [RELEASE] + [ACCEPT] * 6)], LOCK)
    assert [(s.first, s.last, s.state) for s in changed] == [(0, 2, ACKNOWLEDGED), (3, 3, AVAILABLE),
                                                             (4, 9, ACKNOWLEDGED)]
    assert sp.start == 3 and sp.next_fetch_offset() == 3
    assert sp.acquire("b", batches((0, 9)), (), 100, LOCK) == [Acquired(3, 3, 2)]
    sp.acknowledge("b", [(3, 3, [REJECT])], LOCK)
    assert (sp.start, sp.end, sp.spans) == (10, 10, [])


def test_acknowledging_what_another_member_holds_changes_nothing():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 4)), (), 100, LOCK)
    before = states(sp)
    for bad in ([(0, 4, [ACCEPT])], [(3, 7, [ACCEPT])], [(0, 9, [ACCEPT])]):
        with pytest.raises(ShareError) as refused:
            sp.acknowledge("b" if bad[0][1] == 4 else "a", bad, LOCK)
        assert refused.value.code == ErrorCode.invalid_record_state
    with pytest.raises(ShareError) as malformed:
        sp.acknowledge("a", [(0, 4, [ACCEPT, ACCEPT])], LOCK)
    assert malformed.value.code == ErrorCode.invalid_request
    assert states(sp) == before
    sp.acknowledge("a", [(0, 4, [ACCEPT])], LOCK)
    with pytest.raises(ShareError):  # twice
        sp.acknowledge("a", [(0, 4, [ACCEPT])], LOCK)


def test_an_expired_lock_makes_records_available_and_the_limit_archives_them():
    sp = SharePartition(0, delivery_count_limit=2)
    sp.acquire("a", batches((0, 1)), (), 100, deadline=100)
    assert sp.expire_locks(99) == []
    assert [(s.state, s.delivery_count) for s in sp.expire_locks(100)] == [(AVAILABLE, 1)]
    assert sp.acquire("b", batches((0, 1)), (), 100, deadline=200) == [Acquired(0, 1, 2)]
    assert [(s.state, s.delivery_count) for s in sp.expire_locks(200)] == [(ARCHIVED, 2)]
    assert (sp.start, sp.spans) == (2, [])


def test_renew_keeps_the_lock_and_gap_archives():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 3)), (), 100, deadline=100)
    sp.acknowledge("a", [(0, 3, [RENEW, RENEW, GAP, RENEW])], deadline=500)
    assert sp.expire_locks(300) == []
    assert states(sp) == [(0, 1, ACQUIRED, 1), (2, 2, ARCHIVED, 1), (3, 3, ACQUIRED, 1)]


def test_a_member_leaving_releases_what_it_holds():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 3)), (), 100, LOCK)
    sp.acquire("b", batches((0, 3), (4, 5)), (), 100, LOCK)
    sp.release_member("a")
    assert states(sp) == [(0, 3, AVAILABLE, 1), (4, 5, ACQUIRED, 1)]


def test_control_batches_and_aborted_transactions_are_never_delivered_to_read_committed_groups():
    read = [BatchInfo(0, 1, producer_id=7, transactional=True), BatchInfo(2, 2, producer_id=8, transactional=True),
            BatchInfo(3, 3, producer_id=7, transactional=True, control=True), BatchInfo(4, 4),
            BatchInfo(5, 5, producer_id=8, transactional=True, control=True)]
    committed = SharePartition(0, read_committed=True)
    assert committed.acquire("a", read, [(7, 0)], 100, LOCK) == [Acquired(2, 2, 1), Acquired(4, 4, 1)]
    # The aborted records at the start are done with at once: the start offset passes them.
    assert committed.start == 2
    assert [(s.first, s.last) for s in committed.spans if s.state == ARCHIVED] == [(3, 3), (5, 5)]
    uncommitted = SharePartition(0)
    assert uncommitted.acquire("a", read, [], 100, LOCK) == [Acquired(0, 2, 1), Acquired(4, 4, 1)]


def test_the_in_flight_limit_stops_new_acquisitions_not_redeliveries():
    sp = SharePartition(0, max_in_flight=5)
    sp.acquire("a", batches((0, 4)), (), 100, LOCK)
    assert not sp.can_acquire()
    assert sp.acquire("a", batches((0, 4), (5, 9)), (), 100, LOCK) == []
    sp.acknowledge("a", [(0, 4, [RELEASE])], LOCK)
    assert sp.can_acquire()
    assert sp.acquire("b", batches((0, 4), (5, 9)), (), 100, LOCK) == [Acquired(0, 4, 2)]


def test_a_window_resumes_from_persisted_state_with_never_delivered_gaps_available():
    persisted = [StateBatch(10, 12, ACKNOWLEDGED, 1), StateBatch(15, 16, AVAILABLE, 3), StateBatch(18, 18, ARCHIVED, 5)]
    sp = SharePartition(10, persisted)
    assert (sp.start, sp.end) == (13, 19)
    assert states(sp) == [(13, 14, AVAILABLE, 0), (15, 16, AVAILABLE, 3), (17, 17, AVAILABLE, 0), (18, 18, ARCHIVED, 5)]
    assert sp.acquire("a", batches((13, 20)), (), 100, LOCK) == [Acquired(13, 14, 1), Acquired(15, 16, 4),
                                                                 Acquired(17, 17, 1), Acquired(19, 20, 1)]


def test_the_log_start_moving_past_the_window_drops_what_is_gone():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 9)), (), 100, LOCK)
    sp.move_start(5)
    assert (sp.start, states(sp)) == (5, [(5, 9, ACQUIRED, 1)])
    sp.move_start(20)
    assert (sp.start, sp.end, sp.spans) == (20, 20, [])


def test_a_snapshot_restores_the_window_exactly():
    sp = SharePartition(0)
    sp.acquire("a", batches((0, 9)), (), 100, LOCK)
    saved = sp.snapshot()
    sp.acknowledge("a", [(0, 9, [ACCEPT])], LOCK)
    sp.restore(saved)
    assert (sp.start, states(sp)) == (0, [(0, 9, ACQUIRED, 1)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 30), st.integers(0, 5),
                          st.sampled_from([ACCEPT, RELEASE, REJECT, RENEW, None])), max_size=40))
def test_every_offset_is_in_exactly_one_state_and_done_ones_never_come_back(steps):
    sp = SharePartition(0, delivery_count_limit=3)
    log = [BatchInfo(i * 3, i * 3 + 2) for i in range(20)]
    done: set[int] = set()
    for member, offset, length, ack in steps:
        if ack is None:
            start = sp.next_fetch_offset()
            sp.acquire(member, [b for b in log if b.last_offset >= start][:3], (), 7, LOCK)
        else:
            try:
                sp.acknowledge(member, [(offset, offset + length, [ack])], LOCK)
            except ShareError:
                pass
        covered = [o for s in sp.spans for o in range(s.first, s.last + 1)]
        assert covered == list(range(sp.start, sp.end)), "the spans tile the window"
        assert all(a.last < b.first for a, b in zip(sp.spans, sp.spans[1:]))
        now_done = set(range(0, sp.start)) | {o for s in sp.spans if s.state in (ACKNOWLEDGED, ARCHIVED)
                                              for o in range(s.first, s.last + 1)}
        assert done <= now_done, "an acknowledged or archived offset became deliverable again"
        done = now_done
        assert all(s.delivery_count <= 3 for s in sp.spans)
