"""Metadata records: Kafka's own KRaft records, in Kafka's binary format.

Every change to cluster state is one of these, appended to the metadata log
(``__cluster_metadata``). The classes follow the schemas of Kafka's
``metadata/*.json`` field for field, at the version Kafka 4.x writes, and are
declared the way kio declares protocol messages so kio's native reader and
writer serialise them. A record is stored as the value of one Kafka record,
framed as Kafka's ``ApiMessageAndVersion``: unsigned varints for the frame
version (1), the record's api key and its version, then the body in the
flexible (tagged-field) encoding. Kafka's ``kafka-dump-log.sh
--cluster-metadata-decoder`` reads a josef metadata log, and josef reads
Kafka's.

The module is evaluated without postponed annotations because kio reads
the field types.

Older versions of a record are read where their layout is the one declared
here apart from tagged fields (``_OLDEST_READABLE``); anything else is refused
with a clear error rather than misread.
"""

import base64
import io
import uuid
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, ClassVar, Union

import attrs
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

#: Resource types of ConfigRecord, numbered as in DescribeConfigs.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
#: A client-metrics subscription (KIP-714, Kafka's ConfigResource.Type.CLIENT_METRICS): :mod:`josef.metadata.client_metrics`.
CLIENT_METRICS_RESOURCE = 16
#: A consumer or share group's configs (Kafka's ConfigResource.Type.GROUP, KIP-848/KIP-932).
GROUP_RESOURCE = 32
#: ``PartitionChangeRecord.leader`` when the leader did not change.
NO_LEADER_CHANGE = -2
#: Kafka's ``SecurityProtocol`` ids, as RegisterBrokerRecord stores them.
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
SECURITY_PROTOCOL_NAMES = {number: name for name, number in SECURITY_PROTOCOLS.items()}
FRAME_VERSION = 1
#: Producer ids per AllocateProducerIds answer: the block a ProducerIdsRecord takes (Kafka's
#: ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE).
PRODUCER_ID_BLOCK_SIZE = 1000
#: A client-quota entity as the image keys it: sorted ``(entity type, name)`` pairs; a None name is the default.
QuotaEntity = tuple[tuple[str, "str | None"], ...]


def random_uuid() -> str:
    """A Kafka-style UUID: URL-safe base64 of 16 random bytes, no padding (22 characters)."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line flags
            return text


def uuid_from_text(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


def uuid_to_text(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _f(kafka_type: str, default: Any = MISSING, tag: int | None = None) -> Any:
    """A schema field as kio reads it: its Kafka type, optional tag and default."""
    metadata: dict[str, Any] = {"kafka_type": kafka_type}
    if tag is not None:
        metadata["tag"] = tag
    return field(metadata=metadata, default=default)


def _nested(default: Any = (), tag: int | None = None) -> Any:
    return field(metadata={} if tag is None else {"tag": tag}, default=default)


_record = dataclass(frozen=True, slots=True, kw_only=True)


@attrs.frozen
class Endpoint:
    """A listener of a broker, as the broker's image holds it (not a record)."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@_record
class BrokerEndpoint:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    name: str = _f("string")
    host: str = _f("string")
    port: int = _f("uint16")
    security_protocol: i16 = _f("int16")


@_record
class BrokerFeature:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    name: str = _f("string")
    min_supported_version: i16 = _f("int16")
    max_supported_version: i16 = _f("int16")


@_record
class RegisterBrokerRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 0
    broker_id: i32 = _f("int32")
    is_migrating_zk_broker: bool = _f("bool", False)
    incarnation_id: uuid.UUID = _f("uuid")
    broker_epoch: i64 = _f("int64")
    end_points: tuple[BrokerEndpoint, ...] = _nested()
    features: tuple[BrokerFeature, ...] = _nested()
    rack: str | None = _f("string", None)
    fenced: bool = _f("bool", True)
    in_controlled_shutdown: bool = _f("bool", False)
    log_dirs: tuple[uuid.UUID, ...] = _f("uuid", (), tag=0)


@_record
class UnregisterBrokerRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 1
    broker_id: i32 = _f("int32")
    broker_epoch: i64 = _f("int64")


@_record
class TopicRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 2
    name: str = _f("string")
    topic_id: uuid.UUID = _f("uuid")


@_record
class PartitionRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 3
    partition_id: i32 = _f("int32", i32(-1))
    topic_id: uuid.UUID = _f("uuid")
    replicas: tuple[i32, ...] = _f("int32", ())
    isr: tuple[i32, ...] = _f("int32", ())
    removing_replicas: tuple[i32, ...] = _f("int32", ())
    adding_replicas: tuple[i32, ...] = _f("int32", ())
    leader: i32 = _f("int32", i32(-1))
    leader_recovery_state: i8 = _f("int8", i8(0), tag=0)
    leader_epoch: i32 = _f("int32", i32(-1))
    partition_epoch: i32 = _f("int32", i32(-1))
    directories: tuple[uuid.UUID, ...] = _f("uuid", ())
    eligible_leader_replicas: tuple[i32, ...] | None = _f("int32", None, tag=1)
    last_known_elr: tuple[i32, ...] | None = _f("int32", None, tag=2)


@_record
class ConfigRecord:
    """Sets (value is a string) or removes (value is None) one dynamic config."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 4
    resource_type: i8 = _f("int8")
    resource_name: str = _f("string")
    name: str = _f("string")
    value: str | None = _f("string", None)


@_record
class PartitionChangeRecord:
    """What changed in one partition; a None field (or leader -2) did not change.

    Applying one bumps the partition epoch, and the leader epoch when the
    leader changed, as Kafka's PartitionRegistration.merge does.
    """

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 5
    partition_id: i32 = _f("int32", i32(-1))
    topic_id: uuid.UUID = _f("uuid")
    isr: tuple[i32, ...] | None = _f("int32", None, tag=0)
    leader: i32 = _f("int32", i32(NO_LEADER_CHANGE), tag=1)
    replicas: tuple[i32, ...] | None = _f("int32", None, tag=2)
    removing_replicas: tuple[i32, ...] | None = _f("int32", None, tag=3)
    adding_replicas: tuple[i32, ...] | None = _f("int32", None, tag=4)
    leader_recovery_state: i8 = _f("int8", i8(-1), tag=5)
    eligible_leader_replicas: tuple[i32, ...] | None = _f("int32", None, tag=6)
    last_known_elr: tuple[i32, ...] | None = _f("int32", None, tag=7)
    directories: tuple[uuid.UUID, ...] | None = _f("uuid", None, tag=8)


@_record
class FenceBrokerRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 7
    id: i32 = _f("int32")
    epoch: i64 = _f("int64")


@_record
class UnfenceBrokerRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 8
    id: i32 = _f("int32")
    epoch: i64 = _f("int64")


@_record
class RemoveTopicRecord:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 9
    topic_id: uuid.UUID = _f("uuid")


@_record
class UserScramCredentialRecord:
    """Sets one user's SCRAM credential for one mechanism (1: SCRAM-SHA-256, 2: SCRAM-SHA-512); never a password."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 11
    name: str = _f("string")
    mechanism: i8 = _f("int8")
    salt: bytes = _f("bytes")
    stored_key: bytes = _f("bytes")
    server_key: bytes = _f("bytes")
    iterations: i32 = _f("int32")

    def __repr__(self) -> str:  # the keys stay out of logs and tracebacks
        return f"UserScramCredentialRecord(name={self.name!r}, mechanism={self.mechanism}, iterations={self.iterations})"


@_record
class FeatureLevelRecord:
    """The finalized level of one feature (``metadata.version`` above all); level 0 removes it."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 12
    name: str = _f("string")
    feature_level: i16 = _f("int16")


@_record
class EntityData:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    entity_type: str = _f("string")
    entity_name: str | None = _f("string", None)


@_record
class ClientQuotaRecord:
    """Sets, or removes (``remove``), one quota of a client entity."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 14
    entity: tuple[EntityData, ...] = _nested()
    key: str = _f("string")
    value: float = _f("float64")
    remove: bool = _f("bool", False)


def quota_entity(record: ClientQuotaRecord) -> QuotaEntity:
    """The entity a ClientQuotaRecord names, as images key quotas: ``(entity type, name or None)`` pairs, sorted."""
    return tuple(sorted((e.entity_type, e.entity_name) for e in record.entity))


@_record
class ProducerIdsRecord:
    """A block of producer ids went to ``broker_id``: every id below ``next_producer_id`` is taken for good.

    Kafka's AllocateProducerIds result. Ids are never reused, across
    restarts too, because the image's ``next_producer_id`` only grows.
    """

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 15
    broker_id: i32 = _f("int32")
    broker_epoch: i64 = _f("int64", i64(-1))
    next_producer_id: i64 = _f("int64")


@_record
class BrokerRegistrationChangeRecord:
    """Fences (1), unfences (-1) or marks in controlled shutdown a registered broker."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 17
    broker_id: i32 = _f("int32")
    broker_epoch: i64 = _f("int64")
    fenced: i8 = _f("int8", i8(0), tag=0)
    in_controlled_shutdown: i8 = _f("int8", i8(0), tag=1)
    log_dirs: tuple[uuid.UUID, ...] = _f("uuid", (), tag=2)


@_record
class AccessControlEntryRecord:
    """One ACL (Kafka's record, written by CreateAcls): codes as in :mod:`josef.acls`."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 18
    id: uuid.UUID = _f("uuid")
    resource_type: i8 = _f("int8")
    resource_name: str = _f("string")
    pattern_type: i8 = _f("int8")
    principal: str = _f("string")
    host: str = _f("string")
    operation: i8 = _f("int8")
    permission_type: i8 = _f("int8")


@_record
class RemoveAccessControlEntryRecord:
    """Removes the ACL ``id`` (DeleteAcls)."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 19
    id: uuid.UUID = _f("uuid")


@_record
class RemoveUserScramCredentialRecord:
    """Removes one user's SCRAM credential for one mechanism (AlterUserScramCredentials' deletions)."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 22
    name: str = _f("string")
    mechanism: i8 = _f("int8")


@_record
class DelegationTokenRecord:
    """Creates or updates (renewal, a later expiry) one delegation token; its HMAC is never stored, only derived.

    Principals are stored as Kafka writes them (``User:alice``), so Kafka's
    metadata tools read the record as theirs.
    """

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 10
    owner: str = _f("string")
    requester: str = _f("string")
    renewers: tuple[str, ...] = _f("string", ())
    issue_timestamp: i64 = _f("int64")
    max_timestamp: i64 = _f("int64")
    expiration_timestamp: i64 = _f("int64")
    token_id: str = _f("string")


@_record
class RemoveDelegationTokenRecord:
    """Removes one delegation token: expired by its owner or a renewer, or past its expiry (the controller's sweep)."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 26
    token_id: str = _f("string")


@_record
class ClearElrRecord:
    """Empties the eligible leader replicas (and last known ELR) of one topic's partitions, of every topic's when
    the name is empty: written when a ``min.insync.replicas`` they were chosen under changes (KIP-966)."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 28
    topic_name: str = _f("string")


@_record
class NoOpRecord:
    """Written by an idle controller so followers see the log advance (Kafka's NoOpRecord)."""

    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    api_key: ClassVar[int] = 20


MetadataRecord = Union[
    RegisterBrokerRecord, UnregisterBrokerRecord, TopicRecord, PartitionRecord, ConfigRecord, PartitionChangeRecord,
    FenceBrokerRecord, UnfenceBrokerRecord, RemoveTopicRecord, FeatureLevelRecord, ClientQuotaRecord,
    ProducerIdsRecord, BrokerRegistrationChangeRecord, AccessControlEntryRecord, RemoveAccessControlEntryRecord,
    NoOpRecord, UserScramCredentialRecord, RemoveUserScramCredentialRecord, DelegationTokenRecord,
    RemoveDelegationTokenRecord, ClearElrRecord,
]
_TYPES: tuple[type, ...] = MetadataRecord.__args__  # type: ignore[attr-defined]
_BY_KEY: dict[int, type] = {cls.api_key: cls for cls in _TYPES}
#: The oldest version of a record that has the declared layout (newer fields are all tagged).
_OLDEST_READABLE = {RegisterBrokerRecord: 2, PartitionRecord: 1, PartitionChangeRecord: 0,
                    BrokerRegistrationChangeRecord: 0}
_WRITERS: dict[type, Callable[[Any, Any], None]] = {cls: entity_writer(cls) for cls in _TYPES}  # type: ignore[arg-type]
_READERS: dict[type, Callable[..., Any]] = {cls: entity_reader(cls) for cls in _TYPES}  # type: ignore[arg-type]
_HEADERS = {cls: bytes([FRAME_VERSION, cls.api_key, cls.__version__]) for cls in _TYPES}  # all below 128: one byte each


class UnknownRecordError(ValueError):
    """A metadata record josef cannot read: an unknown type or version, or bytes that are not a record."""


def encode(record: MetadataRecord) -> bytes:
    """``record`` framed as Kafka's ApiMessageAndVersion."""
    out = io.BytesIO()
    out.write(_HEADERS[type(record)])
    _WRITERS[type(record)](out, record)
    return out.getvalue()


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise UnknownRecordError("truncated metadata record header")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise UnknownRecordError("metadata record header varint is too long")


def read_frame(data: bytes) -> tuple[int, int, int]:
    """``(api key, version, body offset)`` of a framed record; :class:`UnknownRecordError` if the frame is not 1."""
    frame, pos = _uvarint(data, 0)
    if frame != FRAME_VERSION:
        raise UnknownRecordError(f"metadata record frame version {frame} is not {FRAME_VERSION}: {bytes(data[:16])!r}")
    key, pos = _uvarint(data, pos)
    version, pos = _uvarint(data, pos)
    return key, version, pos


def decode(data: bytes) -> MetadataRecord:
    """The record framed in ``data``; raises :class:`UnknownRecordError` for what josef cannot read."""
    key, version, pos = read_frame(data)
    cls = _BY_KEY.get(key)
    if cls is None:
        raise UnknownRecordError(f"metadata record type {key} (version {version}) is not one josef reads")
    if not _OLDEST_READABLE.get(cls, cls.__version__) <= version <= cls.__version__:
        raise UnknownRecordError(f"{cls.__name__} version {version} is not one josef reads "
                                 f"(it reads {_OLDEST_READABLE.get(cls, cls.__version__)}-{cls.__version__})")
    try:
        record, size = _READERS[cls](data, pos)
    except Exception as exc:  # kio raises several types for short or malformed bodies
        raise UnknownRecordError(f"malformed {cls.__name__} v{version}: {exc}") from exc
    if pos + size != len(data):
        raise UnknownRecordError(f"{len(data) - pos - size} bytes after a {cls.__name__}")
    return record  # type: ignore[no-any-return]
