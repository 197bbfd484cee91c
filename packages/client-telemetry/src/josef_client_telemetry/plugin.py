"""The entry point (``client-telemetry = josef_client_telemetry.plugin``): client metrics to Prometheus.

Installing this distribution registers the ``prometheus`` client telemetry
receiver: every broker then advertises GetTelemetrySubscriptions and
PushTelemetry, asks clients for all their metrics every
:data:`~josef_client_telemetry.receiver.PUSH_INTERVAL_MS`, and exports what
they push on its ``/metrics`` endpoint. The hook takes no configuration
today, so what is asked for and how often are the receiver's defaults
(constants of :mod:`josef_client_telemetry.receiver`).
"""

from __future__ import annotations

import josef
from josef.hookspecs import Register
from josef_client_telemetry.receiver import PrometheusTelemetryReceiver

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.5,<2"


@josef.hookimpl
def register_client_telemetry(register: Register) -> None:
    register("prometheus", PrometheusTelemetryReceiver)
