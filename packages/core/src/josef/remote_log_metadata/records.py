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
import io
import struct
import uuid
from collections.abc import Mapping
from typing import IO, Any, TypeVar

import attrs
from kio.serial.errors import BufferUnderflow, InvalidUnicode, SerialError, UnexpectedNull
from kio.serial.readers import (
    Reader,
    read_compact_string,
    read_compact_string_as_bytes_nullable,
    read_int8,
    read_int32,
    read_int64,
    read_unsigned_varint,
    read_uuid,
)
from kio.serial.writers import (
    write_compact_array_length,
    write_compact_string,
    write_empty_tagged_fields,
    write_int8,
    write_int32,
    write_int64,
    write_nullable_compact_string,
    write_unsigned_varint,
    write_uuid,
)
from kio.static.constants import uuid_zero

from josef.coordinator.hashing import murmur2, to_positive
from josef.metadata.records import uuid_to_text
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

#: The version of the frame before every record: 0 was KRaft's preview format, which Kafka refuses too.
FRAME_VERSION = 1

#: The api keys of the four records, as their JSON schemas number them.
SEGMENT_METADATA_API_KEY = 0
SEGMENT_METADATA_UPDATE_API_KEY = 1
PARTITION_DELETE_API_KEY = 2
SEGMENT_METADATA_SNAPSHOT_API_KEY = 3

#: The version josef writes of every record type (flexible from 0), which every Kafka since 3.6 reads.
RECORD_VERSION = 0
#: The highest version read: Kafka's version 1 of the segment records adds only tagged fields (the broker's leader
#: epoch, an update's end offset) that nothing here needs, so a reader skips them as any unknown tagged field.
MAX_RECORD_VERSION = 1
#: TxnIndexEmpty (KIP-1058, Kafka 4.0): tagged field 0 of RemoteLogSegmentMetadataRecord and of its snapshot record.
TXN_INDEX_EMPTY_TAG = 0
_SEGMENT_RECORDS = (SEGMENT_METADATA_API_KEY, SEGMENT_METADATA_SNAPSHOT_API_KEY)

_RECORD_NAMES = {
    SEGMENT_METADATA_API_KEY: "RemoteLogSegmentMetadataRecord",
    SEGMENT_METADATA_UPDATE_API_KEY: "RemoteLogSegmentMetadataUpdateRecord",
    PARTITION_DELETE_API_KEY: "RemotePartitionDeleteMetadataRecord",
    SEGMENT_METADATA_SNAPSHOT_API_KEY: "RemoteLogSegmentMetadataSnapshotRecord",
}

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
    txn_index_empty: bool = False

    def __attrs_post_init__(self) -> None:
        RemoteLogSegmentMetadata.check_leader_epochs(self.segment_leader_epochs)

    @classmethod
    def of(cls, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadataSnapshot:
        return cls(metadata.segment_id.id, metadata.start_offset, metadata.end_offset, metadata.max_timestamp_ms,
                   metadata.broker_id, metadata.event_timestamp_ms, metadata.segment_size_in_bytes,
                   metadata.custom_metadata, metadata.state, dict(metadata.segment_leader_epochs),
                   metadata.txn_index_empty)

    def to_metadata(self, topic_id: uuid.UUID, tp: TopicPartition) -> RemoteLogSegmentMetadata:
        """The full metadata again, given the partition the snapshot belongs to."""
        return RemoteLogSegmentMetadata(RemoteLogSegmentId(topic_id, tp, self.segment_id), self.start_offset,
                                        self.end_offset, self.max_timestamp_ms, self.broker_id,
                                        self.event_timestamp_ms, self.segment_size_in_bytes,
                                        dict(self.segment_leader_epochs), self.state, self.custom_metadata,
                                        self.txn_index_empty)


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


# Writing: kio's writers, field by field onto a stream -------------------------------------------------------------


def _write_string(out: IO[bytes], value: str) -> None:
    data = value.encode()
    if len(data) > _MAX_STRING:
        raise ValueError(f"a string of {len(data)} bytes is too long to be serialized")
    write_compact_string(out, data)


def _write_topic_id_partition(out: IO[bytes], topic_id: uuid.UUID, tp: TopicPartition) -> None:
    """A TopicIdPartitionEntry: Name, Id, Partition, tags."""
    _write_string(out, tp.topic)
    write_uuid(out, topic_id)  # most significant long first, as Kafka's writeUuid
    write_int32(out, tp.partition)
    write_empty_tagged_fields(out)


def _write_segment_id(out: IO[bytes], segment_id: RemoteLogSegmentId) -> None:
    """A RemoteLogSegmentIdEntry: TopicIdPartition, Id, tags."""
    _write_topic_id_partition(out, segment_id.topic_id, segment_id.tp)
    write_uuid(out, segment_id.id)
    write_empty_tagged_fields(out)


def _write_segment_fields(out: IO[bytes], record: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataSnapshot) -> None:
    """The fields after the segment's id, the same in RemoteLogSegmentMetadataRecord and its snapshot record."""
    write_int64(out, record.start_offset)
    write_int64(out, record.end_offset)
    write_int32(out, record.broker_id)
    write_int64(out, record.max_timestamp_ms)
    write_int64(out, record.event_timestamp_ms)
    epochs = record.segment_leader_epochs
    write_compact_array_length(out, len(epochs))
    for epoch in sorted(epochs):  # Kafka iterates a TreeMap: ascending epochs
        write_int32(out, epoch)
        write_int64(out, epochs[epoch])
        write_empty_tagged_fields(out)
    write_int32(out, record.segment_size_in_bytes)
    write_nullable_compact_string(out, record.custom_metadata)  # compact nullable bytes: the same encoding
    write_int8(out, record.state)


def _segment_tags(record: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataSnapshot) -> dict[int, bytes]:
    """The tagged fields of a segment record: TxnIndexEmpty when true (a tagged field at its default is left out)."""
    return {TXN_INDEX_EMPTY_TAG: b"\x01"} if record.txn_index_empty else {}


def _write_tagged_fields(out: IO[bytes], fields: Mapping[int, bytes]) -> None:
    """A tagged-field section: the count, then each field's tag, size and bytes, by ascending tag."""
    write_unsigned_varint(out, len(fields))
    for tag in sorted(fields):
        write_unsigned_varint(out, tag)
        write_unsigned_varint(out, len(fields[tag]))
        out.write(fields[tag])


def encode(record: RemoteLogMetadata) -> bytes:
    """The value of a ``__remote_log_metadata`` record (its key is null), as ``RemoteLogMetadataSerde.serialize``."""
    out = io.BytesIO()
    tags: dict[int, bytes] = {}
    try:
        if isinstance(record, RemoteLogSegmentMetadata):
            api_key = SEGMENT_METADATA_API_KEY
            _write_segment_id(out, record.segment_id)
            _write_segment_fields(out, record)
            tags = _segment_tags(record)
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            api_key = SEGMENT_METADATA_UPDATE_API_KEY
            _write_segment_id(out, record.segment_id)
            write_int32(out, record.broker_id)
            write_int64(out, record.event_timestamp_ms)
            write_nullable_compact_string(out, record.custom_metadata)
            write_int8(out, record.state)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            api_key = PARTITION_DELETE_API_KEY
            _write_topic_id_partition(out, record.topic_id, record.tp)
            write_int32(out, record.broker_id)
            write_int64(out, record.event_timestamp_ms)
            write_int8(out, record.state)
        elif isinstance(record, RemoteLogSegmentMetadataSnapshot):
            api_key = SEGMENT_METADATA_SNAPSHOT_API_KEY
            write_uuid(out, record.segment_id)
            _write_segment_fields(out, record)
            tags = _segment_tags(record)
        else:
            raise TypeError(f"{type(record).__name__} is not a record of __remote_log_metadata")
        _write_tagged_fields(out, tags)
    except struct.error as exc:  # an int out of its field's range (kio's writers pack with struct)
        raise ValueError(f"cannot encode {record}: {exc}") from None
    frame = io.BytesIO()
    for value in (FRAME_VERSION, api_key, RECORD_VERSION):
        write_unsigned_varint(frame, value)
    return frame.getvalue() + out.getvalue()


# Reading: kio's readers, with kio's errors turned into ValueErrors that say where ------------------------------------

_T = TypeVar("_T")
_State = TypeVar("_State", RemoteLogSegmentState, RemotePartitionDeleteState)


class _Cursor:
    """The position of decoding in a record's bytes, each field read by a kio reader.

    kio raises its own errors (``BufferUnderflow``, ``UnexpectedNull``,
    ``InvalidUnicode``) and a bare ValueError for a varint of more than 5
    bytes; every one becomes a ValueError naming the field and the position.
    """

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data  # bytes: kio's readers refuse a writable buffer
        self.pos = 0
        self.what = what

    def truncated(self, field: str) -> ValueError:
        return ValueError(f"the {self.what} is truncated: {field} at position {self.pos} runs past the end of its "
                          f"{len(self.data)} byte(s)")

    def read(self, reader: Reader[_T], field: str) -> _T:
        try:
            value, size = reader(self.data, self.pos)
        except BufferUnderflow:
            raise self.truncated(field) from None
        except UnexpectedNull:
            raise ValueError(f"non-nullable field {field} was serialized as null") from None
        except InvalidUnicode:
            raise ValueError(f"string field {field} is not UTF-8") from None
        except SerialError as exc:
            raise ValueError(f"field {field} of the {self.what} at position {self.pos} is malformed: {exc}") from None
        except ValueError:  # kio's one bare ValueError on a read-only buffer: its varint reader's
            raise ValueError(f"a varint of the {self.what} is longer than 5 bytes ({field} at position "
                             f"{self.pos})") from None
        self.pos += size
        return value

    def uvarint(self, field: str) -> int:
        """An unsigned varint as Kafka's ``readUnsignedVarint`` has it: an int32, the bits of a 5th byte past it lost."""
        return self.read(read_unsigned_varint, field) & 0xFFFFFFFF

    def uuid_(self, field: str) -> uuid.UUID:
        value = self.read(read_uuid, field)
        return uuid_zero if value is None else value  # kio reads the zero uuid as None; Kafka, as a uuid

    def string(self, field: str) -> str:
        """A compact string, its length checked against Kafka's limit before its bytes are read."""
        start = self.pos
        length = self.uvarint(field) - 1
        if length > _MAX_STRING:
            raise ValueError(f"string field {field} had invalid length {length}")
        self.pos = start
        return self.read(read_compact_string, field)

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged fields, by tag, their values undecoded: the caller takes those it knows; the rest are a newer
        writer's (kept by Kafka as unknown tagged fields, which change nothing it does)."""
        fields = {}
        for _ in range(self.uvarint("the count of tagged fields")):
            tag = self.uvarint("a tag")
            size = self.uvarint("the size of a tagged field")
            if size > len(self.data) - self.pos:
                raise self.truncated("a tagged field")
            fields[tag] = self.data[self.pos:self.pos + size]
            self.pos += size
        return fields

    def txn_index_empty(self, tags: dict[int, bytes]) -> bool:
        value = tags.get(TXN_INDEX_EMPTY_TAG, b"\0")
        if value not in (b"\0", b"\1"):
            raise ValueError(f"tagged field txnIndexEmpty is not a boolean: {value.hex()}")
        return value == b"\1"

    def state(self, states: type[_State], field: str, what: str) -> _State:
        value = self.read(read_int8, field)
        try:
            return states(value)
        except ValueError:
            raise ValueError(f"unknown {what} {value}") from None

    def topic_id_partition(self) -> tuple[uuid.UUID, TopicPartition]:
        name = self.string("name")
        topic_id = self.uuid_("id")
        partition = self.read(read_int32, "partition")
        self.tagged_fields()
        return topic_id, TopicPartition(name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        topic_id, tp = self.topic_id_partition()
        segment = self.uuid_("id")
        self.tagged_fields()
        return RemoteLogSegmentId(topic_id, tp, segment)

    def leader_epochs(self) -> dict[int, int]:
        count = self.uvarint("segmentLeaderEpochs") - 1
        if count < 0:
            raise ValueError("non-nullable field segmentLeaderEpochs was serialized as null")
        if count > len(self.data) - self.pos:
            raise ValueError(f"segmentLeaderEpochs claims {count} entries with only {len(self.data) - self.pos} "
                             "byte(s) left")
        epochs: dict[int, int] = {}
        for _ in range(count):
            epoch = self.read(read_int32, "leaderEpoch")
            epochs[epoch] = self.read(read_int64, "offset")  # a repeated epoch: the last one wins, as Kafka's HashMap
            self.tagged_fields()
        return epochs

    def segment_state(self) -> RemoteLogSegmentState:
        return self.state(RemoteLogSegmentState, "remoteLogSegmentState", "remote log segment state")

    def segment_fields(self) -> dict[str, Any]:
        """The fields after the segment's id, the same in RemoteLogSegmentMetadataRecord and its snapshot record, by
        the names of the josef types' attributes."""
        return {
            "start_offset": self.read(read_int64, "startOffset"),
            "end_offset": self.read(read_int64, "endOffset"),
            "broker_id": self.read(read_int32, "brokerId"),
            "max_timestamp_ms": self.read(read_int64, "maxTimestampMs"),
            "event_timestamp_ms": self.read(read_int64, "eventTimestampMs"),
            "segment_leader_epochs": self.leader_epochs(),
            "segment_size_in_bytes": self.read(read_int32, "segmentSizeInBytes"),
            "custom_metadata": self.read(read_compact_string_as_bytes_nullable, "customMetadata"),
            "state": self.segment_state(),
        }


def decode(data: bytes) -> RemoteLogMetadata:
    """A record's value back into its josef type, as ``RemoteLogMetadataSerde.deserialize``.

    Raises :class:`ValueError` for anything that is not one whole record of
    a known type and version, with what is wrong (frame version, api key,
    version, truncation, trailing bytes, an impossible field).
    """
    r = _Cursor(bytes(data), "record frame")
    frame_version = r.uvarint("frameVersion")
    if frame_version == 0:
        raise ValueError("Could not deserialize metadata record with frame version 0 (the KRaft preview format)")
    if frame_version != FRAME_VERSION:
        raise ValueError(f"Could not deserialize metadata record due to unknown frame version {frame_version} "
                         f"(only frame version {FRAME_VERSION} is supported)")
    api_key = r.uvarint("apiKey")
    version = r.uvarint("version")
    name = _RECORD_NAMES.get(api_key)
    if name is None:
        raise ValueError(f"unknown __remote_log_metadata record type (api key) {api_key}")
    if version > MAX_RECORD_VERSION:
        raise ValueError(f"Can't read version {version} of {name} (versions up to {MAX_RECORD_VERSION} are known)")
    r.what = name
    record: RemoteLogMetadata
    try:
        if api_key == SEGMENT_METADATA_API_KEY:
            record = RemoteLogSegmentMetadata(r.segment_id(), **r.segment_fields())
        elif api_key == SEGMENT_METADATA_UPDATE_API_KEY:
            segment_id = r.segment_id()
            broker, event_ts = r.read(read_int32, "brokerId"), r.read(read_int64, "eventTimestampMs")
            custom, state = r.read(read_compact_string_as_bytes_nullable, "customMetadata"), r.segment_state()
            record = RemoteLogSegmentMetadataUpdate(segment_id, custom, state, event_ts, broker)
        elif api_key == PARTITION_DELETE_API_KEY:
            topic_id, tp = r.topic_id_partition()
            broker, event_ts = r.read(read_int32, "brokerId"), r.read(read_int64, "eventTimestampMs")
            delete_state = r.state(RemotePartitionDeleteState, "remotePartitionDeleteState",
                                   "remote partition delete state")
            record = RemotePartitionDeleteMetadata(topic_id, tp, delete_state, event_ts, broker)
        else:
            record = RemoteLogSegmentMetadataSnapshot(r.uuid_("segmentId"), **r.segment_fields())
        tags = r.tagged_fields()
        if api_key in _SEGMENT_RECORDS:
            record = attrs.evolve(record, txn_index_empty=r.txn_index_empty(tags))  # type: ignore[misc]
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
                f"customMetadata={_custom(record.custom_metadata)}, state={record.state.name}, "
                f"txnIdxEmpty={_java_bool(record.txn_index_empty)}}}")
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
                f"customMetadata={_custom(record.custom_metadata)}, state={record.state.name}, "
                f"txnIdxEmpty={_java_bool(record.txn_index_empty)}}}")
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


def _java_bool(value: bool) -> str:
    return "true" if value else "false"
