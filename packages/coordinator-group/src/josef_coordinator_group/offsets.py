"""Committed offsets of the groups of one ``__consumer_offsets`` partition, and when they expire.

The store is only changed by replaying records (after they are committed to
the partition), so what a client reads back is always what a restarted
coordinator would load.

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

from josef_coordinator_group.group import ClassicGroup
from josef_coordinator_group.records import OffsetKey, OffsetValue

TopicPartitionKey = tuple[str, int]


@attrs.frozen
class PendingOffset:
    """An offset a transaction committed, and where its record is (it wins only over older records)."""

    value: OffsetValue
    record_offset: int


@attrs.define
class OffsetStore:
    """group id -> (topic, partition) -> committed offset; and the offsets of open transactions."""

    by_group: dict[str, dict[TopicPartitionKey, OffsetValue]] = attrs.Factory(dict)
    #: The partition offset of each committed offset's record.
    record_offsets: dict[OffsetKey, int] = attrs.Factory(dict)
    #: producer id -> offsets committed in its open transaction.
    pending: dict[int, dict[OffsetKey, PendingOffset]] = attrs.Factory(dict)
    #: group id -> (topic, partition) -> producer ids with a pending offset there (Kafka's OpenTransactions).
    open_transactions: dict[str, dict[TopicPartitionKey, set[int]]] = attrs.Factory(dict)

    def replay(self, key: OffsetKey, value: OffsetValue | None, record_offset: int) -> None:
        """A plain commit, or a tombstone (which also drops what open transactions hold for the partition)."""
        tp = (key.topic, key.partition)
        if value is not None:
            self.by_group.setdefault(key.group, {})[tp] = value
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
                self.pending[producer_id].pop(key, None)
            if not by_partition:
                del self.open_transactions[key.group]

    def replay_transactional(self, producer_id: int, key: OffsetKey, value: OffsetValue, record_offset: int) -> None:
        self.pending.setdefault(producer_id, {})[key] = PendingOffset(value, record_offset)
        self.open_transactions.setdefault(key.group, {}).setdefault((key.topic, key.partition), set()).add(producer_id)

    def end_transaction(self, producer_id: int, committed: bool) -> None:
        """The marker of ``producer_id``'s transaction: its pending offsets become committed, or are dropped."""
        pending = self.pending.pop(producer_id, {})
        for key in pending:
            by_partition = self.open_transactions.get(key.group, {})
            producers = by_partition.get((key.topic, key.partition), set())
            producers.discard(producer_id)
            if not producers:
                by_partition.pop((key.topic, key.partition), None)
                if not by_partition:
                    self.open_transactions.pop(key.group, None)
        if not committed:
            return
        for key, offset in pending.items():
            if offset.record_offset > self.record_offsets.get(key, -1):
                self.replay(key, offset.value, offset.record_offset)

    def get(self, group: str, topic: str, partition: int) -> OffsetValue | None:
        return self.by_group.get(group, {}).get((topic, partition))

    def of_group(self, group: str) -> dict[TopicPartitionKey, OffsetValue]:
        return self.by_group.get(group, {})

    def has_offsets(self, group: str) -> bool:
        return bool(self.by_group.get(group))

    def groups(self) -> Iterator[str]:
        return iter(list(self.by_group))

    def has_pending(self, group: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset of this partition (OffsetFetch's UNSTABLE_OFFSET_COMMIT)."""
        return (topic, partition) in self.open_transactions.get(group, {})

    def has_open_transactions(self, group: str) -> bool:
        return group in self.open_transactions

    def all_partitions(self, group: str) -> list[TopicPartitionKey]:
        """Partitions with a committed or a pending offset: what deleting the group must tombstone."""
        committed = list(self.of_group(group))
        known = set(committed)
        return committed + [tp for tp in self.open_transactions.get(group, {}) if tp not in known]


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
