"""ConsumerGroupHeartbeat (API 68, v0-v1) and ConsumerGroupDescribe (API 69, v0): KIP-848 consumer groups."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.metadata.records import uuid_from_text
from josef.protocol.messages import OPERATIONS_OMITTED
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import client_host, ms, with_shard
from josef_coordinator_group.consumer_group import Partitions
from josef_coordinator_group.consumer_membership import HeartbeatRequest, HeartbeatResult, Topics

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

def cluster_topics(image: Any) -> dict[str, tuple[str, int]]:
    """{name: (topic id as a UUID string, partition count)} of every topic in the metadata image."""
    return {name: (_topic_id(topic.topic_id), len(topic.partitions)) for name, topic in image.topics.items()}


def _topic_id(text: str) -> str:
    """josef keeps topic ids as Kafka's base64 text; consumer groups use the UUID's canonical form."""
    try:
        return str(uuid_from_text(text))
    except ValueError:
        return str(uuid.UUID(text))


def partitions_out(value: Partitions) -> list[dict[str, Any]]:
    return [{"topic_id": uuid.UUID(t), "partitions": sorted(ps)} for t, ps in sorted(value.items())]


def topic_names(image: Any) -> dict[str, str]:
    """{topic id as a UUID string: name} of every topic in the metadata image."""
    return {_topic_id(topic.topic_id): name for name, topic in image.topics.items()}


class ConsumerGroupApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def heartbeat(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        owned = None
        if request.topic_partitions is not None:
            owned = {}
            for tp in request.topic_partitions:
                if tp.topic_id is not None:
                    owned[str(tp.topic_id)] = frozenset(owned.get(str(tp.topic_id), frozenset()) | set(tp.partitions))
        hb = HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=ms(request.rebalance_timeout),
            subscribed_topic_names=tuple(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None else None,
            subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
            server_assignor=request.server_assignor,
            owned=owned,
            client_id=ctx.client_id or "",
            client_host=client_host(ctx),
            api_version=ctx.api_version,
        )
        topics: Topics = cluster_topics(ctx.services.image)

        async def operation(shard: GroupShard) -> HeartbeatResult:
            result = await shard.consumer_membership.heartbeat(hb, topics)
            if result.error != ErrorCode.none:
                shard.refused()
            return result

        try:
            result = await with_shard(self.coordinator, hb.group_id, operation) if hb.group_id else \
                HeartbeatResult(ErrorCode.invalid_request, "GroupId can't be empty")
        except CoordinatorError as exc:
            result = HeartbeatResult(exc.code, exc.message)
        return {
            "throttle_time": 0,
            "error_code": result.error,
            "error_message": result.message if result.error != ErrorCode.none else None,
            "member_id": result.member_id,
            "member_epoch": result.member_epoch,
            "heartbeat_interval": result.heartbeat_interval_ms,
            "assignment": None if result.assignment is None or result.error != ErrorCode.none
            else {"topic_partitions": partitions_out(result.assignment)},
        }

    async def describe(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        names = topic_names(ctx.services.image)

        def assignment(value: Partitions) -> dict[str, Any]:
            return {"topic_partitions": [
                {"topic_id": uuid.UUID(t), "topic_name": names.get(t, ""), "partitions": sorted(ps)}
                for t, ps in sorted(value.items())]}

        groups = []
        for group_id in request.group_ids:
            answer: dict[str, Any] = {"group_id": group_id, "group_state": "", "group_epoch": 0,
                                      "assignment_epoch": 0, "assignor_name": "", "members": [],
                                      "error_code": ErrorCode.none, "error_message": None,
                                      "authorized_operations": OPERATIONS_OMITTED}
            try:
                context, shard = await self.coordinator.shard_for(group_id)
                if not context.active:
                    raise CoordinatorError(ErrorCode.not_coordinator, "moved")
                group = shard.consumer_groups.get(group_id, at=shard.committed)  # a read: committed state only
                if group is None:
                    answer["error_code"] = ErrorCode.group_id_not_found
                    answer["error_message"] = f"Group {group_id} not found." \
                        if not shard.groups.contains(group_id, shard.committed) \
                        else f"Group {group_id} is not a consumer group."
                else:
                    answer.update(
                        group_state=group.state, group_epoch=group.group_epoch,
                        assignment_epoch=group.assignment_epoch,
                        assignor_name=shard.consumer_membership.assignor_name(group, shard.settings()),
                        members=[{
                            "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                            "member_epoch": m.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
                            "subscribed_topic_names": list(m.subscribed_topic_names),
                            "subscribed_topic_regex": m.subscribed_topic_regex,
                            "assignment": assignment(m.assigned),
                            "target_assignment": assignment(group.target.get(m.member_id, {})),
                        } for m in group.members.values()])
            except CoordinatorError as exc:
                answer["error_code"], answer["error_message"] = exc.code, exc.message
            groups.append(answer)
        return {"throttle_time": 0, "groups": groups}
