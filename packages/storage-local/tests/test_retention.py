"""Retention by time and size, and DeleteRecords (the log start offset)."""

from __future__ import annotations

import os

import attrs
import pytest
from josef.log import OffsetOutOfRangeError
from josef_storage_local.logdir import LOG_START_OFFSET_FILE


def segment_files(harness):
    return sorted(path.name for path in harness.path().iterdir() if path.name[0].isdigit())


def test_retention_by_time_deletes_expired_segments_but_never_the_active_one(harness):
    log = harness.open(attrs.evolve(harness.config, retention_ms=10_000))
    for i in range(70):
        harness.append(log, timestamp=1000 + i * 100)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    first_max = 1000 + (bases[1] - 1) * 100  # the max timestamp of the first segment
    assert log.apply_retention(first_max + 10_000) == 0
    assert log.apply_retention(first_max + 10_001) == 1
    assert log.segment_base_offsets == bases[1:]
    assert log.log_start_offset == bases[1]
    assert not harness.segment_file(0, ".log").exists()
    assert not any(name.endswith(".deleted") for name in segment_files(harness))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1 << 20, log.log_end_offset)

    assert log.apply_retention(10**15) == len(bases) - 2
    assert log.segment_base_offsets == [bases[-1]]
    assert log.apply_retention(10**15) == 0
    assert harness.batches(log.read(bases[-1], 1 << 20, log.log_end_offset))[0] == (
        bases[-1],
        bases[-1],
    )
    assert harness.restart().log_start_offset == bases[-1]


def test_retention_by_time_uses_the_file_time_when_batches_have_no_timestamp(harness, clock):
    log = harness.open(attrs.evolve(harness.config, retention_ms=10_000))
    for _ in range(30):
        harness.append(log, timestamp=-1)
    first = harness.segment_file(0, ".log")
    mtime = clock.now / 1000 - 11
    os.utime(first, (mtime, mtime))
    assert log.apply_retention(clock.now) == 1
    assert not first.exists()


def test_retention_by_size_deletes_the_oldest_segments_until_one_more_would_go_below_it(harness):
    log = harness.open(attrs.evolve(harness.config, retention_bytes=3000))
    for _ in range(100):
        harness.append(log)
    count = len(log.segment_base_offsets)
    deleted = log.apply_retention(harness.clock())
    assert deleted >= 1
    assert len(log.segment_base_offsets) == count - deleted
    first_size = harness.segment_file(log.segment_base_offsets[0], ".log").stat().st_size
    assert log.size_bytes - first_size < 3000 <= log.size_bytes


def test_retention_by_size_never_deletes_the_active_segment(harness):
    log = harness.open(attrs.evolve(harness.config, retention_bytes=0))
    for _ in range(70):
        harness.append(log)
    last = log.segment_base_offsets[-1]
    assert log.apply_retention(harness.clock()) >= 2
    assert log.segment_base_offsets == [last]
    assert log.log_start_offset == last


def test_compacted_topics_are_not_cut_by_time_or_size(harness):
    log = harness.open(
        attrs.evolve(harness.config, retention_bytes=0, retention_ms=0, cleanup_policy=("compact",))
    )
    for _ in range(70):
        harness.append(log)
    assert log.apply_retention(10**15) == 0


def test_delete_records_before_moves_the_log_start_and_retention_drops_whole_segments(harness):
    log = harness.open()
    for _ in range(70):
        harness.append(log)
    bases = log.segment_base_offsets
    target = bases[2] + 1
    assert log.delete_records_before(target) == target
    assert (harness.root / LOG_START_OFFSET_FILE).read_text() == f"0\n1\norders 0 {target}\n"
    assert log.log_start_offset == target
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 1 << 20, log.log_end_offset)
    assert harness.batches(log.read(target, 1 << 20, log.log_end_offset))[0] == (target, target)
    assert log.delete_records_before(3) == target  # never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(log.log_end_offset + 1)

    assert log.apply_retention(harness.clock()) == 2
    assert log.segment_base_offsets == bases[2:]
    assert log.log_start_offset == target  # not back to the segment's base
    assert harness.restart().log_start_offset == target
