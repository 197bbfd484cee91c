"""The core's own hook implementations, registered before any plugin."""

from __future__ import annotations

from josef.authorizer import AllowAll
from josef.broker_config import CORE_KEYS
from josef.hookspecs import Register, hookimpl


@hookimpl
def register_configs(register: Register) -> None:
    for key in CORE_KEYS:
        register(key)


@hookimpl
def register_authorizers(register: Register) -> None:
    register("allow-all", AllowAll)
