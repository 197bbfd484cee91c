"""ConsumerGroupHeartbeat on a shard: join, reconcile, leave, session expiry (KIP-848).

Every heartbeat works on a copy of the group (copy-on-write): the copy takes
the group's place in the shard's timeline map, is changed, and the records
describing the change are appended. The version the map held before stays as
it was, which is what reads at the committed offset see and what a failed
append rolls the map back to. A heartbeat refused before it writes puts the
version it found back itself.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef_coordinator_group.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    ConsumerMember,
    Partitions,
    _norm,
    current_record,
    group_epoch_record,
    member_record,
    member_tombstones,
    new_member_id,
    target_records,
)
from josef_coordinator_group.group import GroupError
from josef_coordinator_group.server_assignors import MemberSpec

if TYPE_CHECKING:
    from josef_coordinator_group.shard import GroupShard

log = logging.getLogger(__name__)

#: {topic name: (topic id, partition count)} of the cluster's topics.
Topics = Mapping[str, tuple[str, int]]


@attrs.frozen
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@attrs.frozen
class HeartbeatResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None


def session_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("consumer-session", group_id, member_id)


def revocation_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("consumer-revocation", group_id, member_id)


class ConsumerMembership:
    def __init__(self, shard: GroupShard) -> None:
        self.shard = shard

    # Heartbeat -----------------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest, topics: Topics) -> HeartbeatResult:
        shard = self.shard
        settings = shard.settings()
        try:
            self._validate(request, settings)
        except GroupError as exc:
            return HeartbeatResult(exc.code, str(exc), request.member_id or None, request.member_epoch)
        group_id = request.group_id
        existing = shard.consumer_groups.get(group_id)
        classic = shard.groups.get(group_id)
        if existing is not None:
            # Copy-on-write: the version the snapshots hold stays as it was (committed reads, rollback).
            shard.consumer_groups[group_id] = copy.deepcopy(existing)
        try:
            if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                result, records = self._leave(request)
            else:
                result, records = self._heartbeat(request, topics, settings)
        except GroupError as exc:
            self._restore(group_id, existing, classic)
            return HeartbeatResult(exc.code, str(exc), request.member_id or None, request.member_epoch)
        except BaseException:
            self._restore(group_id, existing, classic)
            raise
        try:
            # A failed append rolls the group back with the batch; a timeout leaves it as written (it may commit).
            await shard.write(records)
        except CoordinatorError as exc:
            return HeartbeatResult(exc.code, exc.message, request.member_id or None, request.member_epoch)
        group = shard.consumer_groups.get(group_id)
        if result.member_epoch >= 0 or result.member_epoch == STATIC_LEAVE_EPOCH:
            if group is not None and result.member_id in group.members:
                self.schedule_session(group, result.member_id)
                self.schedule_revocation(group, group.members[result.member_id])
        else:
            shard.cancel(session_key(group_id, result.member_id or ""))
            shard.cancel(revocation_key(group_id, result.member_id or ""))
        return result

    def _restore(self, group_id: str, existing: ConsumerGroup | None, classic: Any) -> None:
        """A heartbeat refused: the groups are the versions it found (none, or the classic one it replaced)."""
        if existing is None:
            self.shard.consumer_groups.pop(group_id, None)
        else:
            self.shard.consumer_groups[group_id] = existing
        if classic is not None and group_id not in self.shard.groups:
            self.shard.groups[group_id] = classic

    def _validate(self, request: HeartbeatRequest, settings: Any) -> None:
        if not request.group_id:
            raise GroupError(ErrorCode.invalid_request, "GroupId can't be empty")
        if request.instance_id is not None and not request.instance_id:
            raise GroupError(ErrorCode.invalid_request, "InstanceId can't be empty")
        if request.member_epoch > 0 or request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            if not request.member_id:
                raise GroupError(ErrorCode.invalid_request, "MemberId can't be empty")
        elif request.member_epoch == 0:
            if request.rebalance_timeout_ms == -1:
                raise GroupError(ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request")
            if request.owned:
                raise GroupError(ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining")
            if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
                raise GroupError(ErrorCode.invalid_request,
                                 "SubscribedTopicNames or SubscribedTopicRegex must be set in first request")
        else:
            raise GroupError(ErrorCode.invalid_request, f"MemberEpoch {request.member_epoch} is invalid")
        if request.member_epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
            raise GroupError(ErrorCode.invalid_request, "InstanceId can't be null when MemberEpoch is -2")
        if request.server_assignor is not None and request.server_assignor not in settings.consumer_assignors:
            raise GroupError(ErrorCode.unsupported_assignor, f"ServerAssignor {request.server_assignor} is not supported")

    def _group(self, group_id: str, create: bool) -> ConsumerGroup:
        shard = self.shard
        group = shard.consumer_groups.get(group_id)
        if group is not None:
            return group
        classic = shard.groups.get(group_id)
        if shard.share_groups.get(group_id) is not None or (
                classic is not None and not (classic.is_empty and not classic.pending_members)):
            raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group")
        if not create:
            raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} not found")
        if classic is not None:
            # An empty classic (or simple) group becomes a consumer group; its offsets stay.
            shard.groups.pop(group_id, None)
        group = ConsumerGroup(group_id)
        shard.consumer_groups[group_id] = group
        return group

    def _heartbeat(self, request: HeartbeatRequest, topics: Topics,
                   settings: Any) -> tuple[HeartbeatResult, list[tuple[bytes, bytes | None]]]:
        group = self._group(request.group_id, create=request.member_epoch == 0)
        records: list[tuple[bytes, bytes | None]] = []
        member_id = request.member_id or new_member_id()
        member = group.members.get(member_id)
        full = request.member_epoch == 0 or request.owned is not None
        joined = False
        if request.member_epoch == 0:
            if request.instance_id is not None:
                previous = group.member_by_instance(request.instance_id)
                if previous is not None and previous.member_id != member_id:
                    if previous.member_epoch != STATIC_LEAVE_EPOCH:
                        raise GroupError(ErrorCode.unreleased_instance_id,
                                         f"Static member {request.instance_id} has not left the group")
                    # The static member comes back under a new member id: it takes over its partitions.
                    member = attrs.evolve(previous, member_id=member_id)
                    member.member_epoch = previous.previous_member_epoch if previous.previous_member_epoch > 0 else 0
                    del group.members[previous.member_id]
                    self.shard.cancel(session_key(group.group_id, previous.member_id))
                    records += member_tombstones(group, previous.member_id)
                    if previous.member_id in group.target:
                        group.target[member_id] = group.target.pop(previous.member_id)
                    group.members[member_id] = member
                    records.append(member_record(group, member))
            if member is None:
                if len(group.members) >= settings.consumer_max_size:
                    raise GroupError(ErrorCode.group_max_size_reached, f"Group {group.group_id} is full")
                member = ConsumerMember(member_id)
                group.members[member_id] = member
                joined = True
            elif member.member_epoch not in (0, STATIC_LEAVE_EPOCH) and not request.instance_id:
                # A dynamic member rejoining (after being fenced): it has given up all its partitions.
                member.assigned, member.pending_revocation = {}, {}
                member.member_epoch, member.state = 0, 0
        else:
            if member is None:
                raise GroupError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of the group")
            self._check_epoch(member, request)
        # Subscription and client information.
        changed = joined
        updates = {
            "instance_id": request.instance_id,
            "rack_id": request.rack_id,
            "subscribed_topic_names": tuple(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None else None,
            "subscribed_topic_regex": request.subscribed_topic_regex,
            "server_assignor": request.server_assignor,
        }
        metadata_changed = joined
        for name, value in updates.items():
            if value is not None and getattr(member, name) != value:
                setattr(member, name, value)
                metadata_changed = True
                if name in ("subscribed_topic_names", "subscribed_topic_regex", "server_assignor"):
                    changed = True
        if request.subscribed_topic_regex == "" and member.subscribed_topic_regex:
            member.subscribed_topic_regex = None
            metadata_changed = changed = True
        if request.rebalance_timeout_ms != -1 and member.rebalance_timeout_ms != request.rebalance_timeout_ms:
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
            metadata_changed = True
        if joined or member.client_id != request.client_id or member.client_host != request.client_host:
            if request.member_epoch == 0:
                member.client_id, member.client_host = request.client_id, request.client_host
                metadata_changed = True
        if metadata_changed:
            records.append(member_record(group, member))
        # The subscribed topics' metadata (a new topic matching a regex, more partitions...).
        metadata = self.subscribed_metadata(group, topics)
        if group.subscribed_metadata != metadata:
            if group.subscribed_metadata is not None:
                changed = True
            group.subscribed_metadata = metadata
        if changed:
            group.group_epoch += 1
            records.append(group_epoch_record(group))
        if group.group_epoch > group.assignment_epoch:
            previous_target = dict(group.target)
            self.compute_target(group, topics, settings)
            records += target_records(group, previous_target)
        before = member.assignment_value()
        reconciled = group.reconcile(member, request.owned)
        if reconciled or joined or before != member.assignment_value():
            records.append(current_record(group, member))
        send = full or reconciled or joined
        if request.owned is not None and _norm(request.owned) == member.assigned and not reconciled and not joined \
                and request.member_epoch != 0:
            send = False
        return HeartbeatResult(
            member_id=member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=settings.consumer_heartbeat_interval_ms,
            assignment=dict(member.assigned) if send else None,
        ), records

    def _check_epoch(self, member: ConsumerMember, request: HeartbeatRequest) -> None:
        received = request.member_epoch
        if received > member.member_epoch:
            raise GroupError(ErrorCode.fenced_member_epoch,
                             f"The consumer group member has a greater member epoch ({received}) than the one known "
                             f"by the group coordinator ({member.member_epoch}).")
        if received < member.member_epoch:
            owned = _norm(request.owned) if request.owned is not None else None
            if received != member.previous_member_epoch or owned is None or any(
                    not parts <= member.assigned.get(t, frozenset()) for t, parts in owned.items()):
                raise GroupError(ErrorCode.fenced_member_epoch,
                                 f"The consumer group member has a smaller member epoch ({received}) than the one "
                                 f"known by the group coordinator ({member.member_epoch}).")

    # Assignment ------------------------------------------------------------------------------

    def subscribed_metadata(self, group: ConsumerGroup, topics: Topics) -> dict[str, int]:
        return {topics[name][0]: topics[name][1] for name in group.subscribed_topics(topics)}

    def assignor_name(self, group: ConsumerGroup, settings: Any) -> str:
        wanted = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
        if wanted:
            return wanted.most_common(1)[0][0]
        return settings.consumer_assignors[0] if settings.consumer_assignors else "uniform"

    def compute_target(self, group: ConsumerGroup, topics: Topics, settings: Any) -> None:
        name = self.assignor_name(group, settings)
        assignor = self.shard.server_assignors().get(name)
        if assignor is None:
            raise GroupError(ErrorCode.unsupported_assignor, f"ServerAssignor {name} is not installed")
        ids = {n: t[0] for n, t in topics.items()}
        counts = {t[0]: t[1] for t in topics.values()}
        specs = {mid: MemberSpec(group.member_topics(m, ids), m.instance_id, group.target.get(mid, {}))
                 for mid, m in group.members.items()}
        wanted = set().union(*(s.topics for s in specs.values())) if specs else set()
        result = assignor.assign(specs, {t: counts[t] for t in wanted if t in counts})
        group.target = {mid: _norm(result.get(mid, {})) for mid in group.members}
        group.assignment_epoch = group.group_epoch

    # Leaving and expiry -------------------------------------------------------------------------

    def _leave(self, request: HeartbeatRequest) -> tuple[HeartbeatResult, list[tuple[bytes, bytes | None]]]:
        group = self._group(request.group_id, create=False)
        member = group.members.get(request.member_id)
        if member is None and request.instance_id is not None:
            member = group.member_by_instance(request.instance_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id, f"Member {request.member_id} is not a member of the group")
        if request.member_epoch == STATIC_LEAVE_EPOCH:
            # A static member leaves temporarily: it keeps its partitions until its session expires.
            if member.member_epoch != STATIC_LEAVE_EPOCH:
                member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH
            return (HeartbeatResult(member_id=member.member_id, member_epoch=STATIC_LEAVE_EPOCH),
                    [current_record(group, member)])
        return (HeartbeatResult(member_id=member.member_id, member_epoch=LEAVE_EPOCH),
                self.remove_member(group, member.member_id))

    def remove_member(self, group: ConsumerGroup, member_id: str) -> list[tuple[bytes, bytes | None]]:
        """Drop a member (its partitions become free) and bump the group epoch; the records to write."""
        group.members.pop(member_id, None)
        group.target.pop(member_id, None)
        group.group_epoch += 1
        return member_tombstones(group, member_id) + [group_epoch_record(group)]

    def schedule_session(self, group: ConsumerGroup, member_id: str) -> None:
        group_id = group.group_id
        timeout = self.shard.settings().consumer_session_timeout_ms

        async def expire() -> None:
            await self.expire_session(group_id, member_id)

        self.shard.schedule(session_key(group_id, member_id), timeout, expire)

    def schedule_revocation(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """A member asked to revoke partitions must do so within its rebalance timeout, or it is removed."""
        key = revocation_key(group.group_id, member.member_id)
        if member.state != UNREVOKED_PARTITIONS:
            if key in self.shard._timer_tokens:
                self.shard.cancel(key)
            return
        if key in self.shard._timer_tokens:
            return  # the clock started when the revocation was first asked for
        group_id, member_id = group.group_id, member.member_id
        timeout = member.rebalance_timeout_ms if member.rebalance_timeout_ms > 0 else \
            self.shard.settings().consumer_session_timeout_ms

        async def expire() -> None:
            current = self.shard.consumer_groups.get(group_id)
            still = current.members.get(member_id) if current is not None else None
            if still is not None and still.state == UNREVOKED_PARTITIONS:
                log.info("consumer group %s: member %s did not revoke in time", group_id, member_id)
                self.shard.cancel(session_key(group_id, member_id))
                await self.expire_session(group_id, member_id)

        self.shard.schedule(key, timeout, expire)

    async def expire_session(self, group_id: str, member_id: str) -> None:
        current = self.shard.consumer_groups.get(group_id)
        if current is None or member_id not in current.members:
            return
        group = self.shard.consumer_groups[group_id] = copy.deepcopy(current)
        records = self.remove_member(group, member_id)
        try:
            await self.shard.write(records)
            log.info("consumer group %s: member %s expired", group_id, member_id)
        except CoordinatorError as exc:
            log.warning("consumer group %s: could not remove expired member %s: %s", group_id, member_id, exc)
            restored = self.shard.consumer_groups.get(group_id)
            if restored is not None and member_id in restored.members:  # rolled back: try again later
                self.schedule_session(restored, member_id)

    # Offsets -----------------------------------------------------------------------------------

    def validate_offset_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int,
                               transactional: bool = False, instance_id: str | None = None) -> None:
        """Consumer-group members commit with their member id and member epoch (-1 without: admin commits).

        A transactional commit without member fields (TxnOffsetCommit before
        v3, or a producer given no group metadata) is accepted, as in Kafka.
        """
        if member_epoch < 0 and not member_id:
            if group.members and not (transactional and instance_id is None):
                raise GroupError(ErrorCode.unknown_member_id, "the group has members")
            return
        member = group.members.get(member_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of the group")
        if member_epoch != member.member_epoch and member_epoch != member.previous_member_epoch:
            raise GroupError(ErrorCode.stale_member_epoch if member_epoch < member.member_epoch
                             else ErrorCode.fenced_member_epoch, "stale member epoch")

    def validate_offset_fetch(self, group: ConsumerGroup, member_id: str | None, member_epoch: int) -> None:
        if member_id is None or member_epoch < 0:
            return
        member = group.members.get(member_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of the group")
        if member_epoch > member.member_epoch:
            raise GroupError(ErrorCode.stale_member_epoch, "stale member epoch")
