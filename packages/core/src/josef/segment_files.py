"""The formats of a segment's companion files, which travel with it to remote storage (Kafka's ``.index``,
``.timeindex``, ``.txnindex`` and ``leader-epoch-checkpoint``).

A local storage writes them and tiered storage reads them back from remote
storage, so both take the formats from here. They are Kafka's, big-endian,
so the files are interchangeable with a Kafka broker's and its tools'.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence

from josef.log import AbortedTxn, EpochEntry

#: ``.index``: (offset relative to the segment's base offset, byte position in the ``.log``), sorted on both.
OFFSET_INDEX_ENTRY = struct.Struct(">ii")
#: ``.timeindex``: (timestamp, relative offset of the first record with it or a larger one), sorted on both.
TIME_INDEX_ENTRY = struct.Struct(">qi")
#: ``.txnindex``: version, producer id, first offset, marker offset, last stable offset after the marker.
TXN_INDEX_ENTRY = struct.Struct(">hqqqq")
TXN_INDEX_VERSION = 0
#: ``leader-epoch-checkpoint`` is a text checkpoint of this version: the version, a count, ``epoch start`` lines.
CHECKPOINT_VERSION = 0


def encode_aborted_txn(txn: AbortedTxn) -> bytes:
    return TXN_INDEX_ENTRY.pack(TXN_INDEX_VERSION, txn.producer_id, txn.first_offset, txn.last_offset,
                                txn.last_stable_offset)


def decode_aborted_txns(data: bytes, base_offset: int) -> list[AbortedTxn]:
    """The entries of a ``.txnindex``; ``ValueError`` when they cannot be a segment's index.

    Corrupt: a size that is not whole entries (a torn write), a version
    other than 0, a marker below the segment's base offset (Kafka's sanity
    check), or markers that do not increase (the log appends in marker order).
    """
    if len(data) % TXN_INDEX_ENTRY.size:
        raise ValueError(f"{len(data)} bytes are not whole {TXN_INDEX_ENTRY.size}-byte entries")
    entries: list[AbortedTxn] = []
    previous = base_offset - 1
    for version, producer_id, first_offset, last_offset, lso in TXN_INDEX_ENTRY.iter_unpack(data):
        if version != TXN_INDEX_VERSION:
            raise ValueError(f"entry {len(entries)} has version {version}, not {TXN_INDEX_VERSION}")
        if last_offset <= previous:
            raise ValueError(
                f"entry {len(entries)} has its marker at {last_offset}, not after {previous}"
                f" (entries increase from the segment's base offset {base_offset})"
            )
        entries.append(AbortedTxn(producer_id, first_offset, last_offset, lso))
        previous = last_offset
    return entries


def position_for(index: bytes, base_offset: int, offset: int) -> int:
    """Where in the ``.log`` to start looking for ``offset``, by a segment's ``.index``: the position of the last
    indexed batch at or below it, 0 when none is (reading from there finds its batch)."""
    if len(index) % OFFSET_INDEX_ENTRY.size:
        raise ValueError(f"an offset index of {len(index)} bytes is not whole {OFFSET_INDEX_ENTRY.size}-byte entries")
    entries = [entry for entry in OFFSET_INDEX_ENTRY.iter_unpack(index)]
    found = bisect.bisect_right(entries, offset - base_offset, key=lambda e: e[0])
    return entries[found - 1][1] if found else 0


def offset_for_time(time_index: bytes, base_offset: int, timestamp: int) -> int:
    """By a segment's ``.timeindex``: the offset of its last entry stamped <= ``timestamp`` (the base offset when
    none is). No record before it is stamped at or after ``timestamp``, so a search starts there."""
    if len(time_index) % TIME_INDEX_ENTRY.size:
        raise ValueError(f"a time index of {len(time_index)} bytes is not whole {TIME_INDEX_ENTRY.size}-byte entries")
    entries = list(TIME_INDEX_ENTRY.iter_unpack(time_index))
    found = bisect.bisect_right(entries, timestamp, key=lambda e: e[0])
    return base_offset + entries[found - 1][1] if found else base_offset


def encode_epoch_checkpoint(entries: Sequence[EpochEntry]) -> bytes:
    lines = [str(CHECKPOINT_VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]
    return ("\n".join(lines) + "\n").encode()


def decode_epoch_checkpoint(data: bytes) -> list[EpochEntry]:
    """The entries of a ``leader-epoch-checkpoint``; ``ValueError`` when malformed."""
    lines = data.decode("utf-8").splitlines()
    if len(lines) < 2 or lines[0].strip() != str(CHECKPOINT_VERSION):
        raise ValueError(f"not a version {CHECKPOINT_VERSION} checkpoint")
    entries = [line.split() for line in lines[2:] if line.strip()]
    if int(lines[1]) != len(entries) or any(len(entry) != 2 for entry in entries):
        raise ValueError(f"expected {lines[1].strip()} entries of 2 fields")
    return [EpochEntry(int(epoch), int(start)) for epoch, start in entries]
