"""The entry point (``console = josef_console.plugin``): a web console on every node's HTTP listener.

Installed, a node with ``http.listeners`` serves the console at
``/console/`` (and ``/`` redirects there): brokers, the controller quorum,
topics, groups, transactions, reassignments and throughput, read through
the node's :class:`josef.services.BrokerServices` only.
"""

from __future__ import annotations

import josef
from josef.hookspecs import Register
from josef_console.configs import CONFIG_KEYS

#: The plugin API versions this plugin works with: register_http_routes, BrokerServices.metrics and .is_broker (1.5).
JOSEF_PLUGIN_API = ">=1.5,<2"

#: Where the console is mounted on the HTTP listener: ``/console/``.
NAME = "console"


@josef.hookimpl
def register_http_routes(register: Register) -> None:
    from josef_console.app import console_app

    register(NAME, console_app)


@josef.hookimpl
def register_configs(register: Register) -> None:
    for key in CONFIG_KEYS:
        register(key)
