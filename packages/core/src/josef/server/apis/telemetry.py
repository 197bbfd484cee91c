"""GetTelemetrySubscriptions (v0) and PushTelemetry (v0): client metrics for the installed receivers (KIP-714)."""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from josef.server.dispatch import RequestContext
from josef.telemetry import ACCEPTED_COMPRESSION, TelemetryError


async def get_telemetry_subscriptions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    telemetry = ctx.broker.telemetry
    subscription = telemetry.subscription
    return {
        "throttle_time": 0, "error_code": ErrorCode.none,
        "client_instance_id": telemetry.instance_id(request.client_instance_id),
        "subscription_id": subscription.subscription_id,
        "accepted_compression_types": [int(c) for c in ACCEPTED_COMPRESSION],
        "push_interval": datetime.timedelta(milliseconds=subscription.push_interval_ms),
        "telemetry_max_bytes": telemetry.max_bytes,
        "delta_temporality": True,
        "requested_metrics": list(subscription.requested_metrics),
    }


async def push_telemetry(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        ctx.broker.telemetry.push(request.client_instance_id, request.subscription_id, request.compression_type,
                                  bytes(request.metrics), request.terminating)
    except TelemetryError as exc:
        return {"throttle_time": 0, "error_code": exc.code}
    return {"throttle_time": 0, "error_code": ErrorCode.none}
