"""The little the broker reads of the "consumer" embedded protocol: which topics a member subscribes to.

A classic group's member metadata is opaque to the coordinator, except that
Kafka peeks at consumer groups' subscriptions (ConsumerProtocolSubscription,
non-flexible versions 0-3, all starting ``version int16, topics [string]``)
to know the group's subscribed topics: OffsetDelete refuses to delete offsets
of a topic the group still consumes (GROUP_SUBSCRIBED_TO_TOPIC), and offsets
of topics a stable group no longer consumes may expire.
"""

from __future__ import annotations

import struct
from typing import Iterable

#: The protocol type of consumer groups; Kafka Connect uses "connect", which josef treats as opaque.
CONSUMER_PROTOCOL_TYPE = "consumer"


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription; None when it cannot be read."""
    try:
        (version,) = struct.unpack_from(">h", metadata, 0)
        if version < 0:
            return None
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos = 6
        topics = set()
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                return None
            topics.add(metadata[pos : pos + size].decode())
            pos += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def encode_subscription(topics: Iterable[str], user_data: bytes | None = None) -> bytes:
    """A version-0 ConsumerProtocolSubscription (tests and tools use it to act as a consumer)."""
    names = [t.encode() for t in topics]
    parts = [struct.pack(">hi", 0, len(names))]
    parts += [struct.pack(">h", len(n)) + n for n in names]
    parts.append(struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data)) + user_data)
    return b"".join(parts)


def encode_assignment(partitions: dict[str, list[int]], user_data: bytes | None = None) -> bytes:
    """A version-0 ConsumerProtocolAssignment."""
    parts = [struct.pack(">hi", 0, len(partitions))]
    for topic, indexes in partitions.items():
        name = topic.encode()
        parts.append(struct.pack(">h", len(name)) + name + struct.pack(">i", len(indexes)))
        parts += [struct.pack(">i", i) for i in indexes]
    parts.append(struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data)) + user_data)
    return b"".join(parts)


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The partitions of a ConsumerProtocolAssignment (any version: they all start the same way)."""
    if not data:
        return {}
    (count,) = struct.unpack_from(">i", data, 2)
    pos = 6
    result: dict[str, list[int]] = {}
    for _ in range(max(count, 0)):
        (size,) = struct.unpack_from(">h", data, pos)
        pos += 2
        topic = data[pos : pos + size].decode()
        pos += size
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        result[topic] = list(struct.unpack_from(f">{n}i", data, pos))
        pos += 4 * n
    return result
