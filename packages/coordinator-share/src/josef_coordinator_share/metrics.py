"""Share groups' metrics on the node's ``/metrics``, as Kafka 4.x names them (KIP-932, KIP-1103) once the JMX
exporter's generic rules renamed them.

On the share partitions' leaders (:class:`~josef_coordinator_share.partitions.SharePartitionManager`):

- ``kafka.server:type=ShareGroupMetrics,name=RecordAcknowledgementsPerSec,ackType=Accept``
  -> ``kafka_server_sharegroupmetrics_recordacknowledgements_total{ackType}`` (Accept, Release, Reject,
  Renew): records acknowledged, counted once per acknowledged range;
- ``...,name=PartitionLoadTimeMs`` -> the summary ``kafka_server_sharegroupmetrics_partitionloadtimems``:
  ms to load a share partition from the share coordinator;
- ``kafka.server:type=SharePartitionMetrics,name=InFlightMessageCount,group=g,topic=t,partition=p``
  (``kafka_server_sharepartitionmetrics_inflightmessagecount``), ``InFlightBatchCount`` (josef: the ranges
  of offsets sharing one state, whole fetched batches unless acknowledgements split them) and
  ``AcquisitionLockTimeoutPerSec`` (``..._acquisitionlocktimeout_total``: records whose acquisition lock
  expired);
- ``kafka.server:type=ShareSessionCache``: ``ShareSessionsCount``, ``SharePartitionsCount``,
  ``ShareSessionEvictionsPerSec`` (``kafka_server_sharesessioncache_*``);
- ``kafka.server:type=BrokerTopicMetrics,name=TotalShareFetchRequestsPerSec,topic=t`` and
  ``FailedShareFetchRequestsPerSec``, ``TotalShareAcknowledgementRequestsPerSec``,
  ``FailedShareAcknowledgementRequestsPerSec``: partitions of ShareFetch and of acknowledgements (in
  ShareFetch or ShareAcknowledge), per topic and, without the label, for all topics, as the core's
  BrokerTopicMetrics (other meters of the same MBean type, so other family names).

On the share coordinator (``kafka.server:type=share-coordinator-metrics``):
``write-total``, ``write-latency-avg``, ``write-latency-max`` (ms, over the last
:data:`LATENCY_SAMPLES` writes) of WriteShareGroupState, and ``last-pruned-offset``
of each ``__share_group_state`` partition this broker keeps
(``kafka_server_share_coordinator_metrics_*``).

Handlers add to plain integers once per partition of a request; the rest is
read when Prometheus scrapes.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from josef.metrics import add_quantiles, summary
from josef.metrics.topics import TopicCounters
from josef_coordinator_share.share_partition import ACCEPT, REJECT, RELEASE, RENEW

if TYPE_CHECKING:
    from josef_coordinator_share.coordinator import ShareCoordinator

#: How many recent partition loads the load-time quantiles are taken from.
LOAD_SAMPLES = 256
#: How many recent share-state writes the write latency average and maximum are taken over.
LATENCY_SAMPLES = 256
#: Kafka's ackType tag of each acknowledge type counted (gaps are not records: not counted, as Kafka).
ACK_TYPES = ((ACCEPT, "Accept"), (RELEASE, "Release"), (REJECT, "Reject"), (RENEW, "Renew"))
#: The BrokerTopicMetrics meters kept per topic, in :attr:`ShareCounters.topics`' order.
TOPIC_METERS = tuple((f"kafka_server_brokertopicmetrics_{meter}", doc) for meter, doc in (
    ("totalsharefetchrequests", "Partitions of ShareFetch requests."),
    ("failedsharefetchrequests", "Partitions of ShareFetch requests that failed."),
    ("totalshareacknowledgementrequests", "Partitions acknowledged (ShareFetch or ShareAcknowledge)."),
    ("failedshareacknowledgementrequests", "Partitions whose acknowledgement failed."),
))
TOTAL_FETCH, FAILED_FETCH, TOTAL_ACK, FAILED_ACK = range(len(TOPIC_METERS))


class ShareCounters:
    """What the share code counts as it goes: plain integers and a few recent samples, read at scrape time."""

    def __init__(self) -> None:
        #: Records acknowledged, by acknowledge type (indexed by the type: GAP, ACCEPT, RELEASE, REJECT, RENEW).
        self.acknowledged = [0] * 5
        self.load_times_ms: deque[float] = deque(maxlen=LOAD_SAMPLES)
        self.loads = 0
        self.load_time_total_ms = 0.0
        #: {topic: [TOTAL_FETCH, FAILED_FETCH, TOTAL_ACK, FAILED_ACK]}
        self.topics = TopicCounters(TOPIC_METERS)
        self.state_writes = 0
        self.state_write_latencies_ms: deque[float] = deque(maxlen=LATENCY_SAMPLES)

    def loaded(self, ms: float) -> None:
        self.load_times_ms.append(ms)
        self.loads += 1
        self.load_time_total_ms += ms

    def requested(self, topic: str, *, fetch: bool, failed: bool) -> None:
        """One partition of ``topic`` fetched (``fetch``) or acknowledged, and whether that failed."""
        counts = self.topics.of(topic)
        counts[TOTAL_FETCH if fetch else TOTAL_ACK] += 1
        if failed:
            counts[FAILED_FETCH if fetch else FAILED_ACK] += 1

    def state_written(self, ms: float) -> None:
        self.state_writes += 1
        self.state_write_latencies_ms.append(ms)


def share_metrics(coordinator: ShareCoordinator) -> Iterable[Metric]:
    """Every family of the share coordinator and the share partitions of its broker."""
    counters = coordinator.counters
    manager = coordinator.partitions
    acks = CounterMetricFamily("kafka_server_sharegroupmetrics_recordacknowledgements", "Records acknowledged by "
                               "share consumers, by acknowledgement type.", labels=["ackType"])
    for ack, name in ACK_TYPES:
        acks.add_metric([name], counters.acknowledged[ack])
    yield acks
    loads = summary("kafka_server_sharegroupmetrics_partitionloadtimems", "Milliseconds to load a share partition "
                    f"from the share coordinator (quantiles of the last {LOAD_SAMPLES} loads).", [])
    add_quantiles(loads, [], list(counters.load_times_ms), counters.loads, counters.load_time_total_ms)
    yield loads

    labels = ["group", "topic", "partition"]
    in_flight = GaugeMetricFamily("kafka_server_sharepartitionmetrics_inflightmessagecount", "Records in the share "
                                  "partition's in-flight window (fetched, not yet acknowledged or archived past its "
                                  "start).", labels=labels)
    batches = GaugeMetricFamily("kafka_server_sharepartitionmetrics_inflightbatchcount", "Ranges of in-flight "
                                "records sharing a state (whole fetched batches unless acknowledgements split "
                                "them).", labels=labels)
    timeouts = CounterMetricFamily("kafka_server_sharepartitionmetrics_acquisitionlocktimeout", "Records whose "
                                   "acquisition lock expired before they were acknowledged.", labels=labels)
    for (group, tp), window in sorted(manager.windows.items(), key=lambda item: (item[0][0], *item[0][1])):
        series = [group, tp.topic, str(tp.partition)]
        in_flight.add_metric(series, window.partition.in_flight())
        batches.add_metric(series, len(window.partition.spans))
        timeouts.add_metric(series, window.lock_timeouts)
    yield from (in_flight, batches, timeouts)

    sessions = manager.sessions
    yield GaugeMetricFamily("kafka_server_sharesessioncache_sharesessionscount", "Share sessions this broker keeps.",
                            value=len(sessions.sessions))
    yield GaugeMetricFamily("kafka_server_sharesessioncache_sharepartitionscount", "Partitions of the share "
                            "sessions this broker keeps.", value=sum(len(s.partitions)
                                                                     for s in sessions.sessions.values()))
    yield CounterMetricFamily("kafka_server_sharesessioncache_sharesessionevictions", "Share sessions closed "
                              "because they were not used for long enough.", value=sessions.evictions)

    counters.topics.keep_only(coordinator.services.image.topics)
    yield from counters.topics.collect()

    prefix = "kafka_server_share_coordinator_metrics"
    latencies = counters.state_write_latencies_ms
    yield CounterMetricFamily(f"{prefix}_write", "Share-partition state writes (WriteShareGroupState) this "
                              "share coordinator made.", value=counters.state_writes)
    yield GaugeMetricFamily(f"{prefix}_write_latency_avg", f"Average ms of a share-partition state write, its "
                            f"append included, over the last {LATENCY_SAMPLES} (NaN: none).",
                            value=sum(latencies) / len(latencies) if latencies else float("nan"))
    yield GaugeMetricFamily(f"{prefix}_write_latency_max", f"Most ms of a share-partition state write, its append "
                            f"included, over the last {LATENCY_SAMPLES} (NaN: none).",
                            value=max(latencies, default=float("nan")))
    pruned = GaugeMetricFamily(f"{prefix}_last_pruned_offset", "The offset below which this share coordinator last "
                               "pruned its __share_group_state partition (-1: not yet).",
                               labels=["topic", "partition"])
    for shard in sorted(coordinator.shards(), key=lambda s: s.context.tp.partition):
        pruned.add_metric([shard.context.tp.topic, str(shard.context.tp.partition)], shard.last_pruned_offset)
    yield pruned
