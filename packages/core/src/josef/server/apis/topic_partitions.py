"""DescribeTopicPartitions (KIP-966): Metadata's topic part, paged so clusters with huge topics stay describable.

Topics are answered in name order, each from its first partition (or the
cursor's), until the response holds ``response_partition_limit`` partitions;
``next_cursor`` then names the first topic and partition left out, and the
client sends the same request again with it as ``cursor``. The rules are
Kafka's ``DescribeTopicPartitionsRequestHandler`` and
``KRaftMetadataCache.describeTopicResponse``.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError, validate_topic_name
from josef.metadata.image import MetadataImage
from josef.server.apis.cluster import is_internal, missing_topic, topic_metadata
from josef.server.dispatch import RequestContext

#: The most partitions one response carries whatever the client asks (Kafka's
#: ``max.request.partition.size.limit`` default), so one request cannot make a huge response.
MAX_PARTITIONS_PER_RESPONSE = 2000


def _unknown(name: str) -> dict[str, Any]:
    """A requested topic that does not exist: INVALID_TOPIC_EXCEPTION when it could not even be created."""
    try:
        validate_topic_name(name)
        code = ErrorCode.unknown_topic_or_partition
    except ControllerError as exc:
        code = exc.code
    return {**missing_topic(code, name), "is_internal": is_internal(name)}


def _invalid(request: Any) -> dict[str, Any]:
    """Kafka's answer to a bad cursor: every requested topic fails with INVALID_REQUEST."""
    return {"throttle_time": 0, "next_cursor": None,
            "topics": [missing_topic(ErrorCode.invalid_request, t.name) for t in request.topics]}


def _names(image: MetadataImage, request: Any) -> list[str] | None:
    """The topics to answer, sorted, from the cursor's on; None when the cursor is not valid for the request."""
    cursor = request.cursor
    first = cursor.topic_name if cursor is not None else ""
    every_topic = not request.topics
    candidates = image.topics.keys() if every_topic else (t.name for t in request.topics)
    names = sorted({name for name in candidates if name >= first})
    if cursor is not None and (cursor.partition_index < 0 or (not every_topic and cursor.topic_name not in names)):
        return None
    return names


async def describe_topic_partitions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    image = ctx.broker.image
    names = _names(image, request)
    if names is None:
        return _invalid(request)
    cursor = request.cursor
    remaining = max(min(MAX_PARTITIONS_PER_RESPONSE, request.response_partition_limit), 1)
    topics: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        if remaining == 0:
            # The previous topic filled the response exactly: continue at the start of this one.
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        topic = image.topics.get(name)
        if topic is None:
            # Asking for every topic names only topics that exist; one deleted meanwhile is just left out.
            if request.topics:
                topics.append(_unknown(name))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        end = min(len(topic.partitions), start + remaining)
        described = topic_metadata(ctx.broker.image, topic, range(start, end))
        topics.append(described)
        if end < len(topic.partitions):
            next_cursor = {"topic_name": name, "partition_index": end}
            break
        remaining -= len(described["partitions"])
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}
