"""A workload of real clients for history checks: producers, transactions, readers and consumer groups.

Each part runs in threads of the test process (the clients block) and records
what it does into a :class:`~josef.testing.history.History`; at the end,
:meth:`Workload.finish` drains the producers, reads every partition back
(:func:`final_read`), waits for the groups to commit up to the end, stops
everything and returns the read-back for :func:`~josef.testing.history.check`::

    history = History()
    cluster.faults.listeners.append(history.on_fault)
    create_topic(cluster.bootstrap_servers, "checked", partitions=6)
    with Workload(cluster.bootstrap_servers, "checked", history=history, seed=7, parts=[
            Producers(count=2, rate=200), Transactions(rate=5), Readers(), Group("g", members=3)]) as workload:
        workload.start()
        workload.progress(500)          # 500 more acknowledgements
        ... faults ...
        final = workload.finish()
    verdict = check(history, final)
    print(verdict.report())

The clients are behind a small driver interface (:class:`Client`), so the same
workload runs with confluent-kafka (:class:`ConfluentClient`, the default,
named ``"confluent"``) and with josef's own client, whose driver lives with
that client (``josef_client.workload.JosefClient``: the core imports no
client). Client libraries are imported when first used, with an error saying
what to install.

Values are unique ids naming their producer and sequence
(:func:`~josef.testing.history.value_id`); which partition each goes to, and
which transactions abort, come from ``seed``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import attrs

from josef.protocol.topic_partition import TopicPartition
from josef.testing.producer_stamps import read_stamps
from josef.testing.history import (
    FAILED,
    ISOLATION_LEVELS,
    OK,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNKNOWN,
    FinalReads,
    GroupOffset,
    History,
    LogRecord,
    PartitionRead,
    decode_value,
    encode_value,
    value_id,
)

__all__ = [
    "FAULT_CONSUMER", "FAULT_PRODUCER",
    "Client", "ConfluentClient", "ConsumerClient", "Delivery", "Failure", "Group", "ProducerClient", "Producers",
    "Readers", "Rebalance", "Record", "Transactions", "Workload", "create_topic", "final_read", "group_offsets",
    "resolve_client",
]

log = logging.getLogger(__name__)

#: How long a client call (init, commit, abort, metadata) may take before the workload calls it unknown.
CALL_TIMEOUT_S = 30.0
#: How often a retriable commit of a transaction is tried before its outcome is called unknown.
COMMIT_ATTEMPTS = 3

#: Client settings for runs under faults: give up on a silent broker within seconds, and keep retrying a record
#: for longer than a fault lasts (up to ``transaction.timeout.ms``, which a transactional producer may not exceed).
#: A frozen node keeps its connections open and answers nothing, so only a request's own timeout ends a wait on it.
FAULT_PRODUCER = {"request.timeout.ms": 5000, "delivery.timeout.ms": 60000, "socket.connection.setup.timeout.ms": 3000}
#: ``max.poll.interval.ms`` is also the rebalance timeout, and the timeout of a JoinGroup: at its default (5 min)
#: a member whose JoinGroup went to a coordinator that then froze waits five minutes before it looks for the new one.
FAULT_CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "max.poll.interval.ms": 15000,
                  "request.timeout.ms": 10000, "socket.connection.setup.timeout.ms": 3000}


# The driver interface ------------------------------------------------------------------------------------------


@attrs.frozen
class Failure:
    """A client's error, sorted as the workload needs it.

    ``definite``: the record surely was not written. ``fatal``: this client
    instance cannot go on (the workload replaces it). ``abortable``: the
    transaction must be aborted and surely did not commit. ``retriable``: the
    same call may be tried again.
    """

    text: str
    definite: bool = False
    fatal: bool = False
    abortable: bool = False
    retriable: bool = False


class Record(NamedTuple):
    """A consumed record as drivers hand it over (``leader_epoch`` -1 when unknown)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    leader_epoch: int


#: ``on_delivery(offset, error)``: the offset on success (error None), else -1 and the client's error.
Delivery = Callable[[int, Any], None]
Rebalance = Callable[[list[TopicPartition]], None]


class ProducerClient(Protocol):
    def send(self, topic: str, partition: int, value: bytes, on_delivery: Delivery) -> None:
        """Queue a record; raises when it could not be queued (so it was surely not written)."""

    def poll(self, timeout: float) -> None:
        """Run due delivery callbacks (clients that call them on their own thread just wait)."""

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` for every queued record's outcome."""

    def abandon(self) -> None:
        """Give up on records still queued or in flight, failing their deliveries where the client can."""

    def close(self, timeout: float) -> None: ...

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float) -> None: ...

    def abort_transaction(self, timeout: float) -> None: ...


class ConsumerClient(Protocol):
    def partitions(self, topic: str, timeout: float) -> int:
        """How many partitions ``topic`` has."""

    def watermarks(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        """The log start offset and the end at the consumer's isolation level (high watermark or last stable offset)."""

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read these partitions from their log start, outside any group."""

    def subscribe(self, topics: Sequence[str], on_assign: Rebalance, on_revoke: Rebalance, on_lost: Rebalance) -> None:
        """Join the configured group; the callbacks get the partitions added, taken back, or lost."""

    def poll(self, max_records: int, timeout: float) -> list[Record]: ...

    def position(self, tp: TopicPartition) -> int:
        """The next offset this consumer will read in ``tp`` (past control and aborted records), -1 before any."""

    def commit(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Any]:
        """Commit synchronously: each partition's error (None where it succeeded); raises when it failed whole."""

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        """The group's committed offsets (-1 where none)."""

    def close(self) -> None: ...


class Client(Protocol):
    """A client library behind the workload: makes producers and consumers with Kafka's property names."""

    name: str

    def producer(self, bootstrap: str, settings: Mapping[str, Any]) -> ProducerClient: ...

    def consumer(self, bootstrap: str, settings: Mapping[str, Any]) -> ConsumerClient: ...

    def classify(self, error: Any) -> Failure: ...


# confluent-kafka ----------------------------------------------------------------------------------------------


def _confluent_kafka() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin  # noqa: F401 (create_topic's)
    except ImportError as exc:
        raise ImportError("the workload's 'confluent' client needs confluent-kafka: "
                          "pip install confluent-kafka") from exc
    return confluent_kafka


class ConfluentClient:
    """confluent-kafka (librdkafka) behind the workload."""

    name = "confluent"

    def __init__(self) -> None:
        self.kafka = _confluent_kafka()
        codes = self.kafka.KafkaError
        #: Errors after which the record surely was not written: refused as invalid or unauthorized. Not
        #: _PURGE_QUEUE: a queued record may be a retry of one the broker wrote (librdkafka knows, in the
        #: message status, which confluent-kafka does not show).
        self._definite = {getattr(codes, name) for name in (
            "MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD",
            "INVALID_MSG", "INVALID_REQUIRED_ACKS", "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC")}

    def producer(self, bootstrap: str, settings: Mapping[str, Any]) -> ProducerClient:
        import os as _os
        extra = {}
        if _os.environ.get("JOSEF_RDKAFKA_DEBUG"):
            _l = logging.getLogger(f"rdk.{id(settings)}.{time.monotonic()}")
            _l.propagate = False
            _h = logging.FileHandler(f"/tmp/rep/rdk-{_os.getpid()}-{time.monotonic():.3f}.log")
            _h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            _l.addHandler(_h); _l.setLevel(logging.DEBUG)
            extra = {"debug": _os.environ["JOSEF_RDKAFKA_DEBUG"], "logger": _l}
        return _ConfluentProducer(self.kafka, {"bootstrap.servers": bootstrap, **_librdkafka(settings, producer=True), **extra})

    def consumer(self, bootstrap: str, settings: Mapping[str, Any]) -> ConsumerClient:
        return _ConfluentConsumer(self.kafka, {"bootstrap.servers": bootstrap, "enable.partition.eof": True,
                                               **_librdkafka(settings, producer=False)})

    def classify(self, error: Any) -> Failure:
        kafka = self.kafka
        if isinstance(error, kafka.KafkaException) and error.args and isinstance(error.args[0], kafka.KafkaError):
            error = error.args[0]
        if isinstance(error, kafka.KafkaError):
            return Failure(f"{error.name()}: {error.str()}", definite=error.code() in self._definite,
                           fatal=error.fatal(), abortable=error.txn_requires_abort(), retriable=error.retriable())
        return Failure(f"{type(error).__name__}: {error}")


class _ConfluentProducer:
    def __init__(self, kafka: Any, config: Mapping[str, Any]) -> None:
        self._producer = kafka.Producer(dict(config))

    def send(self, topic: str, partition: int, value: bytes, on_delivery: Delivery) -> None:
        def delivered(error: Any, message: Any) -> None:
            on_delivery(message.offset() if error is None else -1, error)

        while True:
            try:
                self._producer.produce(topic, value, partition=partition, on_delivery=delivered)
                return
            except BufferError:  # the local queue is full: deliver what is done, then try again
                self._producer.poll(0.05)

    def poll(self, timeout: float) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout)

    def abandon(self) -> None:
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._producer.poll(0)  # the purged records' callbacks

    def close(self, timeout: float) -> None:
        self._producer.flush(timeout)

    def init_transactions(self, timeout: float) -> None:
        self._producer.init_transactions(timeout)

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def commit_transaction(self, timeout: float) -> None:
        self._producer.commit_transaction(timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._producer.abort_transaction(timeout)


def _librdkafka(settings: Mapping[str, Any], *, producer: bool) -> dict[str, Any]:
    """``settings`` in librdkafka's terms: Java's ``request.timeout.ms`` bounds every request, librdkafka's only a
    produce; its ``socket.timeout.ms`` (60 s by default) bounds the others (FindCoordinator, InitProducerId,
    metadata), so a group lookup that went to a frozen broker would wait a minute."""
    config = dict(settings)
    if "request.timeout.ms" in config:
        config.setdefault("socket.timeout.ms", config["request.timeout.ms"])
        if not producer:
            del config["request.timeout.ms"]  # a producer property librdkafka's consumer warns about
    return config


class _ConfluentConsumer:
    def __init__(self, kafka: Any, config: Mapping[str, Any]) -> None:
        self._kafka = kafka
        self._consumer = kafka.Consumer(dict(config))
        self._positions: dict[TopicPartition, int] = {}

    def _tp(self, tp: TopicPartition, offset: int | None = None) -> Any:
        return self._kafka.TopicPartition(tp.topic, tp.partition) if offset is None else \
            self._kafka.TopicPartition(tp.topic, tp.partition, offset)

    def partitions(self, topic: str, timeout: float) -> int:
        described = self._consumer.list_topics(topic, timeout=timeout).topics[topic]
        if described.error is not None:
            raise self._kafka.KafkaException(described.error)
        return len(described.partitions)

    def watermarks(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(self._tp(tp), timeout=timeout)
        return low, high

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.assign([self._tp(tp, self._kafka.OFFSET_BEGINNING) for tp in partitions])

    def subscribe(self, topics: Sequence[str], on_assign: Rebalance, on_revoke: Rebalance, on_lost: Rebalance) -> None:
        def ours(partitions: Iterable[Any]) -> list[TopicPartition]:
            return [TopicPartition(p.topic, p.partition) for p in partitions]

        self._consumer.subscribe(list(topics), on_assign=lambda _, ps: on_assign(ours(ps)),
                                 on_revoke=lambda _, ps: on_revoke(ours(ps)), on_lost=lambda _, ps: on_lost(ours(ps)))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        records = []
        for message in self._consumer.consume(max_records, timeout):
            error = message.error()
            if error is not None:
                if error.code() == self._kafka.KafkaError._PARTITION_EOF:
                    self._positions[TopicPartition(message.topic(), message.partition())] = message.offset()
                else:
                    log.debug("consumer error: %s", error)
                continue
            epoch = message.leader_epoch()
            records.append(Record(message.topic(), message.partition(), message.offset(), message.value(),
                                  -1 if epoch is None else epoch))
            self._positions[TopicPartition(message.topic(), message.partition())] = message.offset() + 1
        return records

    def position(self, tp: TopicPartition) -> int:
        # librdkafka's own position stays at the last record + 1 until it reports the end of the partition
        # (past control and aborted records), which enable.partition.eof makes it do.
        return self._positions.get(tp, -1)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Any]:
        done = self._consumer.commit(offsets=[self._tp(tp, offset) for tp, offset in offsets.items()],
                                     asynchronous=False)
        return {TopicPartition(p.topic, p.partition): p.error for p in done or ()}

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        found = self._consumer.committed([self._tp(tp) for tp in partitions], timeout=timeout)
        return {TopicPartition(p.topic, p.partition): p.offset if p.offset >= 0 else -1 for p in found}

    def close(self) -> None:
        self._consumer.close()


_BUILT_IN: dict[str, Callable[[], Client]] = {"confluent": ConfluentClient}


def resolve_client(client: Client | str) -> Client:
    """A driver by name (``"confluent"``) or as given (josef's: ``josef_client.workload.JosefClient()``)."""
    if not isinstance(client, str):
        return client
    try:
        return _BUILT_IN[client]()
    except KeyError:
        raise ValueError(f"no workload client named {client!r}: {sorted(_BUILT_IN)} are built in; pass another "
                         "as an object (josef's: josef_client.workload.JosefClient())") from None


# The parts of a workload ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Producers:
    """``count`` idempotent ``acks=all`` producers, each sending ``rate`` unique records a second to random partitions.

    ``records`` stops each after that many; ``settings`` add to or override
    the client's (Kafka property names).
    """

    count: int = 1
    client: Any = "confluent"
    rate: float = 200.0
    records: int | None = None
    settings: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Transactions:
    """``count`` transactional producers, each writing ``rate`` transactions a second of one record on each of
    ``partitions_per_txn`` random partitions, aborting a ``abort_ratio`` share of them at random."""

    count: int = 1
    client: Any = "confluent"
    rate: float = 5.0
    partitions_per_txn: int = 3
    abort_ratio: float = 0.3
    settings: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Readers:
    """One consumer per isolation level, assigned every partition from its start, recording every record it reads."""

    isolation: Sequence[str] = (READ_COMMITTED,)
    client: Any = "confluent"
    settings: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Group:
    """A consumer group of ``members`` members subscribed to the topic, committing synchronously after each batch.

    Two parts with one name make one group of members of two clients (the same isolation level, then).
    """

    name: str
    members: int = 3
    client: Any = "confluent"
    isolation: str = READ_UNCOMMITTED
    settings: Mapping[str, Any] = attrs.field(factory=dict)


Part = Producers | Transactions | Readers | Group


class _Worker:
    """One client in a thread; an unexpected exception ends it and is kept in ``error``."""

    def __init__(self, workload: Workload, client: Client, name: str) -> None:
        self.workload = workload
        self.history = workload.history
        self.client = client
        self.name = name
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"workload-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            log.exception("workload client %s failed", self.name)
            self.error = exc

    def run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    def join(self, deadline: float) -> bool:
        """Wait for the thread until ``deadline`` (monotonic); whether it ended (or never started)."""
        if self._thread.ident is not None:
            self._thread.join(max(deadline - time.monotonic(), 0))
        return not self._thread.is_alive()

    def _pace(self, producer: ProducerClient, until: float) -> None:
        """Wait until ``until`` (monotonic) or a stop, running due delivery callbacks every 50 ms."""
        while True:
            producer.poll(0)
            left = until - time.monotonic()
            if left <= 0 or self._stop.wait(min(left, 0.05)):
                return


class _Sender(_Worker):
    """What idempotent and transactional producers share: sending with outcomes recorded, replacing a dead client."""

    def __init__(self, workload: Workload, client: Client, name: str, settings: Mapping[str, Any], seed: int) -> None:
        super().__init__(workload, client, name)
        self.settings = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, **settings}
        self.random = random.Random(seed)
        self.generation = 0
        self.process = name
        self._outstanding: dict[str, tuple[str, str, int]] = {}  # value -> (process, topic, partition)
        self._lock = threading.Lock()
        self.fatal: Failure | None = None

    def _send(self, producer: ProducerClient, partition: int, value: str, txn: str | None = None) -> None:
        topic = self.workload.topic
        process = self.process
        self.history.send(process, topic, partition, value, txn)
        with self._lock:
            self._outstanding[value] = (process, topic, partition)

        def delivered(offset: int, error: Any) -> None:
            with self._lock:
                if self._outstanding.pop(value, None) is None:
                    return  # already given up on at a replacement or the drain
            if error is None:
                self.history.ack(process, value, topic, partition, offset)
                self.workload._acknowledged()
            else:
                failure = self.client.classify(error)
                self.history.fail(process, value, topic, partition, failure.text, definite=failure.definite)
                if failure.fatal:
                    self.fatal = failure

        try:
            producer.send(topic, partition, encode_value(value, self.workload.value_size), delivered)
        except Exception as exc:  # not queued, so surely not written
            with self._lock:
                self._outstanding.pop(value, None)
            failure = self.client.classify(exc)
            self.history.fail(process, value, topic, partition, failure.text, definite=True)
            if failure.fatal:
                self.fatal = failure

    def _give_up(self, producer: ProducerClient | None, why: str) -> None:
        """Abandon the client's outstanding records (recorded as indefinite failures) and close it."""
        if producer is not None:
            try:
                producer.abandon()
                producer.close(1.0)
            except Exception:
                log.exception("closing producer %s", self.process)
        with self._lock:
            left, self._outstanding = self._outstanding, {}
        for value, (process, topic, partition) in left.items():
            self.history.fail(process, value, topic, partition, why, definite=False)

    def _drain(self, producer: ProducerClient | None) -> None:
        if producer is not None:
            try:
                producer.flush(max(self.workload.drain_deadline - time.monotonic(), 0))
            except Exception:
                log.exception("draining producer %s", self.process)
        self._give_up(producer, "no acknowledgement by the end of the drain")

    def _next_process(self) -> None:
        self.generation += 1
        self.process = f"{self.name}.{self.generation}"
        self.fatal = None


class _IdempotentProducer(_Sender):
    def __init__(self, workload: Workload, client: Client, name: str, spec: Producers, seed: int) -> None:
        super().__init__(workload, client, name, spec.settings, seed)
        self.rate = spec.rate
        self.records = spec.records

    def run(self) -> None:
        producer: ProducerClient | None = self.client.producer(self.workload.bootstrap, self.settings)
        sequence = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set() and (self.records is None or sequence < self.records):
                if self.fatal is not None:
                    log.warning("producer %s hit a fatal error (%s): replacing it", self.process, self.fatal.text)
                    self._give_up(producer, f"abandoned after a fatal error: {self.fatal.text}")
                    producer = None
                    self._next_process()
                    producer = self.client.producer(self.workload.bootstrap, self.settings)
                partition = self.random.randrange(self.workload.partitions)
                self._send(producer, partition, value_id(self.process, sequence))
                sequence += 1
                next_at = max(next_at + 1 / self.rate, time.monotonic() - 1)  # far behind: do not burst
                self._pace(producer, next_at)
        finally:
            self._drain(producer)


class _TransactionalProducer(_Sender):
    def __init__(self, workload: Workload, client: Client, name: str, spec: Transactions, seed: int) -> None:
        super().__init__(workload, client, name, {"transactional.id": f"{workload.topic}-{name}", **spec.settings},
                         seed)
        self.spec = spec
        self._sequence = 0

    def _new_producer(self) -> ProducerClient | None:
        """A producer whose transactions are initialised (which fences the previous one), or None once stopped."""
        while not self._stop.is_set():
            producer = self.client.producer(self.workload.bootstrap, self.settings)
            try:
                producer.init_transactions(self._call_timeout())
                return producer
            except Exception as exc:
                log.warning("init_transactions of %s failed: %s", self.process, self.client.classify(exc).text)
                producer.close(0)
                self._stop.wait(0.5)
        return None

    def _replace(self, producer: ProducerClient, why: str) -> ProducerClient | None:
        self._give_up(producer, why)
        self._next_process()
        return self._new_producer()

    def run(self) -> None:
        producer = self._new_producer()
        number = 0
        next_at = time.monotonic()
        try:
            while producer is not None and not self._stop.is_set():
                txn = f"{self.settings['transactional.id']}#{number}"
                number += 1
                producer = self._transaction(producer, txn)
                next_at = max(next_at + 1 / self.spec.rate, time.monotonic() - 1)
                if producer is not None:
                    self._pace(producer, next_at)
        finally:
            self._drain(producer)

    def _transaction(self, producer: ProducerClient, txn: str) -> ProducerClient | None:
        """Write one transaction and end it; returns the producer to go on with (a new one after a fatal error)."""
        values: list[str] = []
        self.history.txn_begin(self.process, txn)
        try:
            producer.begin_transaction()
            count = min(self.spec.partitions_per_txn, self.workload.partitions)
            for partition in sorted(self.random.sample(range(self.workload.partitions), count)):
                value = value_id(self.process, self._sequence)
                self._sequence += 1
                values.append(value)
                self._send(producer, partition, value, txn)
            if self.fatal is not None:
                raise RuntimeError(self.fatal.text)
        except Exception as exc:
            failure = self.client.classify(exc)
            if not failure.abortable:  # a client that cannot go on: the next one's init aborts what this left open
                self.history.txn_abort(self.process, txn, values, UNKNOWN, failure.text)
                return self._replace(producer, f"transaction {txn} failed: {failure.text}")
            return self._abort(producer, txn, values)
        if self.random.random() < self.spec.abort_ratio:
            return self._abort(producer, txn, values)
        return self._commit(producer, txn, values)

    def _commit(self, producer: ProducerClient, txn: str, values: list[str]) -> ProducerClient | None:
        """Commit, trying a retriable failure again (COMMIT_ATTEMPTS in all, within the drain); an outcome it
        cannot learn is unknown, and the producer is replaced (its successor's init settles the transaction)."""
        attempt = 1
        while True:
            try:
                producer.commit_transaction(self._call_timeout())
            except Exception as exc:
                failure = self.client.classify(exc)
                if failure.abortable:  # refused before it could commit: abort and go on
                    self.history.txn_commit(self.process, txn, values, FAILED, failure.text)
                    return self._abort(producer, txn, values)
                if (failure.retriable and not failure.fatal and attempt < COMMIT_ATTEMPTS
                        and time.monotonic() < self.workload.drain_deadline):
                    attempt += 1
                    continue
                self.history.txn_commit(self.process, txn, values, UNKNOWN, failure.text)
                return self._replace(producer, f"commit of {txn} unknown: {failure.text}")
            self.history.txn_commit(self.process, txn, values, OK)
            return producer

    def _call_timeout(self) -> float:
        """CALL_TIMEOUT_S, or less once the drain has begun, so that the drain ends by its deadline."""
        return max(min(CALL_TIMEOUT_S, self.workload.drain_deadline - time.monotonic()), 1.0)

    def _abort(self, producer: ProducerClient, txn: str, values: list[str]) -> ProducerClient | None:
        try:
            producer.abort_transaction(self._call_timeout())
        except Exception as exc:
            failure = self.client.classify(exc)
            self.history.txn_abort(self.process, txn, values, UNKNOWN, failure.text)
            return self._replace(producer, f"abort of {txn} unknown: {failure.text}")
        self.history.txn_abort(self.process, txn, values, OK)
        return producer


def _consumer_settings(isolation: str, group: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"an isolation level is one of {ISOLATION_LEVELS}, not {isolation!r}")
    return {"group.id": group, "isolation.level": isolation, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", **settings}


class _Consumer(_Worker):
    """Polls and records reads; a failing poll is logged and tried again."""

    def __init__(self, workload: Workload, client: Client, name: str, isolation: str, group: str | None,
                 settings: Mapping[str, Any]) -> None:
        super().__init__(workload, client, name)
        self.isolation = isolation
        self.group = group
        self.settings = _consumer_settings(isolation, group or f"josef-reader-{uuid.uuid4().hex[:12]}", settings)
        self.poll_errors = 0
        self.last_poll_error = ""

    def _poll(self, consumer: ConsumerClient) -> list[Record]:
        try:
            records = consumer.poll(500, 0.2)
        except Exception as exc:
            self.poll_errors += 1
            text = self.client.classify(exc).text
            if text != self.last_poll_error:  # each new error once, with its traceback: a stuck consumer shows
                self.last_poll_error = text
                log.warning("consumer %s: poll failed (trying again): %s", self.name, text, exc_info=exc)
            self._stop.wait(0.2)
            return []
        for r in records:
            self.history.read(self.name, self.isolation, r.topic, r.partition, r.offset, decode_value(r.value),
                              r.leader_epoch, self.group)
        return records


class _Reader(_Consumer):
    def run(self) -> None:
        consumer = self.client.consumer(self.workload.bootstrap, self.settings)
        try:
            partitions = self.workload.topic_partitions()
            consumer.assign(partitions)
            self.history.assign(self.name, partitions)
            while not self._stop.is_set():
                self._poll(consumer)
        finally:
            consumer.close()


class _GroupMember(_Consumer):
    def run(self) -> None:
        consumer = self.client.consumer(self.workload.bootstrap, self.settings)
        group = self.group
        assert group is not None
        try:
            consumer.subscribe([self.workload.topic],
                               on_assign=lambda tps: self.history.assign(self.name, tps, group),
                               on_revoke=lambda tps: self.history.revoke(self.name, tps, group),
                               on_lost=lambda tps: self.history.revoke(self.name, tps, group, lost=True))
            while not self._stop.is_set():
                records = self._poll(consumer)
                if records:
                    self._commit(consumer, records)
        finally:
            consumer.close()

    def _commit(self, consumer: ConsumerClient, records: list[Record]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        try:
            errors = consumer.commit(offsets)
        except Exception as exc:
            text = self.client.classify(exc).text
            errors = {tp: text for tp in offsets}
        for tp, offset in offsets.items():
            error = errors.get(tp)
            self.history.commit(self.group or "", self.name, tp.topic, tp.partition, offset, error is None,
                                "" if error is None else str(error))


# The workload ---------------------------------------------------------------------------------------------------


class Workload:
    """The parts' clients against ``topic`` (which must exist), recording into ``history``; see the module docstring.

    Names in the history: producers ``<client>-p<n>`` (``.1``, ``.2``... for
    the clients that replace one after a fatal error), transactional
    producers ``<client>-t<n>`` (transactional id ``<topic>-<client>-t<n>``),
    readers ``<client>-<isolation>-<n>``, group members ``<group>-<client>-<n>``.
    """

    def __init__(self, bootstrap: str, topic: str, *, parts: Sequence[Part] = (Producers(),),
                 history: History | None = None, seed: int = 0, value_size: int = 0, drain_s: float = 60.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.parts = list(parts)
        self.history = history if history is not None else History()
        self.seed = seed
        self.value_size = value_size
        self.drain_s = drain_s
        self.drain_deadline = float("inf")
        self.partitions = 0
        self._acked = 0
        self._acked_changed = threading.Condition()
        self._clients: dict[int, Client] = {}
        self.producers: list[_Sender] = []
        self.consumers: list[_Consumer] = []
        #: Consumers that did not stop within a minute of :meth:`finish` asking them to.
        self.stuck: list[str] = []
        self.groups: dict[str, Group] = {}
        self._started = False

    def _client(self, client: Client | str) -> Client:
        key = id(client)
        if key not in self._clients:
            self._clients[key] = resolve_client(client)
        return self._clients[key]

    def topic_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in range(self.partitions)]

    def _build(self) -> None:
        rng = random.Random(self.seed)
        counts: dict[str, int] = {}

        def name(key: str) -> str:
            counts[key] = counts.get(key, 0) + 1
            return f"{key}{counts[key] - 1}"

        for part in self.parts:
            if not isinstance(part, (Producers, Transactions, Readers, Group)):
                raise TypeError(f"a workload part is Producers, Transactions, Readers or Group, not {part!r}")
            client = self._client(part.client)
            if isinstance(part, Producers):
                self.producers += [_IdempotentProducer(self, client, name(f"{client.name}-p"), part,
                                                       rng.randrange(2**32)) for _ in range(part.count)]
            elif isinstance(part, Transactions):
                self.producers += [_TransactionalProducer(self, client, name(f"{client.name}-t"), part,
                                                          rng.randrange(2**32)) for _ in range(part.count)]
            elif isinstance(part, Readers):
                for isolation in part.isolation:
                    self.consumers.append(_Reader(self, client, name(f"{client.name}-{isolation.replace('_', '-')}-"),
                                                  isolation, None, part.settings))
            elif isinstance(part, Group):
                known = self.groups.setdefault(part.name, part)
                if known.isolation != part.isolation:
                    raise ValueError(f"group {part.name!r} is given two isolation levels")
                self.consumers += [_GroupMember(self, client, name(f"{part.name}-{client.name}-"), part.isolation,
                                                part.name, part.settings) for _ in range(part.members)]

    def start(self) -> Workload:
        """Learn the topic's partitions, then start every client."""
        if self._started:
            raise RuntimeError("the workload was started already")
        self._started = True
        probe_client = self._client("confluent" if not self.parts else self.parts[0].client)
        probe = probe_client.consumer(
            self.bootstrap, _consumer_settings(READ_UNCOMMITTED, f"josef-probe-{uuid.uuid4().hex[:12]}", {}))
        try:  # every broker learns of a new topic a moment after it is created
            self.partitions = _retry(lambda: probe.partitions(self.topic, 10), time.monotonic() + CALL_TIMEOUT_S,
                                     probe_client)
        finally:
            probe.close()
        self._build()
        for worker in (*self.consumers, *self.producers):
            worker.start()
        return self

    def _acknowledged(self) -> None:
        with self._acked_changed:
            self._acked += 1
            self._acked_changed.notify_all()

    @property
    def acknowledged(self) -> int:
        return self._acked

    def progress(self, more: int = 200, timeout: float = 60.0) -> None:
        """Wait until ``more`` further records are acknowledged; AssertionError after ``timeout`` seconds."""
        with self._acked_changed:
            self.await_acknowledged(self._acked + more, timeout)

    def await_acknowledged(self, total: int, timeout: float = 60.0) -> None:
        """Wait until ``total`` records in all are acknowledged; AssertionError after ``timeout`` seconds."""
        with self._acked_changed:
            if not self._acked_changed.wait_for(lambda: self._acked >= total, timeout):
                raise AssertionError(f"{total} acknowledgements did not come within {timeout} s ({self._acked} came)")

    @property
    def errors(self) -> list[tuple[str, BaseException]]:
        """Clients that ended on an unexpected exception (their history stops there)."""
        return [(w.name, w.error) for w in (*self.producers, *self.consumers) if w.error is not None]

    def stop_producers(self, timeout: float | None = None) -> None:
        """Stop producing and wait for the outstanding acknowledgements, up to ``timeout`` (default ``drain_s``)."""
        self.drain_deadline = time.monotonic() + (self.drain_s if timeout is None else timeout)
        self._stop_all(self.producers, self.drain_deadline + 10)

    def finish(self, timeout: float = 120.0, final_client: Client | str = "confluent") -> FinalReads:
        """Drain the producers, read every partition back, let the groups catch up, stop; the read-back for check().

        The groups are given until the deadline to commit past the last record
        they can see (polled, against the read-back); a group still behind then
        is reported by the checker (``group-lag``).
        """
        deadline = time.monotonic() + timeout
        self.stop_producers(min(self.drain_s, timeout / 2))
        final = final_read(self.bootstrap, [self.topic], timeout=max(deadline - time.monotonic(), 1),
                           client=final_client)
        self.await_groups(final, deadline, final_client)
        # A consumer stuck in its client (a close that never returns) is a finding, but its reads so far are
        # in the history and the read-back is complete: the check runs, and the caller says what did not stop.
        self.stuck = self._stop(self.consumers, time.monotonic() + 60)
        if self.stuck:
            log.warning("workload consumers that did not stop within 60 s: %s", self.stuck)
        self._raise_errors()
        return final.with_groups(group_offsets(self.bootstrap, self._group_partitions(), client=final_client))

    def _group_partitions(self) -> dict[str, tuple[list[TopicPartition], str]]:
        return {name: (self.topic_partitions(), group.isolation) for name, group in self.groups.items()}

    def await_groups(self, final: FinalReads, deadline: float, client: Client | str = "confluent") -> bool:
        """Poll the groups' committed offsets until each passes the last record its isolation level sees, or until
        ``deadline``; whether they all did."""
        targets: dict[tuple[str, TopicPartition], int] = {}
        for name, group in self.groups.items():
            for tp in self.topic_partitions():
                read = final.read(group.isolation, tp)
                targets[(name, tp)] = read.records[-1].offset + 1 if read and read.records else 0
        polling = threading.Event()  # never set: the pause between two polls
        with _GroupOffsetReader(self.bootstrap, self._group_partitions(), client) as reader:
            while True:
                behind: list[Any]
                try:
                    behind = [o for o in reader.read(10) if o.offset < targets[(o.group, o.tp)]]
                except Exception as exc:  # no coordinator just now, say: ask again
                    behind = [exc]
                if not behind:
                    return True
                if time.monotonic() >= deadline:
                    log.warning("groups still behind at the deadline: %s", behind[:6])
                    return False
                polling.wait(0.25)

    @staticmethod
    def _stop(workers: Sequence[_Worker], deadline: float) -> list[str]:
        """Ask ``workers`` to stop; the names of those still running at ``deadline``."""
        for worker in workers:
            worker.stop()
        return [w.name for w in workers if not w.join(deadline)]

    def _stop_all(self, workers: Sequence[_Worker], deadline: float) -> None:
        stuck = self._stop(workers, deadline)
        if stuck:
            raise RuntimeError(f"workload clients did not stop in time: {stuck}")

    def _raise_errors(self) -> None:
        if self.errors:
            name, error = self.errors[0]
            raise RuntimeError(f"workload client {name} failed: {error!r}; the history stops there") from error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every client: producers drain for up to ``timeout`` (records still unacknowledged then are
        recorded as indefinite failures), consumers close. :meth:`finish` is the orderly end; this is for
        teardown, after a failure too (a second call does nothing more)."""
        self.drain_deadline = min(self.drain_deadline, time.monotonic() + timeout)
        for worker in (*self.producers, *self.consumers):
            worker.stop()
        deadline = time.monotonic() + timeout + 60
        for worker in (*self.producers, *self.consumers):
            worker.join(deadline)

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Reading back ---------------------------------------------------------------------------------------------------


def final_read(bootstrap: str, topics: Iterable[str], *, timeout: float = 60.0, client: Client | str = "confluent",
               isolation_levels: Sequence[str] = ISOLATION_LEVELS) -> FinalReads:
    """Every partition of ``topics`` read from its log start to its end, at each isolation level, within ``timeout``.

    The end is the high watermark (read_uncommitted) or the last stable
    offset (read_committed) when the read starts; a partition not read to its
    end by the deadline says how far it got (:attr:`PartitionRead.reached`).
    Each record also carries the producer id, epoch and sequence of its
    batch, read from the leaders with plain Fetch requests
    (:mod:`josef.testing.producer_stamps`).
    """
    driver = resolve_client(client)
    deadline = time.monotonic() + timeout
    partitions: list[PartitionRead] = []
    for isolation in isolation_levels:
        consumer = driver.consumer(bootstrap, _consumer_settings(
            isolation, f"josef-final-read-{uuid.uuid4().hex[:12]}", {}))
        try:
            tps = [TopicPartition(topic, p) for topic in topics
                   for p in range(_retry(lambda: consumer.partitions(topic, 10), deadline, driver))]
            marks = {tp: _retry(lambda: consumer.watermarks(tp, 10), deadline, driver) for tp in tps}
            records: dict[TopicPartition, dict[int, LogRecord]] = {tp: {} for tp in tps}
            consumer.assign(tps)
            pending = {tp for tp in tps if marks[tp][1] > marks[tp][0]}
            while pending and time.monotonic() < deadline:
                for r in consumer.poll(1000, 0.2):
                    tp = TopicPartition(r.topic, r.partition)
                    if tp in records:
                        records[tp].setdefault(r.offset, LogRecord(r.offset, decode_value(r.value), r.leader_epoch))
                pending = {tp for tp in pending if consumer.position(tp) < marks[tp][1]}
            for tp in tps:
                start, end = marks[tp]
                reached = consumer.position(tp) if tp in pending else end
                partitions.append(PartitionRead(topic=tp.topic, partition=tp.partition, isolation=isolation,
                                                start=start, end=end, reached=max(reached, start),
                                                records=sorted(records[tp].values())))
        finally:
            consumer.close()
    try:
        stamps = read_stamps(bootstrap, {p.tp for p in partitions}, min(max(deadline - time.monotonic(), 5.0), 30.0))
    except Exception:  # without them the checker only tolerates less (josef.testing.history._resent)
        log.exception("reading the producer fields of the final read-back")
        return FinalReads(partitions=partitions)
    return FinalReads(partitions=[attrs.evolve(p, records=[
        r._replace(producer_id=s[0], producer_epoch=s[1], sequence=s[2]) if (s := stamps[p.tp].get(r.offset)) else r
        for r in p.records]) for p in partitions])


class _GroupOffsetReader:
    """One consumer per group, outside the group's membership, asking for its committed offsets."""

    def __init__(self, bootstrap: str, groups: Mapping[str, tuple[Sequence[TopicPartition], str]],
                 client: Client | str) -> None:
        driver = resolve_client(client)
        self.groups = dict(groups)
        self._consumers: dict[str, ConsumerClient] = {}
        try:
            for group, (_, isolation) in self.groups.items():
                self._consumers[group] = driver.consumer(bootstrap, _consumer_settings(isolation, group, {}))
        except BaseException:
            self.close()
            raise

    def read(self, timeout: float) -> list[GroupOffset]:
        found = []
        for group, (partitions, isolation) in self.groups.items():
            committed = self._consumers[group].committed(list(partitions), timeout)
            found += [GroupOffset(group=group, topic=tp.topic, partition=tp.partition,
                                  offset=committed.get(tp, -1), isolation=isolation) for tp in partitions]
        return found

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    def __enter__(self) -> _GroupOffsetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_offsets(bootstrap: str, groups: Mapping[str, tuple[Sequence[TopicPartition], str]], *,
                  timeout: float = 30.0, client: Client | str = "confluent") -> list[GroupOffset]:
    """The committed offsets of each group (``{group: (partitions, isolation)}``), -1 where it has none."""
    with _GroupOffsetReader(bootstrap, groups, client) as reader:
        return reader.read(timeout)


def create_topic(bootstrap: str, topic: str, partitions: int = 6, replication_factor: int = 3,
                 config: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
    """Create ``topic`` with confluent-kafka's admin client (default ``min.insync.replicas=2``) and wait for it."""
    kafka = _confluent_kafka()
    admin = kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    settings = {"min.insync.replicas": "2", **(config or {})}
    futures = admin.create_topics([kafka.admin.NewTopic(topic, partitions, replication_factor, config=settings)])
    futures[topic].result(timeout)
    # CreateTopics answers once the controller has it; a broker may learn of it a moment later, and a workload
    # starting then would be told UNKNOWN_TOPIC_OR_PARTITION: wait until metadata shows every partition led.
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: the pause between two looks
    while True:
        described = admin.list_topics(topic, timeout=max(deadline - time.monotonic(), 1)).topics.get(topic)
        if (described is not None and described.error is None and len(described.partitions) == partitions
                and all(p.leader >= 0 for p in described.partitions.values())):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {topic!r} was created but its {partitions} partitions are not all led "
                               f"after {timeout} s")
        pause.wait(0.1)


def _retry(call: Callable[[], Any], deadline: float, client: Client) -> Any:
    """``call()``, tried again every half second while it fails (no leader yet, say) until ``deadline``."""
    pause = threading.Event()  # never set: the pause between two tries
    while True:
        try:
            return call()
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("retrying after %s", client.classify(exc).text)
        pause.wait(0.5)
