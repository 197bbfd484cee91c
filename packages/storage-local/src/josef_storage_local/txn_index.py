"""Kafka's ``.txnindex``: the aborted transactions whose ABORT markers are in one segment.

Entries are Kafka's, big-endian, 34 bytes each, in marker order, so the
files are interchangeable with Kafka's::

    version           int16   0
    producerId        int64
    firstOffset       int64   the producer's first offset in the transaction
    lastOffset        int64   the offset of the ABORT marker
    lastStableOffset  int64   the partition's LSO just after the marker

As in Kafka the file is created by the first entry (most segments never hold
an aborted transaction, and have no file), truncated but kept when entries
are cut, and deleted with its segment. When the log must forget every entry
of a segment (recovery, corruption) the file is deleted, where Kafka
truncates it to nothing: an absent file reads the same, and a corrupt one
is better gone. The entries are also kept in memory:
every ``read_committed`` fetch asks for them, and reading files there would
put disk reads on the fetch path. A file is read once, when its log loads.

Methods raise :class:`OSError` and leave the index as it was; the log turns
the error into :class:`josef.log.LogDirError`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from pathlib import Path

from josef.log import AbortedTxn
from josef.segment_files import TXN_INDEX_ENTRY as ENTRY
from josef.segment_files import decode_aborted_txns as decode
from josef.segment_files import encode_aborted_txn as encode

from josef_storage_local.files import fsync_dir, write_all

SUFFIX = ".txnindex"


def _marker_offset(txn: AbortedTxn) -> int:
    return txn.last_offset


class TxnIndex:
    """The aborted transactions of one segment: ``entries`` in marker order, mirrored by the file.

    The file is opened only when written: sealed segments, which are
    almost never written again, hold no descriptor for it.
    """

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries: list[AbortedTxn] = []
        self._fd: int | None = None
        self._unflushed = False
        self._created = False

    def load(self) -> None:
        """Read the file, if there is one; ``ValueError`` when it is corrupt (see :func:`decode`)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            self.entries = decode(data, self.base_offset)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None

    def _open(self) -> int:
        if self._fd is None:
            self._created = not self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry after the others (the caller keeps markers increasing)."""
        position = len(self.entries) * ENTRY.size
        fd = self._open()
        try:
            write_all(fd, encode(txn), position)
        except OSError:
            with contextlib.suppress(OSError):  # best effort: a torn entry would make the file look corrupt
                os.ftruncate(fd, position)
            raise
        self.entries.append(txn)
        self._unflushed = True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after ``offset`` (their batches are gone); the file stays."""
        keep = bisect.bisect_left(self.entries, offset, key=_marker_offset)
        if keep < len(self.entries):
            os.ftruncate(self._open(), keep * ENTRY.size)
            del self.entries[keep:]
            self._unflushed = True

    def reset(self) -> None:
        """Forget every entry and remove the file, as Kafka resets a segment it recovers: the broker reports them again."""
        self.close()
        self.entries.clear()
        self._unflushed = False
        self.path.unlink(missing_ok=True)

    def collect(self, start_offset: int, upper_offset: int, into: list[AbortedTxn]) -> bool:
        """Add the entries overlapping ``[start_offset, upper_offset)`` to ``into``; returns whether the search is complete.

        Kafka's ``collectAbortedTxns``: entries with a marker at or after
        ``start_offset`` and a first offset below ``upper_offset``. The
        search is complete at an entry whose last stable offset reaches
        ``upper_offset``: no transaction still open after that marker began
        below it, so no later marker concerns the range.
        """
        entries = self.entries
        first = 0
        if entries and entries[0].last_offset < start_offset:
            first = bisect.bisect_left(entries, start_offset, key=_marker_offset)
        for i in range(first, len(entries)):
            txn = entries[i]
            if txn.first_offset < upper_offset:
                into.append(txn)
            if txn.last_stable_offset >= upper_offset:
                return True
        return False

    def flush(self) -> None:
        """fsync what was written since the last flush; the directory too when this created the file."""
        if self._unflushed and self._fd is not None:
            os.fsync(self._fd)
            if self._created:
                fsync_dir(self.path.parent)
                self._created = False
            self._unflushed = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
