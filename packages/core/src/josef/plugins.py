"""Building the plugin manager and selecting named implementations.

The plugin manager is never a module-level global: every broker, client and
CLI invocation builds its own through :func:`get_plugin_manager`, so tests can
run several brokers with different plugin sets in one process.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any, Generic, Iterable, TypeVar

import pluggy

from josef import hookspecs, plugin_api
from josef.plugin_api import IncompatiblePlugin, check_compatible, warn_deprecated

ENTRY_POINT_GROUP = "josef"
DISABLE_AUTOLOAD_ENV = "JOSEF_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "JOSEF_BLOCK_PLUGINS"

#: Modules of the core that implement hooks, registered before any entry point.
BUILTIN_PLUGINS = ("josef.node.builtins",)

T = TypeVar("T")


class PluginError(Exception):
    """A plugin could not be loaded, or an implementation could not be selected."""


def get_plugin_manager(
    *,
    autoload: bool | None = None,
    block: Iterable[str] = (),
    plugins: Iterable[object] = (),
) -> pluggy.PluginManager:
    """Build a plugin manager: built-ins, then ``josef`` entry points, then validation.

    ``autoload=None`` loads entry points unless ``JOSEF_DISABLE_PLUGIN_AUTOLOAD``
    is set. ``block`` names entry points (or distributions) not to load, added
    to the comma-separated ``JOSEF_BLOCK_PLUGINS``. ``plugins`` are extra plugin
    objects registered after the entry points (tests use this).
    """
    pm = pluggy.PluginManager("josef")
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(name), name=name)
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    blocked = set(block) | {b.strip() for b in os.environ.get(BLOCK_ENV, "").split(",") if b.strip()}
    if autoload:
        _load_entry_points(pm, blocked)
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()
    _warn_deprecated_hooks(pm)
    return pm


def _warn_deprecated_hooks(pm: pluggy.PluginManager) -> None:
    """One warning per plugin that implements a hook on its way out (see :data:`josef.plugin_api.DEPRECATED_HOOKS`)."""
    for name, (instead, removed_in) in plugin_api.DEPRECATED_HOOKS.items():
        for impl in getattr(pm.hook, name).get_hookimpls():
            owner = pm.get_name(impl.plugin) or repr(impl.plugin)
            warn_deprecated(f"hook {name} (implemented by plugin {owner})", instead, removed_in)


def _load_entry_points(pm: pluggy.PluginManager, blocked: set[str]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist else "?"
        if ep.name in blocked or dist in blocked or pm.get_plugin(ep.name) is not None:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin {ep.name!r} from distribution {dist!r} failed to import: {exc}"
            ) from exc
        try:
            check_compatible(f"{dist} {ep.dist.version}" if ep.dist else dist, plugin)
        except IncompatiblePlugin as exc:
            raise PluginError(str(exc)) from None
        pm.register(plugin, name=ep.name)


class Registry(Generic[T]):
    """Implementations of one kind, by name, as offered through a ``register_*`` hook."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}

    def register(self, name: str, item: T, owner: str = "?") -> None:
        if name in self._items:
            raise PluginError(
                f"two {self.kind} implementations are registered as {name!r}: "
                f"{self._items[name]!r} (from {self._owners[name]}) and {item!r} (from {owner})"
            )
        self._items[name] = item
        self._owners[name] = owner

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            installed = ", ".join(sorted(self._items)) or "none"
            raise PluginError(
                f"no {self.kind} named {name!r} is installed; installed: {installed}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())


def collect(pm: pluggy.PluginManager, hook_name: str, kind: str) -> Registry[Any]:
    """Call ``hook_name`` on every plugin and gather what each registers, naming its owner."""
    registry: Registry[Any] = Registry(kind)
    hook = getattr(pm.hook, hook_name)
    for impl in hook.get_hookimpls():
        owner = pm.get_name(impl.plugin) or repr(impl.plugin)
        impl.function(register=lambda name, item, _owner=owner: registry.register(name, item, _owner))
    return registry
