"""Client-side partition assignors of the classic group protocol, as Kafka's Java client has them.

In the classic protocol the group coordinator only picks a protocol (an
assignor name every member lists in ``partition.assignment.strategy``); the
*leader* member then runs that assignor over every member's subscription and
sends the result back through SyncGroup. An assignor is therefore a pure
function of the cluster's partition counts and the members' subscriptions::

    assignor.assign({"orders": 6}, {"m1": Subscription(("orders",)), "m2": Subscription(("orders",))})
    == {"m1": [orders-0, orders-1, orders-2], "m2": [orders-3, orders-4, orders-5]}

The built-ins (registered through the ``register_assignors`` hook by
:mod:`josef_client.plugin`):

``range``
    Kafka's RangeAssignor: per topic, consecutive ranges of partitions to the
    members subscribed to it, sorted; the first ``partitions % members`` get one more.
``roundrobin``
    Kafka's RoundRobinAssignor: all partitions sorted by topic and number,
    dealt to the members in turn, skipping members not subscribed to the topic.
``sticky``
    Kafka's StickyAssignor: as balanced as possible (counts differ by at most
    one when every member subscribes to the same topics) while keeping as many
    partitions as possible where they were. Eager: previous ownership travels
    in the subscription's user data (members revoke everything before joining).
``cooperative-sticky``
    Kafka's CooperativeStickyAssignor: the sticky assignment, minus every
    partition that would move from one member to another. The old owner sees
    it missing, revokes it and rejoins; in that follow-up rebalance the
    partition is unowned and is assigned to its new member. So no partition is
    ever owned by two members, and partitions that stay put keep being consumed.

A third-party assignor registers the same way and needs ``name``,
``supports_cooperative`` and ``assign``; ``subscription_user_data(topics)``
and ``on_assignment(partitions, generation)`` are optional (for assignors
that keep state across rebalances in the user data, as ``sticky`` does).
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any, Iterable, Mapping, Protocol, Sequence

from josef.protocol.consumer_protocol import Subscription
from josef.protocol.topic_partition import TopicPartition

__all__ = ["Assignor", "CooperativeStickyAssignor", "RangeAssignor", "RoundRobinAssignor", "StickyAssignor",
           "Subscription", "load_assignors", "member_order"]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class Assignor(Protocol):
    name: str
    #: True if the assignor never hands a partition from one member straight to another (COOPERATIVE).
    supports_cooperative: bool

    def assign(self, cluster_partitions: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        ...


def member_order(subscriptions: Mapping[str, Subscription]) -> list[str]:
    """Members in Kafka's MemberInfo order: static members first, by instance id; then the others by member id."""
    def key(member: str) -> tuple[int, str, str]:
        instance = subscriptions[member].group_instance_id
        return (0, instance, member) if instance is not None else (1, member, "")
    return sorted(subscriptions, key=key)


def _partitions_of(cluster_partitions: Mapping[str, int], topics: Iterable[str]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t in sorted(set(topics)) for p in range(cluster_partitions.get(t, 0))]


class RangeAssignor:
    name = "range"
    supports_cooperative = False

    def assign(self, cluster_partitions: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        members = member_order(subscriptions)
        result: dict[str, list[TopicPartition]] = {m: [] for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        for topic in topics:
            count = cluster_partitions.get(topic, 0)
            consumers = [m for m in members if topic in subscriptions[m].topics]
            if not count or not consumers:
                continue
            each, extra = divmod(count, len(consumers))
            for i, member in enumerate(consumers):
                start = each * i + min(i, extra)
                length = each + (1 if i < extra else 0)
                result[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
        return result


class RoundRobinAssignor:
    name = "roundrobin"
    supports_cooperative = False

    def assign(self, cluster_partitions: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        members = member_order(subscriptions)
        result: dict[str, list[TopicPartition]] = {m: [] for m in members}
        if not members:
            return result
        partitions = _partitions_of(cluster_partitions, (t for s in subscriptions.values() for t in s.topics))
        turn = 0
        for tp in partitions:
            for _ in range(len(members)):  # the next member (circularly) subscribed to this topic
                member = members[turn % len(members)]
                turn += 1
                if tp.topic in subscriptions[member].topics:
                    result[member].append(tp)
                    break
        return result


# The sticky assignors ---------------------------------------------------------------------------


def encode_sticky_user_data(partitions: Iterable[TopicPartition], generation: int) -> bytes:
    """Kafka's StickyAssignorUserData v1: the previous assignment by topic, then the generation."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    buf = io.BytesIO()
    buf.write(_I32.pack(len(by_topic)))
    for topic, parts in by_topic.items():
        name = topic.encode()
        buf.write(_I16.pack(len(name)) + name + _I32.pack(len(parts)))
        for p in parts:
            buf.write(_I32.pack(p))
    buf.write(_I32.pack(generation))
    return buf.getvalue()


def decode_sticky_user_data(data: bytes | None) -> tuple[list[TopicPartition], int]:
    """(previous assignment, generation) from StickyAssignorUserData v0/v1; ([], -1) if absent or unreadable."""
    if not data:
        return [], -1
    try:
        pos = 0
        (topics,), pos = _I32.unpack_from(data, pos), pos + 4
        out = []
        for _ in range(topics):
            (length,), pos = _I16.unpack_from(data, pos), pos + 2
            topic, pos = data[pos:pos + length].decode(), pos + length
            (count,), pos = _I32.unpack_from(data, pos), pos + 4
            for _ in range(count):
                (p,), pos = _I32.unpack_from(data, pos), pos + 4
                out.append(TopicPartition(topic, p))
        generation = _I32.unpack_from(data, pos)[0] if len(data) >= pos + 4 else -1
        return out, generation
    except (struct.error, UnicodeDecodeError):
        return [], -1


def sticky_assign(cluster_partitions: Mapping[str, int], subscriptions: Mapping[str, Subscription],
                  previous: Mapping[str, tuple[Sequence[TopicPartition], int]]
                  ) -> tuple[dict[str, list[TopicPartition]], dict[TopicPartition, str]]:
    """The sticky assignment, and each partition's valid previous owner.

    ``previous`` is each member's claimed ownership and its generation. A
    partition claimed by several members stays with the claim of the highest
    generation; a tie invalidates it (Kafka logs "multiple consumers claiming
    the same partition in the same generation"). Claims on partitions that no
    longer exist or that the member no longer subscribes to are dropped.

    Then: keep every valid claim, give each unowned partition (those with the
    fewest eligible members first) to the eligible member with the fewest
    partitions, and move partitions from the most to the least loaded members
    while some eligible member has two fewer. With identical subscriptions the
    result differs by at most one partition between members.
    """
    members = member_order(subscriptions)
    rank = {m: i for i, m in enumerate(members)}
    all_partitions = _partitions_of(cluster_partitions, (t for s in subscriptions.values() for t in s.topics))
    existing = set(all_partitions)
    eligible = {tp: [m for m in members if tp.topic in subscriptions[m].topics] for tp in all_partitions}

    claims: dict[TopicPartition, list[tuple[int, str]]] = {}
    for member in members:
        owned, generation = previous.get(member, ((), -1))
        for tp in set(owned):
            if tp in existing and tp.topic in subscriptions[member].topics:
                claims.setdefault(tp, []).append((generation, member))
    owner: dict[TopicPartition, str] = {}
    for tp, found in claims.items():
        best = max(g for g, _ in found)
        winners = [m for g, m in found if g == best]
        if len(winners) == 1:
            owner[tp] = winners[0]

    assignment: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for tp, member in owner.items():
        assignment[member].add(tp)

    # With identical subscriptions no member may keep more than ceil(P/M) partitions, nor more than
    # P % M members that many: trim the surplus (highest partitions first) before filling up.
    if members and all(set(subscriptions[m].topics) == set(subscriptions[members[0]].topics) for m in members):
        total = len(all_partitions)
        low, high = total // len(members), math.ceil(total / len(members))
        slots_at_high = total % len(members) if low != high else len(members)
        for member in sorted(members, key=lambda m: (-len(assignment[m]), rank[m])):
            keep = high if slots_at_high > 0 and len(assignment[member]) >= high else low
            if len(assignment[member]) >= high and slots_at_high > 0:
                slots_at_high -= 1
            for tp in sorted(assignment[member])[keep:]:
                assignment[member].discard(tp)

    assigned = {tp for parts in assignment.values() for tp in parts}
    unassigned = sorted((tp for tp in all_partitions if tp not in assigned), key=lambda tp: (len(eligible[tp]), tp))
    for tp in unassigned:
        if eligible[tp]:
            member = min(eligible[tp], key=lambda m: (len(assignment[m]), rank[m]))
            assignment[member].add(tp)

    # Balance: move from a member to an eligible one with at least two fewer partitions.
    moved = True
    while moved:
        moved = False
        for giver in sorted(members, key=lambda m: (-len(assignment[m]), rank[m])):
            for tp in sorted(assignment[giver], reverse=True):
                taker = min(eligible[tp], key=lambda m: (len(assignment[m]), rank[m]))
                if len(assignment[giver]) - len(assignment[taker]) > 1:
                    assignment[giver].discard(tp)
                    assignment[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
    return {m: sorted(assignment[m]) for m in members}, owner


class StickyAssignor:
    """Eager sticky: previous ownership comes from the user data each member sends (it owns nothing when it joins)."""

    name = "sticky"
    supports_cooperative = False

    def __init__(self) -> None:
        self._owned: list[TopicPartition] = []
        self._generation = -1

    def subscription_user_data(self, topics: Iterable[str]) -> bytes | None:
        return encode_sticky_user_data(self._owned, self._generation) if self._generation >= 0 else None

    def on_assignment(self, partitions: Iterable[TopicPartition], generation: int) -> None:
        self._owned = sorted(partitions)
        self._generation = generation

    @staticmethod
    def _previous(subscriptions: Mapping[str, Subscription]) -> dict[str, tuple[Sequence[TopicPartition], int]]:
        previous = {}
        for member, sub in subscriptions.items():
            if sub.owned_partitions:
                previous[member] = (sub.owned_partitions, sub.generation)
            else:
                previous[member] = decode_sticky_user_data(sub.user_data)
        return previous

    def assign(self, cluster_partitions: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        return sticky_assign(cluster_partitions, subscriptions, self._previous(subscriptions))[0]


class CooperativeStickyAssignor:
    """Sticky, minus partitions changing owner: those are revoked now and assigned in the next rebalance."""

    name = "cooperative-sticky"
    supports_cooperative = True

    def __init__(self) -> None:
        self._generation = -1

    def subscription_user_data(self, topics: Iterable[str]) -> bytes | None:
        # Kafka's CooperativeStickyAssignor user data: the generation, for subscriptions older than v2.
        return _I32.pack(self._generation)

    def on_assignment(self, partitions: Iterable[TopicPartition], generation: int) -> None:
        self._generation = generation

    def assign(self, cluster_partitions: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        previous = {}
        for member, sub in subscriptions.items():
            generation = sub.generation
            if generation < 0 and sub.user_data and len(sub.user_data) >= 4:
                generation = _I32.unpack_from(sub.user_data, 0)[0]
            previous[member] = (sub.owned_partitions, generation)
        assignment, owner = sticky_assign(cluster_partitions, subscriptions, previous)
        for member, partitions in assignment.items():
            assignment[member] = [tp for tp in partitions if owner.get(tp, member) == member]
        return assignment


def load_assignors(names: Iterable[str], pm: Any = None) -> list[Any]:
    """Fresh assignor objects for ``names`` (``partition.assignment.strategy``), from the ``register_assignors`` hook."""
    from josef.plugins import collect, get_plugin_manager

    registry = collect(pm or get_plugin_manager(), "register_assignors", "assignor")
    assignors = []
    for name in names:
        assignor = registry.get(name)()
        for attribute in ("name", "supports_cooperative", "assign"):
            if not hasattr(assignor, attribute):
                raise TypeError(f"assignor {name!r} ({assignor!r}) has no {attribute!r}")
        assignors.append(assignor)
    return assignors
