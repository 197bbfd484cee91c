"""The metadata log's commits as znodes: one persistent sequential znode under ``/josef/metadata/log`` per commit.

A commit znode holds a header (magic ``JZ``, format 0, the offset of its
first record, how many records, a CRC-32C of the records' bytes; format 1
adds the offset of the log's record before it, after a gap) and the
records, each Kafka's framed metadata record (ApiMessageAndVersion, as in
the KRaft log) behind its int32 length. Records that would not fit under
ZooKeeper's 1 MB znode limit (``jute.maxbuffer``, which also bounds a whole
request) go to part znodes under ``/josef/metadata/parts`` first, each
written on its own; the commit znode then names them. The commit is the
only write conditioned on the controller epoch, so parts a deposed
controller left are never read.

A snapshot (``/josef/metadata/snapshot``) holds the whole metadata image
as of a commit: its own header (magic ``JS``, format 0, the offset of the
last record it covers, the sequence number of the last commit it covers)
in front of the image's records, encoded as a commit is (inline or in
parts). Once it is written the commits it covers are deleted, so a
restarted node reads the snapshot and the few commits after it.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence

import attrs
import crc32c

from josef.metadata.records import MetadataRecord, UnknownRecordError, decode, encode

MAGIC = b"JZ"
SNAPSHOT_MAGIC = b"JS"
FORMAT = 0
#: A commit that does not start right after the one before it: a KRaft quorum's, mirrored while a cluster
#: migrates to KRaft (josef_metadata_zk.migration), where the Raft log's control records take offsets of their own.
#: Its header is followed by the offset of the last record before it.
FORMAT_AFTER_GAP = 1
_HEADER = struct.Struct(">2sBqiIB")  # magic, format, base offset, record count, crc32c, 0 inline / 1 in parts
_PREVIOUS = struct.Struct(">q")
_PARTS = struct.Struct(">16si")  # the parts' uuid, how many
_LENGTH = struct.Struct(">i")
_SNAPSHOT = struct.Struct(">2sBqq")  # magic, format, last offset covered, last commit sequence covered
#: The most record bytes kept in one znode: under ZooKeeper's default 1 MB, leaving room for the request around it.
MAX_ZNODE_BYTES = 900 * 1024


class CorruptCommitError(ValueError):
    """A commit znode (or its parts) that is not what josef wrote: the node stops and names the znode."""


@attrs.frozen
class EncodedCommit:
    """What an append writes: the commit znode's data and, for a large commit, its parts' names and data first."""

    data: bytes
    parts: tuple[tuple[str, bytes], ...] = ()


def encode_commit(base_offset: int, records: Sequence[MetadataRecord], previous: int | None = None) -> EncodedCommit:
    """A commit of ``records`` from ``base_offset``; ``previous`` is the offset of the log's last record before it
    when that is not ``base_offset - 1`` (a mirrored KRaft log's gap)."""
    payload = b"".join(_LENGTH.pack(len(frame)) + frame for frame in map(encode, records))
    checksum = crc32c.crc32c(payload)
    version, after = FORMAT, b""
    if previous is not None and previous != base_offset - 1:
        if not -1 <= previous < base_offset - 1:
            raise ValueError(f"a commit from offset {base_offset} cannot follow offset {previous}")
        version, after = FORMAT_AFTER_GAP, _PREVIOUS.pack(previous)
    if len(payload) <= MAX_ZNODE_BYTES:
        return EncodedCommit(_HEADER.pack(MAGIC, version, base_offset, len(records), checksum, 0) + after + payload)
    parts_id = uuid.uuid4()
    parts = tuple((f"{parts_id.hex}-{i // MAX_ZNODE_BYTES:06d}", payload[i:i + MAX_ZNODE_BYTES])
                  for i in range(0, len(payload), MAX_ZNODE_BYTES))
    data = (_HEADER.pack(MAGIC, version, base_offset, len(records), checksum, 1) + after
            + _PARTS.pack(parts_id.bytes, len(parts)))
    return EncodedCommit(data, parts)


@attrs.frozen
class CommitHeader:
    base_offset: int
    count: int
    checksum: int
    #: Names of the part znodes holding the records, in order; empty when they are inline (``inline``).
    parts: tuple[str, ...]
    inline: bytes
    #: The offset of the log's last record before this commit: ``base_offset - 1`` but after a mirrored gap.
    previous_offset: int = -1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


def read_header(data: bytes, where: str) -> CommitHeader:
    if len(data) < _HEADER.size:
        raise CorruptCommitError(f"{where}: {len(data)} bytes, too short for a commit header")
    magic, version, base, count, checksum, kind = _HEADER.unpack_from(data)
    if magic != MAGIC or version not in (FORMAT, FORMAT_AFTER_GAP) or kind not in (0, 1) or base < 0 or count < 0:
        raise CorruptCommitError(f"{where}: not a josef metadata commit (magic {magic!r}, format {version}, "
                                 f"base offset {base}, {count} records)")
    at, previous = _HEADER.size, base - 1
    if version == FORMAT_AFTER_GAP:
        if len(data) < at + _PREVIOUS.size:
            raise CorruptCommitError(f"{where}: {len(data)} bytes, too short for a commit after a gap")
        (previous,) = _PREVIOUS.unpack_from(data, at)
        at += _PREVIOUS.size
        if not -1 <= previous < base - 1:
            raise CorruptCommitError(f"{where}: its records start at offset {base} after offset {previous}")
    if kind == 0:
        return CommitHeader(base, count, checksum, (), data[at:], previous)
    if len(data) != at + _PARTS.size:
        raise CorruptCommitError(f"{where}: a commit in parts has {len(data)} bytes, not {at + _PARTS.size}")
    parts_id, how_many = _PARTS.unpack_from(data, at)
    return CommitHeader(base, count, checksum, tuple(f"{parts_id.hex()}-{i:06d}" for i in range(how_many)), b"",
                        previous)


def decode_records(header: CommitHeader, payload: bytes, where: str) -> list[MetadataRecord]:
    """The records of a commit whose bytes (inline, or its parts joined) are ``payload``."""
    if crc32c.crc32c(payload) != header.checksum:
        raise CorruptCommitError(f"{where}: the records fail their CRC-32C")
    records: list[MetadataRecord] = []
    at = 0
    try:
        while at < len(payload):
            (length,) = _LENGTH.unpack_from(payload, at)
            records.append(decode(payload[at + _LENGTH.size:at + _LENGTH.size + length]))
            at += _LENGTH.size + length
    except (struct.error, UnknownRecordError) as exc:
        raise CorruptCommitError(f"{where}: record {len(records)} cannot be read: {exc}") from exc
    if len(records) != header.count or at != len(payload):
        raise CorruptCommitError(f"{where}: {len(records)} records where the header says {header.count}")
    return records


@attrs.frozen
class SnapshotHeader:
    #: The offset of the last record the snapshot covers: the image is the state after it.
    offset: int
    #: The sequence number of the last commit znode it covers: the log goes on with the next one.
    sequence: int
    records: CommitHeader


def encode_snapshot(offset: int, sequence: int, records: Sequence[MetadataRecord]) -> EncodedCommit:
    body = encode_commit(0, records)
    return EncodedCommit(_SNAPSHOT.pack(SNAPSHOT_MAGIC, FORMAT, offset, sequence) + body.data, body.parts)


def read_snapshot_header(data: bytes, where: str) -> SnapshotHeader:
    if len(data) < _SNAPSHOT.size:
        raise CorruptCommitError(f"{where}: {len(data)} bytes, too short for a snapshot header")
    magic, version, offset, sequence = _SNAPSHOT.unpack_from(data)
    if magic != SNAPSHOT_MAGIC or version != FORMAT or offset < -1 or sequence < -1:
        raise CorruptCommitError(f"{where}: not a josef metadata snapshot (magic {magic!r}, format {version}, "
                                 f"offset {offset}, commit sequence {sequence})")
    return SnapshotHeader(offset, sequence, read_header(data[_SNAPSHOT.size:], where))
