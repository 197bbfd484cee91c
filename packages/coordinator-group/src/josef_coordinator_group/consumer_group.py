"""KIP-848 consumer groups: member epochs, a server-side target assignment, incremental reconciliation.

A :class:`ConsumerGroup` lives in a :class:`~josef_coordinator_group.shard.GroupShard`
next to the classic groups (a group id is one or the other). Unlike classic
groups, every change is written as Kafka's consumer-group records before the
heartbeat is answered, and those records are what the shard replays on load:

- ConsumerGroupMetadata (key v3): the group epoch, bumped when membership or
  subscriptions (or the subscribed topics' partitions) change;
- ConsumerGroupMemberMetadata (key v5): a member's subscription and client;
- ConsumerGroupTargetAssignmentMetadata/Member (keys v6/v7): the assignment
  the server-side assignor computed for the assignment epoch;
- ConsumerGroupCurrentMemberAssignment (key v8): the member epoch, its
  assigned partitions and those it still has to revoke.

Reconciliation follows Kafka's ``CurrentAssignmentBuilder``: a member first
loses (revokes) partitions that the target takes away, keeping its old epoch
until it acknowledges the revocation (its owned partitions in a heartbeat);
then it moves to the assignment epoch and gets the target's new partitions,
but only those no other member still holds (assigned or pending revocation).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Iterable, Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef_coordinator_group.group import GroupError
from josef_coordinator_group.records import (
    CONSUMER_CURRENT_ASSIGNMENT,
    CONSUMER_GROUP_METADATA,
    CONSUMER_MEMBER_METADATA,
    CONSUMER_TARGET_MEMBER,
    CONSUMER_TARGET_METADATA,
    ConsumerAssignmentValue,
    ConsumerKey,
    ConsumerMemberValue,
    encode_consumer_member,
    encode_current_assignment,
    encode_epoch,
    encode_key,
    encode_target_member,
)

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# MemberState (Kafka's values, persisted in the current assignment record)
STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS, UNKNOWN = 0, 1, 2, 127

Partitions = dict[str, frozenset[int]]


def _norm(value: Mapping[str, Iterable[int]]) -> Partitions:
    return {t: frozenset(p) for t, p in value.items() if p}


def _minus(a: Partitions, b: Partitions) -> Partitions:
    return _norm({t: ps - b.get(t, frozenset()) for t, ps in a.items()})


def _and(a: Partitions, b: Partitions) -> Partitions:
    return _norm({t: ps & b.get(t, frozenset()) for t, ps in a.items()})


def _union(a: Partitions, b: Partitions) -> Partitions:
    return _norm({t: a.get(t, frozenset()) | b.get(t, frozenset()) for t in set(a) | set(b)})


@attrs.define
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: int = STABLE
    assigned: Partitions = attrs.field(factory=dict)
    pending_revocation: Partitions = attrs.field(factory=dict)

    def metadata_value(self) -> ConsumerMemberValue:
        return ConsumerMemberValue(self.instance_id, self.rack_id, self.client_id, self.client_host,
                                   self.subscribed_topic_names, self.subscribed_topic_regex,
                                   self.rebalance_timeout_ms, self.server_assignor)

    def assignment_value(self) -> ConsumerAssignmentValue:
        return ConsumerAssignmentValue(self.member_epoch, self.previous_member_epoch, self.state,
                                       self.assigned, self.pending_revocation)

    def apply_metadata(self, value: ConsumerMemberValue) -> None:
        self.instance_id, self.rack_id = value.instance_id, value.rack_id
        self.client_id, self.client_host = value.client_id, value.client_host
        self.subscribed_topic_names = tuple(value.subscribed_topic_names)
        self.subscribed_topic_regex = value.subscribed_topic_regex
        self.rebalance_timeout_ms, self.server_assignor = value.rebalance_timeout_ms, value.server_assignor

    def apply_assignment(self, value: ConsumerAssignmentValue) -> None:
        self.member_epoch, self.previous_member_epoch, self.state = (value.member_epoch,
                                                                     value.previous_member_epoch, value.state)
        self.assigned, self.pending_revocation = dict(value.assigned), dict(value.pending_revocation)


@attrs.define
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = attrs.field(factory=dict)
    target: dict[str, Partitions] = attrs.field(factory=dict)
    #: {topic id: partition count} of the subscribed topics when the target was computed.
    #: None until first computed (after a load: then it is taken as it is, without a new epoch).
    subscribed_metadata: dict[str, int] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.members

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def member_by_instance(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    # Topics --------------------------------------------------------------------------------

    def subscribed_topics(self, topic_names: Iterable[str]) -> set[str]:
        """Names subscribed by some member: listed names that exist, plus those matching a member's regex."""
        existing = set(topic_names)
        wanted: set[str] = set()
        for member in self.members.values():
            wanted |= set(member.subscribed_topic_names) & existing
            if member.subscribed_topic_regex:
                pattern = compile_regex(member.subscribed_topic_regex)
                wanted |= {t for t in existing if not t.startswith("__") and pattern.fullmatch(t)}
        return wanted

    def member_topics(self, member: ConsumerMember, names: Mapping[str, str]) -> frozenset[str]:
        """The topic ids ``member`` subscribes to (``names``: name -> id of every existing topic)."""
        ids = {names[n] for n in member.subscribed_topic_names if n in names}
        if member.subscribed_topic_regex:
            pattern = compile_regex(member.subscribed_topic_regex)
            ids |= {i for n, i in names.items() if not n.startswith("__") and pattern.fullmatch(n)}
        return frozenset(ids)

    # Ownership -----------------------------------------------------------------------------

    def owner_of(self, topic_id: str, partition: int, other_than: str) -> str | None:
        for member in self.members.values():
            if member.member_id == other_than:
                continue
            if partition in member.assigned.get(topic_id, ()) or partition in member.pending_revocation.get(topic_id, ()):
                return member.member_id
        return None

    # Reconciliation (Kafka's CurrentAssignmentBuilder) ---------------------------------------

    def reconcile(self, member: ConsumerMember, owned: Partitions | None) -> bool:
        """Move ``member`` towards its target; ``owned`` is what the heartbeat reported (None: not sent).

        Returns True if the member's epoch, state or partitions changed.
        """
        before = (member.member_epoch, member.state, member.assigned, member.pending_revocation)
        target = self.target.get(member.member_id, {})
        if member.state == UNREVOKED_PARTITIONS:
            if owned is None or _and(member.pending_revocation, owned):
                return False  # still waiting for the revocation to be acknowledged
            member.pending_revocation = {}
            self._next(member, target, owned)
        elif member.member_epoch != self.assignment_epoch or member.state == UNRELEASED_PARTITIONS:
            self._next(member, target, owned)
        elif member.state == STABLE and member.assigned != _norm(target):
            # Same epoch, but topics of the target vanished (deleted): drop them.
            self._next(member, target, owned)
        return before != (member.member_epoch, member.state, member.assigned, member.pending_revocation)

    def _next(self, member: ConsumerMember, target: Partitions, owned: Partitions | None) -> None:
        target = _norm(target)
        current = member.assigned
        kept = _and(current, target)
        revoking = _minus(current, target)
        if revoking:
            member.assigned = kept
            member.pending_revocation = revoking
            member.state = UNREVOKED_PARTITIONS
            return
        wanted = _minus(target, current)
        assignable: dict[str, set[int]] = {}
        unreleased = False
        for topic_id, parts in wanted.items():
            for p in parts:
                if self.owner_of(topic_id, p, member.member_id) is None:
                    assignable.setdefault(topic_id, set()).add(p)
                else:
                    unreleased = True
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        member.assigned = _union(kept, _norm(assignable))
        member.pending_revocation = {}
        member.state = UNRELEASED_PARTITIONS if unreleased else STABLE


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def compile_regex(regex: str) -> re.Pattern[str]:
    pattern = _REGEX_CACHE.get(regex)
    if pattern is None:
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise GroupError(ErrorCode.invalid_regular_expression, f"invalid regex {regex!r}: {exc}") from exc
        _REGEX_CACHE[regex] = pattern
    return pattern


# Records ------------------------------------------------------------------------------------

Record = tuple[bytes, "bytes | None"]


def group_epoch_record(group: ConsumerGroup) -> Record:
    return encode_key(ConsumerKey(CONSUMER_GROUP_METADATA, group.group_id)), encode_epoch(group.group_epoch)


def member_record(group: ConsumerGroup, member: ConsumerMember) -> Record:
    return (encode_key(ConsumerKey(CONSUMER_MEMBER_METADATA, group.group_id, member.member_id)),
            encode_consumer_member(member.metadata_value()))


def target_records(group: ConsumerGroup | Any, previous: Mapping[str, Partitions], *,
                   member_key: int = CONSUMER_TARGET_MEMBER, epoch_key: int = CONSUMER_TARGET_METADATA
                   ) -> list[Record]:
    """The target assignment's records: members whose target changed (tombstones for those gone), then the
    assignment epoch. The key versions are the consumer group's, or the share group's."""
    records: list[Record] = []
    for member_id, parts in sorted(group.target.items()):
        if previous.get(member_id) != parts:
            records.append((encode_key(ConsumerKey(member_key, group.group_id, member_id)),
                            encode_target_member(parts)))
    for member_id in sorted(set(previous) - set(group.target)):
        records.append((encode_key(ConsumerKey(member_key, group.group_id, member_id)), None))
    records.append((encode_key(ConsumerKey(epoch_key, group.group_id)), encode_epoch(group.assignment_epoch)))
    return records


def current_record(group: ConsumerGroup, member: ConsumerMember) -> Record:
    return (encode_key(ConsumerKey(CONSUMER_CURRENT_ASSIGNMENT, group.group_id, member.member_id)),
            encode_current_assignment(member.assignment_value()))


def member_tombstones(group: ConsumerGroup | Any, member_id: str,
                      versions: tuple[int, ...] = (CONSUMER_CURRENT_ASSIGNMENT, CONSUMER_TARGET_MEMBER,
                                                   CONSUMER_MEMBER_METADATA)) -> list[Record]:
    return [(encode_key(ConsumerKey(v, group.group_id, member_id)), None) for v in versions]


def group_tombstones(group_id: str, versions: tuple[int, ...] = (CONSUMER_TARGET_METADATA, CONSUMER_GROUP_METADATA)
                     ) -> list[Record]:
    return [(encode_key(ConsumerKey(v, group_id)), None) for v in versions]


def new_member_id() -> str:
    return uuid.uuid4().hex[:22]
