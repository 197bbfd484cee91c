"""The broker configuration keys of the share coordinator, with Kafka's names and defaults (ShareCoordinatorConfig).

:class:`ShareSettings` is a typed snapshot of them, taken per operation from
the broker's current configuration, as the other coordinators do.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from josef.config import ConfigError, ConfigKey, ConfigType, at_least, one_of

I, L, S, STR = ConfigType.INT, ConfigType.LONG, ConfigType.SHORT, ConfigType.STRING
#: ``by_duration:`` takes an ISO-8601 duration as Java's ``Duration.parse`` reads it (``PT1H``, ``P1DT12H``).
_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$", re.IGNORECASE)


def reset_duration_ms(value: str) -> int | None:
    """``share.auto.offset.reset``'s duration in ms for ``by_duration:...``; None for latest and earliest."""
    if not value.lower().startswith("by_duration:"):
        return None
    text = value.split(":", 1)[1].strip()
    match = _DURATION.match(text)
    if not match or text.upper() in ("P", "PT") or text.upper().endswith("T"):
        raise ConfigError(f"{text!r} is not an ISO-8601 duration (PnDTnHnMn.nS)")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return int(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


def _offset_reset(value: Any) -> None:
    if not isinstance(value, str) or (value.lower() not in ("latest", "earliest")
                                      and reset_duration_ms(value) is None):
        raise ConfigError("must be latest, earliest or by_duration:<ISO-8601 duration>")

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
    ConfigKey("group.share.record.lock.duration.ms", I, 30000,
              "How long a share group's member holds the records it was given before they go to another member "
              "(the acquisition lock), unless the group sets share.record.lock.duration.ms.", at_least(1000),
              group_name="share.record.lock.duration.ms"),
    ConfigKey("share.auto.offset.reset", STR, "latest",
              "Where a share group starts reading a partition it has no state for: latest (records produced from "
              "now on), earliest (the log start), or by_duration:<ISO-8601 duration> (the first record of that long "
              "ago). A group config (IncrementalAlterConfigs on the GROUP resource).", _offset_reset,
              group_name="share.auto.offset.reset", group_only=True),
    ConfigKey("share.isolation.level", STR, "read_uncommitted",
              "read_committed: a share group is given only records of committed transactions (up to the last "
              "stable offset; aborted ones are archived). A group config.",
              one_of("read_uncommitted", "read_committed"), group_name="share.isolation.level", group_only=True),
    ConfigKey("group.share.min.record.lock.duration.ms", I, 15000,
              "The shortest acquisition lock a share group may configure.", at_least(1000)),
    ConfigKey("group.share.max.record.lock.duration.ms", I, 60000,
              "The longest acquisition lock a share group may configure.", at_least(1000)),
    ConfigKey("group.share.delivery.count.limit", I, 5,
              "How many times a record is delivered to a share group before it is archived (a poison record "
              "stops coming back).", at_least(2)),
    ConfigKey("group.share.partition.max.record.locks", I, 2000,
              "How many records of one partition a share group may have in flight (delivered, not yet "
              "acknowledged) at once.", at_least(100)),
    ConfigKey("group.share.max.share.sessions", I, 2000,
              "How many share sessions (one per member and broker) a broker keeps; more are refused with "
              "SHARE_SESSION_LIMIT_REACHED.", at_least(1)),
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
    record_lock_duration_ms: int = 30000
    delivery_count_limit: int = 5
    max_record_locks: int = 2000
    max_share_sessions: int = 2000

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
            record_lock_duration_ms=min(max(config["group.share.record.lock.duration.ms"],
                                            config["group.share.min.record.lock.duration.ms"]),
                                        config["group.share.max.record.lock.duration.ms"]),
            delivery_count_limit=config["group.share.delivery.count.limit"],
            max_record_locks=config["group.share.partition.max.record.locks"],
            max_share_sessions=config["group.share.max.share.sessions"],
        )
