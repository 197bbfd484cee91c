"""Committed offsets of the groups of one ``__consumer_offsets`` partition, and when they expire.

The store is only changed by replaying records (after they are committed to
the partition), so what a client reads back is always what a restarted
coordinator would load.
"""

from __future__ import annotations

from typing import Iterator

import attrs

from josef_coordinator_group.group import ClassicGroup
from josef_coordinator_group.records import OffsetKey, OffsetValue

TopicPartitionKey = tuple[str, int]


@attrs.define
class OffsetStore:
    """group id -> (topic, partition) -> committed offset."""

    by_group: dict[str, dict[TopicPartitionKey, OffsetValue]] = attrs.Factory(dict)

    def replay(self, key: OffsetKey, value: OffsetValue | None) -> None:
        if value is None:
            offsets = self.by_group.get(key.group)
            if offsets is not None:
                offsets.pop((key.topic, key.partition), None)
                if not offsets:
                    del self.by_group[key.group]
        else:
            self.by_group.setdefault(key.group, {})[(key.topic, key.partition)] = value

    def get(self, group: str, topic: str, partition: int) -> OffsetValue | None:
        return self.by_group.get(group, {}).get((topic, partition))

    def of_group(self, group: str) -> dict[TopicPartitionKey, OffsetValue]:
        return self.by_group.get(group, {})

    def has_offsets(self, group: str) -> bool:
        return bool(self.by_group.get(group))

    def groups(self) -> Iterator[str]:
        return iter(list(self.by_group))


def expired_offsets(group: ClassicGroup | None, offsets: dict[TopicPartitionKey, OffsetValue], now_ms: int,
                    retention_ms: int) -> list[TopicPartitionKey]:
    """Offsets of ``group`` that retention removes now (Kafka's OffsetExpirationCondition).

    An offset committed with its own retention (OffsetCommit v2-v4) expires at
    that time. Otherwise it expires ``offsets.retention.minutes`` after: the
    group became empty (a group that had members); its commit (a simple group,
    or a stable consumer group's offsets of topics no member subscribes to).
    Offsets of a group that is rebalancing, or of subscribed topics, are kept.
    """
    base = "commit" if group is None else group.offset_expiry_base()
    if base is None:
        return []
    expired = []
    for (topic, partition), value in offsets.items():
        if group is not None and group.is_subscribed_to(topic):
            continue
        if value.expire_timestamp >= 0:
            if now_ms >= value.expire_timestamp:
                expired.append((topic, partition))
            continue
        since = group.state_timestamp_ms if base == "state" and group is not None else value.commit_timestamp
        if now_ms - since >= retention_ms:
            expired.append((topic, partition))
    return expired
