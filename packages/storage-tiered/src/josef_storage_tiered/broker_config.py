"""The broker keys of tiered storage, with Kafka's names and defaults (RemoteLogManagerConfig,
TopicBasedRemoteLogMetadataManagerConfig).

The topic keys (``remote.storage.enable``, ``local.retention.ms``...) are
the core's: every broker knows them, as in Kafka, and the controller checks
them. The remote storage backend's own settings are the keys under
``remote.log.storage.manager.impl.prefix`` (``rsm.config.``), the metadata
topic's under ``remote.log.metadata.manager.impl.prefix`` (``rlmm.config.``):
those are read with :func:`prefixed`.
"""

from __future__ import annotations

from typing import Any

from josef.config import INT64_MAX, Config, ConfigKey, ConfigType, at_least

B, I, L, S = ConfigType.BOOLEAN, ConfigType.INT, ConfigType.LONG, ConfigType.STRING

#: Kafka's only remote log metadata manager, which josef implements (the metadata in ``__remote_log_metadata``).
TOPIC_BASED_RLMM = "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"

CONFIG_KEYS = [
    ConfigKey("remote.log.storage.system.enable", B, False,
              "Turn tiered storage on for this broker: topics with remote.storage.enable copy their rolled segments "
              "to remote storage."),
    ConfigKey("remote.log.storage.manager.class.name", S, None,
              "The remote storage backend: a name josef-storage-tiered registers (s3, local-dir), or Aiven's "
              "io.aiven.kafka.tieredstorage.RemoteStorageManager with rsm.config.storage.backend.class."),
    ConfigKey("remote.log.storage.manager.impl.prefix", S, "rsm.config.",
              "The prefix of the remote storage backend's own settings.", prefix=True),
    ConfigKey("remote.log.metadata.manager.class.name", S, TOPIC_BASED_RLMM,
              "Where the remote log metadata is kept; only Kafka's topic-based manager (__remote_log_metadata)."),
    ConfigKey("remote.log.metadata.manager.impl.prefix", S, "rlmm.config.",
              "The prefix of the remote log metadata manager's settings (remote.log.metadata.topic.*).", prefix=True),
    ConfigKey("remote.log.manager.task.interval.ms", L, 30_000,
              "How often each tiered partition's segments are copied, expired and their local copies deleted.",
              at_least(1)),
    ConfigKey("remote.log.manager.task.retry.backoff.ms", L, 500, "The first wait after a failed copy.", at_least(1)),
    ConfigKey("remote.log.manager.task.retry.backoff.max.ms", L, 30_000, "The longest wait after failed copies.",
              at_least(1)),
    ConfigKey("remote.log.manager.thread.pool.size", I, 10,
              "Threads of the remote log manager's tasks; the copier and expiration pools default to it.", at_least(1)),
    ConfigKey("remote.log.manager.copier.thread.pool.size", I, -1,
              "Threads copying segments to remote storage (-1: remote.log.manager.thread.pool.size).", at_least(-1),
              dynamic=True),
    ConfigKey("remote.log.manager.expiration.thread.pool.size", I, -1,
              "Threads deleting expired remote segments (-1: remote.log.manager.thread.pool.size).", at_least(-1),
              dynamic=True),
    ConfigKey("remote.log.reader.threads", I, 10, "Threads reading remote segments for fetches.", at_least(1),
              dynamic=True),
    ConfigKey("remote.log.index.file.cache.total.size.bytes", L, 1024 * 1024 * 1024,
              "The bytes of remote segments' indexes kept in memory for reads.", at_least(1), dynamic=True),
    ConfigKey("remote.log.manager.copy.max.bytes.per.second", L, INT64_MAX,
              "The most bytes a second this broker copies to remote storage.", at_least(1), dynamic=True),
    ConfigKey("remote.log.manager.fetch.max.bytes.per.second", L, INT64_MAX,
              "The most bytes a second this broker reads from remote storage.", at_least(1), dynamic=True),
]

#: Settings of the metadata topic under ``rlmm.config.``, with Kafka's defaults.
METADATA_TOPIC_DEFAULTS = {
    "remote.log.metadata.topic.num.partitions": 50,
    "remote.log.metadata.topic.replication.factor": 3,
    "remote.log.metadata.topic.retention.ms": -1,
}


def prefixed(config: Config, prefix_key: str) -> dict[str, str]:
    """The settings under the prefix ``config[prefix_key]`` names, prefix removed (they are no keys of josef's)."""
    prefix = config[prefix_key]
    return {name[len(prefix):]: value for name, value in config.unknown.items() if name.startswith(prefix)}


def metadata_topic_setting(config: Config, name: str) -> Any:
    """One ``rlmm.config.remote.log.metadata.topic.*`` setting, as an int, or Kafka's default."""
    raw = prefixed(config, "remote.log.metadata.manager.impl.prefix").get(name)
    if raw is None:
        return METADATA_TOPIC_DEFAULTS[name]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"rlmm.config.{name} must be a number, not {raw!r}") from None
