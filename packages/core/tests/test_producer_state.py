"""The idempotent-producer state machine of a partition: duplicates, gaps, fencing, epoch bumps, wrap-around."""

import pytest
from kio.schema.errors import ErrorCode

from josef.producer.producer_state import (
    MAX_CACHED_BATCHES,
    BatchMetadata,
    ProducerEntry,
    ProducerStateError,
    ProducerStateManager,
)
from josef.protocol.records import (
    InvalidRecordError,
    ProducerBatch,
    build_batch,
    validate_and_assign,
)

INT_MAX = 2**31 - 1
PID = 42


class Log:
    """Offsets as a log would assign them, so batches look like the partition's."""

    def __init__(self):
        self.end = 0

    def batch(self, seq, count=1, epoch=0, pid=PID, timestamp=1000):
        return ProducerBatch(pid, epoch, seq, self.end, self.end + count - 1, timestamp)

    def append(self, state, *batches):
        plan = state.validate(batches)
        assert plan.duplicate is None
        state.commit(plan)
        self.end = batches[-1].last_offset + 1
        return plan


def fails(state, batches, code):
    with pytest.raises(ProducerStateError) as info:
        state.validate(batches)
    assert info.value.code == code
    return info.value


def test_a_producer_id_without_a_sequence_is_an_invalid_record():
    """Kafka's LogValidator: a batch with a producer id must carry a sequence number."""
    buf = bytearray(build_batch([(None, b"a", 5)], producer_id=7, producer_epoch=0, base_sequence=-1))
    with pytest.raises(InvalidRecordError):
        validate_and_assign(buf, 0, 0, 1 << 20)


@pytest.fixture
def log():
    return Log()


def test_last_sequence_comes_from_the_header_and_wraps():
    assert ProducerBatch(1, 0, 10, 100, 104, 0).last_sequence == 14
    assert ProducerBatch(1, 0, INT_MAX - 1, 100, 103, 0).last_sequence == 1
    assert ProducerBatch(1, 0, INT_MAX, 100, 100, 0).last_sequence == INT_MAX


def test_validate_and_assign_reports_producer_batches_with_their_offsets():
    buf = bytearray(build_batch([(None, b"a", 5), (None, b"b", 9)], producer_id=7, producer_epoch=3, base_sequence=11)
                    + build_batch([(None, b"c", 1)]))
    info = validate_and_assign(buf, 100, 0, 1 << 20)
    assert info.producer_ids == (ProducerBatch(7, 3, 11, 100, 101, 9),)


def test_in_sequence_batches_are_accepted_and_the_last_five_remembered(log):
    state = ProducerStateManager()
    for n in range(8):
        log.append(state, log.batch(seq=n * 3, count=3))
    entry = state.get(PID)
    assert entry.epoch == 0 and len(entry.batches) == MAX_CACHED_BATCHES
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in entry.batches] == [
        (n * 3, n * 3 + 2, n * 3, n * 3 + 2) for n in range(3, 8)]


def test_unknown_producer_is_accepted_at_any_sequence(log):
    """Kafka 2.5+: state lost through retention must not fail the producer (no UNKNOWN_PRODUCER_ID)."""
    state = ProducerStateManager()
    log.append(state, log.batch(seq=17, count=2))
    assert state.get(PID).last_seq == 18
    fails(state, [log.batch(seq=20)], ErrorCode.out_of_order_sequence_number)
    log.append(state, log.batch(seq=19))


@pytest.mark.parametrize("which", range(MAX_CACHED_BATCHES))
def test_each_of_the_last_five_batches_is_a_duplicate(log, which):
    state = ProducerStateManager()
    sent = []
    for n in range(7):
        batch = log.batch(seq=n * 2, count=2, timestamp=1000 + n)
        log.append(state, batch)
        sent.append(batch)
    before = state.snapshot()
    original = sent[2 + which]
    retry = ProducerBatch(PID, 0, original.base_sequence, 999, 1000, 5)  # offsets a retry would be given now
    plan = state.validate([retry])
    assert plan.duplicate == BatchMetadata(original.base_sequence, original.last_sequence, original.first_offset,
                                           original.last_offset, original.max_timestamp)
    assert not plan.updates
    assert state.snapshot() == before


def test_a_batch_older_than_the_cache_is_out_of_order_not_a_duplicate(log):
    state = ProducerStateManager()
    for n in range(6):
        log.append(state, log.batch(seq=n))
    fails(state, [log.batch(seq=0)], ErrorCode.out_of_order_sequence_number)


def test_same_first_sequence_but_other_range_is_not_a_duplicate(log):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0, count=3))
    fails(state, [log.batch(seq=0, count=2)], ErrorCode.out_of_order_sequence_number)


def test_gap_is_out_of_order(log):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0, count=5))
    error = fails(state, [log.batch(seq=6)], ErrorCode.out_of_order_sequence_number)
    assert "expected 5" in str(error)
    assert state.get(PID).last_seq == 4


def test_older_epoch_is_fenced(log):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0, epoch=3))
    fails(state, [log.batch(seq=1, epoch=2)], ErrorCode.invalid_producer_epoch)
    # Even a retry of a batch the old epoch really wrote: it is no longer the producer's epoch.
    fails(state, [log.batch(seq=0, epoch=2)], ErrorCode.invalid_producer_epoch)


def test_bumped_epoch_starts_at_zero_and_fences_the_old_one(log):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0, count=4, epoch=0))
    fails(state, [log.batch(seq=4, epoch=1)], ErrorCode.out_of_order_sequence_number)
    log.append(state, log.batch(seq=0, count=2, epoch=1))
    entry = state.get(PID)
    assert entry.epoch == 1 and [(b.first_seq, b.last_seq) for b in entry.batches] == [(0, 1)]
    fails(state, [log.batch(seq=4, epoch=0)], ErrorCode.invalid_producer_epoch)
    # The new epoch's batch is a duplicate of itself, the old epoch's same range is not.
    assert state.validate([ProducerBatch(PID, 1, 0, 50, 51, 0)]).duplicate is not None
    log.append(state, log.batch(seq=2, epoch=1))


@pytest.mark.parametrize("first,count,next_seq", [
    (INT_MAX - 1, 2, 0),  # ends exactly on Int.MAX
    (INT_MAX - 1, 4, 2),  # runs over Int.MAX into 0, 1
    (INT_MAX, 1, 0),
])
def test_sequences_wrap_at_int_max(log, first, count, next_seq):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=first - 2, count=2))
    wrapping = log.batch(seq=first, count=count)
    log.append(state, wrapping)
    assert state.validate([ProducerBatch(PID, 0, first, 0, count - 1, 0)]).duplicate is not None
    fails(state, [log.batch(seq=next_seq + 1)], ErrorCode.out_of_order_sequence_number)
    log.append(state, log.batch(seq=next_seq))


def test_a_buffer_is_validated_as_a_whole_and_changes_nothing_until_commit(log):
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0))
    first = ProducerBatch(PID, 0, 1, 1, 2, 0)
    second = ProducerBatch(PID, 0, 3, 3, 3, 0)
    plan = state.validate([first, second])
    assert state.get(PID).last_seq == 0, "validate must not change the state"
    state.commit(plan)
    assert state.get(PID).last_seq == 3
    # A gap in the second batch fails the buffer, and the first batch is not taken either.
    fails(state, [ProducerBatch(PID, 0, 4, 4, 4, 0), ProducerBatch(PID, 0, 9, 5, 5, 0)],
          ErrorCode.out_of_order_sequence_number)
    assert state.get(PID).last_seq == 3
    # Other producers in the same buffer are independent.
    plan = state.validate([ProducerBatch(7, 0, 0, 4, 4, 0), ProducerBatch(PID, 0, 4, 5, 5, 0)])
    state.commit(plan)
    assert state.get(7).last_seq == 0 and state.get(PID).last_seq == 4


def test_replay_applies_logged_batches_without_checks(log):
    state = ProducerStateManager()
    state.replay(ProducerBatch(PID, 0, 0, 0, 0, 0))
    state.replay(ProducerBatch(PID, 0, 5, 1, 1, 0))  # would be a gap for a client
    state.replay(ProducerBatch(PID, 2, 0, 2, 3, 0))
    entry = state.get(PID)
    assert entry.epoch == 2 and entry.last_seq == 1 and entry.batches[0].first_offset == 2


def test_snapshot_round_trip(log):
    state = ProducerStateManager()
    for pid in (1, 2, 3):
        for n in range(pid * 3):
            log.append(state, log.batch(seq=n, pid=pid, epoch=pid, timestamp=n))
    snapshot = state.snapshot()
    log.append(state, log.batch(seq=9, pid=3, epoch=3))
    assert next(e for e in snapshot if e.producer_id == 3).last_seq == 8, "a snapshot does not follow later appends"
    restored = ProducerStateManager(snapshot)
    assert restored.producers == {e.producer_id: e for e in snapshot}
    assert restored.validate([ProducerBatch(2, 2, 5, 100, 100, 0)]).duplicate is not None
    fails(restored, [ProducerBatch(1, 0, 3, 100, 100, 0)], ErrorCode.invalid_producer_epoch)
    restored.commit(restored.validate([ProducerBatch(3, 3, 9, 100, 100, 0)]))


def test_entries_keep_at_most_five_batches_and_reset_on_a_new_epoch():
    entry = ProducerEntry(1, 0)
    for n in range(7):
        entry = entry.with_batch(0, BatchMetadata(n, n, n, n, 0))
    assert [b.first_seq for b in entry.batches] == [2, 3, 4, 5, 6]
    assert entry.with_batch(1, BatchMetadata(0, 0, 9, 9, 0)).batches == (BatchMetadata(0, 0, 9, 9, 0),)


# Expiry (producer.id.expiration.ms) -----------------------------------------------------

def test_producers_silent_for_the_expiration_are_forgotten_unless_a_transaction_is_open(log):
    """Kafka's removeExpiredProducers: by the timestamp of the last batch or marker, never with a transaction open."""
    from josef.protocol.records import COMMIT_MARKER
    state = ProducerStateManager()
    log.append(state, log.batch(seq=0, pid=1, timestamp=1000))  # silent since 1000
    log.append(state, log.batch(seq=0, pid=2, timestamp=1000), log.batch(seq=1, pid=2, timestamp=5000))
    open_txn = ProducerBatch(3, 0, 0, log.end, log.end, 1000, transactional=True)
    log.append(state, open_txn)  # a transaction open since 1000
    ended = ProducerBatch(4, 0, 0, log.end, log.end, 1000, transactional=True)
    log.append(state, ended)
    marker = ProducerBatch(4, 1, -1, log.end, log.end, 5000, transactional=True, marker=COMMIT_MARKER,
                           coordinator_epoch=0)
    state.replay(marker)  # its epoch bump (Transactions V2) drops the batches: the marker's timestamp counts
    assert state.get(4).batches == () and state.get(4).last_timestamp == 5000
    snapshot = state.snapshot()

    assert state.remove_expired(now_ms=1999, expiration_ms=1000) == []
    assert state.remove_expired(now_ms=2000, expiration_ms=1000) == [1]
    assert sorted(state.producers) == [2, 3, 4]
    assert state.remove_expired(now_ms=10**9, expiration_ms=1000) == [2, 4]
    assert sorted(state.producers) == [3] and state.ongoing == {3: open_txn.first_offset}
    assert [e.producer_id for e in state.snapshot()] == [3]  # the next snapshot file holds only what is left
    assert len(snapshot) == 4  # a snapshot taken before is whole

    # A forgotten producer that writes again is a new one: any sequence is accepted.
    state.commit(state.validate([ProducerBatch(1, 0, 17, log.end, log.end, 10**9)]))
    assert state.get(1).last_seq == 17


def test_entries_restored_from_a_snapshot_expire_by_their_own_timestamps():
    restored = ProducerStateManager([ProducerEntry(1, 0, (BatchMetadata(0, 0, 0, 0, 100),), last_timestamp=100),
                                     ProducerEntry(2, 0, (), last_timestamp=900)])
    assert restored.remove_expired(now_ms=1000, expiration_ms=500) == [1]
    assert list(restored.producers) == [2]
