"""The broker configuration keys of the transaction coordinator, with Kafka's names and defaults.

:class:`TxnSettings` is a typed snapshot of them, taken per operation from the
broker's current configuration, as the group coordinator does.
"""

from __future__ import annotations

from typing import Any

import attrs

from josef.config import ConfigKey, ConfigType, at_least

I, L, S = ConfigType.INT, ConfigType.LONG, ConfigType.SHORT

CONFIG_KEYS = (
    ConfigKey("transaction.state.log.num.partitions", I, 50,
              "Partitions of __transaction_state; fixed once the topic exists (it decides which broker coordinates a "
              "transactional id).", at_least(1)),
    ConfigKey("transaction.state.log.replication.factor", S, 3,
              "Replication factor of __transaction_state. Until that many brokers are live the topic is not created and "
              "transactional requests answer COORDINATOR_NOT_AVAILABLE.", at_least(1)),
    ConfigKey("transaction.state.log.min.isr", I, 2,
              "min.insync.replicas of __transaction_state: a transaction's state is written to at least that many replicas.",
              at_least(1)),
    ConfigKey("transaction.state.log.segment.bytes", I, 104857600,
              "Segment size of __transaction_state, kept small so compaction and loading stay fast.", at_least(1)),
    ConfigKey("transaction.max.timeout.ms", I, 900000,
              "The longest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT beyond), so a "
              "stuck transaction cannot hold back read_committed consumers for longer.", at_least(1)),
    ConfigKey("transactional.id.expiration.ms", I, 604800000,
              "How long a transactional id with no transaction going on is kept after its last update before it "
              "is forgotten (a tombstone in __transaction_state).", at_least(1)),
    ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", I, 10000,
              "How often transactions open for longer than their timeout are looked for (and aborted).", at_least(1)),
    ConfigKey("transaction.remove.expired.transaction.cleanup.interval.ms", I, 3600000,
              "How often expired transactional ids are looked for (and removed).", at_least(1)),
)


@attrs.frozen
class TxnSettings:
    """The coordinator's configuration at one moment."""

    num_partitions: int = 50
    replication_factor: int = 3
    min_isr: int = 2
    segment_bytes: int = 104857600
    max_timeout_ms: int = 900000
    transactional_id_expiration_ms: int = 604800000
    abort_timed_out_interval_ms: int = 10000
    remove_expired_interval_ms: int = 3600000
    #: ``request.timeout.ms`` (the core's): how long a write to __transaction_state may wait for replication.
    write_timeout_ms: int = 30000

    @classmethod
    def from_config(cls, config: Any) -> TxnSettings:
        """From a :class:`josef.config.Config` (anything indexable by key name)."""
        return cls(
            num_partitions=config["transaction.state.log.num.partitions"],
            replication_factor=config["transaction.state.log.replication.factor"],
            min_isr=config["transaction.state.log.min.isr"],
            segment_bytes=config["transaction.state.log.segment.bytes"],
            max_timeout_ms=config["transaction.max.timeout.ms"],
            transactional_id_expiration_ms=config["transactional.id.expiration.ms"],
            abort_timed_out_interval_ms=config["transaction.abort.timed.out.transaction.cleanup.interval.ms"],
            remove_expired_interval_ms=config["transaction.remove.expired.transaction.cleanup.interval.ms"],
            write_timeout_ms=config["request.timeout.ms"],
        )
