"""The leader-epoch cache, OffsetsForLeaderEpoch answers, and truncation of a diverging log."""

from __future__ import annotations

from josef.log import EpochEntry

EPOCH_FILE = "leader-epoch-checkpoint"


def test_assign_epoch_ignores_older_epochs_and_is_checkpointed(harness):
    log = harness.open()
    for _ in range(3):
        harness.append(log, epoch=0)
    log.assign_epoch(2, 3)
    harness.append(log, count=2, epoch=2)
    log.assign_epoch(1, 5)
    log.assign_epoch(2, 4)
    log.assign_epoch(4, 5)
    harness.append(log, epoch=4)
    assert log.epoch_entries() == (EpochEntry(0, 0), EpochEntry(2, 3), EpochEntry(4, 5))
    assert (harness.path() / EPOCH_FILE).read_text() == "0\n3\n0 0\n2 3\n4 5\n"


def test_end_offset_for_epoch_answers_as_kafka(harness):
    log = harness.open()
    for epoch, count in ((0, 3), (2, 2), (4, 1)):
        log.assign_epoch(epoch, log.log_end_offset)
        harness.append(log, count=count, epoch=epoch)
    assert [log.end_offset_for_epoch(e) for e in range(6)] == [
        (0, 3),
        (0, 3),
        (2, 5),
        (2, 5),
        (4, 6),
        (-1, -1),
    ]
    assert log.end_offset_for_epoch(-1) == (-1, -1)


def test_end_offset_for_an_epoch_below_the_first_known(harness):
    log = harness.open()
    log.assign_epoch(3, 0)
    harness.append(log, count=4, epoch=3)
    log.assign_epoch(5, 4)
    assert log.end_offset_for_epoch(1) == (1, 0)
    assert log.end_offset_for_epoch(3) == (3, 4)


def test_an_empty_cache_knows_no_epoch(harness):
    assert harness.open().end_offset_for_epoch(0) == (-1, -1)


def test_epochs_are_learnt_from_appended_batches_as_a_follower_needs(harness):
    log = harness.open()
    harness.append(log, count=2, epoch=3)
    harness.append(log, epoch=3)
    harness.append(log, epoch=5)
    assert log.epoch_entries() == (EpochEntry(3, 0), EpochEntry(5, 3))
    log.flush()
    assert (harness.path() / EPOCH_FILE).read_text() == "0\n2\n3 0\n5 3\n"


def test_epochs_are_relearnt_from_the_log_when_the_checkpoint_is_lost(harness):
    log = harness.open()
    harness.append(log, count=2, epoch=3)
    harness.append(log, epoch=5)
    harness.crash()
    (harness.path() / EPOCH_FILE).unlink(missing_ok=True)
    log = harness.reopen()
    assert log.epoch_entries() == (EpochEntry(3, 0), EpochEntry(5, 2))


def test_truncate_to_drops_segments_batches_indexes_and_epochs_after_the_offset(harness):
    log = harness.open()
    for i in range(70):
        if i == 40:
            log.assign_epoch(1, log.log_end_offset)
        harness.append(log, timestamp=1000 + i, epoch=1 if i >= 40 else 0)
    bases = log.segment_base_offsets
    target = bases[1] + 3
    log.truncate_to(target)
    assert log.log_end_offset == target
    assert log.segment_base_offsets == bases[:2]
    assert not harness.segment_file(bases[2], ".log").exists()
    assert log.epoch_entries() == (EpochEntry(0, 0),)
    assert log.max_timestamp() == (1000 + target - 1, target - 1)
    assert log.read(target, 1 << 20, target) == b""
    assert harness.batches(log.read(target - 1, 1 << 20, target)) == [(target - 1, target - 1)]

    assert harness.append(log, epoch=2).first_offset == target
    log = harness.restart()
    assert log.log_end_offset == target + 1
    for offset in range(target + 1):
        first = harness.batches(log.read(offset, 1 << 20, target + 1))[0]
        assert first[0] <= offset <= first[1]


def test_truncate_to_inside_a_batch_drops_the_whole_batch(harness):
    log = harness.open()
    harness.append(log, count=3)
    harness.append(log, count=3)
    log.truncate_to(4)
    assert log.log_end_offset == 3
    assert harness.batches(log.read(0, 1 << 20, 10)) == [(0, 2)]


def test_truncate_to_at_or_past_the_end_does_nothing(harness):
    log = harness.open()
    harness.append(log, count=3)
    log.truncate_to(3)
    log.truncate_to(10)
    assert log.log_end_offset == 3


def test_truncate_below_the_first_segment_starts_the_log_over_there(harness):
    log = harness.open()
    for _ in range(70):
        harness.append(log)
    bases = log.segment_base_offsets
    log.delete_records_before(bases[2])
    log.apply_retention(harness.clock())
    log.truncate_to(bases[1])
    assert (log.segment_base_offsets, log.log_start_offset, log.log_end_offset) == (
        [bases[1]],
        bases[1],
        bases[1],
    )
    assert log.epoch_entries() == ()
    assert harness.append(log).first_offset == bases[1]
