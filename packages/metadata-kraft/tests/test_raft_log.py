"""The RaftLog rules (epoch cache, divergence, snapshot redirection) and the quorum-state file."""

import json

import pytest
from raft_sim import MemoryRaftLog

from josef.protocol.records import build_batch
from josef_metadata_kraft.raft import (
    ElectionState,
    FileQuorumStateStore,
    OffsetAndEpoch,
    QuorumStateError,
    RaftLogError,
    end_offset_for_epoch,
    epoch_cache_end_offset,
)
from josef_metadata_kraft.raft.log import FetchPosition, truncation_offset, validate_offset_and_epoch

ENTRIES = [(1, 0), (3, 10), (5, 20)]  # epoch 1 at 0, epoch 3 at 10, epoch 5 at 20


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (5, OffsetAndEpoch(30, 5)),  # the latest epoch ends at the log end
        (3, OffsetAndEpoch(20, 3)),
        (4, OffsetAndEpoch(20, 3)),  # an epoch we never had: the largest below it, ending where the next starts
        (2, OffsetAndEpoch(10, 1)),
        (0, OffsetAndEpoch(0, 0)),  # smaller than any: the start of the first known epoch
        (6, None),  # larger than any
        (-1, None),
    ],
)
def test_epoch_cache_answers_like_kafkas_leader_epoch_file_cache(epoch, expected):
    assert epoch_cache_end_offset(ENTRIES, epoch, 30) == expected


def test_end_offset_for_epoch_uses_the_snapshot_when_the_cache_was_trimmed():
    # The cache kept epoch 3 rebased at the snapshot's offset 15; asked about epoch 4 it says (15, 3),
    # but the snapshot knows the record before 15 is of epoch 4.
    snapshot = OffsetAndEpoch(15, 4)
    found = epoch_cache_end_offset([(3, 15), (5, 20)], 4, 30)
    assert found == OffsetAndEpoch(20, 3)
    assert end_offset_for_epoch(OffsetAndEpoch(15, 3), snapshot, 30, 5) == snapshot
    assert end_offset_for_epoch(None, snapshot, 30, 5) == OffsetAndEpoch(30, 5)
    assert end_offset_for_epoch(OffsetAndEpoch(20, 3), snapshot, 30, 5) == OffsetAndEpoch(20, 3)


def fill(log, epochs):
    """Append one single-record batch per epoch in ``epochs`` as the leader of that epoch."""
    for epoch in epochs:
        log.append_as_leader(build_batch([(None, b"v%d" % log.end_offset, 0)], base_offset=log.end_offset,
                                         leader_epoch=epoch), epoch)


def test_validate_offset_and_epoch_valid_diverging_and_snapshot():
    log = MemoryRaftLog()
    fill(log, [1, 1, 1, 3, 3, 5])  # epochs: 1 at 0-2, 3 at 3-4, 5 at 5
    assert validate_offset_and_epoch(log, 0, 0) == FetchPosition("valid", OffsetAndEpoch(0, 0))
    assert validate_offset_and_epoch(log, 3, 1).kind == "valid"
    assert validate_offset_and_epoch(log, 6, 5).kind == "valid"
    # The follower has epoch 1 up to 4, but epoch 1 ends at 3 here.
    assert validate_offset_and_epoch(log, 4, 1) == FetchPosition("diverging", OffsetAndEpoch(3, 1))
    # An epoch this log never had: agree up to the end of the epoch below it.
    assert validate_offset_and_epoch(log, 5, 2) == FetchPosition("diverging", OffsetAndEpoch(3, 1))
    assert validate_offset_and_epoch(log, 5, 4) == FetchPosition("diverging", OffsetAndEpoch(5, 3))
    # A snapshot at 3 (epoch 1) and the prefix trimmed: anything before it, or not vouched for, goes there.
    log.create_snapshot(OffsetAndEpoch(3, 1), b"snap")
    log.delete_before_snapshot(OffsetAndEpoch(3, 1))
    assert log.start_offset == 3
    assert validate_offset_and_epoch(log, 2, 1) == FetchPosition("snapshot", OffsetAndEpoch(3, 1))
    assert validate_offset_and_epoch(log, 0, 0) == FetchPosition("snapshot", OffsetAndEpoch(3, 1))
    assert validate_offset_and_epoch(log, 3, 0) == FetchPosition("snapshot", OffsetAndEpoch(3, 1))
    assert validate_offset_and_epoch(log, 3, 1).kind == "valid"
    assert validate_offset_and_epoch(log, 4, 3).kind == "valid"


def test_follower_truncation_point_follows_kafkas_truncate_to_end_offset():
    follower = MemoryRaftLog()
    fill(follower, [1, 1, 2, 2, 2])  # an unreplicated tail of epoch 2 at 2-4
    # The leader never had epoch 2: it answers (epoch 1, end 2); we cut back to 2.
    assert truncation_offset(follower, OffsetAndEpoch(2, 1)) == 2
    # The leader's epoch 2 ended at 3: keep the shorter of the two.
    assert truncation_offset(follower, OffsetAndEpoch(3, 2)) == 3
    # The leader's epoch 1 ran to 3 (it never had epoch 2): our epoch 1 ends at 2, which bounds it.
    assert truncation_offset(follower, OffsetAndEpoch(3, 1)) == 2
    # Epoch 0 (an empty leader log): the smaller offset.
    assert truncation_offset(follower, OffsetAndEpoch(0, 0)) == 0


def test_memory_log_loses_unflushed_appends_on_crash_and_validates_follower_batches():
    log = MemoryRaftLog()
    fill(log, [1, 1])
    log.flush()
    fill(log, [2])
    log.crash()
    assert (log.end_offset, log.last_fetched_epoch) == (2, 1)
    stray = build_batch([(None, b"x", 0)], base_offset=5, leader_epoch=1)
    with pytest.raises(RaftLogError):
        log.append_as_follower(stray, 1)
    good = build_batch([(None, b"x", 0)], base_offset=2, leader_epoch=3)
    with pytest.raises(RaftLogError):
        log.append_as_follower(good, 2)  # a batch of an epoch above the leader's
    corrupt = bytearray(good)
    corrupt[-1] ^= 1
    with pytest.raises(RaftLogError):
        log.append_as_follower(bytes(corrupt), 3)
    assert log.append_as_follower(good, 3).last_offset == 2


def test_trimming_keeps_the_epoch_covering_the_new_start():
    log = MemoryRaftLog()
    fill(log, [1, 1, 2, 2, 3])
    log.flush()
    log.create_snapshot(OffsetAndEpoch(3, 2), b"s")
    log.delete_before_snapshot(OffsetAndEpoch(3, 2))
    assert log.epoch_entries() == [(2, 3), (3, 4)]
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(3, 2)  # before the trimmed start: the snapshot
    assert log.read(3, 1)[:8] == (3).to_bytes(8, "big")
    with pytest.raises(RaftLogError):
        log.read(2, 100)
    log.install_snapshot(OffsetAndEpoch(9, 4), b"t")
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch) == (9, 9, 4)
    assert log.latest_snapshot_id() == log.earliest_snapshot_id() == OffsetAndEpoch(9, 4)


def test_quorum_state_file_is_kafkas_json_written_atomically(tmp_path):
    store = FileQuorumStateStore(tmp_path / "quorum-state")
    assert store.read() is None
    store.write(ElectionState(7, leader_id=2, voted_id=3))
    text = (tmp_path / "quorum-state").read_text()
    assert json.loads(text) == {"leaderId": 2, "leaderEpoch": 7, "votedId": 3,
                                "votedDirectoryId": "AAAAAAAAAAAAAAAAAAAAAA", "data_version": 1}
    assert list(json.loads(text)) == ["leaderId", "leaderEpoch", "votedId", "votedDirectoryId", "data_version"]
    assert [p.name for p in tmp_path.iterdir()] == ["quorum-state"]  # no temporary file left behind
    assert store.read() == ElectionState(7, 2, 3)
    store.write(ElectionState(8))
    assert json.loads((tmp_path / "quorum-state").read_text())["leaderId"] == -1
    assert store.read() == ElectionState(8, None, None)


def test_quorum_state_file_reads_kafkas_version_0_and_refuses_unknown_versions(tmp_path):
    path = tmp_path / "quorum-state"
    path.write_text('{"clusterId":"","leaderId":1,"leaderEpoch":4,"votedId":-1,"appliedOffset":0,'
                    '"currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}')
    assert FileQuorumStateStore(path).read() == ElectionState(4, leader_id=1, voted_id=None)
    path.write_text('{"leaderId":1,"leaderEpoch":4,"votedId":-1,"data_version":7}')
    with pytest.raises(QuorumStateError):
        FileQuorumStateStore(path).read()
    path.write_text("not json")
    with pytest.raises(QuorumStateError):
        FileQuorumStateStore(path).read()
