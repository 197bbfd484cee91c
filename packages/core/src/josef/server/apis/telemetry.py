"""GetTelemetrySubscriptions (v0) and PushTelemetry (v0): client metrics for the installed receivers (KIP-714).

:class:`josef.telemetry.ClientTelemetry` decides, from the client's
connection (its client id, software, address and port, as Kafka's
ClientMetricsManager reads them from the request context) and the
client-metrics resources of the metadata image.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from josef.protocol.error_responses import error_response
from josef.server.dispatch import RequestContext
from josef.telemetry import ACCEPTED_COMPRESSION, TelemetryError


async def get_telemetry_subscriptions(ctx: RequestContext, request: Any) -> Any:
    telemetry = ctx.broker.telemetry
    try:
        instance_id, subscription = telemetry.subscribe(ctx.broker.image, ctx.session, ctx.client_id,
                                                        request.client_instance_id)
    except TelemetryError as exc:
        return error_response(ctx.api_key, ctx.api_version, request, exc.code, str(exc))
    return {
        "throttle_time": 0, "error_code": ErrorCode.none,
        "client_instance_id": instance_id,
        "subscription_id": subscription.subscription_id,
        "accepted_compression_types": [int(c) for c in ACCEPTED_COMPRESSION],
        "push_interval": datetime.timedelta(milliseconds=subscription.push_interval_ms),
        "telemetry_max_bytes": telemetry.max_bytes,
        "delta_temporality": True,
        "requested_metrics": list(subscription.requested_metrics),
    }


async def push_telemetry(ctx: RequestContext, request: Any) -> Any:
    try:
        ctx.broker.telemetry.push(ctx.broker.image, ctx.session, ctx.client_id, request)
    except TelemetryError as exc:
        return error_response(ctx.api_key, ctx.api_version, request, exc.code, str(exc))
    return {"throttle_time": 0, "error_code": ErrorCode.none}
