"""Share groups' configs on the GROUP config resource (IncrementalAlterConfigs / DescribeConfigs, type 32):
validated, described with their source, and over the brokers' defaults."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually
from josef_coordinator_share.configs import reset_duration_ms

E = ErrorCode
GROUP = 32
GROUP_CONFIG, DEFAULT_CONFIG, STATIC_BROKER_CONFIG = 8, 5, 4


def alter(client: RawClient, group: str, configs: dict[str, str | None]):
    answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
        {"resource_type": GROUP, "resource_name": group, "configs": [
            {"name": k, "config_operation": 0 if v is not None else 1, "value": v} for k, v in configs.items()]}]})
    return answer.responses[0]


def describe(client: RawClient, group: str) -> dict[str, tuple[str | None, int]]:
    answer = client.call(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [
        {"resource_type": GROUP, "resource_name": group, "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False})
    [result] = answer.results
    assert result.error_code == E.none, result
    return {c.name: (c.value, c.config_source) for c in result.configs}


@pytest.mark.josef_config(**{"group.share.record.lock.duration.ms": "20000"})
def test_group_configs_are_set_described_and_removed(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        before = describe(client, "q")
        assert before["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
        assert before["share.isolation.level"] == ("read_uncommitted", DEFAULT_CONFIG)
        assert before["share.record.lock.duration.ms"] == ("20000", STATIC_BROKER_CONFIG)  # the broker's own
        assert "share.session.timeout.ms" in before and "share.heartbeat.interval.ms" in before
        assert alter(client, "q", {"share.auto.offset.reset": "by_duration:PT1H",
                                   "share.record.lock.duration.ms": "15000"}).error_code == E.none
        after = eventually(lambda: (d := describe(client, "q"))["share.auto.offset.reset"][0] != "latest" and d, 10,
                           what="the group config")
        assert after["share.auto.offset.reset"] == ("by_duration:PT1H", GROUP_CONFIG)
        assert after["share.record.lock.duration.ms"] == ("15000", GROUP_CONFIG)
        assert describe(client, "other")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
        assert alter(client, "q", {"share.auto.offset.reset": None}).error_code == E.none
        eventually(lambda: describe(client, "q")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG), 10,
                   what="the config removed")
    finally:
        client.close()


def test_bad_group_configs_are_refused_with_invalid_config(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        for name, value in (("share.auto.offset.reset", "sometimes"), ("share.auto.offset.reset", "by_duration:1h"),
                            ("share.isolation.level", "read_most"), ("share.record.lock.duration.ms", "ten"),
                            ("no.such.group.config", "1"), ("log.retention.ms", "1")):
            refused = alter(client, "q", {name: value})
            assert refused.error_code == E.invalid_config, (name, value, refused)
    finally:
        client.close()


def test_by_duration_reads_iso_8601_durations():
    assert reset_duration_ms("by_duration:PT1H30M") == 5_400_000
    assert reset_duration_ms("by_duration:P2D") == 172_800_000
    assert reset_duration_ms("by_duration:PT0.25S") == 250
    assert reset_duration_ms("earliest") is None
    for bad in ("by_duration:", "by_duration:PT", "by_duration:1h", "by_duration:-PT1H"):
        with pytest.raises(ConfigError):
            reset_duration_ms(bad)
