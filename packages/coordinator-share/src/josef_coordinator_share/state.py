"""What the share coordinator keeps of one share partition, and how writes combine with it.

A share partition's durable state is its start offset (SPSO: every record
below it is done with) and, above it, the *state batches* of its in-flight
window: offset ranges with a delivery state (0 AVAILABLE, 2 ACKNOWLEDGED,
4 ARCHIVED; ACQUIRED is never persisted, a lock does not survive its leader)
and a delivery count. Offsets above the start with no batch are AVAILABLE,
never delivered. Each write names only the ranges it changed; they are laid
over what is known (Kafka's PersisterStateBatchCombiner): the newer range
wins where two overlap, ranges below the start offset are dropped, and
neighbours with the same state and count are joined, so the state stays as
small as the window's distinct runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import attrs

from josef.metadata.records import uuid_to_text

AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
#: The delivery states a batch may be persisted in.
PERSISTED_STATES = frozenset((AVAILABLE, ACKNOWLEDGED, ARCHIVED))
#: A start offset, state or leader epoch that a request leaves as it is (Kafka's -1).
UNCHANGED = -1
#: ReadShareGroupState's start offset for a share partition with no state yet: the reader initializes it.
UNINITIALIZED_START_OFFSET = -1
DEFAULT_STATE_EPOCH = 0


@attrs.frozen
class ShareKey:
    """One share partition: Kafka's SharePartitionKey, ``groupId:topicId:partition`` as a coordinator key."""

    group_id: str
    topic_id: uuid.UUID
    partition: int

    @property
    def coordinator_key(self) -> str:
        """The string whose hash picks the ``__share_group_state`` partition (FindCoordinator's key of type 2)."""
        return f"{self.group_id}:{uuid_to_text(self.topic_id)}:{self.partition}"


@attrs.frozen
class StateBatch:
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


@attrs.frozen
class ShareState:
    """A share partition's state as its last snapshot and the updates after it left it."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...] = ()

    def updated(self, leader_epoch: int, start_offset: int, batches: Iterable[StateBatch]) -> ShareState:
        """This state with one write's changes laid over it (-1 for what the write leaves as it is)."""
        start = self.start_offset if start_offset == UNCHANGED else start_offset
        return attrs.evolve(
            self, leader_epoch=self.leader_epoch if leader_epoch == UNCHANGED else leader_epoch, start_offset=start,
            batches=combine(self.batches, batches, start))


def combine(current: Iterable[StateBatch], new: Iterable[StateBatch], start_offset: int) -> tuple[StateBatch, ...]:
    """``new`` laid over ``current`` (a later range wins over an earlier one), from ``start_offset`` on, joined."""
    batches = sorted(current, key=lambda b: b.first_offset)
    for batch in new:
        batches = _overlay(batches, batch)
    kept = [b if b.first_offset >= start_offset else attrs.evolve(b, first_offset=start_offset)
            for b in batches if b.last_offset >= start_offset]
    joined: list[StateBatch] = []
    for batch in kept:
        last = joined[-1] if joined else None
        if (last is not None and last.last_offset + 1 == batch.first_offset
                and (last.delivery_state, last.delivery_count) == (batch.delivery_state, batch.delivery_count)):
            joined[-1] = attrs.evolve(last, last_offset=batch.last_offset)
        else:
            joined.append(batch)
    return tuple(joined)


def _overlay(batches: list[StateBatch], top: StateBatch) -> list[StateBatch]:
    """Sorted, disjoint ``batches`` with ``top`` over them: what it covers is cut out of the others."""
    out: list[StateBatch] = []
    for batch in batches:
        if batch.last_offset < top.first_offset or batch.first_offset > top.last_offset:
            out.append(batch)
            continue
        if batch.first_offset < top.first_offset:
            out.append(attrs.evolve(batch, last_offset=top.first_offset - 1))
        if batch.last_offset > top.last_offset:
            out.append(attrs.evolve(batch, first_offset=top.last_offset + 1))
    out.append(top)
    out.sort(key=lambda b: b.first_offset)
    return out
