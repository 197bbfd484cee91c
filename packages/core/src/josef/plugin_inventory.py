"""What every installed plugin registers, and what a configuration selects: ``josef plugins``.

Each ``register_*`` hook is called once per plugin with a collecting
``register``, so the listing shows exactly what a broker or client would
see, attributed to the plugin that offers it, without starting anything.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import attrs
import click
import pluggy
from kio.schema.index import api_key_map

from josef.config import Config
from josef.plugin_api import RANGE_ATTRIBUTE
from josef.plugins import BUILTIN_PLUGINS, ENTRY_POINT_GROUP

#: Hook -> what the listing calls its registrations, in the order they are shown.
KINDS = {
    "register_log_storage": "log storage",
    "register_log_storage_layers": "log storage layers",
    "register_metadata_quorum": "metadata quorum",
    "register_metadata_migrations": "metadata migrations",
    "register_coordinators": "coordinators",
    "register_authorizers": "authorizers",
    "register_policies": "policies",
    "register_remote_storage": "remote storage",
    "register_client_telemetry": "client telemetry",
    "register_http_routes": "http routes",
    "register_assignors": "assignors",
    "register_partitioners": "partitioners",
    "register_interceptors": "interceptors",
    "register_record_decoders": "record decoders",
    "register_features": "features",
    "register_configs": "configs",
    "register_commands": "commands",
}

#: Broker configuration keys that pick a registered implementation by name (unset: none is picked).
SELECTED_BY = {
    "log storage": ("log.storage",),
    "metadata quorum": ("metadata.quorum",),
    "authorizers": ("authorizer.class.name",),
    "policies": ("create.topic.policy.class.name", "alter.config.policy.class.name"),
}


def selections(config: Config, kind: str) -> list[tuple[str, str]]:
    """``(key, name)`` for each key of ``kind`` that ``config`` sets."""
    return [(key, config[key]) for key in SELECTED_BY.get(kind, ()) if key in config.definition and config[key]]


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    plugin_api: str | None
    registers: dict[str, list[str]]
    #: Coordinator name -> the API keys it answers, as "Name (key) vLOW-vHIGH".
    apis: dict[str, list[str]]
    #: What the configuration selects among this plugin's registrations (kind -> name).
    selected: dict[str, list[str]]


def _distributions() -> dict[str, importlib.metadata.Distribution]:
    return {ep.name: ep.dist for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.dist is not None}


def _registered(pm: pluggy.PluginManager, hook_name: str, plugin: object) -> list[tuple[str, Any]]:
    hook = getattr(pm.hook, hook_name, None)
    if hook is None:
        return []
    found: list[tuple[str, Any]] = []
    for impl in hook.get_hookimpls():
        if impl.plugin is not plugin:
            continue
        if hook_name == "register_commands":
            group = click.Group()
            impl.function(cli=group)
            found += [(name, None) for name in group.commands]
        elif hook_name == "register_configs":
            impl.function(register=lambda key: found.append((key.name, key)))
        else:
            impl.function(register=lambda name, item: found.append((name, item)))
    return found


def _apis(coordinator_factory: Any) -> list[str]:
    """The API keys a coordinator declares (``Coordinator.apis()`` is a declaration: built without a broker)."""
    return [f"{''.join(w.capitalize() for w in api_key_map[key].split('_'))} ({int(key)}) v{low}-v{high}"
            for key, _, low, high in coordinator_factory(None).apis()]


def inventory(pm: pluggy.PluginManager, config: Config | None) -> list[PluginInfo]:
    """Every plugin of ``pm`` (the core's built-ins first) with what it registers and what ``config`` selects."""
    dists = _distributions()
    plugins = []
    for name, plugin in pm.list_name_plugin():
        dist = dists.get(name)
        registers: dict[str, list[str]] = {}
        apis: dict[str, list[str]] = {}
        selected: dict[str, list[str]] = {}
        for hook_name, kind in KINDS.items():
            found = _registered(pm, hook_name, plugin)
            if not found:
                continue
            registers[kind] = [n for n, _ in found]
            if kind == "coordinators":
                apis = {n: _apis(factory) for n, factory in found}
                selected[kind] = [n for n, _ in found]  # every installed coordinator runs
            if config is not None:
                chosen = sorted({name for _, name in selections(config, kind) if name in registers[kind]})
                if chosen:
                    selected[kind] = chosen
        builtin = name in BUILTIN_PLUGINS
        plugins.append(PluginInfo(
            name=name,
            distribution="josef" if builtin else dist.name if dist else None,
            version=importlib.metadata.version("josef") if builtin else dist.version if dist else None,
            plugin_api=getattr(plugin, RANGE_ATTRIBUTE, None),
            registers=registers, apis=apis, selected=selected))
    return plugins
