"""The consumer: fetches records of assigned partitions ahead of ``poll()``, as Kafka's Java fetcher does.

A background task keeps one Fetch request in flight per leader broker for the
assigned partitions that are fetchable: they have a position, are not paused,
have no unreturned data buffered and are not backing off after an error.
Responses land in a buffer that holds at most one response part per
partition, so memory stays bounded (about ``max.partition.fetch.bytes`` per
partition, ``fetch.max.bytes`` per broker) while the next records are already
on their way as the application processes the previous poll.

Positions belong to the consumer, not to the buffered data: every
:meth:`AsyncConsumer.seek` bumps the partition's *generation*, and data
fetched for an older generation (buffered, or still in flight) is dropped
when it is seen. Records are decoded only when ``poll()`` hands them out
(see :mod:`josef_client.records`).

Errors: retriable ones (a leader moved, a broker restarted, a request timed
out) are retried after ``retry.backoff.ms`` with refreshed metadata and never
reach the application; ``poll()`` raises what needs a decision from it: an
offset out of range with ``auto.offset.reset=none``, a topic that does not
exist, a corrupt batch or a failing deserialiser (seek past the record to
go on).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import logging
import re
import time
from typing import Any, Iterable, Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.records import ConsumerRecord, RecordDeserializationError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import STALE_METADATA, Cluster
from josef_client.config import CONSUMER, ConfigError, build_config
from josef_client.group import (
    ClassicGroupMember,
    CommitFailedError,
    ConsumerGroupMetadata,
    RebalanceListener,
)
from josef_client.interceptors import InterceptorChain
from josef_client.records import FetchedPartition
from josef_client.sync import LoopThread

__all__ = ["AsyncConsumer", "CommitFailedError", "Consumer", "ConsumerGroupMetadata", "ConsumerRecord",
           "NoOffsetForPartitionError", "OffsetAndMetadata", "OffsetOutOfRangeError", "RebalanceListener",
           "RecordDeserializationError", "TopicPartition"]

log = logging.getLogger(__name__)

#: ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2
#: How long the offset lookups (position, *_offsets, seek_to_*, committed) retry before giving up,
#: as the Java client's default.api.timeout.ms.
DEFAULT_API_TIMEOUT_MS = 60000
#: Errors of FindCoordinator/OffsetFetch that mean "ask again, maybe elsewhere".
COORDINATOR_RETRY = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
                               ErrorCode.coordinator_load_in_progress, ErrorCode.unstable_offset_commit})
#: OffsetCommit errors meaning the member's generation is gone.
FENCED = frozenset({ErrorCode.unknown_member_id, ErrorCode.illegal_generation, ErrorCode.fenced_instance_id,
                    ErrorCode.rebalance_in_progress, ErrorCode.stale_member_epoch})


class OffsetOutOfRangeError(KafkaError):
    """The position is outside the log and ``auto.offset.reset`` is ``none``: seek to go on.

    ``partitions`` maps each partition to the offset the broker refused.
    """

    def __init__(self, partitions: Mapping[TopicPartition, int]) -> None:
        self.partitions = dict(partitions)
        where = ", ".join(f"{tp.topic}-{tp.partition}@{offset}" for tp, offset in self.partitions.items())
        super().__init__(ErrorCode.offset_out_of_range, f"fetch position out of range and auto.offset.reset=none: {where}")


class NoOffsetForPartitionError(KafkaError):
    """A partition has no position and ``auto.offset.reset`` is ``none``: seek (or commit, for groups) first."""

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self.partitions = frozenset(partitions)
        where = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(self.partitions))
        super().__init__(ErrorCode.offset_out_of_range, f"no position and auto.offset.reset=none for {where}")


@attrs.frozen
class OffsetAndMetadata:
    """A committed offset: the next offset to consume, with the committer's metadata string."""

    offset: int
    metadata: str | None = None
    leader_epoch: int = -1


@attrs.define(slots=True)
class _PartitionState:
    """What the consumer knows of one assigned partition."""

    #: Next offset poll() returns; None until set by seek or an offset reset.
    position: int | None = None
    #: "earliest"/"latest" while a reset by ListOffsets is wanted, None otherwise.
    reset: str | None = None
    paused: bool = False
    #: Bumped by every change of position not made by poll(): older fetched data is void.
    generation: int = 0
    #: Part of an outstanding Fetch or ListOffsets request.
    busy: bool = False
    #: Not fetched before this time (monotonic), after an error.
    backoff_until: float = 0.0
    #: An error poll() raises until the application seeks (out of range, no offset).
    error: KafkaError | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


class AsyncConsumer:
    """The asyncio consumer of partitions assigned with :meth:`assign`.

    ::

        async with AsyncConsumer(bootstrap_servers="localhost:9092", auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("orders", 0)])
            while True:
                for tp, records in (await consumer.poll(timeout_ms=1000)).items():
                    ...

    Or as a member of a consumer group, which shares the partitions of the
    subscribed topics among its members::

        async with AsyncConsumer(bootstrap_servers="localhost:9092", group_id="billing") as consumer:
            consumer.subscribe(["orders"], listener=MyRebalanceListener())
            while True:
                for tp, records in (await consumer.poll(timeout_ms=1000)).items():
                    ...   # positions are committed every auto.commit.interval.ms, on rebalance and on close

    ``plugin_manager`` (not a Kafka key) is where interceptors and assignors come from.

    Where assignments come from: everything below the assignment (positions,
    pause state, the fetcher, poll) only reads ``self._states``, which
    :meth:`_set_assignment` replaces. :meth:`assign` is one source of
    assignments; group membership (:meth:`subscribe`, see
    :mod:`josef_client.group`) is the other: its coordinator calls
    ``_set_assignment(partitions, reset=False)`` after each rebalance, leaving
    new partitions without a position (so the fetcher neither fetches nor
    resets them), then seeks each one to its :meth:`committed` offset and
    calls ``_request_reset`` for those with none, so ``auto.offset.reset``
    applies only where nothing was committed.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, plugin_manager: Any = None, **kwargs: Any) -> None:
        self.config = build_config("consumer", CONSUMER, config, kwargs)
        if self.config["fetch.max.wait.ms"] >= self.config["request.timeout.ms"]:
            raise ConfigError("request.timeout.ms must be greater than fetch.max.wait.ms, "
                              "or every fetch with no new data times out")
        self._interceptors = InterceptorChain.from_config(self.config["interceptor.classes"], self.config, plugin_manager)
        group_id = self.config["group.id"]
        self._consumer_protocol = self.config["group.protocol"] == "consumer"
        if self._consumer_protocol:
            given = set(config or {}) | {name.replace("_", ".") for name in kwargs}
            for name in ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"):
                if name in given:
                    raise ConfigError(f"{name} is not supported with group.protocol=consumer (KIP-848): the group "
                                      "coordinator assigns partitions and sets the heartbeat interval and session "
                                      "timeout; use group.remote.assignor to choose a server-side assignor")
        elif self.config["group.remote.assignor"] is not None:
            raise ConfigError("group.remote.assignor is only used with group.protocol=consumer")
        if self.config["heartbeat.interval.ms"] >= self.config["session.timeout.ms"]:
            raise ConfigError("heartbeat.interval.ms must be lower than session.timeout.ms")
        if group_id is not None and not group_id:
            raise ConfigError("group.id must not be empty")
        self._assignors: list[Any] = []
        if group_id and not self._consumer_protocol:
            from josef_client.assignors import load_assignors

            if not self.config["partition.assignment.strategy"]:
                raise ConfigError("partition.assignment.strategy must name at least one assignor")
            self._assignors = load_assignors(self.config["partition.assignment.strategy"], plugin_manager)
        self._auto_commit = bool(group_id) and self.config["enable.auto.commit"]
        self._next_auto_commit = time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
        self._group: ClassicGroupMember | None = None
        self._manual = False
        self._coordinator_address: tuple[str, int] | None = None
        self._commits: set[asyncio.Task[None]] = set()
        self._reset_strategy: str = self.config["auto.offset.reset"]
        self._read_committed = self.config["isolation.level"] == "read_committed"
        self._isolation = 1 if self._read_committed else 0
        self._backoff_s = self.config["retry.backoff.ms"] / 1000
        self._key_deserializer = self.config["key.deserializer"]
        self._value_deserializer = self.config["value.deserializer"]
        self.cluster = Cluster(self.config)
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._buffer: collections.deque[FetchedPartition] = collections.deque()
        self._fetching_nodes: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._topic_errors: dict[str, KafkaError] = {}
        self._metadata_wanted = True
        self._metadata_not_before = 0.0
        self._metadata_task: asyncio.Task[None] | None = None
        self._rotation = 0
        self._wakeup: asyncio.Event | None = None
        self._data: asyncio.Event | None = None
        self._fetcher: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._closed = False

    # Lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (metadata from a bootstrap server, so a wrong address fails here) and start the fetcher."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._fetcher is not None:
            return
        self._wakeup = asyncio.Event()
        self._data = asyncio.Event()
        await self.cluster.refresh([])
        self._fetcher = asyncio.get_running_loop().create_task(self._fetch_loop(), name="josef-consumer-fetcher")

    async def close(self) -> None:
        """Stop fetching and close the connections; buffered records are dropped."""
        if self._closed:
            return
        if self._fetcher is not None:
            await self._leave_on_close()
        self._closed = True
        # The fetcher first, so nothing new starts; then the connections, so requests in flight fail
        # into the tasks awaiting them (rather than into futures nobody reads); then those tasks.
        await self._cancel([self._fetcher])
        await self.cluster.close()
        await self._cancel([self._metadata_task, *self._tasks])
        await self.cluster.close()  # one a task may have opened meanwhile
        self._buffer.clear()

    async def _leave_on_close(self) -> None:
        """Commit (auto commit), revoke and leave the group, within request.timeout.ms; failures are logged."""
        try:
            if self._group is not None:
                await asyncio.wait_for(self._group.close(), self.config["request.timeout.ms"] / 1000)
            elif self._auto_commit and self._positions():
                await self._commit(self._positions(), self.config["request.timeout.ms"])
        except (KafkaError, asyncio.TimeoutError) as exc:
            log.warning("committing or leaving the group on close failed: %s", exc or "timed out")
        if self._commits:
            await asyncio.wait(set(self._commits), timeout=self.config["request.timeout.ms"] / 1000)

    @staticmethod
    async def _cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
        running = [t for t in tasks if t is not None]
        for task in running:
            task.cancel()
        for task in running:
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled, or failed: either way it is over
                pass

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # Assignment, positions, pausing ---------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing the previous assignment).

        Partitions kept from the previous assignment keep their positions; new
        ones start at ``auto.offset.reset`` unless :meth:`seek` says otherwise.
        Topics are not created: :meth:`poll` raises
        ``KafkaError(UNKNOWN_TOPIC_OR_PARTITION)`` after each metadata refresh
        (``retry.backoff.ms`` apart) that finds one missing, and consumes it once it exists.
        """
        self._check_open()
        if self._group is not None:
            raise RuntimeError("assign() and subscribe() are mutually exclusive: unsubscribe() first")
        partitions = list(partitions)
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartition objects, not {tp!r}")
        self._manual = True
        self._set_assignment(partitions, reset=True)

    def _set_assignment(self, partitions: Iterable[TopicPartition], *, reset: bool) -> None:
        """The assignment source's entry point (see the class docstring)."""
        wanted = set(partitions)
        for tp in set(self._states) - wanted:
            del self._states[tp]
        for tp in wanted - set(self._states):
            self._states[tp] = state = _PartitionState()
            if reset:
                self._request_reset(tp, state)
        self._buffer = collections.deque(fp for fp in self._buffer if fp.tp in self._states)
        self._topic_errors = {t: e for t, e in self._topic_errors.items() if any(tp.topic == t for tp in wanted)}
        if any(tp.topic not in self.cluster.partitions for tp in wanted):
            self._metadata_wanted = True
            self._metadata_not_before = 0.0
        self._wake()

    def _request_reset(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Forget the position; the fetcher looks one up by ``auto.offset.reset`` (or poll raises, for none)."""
        state.position = None
        state.generation += 1
        if self._reset_strategy == "none":
            state.reset = None
            state.error = NoOffsetForPartitionError([tp])
        else:
            state.reset = self._reset_strategy
            state.error = None
        self._wake()

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._states)

    def _state(self, tp: TopicPartition) -> _PartitionState:
        state = self._states.get(tp)
        if state is None:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next one :meth:`poll` returns for ``tp``; fetched data from elsewhere is dropped."""
        self._check_open()
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"seek offset must be an int >= 0, not {offset!r}")
        state = self._state(tp)
        state.position = offset
        state.generation += 1
        state.reset = None
        state.error = None
        state.backoff_until = 0.0
        self._buffer = collections.deque(fp for fp in self._buffer if fp.tp != tp)
        self._wake()

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Seek to the log start offset of each partition (all assigned ones when none are given)."""
        await self._seek_to(partitions, EARLIEST)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Seek to the end: the high watermark, or the last stable offset for read_committed."""
        await self._seek_to(partitions, LATEST)

    async def _seek_to(self, partitions: Iterable[TopicPartition], timestamp: int) -> None:
        self._check_open()
        tps = list(partitions) or list(self._states)
        for tp in tps:
            self._state(tp)
        found = await self._list_offsets({tp: timestamp for tp in tps})
        for tp, (offset, _, _) in found.items():
            if tp in self._states:
                self.seek(tp, offset)

    async def position(self, tp: TopicPartition, timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> int:
        """The offset of the next record :meth:`poll` returns for ``tp``, looked up now if not known yet."""
        self._check_open()
        state = self._state(tp)
        deadline = time.monotonic() + timeout_ms / 1000
        while state.position is None:
            if state.error is not None:
                raise state.error
            if state.reset is None and self._group is not None and tp in self._group.pending_positions:
                await self._group.init_positions()
                if state.position is not None or state.reset is not None:
                    continue
            if state.reset is None:
                raise NoOffsetForPartitionError([tp])
            strategy, generation = state.reset, state.generation
            found = await self._list_offsets({tp: EARLIEST if strategy == "earliest" else LATEST},
                                             max(1, int((deadline - time.monotonic()) * 1000)))
            if self._states.get(tp) is not state:
                raise ValueError(f"{tp.topic}-{tp.partition} was unassigned meanwhile")
            if state.generation == generation and state.position is None:
                self._set_position(tp, state, found[tp][0])
        return state.position

    def _set_position(self, tp: TopicPartition, state: _PartitionState, offset: int) -> None:
        state.position = offset
        state.reset = None
        state.generation += 1
        self._wake()

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning these partitions; their positions and buffered data stay."""
        self._check_open()
        for tp in partitions:
            self._state(tp).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        self._check_open()
        for tp in partitions:
            self._state(tp).paused = False
        self._wake()
        if self._data is not None and any(fp.tp in partitions for fp in self._buffer):
            self._data.set()

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, state in self._states.items() if state.paused)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark the last fetch of ``tp`` reported (None before one)."""
        hw = self._state(tp).high_watermark
        return hw if hw >= 0 else None

    # Polling ------------------------------------------------------------------------

    async def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of the assigned partitions, at most ``max_records`` (default ``max.poll.records``) in all.

        Returns as soon as any record is buffered, or an empty dict after
        ``timeout_ms``. Each partition's list is in offset order and continues
        exactly at its position; positions move past what is returned.
        """
        self._check_open()
        if self._fetcher is None:
            await self.start()
        if not self._states and self._group is None:
            raise RuntimeError("no partitions are assigned: call assign() or subscribe() before poll()")
        limit = max_records or self.config["max.poll.records"]
        if limit < 1:
            raise ValueError("max_records must be at least 1")
        assert self._data is not None
        deadline = time.monotonic() + timeout_ms / 1000
        self._maybe_auto_commit()
        while True:
            if self._group is not None:
                await self._group.poll()
            self._raise_errors()
            records = self._collect(limit)
            if records:
                self._wake()  # drained partitions are fetchable again: fetch while the caller works
                return self._interceptors.on_consume(records) if self._interceptors else records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            self._data.clear()
            try:
                await asyncio.wait_for(self._data.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _raise_errors(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        for tp, state in self._states.items():
            if state.error is not None:
                raise state.error
            if tp.topic in self._topic_errors:
                # Once per metadata refresh that finds it, so a poll loop that logs and goes on does not spin.
                raise self._topic_errors.pop(tp.topic)

    def _collect(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Take up to ``limit`` records from the buffer, in arrival order, dropping void data."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        taken = 0
        pending, self._buffer = self._buffer, collections.deque()
        try:
            while pending:
                fp = pending[0]
                state = self._states.get(fp.tp)
                if state is None or state.generation != fp.generation or state.position != fp.next_offset:
                    pending.popleft()  # seeked or unassigned since it was fetched
                    continue
                if state.paused or taken >= limit:
                    self._buffer.append(pending.popleft())
                    continue
                try:
                    records = fp.take(limit - taken)
                except Exception:
                    if out:  # hand out what is good; the next poll raises on this partition again
                        break
                    raise
                state.position = fp.next_offset
                if records:
                    out.setdefault(fp.tp, []).extend(records)
                    taken += len(records)
                if fp.exhausted:
                    pending.popleft()
                else:
                    self._buffer.append(pending.popleft())
        finally:
            self._buffer.extend(pending)
        return out

    # The fetcher ---------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Start metadata refreshes, offset resets and fetches whenever something changed, then sleep."""
        assert self._wakeup is not None
        try:
            while not self._closed:
                self._wakeup.clear()
                now = time.monotonic()
                self._maybe_refresh_metadata(now)
                self._start_resets(now)
                self._start_fetches(now)
                delay = self._next_deadline(now)
                if delay is None:
                    await self._wakeup.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: make poll() say so instead of hanging
            log.exception("the consumer's fetcher failed")
            self._fatal = exc
            if self._data is not None:
                self._data.set()

    def _next_deadline(self, now: float) -> float | None:
        """Seconds until a backoff ends or metadata is due (None: only a wake-up matters)."""
        if not self._states:
            return None
        times = [s.backoff_until for s in self._states.values() if s.backoff_until > now]
        if self._metadata_task is None:
            due = self._refreshed_at_plus_max_age() if not self._metadata_wanted else now
            times.append(max(due, self._metadata_not_before))
        return max(min(times) - now, 0.001) if times else None

    def _refreshed_at_plus_max_age(self) -> float:
        return self.cluster._refreshed_at + self.config["metadata.max.age.ms"] / 1000

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            log.error("consumer task failed", exc_info=task.exception())
            self._fatal = task.exception()
            if self._data is not None:
                self._data.set()
        self._wake()

    def _backoff(self, tps: Iterable[TopicPartition], *, metadata: bool) -> None:
        until = time.monotonic() + self._backoff_s
        for tp in tps:
            state = self._states.get(tp)
            if state is not None:
                state.backoff_until = until
        if metadata:
            self._metadata_wanted = True

    # Metadata

    def _maybe_refresh_metadata(self, now: float) -> None:
        if self._metadata_task is not None or not self._states or now < self._metadata_not_before:
            return
        if not self._metadata_wanted and not self.cluster.stale:
            return
        self._metadata_task = asyncio.get_running_loop().create_task(self._refresh_metadata())
        self._metadata_task.add_done_callback(self._metadata_done)

    def _metadata_done(self, task: asyncio.Task[None]) -> None:
        self._metadata_task = None
        self._task_done(task)

    async def _refresh_metadata(self) -> None:
        topics = {tp.topic for tp in self._states}
        self._metadata_wanted = False
        self._metadata_not_before = time.monotonic() + self._backoff_s
        try:
            await self.cluster.refresh(topics)
        except KafkaError as exc:
            log.info("metadata refresh failed (%s); retrying in %.0f ms", exc, self._backoff_s * 1000)
            self._metadata_wanted = True
            return
        errors: dict[str, KafkaError] = {}
        for tp in self._states:
            code = self.cluster.topic_errors.get(tp.topic)
            if code == ErrorCode.unknown_topic_or_partition:
                errors[tp.topic] = KafkaError(code, f"topic {tp.topic!r} does not exist")
            elif code is not None and not code.retriable:
                errors[tp.topic] = KafkaError(code, f"metadata of topic {tp.topic!r}")
            elif tp.topic in self.cluster.partitions and tp.partition not in self.cluster.partitions[tp.topic]:
                errors[tp.topic] = KafkaError(ErrorCode.unknown_topic_or_partition,
                                              f"topic {tp.topic!r} has no partition {tp.partition}")
            if code is not None or self.cluster.leader(tp) < 0:
                self._metadata_wanted = True  # keep looking, with backoff
        self._topic_errors = errors
        if errors and self._data is not None:
            self._data.set()

    # Offset resets

    def _start_resets(self, now: float) -> None:
        by_node: dict[int, dict[TopicPartition, int]] = {}
        for tp, state in self._states.items():
            if (state.reset is None or state.position is not None or state.busy or state.error is not None
                    or state.backoff_until > now):
                continue
            leader = self.cluster.leader(tp)
            if leader < 0:
                self._metadata_wanted = True
                continue
            by_node.setdefault(leader, {})[tp] = state.generation
        for node, generations in by_node.items():
            for tp in generations:
                self._states[tp].busy = True
            self._spawn(self._reset_from(node, generations))

    async def _reset_from(self, node: int, generations: dict[TopicPartition, int]) -> None:
        """One ListOffsets to ``node`` for partitions awaiting a reset; errors back off and retry."""
        query = {tp: EARLIEST if self._states[tp].reset == "earliest" else LATEST for tp in generations}
        try:
            found, retry, errors = await self._list_offsets_from(node, query)
        except KafkaError as exc:
            log.info("offset reset on broker %s failed (%s); retrying", node, exc)
            found, retry, errors = {}, set(query), {}
        finally:
            for tp in generations:
                if tp in self._states:
                    self._states[tp].busy = False
        for tp, (offset, _, _) in found.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp] and state.position is None:
                log.debug("reset %s-%s to %s (%s)", tp.topic, tp.partition, offset, state.reset)
                self._set_position(tp, state, offset)
        self._backoff(retry, metadata=True)
        for tp, error in errors.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp]:
                state.error = error
        if errors and self._data is not None:
            self._data.set()

    # Fetches

    def _start_fetches(self, now: float) -> None:
        buffered = {fp.tp for fp in self._buffer}
        tps = list(self._states)
        if tps:  # rotate, so a partition that fills fetch.max.bytes does not starve the others
            shift = self._rotation % len(tps)
            tps = tps[shift:] + tps[:shift]
            self._rotation += 1
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            state = self._states[tp]
            if (state.position is None or state.paused or state.busy or state.error is not None
                    or state.backoff_until > now or tp in buffered):
                continue
            leader = self.cluster.leader(tp)
            if leader < 0:
                self._metadata_wanted = True
                continue
            if leader not in self._fetching_nodes:
                by_node.setdefault(leader, []).append(tp)
        for node, partitions in by_node.items():
            self._fetching_nodes.add(node)
            wanted: dict[TopicPartition, tuple[int, int]] = {}
            for tp in partitions:
                state = self._states[tp]
                assert state.position is not None
                state.busy = True
                wanted[tp] = (state.position, state.generation)
            self._spawn(self._fetch_from(node, wanted))

    def _fetch_body(self, wanted: Mapping[TopicPartition, tuple[int, int]]) -> dict[str, Any]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, (offset, _) in wanted.items():
            info = self.cluster.partitions.get(tp.topic, {}).get(tp.partition)
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "current_leader_epoch": info.leader_epoch if info else -1,
                "fetch_offset": offset, "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": self.config["max.partition.fetch.bytes"]})
        return {"replica_id": -1, "max_wait": self.config["fetch.max.wait.ms"],
                "min_bytes": self.config["fetch.min.bytes"], "max_bytes": self.config["fetch.max.bytes"],
                "isolation_level": self._isolation, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": name, "topic_id": None, "partitions": parts} for name, parts in topics.items()],
                "forgotten_topics_data": [], "rack_id": ""}

    async def _fetch_from(self, node: int, wanted: dict[TopicPartition, tuple[int, int]]) -> None:
        """One Fetch to ``node``; what comes back goes to the buffer, errors become backoffs or poll() errors."""
        try:
            try:
                conn = await self.cluster.connection(node)
                response = await conn.request(ApiKey.FETCH, self._fetch_body(wanted))
            except KafkaError as exc:
                if self._closed:
                    return
                log.info("fetch from broker %s failed (%s); retrying in %.0f ms", node, exc, self._backoff_s * 1000)
                self._backoff(wanted, metadata=True)
                return
            if getattr(response, "error_code", ErrorCode.none) != ErrorCode.none:  # v7+: fetch sessions
                log.info("fetch from broker %s failed: %s", node, response.error_code.name)
                self._backoff(wanted, metadata=response.error_code in STALE_METADATA)
                return
            self._handle_fetch(response, wanted)
        finally:
            self._fetching_nodes.discard(node)
            for tp in wanted:
                state = self._states.get(tp)
                if state is not None:
                    state.busy = False

    def _handle_fetch(self, response: Any, wanted: Mapping[TopicPartition, tuple[int, int]]) -> None:
        assert self._data is not None
        out_of_range: dict[TopicPartition, int] = {}
        for topic in response.responses:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition_index)
                if tp not in wanted:
                    continue
                offset, generation = wanted[tp]
                state = self._states.get(tp)
                if state is None or state.generation != generation or state.position != offset:
                    continue  # seeked or unassigned while the fetch was in flight
                code = part.error_code
                if code == ErrorCode.none:
                    state.high_watermark = part.high_watermark
                    state.last_stable_offset = part.last_stable_offset
                    state.log_start_offset = getattr(part, "log_start_offset", -1)  # v5+
                    if part.records:
                        aborted = [(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()]
                        self._buffer.append(FetchedPartition(
                            tp, part.records, offset, generation=generation, high_watermark=part.high_watermark,
                            aborted_transactions=aborted, read_committed=self._read_committed,
                            check_crc=self.config["check.crcs"], key_deserializer=self._key_deserializer,
                            value_deserializer=self._value_deserializer))
                        self._data.set()
                elif code == ErrorCode.offset_out_of_range:
                    if self._reset_strategy == "none":
                        out_of_range[tp] = offset
                    else:
                        log.info("offset %s of %s-%s is out of range; resetting to %s", offset, tp.topic,
                                 tp.partition, self._reset_strategy)
                        self._request_reset(tp, state)
                elif code in STALE_METADATA:
                    self._backoff([tp], metadata=True)
                else:
                    state.error = KafkaError(code, f"fetching {tp.topic}-{tp.partition} at offset {offset}")
                    self._data.set()
        if out_of_range:
            error = OffsetOutOfRangeError(out_of_range)
            for tp in out_of_range:
                self._states[tp].error = error
            self._data.set()

    # Offset lookups ------------------------------------------------------------------

    async def beginning_offsets(self, partitions: Iterable[TopicPartition],
                                timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        found = await self._list_offsets({tp: EARLIEST for tp in partitions}, timeout_ms)
        return {tp: offset for tp, (offset, _, _) in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> dict[TopicPartition, int]:
        """The offset after the last readable record: the high watermark (last stable offset for read_committed)."""
        found = await self._list_offsets({tp: LATEST for tp in partitions}, timeout_ms)
        return {tp: offset for tp, (offset, _, _) in found.items()}

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                                ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, ``(offset, timestamp)`` of the first record with a timestamp >= the given one; None if none."""
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp.topic}-{tp.partition} must be an int >= 0, not {ts!r}")
        found = await self._list_offsets(dict(timestamps), timeout_ms)
        return {tp: None if offset < 0 else (offset, ts) for tp, (offset, ts, _) in found.items()}

    async def _list_offsets(self, query: Mapping[TopicPartition, int], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                            ) -> dict[TopicPartition, tuple[int, int, int]]:
        """``{tp: (offset, timestamp, leader_epoch)}`` by ListOffsets at each leader, retrying retriable errors."""
        self._check_open()
        deadline = time.monotonic() + timeout_ms / 1000
        remaining = dict(query)
        result: dict[TopicPartition, tuple[int, int, int]] = {}
        last_error: Exception | None = None
        refresh = any(self.cluster.leader(tp) < 0 for tp in remaining)
        while remaining:
            try:
                if refresh:
                    await asyncio.wait_for(self.cluster.refresh({tp.topic for tp in remaining}),
                                           max(deadline - time.monotonic(), 0.001))
                self._check_topics(remaining)
                by_node: dict[int, dict[TopicPartition, int]] = {}
                for tp, ts in remaining.items():
                    by_node.setdefault(self.cluster.leader(tp), {})[tp] = ts
                if -1 in by_node:
                    last_error = KafkaError(ErrorCode.leader_not_available, "no leader known")
                    by_node.pop(-1)
                answers = await asyncio.wait_for(
                    asyncio.gather(*(self._list_offsets_from(node, q) for node, q in by_node.items()),
                                   return_exceptions=True),
                    max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise KafkaTimeoutError(f"offsets not found within {timeout_ms} ms"
                                        + (f" (last error: {last_error})" if last_error else "")) from None
            except KafkaError as exc:
                if not exc.retriable or exc.code == ErrorCode.unknown_topic_or_partition:
                    raise
                answers, last_error = [], exc
            for answer in answers:
                if isinstance(answer, KafkaError) and answer.retriable:
                    last_error = answer
                    continue
                if isinstance(answer, BaseException):
                    raise answer
                found, _, errors = answer
                if errors:
                    raise next(iter(errors.values()))
                for tp, value in found.items():
                    result[tp] = value
                    remaining.pop(tp, None)
            if remaining:
                if time.monotonic() + self._backoff_s >= deadline:
                    raise KafkaTimeoutError(f"offsets not found within {timeout_ms} ms"
                                            + (f" (last error: {last_error})" if last_error else ""))
                await asyncio.sleep(self._backoff_s)
                refresh = True
        return result

    def _check_topics(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            code = self.cluster.topic_errors.get(tp.topic)
            if code == ErrorCode.unknown_topic_or_partition:
                raise KafkaError(code, f"topic {tp.topic!r} does not exist")
            if code is not None and not code.retriable:
                raise KafkaError(code, f"metadata of topic {tp.topic!r}")
            known = self.cluster.partitions.get(tp.topic)
            if known is not None and tp.partition not in known:
                raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {tp.topic!r} has no partition {tp.partition}")

    async def _list_offsets_from(self, node: int, query: Mapping[TopicPartition, int]) -> tuple[
            dict[TopicPartition, tuple[int, int, int]], set[TopicPartition], dict[TopicPartition, KafkaError]]:
        """One ListOffsets: (answers, partitions worth retrying, partitions that failed for good)."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, ts in query.items():
            info = self.cluster.partitions.get(tp.topic, {}).get(tp.partition)
            topics.setdefault(tp.topic, []).append({"partition_index": tp.partition, "timestamp": ts, "max_num_offsets": 1,
                                                    "current_leader_epoch": info.leader_epoch if info else -1})
        conn = await self.cluster.connection(node)
        response = await conn.request(ApiKey.LIST_OFFSETS, {
            "replica_id": -1, "isolation_level": self._isolation,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]})
        found: dict[TopicPartition, tuple[int, int, int]] = {}
        retry: set[TopicPartition] = set()
        errors: dict[TopicPartition, KafkaError] = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if tp not in query:
                    continue
                if part.error_code == ErrorCode.none:
                    found[tp] = (part.offset, part.timestamp, getattr(part, "leader_epoch", -1))
                elif part.error_code in STALE_METADATA or part.error_code.retriable:
                    retry.add(tp)
                else:
                    errors[tp] = KafkaError(part.error_code, f"ListOffsets for {tp.topic}-{tp.partition}")
        retry |= set(query) - set(found) - set(errors)
        return found, retry, errors

    # Committed offsets ----------------------------------------------------------------

    async def committed(self, partitions: Iterable[TopicPartition], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                        ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The offsets ``group.id`` committed for these partitions (None where it has none).

        Asks the group coordinator (FindCoordinator, then OffsetFetch). A broker
        without a group coordinator (josef without its coordinator-group
        plugin) answers with :class:`UnsupportedVersionError`.
        """
        self._check_open()
        group = self.config["group.id"]
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
                    self._forget_coordinator()
                if not (exc.retriable or exc.code in COORDINATOR_RETRY) or time.monotonic() + self._backoff_s >= deadline:
                    raise
                log.info("committed offsets of group %r: %s; retrying", group, exc)
            await asyncio.sleep(self._backoff_s)

    async def _offset_fetch(self, group: str, tps: list[TopicPartition] | None
                            ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """``group``'s committed offsets of ``tps`` (None where there is none), or with ``tps=None`` every one it has."""
        conn = await self._coordinator(group)
        version = conn.version(ApiKey.OFFSET_FETCH)
        wanted = None
        if tps is None:
            if version < 2:
                raise UnsupportedVersionError("the broker's OffsetFetch cannot list all of a group's offsets (needs v2+)")
        else:
            topics: dict[str, list[int]] = {}
            for tp in tps:
                topics.setdefault(tp.topic, []).append(tp.partition)
            wanted = [{"name": name, "partition_indexes": parts} for name, parts in topics.items()]
        response = await conn.request(ApiKey.OFFSET_FETCH, {
            "group_id": group, "topics": wanted, "require_stable": True,
            "groups": [{"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}]}, version=version)
        if version >= 8:
            [answer] = [g for g in response.groups if g.group_id == group]
            code, topics_out = answer.error_code, answer.topics
        else:
            code, topics_out = getattr(response, "error_code", ErrorCode.none), response.topics
        if code != ErrorCode.none:
            raise KafkaError(code, f"OffsetFetch for group {group!r}")
        result: dict[TopicPartition, OffsetAndMetadata | None] = {} if tps is None else {tp: None for tp in tps}
        for topic in topics_out:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if part.error_code != ErrorCode.none:
                    raise KafkaError(part.error_code, f"OffsetFetch for {tp.topic}-{tp.partition} of group {group!r}")
                if (tps is None or tp in result) and part.committed_offset >= 0:
                    result[tp] = OffsetAndMetadata(part.committed_offset, part.metadata,
                                                   getattr(part, "committed_leader_epoch", -1))
        return result

    async def _coordinator(self, group: str) -> Any:
        """A connection to ``group``'s coordinator (the consumer's ordinary one to that broker)."""
        return await self.cluster.connection(await self._find_coordinator(group))

    async def _find_coordinator(self, group: str) -> tuple[str, int]:
        """The address of ``group``'s coordinator, by FindCoordinator (key type 0: group); kept until forgotten."""
        if self._coordinator_address is not None:
            return self._coordinator_address
        conn = await self.cluster.any_connection()
        try:
            version = conn.version(ApiKey.FIND_COORDINATOR)
        except UnsupportedVersionError as exc:
            raise UnsupportedVersionError(f"consumer groups and committed offsets need a group coordinator: "
                                          f"{exc.message}") from None
        response = await conn.request(ApiKey.FIND_COORDINATOR, {"key": group, "key_type": 0, "coordinator_keys": [group]},
                                      version=version)
        if version >= 4:
            [found] = [c for c in response.coordinators if c.key == group]
        else:
            found = response
        if found.error_code != ErrorCode.none:
            raise KafkaError(found.error_code, f"FindCoordinator for group {group!r}: {found.error_message or ''}")
        self._coordinator_address = (found.host, found.port)
        return self._coordinator_address

    def _forget_coordinator(self) -> None:
        self._coordinator_address = None

    # Group membership -------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | str | None = None, *, pattern: str | re.Pattern[str] | None = None,
                  listener: Any = None) -> None:
        """Join ``group.id`` and consume the partitions the group assigns from these topics (or those matching ``pattern``).

        The group shares the partitions of the subscribed topics among its
        members (with the first assignor of ``partition.assignment.strategy``
        every member has); the join happens in :meth:`poll`. ``pattern`` is a
        regular expression matched against whole topic names, re-evaluated at
        every metadata refresh (``metadata.max.age.ms``). ``listener`` is a
        :class:`RebalanceListener` (or any object with some of its methods).
        Subscribing again replaces the subscription (and rejoins).
        """
        self._check_open()
        if not self.config["group.id"]:
            raise KafkaError(ErrorCode.invalid_group_id, "subscribe() needs group.id")
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe() takes topics or pattern=, not both or neither")
        compiled = None
        names: list[str] = []
        if pattern is not None:
            try:
                compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"subscribe(pattern={pattern!r}) is not a valid regular expression: {exc}") from None
        else:
            names = [topics] if isinstance(topics, str) else list(topics or ())
            if not names:
                raise ValueError("subscribe() needs at least one topic; unsubscribe() stops consuming")
            for name in names:
                if not isinstance(name, str) or not name.strip():
                    raise ValueError(f"subscribe() takes topic names, not {name!r}")
        if self._manual:
            raise RuntimeError("assign() and subscribe() are mutually exclusive: unsubscribe() first")
        if self._group is None and self._consumer_protocol:
            from josef_client.group_consumer import ConsumerGroupMember

            self._group = ConsumerGroupMember(self, topics=names, pattern=compiled, listener=listener)
        elif self._group is None:
            self._group = ClassicGroupMember(self, self._assignors, topics=names, pattern=compiled, listener=listener)
        else:
            self._group.set_subscription(names, compiled, listener)
        self._wake()
        if self._data is not None:
            self._data.set()

    def subscription(self) -> frozenset[str]:
        """The subscribed topics (those the pattern matched so far, for a pattern)."""
        return frozenset(self._group.topics) if self._group is not None else frozenset()

    async def unsubscribe(self) -> None:
        """Leave the group (committing, with auto commit, and revoking first), or drop the assign()ed partitions."""
        self._check_open()
        if self._group is not None:
            try:
                await self._group.close()
            finally:
                self._group = None
        self._manual = False
        self._set_assignment([], reset=False)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, generation and member id, as ``send_offsets_to_transaction`` wants them."""
        if self._group is not None:
            return self._group.metadata()
        return ConsumerGroupMetadata(self.config["group.id"] or "")

    # Commits ----------------------------------------------------------------------------

    def _positions(self, partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        wanted = None if partitions is None else set(partitions)
        return {tp: OffsetAndMetadata(state.position) for tp, state in sorted(self._states.items())
                if state.position is not None and (wanted is None or tp in wanted)}

    def _offsets_to_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None
                           ) -> dict[TopicPartition, OffsetAndMetadata]:
        if not self.config["group.id"]:
            raise KafkaError(ErrorCode.invalid_group_id, "commits need group.id")
        if offsets is None:
            return self._positions()
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

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     timeout_ms: int | None = None) -> None:
        """Commit offsets (default: the position of every assigned partition) and wait for the coordinator's answer.

        An offset is the next one to consume. Raises :class:`CommitFailedError`
        when the group has rebalanced since this member's generation (its
        partitions may be someone else's now), :class:`KafkaTimeoutError`
        after ``timeout_ms`` (default ``default.api.timeout.ms``) of retrying.
        """
        self._check_open()
        found = self._offsets_to_commit(offsets)
        if found:
            await self._commit(found, self.config["default.api.timeout.ms"] if timeout_ms is None else timeout_ms)

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: Any = None) -> asyncio.Task[None]:
        """Commit without waiting; ``callback(offsets, error_or_None)`` (sync or async) is called when it is done.

        Returns the task (await it to wait). Commits are sent in call order.
        """
        self._check_open()
        found = self._offsets_to_commit(offsets)

        async def run() -> None:
            error: KafkaError | None = None
            try:
                if found:
                    await self._commit(found, self.config["request.timeout.ms"])
            except KafkaError as exc:
                error = exc
            if callback is not None:
                try:
                    result = callback(found, error)
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

    def _maybe_auto_commit(self) -> None:
        if not self._auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config["auto.commit.interval.ms"] / 1000
        if self._group is not None and not self._group.stable:
            return
        offsets = self._positions()
        if offsets:
            def logged(offsets: Any, error: KafkaError | None) -> None:
                if error is not None:
                    log.info("auto commit failed: %s", error)
            self.commit_async(offsets, logged)

    async def _commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_ms: float) -> None:
        """OffsetCommit to the group's coordinator, retrying what may pass elsewhere or later, within ``timeout_ms``."""
        group = self.config["group.id"]
        if self._group is not None:
            generation, member, instance = self._group.commit_identity()
        else:
            generation, member, instance = -1, "", None
        deadline = time.monotonic() + timeout_ms / 1000
        last: KafkaError | None = None
        while True:
            try:
                conn = await asyncio.wait_for(self._coordinator(group), max(deadline - time.monotonic(), 0.001))
                errors = await asyncio.wait_for(self._offset_commit(conn, group, offsets, generation, member, instance),
                                                max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise KafkaTimeoutError(f"commit to group {group!r} not done within {int(timeout_ms)} ms"
                                        + (f" (last error: {last})" if last else "")) from None
            except UnsupportedVersionError:
                raise
            except KafkaError as exc:
                if not (exc.retriable or exc.code in COORDINATOR_RETRY):
                    raise
                self._forget_coordinator()
                last = exc
            else:
                if not errors:
                    if self._interceptors:
                        self._interceptors.on_commit(dict(offsets))
                    return
                tp, code = min(errors.items())
                what = f"OffsetCommit of {tp.topic}-{tp.partition} for group {group!r}"
                if code in FENCED:
                    if self._group is not None:
                        if code == ErrorCode.rebalance_in_progress:
                            self._group.request_rejoin("a commit found the group rebalancing")
                        elif code == ErrorCode.unknown_member_id:
                            self._group.reset_generation("OffsetCommit: UNKNOWN_MEMBER_ID", reset_member_id=True)
                        elif code == ErrorCode.illegal_generation:
                            self._group.reset_generation("OffsetCommit: ILLEGAL_GENERATION", reset_member_id=False)
                    raise CommitFailedError(code, f"{what}: the group has rebalanced or is rebalancing; "
                                                  "the partitions may now belong to another member")
                if code in COORDINATOR_RETRY or code.retriable:
                    if code in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available):
                        self._forget_coordinator()
                        if self._group is not None:
                            self._group.coordinator_dead(code.name)
                    last = KafkaError(code, what)
                else:
                    raise KafkaError(code, what)
            if time.monotonic() + self._backoff_s >= deadline:
                raise KafkaTimeoutError(f"commit to group {group!r} not done within {int(timeout_ms)} ms"
                                        + (f" (last error: {last})" if last else ""))
            await asyncio.sleep(self._backoff_s)

    async def _offset_commit(self, conn: Any, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                             generation: int, member: str, instance: str | None) -> dict[TopicPartition, ErrorCode]:
        """One OffsetCommit; the partitions that failed, with their errors."""
        version = conn.version(ApiKey.OFFSET_COMMIT)
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, om in sorted(offsets.items()):
            topics.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": om.offset,
                "committed_leader_epoch": om.leader_epoch, "committed_metadata": om.metadata})
        response = await conn.request(ApiKey.OFFSET_COMMIT, {
            "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
            "group_instance_id": instance, "retention_time": -1,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}, version=version)
        errors = {}
        answered = set()
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                answered.add(tp)
                if part.error_code != ErrorCode.none:
                    errors[tp] = part.error_code
        for tp in offsets:
            if tp not in answered:
                errors[tp] = ErrorCode.unknown_server_error
        return errors


class _ThreadedListener:
    """A synchronous consumer's rebalance listener: plain callbacks run on a worker thread while ``poll()`` waits.

    So they may call the consumer's blocking methods (``commit()``,
    ``seek()``...), which hop onto the consumer's event loop, free meanwhile.
    """

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    async def _call(self, name: str, partitions: list[TopicPartition], fallback: str | None = None) -> None:
        callback = getattr(self.listener, name, None)
        if callback is None and fallback is not None:
            callback = getattr(self.listener, fallback, None)
        if callback is None:
            return
        if inspect.iscoroutinefunction(callback):
            await callback(partitions)
            return
        result = await asyncio.to_thread(callback, partitions)
        if inspect.isawaitable(result):
            await result

    async def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        await self._call("on_partitions_revoked", partitions)

    async def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        await self._call("on_partitions_assigned", partitions)

    async def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        await self._call("on_partitions_lost", partitions, "on_partitions_revoked")


class Consumer:
    """The synchronous consumer: :class:`AsyncConsumer`'s methods, blocking, on a private event loop thread.

    The fetcher runs on that thread too, so records are fetched while the
    calling thread processes the previous poll.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, plugin_manager: Any = None, **kwargs: Any) -> None:
        self._closed = False
        self._thread = LoopThread("josef-consumer")
        try:
            self._consumer = self._thread.run(self._make(config, plugin_manager, kwargs))
            self._thread.run(self._consumer.start())
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._consumer.config

    @staticmethod
    async def _make(config: Mapping[str, Any] | None, plugin_manager: Any, kwargs: dict[str, Any]) -> AsyncConsumer:
        return AsyncConsumer(config, plugin_manager=plugin_manager, **kwargs)

    def _run(self, coro: Any) -> Any:
        if self._closed:
            coro.close()
            raise RuntimeError("the consumer is closed")
        return self._thread.run(coro)

    def _call(self, method: Any, *args: Any) -> Any:
        """Run a plain method on the loop thread: the fetcher touches the same state there."""
        async def call() -> Any:
            return method(*args)
        return self._run(call())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._call(self._consumer.assign, list(partitions))

    def subscribe(self, topics: Iterable[str] | str | None = None, *, pattern: str | re.Pattern[str] | None = None,
                  listener: Any = None) -> None:
        """As :meth:`AsyncConsumer.subscribe`; the listener's plain callbacks run on a worker thread during poll()."""
        wrapped = None if listener is None else _ThreadedListener(listener)
        self._call(lambda: self._consumer.subscribe(None if topics is None else (
            [topics] if isinstance(topics, str) else list(topics)), pattern=pattern, listener=wrapped))

    def unsubscribe(self) -> None:
        self._run(self._consumer.unsubscribe())

    def subscription(self) -> frozenset[str]:
        return self._call(self._consumer.subscription)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._call(self._consumer.group_metadata)

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
               timeout_ms: int | None = None) -> None:
        self._run(self._consumer.commit(None if offsets is None else dict(offsets), timeout_ms))

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: Any = None) -> concurrent.futures.Future[None]:
        """As :meth:`AsyncConsumer.commit_async`; returns a future, and a plain callback runs on a worker thread."""
        if self._closed:
            raise RuntimeError("the consumer is closed")

        async def threaded(found: Any, error: Any) -> None:
            await asyncio.to_thread(callback, found, error)

        async def start() -> None:
            task = self._consumer.commit_async(None if offsets is None else dict(offsets),
                                               None if callback is None else threaded)
            await task

        return asyncio.run_coroutine_threadsafe(start(), self._thread.loop)

    def assignment(self) -> frozenset[TopicPartition]:
        return self._call(self._consumer.assignment)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._call(self._consumer.seek, tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._run(self._consumer.seek_to_beginning(*partitions))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._run(self._consumer.seek_to_end(*partitions))

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        return self._run(self._consumer.poll(timeout_ms, max_records))

    def pause(self, *partitions: TopicPartition) -> None:
        self._call(self._consumer.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._call(self._consumer.resume, *partitions)

    def paused(self) -> frozenset[TopicPartition]:
        return self._call(self._consumer.paused)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._call(self._consumer.highwater, tp)

    def position(self, tp: TopicPartition, timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> int:
        return self._run(self._consumer.position(tp, timeout_ms))

    def committed(self, partitions: Iterable[TopicPartition], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                  ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self._run(self._consumer.committed(list(partitions), timeout_ms))

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                          ) -> dict[TopicPartition, tuple[int, int] | None]:
        return self._run(self._consumer.offsets_for_times(dict(timestamps), timeout_ms))

    def beginning_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                          ) -> dict[TopicPartition, int]:
        return self._run(self._consumer.beginning_offsets(list(partitions), timeout_ms))

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                    ) -> dict[TopicPartition, int]:
        return self._run(self._consumer.end_offsets(list(partitions), timeout_ms))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._thread.run(self._consumer.close())
        finally:
            self._closed = True
            self._thread.stop()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
