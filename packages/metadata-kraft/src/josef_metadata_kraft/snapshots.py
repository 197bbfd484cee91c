"""Metadata snapshots: the image as Kafka's ``.checkpoint`` files hold it, and reading one back.

A snapshot at ``(end offset, epoch)`` is the metadata image after every
record below that offset, written as the records that rebuild it
(:meth:`josef.metadata.image.MetadataImage.records`) between a
SnapshotHeader and a SnapshotFooter control batch, exactly as Kafka's
RecordsSnapshotWriter lays it out, so Kafka's tools read josef's snapshots
and the other way round. A restarting node loads its latest snapshot, then
replays only the log after it.
"""

from __future__ import annotations

import time

from josef.metadata.image import MetadataImage
from josef.metadata.records import MetadataRecord, UnknownRecordError, decode, encode
from josef.protocol.records import batch_is_valid, control_type, iter_batches, iter_records
from josef_metadata_kraft.raft import OffsetAndEpoch
from josef_metadata_kraft.raft.messages import SNAPSHOT_FOOTER, SNAPSHOT_HEADER, snapshot_bytes


class SnapshotError(ValueError):
    """A snapshot that cannot be read: bad CRC, truncated, no header or footer, an unreadable record."""


def build_snapshot(image: MetadataImage, snapshot_id: OffsetAndEpoch) -> bytes:
    return snapshot_bytes(snapshot_id, [encode(r) for r in image.records()], int(time.time() * 1000))


def check_snapshot(data: bytes) -> None:
    """Raise :class:`SnapshotError` unless ``data`` is whole, valid batches from a SnapshotHeader to a SnapshotFooter."""
    end = 0
    kinds = []
    for pos, header in iter_batches(data):
        if header.magic != 2 or not batch_is_valid(data, pos, header):
            raise SnapshotError(f"batch at byte {pos} fails its CRC")
        kinds.append(control_type(data, pos) if header.is_control else None)
        end = pos + header.size
    if end != len(data):
        raise SnapshotError(f"{len(data) - end} bytes of a partial batch at byte {end}")
    if not kinds or kinds[0] != SNAPSHOT_HEADER or kinds[-1] != SNAPSHOT_FOOTER:
        raise SnapshotError("it does not run from a SnapshotHeader to a SnapshotFooter")


def snapshot_records(data: bytes) -> list[MetadataRecord]:
    """The metadata records of a checked snapshot, in order."""
    records: list[MetadataRecord] = []
    for pos, header in iter_batches(data):
        if header.is_control:
            continue
        try:
            records += [decode(r.value or b"") for r in iter_records(memoryview(data)[pos: pos + header.size])]
        except UnknownRecordError as exc:
            raise SnapshotError(f"batch at offset {header.base_offset}: {exc}") from exc
    return records
