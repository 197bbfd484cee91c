"""__consumer_offsets records: Kafka's binary format, written and read back, including versions josef only reads."""

from __future__ import annotations

import struct

import pytest

from josef_coordinator_group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    decode_group,
    decode_key,
    decode_offset,
    encode_group,
    encode_key,
    encode_offset,
)


def s16(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(text)) + text.encode()


def compact(text: str | bytes | None) -> bytes:
    if text is None:
        return b"\x00"
    data = text.encode() if isinstance(text, str) else text
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def test_keys_identify_the_entity_as_kafka_writes_them():
    offset_key = encode_key(OffsetKey("g", "orders", 3))
    assert offset_key == struct.pack(">h", 1) + s16("g") + s16("orders") + struct.pack(">i", 3)
    assert decode_key(offset_key) == OffsetKey("g", "orders", 3)
    assert decode_key(struct.pack(">h", 0) + s16("g") + s16("t") + struct.pack(">i", 0)) == OffsetKey("g", "t", 0)
    group_key = encode_key(GroupKey("g"))
    assert group_key == struct.pack(">h", 2) + s16("g") and decode_key(group_key) == GroupKey("g")
    # KIP-848 consumer-group records: keys 3-8 are read; 4 (deprecated partition metadata) and unknown ones skipped.
    from josef_coordinator_group.records import ConsumerKey

    assert decode_key(struct.pack(">h", 3) + s16("g")) == ConsumerKey(3, "g")
    assert decode_key(struct.pack(">h", 5) + s16("g") + s16("m")) == ConsumerKey(5, "g", "m")
    assert encode_key(ConsumerKey(8, "g", "m")) == struct.pack(">h", 8) + s16("g") + s16("m")
    assert decode_key(struct.pack(">h", 4) + s16("g")) is None
    assert decode_key(struct.pack(">h", 99) + s16("g")) is None


def test_consumer_group_values_round_trip():
    from josef_coordinator_group.records import (
        ConsumerAssignmentValue,
        ConsumerMemberValue,
        decode_consumer_member,
        decode_current_assignment,
        decode_epoch,
        decode_target_member,
        encode_consumer_member,
        encode_current_assignment,
        encode_epoch,
        encode_target_member,
    )

    tid = "6f1c4d2e-0b7a-4c39-9d0e-1a2b3c4d5e6f"
    assert decode_epoch(encode_epoch(7)) == 7
    assert encode_epoch(7) == b"\x00\x00\x00\x00\x00\x07\x00"
    member = ConsumerMemberValue("i", None, "client", "/1.2.3.4", ("a", "b"), "t.*", 30000, "uniform")
    assert decode_consumer_member(encode_consumer_member(member)) == member
    target = {tid: frozenset({0, 2})}
    assert decode_target_member(encode_target_member(target)) == target
    current = ConsumerAssignmentValue(3, 2, 1, target, {tid: frozenset({1})})
    assert decode_current_assignment(encode_current_assignment(current)) == current


def test_offset_values_round_trip():
    value = OffsetValue(42, "meta", 1_700_000_000_000, leader_epoch=7)
    data = encode_offset(value)
    assert data[:2] == struct.pack(">h", 3)
    assert decode_offset(data) == value
    expiring = OffsetValue(42, "", 1000, expire_timestamp=5000)
    data = encode_offset(expiring)
    assert data[:2] == struct.pack(">h", 1)  # the only version with an expiry time
    assert decode_offset(data) == OffsetValue(42, "", 1000, -1, 5000)


def test_old_and_flexible_offset_values_are_read():
    v0 = struct.pack(">hq", 0, 10) + s16("m") + struct.pack(">q", 99)
    assert decode_offset(v0) == OffsetValue(10, "m", 99)
    v2 = struct.pack(">hq", 2, 11) + s16("") + struct.pack(">q", 98)
    assert decode_offset(v2) == OffsetValue(11, "", 98)
    v4 = struct.pack(">hqi", 4, 12, 5) + compact("x") + struct.pack(">q", 97) + b"\x01\x07\x02ab"  # a tagged field
    assert decode_offset(v4) == OffsetValue(12, "x", 97, 5)
    with pytest.raises(RecordFormatError):
        decode_offset(struct.pack(">hq", 9, 1))
    with pytest.raises(RecordFormatError):
        decode_offset(struct.pack(">h", 3) + b"\x00")


def test_group_values_round_trip():
    members = (MemberValue("m1", None, "c1", "/1.2.3.4", 30000, 10000, b"sub1", b"as1"),
               MemberValue("m2", "static-2", "c2", "/1.2.3.5", 40000, 20000, b"sub2", b""))
    value = GroupValue("consumer", 5, "range", "m1", 1234, members)
    data = encode_group(value)
    assert data[:2] == struct.pack(">h", 3)
    assert decode_group(data) == value
    empty = GroupValue("consumer", 6, None, None, 999, ())
    assert decode_group(encode_group(empty)) == empty


def test_old_and_flexible_group_values_are_read():
    member_v0 = s16("m1") + s16("c") + s16("/h") + struct.pack(">i", 10000) + struct.pack(">i", 2) + b"su" + \
        struct.pack(">i", 1) + b"a"
    v0 = struct.pack(">h", 0) + s16("consumer") + struct.pack(">i", 3) + s16("range") + s16("m1") + \
        struct.pack(">i", 1) + member_v0
    assert decode_group(v0) == GroupValue("consumer", 3, "range", "m1", -1, (
        MemberValue("m1", None, "c", "/h", 10000, 10000, b"su", b"a"),))  # v0: rebalance timeout = session timeout
    member_v4 = compact("m1") + compact("inst") + compact("c") + compact("/h") + struct.pack(">ii", 20000, 10000) + \
        compact(b"su") + compact(b"a") + b"\x00"
    v4 = struct.pack(">h", 4) + compact("consumer") + struct.pack(">i", 3) + compact("range") + compact(None) + \
        struct.pack(">q", 77) + b"\x02" + member_v4 + b"\x00"
    assert decode_group(v4) == GroupValue("consumer", 3, "range", None, 77, (
        MemberValue("m1", "inst", "c", "/h", 20000, 10000, b"su", b"a"),))
