"""Reading batches back from a remote segment: the offset index finds where to start, ranged reads fetch the bytes.

Kafka's RemoteLogReader: a fetch below the local log start reads one
remote segment, from the batch holding the fetch offset, whole batches up
to ``max_bytes`` (the first one whole whatever its size, KIP-74). The
segment's indexes are fetched once and kept in :class:`IndexCache`,
bounded by ``remote.log.index.file.cache.total.size.bytes``. Blocking: runs
in the reader threads (``remote.log.reader.threads``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from josef.log import AbortedTxn, LogDirError
from josef.protocol.records import HEADER_SIZE, BatchHeader, CorruptRecordError, batch_is_valid, iter_records
from josef.remote_storage import IndexType, RemoteLogSegmentMetadata, RemoteResourceNotFoundError, RemoteStorageError
from josef.remote_storage import RemoteStorageManager
from josef.segment_files import decode_aborted_txns, offset_for_time, position_for

#: Bytes fetched at once beyond what a read asks for, so a read rarely needs a second request for a batch's tail.
READ_AHEAD = 64 * 1024


class IndexCache:
    """Remote segments' companion files, least recently used dropped first beyond ``max_bytes``; thread-safe."""

    def __init__(self, storage: RemoteStorageManager, max_bytes: int) -> None:
        self._storage = storage
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[object, IndexType], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        #: Lookups answered from memory, fetched from remote storage, and files dropped to make room (metrics).
        self.hits = self.misses = self.evictions = 0

    def get(self, segment: RemoteLogSegmentMetadata, kind: IndexType) -> bytes:
        """The file, from memory or fetched (RemoteStorageError when the fetch fails).

        A transaction index that remote storage does not have is an empty
        one (a segment copied without, its metadata from before KIP-1058),
        and is kept as such: asked again, it costs no request.
        """
        key = (segment.segment_id.id, kind)
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return data
            self.misses += 1
        try:
            data = self._storage.fetch_index(segment, kind)
        except RemoteResourceNotFoundError:
            if kind is not IndexType.TRANSACTION:
                raise
            data = b""
        with self._lock:
            if key not in self._entries:
                self._entries[key] = data
                self._size += len(data)
            while self._size > self.max_bytes and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._size -= len(dropped)
                self.evictions += 1
        return data

    def stats(self) -> tuple[int, int, int, int, int]:
        """(files, bytes, hits, misses, evictions), read together."""
        with self._lock:
            return len(self._entries), self._size, self.hits, self.misses, self.evictions

    def forget(self, segment: RemoteLogSegmentMetadata) -> None:
        """Drop a deleted segment's files."""
        with self._lock:
            for kind in IndexType:
                dropped = self._entries.pop((segment.segment_id.id, kind), None)
                if dropped is not None:
                    self._size -= len(dropped)


def read_batches(storage: RemoteStorageManager, indexes: IndexCache, segment: RemoteLogSegmentMetadata, offset: int,
                 max_bytes: int, upper: int, min_one_batch: bool) -> bytes:
    """Whole batches of ``segment`` from the one holding ``offset``, below ``upper``, up to ``max_bytes``.

    Remote failures and corrupt data raise :class:`josef.log.LogDirError`
    (KAFKA_STORAGE_ERROR for this read alone).
    """
    try:
        index = indexes.get(segment, IndexType.OFFSET)
        position = position_for(index, segment.start_offset, offset)
        return _scan(storage, segment, position, offset, max_bytes, upper, min_one_batch)
    except (RemoteStorageError, CorruptRecordError, ValueError) as exc:
        raise LogDirError(f"reading remote segment {segment.segment_id.id} of {segment.segment_id.tp} at offset "
                          f"{offset}: {exc}") from exc


def find_timestamp(storage: RemoteStorageManager, indexes: IndexCache, segment: RemoteLogSegmentMetadata,
                   timestamp: int, start_offset: int) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the segment's first record at or after ``start_offset`` stamped >= ``timestamp``.

    Kafka's remote timestamp lookup: the time index says where to start,
    batch headers are walked from there, and only the first batch whose max
    timestamp qualifies is read whole and decoded. Failures raise
    :class:`josef.log.LogDirError`.
    """
    try:
        start = max(offset_for_time(indexes.get(segment, IndexType.TIMESTAMP), segment.start_offset, timestamp),
                    start_offset)
        position = position_for(indexes.get(segment, IndexType.OFFSET), segment.start_offset, start)
        size = segment.segment_size_in_bytes
        while position + HEADER_SIZE <= size:
            chunk = _fetch(storage, segment, position, READ_AHEAD)
            at = 0
            while at + HEADER_SIZE <= len(chunk):
                header = BatchHeader.parse(chunk, at)
                if header.magic != 2 or header.size <= HEADER_SIZE:
                    raise CorruptRecordError(f"no record batch at segment position {position + at}")
                if header.max_timestamp >= timestamp and header.last_offset >= start_offset:
                    batch = chunk[at:at + header.size]
                    if len(batch) < header.size:
                        batch = _fetch(storage, segment, position + at, header.size)
                    if not batch_is_valid(batch, 0, header):
                        raise CorruptRecordError(f"the batch at offset {header.base_offset} fails its CRC")
                    for record in iter_records(batch):
                        if record.timestamp >= timestamp and record.offset >= start_offset:
                            return record.offset, record.timestamp
                at += header.size
            position += at
    except (RemoteStorageError, CorruptRecordError, ValueError) as exc:
        raise LogDirError(f"searching remote segment {segment.segment_id.id} of {segment.segment_id.tp} for "
                          f"timestamp {timestamp}: {exc}") from exc
    return None


def _scan(storage: RemoteStorageManager, segment: RemoteLogSegmentMetadata, position: int, offset: int,
          max_bytes: int, upper: int, min_one_batch: bool) -> bytes:
    size = segment.segment_size_in_bytes
    buf = bytearray()
    at = position  # the segment position of buf[0]
    cursor = 0
    start: int | None = None  # where in buf the answer begins
    while True:
        need = cursor + HEADER_SIZE - len(buf)
        if need > 0:
            if at + len(buf) >= size:
                break
            buf += _fetch(storage, segment, at + len(buf), max(need, max_bytes + READ_AHEAD))
            continue
        header = BatchHeader.parse(buf, cursor)
        if header.magic != 2 or header.size <= HEADER_SIZE or not (
                segment.start_offset <= header.base_offset <= header.last_offset <= segment.end_offset):
            raise CorruptRecordError(f"no record batch at segment position {at + cursor}: magic {header.magic}, "
                                     f"offsets {header.base_offset}..{header.last_offset}")
        if header.base_offset >= upper:
            break
        if header.last_offset < offset:  # before the fetch offset (the index points at or below it): skip it
            at += cursor + header.size
            buf = buf[cursor + header.size:]
            cursor = 0
            continue
        if start is None:
            start = cursor
        taken = cursor - start
        if taken + header.size > max_bytes and not (taken == 0 and min_one_batch):
            break
        missing = cursor + header.size - len(buf)
        if missing > 0:
            if at + len(buf) >= size:
                raise CorruptRecordError(f"a batch at segment position {at + cursor} runs past the segment's end")
            buf += _fetch(storage, segment, at + len(buf), missing)
        if not batch_is_valid(buf, cursor, header):  # what a remote store returns is checked before it is served
            raise CorruptRecordError(f"the batch at offset {header.base_offset} fails its CRC")
        cursor += header.size
    return bytes(buf[start:cursor]) if start is not None else b""


def _fetch(storage: RemoteStorageManager, segment: RemoteLogSegmentMetadata, position: int, length: int) -> bytes:
    end = min(position + length, segment.segment_size_in_bytes) - 1
    data = storage.fetch_log_segment(segment, position, end)
    if not data:
        raise CorruptRecordError(f"remote storage returned nothing at segment position {position}")
    return data


def aborted_txns(indexes: IndexCache, segments: list[RemoteLogSegmentMetadata], start: int,
                 upper: int) -> tuple[list[AbortedTxn], bool]:
    """Aborted transactions overlapping ``[start, upper)`` from the transaction indexes of ``segments`` (in order,
    from the one holding ``start``), and whether the search is complete (Kafka's collectAbortedTransactions: it
    ends after an entry whose last stable offset reaches ``upper``)."""
    found: list[AbortedTxn] = []
    try:
        for segment in segments:
            if segment.txn_index_empty:  # KIP-1058: nothing to fetch
                continue
            for txn in decode_aborted_txns(indexes.get(segment, IndexType.TRANSACTION), segment.start_offset):
                if txn.last_offset >= start and txn.first_offset < upper:
                    found.append(txn)
                if txn.last_stable_offset >= upper:
                    return found, True
    except (RemoteStorageError, ValueError) as exc:
        raise LogDirError(f"reading remote transaction indexes of {segments[0].segment_id.tp}: {exc}") from exc
    return found, False
