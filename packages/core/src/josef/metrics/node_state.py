"""Metrics read from a node's state when Prometheus scrapes: replicas, logs, the controller's view of the cluster.

Kafka's gauges, named as the JMX exporter's generic rules name them:

- ReplicaManager (``kafka_server_replicamanager_*``): partitions hosted and
  led, under-replicated, under and at min ISR, offline replicas, ISR shrinks
  and expands (counters);
- Log (``kafka_log_log_*{topic,partition}``): size, log start and end
  offsets, segments of each hosted partition;
- KafkaController (``kafka_controller_kafkacontroller_*``): on controllers,
  whether this one is active, and from its metadata image the cluster's
  topics, partitions, offline partitions, preferred-replica imbalance and
  active and fenced brokers, as Kafka's KRaft controllers all report them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from josef.metrics import Table

if TYPE_CHECKING:
    from josef.node.broker import Broker


class NodeStateMetrics:
    """The collector of one node's state (read on the event loop at scrape time)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def collect(self) -> Iterable[Metric | Table]:
        broker = self._broker
        if broker.is_broker and getattr(broker, "replicas", None) is not None:
            yield from self._replicas()
        if broker.is_controller and hasattr(broker, "quorum"):
            yield from self._controller()

    def _replicas(self) -> Iterable[Metric | Table]:
        replicas = self._broker.replicas
        node_id = self._broker.node_id
        led = under_replicated = under_min_isr = at_min_isr = 0
        logs = []
        for tp, partition in list(replicas.partitions.items()):
            log = partition.log
            logs.append((tp.topic, tp.partition, log.size_bytes, log.log_start_offset, log.log_end_offset))
            if partition.leader_id != node_id:
                continue
            led += 1
            in_sync = len(partition.isr)
            if in_sync < len(partition.replicas):
                under_replicated += 1
            min_isr = partition.topic_config.get("min.insync.replicas", 1)
            if in_sync < min_isr:
                under_min_isr += 1
            elif in_sync == min_isr:
                at_min_isr += 1
        for name, doc, value in (
            ("partitioncount", "Partitions this broker hosts a replica of.", len(replicas.partitions)),
            ("leadercount", "Partitions this broker leads.", led),
            ("underreplicatedpartitions", "Partitions this broker leads whose ISR lacks some replicas.",
             under_replicated),
            ("underminisrpartitioncount", "Partitions this broker leads with fewer in-sync replicas than "
                                          "min.insync.replicas (acks=all producers are refused).", under_min_isr),
            ("atminisrpartitioncount", "Partitions this broker leads with exactly min.insync.replicas in sync.",
             at_min_isr),
            ("offlinereplicacount", "Replicas on this broker whose log directory failed.", len(replicas.offline)),
        ):
            yield GaugeMetricFamily(f"kafka_server_replicamanager_{name}", doc, value=value)
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "ISR shrinks of partitions this broker "
                                  "leads, accepted by the controller.", value=replicas.isr_shrinks)
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "ISR expansions of partitions this "
                                  "broker leads, accepted by the controller.", value=replicas.isr_expands)
        for name, doc, column in (("size", "Bytes of the partition's log on this broker (local).", 2),
                                  ("logstartoffset", "The partition's log start offset.", 3),
                                  ("logendoffset", "The partition's log end offset on this broker.", 4)):
            yield Table(f"kafka_log_log_{name}", "gauge", doc, ("topic", "partition"), logs, column)
        lags = GaugeMetricFamily("kafka_server_fetcherlagmetrics_consumerlag", "How far this follower's log is "
                                 "behind its leader's high watermark, in offsets, at its last fetch.",
                                 labels=["clientId", "topic", "partition"])
        max_lag = 0
        for client_id, tp, lag in replicas.fetchers.lags():
            lags.add_metric([client_id, tp.topic, str(tp.partition)], lag)
            max_lag = max(max_lag, lag)
        yield lags
        max_lags = GaugeMetricFamily("kafka_server_replicafetchermanager_maxlag", "The largest lag of the partitions "
                                     "this broker follows, in offsets.", labels=["clientId"])
        max_lags.add_metric(["Replica"], max_lag)
        yield max_lags

    def _controller(self) -> Iterable[Metric]:
        broker = self._broker
        image = broker.image
        active = broker.quorum.controller_id == broker.node_id
        partitions = offline = imbalance = 0
        for topic in image.topics.values():
            for state in topic.partitions.values():
                partitions += 1
                if state.leader < 0:
                    offline += 1
                elif state.replicas and state.leader != state.replicas[0]:
                    imbalance += 1
        fenced = sum(1 for b in image.brokers.values() if b.fenced)
        for name, doc, value in (
            ("activecontrollercount", "1 on the active controller, 0 on the others.", int(active)),
            ("globaltopiccount", "Topics in the cluster.", len(image.topics)),
            ("globalpartitioncount", "Partitions in the cluster.", partitions),
            ("offlinepartitionscount", "Partitions without a leader.", offline),
            ("preferredreplicaimbalancecount", "Partitions whose leader is not their preferred replica.", imbalance),
            ("activebrokercount", "Registered brokers that are not fenced.", len(image.brokers) - fenced),
            ("fencedbrokercount", "Registered brokers that are fenced.", fenced),
        ):
            yield GaugeMetricFamily(f"kafka_controller_kafkacontroller_{name}", doc, value=value)
