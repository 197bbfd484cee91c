"""Loading after clean and unclean shutdowns: recovery, index rebuilds, checkpoints."""

from __future__ import annotations

import os

import pytest
from josef.log import EpochEntry, LogConfig
from josef_storage_local.logdir import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
)
from josef_storage_local.segment import Segment


def every_offset_reads(harness, log) -> bool:
    for offset in range(log.log_start_offset, log.log_end_offset):
        first = harness.batches(log.read(offset, 1 << 20, log.log_end_offset))[0]
        if not first[0] <= offset <= first[1]:
            return False
    return True


def test_recovery_cuts_a_torn_tail_and_appends_continue(harness):
    log = harness.open()
    infos = [harness.append(log, count=2) for _ in range(30)]
    log.assign_epoch(1, log.log_end_offset)
    torn = harness.append(log, count=2, epoch=1)
    path = harness.segment_file(log.segment_base_offsets[-1], ".log")
    size = path.stat().st_size
    harness.crash()
    os.truncate(path, size - 10)

    log = harness.reopen()
    assert log.log_end_offset == torn.first_offset == infos[-1].last_offset + 1
    assert path.stat().st_size == size - torn.batches[0].size
    assert log.epoch_entries() == (EpochEntry(0, 0),)  # the epoch started by the lost batch is gone
    assert every_offset_reads(harness, log)
    again = harness.append(log, count=2)
    assert (again.first_offset, log.log_end_offset) == (torn.first_offset, torn.first_offset + 2)
    assert harness.batches(log.read(torn.first_offset, 1 << 20, log.log_end_offset)) == [(60, 61)]


def test_recovery_cuts_a_corrupt_tail_that_the_crc_catches(harness):
    log = harness.open()
    infos = [harness.append(log) for _ in range(10)]
    path = harness.segment_file(0, ".log")
    harness.crash()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the last record's value: only the CRC can tell
    path.write_bytes(data)

    log = harness.reopen(LogConfig())
    assert log.log_end_offset == infos[-1].first_offset
    assert path.stat().st_size == len(data) - infos[-1].batches[0].size


def test_corruption_in_a_middle_segment_drops_the_later_ones(harness):
    log = harness.open()
    for _ in range(70):
        harness.append(log)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    path = harness.segment_file(bases[1], ".log")
    harness.crash()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)

    log = harness.reopen()
    assert log.segment_base_offsets == bases[:2]
    assert bases[1] < log.log_end_offset < bases[2]
    assert not harness.segment_file(bases[2], ".log").exists()
    assert every_offset_reads(harness, log)


def test_an_unclean_start_recovers_only_from_the_recovery_point(harness, clock, monkeypatch):
    log = harness.open()
    for _ in range(70):
        harness.append(log)
    clock.now += 60_000  # log.flush.offset.checkpoint.interval.ms: this flush writes the checkpoint
    log.flush()
    assert (harness.root / RECOVERY_POINT_FILE).read_text() == "0\n1\norders 0 70\n"
    for _ in range(3):
        harness.append(log)
    harness.crash()
    recovered = []
    real_recover = Segment.recover
    monkeypatch.setattr(
        Segment,
        "recover",
        lambda self, *a: (recovered.append(self.base_offset), real_recover(self, *a))[1],
    )

    log = harness.reopen()
    assert recovered == [log.segment_base_offsets[-1]]
    assert log.log_end_offset == 73
    assert every_offset_reads(harness, log)


def test_a_clean_start_recovers_nothing(harness, monkeypatch):
    log = harness.open()
    for _ in range(70):
        harness.append(log)
    monkeypatch.setattr(
        Segment, "recover", lambda *a: pytest.fail("recovered after a clean shutdown")
    )
    log = harness.restart()
    assert log.log_end_offset == 70
    assert every_offset_reads(harness, log)


def test_missing_index_is_rebuilt_after_a_clean_shutdown(harness):
    log = harness.open()
    for i in range(70):
        harness.append(log, timestamp=1000 + i)
    bases = log.segment_base_offsets
    index, timeindex = (
        harness.segment_file(bases[1], ".index"),
        harness.segment_file(bases[1], ".timeindex"),
    )
    harness.storage.close()
    before = index.read_bytes(), timeindex.read_bytes()
    index.unlink()
    timeindex.unlink()

    log = harness.reopen()
    assert (index.read_bytes(), timeindex.read_bytes()) == before
    assert every_offset_reads(harness, log)


def test_corrupt_indexes_are_rebuilt_after_a_clean_shutdown(harness):
    log = harness.open()
    for i in range(70):
        harness.append(log, timestamp=1000 + i)
    bases = log.segment_base_offsets
    harness.storage.close()
    paths = [
        harness.segment_file(bases[n], suffix)
        for n in (0, 1)
        for suffix in (".index", ".timeindex")
    ]
    before = [path.read_bytes() for path in paths]
    paths[0].write_bytes(before[0] + bytes(64))  # untrimmed: zero-filled entries
    paths[1].write_bytes(before[1][:-1])  # not whole entries
    paths[2].write_bytes(b"\x00\x00\x00\x07\x00\x00\x00\x05" * 3)  # entries naming no batch

    log = harness.reopen()
    assert [path.read_bytes() for path in paths] == before
    assert every_offset_reads(harness, log)


def test_checkpoints_and_marker_survive_a_clean_restart(harness):
    log = harness.open()
    for _ in range(30):
        harness.append(log)
    log.delete_records_before(5)
    log.assign_epoch(3, 30)
    harness.append(log, epoch=3)
    harness.storage.close()
    root = harness.root
    assert (root / CLEAN_SHUTDOWN_FILE).exists()
    assert (root / RECOVERY_POINT_FILE).read_text() == "0\n1\norders 0 31\n"
    assert (root / LOG_START_OFFSET_FILE).read_text() == "0\n1\norders 0 5\n"
    assert (harness.path() / "leader-epoch-checkpoint").read_text() == "0\n2\n0 5\n3 30\n"

    log = harness.reopen()
    assert not (root / CLEAN_SHUTDOWN_FILE).exists()
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (5, 31, 31)
    assert log.epoch_entries() == (EpochEntry(0, 5), EpochEntry(3, 30))


def test_a_log_not_reopened_after_a_crash_keeps_the_next_start_unclean(harness):
    log = harness.open()
    infos = [harness.append(log) for _ in range(5)]
    harness.crash()
    harness.start()
    harness.storage.close()  # the log was never opened, so never recovered
    assert not (harness.root / CLEAN_SHUTDOWN_FILE).exists()
    path = harness.segment_file(0, ".log")
    os.truncate(path, path.stat().st_size - 3)

    log = harness.reopen()
    assert log.log_end_offset == infos[-1].first_offset


def test_a_crash_that_loses_data_above_the_log_start_starts_the_log_there(harness):
    log = harness.open()
    for _ in range(10):
        harness.append(log)
    log.delete_records_before(10)
    harness.crash()
    path = harness.segment_file(0, ".log")
    os.truncate(path, path.stat().st_size - 3)

    log = harness.reopen()
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (10, 10, [10])
    assert log.read(10, 1 << 20, 10) == b""
    assert harness.append(log).first_offset == 10


def test_leftovers_of_interrupted_deletions_are_removed_on_load(harness):
    log = harness.open()
    harness.append(log)
    harness.storage.close()
    stale = harness.path() / "00000000000000000099.log.deleted"
    orphan = harness.path() / "00000000000000000042.index"
    stale.write_bytes(b"old")
    orphan.write_bytes(b"")
    log = harness.reopen()
    assert not stale.exists() and not orphan.exists()
    assert log.segment_base_offsets == [0]
