"""The records of ``__remote_log_metadata`` (KIP-405), byte for byte as Kafka's ``RemoteLogMetadataSerde`` writes them.

Tiered storage keeps which segments of a partition are remote, and in what
state, in this internal topic rather than in the remote store, so that every
replica learns it by consuming the topic. Writing exactly Kafka's bytes
keeps a cluster's metadata readable by Kafka's own tools
(``kafka-dump-log.sh --remote-log-metadata-decoder``,
``RemoteLogMetadataSerde$RemoteLogMetadataFormatter``) and lets a log copied
from Kafka load here.

A record has a null key; its value is a frame (``AbstractApiMessageSerde``:
unsigned varints for the frame version, 1, then the record's api key and
version) followed by the record, a flexible-version message (compact
strings, arrays and bytes, 16-byte uuids, a tagged-field section closing the
record and each of its structs):

=======  ========================================  ==========================================
api key  record (storage/.../message/*.json, v0)   josef type
=======  ========================================  ==========================================
0        RemoteLogSegmentMetadataRecord            :class:`josef.remote_storage.RemoteLogSegmentMetadata`
1        RemoteLogSegmentMetadataUpdateRecord      :class:`RemoteLogSegmentMetadataUpdate`
2        RemotePartitionDeleteMetadataRecord       :class:`RemotePartitionDeleteMetadata`
3        RemoteLogSegmentMetadataSnapshotRecord    :class:`RemoteLogSegmentMetadataSnapshot`
=======  ========================================  ==========================================

Which of the topic's partitions a user partition's records go to is
:func:`metadata_partition`, so that one consumer sees all of a partition's
records, in order.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Mapping

import attrs

from josef.metadata.records import uuid_to_text
from josef.coordinator.hashing import murmur2, to_positive
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

#: The version of the frame before every record: 0 was KRaft's preview format, which Kafka refuses too.
FRAME_VERSION = 1

#: The api keys of the four records, as their JSON schemas number them.
SEGMENT_METADATA_API_KEY = 0
SEGMENT_METADATA_UPDATE_API_KEY = 1
PARTITION_DELETE_API_KEY = 2
SEGMENT_METADATA_SNAPSHOT_API_KEY = 3

#: Every record type is at version 0 (and flexible from 0): the only version Kafka writes and reads.
RECORD_VERSION = 0

_RECORD_NAMES = {
    SEGMENT_METADATA_API_KEY: "RemoteLogSegmentMetadataRecord",
    SEGMENT_METADATA_UPDATE_API_KEY: "RemoteLogSegmentMetadataUpdateRecord",
    PARTITION_DELETE_API_KEY: "RemotePartitionDeleteMetadataRecord",
    SEGMENT_METADATA_SNAPSHOT_API_KEY: "RemoteLogSegmentMetadataSnapshotRecord",
}

_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAX_STRING = 0x7FFF  # Kafka's generated code refuses longer strings both ways


class RemotePartitionDeleteState(enum.IntEnum):
    """Where the deletion of a whole partition's remote data is (Kafka's ids, as the records store them).

    The controller marks a deleted topic's partitions; the leader of the
    metadata partition then deletes their segments and records the start and
    the end of that work, so a broker restarting half way resumes it.
    """

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2

    @staticmethod
    def is_valid_transition(current: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState) -> bool:
        """Kafka's rule: a partition is first marked, then started, then finished; repeating a state is allowed so
        that a retried or replayed event is harmless."""
        if current is None:
            return target is RemotePartitionDeleteState.DELETE_PARTITION_MARKED
        if current is target:
            return True
        return target == current + 1


@attrs.frozen
class RemoteLogSegmentMetadataUpdate:
    """A remote segment's move to a new state (Kafka's ``RemoteLogSegmentMetadataUpdate``).

    Only the state, who moved it and when change after a segment is first
    recorded; ``custom_metadata`` is what the backend returned when the copy
    finished, carried on every later update so that a delete can hand it back.
    """

    segment_id: RemoteLogSegmentId
    custom_metadata: bytes | None
    state: RemoteLogSegmentState
    event_timestamp_ms: int
    broker_id: int


@attrs.frozen
class RemotePartitionDeleteMetadata:
    """A step of deleting a whole partition's remote data (Kafka's ``RemotePartitionDeleteMetadata``)."""

    topic_id: uuid.UUID
    tp: TopicPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int


@attrs.frozen
class RemoteLogSegmentMetadataSnapshot:
    """A segment's metadata without its partition (Kafka's ``RemoteLogSegmentMetadataSnapshot``).

    Kafka defined it for per-partition snapshot files, where the partition is
    known from the file, so only the segment's own uuid is kept.
    """

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    custom_metadata: bytes | None
    state: RemoteLogSegmentState
    segment_leader_epochs: Mapping[int, int]

    def __attrs_post_init__(self) -> None:
        if not self.segment_leader_epochs:
            raise ValueError("a remote segment names at least one leader epoch")

    @classmethod
    def of(cls, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadataSnapshot:
        return cls(metadata.segment_id.id, metadata.start_offset, metadata.end_offset, metadata.max_timestamp_ms,
                   metadata.broker_id, metadata.event_timestamp_ms, metadata.segment_size_in_bytes,
                   metadata.custom_metadata, metadata.state, dict(metadata.segment_leader_epochs))

    def to_metadata(self, topic_id: uuid.UUID, tp: TopicPartition) -> RemoteLogSegmentMetadata:
        """The full metadata again, given the partition the snapshot belongs to."""
        return RemoteLogSegmentMetadata(RemoteLogSegmentId(topic_id, tp, self.segment_id), self.start_offset,
                                        self.end_offset, self.max_timestamp_ms, self.broker_id,
                                        self.event_timestamp_ms, self.segment_size_in_bytes,
                                        dict(self.segment_leader_epochs), self.state, self.custom_metadata)


#: Any record of ``__remote_log_metadata``.
RemoteLogMetadata = (RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
                     | RemoteLogSegmentMetadataSnapshot)


def with_update(metadata: RemoteLogSegmentMetadata, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
    """The segment after ``update`` (Kafka's ``createWithUpdates``): its state, custom metadata, broker and time."""
    if update.segment_id != metadata.segment_id:
        raise ValueError(f"the update of {update.segment_id} does not apply to {metadata.segment_id}")
    return attrs.evolve(metadata, broker_id=update.broker_id, event_timestamp_ms=update.event_timestamp_ms,
                        custom_metadata=update.custom_metadata, state=update.state)


# Which partition of __remote_log_metadata ------------------------------------------------------------------------


def metadata_partition(topic_id: uuid.UUID, partition: int, partitions: int) -> int:
    """The partition of ``__remote_log_metadata`` (of ``partitions``) holding a user partition's records.

    Kafka's ``RemoteLogMetadataTopicPartitioner``: murmur2 of the 4 big-endian
    bytes of Java's ``Objects.hash(lsb, msb, partition)`` over the topic id's
    halves, made positive, modulo the partition count. Kafka hashes the id's
    longs itself so that a change of ``Uuid.hashCode`` never moves a
    partition's records, and so must josef, bit for bit.
    """
    if partitions <= 0:
        raise ValueError(f"__remote_log_metadata has {partitions} partitions")
    msb, lsb = topic_id.int >> 64, topic_id.int & 0xFFFFFFFFFFFFFFFF
    java_hash = 1  # Arrays.hashCode over (Long lsb, Long msb, Integer partition), in int32 arithmetic
    for element in (_java_long_hash(lsb), _java_long_hash(msb), partition & 0xFFFFFFFF):
        java_hash = (31 * java_hash + element) & 0xFFFFFFFF
    return to_positive(murmur2(java_hash.to_bytes(4, "big"))) % partitions


def _java_long_hash(value: int) -> int:
    """``Long.hashCode`` of a long given as its 64 unsigned bits: the low int of ``value ^ (value >>> 32)``."""
    return (value ^ (value >> 32)) & 0xFFFFFFFF


# Writing -----------------------------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def uvarint(self, value: int) -> _Writer:
        out = bytearray()
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))
        return self

    def i8(self, value: int) -> _Writer:
        self.parts.append(_I8.pack(value))
        return self

    def i32(self, value: int) -> _Writer:
        self.parts.append(_I32.pack(value))
        return self

    def i64(self, value: int) -> _Writer:
        self.parts.append(_I64.pack(value))
        return self

    def uuid_(self, value: uuid.UUID) -> _Writer:
        self.parts.append(value.bytes)  # most significant long first, as Kafka's writeUuid
        return self

    def string(self, value: str) -> _Writer:
        data = value.encode()
        if len(data) > _MAX_STRING:
            raise ValueError(f"a string of {len(data)} bytes is too long to be serialized")
        self.uvarint(len(data) + 1)
        self.parts.append(data)
        return self

    def nullable_bytes(self, value: bytes | None) -> _Writer:
        if value is None:
            return self.uvarint(0)
        self.uvarint(len(value) + 1)
        self.parts.append(bytes(value))
        return self

    def no_tagged_fields(self) -> _Writer:
        return self.uvarint(0)

    def topic_id_partition(self, topic_id: uuid.UUID, tp: TopicPartition) -> _Writer:
        return self.string(tp.topic).uuid_(topic_id).i32(tp.partition).no_tagged_fields()

    def segment_id(self, segment_id: RemoteLogSegmentId) -> _Writer:
        return self.topic_id_partition(segment_id.topic_id, segment_id.tp).uuid_(segment_id.id).no_tagged_fields()

    def leader_epochs(self, epochs: Mapping[int, int]) -> _Writer:
        self.uvarint(len(epochs) + 1)
        for epoch in sorted(epochs):  # Kafka iterates a TreeMap: ascending epochs
            self.i32(epoch).i64(epochs[epoch]).no_tagged_fields()
        return self


def encode(record: RemoteLogMetadata) -> bytes:
    """The value of a ``__remote_log_metadata`` record (its key is null), as ``RemoteLogMetadataSerde.serialize``."""
    w = _Writer()
    try:
        if isinstance(record, RemoteLogSegmentMetadata):
            api_key = SEGMENT_METADATA_API_KEY
            (w.segment_id(record.segment_id).i64(record.start_offset).i64(record.end_offset).i32(record.broker_id)
             .i64(record.max_timestamp_ms).i64(record.event_timestamp_ms).leader_epochs(record.segment_leader_epochs)
             .i32(record.segment_size_in_bytes).nullable_bytes(record.custom_metadata).i8(record.state))
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            api_key = SEGMENT_METADATA_UPDATE_API_KEY
            (w.segment_id(record.segment_id).i32(record.broker_id).i64(record.event_timestamp_ms)
             .nullable_bytes(record.custom_metadata).i8(record.state))
        elif isinstance(record, RemotePartitionDeleteMetadata):
            api_key = PARTITION_DELETE_API_KEY
            (w.topic_id_partition(record.topic_id, record.tp).i32(record.broker_id).i64(record.event_timestamp_ms)
             .i8(record.state))
        elif isinstance(record, RemoteLogSegmentMetadataSnapshot):
            api_key = SEGMENT_METADATA_SNAPSHOT_API_KEY
            (w.uuid_(record.segment_id).i64(record.start_offset).i64(record.end_offset).i32(record.broker_id)
             .i64(record.max_timestamp_ms).i64(record.event_timestamp_ms).leader_epochs(record.segment_leader_epochs)
             .i32(record.segment_size_in_bytes).nullable_bytes(record.custom_metadata).i8(record.state))
        else:
            raise TypeError(f"{type(record).__name__} is not a record of __remote_log_metadata")
    except struct.error as exc:  # an int out of its field's range
        raise ValueError(f"cannot encode {record}: {exc}") from None
    w.no_tagged_fields()
    frame = _Writer().uvarint(FRAME_VERSION).uvarint(api_key).uvarint(RECORD_VERSION)
    return b"".join(frame.parts + w.parts)


# Reading -----------------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.what = "record"

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"the {self.what} is truncated: {n} more byte(s) needed at position {self.pos} "
                             f"of {len(self.data)}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uvarint(self) -> int:
        value = 0
        for shift in range(0, 35, 7):  # an int32: at most 5 bytes, as Kafka's readUnsignedVarint
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value & 0xFFFFFFFF
        raise ValueError(f"a varint of the {self.what} is longer than 5 bytes")

    def i8(self) -> int:
        return int(_I8.unpack(self.take(1))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def uuid_(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16))

    def string(self, field: str) -> str:
        length = self.uvarint() - 1
        if length < 0:
            raise ValueError(f"non-nullable field {field} was serialized as null")
        if length > _MAX_STRING:
            raise ValueError(f"string field {field} had invalid length {length}")
        try:
            return self.take(length).decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"string field {field} is not UTF-8: {exc}") from None

    def nullable_bytes(self) -> bytes | None:
        length = self.uvarint() - 1
        return None if length < 0 else self.take(length)

    def tagged_fields(self) -> None:
        """Skip the tagged fields: none of these records defines one, so all are a newer writer's (kept by Kafka as
        unknown tagged fields, which change nothing it does)."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def topic_id_partition(self) -> tuple[uuid.UUID, TopicPartition]:
        name = self.string("name")
        topic_id = self.uuid_()
        partition = self.i32()
        self.tagged_fields()
        return topic_id, TopicPartition(name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        topic_id, tp = self.topic_id_partition()
        segment = self.uuid_()
        self.tagged_fields()
        return RemoteLogSegmentId(topic_id, tp, segment)

    def leader_epochs(self) -> dict[int, int]:
        count = self.uvarint() - 1
        if count < 0:
            raise ValueError("non-nullable field segmentLeaderEpochs was serialized as null")
        if count > len(self.data) - self.pos:
            raise ValueError(f"segmentLeaderEpochs claims {count} entries with only {len(self.data) - self.pos} "
                             "byte(s) left")
        epochs: dict[int, int] = {}
        for _ in range(count):
            epoch = self.i32()
            epochs[epoch] = self.i64()  # a repeated epoch: the last one wins, as in Kafka's HashMap
            self.tagged_fields()
        return epochs

    def segment_state(self) -> RemoteLogSegmentState:
        value = self.i8()
        try:
            return RemoteLogSegmentState(value)
        except ValueError:
            raise ValueError(f"unknown remote log segment state {value}") from None

    def partition_delete_state(self) -> RemotePartitionDeleteState:
        value = self.i8()
        try:
            return RemotePartitionDeleteState(value)
        except ValueError:
            raise ValueError(f"unknown remote partition delete state {value}") from None


def decode(data: bytes) -> RemoteLogMetadata:
    """A record's value back into its josef type, as ``RemoteLogMetadataSerde.deserialize``.

    Raises :class:`ValueError` for anything that is not one whole record of
    a known type and version, with what is wrong (frame version, api key,
    version, truncation, trailing bytes, an impossible field).
    """
    r = _Reader(bytes(data))
    r.what = "record frame"
    frame_version = r.uvarint()
    if frame_version == 0:
        raise ValueError("Could not deserialize metadata record with frame version 0 (the KRaft preview format)")
    if frame_version != FRAME_VERSION:
        raise ValueError(f"Could not deserialize metadata record due to unknown frame version {frame_version} "
                         f"(only frame version {FRAME_VERSION} is supported)")
    api_key = r.uvarint()
    version = r.uvarint()
    name = _RECORD_NAMES.get(api_key)
    if name is None:
        raise ValueError(f"unknown __remote_log_metadata record type (api key) {api_key}")
    if version != RECORD_VERSION:
        raise ValueError(f"Can't read version {version} of {name} (only version {RECORD_VERSION} exists)")
    r.what = name
    record: RemoteLogMetadata
    try:
        if api_key == SEGMENT_METADATA_API_KEY:
            segment_id = r.segment_id()
            start, end, broker, max_ts, event_ts = r.i64(), r.i64(), r.i32(), r.i64(), r.i64()
            epochs = r.leader_epochs()
            size, custom, state = r.i32(), r.nullable_bytes(), r.segment_state()
            record = RemoteLogSegmentMetadata(segment_id, start, end, max_ts, broker, event_ts, size, epochs, state,
                                              custom)
        elif api_key == SEGMENT_METADATA_UPDATE_API_KEY:
            segment_id = r.segment_id()
            broker, event_ts, custom, state = r.i32(), r.i64(), r.nullable_bytes(), r.segment_state()
            record = RemoteLogSegmentMetadataUpdate(segment_id, custom, state, event_ts, broker)
        elif api_key == PARTITION_DELETE_API_KEY:
            topic_id, tp = r.topic_id_partition()
            broker, event_ts, delete_state = r.i32(), r.i64(), r.partition_delete_state()
            record = RemotePartitionDeleteMetadata(topic_id, tp, delete_state, event_ts, broker)
        else:
            segment = r.uuid_()
            start, end, broker, max_ts, event_ts = r.i64(), r.i64(), r.i32(), r.i64(), r.i64()
            epochs = r.leader_epochs()
            size, custom, state = r.i32(), r.nullable_bytes(), r.segment_state()
            record = RemoteLogSegmentMetadataSnapshot(segment, start, end, max_ts, broker, event_ts, size, custom,
                                                      state, epochs)
        r.tagged_fields()
    except ValueError as exc:
        raise ValueError(f"Failed to deserialize record with type {api_key} ({name}): {exc}") from None
    if r.pos != len(r.data):
        raise ValueError(f"Found {len(r.data) - r.pos} byte(s) of garbage after {name}")
    return record


# Text, as Kafka's toString() and kafka-dump-log.sh print it --------------------------------------------------------


def format_record(record: RemoteLogMetadata) -> str:
    """A record as its Kafka class's ``toString()``: what Kafka's dump tool and console formatter print."""
    if isinstance(record, RemoteLogSegmentMetadata):
        return (f"RemoteLogSegmentMetadata{{remoteLogSegmentId={_segment_id(record.segment_id)}, "
                f"startOffset={record.start_offset}, endOffset={record.end_offset}, brokerId={record.broker_id}, "
                f"maxTimestampMs={record.max_timestamp_ms}, eventTimestampMs={record.event_timestamp_ms}, "
                f"segmentLeaderEpochs={_epochs(record.segment_leader_epochs)}, "
                f"segmentSizeInBytes={record.segment_size_in_bytes}, "
                f"customMetadata={_custom(record.custom_metadata)}, state={record.state.name}}}")
    if isinstance(record, RemoteLogSegmentMetadataUpdate):
        return (f"RemoteLogSegmentMetadataUpdate{{remoteLogSegmentId={_segment_id(record.segment_id)}, "
                f"customMetadata={_custom(record.custom_metadata)}, state={record.state.name}, "
                f"eventTimestampMs={record.event_timestamp_ms}, brokerId={record.broker_id}}}")
    if isinstance(record, RemotePartitionDeleteMetadata):
        return (f"RemotePartitionDeleteMetadata{{topicPartition={_topic_id_partition(record.topic_id, record.tp)}, "
                f"state={record.state.name}, eventTimestampMs={record.event_timestamp_ms}, "
                f"brokerId={record.broker_id}}}")
    if isinstance(record, RemoteLogSegmentMetadataSnapshot):
        return (f"RemoteLogSegmentMetadataSnapshot{{segmentId={uuid_to_text(record.segment_id)}, "
                f"startOffset={record.start_offset}, endOffset={record.end_offset}, "
                f"maxTimestampMs={record.max_timestamp_ms}, "
                f"segmentLeaderEpochs={_epochs(record.segment_leader_epochs)}, "
                f"segmentSizeInBytes={record.segment_size_in_bytes}, "
                f"customMetadata={_custom(record.custom_metadata)}, state={record.state.name}}}")
    raise TypeError(f"{type(record).__name__} is not a record of __remote_log_metadata")


def decode_remote_log_metadata(key: bytes | None, value: bytes | None) -> str:
    """One record of ``__remote_log_metadata`` as ``kafka-dump-log.sh --remote-log-metadata-decoder`` prints its payload.

    Kafka's tool ignores the key (it is always null) and prints no ``key:``;
    the dump tool prints ``Error at offset N, skipping. <message>`` for the
    :class:`ValueError` raised on bytes that are not a record.
    """
    if value is None:
        raise ValueError("a record of __remote_log_metadata has no value")
    return format_record(decode(value))


def _topic_id_partition(topic_id: uuid.UUID, tp: TopicPartition) -> str:
    return f"{uuid_to_text(topic_id)}:{tp.topic}-{tp.partition}"


def _segment_id(segment_id: RemoteLogSegmentId) -> str:
    return (f"RemoteLogSegmentId{{topicIdPartition={_topic_id_partition(segment_id.topic_id, segment_id.tp)}, "
            f"id={uuid_to_text(segment_id.id)}}}")


def _epochs(epochs: Mapping[int, int]) -> str:
    return "{" + ", ".join(f"{epoch}={epochs[epoch]}" for epoch in sorted(epochs)) + "}"


def _custom(custom: bytes | None) -> str:
    return "Optional.empty" if custom is None else f"Optional[CustomMetadata{{{len(custom)} bytes}}]"
