"""Server-side partition assignors of the KIP-848 consumer group protocol (``uniform``, ``range``).

They are offered through the ``register_assignors`` hook under the names
``server:uniform`` and ``server:range`` (the core registers the client-side
``range``; the prefix keeps the two apart) and picked with the broker config
``group.consumer.assignors`` or a member's ``server_assignor``.

``assign(members, topics)`` takes each member's subscribed topic ids (and
its current target, for stickiness) and every subscribed topic's partition
count, and returns each member's target assignment ``{topic_id: {partitions}}``.
"""

from __future__ import annotations

from typing import Mapping

import attrs

Assignment = dict[str, set[int]]
SERVER_PREFIX = "server:"


@attrs.frozen
class MemberSpec:
    topics: frozenset[str]
    instance_id: str | None = None
    current: Mapping[str, frozenset[int]] = attrs.field(factory=dict)


def _order(members: Mapping[str, MemberSpec]) -> list[str]:
    return sorted(members, key=lambda m: (members[m].instance_id is None, members[m].instance_id or "", m))


class UniformAssignor:
    """Kafka's UniformAssignor: balanced (counts differ by at most one per topic set) and sticky."""

    name = "uniform"
    server_side = True

    def assign(self, members: Mapping[str, MemberSpec], topics: Mapping[str, int]) -> dict[str, Assignment]:
        result: dict[str, Assignment] = {m: {} for m in members}
        counts = {m: 0 for m in members}
        unassigned: list[tuple[str, int]] = []
        for topic in sorted(topics):
            if any(topic in spec.topics for spec in members.values()):
                unassigned += [(topic, p) for p in range(topics[topic])]
        # Quota per member: spread all partitions of the topics each subscribes to.
        eligible = {tp: [m for m in members if tp[0] in members[m].topics] for tp in unassigned}
        total = len(unassigned)
        n = max(len(members), 1)
        quota = {m: total // n + (1 if i < total % n else 0) for i, m in enumerate(_order(members))}
        # Sticky pass: keep current partitions up to the quota.
        free: list[tuple[str, int]] = []
        owner: dict[tuple[str, int], str] = {}
        for m in _order(members):
            for topic, parts in sorted(members[m].current.items()):
                for p in sorted(parts):
                    if (topic, p) in eligible and m in eligible[(topic, p)] and (topic, p) not in owner:
                        owner[(topic, p)] = m
        kept: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
        for tp, m in sorted(owner.items()):
            kept[m].append(tp)
        for m in _order(members):
            for tp in kept[m][quota[m]:]:
                del owner[tp]
        for tp in unassigned:
            if tp not in owner:
                free.append(tp)
            else:
                counts[owner[tp]] += 1
        for tp in free:
            candidates = eligible[tp]
            if not candidates:
                continue
            m = min(candidates, key=lambda c: (counts[c] - quota[c] >= 0, counts[c], _order(members).index(c)))
            owner[tp] = m
            counts[m] += 1
        for (topic, p), m in owner.items():
            result[m].setdefault(topic, set()).add(p)
        return result


class RangeAssignor:
    """Kafka's server-side RangeAssignor: per topic, consecutive ranges to its subscribers in order."""

    name = "range"
    server_side = True

    def assign(self, members: Mapping[str, MemberSpec], topics: Mapping[str, int]) -> dict[str, Assignment]:
        result: dict[str, Assignment] = {m: {} for m in members}
        for topic in sorted(topics):
            subscribers = [m for m in _order(members) if topic in members[m].topics]
            if not subscribers:
                continue
            count = topics[topic]
            per, extra = divmod(count, len(subscribers))
            start = 0
            for i, m in enumerate(subscribers):
                size = per + (1 if i < extra else 0)
                if size:
                    result[m][topic] = set(range(start, start + size))
                start += size
        return result


BUILTIN = (UniformAssignor, RangeAssignor)
