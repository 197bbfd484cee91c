"""The consumer's background fetcher: records of assigned partitions fetched ahead of ``poll()``, as Kafka's Java fetcher does.

A background task keeps one Fetch request in flight per leader broker for the
assigned partitions that are fetchable: they have a position, are not paused,
have no unreturned data buffered and are not backing off after an error.
Responses land in a buffer that holds at most one response part per
partition, so memory stays bounded (about ``max.partition.fetch.bytes`` per
partition, ``fetch.max.bytes`` per broker) while the next records are already
on their way as the application processes the previous poll. The same task
refreshes the metadata of the assigned topics and resets positions by
``auto.offset.reset`` (one ListOffsets per leader).

Positions belong to :class:`~josef_client.subscription_state.SubscriptionState`,
not to the buffered data: buffered or in-flight data of an older generation
is dropped when it is seen. Records are decoded only when :meth:`Fetcher.collect`
hands them out (see :mod:`josef_client.records`).

Errors: retriable ones (a leader moved, a broker restarted, a request timed
out) are retried after ``retry.backoff.ms`` with refreshed metadata and never
reach the application; :meth:`Fetcher.raise_errors` raises what needs a
decision from it: an offset out of range with ``auto.offset.reset=none``, a
topic that does not exist, a corrupt batch or a failing deserialiser (seek
past the record to go on).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import AbstractSet, Any, Iterable, Mapping

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError
from josef.protocol.records import ConsumerRecord
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import STALE_METADATA, Cluster
from josef_client.offset_lookups import OffsetLookups, reset_timestamp
from josef_client.records import FetchedPartition
from josef_client.subscription_state import SubscriptionState

__all__ = ["Fetcher", "OffsetOutOfRangeError"]

log = logging.getLogger(__name__)


class OffsetOutOfRangeError(KafkaError):
    """The position is outside the log and ``auto.offset.reset`` is ``none``: seek to go on.

    ``partitions`` maps each partition to the offset the broker refused.
    """

    def __init__(self, partitions: Mapping[TopicPartition, int]) -> None:
        self.partitions = dict(partitions)
        where = ", ".join(f"{tp.topic}-{tp.partition}@{offset}" for tp, offset in self.partitions.items())
        super().__init__(ErrorCode.offset_out_of_range, f"fetch position out of range and auto.offset.reset=none: {where}")


async def _cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel the tasks and wait until they are over."""
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    for task in running:
        try:
            await task
        except BaseException:  # noqa: BLE001 - cancelled, or failed: either way it is over
            pass


class Fetcher:
    """The fetch loop, its requests and the buffer of fetched data (see the module docstring).

    It is the :class:`~josef_client.subscription_state.SubscriptionListener`
    of the consumer's subscription state: assignment changes and seeks drop
    void data at once and wake the loop.
    """

    def __init__(self, config: Mapping[str, Any], cluster: Cluster, subscriptions: SubscriptionState,
                 lookups: OffsetLookups) -> None:
        self.config = config
        self.cluster = cluster
        self.subscriptions = subscriptions
        self.lookups = lookups
        self._read_committed = config["isolation.level"] == "read_committed"
        self._isolation = 1 if self._read_committed else 0
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._key_deserializer = config["key.deserializer"]
        self._value_deserializer = config["value.deserializer"]
        self._buffer: collections.deque[FetchedPartition] = collections.deque()
        self._fetching_nodes: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._topic_errors: dict[str, KafkaError] = {}
        self._metadata_wanted = True
        self._metadata_not_before = 0.0
        self._metadata_task: asyncio.Task[None] | None = None
        self._rotation = 0
        #: Set when something may have become fetchable: the fetch loop looks again.
        self._wakeup = asyncio.Event()
        #: Set when poll() has something to look at: data, an error, a rebalance to go on with.
        self._data = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._stopped = False

    # Lifecycle and wake-ups ------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._loop_task is not None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._fetch_loop(), name="josef-consumer-fetcher")

    async def stop(self) -> None:
        """End the fetch loop, so that nothing new starts; requests in flight go on."""
        self._stopped = True
        await _cancel([self._loop_task])

    async def cancel_requests(self) -> None:
        """End the requests in flight and drop the buffer; close the connections first, so requests fail into their tasks."""
        await _cancel([self._metadata_task, *self._tasks])
        self._buffer.clear()

    def wake(self) -> None:
        self._wakeup.set()

    def wake_poll(self) -> None:
        self._data.set()

    async def wait_for_data(self, timeout_s: float) -> None:
        """Until :meth:`wake_poll` (data, an error...) or ``timeout_s``."""
        self._data.clear()
        try:
            await asyncio.wait_for(self._data.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # Subscription changes (the SubscriptionListener) -------------------------------------

    def assignment_changed(self, assigned: AbstractSet[TopicPartition]) -> None:
        self._buffer = collections.deque(fp for fp in self._buffer if fp.tp in assigned)
        self._topic_errors = {t: e for t, e in self._topic_errors.items() if any(tp.topic == t for tp in assigned)}
        if any(tp.topic not in self.cluster.partitions for tp in assigned):
            self._metadata_wanted = True
            self._metadata_not_before = 0.0
        self.wake()

    def seeked(self, tp: TopicPartition) -> None:
        self._buffer = collections.deque(fp for fp in self._buffer if fp.tp != tp)
        self.wake()

    def resumed(self, partitions: Iterable[TopicPartition]) -> None:
        self.wake()
        if any(fp.tp in partitions for fp in self._buffer):
            self._data.set()

    # What poll() takes -------------------------------------------------------------------

    def raise_errors(self) -> None:
        """Raise what poll() must report: a fetcher bug, a partition's error, a missing topic."""
        if self._fatal is not None:
            raise self._fatal
        for tp, state in self.subscriptions.states.items():
            if state.error is not None:
                raise state.error
            if tp.topic in self._topic_errors:
                # Once per metadata refresh that finds it, so a poll loop that logs and goes on does not spin.
                raise self._topic_errors.pop(tp.topic)

    def collect(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Take up to ``limit`` records from the buffer, in arrival order, dropping void data; positions move past them."""
        states = self.subscriptions.states
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        taken = 0
        drained = False
        pending, self._buffer = self._buffer, collections.deque()
        try:
            while pending:
                fp = pending[0]
                state = states.get(fp.tp)
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
                    drained = True
                else:
                    self._buffer.append(pending.popleft())
        finally:
            self._buffer.extend(pending)
        if drained:  # fetchable again, even when all it held was control or aborted batches (no record to return)
            self.wake()
        return out

    # The loop ----------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Start metadata refreshes, offset resets and fetches whenever something changed, then sleep."""
        try:
            while not self._stopped:
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
            self._data.set()

    def _next_deadline(self, now: float) -> float | None:
        """Seconds until a backoff ends or metadata is due (None: only a wake-up matters)."""
        states = self.subscriptions.states
        if not states:
            return None
        times = [s.backoff_until for s in states.values() if s.backoff_until > now]
        if self._metadata_task is None:
            due = self.cluster.refresh_due_at if not self._metadata_wanted else now
            times.append(max(due, self._metadata_not_before))
        return max(min(times) - now, 0.001) if times else None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            log.error("consumer task failed", exc_info=task.exception())
            self._fatal = task.exception()
            self._data.set()
        self.wake()

    def _backoff(self, tps: Iterable[TopicPartition], *, metadata: bool) -> None:
        until = time.monotonic() + self._backoff_s
        states = self.subscriptions.states
        for tp in tps:
            state = states.get(tp)
            if state is not None:
                state.backoff_until = until
        if metadata:
            self._metadata_wanted = True

    # Metadata

    def _maybe_refresh_metadata(self, now: float) -> None:
        if self._metadata_task is not None or not self.subscriptions.states or now < self._metadata_not_before:
            return
        if not self._metadata_wanted and not self.cluster.stale:
            return
        self._metadata_task = asyncio.get_running_loop().create_task(self._refresh_metadata())
        self._metadata_task.add_done_callback(self._metadata_done)

    def _metadata_done(self, task: asyncio.Task[None]) -> None:
        self._metadata_task = None
        self._task_done(task)

    async def _refresh_metadata(self) -> None:
        states = self.subscriptions.states
        topics = {tp.topic for tp in states}
        self._metadata_wanted = False
        self._metadata_not_before = time.monotonic() + self._backoff_s
        try:
            await self.cluster.refresh(topics)
        except KafkaError as exc:
            log.info("metadata refresh failed (%s); retrying in %.0f ms", exc, self._backoff_s * 1000)
            self._metadata_wanted = True
            return
        errors: dict[str, KafkaError] = {}
        for tp in states:
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
        if errors:
            self._data.set()

    # Offset resets

    def _start_resets(self, now: float) -> None:
        states = self.subscriptions.states
        by_node: dict[int, dict[TopicPartition, int]] = {}
        for tp, state in states.items():
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
                states[tp].busy = True
            self._spawn(self._reset_from(node, generations))

    async def _reset_from(self, node: int, generations: dict[TopicPartition, int]) -> None:
        """One ListOffsets to ``node`` for partitions awaiting a reset; errors back off and retry."""
        states = self.subscriptions.states
        query = {tp: reset_timestamp(states[tp].reset) for tp in generations}
        try:
            found, retry, errors = await self.lookups.list_offsets_from(node, query)
        except KafkaError as exc:
            log.info("offset reset on broker %s failed (%s); retrying", node, exc)
            found, retry, errors = {}, set(query), {}
        finally:
            for tp in generations:
                if tp in states:
                    states[tp].busy = False
        for tp, (offset, _, _) in found.items():
            state = states.get(tp)
            if state is not None and state.generation == generations[tp] and state.position is None:
                log.debug("reset %s-%s to %s (%s)", tp.topic, tp.partition, offset, state.reset)
                self.subscriptions.set_position(state, offset)
        self._backoff(retry, metadata=True)
        for tp, error in errors.items():
            state = states.get(tp)
            if state is not None and state.generation == generations[tp]:
                state.error = error
        if errors:
            self._data.set()

    # Fetches

    def _start_fetches(self, now: float) -> None:
        states = self.subscriptions.states
        buffered = {fp.tp for fp in self._buffer}
        tps = list(states)
        if tps:  # rotate, so a partition that fills fetch.max.bytes does not starve the others
            shift = self._rotation % len(tps)
            tps = tps[shift:] + tps[:shift]
            self._rotation += 1
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            state = states[tp]
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
                state = states[tp]
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
                if self._stopped:
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
            states = self.subscriptions.states
            for tp in wanted:
                state = states.get(tp)
                if state is not None:
                    state.busy = False

    def _handle_fetch(self, response: Any, wanted: Mapping[TopicPartition, tuple[int, int]]) -> None:
        states = self.subscriptions.states
        reset_strategy = self.subscriptions.reset_strategy
        out_of_range: dict[TopicPartition, int] = {}
        for topic in response.responses:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition_index)
                if tp not in wanted:
                    continue
                offset, generation = wanted[tp]
                state = states.get(tp)
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
                    if reset_strategy == "none":
                        out_of_range[tp] = offset
                    else:
                        log.info("offset %s of %s-%s is out of range; resetting to %s", offset, tp.topic,
                                 tp.partition, reset_strategy)
                        self.subscriptions.request_reset(tp, state)
                elif code in STALE_METADATA:
                    self._backoff([tp], metadata=True)
                else:
                    state.error = KafkaError(code, f"fetching {tp.topic}-{tp.partition} at offset {offset}")
                    self._data.set()
        if out_of_range:
            error = OffsetOutOfRangeError(out_of_range)
            for tp in out_of_range:
                states[tp].error = error
            self._data.set()
