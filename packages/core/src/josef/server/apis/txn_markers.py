"""WriteTxnMarkers (API 27): the transaction coordinator ends a transaction in the partitions this broker leads.

Every broker answers it, with or without the transaction plugin: the
coordinator of a transaction sends it to the leader of each partition the
transaction wrote to, which appends a COMMIT or ABORT marker (a control
batch) as leader, checked against the producer's state
(:meth:`josef.replication.partition.Partition.append_marker`), and answers once the ISR
has it, as Kafka appends markers with acks=all. A marker in a coordinator's
internal partition (``__consumer_offsets``: offsets committed in a
transaction) is then applied to the coordinator's state through the
coordinator runtime.

The answer waits (a :class:`~josef.server.dispatch.Later`), so the
coordinator's connection carries the markers of other transactions
meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from josef.server.apis.common import error_of, partition_for
from josef.server.apis.produce import await_replication
from josef.server.dispatch import Later, RequestContext


async def write_txn_markers(ctx: RequestContext, request: Any) -> Later:
    replicas = ctx.broker.replicas
    answers = []
    waiting = []  # (partition, marker offset, result), as Produce's acks=all waits
    applied = []  # (partition, producer id, commit, marker offset, result): internal partitions' shards
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                result: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none}
                partitions.append(result)
                try:
                    partition = partition_for(ctx, topic.name, index)
                    info = partition.append_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                                   marker.transaction_result)
                except Exception as exc:
                    result["error_code"], _ = error_of(exc)
                    continue
                replicas.appended(partition.tp)
                waiting.append((partition, info.last_offset, result))
                applied.append((partition, marker.producer_id, marker.transaction_result, info.last_offset, result))
            topics.append({"name": topic.name, "partitions": partitions})
        answers.append({"producer_id": marker.producer_id, "topics": topics})
    epochs = {id(partition): partition.leader_epoch for partition, _, _ in waiting}
    deadline = time.monotonic() + ctx.broker.config["request.timeout.ms"] / 1000

    async def answer() -> dict[str, Any]:
        await await_replication(ctx, waiting, epochs, deadline)
        for partition, producer_id, commit, offset, result in applied:
            if result["error_code"] == ErrorCode.none:
                await ctx.broker.coordinators.complete_transaction(partition.tp, producer_id, commit, offset)
        return {"throttle_time": 0, "markers": answers}

    return Later(answer())
