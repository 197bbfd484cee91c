"""Topic policies (josef.policy): Kafka's create.topic.policy.class.name and alter.config.policy.class.name.

The policy comes from a plugin installed as a wheel would install it (a
module and a dist-info with its ``josef`` entry point), and the broker is the
``josef_broker`` fixture, which loads it like any installed plugin.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.records import BROKER_RESOURCE, TOPIC_RESOURCE
from josef.node.runner import BrokerThread
from josef.plugins import PluginError
from josef.policy import AlterConfigRequest, ConfigResource, ConfigResourceType, CreateTopicRequest
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, broker_overrides

MODULE = "josef_policy_test_plugin"

PLUGIN = '''
"""One policy for both keys, and one for creations only, with a config key of their own."""
from josef import hookimpl
from josef.config import ConfigKey, ConfigType
from josef.policy import PolicyViolation

JOSEF_PLUGIN_API = ">=1.0,<2"

#: Every policy built (the test reads what each was asked).
BUILT = []


class Strict:
    def __init__(self, config):
        self.max_partitions = config["strict.max.partitions"]
        self.seen = []
        BUILT.append(self)

    def validate_create_topic(self, request):
        self.seen.append(request)
        if request.topic.startswith("__"):
            return
        if not request.topic.startswith("ok-"):
            raise PolicyViolation(f"topic {request.topic} must start with ok-")
        partitions = request.num_partitions or len(request.replicas_assignments)
        if partitions > self.max_partitions:
            raise PolicyViolation(f"{partitions} partitions is over the limit of {self.max_partitions}")

    def validate_alter_config(self, request):
        self.seen.append(request)
        retention = request.configs.get("retention.ms")
        if retention is not None and int(retention) < 1000:
            raise PolicyViolation(f"retention.ms={retention} is below 1000 for {request.resource.name}")


class CreateOnly:
    def __init__(self, config):
        pass

    def validate_create_topic(self, request):
        pass


@hookimpl
def register_policies(register):
    register("strict", Strict)
    register("create-only", CreateOnly)


@hookimpl
def register_configs(register):
    register(ConfigKey("strict.max.partitions", ConfigType.INT, 4, "The most partitions a topic may have."))
'''

BOTH = {"create.topic.policy.class.name": "strict", "alter.config.policy.class.name": "strict"}


@pytest.fixture
def policy_plugin(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """The plugin's module and its dist-info with a ``josef`` entry point, on sys.path: installed."""
    site: Path = tmp_path_factory.mktemp("site")
    (site / f"{MODULE}.py").write_text(PLUGIN)
    info = site / "josef_policy_test-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: josef-policy-test\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[josef]\njosef-policy-test = {MODULE}\n")
    monkeypatch.syspath_prepend(str(site))
    module = importlib.import_module(MODULE)
    yield module
    sys.modules.pop(MODULE, None)


def policy(plugin) -> object:
    [built] = plugin.BUILT
    return built


def create(client: RawClient, topics: list[dict], validate_only: bool = False) -> dict[str, tuple[int, str | None]]:
    """CreateTopics v7: each topic's (error code, error message)."""
    bodies = [{"num_partitions": -1, "replication_factor": -1, "assignments": [], "configs": [], **t} for t in topics]
    answer = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": bodies, "timeout": 10000, "validate_only": validate_only})
    return {t.name: (t.error_code, t.error_message) for t in answer.topics}


def incremental(client: RawClient, resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
                validate_only: bool = False) -> list[tuple[int, str | None]]:
    """IncrementalAlterConfigs v1: each resource's (error code, error message)."""
    answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": validate_only, "resources": [
        {"resource_type": kind, "resource_name": name,
         "configs": [{"name": k, "config_operation": op, "value": v} for k, op, v in ops]}
        for kind, name, ops in resources]})
    return [(r.error_code, r.error_message) for r in answer.responses]


SET, DELETE = 0, 1


@pytest.mark.josef_config(**BOTH, **{"num.partitions": "2"})
def test_a_topic_the_policy_refuses_is_answered_policy_violation_with_its_message_alone(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    answers = create(client, [
        {"name": "ok-orders", "num_partitions": 3, "configs": [{"name": "retention.ms", "value": "5000"}]},
        {"name": "orders"},
        {"name": "ok-huge", "num_partitions": 5},
        {"name": "ok-defaults"},
        {"name": "ok-manual", "assignments": [{"partition_index": 0, "broker_ids": [1]},
                                              {"partition_index": 1, "broker_ids": [1]}]},
    ])
    assert answers == {
        "ok-orders": (ErrorCode.none, None),
        "orders": (ErrorCode.policy_violation, "topic orders must start with ok-"),
        "ok-huge": (ErrorCode.policy_violation, "5 partitions is over the limit of 4"),
        "ok-defaults": (ErrorCode.none, None),
        "ok-manual": (ErrorCode.none, None),
    }
    assert ErrorCode.policy_violation == 44
    topics = josef_broker.broker.image.topics
    assert {"ok-orders", "ok-defaults", "ok-manual"} <= set(topics) and not {"orders", "ok-huge"} & set(topics)
    # Kafka's RequestMetadata: defaults applied, the request's configs only; a manual assignment instead of counts.
    seen = {r.topic: r for r in policy(policy_plugin).seen if not r.topic.startswith("__")}
    assert seen["ok-orders"] == CreateTopicRequest("ok-orders", 3, 1, None, {"retention.ms": "5000"})
    assert seen["ok-defaults"] == CreateTopicRequest("ok-defaults", 2, 1, None, {})
    assert seen["ok-manual"] == CreateTopicRequest("ok-manual", None, None, {0: (1,), 1: (1,)}, {})
    # Selected by both keys, the policy was built once, when the broker started.
    assert len(policy_plugin.BUILT) == 1


@pytest.mark.josef_config(**BOTH)
def test_validate_only_requests_are_checked_and_create_nothing(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    answers = create(client, [{"name": "ok-dry", "num_partitions": 1}, {"name": "dry", "num_partitions": 1}],
                     validate_only=True)
    assert answers == {"ok-dry": (ErrorCode.none, None),
                       "dry": (ErrorCode.policy_violation, "topic dry must start with ok-")}
    assert not {"ok-dry", "dry"} & set(josef_broker.broker.image.topics)
    assert [r.topic for r in policy(policy_plugin).seen] == ["ok-dry", "dry"]


@pytest.mark.josef_config(**BOTH)
def test_the_policy_decides_after_the_controller_s_own_checks(policy_plugin, josef_broker):
    """As Kafka: an invalid request gets its own error, and the policy is not asked."""
    client = RawClient(josef_broker.port)
    assert create(client, [{"name": "ok-twice"}]) == {"ok-twice": (ErrorCode.none, None)}
    assert create(client, [{"name": "ok-twice"}])["ok-twice"][0] == ErrorCode.topic_already_exists
    assert create(client, [{"name": "no-brokers", "replication_factor": 3}])["no-brokers"][0] == \
        ErrorCode.invalid_replication_factor
    assert [r.topic for r in policy(policy_plugin).seen] == ["ok-twice"]


@pytest.mark.josef_config(**BOTH)
def test_automatically_created_topics_are_checked_too(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    answer = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "auto", "topic_id": None}],
                                               "allow_auto_topic_creation": True,
                                               "include_topic_authorized_operations": False})
    assert [(t.name, t.error_code) for t in answer.topics] == [("auto", ErrorCode.policy_violation)]
    assert "auto" not in josef_broker.broker.image.topics


@pytest.mark.josef_config(**BOTH)
def test_config_changes_the_policy_refuses_are_answered_policy_violation_per_resource(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    assert create(client, [{"name": "ok-a"}, {"name": "ok-b"}]) == {"ok-a": (0, None), "ok-b": (0, None)}
    built = policy(policy_plugin)
    built.seen.clear()
    refused = (ErrorCode.policy_violation, "retention.ms=500 is below 1000 for ok-a")
    assert incremental(client, [(TOPIC_RESOURCE, "ok-a", [("retention.ms", SET, "500")]),
                                (TOPIC_RESOURCE, "ok-b", [("retention.ms", SET, "5000")])]) == [refused, (0, None)]
    image = josef_broker.broker.image
    assert "retention.ms" not in image.config(TOPIC_RESOURCE, "ok-a")
    assert image.config(TOPIC_RESOURCE, "ok-b")["retention.ms"] == "5000"
    # validate_only is checked too, and changes nothing.
    assert incremental(client, [(TOPIC_RESOURCE, "ok-a", [("retention.ms", SET, "500")])], validate_only=True) == \
        [refused]
    assert incremental(client, [(TOPIC_RESOURCE, "ok-a", [("retention.ms", SET, "2000")])], validate_only=True) == \
        [(0, None)]
    assert "retention.ms" not in josef_broker.broker.image.config(TOPIC_RESOURCE, "ok-a")
    # The legacy AlterConfigs (v0..2) too.
    legacy = client.call(ApiKey.ALTER_CONFIGS, 2, {"validate_only": False, "resources": [
        {"resource_type": TOPIC_RESOURCE, "resource_name": "ok-a", "configs": [{"name": "retention.ms", "value": "500"}]},
        {"resource_type": TOPIC_RESOURCE, "resource_name": "ok-b",
         "configs": [{"name": "segment.ms", "value": "60000"}]}]})
    assert [(r.error_code, r.error_message) for r in legacy.responses] == [refused, (0, None)]
    # The policy sees the keys a request names, with their new values (None: deleted), for brokers too (as KRaft).
    assert incremental(client, [(TOPIC_RESOURCE, "ok-b", [("retention.ms", DELETE, None), ("segment.ms", SET, "7")]),
                                (BROKER_RESOURCE, "", [("log.retention.ms", SET, "100")])]) == [(0, None), (0, None)]
    topic_b = ConfigResource(ConfigResourceType.TOPIC, "ok-b")
    assert built.seen[-2:] == [
        AlterConfigRequest(topic_b, {"retention.ms": None, "segment.ms": "7"}),
        AlterConfigRequest(ConfigResource(ConfigResourceType.BROKER, ""), {"log.retention.ms": "100"}),
    ]
    # A legacy AlterConfigs replaces every value; those it drops are not shown to the policy (Kafka's KAFKA-14195).
    assert built.seen[5] == AlterConfigRequest(topic_b, {"segment.ms": "60000"})


@pytest.mark.josef_config(**BOTH)
def test_create_partitions_is_not_checked_as_in_kafka(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    assert create(client, [{"name": "ok-grow", "num_partitions": 2}]) == {"ok-grow": (0, None)}
    answer = client.call(ApiKey.CREATE_PARTITIONS, 3, {"timeout": 10000, "validate_only": False, "topics": [
        {"name": "ok-grow", "count": 8, "assignments": None}]})
    assert [(r.name, r.error_code) for r in answer.results] == [("ok-grow", ErrorCode.none)]


@pytest.mark.josef_config(**{"create.topic.policy.class.name": "create-only"})
def test_one_key_alone_selects_one_policy(policy_plugin, josef_broker):
    client = RawClient(josef_broker.port)
    assert create(client, [{"name": "anything"}]) == {"anything": (0, None)}
    assert incremental(client, [(TOPIC_RESOURCE, "anything", [("retention.ms", SET, "1")])]) == [(0, None)]


def test_an_unknown_policy_name_stops_start_up_listing_the_installed_ones(policy_plugin, tmp_path):
    broker = BrokerThread(broker_overrides(tmp_path, **{"alter.config.policy.class.name": "stirct"}))
    with pytest.raises(PluginError) as refused:
        broker.start()
    assert str(refused.value) == ("alter.config.policy.class.name: no policy named 'stirct' is installed; "
                                  "installed: create-only, strict")


def test_a_policy_without_the_selected_contract_stops_start_up(policy_plugin, tmp_path):
    broker = BrokerThread(broker_overrides(tmp_path, **{"alter.config.policy.class.name": "create-only"}))
    with pytest.raises(PluginError, match=r"alter.config.policy.class.name: the policy 'create-only' \(CreateOnly\) "
                                          r"has no validate_alter_config\(request\) method"):
        broker.start()
