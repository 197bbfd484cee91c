"""Loading a broker's configuration: server.properties, then ``--override``, validated against every plugin's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import pluggy

from josef.config import Config, ConfigDef, parse_overrides, read_properties
from josef.plugins import get_plugin_manager


def load_config(
    path: Path | None,
    overrides: Iterable[str] | Mapping[str, str] = (),
    pm: pluggy.PluginManager | None = None,
) -> Config:
    """The typed configuration of ``path`` (None: embedded defaults) with overrides applied.

    Raises :class:`josef.config.ConfigError` naming the key of any bad value.
    """
    raw = read_properties(path) if path is not None else {}
    raw.update(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides))
    definition = ConfigDef.from_plugins(pm or get_plugin_manager())
    return Config.build(definition, raw)
