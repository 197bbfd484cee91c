"""The classic group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and the timers between them.

This follows Kafka's classic-group logic (``GroupMetadataManager`` in Kafka
4.x) step by step, because clients depend on its exact behaviour: when a
JoinGroup is answered, which member leads, which errors make a client rejoin
and which make it start over. Every method runs with the shard lock held, which
a write releases while it waits for replication: after a write the group is
looked at again, as Kafka's append-future callbacks do.

A rebalance, in short:

1. A member joins (or leaves, or its session expires): the group goes to
   PreparingRebalance. Members learn it from their heartbeats
   (REBALANCE_IN_PROGRESS) and send JoinGroup again; those requests are
   parked.
2. When every member has rejoined, or the rebalance timeout (the largest of
   the members') passes, members that did not rejoin are dropped, the next
   generation starts with the protocol most members prefer, and every parked
   JoinGroup is answered; the leader gets the members' metadata. An empty
   group waits ``group.initial.rebalance.delay.ms`` first (extended while new
   members keep arriving), so a starting fleet joins one generation.
3. CompletingRebalance: the leader's SyncGroup brings the assignment, which is
   written to ``__consumer_offsets``, then handed to every member (followers'
   SyncGroups wait for it). The group is Stable. Members that do not sync
   within the rebalance timeout are removed and the group rebalances again.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import CoordinatorError
from josef_coordinator_group.group import (
    ClassicGroup,
    GroupError,
    GroupState,
    IllegalTransitionError,
    JoinResult,
    Member,
    Protocols,
    SyncResult,
    Waiter,
)
from josef_coordinator_group.records import GroupKey, GroupValue, encode_group, encode_key

if TYPE_CHECKING:
    from josef_coordinator_group.shard import GroupShard

log = logging.getLogger(__name__)

S = GroupState


@attrs.frozen
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    client_id: str
    client_host: str
    api_version: int
    reason: str | None = None


@attrs.frozen
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: dict[str, bytes]


@attrs.frozen
class LeavingMember:
    member_id: str
    group_instance_id: str | None
    reason: str | None = None


def _heartbeat_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("heartbeat", group_id, member_id)


def _join_key(group_id: str) -> tuple[str, str]:
    return ("join", group_id)


def _sync_key(group_id: str) -> tuple[str, str]:
    return ("sync", group_id)


def _protocol_inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


class Membership:
    """The classic protocol over the groups of one shard."""

    def __init__(self, shard: GroupShard) -> None:
        self.shard = shard

    @property
    def groups(self) -> dict[str, ClassicGroup]:
        return self.shard.groups

    def group_record(self, group: ClassicGroup, assignment: dict[str, bytes] | None = None) -> tuple[bytes, bytes]:
        return encode_key(GroupKey(group.group_id)), encode_group(group.to_value(assignment))

    # Timers -----------------------------------------------------------------------------

    def schedule_heartbeat(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        group_id = group.group_id
        self.shard.schedule(_heartbeat_key(group_id, member_id), timeout_ms,
                            lambda: self._expire_heartbeat(group_id, member_id))

    def cancel_heartbeat(self, group: ClassicGroup, member_id: str) -> None:
        self.shard.cancel(_heartbeat_key(group.group_id, member_id))

    def forget(self, group: ClassicGroup, now_ms: int) -> None:
        """The group is deleted: Dead, out of the shard, its timers stopped (unless a new group took its id meanwhile)."""
        group.transition_to(S.DEAD, now_ms)
        current = self.groups.get(group.group_id)
        if current is group:
            self.groups.pop(group.group_id)
        if current is None or current is group:
            self.cancel_timers(group)

    def cancel_timers(self, group: ClassicGroup) -> None:
        self.shard.cancel(_join_key(group.group_id))
        self.shard.cancel(_sync_key(group.group_id))
        for member_id in list(group.members) + list(group.pending_members):
            self.shard.cancel(_heartbeat_key(group.group_id, member_id))

    def _persist_new_group(self, group: ClassicGroup) -> None:
        """Write a new group's empty metadata, as Kafka does, so that the group exists in the committed state.

        Not waited for: the join is answered as usual. If the append fails,
        the group's creation is rolled back with it: the requests parked on it
        are answered with the error and its timers stopped.
        """
        value = GroupValue("", 0, None, None, group.state_timestamp_ms)

        def failed(error: CoordinatorError) -> None:
            if self.shard.active and self.groups.get(group.group_id) is not group:
                log.info("group %s: writing its creation failed (%s); it is gone", group.group_id, error.code.name)
                self.shard.abandon(group, error.code)
                self.cancel_timers(group)

        try:
            pending = self.shard.append([(encode_key(GroupKey(group.group_id)), encode_group(value))])
        except CoordinatorError as exc:
            failed(exc)
            return
        pending.add_done_callback(lambda done: failed(done.error) if done.error is not None else None)

    # JoinGroup --------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> Waiter[JoinResult]:
        """Handle a JoinGroup; the returned waiter completes when the request may be answered."""
        waiter: Waiter[JoinResult] = Waiter()
        settings = self.shard.settings()
        if not settings.min_session_timeout_ms <= request.session_timeout_ms <= settings.max_session_timeout_ms:
            waiter.complete(JoinResult.failed(ErrorCode.invalid_session_timeout, request.member_id))
            return waiter
        is_unknown = request.member_id == ""
        group = self.groups.get(request.group_id)
        created = False
        if group is None:
            if not is_unknown:
                waiter.complete(JoinResult.failed(ErrorCode.unknown_member_id, request.member_id))
                return waiter
            group = ClassicGroup(request.group_id, clock.now_ms())
            self.groups[request.group_id] = group
            created = True
        try:
            if not self._accept_joining_member(group, request.member_id, settings.max_size):
                if request.member_id:
                    # Kafka forgets a refused member (or pending member id) at once.
                    group.remove(request.member_id)
                    self.cancel_heartbeat(group, request.member_id)
                waiter.complete(JoinResult.failed(ErrorCode.group_max_size_reached))
            elif is_unknown:
                await self._join_new_member(group, request, waiter)
            else:
                await self._join_existing_member(group, request, waiter)
        finally:
            if created and self.groups.get(group.group_id) is group:
                if group.is_empty and not group.members and not group.pending_members \
                        and not self.shard.offsets.has_offsets(group.group_id):
                    # A join that failed before anything happened leaves no trace of the group.
                    del self.groups[group.group_id]
                elif self.shard.active:
                    self._persist_new_group(group)
        return waiter

    def _accept_joining_member(self, group: ClassicGroup, member_id: str, max_size: int) -> bool:
        if group.in_state(S.EMPTY, S.DEAD):
            return True
        if group.in_state(S.COMPLETING_REBALANCE, S.STABLE):
            return group.has_member(member_id) or len(group.members) < max_size
        member = group.members.get(member_id)
        return (member is not None and member.is_awaiting_join) or group.num_awaiting_join < max_size

    def _check_joinable(self, group: ClassicGroup, request: JoinRequest) -> ErrorCode | None:
        if group.state is S.DEAD:
            # The group was just deleted or is moving to another coordinator: find it again and retry.
            return ErrorCode.coordinator_not_available
        if not group.supports_protocols(request.protocol_type, request.protocols):
            return ErrorCode.inconsistent_group_protocol
        return None

    async def _join_new_member(self, group: ClassicGroup, request: JoinRequest, waiter: Waiter[JoinResult]) -> None:
        error = self._check_joinable(group, request)
        if error is not None:
            waiter.complete(JoinResult.failed(error, request.member_id))
            return
        prefix = request.group_instance_id if request.group_instance_id is not None else request.client_id
        new_member_id = f"{prefix}-{uuid.uuid4()}"
        if request.group_instance_id is not None:
            existing = group.static_member_id(request.group_instance_id)
            if existing is not None:
                await self._replace_static_member(group, request, existing, new_member_id, waiter)
            else:
                await self._add_member(group, request, new_member_id, waiter)
        elif request.api_version >= 4:
            # KIP-394: hand out the member id first, so a client that times out and retries does
            # not leave a defunct member behind; it must rejoin with the id within its session.
            group.pending_members.add(new_member_id)
            self.schedule_heartbeat(group, new_member_id, request.session_timeout_ms)
            waiter.complete(JoinResult.failed(ErrorCode.member_id_required, new_member_id))
        else:
            await self._add_member(group, request, new_member_id, waiter)

    async def _join_existing_member(self, group: ClassicGroup, request: JoinRequest,
                                    waiter: Waiter[JoinResult]) -> None:
        member_id = request.member_id
        error = self._check_joinable(group, request)
        if error is not None:
            waiter.complete(JoinResult.failed(error, member_id))
            return
        if group.is_pending(member_id):
            if request.group_instance_id is not None:
                waiter.complete(JoinResult.failed(ErrorCode.unknown_server_error, member_id))
                return
            await self._add_member(group, request, member_id, waiter)
            return
        try:
            group.validate_member(member_id, request.group_instance_id)
        except GroupError as exc:
            waiter.complete(JoinResult.failed(exc.code, member_id))
            return
        member = group.members[member_id]
        reason = f"member {member_id} rejoined ({request.reason or 'no reason given'})"
        if group.state is S.PREPARING_REBALANCE:
            await self._update_member(group, member, request, waiter, reason)
        elif group.state is S.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # The member lost its JoinGroup response: answer again with this generation.
                waiter.complete(self._join_result(group, member, with_members=group.is_leader(member_id)))
            else:
                await self._update_member(group, member, request, waiter, reason + " with new metadata")
        elif group.state is S.STABLE:
            if group.is_leader(member_id) or not member.matches(request.protocols):
                # The leader rejoins to have the assignment redone (new partitions, a subscription
                # change only it knows about); a follower rejoins when its metadata changed.
                await self._update_member(group, member, request, waiter, reason)
            else:
                waiter.complete(self._join_result(group, member, with_members=False))
        else:
            waiter.complete(JoinResult.failed(ErrorCode.unknown_member_id, member_id))

    def _join_result(self, group: ClassicGroup, member: Member, *, with_members: bool,
                     leader: str | None = None, skip_assignment: bool = False) -> JoinResult:
        return JoinResult(ErrorCode.none, member.member_id, group.generation_id, group.protocol_type,
                          group.protocol_name, leader if leader is not None else (group.leader_id or ""),
                          skip_assignment, group.current_members() if with_members else ())

    async def _add_member(self, group: ClassicGroup, request: JoinRequest, member_id: str,
                          waiter: Waiter[JoinResult]) -> None:
        member = Member(member_id, request.group_instance_id, request.client_id, request.client_host,
                        request.rebalance_timeout_ms, request.session_timeout_ms, request.protocol_type,
                        request.protocols, is_new=True)
        if group.state is S.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, waiter)
        # A new member has no member id to heartbeat with while its JoinGroup is parked, and a
        # client that gave up will retry with a fresh JoinGroup: expire it after a long while.
        self.schedule_heartbeat(group, member_id, self.shard.settings().new_member_join_timeout_ms)
        await self._maybe_prepare_rebalance_or_complete_join(group, f"new member {member_id} joined")

    async def _update_member(self, group: ClassicGroup, member: Member, request: JoinRequest,
                             waiter: Waiter[JoinResult], reason: str) -> None:
        group.update_member(member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms,
                            waiter)
        await self._maybe_prepare_rebalance_or_complete_join(group, reason)

    async def _replace_static_member(self, group: ClassicGroup, request: JoinRequest, old_member_id: str,
                                     new_member_id: str, waiter: Waiter[JoinResult]) -> None:
        """KIP-345: a static member restarted; its new member id takes over, avoiding a rebalance when possible."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self.cancel_heartbeat(group, old_member_id)
        self.schedule_heartbeat(group, new_member_id, member.session_timeout_ms)
        old_protocols, old_rebalance, old_session = member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms
        group.update_member(member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms, waiter)
        reason = f"static member {instance_id} rejoined as {new_member_id}"
        if group.state is S.STABLE:
            if group.protocol_name != group.select_protocol():
                await self._maybe_prepare_rebalance_or_complete_join(group, reason + " with a change of protocol")
                return
            # Same protocol: persist the new member id and let the member carry on with the
            # current assignment, without a rebalance.
            try:
                await self.shard.write([self.group_record(group)])
            except CoordinatorError as exc:
                if group.members.get(new_member_id) is not member or self.groups.get(group.group_id) is not group:
                    waiter.complete(JoinResult.failed(exc.code))  # the group moved on while the write waited
                    return
                member.join_waiter = None
                group.update_member(member, old_protocols, old_rebalance, old_session, None)
                group.replace_static_member(instance_id, new_member_id, old_member_id)
                self.cancel_heartbeat(group, new_member_id)
                self.schedule_heartbeat(group, old_member_id, old_session)
                waiter.complete(JoinResult(exc.code, "", group.generation_id, group.protocol_type,
                                           group.protocol_name, current_leader))
                return
            if request.api_version >= 9:
                # KIP-814: a rejoining static leader learns the members without redoing the assignment.
                is_leader = group.is_leader(new_member_id)
                group.complete_join(member, self._join_result(group, member, with_members=is_leader,
                                                              skip_assignment=is_leader))
            else:
                group.complete_join(member, self._join_result(group, member, with_members=False,
                                                              leader=current_leader))
        elif group.state is S.COMPLETING_REBALANCE:
            # The leader may be computing an assignment for the old member id: start over.
            await self._prepare_rebalance(group, reason)
        elif group.state is S.PREPARING_REBALANCE:
            pass  # the member is now awaiting the join like the others
        else:
            waiter.complete(JoinResult.failed(ErrorCode.unknown_server_error, new_member_id))

    # Rebalance --------------------------------------------------------------------------

    async def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            await self._prepare_rebalance(group, reason)
        else:
            await self._maybe_complete_join_phase(group)

    async def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.state is S.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment(group, ErrorCode.rebalance_in_progress)
        self.shard.cancel(_sync_key(group.group_id))
        initial = group.state is S.EMPTY
        group_id = group.group_id
        if initial:
            settings = self.shard.settings()
            delay = settings.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            self.shard.schedule(_join_key(group_id), delay,
                                lambda: self._try_complete_initial_rebalance(group_id, delay, remaining))
        group.transition_to(S.PREPARING_REBALANCE, clock.now_ms())
        log.info("preparing to rebalance group %s in generation %d: %s", group_id, group.generation_id, reason)
        if not initial:
            await self._maybe_complete_join_else_schedule(group)

    async def _maybe_complete_join_else_schedule(self, group: ClassicGroup) -> None:
        if group.has_all_members_joined():
            await self._complete_join(group)
        else:
            group_id = group.group_id
            self.shard.schedule(_join_key(group_id), group.rebalance_timeout_ms,
                                lambda: self._complete_join_timer(group_id))

    async def _maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined() \
                and group.previous_state is not S.EMPTY:
            await self._complete_join(group)

    async def _try_complete_initial_rebalance(self, group_id: str, delay_ms: int, remaining_ms: int) -> None:
        group = self.groups.get(group_id)
        if group is None or group.state is not S.PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining_ms != 0:
            # More members keep arriving: wait a little longer, within the rebalance timeout.
            group.new_member_added = False
            settings = self.shard.settings()
            new_delay = min(settings.initial_rebalance_delay_ms, remaining_ms)
            new_remaining = max(remaining_ms - delay_ms, 0)
            self.shard.schedule(_join_key(group_id), new_delay,
                                lambda: self._try_complete_initial_rebalance(group_id, new_delay, new_remaining))
        else:
            await self._complete_join(group)

    async def _complete_join_timer(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.state is S.PREPARING_REBALANCE:
            await self._complete_join(group)

    async def _complete_join(self, group: ClassicGroup) -> None:
        """End the join phase: drop dynamic members that did not rejoin, start the next generation, answer joins."""
        group_id = group.group_id
        self.shard.cancel(_join_key(group_id))
        gone = [m for m in group.not_yet_rejoined() if not m.is_static]
        for member in gone:
            group.remove(member.member_id)
            self.cancel_heartbeat(group, member.member_id)
        if gone:
            log.info("group %s removed members that did not rejoin: %s", group_id, [m.member_id for m in gone])
        if group.state is S.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined are left: wait for them (or for their
            # sessions to expire) one more rebalance timeout.
            log.warning("group %s could not complete its rebalance: no member rejoined", group_id)
            self.shard.schedule(_join_key(group_id), group.rebalance_timeout_ms,
                                lambda: self._complete_join_timer(group_id))
            return
        group.init_next_generation(clock.now_ms())
        if group.state is S.EMPTY:
            log.info("group %s with generation %d is now empty", group_id, group.generation_id)
            try:
                await self.shard.write([self.group_record(group, {})])
            except CoordinatorError as exc:
                # The previous generation stays on disk; with no members it would only time out.
                log.warning("could not write the empty generation %d of group %s: %s", group.generation_id,
                            group_id, exc.message)
            return
        log.info("group %s stabilising generation %d (%s) with %d members", group_id, group.generation_id,
                 group.protocol_name, len(group.members))
        for member in group.members.values():
            group.complete_join(member, self._join_result(group, member, with_members=group.is_leader(member.member_id)))
            self.schedule_heartbeat(group, member.member_id, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        generation = group.generation_id
        self.shard.schedule(_sync_key(group_id), group.rebalance_timeout_ms,
                            lambda: self._expire_pending_sync(group_id, generation))

    async def _expire_pending_sync(self, group_id: str, generation: int) -> None:
        group = self.groups.get(group_id)
        if group is None or group.generation_id != generation:
            return
        if group.in_state(S.COMPLETING_REBALANCE, S.STABLE) and group.pending_sync_members:
            late = sorted(group.pending_sync_members)
            for member_id in late:
                group.remove(member_id)
                self.cancel_heartbeat(group, member_id)
            await self._prepare_rebalance(group, f"members {late} did not send SyncGroup in time")

    def _reset_and_propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        if group.state is not S.COMPLETING_REBALANCE:
            raise IllegalTransitionError(f"group {group.group_id} is {group.state.value}, not CompletingRebalance")
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in group.members.values():
            result = SyncResult(error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                                member.assignment)
            if group.complete_sync(member, result):
                # Its session timer may have fired while it waited and been ignored: start it again.
                self.schedule_heartbeat(group, member.member_id, member.session_timeout_ms)

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.in_state(S.COMPLETING_REBALANCE, S.STABLE) or not group.pending_sync_members:
            self.shard.cancel(_sync_key(group.group_id))

    # SyncGroup --------------------------------------------------------------------------

    async def sync(self, request: SyncRequest) -> Waiter[SyncResult]:
        waiter: Waiter[SyncResult] = Waiter()
        group = self.groups.get(request.group_id)
        if group is None:
            waiter.complete(SyncResult(ErrorCode.unknown_member_id))
            return waiter
        error = self._validate_sync(group, request)
        if error is not None:
            waiter.complete(SyncResult(error))
        elif group.state is S.EMPTY:
            waiter.complete(SyncResult(ErrorCode.unknown_member_id))
        elif group.state is S.PREPARING_REBALANCE:
            waiter.complete(SyncResult(ErrorCode.rebalance_in_progress))
        elif group.state is S.COMPLETING_REBALANCE:
            member = group.members[request.member_id]
            if member.sync_waiter is not None:
                member.sync_waiter.complete(SyncResult(ErrorCode.rebalance_in_progress))
            member.sync_waiter = waiter
            self._remove_pending_sync_member(group, request.member_id)
            if group.is_leader(request.member_id):
                await self._complete_sync_from_leader(group, request)
        elif group.state is S.STABLE:
            self._remove_pending_sync_member(group, request.member_id)
            member = group.members[request.member_id]
            waiter.complete(SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment))
        else:
            waiter.complete(SyncResult(ErrorCode.coordinator_not_available))
        return waiter

    def _validate_sync(self, group: ClassicGroup, request: SyncRequest) -> ErrorCode | None:
        if group.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        try:
            group.validate_member(request.member_id, request.group_instance_id)
        except GroupError as exc:
            return exc.code
        if request.generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if _protocol_inconsistent(request.protocol_type, group.protocol_type) or \
                _protocol_inconsistent(request.protocol_name, group.protocol_name):
            return ErrorCode.inconsistent_group_protocol
        return None

    async def _complete_sync_from_leader(self, group: ClassicGroup, request: SyncRequest) -> None:
        assignment = dict(request.assignments)
        missing = [m for m in group.members if m not in assignment]
        if missing:
            log.warning("the leader of group %s gave no assignment to %s: they get an empty one", group.group_id,
                        missing)
        for member_id in missing:
            assignment[member_id] = b""
        generation = group.generation_id
        try:
            await self.shard.write([self.group_record(group, assignment)])
        except CoordinatorError as exc:
            if group.state is S.COMPLETING_REBALANCE and group.generation_id == generation:
                self._reset_and_propagate_assignment(group, exc.code)
                await self._maybe_prepare_rebalance_or_complete_join(
                    group, f"storing the assignment failed: {exc.message}")
            return
        if group.state is S.COMPLETING_REBALANCE and group.generation_id == generation:
            for member in group.members.values():
                member.assignment = assignment.get(member.member_id, b"")
            self._propagate_assignment(group, ErrorCode.none)
            group.transition_to(S.STABLE, clock.now_ms())
            log.info("group %s is stable in generation %d", group.group_id, generation)

    # Heartbeat --------------------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None, generation_id: int) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        try:
            group.validate_member(member_id, instance_id)
        except GroupError as exc:
            return exc.code
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is S.EMPTY:
            return ErrorCode.unknown_member_id
        member = group.members[member_id]
        self.schedule_heartbeat(group, member_id, member.session_timeout_ms)
        if group.state is S.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def touch(self, group: ClassicGroup, member_id: str) -> None:
        """A member of the current generation committed offsets: that shows it is alive, as a heartbeat does."""
        member = group.members.get(member_id)
        if member is not None and not group.in_state(S.EMPTY, S.DEAD) and not member.is_new:
            self.schedule_heartbeat(group, member_id, member.session_timeout_ms)

    async def _expire_heartbeat(self, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is None or group.state is S.DEAD:
            return
        if group.is_pending(member_id):
            log.info("pending member %s of group %s did not join within its session timeout", member_id, group_id)
            group.remove(member_id)
            if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
                await self._complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        log.info("member %s of group %s failed its session timeout: removing it", member_id, group_id)
        await self._remove_member_and_update_group(group, member, f"member {member_id} session expired")

    async def _remove_member_and_update_group(self, group: ClassicGroup, member: Member, reason: str) -> None:
        # A new member may still have a JoinGroup parked: answer it, so the client rejoins if alive.
        group.complete_join(member, JoinResult.failed(ErrorCode.unknown_member_id))
        group.complete_sync(member, SyncResult(ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        if group.in_state(S.STABLE, S.COMPLETING_REBALANCE):
            await self._maybe_prepare_rebalance_or_complete_join(group, reason)
        elif group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
            await self._complete_join(group)

    async def shrink_oversized(self, group_id: str) -> None:
        """A loaded group has more members than group.max.size allows now: rebalance (the extra ones cannot rejoin)."""
        group = self.groups.get(group_id)
        if group is not None and len(group.members) > self.shard.settings().max_size and group.can_rebalance():
            await self._prepare_rebalance(group, "the group is larger than group.max.size")

    # LeaveGroup -------------------------------------------------------------------------

    async def leave(self, group_id: str, leaving: list[LeavingMember]) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove members (v3+: several at once, by member id or, for admins, by instance id alone)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id, [ErrorCode.unknown_member_id] * len(leaving)
        if group.state is S.DEAD:
            return ErrorCode.coordinator_not_available, [ErrorCode.coordinator_not_available] * len(leaving)
        errors: list[ErrorCode] = []
        removed: list[str] = []
        for who in leaving:
            if who.member_id == "":
                member_id = group.static_member_id(who.group_instance_id)
                if member_id is None:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                self._remove_current_member(group, member_id)
            elif group.is_pending(who.member_id):
                group.remove(who.member_id)
                self.cancel_heartbeat(group, who.member_id)
            else:
                try:
                    group.validate_member(who.member_id, who.group_instance_id)
                except GroupError as exc:
                    errors.append(exc.code)
                    continue
                self._remove_current_member(group, who.member_id)
            errors.append(ErrorCode.none)
            removed.append(who.member_id or str(who.group_instance_id))
        if removed:
            reason = f"members {removed} left the group"
            log.info("group %s: %s", group_id, reason)
            if group.in_state(S.STABLE, S.COMPLETING_REBALANCE):
                await self._maybe_prepare_rebalance_or_complete_join(group, reason)
            elif group.state is S.PREPARING_REBALANCE:
                await self._maybe_complete_join_phase(group)
        return ErrorCode.none, errors

    def _remove_current_member(self, group: ClassicGroup, member_id: str) -> None:
        member = group.members[member_id]
        self.cancel_heartbeat(group, member_id)
        group.complete_join(member, JoinResult.failed(ErrorCode.unknown_member_id))
        group.complete_sync(member, SyncResult(ErrorCode.unknown_member_id))
        group.remove(member_id)

