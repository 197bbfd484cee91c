"""The error response to any request, built from kio's response schema.

Kafka answers a request whose handling failed with
``AbstractRequest.getErrorResponse``, written once per request type. josef
derives it from the schemas instead, so that a handler of any API (core or
plugin) that raises still gets its client an answer it can act on:

- every ``error_code`` field carries the error, every ``error_message``
  field the message;
- where the response has per-item entries (a topic, a partition, a config
  resource, a group...), it gets one entry per item of the request, with the
  item's identifying fields (name, partition index, resource name...)
  copied, so the client can match the error to what it asked for. An array
  of the response is mirrored from the request's array of the same name, or
  from the one :data:`_SOURCES` names where Kafka's schemas use different
  names; arrays whose entries carry no error code (Metadata's brokers,
  CreateTopics' configs) stay empty;
- every other field gets its neutral value: the schema's default, -1 for
  offsets, watermarks, epochs, timestamps and ids (Kafka's "unknown"), else 0, "",
  False, an empty array, or None where the field is nullable (record data
  excepted: it is empty, as Kafka writes it, since librdkafka cannot read
  a null message set).

When the response would carry no error code at all (an acks=0 produce, which
gets no response; an old version whose only error codes sit in entries the
request gave no items for), :func:`error_response` returns None, and the
caller closes the connection instead, as Kafka does when
``getErrorResponse`` returns null: an answer that looks like a success would
be worse than none.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Iterator

import attrs
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import build, response_type

#: Per API (kio's name), the request arrays a response array is mirrored from where the
#: names differ: response path (dotted, from the response root) -> request paths
#: relative to the request item that matched the parent entry. Entries of all the
#: paths the request version has are concatenated; a dotted request path flattens.
_SOURCES: dict[str, dict[str, tuple[str, ...]]] = {
    "produce": {"responses": ("topic_data",), "responses.partition_responses": ("partition_data",)},
    "fetch": {"responses": ("topics",)},
    "offset_fetch": {"topics.partitions": ("partition_indexes",), "groups.topics.partitions": ("partition_indexes",)},
    "find_coordinator": {"coordinators": ("coordinator_keys",)},
    "delete_topics": {"responses": ("topics", "topic_names")},
    "add_partitions_to_txn": {
        "results_by_topic_v3_and_below": ("v3_and_below_topics",),
        "results_by_topic_v3_and_below.results_by_partition": ("partitions",),
    },
    "write_txn_markers": {"markers.topics.partitions": ("partition_indexes",)},
    "create_acls": {"results": ("creations",)},
    "delete_acls": {"filter_results": ("filters",)},
    "describe_configs": {"results": ("resources",)},
    "alter_configs": {"responses": ("resources",)},
    "alter_replica_log_dirs": {"results": ("dirs.topics",)},
    "create_partitions": {"results": ("topics",)},
    "delete_groups": {"results": ("groups_names",)},
    "elect_leaders": {
        "replica_election_results": ("topic_partitions",),
        "replica_election_results.partition_result": ("partitions",),
    },
    "incremental_alter_configs": {"responses": ("resources",)},
    "alter_partition_reassignments": {"responses": ("topics",)},
    # Kafka copies each entry's entity (type and name pairs), though they carry no error code.
    "alter_client_quotas": {"entries.entity": ("entity",)},
    "describe_user_scram_credentials": {"results": ("users",)},
    "alter_user_scram_credentials": {"results": ("deletions", "upsertions")},
    "update_features": {"results": ("feature_updates",)},
    "describe_producers": {"topics.partitions": ("partition_indexes",)},
    "describe_transactions": {"transaction_states": ("transactional_ids",)},
    "consumer_group_describe": {"groups": ("group_ids",)},
    "share_group_describe": {"groups": ("group_ids",)},
    "streams_group_describe": {"groups": ("group_ids",)},
    "share_fetch": {"responses": ("topics",)},
    "share_acknowledge": {"responses": ("topics",)},
    "initialize_share_group_state": {"results": ("topics",)},
    "read_share_group_state": {"results": ("topics",)},
    "write_share_group_state": {"results": ("topics",)},
    "delete_share_group_state": {"results": ("topics",)},
    "read_share_group_state_summary": {"results": ("topics",)},
    "alter_share_group_offsets": {"responses": ("topics",)},
    "delete_share_group_offsets": {"responses": ("topics",)},
}

#: Fields that say which item an entry answers for, copied from the request item.
_IDENTITY = frozenset({
    "name", "topic", "topic_id", "topic_name", "index", "partition", "partition_index", "partition_id",
    "resource_type", "resource_name", "group_id", "member_id", "group_instance_id", "key",
    "transactional_id", "producer_id", "entity_type", "entity_name", "user", "feature",
})
#: Where an identifying field has another name in the request item.
_IDENTITY_ALIASES = {"topic_name": ("name",), "partition_index": ("partition",), "user": ("name",)}

_SIGNED = frozenset({"int8", "int16", "int32", "int64"})
_ZERO: dict[str, Any] = {
    "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "float64": 0.0, "bool": False,
    "string": "", "bytes": b"", "records": b"", "timedelta_i32": 0, "timedelta_i64": 0,
}


def error_response(api_key: int, version: int, request: Any, error_code: ErrorCode, message: str) -> Any | None:
    """The ``version`` response to ``request`` that reports ``error_code`` for it and each of its items.

    None when no such response exists: the request expects no answer
    (acks=0 produce) or the response would hold no error code to carry it.
    """
    if api_key == ApiKey.PRODUCE and request.acks == 0:
        return None
    cls = response_type(api_key, version)
    builder = _Builder(_SOURCES.get(api_key_map[api_key], {}), error_code, message)
    response = build(cls, builder.entry(cls, request, ""))
    if not any(True for _ in error_codes(response)):
        return None
    return response


def error_codes(entity: Any) -> Iterator[ErrorCode]:
    """Every error code in a kio entity, nested entries included."""
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if field.metadata.get("kafka_type") == "error_code":
            yield value
        elif dataclasses.is_dataclass(value):
            yield from error_codes(value)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    yield from error_codes(item)


def _has_default(field: dataclasses.Field[Any]) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def _carries_error(cls: type) -> bool:
    """Whether entries of ``cls`` (or entries nested in them) have an error code."""
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if isinstance(kind, (EntityField, EntityTupleField)):
            if _carries_error(kind.type_):
                return True
        elif field.metadata.get("kafka_type") == "error_code":
            return True
    return False


def _neutral(field: dataclasses.Field[Any]) -> Any:
    """Kafka's "nothing here" for a required primitive: -1 for offsets, watermarks, epochs, timestamps, ids."""
    kafka_type = field.metadata["kafka_type"]
    if kafka_type == "datetime_i64":  # a required timestamp cannot be negative on the wire
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type == "uuid":  # nullable in kio; written as the zero UUID
        return None
    unknown = (field.name.endswith(("offset", "epoch", "timestamp", "watermark", "_id"))
               or field.name in ("num_partitions", "replication_factor"))
    if unknown and kafka_type in _SIGNED:
        return -1
    return _ZERO[kafka_type]


@attrs.frozen
class _Builder:
    sources: dict[str, tuple[str, ...]]
    error_code: ErrorCode
    message: str

    def entry(self, cls: type, item: Any, path: str) -> dict[str, Any]:
        """The fields of the ``cls`` entry at ``path`` ("" for the response itself) answering request ``item``.

        ``item`` is a request entity, an item of a primitive array, or None.
        Identifying fields are copied only into entries, never into the
        response itself: there, Kafka reports "unknown" (a JoinGroup error
        carries no member id, an EndTxn error no producer id).
        """
        data: dict[str, Any] = {}
        fields = dataclasses.fields(cls)
        primitive_identity = None
        if item is not None and not dataclasses.is_dataclass(item):
            primitive_identity = next((f.name for f in fields if f.name in _IDENTITY and _holds(f, item)), None)
        for field in fields:
            kind = classify_field(field)
            field_path = f"{path}.{field.name}" if path else field.name
            if isinstance(kind, EntityTupleField):
                data[field.name] = self._entries(kind.type_, item, field.name, field_path)
            elif isinstance(kind, EntityField):
                if not _has_default(field):
                    data[field.name] = None if is_optional(field) else self.entry(kind.type_, None, field_path)
            elif field.metadata.get("kafka_type") == "error_code":
                data[field.name] = self.error_code
            elif field.name == "error_message":
                data[field.name] = self.message
            elif field.name == primitive_identity:
                data[field.name] = item
            elif path and item is not None and (found := _identity(field, item)) is not _MISSING:
                # A null the request may hold where the response may not (Metadata v10's topic name): "", as Kafka.
                data[field.name] = _neutral(field) if found is None and not is_optional(field) else found
            elif isinstance(kind, PrimitiveTupleField):
                data[field.name] = ()
            elif not _has_default(field):
                # Records are empty rather than null, as Kafka's MemoryRecords.EMPTY: librdkafka refuses a null message set.
                nullable = is_optional(field) and field.metadata.get("kafka_type") != "records"
                data[field.name] = None if nullable else _neutral(field)
        return data

    def _entries(self, cls: type, item: Any, name: str, path: str) -> list[dict[str, Any]]:
        """One entry per request item the response array ``name`` answers; none when it answers none."""
        if path in self.sources:
            candidates = self.sources[path]
        elif _carries_error(cls):
            candidates = (name,)
        else:
            return []
        return [self.entry(cls, source, path) for source in _resolve(item, candidates)]


_MISSING = object()


def _holds(field: dataclasses.Field[Any], value: Any) -> bool:
    """Whether a primitive of ``field``'s wire type can hold ``value`` (an item of a request's primitive array)."""
    kafka_type = field.metadata.get("kafka_type")
    if isinstance(value, str):
        return kafka_type == "string"
    return isinstance(value, int) and kafka_type in _SIGNED


def _identity(field: dataclasses.Field[Any], item: Any) -> Any:
    """The value of identifying ``field`` in request ``item`` (same name or an alias, same wire type)."""
    if field.name not in _IDENTITY or not dataclasses.is_dataclass(item):
        return _MISSING
    request_fields = {f.name: f for f in dataclasses.fields(item)}
    for name in (field.name, *_IDENTITY_ALIASES.get(field.name, ())):
        source = request_fields.get(name)
        if source is not None and source.metadata.get("kafka_type") == field.metadata["kafka_type"]:
            return getattr(item, name)
    return _MISSING


def _resolve(item: Any, paths: tuple[str, ...]) -> list[Any]:
    """The request items under ``item`` at each dotted path it has, concatenated (null arrays: none)."""
    if item is None or not dataclasses.is_dataclass(item):
        return []
    names = {f.name for f in dataclasses.fields(item)}
    found: list[Any] = []
    for path in paths:
        first, *rest = path.split(".")
        if first not in names:
            continue
        level = list(getattr(item, first) or ())
        for part in rest:
            level = [child for parent in level for child in (getattr(parent, part) or ())]
        found.extend(level)
    return found
