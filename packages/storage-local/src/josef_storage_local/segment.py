"""One segment of a partition log: a ``.log`` file of record batches, its two sparse indexes and its aborted transactions.

The ``.log`` holds batches exactly as they were appended (wire bytes), so a
fetch is one ``pread`` of whole batches. Nothing here looks past a batch's
61-byte header on the hot paths: appends take their index entries from the
:class:`~josef.protocol.records.BatchInfo` that validation produced, reads
walk headers only. Records are decoded only by the rare timestamp lookups,
and CRCs are checked only by recovery.

Methods raise :class:`OSError` and leave the segment consistent; the log
turns the error into :class:`josef.log.LogDirError`.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import attrs
from josef.log import LogConfig
from josef.protocol.records import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    BatchInfo,
    ConsumerRecord,
    batch_is_valid,
    iter_records,
)

from josef_storage_local.epochs import LeaderEpochCache
from josef_storage_local.files import write_all
from josef_storage_local.index import OffsetIndex, TimeIndex
from josef_storage_local.txn_index import SUFFIX as TXN_INDEX_SUFFIX
from josef_storage_local.txn_index import TxnIndex

# Fields of a header unpacked with records.HEADER (a plain tuple: cheaper than BatchHeader per batch).
BASE_OFFSET, BATCH_LENGTH, LAST_OFFSET_DELTA, MAX_TIMESTAMP = 0, 1, 6, 8
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

#: Bytes read at a time when walking headers: an index entry is at most
#: index.interval.bytes (4 KiB by default) plus one batch before the batch a read wants.
SCAN_CHUNK = 16 * 1024
#: Bytes read at a time by recovery, which checks every byte's CRC anyway.
RECOVERY_CHUNK = 8 * 1024 * 1024
INT32_MAX = 2**31 - 1
SUFFIXES = (".log", ".index", ".timeindex", TXN_INDEX_SUFFIX)
DELETED_SUFFIX = ".deleted"


def file_name(base_offset: int, suffix: str) -> str:
    """Kafka's segment file name: the base offset on 20 digits."""
    return f"{base_offset:020d}{suffix}"


@attrs.define
class IndexPlan:
    """Index entries and max timestamp for batches about to be written.

    Built before the write and committed after it, so a write that fails
    leaves the segment's state untouched. Follows Kafka's rule: a batch gets
    an offset-index entry (its last offset, its position) when more than
    ``index.interval.bytes`` were written since the previous entry, and the
    time index then gets the max timestamp so far if it rose.
    """

    base_offset: int
    interval: int
    bytes_since_entry: int
    max_timestamp: int
    offset_of_max_timestamp: int
    offset_room: int
    time_room: int
    last_indexed_timestamp: int
    offset_entries: bytearray = attrs.field(factory=bytearray)
    time_entries: bytearray = attrs.field(factory=bytearray)

    def add(self, position: int, size: int, last_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, last_offset
        if self.bytes_since_entry > self.interval:
            if self.offset_room > 0:
                self.offset_entries += OffsetIndex.ENTRY.pack(
                    last_offset - self.base_offset, position
                )
                self.offset_room -= 1
            if self.time_room > 0 and self.max_timestamp > self.last_indexed_timestamp:
                relative = self.offset_of_max_timestamp - self.base_offset
                self.time_entries += TimeIndex.ENTRY.pack(self.max_timestamp, relative)
                self.time_room -= 1
                self.last_indexed_timestamp = self.max_timestamp
            self.bytes_since_entry = 0
        self.bytes_since_entry += size


class Segment:
    """The files of one segment, open, with what the log needs to know about them in memory."""

    def __init__(self, dir: Path, base_offset: int, config: LogConfig, now_ms: int) -> None:
        self.base_offset = base_offset
        #: Not read here: the log loads it (and handles a corrupt one) when it loads the segments.
        self.txn_index = TxnIndex(dir / file_name(base_offset, TXN_INDEX_SUFFIX), base_offset)
        self.path = dir / file_name(base_offset, ".log")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.offset_index = OffsetIndex(
            dir / file_name(base_offset, ".index"), base_offset, config.segment_index_bytes
        )
        self.time_index = TimeIndex(
            dir / file_name(base_offset, ".timeindex"), base_offset, config.segment_index_bytes
        )
        #: The largest batch max timestamp and the last offset of the first batch holding it.
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry()
        self.bytes_since_index_entry = 0
        #: segment.ms counts from here when the batches carry no timestamp (Kafka's ``created``).
        self.created_ms = now_ms
        jitter = min(config.segment_jitter_ms, config.segment_ms)
        self.roll_jitter_ms = random.randrange(jitter) if jitter > 0 else 0
        self._first_batch_timestamp: int | None = None
        #: Set by :meth:`close`: a flush outside the log's lock may find the segment deleted meanwhile.
        self.closed = False

    def paths(self) -> list[Path]:
        return [self.path.with_suffix(suffix) for suffix in SUFFIXES]

    # Appending -----------------------------------------------------------------

    def first_batch_timestamp(self) -> int:
        """Max timestamp of the first batch, which segment.ms counts from (Kafka's rollingBasedTimestamp); -1 if none."""
        if self._first_batch_timestamp is None:
            if self.size < HEADER_SIZE:
                return -1
            self._first_batch_timestamp = HEADER.unpack(os.pread(self.fd, HEADER_SIZE, 0))[
                MAX_TIMESTAMP
            ]
        return self._first_batch_timestamp

    def should_roll(
        self,
        config: LogConfig,
        append_bytes: int,
        max_timestamp: int,
        last_offset: int,
        now_ms: int,
    ) -> bool:
        """Kafka's ``shouldRoll``: too big, too old, an index full, or offsets beyond a 32-bit relative offset.

        An empty segment never rolls, so a batch larger than segment.bytes
        still goes into one.
        """
        if self.size == 0:
            return False
        first = self.first_batch_timestamp()
        waited = max_timestamp - first if first >= 0 else now_ms - self.created_ms
        return (
            self.size > config.segment_bytes - append_bytes
            or waited > config.segment_ms - self.roll_jitter_ms
            or self.offset_index.is_full()
            or self.time_index.is_full()
            or last_offset - self.base_offset > INT32_MAX
        )

    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: Sequence[BatchInfo],
        index_interval: int,
    ) -> None:
        """Write whole batches at the end and index them; on failure the segment is as it was."""
        start = self.size
        plan = self._plan(index_interval)
        for batch in batches:
            plan.add(start + batch.position, batch.size, batch.last_offset, batch.max_timestamp)
        offset_entries, time_entries = self.offset_index.entries, self.time_index.entries
        try:
            write_all(self.fd, data, start)
            self.offset_index.write(plan.offset_entries)
            self.time_index.write(plan.time_entries)
        except OSError:
            self.offset_index.keep(offset_entries)
            self.time_index.keep(time_entries)
            # Best effort: if even this fails, reads stop at self.size, the next write
            # overwrites the partial bytes, and recovery would cut them.
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise
        if start == 0:
            self._first_batch_timestamp = batches[0].max_timestamp
        self.size = start + len(data)
        self._commit(plan)

    def _plan(self, index_interval: int) -> IndexPlan:
        return IndexPlan(
            base_offset=self.base_offset,
            interval=index_interval,
            bytes_since_entry=self.bytes_since_index_entry,
            max_timestamp=self.max_timestamp,
            offset_of_max_timestamp=self.offset_of_max_timestamp,
            offset_room=self.offset_index.max_entries - self.offset_index.entries,
            time_room=self.time_index.max_entries - 1 - self.time_index.entries,
            last_indexed_timestamp=self.time_index.last_entry()[0],
        )

    def _commit(self, plan: IndexPlan) -> None:
        self.bytes_since_index_entry = plan.bytes_since_entry
        self.max_timestamp, self.offset_of_max_timestamp = (
            plan.max_timestamp,
            plan.offset_of_max_timestamp,
        )

    # Reading -------------------------------------------------------------------

    def _headers(self, position: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """``(position, header fields)`` of each batch from ``position`` on, reading chunks with pread.

        Stops at a length that cannot be a batch, which only a torn or
        corrupt file has (the caller then sees the walk end early).
        """
        end = self.size
        chunk, chunk_start = b"", position
        while position + HEADER_SIZE <= end:
            at = position - chunk_start
            if at + HEADER_SIZE > len(chunk):
                chunk, chunk_start, at = (
                    os.pread(self.fd, min(SCAN_CHUNK, end - position), position),
                    position,
                    0,
                )
                if len(chunk) < HEADER_SIZE:
                    return
            fields = HEADER.unpack_from(chunk, at)
            if fields[BATCH_LENGTH] < _MIN_BATCH_LENGTH:
                return
            yield position, fields
            position += fields[BATCH_LENGTH] + LOG_OVERHEAD

    def find(self, offset: int) -> tuple[int, tuple[int, ...]] | None:
        """Position and header of the first batch whose last offset is >= ``offset``; None if the segment ends before."""
        for position, fields in self._headers(self.offset_index.lookup(offset)):
            if fields[BASE_OFFSET] + fields[LAST_OFFSET_DELTA] >= offset:
                return position, fields
        return None

    def batch_headers(self, offset: int) -> Iterator[tuple[int, ...]]:
        """Header fields of the batches from the one holding ``offset`` to the end of the segment."""
        found = self.find(offset)
        if found is not None:
            for _, fields in self._headers(found[0]):
                yield fields

    def locate(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int,
        min_one_batch: bool,
        ends_below_max_offset: bool,
    ) -> tuple[int, int] | None:
        """``(position, size)`` of the whole batches from the one holding ``offset``, as
        :meth:`josef.log.Log.read` describes them (size 0: nothing), or None when the segment
        ends before ``offset`` (the log then asks the next one).

        ``ends_below_max_offset`` says every batch here ends below ``max_offset``
        (a fetch up to the log end), which spares looking for the batch that
        reaches it. Where the answer ends is found through the index, never by
        walking all its batches; the caller reads it with one ``pread`` or sends
        it as a file region.
        """
        found = self.find(offset)
        if found is None:
            return None
        start, fields = found
        if fields[BASE_OFFSET] + fields[LAST_OFFSET_DELTA] >= max_offset:
            return start, 0
        first_size = fields[BATCH_LENGTH] + LOG_OVERHEAD
        if first_size > max_bytes:
            return (start, first_size) if min_one_batch else (start, 0)
        end = self.size
        if not ends_below_max_offset:
            beyond = self.find(max_offset)
            if beyond is not None:
                end = beyond[0]
        if end - start > max_bytes:
            end = self._last_boundary(start, start + max_bytes)
        return start, end - start

    def _last_boundary(self, start: int, limit: int) -> int:
        """The last batch boundary at or before ``limit``: the index gets close, a short header walk the rest."""
        n = self.offset_index.count_at_most(limit, 1)
        position = max(self.offset_index.entry(n - 1)[1], start) if n else start
        for batch_position, fields in self._headers(position):
            batch_end = batch_position + fields[BATCH_LENGTH] + LOG_OVERHEAD
            if batch_end > limit:
                return batch_position
            position = batch_end
        return position

    def _records(self, position: int, fields: tuple[int, ...]) -> Iterable[ConsumerRecord]:
        return iter_records(os.pread(self.fd, fields[BATCH_LENGTH] + LOG_OVERHEAD, position))

    def find_timestamp(self, timestamp: int, log_start_offset: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record at or after ``log_start_offset`` stamped >= ``timestamp``.

        The time index gives a batch before which nothing qualifies; headers
        are walked from there and only the first batch whose max timestamp
        qualifies is decoded (Kafka's ``findOffsetByTimestamp``).
        """
        start = max(self.time_index.lookup(timestamp), log_start_offset)
        for position, fields in self._headers(self.offset_index.lookup(start)):
            if (
                fields[MAX_TIMESTAMP] >= timestamp
                and fields[BASE_OFFSET] + fields[LAST_OFFSET_DELTA] >= log_start_offset
            ):
                for record in self._records(position, fields):
                    if record.timestamp >= timestamp and record.offset >= log_start_offset:
                        return record.offset, record.timestamp
        return None

    def max_timestamp_record(self) -> tuple[int, int]:
        """``(timestamp, offset)`` of the first record holding the segment's max timestamp (one batch decoded)."""
        found = self.find(self.offset_of_max_timestamp)
        if found is not None:
            for record in self._records(*found):
                if record.timestamp == self.max_timestamp:
                    return record.timestamp, record.offset
        return self.max_timestamp, self.offset_of_max_timestamp

    # Loading, recovery, truncation ---------------------------------------------------

    def indexes_ok(self, next_offset: int | None) -> bool:
        """A cheap sanity check of the indexes (Kafka's, a little stricter); never a scan of the files.

        Missing files, sizes that are not whole entries, last entries that
        do not increase or point past the log, and an offset entry that does
        not name the batch at its position (as an untrimmed, zero-filled
        index would) fail. ``next_offset`` bounds the time index of a
        segment that is followed by another.
        """
        offsets, times = self.offset_index, self.time_index
        if self.size and not (offsets.existed and times.existed):
            return False
        if offsets.file_size % offsets.ENTRY.size or times.file_size % times.ENTRY.size:
            return False
        if offsets.entries:
            relative, position = offsets.entry(offsets.entries - 1)
            if position + HEADER_SIZE > self.size:
                return False
            if offsets.entries > 1:
                previous_relative, previous_position = offsets.entry(offsets.entries - 2)
                if previous_relative >= relative or previous_position >= position:
                    return False
            fields = HEADER.unpack(os.pread(self.fd, HEADER_SIZE, position))
            if fields[BASE_OFFSET] + fields[LAST_OFFSET_DELTA] != self.base_offset + relative:
                return False
        if times.entries:
            timestamp, relative = times.entry(times.entries - 1)
            if relative < 0 or (
                next_offset is not None and self.base_offset + relative >= next_offset
            ):
                return False
            if times.entries > 1:
                previous_timestamp, previous_relative = times.entry(times.entries - 2)
                if previous_timestamp >= timestamp or previous_relative > relative:
                    return False
        return True

    def load_tail(self) -> int | None:
        """Walk the batches after the last offset-index entry: the next offset, max timestamp and index spacing.

        Returns the next offset, or None when the file does not end on a
        batch boundary (a torn write: the segment needs recovery).
        """
        entries = self.offset_index.entries
        position = self.offset_index.entry(entries - 1)[1] if entries else 0
        max_timestamp, offset_of_max = self.time_index.last_entry()
        next_offset, end = self.base_offset, position
        for batch_position, fields in self._headers(position):
            last_offset = fields[BASE_OFFSET] + fields[LAST_OFFSET_DELTA]
            if fields[MAX_TIMESTAMP] > max_timestamp:
                max_timestamp, offset_of_max = fields[MAX_TIMESTAMP], last_offset
            next_offset, end = last_offset + 1, batch_position + fields[BATCH_LENGTH] + LOG_OVERHEAD
        if end != self.size:
            return None
        self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, offset_of_max
        self.bytes_since_index_entry = self.size - position
        return next_offset

    def recover(self, index_interval: int, epochs: LeaderEpochCache) -> tuple[int, bool]:
        """Validate every batch and rebuild both sparse indexes; cut the file at the first torn or corrupt batch.

        A batch must be complete, pass :func:`batch_is_valid` (magic, CRC)
        and start after the previous one. Leader epochs are learnt from the
        batches, as Kafka does, so a lost checkpoint is rebuilt (in memory:
        the caller checkpoints). Aborted transactions whose markers were cut
        go too; the rest of the transaction index cannot be rebuilt from the
        batches alone (it takes the producer state), so the log decides
        whether to keep it. Returns the next offset and whether bytes were cut.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp = self.offset_of_max_timestamp = -1
        self.bytes_since_index_entry = 0
        self._first_batch_timestamp = None
        plan = self._plan(index_interval)
        file_size = os.fstat(self.fd).st_size
        position, next_offset = 0, self.base_offset
        chunk, chunk_start = b"", 0
        while position + HEADER_SIZE <= file_size:
            at = position - chunk_start
            if at + HEADER_SIZE > len(chunk):
                chunk, chunk_start, at = (
                    os.pread(self.fd, min(RECOVERY_CHUNK, file_size - position), position),
                    position,
                    0,
                )
                if len(chunk) < HEADER_SIZE:
                    break
            header = BatchHeader.parse(chunk, at)
            if header.batch_length < _MIN_BATCH_LENGTH or position + header.size > file_size:
                break
            if at + header.size > len(chunk):
                wanted = max(header.size, min(RECOVERY_CHUNK, file_size - position))
                chunk, chunk_start, at = os.pread(self.fd, wanted, position), position, 0
                if len(chunk) < header.size:
                    break
            if (
                not batch_is_valid(chunk, at, header)
                or header.base_offset < next_offset
                or header.last_offset_delta < 0
                or header.last_offset - self.base_offset > INT32_MAX
            ):
                break
            plan.add(position, header.size, header.last_offset, header.max_timestamp)
            epochs.assign(header.partition_leader_epoch, header.base_offset)
            next_offset = header.last_offset + 1
            position += header.size
        truncated = position < file_size
        if truncated:
            os.ftruncate(self.fd, position)
        self.size = position
        self.offset_index.write(plan.offset_entries)
        self.time_index.write(plan.time_entries)
        self._commit(plan)
        self.txn_index.truncate_to(next_offset)
        return next_offset, truncated

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Drop the batches ending at or after ``offset`` (a batch holding it goes whole); returns the next offset.

        The aborted transactions whose markers go are dropped with them.
        """
        found = self.find(offset)
        if found is not None:
            os.ftruncate(self.fd, found[0])
            self.size = found[0]
            self.offset_index.truncate_to(offset)
            self.time_index.truncate_to(offset)
        if self.size == 0:
            self._first_batch_timestamp = None
            self.created_ms = now_ms
        next_offset = self.load_tail()
        assert next_offset is not None, "a truncated segment ends on a batch boundary"
        self.txn_index.truncate_to(next_offset)
        return next_offset

    # Life cycle ------------------------------------------------------------------

    def activate(self) -> None:
        """Preallocate the indexes to segment.index.bytes: this is the segment appends go to."""
        self.offset_index.preallocate()
        self.time_index.preallocate()

    def seal(self) -> None:
        """Finish the segment when it stops being active: its max timestamp goes into the time index, indexes are trimmed."""
        if self.max_timestamp > self.time_index.last_entry()[0]:
            relative = self.offset_of_max_timestamp - self.base_offset
            self.time_index.write(TimeIndex.ENTRY.pack(self.max_timestamp, relative))
        self.offset_index.trim()
        self.time_index.trim()

    def largest_timestamp(self) -> int:
        """What retention.ms compares with: the max timestamp, or the file's mtime when no batch has one (Kafka)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return os.fstat(self.fd).st_mtime_ns // 1_000_000

    def flush(self) -> None:
        os.fsync(self.fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        self.closed = True
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        os.close(self.fd)

    def delete(self) -> list[Path]:
        """Close the files and rename them to ``.deleted``, as Kafka does; returns the renamed files for the caller to remove.

        The rename takes the segment out of the log at once; removing the
        files can wait (``file.delete.delay.ms``) and belongs off the event
        loop. A crash in between leaves ``.deleted`` files, which the next
        load removes instead of mistaking them for a segment.
        """
        self.close()
        doomed = []
        for path in self.paths():
            if path.exists():
                deleted = path.with_name(path.name + DELETED_SUFFIX)
                os.rename(path, deleted)
                doomed.append(deleted)
        return doomed
