"""The core's coordinator contract suite (:mod:`josef.testing.coordinator`) run against the transaction coordinator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing.coordinator import ContractServices, CoordinatorContract, RecordingContext
from josef_coordinator_txn.coordinator import TransactionCoordinator
from josef_coordinator_txn.shard import EXPIRE_IDS_TIMER, TransactionShard

WEEK_MS = 7 * 24 * 3600 * 1000


class TransactionHarness:
    """Three transactional ids through InitProducerId, one with a transaction open on two partitions
    (AddPartitionsToTxn), one expired by the shard's expiration timer (a tombstone); ``transaction.version`` 2,
    whose records keep the previous and next producer ids."""

    name = "transaction"

    def config_keys(self) -> Mapping[str, str]:
        return {"transaction.state.log.num.partitions": "1", "transactional.id.expiration.ms": str(WEEK_MS)}

    async def scenario(self, coordinator: TransactionCoordinator, context: RecordingContext,
                       services: ContractServices) -> None:
        services.add_topic("orders", 2)
        services.set_feature("transaction.version", 2)
        await self._init(services, "tx-idle")
        services.clock.now += WEEK_MS + 1
        producer_id, epoch = await self._init(services, "tx-open")
        await self._init(services, "tx-empty")
        added = await services.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": "tx-open", "v3_and_below_producer_id": producer_id,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": "orders", "partitions": [0, 1]}]})
        assert {p.partition_error_code for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition} == {ErrorCode.none}
        await context.fire(EXPIRE_IDS_TIMER)  # forgets tx-idle, untouched for longer than the expiration
        assert [entry.value for entry in context.log][-1] is None, "the expiration wrote no tombstone"

    @staticmethod
    async def _init(services: ContractServices, transactional_id: str) -> tuple[int, int]:
        answer = await services.call(ApiKey.INIT_PRODUCER_ID, 4, {
            "transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": -1,
            "producer_epoch": -1})
        assert answer.error_code == ErrorCode.none, answer
        return answer.producer_id, answer.producer_epoch

    def state(self, shard: TransactionShard) -> Any:
        """Each id as it is stored (the last producer epoch is not, as in Kafka: a load cannot restore it)."""
        return {transactional_id: (m.producer_id, m.producer_epoch, m.previous_producer_id, m.next_producer_id,
                                   m.timeout_ms, m.last_update_ms, m.state.name, sorted(m.partitions), m.start_ms,
                                   m.client_transaction_version, m.pending)
                for transactional_id, m in shard.transactions.items()}

    def read(self, shard: TransactionShard, at: int) -> Any:
        """What DescribeTransactions and ListTransactions answer from: the committed state of each id."""
        return {m.transactional_id: (m.producer_id, m.producer_epoch, m.state.name, sorted(m.partitions))
                for m in shard.committed_transactions()}

    def request(self, api_key: int, version: int) -> Mapping[str, Any] | None:
        return None


class TestTransactionCoordinatorContract(CoordinatorContract):
    @pytest.fixture
    def coordinator_harness(self) -> TransactionHarness:
        return TransactionHarness()
