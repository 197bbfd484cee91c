"""The share coordinator as the core's coordinator runtime sees it: an internal topic, its APIs, its shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, ShardContext
from josef.protocol.api_keys import ApiKey
from josef_coordinator_share import api_share, api_state
from josef_coordinator_share.api_state import SHARE_KEY_TYPE
from josef_coordinator_share.configs import ShareSettings
from josef_coordinator_share.metrics import ShareCounters, share_metrics
from josef_coordinator_share.partitions import SharePartitionManager
from josef_coordinator_share.shard import ShareStateShard
from josef_coordinator_share.state import ShareKey

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from josef.server.dispatch import Handler
    from josef.services import BrokerServices

SHARE_GROUP_STATE_TOPIC = "__share_group_state"


class ShareCoordinator:
    """Share-partition state, kept in ``__share_group_state`` (registered as ``share``)."""

    key_type = SHARE_KEY_TYPE
    internal_topic = SHARE_GROUP_STATE_TOPIC

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        #: What the share partitions and the shards count for the node's /metrics (josef_coordinator_share.metrics).
        self.counters = ShareCounters()
        #: The share partitions this broker leads, and its share sessions.
        self.partitions = SharePartitionManager(services, self)

    def settings(self) -> ShareSettings:
        return ShareSettings.from_config(self.services.config)

    def append_linger_ms(self) -> int:
        return self.settings().append_linger_ms

    def topic_settings(self) -> tuple[int, int, Mapping[str, str]]:
        """Partitions (the existing topic's count once it exists), RF, and the configs Kafka gives the topic.

        Not compacted: the shards prune it themselves (see :mod:`josef_coordinator_share.shard`), and nothing
        is deleted by time or size.
        """
        settings = self.settings()
        topic = self.services.image.topics.get(SHARE_GROUP_STATE_TOPIC)
        partitions = len(topic.partitions) if topic is not None and topic.partitions else settings.num_partitions
        return partitions, settings.replication_factor, {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "compression.type": "producer",
            "min.insync.replicas": str(settings.min_isr),
            "segment.bytes": str(settings.segment_bytes),
            "unclean.leader.election.enable": "false",
        }

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        """The share-state APIs and share consumers' ShareFetch and ShareAcknowledge, at Kafka 4.2's versions
        (v0 of those two was KIP-932's early access, which Kafka 4.1 dropped)."""
        return (
            (ApiKey.SHARE_FETCH, api_share.share_fetch, 1, 2),
            (ApiKey.SHARE_ACKNOWLEDGE, api_share.share_acknowledge, 1, 2),
            (ApiKey.INITIALIZE_SHARE_GROUP_STATE, api_state.initialize_share_group_state, 0, 0),
            (ApiKey.READ_SHARE_GROUP_STATE, api_state.read_share_group_state, 0, 0),
            (ApiKey.WRITE_SHARE_GROUP_STATE, api_state.write_share_group_state, 0, 1),
            (ApiKey.DELETE_SHARE_GROUP_STATE, api_state.delete_share_group_state, 0, 0),
            (ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, api_state.read_share_group_state_summary, 0, 1),
        )

    def new_shard(self, context: ShardContext) -> ShareStateShard:
        return ShareStateShard(context, self)

    def shards(self) -> list[ShareStateShard]:
        """The shards of ``__share_group_state`` loaded on this broker."""
        return [c.shard for c in self.services.coordinators.shards(self) if isinstance(c.shard, ShareStateShard)]

    def collect(self) -> Iterable[Metric]:
        """Share groups' metrics on the node's ``/metrics`` (:mod:`josef_coordinator_share.metrics`)."""
        return share_metrics(self)

    async def shard_for(self, key: ShareKey) -> ShareStateShard:
        """The loaded shard keeping ``key``; CoordinatorError (NOT_COORDINATOR...) otherwise."""
        context = await self.services.coordinators.shard_for(self, key.coordinator_key)
        shard = context.shard
        if not context.active or not isinstance(shard, ShareStateShard):
            raise CoordinatorError(ErrorCode.not_coordinator, f"{key.coordinator_key!r} is not coordinated here")
        return shard
