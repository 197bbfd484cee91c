"""Consumer group membership with Kafka's classic protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

:class:`ClassicGroupMember` is what :meth:`AsyncConsumer.subscribe` plugs in
below the consumer's assignment (see
:class:`~josef_client.subscription_state.SubscriptionState`). It
works as the Java client's ConsumerCoordinator does:

- Rebalances happen inside ``poll()``, never behind the application's back:
  ``poll`` runs the rebalance listener's callbacks, so records the previous
  poll returned are processed before their partitions are revoked and their
  positions committed. The network part of a rebalance (FindCoordinator,
  JoinGroup, the leader's assignment, SyncGroup) runs in a task that goes on
  across polls, since JoinGroup waits for every member to join.
- *onJoinPrepare*: commit positions (``enable.auto.commit``), then revoke all
  partitions (eager protocol), or only those of topics no longer subscribed
  (cooperative), or report them lost (the member was fenced out: its
  generation is gone, so it cannot commit).
- JoinGroup (retried with the member id of a ``MEMBER_ID_REQUIRED`` answer),
  then the *leader* runs the selected assignor over every member's
  ConsumerProtocolSubscription and sends the result with SyncGroup.
- *onJoinComplete*: decode the ConsumerProtocolAssignment; with the
  cooperative protocol, revoke what was owned but is no longer assigned and
  rejoin once more (that second rebalance hands those partitions to their
  new owners); hand the new assignment to the consumer; seek each new
  partition to its committed offset (OffsetFetch), or ``auto.offset.reset``;
  call ``on_partitions_assigned``.
- A heartbeat task keeps the membership alive every ``heartbeat.interval.ms``.
  ``REBALANCE_IN_PROGRESS`` makes the next poll rejoin; ``UNKNOWN_MEMBER_ID``
  and ``ILLEGAL_GENERATION`` reset the generation, so the next poll reports
  the partitions lost and rejoins; coordinator errors (``NOT_COORDINATOR``,
  ``COORDINATOR_NOT_AVAILABLE``, a dropped connection) look the coordinator
  up again. A member whose application stops polling for longer than
  ``max.poll.interval.ms`` leaves the group.
- ``close()`` commits, revokes, and sends LeaveGroup unless the member is
  static (``group.instance.id``): a static member keeps its place for
  ``session.timeout.ms``, so a restart within it gets its partitions back
  without a rebalance.

Join, sync, heartbeat and leave requests use a connection of their own to the
coordinator: a broker answers one request per connection at a time, and a
JoinGroup may wait a whole rebalance timeout. Commits and offset lookups use
the consumer's ordinary connection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol import consumer_protocol
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.consumer_protocol import Subscription
from josef.protocol.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import MAX_VERSIONS

if TYPE_CHECKING:
    from josef_client.consumer import AsyncConsumer
    from josef_client.consumer_coordinator import ConsumerCoordinator
    from josef_client.subscription_state import SubscriptionState

__all__ = ["ClassicGroupMember", "CommitFailedError", "ConsumerGroupMetadata", "RebalanceListener"]

log = logging.getLogger(__name__)

#: Errors after which the coordinator must be looked up again.
COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
#: Errors that end group membership for good: poll() raises them.
FATAL = frozenset({ErrorCode.fenced_instance_id, ErrorCode.group_authorization_failed,
                   ErrorCode.inconsistent_group_protocol, ErrorCode.invalid_session_timeout,
                   ErrorCode.group_max_size_reached, ErrorCode.invalid_group_id, ErrorCode.unsupported_version,
                   ErrorCode.topic_authorization_failed, ErrorCode.unreleased_instance_id})


class CommitFailedError(KafkaError):
    """A commit the group refused: the member's generation is gone (it was fenced, or the group rebalanced).

    Its partitions may already belong to another member. The next ``poll()``
    rejoins; records since the last successful commit may be consumed again.
    """


@attrs.frozen
class ConsumerGroupMetadata:
    """Who this consumer is in its group (for ``send_offsets_to_transaction``)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class RebalanceListener:
    """Callbacks around rebalances; subclass and override what you need. Each may be sync or ``async``.

    All run inside ``poll()`` (or ``close()``/``unsubscribe()``), with sorted
    lists of partitions. ``on_partitions_revoked`` runs before partitions are
    taken away, while offsets can still be committed; with the cooperative
    protocol only for the partitions that move (and only if some do).
    ``on_partitions_assigned`` runs after every rebalance, with the partitions
    added (possibly none). ``on_partitions_lost`` runs when the member lost
    its partitions without a chance to commit (it was fenced out of the
    group): they may already be someone else's. It calls
    ``on_partitions_revoked`` unless overridden, as Kafka's does.
    An exception from a callback is raised by ``poll()`` once the rebalance completes.
    """

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> Any:
        pass

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> Any:
        pass

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> Any:
        return self.on_partitions_revoked(partitions)


# Membership -----------------------------------------------------------------------------------------


class _Rejoin(Exception):
    """The join must start over: at once (``backoff`` False) or after retry.backoff.ms."""

    def __init__(self, reason: str, *, backoff: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.backoff = backoff


@attrs.frozen
class _Joined:
    generation: int
    protocol: str
    assignment: bytes


async def invoke(callback: Any, partitions: list[TopicPartition]) -> None:
    result = callback(partitions)
    if inspect.isawaitable(result):
        await result


class ClassicGroupMember:
    """One consumer's membership of its group (see the module docstring).

    It works on the consumer's parts: ``subscriptions`` (the assignment it
    hands over), ``consumer_coordinator`` (commits and the coordinator's
    address) and ``wake_poll`` (to have a waiting ``poll()`` go on with a
    rebalance); the consumer itself for its public methods.
    """

    def __init__(self, consumer: AsyncConsumer, subscriptions: SubscriptionState,
                 consumer_coordinator: ConsumerCoordinator, wake_poll: Callable[[], None], assignors: list[Any], *,
                 topics: Iterable[str] = (), pattern: re.Pattern[str] | None = None, listener: Any = None) -> None:
        config = consumer.config
        self.consumer = consumer
        self.subscriptions = subscriptions
        self.consumer_coordinator = consumer_coordinator
        self._wake_poll = wake_poll
        self.group_id: str = config["group.id"]
        self.instance_id: str | None = config["group.instance.id"]
        self.assignors = {a.name: a for a in assignors}
        self._assignor_order = [a.name for a in assignors]
        #: The rebalance protocol: cooperative only if every configured assignor supports it (as Kafka decides).
        self.cooperative = all(a.supports_cooperative for a in assignors)
        self.topics: tuple[str, ...] = tuple(sorted(set(topics)))
        self.pattern = pattern
        self.listener = listener
        self._session_timeout_ms = config["session.timeout.ms"]
        self._rebalance_timeout_ms = config["max.poll.interval.ms"]
        self._heartbeat_s = config["heartbeat.interval.ms"] / 1000
        self._max_poll_interval_s = config["max.poll.interval.ms"] / 1000
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._request_timeout_s = config["request.timeout.ms"] / 1000
        self._metadata_max_age_s = config["metadata.max.age.ms"] / 1000

        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.state = "unjoined"  # unjoined -> rebalancing -> stable
        self.rejoin_needed = True
        self.rejoin_reason = "the consumer subscribed"
        #: Partitions assigned but still without a position: their committed offsets are looked up.
        self.pending_positions: set[TopicPartition] = set()
        self._needs_join_prepare = True
        self._joined_topics: tuple[str, ...] | None = None
        #: Leader only: partition counts of every topic the group subscribes to, at the last assignment.
        self._assigned_counts: dict[str, int] | None = None
        self._group_topics: tuple[str, ...] = ()
        self._pattern_resolved = pattern is None
        self._conn: Connection | None = None
        self._coordinator: tuple[str, int] | None = None
        self._join_task: asyncio.Task[_Joined] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._metadata_at = 0.0
        self._backoff_until = 0.0
        self._last_poll = time.monotonic()
        self._last_heartbeat_ok = time.monotonic()
        self._fatal: KafkaError | None = None
        self._listener_error: BaseException | None = None
        self._closed = False

    # State seen by the consumer --------------------------------------------------------------

    @property
    def stable(self) -> bool:
        return self.state == "stable" and self._join_task is None

    def commit_identity(self) -> tuple[int, str, str | None]:
        """(generation, member id, instance id) for OffsetCommit; raises if no generation may commit now."""
        if self.state == "rebalancing" or (self._join_task is not None and self.generation >= 0):
            raise CommitFailedError(ErrorCode.rebalance_in_progress,
                                    f"group {self.group_id!r} is rebalancing; commit after the next poll()")
        if self.generation < 0 or not self.member_id:
            raise CommitFailedError(ErrorCode.illegal_generation,
                                    f"this consumer is not a member of group {self.group_id!r} in any generation "
                                    "(it was fenced or has not joined yet); the next poll() rejoins")
        return self.generation, self.member_id, self.instance_id

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(self.group_id, self.generation, self.member_id, self.instance_id)

    def request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            log.info("group %s: member %s will rejoin: %s", self.group_id, self.member_id, reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason
        self._wake()

    def reset_generation(self, reason: str, *, reset_member_id: bool) -> None:
        """Fenced out (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION...): the next poll reports partitions lost and rejoins."""
        log.info("group %s: member %s (generation %s) is reset: %s", self.group_id, self.member_id,
                 self.generation, reason)
        self.generation = -1
        if reset_member_id:
            self.member_id = ""
        self.state = "unjoined"
        self._needs_join_prepare = True
        self.request_rejoin(reason)

    def _wake(self) -> None:
        self._wake_poll()

    def subscribed_topics(self) -> tuple[str, ...]:
        return self.topics

    def set_subscription(self, topics: Iterable[str] = (), pattern: re.Pattern[str] | None = None,
                         listener: Any = None) -> None:
        self._store_subscription(topics, pattern, listener)
        if (self._joined_topics is not None and self._joined_topics != self.topics) or pattern is not None:
            self.request_rejoin("the subscription changed")

    def _store_subscription(self, topics: Iterable[str], pattern: re.Pattern[str] | None, listener: Any) -> None:
        self.topics = tuple(sorted(set(topics)))
        self.pattern = pattern
        self._pattern_resolved = pattern is None
        self.listener = listener

    # poll() ----------------------------------------------------------------------------------

    def _raise_errors(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._listener_error is not None:
            error, self._listener_error = self._listener_error, None
            raise error

    def _wants_join(self) -> bool:
        if self._join_task is not None or self.rejoin_needed or self.generation < 0:
            return True
        if self._joined_topics is not None and self._joined_topics != self.topics:
            self.request_rejoin("the subscription changed")
            return True
        return False

    async def poll(self) -> None:
        """Do the group's part of a poll: start or finish a rebalance, look up positions; never waits for a rebalance.

        The join runs in a task whose end wakes ``poll()`` (as fetched data does),
        so a cooperative member goes on consuming what it owns meanwhile.
        """
        self._last_poll = time.monotonic()
        self._raise_errors()
        if not self._pattern_resolved:
            await self._refresh_metadata()
        self._maybe_refresh_metadata()
        while self._wants_join():
            if self._join_task is None:
                now = time.monotonic()
                if self._backoff_until > now:
                    asyncio.get_running_loop().call_later(self._backoff_until - now, self._wake)
                    break
                if self._needs_join_prepare:
                    self._needs_join_prepare = False
                    await self._on_join_prepare()
                self._stop_heartbeat()
                self.rejoin_needed = False
                self.state = "rebalancing"
                self._join_task = asyncio.get_running_loop().create_task(
                    self._join_and_sync(), name=f"josef-join-{self.group_id}")
                self._join_task.add_done_callback(lambda _: self._wake())
            if not self._join_task.done():
                break
            task, self._join_task = self._join_task, None
            try:
                joined = task.result()
            except _Rejoin as again:
                log.info("group %s: rejoining (%s)", self.group_id, again.reason)
                self.rejoin_needed = True
                if self.state == "rebalancing":
                    self.state = "unjoined"
                if again.backoff:
                    self._backoff_until = time.monotonic() + self._backoff_s
                continue
            except KafkaError as exc:
                self.state = "unjoined"
                self.rejoin_needed = True
                self._fatal = exc
                raise
            await self._on_join_complete(joined)
            self._raise_errors()
        if self.pending_positions:
            await self.init_positions()
        self._raise_errors()

    async def _invoke(self, name: str, partitions: Iterable[TopicPartition]) -> None:
        listener = self.listener
        if listener is None:
            return
        callback = getattr(listener, name, None)
        if callback is None and name == "on_partitions_lost":
            callback = getattr(listener, "on_partitions_revoked", None)
        if callback is None:
            return
        try:
            await invoke(callback, sorted(partitions))
        except Exception as exc:  # noqa: BLE001 - raised by poll() once the rebalance is over
            log.exception("group %s: rebalance listener %s failed", self.group_id, name)
            if self._listener_error is None:
                self._listener_error = exc

    async def _commit_positions(self, partitions: Iterable[TopicPartition], why: str) -> None:
        """Commit the positions of ``partitions`` if auto commit is on; failures are logged (as Kafka does)."""
        if not self.consumer_coordinator.auto_commit:
            return
        offsets = self.consumer_coordinator.positions(partitions)
        if not offsets:
            return
        try:
            await self.consumer_coordinator.commit(offsets, self._request_timeout_s * 1000)
        except KafkaError as exc:
            log.warning("group %s: committing offsets %s failed: %s", self.group_id, why, exc)

    async def _on_join_prepare(self) -> None:
        owned = set(self.subscriptions.states)
        if self.generation >= 0 and self.member_id and self.state == "stable":
            await self._commit_positions(owned, "before rebalancing")
        if self.generation < 0 or not self.member_id:
            if owned:
                log.info("group %s: partitions lost (the member was fenced): %s", self.group_id, sorted(owned))
                await self._invoke("on_partitions_lost", owned)
                self.subscriptions.set_assignment([], reset=False)
        elif not self.cooperative:
            await self._invoke("on_partitions_revoked", owned)
            self.subscriptions.set_assignment([], reset=False)
        else:
            gone = {tp for tp in owned if tp.topic not in self.topics}
            if gone:
                await self._invoke("on_partitions_revoked", gone)
                self.subscriptions.set_assignment(owned - gone, reset=False)
        self.pending_positions &= set(self.subscriptions.states)

    async def _on_join_complete(self, joined: _Joined) -> None:
        self._needs_join_prepare = True
        partitions, _ = consumer_protocol.decode_assignment(joined.assignment)
        assigned = set(partitions)
        unexpected = {tp.topic for tp in assigned if tp.topic not in self.topics}
        if unexpected and self.pattern is not None:
            matching = {t for t in unexpected if self.pattern.fullmatch(t)}
            if matching:  # the leader knows topics our metadata has not shown yet
                self.topics = tuple(sorted(set(self.topics) | matching))
                self._joined_topics = self.topics
                unexpected -= matching
        if unexpected:
            self.request_rejoin(f"the assignment has topics not subscribed to: {sorted(unexpected)}")
            return
        assignor = self.assignors.get(joined.protocol)
        if assignor is not None and hasattr(assignor, "on_assignment"):
            try:
                assignor.on_assignment(sorted(assigned), joined.generation)
            except Exception:  # noqa: BLE001 - a third-party assignor's bug must not stop the rebalance
                log.exception("assignor %s failed in on_assignment", joined.protocol)
        owned = set(self.subscriptions.states)
        revoked, added = owned - assigned, assigned - owned
        log.info("group %s: member %s joined generation %s (%s, %s): assigned %s", self.group_id, self.member_id,
                 joined.generation, joined.protocol, "cooperative" if self.cooperative else "eager",
                 sorted(assigned))
        if revoked:
            await self._commit_positions(revoked, "of revoked partitions")
            await self._invoke("on_partitions_revoked", revoked)
            if self.cooperative:
                self.request_rejoin("partitions were revoked; rejoining so they can be reassigned")
        self.subscriptions.set_assignment(assigned, reset=False)
        self.pending_positions = (self.pending_positions & assigned) | added
        await self.init_positions()
        await self._invoke("on_partitions_assigned", added)

    async def init_positions(self) -> None:
        """Seek assigned partitions without a position to their committed offsets, or request a reset."""
        states = self.subscriptions.states
        wanted = sorted(tp for tp in self.pending_positions if tp in states and states[tp].position is None
                        and states[tp].reset is None and states[tp].error is None)
        self.pending_positions = set(wanted)
        if not wanted:
            return
        try:
            committed = await self.consumer.committed(wanted, int(self._request_timeout_s * 1000))
        except KafkaError as exc:
            log.warning("group %s: committed offsets not found (%s); retrying at the next poll", self.group_id, exc)
            return
        for tp in wanted:
            state = states.get(tp)
            self.pending_positions.discard(tp)
            if state is None or state.position is not None or state.reset is not None:
                continue  # unassigned, or seeked by a listener meanwhile
            found = committed.get(tp)
            if found is not None:
                self.consumer.seek(tp, found.offset)
            else:
                self.subscriptions.request_reset(tp, state)

    # The coordinator ------------------------------------------------------------------------

    async def _ensure_coordinator(self) -> Connection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        host, port = await self.consumer_coordinator.coordinator_address()
        config = self.consumer.config
        self._conn = await Connection.open(host, port, client_id=config["client.id"],
                                           request_timeout_ms=config["request.timeout.ms"],
                                           connect_timeout_ms=config["socket.connection.setup.timeout.ms"],
                                           max_versions=MAX_VERSIONS, ssl_context=self.consumer.cluster.ssl_context,
                                           sasl=self.consumer.cluster.sasl)
        self._coordinator = (host, port)
        return self._conn

    def coordinator_dead(self, why: object) -> None:
        if self._coordinator is not None:
            log.info("group %s: coordinator %s:%s unavailable (%s); looking it up again", self.group_id,
                     *self._coordinator, why)
        conn, self._conn, self._coordinator = self._conn, None, None
        if conn is not None and not conn.closed:
            asyncio.get_running_loop().create_task(conn.close())
        self.consumer_coordinator.forget_coordinator()

    async def _request(self, conn: Connection, api_key: int, body: Mapping[str, Any], timeout_s: float,
                       max_version: int | None = None) -> Any:
        version = conn.version(api_key)
        if max_version is not None:
            version = min(version, max_version)
        future = conn.send(api_key, body, version=version)
        assert future is not None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            await conn.close()  # its order of responses is lost
            raise KafkaTimeoutError(f"no response from the group coordinator within {timeout_s:.1f}s") from None

    # Join and sync --------------------------------------------------------------------------

    def _handle_error(self, code: ErrorCode, what: str) -> None:
        """Turn a JoinGroup/SyncGroup error into a retry or a fatal error (always raises)."""
        if code == ErrorCode.unknown_member_id:
            self.reset_generation(f"{what}: UNKNOWN_MEMBER_ID", reset_member_id=True)
            raise _Rejoin(f"{what}: unknown member id", backoff=False)
        if code == ErrorCode.illegal_generation:
            self.reset_generation(f"{what}: ILLEGAL_GENERATION", reset_member_id=False)
            raise _Rejoin(f"{what}: illegal generation", backoff=False)
        if code == ErrorCode.rebalance_in_progress:
            raise _Rejoin(f"{what}: the group is rebalancing", backoff=False)
        if code in COORDINATOR_MOVED:
            self.coordinator_dead(code.name)
            raise _Rejoin(f"{what}: {code.name}", backoff=True)
        if code in FATAL or not code.retriable:
            if code == ErrorCode.fenced_instance_id:
                raise KafkaError(code, f"{what}: another consumer with group.instance.id {self.instance_id!r} "
                                       f"joined group {self.group_id!r}")
            raise KafkaError(code, f"{what} for group {self.group_id!r}")
        raise _Rejoin(f"{what}: {code.name}", backoff=True)

    def _protocols(self, topics: tuple[str, ...]) -> list[dict[str, Any]]:
        owned = tuple(sorted(self.subscriptions.states))
        rack = self.consumer.config["client.rack"]
        protocols = []
        for name in self._assignor_order:
            assignor = self.assignors[name]
            user_data = None
            if hasattr(assignor, "subscription_user_data"):
                user_data = assignor.subscription_user_data(topics)
            sub = Subscription(topics, user_data, owned, self.generation, rack)
            protocols.append({"name": name, "metadata": consumer_protocol.encode_subscription(sub)})
        return protocols

    async def _join_and_sync(self) -> _Joined:
        try:
            return await self._join_and_sync_once()
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            self.coordinator_dead(exc)
            raise _Rejoin(f"coordinator unreachable: {exc}", backoff=True) from None
        except KafkaError as exc:
            if exc.code in FATAL or not (exc.retriable or exc.code in COORDINATOR_MOVED):
                raise
            if exc.code in COORDINATOR_MOVED:
                self.coordinator_dead(exc)
            raise _Rejoin(str(exc), backoff=True) from None

    async def _join_and_sync_once(self) -> _Joined:
        conn = await self._ensure_coordinator()
        topics = self.topics
        self._joined_topics = topics
        protocols = self._protocols(topics)
        rebalance_s = self._rebalance_timeout_ms / 1000
        while True:
            response = await self._request(conn, ApiKey.JOIN_GROUP, {
                "group_id": self.group_id, "session_timeout": self._session_timeout_ms,
                "rebalance_timeout": self._rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": consumer_protocol.PROTOCOL_TYPE, "protocols": protocols,
                "reason": self.rejoin_reason}, rebalance_s + 5 + self._request_timeout_s)
            if response.error_code == ErrorCode.member_id_required:
                self.member_id = response.member_id  # KIP-394: join again with the id the coordinator chose
                continue
            if response.error_code != ErrorCode.none:
                self._handle_error(response.error_code, "JoinGroup")
            break
        self.member_id = response.member_id
        generation, protocol, leader = response.generation_id, response.protocol_name, response.leader
        if protocol not in self.assignors:
            raise KafkaError(ErrorCode.inconsistent_group_protocol,
                             f"the coordinator chose assignor {protocol!r}, not one of {self._assignor_order}")
        assignments: list[dict[str, Any]] = []
        if leader == self.member_id:
            assignments = await self._lead(protocol, response.members, skip=getattr(response, "skip_assignment", False))
        else:
            self._assigned_counts = None
        sync = await self._request(conn, ApiKey.SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": consumer_protocol.PROTOCOL_TYPE, "protocol_name": protocol,
            "assignments": assignments}, self._request_timeout_s + rebalance_s)
        if sync.error_code != ErrorCode.none:
            self._handle_error(sync.error_code, "SyncGroup")
        self.generation, self.protocol, self.leader_id = generation, protocol, leader
        self.state = "stable"
        self._start_heartbeat()
        return _Joined(generation, protocol, bytes(sync.assignment))

    async def _lead(self, protocol: str, members: Iterable[Any], *, skip: bool) -> list[dict[str, Any]]:
        """The leader's part: every member's subscription through the assignor; the result for SyncGroup."""
        subscriptions = {m.member_id: consumer_protocol.decode_subscription(bytes(m.metadata), getattr(m, "group_instance_id", None))
                         for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        self._group_topics = tuple(topics)
        if topics:
            await self.consumer.cluster.refresh(topics)
        counts = self._partition_counts(topics)
        self._assigned_counts = counts
        if skip:  # a static leader rejoining (KIP-814): the group keeps its assignment
            return []
        assignor = self.assignors[protocol]
        result = assignor.assign(counts, subscriptions)
        if self.cooperative:
            self._check_cooperative(subscriptions, result)
        log.info("group %s: leader %s assigned with %s: %s", self.group_id, self.member_id, protocol,
                 {m: [f"{tp.topic}-{tp.partition}" for tp in ps] for m, ps in result.items()})
        return [{"member_id": member, "assignment": consumer_protocol.encode_assignment(result.get(member, ()))}
                for member in subscriptions]

    @staticmethod
    def _check_cooperative(subscriptions: Mapping[str, Subscription],
                           result: Mapping[str, Iterable[TopicPartition]]) -> None:
        """A cooperative assignor must not give a partition straight to another member (Kafka checks this too)."""
        owners = {tp: m for m, s in subscriptions.items() for tp in s.owned_partitions}
        for member, partitions in result.items():
            for tp in partitions:
                if owners.get(tp, member) != member:
                    raise KafkaError(ErrorCode.inconsistent_group_protocol,
                                     f"the assignor gave {tp.topic}-{tp.partition} to {member} while "
                                     f"{owners[tp]} still owns it")

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        known = self.consumer.cluster.partitions
        return {t: len(known[t]) for t in topics if t in known}

    # Metadata: pattern subscriptions and partition counts -----------------------------------

    def _maybe_refresh_metadata(self) -> None:
        if self._metadata_task is not None or self._closed:
            return
        if self.pattern is None and self._assigned_counts is None:
            return  # only a pattern, or the leader's view of partition counts, needs watching here
        if time.monotonic() < self._metadata_at + self._metadata_max_age_s:
            return
        self._metadata_task = asyncio.get_running_loop().create_task(self._refresh_metadata())
        self._metadata_task.add_done_callback(self._metadata_done)

    def _metadata_done(self, task: asyncio.Task[None]) -> None:
        self._metadata_task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("group %s: metadata refresh failed", self.group_id, exc_info=task.exception())

    async def _refresh_metadata(self) -> None:
        self._metadata_at = time.monotonic()
        try:
            if self.pattern is not None:
                await self.consumer.cluster.refresh(None)
            else:
                await self.consumer.cluster.refresh(self._group_topics or self.topics)
        except KafkaError as exc:
            log.info("group %s: metadata refresh failed: %s", self.group_id, exc)
            return
        if self.pattern is not None:
            exclude = self.consumer.config["exclude.internal.topics"]
            matched = tuple(sorted(t for t in self.consumer.cluster.partitions
                                   if self.pattern.fullmatch(t) and not (exclude and t.startswith("__"))))
            self._pattern_resolved = True
            if matched != self.topics:
                log.info("group %s: pattern %r now matches %s", self.group_id, self.pattern.pattern, matched)
                self.topics = matched
                if self._joined_topics is not None:
                    self.request_rejoin("the topics matching the subscribed pattern changed")
        if self._assigned_counts is not None and self.leader_id == self.member_id:
            counts = self._partition_counts(self._group_topics)
            if counts != self._assigned_counts:
                self.request_rejoin(f"partitions of the group's topics changed ({self._assigned_counts} -> {counts})")

    # Heartbeats -----------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._last_heartbeat_ok = time.monotonic()  # the join and sync just answered
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"josef-heartbeat-{self.group_id}")

    def _stop_heartbeat(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _heartbeat_loop(self) -> None:
        try:
            await self._heartbeats()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: poll() reports it rather than the member silently dying
            log.exception("group %s: heartbeat task failed", self.group_id)
            self._fatal = KafkaError(ErrorCode.unknown_server_error, "the heartbeat task failed")
            self._wake()

    async def _heartbeats(self) -> None:
        delay = self._heartbeat_s
        while not self._closed:
            await asyncio.sleep(delay)
            delay = self._heartbeat_s
            if self.state != "stable" or self.generation < 0:
                return
            if time.monotonic() - self._last_poll > self._max_poll_interval_s:
                log.warning("group %s: no poll() for over max.poll.interval.ms (%d ms): leaving the group; "
                            "the next poll() rejoins", self.group_id, int(self._max_poll_interval_s * 1000))
                await self.leave("consumer poll timeout has expired")
                return
            # A heartbeat waits no longer than the session has left (Java's AbstractCoordinator: a session that
            # expires with no heartbeat answered marks the coordinator unknown), so a coordinator that stopped
            # answering is replaced before the group's new coordinator expires this member.
            session_left = self._session_timeout_ms / 1000 - (time.monotonic() - self._last_heartbeat_ok)
            try:
                conn = await self._ensure_coordinator()
                response = await self._request(conn, ApiKey.HEARTBEAT, {
                    "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
                    "group_instance_id": self.instance_id},
                    max(min(self._request_timeout_s, session_left), self._heartbeat_s))
            except KafkaError as exc:
                self.coordinator_dead(exc)
                delay = self._backoff_s
                continue
            code = response.error_code
            self._last_heartbeat_ok = time.monotonic()  # the coordinator answered: it is alive
            if code == ErrorCode.none:
                continue
            if code == ErrorCode.rebalance_in_progress:
                self.request_rejoin("the group is rebalancing")  # and go on heartbeating until poll() rejoins
            elif code == ErrorCode.unknown_member_id:
                self.reset_generation("Heartbeat: UNKNOWN_MEMBER_ID", reset_member_id=True)
                return
            elif code == ErrorCode.illegal_generation:
                self.reset_generation("Heartbeat: ILLEGAL_GENERATION", reset_member_id=False)
                return
            elif code in COORDINATOR_MOVED:
                self.coordinator_dead(code.name)
                delay = self._backoff_s
            elif code in FATAL:
                self._fatal = KafkaError(code, f"Heartbeat for group {self.group_id!r}")
                self.state = "unjoined"
                self._wake()
                return
            else:
                log.info("group %s: heartbeat failed: %s", self.group_id, code.name)
                delay = self._backoff_s

    # Leaving --------------------------------------------------------------------------------

    async def leave(self, reason: str) -> None:
        """LeaveGroup (dynamic members only, as Kafka's), then forget the generation and member id."""
        if self._heartbeat_task is asyncio.current_task():
            self._heartbeat_task = None  # the heartbeat task itself is leaving (poll timeout): it ends after this
        else:
            self._stop_heartbeat()
        if self.instance_id is None and self.member_id:
            try:
                conn = await self._ensure_coordinator()
                response = await self._request(conn, ApiKey.LEAVE_GROUP, {
                    "group_id": self.group_id, "member_id": self.member_id,
                    "members": [{"member_id": self.member_id, "group_instance_id": None, "reason": reason}]},
                    self._request_timeout_s)
                code = response.error_code
                if code == ErrorCode.none:
                    for member in getattr(response, "members", None) or ():
                        if member.error_code != ErrorCode.none:
                            code = member.error_code
                if code != ErrorCode.none:
                    log.info("group %s: LeaveGroup answered %s", self.group_id, code.name)
                else:
                    log.info("group %s: member %s left (%s)", self.group_id, self.member_id, reason)
            except KafkaError as exc:
                log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
        self.generation = -1
        self.member_id = ""
        self.state = "unjoined"
        self._needs_join_prepare = True
        self.rejoin_needed = True
        self.rejoin_reason = reason
        self._wake()

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in (self._join_task, self._heartbeat_task, self._metadata_task) if t is not None]
        self._join_task = self._heartbeat_task = self._metadata_task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled or failed: over either way
                pass

    async def unsubscribe(self, reason: str = "the consumer unsubscribed") -> None:
        """Commit (auto commit), revoke (or report lost), and leave the group."""
        rebalancing = self._join_task is not None or self.state == "rebalancing"
        await self._cancel_tasks()
        if rebalancing and self._conn is not None:
            # A JoinGroup may still be pending on it, and the broker answers one request at a time:
            # LeaveGroup goes on a new connection.
            await self._conn.close()
            self._conn = None
        owned = set(self.subscriptions.states)
        if self.generation >= 0 and self.member_id and not rebalancing:
            await self._commit_positions(owned, "before leaving")
        if owned:
            if self.generation < 0 or not self.member_id or rebalancing:
                await self._invoke("on_partitions_lost", owned)
            else:
                await self._invoke("on_partitions_revoked", owned)
        self.subscriptions.set_assignment([], reset=False)
        self.pending_positions.clear()
        await self.leave(reason)

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await self.unsubscribe("the consumer is being closed")
        finally:
            self._closed = True
            await self._cancel_tasks()
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
