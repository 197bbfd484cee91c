"""The metadata image: cluster state as of one offset of the metadata log, and the delta to the next.

Brokers never read the metadata log themselves: they receive an immutable
:class:`MetadataImage` and the :class:`MetadataDelta` that produced it, so the
same broker code works whatever backend (single voter, a Raft quorum,
ZooKeeper) produced the records.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs

from josef.metadata.records import (
    ClientQuotaRecord,
    ConfigRecord,
    Endpoint,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    QuotaEntity,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)


@attrs.frozen
class BrokerImage:
    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool

    def endpoint(self, listener: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == listener), None)


@attrs.frozen
class PartitionImage:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


@attrs.frozen
class TopicImage:
    name: str
    topic_id: str
    partitions: Mapping[int, PartitionImage]


@attrs.frozen
class MetadataDelta:
    """What one commit changed; the replica manager acts on it."""

    created_topics: tuple[TopicImage, ...] = ()
    deleted_topics: tuple[TopicImage, ...] = ()
    #: (topic name, partition) of partitions created or changed.
    changed_partitions: tuple[tuple[str, int], ...] = ()
    #: (resource type, resource name) of configs that changed.
    changed_configs: tuple[tuple[int, str], ...] = ()
    changed_brokers: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.created_topics or self.deleted_topics or self.changed_partitions
                    or self.changed_configs or self.changed_brokers)


@attrs.frozen
class MetadataImage:
    offset: int = -1
    brokers: Mapping[int, BrokerImage] = attrs.field(factory=dict)
    topics: Mapping[str, TopicImage] = attrs.field(factory=dict)
    topic_names: Mapping[str, str] = attrs.field(factory=dict)  # topic id -> name
    configs: Mapping[tuple[int, str], Mapping[str, str]] = attrs.field(factory=dict)
    #: The first producer id of the next block the controller hands out (ProducerIdsRecord).
    next_producer_id: int = 0
    #: Client quotas by entity (ClientQuotaRecord): {entity: {quota key: value}}.
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = attrs.field(factory=dict)

    def topic_by_id(self, topic_id: str) -> TopicImage | None:
        name = self.topic_names.get(topic_id)
        return self.topics[name] if name is not None else None

    def config(self, resource_type: int, name: str) -> Mapping[str, str]:
        return self.configs.get((resource_type, name), {})

    def apply(self, offset: int, records: Iterable[MetadataRecord]) -> tuple[MetadataImage, MetadataDelta]:
        """The image after ``records`` (committed at ``offset``), and what changed."""
        brokers = dict(self.brokers)
        topics = dict(self.topics)
        names = dict(self.topic_names)
        configs = dict(self.configs)
        created: dict[str, TopicImage] = {}
        deleted: list[TopicImage] = []
        changed_partitions: list[tuple[str, int]] = []
        changed_configs: list[tuple[int, str]] = []
        changed_brokers: list[int] = []
        next_producer_id = self.next_producer_id
        quotas = dict(self.client_quotas)
        for record in records:
            if isinstance(record, RegisterBrokerRecord):
                brokers[record.broker_id] = BrokerImage(record.broker_id, record.endpoints, record.rack, record.fenced)
                changed_brokers.append(record.broker_id)
            elif isinstance(record, TopicRecord):
                topics[record.name] = TopicImage(record.name, record.topic_id, {})
                names[record.topic_id] = record.name
                created[record.name] = topics[record.name]
            elif isinstance(record, PartitionRecord):
                topic = topics[names[record.topic_id]]
                partition = PartitionImage(record.replicas, record.isr, record.leader,
                                           record.leader_epoch, record.partition_epoch)
                topics[topic.name] = topic = attrs.evolve(
                    topic, partitions={**topic.partitions, record.partition_id: partition})
                if topic.name in created:
                    created[topic.name] = topic
                changed_partitions.append((topic.name, record.partition_id))
            elif isinstance(record, RemoveTopicRecord):
                name = names.pop(record.topic_id)
                deleted.append(topics.pop(name))
                created.pop(name, None)
                configs.pop((2, name), None)
            elif isinstance(record, ConfigRecord):
                key = (record.resource_type, record.resource_name)
                values = dict(configs.get(key, {}))
                if record.value is None:
                    values.pop(record.name, None)
                else:
                    values[record.name] = record.value
                configs[key] = values
                changed_configs.append(key)
            elif isinstance(record, ProducerIdsRecord):
                # Never backwards, whatever a record says: a reused producer id would merge two producers' state.
                next_producer_id = max(next_producer_id, record.next_producer_id)
            elif isinstance(record, ClientQuotaRecord):
                values = {k: v for k, v in quotas.get(record.entity, {}).items() if k != record.key}
                if not record.remove:
                    values[record.key] = record.value
                if values:
                    quotas[record.entity] = values
                else:
                    quotas.pop(record.entity, None)
        image = MetadataImage(offset, brokers, topics, names, configs, next_producer_id, quotas)
        delta = MetadataDelta(tuple(created.values()), tuple(deleted), tuple(changed_partitions),
                              tuple(dict.fromkeys(changed_configs)), tuple(dict.fromkeys(changed_brokers)))
        return image, delta
