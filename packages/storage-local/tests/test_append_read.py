"""Appending, rolling and reading: the data path."""

from __future__ import annotations

import os
import random
import struct

import attrs
import pytest
from josef.log import LogConfig
from josef.protocol.records import build_batch, iter_batches, validate_and_assign
from josef_storage_local.segment import file_name


def test_appended_batches_read_back_as_appended(harness):
    log = harness.open()
    infos = [harness.append(log, count=n) for n in (1, 3, 2)]
    assert log.log_end_offset == 6
    data = log.read(0, 1 << 20, 6)
    assert harness.batches(data) == [(0, 0), (1, 3), (4, 5)]
    assert log.size_bytes == sum(info.batches[0].size for info in infos) == len(data)
    assert harness.segment_file(0, ".log").read_bytes() == data


def test_one_append_of_several_batches_is_indexed_per_batch(harness):
    log = harness.open(LogConfig(index_interval_bytes=0))
    buf = bytearray(b"".join(build_batch([(None, b"v", 1000 + i)] * 2) for i in range(4)))
    info = validate_and_assign(buf, 0, 0, 1 << 30)
    log.append(buf, info)
    log.close()
    index = harness.segment_file(0, ".index").read_bytes()
    # Every batch after the first gets an entry: its last offset, its position.
    positions = [position for position, _ in iter_batches(bytes(buf))]
    assert list(struct.iter_unpack(">ii", index)) == [
        (3, positions[1]),
        (5, positions[2]),
        (7, positions[3]),
    ]
    timeindex = harness.segment_file(0, ".timeindex").read_bytes()
    assert list(struct.iter_unpack(">qi", timeindex)) == [(1001, 3), (1002, 5), (1003, 7)]


def test_segments_roll_when_the_next_batch_does_not_fit(harness):
    log = harness.open()
    infos = [harness.append(log) for _ in range(60)]
    size = infos[0].batches[0].size
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    for base in bases[:-1]:
        file_size = harness.segment_file(base, ".log").stat().st_size
        assert harness.config.segment_bytes - size < file_size <= harness.config.segment_bytes
    for base in bases:
        assert harness.batches(log.read(base, size, log.log_end_offset))[0][0] == base
    assert log.size_bytes == sum(harness.segment_file(b, ".log").stat().st_size for b in bases)


def test_a_batch_larger_than_a_segment_gets_an_empty_segment(harness):
    log = harness.open()
    harness.append(log)
    big = harness.append(log, value_size=5000)
    harness.append(log)
    assert log.segment_base_offsets == [0, 1, 2]
    assert harness.segment_file(1, ".log").stat().st_size == big.batches[0].size


def test_segments_roll_by_time_from_the_first_batch_timestamp(harness):
    log = harness.open(LogConfig(segment_ms=1000))
    harness.append(log, timestamp=10_000)
    harness.append(log, timestamp=11_000)
    assert log.segment_base_offsets == [0]
    harness.append(log, timestamp=11_001)
    assert log.segment_base_offsets == [0, 2]


def test_segments_roll_by_time_from_creation_when_batches_have_no_timestamp(harness, clock):
    log = harness.open(LogConfig(segment_ms=1000))
    harness.append(log, timestamp=-1)
    clock.now += 1000
    harness.append(log, timestamp=-1)
    assert log.segment_base_offsets == [0]
    clock.now += 1
    harness.append(log, timestamp=-1)
    assert log.segment_base_offsets == [0, 2]


def test_segments_roll_when_the_offset_index_is_full(harness):
    # 36 bytes: 4 offset entries; the time index (3 slots, one kept for the roll) gets one entry only.
    log = harness.open(LogConfig(index_interval_bytes=0, segment_index_bytes=36))
    for _ in range(6):
        harness.append(log)
    assert log.segment_base_offsets == [0, 5]
    assert harness.segment_file(0, ".index").stat().st_size == 4 * 8


def test_active_indexes_are_preallocated_and_rolled_ones_trimmed_to_valid_entries(harness):
    log = harness.open()
    for i in range(60):
        harness.append(log, timestamp=1000 + i)
    *rolled, active = log.segment_base_offsets
    assert harness.segment_file(active, ".index").stat().st_size == 1024
    assert harness.segment_file(active, ".timeindex").stat().st_size == 1020
    assert rolled
    for base in rolled:
        segment = harness.segment_file(base, ".log").read_bytes()
        last_offset_at = {
            position: header.last_offset for position, header in iter_batches(segment)
        }
        entries = list(struct.iter_unpack(">ii", harness.segment_file(base, ".index").read_bytes()))
        assert entries, "a 2000-byte segment with a 200-byte interval has index entries"
        assert all(last_offset_at[position] == base + relative for relative, position in entries)
        assert [e[1] for e in entries] == sorted({e[1] for e in entries})
        times = list(
            struct.iter_unpack(">qi", harness.segment_file(base, ".timeindex").read_bytes())
        )
        # The last time entry is the segment's max timestamp, written when it rolled.
        assert times[-1] == (
            1000 + max(last_offset_at.values()),
            max(last_offset_at.values()) - base,
        )


def test_read_at_every_offset_returns_the_batch_holding_it_then_the_following_ones(harness):
    log = harness.open()
    expected = []
    for i in range(80):
        info = harness.append(log, count=1 + i % 4)
        expected.append((info.first_offset, info.last_offset))
    assert len(log.segment_base_offsets) > 3

    def check() -> None:
        for offset in range(log.log_end_offset):
            got = harness.batches(log.read(offset, 1 << 20, log.log_end_offset))
            first = next(i for i, (_, last) in enumerate(expected) if last >= offset)
            assert got and got == expected[first : first + len(got)], offset

    check()
    log = harness.restart()  # the same with indexes read back from disk
    check()


def test_read_stops_at_max_bytes_and_max_offset_on_whole_batches(harness):
    log = harness.open(LogConfig())
    infos = [harness.append(log, count=2) for _ in range(10)]
    size = infos[0].batches[0].size
    assert harness.batches(log.read(0, size * 3 + size // 2, 20)) == [(0, 1), (2, 3), (4, 5)]
    # max_offset (the high watermark) is exclusive; a batch reaching past it is not returned.
    assert harness.batches(log.read(0, 1 << 20, 6)) == [(0, 1), (2, 3), (4, 5)]
    assert harness.batches(log.read(0, 1 << 20, 7)) == [(0, 1), (2, 3), (4, 5)]
    assert log.read(6, 1 << 20, 6) == b""
    # An offset inside a batch returns the whole batch.
    assert harness.batches(log.read(3, size, 20)) == [(2, 3)]
    # KIP-74: the first batch comes whole even above max_bytes, unless min_one_batch is off.
    assert harness.batches(log.read(0, 10, 20)) == [(0, 1)]
    assert log.read(0, 10, 20, min_one_batch=False) == b""


def test_read_crossing_a_segment_end_returns_that_segment_then_the_next_read_continues(harness):
    log = harness.open()
    for _ in range(40):
        harness.append(log)
    second = log.segment_base_offsets[1]
    first_part = harness.batches(log.read(second - 2, 1 << 20, log.log_end_offset))
    assert first_part == [(second - 2, second - 2), (second - 1, second - 1)]
    assert harness.batches(log.read(second, 1 << 20, log.log_end_offset))[0] == (second, second)


def test_append_must_start_at_the_log_end(harness):
    log = harness.open()
    buf = bytearray(build_batch([(None, b"v", 1)]))
    info = validate_and_assign(buf, 5, 0, 1 << 30)
    with pytest.raises(ValueError, match="log ends at 0"):
        log.append(buf, info)
    assert log.log_end_offset == 0


def test_flush_messages_fsyncs_and_moves_the_recovery_point(harness, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    log = harness.open(attrs.evolve(harness.config, flush_messages=3))
    harness.append(log)
    harness.append(log)
    assert (synced, log.recovery_point) == ([], 0)
    harness.append(log)
    assert len(synced) >= 3  # the .log and both indexes
    assert log.recovery_point == 3


def test_flush_ms_flushes_on_the_append_after_the_interval(harness, clock):
    log = harness.open(attrs.evolve(harness.config, flush_ms=1000))
    harness.append(log)
    clock.now += 999
    harness.append(log)
    assert log.recovery_point == 0
    clock.now += 1
    harness.append(log)
    assert log.recovery_point == 3


def test_segment_file_names_are_twenty_digits():
    assert file_name(123, ".log") == "00000000000000000123.log"


def test_reads_cut_by_max_bytes_and_max_offset_match_a_brute_force_answer(harness):
    log = harness.open(LogConfig(index_interval_bytes=200))
    rng = random.Random(3)
    sizes = {}
    for _ in range(150):
        info = harness.append(log, count=rng.randrange(1, 4), value_size=rng.randrange(1, 300))
        sizes[(info.first_offset, info.last_offset)] = info.batches[0].size
    end = log.log_end_offset
    for _ in range(400):
        offset = rng.randrange(end)
        max_bytes = rng.randrange(1, 8000)
        max_offset = rng.randrange(offset, end + 1)
        expected, total = [], 0
        for batch, size in sizes.items():
            if batch[1] < offset:
                continue
            if batch[1] >= max_offset or (expected and total + size > max_bytes):
                break
            if not expected and size > max_bytes:
                expected.append(batch)
                break
            expected.append(batch)
            total += size
        assert harness.batches(log.read(offset, max_bytes, max_offset)) == expected, (
            offset,
            max_bytes,
            max_offset,
        )
