"""Kafka's sparse indexes of a segment: ``.index`` (offset -> position) and ``.timeindex`` (timestamp -> offset).

Entries are big-endian and relative to the segment's base offset, as in
Kafka, so the files are interchangeable. The active segment's indexes are
preallocated to ``segment.index.bytes`` and trimmed to their entries when
the segment rolls or the log closes; an index that was not trimmed shows an
unclean shutdown and is rebuilt from the log.

Entries are written with ``os.pwrite`` and searched through a read-only
mmap. Writing through a shared mapping instead would save a system call per
entry (one per ``index.interval.bytes`` of log), but a store into a
preallocated, sparse file on a full disk raises SIGBUS and kills the
interpreter, where ``pwrite`` raises ENOSPC that the log reports as a
:class:`josef.log.LogDirError`. Reading holes through a read-only mapping
allocates nothing.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import ClassVar

from josef.segment_files import OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY

from josef_storage_local.files import write_all


class _Index:
    """Fixed-size entries sorted on every field; ``entries`` counts the valid ones at the file's start."""

    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: Path, base_offset: int, max_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        #: False when the file had to be created: an existing segment then needs its index rebuilt.
        self.existed = path.exists()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.file_size = os.fstat(self.fd).st_size
        self.entries = self.file_size // self.ENTRY.size
        self.max_entries = max_bytes // self.ENTRY.size
        self._map: mmap.mmap | None = None
        self._last: tuple[int, ...] | None = None  # the last entry, read once: appends consult it

    def last(self) -> tuple[int, ...] | None:
        """The last valid entry, or None when there is none."""
        if self._last is None and self.entries:
            self._last = self.entry(self.entries - 1)
        return self._last

    def entry(self, n: int) -> tuple[int, ...]:
        size = self.ENTRY.size
        if self._map is not None and len(self._map) >= (n + 1) * size:
            return self.ENTRY.unpack_from(self._map, n * size)
        return self.ENTRY.unpack(os.pread(self.fd, size, n * size))

    def count_at_most(self, value: int, field: int) -> int:
        """How many entries have ``field`` <= ``value`` (a binary search: every field is increasing)."""
        if self.entries == 0:
            return 0
        mapped = self._mapped()
        unpack, size = self.ENTRY.unpack_from, self.ENTRY.size
        low, high = 0, self.entries
        while low < high:
            middle = (low + high) // 2
            if unpack(mapped, middle * size)[field] <= value:
                low = middle + 1
            else:
                high = middle
        return low

    def _mapped(self) -> mmap.mmap:
        if self._map is None or len(self._map) < self.entries * self.ENTRY.size:
            self._unmap()
            self._map = mmap.mmap(self.fd, self.file_size, access=mmap.ACCESS_READ)
        return self._map

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def write(self, data: bytes | bytearray) -> None:
        """Add entries (packed ``ENTRY`` structs) after the valid ones."""
        if not data:
            return
        position = self.entries * self.ENTRY.size
        write_all(self.fd, data, position)
        self.entries += len(data) // self.ENTRY.size
        self.file_size = max(self.file_size, position + len(data))
        self._last = None

    def keep(self, entries: int) -> None:
        """Keep only the first ``entries`` entries (the rest of the file is ignored and overwritten)."""
        self.entries = min(self.entries, entries)
        self._last = None

    def resize(self, size: int) -> None:
        if size != self.file_size:
            self._unmap()  # a mapping past the end of a shrunk file would fault
            os.ftruncate(self.fd, size)
            self.file_size = size

    def reset(self) -> None:
        """Drop every entry and empty the file, before a rebuild."""
        self.keep(0)
        self.resize(0)

    def preallocate(self) -> None:
        """Extend the file to ``segment.index.bytes``, as Kafka does for the active segment."""
        self.resize(max(self.entries, self.max_entries) * self.ENTRY.size)

    def trim(self) -> None:
        """Cut the file to its valid entries, as Kafka does when a segment stops being active."""
        self.resize(self.entries * self.ENTRY.size)

    def flush(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)


class OffsetIndex(_Index):
    """``.index``: ``relativeOffset int32, position int32``; the offset is a batch's last offset, as in Kafka."""

    ENTRY = OFFSET_INDEX_ENTRY

    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch whose last offset is <= ``offset``; 0 when there is none."""
        n = self.count_at_most(offset - self.base_offset, 0)
        return self.entry(n - 1)[1] if n else 0

    def truncate_to(self, offset: int) -> None:
        """Forget entries of batches ending at or after ``offset``."""
        self.keep(self.count_at_most(offset - self.base_offset - 1, 0))


class TimeIndex(_Index):
    """``.timeindex``: ``timestamp int64, relativeOffset int32``, an entry per rise of the segment's max timestamp."""

    ENTRY = TIME_INDEX_ENTRY

    def is_full(self) -> bool:
        # Kafka keeps the last slot for the entry written when the segment rolls.
        return self.entries >= self.max_entries - 1

    def last_entry(self) -> tuple[int, int]:
        """``(timestamp, offset)`` of the last entry; ``(-1, -1)`` when empty."""
        last = self.last()
        return (-1, -1) if last is None else (last[0], self.base_offset + last[1])

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry whose timestamp is <= ``timestamp``; the base offset when there is none."""
        n = self.count_at_most(timestamp, 0)
        return self.base_offset + self.entry(n - 1)[1] if n else self.base_offset

    def truncate_to(self, offset: int) -> None:
        """Forget entries pointing at or after ``offset``."""
        self.keep(self.count_at_most(offset - self.base_offset - 1, 1))
