"""ListOffsets by timestamp and max timestamp, through the time index."""

from __future__ import annotations

import random

from josef.log import LogConfig


def fill(harness, log, batches: int = 60, seed: int = 7) -> list[tuple[int, int]]:
    """Batches of 1-3 records with timestamps that rise overall but not monotonically; returns (offset, ts)."""
    rng = random.Random(seed)
    records = []
    for i in range(batches):
        stamps = [1000 + i * 10 + rng.randrange(-25, 25) for _ in range(rng.randrange(1, 4))]
        info = harness.append(log, timestamps=stamps)
        records += zip(range(info.first_offset, info.last_offset + 1), stamps)
    return records


def first_at_or_after(records, timestamp, log_start=0):
    return next(((o, ts) for o, ts in records if ts >= timestamp and o >= log_start), None)


def test_offset_for_timestamp_is_the_first_record_at_or_after_it(harness):
    log = harness.open()
    records = fill(harness, log)
    assert len(log.segment_base_offsets) > 2
    targets = range(900, 1700, 3)
    assert [log.offset_for_timestamp(t) for t in targets] == [
        first_at_or_after(records, t) for t in targets
    ]
    log = harness.restart()  # time indexes read back from disk
    assert [log.offset_for_timestamp(t) for t in targets] == [
        first_at_or_after(records, t) for t in targets
    ]
    assert log.offset_for_timestamp(10**12) is None


def test_offset_for_timestamp_skips_records_below_the_log_start(harness):
    log = harness.open()
    records = fill(harness, log)
    start = log.segment_base_offsets[1] + 3
    log.delete_records_before(start)
    targets = range(900, 1700, 7)
    expected = [first_at_or_after(records, t, start) for t in targets]
    assert [log.offset_for_timestamp(t) for t in targets] == expected
    assert log.offset_for_timestamp(0)[0] == start


def test_max_timestamp_is_the_first_record_holding_it(harness):
    log = harness.open()
    assert log.max_timestamp() == (-1, -1)
    records = fill(harness, log)
    offset, ts = max(records, key=lambda r: r[1])
    assert log.max_timestamp() == (ts, offset)
    assert harness.restart().max_timestamp() == (ts, offset)
    harness.crash()
    assert harness.reopen().max_timestamp() == (ts, offset)


def test_max_timestamp_inside_a_batch_of_many_records(harness):
    log = harness.open(LogConfig())
    harness.append(log, timestamps=[5, 9, 7])
    harness.append(log, timestamps=[8, 9, 1])
    # The batch's max timestamp belongs to its second record; the later tie does not count.
    assert log.max_timestamp() == (9, 1)
    assert log.offset_for_timestamp(9) == (1, 9)
    assert log.offset_for_timestamp(8) == (1, 9)
