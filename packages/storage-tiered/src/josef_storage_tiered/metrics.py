"""Tiered storage's metrics on the node's ``/metrics``, as Kafka 3.6+ names them (KIP-405, KIP-963) once the JMX
exporter's generic rules renamed them.

Kafka's remote storage meters are BrokerTopicMetrics, per topic and (without
the ``topic`` key) for all topics: ``kafka.server:type=BrokerTopicMetrics,
name=RemoteCopyBytesPerSec,topic=t`` becomes
``kafka_server_brokertopicmetrics_remotecopybytes_total{topic="t"}``, and the
series without the label is the all-topics meter, as the core's
BrokerTopicMetrics (other meters of the same MBean type: other family names):

- RemoteCopyBytes, RemoteCopyRequests, RemoteCopyErrors: segments copied
  (their bytes), copies tried, copies failed;
- RemoteFetchBytes, RemoteFetchRequests, RemoteFetchErrors: reads of remote
  segments (a read refused by the fetch quota reads nothing and is not one);
- RemoteDeleteRequests, RemoteDeleteErrors: remote segments deleted (retention,
  DeleteRecords, failed copies, deleted topics), deletions failed;
- BuildRemoteLogAuxStateRequests, BuildRemoteLogAuxStateErrors: a follower
  starting at its leader's local log start fetched the producer snapshot of
  the remote segment ending there.

And Kafka's remote gauges, per topic over the partitions this broker leads
(the all-topics series: their sum): RemoteCopyLagBytes and
RemoteCopyLagSegments (rolled, stable segments not copied yet, as of the
remote log manager's last visit), RemoteDeleteLagBytes and
RemoteDeleteLagSegments (remote segments due for deletion and not deleted
yet), RemoteLogSizeBytes (the copied segments) and RemoteLogMetadataCount
(segments the remote log metadata knows, in any state).

josef's own, named by the same rules (``kafka.log:type=RemoteIndexCache``):
the remote index cache's files and bytes (``kafka_log_remoteindexcache_entrycount``,
``..._sizebytes``) and its hits, misses and evictions (``..._hits_total``...).

Counters are plain integers the remote log manager adds to on the event loop,
once per segment copied, deleted or read; the rest is read when Prometheus
scrapes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from josef.metrics.topics import TopicCounters, per_topic

if TYPE_CHECKING:
    from josef_storage_tiered.manager import RemoteLogManager

#: Kafka's remote BrokerTopicMetrics meters (without ``PerSec``), in :func:`remote_counters`' order.
METERS = (
    ("RemoteCopyBytes", "Bytes of segments copied to remote storage."),
    ("RemoteCopyRequests", "Segment copies to remote storage tried."),
    ("RemoteCopyErrors", "Segment copies to remote storage that failed."),
    ("RemoteFetchBytes", "Bytes read from remote storage for fetches."),
    ("RemoteFetchRequests", "Reads of remote segments for fetches."),
    ("RemoteFetchErrors", "Reads of remote segments that failed."),
    ("RemoteDeleteRequests", "Remote segment deletions tried."),
    ("RemoteDeleteErrors", "Remote segment deletions that failed."),
    ("BuildRemoteLogAuxStateRequests", "Producer snapshots of remote segments a follower starting at its leader's "
                                       "local log start asked for."),
    ("BuildRemoteLogAuxStateErrors", "Producer snapshots of remote segments a follower could not get."),
)
(COPY_BYTES, COPY_REQUESTS, COPY_ERRORS, FETCH_BYTES, FETCH_REQUESTS, FETCH_ERRORS, DELETE_REQUESTS, DELETE_ERRORS,
 BUILD_AUX_REQUESTS, BUILD_AUX_ERRORS) = range(len(METERS))
#: Kafka's remote BrokerTopicMetrics gauges.
GAUGES = (
    ("RemoteCopyLagBytes", "Bytes of rolled, stable segments of the topic's partitions this broker leads that are not "
                           "copied to remote storage yet."),
    ("RemoteCopyLagSegments", "Rolled, stable segments of the topic's partitions this broker leads that are not "
                              "copied to remote storage yet."),
    ("RemoteDeleteLagBytes", "Bytes of remote segments due for deletion that are not deleted yet."),
    ("RemoteDeleteLagSegments", "Remote segments due for deletion that are not deleted yet."),
    ("RemoteLogSizeBytes", "Bytes of the topic's segments in remote storage (partitions this broker leads)."),
    ("RemoteLogMetadataCount", "Remote segments the remote log metadata knows of the topic's partitions this broker "
                               "leads, in any state."),
)
_PREFIX = "kafka_server_brokertopicmetrics"


def remote_counters() -> TopicCounters:
    """The remote meters of each topic (index them with the constants above): plain ints, added to on the event loop."""
    return TopicCounters([(f"{_PREFIX}_{meter.lower()}", doc) for meter, doc in METERS])


def remote_metrics(manager: RemoteLogManager) -> Iterable[Metric]:
    """Every family of one broker's tiered storage."""
    manager.counters.keep_only(manager.existing_topics())
    yield from manager.counters.collect()

    gauges: list[defaultdict[str, int]] = [defaultdict(int) for _ in GAUGES]
    for tp, metadata_count in manager.led_partitions():
        topic = tp.topic
        copy = manager.copy_lag.get(tp, (0, 0))
        delete = manager.delete_lag.get(tp, (0, 0))
        for i, amount in enumerate((*copy, *delete, manager.view(tp).size_bytes, metadata_count or 0)):
            gauges[i][topic] += amount
    for (gauge, doc), by_topic in zip(GAUGES, gauges):
        yield per_topic(GaugeMetricFamily(f"{_PREFIX}_{gauge.lower()}", doc, labels=["topic"]), by_topic)

    entries, size, hits, misses, evictions = manager.indexes.stats()
    yield GaugeMetricFamily("kafka_log_remoteindexcache_entrycount", "Files of remote segments' indexes held in "
                            "memory.", value=entries)
    yield GaugeMetricFamily("kafka_log_remoteindexcache_sizebytes", "Bytes of remote segments' indexes held in "
                            "memory (at most remote.log.index.file.cache.total.size.bytes).", value=size)
    for name, doc, value in (("hits", "Remote index lookups answered from memory.", hits),
                             ("misses", "Remote index lookups fetched from remote storage.", misses),
                             ("evictions", "Remote index files dropped from memory to make room.", evictions)):
        yield CounterMetricFamily(f"kafka_log_remoteindexcache_{name}", doc, value=value)
