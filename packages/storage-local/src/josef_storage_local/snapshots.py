"""Producer-state snapshot files: ``<offset, 20 digits>.snapshot`` beside the segments, as Kafka names them.

A snapshot at offset N holds the broker's producer state after every batch
below N. The log writes one when it rolls a segment (N is the new segment's
base offset) and when it closes (N is the log end), so a restart replays at
most the batch headers of the active segment.

The format is josef's own (Kafka's keeps only the last batch of each
producer; this keeps all five, so a retry of any of them is still recognised
after a restart). Big-endian, like everything in Kafka::

    version         int16   3 (1 and 2 are still read)
    crc             uint32  CRC-32 (zlib's) of everything after this field
    producer_count  int32
    producer_count times:
        producer_id     int64
        epoch           int16
        coordinator_epoch          int32   version 2 and later
        current_txn_first_offset   int64   version 2 and later
        last_timestamp             int64   version 3
        batch_count     int16   at most 5, oldest first
        batch_count times:
            first_seq       int32
            last_seq        int32
            first_offset    int64
            last_offset     int64
            max_timestamp   int64

Version 2 adds what transactions need after a restart, as Kafka's snapshots
hold it: the epoch of the coordinator that wrote the producer's last marker
(older coordinators stay fenced) and the first offset of the producer's open
transaction, -1 when none is (the last stable offset, and the first offset
of an aborted transaction whose marker the broker replays). Version 1 files,
written before transactions, read with both at -1: no transaction was open.
Version 3 adds the timestamp of the producer's last batch or marker, which
``producer.id.expiration.ms`` counts from (Kafka's snapshots hold it too);
older files read with their last batch's timestamp, -1 without a batch.

A file that is too short, has an unknown version, a wrong CRC or trailing
bytes is corrupt: :func:`read_snapshot` raises ``ValueError`` and the log
falls back to an older snapshot, or to the log itself (Kafka does the same).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from josef.producer.producer_state import BatchMetadata, ProducerEntry

from josef_storage_local.files import fsync_dir

SUFFIX = ".snapshot"
VERSION = 3
_HEADER = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
#: A producer's fields before its batches, by version: the fields of :class:`ProducerEntry` in order
#: (producer id, epoch, then version 2's coordinator epoch and open transaction, version 3's last timestamp),
#: then the batch count.
_PRODUCER = {1: struct.Struct(">qhh"), 2: struct.Struct(">qhiqh"), 3: struct.Struct(">qhiqqh")}
_BATCH = struct.Struct(">iiqqq")


def snapshot_path(dir: Path, offset: int) -> Path:
    return dir / f"{offset:020d}{SUFFIX}"


def list_snapshots(dir: Path) -> list[int]:
    """Offsets of the snapshot files in ``dir``, oldest first."""
    offsets = []
    for path in dir.iterdir():
        stem = path.name[: -len(SUFFIX)]
        if path.name.endswith(SUFFIX) and stem.isdigit():
            offsets.append(int(stem))
    return sorted(offsets)


def encode(producers: Sequence[ProducerEntry]) -> bytes:
    body = bytearray(_COUNT.pack(len(producers)))
    producer_struct = _PRODUCER[VERSION]
    for producer in producers:
        body += producer_struct.pack(producer.producer_id, producer.epoch, producer.coordinator_epoch,
                                     producer.current_txn_first_offset, producer.last_timestamp,
                                     len(producer.batches))
        for batch in producer.batches:
            body += _BATCH.pack(batch.first_seq, batch.last_seq, batch.first_offset, batch.last_offset,
                                batch.max_timestamp)
    return _HEADER.pack(VERSION, zlib.crc32(body)) + body


def decode(data: bytes) -> tuple[ProducerEntry, ...]:
    """The entries of a snapshot file's bytes; ``ValueError`` when they are not a valid snapshot."""
    if len(data) < _HEADER.size + _COUNT.size:
        raise ValueError(f"{len(data)} bytes are too short for a snapshot")
    version, crc = _HEADER.unpack_from(data, 0)
    producer_struct = _PRODUCER.get(version)
    if producer_struct is None:
        raise ValueError(f"snapshot version {version} is not one of {sorted(_PRODUCER)}")
    body = memoryview(data)[_HEADER.size :]
    if zlib.crc32(body) != crc:
        raise ValueError("snapshot CRC mismatch")
    try:
        (count,) = _COUNT.unpack_from(body, 0)
        pos = _COUNT.size
        producers = []
        for _ in range(count):
            *fields, batch_count = producer_struct.unpack_from(body, pos)
            pos += producer_struct.size
            batches = []
            for _ in range(batch_count):
                batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            producer_id, epoch, *later_fields = fields
            if version < 3:
                later_fields.append(batches[-1].max_timestamp if batches else -1)
            if version < 2:
                later_fields = [-1, -1, *later_fields]
            producers.append(ProducerEntry(producer_id, epoch, tuple(batches), *later_fields))
    except struct.error as exc:
        raise ValueError(f"snapshot ends early: {exc}") from None
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} unexpected bytes after the last producer")
    return tuple(producers)


def write_snapshot(dir: Path, offset: int, producers: Sequence[ProducerEntry]) -> Path:
    """Write the snapshot at ``offset`` so that a crash leaves the old file or the whole new one.

    Written to ``<name>.tmp``, fsynced, renamed, directory fsynced: a
    snapshot is written once per segment roll and at close, so the cost
    (well under a millisecond here) does not matter, and a snapshot that
    vanished after a power loss would only mean a longer replay.
    """
    path = snapshot_path(dir, offset)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as file:
        file.write(encode(producers))
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(dir)
    return path


def read_snapshot(dir: Path, offset: int) -> tuple[ProducerEntry, ...]:
    path = snapshot_path(dir, offset)
    try:
        return decode(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def delete_snapshot(dir: Path, offset: int) -> None:
    snapshot_path(dir, offset).unlink(missing_ok=True)


def remove_leftovers(dir: Path) -> None:
    """Remove ``.snapshot.tmp`` files a crash left in the middle of :func:`write_snapshot`."""
    for path in dir.glob(f"*{SUFFIX}.tmp"):
        path.unlink()
