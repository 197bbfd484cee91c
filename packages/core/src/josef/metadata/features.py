"""Feature flags (KIP-584): the levels this node supports and the rules for finalizing them.

A feature's finalized level lives in the metadata log (FeatureLevelRecord);
``metadata.version`` says which metadata records the cluster writes. josef
writes the records of Kafka 4.0, so it runs at Kafka's 4.0 metadata versions
and no lower: claiming an older level would promise records it does not
write. 4.1-IV0 changed no record, only what a new cluster starts with:
eligible leader replicas on (KIP-966). Plugins declare the features they
implement through the ``register_features`` hook; the controller refuses a
level that any registered broker does not support, or whose dependencies
(a feature level needs a ``metadata.version``) the update would leave unmet,
as Kafka's FeatureControlManager does.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Mapping

import attrs

METADATA_VERSION = "metadata.version"
#: Kafka's MetadataVersion levels josef can run at, by the name Kafka's tools print.
METADATA_VERSIONS = {"4.0-IV0": 22, "4.0-IV1": 23, "4.0-IV2": 24, "4.0-IV3": 25, "4.1-IV0": 26}
#: Levels whose metadata records changed (Kafka's ``didMetadataChange``): a downgrade across one may lose metadata.
_METADATA_CHANGED = frozenset({23})
#: The level a first start and a format without ``--release-version`` choose: Kafka 4.1-IV0.
LATEST_METADATA_VERSION = 26
#: KIP-966 eligible leader replicas: level 1 tracks them.
ELIGIBLE_LEADER_REPLICAS_VERSION = "eligible.leader.replicas.version"


class UpgradeType(IntEnum):
    """UpdateFeatures' upgrade types (v1+; v0's AllowDowngrade means SAFE_DOWNGRADE)."""

    UPGRADE = 1
    SAFE_DOWNGRADE = 2
    UNSAFE_DOWNGRADE = 3


@attrs.frozen
class SupportedFeature:
    """The levels of one feature this node can run at, and the one a new cluster starts with."""

    min_level: int
    max_level: int
    #: The level a new cluster at the latest ``metadata.version`` starts with.
    default_level: int
    #: The ``metadata.version`` from which a new cluster starts at each level, for a feature whose starting level
    #: depends on the release it is formatted at (Kafka's ``FeatureVersion.bootstrapMetadataVersion``); without
    #: it, every release starts at ``default_level``.
    since: Mapping[int, int] = attrs.field(factory=dict, hash=False)
    #: The levels of other features each level needs (Kafka's ``FeatureVersion.dependencies``).
    requires: Mapping[int, Mapping[str, int]] = attrs.field(factory=dict, hash=False)

    def __attrs_post_init__(self) -> None:
        if not self.min_level <= self.default_level <= self.max_level:
            raise ValueError(f"default level {self.default_level} is outside {self.min_level}-{self.max_level}")

    def default_for(self, metadata_version: int) -> int:
        """The level a new cluster formatted at ``metadata_version`` starts with (Kafka's ``Feature.defaultLevel``)."""
        if not self.since:
            return self.default_level
        return max((level for level, since in self.since.items() if since <= metadata_version),
                   default=self.min_level)


#: Kafka 4.1's eligible.leader.replicas.version: level 1 needs metadata.version 4.0-IV2, and is where new
#: clusters start from 4.1-IV0 on; ``--release-version 4.0`` starts without it, as Kafka 4.0 did.
ELIGIBLE_LEADER_REPLICAS = SupportedFeature(0, 1, 1, since={1: METADATA_VERSIONS["4.1-IV0"]},
                                            requires={1: {METADATA_VERSION: METADATA_VERSIONS["4.0-IV2"]}})


class FeatureError(Exception):
    """An update Kafka would refuse with INVALID_UPDATE_VERSION; the message is Kafka's."""


def release_level(release: str) -> int:
    """The metadata.version level of a release name (``4.0`` or ``4.0-IV3``), as ``--release-version`` takes it."""
    if release in METADATA_VERSIONS:
        return METADATA_VERSIONS[release]
    levels = [level for name, level in METADATA_VERSIONS.items() if name.split("-")[0] == release]
    if not levels:
        raise FeatureError(f"unknown metadata.version {release!r}; josef supports {', '.join(METADATA_VERSIONS)}")
    return max(levels)


def release_name(level: int) -> str:
    return next((name for name, value in METADATA_VERSIONS.items() if value == level), f"level {level}")


def unmet_dependency(name: str, level: int, levels: Mapping[str, int],
                     supported: Mapping[str, SupportedFeature]) -> str | None:
    """Why ``name`` may not be at ``level`` beside the other ``levels``, in Kafka's words (Feature.validateVersion);
    None when every feature it depends on is at the level it needs."""
    feature = supported.get(name)
    for needed, needed_level in (feature.requires.get(level, {}) if feature is not None else {}).items():
        if levels.get(needed, 0) < needed_level:
            return f"{name} could not be set to {level} because it depends on {needed} level {needed_level}"
    return None


def check_update(
    name: str,
    level: int,
    upgrade_type: UpgradeType,
    current: int,
    supported: Mapping[str, SupportedFeature],
    brokers: Mapping[int, Mapping[str, tuple[int, int]]],
    proposed: Mapping[str, int] | None = None,
) -> None:
    """Raise :class:`FeatureError` unless ``name`` may move from ``current`` to ``level``.

    ``brokers`` maps each registered broker to the ``(min, max)`` levels it
    supports by feature. A level below 1 disables the feature. ``proposed``
    are every feature's levels once the whole request applies (the current
    ones otherwise): a feature other than ``metadata.version`` must find
    the levels it depends on there, as Kafka checks them.
    """
    feature = supported.get(name)
    if feature is None:
        raise FeatureError(f"The controller does not support the given {name} feature.")
    if upgrade_type not in UpgradeType.__members__.values():
        raise FeatureError(f"Unknown upgrade type {int(upgrade_type)}.")
    target = max(level, 0)
    if target != 0 and not feature.min_level <= target <= feature.max_level:
        raise FeatureError(f"Invalid update version {target} for feature {name}. Local controller supports versions "
                           f"{feature.min_level}-{feature.max_level}")
    for broker_id, ranges in sorted(brokers.items()):
        low, high = ranges.get(name, (0, 0))
        if target != 0 and not low <= target <= high:
            raise FeatureError(f"Invalid update version {target} for feature {name}. Broker {broker_id} only supports "
                               f"versions {low}-{high}")
    if target < current:
        if upgrade_type == UpgradeType.UPGRADE:
            raise FeatureError("Can't downgrade the version of this feature without setting the upgrade type to "
                               "either safe or unsafe downgrade.")
        if name == METADATA_VERSION:
            if target < 1:
                raise FeatureError("The metadata.version feature cannot be disabled.")
            if any(target < changed <= current for changed in _METADATA_CHANGED):
                if upgrade_type == UpgradeType.SAFE_DOWNGRADE:
                    raise FeatureError(f"Invalid metadata.version {target}. Refusing to perform the requested "
                                       f"downgrade because it might delete metadata information.")
                raise FeatureError(f"Invalid metadata.version {target}. Unsafe metadata downgrade is not supported "
                                   f"in this version.")
    elif target > current and upgrade_type != UpgradeType.UPGRADE:
        raise FeatureError("Can't downgrade to a newer version.")
    if name != METADATA_VERSION and proposed is not None:
        unmet = unmet_dependency(name, target, proposed, supported)
        if unmet is not None:
            raise FeatureError(f"Invalid update version {target} for feature {name}. {unmet}")
