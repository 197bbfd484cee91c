"""Fetch: whole batches below the high watermark, with long polling on max_wait_ms/min_bytes.

Sessions (KIP-227) are answered with session id 0, which tells clients to
keep sending full fetch requests; that is always allowed by the protocol.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from josef.partition import Partition
from josef.server.apis.common import error_of, partition_for, topic_name
from josef.server.dispatch import RequestContext


async def fetch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    deadline = time.monotonic() + request.max_wait.total_seconds()
    min_bytes = request.min_bytes
    max_bytes = getattr(request, "max_bytes", 2**31 - 1)
    wanted = []  # (topic entry, partition request, name)
    for topic in request.topics:
        name = topic_name(ctx, topic)
        for part in topic.partitions:
            wanted.append((topic, part, name))
    while True:
        responses, total, tps = _read_all(ctx, wanted, max_bytes)
        remaining = deadline - time.monotonic()
        if total >= min_bytes or remaining <= 0 or not tps or any(
            p["error_code"] for t in responses for p in t["partitions"]
        ):
            break
        await ctx.broker.replicas.wait_for_data(tps, int(remaining * 1000))
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}


def _read_all(ctx: RequestContext, wanted: list[tuple[Any, Any, str | None]],
              max_bytes: int) -> tuple[list[dict[str, Any]], int, list[Any]]:
    total = 0
    by_topic: dict[int, dict[str, Any]] = {}
    tps = []
    for topic, part, name in wanted:
        entry = by_topic.setdefault(id(topic), {"topic": name or "", "topic_id": getattr(topic, "topic_id", None),
                                                "partitions": []})
        result: dict[str, Any] = {"partition_index": part.partition, "error_code": ErrorCode.none,
                                  "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                                  "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}
        entry["partitions"].append(result)
        partition: Partition | None = None
        try:
            partition = partition_for(ctx, name, part.partition)
            partition.require_leader()
            partition.check_leader_epoch(getattr(part, "current_leader_epoch", -1))
            limit = min(part.partition_max_bytes, max(max_bytes - total, 0))
            records = partition.read(part.fetch_offset, limit, min_one_batch=total == 0) if limit or total == 0 else b""
        except Exception as exc:
            result["error_code"], _ = error_of(exc)
            if partition is not None and result["error_code"] == ErrorCode.offset_out_of_range:
                result["high_watermark"] = partition.high_watermark
                result["log_start_offset"] = partition.log.log_start_offset
            continue
        tps.append(partition.tp)
        total += len(records)
        result.update(records=records, high_watermark=partition.high_watermark,
                      last_stable_offset=partition.high_watermark, log_start_offset=partition.log.log_start_offset)
    return list(by_topic.values()), total, tps
