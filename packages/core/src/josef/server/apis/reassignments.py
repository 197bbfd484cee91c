"""AlterPartitionReassignments and ListPartitionReassignments (KIP-455): moving partitions between brokers.

Brokers forward both to the active controller, as Kafka's do. v1 of
AlterPartitionReassignments lets the client forbid a change of the
replication factor (KIP-860).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.server.dispatch import RequestContext


async def alter_partition_reassignments(ctx: RequestContext, request: Any) -> dict[str, Any]:
    targets = [(topic.name, p.partition_index, None if p.replicas is None else list(p.replicas))
               for topic in request.topics for p in topic.partitions]
    allow = getattr(request, "allow_replication_factor_change", True)
    base = {"throttle_time": 0, "allow_replication_factor_change": allow}
    try:
        results = await ctx.broker.controller.alter_partition_reassignments(targets, allow)
    except ControllerError as exc:
        return {**base, "error_code": exc.code, "error_message": exc.message, "responses": []}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_topic.setdefault(result.topic, []).append(
            {"partition_index": result.partition, "error_code": result.error, "error_message": result.message})
    return {**base, "error_code": ErrorCode.none, "error_message": None, "responses": [
        {"name": name, "partitions": partitions} for name, partitions in by_topic.items()]}


async def list_partition_reassignments(ctx: RequestContext, request: Any) -> dict[str, Any]:
    wanted = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
    try:
        found = ctx.broker.controller.list_partition_reassignments(wanted)
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "error_message": exc.message, "topics": []}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, index, p in found:
        by_topic.setdefault(name, []).append({"partition_index": index, "replicas": p.replicas,
                                              "adding_replicas": p.adding_replicas,
                                              "removing_replicas": p.removing_replicas})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "topics": [
        {"name": name, "partitions": partitions} for name, partitions in by_topic.items()]}
