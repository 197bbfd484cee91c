"""The consumer embedded protocol: Kafka's bytes, every version, and what the coordinator reads of it."""

from __future__ import annotations

import struct

import pytest

from josef.protocol.consumer_protocol import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    subscribed_topics,
)
from josef.protocol.errors import KafkaError
from josef.protocol.topic_partition import TopicPartition


def tps(spec: str) -> list[TopicPartition]:
    """``"a0 a1 b2"`` -> [a-0, a-1, b-2] (topic is the letters, partition the digits)."""
    out = []
    for item in spec.split():
        topic = item.rstrip("0123456789")
        out.append(TopicPartition(topic, int(item[len(topic):])))
    return out


def s16(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_subscription_v0_is_kafkas_bytes():
    sub = Subscription(("foo",))
    assert encode_subscription(sub, version=0) == b"\x00\x00" + b"\x00\x00\x00\x01\x00\x03foo" + b"\xff\xff\xff\xff"
    assert decode_subscription(encode_subscription(sub, version=0)) == sub


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_round_trips_in_every_version(version):
    sub = Subscription(("a", "b"), b"user", tuple(tps("a1 a0 b3")), 42, "rack-1")
    decoded = decode_subscription(encode_subscription(sub, version=version), group_instance_id="static-1")
    assert decoded.topics == ("a", "b") and decoded.user_data == b"user"
    assert decoded.group_instance_id == "static-1"
    assert set(decoded.owned_partitions) == (set(tps("a0 a1 b3")) if version >= 1 else set())
    assert decoded.generation == (42 if version >= 2 else -1)
    assert decoded.rack_id == ("rack-1" if version >= 3 else None)


def test_newer_subscription_versions_are_read_as_the_newest_known():
    data = encode_subscription(Subscription(("a",), None, tuple(tps("a0")), 3, None))
    future = b"\x00\x07" + data[2:] + b"fields of version 7"
    decoded = decode_subscription(future)
    assert decoded.topics == ("a",) and decoded.owned_partitions == tuple(tps("a0")) and decoded.generation == 3


def test_bad_subscriptions_are_group_protocol_errors():
    for data in (b"", b"\x00", b"\xff\xff\x00", b"\x00\x00\x00\x00\x00\x05\x00"):
        with pytest.raises(KafkaError, match="INCONSISTENT_GROUP_PROTOCOL"):
            decode_subscription(data)


def test_assignment_round_trips_and_empty_means_nothing():
    data = encode_assignment(tps("b0 a2 a0"), b"ud")
    assert data[:2] == b"\x00\x03"
    assert decode_assignment(data) == (tps("a0 a2 b0"), b"ud")
    assert decode_assignment(encode_assignment([], version=0)) == ([], None)
    assert decode_assignment(b"") == ([], None)
    # v0 bytes as Kafka writes them: one topic "t" with partitions 0 and 1, no user data.
    v0 = b"\x00\x00" + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01" + b"\xff\xff\xff\xff"
    assert encode_assignment(tps("t1 t0"), version=0) == v0
    assert decode_assignment(v0) == (tps("t0 t1"), None)


def test_the_coordinator_reads_the_topics_of_any_subscription_version():
    subscription = encode_subscription(Subscription(("b", "a"), b"ud"), version=0)
    assert subscribed_topics(subscription) == {"a", "b"}
    # Later versions append fields (owned partitions, generation, rack) after the topics.
    v3 = struct.pack(">hi", 3, 1) + s16("t") + struct.pack(">i", -1) + struct.pack(">i", 0) + \
        struct.pack(">i", 2) + s16("rack")
    assert subscribed_topics(v3) == {"t"}
    assert subscribed_topics(b"\x00") is None
    assert subscribed_topics(b"") is None
    assert subscribed_topics(b"\xff\xff\x00") is None
