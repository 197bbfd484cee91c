"""The consumer: records of assigned partitions, fetched ahead of ``poll()``, as Kafka's Java client does.

:class:`AsyncConsumer` is the facade over the pieces Kafka's Java consumer
has too, each in its own module:

- :mod:`~josef_client.subscription_state`: the assigned partitions, their
  positions, offset resets and pause state;
- :mod:`~josef_client.fetcher`: the background task that fetches from each
  leader, buffers what comes back, resets positions and watches metadata;
  ``poll()`` takes records from its buffer;
- :mod:`~josef_client.offset_lookups`: ListOffsets lookups;
- :mod:`~josef_client.consumer_coordinator`: group membership (subscribe),
  committed offsets and commits, with the coordinator's requests in
  :mod:`~josef_client.coordinator_requests`.

:class:`Consumer` is the synchronous wrapper.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import re
import time
from typing import Any, Iterable, Mapping

from kio.schema.errors import ErrorCode

from josef.protocol.errors import KafkaError
from josef.protocol.records import ConsumerRecord, RecordDeserializationError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import Cluster
from josef_client.config import CONSUMER, ConfigError, build_config
from josef_client.consumer_coordinator import ConsumerCoordinator
from josef_client.coordinator_requests import OffsetAndMetadata
from josef_client.fetcher import Fetcher, OffsetOutOfRangeError
from josef_client.group import (
    ClassicGroupMember,
    CommitFailedError,
    ConsumerGroupMetadata,
    RebalanceListener,
)
from josef_client.interceptors import InterceptorChain
from josef_client.offset_lookups import EARLIEST, LATEST, OffsetLookups, reset_timestamp
from josef_client.subscription_state import NoOffsetForPartitionError, SubscriptionState
from josef_client.sync import LoopThread

__all__ = ["AsyncConsumer", "CommitFailedError", "Consumer", "ConsumerGroupMetadata", "ConsumerRecord",
           "NoOffsetForPartitionError", "OffsetAndMetadata", "OffsetOutOfRangeError", "RebalanceListener",
           "RecordDeserializationError", "TopicPartition"]

#: How long the offset lookups (position, *_offsets, seek_to_*, committed) retry before giving up,
#: as the Java client's default.api.timeout.ms.
DEFAULT_API_TIMEOUT_MS = 60000


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

    The consumer checks arguments and its own state, and leaves the work to
    its parts (see the module docstring). Assignments come from
    :meth:`assign` or, after :meth:`subscribe`, from the group membership;
    both go through the subscription state (see
    :class:`~josef_client.subscription_state.SubscriptionState`).
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
        self.cluster = Cluster(self.config)
        self._subscriptions = SubscriptionState(self.config["auto.offset.reset"])
        self._lookups = OffsetLookups(self.config, self.cluster)
        self._fetcher = Fetcher(self.config, self.cluster, self._subscriptions, self._lookups)
        self._subscriptions.listener = self._fetcher
        self._coordinator = ConsumerCoordinator(self.config, self.cluster, self._subscriptions, self._interceptors)
        #: assign() was called: subscribe() must wait for unsubscribe().
        self._manual = False
        self._closed = False

    # Lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (metadata from a bootstrap server, so a wrong address fails here) and start the fetcher."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._fetcher.started:
            return
        await self.cluster.refresh([])
        self._fetcher.start()

    async def close(self) -> None:
        """Stop fetching and close the connections; buffered records are dropped."""
        if self._closed:
            return
        if self._fetcher.started:
            await self._coordinator.close()
        self._closed = True
        # The fetcher first, so nothing new starts; then the connections, so requests in flight fail
        # into the tasks awaiting them (rather than into futures nobody reads); then those tasks.
        await self._fetcher.stop()
        await self.cluster.close()
        await self._fetcher.cancel_requests()
        await self.cluster.close()  # one a task may have opened meanwhile

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

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
        if self._coordinator.member is not None:
            raise RuntimeError("assign() and subscribe() are mutually exclusive: unsubscribe() first")
        partitions = list(partitions)
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartition objects, not {tp!r}")
        self._manual = True
        self._subscriptions.set_assignment(partitions, reset=True)

    def assignment(self) -> frozenset[TopicPartition]:
        return self._subscriptions.assignment()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next one :meth:`poll` returns for ``tp``; fetched data from elsewhere is dropped."""
        self._check_open()
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"seek offset must be an int >= 0, not {offset!r}")
        self._subscriptions.seek(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Seek to the log start offset of each partition (all assigned ones when none are given)."""
        await self._seek_to(partitions, EARLIEST)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Seek to the end: the high watermark, or the last stable offset for read_committed."""
        await self._seek_to(partitions, LATEST)

    async def _seek_to(self, partitions: Iterable[TopicPartition], timestamp: int) -> None:
        self._check_open()
        tps = list(partitions) or list(self._subscriptions.states)
        for tp in tps:
            self._subscriptions.state(tp)
        found = await self._lookups.list_offsets({tp: timestamp for tp in tps}, DEFAULT_API_TIMEOUT_MS)
        for tp, (offset, _, _) in found.items():
            if tp in self._subscriptions.states:
                self.seek(tp, offset)

    async def position(self, tp: TopicPartition, timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> int:
        """The offset of the next record :meth:`poll` returns for ``tp``, looked up now if not known yet."""
        self._check_open()
        state = self._subscriptions.state(tp)
        deadline = time.monotonic() + timeout_ms / 1000
        while state.position is None:
            if state.error is not None:
                raise state.error
            member = self._coordinator.member
            if state.reset is None and member is not None and tp in member.pending_positions:
                await member.init_positions()
                if state.position is not None or state.reset is not None:
                    continue
            if state.reset is None:
                raise NoOffsetForPartitionError([tp])
            strategy, generation = state.reset, state.generation
            self._check_open()  # closed while init_positions() or an earlier lookup waited
            found = await self._lookups.list_offsets({tp: reset_timestamp(strategy)},
                                                     max(1, int((deadline - time.monotonic()) * 1000)))
            if self._subscriptions.states.get(tp) is not state:
                raise ValueError(f"{tp.topic}-{tp.partition} was unassigned meanwhile")
            if state.generation == generation and state.position is None:
                self._subscriptions.set_position(state, found[tp][0])
        return state.position

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning these partitions; their positions and buffered data stay."""
        self._check_open()
        self._subscriptions.pause(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._check_open()
        self._subscriptions.resume(partitions)

    def paused(self) -> frozenset[TopicPartition]:
        return self._subscriptions.paused()

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark the last fetch of ``tp`` reported (None before one)."""
        hw = self._subscriptions.state(tp).high_watermark
        return hw if hw >= 0 else None

    # Polling ------------------------------------------------------------------------

    async def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of the assigned partitions, at most ``max_records`` (default ``max.poll.records``) in all.

        Returns as soon as any record is buffered, or an empty dict after
        ``timeout_ms``. Each partition's list is in offset order and continues
        exactly at its position; positions move past what is returned.
        """
        self._check_open()
        if not self._fetcher.started:
            await self.start()
        if not self._subscriptions.states and self._coordinator.member is None:
            raise RuntimeError("no partitions are assigned: call assign() or subscribe() before poll()")
        limit = max_records or self.config["max.poll.records"]
        if limit < 1:
            raise ValueError("max_records must be at least 1")
        deadline = time.monotonic() + timeout_ms / 1000
        self._coordinator.maybe_auto_commit()
        while True:
            member = self._coordinator.member
            if member is not None:
                await member.poll()
            self._fetcher.raise_errors()
            records = self._fetcher.collect(limit)
            if records:
                self._fetcher.wake()  # drained partitions are fetchable again: fetch while the caller works
                return self._interceptors.on_consume(records) if self._interceptors else records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            await self._fetcher.wait_for_data(remaining)

    # Offset lookups ------------------------------------------------------------------

    async def beginning_offsets(self, partitions: Iterable[TopicPartition],
                                timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        self._check_open()
        return await self._lookups.beginning_offsets(partitions, timeout_ms)

    async def end_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int = DEFAULT_API_TIMEOUT_MS) -> dict[TopicPartition, int]:
        """The offset after the last readable record: the high watermark (last stable offset for read_committed)."""
        self._check_open()
        return await self._lookups.end_offsets(partitions, timeout_ms)

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                                ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, ``(offset, timestamp)`` of the first record with a timestamp >= the given one; None if none."""
        self._check_open()
        return await self._lookups.offsets_for_times(timestamps, timeout_ms)

    # Committed offsets ----------------------------------------------------------------

    async def committed(self, partitions: Iterable[TopicPartition], timeout_ms: int = DEFAULT_API_TIMEOUT_MS
                        ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The offsets ``group.id`` committed for these partitions (None where it has none).

        Asks the group coordinator (FindCoordinator, then OffsetFetch). A broker
        without a group coordinator (josef without its coordinator-group
        plugin) answers with :class:`UnsupportedVersionError`.
        """
        self._check_open()
        return await self._coordinator.committed(partitions, timeout_ms)

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
        member = self._coordinator.member
        if member is None:
            if self._consumer_protocol:
                from josef_client.group_consumer import ConsumerGroupMember

                member = ConsumerGroupMember(self, self._subscriptions, self._coordinator, self._fetcher.wake_poll,
                                             topics=names, pattern=compiled, listener=listener)
            else:
                member = ClassicGroupMember(self, self._subscriptions, self._coordinator, self._fetcher.wake_poll,
                                            self._assignors, topics=names, pattern=compiled, listener=listener)
            self._coordinator.member = member
        else:
            member.set_subscription(names, compiled, listener)
        self._fetcher.wake()
        self._fetcher.wake_poll()

    def subscription(self) -> frozenset[str]:
        """The subscribed topics (those the pattern matched so far, for a pattern)."""
        member = self._coordinator.member
        return frozenset(member.topics) if member is not None else frozenset()

    async def unsubscribe(self) -> None:
        """Leave the group (committing, with auto commit, and revoking first), or drop the assign()ed partitions."""
        self._check_open()
        if self._coordinator.member is not None:
            try:
                await self._coordinator.member.close()
            finally:
                self._coordinator.member = None
        self._manual = False
        self._subscriptions.set_assignment([], reset=False)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, generation and member id, as ``send_offsets_to_transaction`` wants them."""
        if self._coordinator.member is not None:
            return self._coordinator.member.metadata()
        return ConsumerGroupMetadata(self._coordinator.group_id)

    # Commits ----------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     timeout_ms: int | None = None) -> None:
        """Commit offsets (default: the position of every assigned partition) and wait for the coordinator's answer.

        An offset is the next one to consume. Raises :class:`CommitFailedError`
        when the group has rebalanced since this member's generation (its
        partitions may be someone else's now), :class:`KafkaTimeoutError`
        after ``timeout_ms`` (default ``default.api.timeout.ms``) of retrying.
        """
        self._check_open()
        found = self._coordinator.offsets_to_commit(offsets)
        if found:
            await self._coordinator.commit(found, self.config["default.api.timeout.ms"] if timeout_ms is None else timeout_ms)

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: Any = None) -> asyncio.Task[None]:
        """Commit without waiting; ``callback(offsets, error_or_None)`` (sync or async) is called when it is done.

        Returns the task (await it to wait). Commits are sent in call order.
        """
        self._check_open()
        return self._coordinator.commit_async(self._coordinator.offsets_to_commit(offsets), callback)


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
