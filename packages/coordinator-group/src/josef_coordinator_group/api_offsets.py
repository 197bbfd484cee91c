"""OffsetCommit (v2-v10), OffsetFetch (v1-v10) and OffsetDelete (v0): a group's committed positions.

Who may commit follows Kafka: members of the current generation (member id
and generation checked), or anyone while the group is empty or does not
exist when the request carries generation -1 (the admin client, consumers
that assign partitions themselves), which creates a "simple" group. Offsets
are written as records and answered only once committed to the partition;
OffsetFetch reads the offsets committed (a commit still replicating is not
seen, one that timed out is seen once it commits).
(kio, which parses requests, knows no OffsetCommit v0-v1 nor OffsetFetch v0:
those versions, dropped by Kafka 4.0 too (KIP-896), are not advertised.)

From v10 on, OffsetCommit and OffsetFetch name topics by topic id (KIP-848),
as the new consumer does everywhere. Offsets stay stored by topic name, as
Kafka's are: ids are resolved through the metadata image when the request
arrives, an id the image does not know is answered UNKNOWN_TOPIC_ID, and
answers carry the ids back (a fetch of all offsets leaves out topics that no
longer exist, since they have no id left to name them by).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import CoordinatorError
from josef.metadata.image import MetadataImage
from josef.metadata.records import uuid_from_text, uuid_to_text
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import ms, with_shard
from josef_coordinator_group.group import GroupError
from josef_coordinator_group.records import OffsetKey, OffsetValue, encode_key, encode_offset

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

#: (topic, [(partition, offset, leader epoch, metadata)]) as requested.
CommitTopics = list[tuple[str, list[tuple[int, int, int, str | None]]]]
PartitionErrors = dict[tuple[str, int], ErrorCode]
#: The first OffsetCommit and OffsetFetch version that names topics by id.
TOPIC_ID_VERSION = 10


def topic_name(image: MetadataImage, topic: Any, version: int) -> str | None:
    """A request topic's name: its own before v10, its id's from v10 on (None: an unknown id)."""
    if version < TOPIC_ID_VERSION:
        return topic.name
    found = image.topic_by_id(uuid_to_text(topic.topic_id)) if topic.topic_id is not None else None
    return found.name if found is not None else None


def topic_id(image: MetadataImage, name: str) -> uuid.UUID | None:
    """The id of topic ``name``; None once it no longer exists."""
    topic = image.topics.get(name)
    return uuid_from_text(topic.topic_id) if topic is not None else None


@attrs.frozen
class CommitRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    retention_ms: int
    topics: CommitTopics
    api_version: int


async def commit_offsets(shard: GroupShard, image: MetadataImage, request: CommitRequest) -> PartitionErrors:
    """Validate the committer, write the offsets, return each partition's error code."""
    everything = [(t, p[0]) for t, parts in request.topics for p in parts]
    group = shard.groups.get(request.group_id)
    consumer_group = shard.consumer_groups.get(request.group_id)
    try:
        if consumer_group is not None:
            # KIP-848 members commit with their member id and member epoch.
            shard.consumer_membership.validate_offset_commit(consumer_group, request.member_id,
                                                             request.generation_id)
        elif group is None:
            if request.generation_id >= 0:
                # v9+ says what happened; older clients expect ILLEGAL_GENERATION and rejoin.
                raise GroupError(ErrorCode.group_id_not_found if request.api_version >= 9
                                 else ErrorCode.illegal_generation, f"group {request.group_id} does not exist")
        else:
            group.validate_offset_commit(request.member_id, request.group_instance_id, request.generation_id)
    except GroupError as exc:
        shard.refused()
        return {tp: exc.code for tp in everything}
    errors: PartitionErrors = {(topic, p[0]): ErrorCode.unknown_topic_or_partition
                               for topic, partitions in request.topics if topic not in image.topics for p in partitions}
    known = [(topic, partitions) for topic, partitions in request.topics if topic in image.topics]
    if group is not None and request.generation_id >= 0:
        shard.membership.touch(group, request.member_id)  # at the request, as Kafka: the member is alive
    written, _ = await write_offsets(shard, request.group_id, known, request.retention_ms)
    errors.update(written)
    return errors


async def write_offsets(shard: GroupShard, group_id: str, topics: CommitTopics, retention_ms: int = -1, *,
                        producer_id: int = -1, producer_epoch: int = -1,
                        verification: object | None = None) -> tuple[PartitionErrors, ErrorCode]:
    """Write the offset records of ``topics`` (existing ones), in ``producer_id``'s transaction if given
    (``verification``: the guard of the partition's verification with the transaction coordinator).

    Returns each partition's error (OFFSET_METADATA_TOO_LARGE, or the
    write's outcome) and the write's outcome.
    """
    max_metadata = shard.settings().offset_metadata_max_bytes
    now = clock.now_ms()
    expire = now + retention_ms if retention_ms >= 0 else -1
    errors: PartitionErrors = {}
    records: list[tuple[bytes, bytes | None]] = []
    written: list[tuple[str, int]] = []
    for topic, partitions in topics:
        for index, offset, leader_epoch, metadata in partitions:
            if metadata is not None and len(metadata.encode()) > max_metadata:
                errors[(topic, index)] = ErrorCode.offset_metadata_too_large
            else:
                value = OffsetValue(offset, metadata or "", now, leader_epoch, expire)
                records.append((encode_key(OffsetKey(group_id, topic, index)), encode_offset(value)))
                written.append((topic, index))
    try:
        await shard.write(records, producer_id=producer_id, producer_epoch=producer_epoch,
                          verification=verification)
        code = ErrorCode.none
    except CoordinatorError as exc:
        code = exc.code
    errors.update({tp: code for tp in written})
    return errors, code


def _commit_response(request: Any, names: list[str | None], errors: PartitionErrors | None,
                     error: ErrorCode) -> dict[str, Any]:
    """Each requested partition's error; ``names`` are the request topics' (None: an unknown topic id)."""

    def code(name: str | None, partition: int) -> ErrorCode:
        if name is None:
            return ErrorCode.unknown_topic_id
        return errors.get((name, partition), error) if errors is not None else error

    return {"throttle_time": 0, "topics": [
        {"name": name, "topic_id": getattr(topic, "topic_id", None), "partitions": [
            {"partition_index": p.partition_index, "error_code": code(name, p.partition_index)}
            for p in topic.partitions]}
        for topic, name in zip(request.topics, names)]}


def _fetch_partition(shard: GroupShard | None, group_id: str, topic: str, partition: int,
                     error: ErrorCode = ErrorCode.none, require_stable: bool = False,
                     at: int | None = None) -> dict[str, Any]:
    """One partition's offset ``at`` a snapshot; UNSTABLE_OFFSET_COMMIT under ``require_stable`` while one is pending."""
    if require_stable and shard is not None and shard.offsets.has_pending(group_id, topic, partition, at):
        error, value = ErrorCode.unstable_offset_commit, None
    else:
        value = shard.offsets.get(group_id, topic, partition, at) if shard is not None else None
    if value is None:
        return {"partition_index": partition, "committed_offset": -1, "committed_leader_epoch": -1,
                "metadata": "", "error_code": error}
    return {"partition_index": partition, "committed_offset": value.offset,
            "committed_leader_epoch": value.leader_epoch, "metadata": value.metadata, "error_code": error}


def _subscribed_topics(shard: GroupShard, group_id: str, image: MetadataImage) -> set[str]:
    """The topics whose offsets OffsetDelete must keep (GROUP_SUBSCRIBED_TO_TOPIC), once the group may delete any.

    A KIP-848 consumer group may delete offsets in any state, of topics no
    member subscribes to (Kafka's ConsumerGroup.validateOffsetDelete accepts
    all); a classic group only while empty or using the consumer protocol.
    """
    consumer_group = shard.consumer_groups.get(group_id)
    if consumer_group is not None:
        return consumer_group.subscribed_topics(image.topics)
    group = shard.groups.get(group_id)
    if group is None:
        raise GroupError(ErrorCode.group_id_not_found, f"group {group_id} does not exist")
    group.validate_offset_delete()
    return {topic for topic in image.topics if group.is_subscribed_to(topic)}


class OffsetApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def offset_commit(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        names = [topic_name(ctx.services.image, t, version) for t in request.topics]
        commit = CommitRequest(
            group_id=request.group_id,
            generation_id=getattr(request, "generation_id_or_member_epoch", -1),
            member_id=getattr(request, "member_id", ""),
            group_instance_id=getattr(request, "group_instance_id", None),
            retention_ms=ms(getattr(request, "retention_time", None)),
            topics=[(name, [(p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", -1),
                             p.committed_metadata) for p in t.partitions])
                    for t, name in zip(request.topics, names) if name is not None],
            api_version=version,
        )
        if not commit.group_id:
            return _commit_response(request, names, None, ErrorCode.invalid_group_id)

        async def operation(shard: GroupShard) -> PartitionErrors:
            return await commit_offsets(shard, ctx.services.image, commit)

        try:
            errors = await with_shard(self.coordinator, commit.group_id, operation)
        except CoordinatorError as exc:
            return _commit_response(request, names, None, exc.code)
        return _commit_response(request, names, errors, ErrorCode.none)

    async def _fetch_group(self, group_id: str, requested: Any, version: int, image: MetadataImage,
                           require_stable: bool) -> tuple[ErrorCode, list[dict[str, Any]]]:
        """One group's offsets: the requested topics' partitions (-1 when none is committed), or all it has.

        A read of the committed offsets, as Kafka's. ``require_stable``
        (v7+, KIP-447) makes it Kafka's write operation instead: the latest
        state is read, a partition whose offset an open transaction is
        committing answers UNSTABLE_OFFSET_COMMIT (a partition error, in
        every version), so the consumer retries rather than start from an
        offset the transaction is about to replace, and the answer waits
        until everything written before it is committed.
        """
        try:
            context, shard = await self.coordinator.shard_for(group_id)
            if not context.active:
                raise CoordinatorError(ErrorCode.not_coordinator, "moved")
            if require_stable:
                async with context.lock:
                    topics = self._offsets(shard, group_id, requested, version, image, True, None)
                    await shard.wait(context.barrier())
                return ErrorCode.none, topics
        except CoordinatorError as exc:
            if requested is None or version >= 2:
                return exc.code, []
            return exc.code, [{"name": t.name, "partitions": [_fetch_partition(None, group_id, t.name, p, exc.code)
                                                             for p in t.partition_indexes]} for t in requested]
        return ErrorCode.none, self._offsets(shard, group_id, requested, version, image, False, shard.committed)

    @staticmethod
    def _offsets(shard: GroupShard, group_id: str, requested: Any, version: int, image: MetadataImage,
                 require_stable: bool, at: int | None) -> list[dict[str, Any]]:
        if requested is None:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for topic, partition in sorted(shard.offsets.of_group(group_id, at)):
                by_topic[topic].append(partition)
            ids = {topic: topic_id(image, topic) for topic in by_topic} if version >= TOPIC_ID_VERSION else {}
            return [
                {"name": topic, "topic_id": ids.get(topic),
                 "partitions": [_fetch_partition(shard, group_id, topic, p, require_stable=require_stable, at=at)
                                for p in partitions]}
                for topic, partitions in by_topic.items()
                if version < TOPIC_ID_VERSION or ids[topic] is not None]
        topics = []
        for t in requested:
            name = topic_name(image, t, version)
            topics.append({"name": name, "topic_id": getattr(t, "topic_id", None), "partitions": [
                _fetch_partition(shard, group_id, name, p, require_stable=require_stable, at=at) if name is not None
                else _fetch_partition(None, group_id, "", p, ErrorCode.unknown_topic_id)
                for p in t.partition_indexes]})
        return topics

    async def offset_fetch(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        image = ctx.services.image
        require_stable = bool(getattr(request, "require_stable", False))
        if version >= 8:
            groups = []
            for group in request.groups:
                error, topics = await self._fetch_group(group.group_id, group.topics, version, image, require_stable)
                groups.append({"group_id": group.group_id, "topics": topics, "error_code": error})
            return {"throttle_time": 0, "groups": groups}
        error, topics = await self._fetch_group(request.group_id, request.topics, version, image, require_stable)
        return {"throttle_time": 0, "topics": topics, "error_code": error}

    async def offset_delete(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        group_id = request.group_id
        image = ctx.services.image
        requested = [(t.name, [p.partition_index for p in t.partitions]) for t in request.topics]

        async def operation(shard: GroupShard) -> PartitionErrors:
            subscribed = _subscribed_topics(shard, group_id, image)
            errors: PartitionErrors = {}
            records: list[tuple[bytes, bytes | None]] = []
            for topic, partitions in requested:
                topic_image = image.topics.get(topic)
                for index in partitions:
                    if topic_image is None or index not in topic_image.partitions:
                        errors[(topic, index)] = ErrorCode.unknown_topic_or_partition
                    elif topic in subscribed:
                        errors[(topic, index)] = ErrorCode.group_subscribed_to_topic
                    else:
                        errors[(topic, index)] = ErrorCode.none
                        if (shard.offsets.get(group_id, topic, index) is not None
                                or shard.offsets.has_pending(group_id, topic, index)):
                            records.append((encode_key(OffsetKey(group_id, topic, index)), None))
            await shard.write(records)
            return errors

        error = ErrorCode.none
        errors: PartitionErrors = {}
        try:
            if not group_id:
                raise GroupError(ErrorCode.invalid_group_id)
            errors = await with_shard(self.coordinator, group_id, operation)
        except (CoordinatorError, GroupError) as exc:
            error = exc.code
        return {"error_code": error, "throttle_time": 0, "topics": [] if error != ErrorCode.none else [
            {"name": topic, "partitions": [{"partition_index": p, "error_code": errors[(topic, p)]} for p in parts]}
            for topic, parts in requested]}
