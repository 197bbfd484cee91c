"""ShareGroupHeartbeat (API 76, v1) and ShareGroupDescribe (API 77, v1): KIP-932 share groups' membership.

Share groups are on while ``share.version`` is finalized at 1 or more (a new
cluster's level); at 0 both APIs answer UNSUPPORTED_VERSION, as Kafka does
with share groups disabled.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.protocol.messages import OPERATIONS_OMITTED
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import client_host, with_shard
from josef_coordinator_group.api_consumer import cluster_topics, partitions_out, topic_names
from josef_coordinator_group.share_membership import ShareHeartbeat, ShareHeartbeatResult

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

SHARE_VERSION = "share.version"


def _enabled(ctx: RequestContext) -> bool:
    return ctx.services.image.features.get(SHARE_VERSION, 0) >= 1


class ShareGroupApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def heartbeat(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        hb = ShareHeartbeat(
            group_id=request.group_id, member_id=request.member_id, member_epoch=request.member_epoch,
            rack_id=request.rack_id,
            subscribed_topic_names=tuple(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None else None,
            client_id=ctx.client_id or "", client_host=client_host(ctx))
        topics = cluster_topics(ctx.services.image)

        async def operation(shard: GroupShard) -> ShareHeartbeatResult:
            result = await shard.share_membership.heartbeat(hb, topics)
            if result.error != ErrorCode.none:
                shard.refused()
            return result

        if not _enabled(ctx):
            result = ShareHeartbeatResult(ErrorCode.unsupported_version, "Share groups are not enabled.")
        elif not hb.group_id:
            result = ShareHeartbeatResult(ErrorCode.invalid_request, "GroupId can't be empty")
        else:
            try:
                result = await with_shard(self.coordinator, hb.group_id, operation)
            except CoordinatorError as exc:
                result = ShareHeartbeatResult(exc.code, exc.message)
        ok = result.error == ErrorCode.none
        return {
            "throttle_time": 0, "error_code": result.error, "error_message": None if ok else result.message,
            "member_id": result.member_id, "member_epoch": result.member_epoch,
            "heartbeat_interval": result.heartbeat_interval_ms,
            "assignment": {"topic_partitions": partitions_out(result.assignment)}
            if ok and result.assignment is not None else None,
        }

    async def describe(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        names = topic_names(ctx.services.image)
        groups = []
        for group_id in request.group_ids:
            answer: dict[str, Any] = {"group_id": group_id, "group_state": "", "group_epoch": 0,
                                      "assignment_epoch": 0, "assignor_name": "", "members": [],
                                      "error_code": ErrorCode.none, "error_message": None,
                                      "authorized_operations": OPERATIONS_OMITTED}
            try:
                if not _enabled(ctx):
                    raise CoordinatorError(ErrorCode.unsupported_version, "Share groups are not enabled.")
                context, shard = await self.coordinator.shard_for(group_id)
                if not context.active:
                    raise CoordinatorError(ErrorCode.not_coordinator, "moved")
                group = shard.share_groups.get(group_id, at=shard.committed)
                if group is None:
                    other = shard.groups.contains(group_id, shard.committed) or \
                        shard.consumer_groups.contains(group_id, shard.committed)
                    answer.update(error_code=ErrorCode.group_id_not_found,
                                  error_message=f"Group {group_id} is not a share group." if other
                                  else f"Group {group_id} not found.")
                else:
                    answer.update(
                        group_state=group.state, group_epoch=group.group_epoch,
                        assignment_epoch=group.assignment_epoch,
                        assignor_name=shard.share_membership.assignor_name(),
                        members=[{
                            "member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.member_epoch,
                            "client_id": m.client_id, "client_host": m.client_host,
                            "subscribed_topic_names": list(m.subscribed_topic_names),
                            "assignment": {"topic_partitions": [
                                {"topic_id": uuid.UUID(t), "topic_name": names.get(t, ""), "partitions": sorted(ps)}
                                for t, ps in sorted(m.assigned.items())]},
                        } for m in group.members.values()])
            except CoordinatorError as exc:
                answer["error_code"], answer["error_message"] = exc.code, exc.message
            groups.append(answer)
        return {"throttle_time": 0, "groups": groups}
