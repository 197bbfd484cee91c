"""FindCoordinator: which broker coordinates a group id or transactional id (v4+: several at once)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.server.dispatch import RequestContext


async def _find(ctx: RequestContext, key: str, key_type: int) -> dict[str, Any]:
    answer: dict[str, Any] = {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": ErrorCode.none,
                              "error_message": None}
    runtime = ctx.broker.coordinators
    coordinator = runtime.by_key_type(key_type)
    if coordinator is None:
        answer.update(error_code=ErrorCode.invalid_request, error_message=f"no coordinator for key type {key_type} is installed")
        return answer
    try:
        await runtime.ensure_topic(coordinator)
    except CoordinatorError as exc:
        answer.update(error_code=exc.code, error_message=exc.message)
        return answer
    leader = runtime.leader_of(coordinator, key)
    broker = ctx.broker.image.brokers.get(leader)
    endpoint = broker.endpoint(ctx.listener_name) if broker is not None else None
    if endpoint is None:
        answer.update(error_code=ErrorCode.coordinator_not_available, error_message="the coordinator partition has no leader")
    else:
        answer.update(node_id=leader, host=endpoint.host, port=endpoint.port)
    return answer


async def find_coordinator(ctx: RequestContext, request: Any) -> dict[str, Any]:
    key_type = getattr(request, "key_type", 0)
    keys = getattr(request, "coordinator_keys", None)
    if keys is not None and ctx.api_version >= 4:
        return {"throttle_time": 0, "coordinators": [await _find(ctx, key, key_type) for key in keys]}
    answer = await _find(ctx, request.key, key_type)
    return {"throttle_time": 0, **answer}
