"""read_committed fetches of remote data: which transaction indexes they ask remote storage for (KIP-1058)."""

import uuid

from josef.log import AbortedTxn
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import (
    IndexType,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundError,
)
from josef.segment_files import encode_aborted_txn

from josef_storage_tiered.remote_reader import IndexCache, aborted_txns

TP = TopicPartition("t", 0)


def segment(start: int, end: int, txn_index_empty: bool = False) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(uuid.uuid4(), TP), start, end, 1000, 1, 1000, 100,
                                    {0: start}, RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                                    txn_index_empty=txn_index_empty)


class TransactionIndexes:
    """A remote store holding only transaction indexes, counting what is asked of it."""

    def __init__(self, indexes: dict[uuid.UUID, bytes]) -> None:
        self.indexes = indexes
        self.fetched: list[uuid.UUID] = []

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, kind: IndexType) -> bytes:
        assert kind is IndexType.TRANSACTION
        self.fetched.append(metadata.segment_id.id)
        if metadata.segment_id.id not in self.indexes:
            raise RemoteResourceNotFoundError(f"no transaction index for {metadata.segment_id.id}")
        return self.indexes[metadata.segment_id.id]


def test_segments_known_to_have_no_aborted_transaction_cost_no_request():
    quiet = [segment(0, 99, txn_index_empty=True), segment(100, 199, txn_index_empty=True)]
    aborted = AbortedTxn(producer_id=7, first_offset=210, last_offset=250, last_stable_offset=251)
    busy = segment(200, 299)
    store = TransactionIndexes({busy.segment_id.id: encode_aborted_txn(aborted)})
    indexes = IndexCache(store, 1 << 20)
    # A read of offsets 0..99 searches on until a transaction settles past them: the first two segments are
    # passed over without a request, the third's index says the search is complete.
    assert aborted_txns(indexes, [*quiet, busy], 0, 100) == ([], True)
    assert store.fetched == [busy.segment_id.id]
    assert aborted_txns(indexes, [busy], 200, 250) == ([aborted], True)
    assert store.fetched == [busy.segment_id.id]  # cached


def test_a_transaction_index_remote_storage_lacks_is_empty_and_asked_for_once():
    old = segment(0, 99)  # metadata from before KIP-1058: the flag is false, the index may be missing
    store = TransactionIndexes({})
    indexes = IndexCache(store, 1 << 20)
    for _ in range(3):
        assert aborted_txns(indexes, [old], 0, 100) == ([], False)
    assert store.fetched == [old.segment_id.id]
