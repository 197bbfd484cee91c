"""The consumer's side of its group (Kafka's ConsumerCoordinator): membership, committed offsets, commits.

:class:`ConsumerCoordinator` holds the group membership while the consumer
is subscribed (:class:`~josef_client.group.ClassicGroupMember`, or
:class:`~josef_client.group_consumer.ConsumerGroupMember` with
``group.protocol=consumer``) and does what needs both the member and the
coordinator's offsets: commits carry the member's generation, and a commit
the coordinator refuses because the group moved on tells the member to
rejoin. Offsets are fetched and committed on the consumer's ordinary
connection to the coordinator, whose address is kept until a request finds
it moved.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from kio.schema.errors import ErrorCode

from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import Cluster
from josef_client.coordinator_requests import (
    OffsetAndMetadata,
    find_coordinator,
    offset_commit,
    offset_fetch,
)
from josef_client.group import CommitFailedError
from josef_client.interceptors import InterceptorChain
from josef_client.subscription_state import SubscriptionState

if TYPE_CHECKING:
    from josef_client.group import ClassicGroupMember

__all__ = ["ConsumerCoordinator"]

log = logging.getLogger(__name__)

#: Errors of FindCoordinator/OffsetFetch that mean "ask again, maybe elsewhere".
COORDINATOR_RETRY = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
                               ErrorCode.coordinator_load_in_progress, ErrorCode.unstable_offset_commit})
#: OffsetCommit errors meaning the member's generation is gone.
FENCED = frozenset({ErrorCode.unknown_member_id, ErrorCode.illegal_generation, ErrorCode.fenced_instance_id,
                    ErrorCode.rebalance_in_progress, ErrorCode.stale_member_epoch})


class ConsumerCoordinator:
    """``group.id``'s membership, committed offsets and commits, for one consumer (see the module docstring)."""

    def __init__(self, config: Mapping[str, Any], cluster: Cluster, subscriptions: SubscriptionState,
                 interceptors: InterceptorChain) -> None:
        self.config = config
        self.cluster = cluster
        self.subscriptions = subscriptions
        #: ``group.id``; "" for a consumer without a group.
        self.group_id: str = config["group.id"] or ""
        #: ``enable.auto.commit``, for a consumer with a group.
        self.auto_commit: bool = bool(self.group_id) and config["enable.auto.commit"]
        #: The group membership, while subscribed.
        self.member: ClassicGroupMember | None = None
        self._interceptors = interceptors
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._next_auto_commit = time.monotonic() + config["auto.commit.interval.ms"] / 1000
        self._address: tuple[str, int] | None = None
        self._commits: set[asyncio.Task[None]] = set()

    # The coordinator ----------------------------------------------------------------------

    async def coordinator_address(self) -> tuple[str, int]:
        """The group coordinator's address, looked up once and kept until :meth:`forget_coordinator`."""
        if self._address is None:
            self._address = await find_coordinator(self.cluster, self.group_id)
        return self._address

    def forget_coordinator(self) -> None:
        """Look the coordinator up again on next use, and drop the connection to the old one, as the Java client's
        markCoordinatorUnknown does: a commit waiting on a coordinator that stopped answering fails and is retried."""
        if self._address is not None:
            self.cluster.disconnect(self._address)
        self._address = None

    async def _connection(self) -> Connection:
        """The consumer's ordinary connection to the coordinator's broker."""
        return await self.cluster.connection(await self.coordinator_address())

    # Committed offsets --------------------------------------------------------------------

    async def committed(self, partitions: Iterable[TopicPartition], timeout_ms: int
                        ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (None where it has none), retrying what may pass later or elsewhere."""
        group = self.group_id
        if not group:
            raise KafkaError(ErrorCode.invalid_group_id, "committed() needs group.id")
        tps = sorted(set(partitions))
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                return await asyncio.wait_for(self._offset_fetch(group, tps), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise KafkaTimeoutError(f"committed offsets of group {group!r} not found within {timeout_ms} ms") from None
            except UnsupportedVersionError:
                raise
            except KafkaError as exc:
                if exc.code != ErrorCode.coordinator_load_in_progress:
                    self.forget_coordinator()
                if not (exc.retriable or exc.code in COORDINATOR_RETRY) or time.monotonic() + self._backoff_s >= deadline:
                    raise
                log.info("committed offsets of group %r: %s; retrying", group, exc)
            await asyncio.sleep(self._backoff_s)

    async def _offset_fetch(self, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return await offset_fetch(await self._connection(), group, tps)

    # Commits ------------------------------------------------------------------------------

    def positions(self, partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions of ``partitions`` (default: every assigned one), as offsets to commit."""
        return {tp: OffsetAndMetadata(offset) for tp, offset in self.subscriptions.positions(partitions).items()}

    def offsets_to_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None
                          ) -> dict[TopicPartition, OffsetAndMetadata]:
        """``commit()``'s argument, checked; None means the positions."""
        if not self.group_id:
            raise KafkaError(ErrorCode.invalid_group_id, "commits need group.id")
        if offsets is None:
            return self.positions()
        result = {}
        for tp, value in offsets.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"commit offsets are keyed by TopicPartition, not {tp!r}")
            if isinstance(value, int) and not isinstance(value, bool):
                value = OffsetAndMetadata(value)
            if not isinstance(value, OffsetAndMetadata) or not isinstance(value.offset, int) or value.offset < 0:
                raise ValueError(f"commit offset for {tp.topic}-{tp.partition} must be an int >= 0 "
                                 f"or an OffsetAndMetadata, not {value!r}")
            result[tp] = value
        return result

    def commit_async(self, offsets: dict[TopicPartition, OffsetAndMetadata], callback: Any) -> asyncio.Task[None]:
        """Commit in a task; ``callback(offsets, error_or_None)`` (sync or async) is called when it is done."""
        async def run() -> None:
            error: KafkaError | None = None
            try:
                if offsets:
                    await self.commit(offsets, self.config["request.timeout.ms"])
            except KafkaError as exc:
                error = exc
            if callback is not None:
                try:
                    result = callback(offsets, error)
                    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                        await result
                except Exception:  # noqa: BLE001 - a user callback
                    log.exception("commit callback failed")
            elif error is not None:
                log.warning("asynchronous commit failed: %s", error)
            if error is not None:
                raise error

        task = asyncio.get_running_loop().create_task(run(), name="josef-commit")
        self._commits.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._commits.discard(t)
            if not t.cancelled():
                t.exception()  # retrieved: an ignored task must not log "exception was never retrieved"

        task.add_done_callback(done)
        return task

    def maybe_auto_commit(self) -> None:
        """Commit the positions in the background if ``auto.commit.interval.ms`` has passed (and no rebalance runs)."""
        if not self.auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config["auto.commit.interval.ms"] / 1000
        if self.member is not None and not self.member.stable:
            return
        offsets = self.positions()
        if offsets:
            def logged(offsets: Any, error: KafkaError | None) -> None:
                if error is not None:
                    log.info("auto commit failed: %s", error)
            self.commit_async(offsets, logged)

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_ms: float) -> None:
        """OffsetCommit to the group's coordinator, retrying what may pass elsewhere or later, within ``timeout_ms``."""
        group = self.group_id
        if self.member is not None:
            generation, member_id, instance = self.member.commit_identity()
        else:
            generation, member_id, instance = -1, "", None
        deadline = time.monotonic() + timeout_ms / 1000
        last: KafkaError | None = None
        while True:
            try:
                conn = await asyncio.wait_for(self._connection(), max(deadline - time.monotonic(), 0.001))
                errors = await asyncio.wait_for(offset_commit(conn, group, offsets, generation, member_id, instance),
                                                max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise KafkaTimeoutError(f"commit to group {group!r} not done within {int(timeout_ms)} ms"
                                        + (f" (last error: {last})" if last else "")) from None
            except UnsupportedVersionError:
                raise
            except KafkaError as exc:
                if not (exc.retriable or exc.code in COORDINATOR_RETRY):
                    raise
                self.forget_coordinator()
                last = exc
            else:
                if not errors:
                    if self._interceptors:
                        self._interceptors.on_commit(dict(offsets))
                    return
                tp, code = min(errors.items())
                what = f"OffsetCommit of {tp.topic}-{tp.partition} for group {group!r}"
                if code in FENCED:
                    if self.member is not None:
                        if code == ErrorCode.rebalance_in_progress:
                            self.member.request_rejoin("a commit found the group rebalancing")
                        elif code == ErrorCode.unknown_member_id:
                            self.member.reset_generation("OffsetCommit: UNKNOWN_MEMBER_ID", reset_member_id=True)
                        elif code == ErrorCode.illegal_generation:
                            self.member.reset_generation("OffsetCommit: ILLEGAL_GENERATION", reset_member_id=False)
                    raise CommitFailedError(code, f"{what}: the group has rebalanced or is rebalancing; "
                                                  "the partitions may now belong to another member")
                if code in COORDINATOR_RETRY or code.retriable:
                    if code in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available):
                        self.forget_coordinator()
                        if self.member is not None:
                            self.member.coordinator_dead(code.name)
                    last = KafkaError(code, what)
                else:
                    raise KafkaError(code, what)
            if time.monotonic() + self._backoff_s >= deadline:
                raise KafkaTimeoutError(f"commit to group {group!r} not done within {int(timeout_ms)} ms"
                                        + (f" (last error: {last})" if last else ""))
            await asyncio.sleep(self._backoff_s)

    # Closing ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit (auto commit), revoke and leave the group, within request.timeout.ms; failures are logged."""
        timeout_ms = self.config["request.timeout.ms"]
        try:
            if self.member is not None:
                await asyncio.wait_for(self.member.close(), timeout_ms / 1000)
            elif self.auto_commit and self.positions():
                await self.commit(self.positions(), timeout_ms)
        except (KafkaError, asyncio.TimeoutError) as exc:
            log.warning("committing or leaving the group on close failed: %s", exc or "timed out")
        if self._commits:
            await asyncio.wait(set(self._commits), timeout=timeout_ms / 1000)
