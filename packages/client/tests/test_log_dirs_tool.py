"""``josef log-dirs describe`` (kafka-log-dirs.sh) against an in-process broker, and the Java orders its JSON follows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from josef.cli import build_cli
from josef.protocol.topic_partition import TopicPartition
from josef_client import Producer
from josef_client.admin import Admin, LogDirDescription, NewTopic, ReplicaInfo
from josef_client.commands.log_dirs import format_as_json, java_hash_order, java_string_hash, log_dirs


def test_the_command_is_registered_on_josef():
    assert "log-dirs" in build_cli().commands


def test_java_string_hashes_and_hash_map_order():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322  # "hello".hashCode() in Java
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("é€") == (233 * 31 + 8364)  # UTF-16 code units, not bytes
    # The key orders Kafka's HashMaps give (kafka-log-dirs.sh output as documented and as Java prints it).
    assert java_hash_order(["version", "brokers"], java_string_hash) == ["brokers", "version"]
    assert java_hash_order(["logDir", "error", "partitions"], java_string_hash) == ["partitions", "error", "logDir"]
    assert java_hash_order(["partition", "size", "offsetLag", "isFuture"], java_string_hash) == [
        "partition", "size", "offsetLag", "isFuture"]
    # 16 buckets: 16 in bucket 0, then 17 and 1 in bucket 1 in the order they were put, then 3.
    assert java_hash_order([17, 3, 1, 16], lambda i: i) == [16, 17, 1, 3]
    # 13 keys exceed 0.75 of 16 buckets: the table has 32, so hashes 0 and 16 fall apart.
    assert java_hash_order(range(13), lambda i: 16 * i) == [0, 2, 4, 6, 8, 10, 12, 1, 3, 5, 7, 9, 11]


def test_format_as_json_filters_topics_and_names_errors():
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    dirs = {"/a": LogDirDescription(None, {TopicPartition("t", 0): ReplicaInfo(10, 0, False),
                                           TopicPartition("u", 0): ReplicaInfo(5, 0, False)}),
            "/b": LogDirDescription(KafkaError(ErrorCode.kafka_storage_error, "/b"), {})}
    text = format_as_json({1: dirs}, {"t"})
    assert json.loads(text) == {"brokers": [{"broker": 1, "logDirs": [
        {"partitions": [{"partition": "t-0", "size": 10, "offsetLag": 0, "isFuture": False}], "error": None,
         "logDir": "/a"},
        {"partitions": [], "error": "org.apache.kafka.common.errors.KafkaStorageException", "logDir": "/b"}]}],
        "version": 1}
    assert text.startswith('{"brokers":[{"broker":1,"logDirs":[{"partitions":[{"partition":"t-0","size":10,')
    assert text.endswith('"error":"org.apache.kafka.common.errors.KafkaStorageException","logDir":"/b"}]}],"version":1}')
    # --remote: remoteSize on the entries of partitions remote storage holds anything of, the rest as Kafka's.
    both = json.loads(format_as_json({1: dirs}, set(), {("u", 0): 4096}))["brokers"][0]["logDirs"][0]["partitions"]
    assert sorted(both, key=lambda p: p["partition"]) == [
        {"partition": "t-0", "size": 10, "offsetLag": 0, "isFuture": False},
        {"partition": "u-0", "size": 5, "offsetLag": 0, "isFuture": False, "remoteSize": 4096}]


@pytest.fixture
def broker_with_data(josef_broker):
    with Admin(bootstrap_servers=josef_broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic("orders", num_partitions=2), NewTopic("other")])
    with Producer({"bootstrap.servers": josef_broker.bootstrap_servers}) as producer:
        for i in range(10):
            producer.send("orders", b"x" * 100, partition=i % 2)
        producer.flush()
    return josef_broker


def describe(broker, *args: str):
    result = CliRunner().invoke(log_dirs, ["describe", "--bootstrap-server", broker.bootstrap_servers, *args])
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result


def test_describe_prints_kafkas_lines_and_json(broker_with_data):
    with Admin(bootstrap_servers=broker_with_data.bootstrap_servers) as admin:
        (node,) = [b.node_id for b in admin.describe_cluster().brokers]
        described = admin.describe_log_dirs([node])[node]
    result = describe(broker_with_data, "--topic-list", "orders")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["Querying brokers for log directories information",
                         f"Received log directory information from brokers {node}"]
    [(path, description)] = described.items()
    output = json.loads(lines[2])
    assert output["version"] == 1 and [b["broker"] for b in output["brokers"]] == [node]
    [log_dir] = output["brokers"][0]["logDirs"]
    assert log_dir["logDir"] == path and log_dir["error"] is None
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert sizes == {f"orders-{p}": description.replicas[TopicPartition("orders", p)].size for p in (0, 1)}
    assert all(size > 500 for size in sizes.values())  # five 100-byte records each
    assert lines[2] == format_as_json({node: described}, {"orders"})


def test_kafkas_describe_flag_and_all_topics(broker_with_data):
    result = CliRunner().invoke(log_dirs, ["--describe", "--bootstrap-server", broker_with_data.bootstrap_servers])
    assert result.exit_code == 0, result.stderr
    partitions = {p["partition"] for d in json.loads(result.stdout.splitlines()[2])["brokers"][0]["logDirs"]
                  for p in d["partitions"]}
    assert {"orders-0", "orders-1", "other-0"} <= partitions


def test_unknown_brokers_are_refused_as_kafka_does(broker_with_data):
    result = describe(broker_with_data, "--broker-list", "77,78")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("ERROR: The given brokers do not exist from --broker-list: 77,78. "
                                    "Current existent brokers: ")


def test_remote_sizes_of_a_cluster_without_tiered_storage_leave_kafkas_output(broker_with_data):
    plain, remote = describe(broker_with_data, "--topic-list", "orders"), describe(broker_with_data, "--topic-list",
                                                                                   "orders", "--remote")
    assert (plain.exit_code, remote.exit_code) == (0, 0), remote.stderr
    assert json.loads(remote.stdout.splitlines()[2]) == json.loads(plain.stdout.splitlines()[2])
