"""ElectLeaders (KIP-183, KIP-460): preferred or unclean leader elections an admin asks the controller for.

Brokers forward it to the active controller, as Kafka's do. v0 knows only
preferred elections; v1 adds the election type and a top-level error.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.metadata.partition_changes import Election
from josef.server.dispatch import RequestContext

#: ElectLeaders' election types (Kafka's ElectionType).
ELECTION_TYPES = {0: Election.PREFERRED, 1: Election.UNCLEAN}


async def elect_leaders(ctx: RequestContext, request: Any) -> dict[str, Any]:
    election = ELECTION_TYPES.get(getattr(request, "election_type", 0))
    if election is None:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "replica_election_results": []}
    partitions = None if request.topic_partitions is None else [
        (topic.topic, index) for topic in request.topic_partitions for index in topic.partitions]
    try:
        results = await ctx.broker.controller.elect_leaders(election, partitions)
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "replica_election_results": []}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_topic.setdefault(result.topic, []).append(
            {"partition_id": result.partition, "error_code": result.error, "error_message": result.message})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "replica_election_results": [
        {"topic": topic, "partition_result": partitions} for topic, partitions in by_topic.items()]}
