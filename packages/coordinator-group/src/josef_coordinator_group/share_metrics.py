"""Share groups' part of the group coordinator's metrics (KIP-932): share groups by state.

Kafka 4.x's group-coordinator-metrics ``share-group-count`` tagged ``state``
(Empty, Stable, Dead), as the JMX exporter names it:
``kafka_server_group_coordinator_metrics_share_group_count{state}``, every
state, 0 included. :class:`josef_coordinator_group.metrics.GroupMetrics`
yields it with the coordinator's other families; the share partitions'
metrics are the share coordinator's (``josef_coordinator_share.metrics``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from josef_coordinator_group.shard import GroupShard

#: Kafka's ShareGroupState values that have a share-group-count gauge.
SHARE_GROUP_STATES = ("Empty", "Stable", "Dead")


def share_group_metrics(shards: Sequence[GroupShard]) -> Iterable[Metric]:
    """The share-group families of the group coordinator whose loaded ``shards`` are given."""
    by_state = Counter(group.state for shard in shards for group in shard.share_groups.values())
    counts = GaugeMetricFamily("kafka_server_group_coordinator_metrics_share_group_count",
                               "Share groups this broker coordinates, by state.", labels=["state"])
    for state in SHARE_GROUP_STATES:
        counts.add_metric([state], by_state[state])
    yield counts
