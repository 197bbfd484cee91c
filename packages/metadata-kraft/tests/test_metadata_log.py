"""The Raft log on disk: josef's partition log for the batches, Kafka's ``.checkpoint`` files for snapshots."""

import uuid

import pytest

from josef.config import ConfigError
from josef.log import LogConfig
from josef.metadata.image import MetadataImage
from josef.metadata.records import FeatureLevelRecord, PartitionRecord, TopicRecord, encode
from josef.plugins import collect, get_plugin_manager
from josef.protocol.records import build_batch
from josef.protocol.topic_partition import TopicPartition
from josef.node.server_properties import load_config
from josef_metadata_kraft.metadata_log import MetadataLog, snapshot_name
from josef_metadata_kraft.raft import OffsetAndEpoch, RaftLogError
from josef_metadata_kraft.raft.messages import leader_change_batch
from josef_metadata_kraft.snapshots import SnapshotError, build_snapshot, check_snapshot, snapshot_records

TP = TopicPartition("__cluster_metadata", 0)
CONFIG = LogConfig(segment_bytes=4096, retention_ms=-1, retention_bytes=-1)


@pytest.fixture
def storage(tmp_path):
    config = load_config(None, {"log.dirs": str(tmp_path)})
    store = collect(get_plugin_manager(), "register_log_storage", "log storage").get("local")(config)
    yield store
    store.close()


def open_log(storage):
    return MetadataLog(storage.open(TP, CONFIG))


def data_batch(base_offset, epoch, count=3):
    return build_batch([(None, encode(FeatureLevelRecord(name=f"f{base_offset + i}", feature_level=1)), 1000)
                        for i in range(count)], base_offset=base_offset, leader_epoch=epoch)


def image_of(topics):
    records = []
    for name in topics:
        topic_id = uuid.uuid4()
        records += [TopicRecord(name=name, topic_id=topic_id),
                    PartitionRecord(partition_id=0, topic_id=topic_id, replicas=(1,), isr=(1,), leader=1)]
    return MetadataImage().apply(10, records)[0]


def test_appends_epochs_and_divergence_survive_a_reopen(storage):
    log = open_log(storage)
    log.append_as_leader(leader_change_batch(base_offset=0, epoch=1, leader_id=1, voters=[1, 2, 3],
                                             granting_voters=[1, 2], timestamp_ms=1), 1)
    log.append_as_leader(data_batch(1, 1), 1)
    log.append_as_follower(data_batch(4, 3) + data_batch(7, 3), 3)
    log.flush()
    assert (log.end_offset, log.last_fetched_epoch) == (10, 3)
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(4, 1)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(4, 1)  # epoch 2 never wrote: epoch 1's end
    storage.close()
    log = open_log(storage)
    assert (log.end_offset, log.last_fetched_epoch) == (10, 3)
    assert log.read(4, 1)[:8] == (4).to_bytes(8, "big")  # whole batches from the one holding the offset
    log.truncate_to(4)
    assert (log.end_offset, log.last_fetched_epoch) == (4, 1)


@pytest.mark.parametrize("batches,epoch,message", [
    (lambda: data_batch(5, 1), 1, "starts at offset 5, expected 0"),
    (lambda: data_batch(0, 4), 3, "epoch 4 out of order"),
    (lambda: data_batch(0, 2) + data_batch(3, 1), 2, "epoch 1 out of order"),
    (lambda: data_batch(0, 1)[:-2], 1, "not whole record batches"),
    (lambda: (b := data_batch(0, 1))[:-1] + bytes([b[-1] ^ 1]), 1, "fails its CRC"),
])
def test_follower_batches_are_checked_before_anything_is_written(storage, batches, epoch, message):
    log = open_log(storage)
    with pytest.raises(RaftLogError, match=message):
        log.append_as_follower(batches(), epoch)
    assert log.end_offset == 0


def test_snapshots_trim_the_log_and_load_back(storage):
    log = open_log(storage)
    for base in range(0, 300, 3):
        log.append_as_leader(data_batch(base, 2), 2)
    image = image_of(["a", "b"])
    snapshot_id = OffsetAndEpoch(150, 2)
    log.create_snapshot(snapshot_id, build_snapshot(image, snapshot_id))
    log.delete_before_snapshot(snapshot_id)
    assert log.start_offset == 150 and log.latest_snapshot_id() == snapshot_id
    data = log.read_snapshot(snapshot_id, 0, 1 << 20)
    assert len(data) == log.snapshot_size(snapshot_id)
    rebuilt, _ = MetadataImage().apply(149, snapshot_records(data))
    assert rebuilt.topics.keys() == {"a", "b"} and rebuilt == MetadataImage().apply(149, list(image.records()))[0]
    storage.close()
    log = open_log(storage)
    assert log.latest_snapshot_id() == snapshot_id and log.start_offset == 150


def test_an_installed_snapshot_replaces_the_whole_log(storage):
    log = open_log(storage)
    log.append_as_follower(data_batch(0, 1), 1)
    snapshot_id = OffsetAndEpoch(500, 4)
    log.install_snapshot(snapshot_id, build_snapshot(image_of(["x"]), snapshot_id))
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch) == (500, 500, 4)
    log.append_as_follower(data_batch(500, 4), 4)
    assert log.end_offset == 503


def test_a_corrupt_snapshot_is_set_aside_or_refused_with_one_line(storage, tmp_path):
    log = open_log(storage)
    for base in range(0, 30, 3):
        log.append_as_leader(data_batch(base, 1), 1)
    first, second = OffsetAndEpoch(9, 1), OffsetAndEpoch(21, 1)
    for snapshot_id in (first, second):
        log.create_snapshot(snapshot_id, build_snapshot(image_of(["t"]), snapshot_id))
    log.delete_before_snapshot(first)
    storage.close()
    newest = log.dir / snapshot_name(second)
    newest.write_bytes(newest.read_bytes()[:-5])  # a torn write
    log = open_log(storage)
    assert log.latest_snapshot_id() == first  # the log still holds 9..29, so the older one will do
    assert (log.dir / (snapshot_name(second) + ".deleted")).exists()
    log.delete_before_snapshot(OffsetAndEpoch(21, 1))
    storage.close()
    oldest = log.dir / snapshot_name(first)
    oldest.write_bytes(b"\x00" * 10)
    with pytest.raises(ConfigError, match="starts at offset 21, but no readable snapshot covers"):
        open_log(storage)


def test_check_snapshot_names_what_is_wrong():
    good = build_snapshot(image_of(["t"]), OffsetAndEpoch(5, 1))
    check_snapshot(good)
    with pytest.raises(SnapshotError, match="SnapshotHeader to a SnapshotFooter"):
        check_snapshot(data_batch(0, 1))
    with pytest.raises(SnapshotError, match="partial batch"):
        check_snapshot(good[:-1])


def test_a_torn_tail_after_a_crash_is_cut_back_to_the_last_whole_batch(tmp_path):
    config = load_config(None, {"log.dirs": str(tmp_path)})
    storage = collect(get_plugin_manager(), "register_log_storage", "log storage").get("local")(config)
    log = open_log(storage)
    for base in range(0, 12, 3):
        log.append_as_leader(data_batch(base, 1), 1)
    log.flush()
    [segment] = log.dir.glob("*.log")
    with open(segment, "r+b") as f:  # the crash tore the last batch: no clean shutdown, bytes missing
        f.truncate(segment.stat().st_size - 7)
    crashed = collect(get_plugin_manager(), "register_log_storage", "log storage").get("local")(config)
    reopened = open_log(crashed)
    assert (reopened.end_offset, reopened.last_fetched_epoch) == (9, 1)
    reopened.append_as_follower(data_batch(9, 2), 2)  # the leader's batches continue it
    assert reopened.end_offset == 12
    crashed.close()
