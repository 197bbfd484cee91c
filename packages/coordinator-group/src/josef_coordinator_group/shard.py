"""The state of one ``__consumer_offsets`` partition: its groups and their offsets, rebuilt by replay.

This is the :class:`josef.coordinator.runtime.CoordinatorShard` of the group
coordinator. Offsets live only in what the partition holds: they change when
a committed record is replayed. Groups follow Kafka's classic-group rule
instead: their state changes in memory as requests and timers drive the state
machine, and a GroupMetadata record is written at the end of every rebalance
(and when the group becomes empty or is deleted) so a restarted coordinator
resumes from the last generation. Group records are therefore applied only
while loading; afterwards the in-memory group is already ahead of them.

Every operation runs with the shard's lock held (handlers and timers alike),
so the state machine sees one event at a time, like Kafka's single-threaded
coordinator shards.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable

import anyio
from josef.coordinator.runtime import CoordinatorError, Records, ShardContext
from kio.schema.errors import ErrorCode

from josef_coordinator_group import clock
from josef_coordinator_group.configs import GroupSettings
from josef_coordinator_group.group import ClassicGroup, JoinResult, SyncResult
from josef_coordinator_group.membership import Membership
from josef_coordinator_group.offsets import OffsetStore, expired_offsets
from josef_coordinator_group.records import (
    GroupKey,
    OffsetKey,
    RecordFormatError,
    decode_group,
    decode_key,
    decode_offset,
    encode_key,
)

log = logging.getLogger(__name__)

EXPIRE_OFFSETS_TIMER = "expire-offsets"


class GroupShard:
    """Groups and offsets of one partition, with timers that only fire while their key is still wanted."""

    def __init__(self, context: ShardContext, settings: Callable[[], GroupSettings]) -> None:
        self.context = context
        self._settings = settings
        self.groups: dict[str, ClassicGroup] = {}
        self.offsets = OffsetStore()
        self.loading = True
        self.membership: Membership = Membership(self)
        self._timer_tokens: dict[Any, object] = {}

    def settings(self) -> GroupSettings:
        return self._settings()

    @property
    def active(self) -> bool:
        return bool(self.context.active)

    # CoordinatorShard -------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetKey):
                offset_value = decode_offset(value) if value is not None else None
                self.offsets.replay(decoded, offset_value)
                if offset_value is not None and decoded.group not in self.groups:
                    # Offsets without group metadata belong to a "simple" group (manual commits).
                    self.groups[decoded.group] = ClassicGroup(decoded.group, clock.now_ms())
            elif isinstance(decoded, GroupKey) and self.loading:
                if value is None:
                    self.groups.pop(decoded.group, None)
                else:
                    self.groups[decoded.group] = ClassicGroup.from_value(decoded.group, decode_group(value), clock.now_ms())
        except RecordFormatError as exc:
            log.warning("skipping unreadable record at %s offset %d: %s", self.context.tp, offset, exc)

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
        self.schedule_offset_expiry(settings.retention_check_interval_ms)

    def unloaded(self) -> None:
        """The partition moved (or the broker stops): answer parked requests so clients look for the new coordinator."""
        self._timer_tokens.clear()
        for group in self.groups.values():
            for member in list(group.members.values()):
                group.complete_join(member, JoinResult.failed(ErrorCode.not_coordinator, member.member_id))
                group.complete_sync(member, SyncResult(ErrorCode.not_coordinator))
        self.groups.clear()

    # Writes and timers ---------------------------------------------------------------------

    async def write(self, records: Records) -> None:
        """Append and wait for commit (then replay), within ``offsets.commit.timeout.ms``.

        Failures carry the error clients expect (Kafka's normalisation of
        append errors). A write that times out fails the request with
        COORDINATOR_NOT_AVAILABLE; its records may still commit later and are
        then seen on the next load.
        """
        if not records:
            return
        if not self.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"{self.context.tp} is no longer coordinated here")
        timeout = self.settings().commit_timeout_ms / 1000
        try:
            with anyio.move_on_after(timeout) as scope:
                await self.context.write(records)
        except CoordinatorError as exc:
            raise CoordinatorError(write_error(exc.code), exc.message) from exc
        if scope.cancelled_caught:
            raise CoordinatorError(ErrorCode.coordinator_not_available,
                                   f"writing to {self.context.tp} took longer than {timeout}s")

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

        One write for the whole shard: the check holds the shard's lock, so it
        waits for replication once rather than once per group.
        """
        settings = self.settings()
        now = clock.now_ms()
        records: list[tuple[bytes, bytes | None]] = []
        deleted: list[ClassicGroup] = []
        expired_count = 0
        try:
            for group_id in list(self.groups) + [g for g in self.offsets.groups() if g not in self.groups]:
                group = self.groups.get(group_id)
                offsets = self.offsets.of_group(group_id)
                expired = expired_offsets(group, offsets, now, settings.offsets_retention_ms)
                records += [(encode_key(OffsetKey(group_id, topic, partition)), None) for topic, partition in expired]
                expired_count += len(expired)
                if group is not None and group.is_empty and len(expired) == len(offsets) and not group.pending_members:
                    records.append((encode_key(GroupKey(group_id)), None))
                    deleted.append(group)
            await self.write(records)
            for group in deleted:
                if self.groups.get(group.group_id) is group:
                    self.membership.forget(group, now)
            if records:
                log.info("%s: %d offsets expired, %d empty groups deleted", self.context.tp, expired_count,
                         len(deleted))
        finally:
            self.schedule_offset_expiry(settings.retention_check_interval_ms)
        return len(records)

def write_error(code: ErrorCode) -> ErrorCode:
    """What a failed write tells the client (Kafka's ``appendGroupMetadataErrorToResponseError``)."""
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.unknown_server_error
    return code
