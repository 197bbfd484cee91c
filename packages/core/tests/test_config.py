from pathlib import Path

import pytest

from josef.config import Config, ConfigError, ConfigSource, parse_overrides, read_properties
from josef.plugins import get_plugin_manager
from josef.node.broker_config import metadata_quorum_name
from josef.node.server_properties import load_config


@pytest.fixture
def pm():
    return get_plugin_manager(autoload=False)


def test_defaults_match_kafka(pm):
    config = load_config(None, {}, pm)
    assert config["num.partitions"] == 1
    assert config["message.max.bytes"] == 1048588
    assert config["listeners"] == ["PLAINTEXT://localhost:9092"]
    assert config["auto.create.topics.enable"] is True
    topic = config.topic_config({})
    assert topic["retention.ms"] == 168 * 3600 * 1000
    assert topic["segment.bytes"] == 1073741824
    assert topic["segment.ms"] == 168 * 3600 * 1000
    assert topic["cleanup.policy"] == ["delete"]


def test_properties_file_and_overrides(tmp_path: Path, pm):
    props = tmp_path / "server.properties"
    props.write_text("# comment\n! also a comment\nnum.partitions = 3\nlog.dirs=/a,\\\n  /b\nlog.retention.hours: 1\n")
    config = load_config(props, ["num.partitions=5", "log.segment.bytes=1024"], pm)
    assert config["num.partitions"] == 5
    assert config["log.dirs"] == ["/a", "/b"]
    assert config.topic_config({})["retention.ms"] == 3600 * 1000
    assert config.topic_config({"retention.ms": 5})["retention.ms"] == 5
    assert config.source("log.segment.bytes") == ConfigSource.STATIC_BROKER_CONFIG
    assert config.source("num.io.threads" if "num.io.threads" in config.definition else "delete.topic.enable") == ConfigSource.DEFAULT_CONFIG


def test_retention_synonyms_most_specific_wins(pm):
    config = load_config(None, {"log.retention.hours": "2", "log.retention.minutes": "3"}, pm)
    assert config.topic_config({})["retention.ms"] == 3 * 60_000
    config = load_config(None, {"log.retention.ms": "-1", "log.retention.hours": "2"}, pm)
    assert config.topic_config({})["retention.ms"] == -1


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("num.partitions", "zero", "num.partitions"),
        ("num.partitions", "0", "at least 1"),
        ("auto.create.topics.enable", "yes", "true or false"),
        ("listeners", "localhost:9092", "NAME://HOST:PORT"),
        ("log.cleanup.policy", "shred", "one of"),
        ("message.max.bytes", "99999999999", "out of range"),
    ],
)
def test_bad_values_name_the_key(pm, key, value, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, {key: value}, pm)
    assert key in str(info.value)
    assert fragment in str(info.value)


def test_unknown_keys_are_kept_not_fatal(pm):
    config = load_config(None, {"some.plugin.key": "1"}, pm)
    assert config.unknown == {"some.plugin.key": "1"}


def test_overrides_must_be_key_value():
    assert parse_overrides(["a=b=c", " x = 1 "]) == {"a": "b=c", "x": "1"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["nonsense"])


def test_read_properties_rejects_nothing_it_can_read(tmp_path):
    path = tmp_path / "p.properties"
    path.write_text("a=1\nb 2\nflag\n")
    assert read_properties(path) == {"a": "1", "b": "2", "flag": ""}


def test_dynamic_values_win(pm):
    config = load_config(None, {"log.retention.ms": "10"}, pm)
    dynamic = config.with_dynamic({"log.retention.ms": 20})
    assert dynamic.topic_config({})["retention.ms"] == 20
    assert dynamic.source("log.retention.ms") == ConfigSource.DYNAMIC_BROKER_CONFIG
    assert isinstance(dynamic, Config)


def test_topic_configs_validated(pm):
    config = load_config(None, {}, pm)
    assert config.definition.parse_topic_configs({"retention.ms": "100"}) == {"retention.ms": 100}
    with pytest.raises(ConfigError, match="unknown topic configuration"):
        config.definition.parse_topic_configs({"retention.msec": "100"})


def test_broker_id_and_node_id_are_synonyms_as_in_kafka():
    pm = get_plugin_manager()
    assert load_config(None, {"broker.id": "7"}, pm)["node.id"] == 7
    assert load_config(None, {"node.id": "7"}, pm)["broker.id"] == 7
    assert load_config(None, {"node.id": "7", "broker.id": "7"}, pm)["node.id"] == 7
    with pytest.raises(ConfigError, match="broker.id=7 and node.id=8"):
        load_config(None, {"broker.id": "7", "node.id": "8"}, pm)


def test_zookeeper_connect_without_process_roles_selects_zookeeper_as_kafka_3_did():
    pm = get_plugin_manager()
    connect = {"zookeeper.connect": "127.0.0.1:2181/josef"}
    assert metadata_quorum_name(load_config(None, {}, pm)) == "kraft"
    assert metadata_quorum_name(load_config(None, connect, pm)) == "zookeeper"
    assert metadata_quorum_name(load_config(None, {**connect, "process.roles": "broker,controller"}, pm)) == "kraft"
    assert metadata_quorum_name(load_config(None, {**connect, "metadata.quorum": "kraft"}, pm)) == "kraft"
