"""Produce: append whole batches to partition leaders; acks 0, 1 and all."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from josef.server.apis.common import error_of, partition_for, topic_name
from josef.server.dispatch import RequestContext

log = logging.getLogger(__name__)


async def produce(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
    acks = request.acks
    replicas = ctx.broker.replicas
    topics = []
    waiting = []  # (partition, offset the high watermark must pass, response dict)
    for topic in request.topic_data:
        name = topic_name(ctx, topic)
        partitions = []
        for data in topic.partition_data:
            result: dict[str, Any] = {"index": data.index, "error_code": ErrorCode.none, "base_offset": -1,
                                      "log_append_time": -1, "log_start_offset": -1, "record_errors": ()}
            partitions.append(result)
            if acks not in (0, 1, -1):
                result["error_code"] = ErrorCode.invalid_required_acks
                continue
            try:
                partition = partition_for(ctx, name, data.index)
                info, append_time = partition.append_as_leader(data.records or b"", acks)
            except Exception as exc:
                code, message = error_of(exc)
                log.debug("produce to %s-%s failed: %s", name, data.index, message)
                result["error_code"], result["error_message"] = code, message
                continue
            replicas.appended(partition.tp)
            result["base_offset"] = info.first_offset
            result["log_append_time"] = append_time
            result["log_start_offset"] = partition.log.log_start_offset
            if acks == -1 and partition.high_watermark <= info.last_offset:
                waiting.append((partition, info.last_offset, result))
        topics.append({"name": name or "", "topic_id": getattr(topic, "topic_id", None), "partition_responses": partitions})
    if acks == 0:
        return None
    if waiting:
        await _await_replication(ctx, waiting, request.timeout.total_seconds())
    return {"responses": topics, "throttle_time": 0}


async def _await_replication(ctx: RequestContext, waiting: list[tuple[Any, int, dict[str, Any]]], timeout_s: float) -> None:
    """acks=all: hold the response until the ISR has every appended batch, or time out."""
    with anyio.move_on_after(timeout_s):
        while waiting:
            waiting = [w for w in waiting if w[0].high_watermark <= w[1]]
            if waiting:
                await ctx.broker.replicas.purgatory.wait([w[0].tp for w in waiting], timeout_s)
    for _, _, result in waiting:
        result["error_code"] = ErrorCode.request_timed_out
