"""Error responses built from kio's schemas: one for every API and version a dispatcher could register."""

import dataclasses
import datetime
import uuid
from typing import Any, Iterator

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field

from josef.protocol.api_keys import ApiKey
from josef.protocol.error_responses import error_response
from josef.protocol.messages import build, decode_response, encode_response, request_type

ERROR = ErrorCode.unknown_server_error
MESSAGE = "it broke"

#: (API, version) whose response has no error code where a request's items could put one:
#: DescribeLogDirs v1-v2 reports errors per log dir, which a request does not name, and has no
#: top-level error code. A failure there closes the connection.
NO_ERROR_RESPONSE = {("describe_log_dirs", 1), ("describe_log_dirs", 2)}

ALL_VERSIONS = [(key, version) for key, name in sorted(api_key_map.items()) for version in sorted(schema_name_map[name])]

_SAMPLES: dict[str, Any] = {
    "int8": 1, "int16": 1, "int32": 1, "int64": 1, "uint16": 1, "float64": 1.0, "bool": True,
    "string": "s", "bytes": b"b", "records": b"", "uuid": uuid.UUID(int=7), "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(milliseconds=1), "timedelta_i64": datetime.timedelta(milliseconds=1),
    "datetime_i64": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
}


def sample(cls: type) -> Any:
    """A request of ``cls`` with every field set and one item in every array (a worst case for mirroring)."""
    values = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if isinstance(kind, EntityTupleField):
            values[field.name] = (sample(kind.type_),)
        elif isinstance(kind, EntityField):
            values[field.name] = sample(kind.type_)
        elif isinstance(kind, PrimitiveTupleField):
            values[field.name] = (_SAMPLES[field.metadata["kafka_type"]],)
        else:
            values[field.name] = _SAMPLES[field.metadata["kafka_type"]]
    return cls(**values)


def errors_and_messages(entity: Any) -> Iterator[tuple[str, Any]]:
    """Every ``error_code`` and ``error_message`` field's value in a response, nested entries included."""
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if field.metadata.get("kafka_type") == "error_code":
            yield "error_code", value
        elif field.name == "error_message":
            yield "error_message", value
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                yield from errors_and_messages(item)


def round_trip(key: int, version: int, response: Any) -> Any:
    """The response as a client reads it after the broker's response writer framed it."""
    frame = encode_response(key, version, 42, response)
    correlation_id, decoded = decode_response(key, version, memoryview(frame)[4:])
    assert correlation_id == 42
    return decoded


def answer(key: int, version: int, body: dict[str, Any]) -> Any:
    response = error_response(key, version, build(request_type(key, version), body), ERROR, MESSAGE)
    assert response is not None
    return round_trip(key, version, response)


@pytest.mark.parametrize(("key", "version"), ALL_VERSIONS, ids=[f"{api_key_map[k]}-v{v}" for k, v in ALL_VERSIONS])
def test_every_api_version_has_an_error_response(key, version):
    response = error_response(key, version, sample(request_type(key, version)), ERROR, MESSAGE)
    if (api_key_map[key], version) in NO_ERROR_RESPONSE:
        assert response is None
        return
    assert response is not None
    decoded = round_trip(key, version, response)
    assert decoded == response
    found = list(errors_and_messages(decoded))
    assert [value for kind, value in found if kind == "error_code"], "the error reaches the client"
    assert all(value == (ERROR if kind == "error_code" else MESSAGE) for kind, value in found)


def test_produce_answers_each_partition():
    body = {"acks": -1, "timeout": 1000, "topic_data": [
        {"name": "a", "partition_data": [{"index": 0, "records": None}, {"index": 3, "records": None}]},
        {"name": "b", "partition_data": [{"index": 1, "records": None}]},
    ]}
    response = answer(ApiKey.PRODUCE, 9, body)
    assert [(t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses]) for t in response.responses] == [
        ("a", [(0, ERROR, -1), (3, ERROR, -1)]),
        ("b", [(1, ERROR, -1)]),
    ]


def test_acks_0_produce_has_no_response():
    request = build(request_type(ApiKey.PRODUCE, 9), {"acks": 0, "timeout": 1000, "topic_data": []})
    assert error_response(ApiKey.PRODUCE, 9, request, ERROR, MESSAGE) is None


def test_metadata_answers_each_topic_and_no_broker():
    body = {"topics": [{"name": "a", "topic_id": None}, {"name": "b", "topic_id": None}], "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False}
    response = answer(ApiKey.METADATA, 12, body)
    assert [(t.name, t.error_code, t.partitions) for t in response.topics] == [("a", ERROR, ()), ("b", ERROR, ())]
    assert response.brokers == ()
    assert response.controller_id == -1


def test_metadata_of_all_topics():
    """v13 carries a top-level error; before it, an all-topics request leaves the error nowhere to go."""
    body = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    assert answer(ApiKey.METADATA, 13, body).error_code == ERROR
    request = build(request_type(ApiKey.METADATA, 12), body)
    assert error_response(ApiKey.METADATA, 12, request, ERROR, MESSAGE) is None


def test_create_topics_answers_each_topic():
    topic = {"num_partitions": 3, "replication_factor": 1, "assignments": [], "configs": [{"name": "retention.ms", "value": "1"}]}
    response = answer(ApiKey.CREATE_TOPICS, 7, {"topics": [{"name": "a", **topic}, {"name": "b", **topic}], "timeout": 1000})
    assert [(t.name, t.error_code, t.error_message, t.num_partitions, t.configs) for t in response.topics] == [
        ("a", ERROR, MESSAGE, -1, ()),
        ("b", ERROR, MESSAGE, -1, ()),
    ]


def test_describe_configs_answers_each_resource():
    body = {"resources": [{"resource_type": 2, "resource_name": "a", "configuration_keys": None},
                          {"resource_type": 4, "resource_name": "1", "configuration_keys": ["x"]}]}
    response = answer(ApiKey.DESCRIBE_CONFIGS, 4, body)
    assert [(r.resource_type, r.resource_name, r.error_code, r.error_message, r.configs) for r in response.results] == [
        (2, "a", ERROR, MESSAGE, ()),
        (4, "1", ERROR, MESSAGE, ()),
    ]


def test_offset_commit_answers_each_partition():
    partition = {"committed_offset": 5, "committed_leader_epoch": -1, "committed_metadata": None}
    body = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "m", "topics": [
        {"name": "a", "partitions": [{"partition_index": 0, **partition}, {"partition_index": 2, **partition}]},
    ]}
    response = answer(ApiKey.OFFSET_COMMIT, 8, body)
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.topics] == [
        ("a", [(0, ERROR), (2, ERROR)]),
    ]


def test_items_given_as_plain_values():
    """Requests that list partitions or groups as bare numbers or names get one entry per value."""
    response = answer(ApiKey.OFFSET_FETCH, 7, {"group_id": "g", "topics": [{"name": "a", "partition_indexes": [4, 5]}]})
    assert [(p.partition_index, p.committed_offset, p.error_code) for p in response.topics[0].partitions] == [
        (4, -1, ERROR), (5, -1, ERROR)]
    response = answer(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g1", "g2"]})
    assert [(r.group_id, r.error_code) for r in response.results] == [("g1", ERROR), ("g2", ERROR)]


def test_top_level_fields_are_unknown_not_copied():
    """Kafka's JoinGroup error carries no member id and generation -1, whatever the request said."""
    body = {"group_id": "g", "session_timeout": 10_000, "rebalance_timeout": 10_000, "member_id": "m-1",
            "protocol_type": "consumer", "protocols": []}
    response = answer(ApiKey.JOIN_GROUP, 9, body)
    assert (response.error_code, response.member_id, response.generation_id, response.members) == (ERROR, "", -1, ())
