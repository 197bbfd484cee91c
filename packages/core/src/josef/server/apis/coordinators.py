"""FindCoordinator (v0-v6): which broker coordinates a group id or transactional id (v4+: several at once).

v5 only allows TRANSACTION_ABORTABLE for transactional keys and v6 only adds
key type 2, share groups (KIP-932): both answer groups as v4 does.
"""

from __future__ import annotations

import base64
from typing import Any

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.server.dispatch import RequestContext

#: FindCoordinator key type of share groups (KIP-932), only valid from v6 on.
SHARE_KEY_TYPE = 2
SHARE_MIN_VERSION = 6


def _missing_coordinator(key_type: int, api_version: int) -> tuple[ErrorCode, str]:
    """The error for a key type no installed coordinator answers, as Kafka's ``KafkaApis.getCoordinator`` picks it.

    Share keys (KIP-932) exist from v6 on: before, Kafka answers them
    INVALID_REQUEST like any key type it does not know. From v6 on a share key
    is a valid question this broker cannot answer yet: Kafka answers
    COORDINATOR_NOT_AVAILABLE when its share coordinator is not running, and
    so does josef, which has none. That error is retriable, so a share client
    keeps looking until its timeout instead of failing on a request it was
    right to send. With a share coordinator installed (josef-coordinator-share),
    a share key must be ``groupId:topicId:partition`` and asked at v6+.
    """
    if key_type == SHARE_KEY_TYPE and api_version >= SHARE_MIN_VERSION:
        return ErrorCode.coordinator_not_available, "share groups have no coordinator on this broker"
    return ErrorCode.invalid_request, f"no coordinator for key type {key_type} is installed"


def _share_key_error(key: str, api_version: int) -> str | None:
    """Why a share key is not one (Kafka's SharePartitionKey.validate): ``groupId:topicId:partition``, v6+ only."""
    if api_version < SHARE_MIN_VERSION:
        return f"share keys need FindCoordinator v{SHARE_MIN_VERSION}"
    group_id, _, rest = key.rpartition(":")
    group_id, _, topic_id = group_id.rpartition(":")
    try:
        if not group_id or int(rest) < 0 or len(base64.urlsafe_b64decode(topic_id + "==")) != 16:
            raise ValueError(key)
    except ValueError:
        return f"invalid share coordinator key {key!r}: expected groupId:topicId:partition"
    return None


async def _find(ctx: RequestContext, key: str, key_type: int) -> dict[str, Any]:
    answer: dict[str, Any] = {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": ErrorCode.none,
                              "error_message": None}
    runtime = ctx.broker.coordinators
    coordinator = runtime.by_key_type(key_type)
    if coordinator is None:
        code, message = _missing_coordinator(key_type, ctx.api_version)
        answer.update(error_code=code, error_message=message)
        return answer
    if key_type == SHARE_KEY_TYPE and (error := _share_key_error(key, ctx.api_version)) is not None:
        answer.update(error_code=ErrorCode.invalid_request, error_message=error)
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
