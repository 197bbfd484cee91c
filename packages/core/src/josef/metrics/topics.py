"""Kafka's BrokerTopicMetrics: messages and bytes in and out, requests and failures, per topic and for all topics.

``kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec,topic=t`` becomes
``kafka_server_brokertopicmetrics_bytesin_total{topic="t"}``; Kafka's
all-topics meter (no ``topic`` key) is the series without the label.
Handlers add to them once per partition of a request (a produce's batches
carry their record counts in their headers: no per-record work).
"""

from __future__ import annotations

from typing import Callable, Container, Mapping, Sequence

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


def per_topic(family: Metric, by_topic: Mapping[str, float]) -> Metric:
    """Fill ``family`` (labelled ``topic``) with a series per topic and Kafka's all-topics series: no label, their sum.

    Kafka registers each BrokerTopicMetrics meter twice, with and without the
    ``topic`` key; dashboards read either. Returns ``family``.
    """
    total = 0.0
    for topic, amount in sorted(by_topic.items()):
        family.add_metric([topic], amount)
        total += amount
    suffix = "_total" if family.type == "counter" else ""
    family.samples.append(Sample(f"{family.name}{suffix}", {}, total))
    return family


class TopicCounters:
    """Counters per topic: for each topic, a list of ints, one per meter, that hot paths add to (index them).

    ``meters`` are (family name, documentation); :meth:`collect` exports one
    counter family per meter with :func:`per_topic`'s series.
    """

    def __init__(self, meters: Sequence[tuple[str, str]]) -> None:
        self.meters = tuple(meters)
        self.topics: dict[str, list[int]] = {}

    def of(self, topic: str) -> list[int]:
        """The topic's counts, to add to."""
        counts = self.topics.get(topic)
        if counts is None:
            counts = self.topics[topic] = [0] * len(self.meters)
        return counts

    def add(self, topic: str, meter: int, amount: int = 1) -> None:
        self.of(topic)[meter] += amount

    def keep_only(self, existing: Container[str]) -> None:
        """Forget the topics that no longer exist: a deleted topic's series go, as Kafka removes its meters."""
        for gone in [t for t in self.topics if t not in existing]:
            del self.topics[gone]

    def collect(self) -> list[Metric]:
        return [per_topic(CounterMetricFamily(name, doc, labels=["topic"]),
                          {topic: counts[i] for topic, counts in self.topics.items()})
                for i, (name, doc) in enumerate(self.meters)]


class BrokerTopicMetrics(TopicCounters):
    """The core's BrokerTopicMetrics: :data:`METERS` per topic, counted by the produce and fetch handlers.

    ``existing()`` gives the topics that exist (the metadata image's), whose
    series are kept at each scrape.
    """

    def __init__(self, existing: Callable[[], Container[str]] = dict) -> None:
        super().__init__([(f"kafka_server_brokertopicmetrics_{m.lower()}", _DOCS[m]) for m in METERS])
        self._existing = existing

    def collect(self) -> list[Metric]:
        existing = self._existing()
        if existing:
            self.keep_only(existing)
        return super().collect()
