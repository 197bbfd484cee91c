"""ListConfigResources (v0-1): the config resources a broker knows of, as Kafka's KafkaApis lists them.

Version 0 is Kafka's ListClientMetricsResources (KIP-714) and lists the
client-metrics resources; version 1 (KIP-1142) lists the resources of the
types a request names, or of every type it supports when it names none. A
request naming a type its version does not list is answered
UNSUPPORTED_VERSION, with no resources. It needs DESCRIBE_CONFIGS on the
cluster (josef.server.authorization).
"""

from __future__ import annotations

from typing import Any, Callable

from kio.schema.errors import ErrorCode

from josef.metadata.image import MetadataImage
from josef.metadata.records import (
    BROKER_RESOURCE,
    CLIENT_METRICS_RESOURCE,
    GROUP_RESOURCE,
    TOPIC_RESOURCE,
)
from josef.server.dispatch import RequestContext

#: A broker's log levels (Kafka's ConfigResource.Type.BROKER_LOGGER): listed per broker, never stored.
BROKER_LOGGER_RESOURCE = 8


def _configured(resource_type: int) -> Callable[[RequestContext, MetadataImage], list[str]]:
    """The names with dynamic configs of one type (groups and client-metrics resources exist by having some)."""
    def names(ctx: RequestContext, image: MetadataImage) -> list[str]:
        return sorted(name for (kind, name), values in image.configs.items() if kind == resource_type and values)
    return names


def _brokers(ctx: RequestContext, image: MetadataImage) -> list[str]:
    """Kafka's getBrokerNodes: every registered broker with the request's listener, fenced ones too."""
    return [str(b.broker_id) for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
            if b.endpoint(ctx.listener_name) is not None]


def _topics(ctx: RequestContext, image: MetadataImage) -> list[str]:
    return sorted(image.topics)


#: What each type lists, in the order KafkaApis.handleListConfigResources lists them.
LISTED: dict[int, Callable[[RequestContext, MetadataImage], list[str]]] = {
    GROUP_RESOURCE: _configured(GROUP_RESOURCE),
    CLIENT_METRICS_RESOURCE: _configured(CLIENT_METRICS_RESOURCE),
    BROKER_LOGGER_RESOURCE: _brokers,
    BROKER_RESOURCE: _brokers,
    TOPIC_RESOURCE: _topics,
}
#: The types each version lists (Kafka's ListConfigResourcesRequest.supportedResourceTypes).
SUPPORTED = {0: frozenset({CLIENT_METRICS_RESOURCE}), 1: frozenset(LISTED)}


async def list_config_resources(ctx: RequestContext, request: Any) -> dict[str, Any]:
    supported = SUPPORTED[ctx.api_version]
    wanted = set(getattr(request, "resource_types", ())) or supported
    if not wanted <= supported:
        return {"throttle_time": 0, "error_code": ErrorCode.unsupported_version, "config_resources": []}
    image = ctx.broker.image
    resources = [{"resource_name": name, "resource_type": kind}
                 for kind, names in LISTED.items() if kind in wanted for name in names(ctx, image)]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "config_resources": resources}
