"""The ``s3`` backend against a real SeaweedFS: refused credentials, a missing bucket, a server that goes away
mid-copy, and the objects it leaves, as seen by a plain S3 listing."""

from __future__ import annotations

import os
import threading
import uuid

import attrs
import obstore
import pytest

from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import IndexType, RemoteLogSegmentId, RemoteResourceNotFoundError, RemoteStorageError
from josef.testing.remote_storage import segment_metadata, write_segment
from josef_storage_tiered.plugin import s3
from josef_storage_tiered.s3 import S3Settings
from josef_storage_tiered.testing import SeaweedS3

MiB = 1024 * 1024
TP = TopicPartition("orders", 0)
#: A call that cannot reach the server gives up after 1 s of retries (the default is 2 minutes).
SHORT_TIMEOUTS = {"storage.s3.api.call.timeout": "1000", "storage.s3.api.call.attempt.timeout": "5000"}


def copied(rsm, directory, **segment):
    files = write_segment(directory, **segment)
    metadata = segment_metadata(RemoteLogSegmentId.generate(uuid.uuid4(), TP), files)
    rsm.copy_log_segment_data(metadata, files.data)
    return metadata, files


def refused(call) -> RemoteStorageError:
    """The RemoteStorageError a call raises, which must not claim the segment is gone."""
    with pytest.raises(RemoteStorageError) as raised:
        call()
    assert not isinstance(raised.value, RemoteResourceNotFoundError), raised.value
    return raised.value


def test_objects_are_laid_out_per_segment_under_the_key_prefix(seaweedfs, s3_bucket, tmp_path):
    settings = seaweedfs.rsm_settings(s3_bucket, {"key.prefix": "cluster-1/"})
    metadata, files = copied(s3(settings), tmp_path)
    listed = {item["path"]: item["size"] for batch in obstore.list(S3Settings.parse(settings).store())
              for item in batch}
    stem = S3Settings.parse(settings).key_prefix + "orders-"
    assert all(path.startswith(stem) for path in listed)
    log_key = [path for path in listed if path.endswith(".log")]
    assert len(log_key) == 1 and listed[log_key[0]] == len(files.log)
    assert sorted(path.rsplit(".", 1)[1] for path in listed) == [
        "index", "leader_epoch_checkpoint", "log", "snapshot", "timeindex", "txnindex"]


def test_a_fetch_from_the_end_of_the_object_is_empty(seaweedfs, s3_bucket, tmp_path):
    rsm = s3(seaweedfs.rsm_settings(s3_bucket))
    metadata, files = copied(rsm, tmp_path, log_bytes=100)
    assert rsm.fetch_log_segment(metadata, 100) == b""  # S3 answers 416 there
    assert rsm.fetch_log_segment(metadata, 500, 600) == b""
    assert rsm.fetch_log_segment(metadata, 99) == files.log[99:]
    empty, _ = copied(rsm, tmp_path / "empty", log_bytes=0)
    assert rsm.fetch_log_segment(empty, 0) == b""
    assert rsm.fetch_log_segment(empty, 0, 10) == b""


@pytest.mark.parametrize("wrong", ["secret", "access key"])
def test_refused_credentials_name_the_access_key_and_the_bucket(seaweedfs, s3_bucket, tmp_path, wrong):
    good = s3(seaweedfs.rsm_settings(s3_bucket))
    metadata, files = copied(good, tmp_path / "good")
    key = "josef-nobody" if wrong == "access key" else seaweedfs.access_key
    rsm = s3(seaweedfs.rsm_settings(s3_bucket, {"storage.aws.access.key.id": key,
                                                "storage.aws.secret.access.key": "wrong-secret"}))
    for call in (lambda: rsm.copy_log_segment_data(metadata, files.data),
                 lambda: rsm.fetch_log_segment(metadata, 0), lambda: rsm.fetch_index(metadata, IndexType.OFFSET),
                 lambda: rsm.delete_log_segment_data(metadata)):
        message = str(refused(call))
        assert f"{seaweedfs.endpoint} refused access key {key!r} (rsm.config.storage.aws.access.key.id, " \
               f"rsm.config.storage.aws.secret.access.key) for bucket {s3_bucket!r}" in message
        assert "wrong-secret" not in message
    assert good.fetch_log_segment(metadata, 0) == files.log  # the refused delete deleted nothing


def test_a_missing_bucket_is_an_error_naming_it_not_a_missing_segment(seaweedfs, s3_bucket, tmp_path):
    missing = f"{s3_bucket}-missing"
    rsm = s3(seaweedfs.rsm_settings(missing))
    files = write_segment(tmp_path)
    metadata = segment_metadata(RemoteLogSegmentId.generate(uuid.uuid4(), TP), files)
    for call in (lambda: rsm.copy_log_segment_data(metadata, files.data), lambda: rsm.fetch_log_segment(metadata, 0),
                 lambda: rsm.fetch_index(metadata, IndexType.TRANSACTION),
                 lambda: rsm.delete_log_segment_data(metadata)):
        message = str(refused(call))
        assert (f"bucket {missing!r} does not exist at {seaweedfs.endpoint} "
                "(set by rsm.config.storage.s3.bucket.name)") in message
    assert seaweedfs.request("HEAD", f"/{missing}")[0] == 404  # and no upload created it
    assert seaweedfs.request("HEAD", f"/{s3_bucket}")[0] == 200


def test_the_server_checks_signatures(seaweedfs, s3_bucket):
    assert seaweedfs.request("GET", f"/{s3_bucket}")[0] == 200
    assert seaweedfs.request("GET", f"/{s3_bucket}", secret_key="wrong-secret")[0] == 403
    assert seaweedfs.request("GET", f"/{s3_bucket}", access_key="josef-nobody")[0] == 403


def test_a_server_stopped_mid_copy_fails_the_calls_and_a_new_copy_works_after_it_is_back(
        seaweedfs: SeaweedS3, s3_bucket, tmp_path):
    """The copy reads its .log from a FIFO, so the test decides when the server dies: after the indexes are
    stored and more than one 5 MiB part of the .log has been read (the multipart upload is under way), before the
    rest of it exists. Every call then fails with a RemoteStorageError within the call timeout, none hangs."""
    rsm = s3(seaweedfs.rsm_settings(s3_bucket, {**SHORT_TIMEOUTS,
                                                "storage.s3.multipart.upload.part.size": str(5 * MiB)}))
    files = write_segment(tmp_path / "segment", log_bytes=12 * MiB)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    metadata = segment_metadata(RemoteLogSegmentId.generate(uuid.uuid4(), TP), files)
    failures: list[BaseException] = []

    def copy() -> None:
        try:
            rsm.copy_log_segment_data(metadata, attrs.evolve(files.data, log_segment=fifo))
        except BaseException as exc:
            failures.append(exc)

    copier = threading.Thread(target=copy)
    copier.start()
    with open(fifo, "wb") as pipe:  # opens once the copy reads the .log: every index is stored by then
        assert rsm.fetch_index(metadata, IndexType.OFFSET) == files.indexes[IndexType.OFFSET]
        pipe.write(files.log[:6 * MiB])  # returns once the copy has read all but the pipe's buffer of it
        seaweedfs.kill()
        try:
            pipe.write(files.log[6 * MiB:])
        except BrokenPipeError:
            pass  # the copy gave up before reading the rest
    copier.join(timeout=120)
    assert not copier.is_alive(), "the copy hangs on a stopped server"
    [failure] = failures
    assert isinstance(failure, RemoteStorageError) and not isinstance(failure, RemoteResourceNotFoundError)
    assert f"bucket {s3_bucket} at {seaweedfs.endpoint}" in str(failure)
    for call in (lambda: rsm.fetch_log_segment(metadata, 0, 99), lambda: rsm.delete_log_segment_data(metadata)):
        assert f"in bucket {s3_bucket} at {seaweedfs.endpoint} failed" in str(refused(call))

    seaweedfs.start()  # same ports, same data directory
    assert rsm.fetch_index(metadata, IndexType.OFFSET) == files.indexes[IndexType.OFFSET]  # stored before the kill
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_log_segment(metadata, 0)
    rsm.delete_log_segment_data(metadata)  # what the caller does with a failed copy: some objects are not there
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_index(metadata, IndexType.OFFSET)
    again = segment_metadata(RemoteLogSegmentId.generate(metadata.segment_id.topic_id, TP), files)
    rsm.copy_log_segment_data(again, files.data)
    assert rsm.fetch_log_segment(again, 0) == files.log
