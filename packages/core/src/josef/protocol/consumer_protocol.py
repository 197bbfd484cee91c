"""The "consumer" embedded protocol: what classic-group members put in JoinGroup and SyncGroup.

A classic group's member metadata and assignments are opaque bytes to the
group protocol. Consumers fill them with ConsumerProtocolSubscription
(topics, user data, owned partitions from v1, generation v2, rack v3) and
ConsumerProtocolAssignment, each prefixed with its int16 version. The
client's leader member writes and reads them; the group coordinator peeks
at subscriptions to know a group's topics (OffsetDelete refuses to delete
offsets of a topic the group still consumes, and offsets of topics a stable
group no longer consumes may expire), as Kafka's does.
"""

from __future__ import annotations

import importlib
import io
from typing import Any, Iterable

import attrs
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from josef.protocol.errors import KafkaError
from josef.protocol.topic_partition import TopicPartition

__all__ = ["PROTOCOL_TYPE", "VERSION", "Subscription", "decode_assignment", "decode_subscription",
           "encode_assignment", "encode_subscription", "subscribed_topics"]

#: The protocol type of consumer groups; Kafka Connect uses "connect", which is opaque here.
PROTOCOL_TYPE = "consumer"
#: The newest ConsumerProtocolSubscription/Assignment version written (and read: newer ones only append fields).
VERSION = 3


@attrs.frozen
class Subscription:
    """What one member told the coordinator in JoinGroup (Kafka's ConsumerPartitionAssignor.Subscription)."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    #: Partitions the member owns now (sent by cooperative members; eager members revoke first and send none).
    owned_partitions: tuple[TopicPartition, ...] = ()
    #: The generation in which the member was given ``owned_partitions`` (-1: none).
    generation: int = -1
    rack_id: str | None = None
    #: The member's ``group.instance.id``: static members sort by it, so a restart keeps their place.
    group_instance_id: str | None = None

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "owned_partitions", tuple(self.owned_partitions))


def _schema(kind: str, version: int) -> type:
    module = importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")
    return getattr(module, f"ConsumerProtocol{kind.capitalize()}")


def _nested(kind: str, version: int) -> type:
    return importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data").TopicPartition


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for tp in sorted(set(partitions)):
        topics.setdefault(tp.topic, []).append(tp.partition)
    return topics


def _encode(cls: type, version: int, value: Any) -> bytes:
    buf = io.BytesIO()
    buf.write(version.to_bytes(2, "big", signed=True))
    entity_writer(cls)(buf, value)  # type: ignore[arg-type]
    return buf.getvalue()


def _read_version(data: bytes, what: str) -> int:
    if len(data) < 2:
        raise KafkaError(ErrorCode.inconsistent_group_protocol, f"{what} of {len(data)} bytes has no version")
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < 0:
        raise KafkaError(ErrorCode.inconsistent_group_protocol, f"{what} has version {version}")
    return min(version, VERSION)


def encode_subscription(sub: Subscription, version: int = VERSION) -> bytes:
    """ConsumerProtocolSubscription (v0-v3: owned partitions from v1, generation v2, rack v3), version-prefixed."""
    cls = _schema("subscription", version)
    fields: dict[str, Any] = {"topics": tuple(sub.topics), "user_data": sub.user_data}
    if version >= 1:
        nested = _nested("subscription", version)
        fields["owned_partitions"] = tuple(nested(topic=t, partitions=tuple(ps))
                                           for t, ps in _by_topic(sub.owned_partitions).items())
    if version >= 2:
        fields["generation_id"] = sub.generation
    if version >= 3:
        fields["rack_id"] = sub.rack_id
    return _encode(cls, version, cls(**fields))


def decode_subscription(data: bytes, group_instance_id: str | None = None) -> Subscription:
    """A member's subscription from JoinGroup metadata (any version; newer ones are read as v3)."""
    version = _read_version(data, "subscription")
    try:
        value, _ = entity_reader(_schema("subscription", version))(data, 2)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - kio raises a variety of errors on bad input
        raise KafkaError(ErrorCode.inconsistent_group_protocol, f"cannot decode subscription: {exc}") from None
    owned = tuple(TopicPartition(t.topic, p) for t in getattr(value, "owned_partitions", ()) for p in t.partitions)
    return Subscription(tuple(value.topics), None if value.user_data is None else bytes(value.user_data), owned,
                        getattr(value, "generation_id", -1), getattr(value, "rack_id", None), group_instance_id)


def encode_assignment(partitions: Iterable[TopicPartition], user_data: bytes | None = None,
                      version: int = VERSION) -> bytes:
    cls = _schema("assignment", version)
    nested = _nested("assignment", version)
    assigned = tuple(nested(topic=t, partitions=tuple(ps)) for t, ps in _by_topic(partitions).items())
    return _encode(cls, version, cls(assigned_partitions=assigned, user_data=user_data))


def decode_assignment(data: bytes) -> tuple[list[TopicPartition], bytes | None]:
    """(partitions, user data) from SyncGroup; empty bytes (a member the leader did not assign) is nothing."""
    if not data:
        return [], None
    version = _read_version(data, "assignment")
    try:
        value, _ = entity_reader(_schema("assignment", version))(data, 2)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001
        raise KafkaError(ErrorCode.inconsistent_group_protocol, f"cannot decode assignment: {exc}") from None
    partitions = sorted(TopicPartition(t.topic, p) for t in value.assigned_partitions for p in t.partitions)
    return partitions, None if value.user_data is None else bytes(value.user_data)


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """The topics of a member's ConsumerProtocolSubscription; None when it cannot be read."""
    try:
        return set(decode_subscription(metadata).topics)
    except KafkaError:
        return None
