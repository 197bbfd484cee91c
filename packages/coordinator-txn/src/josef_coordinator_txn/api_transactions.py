"""AddPartitionsToTxn (v0-v5), AddOffsetsToTxn (v0-v4) and EndTxn (v0-v5): a producer's transaction.

AddPartitionsToTxn v0-v3 come from clients, one transaction each. v4+ come
from brokers (KIP-890), several transactions per request: ``verify_only``
asks whether the partitions are already in the transaction (a partition
leader checks before it appends a transactional batch), while v5+ without
``verify_only`` add them (a Transactions V2 producer's first write to a
partition, Produce v12+, which the leader passes on). A transaction naming a
partition the metadata does not know fails as a whole: that partition is
answered UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED.
So does a client's (v0-v3) partition of an internal topic, which Kafka never
lets a client write: TOPIC_AUTHORIZATION_FAILED (offsets join a transaction
through AddOffsetsToTxn).

AddOffsetsToTxn adds the ``__consumer_offsets`` partition of the group, the
one ``TxnOffsetCommit`` then writes to, found as the group coordinator finds
it. EndTxn v5+ is Transactions V2: the epoch is bumped with every end and
the answer carries the producer id and epoch to go on with.

Clients before v2 of these APIs are told INVALID_PRODUCER_EPOCH where newer
ones are told PRODUCER_FENCED (KIP-588).
"""

from __future__ import annotations

from typing import Any, Iterable

import anyio
from kio.schema.errors import ErrorCode

from josef.coordinator.hashing import partition_for
from josef.server.dispatch import RequestContext
from josef_coordinator_txn import transactions
from josef_coordinator_txn.api_common import older_fenced, on_shard
from josef_coordinator_txn.metadata import TV_2

E = ErrorCode
PartitionErrors = dict[tuple[str, int], ErrorCode]
#: The first version of these APIs that may be answered PRODUCER_FENCED.
PRODUCER_FENCED_VERSION = 2
#: AddPartitionsToTxn from this version on is batched and sent by brokers.
BROKER_VERSION = 4
#: AddPartitionsToTxn from this version on adds partitions for Transactions V2 producers.
V2_ADD_VERSION = 5
#: EndTxn from this version on is Transactions V2.
V2_END_VERSION = 5
OFFSETS_TOPIC = "__consumer_offsets"
#: Kafka's default of ``offsets.topic.num.partitions``, for a broker without the group coordinator's keys.
DEFAULT_OFFSETS_PARTITIONS = 50
#: Kafka's internal topics (``Topic.isInternal``): never written by clients themselves.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, "__transaction_state", "__share_group_state"})


def _topic_results(errors: PartitionErrors) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), error in sorted(errors.items()):
        by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": error})
    return [{"name": topic, "results_by_partition": results} for topic, results in by_topic.items()]


def _partitions(topics: Iterable[Any]) -> frozenset[tuple[str, int]]:
    return frozenset((t.name, int(p)) for t in topics for p in t.partitions)


async def _add(ctx: RequestContext, transactional_id: str, producer_id: int, epoch: int,
               partitions: frozenset[tuple[str, int]], *, verify_only: bool, client_transaction_version: int
               ) -> PartitionErrors:
    image = ctx.services.image
    refused: PartitionErrors = {}
    for tp in partitions:
        if ctx.api_version < BROKER_VERSION and tp[0] in INTERNAL_TOPICS:
            refused[tp] = E.topic_authorization_failed
        elif tp[0] not in image.topics or tp[1] not in image.topics[tp[0]].partitions:
            refused[tp] = E.unknown_topic_or_partition
    if refused:
        return {tp: refused.get(tp, E.operation_not_attempted) for tp in partitions}
    if transactional_id == "":
        return dict.fromkeys(partitions, E.invalid_request)
    if verify_only:
        async def verify(shard: Any) -> PartitionErrors:
            return transactions.verify_partitions(shard, transactional_id, producer_id, epoch, partitions)

        error, verified = await on_shard(ctx, transactional_id, verify)
        return verified if verified is not None else dict.fromkeys(partitions, error)
    error, _ = await on_shard(ctx, transactional_id, lambda shard: transactions.add_partitions(
        shard, transactional_id, producer_id, epoch, partitions, client_transaction_version))
    return dict.fromkeys(partitions, older_fenced(error, ctx.api_version, PRODUCER_FENCED_VERSION))


async def add_partitions_to_txn(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if ctx.api_version < BROKER_VERSION:
        errors = await _add(ctx, request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                            request.v3_and_below_producer_epoch, _partitions(request.v3_and_below_topics),
                            verify_only=False, client_transaction_version=0)
        return {"throttle_time": 0, "results_by_topic_v3_and_below": _topic_results(errors)}
    client_version = TV_2 if ctx.api_version >= V2_ADD_VERSION else 0
    results: list[dict[str, Any]] = [{} for _ in request.transactions]

    async def one(index: int, transaction: Any) -> None:
        errors = await _add(ctx, transaction.transactional_id, transaction.producer_id, transaction.producer_epoch,
                            _partitions(transaction.topics), verify_only=transaction.verify_only,
                            client_transaction_version=client_version)
        results[index] = {"transactional_id": transaction.transactional_id, "topic_results": _topic_results(errors)}

    async with anyio.create_task_group() as tg:
        for index, transaction in enumerate(request.transactions):
            tg.start_soon(one, index, transaction)
    return {"throttle_time": 0, "error_code": E.none, "results_by_transaction": results}


def offsets_partition(ctx: RequestContext, group_id: str) -> int:
    """The ``__consumer_offsets`` partition of ``group_id``: the topic's own count once it exists, else the setting."""
    topic = ctx.services.image.topics.get(OFFSETS_TOPIC)
    if topic is not None and topic.partitions:
        count = len(topic.partitions)
    elif "offsets.topic.num.partitions" in ctx.services.config.definition:
        count = ctx.services.config["offsets.topic.num.partitions"]
    else:
        count = DEFAULT_OFFSETS_PARTITIONS
    return partition_for(group_id, count)


async def add_offsets_to_txn(ctx: RequestContext, request: Any) -> dict[str, Any]:
    transactional_id = request.transactional_id
    partition = (OFFSETS_TOPIC, offsets_partition(ctx, request.group_id))
    if transactional_id == "":
        error = E.invalid_request
    else:
        error, _ = await on_shard(ctx, transactional_id, lambda shard: transactions.add_partitions(
            shard, transactional_id, request.producer_id, request.producer_epoch, frozenset({partition}), 0))
    return {"throttle_time": 0, "error_code": older_fenced(error, ctx.api_version, PRODUCER_FENCED_VERSION)}


async def end_txn(ctx: RequestContext, request: Any) -> dict[str, Any]:
    transactional_id = request.transactional_id
    producer = transactions.NO_PRODUCER
    if transactional_id == "":
        error = E.invalid_request
    else:
        client_version = TV_2 if ctx.api_version >= V2_END_VERSION else 0
        error, result = await on_shard(ctx, transactional_id, lambda shard: transactions.end_transaction(
            shard, transactional_id, request.producer_id, request.producer_epoch, commit=request.committed,
            from_client=True, client_transaction_version=client_version))
        producer = result or producer
    return {"throttle_time": 0, "error_code": older_fenced(error, ctx.api_version, PRODUCER_FENCED_VERSION),
            "producer_id": producer[0], "producer_epoch": producer[1]}
