"""josef's client as a driver of the core's history-check workload (:mod:`josef.testing.workload`).

The core imports no client, so this driver lives with the client and is
passed to the workload as an object::

    from josef_client.workload import JosefClient
    Workload(bootstrap, "checked", parts=[Producers(client=JosefClient()), Group("g", client=JosefClient())])
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from josef.testing.workload import Delivery, Failure, Rebalance, Record
from josef_client import (
    Admin,
    Consumer,
    FatalProducerError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    Producer,
    RebalanceListener,
    TopicPartition,
    TransactionAbortableError,
    TransactionAbortedError,
)

#: Errors after which the record surely was not written: refused as invalid or unauthorized.
DEFINITE = frozenset({
    ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_record, ErrorCode.corrupt_message,
    ErrorCode.invalid_required_acks, ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed,
    ErrorCode.transactional_id_authorization_failed,
})


class JosefClient:
    name = "josef"

    def producer(self, bootstrap: str, settings: Mapping[str, Any]) -> _Producer:
        return _Producer({"bootstrap.servers": bootstrap, **settings})

    def consumer(self, bootstrap: str, settings: Mapping[str, Any]) -> _Consumer:
        return _Consumer(bootstrap, {"bootstrap.servers": bootstrap, **settings})

    def classify(self, error: Any) -> Failure:
        text = f"{type(error).__name__}: {error}"
        if isinstance(error, TransactionAbortedError):  # still waiting to be sent when its transaction aborted
            return Failure(text, definite=True)
        if isinstance(error, (KafkaTimeoutError, KafkaConnectionError)):
            return Failure(text, retriable=True)
        if isinstance(error, KafkaError):
            return Failure(text, definite=error.code in DEFINITE, fatal=isinstance(error, FatalProducerError),
                           abortable=isinstance(error, TransactionAbortableError), retriable=error.retriable)
        return Failure(text, retriable=isinstance(error, (TimeoutError, concurrent.futures.TimeoutError)))


class _Producer:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._producer = Producer(dict(config))

    def send(self, topic: str, partition: int, value: bytes, on_delivery: Delivery) -> None:
        self._producer.send(topic, value, partition=partition,
                            on_delivery=lambda metadata, error: on_delivery(-1 if error else metadata.offset, error))

    def poll(self, timeout: float) -> None:
        """Deliveries are called on the client's own loop thread: nothing to serve here."""

    def flush(self, timeout: float) -> None:
        try:
            self._producer.flush(timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):
            pass  # the caller knows what is still outstanding

    def abandon(self) -> None:
        """close() fails what is left; the workload records those as indefinite."""

    def close(self, timeout: float) -> None:
        self._producer.close(timeout)

    def init_transactions(self, timeout: float) -> None:
        self._producer.init_transactions(timeout)

    def begin_transaction(self) -> None:
        self._producer.begin_transaction()

    def commit_transaction(self, timeout: float) -> None:
        self._producer.commit_transaction(timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._producer.abort_transaction(timeout)


class _Listener(RebalanceListener):
    def __init__(self, on_assign: Rebalance, on_revoke: Rebalance, on_lost: Rebalance) -> None:
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._on_assign(list(partitions))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._on_revoke(list(partitions))

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self._on_lost(list(partitions))


class _Consumer:
    def __init__(self, bootstrap: str, config: Mapping[str, Any]) -> None:
        self._bootstrap = bootstrap
        self._consumer = Consumer(dict(config))

    def partitions(self, topic: str, timeout: float) -> int:
        admin = Admin({"bootstrap.servers": self._bootstrap, "default.api.timeout.ms": int(timeout * 1000)})
        try:
            return len(admin.describe_topics([topic])[topic].partitions)
        finally:
            admin.close()

    def watermarks(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        ms = int(timeout * 1000)
        return self._consumer.beginning_offsets([tp], ms)[tp], self._consumer.end_offsets([tp], ms)[tp]

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.assign(partitions)
        self._consumer.seek_to_beginning(*partitions)

    def subscribe(self, topics: Sequence[str], on_assign: Rebalance, on_revoke: Rebalance, on_lost: Rebalance) -> None:
        self._consumer.subscribe(list(topics), listener=_Listener(on_assign, on_revoke, on_lost))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        polled = self._consumer.poll(timeout * 1000, max_records)
        return [Record(r.topic, r.partition, r.offset, r.value, r.leader_epoch)
                for records in polled.values() for r in records]

    def position(self, tp: TopicPartition) -> int:
        return self._consumer.position(tp)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Any]:
        self._consumer.commit(dict(offsets))  # all or nothing: raises CommitFailedError and others
        return {tp: None for tp in offsets}

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        found = self._consumer.committed(partitions, int(timeout * 1000))
        return {tp: -1 if found.get(tp) is None else found[tp].offset for tp in partitions}  # type: ignore[union-attr]

    def close(self) -> None:
        self._consumer.close()
