"""The group coordinator as the core's coordinator runtime sees it: an internal topic, its APIs, its shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, ShardContext
from josef.plugins import collect
from josef.protocol.api_keys import ApiKey
from josef_coordinator_group.api_admin import GroupAdminApis
from josef_coordinator_group.api_consumer import ConsumerGroupApis
from josef_coordinator_group.api_share_groups import ShareGroupApis
from josef_coordinator_group.share_offsets import ShareOffsetApis
from josef_coordinator_group.api_membership import MembershipApis
from josef_coordinator_group.api_offsets import OffsetApis
from josef_coordinator_group.api_txn_offsets import TxnOffsetApis
from josef_coordinator_group.configs import GroupSettings
from josef_coordinator_group.metrics import GroupMetrics
from josef_coordinator_group.server_assignors import SERVER_PREFIX
from josef_coordinator_group.shard import GroupShard

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from josef.services import BrokerServices
    from josef.server.dispatch import Handler

OFFSETS_TOPIC = "__consumer_offsets"
#: FindCoordinator key type of groups.
GROUP_KEY_TYPE = 0


class GroupCoordinator:
    """Consumer groups and their offsets, kept in ``__consumer_offsets`` (registered as ``group``)."""

    key_type = GROUP_KEY_TYPE
    internal_topic = OFFSETS_TOPIC

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self._membership = MembershipApis(self)
        self._offsets = OffsetApis(self)
        self._txn_offsets = TxnOffsetApis(self)
        self._admin = GroupAdminApis(self)
        self._consumer = ConsumerGroupApis(self)
        self._share = ShareGroupApis(self)
        self.share_offsets = ShareOffsetApis(self)
        self._assignors: dict[str, object] | None = None
        self._metrics = GroupMetrics(self)
        if services is not None:  # (None: a declaration of APIs only)
            services.spawn(self._metrics.refresh_forever)

    def collect(self) -> Iterable[Metric]:
        """Groups by state, committed offsets and lag, on the node's /metrics (:mod:`josef_coordinator_group.metrics`)."""
        return self._metrics.collect()

    def settings(self) -> GroupSettings:
        return GroupSettings.from_config(self.services.config)

    def topic_settings(self) -> tuple[int, int, Mapping[str, str]]:
        """Partitions (the existing topic's count once it exists: it decides where groups live), RF, configs."""
        settings = self.settings()
        topic = self.services.image.topics.get(OFFSETS_TOPIC)
        partitions = len(topic.partitions) if topic is not None and topic.partitions else settings.num_partitions
        return partitions, settings.replication_factor, {
            "cleanup.policy": "compact",
            "segment.bytes": str(settings.segment_bytes),
            "compression.type": "producer",
        }

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        """The group APIs with the versions Kafka 4.x answers (OffsetCommit v10 and OffsetFetch v10 since 4.1).

        Kafka 4.0 removed OffsetCommit v0-v1 and OffsetFetch v0 (KIP-896); kio
        parses none of them either. TxnOffsetCommit is the group
        coordinator's too, as in Kafka: the transaction coordinator only
        adds the group's partition to the transaction (AddOffsetsToTxn).
        """
        m, o, a = self._membership, self._offsets, self._admin
        return (
            (ApiKey.JOIN_GROUP, m.join_group, 0, 9),
            (ApiKey.SYNC_GROUP, m.sync_group, 0, 5),
            (ApiKey.HEARTBEAT, m.heartbeat, 0, 4),
            (ApiKey.LEAVE_GROUP, m.leave_group, 0, 5),
            (ApiKey.OFFSET_COMMIT, o.offset_commit, 2, 10),
            (ApiKey.OFFSET_FETCH, o.offset_fetch, 1, 10),
            (ApiKey.OFFSET_DELETE, o.offset_delete, 0, 0),
            (ApiKey.TXN_OFFSET_COMMIT, self._txn_offsets.txn_offset_commit, 0, 5),
            (ApiKey.LIST_GROUPS, a.list_groups, 0, 5),
            (ApiKey.DESCRIBE_GROUPS, a.describe_groups, 0, 6),
            (ApiKey.DELETE_GROUPS, a.delete_groups, 0, 2),
            (ApiKey.CONSUMER_GROUP_HEARTBEAT, self._consumer.heartbeat, 0, 1),
            (ApiKey.CONSUMER_GROUP_DESCRIBE, self._consumer.describe, 0, 0),
            (ApiKey.SHARE_GROUP_HEARTBEAT, self._share.heartbeat, 1, 1),
            (ApiKey.SHARE_GROUP_DESCRIBE, self._share.describe, 1, 1),
            (ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, self.share_offsets.describe, 0, 1),
            (ApiKey.ALTER_SHARE_GROUP_OFFSETS, self.share_offsets.alter, 0, 0),
            (ApiKey.DELETE_SHARE_GROUP_OFFSETS, self.share_offsets.delete, 0, 0),
        )

    def append_linger_ms(self) -> int:
        """``group.coordinator.append.linger.ms``: how long a batch of writes waits for more (-1 adaptive)."""
        return int(self.services.config["group.coordinator.append.linger.ms"])

    def new_shard(self, context: ShardContext) -> GroupShard:
        shard = GroupShard(context, self.settings)
        shard.server_assignors = self.server_assignors
        return shard

    def server_assignors(self) -> dict[str, object]:
        """The server-side assignors (``server:NAME`` in the ``register_assignors`` hook), by NAME."""
        if self._assignors is None:
            registry = collect(self.services.plugins, "register_assignors", "assignor")
            self._assignors = {name[len(SERVER_PREFIX):]: factory() for name, factory in registry.items()
                               if name.startswith(SERVER_PREFIX)}
        return self._assignors

    async def shard_for(self, group_id: str) -> tuple[ShardContext, GroupShard]:
        """The loaded shard coordinating ``group_id``; CoordinatorError (NOT_COORDINATOR...) otherwise."""
        context = await self.services.coordinators.shard_for(self, group_id)
        shard = context.shard
        if not context.active or not isinstance(shard, GroupShard):
            raise CoordinatorError(ErrorCode.not_coordinator, f"group {group_id!r} is not coordinated here")
        return context, shard

    def shards(self) -> list[GroupShard]:
        return [c.shard for c in self.services.coordinators.shards(self) if isinstance(c.shard, GroupShard)]

