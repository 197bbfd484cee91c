"""The broker configuration keys of the share coordinator, with Kafka's names and defaults (ShareCoordinatorConfig).

:class:`ShareSettings` is a typed snapshot of them, taken per operation from
the broker's current configuration, as the other coordinators do.
"""

from __future__ import annotations

from typing import Any

import attrs

from josef.config import ConfigKey, ConfigType, at_least

I, L, S = ConfigType.INT, ConfigType.LONG, ConfigType.SHORT

CONFIG_KEYS = (
    ConfigKey("share.coordinator.state.topic.num.partitions", I, 50,
              "Partitions of __share_group_state; fixed once the topic exists (it decides which broker keeps a share "
              "partition's state).", at_least(1)),
    ConfigKey("share.coordinator.state.topic.replication.factor", S, 3,
              "Replication factor of __share_group_state. Until that many brokers are live the topic is not created "
              "and share-state requests answer COORDINATOR_NOT_AVAILABLE.", at_least(1)),
    ConfigKey("share.coordinator.state.topic.min.isr", S, 2,
              "min.insync.replicas of __share_group_state: a share partition's state is written to at least that "
              "many replicas.", at_least(1)),
    ConfigKey("share.coordinator.state.topic.segment.bytes", I, 104857600,
              "Segment size of __share_group_state, kept small so pruning and loading stay fast.", at_least(1)),
    ConfigKey("share.coordinator.snapshot.update.records.per.snapshot", I, 500,
              "How many ShareUpdate records a share partition gets before its next write is a whole ShareSnapshot "
              "(which lets the records before it be pruned).", at_least(0)),
    ConfigKey("share.coordinator.append.linger.ms", I, -1,
              "How long a batch of state writes waits for more before it is appended to __share_group_state: -1 "
              "while more writes are queued (adaptive), 0 not at all.", at_least(-1)),
    ConfigKey("share.coordinator.write.timeout.ms", I, 5000,
              "How long a state write may wait for __share_group_state's replicas before it is answered "
              "COORDINATOR_NOT_AVAILABLE (it may still commit).", at_least(1)),
    ConfigKey("share.coordinator.state.topic.prune.interval.ms", L, 300000,
              "How often each partition of __share_group_state is pruned (DeleteRecords) below the oldest record "
              "its share partitions still need: the topic is not compacted.", at_least(1)),
)


@attrs.frozen
class ShareSettings:
    """The coordinator's configuration at one moment."""

    num_partitions: int = 50
    replication_factor: int = 3
    min_isr: int = 2
    segment_bytes: int = 104857600
    updates_per_snapshot: int = 500
    append_linger_ms: int = -1
    write_timeout_ms: int = 5000
    prune_interval_ms: int = 300000

    @classmethod
    def from_config(cls, config: Any) -> ShareSettings:
        """From a :class:`josef.config.Config` (anything indexable by key name)."""
        return cls(
            num_partitions=config["share.coordinator.state.topic.num.partitions"],
            replication_factor=config["share.coordinator.state.topic.replication.factor"],
            min_isr=config["share.coordinator.state.topic.min.isr"],
            segment_bytes=config["share.coordinator.state.topic.segment.bytes"],
            updates_per_snapshot=config["share.coordinator.snapshot.update.records.per.snapshot"],
            append_linger_ms=config["share.coordinator.append.linger.ms"],
            write_timeout_ms=config["share.coordinator.write.timeout.ms"],
            prune_interval_ms=config["share.coordinator.state.topic.prune.interval.ms"],
        )
