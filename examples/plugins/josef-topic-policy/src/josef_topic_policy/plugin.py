"""The plugin josef loads through the ``josef`` entry point: its hooks, and the plugin API range it was written for."""

from __future__ import annotations

from josef import hookimpl
from josef.config import ConfigKey, ConfigType, at_least

from josef_topic_policy.interceptor import OriginInterceptor
from josef_topic_policy.policy import MAX_PARTITIONS, MIN_RETENTION_MS, NAME_PATTERN, TopicPolicy, check_pattern

#: The plugin API versions this plugin was written for (josef refuses to load it outside them).
JOSEF_PLUGIN_API = ">=1.0,<2"


@hookimpl
def register_policies(register):
    # One object serves both keys: create.topic.policy.class.name=topic-policy and
    # alter.config.policy.class.name=topic-policy.
    register("topic-policy", TopicPolicy)


@hookimpl
def register_interceptors(register):
    # A producer lists it in interceptor.classes.
    register("origin-header", OriginInterceptor)


@hookimpl
def register_configs(register):
    register(ConfigKey(NAME_PATTERN, ConfigType.STRING, r"[a-z0-9][a-z0-9._-]*",
                       "A regular expression every new topic's whole name must match (internal topics, whose "
                       "names start with __, are exempt).", check_pattern))
    register(ConfigKey(MAX_PARTITIONS, ConfigType.INT, 64, "The most partitions a new topic may have.", at_least(1)))
    register(ConfigKey(MIN_RETENTION_MS, ConfigType.LONG, 3_600_000,
                       "The lowest retention.ms a topic may be created or altered with (-1, keep forever, is "
                       "always allowed).", at_least(0)))
