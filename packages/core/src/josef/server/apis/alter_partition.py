"""AlterPartition (KIP-497): a partition leader asks the active controller to change its ISR.

Answered on controller listeners and in-process, as BrokerHeartbeat. v2
names topics by id; v3 gives each ISR member's broker epoch (KIP-903) so a
replica that restarted since it caught up is refused (INELIGIBLE_REPLICA).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError, IsrChange
from josef.server.apis.common import id_text
from josef.server.dispatch import RequestContext


def _new_isr(partition: Any) -> tuple[tuple[int, int], ...]:
    if hasattr(partition, "new_isr_with_epochs"):
        return tuple((b.broker_id, b.broker_epoch) for b in partition.new_isr_with_epochs)
    return tuple((b, -1) for b in partition.new_isr)


async def alter_partition(ctx: RequestContext, request: Any) -> dict[str, Any]:
    changes = [IsrChange(id_text(topic.topic_id), p.partition_index, p.leader_epoch, p.partition_epoch,
                         _new_isr(p), p.leader_recovery_state)
               for topic in request.topics for p in topic.partitions]
    try:
        results = await ctx.broker.controller.alter_partition(request.broker_id, request.broker_epoch, changes)
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "topics": []}
    answers = iter(zip(changes, results))
    topics = []
    for topic in request.topics:
        partitions = []
        for _ in topic.partitions:
            change, result = next(answers)
            answer: dict[str, Any] = {"partition_index": change.partition, "error_code": result.error,
                                      "leader_id": -1, "leader_epoch": -1, "isr": [], "leader_recovery_state": 0,
                                      "partition_epoch": -1}
            if result.partition is not None:
                p = result.partition
                answer.update(leader_id=p.leader, leader_epoch=p.leader_epoch, isr=list(p.isr),
                              leader_recovery_state=p.leader_recovery_state, partition_epoch=p.partition_epoch)
            partitions.append(answer)
        topics.append({"topic_id": topic.topic_id, "partitions": partitions})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "topics": topics}
