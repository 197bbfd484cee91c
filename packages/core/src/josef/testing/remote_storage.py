"""The remote storage contract suite: what every :class:`josef.remote_storage.RemoteStorageManager` must do.

A backend runs it against itself with a test module that subclasses
:class:`RemoteStorageContract` and gives it a :class:`RemoteStorageHarness`,
the little only the backend knows (how to build one over an empty store, and
how to make it upload in small parts)::

    from josef.testing.remote_storage import RemoteStorageContract

    class TestMyBackendContract(RemoteStorageContract):
        @pytest.fixture
        def remote_storage_harness(self, tmp_path):
            return MyHarness(tmp_path)

The tests use only :mod:`josef.remote_storage`, so they hold for any
backend; object layout, settings and error messages belong in the backend's
own tests. The class is not named ``Test*``: pytest collects it only through
a backend's subclass. :func:`write_segment` and :func:`segment_metadata`
build the segments these tests copy, and serve backends' own tests too.

Segments here are random bytes, not record batches: a backend moves bytes
and must never look inside them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import attrs
import pytest

from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFoundError,
    RemoteStorageManager,
)

__all__ = ["RemoteStorageContract", "RemoteStorageHarness", "SegmentFiles", "TP", "segment_metadata",
           "write_segment"]

TP = TopicPartition("orders", 0)
#: A leader-epoch checkpoint as ``leader-epoch-checkpoint`` holds it: version, count, then ``epoch start-offset``.
LEADER_EPOCHS = b"0\n2\n0 0\n3 40\n"


class RemoteStorageHarness(Protocol):
    """What the suite needs of a backend."""

    #: Bytes of a segment that spans several upload parts of a backend made with ``start(small_parts=True)``.
    large_segment_bytes: int

    def start(self, *, small_parts: bool = False) -> RemoteStorageManager:
        """A backend over this test's store, empty when the test begins (every call of one test: the same store).

        ``small_parts``: configured with the smallest upload part (or chunk)
        size it allows, so that :attr:`large_segment_bytes` take several.
        """


@attrs.frozen
class SegmentFiles:
    """A segment written to local files for a copy, and the bytes each remote object must then hold."""

    data: LogSegmentData
    log: bytes
    indexes: dict[IndexType, bytes]


def write_segment(directory: Path, *, start_offset: int = 0, log_bytes: int = 4096, seed: int = 0,
                  transaction_index: bool | bytes = True) -> SegmentFiles:
    """Write a segment's files (random bytes) under ``directory``, as a log's rolled segment has them.

    ``transaction_index``: True, a ``.txnindex`` of one random 34-byte entry;
    False, none (a segment without aborted transactions); bytes, those.
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"{start_offset:020d}-{seed}"
    contents: dict[IndexType, bytes] = {
        IndexType.OFFSET: rng.randbytes(8 * 16),
        IndexType.TIMESTAMP: rng.randbytes(12 * 16),
        IndexType.PRODUCER_SNAPSHOT: rng.randbytes(90),
        IndexType.LEADER_EPOCH: LEADER_EPOCHS,
    }
    if transaction_index is not False:
        contents[IndexType.TRANSACTION] = rng.randbytes(34) if transaction_index is True else bytes(transaction_index)
    log = rng.randbytes(log_bytes)
    paths = {IndexType.OFFSET: ".index", IndexType.TIMESTAMP: ".timeindex", IndexType.TRANSACTION: ".txnindex",
             IndexType.PRODUCER_SNAPSHOT: ".snapshot"}
    for index_type, suffix in paths.items():
        if index_type in contents:
            stem.with_suffix(suffix).write_bytes(contents[index_type])
    stem.with_suffix(".log").write_bytes(log)
    data = LogSegmentData(
        log_segment=stem.with_suffix(".log"), offset_index=stem.with_suffix(".index"),
        time_index=stem.with_suffix(".timeindex"),
        transaction_index=stem.with_suffix(".txnindex") if IndexType.TRANSACTION in contents else None,
        producer_snapshot=stem.with_suffix(".snapshot"), leader_epoch_index=LEADER_EPOCHS)
    return SegmentFiles(data, log, contents)


def segment_metadata(segment_id: RemoteLogSegmentId, files: SegmentFiles, *, start_offset: int = 0,
                     end_offset: int | None = None) -> RemoteLogSegmentMetadata:
    """The remote log metadata of a copy of ``files`` under ``segment_id``."""
    return RemoteLogSegmentMetadata(
        segment_id=segment_id, start_offset=start_offset,
        end_offset=start_offset + 99 if end_offset is None else end_offset, max_timestamp_ms=1_800_000_000_000,
        broker_id=1, event_timestamp_ms=1_800_000_000_000, segment_size_in_bytes=len(files.log),
        segment_leader_epochs={0: start_offset})


class RemoteStorageContract:
    """The contract suite; subclass it with a ``remote_storage_harness`` fixture (see the module's docstring)."""

    @pytest.fixture
    def rsm(self, remote_storage_harness: RemoteStorageHarness) -> Iterator[RemoteStorageManager]:
        rsm = remote_storage_harness.start()
        yield rsm
        rsm.close()

    @pytest.fixture
    def topic_id(self) -> uuid.UUID:
        return uuid.uuid4()

    def copy(self, rsm: RemoteStorageManager, directory: Path, topic_id: uuid.UUID, *, tp: TopicPartition = TP,
             start_offset: int = 0, **segment: object) -> tuple[RemoteLogSegmentMetadata, SegmentFiles]:
        files = write_segment(directory, start_offset=start_offset, **segment)  # type: ignore[arg-type]
        metadata = segment_metadata(RemoteLogSegmentId.generate(topic_id, tp), files, start_offset=start_offset)
        custom = rsm.copy_log_segment_data(metadata, files.data)
        assert custom is None or isinstance(custom, bytes)
        return attrs.evolve(metadata, custom_metadata=custom), files

    def assert_gone(self, rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> None:
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.fetch_log_segment(metadata, 0)
        for index_type in IndexType:
            with pytest.raises(RemoteResourceNotFoundError):
                rsm.fetch_index(metadata, index_type)

    # Copy and fetch -------------------------------------------------------------------------------------------------

    def test_a_copied_segment_reads_back_whole(self, rsm, remote_storage_harness, tmp_path, topic_id):
        metadata, files = self.copy(rsm, tmp_path, topic_id, log_bytes=10_000)
        whole = rsm.fetch_log_segment(metadata, 0)
        assert isinstance(whole, bytes)
        assert whole == files.log
        assert rsm.fetch_log_segment(metadata, 0, None) == files.log
        later = remote_storage_harness.start()  # another broker, or this one restarted: the store is what counts
        try:
            assert later.fetch_log_segment(metadata, 0) == files.log
            assert later.fetch_index(metadata, IndexType.OFFSET) == files.indexes[IndexType.OFFSET]
        finally:
            later.close()

    def test_ranges_include_their_end_and_stop_at_the_segments_end(self, rsm, tmp_path, topic_id):
        metadata, files = self.copy(rsm, tmp_path, topic_id, log_bytes=5000)
        log, last = files.log, len(files.log) - 1
        assert rsm.fetch_log_segment(metadata, 100, 199) == log[100:200]
        assert rsm.fetch_log_segment(metadata, 0, 0) == log[:1]
        assert rsm.fetch_log_segment(metadata, last, last) == log[last:]
        assert rsm.fetch_log_segment(metadata, 4000) == log[4000:]
        assert rsm.fetch_log_segment(metadata, 4000, None) == log[4000:]
        assert rsm.fetch_log_segment(metadata, 4000, last) == log[4000:]
        assert rsm.fetch_log_segment(metadata, 4000, last + 1000) == log[4000:]
        assert rsm.fetch_log_segment(metadata, last, None) == log[last:]

    def test_every_index_reads_back(self, rsm, tmp_path, topic_id):
        metadata, files = self.copy(rsm, tmp_path, topic_id, transaction_index=True)
        assert set(files.indexes) == set(IndexType)
        for index_type in IndexType:
            assert rsm.fetch_index(metadata, index_type) == files.indexes[index_type], index_type

    def test_a_segment_copied_without_a_transaction_index_has_none(self, rsm, tmp_path, topic_id):
        metadata, files = self.copy(rsm, tmp_path, topic_id, transaction_index=False)
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.fetch_index(metadata, IndexType.TRANSACTION)
        assert rsm.fetch_index(metadata, IndexType.OFFSET) == files.indexes[IndexType.OFFSET]
        assert rsm.fetch_log_segment(metadata, 0) == files.log
        rsm.delete_log_segment_data(metadata)  # one of its objects was never there: still no error
        self.assert_gone(rsm, metadata)

    def test_empty_companion_files_read_back_empty(self, rsm, tmp_path, topic_id):
        files = write_segment(tmp_path, transaction_index=b"")
        files.data.time_index.write_bytes(b"")
        metadata = segment_metadata(RemoteLogSegmentId.generate(topic_id, TP), files)
        rsm.copy_log_segment_data(metadata, files.data)
        assert rsm.fetch_index(metadata, IndexType.TIMESTAMP) == b""
        assert rsm.fetch_index(metadata, IndexType.TRANSACTION) == b""
        assert rsm.fetch_log_segment(metadata, 0) == files.log

    def test_a_segment_never_copied_is_not_found(self, rsm, tmp_path, topic_id):
        files = write_segment(tmp_path)
        self.assert_gone(rsm, segment_metadata(RemoteLogSegmentId.generate(topic_id, TP), files))

    def test_a_large_segment_in_several_parts_round_trips(self, remote_storage_harness, tmp_path, topic_id):
        rsm = remote_storage_harness.start(small_parts=True)
        try:
            size = remote_storage_harness.large_segment_bytes
            metadata, files = self.copy(rsm, tmp_path, topic_id, log_bytes=size, seed=7)
            assert rsm.fetch_log_segment(metadata, 0) == files.log
            middle = size // 2
            assert rsm.fetch_log_segment(metadata, middle - 1000, middle + 1000) == files.log[middle - 1000:middle + 1001]
            assert rsm.fetch_log_segment(metadata, size - 10) == files.log[-10:]
        finally:
            rsm.close()

    # Identity of copies ---------------------------------------------------------------------------------------------

    def test_two_copies_of_the_same_offsets_do_not_collide(self, rsm, tmp_path, topic_id):
        first, first_files = self.copy(rsm, tmp_path / "a", topic_id, start_offset=100, seed=1)
        second, second_files = self.copy(rsm, tmp_path / "b", topic_id, start_offset=100, seed=2)
        assert first_files.log != second_files.log
        assert rsm.fetch_log_segment(first, 0) == first_files.log
        assert rsm.fetch_log_segment(second, 0) == second_files.log
        rsm.delete_log_segment_data(first)
        self.assert_gone(rsm, first)
        assert rsm.fetch_log_segment(second, 0) == second_files.log
        assert rsm.fetch_index(second, IndexType.OFFSET) == second_files.indexes[IndexType.OFFSET]

    def test_a_recreated_topic_does_not_see_the_old_topics_objects(self, rsm, tmp_path, topic_id):
        old, files = self.copy(rsm, tmp_path, topic_id)
        new_id = attrs.evolve(old.segment_id, topic_id=uuid.uuid4())  # same name, partition, offsets and segment id
        new = attrs.evolve(old, segment_id=new_id)
        self.assert_gone(rsm, new)
        rsm.delete_log_segment_data(new)
        assert rsm.fetch_log_segment(old, 0) == files.log

    # Delete ---------------------------------------------------------------------------------------------------------

    def test_a_deleted_segment_is_not_found(self, rsm, tmp_path, topic_id):
        metadata, _ = self.copy(rsm, tmp_path, topic_id)
        rsm.delete_log_segment_data(metadata)
        self.assert_gone(rsm, metadata)

    def test_deleting_twice_or_what_was_never_copied_is_fine(self, rsm, tmp_path, topic_id):
        metadata, _ = self.copy(rsm, tmp_path, topic_id)
        rsm.delete_log_segment_data(metadata)
        rsm.delete_log_segment_data(metadata)
        never = segment_metadata(RemoteLogSegmentId.generate(topic_id, TP), write_segment(tmp_path / "never"))
        rsm.delete_log_segment_data(never)
        self.assert_gone(rsm, metadata)

    # Threads --------------------------------------------------------------------------------------------------------

    def test_concurrent_copies_and_fetches_from_threads(self, rsm, tmp_path, topic_id):
        """The tiered storage's copier and reader pools call one backend from many threads at once."""
        jobs = [(TopicPartition("orders", n % 3), 1000 * n, n) for n in range(8)]

        def copy(job: tuple[TopicPartition, int, int]) -> tuple[RemoteLogSegmentMetadata, SegmentFiles]:
            tp, start, seed = job
            return self.copy(rsm, tmp_path / str(seed), topic_id, tp=tp, start_offset=start, seed=seed,
                             log_bytes=20_000 + seed)

        with ThreadPoolExecutor(8) as pool:
            copied = list(pool.map(copy, jobs))
            read = list(pool.map(lambda job: rsm.fetch_log_segment(job[0], 0), copied))
        assert read == [files.log for _, files in copied]
        assert len({files.log for _, files in copied}) == len(jobs)
