"""Kafka's BrokerTopicMetrics: messages and bytes in and out, requests and failures, per topic and for all topics.

``kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec,topic=t`` becomes
``kafka_server_brokertopicmetrics_bytesin_total{topic="t"}``; Kafka's
all-topics meter (no ``topic`` key) is the series without the label.
Handlers add to them once per partition of a request (a produce's batches
carry their record counts in their headers: no per-record work).
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.samples import Sample

#: Kafka's meter names, without ``PerSec``, in the order :class:`TopicCounts` keeps them.
METERS = ("MessagesIn", "BytesIn", "BytesOut", "BytesRejected", "FailedProduceRequests", "FailedFetchRequests",
          "TotalProduceRequests", "TotalFetchRequests", "ReplicationBytesIn", "ReplicationBytesOut",
          "ProduceMessageConversions", "FetchMessageConversions")
_DOCS = {
    "MessagesIn": "Records appended by producers.",
    "BytesIn": "Bytes of record batches appended by producers.",
    "BytesOut": "Bytes of records sent to consumers.",
    "BytesRejected": "Bytes of produce requests' batches refused (too large, corrupt...).",
    "FailedProduceRequests": "Partitions of produce requests that failed.",
    "FailedFetchRequests": "Partitions of fetch requests that failed.",
    "TotalProduceRequests": "Partitions of produce requests.",
    "TotalFetchRequests": "Partitions of fetch requests (consumers' and followers').",
    "ReplicationBytesIn": "Bytes of records appended as a follower.",
    "ReplicationBytesOut": "Bytes of records sent to followers.",
    "ProduceMessageConversions": "Batches converted between message formats on produce (never: josef keeps v2).",
    "FetchMessageConversions": "Batches converted between message formats on fetch (never: josef keeps v2).",
}
(MESSAGES_IN, BYTES_IN, BYTES_OUT, BYTES_REJECTED, FAILED_PRODUCE, FAILED_FETCH, TOTAL_PRODUCE, TOTAL_FETCH,
 REPLICATION_BYTES_IN, REPLICATION_BYTES_OUT, _, _) = range(len(METERS))


class BrokerTopicMetrics:
    """Counters per topic: a list of :data:`METERS` counts for each topic, kept until the topic is deleted."""

    def __init__(self) -> None:
        self.topics: dict[str, list[int]] = {}

    def of(self, topic: str) -> list[int]:
        """The topic's counts, to add to (index them with the constants above)."""
        counts = self.topics.get(topic)
        if counts is None:
            counts = self.topics[topic] = [0] * len(METERS)
        return counts

    def produced(self, topic: str, messages: int, size: int) -> None:
        counts = self.of(topic)
        counts[MESSAGES_IN] += messages
        counts[BYTES_IN] += size
        counts[TOTAL_PRODUCE] += 1

    def produce_failed(self, topic: str, size: int, rejected: bool) -> None:
        counts = self.of(topic)
        counts[FAILED_PRODUCE] += 1
        counts[TOTAL_PRODUCE] += 1
        if rejected:
            counts[BYTES_REJECTED] += size

    def forget(self, topic: str) -> None:
        """A deleted topic's series go (Kafka removes its meters with the topic)."""
        self.topics.pop(topic, None)

    def collect(self) -> Iterable[Metric]:
        families = [CounterMetricFamily(f"kafka_server_brokertopicmetrics_{meter.lower()}", _DOCS[meter],
                                        labels=["topic"]) for meter in METERS]
        totals = [0] * len(METERS)
        for topic, counts in sorted(self.topics.items()):
            for i, family in enumerate(families):
                family.add_metric([topic], counts[i])
                totals[i] += counts[i]
        for family, total in zip(families, totals):
            family.samples.append(Sample(f"{family.name}_total", {}, total))  # Kafka's all-topics meter
        return families
