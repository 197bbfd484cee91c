"""Tiered storage as a layer over the broker's local storage (``register_log_storage_layers``).

On when the broker says ``remote.log.storage.system.enable=true``, as in
Kafka, whatever local storage ``log.storage`` selected: the layer reaches it
only through :mod:`josef.log`. It builds the remote storage backend
(``remote.log.storage.manager.class.name`` with its ``rsm.config.*``
settings), starts the remote log manager as the broker's background work,
and wraps each user partition's log in a :class:`TieredLog`. Internal
topics (``__*``) are never tiered, as Kafka refuses remote storage for them.
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import Metric

from josef.config import Config, ConfigError
from josef.log import Log, LogConfig, LogStorage
from josef.protocol.topic_partition import TopicPartition
from josef.services import BrokerServices

from josef_storage_tiered.broker_config import TOPIC_BASED_RLMM, prefixed
from josef_storage_tiered.manager import RemoteLogManager
from josef_storage_tiered.metrics import remote_metrics
from josef_storage_tiered.remote import open_backend
from josef_storage_tiered.tiered_log import TieredLog, local_config


class TieredLogStorage:
    """A :class:`josef.log.LogStorage` whose user partitions' logs are tiered; the rest is the local storage's."""

    def __init__(self, inner: LogStorage, manager: RemoteLogManager) -> None:
        self._inner = inner
        self.manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def collect(self) -> Iterable[Metric]:
        """Tiered storage's metrics (:mod:`josef_storage_tiered.metrics`). Defined here, not left to
        :meth:`__getattr__`: the node exports the local storage's own ``collect()`` already, and a family twice
        in one scrape is refused."""
        return remote_metrics(self.manager)

    def open(self, tp: TopicPartition, config: LogConfig) -> Log:
        if tp.topic.startswith("__"):
            return self._inner.open(tp, config)
        log = TieredLog(self._inner.open(tp, local_config(config)), config, self.manager)
        self.manager.register(log)
        return log

    def delete(self, tp: TopicPartition) -> None:
        self.manager.unregister(tp)
        self._inner.delete(tp)

    def close(self, broker_epoch: int = -1) -> None:
        self._inner.close(broker_epoch)
        self.manager.storage.close()


def tiered_storage(storage: LogStorage, config: Config, services: BrokerServices) -> LogStorage | None:
    """The layer's factory: None unless ``remote.log.storage.system.enable``; a clear error for a bad setting."""
    if not config["remote.log.storage.system.enable"]:
        return None
    class_name = config["remote.log.storage.manager.class.name"]
    if not class_name:
        raise ConfigError("remote.log.storage.system.enable=true needs remote.log.storage.manager.class.name "
                          "(s3, local-dir, or Aiven's io.aiven.kafka.tieredstorage.RemoteStorageManager)")
    if config["remote.log.metadata.manager.class.name"] != TOPIC_BASED_RLMM:
        raise ConfigError(f"remote.log.metadata.manager.class.name must be {TOPIC_BASED_RLMM}, the only remote log "
                          f"metadata manager josef has, not {config['remote.log.metadata.manager.class.name']}")
    settings = prefixed(config, "remote.log.storage.manager.impl.prefix")
    remote = open_backend(class_name, settings, services.plugins)
    manager = RemoteLogManager(services, config, remote)
    services.spawn(manager.run)
    return TieredLogStorage(storage, manager)
