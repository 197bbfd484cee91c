"""DescribeProducers (KIP-664): the producers a partition remembers and their open transactions, for finding hanging ones.

Answered from each hosted partition's producer state, as Kafka's
``ReplicaManager.activeProducerState`` does: any replica with the log can
answer, so there is no leader check, only the partition's existence here.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.replication.partition import PartitionError
from josef.producer.producer_state import ProducerEntry
from josef.server.apis.common import partition_for
from josef.server.dispatch import RequestContext

def _producer(entry: ProducerEntry) -> dict[str, Any]:
    return {
        "producer_id": entry.producer_id,
        "producer_epoch": entry.epoch,
        "last_sequence": entry.last_seq,
        "last_timestamp": entry.last_timestamp,
        # Only transactions set these: the epoch of the coordinator that wrote the last marker, the open transaction.
        "coordinator_epoch": entry.coordinator_epoch,
        "current_txn_start_offset": entry.current_txn_first_offset,
    }


def _partition(ctx: RequestContext, topic: str, index: int) -> dict[str, Any]:
    try:
        partition = partition_for(ctx, topic, index)
    except PartitionError as exc:
        return {"partition_index": index, "error_code": exc.code, "error_message": exc.message,
                "active_producers": ()}
    # A snapshot is immutable, so appends going on meanwhile cannot change what is answered halfway.
    producers = sorted(partition.producers.snapshot(), key=lambda e: e.producer_id)
    return {"partition_index": index, "error_code": ErrorCode.none, "error_message": None,
            "active_producers": [_producer(e) for e in producers]}


async def describe_producers(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "topics": [{"name": topic.name, "partitions": [_partition(ctx, topic.name, i) for i in topic.partition_indexes]}
                   for topic in request.topics],
    }
