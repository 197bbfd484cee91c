"""The records of ``__consumer_offsets``, in Kafka's own binary format.

josef writes exactly what a Kafka broker writes (``group-coordinator/*.json``
in Kafka's source), so a ``__consumer_offsets`` partition stays readable by
Kafka's tools (``kafka-console-consumer --formatter
...OffsetsMessageFormatter``) and a log copied from Kafka loads here:

=====================  ==========================================  ===============================
record                 key (int16 version, then fields)            value (int16 version, then fields)
=====================  ==========================================  ===============================
committed offset       v1: group, topic, partition (v0 is read)    v3 (v1 when an expiry time is
                                                                   set, the only version with one);
                                                                   v0-v4 are read
classic group          v2: group                                   v3; v0-v4 are read
KIP-848 consumer group v3 group epoch, v5 member, v6 target        v0 (flexible)
                       epoch, v7 member target, v8 member current
                       assignment: group (and member)
KIP-932 share group    v10 member, v11 group epoch, v12 target     v0 (flexible)
                       epoch, v13 member target, v14 member
                       current assignment: group (and member)
=====================  ==========================================  ===============================

The key identifies the entity, so compaction keeps the latest record per
offset and per group; a record with a null value (tombstone) deletes it.
Keys of versions josef does not know (4 and 9, the partition metadata Kafka
no longer writes, and 16+, the records of streams groups) are skipped by :func:`decode_key`, so a
log written by a newer Kafka still loads.

Encoding: big-endian integers; strings as int16 length + UTF-8 (-1 for
null); bytes as int32 length. Flexible versions (v4 values) use compact
strings/bytes/arrays (unsigned varint length + 1) and tagged-field sections,
which are read and skipped.
"""

from __future__ import annotations

import struct
from typing import Union

import attrs

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
OFFSET_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A record of ``__consumer_offsets`` could not be decoded."""


@attrs.frozen
class OffsetKey:
    """Identifies one committed offset: a group's position in one partition."""

    group: str
    topic: str
    partition: int


@attrs.frozen
class GroupKey:
    """Identifies one classic group's metadata."""

    group: str


@attrs.frozen
class ConsumerKey:
    """A KIP-848 consumer-group record's key: ``version`` 3 (group epoch), 5 (member metadata),
    6 (target assignment epoch), 7 (a member's target assignment), 8 (a member's current assignment); or a
    KIP-932 share group's: 10 (member metadata), 11 (group epoch), 12 (target assignment epoch), 13 (a
    member's target assignment), 14 (a member's current assignment). ``member`` is None for the group-level
    keys (3, 6, 11, 12)."""

    version: int
    group: str
    member: str | None = None


Key = Union[OffsetKey, GroupKey, ConsumerKey]


@attrs.frozen
class OffsetValue:
    """A committed offset. ``expire_timestamp`` is -1 unless the commit asked for its own retention (v2-v4)."""

    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int = -1


@attrs.frozen
class MemberValue:
    """A member as persisted: enough to resume the generation after a restart (Kafka's MemberMetadata)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@attrs.frozen
class GroupValue:
    """A classic group at the end of a rebalance: generation, chosen protocol, leader, members."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[MemberValue, ...] = ()


# Writing ---------------------------------------------------------------------------------


class _Writer:
    def __init__(self, version: int) -> None:
        self.parts: list[bytes] = [_I16.pack(version)]

    def i32(self, value: int) -> _Writer:
        self.parts.append(_I32.pack(value))
        return self

    def i64(self, value: int) -> _Writer:
        self.parts.append(_I64.pack(value))
        return self

    def string(self, value: str | None) -> _Writer:
        if value is None:
            self.parts.append(_I16.pack(-1))
        else:
            data = value.encode()
            self.parts += [_I16.pack(len(data)), data]
        return self

    def bytes_(self, value: bytes) -> _Writer:
        self.parts += [_I32.pack(len(value)), bytes(value)]
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


def encode_key(key: Key) -> bytes:
    if isinstance(key, ConsumerKey):
        w = _Writer(key.version).string(key.group)
        if key.member is not None:
            w.string(key.member)
        return w.done()
    if isinstance(key, OffsetKey):
        return _Writer(OFFSET_KEY_VERSION).string(key.group).string(key.topic).i32(key.partition).done()
    return _Writer(GROUP_KEY_VERSION).string(key.group).done()


def encode_offset(value: OffsetValue) -> bytes:
    if value.expire_timestamp >= 0:
        return (_Writer(OFFSET_VALUE_VERSION_WITH_EXPIRY).i64(value.offset).string(value.metadata)
                .i64(value.commit_timestamp).i64(value.expire_timestamp).done())
    return (_Writer(OFFSET_VALUE_VERSION).i64(value.offset).i32(value.leader_epoch).string(value.metadata)
            .i64(value.commit_timestamp).done())


def encode_group(value: GroupValue) -> bytes:
    w = (_Writer(GROUP_VALUE_VERSION).string(value.protocol_type).i32(value.generation).string(value.protocol)
         .string(value.leader).i64(value.current_state_timestamp).i32(len(value.members)))
    for m in value.members:
        (w.string(m.member_id).string(m.group_instance_id).string(m.client_id).string(m.client_host)
         .i32(m.rebalance_timeout).i32(m.session_timeout).bytes_(m.subscription).bytes_(m.assignment))
    return w.done()


# Reading ---------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = data
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError("record is truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise RecordFormatError("varint is too long")

    def string(self) -> str | None:
        size = self.uvarint() - 1 if self.flexible else self.i16()
        return None if size < 0 else self._take(size).decode()

    def bytes_(self) -> bytes:
        size = self.uvarint() - 1 if self.flexible else self.i32()
        return b"" if size < 0 else self._take(size)

    def array_length(self) -> int:
        return self.uvarint() - 1 if self.flexible else self.i32()

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self._take(self.uvarint())


def decode_key(data: bytes) -> Key | None:
    """The key of a record; None for record types josef does not know (skipped on load)."""
    reader = _Reader(data)
    version = reader.i16()
    if version in (0, 1):
        return OffsetKey(reader.string() or "", reader.string() or "", reader.i32())
    if version == 2:
        return GroupKey(reader.string() or "")
    if version in (3, 6, SHARE_GROUP_METADATA, SHARE_TARGET_METADATA, SHARE_STATE_PARTITIONS):
        return ConsumerKey(version, reader.string() or "")
    if version in (5, 7, 8, SHARE_MEMBER_METADATA, SHARE_TARGET_MEMBER, SHARE_CURRENT_ASSIGNMENT):
        return ConsumerKey(version, reader.string() or "", reader.string() or "")
    return None


def decode_offset(data: bytes) -> OffsetValue:
    reader = _Reader(data)
    version = reader.i16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown offset commit value version {version}")
    reader.flexible = version >= 4
    offset = reader.i64()
    leader_epoch = reader.i32() if version >= 3 else -1
    metadata = reader.string() or ""
    commit_timestamp = reader.i64()
    expire_timestamp = reader.i64() if version == 1 else -1
    reader.tagged_fields()
    return OffsetValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


def decode_group(data: bytes) -> GroupValue:
    reader = _Reader(data)
    version = reader.i16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown group metadata value version {version}")
    reader.flexible = version >= 4
    protocol_type = reader.string() or ""
    generation = reader.i32()
    protocol = reader.string()
    leader = reader.string()
    timestamp = reader.i64() if version >= 2 else -1
    members = []
    for _ in range(reader.array_length()):
        member_id = reader.string() or ""
        instance_id = reader.string() if version >= 3 else None
        client_id = reader.string() or ""
        client_host = reader.string() or ""
        rebalance_timeout = reader.i32() if version >= 1 else -1
        session_timeout = reader.i32()
        subscription = reader.bytes_()
        assignment = reader.bytes_()
        reader.tagged_fields()
        members.append(MemberValue(member_id, instance_id, client_id, client_host,
                                   session_timeout if rebalance_timeout < 0 else rebalance_timeout,
                                   session_timeout, subscription, assignment))
    reader.tagged_fields()
    return GroupValue(protocol_type, generation, protocol, leader, timestamp, tuple(members))


# KIP-848 consumer-group values (flexible version 0: compact strings and arrays, tagged fields) ------------

CONSUMER_GROUP_METADATA = 3
CONSUMER_MEMBER_METADATA = 5
CONSUMER_TARGET_METADATA = 6
CONSUMER_TARGET_MEMBER = 7
CONSUMER_CURRENT_ASSIGNMENT = 8

#: {topic id (uuid string): partitions}
TopicPartitions = dict[str, frozenset[int]]


@attrs.frozen
class ConsumerMemberValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@attrs.frozen
class ConsumerAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: TopicPartitions
    pending_revocation: TopicPartitions


class _FlexWriter:
    def __init__(self) -> None:
        self.parts: list[bytes] = [_I16.pack(0)]

    def uvarint(self, value: int) -> _FlexWriter:
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                break
        self.parts.append(bytes(out))
        return self

    def i32(self, value: int) -> _FlexWriter:
        self.parts.append(_I32.pack(value))
        return self

    def i8(self, value: int) -> _FlexWriter:
        self.parts.append(struct.pack(">b", value))
        return self

    def string(self, value: str | None) -> _FlexWriter:
        if value is None:
            return self.uvarint(0)
        data = value.encode()
        self.uvarint(len(data) + 1)
        self.parts.append(data)
        return self

    def topic_partitions(self, value: TopicPartitions) -> _FlexWriter:
        import uuid

        self.uvarint(len(value) + 1)
        for topic_id, partitions in sorted(value.items()):
            self.parts.append(uuid.UUID(topic_id).bytes)
            self.uvarint(len(partitions) + 1)
            for p in sorted(partitions):
                self.i32(p)
            self.uvarint(0)
        return self

    def done(self) -> bytes:
        self.uvarint(0)
        return b"".join(self.parts)


def _flex_reader(data: bytes, what: str) -> _Reader:
    reader = _Reader(data, flexible=True)
    version = reader.i16()
    if version != 0:
        raise RecordFormatError(f"unknown {what} value version {version}")
    return reader


def _read_topic_partitions(reader: _Reader) -> TopicPartitions:
    import uuid

    result: dict[str, frozenset[int]] = {}
    for _ in range(reader.array_length()):
        topic_id = str(uuid.UUID(bytes=reader._take(16)))
        result[topic_id] = frozenset(reader.i32() for _ in range(reader.array_length()))
        reader.tagged_fields()
    return result


def encode_epoch(epoch: int) -> bytes:
    """ConsumerGroupMetadataValue (group epoch) or ConsumerGroupTargetAssignmentMetadataValue (assignment epoch)."""
    return _FlexWriter().i32(epoch).done()


def decode_epoch(data: bytes) -> int:
    reader = _flex_reader(data, "consumer group epoch")
    return reader.i32()


def encode_consumer_member(value: ConsumerMemberValue) -> bytes:
    w = (_FlexWriter().string(value.instance_id).string(value.rack_id).string(value.client_id)
         .string(value.client_host).uvarint(len(value.subscribed_topic_names) + 1))
    for name in value.subscribed_topic_names:
        w.string(name)
    return w.string(value.subscribed_topic_regex).i32(value.rebalance_timeout_ms).string(value.server_assignor).done()


def decode_consumer_member(data: bytes) -> ConsumerMemberValue:
    r = _flex_reader(data, "consumer group member metadata")
    instance_id, rack_id = r.string(), r.string()
    client_id, client_host = r.string() or "", r.string() or ""
    names = tuple(r.string() or "" for _ in range(r.array_length()))
    regex = r.string()
    rebalance_timeout = r.i32()
    assignor = r.string()
    r.tagged_fields()
    return ConsumerMemberValue(instance_id, rack_id, client_id, client_host, names, regex, rebalance_timeout, assignor)


def encode_target_member(value: TopicPartitions) -> bytes:
    return _FlexWriter().topic_partitions(value).done()


def decode_target_member(data: bytes) -> TopicPartitions:
    r = _flex_reader(data, "consumer group target assignment")
    value = _read_topic_partitions(r)
    r.tagged_fields()
    return value


def encode_current_assignment(value: ConsumerAssignmentValue) -> bytes:
    return (_FlexWriter().i32(value.member_epoch).i32(value.previous_member_epoch).i8(value.state)
            .topic_partitions(value.assigned).topic_partitions(value.pending_revocation).done())


def decode_current_assignment(data: bytes) -> ConsumerAssignmentValue:
    r = _flex_reader(data, "consumer group current member assignment")
    epoch, previous = r.i32(), r.i32()
    state = struct.unpack(">b", r._take(1))[0]
    assigned = _read_topic_partitions(r)
    pending = _read_topic_partitions(r)
    r.tagged_fields()
    return ConsumerAssignmentValue(epoch, previous, state, assigned, pending)


# KIP-932 share-group values (flexible version 0) ----------------------------------------------------------

SHARE_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_TARGET_METADATA = 12
SHARE_TARGET_MEMBER = 13
SHARE_CURRENT_ASSIGNMENT = 14
SHARE_STATE_PARTITIONS = 15


@attrs.frozen
class ShareMemberValue:
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]


@attrs.frozen
class ShareAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: TopicPartitions


def encode_share_member(value: ShareMemberValue) -> bytes:
    w = (_FlexWriter().string(value.rack_id).string(value.client_id).string(value.client_host)
         .uvarint(len(value.subscribed_topic_names) + 1))
    for name in value.subscribed_topic_names:
        w.string(name)
    return w.done()


def decode_share_member(data: bytes) -> ShareMemberValue:
    r = _flex_reader(data, "share group member metadata")
    rack_id, client_id, client_host = r.string(), r.string() or "", r.string() or ""
    names = tuple(r.string() or "" for _ in range(r.array_length()))
    r.tagged_fields()
    return ShareMemberValue(rack_id, client_id, client_host, names)


def encode_share_assignment(value: ShareAssignmentValue) -> bytes:
    return (_FlexWriter().i32(value.member_epoch).i32(value.previous_member_epoch).i8(value.state)
            .topic_partitions(value.assigned).done())


def decode_share_assignment(data: bytes) -> ShareAssignmentValue:
    r = _flex_reader(data, "share group current member assignment")
    epoch, previous = r.i32(), r.i32()
    state = struct.unpack(">b", r._take(1))[0]
    assigned = _read_topic_partitions(r)
    r.tagged_fields()
    return ShareAssignmentValue(epoch, previous, state, assigned)


#: ShareGroupStatePartitionMetadataValue: {topic id (uuid string): (topic name, partitions)} whose share-partition
#: state the group has (initialized), and {topic id: name} of topics whose state is being deleted.
@attrs.frozen
class ShareStatePartitionsValue:
    initialized: dict[str, tuple[str, frozenset[int]]]
    deleting: dict[str, str]


def encode_share_state_partitions(value: ShareStatePartitionsValue) -> bytes:
    import uuid

    w = _FlexWriter().uvarint(len(value.initialized) + 1)
    for topic_id, (name, partitions) in sorted(value.initialized.items()):
        w.parts.append(uuid.UUID(topic_id).bytes)
        w.string(name).uvarint(len(partitions) + 1)
        for p in sorted(partitions):
            w.i32(p)
        w.uvarint(0)
    w.uvarint(len(value.deleting) + 1)
    for topic_id, name in sorted(value.deleting.items()):
        w.parts.append(uuid.UUID(topic_id).bytes)
        w.string(name).uvarint(0)
    return w.done()


def decode_share_state_partitions(data: bytes) -> ShareStatePartitionsValue:
    import uuid

    r = _flex_reader(data, "share group state partition metadata")
    initialized: dict[str, tuple[str, frozenset[int]]] = {}
    for _ in range(r.array_length()):
        topic_id = str(uuid.UUID(bytes=r._take(16)))
        name = r.string() or ""
        initialized[topic_id] = (name, frozenset(r.i32() for _ in range(r.array_length())))
        r.tagged_fields()
    deleting: dict[str, str] = {}
    for _ in range(r.array_length()):
        topic_id = str(uuid.UUID(bytes=r._take(16)))
        deleting[topic_id] = r.string() or ""
        r.tagged_fields()
    r.tagged_fields()
    return ShareStatePartitionsValue(initialized, deleting)
