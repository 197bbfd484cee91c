"""``josef dump-log --offsets-decoder``: the records of ``__consumer_offsets`` as Kafka's tool prints them.

Kafka's ``DumpLogSegments`` prints each key as ``{"type":"<record type>","data":{...}}``
and each value as ``{"version":"<version>","data":{...}}``, the data written by the
records' generated JSON converters (field names in camelCase, only the fields of
that version). A classic group of protocol type ``consumer`` has each member's
subscription and assignment decoded too, as Kafka does; other protocols keep
them as base64 bytes. The plugin registers :func:`decode` through
``register_record_decoders``; the tool serialises the dicts.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from josef.metadata.records import uuid_to_text
from josef.protocol.consumer_protocol import PROTOCOL_TYPE

from josef_coordinator_group import records

Json = dict[str, Any]


def decode(key: bytes, value: bytes | None) -> tuple[Json, Json | None]:
    """One record's key and value (None for a tombstone), for the dump tool; see the ``register_record_decoders`` hook."""
    parsed = records.decode_key(key)
    if parsed is None:
        raise LookupError(struct.unpack_from(">h", key)[0])
    record_type = struct.unpack_from(">h", key)[0]
    data: Json
    if isinstance(parsed, records.OffsetKey):
        data = {"group": parsed.group, "topic": parsed.topic, "partition": parsed.partition}
    elif isinstance(parsed, records.GroupKey):
        data = {"group": parsed.group}
    else:
        data = {"groupId": parsed.group}
        if parsed.member is not None:
            data["memberId"] = parsed.member
    return {"type": str(record_type), "data": data}, None if value is None else _value(record_type, value)


def _value(record_type: int, value: bytes) -> Json:
    version = struct.unpack_from(">h", value)[0] if len(value) >= 2 else -1
    data: Json
    if record_type in (0, 1):
        offset = records.decode_offset(value)
        data = {"offset": offset.offset}
        if version >= 3:
            data["leaderEpoch"] = offset.leader_epoch
        data.update(metadata=offset.metadata, commitTimestamp=offset.commit_timestamp)
        if version == 1:
            data["expireTimestamp"] = offset.expire_timestamp
    elif record_type == 2:
        data = _group(records.decode_group(value), version)
    elif record_type in (records.CONSUMER_GROUP_METADATA, records.SHARE_GROUP_METADATA):
        data = {"epoch": records.decode_epoch(value)}
    elif record_type in (records.CONSUMER_TARGET_METADATA, records.SHARE_TARGET_METADATA):
        data = {"assignmentEpoch": records.decode_epoch(value)}
    elif record_type == records.SHARE_MEMBER_METADATA:
        share_member = records.decode_share_member(value)
        data = {"rackId": share_member.rack_id, "clientId": share_member.client_id,
                "clientHost": share_member.client_host,
                "subscribedTopicNames": list(share_member.subscribed_topic_names)}
    elif record_type == records.SHARE_CURRENT_ASSIGNMENT:
        share_current = records.decode_share_assignment(value)
        data = {"memberEpoch": share_current.member_epoch, "previousMemberEpoch": share_current.previous_member_epoch,
                "state": share_current.state, "assignedPartitions": _topic_partitions(share_current.assigned)}
    elif record_type == records.CONSUMER_MEMBER_METADATA:
        member = records.decode_consumer_member(value)
        data = {"instanceId": member.instance_id, "rackId": member.rack_id, "clientId": member.client_id,
                "clientHost": member.client_host, "subscribedTopicNames": list(member.subscribed_topic_names),
                "subscribedTopicRegex": member.subscribed_topic_regex,
                "rebalanceTimeoutMs": member.rebalance_timeout_ms, "serverAssignor": member.server_assignor}
    elif record_type == records.SHARE_STATE_PARTITIONS:
        state = records.decode_share_state_partitions(value)
        data = {"initializedTopics": [{"topicId": uuid_to_text(uuid.UUID(t)), "topicName": name,
                                       "partitions": sorted(ps)} for t, (name, ps) in state.initialized.items()],
                "deletingTopics": [{"topicId": uuid_to_text(uuid.UUID(t)), "topicName": name}
                                   for t, name in state.deleting.items()]}
    elif record_type in (records.CONSUMER_TARGET_MEMBER, records.SHARE_TARGET_MEMBER):
        data = {"topicPartitions": _topic_partitions(records.decode_target_member(value))}
    else:
        current = records.decode_current_assignment(value)
        data = {"memberEpoch": current.member_epoch, "previousMemberEpoch": current.previous_member_epoch,
                "state": current.state, "assignedPartitions": _topic_partitions(current.assigned),
                "partitionsPendingRevocation": _topic_partitions(current.pending_revocation)}
    return {"version": str(version), "data": data}


def _group(group: records.GroupValue, version: int) -> Json:
    data: Json = {"protocolType": group.protocol_type, "generation": group.generation, "protocol": group.protocol,
                  "leader": group.leader}
    if version >= 2:
        data["currentStateTimestamp"] = group.current_state_timestamp
    members = []
    for member in group.members:
        entry: Json = {"memberId": member.member_id}
        if version >= 3:
            entry["groupInstanceId"] = member.group_instance_id
        entry.update(clientId=member.client_id, clientHost=member.client_host)
        if version >= 1:
            entry["rebalanceTimeout"] = member.rebalance_timeout
        entry["sessionTimeout"] = member.session_timeout
        consumer = group.protocol_type == PROTOCOL_TYPE
        entry["subscription"] = _embedded("subscription", member.subscription) if consumer else member.subscription
        entry["assignment"] = _embedded("assignment", member.assignment) if consumer else member.assignment
        members.append(entry)
    data["members"] = members
    return data


def _embedded(kind: str, data: bytes) -> Any:
    """A ConsumerProtocolSubscription/Assignment as the kio message of its version; its bytes when unreadable (as Kafka)."""
    import importlib

    from kio.serial import entity_reader

    try:
        version = struct.unpack_from(">h", data)[0]
        module = importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")
        message, _ = entity_reader(getattr(module, f"ConsumerProtocol{kind.capitalize()}"))(data, 2)
    except Exception:  # noqa: BLE001 - Kafka keeps the original bytes of whatever it cannot read
        return data
    return message


def _topic_partitions(value: records.TopicPartitions) -> list[Json]:
    return [{"topicId": uuid_to_text(uuid.UUID(topic_id)), "partitions": sorted(partitions)}
            for topic_id, partitions in value.items()]
