"""DescribeClientQuotas (v0-v1) and AlterClientQuotas (v0-v1): client quotas kept in the metadata log."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata import client_quotas
from josef.server.dispatch import RequestContext


async def describe_client_quotas(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        components = client_quotas.check_filter(
            client_quotas.Component(c.entity_type, c.match_type, c.match) for c in request.components)
    except client_quotas.QuotaError as exc:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "error_message": str(exc), "entries": None}
    entries = [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
        for entity, values in sorted(ctx.broker.image.client_quotas.items(), key=lambda item: repr(item[0]))
        if client_quotas.matches(entity, components, request.strict)
    ]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}


async def alter_client_quotas(ctx: RequestContext, request: Any) -> dict[str, Any]:
    entries = [([(e.entity_type, e.entity_name) for e in entry.entity], [(o.key, o.value, o.remove) for o in entry.ops])
               for entry in request.entries]
    errors = await ctx.broker.controller.alter_client_quotas(entries, request.validate_only)
    return {"throttle_time": 0, "entries": [
        {"error_code": ErrorCode.none if error is None else ErrorCode.invalid_request, "error_message": error,
         "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]}
        for entry, error in zip(request.entries, errors)]}
