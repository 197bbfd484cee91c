"""josef's producer: records accumulate per partition, batches go out per broker, retries keep order.

The design follows the Java client. ``send`` encodes the record straight
into its partition's open batch (the only per-record work) and returns a
future; a sender task on the event loop drains batches that are full or
have lingered ``linger.ms`` into one Produce request per broker, with up to
``max.in.flight.requests.per.connection`` requests outstanding. With
``enable.idempotence`` (the default) the producer has an id and epoch from
InitProducerId and numbers each partition's batches, so a batch retried after a
lost acknowledgement is stored once and in order.

With ``transactional.id`` the producer is transactional: ``init_transactions()``
once, then ``begin_transaction()``, sends (and ``send_offsets_to_transaction()``),
and ``commit_transaction()`` or ``abort_transaction()``. The
:class:`~josef_client.transaction_manager.TransactionManager` talks to the
coordinators and decides which partitions' batches may go out; the sender
holds back a partition's batches until the coordinator has added it.

The accumulator is guarded by a lock so that the synchronous
:class:`Producer` can append from the caller's thread; everything else runs on
the event loop. Futures complete on the loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.plugins import collect, get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.codecs import Compression
from josef.protocol.connection import Connection
from josef.protocol.errors import ConfigError, KafkaError, KafkaTimeoutError
from josef.protocol.records import HEADER_SIZE, TRANSACTIONAL_BIT, encode_record, seal_batch
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import STALE_METADATA, Cluster
from josef_client.config import PRODUCER, build_config
from josef_client.coordinator_requests import OffsetAndMetadata
from josef_client.group import ConsumerGroupMetadata
from josef_client.interceptors import InterceptorChain
from josef_client.sync import LoopThread
from josef_client.transaction_errors import TransactionAbortedError, TransactionStateError
from josef_client.transaction_manager import State, TransactionManager

log = logging.getLogger(__name__)

#: Bytes a record adds to a batch beyond key and value: the most its framing can take.
RECORD_OVERHEAD = 21
MAX_SEQUENCE = 2**31 - 1
#: The newest Produce version a transactional producer may use without Transactions V2 (v12 adds partitions itself).
PRODUCE_V1_TRANSACTIONS = 11

Headers = Sequence[tuple[str, bytes | None]]
DeliveryCallback = Callable[["RecordMetadata | None", "Exception | None"], None]


@attrs.frozen(slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int
    serialized_value_size: int


@attrs.frozen(slots=True)
class ProducerRecord:
    """What interceptors see and may replace in ``on_send``."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    headers: Headers


class ProducerBatch:
    """Records for one partition, encoded as they arrive, sent and completed together."""

    __slots__ = ("tp", "body", "count", "base_timestamp", "max_timestamp", "created", "attempts",
                 "base_sequence", "callbacks", "done", "error", "record_errors", "base_offset", "log_append_time",
                 "_async", "size", "deadline", "futures_key_value_sizes")

    def __init__(self, tp: TopicPartition, now: float, delivery_timeout_s: float) -> None:
        self.tp = tp
        self.body = bytearray()
        self.count = 0
        self.base_timestamp = 0
        self.max_timestamp = -1
        self.created = now
        self.deadline = now + delivery_timeout_s
        self.attempts = 0
        self.base_sequence = -1
        self.callbacks: list[tuple[int, DeliveryCallback]] = []
        self.done = threading.Event()
        self.error: Exception | None = None
        #: KIP-467: why the broker refused particular records of the batch, by their index in it.
        self.record_errors: dict[int, str] = {}
        self.base_offset = -1
        self.log_append_time = -1
        self.size = 0
        self._async: asyncio.Future[None] | None = None

    def append(self, key: bytes | None, value: bytes | None, timestamp: int, headers: Headers) -> int:
        if self.count == 0:
            self.base_timestamp = timestamp
        record = encode_record(self.count, timestamp - self.base_timestamp, key, value, headers)
        self.body += record
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        self.count += 1
        return len(record)

    def encode(self, codec: Compression, producer_id: int, producer_epoch: int, attributes: int) -> bytes:
        return seal_batch(self.body, self.count, self.base_timestamp, self.max_timestamp, compression=codec,
                          producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=self.base_sequence,
                          attributes=attributes)

    def async_done(self) -> asyncio.Future[None]:
        """An asyncio future of completion, created on first await (always on the producer's loop)."""
        if self._async is None:
            self._async = asyncio.get_running_loop().create_future()
            if self.done.is_set():
                self._async.set_result(None)
        return self._async

    def complete(self, base_offset: int, log_append_time: int, error: Exception | None) -> None:
        self.base_offset, self.log_append_time, self.error = base_offset, log_append_time, error
        self.done.set()
        if self._async is not None and not self._async.done():
            self._async.set_result(None)

    def error_of(self, index: int) -> Exception | None:
        """The error of record ``index``: the batch's, or, when the broker named refused records, as Java's producer says it."""
        if not self.record_errors or self.error is None:
            return self.error
        why = self.record_errors.get(index, "Failed to append record because it was part of a batch "
                                            "which had one more more invalid records")
        return KafkaError(ErrorCode.invalid_record, why)

    def metadata(self, index: int, key_size: int, value_size: int, timestamp: int) -> RecordMetadata:
        stamp = self.log_append_time if self.log_append_time >= 0 else timestamp
        offset = self.base_offset + index if self.base_offset >= 0 else -1  # acks=0: the broker says nothing
        return RecordMetadata(self.tp.topic, self.tp.partition, offset, stamp, key_size, value_size)


class RecordFuture:
    """The outcome of one ``send``: ``result(timeout)`` from any thread, or ``await`` on the producer's loop."""

    __slots__ = ("_batch", "_index", "_key_size", "_value_size", "_timestamp")

    def __init__(self, batch: ProducerBatch, index: int, key_size: int, value_size: int, timestamp: int) -> None:
        self._batch, self._index = batch, index
        self._key_size, self._value_size, self._timestamp = key_size, value_size, timestamp

    def done(self) -> bool:
        return self._batch.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.done.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        error = self._batch.error_of(self._index)
        if error is not None:
            raise error
        return self._batch.metadata(self._index, self._key_size, self._value_size, self._timestamp)

    def exception(self) -> Exception | None:
        return self._batch.error_of(self._index) if self.done() else None

    def __await__(self):  # type: ignore[no-untyped-def]
        yield from self._batch.async_done().__await__()
        return self.result(0)


class _PartitionState:
    """Idempotence bookkeeping for one partition: the next sequence, and whether a retry is being sorted out."""

    __slots__ = ("next_sequence", "in_flight", "recovering")

    def __init__(self) -> None:
        self.next_sequence = 0
        self.in_flight = 0
        self.recovering = False


def _bytes(value: Any, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes or None, not {type(value).__name__}; set {what}_serializer to convert it")


class AsyncProducer:
    """The asyncio producer. ``plugin_manager`` (not a Kafka key) selects where partitioners and interceptors come from."""

    def __init__(self, config: Mapping[str, Any] | None = None, *, plugin_manager: Any = None, **kwargs: Any) -> None:
        raw = {**(config or {}), **{k.replace("_", "."): v for k, v in kwargs.items()}}
        self.config = build_config("producer", PRODUCER, config, kwargs)
        self._acks = -1 if str(self.config["acks"]) in ("all", "-1") else int(self.config["acks"])
        transactional_id = self.config["transactional.id"]
        if transactional_id is not None and "enable.idempotence" in raw and not self.config["enable.idempotence"]:
            raise ConfigError("transactional.id needs enable.idempotence=true (a transactional producer is idempotent)")
        self._idempotent = self._resolve_idempotence("enable.idempotence" in raw or transactional_id is not None)
        self._codec = Compression.from_name(self.config["compression.type"])
        pm = plugin_manager or get_plugin_manager()
        self._partitioner = collect(pm, "register_partitioners", "partitioner").get(self.config["partitioner.class"])(self.config)
        self._interceptors = InterceptorChain.from_config(self.config["interceptor.classes"], self.config, pm)
        self._has_interceptors = bool(self._interceptors)
        self._max_request_size = self.config["max.request.size"]
        self._tps: dict[tuple[str, int], TopicPartition] = {}
        self._key_serializer = self.config["key.serializer"]
        self._value_serializer = self.config["value.serializer"]
        self._batch_size = max(self.config["batch.size"], 1)
        self._linger_s = self.config["linger.ms"] / 1000
        self._delivery_s = self.config["delivery.timeout.ms"] / 1000
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._batches: dict[TopicPartition, collections.deque[ProducerBatch]] = collections.defaultdict(collections.deque)
        self._buffered = 0
        self._partition_counts: dict[str, int] = {}
        self._states: dict[TopicPartition, _PartitionState] = collections.defaultdict(_PartitionState)
        self._in_flight: dict[int, int] = collections.defaultdict(int)
        self._unfinished: set[ProducerBatch] = set()
        self._flushing = False
        self.producer_id, self.producer_epoch = -1, -1
        self.cluster = Cluster(self.config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._space_freed: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._closing = False
        self._needs_epoch_bump = False
        self._awaited_connections: set[asyncio.Future[Connection]] = set()
        self._txn = (None if transactional_id is None else
                     TransactionManager(transactional_id, self.config, self.cluster, self._new_producer))
        self._attributes = 0 if self._txn is None else TRANSACTIONAL_BIT
        self._adding: asyncio.Future[None] | None = None

    def _resolve_idempotence(self, explicit: bool) -> bool:
        """Idempotence needs acks=all, retries and at most 5 requests in flight; the default gives way, an explicit true does not."""
        wanted = self.config["enable.idempotence"]
        conflicts = [text for bad, text in (
            (self._acks != -1, "acks=all"), (self.config["retries"] == 0, "retries > 0"),
            (self.config["max.in.flight.requests.per.connection"] > 5, "max.in.flight.requests.per.connection <= 5"))
            if bad]
        if wanted and conflicts:
            if explicit:
                raise ConfigError(f"enable.idempotence=true needs {' and '.join(conflicts)}")
            return False
        return bool(wanted)

    # Lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._space_freed = asyncio.Event()
        await self.cluster.refresh([])
        if self._idempotent and self._txn is None:  # a transactional producer's id comes from init_transactions()
            await self._init_producer_id()
        self._sender = self._loop.create_task(self._run_sender())

    async def _init_producer_id(self) -> None:
        """A fresh producer id at epoch 0 from the broker."""
        conn = await self.cluster.any_connection()
        response = await conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout": 60000,
                                                          "producer_id": -1, "producer_epoch": -1})
        if response.error_code != ErrorCode.none:
            raise KafkaError(response.error_code, "InitProducerId failed")
        self._new_producer(response.producer_id, response.producer_epoch)

    async def _bump_epoch(self) -> None:
        """After a numbered batch failed for good its sequence is a gap: restart every partition's numbering in a new epoch.

        As the Java client does for idempotent producers, the epoch is bumped
        locally (the broker accepts a higher epoch starting at sequence 0);
        only an exhausted epoch asks the broker for a new producer id.
        """
        if self.producer_epoch < 2**15 - 1:
            self._new_producer(self.producer_id, self.producer_epoch + 1)
        else:
            try:
                await self._init_producer_id()
            except KafkaError as exc:
                log.warning("could not get a new producer id (%s); retrying", exc)
                return
        self._needs_epoch_bump = False

    def _new_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id or epoch: every partition's sequence starts again at 0."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        with self._lock:
            self._states.clear()
            for queue in self._batches.values():
                for batch in queue:
                    batch.base_sequence = -1

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Send what is buffered (waiting at most ``timeout`` seconds), then release connections."""
        if self._sender is None:
            await self.cluster.close()
            return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except asyncio.TimeoutError:
            log.warning("closing with unsent records after %ss", timeout)
        self._closing = True
        self._sender.cancel()
        try:
            await self._sender
        except asyncio.CancelledError:
            pass
        self._fail_all(KafkaError(ErrorCode.unknown_server_error, "producer closed"))
        await self.cluster.close()
        self._sender = None

    # Sending --------------------------------------------------------------------------

    async def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                   timestamp_ms: int | None = None, headers: Headers | None = None,
                   on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Queue a record; returns a future of its :class:`RecordMetadata`. Waits only for metadata or buffer space."""
        if topic not in self._partition_counts:
            await self.learn_topic(topic)
        while self._buffered >= self.config["buffer.memory"]:
            await self._wait_for_space_async()
        future, wake = self.append(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        if wake:
            self._wakeup.set()  # type: ignore[union-attr]
        return future

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                            timestamp_ms: int | None = None, headers: Headers | None = None) -> RecordMetadata:
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future

    async def learn_topic(self, topic: str) -> None:
        """Wait (up to ``max.block.ms``) until the partitions of ``topic`` are known."""
        partitions = await self.cluster.partitions_for(topic, timeout_s=self.config["max.block.ms"] / 1000)
        self._partition_counts[topic] = len(partitions)

    async def _wait_for_space_async(self) -> None:
        assert self._space_freed is not None
        self._space_freed.clear()
        try:
            await asyncio.wait_for(self._space_freed.wait(), self.config["max.block.ms"] / 1000)
        except asyncio.TimeoutError:
            raise KafkaTimeoutError(f"buffer.memory ({self.config['buffer.memory']} bytes) stayed full for max.block.ms") from None

    def wait_for_space(self) -> None:
        """Block a thread other than the loop's while ``buffer.memory`` is full, up to ``max.block.ms``."""
        limit = self.config["buffer.memory"]
        if self._buffered >= limit:
            with self._space:
                if not self._space.wait_for(lambda: self._buffered < limit, self.config["max.block.ms"] / 1000):
                    raise KafkaTimeoutError(f"buffer.memory ({limit} bytes) stayed full for max.block.ms")

    def append(self, topic: str, value: Any, key: Any, partition: int | None, timestamp_ms: int | None,
                headers: Headers | None, on_delivery: DeliveryCallback | None) -> tuple[RecordFuture, bool]:
        """Encode a record into its partition's open batch; thread-safe. Returns the future and whether to wake the sender.

        This is the producer's per-record path: keep it lean.
        """
        if self._closing:
            raise KafkaError(ErrorCode.unknown_server_error, "producer is closed")
        if self._key_serializer is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None:
            value = self._value_serializer(value)
        if key is not None and type(key) is not bytes:
            key = _bytes(key, "key")
        if value is not None and type(value) is not bytes:
            value = _bytes(value, "value")
        if headers is None:
            headers = ()
        if self._has_interceptors:
            record = self._interceptors.on_send(ProducerRecord(topic, partition, key, value, timestamp_ms, headers))
            topic, partition, key, value, timestamp_ms, headers = (
                record.topic, record.partition, record.key, record.value, record.timestamp_ms, record.headers)
        count = self._partition_counts[topic]
        timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        key_size = -1 if key is None else len(key)
        value_size = -1 if value is None else len(value)
        if partition is None:
            partition = self._partitioner.partition(topic, key, value, count)
        elif not 0 <= partition < count:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{topic} has no partition {partition}")
        tp = self._tps.get((topic, partition))
        if tp is None:
            tp = self._tps[(topic, partition)] = TopicPartition(topic, partition)
        wake = self._txn is not None and self._txn.will_send_to(tp)  # a new partition: the sender adds it
        with self._lock:
            queue = self._batches[tp]
            batch = queue[-1] if queue else None
            if batch is None or batch.size + RECORD_OVERHEAD + key_size + value_size > self._batch_size and batch.count:
                if RECORD_OVERHEAD + HEADER_SIZE + key_size + value_size > self._max_request_size:
                    raise KafkaError(ErrorCode.message_too_large,
                                     f"a record of {key_size + value_size} bytes exceeds max.request.size")
                if batch is not None:
                    wake = True  # a full batch is ready
                    if key is None:
                        self._sticky_moves_on(topic, partition)
                batch = ProducerBatch(tp, time.monotonic(), self._delivery_s)
                queue.append(batch)
                self._unfinished.add(batch)
                wake = wake or len(queue) == 1
            index = batch.count
            size = batch.append(key, value, timestamp, headers)
            batch.size += size
            self._buffered += size
            if on_delivery is not None or self._has_interceptors:
                batch.callbacks.append((index, self._callback(on_delivery, key_size, value_size, timestamp)))
        if wake and self._loop is not None and not self._on_loop():
            self._loop.call_soon_threadsafe(self._wakeup.set)  # type: ignore[union-attr]
            wake = False
        return RecordFuture(batch, index, key_size, value_size, timestamp), wake

    def _sticky_moves_on(self, topic: str, partition: int) -> None:
        """A batch of ``partition`` closed: a sticky partitioner picks another for keyless records (KIP-480)."""
        on_new_batch = getattr(self._partitioner, "on_new_batch", None)
        if on_new_batch is not None:
            on_new_batch(topic, self._partition_counts[topic], partition)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _callback(self, on_delivery: DeliveryCallback | None, key_size: int, value_size: int,
                  timestamp: int) -> Callable[[ProducerBatch, int], None]:
        interceptors = self._interceptors

        def deliver(batch: ProducerBatch, index: int) -> None:
            error = batch.error_of(index)
            metadata = None if error else batch.metadata(index, key_size, value_size, timestamp)
            if interceptors:
                interceptors.on_acknowledgement(metadata, error)
            if on_delivery is not None:
                try:
                    on_delivery(metadata, error)
                except Exception:
                    log.exception("delivery callback failed")

        return deliver  # type: ignore[return-value]

    async def flush(self) -> None:
        """Send everything buffered now, without waiting for linger.ms, and wait for every acknowledgement."""
        with self._lock:
            pending = list(self._unfinished)
        if not pending:
            return
        self._flushing = True
        self._wakeup.set()  # type: ignore[union-attr]
        try:
            for batch in pending:
                await batch.async_done()
        finally:
            self._flushing = False

    # Transactions ---------------------------------------------------------------------------

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise TransactionStateError("transactions need the transactional.id configuration")
        return self._txn

    async def init_transactions(self, timeout: float | None = None) -> None:
        """Get the transactional id's producer id and epoch, fencing older producers and aborting what they left open.

        Call once, before the first transaction. ``timeout`` (seconds)
        defaults to ``max.block.ms``; after a :class:`KafkaTimeoutError`,
        calling again resumes.
        """
        await self._transactions().init_transactions(_ms(timeout))

    def begin_transaction(self) -> None:
        """Open a transaction: what is sent from now until commit or abort is all written or all discarded."""
        self._transactions().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                                          group_metadata: ConsumerGroupMetadata | str,
                                          timeout: float | None = None) -> None:
        """Commit a consumer group's offsets as part of the transaction (consume-transform-produce).

        ``group_metadata`` is the consumer's ``group_metadata()`` (its
        generation and member id let the coordinator refuse a fenced
        member's commit) or just the group id.
        """
        await self._transactions().send_offsets(offsets, group_metadata, _ms(timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Send every buffered record, wait for their acknowledgements, then commit.

        Raises :class:`~josef_client.transaction_errors.TransactionAbortableError`
        if a record failed (abort, then go on), or a fatal error.
        """
        txn = self._transactions()
        txn.begin_commit()
        deadline = _deadline(timeout, self.config["max.block.ms"])
        await self._flush_until(deadline, "commit_transaction()")
        await txn.end_transaction(True, _remaining_ms(deadline))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Discard the transaction: records not sent yet fail with :class:`TransactionAbortedError`, the rest is aborted."""
        txn = self._transactions()
        txn.begin_abort()
        self._drop_unsent(TransactionAbortedError(), sequenced_too=False)
        deadline = _deadline(timeout, self.config["max.block.ms"])
        await self._flush_until(deadline, "abort_transaction()")
        await txn.end_transaction(False, _remaining_ms(deadline))

    async def _flush_until(self, deadline: float, call: str) -> None:
        try:
            await asyncio.wait_for(self.flush(), max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            raise KafkaTimeoutError(f"{call}: records still unacknowledged after max.block.ms; call again to resume") from None

    def _transaction_housekeeping(self, txn: TransactionManager) -> None:
        """Before draining: fail what a failed transaction can no longer send, and add new partitions."""
        error = txn.error_for_unsent()
        if error is not None:
            self._drop_unsent(error, sequenced_too=txn.state is State.FATAL_ERROR)
        if txn.partitions_to_add and (self._adding is None or self._adding.done()):
            self._adding = asyncio.ensure_future(self._add_partitions(txn))

    async def _add_partitions(self, txn: TransactionManager) -> None:
        try:
            await txn.add_partitions()
        finally:
            self._wakeup.set()  # type: ignore[union-attr]

    def _drop_unsent(self, error: Exception, *, sequenced_too: bool) -> None:
        """Fail queued batches; those with a sequence (retries) stay unless ``sequenced_too``: the broker may have them."""
        dropped = []
        with self._lock:
            for tp in list(self._batches):
                queue = self._batches[tp]
                keep = collections.deque(b for b in queue if b.base_sequence >= 0 and not sequenced_too)
                dropped.extend(b for b in queue if b.base_sequence < 0 or sequenced_too)
                if keep:
                    self._batches[tp] = keep
                else:
                    del self._batches[tp]
            for batch in dropped:
                self._buffered -= batch.size
                self._unfinished.discard(batch)
        for batch in dropped:
            self._complete_expired(batch, error)

    # The sender ---------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        assert self._wakeup is not None
        while True:
            delay = await self._send_ready()
            self._wakeup.clear()
            if delay is None:
                await self._wakeup.wait()
            elif delay > 0:
                try:
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    async def _send_ready(self) -> float | None:
        """Send every batch that is ready to a broker with room in flight; returns seconds until the next may be ready."""
        if self._needs_epoch_bump:
            if any(self._in_flight.values()):
                return None  # the last response wakes us
            await self._bump_epoch()
        txn = self._txn
        if txn is not None:
            self._transaction_housekeeping(txn)
        now = time.monotonic()
        by_node: dict[int, list[ProducerBatch]] = collections.defaultdict(list)
        next_check: float | None = None
        unknown_leaders = False
        with self._lock:
            for tp, queue in self._batches.items():
                self._expire(queue, now)
                if not queue:
                    continue
                batch = queue[0]
                ready_at = batch.created + self._linger_s
                if not (len(queue) > 1 or batch.size >= self._batch_size or self._flushing or ready_at <= now
                        or self._closing):
                    next_check = ready_at - now if next_check is None else min(next_check, ready_at - now)
                    continue
                if txn is not None and not txn.sendable(tp):
                    continue  # the coordinator adds the partition first; its answer wakes us
                node = self.cluster.leader(tp)
                if node < 0:
                    unknown_leaders = True
                    continue
                state = self._states[tp]
                if self._idempotent and state.recovering and state.in_flight:
                    continue  # a retried batch must land before anything after it is sent
                by_node[node].append(batch)
        if unknown_leaders:
            asyncio.ensure_future(self._refresh_quietly())
            next_check = self.config["retry.backoff.ms"] / 1000 if next_check is None else next_check
        max_in_flight = self.config["max.in.flight.requests.per.connection"]
        for node, heads in by_node.items():
            if self._in_flight[node] >= max_in_flight:
                continue
            conn = self.cluster.ready(node)
            if conn is None:  # requests go out only on a live connection, so they reach the broker in order
                connecting = self.cluster.connecting(node)
                if connecting is None:  # backing off after a failed attempt
                    backoff = self.config["reconnect.backoff.ms"] / 1000
                    next_check = backoff if next_check is None else min(next_check, backoff)
                elif connecting not in self._awaited_connections:
                    self._awaited_connections.add(connecting)
                    connecting.add_done_callback(self._connected)
                continue
            drained = self._drain(heads)
            if drained:
                self._in_flight[node] += 1
                self._produce(node, conn, drained)
        # None: nothing to time; batches waiting for room in flight are woken by the next response.
        return next_check

    def _connected(self, attempt: asyncio.Future[Connection]) -> None:
        self._awaited_connections.discard(attempt)
        if self._closing:
            return
        if attempt.cancelled() or attempt.exception() is not None:
            asyncio.ensure_future(self._refresh_quietly())  # the broker may have moved
        self._wakeup.set()  # type: ignore[union-attr]

    def _drain(self, heads: list[ProducerBatch]) -> list[ProducerBatch]:
        """Take ready batches off their queues (one per partition), up to max.request.size; assign sequences."""
        limit = self.config["max.request.size"]
        total = 0
        taken = []
        with self._lock:
            for batch in heads:
                if taken and total + batch.size > limit:
                    break
                queue = self._batches[batch.tp]
                if not queue or queue[0] is not batch:
                    continue
                queue.popleft()
                if not queue:
                    del self._batches[batch.tp]
                    self._sticky_moves_on(batch.tp.topic, batch.tp.partition)
                state = self._states[batch.tp]
                if self._idempotent and batch.base_sequence < 0:
                    batch.base_sequence = state.next_sequence
                    state.next_sequence = (state.next_sequence + batch.count) & MAX_SEQUENCE
                state.in_flight += 1
                total += batch.size
                taken.append(batch)
        return taken

    def _produce(self, node: int, conn: Connection, batches: list[ProducerBatch]) -> None:
        """Write one Produce request now, in drain order; a task waits for its response."""
        by_topic: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for batch in batches:
            batch.attempts += 1
            by_topic[batch.tp.topic].append({"index": batch.tp.partition, "records": batch.encode(
                self._codec, self.producer_id, self.producer_epoch, self._attributes)})
        txn = self._txn
        if txn is not None:
            txn.batches_sent()
        body = {"transactional_id": None if txn is None else txn.transactional_id, "acks": self._acks,
                "timeout": self.config["request.timeout.ms"],
                "topic_data": [{"name": t, "partition_data": p} for t, p in by_topic.items()]}
        try:
            version = None
            if txn is not None and not txn.v2:
                version = min(conn.version(ApiKey.PRODUCE), PRODUCE_V1_TRANSACTIONS)
            future = conn.send(ApiKey.PRODUCE, body, version=version, expect_response=self._acks != 0)
        except KafkaError as exc:
            self._failed_request(node, batches, exc)
            return
        asyncio.ensure_future(self._complete(node, conn, future, batches))

    def _failed_request(self, node: int, batches: list[ProducerBatch], error: KafkaError) -> None:
        """The connection was lost or timed out: every batch of the request is retried."""
        for batch in batches:
            self._retry_or_fail(batch, error, refresh=True)
        self._in_flight[node] -= 1
        self._wakeup.set()  # type: ignore[union-attr]

    async def _complete(self, node: int, conn: Connection, future: asyncio.Future[Any] | None,
                        batches: list[ProducerBatch]) -> None:
        try:
            await conn.drain()
            if future is None:
                for batch in batches:
                    self._finish(batch, -1, -1, None)
                return
            response = await conn.wait(future)
        except KafkaError as exc:
            self._failed_request(node, batches, exc)
            return
        try:
            results = {(t.name, p.index): p for t in response.responses for p in t.partition_responses}
            for batch in batches:
                result = results.get((batch.tp.topic, batch.tp.partition))
                if result is None:
                    self._retry_or_fail(batch, KafkaError(ErrorCode.unknown_server_error, "no answer for the partition"))
                elif result.error_code == ErrorCode.none:
                    stamp = getattr(result, "log_append_time", None)
                    append_time = int(stamp.timestamp() * 1000) if stamp is not None else -1
                    self._finish(batch, result.base_offset, append_time, None)
                else:
                    batch.record_errors = {e.batch_index: e.batch_index_error_message or ""
                                           for e in getattr(result, "record_errors", ())}
                    self._retry_or_fail(batch, KafkaError(result.error_code, getattr(result, "error_message", None) or ""),
                                        refresh=result.error_code in STALE_METADATA)
        finally:
            self._in_flight[node] -= 1
            self._wakeup.set()  # type: ignore[union-attr]

    def _retry_or_fail(self, batch: ProducerBatch, error: KafkaError, refresh: bool = False) -> None:
        state = self._states[batch.tp]
        state.in_flight -= 1
        retriable = error.retriable or error.code == ErrorCode.out_of_order_sequence_number and self._idempotent
        if retriable and batch.attempts <= self.config["retries"] and time.monotonic() < batch.deadline:
            log.debug("retrying batch for %s after %s", batch.tp, error)
            if self._idempotent:
                state.recovering = True
            if refresh:
                asyncio.ensure_future(self._refresh_quietly())
            self._loop.call_later(self.config["retry.backoff.ms"] / 1000, self._requeue, batch)  # type: ignore[union-attr]
            return
        if self._txn is not None:
            self._txn.batch_failed(error, batch.base_sequence >= 0)  # the transaction fails, not just the batch
        elif self._idempotent and batch.base_sequence >= 0:
            self._needs_epoch_bump = True
        self._finish(batch, -1, -1, error, state_updated=True)

    def _requeue(self, batch: ProducerBatch) -> None:
        """Put a retried batch back in sequence order, ahead of newer batches of its partition."""
        with self._lock:
            queue = self._batches[batch.tp]
            position = 0
            while position < len(queue) and 0 <= queue[position].base_sequence < batch.base_sequence:
                position += 1
            queue.insert(position, batch)
        self._wakeup.set()  # type: ignore[union-attr]

    def _finish(self, batch: ProducerBatch, base_offset: int, append_time: int, error: Exception | None,
                state_updated: bool = False) -> None:
        state = self._states[batch.tp]
        if not state_updated:
            state.in_flight -= 1
        if error is None and state.in_flight == 0:
            state.recovering = False
        with self._lock:
            self._buffered -= batch.size
            self._unfinished.discard(batch)
            self._space.notify_all()
        batch.complete(base_offset, append_time, error)
        self._space_freed.set()  # type: ignore[union-attr]
        for index, callback in batch.callbacks:
            callback(batch, index)  # type: ignore[call-arg]

    def _expire(self, queue: collections.deque[ProducerBatch], now: float) -> None:
        """Fail batches that waited past delivery.timeout.ms (called with the lock held)."""
        while queue and queue[0].deadline <= now:
            batch = queue.popleft()
            error = KafkaTimeoutError(f"{batch.count} records for {batch.tp.topic}-{batch.tp.partition} expired "
                                      f"after delivery.timeout.ms without an acknowledgement")
            self._buffered -= batch.size
            self._unfinished.discard(batch)
            self._loop.call_soon(self._complete_expired, batch, error)  # type: ignore[union-attr]

    def _complete_expired(self, batch: ProducerBatch, error: Exception) -> None:
        batch.complete(-1, -1, error)
        self._space_freed.set()  # type: ignore[union-attr]
        with self._lock:
            self._space.notify_all()
        for index, callback in batch.callbacks:
            callback(batch, index)  # type: ignore[call-arg]

    async def _refresh_quietly(self) -> None:
        try:
            await self.cluster.refresh(list(self._partition_counts))
        except KafkaError as exc:
            log.debug("metadata refresh failed: %s", exc)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            batches = [b for q in self._batches.values() for b in q]
            self._batches.clear()
        for batch in batches:
            batch.complete(-1, -1, error)

    def partitions_for(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, once the producer has sent to it."""
        return self._partition_counts.get(topic)


def _ms(timeout: float | None) -> int | None:
    return None if timeout is None else int(timeout * 1000)


def _deadline(timeout: float | None, default_ms: int) -> float:
    return time.monotonic() + (default_ms / 1000 if timeout is None else timeout)


def _remaining_ms(deadline: float) -> int:
    return max(int((deadline - time.monotonic()) * 1000), 0)


class Producer:
    """The synchronous producer: ``send`` returns at once with a future; ``flush`` waits for acknowledgements.

    Records are encoded in the calling thread; the network work happens on a
    private event loop thread, where delivery callbacks also run.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, plugin_manager: Any = None, **kwargs: Any) -> None:
        self._thread = LoopThread("josef-producer")
        try:
            self._producer = AsyncProducer(config, plugin_manager=plugin_manager, **kwargs)
            self._thread.run(self._producer.start())
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._producer.config

    def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Headers | None = None,
             on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        producer = self._producer
        if producer.partitions_for(topic) is None:
            self._thread.run(producer.learn_topic(topic))
        producer.wait_for_space()
        future, _ = producer.append(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        return future

    def flush(self, timeout: float | None = None) -> None:
        self._thread.run(self._producer.flush(), timeout)

    def init_transactions(self, timeout: float | None = None) -> None:
        self._thread.run(self._producer.init_transactions(timeout))

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                                    group_metadata: ConsumerGroupMetadata | str, timeout: float | None = None) -> None:
        self._thread.run(self._producer.send_offsets_to_transaction(offsets, group_metadata, timeout))

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._thread.run(self._producer.commit_transaction(timeout))

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._thread.run(self._producer.abort_transaction(timeout))

    def partitions_for(self, topic: str) -> int:
        known = self._producer.partitions_for(topic)
        if known is None:
            self._thread.run(self._producer.learn_topic(topic))
            known = self._producer.partitions_for(topic)
        assert known is not None
        return known

    def close(self, timeout: float | None = None) -> None:
        try:
            self._thread.run(self._producer.close(timeout))
        finally:
            self._thread.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
