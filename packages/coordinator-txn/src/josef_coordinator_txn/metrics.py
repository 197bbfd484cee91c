"""The transaction coordinator's metrics, as Kafka's MBeans are named by the JMX exporter's generic rules.

Kafka's:

- ``kafka.coordinator.transaction:type=TransactionMarkerChannelManager,name=UnknownDestinationQueueSize``
  (``kafka_coordinator_transaction_transactionmarkerchannelmanager_unknowndestinationqueuesize``): markers
  waiting for the leader of their partitions to be known;
- ``...,name=LogAppendRetryQueueSize`` (``..._logappendretryqueuesize``): transactions whose markers are
  written and whose CompleteCommit/CompleteAbort append was refused, waiting to be appended again;
- ``kafka.server:type=transaction-coordinator-metrics``, ``partition-load-time-avg`` and ``-max``
  (``kafka_server_transaction_coordinator_metrics_partition_load_time_avg``): ms to load a
  ``__transaction_state`` partition, over the partitions this broker has loaded now (Kafka: over its
  sample window).

josef's own, under the same names' rules: transactional ids by state
(``kafka_server_transaction_coordinator_metrics_transaction_count{state}``, every state, 0 included, as
DescribeTransactions names it), their number (``..._transactional_id_count``), the producer ids the
coordinator took from the broker (``..._producer_ids_allocated_total``), and the markers queued for each
destination broker (``kafka_coordinator_transaction_transactionmarkerchannelmanager_markerqueuesize{broker}``).

Everything is read from the shards' and the marker channel's state when
Prometheus scrapes, except two plain integers the marker channel keeps.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from josef_coordinator_txn.metadata import TransactionState

if TYPE_CHECKING:
    from josef_coordinator_txn.markers import MarkerChannel
    from josef_coordinator_txn.shard import TransactionShard

_SERVER = "kafka_server_transaction_coordinator_metrics"
_CHANNEL = "kafka_coordinator_transaction_transactionmarkerchannelmanager"


def transaction_metrics(shards: Sequence[TransactionShard], markers: MarkerChannel,
                        producer_ids_allocated: int) -> Iterable[Metric]:
    """The families of the coordinator whose loaded ``shards`` and marker channel are given."""
    by_state: Counter[TransactionState] = Counter()
    load_times: list[float] = []
    for shard in shards:
        for metadata in shard.committed_transactions():
            by_state[metadata.state] += 1
        if shard.load_time_ms is not None:
            load_times.append(shard.load_time_ms)
    states = GaugeMetricFamily(f"{_SERVER}_transaction_count", "Transactional ids this broker coordinates, by "
                               "the state of their transaction (committed to __transaction_state).", labels=["state"])
    for state in TransactionState:
        states.add_metric([state.kafka_name], by_state[state])
    yield states
    yield GaugeMetricFamily(f"{_SERVER}_transactional_id_count", "Transactional ids this broker coordinates.",
                            value=sum(by_state.values()))
    yield CounterMetricFamily(f"{_SERVER}_producer_ids_allocated", "Producer ids this coordinator took from the "
                              "broker's blocks (new transactional ids, exhausted epochs).",
                              value=producer_ids_allocated)
    yield GaugeMetricFamily(f"{_SERVER}_partition_load_time_avg", "Average ms to load a __transaction_state "
                            "partition, over those this broker has loaded now (NaN: none).",
                            value=sum(load_times) / len(load_times) if load_times else float("nan"))
    yield GaugeMetricFamily(f"{_SERVER}_partition_load_time_max", "Most ms to load a __transaction_state "
                            "partition, over those this broker has loaded now (NaN: none).",
                            value=max(load_times, default=float("nan")))
    yield GaugeMetricFamily(f"{_CHANNEL}_unknowndestinationqueuesize", "Transaction markers waiting for the "
                            "leader of their partitions to be known.", value=markers.unknown_destination)
    yield GaugeMetricFamily(f"{_CHANNEL}_logappendretryqueuesize", "Transactions whose markers are written, "
                            "waiting to append their CompleteCommit/CompleteAbort again after it was refused.",
                            value=markers.log_append_retries)
    queued = GaugeMetricFamily(f"{_CHANNEL}_markerqueuesize", "Transaction markers queued for a broker, waiting "
                               "for its next WriteTxnMarkers (one per transaction).", labels=["broker"])
    for broker, size in sorted(markers.queue_sizes().items()):
        queued.add_metric([str(broker)], size)
    yield queued
