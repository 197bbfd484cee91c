"""DescribeTransactions (v0) and ListTransactions (v0-v2): what ``kafka-transactions.sh`` shows.

Each broker answers for the transactional ids it coordinates (the admin
client asks every broker to list, and each id's coordinator to describe).
ListTransactions filters by state names (unknown names are returned in
``unknown_state_filters``), producer ids, v1's duration (transactions
running for longer than that many milliseconds) and v2's transactional id
pattern (KIP-1152, matched against the whole id). Ids being expired (Dead)
are never shown, and neither are ids whose first record is not committed yet:
what is shown is the committed state of each id (a transition in flight
shows once its record is committed).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.server.dispatch import RequestContext
from josef_coordinator_txn.api_common import coordinator_of, on_shard
from josef_coordinator_txn.metadata import TransactionMetadata, TransactionState

if TYPE_CHECKING:
    from josef_coordinator_txn.shard import TransactionShard

E = ErrorCode


async def describe_transactions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {"throttle_time": 0,
            "transaction_states": [await _describe(ctx, transactional_id) for transactional_id in request.transactional_ids]}


async def _describe(ctx: RequestContext, transactional_id: str) -> dict[str, Any]:
    # An error leaves the other fields at the schema's defaults, as Kafka's answer does.
    answer: dict[str, Any] = {"error_code": E.none, "transactional_id": transactional_id, "transaction_state": "",
                              "transaction_timeout": 0, "transaction_start_time": 0, "producer_id": 0,
                              "producer_epoch": 0, "topics": []}
    if transactional_id == "":
        answer["error_code"] = E.invalid_request
        return answer

    async def find(shard: TransactionShard) -> TransactionMetadata | None:
        return shard.transaction(transactional_id)

    error, metadata = await on_shard(ctx, transactional_id, find)
    if error == E.none and (metadata is None or metadata.state == TransactionState.DEAD or not metadata.persisted):
        error = E.transactional_id_not_found
    if error != E.none or metadata is None:
        answer["error_code"] = error
        return answer
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(metadata.partitions):
        topics.setdefault(topic, []).append(partition)
    answer.update(transaction_state=metadata.state.kafka_name, transaction_timeout=metadata.timeout_ms,
                  transaction_start_time=metadata.start_ms, producer_id=metadata.producer_id,
                  producer_epoch=metadata.producer_epoch,
                  topics=[{"topic": t, "partitions": p} for t, p in topics.items()])
    return answer


async def list_transactions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": E.none, "unknown_state_filters": [],
                              "transaction_states": []}
    coordinator = coordinator_of(ctx)
    if coordinator.loading():
        answer["error_code"] = E.coordinator_load_in_progress
        return answer
    states = set()
    for name in request.state_filters:
        state = TransactionState.from_name(name)
        if state is None:
            answer["unknown_state_filters"].append(name)
        else:
            states.add(state)
    producer_ids = set(request.producer_id_filters)
    duration_ms = getattr(request, "duration_filter", -1)
    pattern_text = getattr(request, "transactional_id_pattern", None)
    try:
        pattern = re.compile(pattern_text) if pattern_text else None
    except re.error:
        answer["error_code"] = E.invalid_regular_expression
        return answer
    now = clock.now_ms()
    for shard in coordinator.shards():
        for metadata in shard.committed_transactions():
            if (metadata.state == TransactionState.DEAD
                    or (producer_ids and metadata.producer_id not in producer_ids)
                    or (states and metadata.state not in states)
                    or (duration_ms >= 0 and now - metadata.start_ms <= duration_ms)
                    or (pattern is not None and not pattern.fullmatch(metadata.transactional_id))):
                continue
            answer["transaction_states"].append({"transactional_id": metadata.transactional_id,
                                                 "producer_id": metadata.producer_id,
                                                 "transaction_state": metadata.state.kafka_name})
    return answer
