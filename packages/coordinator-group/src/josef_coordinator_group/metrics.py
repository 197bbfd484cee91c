"""The group coordinator's metrics: groups by protocol and state, committed offsets, and consumer lag.

Lag is what people run kafka-exporter or Burrow next to Kafka for; each
coordinator exports it for the groups it coordinates, under kafka-exporter's
names (``kafka_consumergroup_lag{consumergroup,topic,partition}``,
``kafka_consumergroup_current_offset``, ``kafka_consumergroup_lag_sum``), so
their dashboards work. A group's lag on a partition is the partition's high
watermark less the group's committed offset. High watermarks of partitions
this broker leads are read as they are; the others are asked of their
leaders (ListOffsets) every :data:`END_OFFSETS_REFRESH_S` by a background
task, so a scrape never waits on the network.

Group counts are Kafka's GroupMetadataManager gauges
(``kafka_coordinator_group_groupmetadatamanager_numgroups``,
``..._numoffsets``) and its group-coordinator-metrics ``group-count`` by
protocol and state (``kafka_server_group_coordinator_metrics_group_count``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Iterable

import anyio
from kio.schema.errors import ErrorCode
from prometheus_client.core import GaugeMetricFamily, Metric

from josef.led_partitions import PartitionUnavailable
from josef.protocol.api_keys import ApiKey
from josef.protocol.topic_partition import TopicPartition
from josef_coordinator_group.share_metrics import share_group_metrics

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator

log = logging.getLogger(__name__)

#: How often the high watermarks of partitions led elsewhere are asked for (kafka-exporter's default is 30 s).
END_OFFSETS_REFRESH_S = 10.0


class GroupMetrics:
    """The coordinator's collector, and the high watermarks its lag is computed against."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator
        #: High watermarks of partitions some group committed offsets for and another broker leads.
        self.remote_ends: dict[TopicPartition, int] = {}

    def _committed(self) -> dict[str, dict[TopicPartition, int]]:
        """Every group's committed offsets, of the shards this broker coordinates."""
        committed: dict[str, dict[TopicPartition, int]] = {}
        for shard in self._coordinator.shards():
            for group in shard.offsets.groups():
                committed[group] = {TopicPartition(topic, partition): value.offset
                                    for (topic, partition), value in shard.offsets.of_group(group).items()}
        return committed

    def _end_offset(self, tp: TopicPartition) -> int | None:
        try:
            return self._coordinator.services.partitions.state(tp).high_watermark
        except PartitionUnavailable:
            return self.remote_ends.get(tp)

    async def refresh_end_offsets(self) -> None:
        """Ask the leaders of committed-to partitions this broker does not lead for their high watermarks."""
        services = self._coordinator.services
        image = services.image
        wanted: dict[int, dict[str, list[int]]] = {}
        for offsets in self._committed().values():
            for tp in offsets:
                topic = image.topics.get(tp.topic)
                state = topic.partitions.get(tp.partition) if topic is not None else None
                if state is None or state.leader < 0 or state.leader == services.node_id:
                    continue
                wanted.setdefault(state.leader, {}).setdefault(tp.topic, []).append(tp.partition)
        ends: dict[TopicPartition, int] = {}
        for leader, topics in wanted.items():
            try:
                answer = await services.call_peer(leader, ApiKey.LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": 0, "topics": [
                        {"name": name, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                                       "timestamp": -1} for p in partitions]}
                        for name, partitions in topics.items()]}, version=8)
            except Exception as exc:  # a leader that cannot answer now: its partitions keep their last values
                log.debug("lag metrics: broker %d gave no end offsets: %s", leader, exc)
                continue
            for topic in answer.topics:
                for part in topic.partitions:
                    if part.error_code == ErrorCode.none:
                        ends[TopicPartition(topic.name, part.partition_index)] = part.offset
        self.remote_ends = {**{tp: o for tp, o in self.remote_ends.items() if tp in ends or _kept(tp, wanted)},
                            **ends}

    async def refresh_forever(self) -> None:
        """The background task: it must never stop the broker, so a failed round only waits for the next."""
        while True:
            try:
                await self.refresh_end_offsets()
            except Exception:
                log.exception("lag metrics: refreshing end offsets failed; trying again in %.0f s",
                              END_OFFSETS_REFRESH_S)
            await anyio.sleep(END_OFFSETS_REFRESH_S)

    def collect(self) -> Iterable[Metric]:
        shards = self._coordinator.shards()
        by_state: Counter[tuple[str, str]] = Counter()
        members = GaugeMetricFamily("kafka_consumergroup_members", "Members of a group this broker coordinates.",
                                    labels=["consumergroup", "protocol"])
        for shard in shards:
            for group_id, group in shard.groups.items():
                by_state["classic", group.state.value] += 1
                members.add_metric([group_id, "classic"], len(group.members))
            for group_id, group in shard.consumer_groups.items():
                by_state["consumer", group.state] += 1
                members.add_metric([group_id, "consumer"], len(group.members))
            for group_id, group in shard.share_groups.items():
                by_state["share", group.state] += 1
                members.add_metric([group_id, "share"], len(group.members))
        counts = GaugeMetricFamily("kafka_server_group_coordinator_metrics_group_count",
                                   "Groups this broker coordinates, by protocol and state.",
                                   labels=["protocol", "state"])
        for (protocol, state), count in sorted(by_state.items()):
            counts.add_metric([protocol, state], count)
        yield counts
        yield members
        yield GaugeMetricFamily("kafka_coordinator_group_groupmetadatamanager_numgroups",
                                "Groups this broker coordinates.", value=sum(by_state.values()))
        current = GaugeMetricFamily("kafka_consumergroup_current_offset", "A group's committed offset.",
                                    labels=["consumergroup", "topic", "partition"])
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "A partition's high watermark less the group's "
                                "committed offset.", labels=["consumergroup", "topic", "partition"])
        lag_sum = GaugeMetricFamily("kafka_consumergroup_lag_sum", "A group's lag summed over a topic's partitions.",
                                    labels=["consumergroup", "topic"])
        offsets = 0
        for group, committed in sorted(self._committed().items()):
            sums: Counter[str] = Counter()
            for tp, offset in sorted(committed.items()):
                offsets += 1
                labels = [group, tp.topic, str(tp.partition)]
                current.add_metric(labels, offset)
                end = self._end_offset(tp)
                if end is not None and offset >= 0:
                    lag.add_metric(labels, max(end - offset, 0))
                    sums[tp.topic] += max(end - offset, 0)
            for topic, total in sorted(sums.items()):
                lag_sum.add_metric([group, topic], total)
        yield GaugeMetricFamily("kafka_coordinator_group_groupmetadatamanager_numoffsets",
                                "Committed offsets this broker's groups hold.", value=offsets)
        yield from (current, lag, lag_sum)
        yield from share_group_metrics(shards)


def _kept(tp: TopicPartition, wanted: dict[int, dict[str, list[int]]]) -> bool:
    """Whether a partition is still asked for (its leader did not answer this time): keep its last value."""
    return any(tp.partition in topics.get(tp.topic, ()) for topics in wanted.values())
