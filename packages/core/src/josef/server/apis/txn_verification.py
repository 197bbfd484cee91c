"""Transaction verification of a produce (KIP-890 part 1): is this partition really in the producer's transaction?

A transactional producer that writes to a partition it did not add to its
transaction (a bug, or a retry landing after its transaction was aborted)
would open a transaction the coordinator never ends: a *hanging*
transaction, which holds the last stable offset, and so every
``read_committed`` consumer, back forever. So before a partition leader
appends the first transactional batch of a producer that has no open
transaction in that partition, it asks the transaction coordinator with the
brokers' form of AddPartitionsToTxn (v4+, ``verify_only``), batching the
request's partitions into one call, as Kafka's ``AddPartitionsToTxnManager``
does. Clients of Transactions V2 (Produce v12+) do not add partitions
themselves: for them the leader asks the coordinator to add it
(``verify_only`` false).

A marker written while the question is out (the coordinator aborting the
transaction) invalidates the answer: the partition hands out a guard before
asking and refuses the append if a marker came in between (Kafka's
VerificationGuard).

Errors are translated as Kafka does for the clients of each version:
retriable coordinator errors become NOT_ENOUGH_REPLICAS (retried without a
metadata refresh), PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH, and
TRANSACTION_ABORTABLE becomes INVALID_TXN_STATE for clients before V2.
``transaction.partition.verification.enable=false`` turns this off.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from josef.partition import Partition, PartitionError
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef.protocol.records import HEADER_SIZE, BatchHeader
from josef.server.apis.common import partition_for, topic_name
from josef.server.dispatch import RequestContext

log = logging.getLogger(__name__)

#: FindCoordinator's key type of transactional ids.
TRANSACTION_KEY_TYPE = 1
#: From this Produce version on, clients use Transactions V2 and the leader adds the partition itself.
ADD_PARTITION_VERSION = 12
_RETRIABLE = frozenset({ErrorCode.concurrent_transactions, ErrorCode.network_exception,
                        ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                        ErrorCode.not_coordinator})

#: What verification gave each partition: the guard to append with, or the error to answer.
Verdict = object | ErrorCode


async def verify_partitions(ctx: RequestContext, request: Any) -> dict[tuple[str, int], Verdict]:
    """Verdicts for the partitions of a transactional produce that need one; others are absent."""
    if not request.transactional_id or not ctx.broker.config["transaction.partition.verification.enable"]:
        return {}
    unverified: dict[tuple[str, int], Partition] = {}
    producer = None
    for topic in request.topic_data:
        name = topic_name(ctx, topic)
        for data in topic.partition_data:
            records = data.records
            if name is None or not records or len(records) < HEADER_SIZE:
                continue
            header = BatchHeader.parse(records)
            if not header.is_transactional or header.producer_id < 0:
                continue
            try:
                partition = partition_for(ctx, name, data.index)
            except PartitionError:
                continue  # the append answers it
            if not partition.in_transaction(header.producer_id, header.producer_epoch):
                unverified[(name, data.index)] = partition
                producer = (header.producer_id, header.producer_epoch)
    if producer is None:
        return {}
    guards = {key: partition.start_verification(producer[0]) for key, partition in unverified.items()}
    add = ctx.api_version >= ADD_PARTITION_VERSION
    errors = await _ask_coordinator(ctx, request.transactional_id, *producer, list(unverified), add)
    return {key: _client_error(errors[key], add) if key in errors else guards[key] for key in unverified}


async def _ask_coordinator(ctx: RequestContext, transactional_id: str, producer_id: int, producer_epoch: int,
                           partitions: list[tuple[str, int]], add: bool) -> dict[tuple[str, int], ErrorCode]:
    """The partitions the coordinator did not confirm, with why."""
    runtime = ctx.broker.coordinators
    coordinator = runtime.by_key_type(TRANSACTION_KEY_TYPE)
    node = runtime.leader_of(coordinator, transactional_id) if coordinator is not None else -1
    if node < 0:
        return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
    topics: dict[str, list[int]] = {}
    for name, index in partitions:
        topics.setdefault(name, []).append(index)
    try:
        response = await ctx.broker.peers.call(node, ApiKey.ADD_PARTITIONS_TO_TXN, {"transactions": [{
            "transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": producer_epoch,
            "verify_only": not add, "topics": [{"name": n, "partitions": p} for n, p in topics.items()]}]})
    except (KafkaConnectionError, KafkaTimeoutError) as exc:
        log.warning("verifying %s in transaction %r with broker %d failed: %s", partitions, transactional_id, node, exc)
        return dict.fromkeys(partitions, ErrorCode.network_exception)
    if response.error_code != ErrorCode.none:
        return dict.fromkeys(partitions, response.error_code)
    return {(topic.name, result.partition_index): result.partition_error_code
            for txn in response.results_by_transaction for topic in txn.topic_results
            for result in topic.results_by_partition if result.partition_error_code != ErrorCode.none}


def _client_error(code: ErrorCode, add: bool) -> ErrorCode:
    if code in _RETRIABLE:
        return ErrorCode.not_enough_replicas
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if code == ErrorCode.transaction_abortable and not add:
        return ErrorCode.invalid_txn_state
    return code
