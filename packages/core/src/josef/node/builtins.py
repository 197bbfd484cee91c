"""The core's own hook implementations, registered before any plugin."""

from __future__ import annotations

from josef.authorizer import AllowAll
from josef.server.principals import DEFAULT_PRINCIPAL_BUILDER, DefaultKafkaPrincipalBuilder
from josef.standard_authorizer import STANDARD_AUTHORIZER, StandardAuthorizer
from josef.node.broker_config import CORE_KEYS
from josef.hookspecs import Register, hookimpl
from josef.metadata.features import (
    ELIGIBLE_LEADER_REPLICAS,
    ELIGIBLE_LEADER_REPLICAS_VERSION,
    LATEST_METADATA_VERSION,
    METADATA_VERSION,
    METADATA_VERSIONS,
    SupportedFeature,
)


@hookimpl
def register_configs(register: Register) -> None:
    for key in CORE_KEYS:
        register(key)


@hookimpl
def register_authorizers(register: Register) -> None:
    register("allow-all", AllowAll)
    register(STANDARD_AUTHORIZER, StandardAuthorizer)
    register("acl", StandardAuthorizer)


@hookimpl
def register_principal_builders(register: Register) -> None:
    register(DEFAULT_PRINCIPAL_BUILDER, DefaultKafkaPrincipalBuilder)


@hookimpl
def register_features(register: Register) -> None:
    register(METADATA_VERSION, SupportedFeature(min(METADATA_VERSIONS.values()), LATEST_METADATA_VERSION,
                                                LATEST_METADATA_VERSION))
    register(ELIGIBLE_LEADER_REPLICAS_VERSION, ELIGIBLE_LEADER_REPLICAS)
