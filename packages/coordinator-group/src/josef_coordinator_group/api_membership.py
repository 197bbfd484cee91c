"""JoinGroup (v0-v9), SyncGroup (v0-v5), Heartbeat (v0-v4), LeaveGroup (v0-v5): requests in, responses out.

The handlers only translate between wire versions and
:mod:`josef_coordinator_group.membership`. JoinGroup and SyncGroup may wait
for other members (the join phase, the leader's assignment): the shard lock
is released while they wait, only the request's own connection is held,
exactly as a Kafka broker mutes a connection with a parked request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import client_host, ms, with_shard
from josef_coordinator_group.group import JoinResult, SyncResult, Waiter, join_members
from josef_coordinator_group.membership import JoinRequest, LeavingMember, SyncRequest

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard


def _join_response(result: JoinResult, version: int) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        # Not nullable before v7: Kafka sends "" for "no protocol".
        "protocol_name": result.protocol_name if version >= 7 else (result.protocol_name or ""),
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": join_members(result.members),
    }


def _sync_response(result: SyncResult) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": result.error, "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name, "assignment": result.assignment}


class MembershipApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def join_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        session_timeout = ms(request.session_timeout)
        join = JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            session_timeout_ms=session_timeout,
            # v0 has no rebalance timeout: the session timeout bounds the rebalance.
            rebalance_timeout_ms=ms(request.rebalance_timeout) if version >= 1 else session_timeout,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            client_id=ctx.client_id or "",
            client_host=client_host(ctx),
            api_version=version,
            reason=getattr(request, "reason", None),
        )
        if not join.group_id:
            return _join_response(JoinResult.failed(ErrorCode.invalid_group_id, join.member_id), version)

        async def operation(shard: GroupShard) -> Waiter[JoinResult]:
            if join.group_id in shard.consumer_groups or join.group_id in shard.share_groups:
                # A KIP-848 consumer group or a share group: classic members can't join it.
                raise CoordinatorError(ErrorCode.inconsistent_group_protocol,
                                       f"group {join.group_id} is not a classic group")
            return await shard.membership.join(join)

        try:
            waiter = await with_shard(self.coordinator, join.group_id, operation, settled=False)
            result = await waiter.wait()
        except CoordinatorError as exc:
            result = JoinResult.failed(exc.code, join.member_id)
        return _join_response(result, version)

    async def sync_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        sync = SyncRequest(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
        )
        if not sync.group_id:
            return _sync_response(SyncResult(ErrorCode.invalid_group_id))

        async def operation(shard: GroupShard) -> Waiter[SyncResult]:
            return await shard.membership.sync(sync)

        try:
            waiter = await with_shard(self.coordinator, sync.group_id, operation, settled=False)
            result = await waiter.wait()
        except CoordinatorError as exc:
            result = SyncResult(exc.code)
        return _sync_response(result)

    async def heartbeat(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        group_id = request.group_id
        if not group_id:
            return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id}
        instance_id = getattr(request, "group_instance_id", None)

        async def operation(shard: GroupShard) -> ErrorCode:
            error = shard.membership.heartbeat(group_id, request.member_id, instance_id, request.generation_id)
            if error not in (ErrorCode.none, ErrorCode.rebalance_in_progress):
                shard.refused()
            return error

        try:
            error = await with_shard(self.coordinator, group_id, operation)
        except CoordinatorError as exc:
            # Kafka answers heartbeats blindly while the group's partition loads: the member is
            # told about any rebalance by the next one.
            error = ErrorCode.none if exc.code == ErrorCode.coordinator_load_in_progress else exc.code
        return {"throttle_time": 0, "error_code": error}

    async def leave_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        if version >= 3:
            leaving = [LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                       for m in request.members]
        else:
            leaving = [LeavingMember(request.member_id, None)]
        group_id = request.group_id

        async def operation(shard: GroupShard) -> tuple[ErrorCode, list[ErrorCode]]:
            return await shard.membership.leave(group_id, leaving)

        if not group_id:
            error, errors = ErrorCode.invalid_group_id, [ErrorCode.invalid_group_id] * len(leaving)
        else:
            try:
                error, errors = await with_shard(self.coordinator, group_id, operation)
            except CoordinatorError as exc:
                error, errors = exc.code, [exc.code] * len(leaving)
        if version < 3:
            # One member per request: its outcome is the response's error.
            return {"throttle_time": 0, "error_code": error if error != ErrorCode.none else errors[0]}
        members = [] if error != ErrorCode.none else [
            {"member_id": who.member_id, "group_instance_id": who.group_instance_id, "error_code": code}
            for who, code in zip(leaving, errors)]
        return {"throttle_time": 0, "error_code": error, "members": members}
