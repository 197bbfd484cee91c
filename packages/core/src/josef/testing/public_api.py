"""Does a plugin stay inside josef's public plugin API? For plugin authors' own test suites.

    from josef.testing.public_api import private_uses

    def test_my_plugin_uses_only_the_public_api():
        assert private_uses(["src/my_plugin"]) == []

:data:`josef.plugin_api.PUBLIC_API` lists what a plugin may import; this
reads a plugin's sources (without importing them) and names every import of
anything else under ``josef``, and every reach from a request or shard
context into the node behind it (``ctx.broker``, ``context.runtime``,
``context.partition``: plugins
get :class:`josef.services.BrokerServices` through ``ctx.services``).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Iterable

from josef.plugin_api import PUBLIC_API

#: Attributes of a context that reach past the services into the node itself.
_PRIVATE_ATTRIBUTES = frozenset({"broker", "runtime", "partition"})
_CONTEXTS = frozenset({"ctx", "context", "shard_context"})


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _public(module: str, name: str | None) -> bool:
    """Whether ``from module import name`` (``name`` None: ``import module``) stays inside the public API."""
    allowed = PUBLIC_API.get(module)
    if name is None:
        return allowed is not None
    if f"{module}.{name}" in PUBLIC_API:
        return True
    if allowed is None or name.startswith("_") and name != "__version__":
        return False
    if allowed == "*":
        return not _is_module(f"{module}.{name}")  # a submodule is public only if listed itself
    return name in allowed


def _is_context(node: ast.expr) -> bool:
    """``ctx``, ``context``, ``self.context``...: a request context or shard context, whatever holds it."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in _CONTEXTS


def private_uses(paths: Iterable[str | Path]) -> list[str]:
    """``path:line: what`` for each use of josef's private API in the Python files under ``paths``."""
    found = []
    for root in paths:
        root = Path(root)
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                        node.module == "josef" or node.module.startswith("josef.")):
                    found += [f"{path}:{node.lineno}: from {node.module} import {alias.name}"
                              for alias in node.names if not _public(node.module, alias.name)]
                elif isinstance(node, ast.Import):
                    found += [f"{path}:{node.lineno}: import {alias.name}" for alias in node.names
                              if alias.name.startswith("josef.") and not _public(alias.name, None)]
                elif isinstance(node, ast.Attribute) and node.attr in _PRIVATE_ATTRIBUTES and _is_context(node.value):
                    found.append(f"{path}:{node.lineno}: .{node.attr} (use the services: ctx.services, context.services)")
    return found
