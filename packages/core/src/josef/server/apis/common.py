"""Small helpers shared by API handlers."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from josef.log import LogDirError, OffsetMovedToTieredStorageError, OffsetOutOfRangeError
from josef.metadata.records import uuid_to_text
from josef.replication.partition import Partition, PartitionError
from josef.protocol.records import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from josef.protocol.topic_partition import TopicPartition
from josef.server.dispatch import RequestContext


def error_of(exc: Exception) -> tuple[ErrorCode, str]:
    """The Kafka error code and message an exception raised under a handler stands for."""
    if isinstance(exc, PartitionError):
        return exc.code, exc.message
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.message_too_large, str(exc)
    if isinstance(exc, CorruptRecordError):
        return ErrorCode.corrupt_message, str(exc)
    if isinstance(exc, InvalidRecordError):
        return ErrorCode.invalid_record, str(exc)
    if isinstance(exc, OffsetOutOfRangeError):
        return ErrorCode.offset_out_of_range, str(exc)
    if isinstance(exc, OffsetMovedToTieredStorageError):
        return ErrorCode.offset_moved_to_tiered_storage, str(exc)
    if isinstance(exc, LogDirError):
        return ErrorCode.kafka_storage_error, str(exc)
    raise exc


def id_text(value: uuid.UUID | None) -> str:
    """A topic or incarnation id of a request as text. kio reads the zero UUID as None; Kafka's zero id names
    nothing, so it is looked up as the zero id and found nowhere (UNKNOWN_TOPIC_ID), never a crash."""
    return uuid_to_text(uuid.UUID(int=0) if value is None else value)


def topic_name(ctx: RequestContext, topic: Any) -> str | None:
    """The name of a request's topic entry, which newer versions give as a topic id."""
    name = getattr(topic, "name", None) or getattr(topic, "topic", None)
    if name:
        return str(name)
    topic_id = getattr(topic, "topic_id", None)
    return None if topic_id is None else topic_name_of_id(ctx, topic_id)


def topic_name_of_id(ctx: RequestContext, topic_id: uuid.UUID) -> str | None:
    """The name of the topic with ``topic_id``, or None when this broker does not know it."""
    image = ctx.broker.image.topic_by_id(uuid_to_text(topic_id))
    return image.name if image else None


def partition_for(ctx: RequestContext, topic: str | None, index: int) -> Partition:
    """The hosted partition, or the error a client expects when it is not here."""
    if topic is None:
        raise PartitionError(ErrorCode.unknown_topic_id, "unknown topic id")
    partition = ctx.broker.replicas.get(TopicPartition(topic, index))
    if partition is None:
        image = ctx.broker.image.topics.get(topic)
        if image is not None and index in image.partitions:
            raise PartitionError(ErrorCode.not_leader_or_follower, f"{topic}-{index} is not hosted here")
        raise PartitionError(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist")
    return partition


#: Errors after which a client should go to another leader: KIP-951 tells it which one in the response.
LEADER_MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})


def current_leader(ctx: RequestContext, topic: str | None, index: int, code: ErrorCode) -> dict[str, int]:
    """The leader and epoch the image names for a partition whose request failed with ``code`` (KIP-951)."""
    topic_image = ctx.broker.image.topics.get(topic or "")
    state = topic_image.partitions.get(index) if topic_image is not None and code in LEADER_MOVED else None
    if state is None:
        return {"leader_id": -1, "leader_epoch": -1}
    return {"leader_id": state.leader, "leader_epoch": state.leader_epoch}


def leader_endpoints(ctx: RequestContext, leaders: list[dict[str, int] | None]) -> list[dict[str, Any]]:
    """The endpoints, on the request's listener, of the leaders named in a response's ``current_leader`` fields."""
    image = ctx.broker.image
    endpoints = []
    for node_id in sorted({leader["leader_id"] for leader in leaders if leader and leader["leader_id"] >= 0}):
        broker = image.brokers.get(node_id)
        endpoint = broker.endpoint(ctx.listener_name) if broker is not None else None
        if endpoint is not None:
            endpoints.append({"node_id": node_id, "host": endpoint.host, "port": endpoint.port, "rack": broker.rack})
    return endpoints
