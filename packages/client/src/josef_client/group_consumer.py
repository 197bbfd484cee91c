"""Consumer group membership with the consumer protocol (KIP-848, ``group.protocol=consumer``).

:class:`ConsumerGroupMember` takes the place of
:class:`~josef_client.group.ClassicGroupMember` when the consumer is
configured with ``group.protocol=consumer``. There is no JoinGroup/SyncGroup
and no client-side assignor: one request, ConsumerGroupHeartbeat, does it all.

- A heartbeat task sends ConsumerGroupHeartbeat every ``HeartbeatIntervalMs``
  the coordinator asks for (``heartbeat.interval.ms`` until it answers): the
  member id (a client-generated UUID from v1; v0 uses the one the coordinator
  assigns), the member epoch (0 to join, -1 to leave, -2 for a static member
  leaving temporarily), the subscribed topic names (or the regex, v1+), the
  server assignor (``group.remote.assignor``), and the partitions the member
  owns, by topic id.
- The coordinator answers with the member's *target* assignment whenever it
  changes. ``poll()`` reconciles towards it incrementally: it revokes what is
  no longer assigned (commit with auto commit, ``on_partitions_revoked``),
  then takes the newly assigned partitions (seek to their committed offsets or
  ``auto.offset.reset``, ``on_partitions_assigned``), and has the next
  heartbeat sent at once, reporting what it owns now: that acknowledges the
  revocation so the coordinator can hand those partitions to their new owners.
- ``FENCED_MEMBER_EPOCH`` and ``UNKNOWN_MEMBER_ID`` mean the member is out of
  the group: the next ``poll()`` reports its partitions lost
  (``on_partitions_lost``) and it rejoins with epoch 0.
- Commits send the member id and the member epoch as the generation.
- ``close()``/``unsubscribe()`` commit, revoke, and send a leaving heartbeat.

Commits, offset lookups, the callbacks and the coordinator connection are
those of :class:`ClassicGroupMember`, which this class extends.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError, UnsupportedVersionError
from josef.protocol.topic_partition import TopicPartition
from josef_client.group import COORDINATOR_MOVED, ClassicGroupMember, CommitFailedError

if TYPE_CHECKING:
    from josef_client.consumer import AsyncConsumer
    from josef_client.consumer_coordinator import ConsumerCoordinator
    from josef_client.subscription_state import SubscriptionState

__all__ = ["ConsumerGroupMember"]

log = logging.getLogger(__name__)

JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
#: The member is out of the group: report its partitions lost and rejoin with epoch 0.
FENCED = frozenset({ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id})
#: Errors that end membership for good: poll() raises them.
FATAL_848 = frozenset({ErrorCode.group_authorization_failed, ErrorCode.topic_authorization_failed,
                       ErrorCode.invalid_request, ErrorCode.unsupported_assignor, ErrorCode.unsupported_version,
                       ErrorCode.unreleased_instance_id, ErrorCode.fenced_instance_id,
                       ErrorCode.group_max_size_reached, ErrorCode.invalid_group_id,
                       ErrorCode.inconsistent_group_protocol})


class _Wakeup:
    """A flag the heartbeat loop sleeps on: ``set()`` sends the next heartbeat at once."""

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    async def sleep(self, delay: float) -> None:
        """Until ``delay`` seconds pass or the flag is set; then clears it."""
        if not self._flag:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            handle = loop.call_later(max(delay, 0), lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None
        self._flag = False


class ConsumerGroupMember(ClassicGroupMember):
    """One consumer's membership of a KIP-848 consumer group (see the module docstring)."""

    def __init__(self, consumer: AsyncConsumer, subscriptions: SubscriptionState,
                 consumer_coordinator: ConsumerCoordinator, wake_poll: Callable[[], None], *,
                 topics: Iterable[str] = (), pattern: re.Pattern[str] | None = None, listener: Any = None) -> None:
        super().__init__(consumer, subscriptions, consumer_coordinator, wake_poll, [], topics=topics, pattern=pattern,
                         listener=listener)
        self.server_assignor: str | None = consumer.config.get("group.remote.assignor")
        #: v1+: the client chooses its member id, and keeps it for the consumer's lifetime.
        self._client_member_id = str(uuid.uuid4())
        self.member_epoch = JOIN_EPOCH
        self.generation = -1  # what commits send: the member epoch once joined
        self.state = "joining"  # joining -> stable (reconciled) / reconciling; fenced; left
        #: The latest assignment the coordinator sent (None: none yet).
        self.target: set[TopicPartition] | None = None
        self._unresolved_ids: set[uuid.UUID] = set()
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._topic_names: dict[uuid.UUID, str] = {}
        self._fenced = False
        self._hb_wake = _Wakeup()
        self._hb_interval_s = self._heartbeat_s

    # State seen by the consumer --------------------------------------------------------------

    @property
    def stable(self) -> bool:
        return self.state == "stable" and not self._fenced

    def commit_identity(self) -> tuple[int, str, str | None]:
        if self._fenced or self.member_epoch <= 0 or not self.member_id:
            raise CommitFailedError(ErrorCode.fenced_member_epoch if self._fenced else ErrorCode.unknown_member_id,
                                    f"this consumer is not a member of group {self.group_id!r} with a valid epoch "
                                    "(it was fenced or has not joined yet); the next poll() rejoins")
        return self.member_epoch, self.member_id, self.instance_id

    def request_rejoin(self, reason: str) -> None:
        """The subscription changed (or a commit asks for it): just heartbeat now, with the full state."""
        log.info("group %s: member %s heartbeats now: %s", self.group_id, self.member_id, reason)
        self._hb_wake.set()

    def reset_generation(self, reason: str, *, reset_member_id: bool) -> None:
        self.fence(reason)

    def fence(self, reason: str) -> None:
        """Out of the group: the next poll() reports the partitions lost and rejoins with epoch 0."""
        if not self._fenced:
            log.info("group %s: member %s (epoch %s) fenced: %s", self.group_id, self.member_id,
                     self.member_epoch, reason)
        self._fenced = True
        self.generation = -1
        self.state = "fenced"
        self.target = None
        self._wake()

    def set_subscription(self, topics: Iterable[str] = (), pattern: re.Pattern[str] | None = None,
                         listener: Any = None) -> None:
        self._store_subscription(topics, pattern, listener)
        self._hb_wake.set()

    # poll(): reconciliation ------------------------------------------------------------------

    async def poll(self) -> None:
        self._last_poll = time.monotonic()
        self._raise_errors()
        if self.pattern is not None and not self._use_regex():  # v0: the pattern is matched here
            if not self._pattern_resolved:
                await self._refresh_metadata()
            self._maybe_refresh_metadata()
        if self._fenced:
            owned = set(self.subscriptions.states)
            if owned:
                log.info("group %s: partitions lost: %s", self.group_id, sorted(owned))
                await self._invoke("on_partitions_lost", owned)
                self.subscriptions.set_assignment([], reset=False)
            self.pending_positions.clear()
            self._fenced = False
            self.member_epoch = JOIN_EPOCH
            self.state = "joining"
            self._hb_wake.set()
        if self.state != "left":
            self._start_heartbeat()
        await self.reconcile()
        if self.pending_positions:
            await self.init_positions()
        self._raise_errors()

    async def reconcile(self) -> None:
        """Move the owned partitions towards the target: revoke first, then add; then report them."""
        if self.target is None or self._fenced:
            return
        target = set(self.target)
        owned = set(self.subscriptions.states)
        revoked, added = owned - target, target - owned
        if not revoked and not added:
            if self.state == "reconciling":
                self.state = "stable"
            elif self.state == "joining" and self.member_epoch > 0:
                self.state = "stable"
            return
        self.state = "reconciling"
        log.info("group %s: member %s epoch %s reconciles: revoke %s, add %s", self.group_id, self.member_id,
                 self.member_epoch, sorted(revoked), sorted(added))
        if revoked:
            await self._commit_positions(revoked, "of revoked partitions")
            await self._invoke("on_partitions_revoked", revoked)
            self.subscriptions.set_assignment(owned - revoked, reset=False)
            self.pending_positions -= revoked
        if self._fenced or self.target is None:
            return  # fenced meanwhile: the next poll() reports lost
        if added:
            self.subscriptions.set_assignment((owned - revoked) | added, reset=False)
            self.pending_positions |= added
            await self.init_positions()
        self.state = "stable"
        self._hb_wake.set()  # acknowledge: the next heartbeat reports what is owned now
        await self._invoke("on_partitions_assigned", added)

    # Topic ids ---------------------------------------------------------------------------------

    async def _refresh_topic_ids(self) -> None:
        conn = await self.consumer.cluster.any_connection()
        response = await conn.request(ApiKey.METADATA, {"topics": None, "allow_auto_topic_creation": False,
                                                 "include_cluster_authorized_operations": False,
                                                 "include_topic_authorized_operations": False})
        for topic in response.topics:
            if topic.error_code == ErrorCode.none and topic.name and getattr(topic, "topic_id", None):
                self._topic_ids[topic.name] = topic.topic_id
                self._topic_names[topic.topic_id] = topic.name

    async def _owned_by_id(self) -> list[dict[str, Any]]:
        owned: dict[str, list[int]] = {}
        for tp in sorted(self.subscriptions.states):
            owned.setdefault(tp.topic, []).append(tp.partition)
        if any(t not in self._topic_ids for t in owned):
            await self._refresh_topic_ids()
        return [{"topic_id": self._topic_ids[t], "partitions": ps} for t, ps in owned.items() if t in self._topic_ids]

    async def _resolve_assignment(self, assignment: Any) -> set[TopicPartition]:
        ids = {tps.topic_id for tps in assignment.topic_partitions}
        if ids - set(self._topic_names):
            await self._refresh_topic_ids()
        self._unresolved_ids = ids - set(self._topic_names)
        return {TopicPartition(self._topic_names[tps.topic_id], p) for tps in assignment.topic_partitions
                if tps.topic_id in self._topic_names for p in tps.partitions}

    # Heartbeats -------------------------------------------------------------------------------

    def _use_regex(self) -> bool:
        return self.pattern is not None and self._heartbeat_version() >= 1

    def _heartbeat_version(self) -> int:
        conn = self._conn
        if conn is None or conn.closed:
            return 1
        return conn.version(ApiKey.CONSUMER_GROUP_HEARTBEAT)

    async def _heartbeat_body(self, epoch: int, version: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "group_id": self.group_id, "member_epoch": epoch, "instance_id": self.instance_id,
            "rack_id": self.consumer.config["client.rack"], "rebalance_timeout": self._rebalance_timeout_ms,
            "server_assignor": self.server_assignor, "subscribed_topic_names": None, "topic_partitions": None,
            "member_id": self.member_id or (self._client_member_id if version >= 1 else "")}
        if version >= 1:
            body["subscribed_topic_regex"] = None
        if epoch >= 0:
            if self.pattern is not None and version >= 1:
                body["subscribed_topic_regex"] = self.pattern.pattern
                body["subscribed_topic_names"] = []
            else:
                body["subscribed_topic_names"] = list(self.topics)
            body["topic_partitions"] = [] if epoch == JOIN_EPOCH else await self._owned_by_id()
        return body

    async def heartbeat_once(self) -> float:
        """One ConsumerGroupHeartbeat and what its answer means; the delay until the next one."""
        conn = await self._ensure_coordinator()
        version = conn.version(ApiKey.CONSUMER_GROUP_HEARTBEAT)
        body = await self._heartbeat_body(self.member_epoch, version)
        response = await self._request(conn, ApiKey.CONSUMER_GROUP_HEARTBEAT, body, self._request_timeout_s)
        return await self.handle_response(response)

    async def handle_response(self, response: Any) -> float:
        code = response.error_code
        if code != ErrorCode.none:
            message = f"ConsumerGroupHeartbeat: {code.name} {response.error_message or ''}".strip()
            if code in FENCED:
                if code == ErrorCode.unknown_member_id and not self._client_member_id_used():
                    self.member_id = ""
                self.fence(message)
            elif code in COORDINATOR_MOVED:
                self.coordinator_dead(code.name)
            elif code in FATAL_848 or not code.retriable:
                self._fatal = KafkaError(code, f"{message} (group {self.group_id!r})")
                self._wake()
            else:
                log.info("group %s: %s; retrying", self.group_id, message)
            return self._backoff_s
        if response.member_id:
            self.member_id = response.member_id
        self.member_epoch = response.member_epoch
        self.generation = response.member_epoch
        interval = response.heartbeat_interval  # kio reads it as a timedelta
        interval_s = interval.total_seconds() if hasattr(interval, "total_seconds") else (interval or 0) / 1000
        if interval_s > 0:
            self._hb_interval_s = interval_s
        if response.assignment is not None:
            self.target = await self._resolve_assignment(response.assignment)
            self._wake()
        elif self._unresolved_ids:
            log.info("group %s: assigned topic ids not in metadata yet: %s", self.group_id, self._unresolved_ids)
        return self._hb_interval_s

    def _client_member_id_used(self) -> bool:
        return self.member_id == self._client_member_id

    def _start_heartbeat(self) -> None:
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._hb_wake.set()  # the first heartbeat goes at once
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"josef-consumer-heartbeat-{self.group_id}")

    async def _heartbeats(self) -> None:
        delay = 0.0
        while not self._closed:
            await self._hb_wake.sleep(delay)
            if self._fenced or self._fatal is not None:
                return  # poll() reports the loss and starts heartbeating again with epoch 0
            if time.monotonic() - self._last_poll > self._max_poll_interval_s:
                log.warning("group %s: no poll() for over max.poll.interval.ms (%d ms): leaving the group; "
                            "the next poll() rejoins", self.group_id, int(self._max_poll_interval_s * 1000))
                await self._send_leave()
                self.fence("consumer poll timeout has expired")
                return
            try:
                delay = await self.heartbeat_once()
            except UnsupportedVersionError as exc:
                self._fatal = UnsupportedVersionError(f"group.protocol=consumer needs a broker with "
                                                      f"ConsumerGroupHeartbeat (KIP-848): {exc}")
                self._wake()
                return
            except KafkaError as exc:
                log.info("group %s: heartbeat failed: %s", self.group_id, exc)
                self.coordinator_dead(exc)
                delay = self._backoff_s

    # Leaving ------------------------------------------------------------------------------------

    async def _send_leave(self) -> None:
        if not self.member_id:
            return
        epoch = STATIC_LEAVE_EPOCH if self.instance_id is not None else LEAVE_EPOCH
        try:
            conn = await self._ensure_coordinator()
            body = await self._heartbeat_body(epoch, conn.version(ApiKey.CONSUMER_GROUP_HEARTBEAT))
            response = await self._request(conn, ApiKey.CONSUMER_GROUP_HEARTBEAT, body, self._request_timeout_s)
            if response.error_code != ErrorCode.none:
                log.info("group %s: leaving heartbeat answered %s", self.group_id, response.error_code.name)
            else:
                log.info("group %s: member %s left", self.group_id, self.member_id)
        except KafkaError as exc:
            log.info("group %s: leaving heartbeat failed: %s", self.group_id, exc)

    async def leave(self, reason: str) -> None:
        if self._heartbeat_task is asyncio.current_task():
            self._heartbeat_task = None
        else:
            self._stop_heartbeat()
        await self._send_leave()
        self.member_epoch = JOIN_EPOCH
        self.generation = -1
        self.target = None
        self.state = "left"

    async def unsubscribe(self, reason: str = "the consumer unsubscribed") -> None:
        await self._cancel_tasks()
        owned = set(self.subscriptions.states)
        if owned:
            if self._fenced:
                await self._invoke("on_partitions_lost", owned)
            else:
                await self._commit_positions(owned, "before leaving")
                await self._invoke("on_partitions_revoked", owned)
        self.subscriptions.set_assignment([], reset=False)
        self.pending_positions.clear()
        await self.leave(reason)
