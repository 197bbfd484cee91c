"""The transaction coordinator as the core's coordinator runtime sees it: an internal topic, its APIs, its shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, ShardContext
from josef.protocol.api_keys import ApiKey
from josef_coordinator_txn import api_admin, api_producer, api_transactions
from josef_coordinator_txn.api_common import TRANSACTION_KEY_TYPE
from josef_coordinator_txn.configs import TxnSettings
from josef_coordinator_txn.markers import MarkerChannel
from josef_coordinator_txn.metrics import transaction_metrics
from josef_coordinator_txn.shard import TransactionShard
from josef_coordinator_txn.transactions import write_completion

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from josef.services import BrokerServices
    from josef.server.dispatch import Handler

TRANSACTION_STATE_TOPIC = "__transaction_state"


class TransactionCoordinator:
    """Transactions, kept in ``__transaction_state`` (registered as ``transaction``)."""

    key_type = TRANSACTION_KEY_TYPE
    internal_topic = TRANSACTION_STATE_TOPIC

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.markers = MarkerChannel(services, write_completion)
        #: Producer ids this coordinator took from the broker's blocks (new transactional ids, exhausted epochs).
        self.producer_ids_allocated = 0

    def settings(self) -> TxnSettings:
        return TxnSettings.from_config(self.services.config)

    def topic_settings(self) -> tuple[int, int, Mapping[str, str]]:
        """Partitions (the existing topic's count once it exists: it decides where ids live), RF, configs.

        The configs are those Kafka gives ``__transaction_state``.
        """
        settings = self.settings()
        topic = self.services.image.topics.get(TRANSACTION_STATE_TOPIC)
        partitions = len(topic.partitions) if topic is not None and topic.partitions else settings.num_partitions
        return partitions, settings.replication_factor, {
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "min.insync.replicas": str(settings.min_isr),
            "segment.bytes": str(settings.segment_bytes),
            "unclean.leader.election.enable": "false",
        }

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        """The transaction APIs with the versions Kafka 4.x advertises.

        InitProducerId replaces the core's handler (which it calls for
        idempotent producers). Its v6 (KIP-939, two-phase commit) is an
        unstable version in Kafka 4.x, not advertised, and not here either.
        ListTransactions v2 (KIP-1152) is Kafka 4.1's.
        """
        return (
            (ApiKey.INIT_PRODUCER_ID, api_producer.init_producer_id, 0, 5),
            (ApiKey.ADD_PARTITIONS_TO_TXN, api_transactions.add_partitions_to_txn, 0, 5),
            (ApiKey.ADD_OFFSETS_TO_TXN, api_transactions.add_offsets_to_txn, 0, 4),
            (ApiKey.END_TXN, api_transactions.end_txn, 0, 5),
            (ApiKey.DESCRIBE_TRANSACTIONS, api_admin.describe_transactions, 0, 0),
            (ApiKey.LIST_TRANSACTIONS, api_admin.list_transactions, 0, 2),
        )

    def new_shard(self, context: ShardContext) -> TransactionShard:
        return TransactionShard(context, self)

    async def shard_for(self, transactional_id: str) -> TransactionShard:
        """The loaded shard coordinating ``transactional_id``; CoordinatorError (NOT_COORDINATOR...) otherwise."""
        context = await self.services.coordinators.shard_for(self, transactional_id)
        shard = context.shard
        if not context.active or not isinstance(shard, TransactionShard):
            raise CoordinatorError(ErrorCode.not_coordinator, f"{transactional_id!r} is not coordinated here")
        return shard

    def shards(self) -> list[TransactionShard]:
        return [c.shard for c in self.services.coordinators.shards(self) if isinstance(c.shard, TransactionShard)]

    def loading(self) -> bool:
        """Whether a partition this broker leads is still being loaded (ListTransactions cannot answer for it)."""
        return self.services.coordinators.loading(self)

    def collect(self) -> Iterable[Metric]:
        """The node's ``/metrics`` (:mod:`josef_coordinator_txn.metrics`): read at scrape time."""
        return transaction_metrics(self.shards(), self.markers, self.producer_ids_allocated)
