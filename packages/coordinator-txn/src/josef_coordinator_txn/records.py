"""The records of ``__transaction_state``, in Kafka's own binary format.

josef writes exactly what a Kafka broker writes
(``transaction-coordinator/*.json`` in Kafka's source), so the partition stays
readable by Kafka's tools (``kafka-dump-log.sh --transaction-log-decoder``)
and a log copied from Kafka loads here:

- key: int16 version 0, then the transactional id (int16-length string);
- value: int16 version, then TransactionLogValue. Version 0 is the plain
  encoding; version 1 is flexible (compact strings and arrays, tagged fields:
  0 PreviousProducerId, 1 NextProducerId, 2 ClientTransactionVersion, each
  written only when it differs from its default). Kafka writes version 1
  once ``transaction.version`` is at least 1, version 0 before;
- a null value (tombstone) removes an expired transactional id.

The schemas are declared the way kio declares protocol messages, so kio's
native reader and writer serialise them (as the core does for metadata
records). This module is evaluated without postponed annotations because kio
reads the field types.
"""

from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

import attrs
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

from josef.coordinator.records import decode_versioned, encode_versioned, record_version

KEY_VERSION = 0
#: TransactionLogValue versions: 0 (``transaction.version`` 0), 1 (flexible, from ``transaction.version`` 1 on).
VALUE_VERSIONS = (0, 1)

#: TransactionStatus of Empty, the one state whose partitions are null rather than an array.
EMPTY_STATE_ID = 0

#: (topic, partition) pairs of a transaction.
Partitions = frozenset[tuple[str, int]]


class RecordFormatError(ValueError):
    """A record of ``__transaction_state`` could not be decoded."""


@attrs.frozen
class TransactionLogValue:
    """One transactional id's state as persisted (Empty's partitions are written as a null array, as Kafka does)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state_id: int
    partitions: Partitions
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


# The schemas, as kio entities ------------------------------------------------------------------------


def _f(kafka_type: str, default: Any = MISSING, tag: Any = None) -> Any:
    metadata: dict[str, Any] = {"kafka_type": kafka_type}
    if tag is not None:
        metadata["tag"] = tag
    return field(metadata=metadata, default=default)


_schema = dataclass(frozen=True, slots=True, kw_only=True)


@_schema
class _KeyV0:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    transactional_id: str = _f("string")


@_schema
class _PartitionsV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    topic: str = _f("string")
    partition_ids: tuple[i32, ...] = _f("int32", ())


@_schema
class _ValueV0:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    producer_id: i64 = _f("int64")
    producer_epoch: i16 = _f("int16")
    transaction_timeout_ms: i32 = _f("int32")
    transaction_status: i8 = _f("int8")
    transaction_partitions: tuple[_PartitionsV0, ...] | None = field(metadata={}, default=None)
    transaction_last_update_timestamp_ms: i64 = _f("int64")
    transaction_start_timestamp_ms: i64 = _f("int64")


@_schema
class _PartitionsV1:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = True
    topic: str = _f("string")
    partition_ids: tuple[i32, ...] = _f("int32", ())


@_schema
class _ValueV1:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = True
    producer_id: i64 = _f("int64")
    previous_producer_id: i64 = _f("int64", i64(-1), tag=0)
    next_producer_id: i64 = _f("int64", i64(-1), tag=1)
    producer_epoch: i16 = _f("int16")
    transaction_timeout_ms: i32 = _f("int32")
    transaction_status: i8 = _f("int8")
    transaction_partitions: tuple[_PartitionsV1, ...] | None = field(metadata={}, default=None)
    transaction_last_update_timestamp_ms: i64 = _f("int64")
    transaction_start_timestamp_ms: i64 = _f("int64")
    client_transaction_version: i16 = _f("int16", i16(0), tag=2)


_VALUES = {0: (_ValueV0, _PartitionsV0), 1: (_ValueV1, _PartitionsV1)}



# Keys ----------------------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    return encode_versioned(_KeyV0, _KeyV0(transactional_id=transactional_id), KEY_VERSION)


def decode_key(data: bytes) -> str | None:
    """The transactional id of a record key; None for key versions josef does not know (skipped on load)."""
    entity = key_entity(data)
    return None if entity is None else str(entity.transactional_id)


# Values --------------------------------------------------------------------------------------------


def encode_value(value: TransactionLogValue, version: int) -> bytes:
    """``value`` as TransactionLogValue ``version`` (0 drops the tagged fields, as Kafka's version 0 has none)."""
    cls, partitions_cls = _VALUES[version]
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(value.partitions):
        by_topic.setdefault(topic, []).append(partition)
    partitions = None if value.state_id == EMPTY_STATE_ID else tuple(
        partitions_cls(topic=topic, partition_ids=tuple(i32(p) for p in ids)) for topic, ids in by_topic.items())
    fields: dict[str, Any] = dict(
        producer_id=i64(value.producer_id), producer_epoch=i16(value.producer_epoch),
        transaction_timeout_ms=i32(value.timeout_ms), transaction_status=i8(value.state_id),
        transaction_partitions=partitions, transaction_last_update_timestamp_ms=i64(value.last_update_ms),
        transaction_start_timestamp_ms=i64(value.start_ms))
    if version >= 1:
        fields.update(previous_producer_id=i64(value.previous_producer_id), next_producer_id=i64(value.next_producer_id),
                      client_transaction_version=i16(value.client_transaction_version))
    return encode_versioned(cls, cls(**fields), version)


def value_entity(data: bytes) -> tuple[int, Any]:
    """A value's version and its schema entity as read, field for field (what ``dump-log`` prints)."""
    version = record_version(data, "transaction log value", RecordFormatError)
    if version not in _VALUES:
        raise RecordFormatError(f"unknown transaction log value version {version}")
    return version, decode_versioned(_VALUES[version][0], data, f"transaction log value v{version}",
                                     RecordFormatError)


def key_entity(data: bytes) -> Any:
    """A key's schema entity; None for key versions josef does not know."""
    if record_version(data, "transaction log key", RecordFormatError) != KEY_VERSION:
        return None
    return decode_versioned(_KeyV0, data, "transaction log key", RecordFormatError)


def decode_value(data: bytes) -> TransactionLogValue:
    _, entity = value_entity(data)
    partitions = frozenset((p.topic, int(i)) for p in entity.transaction_partitions or () for i in p.partition_ids)
    return TransactionLogValue(
        producer_id=entity.producer_id, producer_epoch=entity.producer_epoch, timeout_ms=entity.transaction_timeout_ms,
        state_id=entity.transaction_status, partitions=partitions,
        last_update_ms=entity.transaction_last_update_timestamp_ms, start_ms=entity.transaction_start_timestamp_ms,
        previous_producer_id=getattr(entity, "previous_producer_id", -1),
        next_producer_id=getattr(entity, "next_producer_id", -1),
        client_transaction_version=getattr(entity, "client_transaction_version", 0))
