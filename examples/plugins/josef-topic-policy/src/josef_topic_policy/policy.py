"""A create-topic and alter-config policy (Kafka's CreateTopicPolicy and AlterConfigPolicy), configured by broker keys.

Selected on the controller with::

    create.topic.policy.class.name=topic-policy
    alter.config.policy.class.name=topic-policy
    topic.policy.name.pattern=[a-z]+[.][a-z0-9-]+
    topic.policy.max.partitions=12
    topic.policy.min.retention.ms=3600000
"""

from __future__ import annotations

import re

from josef.config import Config, ConfigError
from josef.policy import AlterConfigRequest, ConfigResourceType, CreateTopicRequest, PolicyViolation

#: The configuration keys this plugin declares (plugin.register_configs).
NAME_PATTERN = "topic.policy.name.pattern"
MAX_PARTITIONS = "topic.policy.max.partitions"
MIN_RETENTION_MS = "topic.policy.min.retention.ms"

RETENTION = "retention.ms"


def check_pattern(value: str) -> None:
    """Refuse, when the broker starts, a pattern that is no regular expression."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ConfigError(f"not a regular expression: {exc}") from None


class TopicPolicy:
    """Topic names must match a pattern, partitions stay under a limit, retention above a floor.

    Built once per controller, with the node's configuration. Both methods
    run on the controller's event loop: they only compare values.
    """

    def __init__(self, config: Config) -> None:
        self.pattern = re.compile(config[NAME_PATTERN])
        self.max_partitions: int = config[MAX_PARTITIONS]
        self.min_retention_ms: int = config[MIN_RETENTION_MS]

    def validate_create_topic(self, request: CreateTopicRequest) -> None:
        if request.topic.startswith("__"):
            return  # the coordinators' internal topics (__consumer_offsets, ...), which brokers create themselves
        if not self.pattern.fullmatch(request.topic):
            raise PolicyViolation(f"Topic name {request.topic!r} does not match {self.pattern.pattern!r} "
                                  f"({NAME_PATTERN}).")
        partitions = (request.num_partitions if request.replicas_assignments is None
                      else len(request.replicas_assignments))
        if partitions is not None and partitions > self.max_partitions:
            raise PolicyViolation(f"Topic {request.topic!r} would have {partitions} partitions; at most "
                                  f"{self.max_partitions} are allowed ({MAX_PARTITIONS}).")
        self._check_retention(f"Topic {request.topic!r}", request.configs.get(RETENTION))

    def validate_alter_config(self, request: AlterConfigRequest) -> None:
        if request.resource.type is ConfigResourceType.TOPIC:
            self._check_retention(f"Topic {request.resource.name!r}", request.configs.get(RETENTION))

    def _check_retention(self, what: str, value: str | None) -> None:
        if value is None:
            return  # not given (or deleted): the broker default applies
        retention = int(value)  # the controller has already refused values that are not numbers
        if retention != -1 and retention < self.min_retention_ms:
            raise PolicyViolation(f"{what}: {RETENTION}={retention} is below the minimum of "
                                  f"{self.min_retention_ms} ({MIN_RETENTION_MS}).")
