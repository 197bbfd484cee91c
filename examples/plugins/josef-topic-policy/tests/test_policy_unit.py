"""The policy on its own, with the request types josef.policy defines (Kafka's RequestMetadata)."""

from __future__ import annotations

import pytest

from josef.config import Config, ConfigDef, ConfigError
from josef.plugins import get_plugin_manager
from josef.policy import AlterConfigRequest, ConfigResource, ConfigResourceType, CreateTopicRequest, PolicyViolation

from josef_topic_policy import TopicPolicy


def policy(**overrides: str) -> TopicPolicy:
    """The policy as a controller builds it: from a configuration with this plugin's keys declared."""
    definition = ConfigDef.from_plugins(get_plugin_manager())
    return TopicPolicy(Config.build(definition, {"topic.policy.max.partitions": "4", **overrides}))


def test_manual_assignments_count_their_partitions():
    assignments = {p: (1,) for p in range(5)}
    with pytest.raises(PolicyViolation, match="would have 5 partitions"):
        policy().validate_create_topic(CreateTopicRequest("orders", None, None, assignments, {}))
    policy().validate_create_topic(CreateTopicRequest("orders", None, None, {0: (1,)}, {}))


def test_internal_topics_are_exempt_and_broker_configs_are_not_checked():
    strict = policy(**{"topic.policy.name.pattern": "[a-z]+"})
    strict.validate_create_topic(CreateTopicRequest("__consumer_offsets", 50, 1, None, {}))
    strict.validate_alter_config(AlterConfigRequest(ConfigResource(ConfigResourceType.BROKER, "1"),
                                                    {"retention.ms": "1"}))
    strict.validate_alter_config(AlterConfigRequest(ConfigResource(ConfigResourceType.TOPIC, "orders"),
                                                    {"retention.ms": None}))  # deleted: the default applies


def test_a_pattern_that_is_no_regular_expression_stops_start_up():
    with pytest.raises(ConfigError, match="topic.policy.name.pattern"):
        policy(**{"topic.policy.name.pattern": "[unclosed"})
