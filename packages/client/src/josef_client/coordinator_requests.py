"""A coordinator's requests, one each: FindCoordinator (groups and transactional ids), OffsetFetch, OffsetCommit.

No retries and no state here: the consumer's
:class:`~josef_client.consumer_coordinator.ConsumerCoordinator` adds them
for its own group, the transactional producer's
:class:`~josef_client.transaction_manager.TransactionManager` for its
transactional id, and the ``groups`` command uses these for any group.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaError, UnsupportedVersionError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import Cluster

__all__ = ["GROUP", "TRANSACTION", "OffsetAndMetadata", "find_coordinator", "offset_commit", "offset_fetch"]


@attrs.frozen
class OffsetAndMetadata:
    """A committed offset: the next offset to consume, with the committer's metadata string."""

    offset: int
    metadata: str | None = None
    leader_epoch: int = -1


#: FindCoordinator's key types, and what the key names in messages.
GROUP, TRANSACTION = 0, 1
_KEY_NAMES = {GROUP: "group", TRANSACTION: "transactional id"}


async def find_coordinator(cluster: Cluster, key: str, key_type: int = GROUP) -> tuple[str, int]:
    """The address of the coordinator of a group (key type 0) or transactional id (1), by FindCoordinator to any broker."""
    conn = await cluster.any_connection()
    what = ("consumer groups and committed offsets need a group coordinator" if key_type == GROUP
            else "transactions need a transaction coordinator")
    try:
        version = conn.version(ApiKey.FIND_COORDINATOR)
    except UnsupportedVersionError as exc:
        raise UnsupportedVersionError(f"{what}: {exc.message}") from None
    if key_type != GROUP and version == 0:
        raise UnsupportedVersionError(f"{what}: FindCoordinator v1+ (key types); the broker has only v0")
    response = await conn.request(ApiKey.FIND_COORDINATOR, {"key": key, "key_type": key_type, "coordinator_keys": [key]},
                                  version=version)
    if version >= 4:
        [found] = [c for c in response.coordinators if c.key == key]
    else:
        found = response
    if found.error_code != ErrorCode.none:
        raise KafkaError(found.error_code, f"FindCoordinator for {_KEY_NAMES[key_type]} {key!r}: {found.error_message or ''}")
    return found.host, found.port


async def offset_fetch(conn: Connection, group: str, tps: list[TopicPartition] | None
                       ) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """``group``'s committed offsets of ``tps`` (None where there is none), or with ``tps=None`` every one it has."""
    version = conn.version(ApiKey.OFFSET_FETCH)
    wanted = None
    if tps is None:
        if version < 2:
            raise UnsupportedVersionError("the broker's OffsetFetch cannot list all of a group's offsets (needs v2+)")
    else:
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)
        wanted = [{"name": name, "partition_indexes": parts} for name, parts in topics.items()]
    response = await conn.request(ApiKey.OFFSET_FETCH, {
        "group_id": group, "topics": wanted, "require_stable": True,
        "groups": [{"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}]}, version=version)
    if version >= 8:
        [answer] = [g for g in response.groups if g.group_id == group]
        code, topics_out = answer.error_code, answer.topics
    else:
        code, topics_out = getattr(response, "error_code", ErrorCode.none), response.topics
    if code != ErrorCode.none:
        raise KafkaError(code, f"OffsetFetch for group {group!r}")
    result: dict[TopicPartition, OffsetAndMetadata | None] = {} if tps is None else {tp: None for tp in tps}
    for topic in topics_out:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            if part.error_code != ErrorCode.none:
                raise KafkaError(part.error_code, f"OffsetFetch for {tp.topic}-{tp.partition} of group {group!r}")
            if (tps is None or tp in result) and part.committed_offset >= 0:
                result[tp] = OffsetAndMetadata(part.committed_offset, part.metadata,
                                               getattr(part, "committed_leader_epoch", -1))
    return result


async def offset_commit(conn: Connection, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                        generation: int, member: str, instance: str | None) -> dict[TopicPartition, ErrorCode]:
    """One OffsetCommit; the partitions that failed, with their errors."""
    version = conn.version(ApiKey.OFFSET_COMMIT)
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp, om in sorted(offsets.items()):
        topics.setdefault(tp.topic, []).append({
            "partition_index": tp.partition, "committed_offset": om.offset,
            "committed_leader_epoch": om.leader_epoch, "committed_metadata": om.metadata})
    response = await conn.request(ApiKey.OFFSET_COMMIT, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
        "group_instance_id": instance, "retention_time": -1,
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}, version=version)
    errors = {}
    answered = set()
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            answered.add(tp)
            if part.error_code != ErrorCode.none:
                errors[tp] = part.error_code
    for tp in offsets:
        if tp not in answered:
            errors[tp] = ErrorCode.unknown_server_error
    return errors
