"""The state of one ``__share_group_state`` partition: the share partitions it keeps, rebuilt by replay.

This is the :class:`josef.coordinator.runtime.CoordinatorShard` of the share
coordinator (Kafka's ShareCoordinatorShard). Its state lives in timeline
types: a write is applied when appended, rolled back if its append fails,
and reads are made at the committed offset.

Fencing is by two epochs, as in Kafka. The *leader epoch* is the share
partition's leader epoch of the user partition: a read or write from an
older leader (a broker that lost leadership and does not know it yet) is
answered FENCED_LEADER_EPOCH, and a read from a newer one records the new
epoch so that the old leader's writes fail from then on. The *state epoch*
rises when the state is initialized again (AlterShareGroupOffsets, a reset):
a write made against the older state is answered FENCED_STATE_EPOCH.

``__share_group_state`` is not compacted (every ShareUpdate of a share
partition has the same key, so compaction would keep only the last one):
each share partition's latest snapshot is the oldest record it needs, and
the shard prunes the partition (DeleteRecords) below the oldest of those
every ``share.coordinator.state.topic.prune.interval.ms``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, ShardContext
from josef.coordinator.timeline import TimelineDict
from josef_coordinator_share.configs import ShareSettings
from josef_coordinator_share.records import (SNAPSHOT_KEY_VERSION, UPDATE_KEY_VERSION, RecordFormatError, decode_key,
                                             encode_key, encode_snapshot, encode_update, state_batches, value_entity)
from josef_coordinator_share.state import UNCHANGED, ShareKey, ShareState, StateBatch, combine

if TYPE_CHECKING:
    from josef_coordinator_share.coordinator import ShareCoordinator

log = logging.getLogger(__name__)

PRUNE_TIMER = "prune"


class ShareStateError(Exception):
    """A request about one share partition refused with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ShareStateShard:
    """The share partitions of one ``__share_group_state`` partition."""

    #: Plugin API 1.2: the state below is in timeline types registered with the context's snapshots.
    timeline = True

    def __init__(self, context: ShardContext, coordinator: ShareCoordinator) -> None:
        self.context = context
        self.coordinator = coordinator
        snapshots = context.snapshots
        self.states: TimelineDict[ShareKey, ShareState] = TimelineDict(snapshots)
        #: ShareUpdate records written since each share partition's last snapshot.
        self.updates: TimelineDict[ShareKey, int] = TimelineDict(snapshots)
        #: The offset of each share partition's last snapshot: the oldest record it needs.
        self.snapshot_offsets: TimelineDict[ShareKey, int] = TimelineDict(snapshots)
        #: The log start offset the last pruning left (-1: not pruned yet), Kafka's last-pruned-offset.
        self.last_pruned_offset = -1

    @property
    def active(self) -> bool:
        return bool(self.context.active)

    def settings(self) -> ShareSettings:
        return self.coordinator.settings()

    # CoordinatorShard ---------------------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        try:
            decoded = decode_key(key)
            if decoded is None:
                return  # a record type of a later version: not josef's to interpret
            record_type, share_key = decoded
            if value is None:
                self.states.pop(share_key, None)
                self.updates.pop(share_key, None)
                self.snapshot_offsets.pop(share_key, None)
                return
            _, entity = value_entity(record_type, value)
        except RecordFormatError:
            log.exception("%s: skipping an unreadable record at offset %d", self.context.tp, offset)
            return
        if record_type == SNAPSHOT_KEY_VERSION:
            self.states[share_key] = ShareState(int(entity.snapshot_epoch), int(entity.state_epoch),
                                                int(entity.leader_epoch), int(entity.start_offset),
                                                state_batches(entity))
            self.updates[share_key] = 0
            self.snapshot_offsets[share_key] = offset
        elif record_type == UPDATE_KEY_VERSION:
            current = self.states.get(share_key)
            batches = state_batches(entity)
            if current is None:  # its snapshot was lost: what the update says is all there is (as Kafka does)
                start = int(entity.start_offset)
                self.states[share_key] = ShareState(int(entity.snapshot_epoch), 0, int(entity.leader_epoch), start,
                                                    combine((), batches, start))
                self.snapshot_offsets[share_key] = offset
            else:
                self.states[share_key] = current.updated(int(entity.leader_epoch), int(entity.start_offset), batches)
            self.updates[share_key] = self.updates.get(share_key, 0) + 1

    def loaded(self) -> None:
        self.schedule_prune()

    # Operations (called with the shard's lock held) -----------------------------------------------------------

    def state(self, key: ShareKey) -> ShareState | None:
        """The committed state of ``key``."""
        return self.states.get(key, at=self.context.committed_offset)

    async def initialize(self, key: ShareKey, state_epoch: int, start_offset: int) -> None:
        """InitializeShareGroupState: a new state epoch and start offset, no batches (a snapshot)."""
        current = self.states.get(key)
        if current is not None and state_epoch < current.state_epoch:
            raise ShareStateError(ErrorCode.fenced_state_epoch,
                                  f"state epoch {state_epoch} is older than {current.state_epoch}")
        snapshot_epoch = current.snapshot_epoch + 1 if current is not None else 0
        await self._write([(encode_key(key, SNAPSHOT_KEY_VERSION),
                            encode_snapshot(ShareState(snapshot_epoch, state_epoch, UNCHANGED, start_offset)))])

    async def read(self, key: ShareKey, leader_epoch: int) -> ShareState | None:
        """ReadShareGroupState: the state (None: never initialized), recording a newer leader epoch first."""
        current = self.states.get(key)
        if current is None:
            return None
        if leader_epoch != UNCHANGED and leader_epoch < current.leader_epoch:
            raise ShareStateError(ErrorCode.fenced_leader_epoch,
                                  f"leader epoch {leader_epoch} is older than {current.leader_epoch}")
        if leader_epoch > current.leader_epoch:
            await self._write([self._state_record(key, current, leader_epoch, UNCHANGED, ())])
        else:
            await self.context.wait(self.context.barrier(), self._timeout_s())
        return self.states.get(key)

    async def write(self, key: ShareKey, state_epoch: int, leader_epoch: int, start_offset: int,
                    batches: tuple[StateBatch, ...]) -> None:
        """WriteShareGroupState: one share partition's changes, as a ShareUpdate or (every N) a ShareSnapshot."""
        started = time.monotonic()
        await self._write_state(key, state_epoch, leader_epoch, start_offset, batches)
        self.coordinator.counters.state_written((time.monotonic() - started) * 1000)

    async def _write_state(self, key: ShareKey, state_epoch: int, leader_epoch: int, start_offset: int,
                           batches: tuple[StateBatch, ...]) -> None:
        current = self.states.get(key)
        if current is None:
            state = ShareState(0, max(state_epoch, 0), leader_epoch, start_offset, combine((), batches, start_offset))
            await self._write([(encode_key(key, SNAPSHOT_KEY_VERSION), encode_snapshot(state))])
            return
        if leader_epoch != UNCHANGED and leader_epoch < current.leader_epoch:
            raise ShareStateError(ErrorCode.fenced_leader_epoch,
                                  f"leader epoch {leader_epoch} is older than {current.leader_epoch}")
        if state_epoch != UNCHANGED and state_epoch < current.state_epoch:
            raise ShareStateError(ErrorCode.fenced_state_epoch,
                                  f"state epoch {state_epoch} is older than {current.state_epoch}")
        newer_state = state_epoch > current.state_epoch  # only a snapshot carries a state epoch
        current = attrs.evolve(current, state_epoch=max(state_epoch, current.state_epoch))
        await self._write([self._state_record(key, current, leader_epoch, start_offset, batches,
                                              snapshot=newer_state)])

    async def delete(self, key: ShareKey) -> None:
        """DeleteShareGroupState: tombstones under both keys (an update left alone would bring the state back)."""
        if self.states.get(key) is None:
            return
        await self._write([(encode_key(key, SNAPSHOT_KEY_VERSION), None), (encode_key(key, UPDATE_KEY_VERSION), None)])

    def _state_record(self, key: ShareKey, current: ShareState, leader_epoch: int, start_offset: int,
                      batches: tuple[StateBatch, ...], *, snapshot: bool = False) -> tuple[bytes, bytes]:
        """A ShareUpdate of the change, or a whole ShareSnapshot once enough updates followed the last one."""
        if snapshot or self.updates.get(key, 0) >= self.settings().updates_per_snapshot:
            state = current.updated(leader_epoch, start_offset, batches)
            return encode_key(key, SNAPSHOT_KEY_VERSION), encode_snapshot(
                ShareState(current.snapshot_epoch + 1, state.state_epoch, state.leader_epoch, state.start_offset,
                           state.batches))
        start = current.start_offset if start_offset == UNCHANGED else start_offset
        return encode_key(key, UPDATE_KEY_VERSION), encode_update(
            current.snapshot_epoch, current.leader_epoch if leader_epoch == UNCHANGED else leader_epoch,
            start_offset, combine((), batches, start))

    async def _write(self, records: list[tuple[bytes, bytes | None]]) -> None:
        await self.context.wait(self.context.append(records), self._timeout_s())

    def _timeout_s(self) -> float:
        return self.settings().write_timeout_ms / 1000

    # Pruning ------------------------------------------------------------------------------------------------

    def prune_offset(self) -> int:
        """The oldest offset a load still needs: the oldest committed snapshot of a share partition with state."""
        at = self.context.committed_offset
        return min(self.snapshot_offsets.values(at=at), default=at)

    def schedule_prune(self) -> None:
        async def prune() -> None:
            async with self.context.lock:
                if not self.active:
                    return
                offset = self.prune_offset()
            try:
                self.last_pruned_offset = self.context.delete_records_before(offset)
            except CoordinatorError as exc:
                log.warning("%s: pruning below offset %d failed: %s", self.context.tp, offset, exc.message)
            self.schedule_prune()

        self.context.schedule(PRUNE_TIMER, self.settings().prune_interval_ms / 1000, prune)

