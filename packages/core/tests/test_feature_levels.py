"""Feature levels (KIP-584): ApiVersions' supported and finalized features, UpdateFeatures, the bootstrap file."""

import pytest
from kio.schema.errors import ErrorCode as E

from josef.config import ConfigError
from josef.metadata import bootstrap
from josef.metadata.features import (
    ELIGIBLE_LEADER_REPLICAS,
    LATEST_METADATA_VERSION,
    FeatureError,
    SupportedFeature,
    UpgradeType,
    check_update,
    release_level,
)
from josef.protocol.api_keys import ApiKey
from josef.node.server_properties import load_config
from josef.testing import RawClient

MV = "metadata.version"
ELR = "eligible.leader.replicas.version"
SUPPORTED = {MV: SupportedFeature(22, 25, 25), "group.version": SupportedFeature(0, 1, 1)}


def update(port, version, *updates, validate_only=False):
    body = {"timeout": 5000, "validate_only": validate_only, "feature_updates": [
        {"feature": name, "max_version_level": level, "allow_downgrade": kind != UpgradeType.UPGRADE,
         "upgrade_type": kind} for name, level, kind in updates]}
    return RawClient(port).call(ApiKey.UPDATE_FEATURES, version, body)


def finalized(port, version=4):
    answer = RawClient(port).call(ApiKey.API_VERSIONS, version, {"client_software_name": "t",
                                                                 "client_software_version": "1"})
    return answer, {f.name: (f.min_version_level, f.max_version_level) for f in answer.finalized_features}


@pytest.mark.parametrize("name,level,kind,current,message", [
    ("nope.version", 1, UpgradeType.UPGRADE, 0, "does not support the given nope.version feature"),
    (MV, 26, UpgradeType.UPGRADE, 25, "Local controller supports versions 22-25"),
    (MV, 24, UpgradeType.UPGRADE, 25, "without setting the upgrade type"),
    (MV, 0, UpgradeType.UNSAFE_DOWNGRADE, 25, "cannot be disabled"),
    (MV, 22, UpgradeType.SAFE_DOWNGRADE, 25, "might delete metadata information"),
    (MV, 22, UpgradeType.UNSAFE_DOWNGRADE, 25, "Unsafe metadata downgrade is not supported"),
    (MV, 25, UpgradeType.SAFE_DOWNGRADE, 24, "Can't downgrade to a newer version"),
])
def test_updates_kafka_refuses(name, level, kind, current, message):
    with pytest.raises(FeatureError, match=message):
        check_update(name, level, kind, current, SUPPORTED, {})


def test_updates_kafka_allows():
    check_update(MV, 24, UpgradeType.SAFE_DOWNGRADE, 25, SUPPORTED, {})  # no metadata change between 24 and 25
    check_update(MV, 25, UpgradeType.UPGRADE, 23, SUPPORTED, {})
    check_update("group.version", 0, UpgradeType.SAFE_DOWNGRADE, 1, SUPPORTED, {})  # disabling a feature


def test_a_level_some_broker_lacks_is_refused():
    with pytest.raises(FeatureError, match="Broker 2 only supports versions 22-24"):
        check_update(MV, 25, UpgradeType.UPGRADE, 24, SUPPORTED, {1: {MV: (22, 25)}, 2: {MV: (22, 24)}})


def test_release_names():
    assert release_level("4.0") == 25 == release_level("4.0-IV3")
    assert release_level("4.1") == LATEST_METADATA_VERSION == release_level("4.1-IV0") == 26
    assert release_level("4.0-IV1") == 23
    with pytest.raises(FeatureError, match="unknown metadata.version '3.9'"):
        release_level("3.9")


def test_api_versions_reports_supported_and_finalized_features(josef_broker):
    answer, levels = finalized(josef_broker.port)
    assert levels[MV] == (LATEST_METADATA_VERSION, LATEST_METADATA_VERSION)
    assert answer.finalized_features_epoch >= 0
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    assert supported[MV] == (22, LATEST_METADATA_VERSION)
    assert set(supported) == set(josef_broker.broker.features)
    old = RawClient(josef_broker.port).call(ApiKey.API_VERSIONS, 0, {})
    assert old.error_code == E.none and old.api_keys


def test_update_features_at_every_version(josef_broker):
    port = josef_broker.port
    answer = update(port, 1, (MV, 24, UpgradeType.SAFE_DOWNGRADE), validate_only=True)
    assert (answer.error_code, [(r.feature, r.error_code) for r in answer.results]) == (E.none, [(MV, E.none)])
    assert finalized(port)[1][MV] == (26, 26)  # validate_only wrote nothing
    epoch = finalized(port)[0].finalized_features_epoch
    assert update(port, 2, (MV, 24, UpgradeType.SAFE_DOWNGRADE)).error_code == E.none
    answer, levels = finalized(port)
    assert levels[MV] == (24, 24) and answer.finalized_features_epoch > epoch
    # v0 has AllowDowngrade instead of an upgrade type.
    refused = update(port, 0, (MV, 23, UpgradeType.UPGRADE))
    assert (refused.error_code, refused.results) == (E.invalid_update_version, ())
    assert "without setting the upgrade type" in refused.error_message
    assert update(port, 0, (MV, 25, UpgradeType.UPGRADE)).error_code == E.none
    # All or nothing: one bad update leaves the good one unapplied.
    both = update(port, 1, (MV, 24, UpgradeType.SAFE_DOWNGRADE), ("nope.version", 1, UpgradeType.UPGRADE))
    assert both.error_code == E.invalid_update_version and finalized(port)[1][MV] == (25, 25)
    # Eligible leader replicas need metadata.version 24: turning them on and off, and what they need.
    assert finalized(port)[1][ELR] == (1, 1)
    assert update(port, 1, (ELR, 0, UpgradeType.SAFE_DOWNGRADE)).error_code == E.none
    assert update(port, 1, (MV, 23, UpgradeType.SAFE_DOWNGRADE)).error_code == E.none
    refused = update(port, 1, (ELR, 1, UpgradeType.UPGRADE))
    assert (refused.error_code, refused.error_message) == (E.invalid_update_version, (
        "Invalid update version 1 for feature eligible.leader.replicas.version. eligible.leader.replicas.version "
        "could not be set to 1 because it depends on metadata.version level 24"))
    assert update(port, 1, (ELR, 1, UpgradeType.UPGRADE), (MV, 26, UpgradeType.UPGRADE)).error_code == E.none
    assert finalized(port)[1][ELR] == (1, 1) and finalized(port)[1][MV] == (26, 26)
    twice = update(port, 2, (MV, 25, UpgradeType.UPGRADE), (MV, 24, UpgradeType.SAFE_DOWNGRADE))
    assert twice.error_code == E.invalid_request


def test_bootstrap_file_chooses_the_starting_levels(tmp_path):
    config = load_config(None, {"log.dirs": str(tmp_path)})
    assert bootstrap.levels(config, SUPPORTED) == {MV: 25, "group.version": 1}
    bootstrap.write(config, {MV: 23, "group.version": 0})
    assert bootstrap.levels(config, SUPPORTED) == {MV: 23, "group.version": 0}
    data = bootstrap.path(config).read_bytes()
    bootstrap.path(config).write_bytes(data[:-3])
    with pytest.raises(ConfigError, match=r"bootstrap.checkpoint is damaged: \d+ bytes of a partial batch"):
        bootstrap.levels(config, SUPPORTED)
    bootstrap.path(config).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ConfigError, match="fails its CRC"):
        bootstrap.levels(config, SUPPORTED)
    bootstrap.write(config, {MV: 21})
    with pytest.raises(ConfigError, match="level 21 is outside the supported 22-25"):
        bootstrap.levels(config, SUPPORTED)


def test_features_a_bootstrap_file_leaves_out_start_at_their_default_for_its_release(tmp_path):
    config = load_config(None, {"log.dirs": str(tmp_path)})
    supported = {MV: SupportedFeature(22, 26, 26), ELR: ELIGIBLE_LEADER_REPLICAS}
    assert bootstrap.levels(config, supported) == {MV: 26, ELR: 1}  # no file: the latest release
    bootstrap.write(config, {MV: 25})
    assert bootstrap.levels(config, supported) == {MV: 25, ELR: 0}  # Kafka 4.0 started without
    bootstrap.write(config, {MV: 25, ELR: 1})
    assert bootstrap.levels(config, supported) == {MV: 25, ELR: 1}
    bootstrap.write(config, {MV: 23, ELR: 1})
    with pytest.raises(ConfigError, match="eligible.leader.replicas.version could not be set to 1 because it "
                                          "depends on metadata.version level 24"):
        bootstrap.levels(config, supported)
