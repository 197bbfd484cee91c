"""ListGroups (v0-v5), DescribeGroups (v0-v6) and DeleteGroups (v0-v2): what operators and admin clients ask.

ListGroups and DescribeGroups are Kafka's read operations: they see the
groups that exist at the shard's committed offset, never one whose records
are not committed yet.

DescribeGroups describes classic groups only, as Kafka's GroupMetadataManager
does: a KIP-848 consumer group is "not a classic group" there (clients
describe those with ConsumerGroupDescribe; Kafka's admin client falls back
to DescribeGroups on GROUP_ID_NOT_FOUND, not the other way round). A group
that is missing (or of the other type) is answered as Dead with no error up
to v5, and from v6 on (KIP-1043) with GROUP_ID_NOT_FOUND and a message.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import CoordinatorError
from josef.protocol.consumer_protocol import PROTOCOL_TYPE
from josef.protocol.messages import OPERATIONS_OMITTED
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import with_shard
from josef_coordinator_group.group import GroupError, GroupState
from josef_coordinator_group.records import GroupKey, OffsetKey, encode_key

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

#: The group types ListGroups v5 reports: classic groups, KIP-848 consumer groups, KIP-932 share groups.
CLASSIC_GROUP_TYPE, CONSUMER_GROUP_TYPE, SHARE_GROUP_TYPE = "classic", "consumer", "share"
#: The protocol type ListGroups gives share groups, as Kafka does.
SHARE_PROTOCOL_TYPE = "share"


#: The first DescribeGroups version that reports a missing group as GROUP_ID_NOT_FOUND (KIP-1043).
DESCRIBE_NOT_FOUND_VERSION = 6


def _not_found(shard: GroupShard, group_id: str, version: int) -> dict[str, Any]:
    """A group this shard has no classic group for: Dead, and from v6 on GROUP_ID_NOT_FOUND with Kafka's message."""
    answer = {"error_code": ErrorCode.none, "error_message": None, "group_id": group_id,
              "group_state": GroupState.DEAD.value, "protocol_type": "", "protocol_data": "", "members": []}
    if version >= DESCRIBE_NOT_FOUND_VERSION:
        message = f"Group {group_id} is not a classic group." \
            if shard.consumer_groups.contains(group_id, shard.committed) \
            or shard.share_groups.contains(group_id, shard.committed) else f"Group {group_id} not found."
        answer.update(error_code=ErrorCode.group_id_not_found, error_message=message)
    return answer


def _describe(shard: GroupShard, group_id: str, version: int) -> dict[str, Any]:
    group = shard.groups.get(group_id, at=shard.committed)
    if group is None or group.state is GroupState.DEAD:
        return _not_found(shard, group_id, version)
    stable = group.state is GroupState.STABLE
    members = [{
        "member_id": m.member_id,
        "group_instance_id": m.group_instance_id,
        "client_id": m.client_id,
        "client_host": m.client_host,
        # Metadata and assignment are only meaningful for a generation that completed.
        "member_metadata": m.metadata(group.protocol_name) if stable else b"",
        "member_assignment": m.assignment if stable else b"",
    } for m in group.members.values()]
    return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": group.state.value,
            "protocol_type": group.protocol_type or "", "protocol_data": (group.protocol_name or "") if stable else "",
            "members": members}


class GroupAdminApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def list_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Groups of every partition this broker coordinates (clients ask each broker and merge)."""
        states = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
        types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
        groups = []
        if not types or CLASSIC_GROUP_TYPE in types:
            for shard in self.coordinator.shards():
                for group in shard.groups.values(shard.committed):
                    if group.state is GroupState.DEAD or (states and group.state.value.lower() not in states):
                        continue
                    groups.append({"group_id": group.group_id, "protocol_type": group.protocol_type or "",
                                   "group_state": group.state.value, "group_type": CLASSIC_GROUP_TYPE})
        if not types or CONSUMER_GROUP_TYPE in types:
            for shard in self.coordinator.shards():
                for consumer_group in shard.consumer_groups.values(shard.committed):
                    if states and consumer_group.state.lower() not in states:
                        continue
                    groups.append({"group_id": consumer_group.group_id, "protocol_type": PROTOCOL_TYPE,
                                   "group_state": consumer_group.state, "group_type": CONSUMER_GROUP_TYPE})
        if not types or SHARE_GROUP_TYPE in types:
            for shard in self.coordinator.shards():
                for share_group in shard.share_groups.values(shard.committed):
                    if states and share_group.state.lower() not in states:
                        continue
                    groups.append({"group_id": share_group.group_id, "protocol_type": SHARE_PROTOCOL_TYPE,
                                   "group_state": share_group.state, "group_type": SHARE_GROUP_TYPE})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": sorted(groups, key=lambda g: g["group_id"])}

    async def describe_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        described = []
        for group_id in request.groups:
            try:
                context, shard = await self.coordinator.shard_for(group_id)
                if not context.active:
                    raise CoordinatorError(ErrorCode.not_coordinator, "moved")
                answer = _describe(shard, group_id, ctx.api_version)
            except CoordinatorError as exc:
                answer = {"error_code": exc.code, "error_message": exc.message, "group_id": group_id,
                          "group_state": "", "protocol_type": "", "protocol_data": "", "members": []}
            # Filled in by the request pipeline's authorization stage when asked for.
            answer["authorized_operations"] = OPERATIONS_OMITTED
            described.append(answer)
        return {"throttle_time": 0, "groups": described}

    async def delete_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Delete empty groups and their offsets, pending ones too (tombstones); NON_EMPTY_GROUP with members."""

        async def delete(shard: GroupShard, *, group_id: str) -> None:
            consumer_group = shard.consumer_groups.get(group_id)
            if consumer_group is not None:
                await delete_consumer_group(shard, group_id)
                return
            if shard.share_groups.get(group_id) is not None:
                await delete_share_group(shard, group_id)
                return
            group = shard.groups.get(group_id)
            if group is None:
                raise GroupError(ErrorCode.group_id_not_found, f"group {group_id} does not exist")
            group.validate_delete()
            records: list[tuple[bytes, bytes | None]] = [
                (encode_key(OffsetKey(group_id, topic, partition)), None)
                for topic, partition in shard.offsets.all_partitions(group_id)]
            records.append((encode_key(GroupKey(group_id)), None))
            await shard.write(records)
            shard.membership.forget(group, clock.now_ms())

        results = []
        for group_id in request.groups_names:
            try:
                await self.coordinator.share_offsets.delete_state(ctx, group_id)  # a share group's, first
                await with_shard(self.coordinator, group_id, functools.partial(delete, group_id=group_id))
                error = ErrorCode.none
            except (CoordinatorError, GroupError) as exc:
                error = exc.code
            results.append({"group_id": group_id, "error_code": error})
        return {"throttle_time": 0, "results": results}


async def delete_consumer_group(shard: GroupShard, group_id: str) -> None:
    """An empty KIP-848 consumer group and its offsets: tombstones for each of their records."""
    from josef_coordinator_group import consumer_group

    await _delete_empty(shard, shard.consumer_groups, group_id, consumer_group.member_tombstones,
                        consumer_group.group_tombstones, offsets=True)


async def delete_share_group(shard: GroupShard, group_id: str) -> None:
    """An empty KIP-932 share group: tombstones for each of its records (its share-partition state stays in
    ``__share_group_state``, where the share coordinator keeps it)."""
    from josef_coordinator_group import share_group

    await _delete_empty(shard, shard.share_groups, group_id, share_group.member_tombstones,
                        share_group.group_tombstones, offsets=False)


async def _delete_empty(shard: GroupShard, groups: Any, group_id: str, member_tombstones: Any,
                        group_tombstones: Any, *, offsets: bool) -> None:
    group = groups[group_id]
    if group.members:
        raise GroupError(ErrorCode.non_empty_group, f"group {group_id} has members")
    records: list[tuple[bytes, bytes | None]] = [
        (encode_key(OffsetKey(group_id, topic, partition)), None)
        for topic, partition in shard.offsets.all_partitions(group_id)] if offsets else []
    for member_id in list(group.target):
        records += member_tombstones(group, member_id)
    records += group_tombstones(group_id)
    groups.pop(group_id)  # with the records: a failed append puts it back
    await shard.write(records)
