"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topic, broker, group and client-metrics resources."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kio.schema.errors import ErrorCode

from josef.config import ConfigKey, ConfigSource, ConfigType, synonyms
from josef.metadata import client_metrics
from josef.metadata.controller import SET, ControllerError
from josef.metadata.records import BROKER_RESOURCE, CLIENT_METRICS_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE
from josef.server.dispatch import RequestContext

if TYPE_CHECKING:
    from josef.node.broker import Broker


def _entry(key: ConfigKey, name: str, value: Any, source: ConfigSource, read_only: bool,
           chain: list[dict[str, Any]], want_synonyms: bool, want_docs: bool) -> dict[str, Any]:
    sensitive = key.sensitive or key.type is ConfigType.PASSWORD
    return {
        "name": name,
        "value": None if sensitive else key.render(value),
        "read_only": read_only,
        "is_default": source == ConfigSource.DEFAULT_CONFIG,
        "config_source": int(source),
        "is_sensitive": sensitive,
        "synonyms": ([{**c, "value": None} for c in chain] if sensitive else chain) if want_synonyms else (),
        "config_type": int(key.type),
        "documentation": key.doc if want_docs else None,
    }


def topic_config_entries(broker: Broker, overrides: Mapping[str, str], names: Any = None,
                         want_synonyms: bool = False, want_docs: bool = False) -> list[dict[str, Any]]:
    """Every topic-level config of a topic with these overrides, with its source and synonyms."""
    config = broker.config
    entries = []
    for key in config.definition.topic_keys():
        name = key.topic_name or key.name
        if names is not None and name not in names:
            continue
        chain = []
        if name in overrides:
            chain.append({"name": name, "value": overrides[name], "source": int(ConfigSource.DYNAMIC_TOPIC_CONFIG)})
        for synonym in synonyms(key):
            if config.is_set(synonym):
                chain.append({"name": synonym, "value": key.render(config[synonym]), "source": int(config.source(synonym))})
        if not key.topic_only:  # a topic-only key has no broker-level synonym, as in Kafka
            chain.append({"name": key.name, "value": key.render(config.topic_default(key)),
                          "source": int(ConfigSource.DEFAULT_CONFIG)})
        if name in overrides:
            value: Any = key.parse(overrides[name])
            source = ConfigSource.DYNAMIC_TOPIC_CONFIG
        else:
            value = config.topic_default(key)
            source = ConfigSource(chain[0]["source"]) if chain else ConfigSource.DEFAULT_CONFIG
        entries.append(_entry(key, name, value, source, False, chain, want_synonyms, want_docs))
    return entries


def group_config_entries(broker: Broker, overrides: Mapping[str, str], names: Any = None,
                         want_synonyms: bool = False, want_docs: bool = False) -> list[dict[str, Any]]:
    """Every group-level config of a group with these overrides (GROUP_CONFIG), or the broker's default."""
    config = broker.config
    entries = []
    for key in config.definition.group_keys():
        name = key.group_name or key.name
        if names is not None and name not in names:
            continue
        chain = []
        if name in overrides:
            chain.append({"name": name, "value": overrides[name], "source": int(ConfigSource.GROUP_CONFIG)})
        if not key.group_only:
            chain.append({"name": key.name, "value": key.render(config[key.name]), "source": int(config.source(key.name))})
        if name in overrides:
            value: Any = key.parse(overrides[name])
            source = ConfigSource.GROUP_CONFIG
        else:
            value = config.group_default(key)
            source = ConfigSource(chain[0]["source"]) if chain else ConfigSource.DEFAULT_CONFIG
        entries.append(_entry(key, name, value, source, False, chain, want_synonyms, want_docs))
    return entries


def _client_metrics_entries(overrides: Mapping[str, str], names: Any, want_synonyms: bool,
                            want_docs: bool) -> list[dict[str, Any]]:
    """Every key of a client-metrics resource: its value (CLIENT_METRICS_CONFIG) or Kafka's default (DEFAULT_CONFIG).

    A resource that does not exist is described with the defaults alone, as Kafka describes it.
    """
    entries = []
    for key in client_metrics.KEYS.values():
        if names is not None and key.name not in names:
            continue
        if key.name in overrides:
            value: Any = key.parse(overrides[key.name])
            source = ConfigSource.CLIENT_METRICS_CONFIG
            chain = [{"name": key.name, "value": key.render(value), "source": int(source)}]
        else:
            value, source, chain = key.default, ConfigSource.DEFAULT_CONFIG, []
        entries.append(_entry(key, key.name, value, source, False, chain, want_synonyms, want_docs))
    return entries


def _broker_entries(broker: Broker, names: Any, want_synonyms: bool, want_docs: bool) -> list[dict[str, Any]]:
    config = broker.config
    entries = []
    for key in config.definition.keys():
        if names is not None and key.name not in names:
            continue
        source = config.source(key.name)
        chain = [{"name": key.name, "value": key.render(config[key.name]), "source": int(source)}]
        entries.append(_entry(key, key.name, config[key.name], source, not key.dynamic, chain, want_synonyms, want_docs))
    return entries


async def describe_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    results = []
    for resource in request.resources:
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                  "resource_type": resource.resource_type, "resource_name": resource.resource_name,
                                  "configs": ()}
        names = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        want_synonyms = getattr(request, "include_synonyms", False)
        want_docs = getattr(request, "include_documentation", False)
        if resource.resource_type == TOPIC_RESOURCE:
            if resource.resource_name not in broker.image.topics:
                result.update(error_code=ErrorCode.unknown_topic_or_partition,
                              error_message=f"topic {resource.resource_name!r} does not exist")
            else:
                overrides = broker.image.config(TOPIC_RESOURCE, resource.resource_name)
                result["configs"] = topic_config_entries(broker, overrides, names, want_synonyms, want_docs)
        elif resource.resource_type == BROKER_RESOURCE:
            if resource.resource_name not in ("", str(broker.node_id)):
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"broker {resource.resource_name!r} is not this broker ({broker.node_id})")
            else:
                result["configs"] = _broker_entries(broker, names, want_synonyms, want_docs)
        elif resource.resource_type == GROUP_RESOURCE:
            overrides = broker.image.config(GROUP_RESOURCE, resource.resource_name)
            result["configs"] = group_config_entries(broker, overrides, names, want_synonyms, want_docs)
        elif resource.resource_type == CLIENT_METRICS_RESOURCE:
            if not resource.resource_name:
                result.update(error_code=ErrorCode.invalid_request,
                              error_message="Client metrics subscription name must not be empty")
            else:
                overrides = broker.image.config(CLIENT_METRICS_RESOURCE, resource.resource_name)
                result["configs"] = _client_metrics_entries(overrides, names, want_synonyms, want_docs)
        else:
            result.update(error_code=ErrorCode.invalid_request,
                          error_message=f"resource type {resource.resource_type} is not supported")
        results.append(result)
    return {"throttle_time": 0, "results": results}


async def _alter(ctx: RequestContext, request: Any, incremental: bool) -> dict[str, Any]:
    responses = []
    for resource in request.resources:
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                  "resource_type": resource.resource_type, "resource_name": resource.resource_name}
        if incremental:
            ops = [(c.name, c.config_operation, c.value) for c in resource.configs]
        else:
            ops = [(c.name, SET, c.value) for c in resource.configs]
        try:
            await ctx.broker.controller.alter_configs(resource.resource_type, resource.resource_name, ops,
                                                      request.validate_only, incremental,
                                                      policy=ctx.broker.policies.alter_config)
        except ControllerError as exc:
            result.update(error_code=exc.code, error_message=exc.message)
        responses.append(result)
    return {"throttle_time": 0, "responses": responses}


async def alter_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return await _alter(ctx, request, incremental=False)


async def incremental_alter_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return await _alter(ctx, request, incremental=True)
