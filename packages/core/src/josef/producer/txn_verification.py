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

A coordinator writing in a producer's transaction (TxnOffsetCommit to
``__consumer_offsets``) is verified the same way, through
:func:`verify`: from TxnOffsetCommit v5 on (Transactions V2, no
AddOffsetsToTxn) that adds the offsets partition to the transaction.

Errors are translated as Kafka does for the clients of each version:
retriable coordinator errors become NOT_ENOUGH_REPLICAS (retried without a
metadata refresh), PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH, and
TRANSACTION_ABORTABLE becomes INVALID_TXN_STATE for clients before V2.
``transaction.partition.verification.enable=false`` turns this off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Hashable, Mapping

from kio.schema.errors import ErrorCode

from josef.replication.partition import Partition
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: FindCoordinator's key type of transactional ids.
TRANSACTION_KEY_TYPE = 1
_RETRIABLE = frozenset({ErrorCode.concurrent_transactions, ErrorCode.network_exception,
                        ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                        ErrorCode.not_coordinator})

#: What verification gave each partition: the guard to append with, or the error to answer.
Verdict = object | ErrorCode


async def verify(broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int,
                 partitions: Mapping[Hashable, Partition], add: bool) -> dict[Hashable, Verdict]:
    """Verdicts for the ``partitions`` (by any key) where the producer has no open transaction yet; others are absent.

    ``add``: the coordinator adds the partitions (Transactions V2) rather than only checking them.
    """
    if not broker.config["transaction.partition.verification.enable"]:
        return {}
    unverified = {key: p for key, p in partitions.items() if not p.in_transaction(producer_id, producer_epoch)}
    if not unverified:
        return {}
    guards = {key: partition.start_verification(producer_id) for key, partition in unverified.items()}
    errors = await _ask_coordinator(broker, transactional_id, producer_id, producer_epoch,
                                    {(p.tp.topic, p.tp.partition): key for key, p in unverified.items()}, add)
    return {key: _client_error(errors[key], add) if key in errors else guards[key] for key in unverified}


async def _ask_coordinator(broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int,
                           partitions: Mapping[tuple[str, int], Hashable], add: bool) -> dict[Hashable, ErrorCode]:
    """The partitions the coordinator did not confirm (by the caller's keys), with why."""
    runtime = broker.coordinators
    coordinator = runtime.by_key_type(TRANSACTION_KEY_TYPE)
    node = runtime.leader_of(coordinator, transactional_id) if coordinator is not None else -1
    if node < 0:
        return dict.fromkeys(partitions.values(), ErrorCode.coordinator_not_available)
    topics: dict[str, list[int]] = {}
    for name, index in partitions:
        topics.setdefault(name, []).append(index)
    try:
        response = await broker.peers.call(node, ApiKey.ADD_PARTITIONS_TO_TXN, {"transactions": [{
            "transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": producer_epoch,
            "verify_only": not add, "topics": [{"name": n, "partitions": p} for n, p in topics.items()]}]})
    except (KafkaConnectionError, KafkaTimeoutError) as exc:
        log.warning("verifying %s in transaction %r with broker %d failed: %s", partitions, transactional_id, node, exc)
        return dict.fromkeys(partitions.values(), ErrorCode.network_exception)
    if response.error_code != ErrorCode.none:
        return dict.fromkeys(partitions.values(), response.error_code)
    return {partitions[(topic.name, result.partition_index)]: result.partition_error_code
            for txn in response.results_by_transaction for topic in txn.topic_results
            for result in topic.results_by_partition
            if result.partition_error_code != ErrorCode.none and (topic.name, result.partition_index) in partitions}


def _client_error(code: ErrorCode, add: bool) -> ErrorCode:
    if code in _RETRIABLE:
        return ErrorCode.not_enough_replicas
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if code == ErrorCode.transaction_abortable and not add:
        return ErrorCode.invalid_txn_state
    return code
