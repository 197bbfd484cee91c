"""ShareGroupHeartbeat on a shard: join, heartbeat, leave, session expiry (KIP-932).

As for consumer groups (:mod:`josef_coordinator_group.consumer_membership`),
every heartbeat works on a copy of the group that takes the group's place in
the shard's timeline map, and the records describing the change are written
before the answer; a refused heartbeat puts back the version it found.
Members generate their own member ids (ShareGroupHeartbeat v1); epoch 0
joins, -1 leaves, anything else must be the member's epoch (or the one
before it, whose answer the member may not have had).
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.metadata.records import GROUP_RESOURCE
from josef_coordinator_group.consumer_group import Partitions
from josef_coordinator_group.consumer_membership import Topics
from josef_coordinator_group.group import GroupError
from josef_coordinator_group.share_group import (
    LEAVE_EPOCH,
    SIMPLE,
    ShareGroup,
    ShareMember,
    current_record,
    group_epoch_record,
    member_record,
    member_tombstones,
    simple_assignment,
    state_partitions_record,
    target_records,
)

if TYPE_CHECKING:
    from josef_coordinator_group.shard import GroupShard

log = logging.getLogger(__name__)


@attrs.frozen
class ShareHeartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


@attrs.frozen
class ShareHeartbeatResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None


def session_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("share-session", group_id, member_id)


class ShareMembership:
    def __init__(self, shard: GroupShard) -> None:
        self.shard = shard

    async def heartbeat(self, request: ShareHeartbeat, topics: Topics) -> ShareHeartbeatResult:
        shard = self.shard
        settings = shard.settings()
        group_id = request.group_id
        existing = shard.share_groups.get(group_id)
        if existing is not None:
            shard.share_groups[group_id] = copy.deepcopy(existing)  # copy-on-write, as consumer groups
        classic = shard.groups.get(group_id)
        try:
            self._validate(request)
            if request.member_epoch == LEAVE_EPOCH:
                result, records = self._leave(request)
            else:
                result, records = self._heartbeat(request, topics, settings)
        except GroupError as exc:
            self._restore(group_id, existing, classic)
            return ShareHeartbeatResult(exc.code, str(exc), request.member_id or None, request.member_epoch)
        except BaseException:
            self._restore(group_id, existing, classic)
            raise
        try:
            await shard.write(records)
        except CoordinatorError as exc:
            return ShareHeartbeatResult(exc.code, exc.message, request.member_id or None, request.member_epoch)
        group = shard.share_groups.get(group_id)
        if result.member_epoch >= 0 and group is not None and result.member_id in group.members:
            self.schedule_session(group, result.member_id or "")
        else:
            shard.cancel(session_key(group_id, result.member_id or ""))
        return result

    def _restore(self, group_id: str, existing: ShareGroup | None, classic: Any) -> None:
        if existing is None:
            self.shard.share_groups.pop(group_id, None)
        else:
            self.shard.share_groups[group_id] = existing
        if classic is not None and group_id not in self.shard.groups:
            self.shard.groups[group_id] = classic

    @staticmethod
    def _validate(request: ShareHeartbeat) -> None:
        if not request.group_id:
            raise GroupError(ErrorCode.invalid_request, "GroupId can't be empty")
        if not request.member_id:
            raise GroupError(ErrorCode.invalid_request, "MemberId can't be empty")
        if request.member_epoch == 0:
            if not request.subscribed_topic_names:
                raise GroupError(ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request")
        elif request.member_epoch < LEAVE_EPOCH:
            raise GroupError(ErrorCode.invalid_request, f"MemberEpoch {request.member_epoch} is invalid")

    def _group(self, group_id: str, create: bool) -> ShareGroup:
        shard = self.shard
        group = shard.share_groups.get(group_id)
        if group is not None:
            return group
        classic = shard.groups.get(group_id)
        if shard.consumer_groups.get(group_id) is not None or (
                classic is not None and not (classic.is_empty and not classic.pending_members)):
            raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        if not create:
            raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        if classic is not None:
            shard.groups.pop(group_id, None)  # an empty simple group (offsets only) becomes the share group
        group = shard.share_groups[group_id] = ShareGroup(group_id)
        return group

    def _heartbeat(self, request: ShareHeartbeat, topics: Topics,
                   settings: Any) -> tuple[ShareHeartbeatResult, list[tuple[bytes, bytes | None]]]:
        group = self._group(request.group_id, create=request.member_epoch == 0)
        records: list[tuple[bytes, bytes | None]] = []
        member = group.members.get(request.member_id)
        joined = False
        if request.member_epoch == 0:
            if member is None:
                if len(group.members) >= settings.share_max_size:
                    raise GroupError(ErrorCode.group_max_size_reached,
                                     f"The share group has reached its maximum capacity of {settings.share_max_size} "
                                     "members.")
                member = group.members[request.member_id] = ShareMember(request.member_id)
                joined = True
            else:  # joining again (after being fenced, or a lost answer): from scratch
                member.member_epoch, member.assigned = 0, {}
        else:
            if member is None:
                raise GroupError(ErrorCode.unknown_member_id,
                                 f"Member {request.member_id} is not a member of group {request.group_id}.")
            if request.member_epoch not in (member.member_epoch, member.previous_member_epoch) or \
                    request.member_epoch > member.member_epoch:
                raise GroupError(ErrorCode.fenced_member_epoch,
                                 f"The share group member has epoch {request.member_epoch}, the group coordinator "
                                 f"{member.member_epoch}.")
        changed = joined
        metadata_changed = joined
        if request.subscribed_topic_names is not None and \
                tuple(request.subscribed_topic_names) != member.subscribed_topic_names:
            member.subscribed_topic_names = tuple(request.subscribed_topic_names)
            changed = metadata_changed = True
        if request.rack_id is not None and request.rack_id != member.rack_id:
            member.rack_id = request.rack_id
            metadata_changed = True
        if request.member_epoch == 0 and (member.client_id, member.client_host) != (request.client_id,
                                                                                    request.client_host):
            member.client_id, member.client_host = request.client_id, request.client_host
            metadata_changed = True
        if metadata_changed:
            records.append(member_record(group, member))
        metadata = {topics[name][0]: topics[name][1] for name in group.subscribed_topics(topics)}
        if group.subscribed_metadata != metadata:
            changed = changed or group.subscribed_metadata is not None
            group.subscribed_metadata = metadata
        if changed:
            group.group_epoch += 1
            records.append(group_epoch_record(group))
        if group.group_epoch > group.assignment_epoch:
            previous = dict(group.target)
            self.compute_target(group, topics)
            records += target_records(group, previous)
            names = {t[0]: name for name, t in topics.items()}
            assigned: dict[str, set[int]] = {}
            for parts in group.target.values():
                for topic_id, partitions in parts.items():
                    assigned.setdefault(topic_id, set()).update(partitions)
            if group.initialize({t: (names.get(t, ""), frozenset(ps)) for t, ps in assigned.items()}):
                records.append(state_partitions_record(group))
        moved = group.take_target(member)
        if moved or joined:
            records.append(current_record(group, member))
        return ShareHeartbeatResult(
            member_id=member.member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.group_setting(group.group_id, "share.heartbeat.interval.ms",
                                                     settings.share_heartbeat_interval_ms),
            assignment=dict(member.assigned) if moved or request.member_epoch == 0 else None), records

    async def create(self, group_id: str) -> None:
        """An empty share group of a new id (AlterShareGroupOffsets before any member joined)."""
        group = self.shard.share_groups[group_id] = ShareGroup(group_id)
        await self.shard.write([group_epoch_record(group)])

    async def set_initialized(self, group_id: str, add: dict[str, tuple[str, frozenset[int]]],
                              remove: set[str] = frozenset()) -> None:
        """Record topics the group now has share-partition state for (``add``) or no longer has (``remove``)."""
        current = self.shard.share_groups.get(group_id)
        if current is None:
            return
        group = self.shard.share_groups[group_id] = copy.deepcopy(current)
        changed = group.initialize(add)
        for topic_id in remove:
            changed = group.initialized.pop(topic_id, None) is not None or changed
        if changed:
            await self.shard.write([state_partitions_record(group)])

    def compute_target(self, group: ShareGroup, topics: Topics) -> None:
        ids = {name: t[0] for name, t in topics.items()}
        subscriptions = {mid: frozenset(ids[n] for n in m.subscribed_topic_names if n in ids)
                         for mid, m in group.members.items()}
        wanted = set().union(*subscriptions.values()) if subscriptions else set()
        counts = {t[0]: t[1] for t in topics.values() if t[0] in wanted}
        group.target = simple_assignment(subscriptions, counts)
        group.assignment_epoch = group.group_epoch

    def assignor_name(self) -> str:
        return self.shard.settings().share_assignors[0] if self.shard.settings().share_assignors else SIMPLE

    # Leaving and expiry -------------------------------------------------------------------------

    def _leave(self, request: ShareHeartbeat) -> tuple[ShareHeartbeatResult, list[tuple[bytes, bytes | None]]]:
        group = self._group(request.group_id, create=False)
        if request.member_id not in group.members:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"Member {request.member_id} is not a member of group {request.group_id}.")
        return (ShareHeartbeatResult(member_id=request.member_id, member_epoch=LEAVE_EPOCH),
                self.remove_member(group, request.member_id))

    def remove_member(self, group: ShareGroup, member_id: str) -> list[tuple[bytes, bytes | None]]:
        """Drop a member and bump the group epoch (the others are assigned its partitions); the records."""
        group.members.pop(member_id, None)
        group.target.pop(member_id, None)
        group.group_epoch += 1
        return member_tombstones(group, member_id) + [group_epoch_record(group)]

    def schedule_session(self, group: ShareGroup, member_id: str) -> None:
        group_id = group.group_id

        async def expire() -> None:
            await self.expire_session(group_id, member_id)

        timeout = self.group_setting(group_id, "share.session.timeout.ms", self.shard.settings().share_session_timeout_ms)
        self.shard.schedule(session_key(group_id, member_id), timeout, expire)

    def group_setting(self, group_id: str, name: str, default: int) -> int:
        """A group config (GROUP config resource, KIP-932's share.* keys) of ``group_id``, else the broker's."""
        services = self.shard.context.services
        raw = services.image.config(GROUP_RESOURCE, group_id).get(name) if services is not None else None
        return int(raw) if raw is not None else default

    async def expire_session(self, group_id: str, member_id: str) -> None:
        current = self.shard.share_groups.get(group_id)
        if current is None or member_id not in current.members:
            return
        group = self.shard.share_groups[group_id] = copy.deepcopy(current)
        try:
            await self.shard.write(self.remove_member(group, member_id))
            log.info("share group %s: member %s expired", group_id, member_id)
        except CoordinatorError as exc:
            log.warning("share group %s: could not remove expired member %s: %s", group_id, member_id, exc)
            restored = self.shard.share_groups.get(group_id)
            if restored is not None and member_id in restored.members:
                self.schedule_session(restored, member_id)
