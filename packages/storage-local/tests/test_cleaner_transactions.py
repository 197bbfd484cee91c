"""The cleaner's transaction and producer rules (Kafka's CleanedTransactionMetadata and RETAIN_EMPTY)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cleaning import append_keyed, append_raw, read_all

from josef.log import AbortedTxn, LogConfig
from josef.producer.producer_state import BatchMetadata, ProducerEntry
from josef.protocol.records import TRANSACTIONAL_BIT, build_marker, iter_batches
from josef.testing import ManualClock
from josef_storage_local.compaction import DELETE_HORIZON_BIT

from local_harness import Harness

RETENTION = 60_000
COMPACT = LogConfig(segment_bytes=64 * 1024, cleanup_policy=("compact",), retention_ms=-1,
                    delete_retention_ms=RETENTION)


@pytest.fixture
def manual(tmp_path: Path) -> Harness:
    h = Harness(tmp_path / "logs", ManualClock())  # type: ignore[arg-type]
    yield h
    h.crash()


def roll(log, clock) -> None:
    append_keyed(log, [(b"filler-%d" % log.log_end_offset, b"x" * COMPACT.segment_bytes, clock.now)])


def headers(log) -> list:
    """Every batch header of the log, oldest first."""
    found = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 30, log.log_end_offset)
        for _, header in iter_batches(data):
            found.append(header)
            offset = header.last_offset + 1
    return found


def test_aborted_data_goes_and_markers_follow_kafkas_rules(manual: Harness) -> None:
    clock = manual.clock
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    txn = dict(producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_BIT)
    append_keyed(log, [(b"a", b"aborted", 1), (b"b", b"aborted", 1)], producer_id=7, **txn)  # 0-1
    append_keyed(log, [(b"c", b"committed", 1), (b"d", b"committed", 1)], producer_id=8, **txn)  # 2-3
    append_raw(log, build_marker(7, 0, 0, commit=False, timestamp=1, leader_epoch=0))  # 4
    append_raw(log, build_marker(8, 0, 0, commit=True, timestamp=1, leader_epoch=0))  # 5
    log.append_aborted_txn(AbortedTxn(7, 0, 4, 6))
    append_keyed(log, [(b"c", b"plain", 1)])  # 6
    roll(log, clock)

    log.clean(clock.now)
    kept = [(h.base_offset, h.last_offset, h.records_count, h.is_control) for h in headers(log)]
    # Aborted data gone; its marker stays (its data was seen in this pass), so does its index entry; the
    # committed batch keeps d, and its marker stays because the pass saw data of that transaction.
    assert kept[:4] == [(2, 3, 1, False), (4, 4, 1, True), (5, 5, 1, True), (6, 6, 1, False)]
    assert [r.key for r in read_all(log)[1] if r.offset == 3] == [b"d"]
    assert log.aborted_txns(0, log.log_end_offset) == [AbortedTxn(7, 0, 4, 6)]

    append_keyed(log, [(b"d", b"plain", 1)])  # d's committed value is superseded: the COMMIT marker's data goes
    roll(log, clock)
    log.clean(clock.now)
    markers = [(m.base_offset, m.attributes & DELETE_HORIZON_BIT, m.base_timestamp)
               for m in headers(log) if m.is_control]
    # The ABORT marker's data is gone: it stays until the delete horizon it now carries, and leaves the
    # index. The COMMIT marker stays as it is: this pass still read its transaction's batch (then emptied).
    assert markers == [(4, DELETE_HORIZON_BIT, clock.now + RETENTION), (5, 0, 1)]
    assert log.aborted_txns(0, log.log_end_offset) == []

    clock.now += RETENTION + 1
    append_keyed(log, [(b"e", b"plain", 1)])
    roll(log, clock)
    log.clean(clock.now)
    markers = [(m.base_offset, m.attributes & DELETE_HORIZON_BIT, m.base_timestamp)
               for m in headers(log) if m.is_control]
    assert markers == [(5, DELETE_HORIZON_BIT, clock.now + RETENTION)]

    clock.now += RETENTION + 1
    assert log.clean(clock.now).cleaned_to >= 0  # due for its passed delete horizon alone
    assert [h for h in headers(log) if h.is_control] == []
    assert [(r.offset, r.key) for r in read_all(log)[1] if not r.key.startswith(b"filler")] == [
        (6, b"c"), (8, b"d"), (10, b"e")]


def test_the_last_batch_of_each_known_producer_stays_emptied(manual: Harness) -> None:
    clock = manual.clock
    log = manual.open(COMPACT)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    append_keyed(log, [(b"x", b"1", 5), (b"y", b"1", 6)], producer_id=5, producer_epoch=3, base_sequence=10)  # 0-1
    append_keyed(log, [(b"z", b"1", 5)], producer_id=6, producer_epoch=0, base_sequence=0)  # 2: producer 6 unknown
    append_raw(log, build_marker(9, 1, 0, commit=False, timestamp=7, leader_epoch=0))  # 3: producer 9's last
    append_keyed(log, [(b"x", b"2", 1), (b"y", b"2", 1), (b"z", b"2", 1)])  # 4-6
    log.attach_producer_state(lambda: [ProducerEntry(5, 3, (BatchMetadata(10, 11, 0, 1, 6),)),
                                       ProducerEntry(9, 1)])
    roll(log, clock)
    log.clean(clock.now)
    clock.now += RETENTION + 1
    append_keyed(log, [(b"w", b"1", 1)])
    roll(log, clock)
    log.clean(clock.now)
    found = [(h.base_offset, h.last_offset, h.records_count, h.producer_id, h.producer_epoch, h.base_sequence,
              h.is_control, h.max_timestamp) for h in headers(log)]
    assert found[:3] == [
        (0, 1, 0, 5, 3, 10, False, 6),  # emptied, with its offsets, sequence, epoch and max timestamp
        (3, 3, 0, 9, 1, -1, True, 7),  # a marker past its horizon, kept empty: it carries the producer's epoch
        (4, 6, 3, -1, -1, -1, False, 1)]
