"""The object layout both backends share, seen where it lands: files under a ``local-dir`` root."""

from __future__ import annotations

import uuid

import attrs
import pytest

from josef.metadata.records import uuid_to_text
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import IndexType, RemoteLogSegmentId
from josef.testing.remote_storage import segment_metadata, write_segment
from josef_storage_tiered.object_store import SegmentLayout, describe
from josef_storage_tiered.plugin import local_dir

TOPIC_ID = uuid.UUID("aa8dc1af-80b7-4d55-915f-52663d41796c")
SEGMENT = uuid.UUID("857d8a40-979e-4340-a361-2c39973800da")


def test_keys_name_topic_id_partition_offset_and_segment_id(tmp_path):
    files = write_segment(tmp_path)
    segment_id = RemoteLogSegmentId(TOPIC_ID, TopicPartition("orders", 3), SEGMENT)
    metadata = segment_metadata(segment_id, files, start_offset=1200)
    layout = SegmentLayout("kafka/")
    stem = "kafka/orders-qo3Br4C3TVWRX1JmPUF5bA/3/00000000000000001200-hX2KQJeeQ0CjYSw5lzgA2g"
    assert uuid_to_text(TOPIC_ID) == "qo3Br4C3TVWRX1JmPUF5bA" and uuid_to_text(SEGMENT) == stem[-22:]
    assert layout.log_key(metadata) == stem + ".log"
    assert {t: layout.index_key(metadata, t) for t in IndexType} == {
        IndexType.OFFSET: stem + ".index", IndexType.TIMESTAMP: stem + ".timeindex",
        IndexType.TRANSACTION: stem + ".txnindex", IndexType.PRODUCER_SNAPSHOT: stem + ".snapshot",
        IndexType.LEADER_EPOCH: stem + ".leader_epoch_checkpoint"}
    assert layout.keys(metadata)[-1] == stem + ".log"  # written last


def test_a_local_dir_holds_one_file_per_object_and_delete_leaves_no_empty_directories(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    rsm = local_dir({"storage.root": str(root), "key.prefix": "tiered/"})
    files = write_segment(tmp_path / "local", log_bytes=3000)
    metadata = segment_metadata(RemoteLogSegmentId(TOPIC_ID, TopicPartition("orders", 0), SEGMENT), files)
    rsm.copy_log_segment_data(metadata, files.data)
    partition = root / "tiered" / "orders-qo3Br4C3TVWRX1JmPUF5bA" / "0"
    stem = "00000000000000000000-hX2KQJeeQ0CjYSw5lzgA2g"
    assert sorted(p.name for p in partition.iterdir()) == sorted(
        stem + s for s in (".log", ".index", ".timeindex", ".txnindex", ".snapshot", ".leader_epoch_checkpoint"))
    assert (partition / (stem + ".log")).read_bytes() == files.log
    assert (partition / (stem + ".leader_epoch_checkpoint")).read_bytes() == files.indexes[IndexType.LEADER_EPOCH]
    rsm.delete_log_segment_data(metadata)
    assert list(root.iterdir()) == []


def test_a_fetch_from_the_end_or_past_it_is_empty_and_a_backwards_range_is_refused(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "remote").mkdir()
    rsm = local_dir({"storage.root": str(tmp_path / "remote")})
    files = write_segment(tmp_path / "local", log_bytes=100)
    metadata = segment_metadata(RemoteLogSegmentId.generate(TOPIC_ID, TopicPartition("orders", 0)), files)
    rsm.copy_log_segment_data(metadata, files.data)
    assert rsm.fetch_log_segment(metadata, 100) == b""
    assert rsm.fetch_log_segment(metadata, 150, 200) == b""
    empty = segment_metadata(RemoteLogSegmentId.generate(TOPIC_ID, TopicPartition("orders", 0)), files)
    rsm.copy_log_segment_data(empty, attrs.evolve(files.data, log_segment=tmp_path / "empty.log"))
    assert rsm.fetch_log_segment(empty, 0) == b""
    assert rsm.fetch_log_segment(empty, 0, 10) == b""
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(metadata, 10, 9)
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(metadata, -1)


def test_s3_error_documents_are_told_in_one_line():
    error = OSError("Object at location x not found: Error performing PUT http://h/b/x in 2ms - Server returned "
                    "non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\n<Error><Code>NoSuchBucket</Code>"
                    "<Message>The specified bucket does not exist</Message></Error>\n\nDebug source:\nNotFound {\n}")
    assert describe(error) == ("Object at location x not found: Error performing PUT http://h/b/x in 2ms - Server "
                               "returned non-2xx status code: 404 Not Found: NoSuchBucket: The specified bucket "
                               "does not exist")
