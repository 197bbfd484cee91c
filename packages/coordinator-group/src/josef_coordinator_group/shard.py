"""The state of one ``__consumer_offsets`` partition: its groups and their offsets, rebuilt by replay.

This is the :class:`josef.coordinator.runtime.CoordinatorShard` of the group
coordinator, on the runtime's timeline model (``timeline = True``): every
record is replayed as soon as it is written, before it is committed, into
timeline types (:mod:`josef.coordinator.timeline`), so a write whose append
fails is rolled back exactly and reads (OffsetFetch, DescribeGroups,
ListGroups, ConsumerGroupDescribe) see the state at the committed offset
(:attr:`GroupShard.committed`), as Kafka's GroupCoordinatorShard does.

What the records build is timeline state: the offsets (committed and those
of open transactions, :mod:`josef_coordinator_group.offsets`), which groups
exist (:attr:`GroupShard.groups`, :attr:`GroupShard.consumer_groups`) and
each KIP-848 consumer group's state (a group is copied, changed and put back
whole by each heartbeat, so the version a snapshot holds never changes).
A classic group's members and generation are Kafka's *soft* state instead:
they change in memory as requests and timers drive the state machine, and a
GroupMetadata record is written at the end of every rebalance (and when the
group is created, becomes empty or is deleted) so that a restarted
coordinator resumes from the last generation. Those records are applied
only while loading (a tombstone always: it removes the group); afterwards the
in-memory group is already ahead of them. Waiters parked on a classic group
(JoinGroup, SyncGroup) and timers are never replayed; an unload answers them.

Every operation runs with the shard's lock held (handlers and timers alike),
except while a write waits for replication
(:meth:`josef.coordinator.runtime.ShardContext.wait` releases it), so the
state machine sees one event at a time, like Kafka's single-threaded
coordinator shards, and code after a write looks at the state again.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import Any, Awaitable, Callable

from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import PendingWrite, Records, ShardContext
from josef.coordinator.timeline import TimelineDict
from josef_coordinator_group.configs import GroupSettings
from josef_coordinator_group.consumer_group import ConsumerGroup, ConsumerMember
from josef_coordinator_group.consumer_membership import ConsumerMembership
from josef_coordinator_group.share_group import ShareGroup, ShareMember
from josef_coordinator_group.share_membership import ShareMembership
from josef_coordinator_group.group import ClassicGroup, JoinResult, SyncResult
from josef_coordinator_group.membership import Membership
from josef_coordinator_group.offsets import OffsetStore, expired_offsets
from josef_coordinator_group.records import (
    CONSUMER_CURRENT_ASSIGNMENT,
    CONSUMER_GROUP_METADATA,
    CONSUMER_MEMBER_METADATA,
    CONSUMER_TARGET_MEMBER,
    CONSUMER_TARGET_METADATA,
    SHARE_CURRENT_ASSIGNMENT,
    SHARE_GROUP_METADATA,
    SHARE_MEMBER_METADATA,
    SHARE_STATE_PARTITIONS,
    SHARE_TARGET_MEMBER,
    SHARE_TARGET_METADATA,
    ConsumerKey,
    GroupKey,
    OffsetKey,
    RecordFormatError,
    decode_consumer_member,
    decode_current_assignment,
    decode_epoch,
    decode_group,
    decode_key,
    decode_offset,
    decode_share_assignment,
    decode_share_member,
    decode_share_state_partitions,
    decode_target_member,
    encode_key,
)

log = logging.getLogger(__name__)

SHARE_KEY_VERSIONS = frozenset((SHARE_MEMBER_METADATA, SHARE_GROUP_METADATA, SHARE_TARGET_METADATA,
                                SHARE_TARGET_MEMBER, SHARE_CURRENT_ASSIGNMENT, SHARE_STATE_PARTITIONS))
EXPIRE_OFFSETS_TIMER = "expire-offsets"
#: Whether the current request is answered by its own outcome: it appended records (its write answers it) or
#: was refused (Kafka's operation throws); otherwise its answer waits for what it read to be committed.
ANSWERED: contextvars.ContextVar[bool] = contextvars.ContextVar("josef_group_answered", default=False)


class GroupShard:
    """Groups and offsets of one partition, with timers that only fire while their key is still wanted."""

    #: Records are replayed as written into timeline state (plugin API 1.2).
    timeline = True

    def __init__(self, context: ShardContext, settings: Callable[[], GroupSettings]) -> None:
        self.context = context
        self._settings = settings
        registry = context.snapshots
        #: Classic (and simple) groups by id.
        self.groups: TimelineDict[str, ClassicGroup] = TimelineDict(registry)
        self.offsets = OffsetStore(registry)
        self.loading = True
        self.membership: Membership = Membership(self)
        self._timer_tokens: dict[Any, object] = {}
        #: KIP-848 consumer groups (a group id is either here or in ``groups``).
        self.consumer_groups: TimelineDict[str, ConsumerGroup] = TimelineDict(registry)
        self.consumer_membership = ConsumerMembership(self)
        #: KIP-932 share groups (a group id is in one of the three maps).
        self.share_groups: TimelineDict[str, ShareGroup] = TimelineDict(registry)
        self.share_membership = ShareMembership(self)
        #: The server-side assignors by name (the coordinator sets them from the ``register_assignors`` hook).
        self.server_assignors: Callable[[], dict[str, Any]] = _builtin_assignors

    def settings(self) -> GroupSettings:
        return self._settings()

    @property
    def active(self) -> bool:
        return bool(self.context.active)

    @property
    def committed(self) -> int:
        """The snapshot epoch reads see: everything below it is committed."""
        return self.context.committed_offset

    # CoordinatorShard -------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetKey):
                offset_value = decode_offset(value) if value is not None else None
                self.offsets.replay(decoded, offset_value, offset)
                if offset_value is not None:
                    self._ensure_group(decoded.group)
            elif isinstance(decoded, ConsumerKey):
                if self.loading:
                    if decoded.version in SHARE_KEY_VERSIONS:
                        self._replay_share(decoded, value)
                    else:
                        self._replay_consumer(decoded, value)
            elif isinstance(decoded, GroupKey):
                if value is None:
                    self.groups.pop(decoded.group, None)
                elif self.loading:
                    self.groups[decoded.group] = ClassicGroup.from_value(decoded.group, decode_group(value), clock.now_ms())
        except RecordFormatError as exc:
            log.warning("skipping unreadable record at %s offset %d: %s", self.context.tp, offset, exc)

    def replay_transactional(self, producer_id: int, producer_epoch: int, key: bytes, value: bytes | None,
                             offset: int) -> None:
        """A record of ``producer_id``'s open transaction (TxnOffsetCommit): its offset stays pending until the marker.

        Like Kafka, the group is created (a simple one) as soon as the record
        is replayed, and anything but an offset commit applies at once.
        """
        try:
            decoded = decode_key(key)
            if not isinstance(decoded, OffsetKey) or value is None:
                self.replay(key, value, offset)
                return
            self.offsets.replay_transactional(producer_id, decoded, decode_offset(value), offset)
            self._ensure_group(decoded.group)
        except RecordFormatError as exc:
            log.warning("skipping unreadable record at %s offset %d: %s", self.context.tp, offset, exc)

    def replay_end_transaction(self, producer_id: int, committed: bool, offset: int) -> None:
        """The transaction's marker is committed: its offsets become visible, or are discarded when it aborted."""
        self.offsets.end_transaction(producer_id, committed)

    def _ensure_group(self, group_id: str) -> None:
        """Offsets without group metadata belong to a "simple" group (manual commits)."""
        if group_id not in self.groups and group_id not in self.consumer_groups and group_id not in self.share_groups:
            self.groups[group_id] = ClassicGroup(group_id, clock.now_ms())

    def _replay_consumer(self, key: ConsumerKey, value: bytes | None) -> None:
        """Rebuild a consumer group from its records (applied while loading; afterwards memory leads)."""
        group = self.consumer_groups.get(key.group)
        if value is None:
            if group is None:
                return
            if key.version == CONSUMER_GROUP_METADATA:
                del self.consumer_groups[key.group]
            elif key.version == CONSUMER_MEMBER_METADATA and key.member is not None:
                group.members.pop(key.member, None)
            elif key.version == CONSUMER_TARGET_MEMBER and key.member is not None:
                group.target.pop(key.member, None)
            return
        if group is None:
            group = self.consumer_groups[key.group] = ConsumerGroup(key.group)
            self.groups.pop(key.group, None)
        member = None
        if key.member is not None and key.version in (CONSUMER_MEMBER_METADATA, CONSUMER_CURRENT_ASSIGNMENT):
            member = group.members.get(key.member)
            if member is None:
                member = group.members[key.member] = ConsumerMember(key.member)
        if key.version == CONSUMER_GROUP_METADATA:
            group.group_epoch = decode_epoch(value)
        elif key.version == CONSUMER_TARGET_METADATA:
            group.assignment_epoch = decode_epoch(value)
        elif key.version == CONSUMER_TARGET_MEMBER and key.member is not None:
            group.target[key.member] = decode_target_member(value)
        elif key.version == CONSUMER_MEMBER_METADATA and member is not None:
            member.apply_metadata(decode_consumer_member(value))
        elif key.version == CONSUMER_CURRENT_ASSIGNMENT and member is not None:
            member.apply_assignment(decode_current_assignment(value))

    def _replay_share(self, key: ConsumerKey, value: bytes | None) -> None:
        """Rebuild a share group from its records (applied while loading; afterwards memory leads)."""
        group = self.share_groups.get(key.group)
        if value is None:
            if group is None:
                return
            if key.version == SHARE_GROUP_METADATA:
                del self.share_groups[key.group]
            elif key.version == SHARE_MEMBER_METADATA and key.member is not None:
                group.members.pop(key.member, None)
            elif key.version == SHARE_TARGET_MEMBER and key.member is not None:
                group.target.pop(key.member, None)
            return
        if group is None:
            group = self.share_groups[key.group] = ShareGroup(key.group)
            self.groups.pop(key.group, None)
        member = None
        if key.member is not None and key.version in (SHARE_MEMBER_METADATA, SHARE_CURRENT_ASSIGNMENT):
            member = group.members.get(key.member)
            if member is None:
                member = group.members[key.member] = ShareMember(key.member)
        if key.version == SHARE_GROUP_METADATA:
            group.group_epoch = decode_epoch(value)
        elif key.version == SHARE_TARGET_METADATA:
            group.assignment_epoch = decode_epoch(value)
        elif key.version == SHARE_TARGET_MEMBER and key.member is not None:
            group.target[key.member] = decode_target_member(value)
        elif key.version == SHARE_MEMBER_METADATA and member is not None:
            member.apply_metadata(decode_share_member(value))
        elif key.version == SHARE_CURRENT_ASSIGNMENT and member is not None:
            member.apply_assignment(decode_share_assignment(value))
        elif key.version == SHARE_STATE_PARTITIONS:
            group.initialized = dict(decode_share_state_partitions(value).initialized)

    def loaded(self) -> None:
        """Resume what the loaded groups need: session timers of their members, the size limit, offset expiry."""
        self.loading = False
        settings = self.settings()
        for group in self.groups.values():
            for member in group.members.values():
                self.membership.schedule_heartbeat(group, member.member_id, member.session_timeout_ms)
            if len(group.members) > settings.max_size:
                group_id = group.group_id
                self.schedule(("max-size", group_id), 0, functools.partial(self.membership.shrink_oversized, group_id))
        for consumer_group in self.consumer_groups.values():
            for member_id in consumer_group.members:
                self.consumer_membership.schedule_session(consumer_group, member_id)
        for share_group in self.share_groups.values():
            for member_id in share_group.members:
                self.share_membership.schedule_session(share_group, member_id)
        self.schedule_offset_expiry(settings.retention_check_interval_ms)

    def unloaded(self) -> None:
        """The partition moved (or the broker stops): answer parked requests so clients look for the new coordinator."""
        self._timer_tokens.clear()
        for group in list(self.groups.values()):
            self.abandon(group, ErrorCode.not_coordinator)

    def abandon(self, group: ClassicGroup, error: ErrorCode) -> None:
        """Answer the requests parked on ``group`` with ``error``: it is gone (unloaded, or its creation rolled back)."""
        for member in list(group.members.values()):
            group.complete_join(member, JoinResult.failed(error, member.member_id))
            group.complete_sync(member, SyncResult(error))

    # Writes and timers ---------------------------------------------------------------------

    def append(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
               verification: object | None = None, atomic: bool = True) -> PendingWrite:
        """Apply and append ``records`` (see :meth:`josef.coordinator.runtime.ShardContext.append`); lock held."""
        ANSWERED.set(True)
        return self.context.append(records, producer_id=producer_id, producer_epoch=producer_epoch,
                                   verification=verification, atomic=atomic)

    @staticmethod
    def refused() -> None:
        """The current request is refused: it is answered at once, as a Kafka operation that throws."""
        ANSWERED.set(True)

    async def write(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
                    verification: object | None = None, atomic: bool = True) -> None:
        """Apply and append ``records``, then wait for their commit within ``offsets.commit.timeout.ms``.

        The lock is released while the write waits: what was read before
        it may have changed when it returns. Failures carry the error
        clients expect (Kafka's normalisation of append errors); a write
        that times out is answered COORDINATOR_NOT_AVAILABLE, its records
        stay applied and take effect for readers when they commit.
        """
        if not records:
            return
        pending = self.append(records, producer_id=producer_id, producer_epoch=producer_epoch,
                              verification=verification, atomic=atomic)
        await self.wait(pending)

    async def wait(self, pending: PendingWrite) -> None:
        """Wait for ``pending`` within ``offsets.commit.timeout.ms``, the lock released meanwhile."""
        await self.context.wait(pending, self.settings().commit_timeout_ms / 1000)

    def schedule(self, key: Any, delay_ms: int, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` under the lock after ``delay_ms``, unless the key is rescheduled or cancelled first.

        The token check matters for a timer that has already woken and waits
        for the lock while a request cancels it: it must then do nothing.
        """
        if not self.active:
            return
        token = object()
        self._timer_tokens[key] = token

        async def run() -> None:
            async with self.context.lock:
                if self._timer_tokens.get(key) is not token or not self.active:
                    return
                del self._timer_tokens[key]
                await callback()

        self.context.schedule(key, max(delay_ms, 0) / 1000, run)

    def cancel(self, key: Any) -> None:
        self._timer_tokens.pop(key, None)
        self.context.cancel(key)

    # Offset retention -----------------------------------------------------------------------

    def schedule_offset_expiry(self, interval_ms: int) -> None:
        async def expire() -> None:
            await self.expire_offsets()

        self.schedule(EXPIRE_OFFSETS_TIMER, interval_ms, expire)

    async def expire_offsets(self) -> int:
        """Write tombstones for expired offsets, and for empty groups left without offsets; returns how many records.

        One write for the whole shard (split into batches if it must be),
        waiting for replication once rather than once per group.
        """
        settings = self.settings()
        now = clock.now_ms()
        records: list[tuple[bytes, bytes | None]] = []
        deleted: list[ClassicGroup] = []
        expired_count = 0
        try:
            for group_id in list(self.groups) + [g for g in self.offsets.groups() if g not in self.groups]:
                consumer_group = self.consumer_groups.get(group_id)
                if consumer_group is not None and consumer_group.members:
                    continue  # offsets of a consumer group with members are kept (KIP-848 groups)
                group = self.groups.get(group_id)
                offsets = self.offsets.of_group(group_id)
                # An offset an open transaction is about to replace is kept until its marker, and so is the group.
                expired = [tp for tp in expired_offsets(group, offsets, now, settings.offsets_retention_ms)
                           if not self.offsets.has_pending(group_id, *tp)]
                records += [(encode_key(OffsetKey(group_id, topic, partition)), None) for topic, partition in expired]
                expired_count += len(expired)
                if (group is not None and group.is_empty and len(expired) == len(offsets) and not group.pending_members
                        and not self.offsets.has_open_transactions(group_id)):
                    records.append((encode_key(GroupKey(group_id)), None))
                    deleted.append(group)
            await self.write(records, atomic=False)
            for group in deleted:
                if self.groups.get(group.group_id) is not group:  # its tombstone took it out; no rollback put it back
                    self.membership.forget(group, now)
            if records:
                log.info("%s: %d offsets expired, %d empty groups deleted", self.context.tp, expired_count,
                         len(deleted))
        finally:
            self.schedule_offset_expiry(settings.retention_check_interval_ms)
        return len(records)

def _builtin_assignors() -> dict[str, Any]:
    from josef_coordinator_group.server_assignors import BUILTIN

    return {cls.name: cls() for cls in BUILTIN}
