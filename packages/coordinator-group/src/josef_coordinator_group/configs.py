"""The broker configuration keys of the group coordinator, with Kafka's names and defaults.

:class:`GroupSettings` is a typed snapshot of them, taken per operation from
the broker's current configuration, so dynamic changes (AlterConfigs on the
broker) apply to the next request without the coordinator caching anything.
"""

from __future__ import annotations

from typing import Any

import attrs

from josef.config import INT32_MAX, ConfigKey, ConfigType, at_least

I, L = ConfigType.INT, ConfigType.LONG
S = ConfigType.SHORT

CONFIG_KEYS = (
    ConfigKey("offsets.topic.num.partitions", I, 50,
              "Partitions of __consumer_offsets; fixed once the topic exists (it decides which broker coordinates a group).",
              at_least(1)),
    ConfigKey("offsets.topic.replication.factor", S, 3,
              "Replication factor of __consumer_offsets. Until that many brokers are live the topic is not created and "
              "group requests answer COORDINATOR_NOT_AVAILABLE.",
              at_least(1)),
    ConfigKey("offsets.topic.segment.bytes", I, 104857600,
              "Segment size of __consumer_offsets, kept small so compaction and loading stay fast.", at_least(1)),
    ConfigKey("offsets.retention.minutes", I, 10080,
              "How long the offsets of a group that has become empty (or of a simple consumer) are kept after its last commit.",
              at_least(1)),
    ConfigKey("offsets.retention.check.interval.ms", L, 600000, "How often expired offsets are looked for.",
              at_least(1)),
    ConfigKey("offsets.commit.timeout.ms", I, 5000,
              "How long a write to __consumer_offsets may wait for replication before the request fails.", at_least(1)),
    ConfigKey("group.coordinator.append.linger.ms", I, -1,
              "How long the coordinator waits for writes to accumulate before appending them to __consumer_offsets as "
              "one batch. Longer makes batches bigger and appends fewer, and adds that much to a request's latency. "
              "-1 (Kafka 4.2's default; 4.1's was 5) adapts to the load: the batch is appended as soon as the writes "
              "already arriving have joined it. Transactional writes are not accumulated.",
              at_least(-1)),
    ConfigKey("offset.metadata.max.bytes", I, 4096,
              "The largest metadata string an offset commit may carry (OFFSET_METADATA_TOO_LARGE beyond).", at_least(0)),
    ConfigKey("group.initial.rebalance.delay.ms", I, 3000,
              "How long the first rebalance of an empty group waits for more members before completing.", at_least(0)),
    ConfigKey("group.min.session.timeout.ms", I, 6000, "The smallest session timeout a member may ask for.", at_least(0)),
    ConfigKey("group.max.session.timeout.ms", I, 1800000, "The largest session timeout a member may ask for.",
              at_least(0)),
    ConfigKey("group.max.size", I, INT32_MAX, "The most members a classic group may have.", at_least(1)),
    ConfigKey("group.consumer.assignors", ConfigType.LIST, ["uniform", "range"],
              "Server-side assignors of consumer (KIP-848) groups; the first is the default."),
    ConfigKey("group.consumer.heartbeat.interval.ms", I, 5000,
              "How often consumer-group members heartbeat.", at_least(1)),
    ConfigKey("group.consumer.session.timeout.ms", I, 45000,
              "How long a consumer-group member may go without heartbeating before it is removed.", at_least(1)),
    ConfigKey("group.consumer.max.size", I, INT32_MAX, "The most members a consumer group may have.", at_least(1)),
    ConfigKey("group.share.heartbeat.interval.ms", I, 5000,
              "How often share-group members heartbeat, unless the group sets share.heartbeat.interval.ms.",
              at_least(1), group_name="share.heartbeat.interval.ms"),
    ConfigKey("group.share.session.timeout.ms", I, 45000,
              "How long a share-group member may go without heartbeating before it is removed, unless the group "
              "sets share.session.timeout.ms.", at_least(1), group_name="share.session.timeout.ms"),
    ConfigKey("group.share.max.size", I, 200, "The most members a share group may have.", at_least(1)),
    ConfigKey("group.share.assignors", ConfigType.LIST, ["simple"],
              "Server-side assignors of share groups; the first is the one used."),
)

#: Kafka's internal constant: a new member's JoinGroup is dropped after this long (it is expected to retry).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


@attrs.frozen
class GroupSettings:
    """The coordinator's configuration at one moment."""

    num_partitions: int = 50
    replication_factor: int = 3
    segment_bytes: int = 104857600
    offsets_retention_ms: int = 10080 * 60_000
    retention_check_interval_ms: int = 600000
    commit_timeout_ms: int = 5000
    append_linger_ms: int = -1
    offset_metadata_max_bytes: int = 4096
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    max_size: int = INT32_MAX
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    consumer_heartbeat_interval_ms: int = 5000
    consumer_session_timeout_ms: int = 45000
    consumer_max_size: int = INT32_MAX
    share_heartbeat_interval_ms: int = 5000
    share_session_timeout_ms: int = 45000
    share_max_size: int = 200
    share_assignors: tuple[str, ...] = ("simple",)

    @classmethod
    def from_config(cls, config: Any) -> GroupSettings:
        """From a :class:`josef.config.Config` (anything indexable by key name)."""
        return cls(
            num_partitions=config["offsets.topic.num.partitions"],
            replication_factor=config["offsets.topic.replication.factor"],
            segment_bytes=config["offsets.topic.segment.bytes"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
            retention_check_interval_ms=config["offsets.retention.check.interval.ms"],
            commit_timeout_ms=config["offsets.commit.timeout.ms"],
            append_linger_ms=config["group.coordinator.append.linger.ms"],
            offset_metadata_max_bytes=config["offset.metadata.max.bytes"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            max_size=config["group.max.size"],
            consumer_assignors=_names(config["group.consumer.assignors"]),
            consumer_heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            consumer_session_timeout_ms=config["group.consumer.session.timeout.ms"],
            consumer_max_size=config["group.consumer.max.size"],
            share_heartbeat_interval_ms=config["group.share.heartbeat.interval.ms"],
            share_session_timeout_ms=config["group.share.session.timeout.ms"],
            share_max_size=config["group.share.max.size"],
            share_assignors=_names(config["group.share.assignors"]),
        )


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    return tuple(v.strip() for v in value or () if v.strip())
