"""DescribeShareGroupOffsets (90, v0-1), AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92).

A share group's "offsets" are its share partitions' start offsets, which the
share coordinator keeps (``__share_group_state``), not this coordinator. The
group coordinator checks the group (a share group; empty to alter or delete)
and asks the share coordinator of each share partition, found as
FindCoordinator key type 2 finds it, through the core's runtime and
``call_peer``: ReadShareGroupStateSummary to describe, InitializeShareGroupState
with the next state epoch to alter (which fences writes made against the old
state), DeleteShareGroupState to delete. Without a share coordinator installed
these answer COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.metadata.records import uuid_from_text, uuid_to_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import with_shard
from josef_coordinator_group.group import GroupError

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

#: FindCoordinator's key type of share partitions.
SHARE_KEY_TYPE = 2


class ShareOffsetApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def _group(self, group_id: str, *, empty: bool, create: bool = False) -> list[str]:
        """The share group's subscribed topic names; GroupError unless it is a share group (and empty). With
        ``create`` an unused group id becomes an empty share group (as AlterShareGroupOffsets does in Kafka)."""
        async def check(shard: GroupShard) -> list[str]:
            group = shard.share_groups.get(group_id)
            if group is None and create and shard.groups.get(group_id) is None \
                    and shard.consumer_groups.get(group_id) is None:
                await shard.share_membership.create(group_id)
                return []
            if group is None:
                raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group."
                                 if shard.groups.get(group_id) is not None or shard.consumer_groups.get(group_id)
                                 is not None else f"Group {group_id} not found.")
            if empty and group.members:
                raise GroupError(ErrorCode.non_empty_group, f"Share group {group_id} has members.")
            return sorted({n for m in group.members.values() for n in m.subscribed_topic_names}
                          | {name for name, _ in group.initialized.values() if name})
        return await with_shard(self.coordinator, group_id, check)

    async def _state_call(self, ctx: RequestContext, api_key: int, version: int, group_id: str, topic_id: str,
                          partition: dict[str, Any]) -> Any:
        """One share partition's share-state request at its share coordinator; its partition result."""
        runtime = ctx.services.coordinators
        share = runtime.by_key_type(SHARE_KEY_TYPE)
        if share is None:
            raise CoordinatorError(ErrorCode.coordinator_not_available, "no share coordinator is installed")
        key = f"{group_id}:{topic_id}:{partition['partition']}"
        await runtime.ensure_topic(share)
        node = runtime.leader_of(share, key)
        if node < 0:
            raise CoordinatorError(ErrorCode.coordinator_not_available, f"no share coordinator for {key}")
        try:
            answer = await ctx.services.call_peer(node, api_key, {"group_id": group_id, "topics": [
                {"topic_id": topic_id, "partitions": [partition]}]}, version=version)
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            raise CoordinatorError(ErrorCode.coordinator_not_available, str(exc)) from exc
        return answer.results[0].partitions[0] if getattr(answer, "results", None) else answer

    def _topic(self, ctx: RequestContext, name: str) -> Any:
        return ctx.services.image.topics.get(name)

    async def delete_state(self, ctx: RequestContext, group_id: str) -> None:
        """Before an empty share group is deleted (DeleteGroups): its share-partition state, at the share
        coordinator, as Kafka does; CoordinatorError when that fails (the group stays)."""
        if ctx.services.coordinators.by_key_type(SHARE_KEY_TYPE) is None:
            return  # no share coordinator installed: no state was kept

        async def initialized(shard: GroupShard) -> dict[str, tuple[str, frozenset[int]]]:
            group = shard.share_groups.get(group_id)
            if group is None or group.members or not group.initialized:
                shard.refused()  # nothing of its to delete here: on to DeleteGroups at once, whatever is pending
                return {}
            return dict(group.initialized)

        for topic_id, (_, partitions) in (await with_shard(self.coordinator, group_id, initialized)).items():
            for partition in sorted(partitions):
                deleted = await self._state_call(ctx, ApiKey.DELETE_SHARE_GROUP_STATE, 0, group_id,
                                                 uuid_to_text(uuid.UUID(topic_id)), {"partition": partition})
                if deleted.error_code != ErrorCode.none:
                    raise CoordinatorError(deleted.error_code, deleted.error_message or deleted.error_code.name)

    async def describe(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        groups = []
        for requested in request.groups:
            answer: dict[str, Any] = {"group_id": requested.group_id, "topics": [], "error_code": ErrorCode.none,
                                      "error_message": None}
            try:
                subscribed = await self._group(requested.group_id, empty=False)
            except (GroupError, CoordinatorError) as exc:
                answer.update(error_code=exc.code, error_message=getattr(exc, "message", str(exc)))
                groups.append(answer)
                continue
            wanted = ([(t.topic_name, list(t.partitions)) for t in requested.topics] if requested.topics is not None
                      else [(n, None) for n in subscribed])
            for name, partitions in wanted:
                topic = self._topic(ctx, name)
                indexes = partitions if partitions is not None else sorted(topic.partitions) if topic else []
                parts = []
                for index in indexes:
                    part: dict[str, Any] = {"partition_index": index, "start_offset": -1, "leader_epoch": -1,
                                            "lag": -1, "error_code": ErrorCode.none, "error_message": None}
                    if topic is None or index not in topic.partitions:
                        part.update(error_code=ErrorCode.unknown_topic_or_partition,
                                    error_message=f"{name}-{index} does not exist")
                    else:
                        try:
                            summary = await self._state_call(ctx, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1,
                                                             requested.group_id, topic.topic_id,
                                                             {"partition": index, "leader_epoch": -1})
                            if summary.error_code != ErrorCode.none:
                                part.update(error_code=summary.error_code, error_message=summary.error_message)
                            else:
                                part.update(start_offset=summary.start_offset, leader_epoch=summary.leader_epoch)
                        except CoordinatorError as exc:
                            part.update(error_code=exc.code, error_message=exc.message)
                    parts.append(part)
                answer["topics"].append({"topic_name": name, "topic_id": topic.topic_id if topic else None,
                                         "partitions": parts})
            groups.append(answer)
        return {"throttle_time": 0, "groups": groups}

    async def alter(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Each share partition restarts at the given offset, under the next state epoch (no in-flight state)."""
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                                  "responses": []}
        try:
            await self._group(request.group_id, empty=True, create=True)
        except (GroupError, CoordinatorError) as exc:
            return {**answer, "error_code": exc.code, "error_message": getattr(exc, "message", str(exc))}
        done: dict[str, tuple[str, set[int]]] = {}
        for requested in request.topics:
            topic = self._topic(ctx, requested.topic_name)
            parts = []
            for part in requested.partitions:
                code, message = ErrorCode.none, None
                if topic is None or part.partition_index not in topic.partitions:
                    code, message = ErrorCode.unknown_topic_or_partition, "the partition does not exist"
                else:
                    try:
                        summary = await self._state_call(ctx, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0,
                                                         request.group_id, topic.topic_id,
                                                         {"partition": part.partition_index, "leader_epoch": -1})
                        initialized = await self._state_call(
                            ctx, ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, request.group_id, topic.topic_id,
                            {"partition": part.partition_index, "state_epoch": summary.state_epoch + 1,
                             "start_offset": part.start_offset})
                        code, message = initialized.error_code, initialized.error_message
                    except CoordinatorError as exc:
                        code, message = exc.code, exc.message
                if code == ErrorCode.none:
                    done.setdefault(str(uuid_from_text(topic.topic_id)), (requested.topic_name, set())
                                    )[1].add(part.partition_index)
                parts.append({"partition_index": part.partition_index, "error_code": code, "error_message": message})
            answer["responses"].append({"topic_name": requested.topic_name,
                                        "topic_id": topic.topic_id if topic else None, "partitions": parts})
        await self._record(request.group_id, add={t: (n, frozenset(ps)) for t, (n, ps) in done.items()})
        return answer

    async def _record(self, group_id: str, add: dict[str, tuple[str, frozenset[int]]] | None = None,
                      remove: set[str] | None = None) -> None:
        """Which topics the group has share-partition state for now (its ShareGroupStatePartitionMetadata)."""
        if not add and not remove:
            return

        async def update(shard: GroupShard) -> None:
            await shard.share_membership.set_initialized(group_id, add or {}, remove or set())
        await with_shard(self.coordinator, group_id, update)

    async def delete(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Forget the share group's state of whole topics (DeleteShareGroupState of each partition)."""
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                                  "responses": []}
        try:
            await self._group(request.group_id, empty=True)
        except (GroupError, CoordinatorError) as exc:
            return {**answer, "error_code": exc.code, "error_message": getattr(exc, "message", str(exc))}
        forgotten: set[str] = set()
        for requested in request.topics:
            topic = self._topic(ctx, requested.topic_name)
            code, message = ErrorCode.none, None
            if topic is None:
                code, message = ErrorCode.unknown_topic_or_partition, f"topic {requested.topic_name} does not exist"
            else:
                for index in sorted(topic.partitions):
                    try:
                        deleted = await self._state_call(ctx, ApiKey.DELETE_SHARE_GROUP_STATE, 0, request.group_id,
                                                         topic.topic_id, {"partition": index})
                        if deleted.error_code != ErrorCode.none:
                            code, message = deleted.error_code, deleted.error_message
                    except CoordinatorError as exc:
                        code, message = exc.code, exc.message
            if topic is not None and code == ErrorCode.none:
                forgotten.add(str(uuid_from_text(topic.topic_id)))
            answer["responses"].append({"topic_name": requested.topic_name,
                                        "topic_id": topic.topic_id if topic else None, "error_code": code,
                                        "error_message": message})
        await self._record(request.group_id, remove=forgotten)
        return answer
