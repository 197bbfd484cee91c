"""josef's admin client against a real broker: every operation, its routing, and the errors it reports."""

import asyncio
import socket

import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.config import ConfigError, ConfigKey, ConfigType
from josef.plugins import get_plugin_manager
from josef.protocol.errors import KafkaConnectionError, KafkaError
from josef.protocol.topic_partition import TopicPartition
from josef.node.runner import BrokerThread
from josef.testing import broker_overrides
from josef_client.admin import (
    Admin,
    AlterConfigOp,
    AlterOp,
    AsyncAdmin,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from josef_client.producer import Producer


@pytest.fixture
def admin(josef_broker):
    client = Admin(bootstrap_servers=josef_broker.bootstrap_servers)
    yield client
    client.close()


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def produce(broker, topic, records, partition=0):
    """(value, timestamp) pairs, one acknowledged request each, so each record is its own batch."""
    with Producer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0) as producer:
        for value, timestamp in records:
            producer.send(topic, value=value, partition=partition, timestamp_ms=timestamp).result(30)


def expect_error(code, call, *args, **kwargs):
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value


# Construction ----------------------------------------------------------------------------------------


def test_config_errors_are_reported_at_construction():
    with pytest.raises(ConfigError, match="bootstrap.servers is required"):
        AsyncAdmin()
    with pytest.raises(ConfigError, match="did you mean 'request.timeout.ms'"):
        AsyncAdmin(bootstrap_servers="127.0.0.1:1", request_timeout_mss=5)
    with pytest.raises(ConfigError, match="unknown admin configuration 'acks'"):
        Admin({"bootstrap.servers": "127.0.0.1:1", "acks": "all"})


def test_unreachable_bootstrap_server_fails_at_start():
    port = closed_port()
    with pytest.raises(KafkaConnectionError, match=f"127.0.0.1:{port}"):
        Admin(bootstrap_servers=f"127.0.0.1:{port}")


def test_async_admin_as_context_manager(josef_broker):
    async def main():
        async with AsyncAdmin(bootstrap_servers=josef_broker.bootstrap_servers) as admin:
            created = await admin.create_topics([NewTopic("async", 2)])
            described = await admin.describe_topics(["async"])
            return created, described

    created, described = asyncio.run(main())
    assert created["async"].num_partitions == 2
    assert [p.partition for p in described["async"].partitions] == [0, 1]


# Topics -------------------------------------------------------------------------------------------


def test_create_topics_with_partitions_replication_and_configs(admin, josef_broker):
    created = admin.create_topics([NewTopic("orders", 3, 1, {"retention.ms": "60000", "cleanup.policy": "compact"})])
    topic = created["orders"]
    assert (topic.name, topic.num_partitions, topic.replication_factor) == ("orders", 3, 1)
    assert topic.configs["retention.ms"] == "60000"
    assert topic.configs["cleanup.policy"] == "compact"
    image = josef_broker.broker.image.topics["orders"]
    assert len(image.partitions) == 3
    assert josef_broker.broker.image.config(ResourceType.TOPIC, "orders") == {"retention.ms": "60000", "cleanup.policy": "compact"}


@pytest.mark.josef_config(**{"num.partitions": "4"})
def test_a_plain_name_takes_the_broker_defaults(admin):
    assert admin.create_topics(["plain"])["plain"].num_partitions == 4
    assert len(admin.describe_topics(["plain"])["plain"].partitions) == 4


def test_create_with_replica_assignments(admin):
    admin.create_topics([NewTopic("placed", replica_assignments={0: [1], 1: [1]})])
    partitions = admin.describe_topics(["placed"])["placed"].partitions
    assert [(p.partition, p.replicas) for p in partitions] == [(0, (1,)), (1, (1,))]
    expect_error(ErrorCode.invalid_replica_assignment, admin.create_topics,
                 [NewTopic("nowhere", replica_assignments={0: [7]})])
    expect_error(ErrorCode.invalid_request, admin.create_topics,
                 [NewTopic("both", 2, replica_assignments={0: [1], 1: [1]})])


def test_validate_only_creates_nothing(admin):
    result = admin.create_topics([NewTopic("dry", 5)], validate_only=True)
    assert result["dry"].num_partitions == 5
    assert "dry" not in admin.list_topics()
    expect_error(ErrorCode.invalid_replication_factor, admin.create_topics, [NewTopic("dry", 1, 3)], validate_only=True)


def test_create_errors_carry_the_brokers_code_and_message(admin):
    admin.create_topics(["exists"])
    error = expect_error(ErrorCode.topic_already_exists, admin.create_topics, ["exists"])
    assert "already exists" in error.message
    expect_error(ErrorCode.invalid_topic_exception, admin.create_topics, ["bad topic"])
    expect_error(ErrorCode.invalid_replication_factor, admin.create_topics, [NewTopic("rf", 1, 3)])
    expect_error(ErrorCode.invalid_partitions, admin.create_topics, [NewTopic("zero", 0)])
    expect_error(ErrorCode.invalid_config, admin.create_topics, [NewTopic("cfg", 1, 1, {"retention.ms": "soon"})])


def test_batch_results_without_raising(admin):
    admin.create_topics(["first"])
    results = admin.create_topics(["first", "second", "bad topic"], raise_errors=False)
    assert results["first"].code == ErrorCode.topic_already_exists
    assert results["second"].num_partitions == 1
    assert results["bad topic"].code == ErrorCode.invalid_topic_exception
    assert list(results) == ["first", "second", "bad topic"]
    # The first failure is raised only after every topic was tried.
    expect_error(ErrorCode.topic_already_exists, admin.create_topics, ["second", "third"])
    assert "third" in admin.list_topics()


def test_delete_topics(admin):
    admin.create_topics(["doomed", "kept"])
    assert admin.delete_topics(["doomed"]) == {"doomed": None}
    assert list(admin.list_topics()) == ["kept"]
    expect_error(ErrorCode.unknown_topic_or_partition, admin.delete_topics, ["doomed"])
    results = admin.delete_topics(["kept", "never"], raise_errors=False)
    assert results["kept"] is None and results["never"].code == ErrorCode.unknown_topic_or_partition
    assert admin.delete_topics([]) == {}


@pytest.mark.josef_config(**{"delete.topic.enable": "false"})
def test_delete_disabled_by_the_broker(admin):
    admin.create_topics(["stays"])
    expect_error(ErrorCode.topic_deletion_disabled, admin.delete_topics, ["stays"])


def test_list_topics_and_the_internal_flag(admin):
    admin.create_topics(["b", "a", "__internal"])
    listed = admin.list_topics()
    assert list(listed) == ["a", "b"]
    everything = admin.list_topics(include_internal=True)
    assert list(everything) == ["__internal", "a", "b"]
    assert everything["__internal"].is_internal and not everything["a"].is_internal
    assert len(everything["a"].topic_id) == 22


def test_describe_topics(admin, josef_broker):
    admin.create_topics([NewTopic("described", 2)])
    description = admin.describe_topics(["described"])["described"]
    assert description.topic_id == admin.list_topics()["described"].topic_id
    assert not description.is_internal
    assert description.replication_factor == 1
    assert [(p.partition, p.leader, p.replicas, p.isr) for p in description.partitions] == [(0, 1, (1,), (1,)), (1, 1, (1,), (1,))]
    assert all(p.leader_epoch >= 0 for p in description.partitions)
    assert set(admin.describe_topics()) == {"described"}
    error = expect_error(ErrorCode.unknown_topic_or_partition, admin.describe_topics, ["described", "missing"])
    assert "missing" in error.message
    mixed = admin.describe_topics(["missing", "described"], raise_errors=False)
    assert isinstance(mixed["missing"], KafkaError) and mixed["described"].name == "described"


def test_describe_does_not_create_topics(admin):
    expect_error(ErrorCode.unknown_topic_or_partition, admin.describe_topics, ["not.created"])
    assert "not.created" not in admin.list_topics()


def test_create_partitions(admin):
    admin.create_topics([NewTopic("grow", 1)])
    assert admin.create_partitions({"grow": 3}) == {"grow": None}
    assert len(admin.describe_topics(["grow"])["grow"].partitions) == 3
    admin.create_partitions({"grow": NewPartitions(4, [[1]])})
    assert admin.describe_topics(["grow"])["grow"].partitions[3].replicas == (1,)
    admin.create_partitions({"grow": 6}, validate_only=True)
    assert len(admin.describe_topics(["grow"])["grow"].partitions) == 4
    error = expect_error(ErrorCode.invalid_partitions, admin.create_partitions, {"grow": 2})
    assert "must be larger" in error.message
    expect_error(ErrorCode.invalid_replica_assignment, admin.create_partitions, {"grow": NewPartitions(6, [[1]])})
    expect_error(ErrorCode.unknown_topic_or_partition, admin.create_partitions, {"nothing": 2})


# Configs -----------------------------------------------------------------------------------------------


def test_describe_topic_configs_with_sources_and_synonyms(admin):
    admin.create_topics([NewTopic("cfg", 1, 1, {"retention.ms": "1000"})])
    resource = ConfigResource.topic("cfg")
    entries = admin.describe_configs([resource])[resource]
    retention = entries["retention.ms"]
    assert (retention.value, retention.source, retention.is_default) == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)
    assert not retention.read_only and not retention.is_sensitive
    assert [(s.name, s.source) for s in retention.synonyms] == [
        ("retention.ms", ConfigSource.DYNAMIC_TOPIC_CONFIG), ("log.retention.ms", ConfigSource.DEFAULT_CONFIG)]
    segment = entries["segment.bytes"]
    assert segment.is_default and segment.source == ConfigSource.DEFAULT_CONFIG
    only = admin.describe_configs([resource], keys=["segment.bytes"], include_synonyms=False)[resource]
    assert list(only) == ["segment.bytes"] and only["segment.bytes"].synonyms == ()
    documented = admin.describe_configs([resource], keys=["segment.bytes"], include_documentation=True)[resource]
    assert "segment" in documented["segment.bytes"].documentation.lower()


def test_describe_broker_configs(admin, josef_broker):
    resource = ConfigResource.broker(1)
    entries = admin.describe_configs([resource])[resource]
    assert entries["log.dirs"].read_only
    assert entries["log.dirs"].source == ConfigSource.STATIC_BROKER_CONFIG
    assert not entries["log.retention.bytes"].read_only
    assert entries["num.partitions"].source == ConfigSource.DEFAULT_CONFIG
    default = ConfigResource.broker()
    assert "num.partitions" in admin.describe_configs([default])[default]


def test_describe_config_errors(admin):
    admin.create_topics(["there"])
    expect_error(ErrorCode.unknown_topic_or_partition, admin.describe_configs, [ConfigResource.topic("absent")])
    expect_error(ErrorCode.broker_not_available, admin.describe_configs, [ConfigResource.broker(9)])
    expect_error(ErrorCode.invalid_request, admin.describe_configs, [ConfigResource.broker("one")])
    results = admin.describe_configs([ConfigResource.topic("absent"), ConfigResource.topic("there")], raise_errors=False)
    assert isinstance(results[ConfigResource.topic("absent")], KafkaError)
    assert "retention.ms" in results[ConfigResource.topic("there")]


def test_alter_configs_incrementally(admin, josef_broker):
    admin.create_topics([NewTopic("alt", 1, 1, {"retention.ms": "1000", "segment.ms": "60000"})])
    resource = ConfigResource.topic("alt")
    overrides = lambda: josef_broker.broker.image.config(ResourceType.TOPIC, "alt")
    assert admin.alter_configs({resource: [AlterConfigOp("retention.ms", "2000")]}) == {resource: None}
    assert overrides() == {"retention.ms": "2000", "segment.ms": "60000"}
    admin.alter_configs({resource: [AlterConfigOp("segment.ms", op=AlterOp.DELETE)]})
    assert overrides() == {"retention.ms": "2000"}
    admin.alter_configs({resource: [AlterConfigOp("cleanup.policy", "compact", AlterOp.APPEND)]})
    assert overrides()["cleanup.policy"] == "delete,compact"
    admin.alter_configs({resource: [AlterConfigOp("cleanup.policy", "delete", AlterOp.SUBTRACT)]})
    assert overrides()["cleanup.policy"] == "compact"
    admin.alter_configs({resource: {"retention.ms": None, "max.message.bytes": 5000}})
    assert overrides() == {"cleanup.policy": "compact", "max.message.bytes": "5000"}
    admin.alter_configs({resource: {"max.message.bytes": "7"}}, validate_only=True)
    assert overrides()["max.message.bytes"] == "5000"
    described = admin.describe_configs([resource], keys=["max.message.bytes"])[resource]
    assert described["max.message.bytes"].value == "5000"


def test_alter_config_errors(admin):
    admin.create_topics(["alt"])
    topic = ConfigResource.topic("alt")
    expect_error(ErrorCode.invalid_config, admin.alter_configs, {topic: {"no.such.config": "1"}})
    expect_error(ErrorCode.invalid_config, admin.alter_configs, {topic: {"retention.ms": "forever"}})
    expect_error(ErrorCode.invalid_config, admin.alter_configs,
                 {topic: [AlterConfigOp("retention.ms", "1", AlterOp.APPEND)]})
    expect_error(ErrorCode.unknown_topic_or_partition, admin.alter_configs, {ConfigResource.topic("absent"): {"retention.ms": "1"}})
    expect_error(ErrorCode.invalid_config, admin.alter_configs, {ConfigResource.broker(1): {"log.dirs": "/elsewhere"}})


def test_alter_broker_configs(admin, josef_broker):
    broker = ConfigResource.broker(1)
    admin.alter_configs({broker: {"log.retention.bytes": "123456"}})
    entry = admin.describe_configs([broker], keys=["log.retention.bytes"])[broker]["log.retention.bytes"]
    assert (entry.value, entry.source) == ("123456", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert josef_broker.broker.config["log.retention.bytes"] == 123456
    admin.alter_configs({ConfigResource.broker(): {"log.segment.bytes": "1048576"}})
    assert josef_broker.broker.config["log.segment.bytes"] == 1048576


def test_sensitive_configs_are_never_shown(tmp_path):
    class Secrets:
        @staticmethod
        @hookimpl
        def register_configs(register):
            register(ConfigKey("my.secret", ConfigType.PASSWORD, None, "A password.", dynamic=True))

    pm = get_plugin_manager(plugins=[Secrets()])
    with (BrokerThread(broker_overrides(tmp_path, **{"my.secret": "hunter2"}), pm=pm) as broker,
          Admin(bootstrap_servers=broker.bootstrap_servers) as admin):
        resource = ConfigResource.broker(1)
        entry = admin.describe_configs([resource], keys=["my.secret"])[resource]["my.secret"]
    assert entry.is_sensitive and entry.value is None
    assert all(s.value != "hunter2" for s in entry.synonyms)


# Offsets and records --------------------------------------------------------------------------------------


def test_list_offsets(admin, josef_broker):
    admin.create_topics([NewTopic("times", 2)])
    produce(josef_broker, "times", [(f"v{i}".encode(), 1_000_000 + i * 1000) for i in range(5)])
    tp, empty = TopicPartition("times", 0), TopicPartition("times", 1)
    offsets = admin.list_offsets({tp: OffsetSpec.EARLIEST, empty: "earliest"})
    assert offsets[tp].offset == 0 and offsets[empty].offset == 0
    assert admin.list_offsets({tp: "latest"})[tp].offset == 5
    assert admin.list_offsets({empty: OffsetSpec.LATEST})[empty].offset == 0
    top = admin.list_offsets({tp: "max-timestamp"})[tp]
    assert (top.offset, top.timestamp) == (4, 1_004_000)
    assert admin.list_offsets({empty: OffsetSpec.MAX_TIMESTAMP})[empty].offset == -1
    for timestamp, expected in [(0, 0), (1_000_000, 0), (1_002_500, 3), (1_004_000, 4), (1_004_001, -1)]:
        found = admin.list_offsets({tp: timestamp})[tp]
        assert found.offset == expected, (timestamp, found)
    assert admin.list_offsets({tp: 1_002_000})[tp].timestamp == 1_002_000
    # Tiered storage's specs (kafka-get-offsets.sh --time earliest-local...): all on disk, nothing remote.
    tiered = admin.list_offsets({tp: "earliest-local", empty: OffsetSpec.LATEST_TIERED})
    assert (tiered[tp].offset, tiered[empty].offset) == (0, -1)


def test_list_offsets_errors(admin):
    admin.create_topics(["one"])
    expect_error(ErrorCode.unknown_topic_or_partition, admin.list_offsets, {TopicPartition("absent", 0): "latest"})
    expect_error(ErrorCode.unknown_topic_or_partition, admin.list_offsets, {TopicPartition("one", 3): "latest"})
    mixed = admin.list_offsets({TopicPartition("one", 3): "latest", TopicPartition("one", 0): "latest"}, raise_errors=False)
    assert isinstance(mixed[TopicPartition("one", 3)], KafkaError) and mixed[TopicPartition("one", 0)].offset == 0
    with pytest.raises(ValueError, match="offset spec"):
        admin.list_offsets({TopicPartition("one", 0): "newest"})
    with pytest.raises(ValueError, match="offset spec"):
        admin.list_offsets({TopicPartition("one", 0): -7})


def test_delete_records(admin, josef_broker):
    admin.create_topics([NewTopic("trim", 2)])
    produce(josef_broker, "trim", [(b"x", None)] * 6)
    produce(josef_broker, "trim", [(b"y", None)] * 2, partition=1)
    tp, other = TopicPartition("trim", 0), TopicPartition("trim", 1)
    assert admin.delete_records({tp: 4}) == {tp: 4}
    assert admin.list_offsets({tp: "earliest"})[tp].offset == 4
    assert admin.delete_records({tp: -1, other: -1}) == {tp: 6, other: 2}
    assert admin.list_offsets({other: "earliest"})[other].offset == 2
    expect_error(ErrorCode.offset_out_of_range, admin.delete_records, {tp: 100})
    expect_error(ErrorCode.unknown_topic_or_partition, admin.delete_records, {TopicPartition("absent", 0): 0})


# Cluster --------------------------------------------------------------------------------------------------


def test_describe_cluster(admin, josef_broker):
    cluster = admin.describe_cluster()
    assert cluster.controller_id == 1
    assert [(b.node_id, b.host, b.port) for b in cluster.brokers] == [(1, "127.0.0.1", josef_broker.port)]
    assert cluster.cluster_id == josef_broker.broker.cluster_id


def test_requests_fail_cleanly_once_the_broker_is_gone(josef_broker):
    admin = Admin(bootstrap_servers=josef_broker.bootstrap_servers, request_timeout_ms=2000, retry_backoff_ms=10)
    try:
        admin.create_topics(["before"])
        josef_broker.stop()
        with pytest.raises(KafkaConnectionError):
            admin.list_topics()
    finally:
        admin.close()
    admin.close()  # closing twice is harmless


def test_list_consumer_group_offsets(admin, josef_broker):
    from josef_client import Consumer, OffsetAndMetadata

    admin.create_topics([NewTopic("grouped", 3)])
    tps = [TopicPartition("grouped", p) for p in range(3)]
    with Consumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="lister", enable_auto_commit=False) as c:
        c.commit({tps[0]: 5, tps[2]: OffsetAndMetadata(9, "m")})
    assert admin.list_consumer_group_offsets("lister") == {tps[0]: OffsetAndMetadata(5, ""), tps[2]: OffsetAndMetadata(9, "m")}
    assert admin.list_consumer_group_offsets("lister", [tps[1], tps[2]]) == {tps[2]: OffsetAndMetadata(9, "m")}
    assert admin.list_consumer_group_offsets("nobody") == {}
