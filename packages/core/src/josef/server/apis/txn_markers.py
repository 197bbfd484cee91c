"""WriteTxnMarkers (API 27): the transaction coordinator ends a transaction in the partitions this broker leads.

Every broker answers it, with or without the transaction plugin: the
coordinator of a transaction sends it to the leader of each partition the
transaction wrote to, which appends a COMMIT or ABORT marker (a control
batch) as leader, checked against the producer's state
(:meth:`josef.replication.partition.Partition.append_marker`), and answers once the ISR
has it, as Kafka appends markers with acks=all. A marker in a coordinator's
internal partition (``__consumer_offsets``: offsets committed in a
transaction) is written through the coordinator runtime instead
(:meth:`josef.coordinator.runtime.CoordinatorRuntime.write_marker`), which
applies it to the shard as it writes it; a partition whose shard is loading
answers NOT_LEADER_OR_FOLLOWER, so the coordinator retries, as in Kafka.

The answer waits (a :class:`~josef.server.dispatch.Later`), so the
coordinator's connection carries the markers of other transactions
meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, PendingWrite
from josef.server.apis.common import error_of, partition_for
from josef.server.apis.produce import await_replication
from josef.server.dispatch import Later, RequestContext


async def write_txn_markers(ctx: RequestContext, request: Any) -> Later:
    replicas = ctx.broker.replicas
    answers = []
    waiting = []  # (partition, marker offset, result), as Produce's acks=all waits
    coordinated: list[tuple[PendingWrite, dict[str, Any]]] = []  # markers of coordinators' internal partitions
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                result: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none}
                partitions.append(result)
                try:
                    partition = partition_for(ctx, topic.name, index)
                    pending = ctx.broker.coordinators.write_marker(
                        partition, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                        marker.transaction_result)
                    if pending is not None:
                        coordinated.append((pending, result))
                        continue
                    info = partition.append_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                                   marker.transaction_result)
                except CoordinatorError as exc:
                    result["error_code"] = _marker_error(exc)
                    continue
                except Exception as exc:
                    result["error_code"], _ = error_of(exc)
                    continue
                replicas.appended(partition.tp)
                waiting.append((partition, info.last_offset, result))
            topics.append({"name": topic.name, "partitions": partitions})
        answers.append({"producer_id": marker.producer_id, "topics": topics})
    epochs = {id(partition): partition.leader_epoch for partition, _, _ in waiting}
    deadline = time.monotonic() + ctx.broker.config["request.timeout.ms"] / 1000

    async def answer() -> dict[str, Any]:
        await await_replication(ctx, waiting, epochs, deadline)
        for pending, result in coordinated:
            with anyio.move_on_after(max(deadline - time.monotonic(), 0)):
                try:
                    await pending.wait()
                except CoordinatorError as exc:
                    result["error_code"] = _marker_error(exc)
            if not pending.done:
                result["error_code"] = ErrorCode.request_timed_out
        return {"throttle_time": 0, "markers": answers}

    return Later(answer())


def _marker_error(exc: CoordinatorError) -> ErrorCode:
    """A coordinator's partition that cannot take the marker now: NOT_LEADER_OR_FOLLOWER, so it is retried (Kafka's mapping)."""
    if exc.code in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                    ErrorCode.coordinator_not_available):
        return ErrorCode.not_enough_replicas_after_append \
            if exc.cause == ErrorCode.not_enough_replicas_after_append else ErrorCode.not_leader_or_follower
    return exc.cause
