"""Metadata records: every change to cluster state is one of these, appended to the metadata log.

They mirror Kafka's KRaft records (``metadata/*.json``: RegisterBrokerRecord,
TopicRecord, PartitionRecord, RemoveTopicRecord, ConfigRecord,
ProducerIdsRecord) field for
field where josef uses the field. A record is stored as the value of one
Kafka record, encoded as JSON tagged with its type and version, so a metadata
log stays readable with ordinary tools.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any, Union

import attrs

#: Resource types of ConfigRecord, numbered as in DescribeConfigs.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


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


@attrs.frozen
class Endpoint:
    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


def _endpoints(value: Any) -> tuple[Endpoint, ...]:
    return tuple(e if isinstance(e, Endpoint) else Endpoint(**e) for e in value)


@attrs.frozen
class RegisterBrokerRecord:
    broker_id: int
    incarnation_id: str
    endpoints: tuple[Endpoint, ...] = attrs.field(converter=_endpoints)
    rack: str | None = None
    fenced: bool = False


@attrs.frozen
class TopicRecord:
    name: str
    topic_id: str


@attrs.frozen
class PartitionRecord:
    topic_id: str
    partition_id: int
    replicas: tuple[int, ...] = attrs.field(converter=tuple)
    isr: tuple[int, ...] = attrs.field(converter=tuple)
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0


@attrs.frozen
class RemoveTopicRecord:
    topic_id: str


@attrs.frozen
class ConfigRecord:
    """Sets (value is a string) or removes (value is None) one dynamic config."""

    resource_type: int
    resource_name: str
    name: str
    value: str | None


@attrs.frozen
class ProducerIdsRecord:
    """A block of producer ids went to ``broker_id``: every id below ``next_producer_id`` is taken for good.

    Kafka's AllocateProducerIds result. Ids are never reused, across
    restarts too, because the image's ``next_producer_id`` only grows.
    """

    broker_id: int
    broker_epoch: int
    next_producer_id: int


#: A client-quota entity: sorted ``(entity type, name)`` pairs; a None name is the type's default entity.
QuotaEntity = tuple[tuple[str, "str | None"], ...]


def _entity(value: Any) -> QuotaEntity:
    return tuple(sorted((str(t), n) for t, n in value))


@attrs.frozen
class ClientQuotaRecord:
    """Sets, or removes (``remove``), one quota of a client entity (Kafka's ClientQuotaRecord)."""

    entity: QuotaEntity = attrs.field(converter=_entity)
    key: str
    value: float
    remove: bool = False


MetadataRecord = Union[
    RegisterBrokerRecord, TopicRecord, PartitionRecord, RemoveTopicRecord, ConfigRecord, ProducerIdsRecord,
    ClientQuotaRecord,
]

_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (RegisterBrokerRecord, TopicRecord, PartitionRecord, RemoveTopicRecord, ConfigRecord, ProducerIdsRecord,
                ClientQuotaRecord)
}
_VERSION = 0


def encode(record: MetadataRecord) -> bytes:
    return json.dumps(
        {"type": type(record).__name__, "version": _VERSION, "data": attrs.asdict(record)},
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> MetadataRecord:
    try:
        doc = json.loads(data)
        cls = _TYPES[doc["type"]]
    except (ValueError, KeyError) as exc:
        raise ValueError(f"not a josef metadata record: {data[:80]!r}") from exc
    return cls(**doc["data"])  # type: ignore[no-any-return]
