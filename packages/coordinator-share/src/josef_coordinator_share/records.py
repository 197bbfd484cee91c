"""The records of ``__share_group_state``, in Kafka's binary format (``share-coordinator/*.json`` in Kafka's source).

Every record is keyed by one share partition (group id, topic id, partition);
the key's int16 version says which record it is, as in every coordinator
topic of Kafka 4.x:

- 0, ShareSnapshot: the share partition's whole state (state epoch, leader
  epoch, start offset, the state batches of the in-flight window);
- 1, ShareUpdate: what one WriteShareGroupState changed (its leader epoch,
  its start offset or -1, its batches), applied over the last snapshot;
- a null value under either key (both are written) deletes the state.

Values carry their own int16 version (0, flexible: compact strings and
arrays, tagged fields). The schemas are declared the way kio declares
protocol messages, so kio's reader and writer serialise them. This module is
evaluated without postponed annotations because kio reads the field types.
"""

import uuid
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64, u16

from josef.coordinator.records import decode_versioned, encode_versioned, record_version

from josef_coordinator_share.state import ShareKey, ShareState, StateBatch

#: Key versions, which name the record type.
SNAPSHOT_KEY_VERSION = 0
UPDATE_KEY_VERSION = 1
VALUE_VERSION = 0


class RecordFormatError(ValueError):
    """A record of ``__share_group_state`` could not be decoded."""


def _f(kafka_type: str, default: Any = MISSING) -> Any:
    return field(metadata={"kafka_type": kafka_type}, default=default)


_schema = dataclass(frozen=True, slots=True, kw_only=True)


@_schema
class _SnapshotKey:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    group_id: str = _f("string")
    topic_id: uuid.UUID = _f("uuid")
    partition: i32 = _f("int32")


@_schema
class _UpdateKey:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    group_id: str = _f("string")
    topic_id: uuid.UUID = _f("uuid")
    partition: i32 = _f("int32")


@_schema
class _StateBatch:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    first_offset: i64 = _f("int64")
    last_offset: i64 = _f("int64")
    delivery_state: i8 = _f("int8")
    delivery_count: i16 = _f("int16")


@_schema
class _SnapshotValue:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    snapshot_epoch: u16 = _f("uint16")
    state_epoch: i32 = _f("int32")
    leader_epoch: i32 = _f("int32")
    start_offset: i64 = _f("int64")
    state_batches: tuple[_StateBatch, ...] = field(metadata={}, default=())


@_schema
class _UpdateValue:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    snapshot_epoch: u16 = _f("uint16")
    leader_epoch: i32 = _f("int32")
    start_offset: i64 = _f("int64")
    state_batches: tuple[_StateBatch, ...] = field(metadata={}, default=())


_KEYS = {SNAPSHOT_KEY_VERSION: _SnapshotKey, UPDATE_KEY_VERSION: _UpdateKey}
_VALUES = {SNAPSHOT_KEY_VERSION: _SnapshotValue, UPDATE_KEY_VERSION: _UpdateValue}



def _batches(batches: tuple[StateBatch, ...]) -> tuple[_StateBatch, ...]:
    return tuple(_StateBatch(first_offset=i64(b.first_offset), last_offset=i64(b.last_offset),
                             delivery_state=i8(b.delivery_state), delivery_count=i16(b.delivery_count))
                 for b in batches)


# Keys --------------------------------------------------------------------------------------------------------


def encode_key(key: ShareKey, record_type: int) -> bytes:
    cls = _KEYS[record_type]
    entity = cls(group_id=key.group_id, topic_id=key.topic_id, partition=i32(key.partition))
    return encode_versioned(cls, entity, record_type)


def key_entity(data: bytes) -> tuple[int, Any] | None:
    """A key's record type and schema entity; None for record types josef does not know (skipped on load)."""
    version = record_version(data, "share group state key", RecordFormatError)
    cls = _KEYS.get(version)
    if cls is None:
        return None
    return version, decode_versioned(cls, data, f"share group state key v{version}", RecordFormatError)


def decode_key(data: bytes) -> tuple[int, ShareKey] | None:
    decoded = key_entity(data)
    if decoded is None:
        return None
    record_type, entity = decoded
    return record_type, ShareKey(entity.group_id, entity.topic_id, int(entity.partition))


# Values ------------------------------------------------------------------------------------------------------


def encode_snapshot(state: ShareState) -> bytes:
    return encode_versioned(_SnapshotValue, _SnapshotValue(
        snapshot_epoch=u16(state.snapshot_epoch), state_epoch=i32(state.state_epoch),
        leader_epoch=i32(state.leader_epoch), start_offset=i64(state.start_offset),
        state_batches=_batches(state.batches)), VALUE_VERSION)


def encode_update(snapshot_epoch: int, leader_epoch: int, start_offset: int, batches: tuple[StateBatch, ...]) -> bytes:
    return encode_versioned(_UpdateValue, _UpdateValue(
        snapshot_epoch=u16(snapshot_epoch), leader_epoch=i32(leader_epoch), start_offset=i64(start_offset),
        state_batches=_batches(batches)), VALUE_VERSION)


def value_entity(record_type: int, data: bytes) -> tuple[int, Any]:
    """A value's version and schema entity as read, field for field (what ``dump-log`` prints)."""
    version = record_version(data, "share group state value", RecordFormatError)
    if version != VALUE_VERSION:
        raise RecordFormatError(f"unknown share group state value version {version}")
    return version, decode_versioned(_VALUES[record_type], data,
                                     f"share group state value of record type {record_type}", RecordFormatError)


def state_batches(entity: Any) -> tuple[StateBatch, ...]:
    return tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                 for b in entity.state_batches)
