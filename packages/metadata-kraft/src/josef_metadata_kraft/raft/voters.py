"""Dynamic voter sets (KIP-853): the KRaftVersion and Voters control records, and where they are in force.

A quorum formatted with ``--standalone`` or ``--initial-controllers`` starts
at ``kraft.version`` 1: its bootstrap snapshot ``00000000000000000000-0000000000.checkpoint``
holds a KRaftVersionRecord and a VotersRecord, and every later change of the
voter set is a VotersRecord appended to the log. The latest *appended*
VotersRecord is in force (not the latest committed one), so a truncation
that removes it brings back the one before: :class:`VoterSetHistory` keeps
them by offset, as Kafka's ``VoterSetHistory`` does.
"""

from __future__ import annotations

import io
import struct
import uuid
from typing import Iterator, Mapping

import attrs
from kio.schema.k_raft_version_record.v0.data import KRaftVersionRecord
from kio.schema.voters_record.v0.data import Endpoint, KRaftVersionFeature, Voter, VotersRecord
from kio.serial import entity_reader, entity_writer

from josef.protocol.records import CONTROL_BIT, build_batch, iter_batches, iter_records

#: Control record types (Kafka's ``ControlRecordType``).
KRAFT_VERSION, KRAFT_VOTERS = 5, 6
_CONTROL_KEY = struct.Struct(">hh")
#: The directory id of a replica that has none (Kafka's ``ReplicaKey.NO_DIRECTORY_ID``).
NO_DIRECTORY_ID = uuid.UUID(int=0)


@attrs.frozen
class VoterInfo:
    """One voter: id, directory id and its endpoints ``(listener, host, port)``."""

    node_id: int
    directory_id: uuid.UUID | None
    endpoints: tuple[tuple[str, str, int], ...]

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return self.endpoints[0][1:] if self.endpoints else None


VoterSet = Mapping[int, VoterInfo]


def _encode(cls: type, value: object) -> bytes:
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)  # type: ignore[arg-type]
    return buf.getvalue()


def voters_record_value(voters: VoterSet) -> bytes:
    record = VotersRecord(version=0, voters=tuple(  # type: ignore[arg-type]
        Voter(voter_id=v.node_id, voter_directory_id=v.directory_id or NO_DIRECTORY_ID,  # type: ignore[arg-type]
              endpoints=tuple(Endpoint(name=n, host=h, port=p) for n, h, p in v.endpoints),  # type: ignore[arg-type]
              k_raft_version_feature=KRaftVersionFeature(min_supported_version=0,  # type: ignore[arg-type]
                                                         max_supported_version=1))  # type: ignore[arg-type]
        for v in sorted(voters.values(), key=lambda v: v.node_id)))
    return _encode(VotersRecord, record)


def decode_voters_record(value: bytes) -> dict[int, VoterInfo]:
    record, _ = entity_reader(VotersRecord)(value, 0)  # type: ignore[arg-type]
    voters = {}
    for v in record.voters:
        directory = None if v.voter_directory_id in (None, NO_DIRECTORY_ID) else v.voter_directory_id
        voters[int(v.voter_id)] = VoterInfo(int(v.voter_id), directory,
                                            tuple((e.name, e.host, int(e.port)) for e in v.endpoints))
    return voters


def kraft_version_value(version: int) -> bytes:
    return _encode(KRaftVersionRecord, KRaftVersionRecord(version=0, k_raft_version=version))  # type: ignore[arg-type]


def decode_kraft_version(value: bytes) -> int:
    record, _ = entity_reader(KRaftVersionRecord)(value, 0)  # type: ignore[arg-type]
    return int(record.k_raft_version)


def control_records(control: list[tuple[int, bytes]], *, base_offset: int, epoch: int, timestamp_ms: int) -> bytes:
    """One control batch holding ``(type, value)`` records."""
    return build_batch([(_CONTROL_KEY.pack(0, t), v, timestamp_ms) for t, v in control], base_offset=base_offset,
                       leader_epoch=epoch, attributes=CONTROL_BIT)


def voters_control(voters: VoterSet, *, with_version: bool) -> list[tuple[int, bytes]]:
    """The control records that put ``voters`` in force (preceded by kraft.version 1 when asked)."""
    records = [(KRAFT_VERSION, kraft_version_value(1))] if with_version else []
    return records + [(KRAFT_VOTERS, voters_record_value(voters))]


def scan_control(data: bytes | memoryview) -> Iterator[tuple[int, int, bytes]]:
    """``(offset, type, value)`` of the KRaftVersion and Voters records in whole batches ``data``."""
    view = memoryview(data)
    for pos, header in iter_batches(view):
        if not header.is_control:
            continue
        for record in iter_records(view[pos:pos + header.size]):
            key = record.key or b""
            if len(key) < 4:
                continue
            kind = _CONTROL_KEY.unpack_from(key)[1]
            if kind in (KRAFT_VERSION, KRAFT_VOTERS):
                yield record.offset, kind, record.value or b""


class VoterSetHistory:
    """The voter sets appended to the log, by offset; the last one is in force.

    ``static`` is the set of ``controller.quorum.voters`` (kraft.version 0),
    in force while no VotersRecord was seen.
    """

    def __init__(self, static: VoterSet) -> None:
        self.static = dict(static)
        self.kraft_version = 0
        self.entries: list[tuple[int, dict[int, VoterInfo]]] = []

    @property
    def dynamic(self) -> bool:
        return self.kraft_version >= 1 or bool(self.entries)

    def current(self) -> VoterSet:
        return self.entries[-1][1] if self.entries else self.static

    def last_offset(self) -> int | None:
        return self.entries[-1][0] if self.entries else None

    def at(self, offset: int) -> VoterSet:
        """The set in force for the record at ``offset`` (entries at or before it)."""
        found: VoterSet = self.static
        for entry_offset, voters in self.entries:
            if entry_offset > offset:
                break
            found = voters
        return found

    def add(self, offset: int, kind: int, value: bytes) -> bool:
        """Learn one control record; ``True`` when the voter set changed."""
        if kind == KRAFT_VERSION:
            self.kraft_version = max(self.kraft_version, decode_kraft_version(value))
            return False
        voters = decode_voters_record(value)
        while self.entries and self.entries[-1][0] >= offset:
            self.entries.pop()
        self.entries.append((offset, voters))
        return True

    def scan(self, data: bytes | memoryview, offset_base: int | None = None) -> bool:
        """Learn every record of ``data``; with ``offset_base`` (a snapshot), records count as at that offset."""
        changed = False
        for offset, kind, value in scan_control(data):
            changed |= self.add(offset if offset_base is None else offset_base, kind, value)
        return changed

    def truncate(self, end_offset: int) -> bool:
        """Forget the sets appended at or after ``end_offset``; ``True`` when the current one changed."""
        before = len(self.entries)
        self.entries = [(o, v) for o, v in self.entries if o < end_offset]
        return len(self.entries) != before

    def reset(self) -> None:
        self.entries = []
        self.kraft_version = 0
