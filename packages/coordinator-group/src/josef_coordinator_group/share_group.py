"""KIP-932 share groups: members, their epochs and the ``simple`` server-side assignment.

A :class:`ShareGroup` lives in a :class:`~josef_coordinator_group.shard.GroupShard`
beside classic and consumer groups (a group id is one kind only). Its
membership works like a KIP-848 consumer group's, written as Kafka's
share-group records before a heartbeat is answered, but without
reconciliation: members of a share group may read the same partitions (the
share partitions on the leaders keep them from reading the same records),
so a member takes its target assignment, and the assignment epoch, at once.

- ShareGroupMetadata (key v11): the group epoch, bumped when membership,
  subscriptions or the subscribed topics' partitions change;
- ShareGroupMemberMetadata (key v10): a member's rack, client and
  subscription;
- ShareGroupTargetAssignmentMetadata/Member (keys v12/v13): the assignment
  computed for the assignment epoch;
- ShareGroupCurrentMemberAssignment (key v14): the member's epoch and
  partitions;
- ShareGroupStatePartitionMetadata (key v15): the topics the group has
  share-partition state for (assigned once, or reset by
  AlterShareGroupOffsets), which describing its offsets covers.

The ``simple`` assignor (Kafka's default for share groups) spreads each
topic's partitions over the members subscribed to it; with more members than
partitions, the partitions are shared, each member getting one.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from josef_coordinator_group import consumer_group
from josef_coordinator_group.consumer_group import Partitions, Record, _norm
from josef_coordinator_group.records import (
    SHARE_CURRENT_ASSIGNMENT,
    SHARE_GROUP_METADATA,
    SHARE_MEMBER_METADATA,
    SHARE_STATE_PARTITIONS,
    SHARE_TARGET_MEMBER,
    SHARE_TARGET_METADATA,
    ConsumerKey,
    ShareAssignmentValue,
    ShareMemberValue,
    ShareStatePartitionsValue,
    encode_epoch,
    encode_key,
    encode_share_assignment,
    encode_share_member,
    encode_share_state_partitions,
)

LEAVE_EPOCH = -1
SIMPLE = "simple"


@attrs.define
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: Partitions = attrs.field(factory=dict)

    def metadata_value(self) -> ShareMemberValue:
        return ShareMemberValue(self.rack_id, self.client_id, self.client_host, self.subscribed_topic_names)

    def assignment_value(self) -> ShareAssignmentValue:
        return ShareAssignmentValue(self.member_epoch, self.previous_member_epoch, 0, self.assigned)

    def apply_metadata(self, value: ShareMemberValue) -> None:
        self.rack_id, self.client_id, self.client_host = value.rack_id, value.client_id, value.client_host
        self.subscribed_topic_names = tuple(value.subscribed_topic_names)

    def apply_assignment(self, value: ShareAssignmentValue) -> None:
        self.member_epoch, self.previous_member_epoch = value.member_epoch, value.previous_member_epoch
        self.assigned = dict(value.assigned)


@attrs.define
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = attrs.field(factory=dict)
    target: dict[str, Partitions] = attrs.field(factory=dict)
    #: {topic id: partition count} of the subscribed topics when the target was computed (None: not yet).
    subscribed_metadata: dict[str, int] | None = None
    #: {topic id: (name, partitions)} the group has share-partition state for: assigned once, or reset (Kafka's
    #: ShareGroupStatePartitionMetadata); what describing its offsets covers.
    initialized: dict[str, tuple[str, frozenset[int]]] = attrs.field(factory=dict)

    def initialize(self, topics: Mapping[str, tuple[str, frozenset[int]]]) -> bool:
        """Add ``topics`` (their partitions) to :attr:`initialized`; True if that changed it."""
        changed = False
        for topic_id, (name, partitions) in topics.items():
            known = self.initialized.get(topic_id)
            merged = (name, partitions | (known[1] if known else frozenset()))
            if known != merged:
                self.initialized[topic_id] = merged
                changed = True
        return changed

    @property
    def is_empty(self) -> bool:
        return not self.members

    @property
    def state(self) -> str:
        """Kafka's ShareGroupState: Empty or Stable (a share group has no rebalance to wait for)."""
        return "Empty" if not self.members else "Stable"

    def subscribed_topics(self, topic_names: Mapping[str, object]) -> set[str]:
        wanted: set[str] = set()
        for member in self.members.values():
            wanted |= {n for n in member.subscribed_topic_names if n in topic_names}
        return wanted

    def take_target(self, member: ShareMember) -> bool:
        """The member moves to the assignment epoch with its target partitions; True if anything changed."""
        target = _norm(self.target.get(member.member_id, {}))
        if member.member_epoch == self.assignment_epoch and member.assigned == target:
            return False
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch, member.member_epoch = member.member_epoch, self.assignment_epoch
        member.assigned = target
        return True


def simple_assignment(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int]
                      ) -> dict[str, Partitions]:
    """Each topic's partitions spread over its subscribers (sorted by member id): round robin while there are at
    least as many partitions as members, otherwise one partition each, shared."""
    result: dict[str, dict[str, set[int]]] = {m: {} for m in subscriptions}
    for topic_id, count in sorted(partitions.items()):
        members = sorted(m for m, topics in subscriptions.items() if topic_id in topics)
        if not members or count <= 0:
            continue
        if len(members) <= count:
            for p in range(count):
                result[members[p % len(members)]].setdefault(topic_id, set()).add(p)
        else:
            for i, member in enumerate(members):
                result[member].setdefault(topic_id, set()).add(i % count)
    return {m: _norm(parts) for m, parts in result.items()}


# Records ------------------------------------------------------------------------------------


def group_epoch_record(group: ShareGroup) -> Record:
    return encode_key(ConsumerKey(SHARE_GROUP_METADATA, group.group_id)), encode_epoch(group.group_epoch)


def member_record(group: ShareGroup, member: ShareMember) -> Record:
    return (encode_key(ConsumerKey(SHARE_MEMBER_METADATA, group.group_id, member.member_id)),
            encode_share_member(member.metadata_value()))


def target_records(group: ShareGroup, previous: Mapping[str, Partitions]) -> list[Record]:
    return consumer_group.target_records(group, previous, member_key=SHARE_TARGET_MEMBER,
                                         epoch_key=SHARE_TARGET_METADATA)


def current_record(group: ShareGroup, member: ShareMember) -> Record:
    return (encode_key(ConsumerKey(SHARE_CURRENT_ASSIGNMENT, group.group_id, member.member_id)),
            encode_share_assignment(member.assignment_value()))


def state_partitions_record(group: ShareGroup) -> Record:
    return (encode_key(ConsumerKey(SHARE_STATE_PARTITIONS, group.group_id)),
            encode_share_state_partitions(ShareStatePartitionsValue(dict(group.initialized), {})))


def member_tombstones(group: ShareGroup, member_id: str) -> list[Record]:
    return consumer_group.member_tombstones(group, member_id, (SHARE_CURRENT_ASSIGNMENT, SHARE_TARGET_MEMBER,
                                                               SHARE_MEMBER_METADATA))


def group_tombstones(group_id: str) -> list[Record]:
    return consumer_group.group_tombstones(group_id, (SHARE_STATE_PARTITIONS, SHARE_TARGET_METADATA,
                                                      SHARE_GROUP_METADATA))
