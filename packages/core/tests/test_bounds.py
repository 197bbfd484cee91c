"""The pre-parse bounds walk agrees with kio's encoding of every request, and refuses hostile counts."""

import dataclasses
import datetime
import io
import socket
import struct
import uuid

import pytest
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from josef.protocol.bounds import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS, BoundsError, check_bounds
from josef.protocol.messages import MalformedRequestError, parse_body, request_type
from josef.testing import RawClient

NEUTRAL = {"bool": True, "int8": 1, "int16": 2, "uint16": 3, "int32": 4, "int64": 5, "float64": 1.5,
           "uuid": uuid.UUID(int=7), "string": "s", "bytes": b"xy", "records": b"rec",
           "timedelta_i32": datetime.timedelta(milliseconds=8), "timedelta_i64": datetime.timedelta(milliseconds=9)}


def sample(cls: type, depth: int = 0):
    """An instance with every field set (arrays of two elements, nested entities filled), to exercise each path."""
    values = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        kafka_type = field.metadata.get("kafka_type")
        if isinstance(kind, EntityTupleField):
            values[field.name] = tuple(sample(kind.type_, depth + 1) for _ in range(2 if depth < 3 else 0))
        elif isinstance(kind, EntityField):
            values[field.name] = sample(kind.type_, depth + 1)
        elif isinstance(kind, PrimitiveTupleField):
            values[field.name] = (NEUTRAL[kafka_type], NEUTRAL[kafka_type])
        else:
            values[field.name] = NEUTRAL[kafka_type]
    return cls(**values)


def encode(entity) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


CASES = [(key, version) for key in sorted(api_key_map) for version in sorted(schema_name_map[api_key_map[key]])]


@pytest.mark.parametrize("key,version", CASES, ids=[f"{api_key_map[k]}-v{v}" for k, v in CASES])
def test_the_walk_ends_where_kio_ended_for_every_request(key, version):
    cls = request_type(key, version)
    data = encode(sample(cls))
    assert check_bounds(cls, data, 0) == len(data)
    parse_body(key, version, data, 0)  # and kio reads it back


def test_nullable_structs_are_walked_both_ways():
    nullable = [(k, v) for k, v in CASES
                if any(isinstance(classify_field(f), EntityField) and is_optional(f)
                       for f in dataclasses.fields(request_type(k, v)))]
    assert nullable, "kio has no request with a nullable struct any more"
    for key, version in nullable:
        cls = request_type(key, version)
        empty = dataclasses.replace(sample(cls), **{
            f.name: None for f in dataclasses.fields(cls) if isinstance(classify_field(f), EntityField) and is_optional(f)})
        data = encode(empty)
        assert check_bounds(cls, data, 0) == len(data)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_hostile_counts_are_refused_before_parsing():
    metadata_v12 = request_type(3, 12)
    for claimed in (MAX_ARRAY_ELEMENTS + 1, 2**31 - 2):  # the second aborted the process inside kio before
        with pytest.raises(BoundsError, match="over the limit of 1,000,000"):
            check_bounds(metadata_v12, uvarint(claimed + 1) + b"\x00" * 8, 0)
    with pytest.raises(BoundsError, match="elements in 3 bytes"):
        check_bounds(metadata_v12, uvarint(1000 + 1) + b"\x00" * 3, 0)
    metadata_v1 = request_type(3, 1)
    with pytest.raises(BoundsError, match="over the limit"):
        check_bounds(metadata_v1, struct.pack(">i", 2**31 - 1), 0)
    # Tagged fields at the end of a Metadata v12 request with no topics.
    body = uvarint(0) + b"\x00\x00" + uvarint(MAX_TAGGED_FIELDS + 1)
    with pytest.raises(BoundsError, match="10,000"):
        check_bounds(metadata_v12, body, 0)
    with pytest.raises(MalformedRequestError, match="refused before parsing"):
        parse_body(3, 12, uvarint(2**31 - 1) + b"\x00" * 8, 0)


def test_the_broker_refuses_a_hostile_frame_and_keeps_serving(josef_broker, caplog):
    body = uvarint(2**31 - 1) + b"\x00" * 8
    header = struct.pack(">hhih", 3, 12, 1, 1) + b"h" + b"\x00"
    with socket.create_connection(("127.0.0.1", josef_broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        assert sock.recv(4) == b""  # closed: the frame cannot be answered
    assert any("over the limit of 1,000,000" in r.getMessage() for r in caplog.records)
    answer = RawClient(josef_broker.port).call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert answer.api_keys


def test_request_header_tagged_fields_are_bounded_too():
    from josef.protocol.messages import is_flexible, parse_header

    fixed = struct.pack(">hhih", 3, 12, 1, -1)
    assert parse_header(fixed + uvarint(1) + uvarint(0) + uvarint(2) + b"ab" + b"body", is_flexible).body_offset == 15
    with pytest.raises(MalformedRequestError, match="10,000"):
        parse_header(fixed + uvarint(MAX_TAGGED_FIELDS + 1), is_flexible)
    with pytest.raises(MalformedRequestError, match="bytes claimed"):
        parse_header(fixed + uvarint(1) + uvarint(0) + uvarint(50) + b"short", is_flexible)
