"""Transaction markers: WriteTxnMarkers to the leaders of a transaction's partitions, until every one is written.

Kafka's TransactionMarkerChannelManager: markers are queued per destination
broker and each broker gets one WriteTxnMarkers at a time carrying every
marker queued for it, from any transaction of any shard, so a busy
coordinator sends few large requests rather than one per transaction and
partition. The request goes through the broker's peer channel (in process
when this broker leads the partition).

A partition whose leader is unknown, or that answers with a retriable error
(NOT_LEADER_OR_FOLLOWER...), or whose broker cannot be reached, is routed
again after a short backoff, to whichever broker leads it then. A partition
whose topic was deleted needs no marker. When no partition is left, the
transaction's Complete* is written. A marker refused because a newer
coordinator has taken the transaction over (TRANSACTION_COORDINATOR_FENCED,
INVALID_PRODUCER_EPOCH) stops this coordinator's work on it; so does the
shard being unloaded (leadership moved: the next coordinator resends).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio
import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey

if TYPE_CHECKING:
    from josef.services import BrokerServices
    from josef_coordinator_txn.metadata import TransactionMetadata, TxnTransit
    from josef_coordinator_txn.shard import TransactionShard

log = logging.getLogger(__name__)

E = ErrorCode
#: Kafka's ``retry.backoff.ms`` default: how long a partition waits before its marker is routed again.
RETRY_BACKOFF_S = 0.1
#: The partition cannot take a marker now; its (possibly new) leader is asked again.
RETRIABLE = frozenset({E.unknown_topic_or_partition, E.not_leader_or_follower, E.not_enough_replicas,
                       E.not_enough_replicas_after_append, E.request_timed_out, E.kafka_storage_error})
#: A newer coordinator wrote markers for this producer: this one no longer owns the transaction.
FENCED = frozenset({E.invalid_producer_epoch, E.transaction_coordinator_fenced})
#: The partition cannot hold markers at all: skipped, as Kafka does.
SKIPPED = frozenset({E.unsupported_for_message_format, E.unsupported_version})

TopicPartitionKey = tuple[str, int]


@attrs.define(eq=False)
class PendingCompletion:
    """A transaction whose Prepare* is committed, waiting for its markers before ``transit`` (Complete*) is written."""

    shard: TransactionShard
    metadata: TransactionMetadata
    transit: TxnTransit
    commit: bool
    coordinator_epoch: int
    producer_id: int
    producer_epoch: int
    transaction_version: int
    fenced: bool = False
    completing: bool = False

    @property
    def transactional_id(self) -> str:
        return self.metadata.transactional_id

    @property
    def current(self) -> bool:
        """Whether this coordinator still owns the completion (not fenced, unloaded, or completed)."""
        return (not self.fenced and self.shard.owns(self.metadata)
                and self.shard.coordinator_epoch == self.coordinator_epoch and self.metadata.pending == self.transit.state)


@attrs.frozen
class _Marker:
    completion: PendingCompletion
    partitions: frozenset[TopicPartitionKey]

    def body(self) -> dict[str, Any]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in sorted(self.partitions):
            by_topic[topic].append(partition)
        c = self.completion
        return {"producer_id": c.producer_id, "producer_epoch": c.producer_epoch, "transaction_result": c.commit,
                "topics": [{"name": t, "partition_indexes": p} for t, p in by_topic.items()],
                "coordinator_epoch": c.coordinator_epoch, "transaction_version": c.transaction_version}


class MarkerChannel:
    """The queues of markers per destination broker, and one sender per broker while its queue is not empty."""

    def __init__(self, services: BrokerServices, on_written: Callable[[PendingCompletion], Awaitable[None]]) -> None:
        self._services = services
        self._on_written = on_written
        self._queues: dict[int, list[_Marker]] = {}
        self._sending: set[int] = set()
        #: The brokers markers were ever queued for (a series each, 0 once their queue is empty).
        self._destinations: set[int] = set()
        #: Markers waiting for their partitions' leaders to be known (Kafka's UnknownDestinationQueueSize).
        self.unknown_destination = 0
        #: Completions whose Complete* append was refused and waits to be written again (LogAppendRetryQueueSize).
        self.log_append_retries = 0

    def queue_sizes(self) -> dict[int, int]:
        """Markers queued for each destination broker, waiting for its next WriteTxnMarkers."""
        return {broker: len(self._queues.get(broker, ())) for broker in self._destinations}

    def send(self, completion: PendingCompletion) -> None:
        """Start writing the markers of ``completion`` to all its partitions."""
        self._route(completion, frozenset(completion.metadata.partitions))

    def _route(self, completion: PendingCompletion, partitions: frozenset[TopicPartitionKey]) -> None:
        if not completion.current:
            return
        image = self._services.image
        by_leader: dict[int, set[TopicPartitionKey]] = defaultdict(set)
        unknown: set[TopicPartitionKey] = set()
        for tp in partitions & completion.metadata.partitions:
            topic = image.topics.get(tp[0])
            state = topic.partitions.get(tp[1]) if topic is not None else None
            if state is None:
                log.info("%s: %s-%d no longer exists, so it needs no marker", completion.transactional_id, *tp)
                completion.metadata.remove_partition(tp)
            elif state.leader < 0 or state.leader not in image.brokers:
                unknown.add(tp)
            else:
                by_leader[state.leader].add(tp)
        for leader, tps in by_leader.items():
            self._queues.setdefault(leader, []).append(_Marker(completion, frozenset(tps)))
            self._destinations.add(leader)
            if leader not in self._sending:
                self._sending.add(leader)
                self._spawn(lambda leader=leader: self._send_loop(leader))
        if unknown:
            self._retry_later(completion, frozenset(unknown), unknown_destination=True)
        self._maybe_written(completion)

    async def _send_loop(self, broker_id: int) -> None:
        try:
            while self._queues.get(broker_id):
                batch = [m for m in self._queues.pop(broker_id) if m.completion.current]
                if batch:
                    await self._send(broker_id, batch)
        finally:
            self._sending.discard(broker_id)

    async def _send(self, broker_id: int, batch: list[_Marker]) -> None:
        try:
            response = await self._services.call_peer(broker_id, ApiKey.WRITE_TXN_MARKERS,
                                                     {"markers": [m.body() for m in batch]})
        except Exception as exc:  # unreachable broker, timeout, or a broker that cannot answer: all retried
            log.info("WriteTxnMarkers to broker %d failed (%s: %s); retrying", broker_id, type(exc).__name__, exc)
            for marker in batch:
                self._retry_later(marker.completion, marker.partitions)
            return
        results = {r.producer_id: r for r in response.markers}
        for marker in batch:
            self._handle(broker_id, marker, results.get(marker.completion.producer_id))

    def _handle(self, broker_id: int, marker: _Marker, result: Any) -> None:
        completion = marker.completion
        if not completion.current:
            return
        errors = {} if result is None else {(t.name, p.partition_index): p.error_code
                                             for t in result.topics for p in t.partitions}
        retry: set[TopicPartitionKey] = set()
        for tp in marker.partitions:
            error = errors.get(tp)
            if error is None:
                retry.add(tp)  # not answered: ask again
            elif error == E.none or error in SKIPPED:
                if error != E.none:
                    log.warning("%s: %s-%d cannot hold transaction markers (%s); skipped",
                                completion.transactional_id, *tp, error.name)
                completion.metadata.remove_partition(tp)
            elif error in FENCED:
                log.info("%s: broker %d refused the marker for %s-%d with %s: a newer coordinator owns the "
                         "transaction", completion.transactional_id, broker_id, *tp, error.name)
                completion.fenced = True
                return
            else:
                if error not in RETRIABLE:
                    log.error("%s: unexpected %s writing the marker to %s-%d; retrying", completion.transactional_id,
                              error.name, *tp)
                retry.add(tp)
        if retry:
            self._retry_later(completion, frozenset(retry))
        self._maybe_written(completion)

    def _retry_later(self, completion: PendingCompletion, partitions: frozenset[TopicPartitionKey], *,
                     unknown_destination: bool = False) -> None:
        if unknown_destination:
            self.unknown_destination += 1

        async def again() -> None:
            try:
                await anyio.sleep(RETRY_BACKOFF_S)
            finally:
                if unknown_destination:
                    self.unknown_destination -= 1
            self._route(completion, partitions)

        self._spawn(again)

    def _maybe_written(self, completion: PendingCompletion) -> None:
        if completion.current and not completion.metadata.partitions and not completion.completing:
            completion.completing = True
            self._spawn(lambda: self._on_written(completion))

    def _spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        """Run ``function`` in the coordinator runtime's task group; a failure is logged, not fatal to the broker."""

        async def logged() -> None:
            try:
                await function()
            except Exception:
                log.exception("transaction markers: %s failed", getattr(function, "__name__", function))

        self._services.coordinators.spawn(logged)
