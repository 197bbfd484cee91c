"""Transactions in one partition: open transactions, markers, the last stable offset and the aborted index.

Partitions are built by hand over logs of the running broker's storage, as
in test_partition_replication.py; ``integration-tests/test_transactions*.py``
check the same rules with real transactional clients.
"""

import itertools
import time

import pytest
from kio.schema.errors import ErrorCode

from josef.log import AbortedTxn, LogConfig
from josef.metadata.image import PartitionImage
from josef.replication.partition import COORDINATOR, READ_COMMITTED, READ_UNCOMMITTED, Partition, PartitionError
from josef.protocol.records import (
    ABORT_MARKER,
    COMMIT_MARKER,
    TRANSACTIONAL_BIT,
    build_batch,
    control_marker,
    iter_batches,
)
from josef.protocol.topic_partition import TopicPartition

ME = 1
_names = itertools.count()


@pytest.fixture
def storage(josef_broker):
    return josef_broker.broker.storage


@pytest.fixture
def make(storage):
    """A single-replica partition led by this broker, on a fresh log."""

    def partition(tp=None):
        tp = tp or TopicPartition(f"txn-unit-{next(_names)}", 0)
        p = Partition(tp, "topic-id", ME, storage.open(tp, LogConfig()), {})
        p.update_state(PartitionImage((ME,), (ME,), ME, 0, 0), at_ms=1000)
        return p
    return partition


def txn_batch(pid, seq, count=1, epoch=0, transactional=True):
    now = int(time.time() * 1000)  # markers carry the time of writing: older records would roll a segment (segment.ms)
    return build_batch([(None, b"v%d" % i, now) for i in range(count)], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, attributes=TRANSACTIONAL_BIT if transactional else 0)


def test_an_open_transaction_holds_the_last_stable_offset_until_its_marker(make):
    p = make()
    p.append_as_leader(build_batch([(None, b"plain", int(time.time() * 1000))]), -1)  # offset 0
    p.append_as_leader(txn_batch(7, 0, 3), -1)  # offsets 1-3
    p.append_as_leader(txn_batch(8, 0, 2), -1)  # offsets 4-5
    assert p.high_watermark == 6
    assert p.last_stable_offset == 1
    assert p.producers.get(7).current_txn_first_offset == 1
    info = p.append_marker(7, 0, 5, commit=True)  # offset 6
    assert info.first_offset == info.last_offset == 6
    assert p.last_stable_offset == 4  # producer 8 is still open
    p.append_marker(8, 0, 5, commit=True)
    assert p.last_stable_offset == p.high_watermark == 8
    assert p.producers.get(7).current_txn_first_offset == -1
    assert p.producers.get(7).coordinator_epoch == 5


def test_read_committed_stops_at_the_last_stable_offset(make):
    p = make()
    p.append_as_leader(build_batch([(None, b"before", int(time.time() * 1000))]), -1)
    p.append_as_leader(txn_batch(7, 0, 2), -1)
    committed = p.read(0, 1 << 20, True, READ_COMMITTED)
    uncommitted = p.read(0, 1 << 20, True, READ_UNCOMMITTED)
    assert [h.base_offset for _, h in iter_batches(committed)] == [0]
    assert [h.base_offset for _, h in iter_batches(uncommitted)] == [0, 1]


def test_markers_are_control_batches_with_the_coordinator_epoch(make):
    p = make()
    p.append_as_leader(txn_batch(7, 0), -1)
    p.append_marker(7, 0, 3, commit=False)
    raw = p.read(1, 1 << 20, True, READ_UNCOMMITTED)
    [(pos, header)] = list(iter_batches(raw))
    assert header.is_control and header.is_transactional and header.producer_id == 7
    assert control_marker(raw, pos) == (ABORT_MARKER, 3)
    p.append_as_leader(txn_batch(7, 1), -1)
    p.append_marker(7, 0, 3, commit=True)
    raw = p.read(3, 1 << 20, True, READ_UNCOMMITTED)
    assert control_marker(raw, 0) == (COMMIT_MARKER, 3)


def test_an_abort_is_indexed_from_the_first_offset_to_the_marker(make):
    p = make()
    p.append_as_leader(txn_batch(7, 0, 2), -1)  # 0-1
    p.append_as_leader(txn_batch(8, 0, 1), -1)  # 2
    p.append_as_leader(txn_batch(7, 2, 2), -1)  # 3-4
    p.append_marker(7, 0, 1, commit=False)  # 5
    assert p.log.aborted_txns(0, 100) == [AbortedTxn(7, 0, 5, 2)]  # producer 8 still holds the LSO at 2
    p.append_marker(8, 0, 1, commit=True)
    assert p.log.aborted_txns(0, 100) == [AbortedTxn(7, 0, 5, 2)]  # commits are not indexed
    assert p.log.aborted_txns(6, 100) == []


def test_markers_from_an_older_coordinator_or_producer_epoch_are_refused(make):
    p = make()
    p.append_as_leader(txn_batch(7, 0, epoch=2), -1)
    p.append_marker(7, 2, 4, commit=True)
    p.append_as_leader(txn_batch(7, 1, epoch=2), -1)
    with pytest.raises(PartitionError) as fenced:
        p.append_marker(7, 2, 3, commit=True)
    assert fenced.value.code == ErrorCode.transaction_coordinator_fenced
    with pytest.raises(PartitionError) as old:
        p.append_marker(7, 1, 4, commit=True)
    assert old.value.code == ErrorCode.invalid_producer_epoch
    assert p.producers.get(7).current_txn_first_offset == 2  # still open


def test_a_bumped_marker_epoch_fences_the_producer_and_restarts_its_sequences(make):
    p = make()
    p.append_as_leader(txn_batch(7, 0, epoch=0), -1)
    p.append_marker(7, 1, 0, commit=False)  # the coordinator aborted it with an epoch bump (a timeout)
    with pytest.raises(PartitionError) as zombie:
        p.append_as_leader(txn_batch(7, 1, epoch=0), -1)
    assert zombie.value.code == ErrorCode.invalid_producer_epoch
    p.append_as_leader(txn_batch(7, 0, epoch=1), -1)
    assert p.producers.get(7).epoch == 1


def test_a_plain_batch_inside_an_open_transaction_is_invalid(make):
    p = make()
    p.append_as_leader(txn_batch(7, 0), -1)
    with pytest.raises(PartitionError) as exc:
        p.append_as_leader(txn_batch(7, 1, transactional=False), -1)
    assert exc.value.code == ErrorCode.invalid_txn_state


def test_coordinator_writes_skip_sequence_checks(make):
    p = make()
    for _ in range(3):  # TxnOffsetCommit writes every batch at sequence 0
        p.append_as_leader(txn_batch(7, 0), -1, origin=COORDINATOR)
    assert p.last_stable_offset == 0
    p.append_marker(7, 0, 0, commit=True)
    assert p.last_stable_offset == 4


def test_a_completed_transaction_stays_unstable_until_the_high_watermark_passes_its_marker(josef_broker):
    storage = josef_broker.broker.storage
    tp = TopicPartition(f"txn-unit-{next(_names)}", 0)
    p = Partition(tp, "topic-id", ME, storage.open(tp, LogConfig()), {})
    p.update_state(PartitionImage((ME, 2), (ME, 2), ME, 0, 0), at_ms=1000)
    p.append_as_leader(txn_batch(7, 0, 2), -1)  # 0-1
    p.append_marker(7, 0, 0, commit=True)  # 2
    p.follower_fetched(2, 2, at_ms=1001)
    assert p.high_watermark == 2 and p.last_stable_offset == 0
    p.follower_fetched(2, 3, at_ms=1002)
    assert p.high_watermark == p.last_stable_offset == 3


def test_followers_learn_transactions_from_the_leaders_batches(make, storage):
    leader = make()
    leader.append_as_leader(txn_batch(7, 0, 2), -1)
    leader.append_marker(7, 0, 0, commit=False)
    leader.append_as_leader(txn_batch(9, 0, 1), -1)
    tp = TopicPartition(f"txn-unit-{next(_names)}", 0)
    follower = Partition(tp, "topic-id", ME, storage.open(tp, LogConfig()), {})
    follower.update_state(PartitionImage((2, ME), (2, ME), 2, 0, 0), at_ms=1000)
    follower.append_as_follower(leader.read(0, 1 << 20, True, -1), 4, 0)
    assert follower.log.aborted_txns(0, 10) == [AbortedTxn(7, 0, 2, 3)]
    assert follower.producers.ongoing == {9: 3}
    assert follower.last_stable_offset == 3


def test_a_reopened_partition_rebuilds_open_transactions_and_the_index(make, storage):
    p = make()
    p.append_as_leader(txn_batch(7, 0, 2), -1)
    p.append_marker(7, 0, 0, commit=False)
    p.append_as_leader(txn_batch(9, 0, 1), -1)
    tp, raw = p.tp, p.read(0, 1 << 20, True, -1)
    storage.delete(tp)  # start again from the same bytes: a fresh log rebuilt from the batches
    q = make(tp)
    q.append_as_follower(raw, 0, 0)
    again = Partition(tp, "topic-id", ME, q.log, {})
    assert again.producers.ongoing == {9: 3}
    assert again.log.aborted_txns(0, 10) == [AbortedTxn(7, 0, 2, 3)]
