"""Regression tests for what the protocol fuzzer (josef.testing.fuzz) found, each over a real socket where it can be.

- Tagged fields a request's schema does not know closed the connection (kio
  refuses them; Kafka's readers keep them aside and go on): a newer client's
  optional field must not cost it its connection.
- A millisecond duration kio cannot hold as a ``timedelta`` (a delegation
  token's max lifetime of 2**63-1 ms) closed the connection: it is clamped.
- A null array where the schema allows none reached the handler as None
  and failed it (UNKNOWN_SERVER_ERROR, a traceback): it is refused as
  Kafka's readers refuse it.
"""

import io
import logging
import socket
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from josef.protocol.api_keys import ApiKey
from josef.protocol.bounds import apply_edits, check_bounds
from josef.protocol.messages import MalformedRequestError, build, decode_response, parse_body, request_type
from josef.testing.fuzz.requests import frame, header, uvarint


def body(api_key: int, version: int, data: dict) -> bytes:
    buf = io.BytesIO()
    entity = build(request_type(api_key, version), data)
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def exchange(port: int, data: bytes, timeout: float = 10) -> bytes | None:
    """One request frame sent; its answer (without size), or None when the broker closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        return sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


def unknown_tags(*tags: tuple[int, bytes]) -> bytes:
    return uvarint(len(tags)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in tags)


VERSIONS_V3 = {"client_software_name": "fuzz", "client_software_version": "1"}


def test_unknown_tagged_fields_are_skipped(josef_broker):
    data = body(ApiKey.API_VERSIONS, 3, VERSIONS_V3)
    assert data.endswith(b"\x00")  # no tagged fields: the section is one count byte
    tagged = data[:-1] + unknown_tags((7, b"hi"), (300, b"x" * 200))
    answer = exchange(josef_broker.port, frame(header(ApiKey.API_VERSIONS, 3, 5, b"c", True) + tagged))
    assert answer is not None, "the broker closed the connection"
    correlation, response = decode_response(ApiKey.API_VERSIONS, 3, answer)
    assert (correlation, response.error_code) == (5, ErrorCode.none)


def test_unknown_tagged_fields_in_nested_entries_are_skipped(josef_broker):
    topics = [{"name": "no-such-topic", "topic_id": None}]
    data = body(ApiKey.METADATA, 12, {"topics": topics, "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    # The one topic entry (topic id, then name) ends with its (empty) tagged section.
    entry_end = data.index(b"no-such-topic") + len("no-such-topic")
    assert data[entry_end] == 0
    tagged = data[:entry_end] + unknown_tags((0, b"\x01\x02")) + data[entry_end + 1:]
    answer = exchange(josef_broker.port, frame(header(ApiKey.METADATA, 12, 6, b"c", True) + tagged))
    assert answer is not None, "the broker closed the connection"
    _, response = decode_response(ApiKey.METADATA, 12, answer)
    assert [(t.name, t.error_code) for t in response.topics] == [("no-such-topic", ErrorCode.unknown_topic_or_partition)]


def test_an_unknown_tag_inside_a_known_tagged_struct_is_dropped_and_its_size_follows():
    """Fetch's ReplicaState (tag 1) holding an unknown tag: the struct's size prefix shrinks with it."""
    cls = request_type(ApiKey.FETCH, 15)
    plain = body(ApiKey.FETCH, 15, {"replica_state": {"replica_id": 3, "replica_epoch": 9}, "max_wait": 0,
                                    "min_bytes": 1, "max_bytes": 100, "isolation_level": 0, "session_id": 0,
                                    "session_epoch": -1, "topics": [], "forgotten_topics_data": [], "rack_id": ""})
    state = struct.pack(">iq", 3, 9)
    inner = state + b"\x00"
    assert plain.find(uvarint(1) + uvarint(len(inner)) + inner) > 0
    with_unknown = state + unknown_tags((5, b"abc"))
    data = plain.replace(uvarint(1) + uvarint(len(inner)) + inner,
                         uvarint(1) + uvarint(len(with_unknown)) + with_unknown)
    edits: list = []
    assert check_bounds(cls, data, 0, edits) == len(data)
    assert apply_edits(data, edits) == plain
    request = parse_body(ApiKey.FETCH, 15, data, 0)
    assert (request.replica_state.replica_id, request.replica_state.replica_epoch) == (3, 9)


@pytest.mark.parametrize("version", [1, 3])
def test_a_duration_longer_than_a_timedelta_is_clamped(josef_broker, version):
    """CreateDelegationToken with max_lifetime 2**63-1 ms: answered (on PLAINTEXT, refused as Kafka refuses it)."""
    data = body(ApiKey.CREATE_DELEGATION_TOKEN, version, {"owner_principal_type": None, "owner_principal_name": None,
                                                          "renewers": [], "max_lifetime": 1})
    data = data[:-(9 if version >= 2 else 8)] + struct.pack(">q", 2**63 - 1) + (b"\x00" if version >= 2 else b"")
    answer = exchange(josef_broker.port, frame(header(ApiKey.CREATE_DELEGATION_TOKEN, version, 7, b"c", version >= 2)
                                               + data))
    assert answer is not None, "the broker closed the connection"
    _, response = decode_response(ApiKey.CREATE_DELEGATION_TOKEN, version, answer)
    assert response.error_code == ErrorCode.delegation_token_request_not_allowed


def test_a_null_array_where_the_schema_has_none_is_refused_before_the_handler(josef_broker, caplog):
    """SyncGroup v2 with a null ``assignments``: Kafka's reader refuses it; it once failed the handler."""
    data = body(ApiKey.SYNC_GROUP, 2, {"group_id": "g", "generation_id": 1, "member_id": "m", "assignments": []})
    assert data.endswith(struct.pack(">i", 0))
    data = data[:-4] + struct.pack(">i", -1)
    with pytest.raises(MalformedRequestError, match="null, where the schema allows no null"):
        parse_body(ApiKey.SYNC_GROUP, 2, data, 0)
    with caplog.at_level(logging.WARNING):
        assert exchange(josef_broker.port, frame(header(ApiKey.SYNC_GROUP, 2, 8, b"c", False) + data)) is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("null, where the schema allows no null" in r.getMessage() for r in caplog.records)
