"""The coordinator runtime: one state machine per partition of an internal topic, kept as records in that partition.

Kafka's group, transaction and share coordinators all work the same way, and
so do josef's, which is why the runtime lives in the core and the coordinators
in plugins (``register_coordinators``). It follows Kafka's CoordinatorRuntime:

- The coordinator for a key (a group id, a transactional id) is the leader of
  partition ``abs(hashCode(key)) % partitions`` of the coordinator's internal
  topic (``__consumer_offsets``...). The runtime creates that topic on first use.
- When this broker becomes leader of such a partition, the runtime *loads* a
  fresh :class:`CoordinatorShard` by replaying the partition's records, up to
  its log end, yielding to the event loop between chunks. When it stops
  leading the shard is *unloaded*: its pending writes fail with
  NOT_COORDINATOR, its timers stop. When the partition's leader epoch rises
  while this broker stays leader, the shard is unloaded and loaded again, so
  its coordinator epoch (:attr:`ShardContext.leader_epoch`) is the new one.
- A request handler takes the shard's lock and, for a change, *appends*
  records (:meth:`ShardContext.append`): they are replayed into the shard at
  once, as uncommitted state, and added to the partition's open batch.
  Records that arrive together (other requests appending while the batch is
  open) go out as one append: the batch is flushed once the shard has been
  quiet for a moment (``append.linger.ms`` -1, Kafka 4.2's adaptive linger) or
  after a fixed linger, when full, or at once for a transactional write.
  The handler then waits for the high watermark to pass its records
  (:meth:`ShardContext.wait`), with the shard's lock released meanwhile.
- The shard keeps the state its records build in timeline types
  (:mod:`josef.coordinator.timeline`) registered with
  :attr:`ShardContext.snapshots`: the runtime takes a snapshot at each offset
  it has written up to, reads see the state at :attr:`ShardContext.committed_offset`,
  and a batch whose append fails is rolled back to the snapshot taken just
  before it (earlier batches, already in the log, still commit). A write that
  times out is answered with an error, but its records stay applied: when they
  commit later, every read sees them, with no reload.
- Writes are appended as Produce with ``acks=all`` appends: refused with
  NOT_ENOUGH_REPLICAS while the ISR is below ``min.insync.replicas``, and
  answered NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below it by the
  time they committed (their records stay: they are in the log).
  :class:`CoordinatorError` codes are those Kafka's coordinators answer with
  (:func:`response_error`).
- Timers (session expiry, rebalance timeouts) run through
  :meth:`ShardContext.schedule` and are cancelled with the shard.
- Records may be written inside a producer's transaction (TxnOffsetCommit):
  they are replayed with ``replay_transactional``, and the transaction
  coordinator's marker (WriteTxnMarkers) is written through the runtime too
  (:meth:`CoordinatorRuntime.write_marker`), replayed with
  ``replay_end_transaction`` like any record.

A shard written for plugin API 1.0-1.1 (no ``timeline`` attribute) keeps the
contract it was written for: its records are replayed once committed, its
:meth:`ShardContext.write` keeps the lock held while it waits.

Record keys and values are opaque bytes to the runtime; each coordinator
owns its encoding.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence

import anyio
import anyio.abc
import anyio.lowlevel
from kio.schema.errors import ErrorCode

from josef.coordinator.hashing import partition_for
from josef.coordinator.timeline import SnapshotRegistry
from josef.log import LogDirError
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
#: How much of the log a load replays before it lets the broker's other work run.
LOAD_CHUNK_BYTES = 1024 * 1024
#: ``append.linger.ms`` of -1: a batch waits for the operations queued when it opened, at most this many loop turns.
ADAPTIVE_MAX_TURNS = 64
#: A batch's bytes beyond its records (Kafka's record batch header).
BATCH_OVERHEAD = 61
#: An upper bound of a record's bytes beyond its key and value (length, attributes, deltas, header count).
RECORD_OVERHEAD = 30


def response_error(code: ErrorCode) -> ErrorCode:
    """What a coordinator answers for a failed write (Kafka's CoordinatorOperationExceptionHelper).

    The transaction coordinator of Kafka 4.x maps NOT_ENOUGH_REPLICAS_AFTER_APPEND
    (its writes use acks=all) the same way as NOT_ENOUGH_REPLICAS.
    """
    if code in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.unknown_server_error
    return code


class CoordinatorError(Exception):
    """The shard for a key is not here (NOT_COORDINATOR) or not ready (COORDINATOR_LOAD_IN_PROGRESS...), or a write failed.

    ``cause`` is the partition's own error behind the code a client is told
    (NOT_ENOUGH_REPLICAS behind COORDINATOR_NOT_AVAILABLE...), when there is one.
    """

    def __init__(self, code: ErrorCode, message: str, cause: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.cause = cause if cause is not None else code

    @classmethod
    def of_write(cls, code: ErrorCode, message: str) -> CoordinatorError:
        return cls(response_error(code), message, code)


class CoordinatorShard(Protocol):
    """The in-memory state of one internal partition, rebuilt from its records."""

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        """Apply one record. Called while loading and for every write; must not fail on old data."""

    def loaded(self) -> None:
        """Loading finished: start timers (session expiry...) for the state just rebuilt."""

    # Plugin API 1.2: ``timeline = True`` (a class attribute) declares the shard keeps what its records
    # build in timeline types (josef.coordinator.timeline) registered with ``context.snapshots``. Its
    # records are then replayed as soon as they are written (uncommitted), rolled back if their append
    # fails, and reads take ``at=context.committed_offset``. Without it (plugin API 1.0-1.1) records are
    # replayed once committed and ShardContext.write keeps the shard's lock held while it waits.
    #
    # Optional, for coordinators that write inside transactions (TxnOffsetCommit):
    #
    # ``replay_transactional(self, producer_id, producer_epoch, key, value, offset) -> None``: a
    # record written in ``producer_id``'s open transaction; it takes effect only when
    # ``replay_end_transaction(self, producer_id, committed, offset) -> None`` is called for the
    # marker that ends the transaction (``committed`` False: discard). Both are called while
    # loading and afterwards, as ``replay``.
    #
    # Optional: ``unloaded(self) -> None``, called (if the shard defines it) when the shard is
    # dropped (leadership moved, broker stopping), after its timers are cancelled and its pending
    # writes failed, so requests parked on it (a JoinGroup waiting for the rebalance) can be
    # answered with NOT_COORDINATOR.


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

    # Optional (plugin API 1.2): ``append_linger_ms(self) -> int``: how long a batch of this coordinator's
    # writes waits for more before it is appended (Kafka's ``group.coordinator.append.linger.ms``): -1
    # adaptive (the default), 0 none.


def _replay(shard: CoordinatorShard, producer_id: int, producer_epoch: int, key: bytes, value: bytes | None,
            offset: int) -> None:
    """One record into its shard: pending in ``producer_id``'s transaction, or at once (-1)."""
    if producer_id >= 0:
        shard.replay_transactional(producer_id, producer_epoch, key, value, offset)  # type: ignore[attr-defined]
    else:
        shard.replay(key, value, offset)


def _replay_marker(shard: CoordinatorShard, producer_id: int, committed: bool, offset: int) -> None:
    end = getattr(shard, "replay_end_transaction", None)
    if end is not None:
        end(producer_id, committed, offset)


class PendingWrite:
    """Records applied to a shard, done once the high watermark passes them (or failed: rolled back, unloaded).

    ``committed`` tells whether its records are in the committed log, which
    is also so when the write failed only its NOT_ENOUGH_REPLICAS_AFTER_APPEND
    check. Callbacks run synchronously when it is done; they must not block.
    """

    __slots__ = ("last_offset", "error", "committed", "_event", "_callbacks")

    def __init__(self, last_offset: int) -> None:
        #: The offset of its last record (or of the last record written before it, for a barrier).
        self.last_offset = last_offset
        self.error: CoordinatorError | None = None
        self.committed = False
        self._event = anyio.Event()
        self._callbacks: list[Callable[[PendingWrite], None]] = []

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def add_done_callback(self, callback: Callable[[PendingWrite], None]) -> None:
        """Call ``callback(self)`` when done (at once if it is)."""
        if self.done:
            _call(callback, self)
        else:
            self._callbacks.append(callback)

    def complete(self, error: CoordinatorError | None = None, *, committed: bool = False) -> None:
        if self.done:
            return
        self.error, self.committed = error, committed
        self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback, self)

    async def wait(self) -> None:
        """Until done; raises its :class:`CoordinatorError` if it failed."""
        await self._event.wait()
        if self.error is not None:
            raise self.error

    def __repr__(self) -> str:
        state = "pending" if not self.done else ("committed" if self.committed else "failed")
        return f"PendingWrite(last_offset={self.last_offset}, {state}, error={self.error and self.error.code.name})"


def _call(callback: Callable[[PendingWrite], None], pending: PendingWrite) -> None:
    try:
        callback(pending)
    except Exception:
        log.exception("a callback of a coordinator write failed")


class _Batch:
    """The records appended since the last flush, and the writes waiting on them (Kafka's CoordinatorBatch)."""

    __slots__ = ("base_offset", "next_offset", "records", "size", "producer_id", "producer_epoch", "verification",
                 "writes", "max_size")

    def __init__(self, base_offset: int, producer_id: int, producer_epoch: int, verification: object | None,
                 max_size: int) -> None:
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.records: list[tuple[bytes, bytes | None, int]] = []
        self.size = BATCH_OVERHEAD
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.verification = verification
        self.writes: list[PendingWrite] = []
        self.max_size = max_size


def _record_size(key: bytes, value: bytes | None) -> int:
    return len(key) + (len(value) if value is not None else 0) + RECORD_OVERHEAD


class ShardContext:
    """A loaded shard's link to its partition: its lock, its writes, its snapshots, its timers."""

    def __init__(self, runtime: CoordinatorRuntime, coordinator: Coordinator, tp: TopicPartition,
                 partition: Partition, leader_epoch: int) -> None:
        self.runtime = runtime
        self.coordinator = coordinator
        self.tp = tp
        self.partition = partition
        #: Held while a request or timer works on the shard's state (never across a wait for replication).
        self.lock = ShardLock()
        self.shard: CoordinatorShard | None = None
        self.active = True
        #: The snapshots of the shard's timeline state (:mod:`josef.coordinator.timeline`).
        self.snapshots = SnapshotRegistry()
        self._leader_epoch = leader_epoch
        self._timers: dict[Any, anyio.CancelScope] = {}
        self._timeline = False
        #: The log end as this shard knows it: every record below it is applied (Kafka's lastWrittenOffset).
        self.last_written_offset = 0
        #: Below it every record is committed; reads of timeline state are made at it (Kafka's lastCommittedOffset).
        self.committed_offset = 0
        self._batch: _Batch | None = None
        #: Writes appended and waiting for the high watermark, in offset order.
        self._deferred: collections.deque[PendingWrite] = collections.deque()
        #: A shard of plugin API 1.0-1.1: the records to replay once committed, in offset order.
        self._unreplayed: collections.deque[tuple[int, int, int, bytes, bytes | None] | tuple[int, int, bool]] = \
            collections.deque()
        self._watcher = anyio.CancelScope()
        self._flushes = 0

    @property
    def leader_epoch(self) -> int:
        """The partition's leader epoch this shard was loaded under: Kafka's coordinator epoch."""
        return self._leader_epoch

    @property
    def services(self) -> BrokerServices:
        """The broker's services (:class:`josef.services.BrokerServices`), for a shard that needs more than its partition."""
        return self.runtime.broker.services

    @deprecated_property("ShardContext.services", "2.0")
    def broker(self) -> BrokerServices:
        return self.runtime.broker.services

    @property
    def flushes(self) -> int:
        """How many appends this shard made to its partition (a batch each)."""
        return self._flushes

    # Writing -------------------------------------------------------------------------------------------------

    def append(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
               verification: object | None = None, atomic: bool = True) -> PendingWrite:
        """Apply ``records`` to the shard and add them to the partition's open batch; the write to wait for.

        Call with :attr:`lock` held (the shard's state changes), then
        :meth:`wait` for it. With a ``producer_id`` the records are written in
        that producer's open transaction (a transactional batch of their own,
        appended at once, ``verification`` the guard of
        :meth:`verify_transaction`). Non-``atomic`` records may be split
        across batches when they do not fit in one. Raises
        :class:`CoordinatorError` when nothing could be applied (the shard
        moved, the records are larger than a batch may be, the batch before
        them failed); an append that fails later fails the returned write.
        """
        self._check_active()
        transactional = producer_id >= 0
        sizes = [_record_size(key, value) for key, value in records]
        max_size = self._max_batch_size()
        if (atomic or transactional) and BATCH_OVERHEAD + sum(sizes) > max_size:
            raise CoordinatorError.of_write(ErrorCode.message_too_large,
                                            f"{len(records)} records of {sum(sizes)} bytes do not fit in a batch of "
                                            f"{max_size} bytes (max.message.bytes of {self.tp})")
        batch = self._batch
        if batch is not None and (transactional or batch.producer_id >= 0
                                  or (atomic and batch.size + sum(sizes) > batch.max_size)):
            self._flush_or_raise()
        if not records:
            return self.barrier()
        now = int(time.time() * 1000)
        for (key, value), size in zip(records, sizes):
            batch = self._batch
            if batch is not None and batch.size + size > batch.max_size:
                self._flush_or_raise()
                batch = None
            if batch is None:
                batch = self._open_batch(producer_id, producer_epoch, verification, max_size)
            offset = batch.next_offset
            if self._timeline:
                try:
                    _replay(self.shard, producer_id, producer_epoch, key, value, offset)  # type: ignore[arg-type]
                except Exception as exc:
                    log.exception("replaying a record written to %s failed: the open batch fails", self.tp)
                    self._fail_batch(batch, CoordinatorError(ErrorCode.unknown_server_error, f"replay failed: {exc}"))
                    raise CoordinatorError(ErrorCode.unknown_server_error, f"replay failed: {exc}") from exc
            else:
                self._unreplayed.append((offset, producer_id, producer_epoch, key, value))
            batch.records.append((key, value, now))
            batch.size += size
            batch.next_offset = offset + 1
        assert self._batch is not None
        pending = PendingWrite(self._batch.next_offset - 1)
        self._batch.writes.append(pending)
        if transactional or self._linger_ms() == 0 or not self.runtime.running:
            self._flush()
        return pending

    def barrier(self) -> PendingWrite:
        """A write of nothing: done once everything applied so far is committed (Kafka's read-only write operations)."""
        self._check_active()
        if self._batch is not None:
            pending = PendingWrite(self._batch.next_offset - 1)
            self._batch.writes.append(pending)
        elif self.committed_offset < self.last_written_offset:
            pending = PendingWrite(self.last_written_offset - 1)
            self._deferred.append(pending)
        else:
            pending = PendingWrite(self.last_written_offset - 1)
            pending.complete(committed=True)
        return pending

    async def wait(self, pending: PendingWrite, timeout_s: float | None = None) -> None:
        """Wait until ``pending`` is committed, with the shard's lock released meanwhile if this task holds it.

        Raises :class:`CoordinatorError` when it failed, or
        COORDINATOR_NOT_AVAILABLE (REQUEST_TIMED_OUT) after ``timeout_s``:
        its records stay applied and may still commit.
        """
        await self._wait(pending, timeout_s, release=True)

    async def _wait(self, pending: PendingWrite, timeout_s: float | None, *, release: bool) -> None:
        held = release and _holds(self.lock)
        if held:
            self.lock.release()
        try:
            with anyio.move_on_after(timeout_s) as scope:
                await pending.wait()
        finally:
            if held:
                with anyio.CancelScope(shield=True):
                    await self.lock.acquire()
        if scope.cancelled_caught:
            raise CoordinatorError.of_write(ErrorCode.request_timed_out,
                                            f"writing to {self.tp} took longer than {timeout_s}s")

    async def verify_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                                 add_partition: bool = False) -> object | None:
        """Ask the transaction coordinator whether this partition is in the producer's transaction (KIP-890).

        Call before taking the lock. Returns the guard to :meth:`append`
        with (None: no question was needed); raises :class:`CoordinatorError`
        with the error the producer is told. ``add_partition`` (TxnOffsetCommit
        v5+) has the coordinator add the partition to the transaction.
        """
        self._check_active()
        guard = (await verify(self.runtime.broker, transactional_id, producer_id, producer_epoch,
                              {self.tp: self.partition}, add_partition)).get(self.tp)
        if isinstance(guard, ErrorCode):
            raise CoordinatorError.of_write(guard, f"{self.tp} is not in transaction {transactional_id!r}")
        return guard

    async def write(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
                    transactional_id: str | None = None, add_partition: bool = False,
                    timeout_s: float | None = None) -> int:
        """Append ``records`` and wait until they are committed; returns the offset of the last one.

        The contract of plugin API 1.0-1.1, kept: with a ``producer_id``
        the records belong to that producer's open transaction (verified with
        its coordinator when ``transactional_id`` is given). A shard with
        ``timeline`` has the lock released while the write waits; an older
        shard keeps it held, its records being replayed only once committed.
        """
        guard = None
        if producer_id >= 0 and transactional_id is not None:
            guard = await self.verify_transaction(transactional_id, producer_id, producer_epoch,
                                                  add_partition=add_partition)
        pending = self.append(records, producer_id=producer_id, producer_epoch=producer_epoch, verification=guard)
        await self._wait(pending, timeout_s, release=self._timeline)
        return pending.last_offset

    def delete_records_before(self, offset: int) -> int:
        """Prune the partition below ``offset``, as DeleteRecords does; the new log start offset.

        For a coordinator whose topic is not compacted (plugin API 1.5: the
        share coordinator's, where every update of a key has the same key):
        it knows which records a load no longer needs. Only committed records
        are pruned (``offset`` is capped at :attr:`committed_offset`);
        followers follow the leader's log start. Raises
        :class:`CoordinatorError` when the shard moved or the log cannot be
        changed (KAFKA_STORAGE_ERROR behind NOT_COORDINATOR).
        """
        self._check_active()
        try:
            return self.partition.log.delete_records_before(min(offset, self.committed_offset))
        except LogDirError as exc:
            raise CoordinatorError.of_write(ErrorCode.kafka_storage_error, f"pruning {self.tp}: {exc}") from exc

    def _check_active(self) -> None:
        if not self.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} is no longer coordinated here")

    def _max_batch_size(self) -> int:
        return int(self.partition.topic_config.get("max.message.bytes", 1048588))

    def _linger_ms(self) -> int:
        linger = getattr(self.coordinator, "append_linger_ms", None)
        return int(linger()) if linger is not None else -1

    def _open_batch(self, producer_id: int, producer_epoch: int, verification: object | None,
                    max_size: int) -> _Batch:
        batch = self._batch = _Batch(self.last_written_offset, producer_id, producer_epoch, verification, max_size)
        linger = self._linger_ms() if producer_id < 0 else 0
        if linger != 0:
            self.runtime.spawn(lambda: self._linger(batch, linger))
        return batch

    async def _linger(self, batch: _Batch, linger_ms: int) -> None:
        """Flush ``batch`` after ``linger_ms``, or (-1) once the operations queued on the shard when it opened are done.

        The adaptive mode is Kafka 4.2's: the flush goes to the end of the
        shard's queue of operations, so a lone write waits only for the loop
        to come round and a burst of writes shares one append. Here the queue
        is the shard's lock (those holding it and waiting for it when the
        batch opened); a shard without ``timeline`` (whose writers hold the
        lock while they wait) flushes once the loop has come round.
        """
        if linger_ms > 0:
            await anyio.sleep(linger_ms / 1000)
        else:
            lock = self.lock
            stats = lock.statistics()
            queued = lock.releases + stats.tasks_waiting + (1 if stats.locked else 0) if self._timeline else 0
            for _ in range(ADAPTIVE_MAX_TURNS):
                await anyio.lowlevel.checkpoint()
                if self._batch is not batch or lock.releases >= queued or not self._timeline:
                    break
                if not lock.locked() and not lock.statistics().tasks_waiting:
                    break
        if self._batch is batch:
            self._flush()

    def _flush_or_raise(self) -> None:
        """Flush the open batch before another; the write that needed it fails too if it did (Kafka's rule)."""
        failed = self._flush()
        if failed is not None:
            raise CoordinatorError(failed.code, failed.message, failed.cause)

    def _flush(self) -> CoordinatorError | None:
        """Append the open batch to the partition; roll the shard back to its start if that fails (the error)."""
        batch, self._batch = self._batch, None
        if batch is None or not batch.records:
            return None
        partition = self.partition
        try:
            if partition.log.log_end_offset != batch.base_offset:
                raise _OutOfSync(partition.log.log_end_offset, batch.base_offset)
            transactional = batch.producer_id >= 0
            data = build_batch(batch.records, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                               base_sequence=0 if transactional else -1,
                               attributes=TRANSACTIONAL_BIT if transactional else 0)
            info, _ = partition.append_as_leader(data, required_acks=-1, origin=COORDINATOR,
                                                 verification=batch.verification)
        except PartitionError as exc:
            log.info("appending %d records to %s failed (%s): rolled back to offset %d", len(batch.records), self.tp,
                     exc.code.name, batch.base_offset)
            return self._fail_batch(batch, CoordinatorError.of_write(exc.code, exc.message or exc.code.name))
        except LogDirError as exc:
            return self._fail_batch(batch, CoordinatorError.of_write(ErrorCode.kafka_storage_error, str(exc)))
        except _OutOfSync as exc:
            log.error("%s: the log end is %d where the coordinator wrote up to %d: reloading it", self.tp, exc.actual,
                      exc.expected)
            error = self._fail_batch(batch, CoordinatorError(ErrorCode.not_coordinator, "the coordinator is reloading"))
            self.runtime.reload(self.tp)
            return error
        self._flushes += 1
        self.last_written_offset = info.last_offset + 1
        if self._timeline:
            self.snapshots.create_snapshot(self.last_written_offset)
        self._deferred.extend(batch.writes)
        self.runtime.broker.replicas.appended(self.tp)
        self._advance()
        return None

    def _fail_batch(self, batch: _Batch, error: CoordinatorError) -> CoordinatorError:
        if self._batch is batch:
            self._batch = None
        if self._timeline:
            self.snapshots.revert_to_snapshot(batch.base_offset)
        else:
            while self._unreplayed and self._unreplayed[-1][0] >= batch.base_offset:
                self._unreplayed.pop()
        for pending in batch.writes:
            pending.complete(error)
        return error

    # Committing ---------------------------------------------------------------------------------------------

    def _advance(self) -> None:
        """The high watermark moved: what is below it is committed; the writes it passed are done."""
        high_watermark = min(self.partition.high_watermark, self.last_written_offset)
        if self._timeline:
            committed = self.snapshots.floor(high_watermark)
            if committed is not None and committed > self.committed_offset:
                self.committed_offset = committed
                self.snapshots.delete_snapshots_up_to(committed)
        else:
            self._replay_committed(high_watermark)
            self.committed_offset = max(self.committed_offset, high_watermark)
        deferred = self._deferred
        if not deferred or deferred[0].last_offset >= high_watermark:
            return
        min_isr = int(self.partition.topic_config.get("min.insync.replicas", 1))
        error = None
        if len(self.partition.isr) < min_isr:
            error = CoordinatorError.of_write(
                ErrorCode.not_enough_replicas_after_append,
                f"{self.tp} has {len(self.partition.isr)} in-sync replicas after the append, "
                f"min.insync.replicas is {min_isr}")
        while deferred and deferred[0].last_offset < high_watermark:
            deferred.popleft().complete(error, committed=True)

    def _replay_committed(self, high_watermark: int) -> None:
        """A shard of plugin API 1.0-1.1: replay its records (and markers) once the high watermark passed them."""
        shard = self.shard
        while self._unreplayed and self._unreplayed[0][0] < high_watermark:
            entry = self._unreplayed.popleft()
            if len(entry) == 3:
                _replay_marker(shard, entry[1], entry[2], entry[0])  # type: ignore[arg-type, misc]
            else:
                offset, producer_id, producer_epoch, key, value = entry  # type: ignore[misc]
                try:
                    _replay(shard, producer_id, producer_epoch, key, value, offset)  # type: ignore[arg-type]
                except Exception:
                    log.exception("replaying the record at %s offset %d failed", self.tp, offset)

    async def _watch(self) -> None:
        """Follow the partition's high watermark while the shard is loaded (Kafka's HighWatermarkListener)."""
        purgatory = self.runtime.broker.replicas.purgatory
        with self._watcher:
            while self.active:
                self._advance()
                await purgatory.wait([self.tp], 1.0)

    # Transaction markers -----------------------------------------------------------------------------------

    def write_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> PendingWrite:
        """Write the marker that ends ``producer_id``'s transaction here; the write to wait for.

        The open batch goes first, so the marker follows every record
        written before it; the shard applies the marker at once, and is
        rolled back if its append fails.
        """
        self._check_active()
        self._flush_or_raise()
        offset = self.last_written_offset
        if self._timeline:
            try:
                _replay_marker(self.shard, producer_id, commit, offset)  # type: ignore[arg-type]
            except Exception:
                log.exception("replaying a transaction marker of %s failed", self.tp)
                self.snapshots.revert_to_snapshot(offset)
                raise CoordinatorError(ErrorCode.unknown_server_error, "replaying the marker failed") from None
        try:
            info = self.partition.append_marker(producer_id, producer_epoch, coordinator_epoch, commit)
        except PartitionError as exc:
            if self._timeline:
                self.snapshots.revert_to_snapshot(offset)
            raise CoordinatorError(exc.code, exc.message or exc.code.name) from None
        if not self._timeline:
            self._unreplayed.append((info.last_offset, producer_id, commit))
        self._flushes += 1
        self.last_written_offset = info.last_offset + 1
        if self._timeline:
            self.snapshots.create_snapshot(self.last_written_offset)
        pending = PendingWrite(info.last_offset)
        self._deferred.append(pending)
        self.runtime.broker.replicas.appended(self.tp)
        self._advance()
        return pending

    # Timers ------------------------------------------------------------------------------------------------

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

    # Unloading ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unload: inactive, timers stopped, pending writes failed with NOT_COORDINATOR, then ``unloaded()``."""
        if not self.active:
            return
        self.active = False
        self._watcher.cancel()
        for scope in self._timers.values():
            scope.cancel()
        self._timers.clear()
        moved = CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} is no longer coordinated here")
        batch, self._batch = self._batch, None
        for pending in [*(batch.writes if batch is not None else ()), *self._deferred]:
            pending.complete(moved)
        self._deferred.clear()
        unloaded = getattr(self.shard, "unloaded", None)
        if unloaded is not None:
            try:
                unloaded()
            except Exception:
                log.exception("unloading %s failed", self.tp)


class _OutOfSync(Exception):
    def __init__(self, actual: int, expected: int) -> None:
        super().__init__(f"log end {actual}, expected {expected}")
        self.actual = actual
        self.expected = expected


class ShardLock:
    """A shard's lock (an :class:`anyio.Lock`) that also counts its releases: the operations done on the shard."""

    __slots__ = ("_lock", "releases")

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self.releases = 0

    async def acquire(self) -> None:
        await self._lock.acquire()

    def release(self) -> None:
        self._lock.release()
        self.releases += 1

    def locked(self) -> bool:
        return self._lock.locked()

    def statistics(self) -> anyio.LockStatistics:
        return self._lock.statistics()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def _holds(lock: Any) -> bool:
    owner = lock.statistics().owner
    return owner is not None and owner.id == anyio.get_current_task().id


class _Load:
    """A shard being loaded: waiters learn when it is done; ``cancelled`` stops it (leadership moved meanwhile)."""

    __slots__ = ("epoch", "done", "cancelled")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.done = anyio.Event()
        self.cancelled = False


class CoordinatorRuntime:
    def __init__(self, broker: Broker, coordinators: Mapping[str, Coordinator]) -> None:
        self.broker = broker
        self.coordinators = dict(coordinators)
        self._by_topic = {c.internal_topic: c for c in coordinators.values()}
        self._shards: dict[TopicPartition, ShardContext] = {}
        self._loading: dict[TopicPartition, _Load] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    def by_key_type(self, key_type: int) -> Coordinator | None:
        return next((c for c in self.coordinators.values() if c.key_type == key_type), None)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host shard loads and timers until the broker stops."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    @property
    def running(self) -> bool:
        """Whether :meth:`run` hosts background work (loads, timers, lingering batches)."""
        return self._tg is not None

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        if self._tg is not None:
            self._tg.start_soon(function)

    # Leadership -------------------------------------------------------------------------

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Load shards of internal partitions this broker now leads; drop the others; reload those whose epoch rose.

        Before :meth:`run` has started there is nowhere to load: the broker
        calls this again once it has.
        """
        if self._tg is None:
            return
        for tp, context in list(self._shards.items()):
            partition = self.broker.replicas.get(tp)
            if partition is None or not partition.is_leader or tp.topic not in image.topics \
                    or partition is not context.partition:
                log.info("unloading %s: this broker no longer leads it", tp)
                self._unload(tp)
            elif partition.leader_epoch > context.leader_epoch:
                log.info("reloading %s: its leader epoch rose from %d to %d", tp, context.leader_epoch,
                         partition.leader_epoch)
                self._unload(tp)
        for tp, load in list(self._loading.items()):
            partition = self.broker.replicas.get(tp)
            if partition is None or not partition.is_leader or partition.leader_epoch != load.epoch:
                load.cancelled = True
                del self._loading[tp]
                load.done.set()
        for topic in self._by_topic:
            if topic not in image.topics:
                continue
            for index in image.topics[topic].partitions:
                tp = TopicPartition(topic, index)
                partition = self.broker.replicas.get(tp)
                if partition is not None and partition.is_leader and tp not in self._shards and tp not in self._loading:
                    self._start_load(tp, partition)

    def reload(self, tp: TopicPartition) -> None:
        """Unload ``tp``'s shard and load it again from its log (its state no longer matches it)."""
        self._unload(tp)
        partition = self.broker.replicas.get(tp)
        if partition is not None and partition.is_leader and tp not in self._loading:
            self._start_load(tp, partition)

    def _unload(self, tp: TopicPartition) -> None:
        context = self._shards.pop(tp, None)
        if context is not None:
            context.close()

    def _start_load(self, tp: TopicPartition, partition: Partition) -> None:
        load = self._loading[tp] = _Load(partition.leader_epoch)
        self.spawn(lambda: self._load(tp, partition, load))

    async def _load(self, tp: TopicPartition, partition: Partition, load: _Load) -> None:
        coordinator = self._by_topic[tp.topic]
        context = ShardContext(self, coordinator, tp, partition, load.epoch)
        started = time.monotonic()
        try:
            shard = context.shard = coordinator.new_shard(context)
            context._timeline = bool(getattr(shard, "timeline", False))
            count = await self._replay_log(context, load)
            if load.cancelled:
                context.active = False
                return
            self._shards[tp] = context
            shard.loaded()
            self.spawn(context._watch)
            log.info("loaded %s (coordinator epoch %d): %d records in %.3fs", tp, load.epoch, count,
                     time.monotonic() - started)
        except Exception:
            log.exception("loading %s failed", tp)
            self._shards.pop(tp, None)
            context.active = False
        finally:
            if self._loading.get(tp) is load:
                del self._loading[tp]
            load.done.set()

    async def _replay_log(self, context: ShardContext, load: _Load) -> int:
        """Replay the whole log into the shard, a chunk at a time, letting other work run between chunks.

        Records past the high watermark (an earlier leader's, not yet
        committed) are replayed too, with a snapshot before each of their
        batches, so that reads see only the committed ones until they commit.
        """
        shard, partition = context.shard, context.partition
        assert shard is not None
        timeline = context._timeline
        log_ = partition.log
        offset = log_.log_start_offset
        committed = partition.high_watermark
        count = 0
        while not load.cancelled:
            end = log_.log_end_offset
            if offset >= end:
                break
            chunk = log_.read(offset, LOAD_CHUNK_BYTES, end)
            if not chunk:
                break
            for pos, header in iter_batches(chunk):
                if header.last_offset < offset:
                    continue
                if header.last_offset >= committed:
                    if timeline:
                        context.snapshots.create_snapshot(max(header.base_offset, offset))
                if header.is_control:
                    if header.is_transactional:
                        _replay_marker(shard, header.producer_id, control_type(chunk, pos) == COMMIT_MARKER,
                                       header.base_offset)
                else:
                    for record in iter_records(memoryview(chunk)[pos : pos + header.size]):
                        if record.offset >= offset and record.key is not None:
                            _replay(shard, header.producer_id if header.is_transactional else -1,
                                    header.producer_epoch, record.key, record.value, record.offset)
                            count += 1
                offset = header.last_offset + 1
            await anyio.lowlevel.checkpoint()
        context.last_written_offset = offset
        if timeline:
            context.snapshots.create_snapshot(offset)
            context.committed_offset = context.snapshots.floor(min(partition.high_watermark, offset)) or 0
            context.snapshots.delete_snapshots_up_to(context.committed_offset)
        else:
            context.committed_offset = offset
        return count

    # Transaction markers ------------------------------------------------------------------

    def write_marker(self, partition: Partition, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> PendingWrite | None:
        """WriteTxnMarkers for a partition of a coordinator's topic: written through its shard (None: not one).

        A partition being loaded, or no longer led here, refuses the marker
        with NOT_LEADER_OR_FOLLOWER, so the transaction coordinator tries
        again, as Kafka's broker answers it.
        """
        tp = partition.tp
        if tp.topic not in self._by_topic or not partition.is_leader:
            return None
        context = self._shards.get(tp)
        if context is None or not context.active:
            raise CoordinatorError(ErrorCode.not_leader_or_follower, f"{tp} is loading")
        return context.write_marker(producer_id, producer_epoch, coordinator_epoch, commit)

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
            await loading.done.wait()
        context = self._shards.get(tp)
        if context is not None and context.active:
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
        for load in self._loading.values():
            load.cancelled = True
            load.done.set()
        self._loading.clear()
        for context in self._shards.values():
            context.close()
        self._shards.clear()
