"""Committed offsets of the groups of one ``__consumer_offsets`` partition, and when they expire.

The store changes only by replaying records, as soon as they are written
(before they are committed): its maps are timeline types
(:mod:`josef.coordinator.timeline`), so a write whose append fails is rolled
back exactly, and OffsetFetch reads them ``at`` the shard's committed offset,
which is what a restarted coordinator would load.

Offsets committed inside a producer's transaction (TxnOffsetCommit) are
*pending* (Kafka's ``pendingTransactionalOffsets``): kept per producer id,
invisible to OffsetFetch, until the transaction's marker moves them to the
committed offsets (commit) or drops them (abort). A pending offset replaces a
committed one only if its record lies later in the partition: with plain and
transactional commits mixed, the record written last wins, as it must once
compaction has removed the older ones. A tombstone for a partition also
drops what open transactions hold for it, so a deleted offset does not come
back when a transaction commits.
"""

from __future__ import annotations

from typing import Iterator

import attrs

from josef.coordinator.timeline import SnapshotRegistry, TimelineDict
from josef_coordinator_group.group import ClassicGroup
from josef_coordinator_group.records import OffsetKey, OffsetValue

TopicPartitionKey = tuple[str, int]


@attrs.frozen
class PendingOffset:
    """An offset a transaction committed, and where its record is (it wins only over older records)."""

    value: OffsetValue
    record_offset: int


class OffsetStore:
    """group id -> (topic, partition) -> committed offset; and the offsets of open transactions.

    Reads take ``at``: the snapshot epoch to read at (the shard's committed offset); None reads the latest state.
    """

    def __init__(self, registry: SnapshotRegistry) -> None:
        self._registry = registry
        self.by_group: TimelineDict[str, TimelineDict[TopicPartitionKey, OffsetValue]] = TimelineDict(registry)
        #: The partition offset of each committed offset's record.
        self.record_offsets: TimelineDict[OffsetKey, int] = TimelineDict(registry)
        #: producer id -> offsets committed in its open transaction.
        self.pending: TimelineDict[int, TimelineDict[OffsetKey, PendingOffset]] = TimelineDict(registry)
        #: group id -> (topic, partition) -> producer ids with a pending offset there (Kafka's OpenTransactions).
        self.open_transactions: TimelineDict[str, TimelineDict[TopicPartitionKey, frozenset[int]]] = \
            TimelineDict(registry)

    def replay(self, key: OffsetKey, value: OffsetValue | None, record_offset: int) -> None:
        """A plain commit, or a tombstone (which also drops what open transactions hold for the partition)."""
        tp = (key.topic, key.partition)
        if value is not None:
            offsets = self.by_group.get(key.group)
            if offsets is None:
                offsets = self.by_group[key.group] = TimelineDict(self._registry)
            offsets[tp] = value
            self.record_offsets[key] = record_offset
            return
        offsets = self.by_group.get(key.group)
        if offsets is not None:
            offsets.pop(tp, None)
            if not offsets:
                del self.by_group[key.group]
        self.record_offsets.pop(key, None)
        by_partition = self.open_transactions.get(key.group)
        if by_partition is not None:
            for producer_id in by_partition.pop(tp, ()):
                pending = self.pending.get(producer_id)
                if pending is not None:
                    pending.pop(key, None)
            if not by_partition:
                del self.open_transactions[key.group]

    def replay_transactional(self, producer_id: int, key: OffsetKey, value: OffsetValue, record_offset: int) -> None:
        pending = self.pending.get(producer_id)
        if pending is None:
            pending = self.pending[producer_id] = TimelineDict(self._registry)
        pending[key] = PendingOffset(value, record_offset)
        by_partition = self.open_transactions.get(key.group)
        if by_partition is None:
            by_partition = self.open_transactions[key.group] = TimelineDict(self._registry)
        tp = (key.topic, key.partition)
        by_partition[tp] = by_partition.get(tp, frozenset()) | {producer_id}

    def end_transaction(self, producer_id: int, committed: bool) -> None:
        """The marker of ``producer_id``'s transaction: its pending offsets become committed, or are dropped."""
        pending = self.pending.pop(producer_id, None)
        offsets = list(pending.items()) if pending is not None else []
        for key, _ in offsets:
            by_partition = self.open_transactions.get(key.group)
            if by_partition is None:
                continue
            tp = (key.topic, key.partition)
            producers = by_partition.get(tp, frozenset()) - {producer_id}
            if producers:
                by_partition[tp] = producers
            else:
                by_partition.pop(tp, None)
                if not by_partition:
                    del self.open_transactions[key.group]
        if not committed:
            return
        for key, offset in offsets:
            if offset.record_offset > self.record_offsets.get(key, -1):
                self.replay(key, offset.value, offset.record_offset)

    def get(self, group: str, topic: str, partition: int, at: int | None = None) -> OffsetValue | None:
        offsets = self.by_group.get(group, at=at)
        return offsets.get((topic, partition), at=at) if offsets is not None else None

    def of_group(self, group: str, at: int | None = None) -> dict[TopicPartitionKey, OffsetValue]:
        offsets = self.by_group.get(group, at=at)
        return offsets.view(at) if offsets is not None else {}

    def has_offsets(self, group: str, at: int | None = None) -> bool:
        return bool(self.of_group(group, at))

    def groups(self, at: int | None = None) -> Iterator[str]:
        return iter(list(self.by_group.keys(at)))

    def has_pending(self, group: str, topic: str, partition: int, at: int | None = None) -> bool:
        """An open transaction holds an offset of this partition (OffsetFetch's UNSTABLE_OFFSET_COMMIT)."""
        by_partition = self.open_transactions.get(group, at=at)
        return by_partition is not None and by_partition.contains((topic, partition), at)

    def has_open_transactions(self, group: str) -> bool:
        return group in self.open_transactions

    def all_partitions(self, group: str) -> list[TopicPartitionKey]:
        """Partitions with a committed or a pending offset: what deleting the group must tombstone."""
        committed = list(self.of_group(group))
        known = set(committed)
        open_ = self.open_transactions.get(group)
        return committed + [tp for tp in (open_ or ()) if tp not in known]


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
