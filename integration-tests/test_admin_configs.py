"""Config sources and replica assignments as confluent-kafka's AdminClient (librdkafka) sees them.

Kafka reports where each broker config value comes from: a key given in
server.properties or with ``--override`` is STATIC_BROKER_CONFIG, a key
nobody set is DEFAULT_CONFIG, one altered on this broker DYNAMIC_BROKER_CONFIG
and one altered for the whole cluster DYNAMIC_DEFAULT_BROKER_CONFIG.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from josef_client import Admin
from josef_client import ConfigResource as JosefResource

pytestmark = pytest.mark.metadata


@pytest.fixture
def configured(broker_factory):
    return broker_factory(**{"num.partitions": "3", "log.retention.hours": "12"})


def broker_configs(client: AdminClient, name: str = "1") -> dict:
    resource = ConfigResource(ResourceType.BROKER, name)
    return client.describe_configs([resource])[resource].result(30)


@pytest.mark.default_broker_config
def test_broker_config_sources(configured):
    client = AdminClient({"bootstrap.servers": configured.bootstrap_servers})
    configs = broker_configs(client)
    for name in ("num.partitions", "log.retention.hours", "listeners", "log.dirs"):
        assert configs[name].source == ConfigSource.STATIC_BROKER_CONFIG.value, name
        assert not configs[name].is_default, name
    assert configs["num.partitions"].value == "3"
    for name in ("message.max.bytes", "log.segment.bytes"):
        assert configs[name].source == ConfigSource.DEFAULT_CONFIG.value, name
        assert configs[name].is_default, name

    # Dynamic on this broker, then as the cluster-wide default.
    this_broker = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.flush.interval.messages", "5000", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([this_broker])[this_broker].result(30)
    # librdkafka cannot name the cluster-default resource (broker ""): josef's admin client can.
    with Admin(bootstrap_servers=configured.bootstrap_servers) as josef_admin:
        errors = josef_admin.alter_configs({JosefResource.broker(""): {"compression.type": "zstd"}})
    assert set(errors.values()) == {None}
    configs = broker_configs(client)
    assert (configs["log.flush.interval.messages"].value, configs["log.flush.interval.messages"].source) == (
        "5000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert (configs["compression.type"].value, configs["compression.type"].source) == (
        "zstd", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

    # A topic's default of a key set statically on the broker comes from that static key.
    client.create_topics([NewTopic("sourced", 1, 1)])["sourced"].result(30)
    topic = ConfigResource(ResourceType.TOPIC, "sourced")
    retention = client.describe_configs([topic])[topic].result(30)["retention.ms"]
    assert retention.value == str(12 * 3600 * 1000)
    assert retention.source == ConfigSource.STATIC_BROKER_CONFIG.value


def test_replica_assignments_are_validated_against_live_brokers(broker):
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    client.create_topics([NewTopic("placed", 2, replica_assignment=[[1], [1]])])["placed"].result(30)
    metadata = client.list_topics("placed", timeout=30).topics["placed"]
    assert sorted(metadata.partitions) == [0, 1]
    assert all(p.replicas == [1] for p in metadata.partitions.values())

    with pytest.raises(KafkaException, match="INVALID_REPLICA_ASSIGNMENT"):
        client.create_topics([NewTopic("nowhere", 1, replica_assignment=[[7]])])["nowhere"].result(30)
    with pytest.raises(KafkaException, match="INVALID_REPLICA_ASSIGNMENT"):
        client.create_partitions([NewPartitions("placed", 3, replica_assignment=[[7]])])["placed"].result(30)
    client.create_partitions([NewPartitions("placed", 3, replica_assignment=[[1]])])["placed"].result(30)
    assert len(client.list_topics("placed", timeout=30).topics["placed"].partitions) == 3
