"""The storage's background thread: flushes after rolls, flush.ms, checkpoints, file.delete.delay.ms."""

from __future__ import annotations

import threading

import attrs
import pytest
from josef.testing import eventually
from josef_storage_local.logdir import LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE
from josef_storage_local.segment import Segment

CHECKPOINT_MS = 5_000


@pytest.fixture
def started(harness):
    """The harness's storage with its background thread running, checkpoints every CHECKPOINT_MS of the manual clock."""
    harness.start(**{
        "log.flush.offset.checkpoint.interval.ms": str(CHECKPOINT_MS),
        "log.flush.start.offset.checkpoint.interval.ms": str(CHECKPOINT_MS),
        "log.flush.scheduler.interval.ms": "1000",
    })
    harness.storage.startup()
    yield harness
    harness.storage.scheduler.close()


def run_due_until(harness, check, what: str) -> None:
    """Run what the manual clock made due; the background thread may take some of it, so wait for ``check``."""
    harness.storage.scheduler.run_due()
    eventually(check, timeout=10, what=what)


def deleted_files(harness) -> list[str]:
    return sorted(path.name for path in harness.path().iterdir() if path.name.endswith(".deleted"))


def test_rolls_advance_the_recovery_point_and_its_checkpoint_without_a_flush_or_close(started, clock, monkeypatch):
    harness = started
    log = harness.open()
    for _ in range(200):
        harness.append(log)
    bases = log.segment_base_offsets
    assert len(bases) >= 5
    eventually(lambda: log.recovery_point == bases[-1], timeout=10, what="the flush after the last roll")
    assert log.recovery_point < log.log_end_offset  # the active segment is left to the next flush

    clock.now += CHECKPOINT_MS
    checkpoint = harness.root / RECOVERY_POINT_FILE
    run_due_until(harness, lambda: checkpoint.read_text() == f"0\n1\norders 0 {bases[-1]}\n", "the checkpoint")

    end = log.log_end_offset
    harness.storage.scheduler.close()
    harness.crash()
    recovered = []
    real_recover = Segment.recover
    monkeypatch.setattr(
        Segment, "recover", lambda self, *a: (recovered.append(self.base_offset), real_recover(self, *a))[1]
    )
    log = harness.reopen()
    assert recovered == [bases[-1]]
    assert log.log_end_offset == end


def test_appends_go_on_while_the_background_thread_flushes_rolled_segments(started):
    harness = started
    log = harness.open(attrs.evolve(harness.config, segment_bytes=50_000))
    for _ in range(3000):
        harness.append(log, value_size=100)
    bases = log.segment_base_offsets
    assert len(bases) >= 10
    eventually(lambda: log.recovery_point == bases[-1], timeout=30, what="the flush after the last roll")
    for base in bases:
        assert harness.batches(log.read(base, 1 << 20, log.log_end_offset))[0][0] == base


def test_logs_past_flush_ms_are_flushed_every_scheduler_interval(started, clock):
    harness = started
    log = harness.open(attrs.evolve(harness.config, flush_ms=1500))
    harness.append(log, 3)
    assert log.recovery_point == 0
    clock.now += 1000
    harness.storage.scheduler.run_due()
    assert log.recovery_point == 0  # checked, not due yet
    clock.now += 1000
    run_due_until(harness, lambda: log.recovery_point == 3, "the flush")


def test_log_start_offsets_are_checkpointed_every_interval(started, clock):
    harness = started
    log = harness.open()
    for _ in range(10):
        harness.append(log)
    log.delete_records_before(4)
    checkpoint = harness.root / LOG_START_OFFSET_FILE
    checkpoint.unlink()
    clock.now += CHECKPOINT_MS - 1
    harness.storage.scheduler.run_due()
    assert not checkpoint.exists()
    clock.now += 1
    run_due_until(harness, lambda: checkpoint.exists() and checkpoint.read_text() == "0\n1\norders 0 4\n", "the checkpoint")


def test_deleted_segments_stay_as_deleted_files_until_file_delete_delay_ms(started, clock):
    harness = started
    log = harness.open(attrs.evolve(harness.config, retention_ms=10_000, file_delete_delay_ms=60_000))
    for _ in range(100):
        harness.append(log, timestamp=1000)
    bases = log.segment_base_offsets
    assert log.apply_retention(10**15) == len(bases) - 1
    first = harness.segment_file(bases[0], ".log")
    assert not first.exists()
    pending = deleted_files(harness)
    assert first.name + ".deleted" in pending
    assert len(pending) >= 2 * (len(bases) - 1)  # each .log with its indexes
    assert harness.batches(log.read(bases[-1], 1 << 20, log.log_end_offset))[0][0] == bases[-1]

    clock.now += 59_999
    harness.storage.scheduler.run_due()
    assert deleted_files(harness) == pending
    clock.now += 1
    run_due_until(harness, lambda: not deleted_files(harness), "the removal of the .deleted files")
    assert log.segment_base_offsets == [bases[-1]]


def test_a_deleted_partition_directory_stays_until_file_delete_delay_ms(started, clock):
    harness = started
    log = harness.open(attrs.evolve(harness.config, file_delete_delay_ms=60_000))
    harness.append(log)
    harness.storage.delete(harness.tp)
    assert not harness.path().exists()
    doomed = [p for p in harness.root.iterdir() if p.name.endswith("-delete")]
    assert len(doomed) == 1 and doomed[0].name.startswith(f"{harness.tp}.")
    assert harness.tp not in harness.storage.stored()
    clock.now += 59_999
    harness.storage.scheduler.run_due()
    assert doomed[0].exists()
    clock.now += 1
    run_due_until(harness, lambda: not doomed[0].exists(), "the removal of the -delete directory")


def test_deleted_files_still_waiting_are_removed_at_close(started):
    harness = started
    log = harness.open(attrs.evolve(harness.config, retention_ms=10_000, file_delete_delay_ms=60_000))
    for _ in range(100):
        harness.append(log, timestamp=1000)
    assert log.apply_retention(10**15) >= 1
    assert deleted_files(harness)
    harness.storage.close()
    assert not deleted_files(harness)
    assert harness.reopen().log_start_offset == log.log_start_offset


def test_truncation_defers_the_removal_of_the_segments_it_drops(started, clock):
    harness = started
    log = harness.open(attrs.evolve(harness.config, file_delete_delay_ms=1000))
    for _ in range(100):
        harness.append(log)
    bases = log.segment_base_offsets
    log.truncate_to(bases[1])
    assert log.segment_base_offsets == bases[:2]
    assert harness.segment_file(bases[2], ".log.deleted").exists()
    for _ in range(100):  # the same base offsets come back while the old files wait
        harness.append(log)
    assert log.segment_base_offsets[2] == bases[2]
    clock.now += 1000
    run_due_until(harness, lambda: not deleted_files(harness), "the removal of the .deleted files")
    assert harness.segment_file(bases[2], ".log").exists()
    assert harness.batches(log.read(bases[2], 1 << 20, log.log_end_offset))[0][0] == bases[2]


def test_retention_racing_the_background_flush_loses_nothing_and_logs_no_failure(started, caplog):
    harness = started
    log = harness.open(attrs.evolve(harness.config, retention_bytes=20_000, file_delete_delay_ms=0))
    stop = threading.Event()
    deleted = []
    begun = [0]  # retention passes begun so far; a pass is done once its count is in deleted

    def retention() -> None:
        while not stop.is_set():
            begun[0] += 1
            deleted.append(log.apply_retention(harness.clock()))

    thread = threading.Thread(target=retention)
    thread.start()
    try:
        for _ in range(3000):
            harness.append(log)
        # However the two threads were scheduled, a pass begun after the last append deletes every segment
        # past retention.bytes, so what the passes deleted adds up to all that the appends pushed out.
        last_append = begun[0]
        eventually(lambda: len(deleted) > last_append, timeout=30, what="a retention pass after the last append")
    finally:
        stop.set()
        thread.join()
    assert sum(deleted) > 10
    bases = log.segment_base_offsets
    eventually(lambda: log.recovery_point == bases[-1], timeout=30, what="the flush after the last roll")
    eventually(lambda: not deleted_files(harness), timeout=10, what="the removal of the .deleted files")
    assert not [r for r in caplog.records if r.name == "josef_storage_local.scheduler"]
    assert harness.batches(log.read(bases[0], 1 << 20, log.log_end_offset))[0][0] == bases[0]
