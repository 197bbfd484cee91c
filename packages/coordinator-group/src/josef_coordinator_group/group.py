"""A classic consumer group: its members, its generation and the state machine Kafka defines for it.

This module holds the data and the transitions that need no I/O (adding and
removing members, choosing the protocol, electing the leader, starting the
next generation); :mod:`josef_coordinator_group.membership` drives them from
requests and timers and persists the results. The states and which state may
follow which are Kafka's (``ClassicGroupState``)::

    Empty ----------------> PreparingRebalance <-------------+
      ^                       |        ^                     |
      |  (no member rejoined) |        | (member joins,      |
      +-----------------------+        |  leaves, expires)   |
                              v        |                     |
                        CompletingRebalance --(leader syncs)--> Stable

    any state --(group deleted, offsets expired, coordinator moved)--> Dead
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from typing import Generic, Sequence, TypeVar

import anyio
import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.consumer_protocol import PROTOCOL_TYPE, subscribed_topics
from josef_coordinator_group.records import GroupValue, MemberValue

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A member's supported protocols, most preferred first: (name, metadata).
Protocols = tuple[tuple[str, bytes], ...]


class GroupState(enum.Enum):
    """The states of a classic group, with the names ListGroups and DescribeGroups report."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_S = GroupState
#: For each state, the states it may be entered from (Kafka's ``validPreviousStates``).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.DEAD: frozenset({_S.STABLE, _S.PREPARING_REBALANCE, _S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}),
}


class GroupError(Exception):
    """A request the group refuses, with the error code the client expects."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class IllegalTransitionError(RuntimeError):
    """A transition the state machine forbids: a bug in the coordinator, never a client error."""


class Waiter(Generic[T]):
    """A response a parked request waits for (JoinGroup until the rebalance completes, SyncGroup for the leader).

    Completing it twice keeps the first result, so every path that ends a
    wait can simply complete it.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._result: T | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def complete(self, result: T) -> bool:
        if self._event.is_set():
            return False
        self._result = result
        self._event.set()
        return True

    async def wait(self) -> T:
        await self._event.wait()
        assert self._result is not None
        return self._result


@attrs.frozen
class JoinMember:
    """One member as the leader sees it in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@attrs.frozen
class JoinResult:
    """What a JoinGroup request is answered with (any version; the handler drops what a version lacks)."""

    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinMember, ...] = ()

    @classmethod
    def failed(cls, error: ErrorCode, member_id: str = "") -> JoinResult:
        return cls(error, member_id)


@attrs.frozen
class SyncResult:
    """What a SyncGroup request is answered with."""

    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@attrs.define(eq=False)
class Member:
    """A member of a classic group, with the requests it has parked on the coordinator."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_waiter: Waiter[JoinResult] | None = None
    sync_waiter: Waiter[SyncResult] | None = None
    #: Joined but not yet part of a generation: it has no heartbeat to send, so it expires on a longer timer.
    is_new: bool = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise IllegalTransitionError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: Protocols) -> bool:
        """Whether a rejoin brings exactly the protocols (and metadata) the member already has."""
        return tuple(protocols) == tuple(self.protocols)

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name in self.protocol_names:
            if name in candidates:
                return name
        raise IllegalTransitionError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """Whether an expiring session timer should spare the member: it is parked in a rebalance."""
        if self.is_new:
            return False
        return self.is_awaiting_join or self.is_awaiting_sync


@attrs.define(eq=False)
class ClassicGroup:
    """One classic group: members in join order (the first is the leader until it leaves), generation, protocol."""

    group_id: str
    state_timestamp_ms: int = -1
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    #: None for a "simple" group, which only ever committed offsets without joining.
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = attrs.Factory(dict)
    #: group.instance.id -> member id of the static members.
    static_members: dict[str, str] = attrs.Factory(dict)
    #: Member ids handed out with MEMBER_ID_REQUIRED that have not joined with them yet.
    pending_members: set[str] = attrs.Factory(set)
    #: Members of the current generation that have not sent SyncGroup yet.
    pending_sync_members: set[str] = attrs.Factory(set)
    #: Protocol name -> how many members support it.
    supported_protocols: Counter[str] = attrs.Factory(Counter)
    #: A member joined during the initial rebalance delay: extend the delay once more.
    new_member_added: bool = False
    subscribed_topics: set[str] | None = None

    # State ------------------------------------------------------------------------------

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTransitionError(
                f"group {self.group_id} cannot go from {self.state.value} to {state.value}")
        self.previous_state, self.state = self.state, state
        self.state_timestamp_ms = now_ms

    def in_state(self, *states: GroupState) -> bool:
        return self.state in states

    def can_rebalance(self) -> bool:
        return self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)

    @property
    def is_empty(self) -> bool:
        return self.state is GroupState.EMPTY

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == PROTOCOL_TYPE

    # Members ----------------------------------------------------------------------------

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def is_pending(self, member_id: str) -> bool:
        return member_id in self.pending_members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.is_awaiting_join)

    @property
    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of any member: how long a rebalance waits for rejoins."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def add(self, member: Member, waiter: Waiter[JoinResult] | None = None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if member.member_id in self.members:
            raise IllegalTransitionError(f"member {member.member_id} is already in group {self.group_id}")
        if self.leader_id is None:
            self.leader_id = member.member_id
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names)
        member.join_waiter = waiter
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        """Forget a member (or a pending member id); a new leader is the next member in join order."""
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names)
            self.supported_protocols += Counter()  # drops counts that reached zero
            if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: Protocols, rebalance_timeout_ms: int, session_timeout_ms: int,
                      waiter: Waiter[JoinResult] | None) -> None:
        """A known member rejoins: take its new protocols and timeouts, and park its JoinGroup."""
        self.supported_protocols.subtract(member.protocol_names)
        member.protocols = tuple(protocols)
        self.supported_protocols.update(member.protocol_names)
        self.supported_protocols += Counter()
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if waiter is not None and member.join_waiter is not None and member.join_waiter is not waiter:
            # The earlier JoinGroup (from a connection the client gave up on) is answered so
            # that its handler ends; a client still listening simply rejoins.
            member.join_waiter.complete(JoinResult.failed(ErrorCode.rebalance_in_progress, member.member_id))
        member.join_waiter = waiter

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """A static member rejoined without its member id: the old id is fenced, the new one takes its place."""
        old = self.members.pop(old_member_id, None)
        if old is None:
            raise IllegalTransitionError(f"static member {instance_id} ({old_member_id}) is not in {self.group_id}")
        self.supported_protocols.subtract(old.protocol_names)
        self.supported_protocols += Counter()
        self.complete_join(old, JoinResult.failed(ErrorCode.fenced_instance_id, old_member_id))
        self.complete_sync(old, SyncResult(ErrorCode.fenced_instance_id))
        new = Member(new_member_id, instance_id, old.client_id, old.client_host, old.rebalance_timeout_ms,
                     old.session_timeout_ms, old.protocol_type, old.protocols, old.assignment)
        was_leader = self.leader_id == old_member_id
        self.static_members.pop(instance_id, None)
        self.pending_sync_members.discard(old_member_id)
        self.add(new)
        if was_leader:
            self.leader_id = new_member_id
        return new

    def validate_member(self, member_id: str, instance_id: str | None) -> None:
        """Kafka's check of a request's member id (and instance id): UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID."""
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                raise GroupError(ErrorCode.unknown_member_id, f"no static member {instance_id} in {self.group_id}")
            if existing != member_id:
                raise GroupError(ErrorCode.fenced_instance_id,
                                 f"static member {instance_id} of {self.group_id} is now {existing}, not {member_id}")
        elif member_id not in self.members:
            raise GroupError(ErrorCode.unknown_member_id, f"{member_id!r} is not a member of {self.group_id}")

    # Waiters ----------------------------------------------------------------------------

    def complete_join(self, member: Member, result: JoinResult) -> bool:
        waiter, member.join_waiter = member.join_waiter, None
        return waiter.complete(result) if waiter is not None else False

    def complete_sync(self, member: Member, result: SyncResult) -> bool:
        waiter, member.sync_waiter = member.sync_waiter, None
        return waiter.complete(result) if waiter is not None else False

    # Protocols and generations ------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, protocols: Protocols) -> bool:
        """Whether a member with these protocols may join: same type, and a protocol every member supports."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols.get(name, 0) == len(self.members) for name, _ in protocols)

    def candidate_protocols(self) -> set[str]:
        return {name for name, count in self.supported_protocols.items() if count == len(self.members)}

    def select_protocol(self) -> str:
        """Each member votes for its favourite protocol that all members support; the most votes wins.

        Ties go to the protocol the earliest-joined member prefers, so the choice is deterministic.
        """
        candidates = self.candidate_protocols()
        if not candidates:
            raise IllegalTransitionError(f"no protocol is supported by every member of {self.group_id}")
        votes = Counter(member.vote(candidates) for member in self.members.values())
        first = list(self.members.values())[0].protocol_names
        return max(votes, key=lambda name: (votes[name], -first.index(name) if name in first else -len(first)))

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, or hand leadership to a member that did; False if none rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for member in self.members.values():
            if member.is_awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def compute_subscribed_topics(self) -> set[str] | None:
        """The topics the members consume (None when unknown: not a consumer group, or unreadable metadata)."""
        if not self.members:
            return set()
        if not self.uses_consumer_protocol() or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                member_topics = subscribed_topics(member.metadata(self.protocol_name))
            except IllegalTransitionError:
                return None
            if member_topics is None:
                return None
            topics |= member_topics
        return topics

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    def current_members(self) -> tuple[JoinMember, ...]:
        """The members with their metadata for the chosen protocol, as the leader receives them."""
        return tuple(JoinMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    # Offsets ----------------------------------------------------------------------------

    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               transactional: bool = False) -> None:
        """Kafka's rules for who may commit: members of the current generation, or anyone when the group is empty.

        A transactional commit (TxnOffsetCommit) is checked only as far as it
        names a member: before v3 the request has no member fields at all,
        and the group's state does not matter to it.
        """
        if self.state is GroupState.DEAD:
            raise GroupError(ErrorCode.coordinator_not_available, f"group {self.group_id} is dead")
        if generation_id < 0 and self.state is GroupState.EMPTY:
            return  # the admin client or a consumer that manages its own partitions
        if generation_id >= 0 or member_id or instance_id is not None:
            self.validate_member(member_id, instance_id)
            if generation_id != self.generation_id:
                raise GroupError(ErrorCode.illegal_generation,
                                 f"generation {generation_id} is not {self.group_id}'s current {self.generation_id}")
        elif transactional:
            return
        elif self.state is not GroupState.EMPTY:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"group {self.group_id} is not empty: commits need a member id and generation")
        if self.state is GroupState.COMPLETING_REBALANCE and not transactional:
            # The member has its new generation but not its assignment yet: it may not know which
            # partitions it owns. (While the group is *preparing* a rebalance, members of the old
            # generation may still commit: eager consumers do so as they give their partitions up.)
            raise GroupError(ErrorCode.rebalance_in_progress, f"group {self.group_id} is awaiting its assignment")

    def validate_offset_delete(self) -> None:
        if self.state is GroupState.DEAD:
            raise GroupError(ErrorCode.group_id_not_found, f"group {self.group_id} is dead")
        if self.state is not GroupState.EMPTY and not self.uses_consumer_protocol():
            raise GroupError(ErrorCode.non_empty_group, f"group {self.group_id} is not empty")

    def validate_delete(self) -> None:
        if self.state is GroupState.DEAD:
            raise GroupError(ErrorCode.group_id_not_found, f"group {self.group_id} is dead")
        if self.state is not GroupState.EMPTY:
            raise GroupError(ErrorCode.non_empty_group, f"group {self.group_id} is not empty")

    def offset_expiry_base(self) -> str | None:
        """Which timestamp offsets of this group expire from: 'state' (since it became empty), 'commit', or None."""
        if self.protocol_type is None:
            return "commit"  # a simple group: each offset expires on its own
        if self.state is GroupState.EMPTY:
            return "state" if self.state_timestamp_ms >= 0 else "commit"
        if self.uses_consumer_protocol() and self.subscribed_topics is not None and self.state is GroupState.STABLE:
            return "commit"  # only offsets of topics no member subscribes to any more
        return None

    # Persistence ------------------------------------------------------------------------

    def to_value(self, assignment: dict[str, bytes] | None = None) -> GroupValue:
        """The GroupMetadata record of this generation, with ``assignment`` (default: the members' current ones)."""
        assignment = assignment if assignment is not None else {m.member_id: m.assignment for m in self.members.values()}
        members = tuple(
            MemberValue(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                        m.session_timeout_ms, m.metadata(self.protocol_name), assignment.get(m.member_id, b""))
            for m in self.members.values())
        return GroupValue(self.protocol_type or "", self.generation_id, self.protocol_name, self.leader_id,
                          self.state_timestamp_ms, members)

    @classmethod
    def from_value(cls, group_id: str, value: GroupValue, now_ms: int) -> ClassicGroup:
        """A group as a restarted coordinator finds it: Stable with its members, or Empty."""
        group = cls(group_id, value.current_state_timestamp if value.current_state_timestamp >= 0 else -1,
                    generation_id=value.generation, protocol_type=value.protocol_type or None,
                    protocol_name=value.protocol)
        for m in value.members:
            group.add(Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout,
                             m.session_timeout, value.protocol_type, ((value.protocol or "", m.subscription),),
                             m.assignment))
        group.leader_id = value.leader if value.leader in group.members else next(iter(group.members), None)
        if group.members:
            group.state = group.previous_state = GroupState.STABLE
            if group.state_timestamp_ms < 0:
                group.state_timestamp_ms = now_ms
        group.subscribed_topics = group.compute_subscribed_topics()
        return group


def join_members(members: Sequence[JoinMember]) -> list[dict[str, object]]:
    return [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
            for m in members]
