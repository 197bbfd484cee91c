"""Loading a broker's configuration: server.properties, then ``--override``, validated against every plugin's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import pluggy

from josef.config import ConfigError, Config, ConfigDef, parse_overrides, read_properties
from josef.plugins import get_plugin_manager


#: What ``josef server start`` without a file runs with, over Kafka's defaults: the settings of Kafka's
#: own single-node ``config/server.properties``. Internal topics then have one replica, where Kafka's
#: defaults (3) would leave a lone broker without group or transaction coordinators. Keys no installed
#: plugin declares are left out.
SINGLE_NODE_DEFAULTS = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}
#: What ``josef server start`` without a properties file adds to :data:`SINGLE_NODE_DEFAULTS`: metrics and health
#: checks where a laptop's Prometheus or browser looks. Not for brokers tests start in a process of their own
#: (many at once), which bind what they are given.
QUICK_START_DEFAULTS = {"http.listeners": "http://127.0.0.1:9644"}


def load_config(
    path: Path | None,
    overrides: Iterable[str] | Mapping[str, str] = (),
    pm: pluggy.PluginManager | None = None,
) -> Config:
    """The typed configuration of ``path`` (None: :data:`SINGLE_NODE_DEFAULTS`) with overrides applied.

    Raises :class:`josef.config.ConfigError` naming the key of any bad value.
    """
    definition = ConfigDef.from_plugins(pm or get_plugin_manager())
    if path is not None:
        raw = read_properties(path)
    else:
        raw = {key: value for key, value in SINGLE_NODE_DEFAULTS.items() if key in definition}
    raw.update(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides))
    return Config.build(definition, with_synonyms(raw))


def with_synonyms(raw: Mapping[str, str]) -> dict[str, str]:
    """``broker.id`` and ``node.id`` as Kafka's KafkaConfig.populateSynonyms treats them: either gives the other,
    so a Kafka 3.x ZooKeeper-mode ``server.properties`` (``broker.id``) starts as it did; both, they must agree."""
    out = dict(raw)
    broker_id, node_id = out.get("broker.id"), out.get("node.id")
    if broker_id is not None and node_id is not None and broker_id.strip() != node_id.strip():
        raise ConfigError(f"broker.id={broker_id} and node.id={node_id} name the same thing and must be equal")
    if broker_id is not None:
        out["node.id"] = broker_id
    elif node_id is not None:
        out["broker.id"] = node_id
    return out
