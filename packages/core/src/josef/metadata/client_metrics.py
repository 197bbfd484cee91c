"""Client-metrics config resources (KIP-714): their keys, how they are validated, which clients they select.

A client-metrics resource (config resource type 16, what ``kafka-client-metrics.sh``
and ``josef client-metrics`` manage) is a named subscription: the metrics
(name prefixes, ``*`` for every metric) that the clients it matches are asked
to push, and how often. It is stored like any other dynamic config, as
ConfigRecords in the metadata log, so it survives restarts and reaches every
broker; a resource whose configs were all deleted no longer exists. The
controller checks every change as Kafka's ClientMetricsConfigs does
(:func:`check`); brokers read the resources of their metadata image
(:func:`resources`) to answer GetTelemetrySubscriptions
(:class:`josef.telemetry.ClientTelemetry`).
"""

from __future__ import annotations

import logging
import re
from types import MappingProxyType
from typing import Mapping

import attrs
from kio.schema.errors import ErrorCode

from josef.config import ConfigError, ConfigKey, ConfigType
from josef.metadata.records import CLIENT_METRICS_RESOURCE

log = logging.getLogger(__name__)

METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
#: A ``metrics`` entry that subscribes every metric; clients are then sent it alone.
ALL_METRICS = "*"
#: Kafka's push interval of a client no resource matches, and of a resource that names none (5 minutes).
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
#: What a ``match`` entry (``selector=regex``) may select clients on.
SELECTORS = frozenset({"client_instance_id", "client_id", "client_software_name", "client_software_version",
                       "client_source_address", "client_source_port"})

#: The keys of a client-metrics resource, with Kafka's types, defaults and docs (DescribeConfigs shows them).
KEYS: Mapping[str, ConfigKey] = MappingProxyType({key.name: key for key in (
    ConfigKey(METRICS, ConfigType.LIST, [], "Telemetry metric name prefix list"),
    ConfigKey(INTERVAL_MS, ConfigType.INT, DEFAULT_INTERVAL_MS, "Metrics push interval in milliseconds"),
    ConfigKey(MATCH, ConfigType.LIST, [], "Client match criteria"),
)})


class ClientMetricsError(ValueError):
    """A resource's configs Kafka refuses, with the error code of its answer (INVALID_REQUEST or INVALID_CONFIG)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class ClientMetricsResource:
    """One subscription (Kafka's ClientMetricsManager.SubscriptionInfo)."""

    name: str
    metrics: tuple[str, ...]
    interval_ms: int
    #: ``(selector, regex)`` pairs a client must all match in full; none: every client matches.
    match: tuple[tuple[str, re.Pattern[str]], ...]

    def matches(self, client: Mapping[str, str | None]) -> bool:
        """Whether a client with these selector values (Kafka's ClientMetricsInstanceMetadata) is subscribed."""
        return all((value := client.get(selector)) is not None and pattern.fullmatch(value)
                   for selector, pattern in self.match)


def check(name: str, configs: Mapping[str, str]) -> ClientMetricsResource:
    """The resource ``configs`` make, or :class:`ClientMetricsError` with Kafka's code and message.

    Kafka's ClientMetricsConfigs.validate, on the configs as a change would
    leave them: an unknown key and an interval out of range are
    INVALID_REQUEST, a value of the wrong type and an illegal match pattern
    INVALID_CONFIG.
    """
    for key in configs:
        if key not in KEYS:
            raise ClientMetricsError(ErrorCode.invalid_request, f"Unknown client metrics configuration: {key}")
    try:
        values = {key: KEYS[key].parse(value) for key, value in configs.items()}
    except ConfigError as exc:
        raise ClientMetricsError(ErrorCode.invalid_config, str(exc)) from None
    interval = values.get(INTERVAL_MS, DEFAULT_INTERVAL_MS)
    if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        raise ClientMetricsError(ErrorCode.invalid_request, f"Invalid value {interval} for {INTERVAL_MS}, interval "
                                 f"must be between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} (1 hour)")
    return ClientMetricsResource(name, tuple(values.get(METRICS, ())), interval,
                                 tuple(_pattern(text) for text in values.get(MATCH, ())))


def _pattern(text: str) -> tuple[str, re.Pattern[str]]:
    """``selector=regex`` as Kafka's parseMatchingPatterns reads it: exactly one ``=`` (Java's split, which drops
    trailing empty parts), a known selector, a regex that compiles."""
    parts = text.split("=")
    while parts and not parts[-1]:
        parts.pop()
    illegal = ClientMetricsError(ErrorCode.invalid_config, f"Illegal client matching pattern: {text}")
    if len(parts) != 2 or parts[0].strip() not in SELECTORS:
        raise illegal
    try:
        return parts[0].strip(), re.compile(parts[1].strip())
    except re.error:
        raise illegal from None


def resources(configs: Mapping[tuple[int, str], Mapping[str, str]]) -> tuple[ClientMetricsResource, ...]:
    """The client-metrics resources among a metadata image's configs, by name.

    The controller let only valid ones in; one that is not (written by
    another implementation) is left out with a warning rather than failing
    every client's GetTelemetrySubscriptions.
    """
    found = []
    for (resource_type, name), values in configs.items():
        if resource_type != CLIENT_METRICS_RESOURCE or not values:
            continue
        try:
            found.append(check(name, values))
        except ClientMetricsError as exc:
            log.warning("client-metrics resource %r is ignored: %s", name, exc)
    return tuple(sorted(found, key=lambda r: r.name))
