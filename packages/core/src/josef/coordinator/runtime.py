"""The coordinator runtime: one state machine per partition of an internal topic, kept as records in that partition.

Kafka's group, transaction and share coordinators all work the same way, and
so do josef's, which is why the runtime lives in the core and the coordinators
in plugins (``register_coordinators``):

- The coordinator for a key (a group id, a transactional id) is the leader of
  partition ``abs(hashCode(key)) % partitions`` of the coordinator's internal
  topic (``__consumer_offsets``...). The runtime creates that topic on first use.
- When this broker becomes leader of such a partition, the runtime *loads* a
  fresh :class:`CoordinatorShard` by replaying the partition's records; when it
  stops leading, the shard is dropped.
- A request handler takes the shard's lock, reads its state, and *writes*
  records through :meth:`ShardContext.write`: they are appended to the
  partition like any produce, and once committed (high watermark) they are
  replayed into the shard, so memory never runs ahead of the log.
- Timers (session expiry, rebalance timeouts) run through
  :meth:`ShardContext.schedule` and are cancelled with the shard.
- Records may be written inside a producer's transaction (TxnOffsetCommit):
  they are replayed as pending, and the transaction marker the transaction
  coordinator later writes to the partition (WriteTxnMarkers) commits or
  discards them, once committed itself, as in Kafka's runtime.

Record keys and values are opaque bytes to the runtime; each coordinator
owns its encoding.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from josef.coordinator.hashing import partition_for
from josef.metadata.image import MetadataDelta, MetadataImage
from josef.replication.partition import COORDINATOR, Partition, PartitionError
from josef.plugin_api import deprecated_property
from josef.protocol.records import COMMIT_MARKER, TRANSACTIONAL_BIT, build_batch, control_type, iter_batches, iter_records
from josef.protocol.topic_partition import TopicPartition
from josef.producer.txn_verification import verify

if TYPE_CHECKING:
    from josef.node.broker import Broker
    from josef.services import BrokerServices
    from josef.server.dispatch import Handler

log = logging.getLogger(__name__)

#: Records a coordinator writes: (key, value); a None value is a tombstone.
Records = Sequence[tuple[bytes, bytes | None]]
_LOAD_CHUNK = 4 * 1024 * 1024
#: What the producer state refuses a transactional write for: the producer is answered with it, as in Kafka.
_PRODUCER_ERRORS = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced, ErrorCode.invalid_txn_state})


class CoordinatorError(Exception):
    """The shard for a key is not here (NOT_COORDINATOR) or not ready (COORDINATOR_LOAD_IN_PROGRESS...)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CoordinatorShard(Protocol):
    """The in-memory state of one internal partition, rebuilt from its records."""

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        """Apply one committed record. Called while loading and after every write; must not fail on old data."""

    def loaded(self) -> None:
        """Loading finished: start timers (session expiry...) for the state just rebuilt."""

    # Optional, for coordinators that write inside transactions (TxnOffsetCommit):
    #
    # ``replay_transactional(self, producer_id, producer_epoch, key, value, offset) -> None``: a
    # committed record written in ``producer_id``'s open transaction; it takes effect only when
    # ``replay_end_transaction(self, producer_id, committed, offset) -> None`` is called for the
    # marker that ends the transaction (``committed`` False: discard). Both are called while
    # loading and afterwards, with the shard's lock held after loading.
    #
    # Optional: ``unloaded(self) -> None``, called (if the shard defines it) when the shard is
    # dropped (leadership moved, broker stopping), after its timers are cancelled, so requests
    # parked on it (a JoinGroup waiting for the rebalance) can be answered with NOT_COORDINATOR.


class Coordinator(Protocol):
    """What a coordinator plugin registers (``register_coordinators``): ``factory(services) -> Coordinator``,
    given the broker's :class:`josef.services.BrokerServices`."""

    #: FindCoordinator key type: 0 group, 1 transaction, 2 share.
    key_type: int
    #: The internal topic that holds this coordinator's state.
    internal_topic: str

    def topic_settings(self) -> tuple[int, int, Mapping[str, str]]:
        """Partitions, replication factor and topic configs of the internal topic (from broker configs)."""

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        """``(api key, handler, lowest version, highest version)`` of the requests this coordinator answers."""

    def new_shard(self, context: ShardContext) -> CoordinatorShard:
        """An empty state machine for one partition; the runtime then replays the partition into it."""


def _replay(shard: CoordinatorShard, producer_id: int, producer_epoch: int, key: bytes, value: bytes | None,
            offset: int) -> None:
    """One committed record into its shard: pending in ``producer_id``'s transaction, or at once (-1)."""
    if producer_id >= 0:
        shard.replay_transactional(producer_id, producer_epoch, key, value, offset)  # type: ignore[attr-defined]
    else:
        shard.replay(key, value, offset)


class ShardContext:
    """A loaded shard's link to its partition: its lock, its writes, its timers."""

    def __init__(self, runtime: CoordinatorRuntime, tp: TopicPartition, partition: Partition) -> None:
        self.runtime = runtime
        self.tp = tp
        self.partition = partition
        self.lock = anyio.Lock()
        self.shard: CoordinatorShard | None = None
        self.active = True
        self._timers: dict[Any, anyio.CancelScope] = {}

    @property
    def leader_epoch(self) -> int:
        """The partition's leader epoch this shard was loaded under: Kafka's coordinator epoch."""
        return self.partition.leader_epoch

    @property
    def services(self) -> BrokerServices:
        """The broker's services (:class:`josef.services.BrokerServices`), for a shard that needs more than its partition."""
        return self.runtime.broker.services

    @deprecated_property("ShardContext.services", "2.0")
    def broker(self) -> BrokerServices:
        return self.runtime.broker.services

    async def write(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
                    transactional_id: str | None = None, add_partition: bool = False) -> int:
        """Append ``records`` to the partition, wait until they are committed, replay them; returns the last offset.

        With a ``producer_id`` the records belong to that producer's open
        transaction (a transactional batch, so the partition's last stable
        offset waits for its marker) and are replayed with
        ``replay_transactional``; a producer the partition's producer state
        refuses (an older epoch...) gets that error, not a retriable one.
        With its ``transactional_id`` the partition is first verified with
        the transaction coordinator (KIP-890, :mod:`josef.producer.txn_verification`),
        or added to the transaction when ``add_partition`` (TxnOffsetCommit
        v5+). Call with :attr:`lock` held, so the next request sees this
        one's effects.
        """
        if not self.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} moved to another broker")
        if not records:
            return self.partition.log.log_end_offset - 1
        now = int(time.time() * 1000)
        transactional = producer_id >= 0
        guard = None
        if transactional and transactional_id is not None:
            guard = (await verify(self.runtime.broker, transactional_id, producer_id, producer_epoch,
                                  {self.tp: self.partition}, add_partition)).get(self.tp)
            if isinstance(guard, ErrorCode):
                raise CoordinatorError(guard, f"{self.tp} is not in transaction {transactional_id!r}")
        batch = build_batch([(key, value, now) for key, value in records], producer_id=producer_id,
                            producer_epoch=producer_epoch, base_sequence=0 if transactional else -1,
                            attributes=TRANSACTIONAL_BIT if transactional else 0)
        try:
            info, _ = self.partition.append_as_leader(batch, required_acks=-1, origin=COORDINATOR, verification=guard)
        except PartitionError as exc:
            if transactional and exc.code in _PRODUCER_ERRORS:
                raise CoordinatorError(exc.code, exc.message) from exc  # the producer is fenced: tell it so
            raise CoordinatorError(ErrorCode.not_coordinator if exc.code == ErrorCode.not_leader_or_follower
                                   else ErrorCode.coordinator_not_available, exc.message) from exc
        replicas = self.runtime.broker.replicas
        replicas.appended(self.tp)
        while self.partition.high_watermark <= info.last_offset:
            await replicas.purgatory.wait([self.tp], 1.0)
            if not self.active:
                raise CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} moved while writing")
        assert self.shard is not None
        for offset, (key, value) in enumerate(records, info.first_offset):
            _replay(self.shard, producer_id if transactional else -1, producer_epoch, key, value, offset)
        return info.last_offset

    def schedule(self, key: Any, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` after ``delay_s`` unless rescheduled or cancelled first; one timer per key."""
        self.cancel(key)
        scope = anyio.CancelScope()
        self._timers[key] = scope

        async def fire() -> None:
            with scope:
                await anyio.sleep(delay_s)
                if self._timers.get(key) is scope:
                    del self._timers[key]
                try:
                    await callback()
                except CoordinatorError as exc:
                    log.info("timer %r of %s gave up: %s", key, self.tp, exc.message)
                except Exception:
                    log.exception("timer %r of %s failed", key, self.tp)

        self.runtime.spawn(fire)

    def cancel(self, key: Any) -> None:
        scope = self._timers.pop(key, None)
        if scope is not None:
            scope.cancel()

    def close(self) -> None:
        self.active = False
        for scope in self._timers.values():
            scope.cancel()
        self._timers.clear()
        unloaded = getattr(self.shard, "unloaded", None)
        if unloaded is not None:
            try:
                unloaded()
            except Exception:
                log.exception("unloading %s failed", self.tp)


class CoordinatorRuntime:
    def __init__(self, broker: Broker, coordinators: Mapping[str, Coordinator]) -> None:
        self.broker = broker
        self.coordinators = dict(coordinators)
        self._by_topic = {c.internal_topic: c for c in coordinators.values()}
        self._shards: dict[TopicPartition, ShardContext] = {}
        self._loading: dict[TopicPartition, anyio.Event] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    def by_key_type(self, key_type: int) -> Coordinator | None:
        return next((c for c in self.coordinators.values() if c.key_type == key_type), None)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host shard loads and timers until the broker stops."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        if self._tg is not None:
            self._tg.start_soon(function)

    # Leadership -------------------------------------------------------------------------

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Load shards of internal partitions this broker now leads; drop the others.

        Before :meth:`run` has started there is nowhere to load: the broker
        calls this again once it has.
        """
        if self._tg is None:
            return
        for tp in list(self._shards):
            partition = self.broker.replicas.get(tp)
            if partition is None or not partition.is_leader or tp.topic not in image.topics:
                self._shards.pop(tp).close()
        for topic in self._by_topic:
            if topic not in image.topics:
                continue
            for index in image.topics[topic].partitions:
                tp = TopicPartition(topic, index)
                partition = self.broker.replicas.get(tp)
                if partition is not None and partition.is_leader and tp not in self._shards and tp not in self._loading:
                    self._loading[tp] = anyio.Event()
                    self.spawn(lambda tp=tp, partition=partition: self._load(tp, partition))

    async def _load(self, tp: TopicPartition, partition: Partition) -> None:
        coordinator = self._by_topic[tp.topic]
        context = ShardContext(self, tp, partition)
        shard = context.shard = coordinator.new_shard(context)
        started = time.monotonic()
        count = 0
        try:
            log_ = partition.log
            offset = log_.log_start_offset
            while offset < partition.high_watermark:
                chunk = log_.read(offset, _LOAD_CHUNK, partition.high_watermark)
                if not chunk:
                    break
                for pos, header in iter_batches(chunk):
                    if header.last_offset < offset:
                        pass
                    elif header.is_control:
                        if header.is_transactional and hasattr(shard, "replay_end_transaction"):
                            shard.replay_end_transaction(header.producer_id, control_type(chunk, pos) == COMMIT_MARKER,
                                                         header.base_offset)
                    else:
                        for record in iter_records(memoryview(chunk)[pos : pos + header.size]):
                            if record.offset >= offset and record.key is not None:
                                _replay(shard, header.producer_id if header.is_transactional else -1,
                                        header.producer_epoch, record.key, record.value, record.offset)
                                count += 1
                    offset = header.last_offset + 1
            self._shards[tp] = context
            shard.loaded()
            log.info("loaded %s: %d records in %.3fs", tp, count, time.monotonic() - started)
        finally:
            self._loading.pop(tp).set()

    async def complete_transaction(self, tp: TopicPartition, producer_id: int, committed: bool, offset: int) -> None:
        """A transaction marker at ``offset`` of internal partition ``tp`` is committed: apply it to the shard.

        Called by the WriteTxnMarkers handler once the marker is below the
        high watermark; does nothing when ``tp`` is not loaded here (a
        later load replays the marker) or its shard writes no transactions.
        """
        context = self._shards.get(tp)
        end = getattr(context.shard, "replay_end_transaction", None) if context is not None else None
        if context is None or end is None:
            return
        async with context.lock:
            if context.active:
                end(producer_id, committed, offset)

    # Finding shards -----------------------------------------------------------------------

    def partition_of(self, coordinator: Coordinator, key: str) -> int:
        return partition_for(key, coordinator.topic_settings()[0])

    async def ensure_topic(self, coordinator: Coordinator) -> None:
        """Create the internal topic on first use, as Kafka does on the first FindCoordinator.

        Always with its configured replication factor: with fewer live
        brokers the creation fails and clients are told
        COORDINATOR_NOT_AVAILABLE until enough brokers run, as in Kafka,
        rather than keeping offsets on fewer replicas than asked.
        """
        if coordinator.internal_topic in self.broker.image.topics:
            return
        partitions, replication, configs = coordinator.topic_settings()
        error, message = await self.broker.channel.create_topic(
            coordinator.internal_topic, partitions, replication, dict(configs))
        if error not in (ErrorCode.none, ErrorCode.topic_already_exists):
            raise CoordinatorError(ErrorCode.coordinator_not_available, message or error.name)

    async def shard_for(self, coordinator: Coordinator, key: str) -> ShardContext:
        """The loaded shard owning ``key``, waiting for a load in progress; CoordinatorError if it is elsewhere."""
        await self.ensure_topic(coordinator)
        tp = TopicPartition(coordinator.internal_topic, self.partition_of(coordinator, key))
        loading = self._loading.get(tp)
        if loading is not None:
            await loading.wait()
        context = self._shards.get(tp)
        if context is not None:
            return context
        partition = self.broker.replicas.get(tp)
        if partition is not None and partition.is_leader:
            raise CoordinatorError(ErrorCode.coordinator_load_in_progress, f"{tp} is loading")
        raise CoordinatorError(ErrorCode.not_coordinator, f"broker {self.broker.node_id} does not coordinate {key!r}")

    def leader_of(self, coordinator: Coordinator, key: str) -> int:
        """Broker id leading ``key``'s partition, -1 while there is none."""
        topic = self.broker.image.topics.get(coordinator.internal_topic)
        if topic is None:
            return -1
        state = topic.partitions.get(self.partition_of(coordinator, key))
        return state.leader if state is not None else -1

    def shards(self, coordinator: Coordinator) -> list[ShardContext]:
        """Every shard of ``coordinator`` loaded on this broker (ListGroups asks them all)."""
        return [c for tp, c in self._shards.items() if tp.topic == coordinator.internal_topic]

    def loading(self, coordinator: Coordinator) -> bool:
        """Whether a partition of ``coordinator``'s topic that this broker leads is not loaded yet (a listing
        of every shard cannot be complete until it is)."""
        topic = self.broker.image.topics.get(coordinator.internal_topic)
        if topic is None:
            return False
        for index in topic.partitions:
            tp = TopicPartition(coordinator.internal_topic, index)
            partition = self.broker.replicas.get(tp)
            if partition is not None and partition.is_leader and tp not in self._shards:
                return True
        return False

    def close(self) -> None:
        for context in self._shards.values():
            context.close()
        self._shards.clear()
