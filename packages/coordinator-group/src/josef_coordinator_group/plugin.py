"""The entry point (``coordinator-group = josef_coordinator_group.plugin``): consumer groups for josef.

Installing this distribution is what turns group coordination on: the broker
starts every registered coordinator, registers its APIs, and answers
FindCoordinator for groups.
"""

from __future__ import annotations

import josef
from josef.hookspecs import Register
from josef_coordinator_group.configs import CONFIG_KEYS
from josef_coordinator_group.coordinator import GroupCoordinator

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.2,<2"


@josef.hookimpl
def register_coordinators(register: Register) -> None:
    register("group", GroupCoordinator)


@josef.hookimpl
def register_configs(register: Register) -> None:
    for key in CONFIG_KEYS:
        register(key)


@josef.hookimpl
def register_assignors(register: Register) -> None:
    """The server-side assignors of consumer (KIP-848) groups, as ``server:uniform`` and ``server:range``."""
    from josef_coordinator_group.server_assignors import BUILTIN, SERVER_PREFIX

    for assignor in BUILTIN:
        register(SERVER_PREFIX + assignor.name, assignor)


@josef.hookimpl
def register_features(register: Register) -> None:
    """``group.version`` 1: the consumer group protocol of KIP-848 is on; josef cannot turn it off.
    ``share.version`` 1: share groups (KIP-932) are on; finalizing 0 turns them off."""
    from josef.metadata.features import METADATA_VERSIONS, SupportedFeature

    register("group.version", SupportedFeature(1, 1, 1))
    # KIP-932: share groups, on (1) for a new cluster of the latest release, as in Kafka 4.2 (off when formatted
    # with --release-version 4.0, as Kafka 4.0 had them); 0 turns ShareGroupHeartbeat off.
    register("share.version", SupportedFeature(0, 1, 1, since={1: METADATA_VERSIONS["4.1-IV0"]}))


@josef.hookimpl
def register_record_decoders(register: Register) -> None:
    """``josef dump-log --offsets-decoder``: the records of ``__consumer_offsets``."""
    from josef_coordinator_group.record_decoder import decode

    register("offsets", decode)
