"""Moving a log between log directories (AlterReplicaLogDirs), its errors, and restarts and crashes around it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from josef.log import LogDirError, LogDirNotFoundError
from josef.producer.producer_state import BatchMetadata, ProducerEntry
from josef_storage_local import move, snapshots
from josef_storage_local.checkpoints import write_offsets
from josef_storage_local.logdir import LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE

ENTRIES = (ProducerEntry(7, 0, (BatchMetadata(0, 0, 0, 0, 1000),)),)


@pytest.fixture
def two_dirs(harness, tmp_path) -> tuple[Path, Path]:
    """The harness storage restarted on two log directories; the log is created in the first."""
    first, second = tmp_path / "a", tmp_path / "b"
    harness.start(**{"log.dirs": f"{first},{second}"})
    return first, second


def filled(harness, epochs=(0, 3)):
    """A log of several segments under two leader epochs, with producer snapshots and a raised log start."""
    log = harness.open()
    log.attach_producer_state(lambda: ENTRIES)
    for epoch in epochs:
        log.assign_epoch(epoch, log.log_end_offset)
        for _ in range(15):
            harness.append(log, count=3, epoch=epoch)
    log.delete_records_before(4)
    assert len(log.segment_base_offsets) >= 3
    return log


def state(harness, log):
    """Everything a move must keep, read through the log's own methods."""
    return (
        harness.records(log.read(log.log_start_offset, 1 << 20, log.log_end_offset)),
        log.log_start_offset, log.log_end_offset, log.segment_base_offsets, list(log.epoch_entries()),
        log.offset_for_timestamp(1000), log.max_timestamp(), log.latest_producer_snapshot().producers,
        [base for base in log.segment_base_offsets[1:] if base in snapshots.list_snapshots(log.dir)],
    )


def restart(harness, first: Path, second: Path):
    """Close cleanly and start a storage on both directories again."""
    harness.storage.close()
    return harness.start(**{"log.dirs": f"{first},{second}"})


def checkpointed(log_dir: Path) -> str:
    path = log_dir / RECOVERY_POINT_FILE
    return path.read_text() if path.exists() else ""


def test_a_move_keeps_every_record_index_epoch_and_snapshot_and_the_log_takes_appends(harness, two_dirs):
    first, second = two_dirs
    log = filled(harness)
    before = state(harness, log)
    harness.storage.move(harness.tp, str(second))
    assert harness.storage.dir_of(harness.tp) == str(second)
    assert log.dir == second / str(harness.tp) and not (first / str(harness.tp)).exists()
    assert sorted(p.name for p in first.iterdir() if p.is_dir()) == []
    assert state(harness, log) == before
    assert log.latest_producer_snapshot().producers == ENTRIES
    info = harness.append(log, count=2, epoch=3)
    assert harness.records(log.read(info.first_offset, 1 << 20, log.log_end_offset))[-1][0] == info.last_offset
    assert log.dir.joinpath(f"{log.segment_base_offsets[-1]:020d}.log").exists()


def test_appends_during_the_first_copy_pass_are_moved_too(harness, two_dirs, monkeypatch):
    """The first pass runs without the log's lock: what is appended meanwhile must reach the new copy."""
    _, second = two_dirs
    log = filled(harness)
    real_sync = move.sync
    appended = []

    def racing_sync(source, future, copied, active_base):
        done = real_sync(source, future, copied, active_base)
        if active_base is None:
            appended.append(harness.append(log, count=4, epoch=3))
        return done

    monkeypatch.setattr("josef_storage_local.storage.sync", racing_sync)
    harness.storage.move(harness.tp, str(second))
    last = appended[0].last_offset
    assert log.log_end_offset == last + 1
    assert harness.records(log.read(appended[0].first_offset, 1 << 20, last + 1))[-1][0] == last
    restart(harness, *two_dirs)
    reopened = harness.open()
    assert reopened.log_end_offset == last + 1
    assert harness.records(reopened.read(appended[0].first_offset, 1 << 20, last + 1))[-1][0] == last


def test_moving_to_a_dir_not_in_log_dirs_is_an_error(harness, two_dirs, tmp_path):
    first, _ = two_dirs
    log = filled(harness)
    with pytest.raises(LogDirNotFoundError):
        harness.storage.move(harness.tp, str(tmp_path / "elsewhere"))
    assert harness.storage.dir_of(harness.tp) == str(first)
    assert not (tmp_path / "elsewhere").exists()
    harness.append(log, epoch=3)


def test_moving_to_the_dir_it_is_in_does_nothing(harness, two_dirs):
    first, _ = two_dirs
    log = filled(harness)
    files = {p.name: p.stat().st_mtime_ns for p in log.dir.iterdir()}
    harness.storage.move(harness.tp, str(first))
    assert {p.name: p.stat().st_mtime_ns for p in log.dir.iterdir()} == files
    assert log.dir == first / str(harness.tp)


def test_moving_a_partition_without_a_log_is_an_error(harness, two_dirs):
    _, second = two_dirs
    with pytest.raises(KeyError):
        harness.storage.move(harness.tp, str(second))
    with pytest.raises(KeyError):
        harness.storage.dir_of(harness.tp)


def test_a_log_that_is_not_open_moves_too(harness, two_dirs):
    first, second = two_dirs
    before = state(harness, filled(harness))
    restart(harness, first, second)
    harness.storage.move(harness.tp, str(second))
    assert state(harness, harness.open()) == before
    assert harness.storage.dir_of(harness.tp) == str(second)


def test_after_a_restart_the_log_is_in_its_new_dir_and_nowhere_else(harness, two_dirs):
    first, second = two_dirs
    log = filled(harness)
    harness.storage.move(harness.tp, str(second))
    before = state(harness, log)
    storage = restart(harness, first, second)
    assert storage.stored() == [harness.tp]
    assert storage.dir_of(harness.tp) == str(second)
    assert list(first.glob("orders-*")) == []
    assert str(harness.tp) not in checkpointed(first)
    assert state(harness, harness.open()) == before


def test_a_failed_copy_leaves_the_log_in_place_and_usable(harness, two_dirs, monkeypatch):
    first, second = two_dirs
    log = filled(harness)
    before = state(harness, log)

    def disk_full(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("josef_storage_local.storage.fsync_tree", disk_full)
    with pytest.raises(LogDirError, match="ENOSPC"):
        harness.storage.move(harness.tp, str(second))
    assert harness.storage.dir_of(harness.tp) == str(first) and log.dir == first / str(harness.tp)
    assert [p for p in second.iterdir() if p.is_dir()] == []
    assert str(harness.tp) not in checkpointed(second)
    assert state(harness, log) == before
    harness.append(log, epoch=3)


def _crash_mid_move(harness, first: Path, second: Path, *, committed: bool) -> tuple:
    """Stop uncleanly with a future copy in ``second``: half-made (before the commit) or whole with the old copy renamed for deletion (after)."""
    log = filled(harness)
    before = state(harness, log)
    harness.clock.now += 60_000  # log.flush.offset.checkpoint.interval.ms: the flush checkpoints the recovery point,
    log.flush()                  # so the restart recovers nothing and keeps every producer snapshot
    harness.crash()
    current = first / str(harness.tp)
    future = second / f"{harness.tp}.0123abcd{move.FUTURE_SUFFIX}"
    if committed:  # as the move does before its commit: a whole copy, and the target's checkpoints
        shutil.copytree(current, future)
        write_offsets(second / LOG_START_OFFSET_FILE, {harness.tp: log.log_start_offset})
        write_offsets(second / RECOVERY_POINT_FILE, {harness.tp: log.recovery_point})
        current.rename(first / f"{harness.tp}.0123abcd-delete")
    else:
        future.mkdir(parents=True)
        for path in sorted(current.glob("*.log"))[:2]:
            shutil.copyfile(path, future / path.name)
    return before


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
def test_a_crash_in_the_middle_of_a_move_recovers_to_exactly_one_copy(harness, two_dirs, committed):
    first, second = two_dirs
    before = _crash_mid_move(harness, first, second, committed=committed)
    storage = harness.start(**{"log.dirs": f"{first},{second}"})
    winner, loser = (second, first) if committed else (first, second)
    assert storage.dir_of(harness.tp) == str(winner)
    assert [p.name for p in loser.iterdir() if p.is_dir()] == []
    assert str(harness.tp) not in checkpointed(loser)
    assert storage.stored() == [harness.tp]
    assert state(harness, harness.open()) == before
    assert snapshots.list_snapshots(winner / str(harness.tp))
