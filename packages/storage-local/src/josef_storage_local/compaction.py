"""One cleaning pass of a compacted log, Kafka's ``Cleaner.doClean``: build the offset map, rewrite segment groups.

Works on a :class:`CleaningPlan` that the log hands out under its lock
(segments to read through descriptors of the cleaner's own, so retention,
truncation or a move meanwhile cannot pull files from under it) and writes
each group of segments into ``<base>.*.cleaned`` files, which the log then
swaps in under its lock (:meth:`josef_storage_local.log.LocalLog.clean`).

The rules are Kafka 4's (``LogCleaner.scala``, ``MemoryRecords.filterTo``):

* a record stays if it is the latest of its key in the offset map of the
  dirty section (or lies past what the map covers); records without a key
  go (Kafka counts them as invalid);
* a tombstone stays until its batch's delete horizon: the first cleaning
  that keeps a tombstone (or a removable transaction marker) rewrites the
  batch with ``deleteHorizonMs = now + delete.retention.ms`` in its base
  timestamp and the delete-horizon attribute bit (KIP-534);
* data of aborted transactions goes; an ABORT marker stays while data of
  its transaction remains, a COMMIT marker while the cleaning saw data of
  its transaction, and a removable marker only past its delete horizon;
* the last batch of every producer the broker knows stays, emptied if
  nothing in it is kept, so the producer's sequence and epoch survive
  (``BatchRetention.RETAIN_EMPTY``).

Offsets never change: a kept batch keeps its base offset and last offset
delta; kept records are copied byte for byte and only a batch that lost
records (or gains a delete horizon) is re-sealed, in its own codec.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import crc32c
from josef.log import AbortedTxn, CleanerStats
from josef.protocol.codecs import Compression, compress
from josef.protocol.record_scan import batch_body, scan_keys, scan_records, with_timestamp_delta
from josef.protocol.records import (
    ABORT_MARKER,
    COMMIT_MARKER,
    CONTROL_BIT,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    CorruptRecordError,
)

from josef_storage_local.files import write_all
from josef_storage_local.index import OffsetIndex, TimeIndex
from josef_storage_local.offset_map import OffsetMap
from josef_storage_local.segment import INT32_MAX, IndexPlan, Segment, file_name
from josef_storage_local.txn_index import SUFFIX as TXN_INDEX_SUFFIX
from josef_storage_local.txn_index import encode as encode_txn

#: Attributes bit 6: the base timestamp is the batch's delete horizon (KIP-534).
DELETE_HORIZON_BIT = 0x40
CLEANED_SUFFIX = ".cleaned"
#: The cleaned files of a segment; the ``.log`` is renamed last, so it commits the swap.
CLEANED_FILES = (".index", ".timeindex", TXN_INDEX_SUFFIX, ".log")
#: Kafka's default share of log.cleaner.dedupe.buffer.size for one thread, for direct calls of clean().
DEFAULT_MAP_CAPACITY = int(134217728 // 24 * 0.9)
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiibI")
_CONTROL_TYPE = struct.Struct(">h")


class CleaningAborted(Exception):
    """The log was closed, deleted, moved, truncated or the cleaner stopped: the pass is given up, nothing changed."""


@attrs.frozen
class CleanerOptions:
    """What the storage's cleaner threads give a pass: map size, read size, throttle and a way to stop it."""

    map_capacity: int = DEFAULT_MAP_CAPACITY
    read_bytes: int = 1 << 20
    #: Called with bytes read or written; sleeps to keep log.cleaner.io.max.bytes.per.second.
    throttle: Callable[[int], None] = lambda n: None
    #: True when the pass must stop (the storage closes).
    stopped: Callable[[], bool] = lambda: False
    #: Told the keys the pass's offset map holds and its capacity, once built (the cleaner's buffer utilization).
    map_used: Callable[[int, int], None] = lambda used, capacity: None


@attrs.frozen
class SourceSegment:
    """A segment as the pass reads it: the log's object (compared at swap time) and a descriptor of the pass's own."""

    segment: Segment
    fd: int
    size: int
    base_offset: int
    #: The next segment's base offset: what this one may hold is below it.
    next_offset: int
    txn_entries: int


@attrs.define
class CleaningPlan:
    """What the log hands the pass under its lock: what to read, up to where, with which rules."""

    dir: Path
    #: Segments from the log's first to the last one below ``end``.
    segments: list[SourceSegment]
    first_dirty: int
    #: The first offset never cleaned: last stable offset, active segment, min.compaction.lag.ms.
    end: int
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    segment_index_bytes: int
    index_interval_bytes: int
    #: Aborted transactions whose markers are below ``end``, by marker.
    aborted: list[AbortedTxn]
    #: Per producer id: (offset of its last data batch or None, epoch), from the broker's producer state.
    producers: dict[int, tuple[int | None, int]]
    #: The log's truncation count when planned: a swap after another truncation is given up.
    generation: int

    def close(self) -> None:
        for source in self.segments:
            os.close(source.fd)


@attrs.define
class CleanedSegment:
    """A group's rewrite, written to ``<base>.*.cleaned`` and fsynced, waiting for its swap."""

    base_offset: int
    replaces: list[SourceSegment]
    size: int
    #: The smallest delete horizon written into a kept batch; -1 when none.
    delete_horizon: int


@attrs.define
class Counters:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0

    def stats(self, cleaned_to: int, started: float) -> CleanerStats:
        return CleanerStats(self.bytes_read, self.bytes_written, self.records_read, self.records_written,
                            cleaned_to, time.monotonic() - started)


class CleanedTxns:
    """Kafka's ``CleanedTransactionMetadata``: which batches of transactions a pass may drop, in offset order.

    One for the offset map, one carried through every group of the rewrite
    (Kafka 4 carries it between groups, so a transaction spanning two
    groups is judged as a whole).
    """

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        #: Not yet reached, by first offset (Kafka's min-heap, here sorted once).
        self._pending = sorted(set(aborted), key=lambda txn: txn.first_offset)
        self._next = 0
        self._ongoing_committed: set[int] = set()
        #: Producer id -> [its aborted transaction, whether a batch of it was seen].
        self._ongoing_aborted: dict[int, list] = {}
        #: Index entries of the ABORT markers kept because data of their transaction was seen, for the
        #: group being rewritten (taken by its writer).
        self.kept: list[AbortedTxn] = []

    def _consume_up_to(self, offset: int) -> None:
        pending = self._pending
        while self._next < len(pending) and pending[self._next].first_offset <= offset:
            txn = pending[self._next]
            self._next += 1
            self._ongoing_aborted.setdefault(txn.producer_id, [txn, False])

    def on_control_batch(self, producer_id: int, last_offset: int, marker: int) -> bool:
        """Whether a marker batch may go (Kafka's ``onControlBatchRead``); ``marker`` is -1 for an empty batch."""
        self._consume_up_to(last_offset)
        if marker == -1:
            return True  # emptied by an earlier cleaning
        if marker == ABORT_MARKER:
            ongoing = self._ongoing_aborted.pop(producer_id, None)
            if ongoing is not None and ongoing[1]:
                self.kept.append(ongoing[0])
                return False
            return True
        if marker == COMMIT_MARKER:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False

    def on_batch(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        """Whether a data batch belongs to an aborted transaction (Kafka's ``onBatchRead``)."""
        self._consume_up_to(last_offset)
        if not transactional:
            return False
        ongoing = self._ongoing_aborted.get(producer_id)
        if ongoing is not None:
            ongoing[1] = True
            return True
        self._ongoing_committed.add(producer_id)
        return False


def _batches(source: SourceSegment, options: CleanerOptions, counters: Counters) -> Iterator[tuple[bytes, int, tuple]]:
    """``(chunk, position in chunk, header fields)`` of each whole batch of a segment, read in large chunks."""
    position, size, fd = 0, source.size, source.fd
    while position < size:
        if options.stopped():
            raise CleaningAborted("the cleaner is stopping")
        chunk = os.pread(fd, min(options.read_bytes, size - position), position)
        if len(chunk) < HEADER_SIZE:
            raise CorruptRecordError(f"{source.segment.path}: a torn batch at byte {position}")
        at, end = 0, len(chunk)
        while at + HEADER_SIZE <= end:
            fields = HEADER.unpack_from(chunk, at)
            batch_size = fields[1] + LOG_OVERHEAD
            if at + batch_size > end:
                break
            yield chunk, at, fields
            at += batch_size
        if at == 0:  # one batch larger than a chunk: read it whole
            batch_size = HEADER.unpack_from(chunk, 0)[1] + LOG_OVERHEAD
            chunk = os.pread(fd, batch_size, position)
            if len(chunk) < batch_size:
                raise CorruptRecordError(f"{source.segment.path}: a torn batch at byte {position}")
            yield chunk, 0, HEADER.unpack_from(chunk, 0)
            at = batch_size
        position += at
        counters.bytes_read += at
        options.throttle(at)


def _control_marker(chunk: bytes, at: int, fields: tuple) -> int:
    """ABORT_MARKER or COMMIT_MARKER from the key of a control batch's record; -1 when it has none."""
    if fields[12] == 0:
        return -1
    body, start, end, count = batch_body(chunk, at)
    records = scan_records(body, start, end, count)
    key = records[0][2]
    return _CONTROL_TYPE.unpack_from(key, 2)[0] if key is not None and len(key) >= 4 else -2


def build_offset_map(plan: CleaningPlan, offsets: OffsetMap, options: CleanerOptions, counters: Counters) -> int:
    """Map every key of the dirty section to its latest offset; returns where the map ends (Kafka's ``buildOffsetMap``).

    Aborted transactional data and markers are not mapped. The map ends
    before the first batch that would overflow it, at a batch boundary, or
    at ``plan.end``.
    """
    start, end = plan.first_dirty, plan.end
    txns = CleanedTxns(plan.aborted)
    mapped_to = start
    table, capacity = offsets.offsets, offsets.capacity
    for source in plan.segments:
        if source.next_offset <= start:
            continue
        for chunk, at, fields in _batches(source, options, counters):
            base, last = fields[0], fields[0] + fields[6]
            if last >= end:
                return mapped_to
            if last < start:
                continue
            attributes = fields[5]
            if attributes & CONTROL_BIT:
                txns.on_control_batch(fields[9], last, _control_marker(chunk, at, fields))
            elif not txns.on_batch(fields[9], last, bool(attributes & TRANSACTIONAL_BIT)) and fields[12]:
                body, rstart, rend, count = batch_body(chunk, at)
                keys = scan_keys(body, rstart, rend, count)
                counters.records_read += count
                if len(table) + count > capacity:
                    fresh = {key for _, key in keys if key is not None and key not in table}
                    if len(table) + len(fresh) > capacity and table:
                        return mapped_to
                if base >= start:
                    table.update([(key, base + delta) for delta, key in keys])
                    table.pop(None, None)  # type: ignore[call-overload]
                else:
                    for delta, key in keys:
                        if key is not None and base + delta >= start:
                            table[key] = base + delta
            mapped_to = last + 1
    return end  # every segment below the end mapped: a gap up to it is mapped too (Kafka fast-forwards)


def group_segments(segments: Sequence[SourceSegment], max_bytes: int, max_index_bytes: int) -> list[list[SourceSegment]]:
    """Consecutive segments whose rewrite fits one segment (Kafka's ``groupSegmentsBySize``)."""
    groups: list[list[SourceSegment]] = []
    rest = list(segments)
    while rest:
        group = [rest.pop(0)]
        size = group[0].size
        index_bytes = group[0].segment.offset_index.entries * OffsetIndex.ENTRY.size
        time_bytes = group[0].segment.time_index.entries * TimeIndex.ENTRY.size
        while rest:
            nxt = rest[0]
            nxt_index = nxt.segment.offset_index.entries * OffsetIndex.ENTRY.size
            nxt_time = nxt.segment.time_index.entries * TimeIndex.ENTRY.size
            if (
                size + nxt.size > max_bytes
                or index_bytes + nxt_index > max_index_bytes
                or time_bytes + nxt_time > max_index_bytes
                or nxt.next_offset - 1 - group[0].base_offset > INT32_MAX
            ):
                break
            group.append(rest.pop(0))
            size += nxt.size
            index_bytes += nxt_index
            time_bytes += nxt_time
        groups.append(group)
    return groups


def _seal(fields: tuple, attributes: int, base_timestamp: int, max_timestamp: int, count: int, records: bytes) -> bytes:
    """A batch with ``fields``' offsets, producer and epoch, holding ``records``: the CRC-32C recomputed."""
    after_crc = _AFTER_CRC.pack(attributes, fields[6], base_timestamp, max_timestamp, fields[9], fields[10],
                                fields[11], count) + records
    return _BEFORE_CRC.pack(fields[0], len(after_crc) + 9, fields[2], 2, crc32c.crc32c(after_crc)) + after_crc


def _empty(fields: tuple, attributes: int, max_timestamp: int) -> bytes:
    """An empty batch keeping a producer's last sequence and epoch (Kafka's ``writeEmptyHeader``)."""
    return _seal(fields, attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT), NO_TIMESTAMP,
                 max_timestamp, 0, b"")


class _Writer:
    """Writes a group's kept batches to ``<base>.log.cleaned`` in large writes and plans its indexes."""

    def __init__(self, plan: CleaningPlan, base_offset: int, options: CleanerOptions, counters: Counters) -> None:
        self.path = plan.dir / (file_name(base_offset, ".log") + CLEANED_SUFFIX)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        self._buffer = bytearray()
        self._options, self._counters = options, counters
        entries = plan.segment_index_bytes
        self.index = IndexPlan(base_offset=base_offset, interval=plan.index_interval_bytes, bytes_since_entry=0,
                               max_timestamp=NO_TIMESTAMP, offset_of_max_timestamp=-1,
                               offset_room=entries // OffsetIndex.ENTRY.size,
                               time_room=entries // TimeIndex.ENTRY.size - 1, last_indexed_timestamp=NO_TIMESTAMP)

    def add(self, batch: bytes | memoryview, last_offset: int, max_timestamp: int) -> None:
        self.index.add(self.size + len(self._buffer), len(batch), last_offset, max_timestamp)
        self._buffer += batch
        if len(self._buffer) >= self._options.read_bytes:
            self._write()

    def _write(self) -> None:
        write_all(self.fd, self._buffer, self.size)
        self.size += len(self._buffer)
        self._counters.bytes_written += len(self._buffer)
        self._options.throttle(len(self._buffer))
        self._buffer.clear()

    def finish(self, kept_txns: Sequence[AbortedTxn]) -> None:
        """Write what is buffered, the indexes (sealed: the max timestamp last) and the aborted transactions; fsync all."""
        try:
            self._write()
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
        index = self.index
        time_entries = bytearray(index.time_entries)
        if index.max_timestamp > index.last_indexed_timestamp:
            time_entries += TimeIndex.ENTRY.pack(index.max_timestamp, index.offset_of_max_timestamp - index.base_offset)
        # The transaction index is written even when empty, so that a crash in the swap never
        # leaves it unclear whether a file without suffix is the old segment's or the rewrite's.
        parts = {".index": bytes(index.offset_entries), ".timeindex": bytes(time_entries),
                 TXN_INDEX_SUFFIX: b"".join(encode_txn(txn) for txn in kept_txns)}
        for suffix, data in parts.items():
            fd = os.open(self.path.with_name(file_name(index.base_offset, suffix) + CLEANED_SUFFIX),
                         os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)


def clean_group(plan: CleaningPlan, group: Sequence[SourceSegment], offsets: OffsetMap, txns: CleanedTxns,
                options: CleanerOptions, counters: Counters) -> CleanedSegment:
    """Rewrite one group of segments into ``.cleaned`` files (Kafka's ``cleanSegments``/``cleanInto``)."""
    base = group[0].base_offset
    writer = _Writer(plan, base, options, counters)
    now, horizon_for_new = plan.now_ms, plan.now_ms + plan.delete_retention_ms
    latest, get, producers = offsets.latest_offset, offsets.offsets.get, plan.producers
    min_horizon = -1
    try:
        for source in group:
            for chunk, at, fields in _batches(source, options, counters):
                (base_offset, length, _, magic, _, attributes, last_delta, base_ts, max_ts, producer_id,
                 producer_epoch, _, count) = fields
                if magic != 2:
                    raise CorruptRecordError(f"{source.segment.path}: batch magic {magic} at offset {base_offset}")
                last_offset = base_offset + last_delta
                if last_offset >= plan.end:  # past the last stable offset: not this pass's to judge
                    writer.add(memoryview(chunk)[at : at + length + LOG_OVERHEAD], last_offset, max_ts)
                    counters.records_read += count
                    counters.records_written += count
                    continue
                control = attributes & CONTROL_BIT
                if control:
                    discardable = txns.on_control_batch(producer_id, last_offset, _control_marker(chunk, at, fields))
                    discard_records = discardable and bool(attributes & DELETE_HORIZON_BIT) and base_ts <= now
                else:
                    discardable = discard_records = txns.on_batch(producer_id, last_offset,
                                                                  bool(attributes & TRANSACTIONAL_BIT))
                # Kept even if emptied: a producer's last batch (its sequence and epoch) and the last
                # batch below the cleaning's end (so the log keeps its last offsets).
                retain_empty = last_offset + 1 == plan.end
                if producer_id >= 0 and producer_id in producers:
                    last_data, epoch = producers[producer_id]
                    retain_empty = retain_empty or ((last_offset == last_data) if last_data is not None else (
                        bool(control) and producer_epoch == epoch))
                counters.records_read += count
                if discard_records or count == 0:
                    if retain_empty:
                        writer.add(_empty(fields, attributes, max_ts), last_offset, max_ts)
                    continue
                has_horizon = attributes & DELETE_HORIZON_BIT
                if control:
                    kept_all, tombstones = True, discardable
                    records: list = []
                else:
                    body, rstart, rend, _ = batch_body(chunk, at)
                    records = scan_records(body, rstart, rend, count)
                    # Kafka's shouldRetainRecord: past the map, or the key's latest and not an expired tombstone.
                    expired = has_horizon and base_ts <= now
                    last = latest - base_offset
                    kept = [r for r in records if r[0] > last or (
                        r[2] is not None and r[0] >= get(r[2], -1) - base_offset and not (r[3] and expired))]
                    tombstones = any(r[3] for r in kept)
                    kept_all = len(kept) == len(records)
                    records = kept
                set_horizon = tombstones and not has_horizon
                if not control and not records:
                    if retain_empty:
                        writer.add(_empty(fields, attributes, max_ts), last_offset, max_ts)
                    continue
                if set_horizon or has_horizon:
                    horizon = horizon_for_new if set_horizon else base_ts
                    if tombstones and (min_horizon < 0 or horizon < min_horizon):
                        min_horizon = horizon
                if kept_all and not set_horizon:
                    writer.add(memoryview(chunk)[at : at + length + LOG_OVERHEAD], last_offset, max_ts)
                    counters.records_written += count
                    continue
                if control:  # a marker gains its delete horizon: its one record keeps its timestamp
                    body, rstart, rend, _ = batch_body(chunk, at)
                    records = scan_records(body, rstart, rend, count)
                new_base_ts = horizon_for_new if set_horizon else base_ts
                if new_base_ts == base_ts:
                    payload = b"".join(body[r[4] : r[5]] for r in records)
                else:
                    shift = base_ts - new_base_ts
                    payload = b"".join(with_timestamp_delta(body, r[4], r[5], r[1] + shift) for r in records)
                if attributes & TIMESTAMP_TYPE_BIT:
                    new_max_ts = max_ts
                else:
                    new_max_ts = base_ts + max(r[1] for r in records)
                codec = attributes & 0x07
                if codec:
                    payload = compress(Compression(codec), payload)
                new_attributes = attributes | DELETE_HORIZON_BIT if (set_horizon or has_horizon) else attributes
                writer.add(_seal(fields, new_attributes, new_base_ts, new_max_ts, len(records), payload),
                           last_offset, new_max_ts)
                counters.records_written += len(records)
        writer.finish(txns.kept)
        txns.kept = []
    except BaseException:
        remove_cleaned(plan.dir, base)
        raise
    return CleanedSegment(base, list(group), writer.size, min_horizon)


def remove_cleaned(dir: Path, base_offset: int) -> None:
    """Delete the ``.cleaned`` files of a group whose swap will not happen."""
    for suffix in CLEANED_FILES:
        (dir / (file_name(base_offset, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
