"""The plugin API: its version, what it consists of, and how it changes.

A plugin is written against this API, not against josef's internals: the
modules and names in :data:`PUBLIC_API` are what a plugin may import, and
everything else under ``josef`` is private and may change in any release
(a test keeps every plugin of this repository inside the list).

The API has its own version, :data:`PLUGIN_API_VERSION` (``MAJOR.MINOR``),
apart from the ``josef`` distribution's: a minor release adds to it, a major
one removes or changes something. A plugin states the range it was written
for in its entry-point module::

    JOSEF_PLUGIN_API = ">=1.0,<2"

and the plugin manager refuses, with one line naming the distribution, the
range and the core's API version, a plugin whose range excludes this core
(:func:`check_compatible`). A plugin that states no range is loaded with a
warning, so plugins written before the API was versioned keep working.

Nothing is removed without notice: a hook or a contract method that is going
away stays for one minor version and warns (:func:`warn_deprecated`, and
:data:`DEPRECATED_HOOKS` for hooks) before a major version removes it.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

log = logging.getLogger(__name__)

#: The plugin API this core offers.
PLUGIN_API_VERSION = "1.5"

#: The attribute of a plugin's entry-point module that states the API range it supports.
RANGE_ATTRIBUTE = "JOSEF_PLUGIN_API"

#: What plugins may import: module -> the public names in it ("*": every name not starting with "_").
#: A module not listed here, and a name of a listed module not given, is private.
PUBLIC_API: dict[str, tuple[str, ...] | str] = {
    "josef": ("hookimpl", "__version__"),
    "josef.hookspecs": "*",
    "josef.plugin_api": ("PLUGIN_API_VERSION", "JosefDeprecationWarning"),
    "josef.plugins": ("PluginError", "Registry", "collect", "get_plugin_manager"),
    "josef.services": ("BrokerServices", "ProducerIdUnavailable"),
    "josef.security": ("ANONYMOUS", "AuthenticationContext", "KafkaPrincipal", "PrincipalBuilder", "Session"),
    # Contracts and their data types.
    "josef.log": "*",
    "josef.led_partitions": "*",
    "josef.authorizer": "*",
    "josef.acls": "*",
    "josef.scram": "*",
    "josef.policy": ("PolicyViolation", "CreateTopicPolicy", "CreateTopicRequest", "AlterConfigPolicy",
                     "AlterConfigRequest", "ConfigResource", "ConfigResourceType", "CREATE_TOPIC_POLICY",
                     "ALTER_CONFIG_POLICY"),
    "josef.telemetry": ("ClientTelemetryReceiver", "ClientTelemetryPush", "TelemetrySubscription"),
    "josef.metrics": ("Collector", "NodeMetrics", "QUANTILES", "Table", "add_quantiles", "summary"),
    "josef.metrics.topics": ("TopicCounters", "per_topic"),
    "josef.metadata.quorum_status": "*",
    "josef.server.http": ("PRINCIPAL", "AUTHORIZATION_CONTEXT", "HttpRequestContext"),
    "josef.remote_storage": "*",
    "josef.remote_log_metadata": "*",
    "josef.remote_log_metadata.records": "*",
    "josef.remote_log_metadata.cache": "*",
    "josef.segment_files": "*",
    "josef.config": "*",
    "josef.coordinator": "*",
    "josef.coordinator.runtime": ("Coordinator", "CoordinatorError", "CoordinatorRuntime", "CoordinatorShard", "Records",
                                  "ShardContext", "PendingWrite", "response_error"),
    "josef.coordinator.timeline": "*",
    "josef.coordinator.records": "*",
    "josef.coordinator.clock": "*",
    "josef.coordinator.hashing": "*",
    "josef.metadata": "*",
    "josef.metadata.quorum": "*",
    "josef.metadata.migration": "*",
    "josef.node.broker_config": ("inter_broker_listener_name",),
    "josef.metadata.bootstrap": "*",
    "josef.metadata.image": "*",
    "josef.metadata.records": "*",
    "josef.metadata.features": "*",
    "josef.metadata.meta_properties": "*",
    "josef.producer.producer_state": "*",
    # Answering requests: a plugin's handlers receive a RequestContext and may answer later or pre-encoded.
    "josef.server.dispatch": ("RequestContext", "Handler", "Later", "Encoded", "Stage"),
    # The wire protocol and record batches, shared with every client.
    "josef.protocol": "*",
    "josef.protocol.api_keys": "*",
    "josef.protocol.codecs": "*",
    "josef.protocol.connection": "*",
    "josef.protocol.consumer_protocol": "*",
    "josef.protocol.errors": "*",
    "josef.protocol.messages": "*",
    "josef.protocol.record_scan": "*",
    "josef.protocol.records": "*",
    "josef.protocol.topic_partition": "*",
    "josef.protocol.tls": "*",
    "josef.protocol.sasl_client": "*",
    "josef.protocol.jaas": "*",
    # Running and testing plugins.
    "josef.node.server_properties": ("load_config",),
    "josef.testing": "*",
    "josef.testing.storage": "*",
    "josef.testing.remote_storage": "*",
    "josef.testing.metadata_quorum": "*",
    "josef.testing.authorizer": "*",
    "josef.testing.coordinator": "*",
    "josef.testing.oauth": "*",
    "josef.testing.tls": "*",
    "josef.testing.faults": "*",
    "josef.testing.history": "*",
    "josef.testing.workload": "*",
}


class JosefDeprecationWarning(DeprecationWarning):
    """A plugin uses a hook or contract member that a later major plugin API version removes."""


# Shown once per place that triggers it, even outside __main__ and test runs (DeprecationWarning is hidden by default).
warnings.simplefilter("default", JosefDeprecationWarning)

#: Deprecated hooks: name -> (what to use instead, the plugin API version that removes it). A plugin
#: implementing one is warned once when the plugin manager is built.
DEPRECATED_HOOKS: dict[str, tuple[str, str]] = {}


class IncompatiblePlugin(Exception):
    """A plugin's declared plugin API range excludes this core."""


def check_compatible(distribution: str, plugin: object) -> None:
    """Refuse a plugin whose ``JOSEF_PLUGIN_API`` range excludes :data:`PLUGIN_API_VERSION`; warn if it has none."""
    declared = getattr(plugin, RANGE_ATTRIBUTE, None)
    if declared is None:
        log.warning("plugin distribution %s declares no plugin API range (%s in its entry-point module); "
                    "loading it with plugin API %s", distribution, RANGE_ATTRIBUTE, PLUGIN_API_VERSION)
        return
    try:
        supported = SpecifierSet(str(declared))
    except InvalidSpecifier:
        raise IncompatiblePlugin(f"plugin distribution {distribution} declares an unreadable plugin API range "
                                 f"{declared!r} (expected e.g. '>=1.0,<2')") from None
    if Version(PLUGIN_API_VERSION) not in supported:
        raise IncompatiblePlugin(f"plugin distribution {distribution} supports plugin API {declared}, "
                                 f"but this josef offers plugin API {PLUGIN_API_VERSION}")


_warned: set[str] = set()


def warn_deprecated(what: str, instead: str, removed_in: str, *, stacklevel: int = 3) -> None:
    """Warn, once per ``what`` in this process, that ``what`` goes in plugin API ``removed_in``."""
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(f"{what} is deprecated and goes in plugin API {removed_in}: use {instead}",
                  JosefDeprecationWarning, stacklevel=stacklevel)


F = TypeVar("F", bound=Callable[..., Any])


def deprecated_property(instead: str, removed_in: str) -> Callable[[F], property]:
    """A contract member kept for one minor version: it works, and warns once, naming its replacement."""

    def decorate(getter: F) -> property:
        def warned(self: Any) -> Any:
            warn_deprecated(f"{type(self).__name__}.{getter.__name__}", instead, removed_in)
            return getter(self)

        warned.__doc__ = f"Deprecated: use {instead} (removed in plugin API {removed_in})."
        return property(warned)

    return decorate
