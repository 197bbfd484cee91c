"""The metadata image: cluster state as of one offset of the metadata log, and the delta to the next.

Brokers never read the metadata log themselves: they receive an immutable
:class:`MetadataImage` and the :class:`MetadataDelta` that produced it, so the
same broker code works whatever backend (single voter, a Raft quorum,
ZooKeeper) produced the records.
"""

from __future__ import annotations

import uuid
from typing import Iterable, Iterator, Mapping

import attrs

from josef.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.delegation_tokens import TokenInformation
from josef.scram import ScramCredential
from josef.metadata.records import (
    NO_LEADER_CHANGE,
    SECURITY_PROTOCOL_NAMES,
    SECURITY_PROTOCOLS,
    TOPIC_RESOURCE,
    AccessControlEntryRecord,
    BrokerEndpoint,
    BrokerFeature,
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ClientQuotaRecord,
    ConfigRecord,
    DelegationTokenRecord,
    EntityData,
    Endpoint,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    QuotaEntity,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveDelegationTokenRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
    quota_entity,
    uuid_from_text,
    uuid_to_text,
)

@attrs.frozen
class BrokerImage:
    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool
    #: Assigned by the controller at registration; fences and unfences name it.
    epoch: int = -1
    incarnation_id: str = ""
    #: ``(min, max)`` levels of each feature the broker supports, from its registration.
    features: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)
    in_controlled_shutdown: bool = False
    #: ``directory.id`` of each online log directory (KIP-858): registered, then narrowed as directories fail.
    log_dirs: tuple[str, ...] = ()

    def has_online_dir(self, directory: str) -> bool:
        """Whether a replica in ``directory`` is usable on this broker: Kafka's ``DirectoryId.isOnline``.

        Unassigned (not reported yet) counts as online and lost as offline; a
        broker that registered no directories is trusted with all of them.
        """
        if directory in (UNASSIGNED_DIR, MIGRATING_DIR):
            return True
        return directory != LOST_DIR and (not self.log_dirs or directory in self.log_dirs)

    def endpoint(self, listener: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == listener), None)

    @classmethod
    def from_record(cls, record: RegisterBrokerRecord) -> BrokerImage:
        endpoints = tuple(Endpoint(e.name, e.host, e.port, SECURITY_PROTOCOL_NAMES.get(e.security_protocol, "PLAINTEXT"))
                          for e in record.end_points)
        features = {f.name: (f.min_supported_version, f.max_supported_version) for f in record.features}
        return cls(record.broker_id, endpoints, record.rack, record.fenced, record.broker_epoch,
                   uuid_to_text(record.incarnation_id), features, record.in_controlled_shutdown,
                   tuple(uuid_to_text(d) for d in record.log_dirs))

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            broker_id=self.broker_id, incarnation_id=uuid_from_text(self.incarnation_id), broker_epoch=self.epoch,
            end_points=tuple(BrokerEndpoint(name=e.name, host=e.host, port=e.port,
                                            security_protocol=SECURITY_PROTOCOLS[e.security_protocol])
                             for e in self.endpoints),
            features=tuple(BrokerFeature(name=n, min_supported_version=lo, max_supported_version=hi)
                           for n, (lo, hi) in sorted(self.features.items())),
            rack=self.rack, fenced=self.fenced, in_controlled_shutdown=self.in_controlled_shutdown,
            log_dirs=tuple(uuid_from_text(d) for d in self.log_dirs))


#: ``leader_recovery_state`` of a leader elected from the ISR, or one that has recovered (KIP-704).
RECOVERED = 0
#: ``leader_recovery_state`` of a leader chosen by an unclean election, until it tells the controller it recovered.
RECOVERING = 1


def _changed(current: tuple[int, ...], change: tuple[int, ...] | None) -> tuple[int, ...]:
    return current if change is None else tuple(change)


#: Kafka's reserved directory ids (``DirectoryId``): a replica whose directory is not known yet,
#: and one whose directory its broker no longer has.
UNASSIGNED_DIR = uuid_to_text(uuid.UUID(int=0))
LOST_DIR = uuid_to_text(uuid.UUID(int=1))
MIGRATING_DIR = uuid_to_text(uuid.UUID(int=2))


def dir_to_text(value: uuid.UUID | None) -> str:
    """A directory id as text; the zero UUID (which kio reads as None) is :data:`UNASSIGNED_DIR`."""
    return UNASSIGNED_DIR if value is None else uuid_to_text(value)


@attrs.frozen
class PartitionImage:
    """One partition as Kafka's PartitionRegistration keeps it.

    ``adding_replicas`` and ``removing_replicas`` are non-empty while a
    reassignment moves the partition (``replicas`` is then the target plus
    the replicas being removed); ``elr`` and ``last_known_elr`` are the
    eligible leader replicas of KIP-966.
    """

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader_recovery_state: int = RECOVERED
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    #: The log directory (``directory.id``) of each replica, in ``replicas`` order (KIP-858); empty when not tracked.
    directories: tuple[str, ...] = ()

    def directory_of(self, broker_id: int) -> str:
        """The directory holding ``broker_id``'s replica: :data:`UNASSIGNED_DIR` until its broker says."""
        if broker_id in self.replicas and len(self.directories) == len(self.replicas):
            return self.directories[self.replicas.index(broker_id)]
        return UNASSIGNED_DIR

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else -1

    @classmethod
    def from_record(cls, record: PartitionRecord) -> PartitionImage:
        return cls(tuple(record.replicas), tuple(record.isr), record.leader, record.leader_epoch, record.partition_epoch,
                   tuple(record.removing_replicas), tuple(record.adding_replicas), record.leader_recovery_state,
                   tuple(record.eligible_leader_replicas or ()), tuple(record.last_known_elr or ()),
                   tuple(dir_to_text(d) for d in record.directories))

    def to_record(self, topic_id: uuid.UUID, partition_id: int) -> PartitionRecord:
        return PartitionRecord(
            partition_id=partition_id, topic_id=topic_id, replicas=self.replicas, isr=self.isr,
            removing_replicas=self.removing_replicas, adding_replicas=self.adding_replicas, leader=self.leader,
            leader_recovery_state=self.leader_recovery_state, leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch, eligible_leader_replicas=self.elr or None,
            last_known_elr=self.last_known_elr or None, directories=tuple(uuid_from_text(d) for d in self.directories))

    def merge(self, change: PartitionChangeRecord) -> PartitionImage:
        """This partition after ``change``: Kafka's PartitionRegistration.merge.

        Any change bumps the partition epoch; naming a leader, even the
        current one, bumps the leader epoch.
        """
        leader, leader_epoch = self.leader, self.leader_epoch
        if change.leader != NO_LEADER_CHANGE:
            leader, leader_epoch = change.leader, leader_epoch + 1
        recovery = self.leader_recovery_state if change.leader_recovery_state == -1 else change.leader_recovery_state
        replicas = _changed(self.replicas, change.replicas)
        if change.directories is not None:
            directories = tuple(dir_to_text(d) for d in change.directories)
        elif replicas != self.replicas and self.directories:  # replicas that stay keep their directory
            directories = tuple(self.directory_of(r) for r in replicas)
        else:
            directories = self.directories
        return PartitionImage(
            replicas, _changed(self.isr, change.isr), leader, leader_epoch,
            self.partition_epoch + 1, _changed(self.removing_replicas, change.removing_replicas),
            _changed(self.adding_replicas, change.adding_replicas), recovery,
            _changed(self.elr, change.eligible_leader_replicas), _changed(self.last_known_elr, change.last_known_elr),
            directories)


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
    #: Names of features whose finalized level changed.
    changed_features: tuple[str, ...] = ()
    #: Whether an ACL was added or removed.
    changed_acls: bool = False

    @property
    def empty(self) -> bool:
        return not (self.created_topics or self.deleted_topics or self.changed_partitions
                    or self.changed_configs or self.changed_brokers or self.changed_features or self.changed_acls)


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
    #: Finalized feature levels above 0 (FeatureLevelRecord), ``metadata.version`` among them.
    features: Mapping[str, int] = attrs.field(factory=dict)
    #: Kafka's ACLs by id (AccessControlEntryRecord).
    acls: Mapping[uuid.UUID, AclBinding] = attrs.field(factory=dict)
    #: SCRAM credentials by (user, mechanism type: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512) (UserScramCredentialRecord).
    scram_credentials: Mapping[tuple[str, int], ScramCredential] = attrs.field(factory=dict)
    #: Delegation tokens by token id (DelegationTokenRecord); their HMACs are derived, never stored.
    delegation_tokens: Mapping[str, TokenInformation] = attrs.field(factory=dict)

    def topic_by_id(self, topic_id: str) -> TopicImage | None:
        name = self.topic_names.get(topic_id)
        return self.topics[name] if name is not None else None

    def config(self, resource_type: int, name: str) -> Mapping[str, str]:
        return self.configs.get((resource_type, name), {})

    def apply(self, offset: int, records: Iterable[MetadataRecord]) -> tuple[MetadataImage, MetadataDelta]:
        """The image after ``records`` (committed at ``offset``), and what changed.

        Only what the records touch is copied: a commit that changes one
        partition copies that topic's partition map and the map of topics
        (a C-level dict copy of references), never the other topics'
        partitions; a heartbeat that unfences a broker copies only the
        brokers.
        """
        builder = _Builder(self)
        for record in records:
            builder.apply(record)
        return builder.build(offset)

    def changes_since(self, old: MetadataImage) -> MetadataDelta:
        """What differs from ``old``, as one delta: how a broker moves to a snapshot it downloaded.

        A topic re-created under the same name (a new id) is deleted and created.
        """
        old_ids = {t.topic_id for t in old.topics.values()}
        new_ids = {t.topic_id for t in self.topics.values()}
        created = tuple(t for t in self.topics.values() if t.topic_id not in old_ids)
        deleted = tuple(t for t in old.topics.values() if t.topic_id not in new_ids)
        changed = [(t.name, p) for t in created for p in t.partitions]
        for topic in self.topics.values():
            before = old.topics.get(topic.name)
            if before is not None and before.topic_id == topic.topic_id:
                changed += [(topic.name, p) for p, state in topic.partitions.items() if before.partitions.get(p) != state]

        def differing(a: Mapping, b: Mapping) -> tuple:  # type: ignore[type-arg]
            return tuple(k for k in {**a, **b} if a.get(k) != b.get(k))

        return MetadataDelta(created, deleted, tuple(changed), differing(old.configs, self.configs),
                             differing(old.brokers, self.brokers), differing(old.features, self.features),
                             old.acls != self.acls)

    def records(self) -> Iterator[MetadataRecord]:
        """Records that rebuild this image from nothing: what a metadata snapshot holds."""
        for name, level in sorted(self.features.items()):
            yield FeatureLevelRecord(name=name, feature_level=level)
        for broker in self.brokers.values():
            yield broker.to_record()
        for topic in self.topics.values():
            topic_id = uuid_from_text(topic.topic_id)
            yield TopicRecord(name=topic.name, topic_id=topic_id)
            for partition_id, p in topic.partitions.items():
                yield p.to_record(topic_id, partition_id)
        for (resource_type, resource_name), values in self.configs.items():
            for name, value in values.items():
                yield ConfigRecord(resource_type=resource_type, resource_name=resource_name, name=name, value=value)
        for entity, values in self.client_quotas.items():
            for key, value in values.items():
                yield ClientQuotaRecord(entity=tuple(EntityData(entity_type=t, entity_name=n) for t, n in entity),
                                        key=key, value=value)
        for acl_id, acl in self.acls.items():
            yield acl_record(acl_id, acl)
        for (user, mechanism), credential in self.scram_credentials.items():
            yield scram_record(user, mechanism, credential)
        for token in self.delegation_tokens.values():
            yield token.to_record()
        if self.next_producer_id:
            yield ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=self.next_producer_id)


def acl_record(acl_id: uuid.UUID, acl: AclBinding) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(id=acl_id, resource_type=acl.resource_type, resource_name=acl.resource_name,
                                    pattern_type=acl.pattern_type, principal=acl.principal, host=acl.host,
                                    operation=acl.operation, permission_type=acl.permission_type)


def scram_record(user: str, mechanism: int, credential: ScramCredential) -> UserScramCredentialRecord:
    return UserScramCredentialRecord(name=user, mechanism=mechanism, salt=credential.salt,
                                     stored_key=credential.stored_key, server_key=credential.server_key,
                                     iterations=credential.iterations)


class _Builder:
    """Applies records to copies of only the parts of an image they change."""

    def __init__(self, base: MetadataImage) -> None:
        # The base image's maps, copied by _own() the first time a record writes to one.
        self.brokers: dict = base.brokers  # type: ignore[assignment]
        self.topics: dict = base.topics  # type: ignore[assignment]
        self.names: dict = base.topic_names  # type: ignore[assignment]
        self.configs: dict = base.configs  # type: ignore[assignment]
        self.quotas: dict = base.client_quotas  # type: ignore[assignment]
        self.features: dict = base.features  # type: ignore[assignment]
        self.acls: dict = base.acls  # type: ignore[assignment]
        self.scram: dict = base.scram_credentials  # type: ignore[assignment]
        self.tokens: dict = base.delegation_tokens  # type: ignore[assignment]
        self._owned: set[str] = set()
        self.next_producer_id = base.next_producer_id
        #: Partition maps copied in this commit, by topic name; frozen into topics at the end.
        self.partitions: dict[str, dict[int, PartitionImage]] = {}
        self.created: dict[str, None] = {}
        self.deleted: list[TopicImage] = []
        self.changed_partitions: list[tuple[str, int]] = []
        self.changed_configs: dict[tuple[int, str], None] = {}
        self.changed_brokers: dict[int, None] = {}
        self.changed_features: dict[str, None] = {}

    def _own(self, name: str) -> dict:  # type: ignore[type-arg]
        """The map ``name``, copied from the base image before this commit first changes it."""
        if name not in self._owned:
            setattr(self, name, dict(getattr(self, name)))
            self._owned.add(name)
        return getattr(self, name)  # type: ignore[no-any-return]

    def _partitions_of(self, topic_id: str) -> tuple[str, dict[int, PartitionImage]]:
        name = self.names[topic_id]
        partitions = self.partitions.get(name)
        if partitions is None:
            partitions = self.partitions[name] = dict(self.topics[name].partitions)
        return name, partitions

    def _broker(self, broker_id: int, epoch: int, **changes: object) -> None:
        broker = self.brokers.get(broker_id)
        if broker is not None and (epoch == -1 or broker.epoch == epoch):
            self._own("brokers")[broker_id] = attrs.evolve(broker, **changes)
            self.changed_brokers[broker_id] = None

    def apply(self, record: MetadataRecord) -> None:  # noqa: C901 - one branch per record type
        if isinstance(record, PartitionRecord):
            name, partitions = self._partitions_of(uuid_to_text(record.topic_id))
            partitions[record.partition_id] = PartitionImage.from_record(record)
            self.changed_partitions.append((name, record.partition_id))
        elif isinstance(record, PartitionChangeRecord):
            name, partitions = self._partitions_of(uuid_to_text(record.topic_id))
            partitions[record.partition_id] = partitions[record.partition_id].merge(record)
            self.changed_partitions.append((name, record.partition_id))
        elif isinstance(record, TopicRecord):
            topic_id = uuid_to_text(record.topic_id)
            self._own("topics")[record.name] = TopicImage(record.name, topic_id, {})
            self._own("names")[topic_id] = record.name
            self.partitions[record.name] = {}
            self.created[record.name] = None
        elif isinstance(record, RemoveTopicRecord):
            name = self._own("names").pop(uuid_to_text(record.topic_id))
            self.partitions.pop(name, None)
            self.deleted.append(self._own("topics").pop(name))
            self.created.pop(name, None)
            if (TOPIC_RESOURCE, name) in self.configs:
                del self._own("configs")[(TOPIC_RESOURCE, name)]
        elif isinstance(record, ConfigRecord):
            key = (record.resource_type, record.resource_name)
            values = dict(self.configs.get(key, {}))
            if record.value is None:
                values.pop(record.name, None)
            else:
                values[record.name] = record.value
            self._own("configs")[key] = values
            self.changed_configs[key] = None
        elif isinstance(record, RegisterBrokerRecord):
            self._own("brokers")[record.broker_id] = BrokerImage.from_record(record)
            self.changed_brokers[record.broker_id] = None
        elif isinstance(record, UnregisterBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            if broker is not None and broker.epoch == record.broker_epoch:
                del self._own("brokers")[record.broker_id]
                self.changed_brokers[record.broker_id] = None
        elif isinstance(record, FenceBrokerRecord):
            self._broker(record.id, record.epoch, fenced=True)
        elif isinstance(record, UnfenceBrokerRecord):
            self._broker(record.id, record.epoch, fenced=False)
        elif isinstance(record, BrokerRegistrationChangeRecord):
            changes: dict[str, object] = {}
            if record.fenced:
                changes["fenced"] = record.fenced == 1
            if record.in_controlled_shutdown:
                changes["in_controlled_shutdown"] = True
            if record.log_dirs:  # empty: unchanged, as in Kafka
                changes["log_dirs"] = tuple(uuid_to_text(d) for d in record.log_dirs)
            self._broker(record.broker_id, record.broker_epoch, **changes)
        elif isinstance(record, FeatureLevelRecord):
            if record.feature_level > 0:
                self._own("features")[record.name] = record.feature_level
            else:
                self._own("features").pop(record.name, None)
            self.changed_features[record.name] = None
        elif isinstance(record, ProducerIdsRecord):
            # Never backwards, whatever a record says: a reused producer id would merge two producers' state.
            self.next_producer_id = max(self.next_producer_id, record.next_producer_id)
        elif isinstance(record, ClientQuotaRecord):
            entity = quota_entity(record)
            values = {k: v for k, v in self.quotas.get(entity, {}).items() if k != record.key}
            if not record.remove:
                values[record.key] = record.value
            if values:
                self._own("quotas")[entity] = values
            else:
                self._own("quotas").pop(entity, None)
        elif isinstance(record, AccessControlEntryRecord):
            self._own("acls")[record.id] = AclBinding(
                ResourceType(record.resource_type), record.resource_name, PatternType(record.pattern_type),
                record.principal, record.host, AclOperation(record.operation), AclPermissionType(record.permission_type))
        elif isinstance(record, RemoveAccessControlEntryRecord):
            self._own("acls").pop(record.id, None)
        elif isinstance(record, UserScramCredentialRecord):
            self._own("scram")[(record.name, record.mechanism)] = ScramCredential(
                record.salt, record.stored_key, record.server_key, record.iterations)
        elif isinstance(record, RemoveUserScramCredentialRecord):
            self._own("scram").pop((record.name, record.mechanism), None)
        elif isinstance(record, DelegationTokenRecord):
            self._own("tokens")[record.token_id] = TokenInformation.from_record(record)
        elif isinstance(record, RemoveDelegationTokenRecord):
            self._own("tokens").pop(record.token_id, None)
        elif isinstance(record, ClearElrRecord):
            self._clear_elr(record.topic_name)

    def _clear_elr(self, topic_name: str) -> None:
        """Kafka's ClearElrRecord replay: each partition of the topic (of every topic when the name is empty) that
        has eligible or last known leader replicas loses them, as a change that bumps its partition epoch.
        A topic that is gone has nothing to clear."""
        names = [topic_name] if topic_name else list(self.topics)
        cleared = PartitionChangeRecord(partition_id=0, topic_id=uuid.UUID(int=0), eligible_leader_replicas=(),
                                        last_known_elr=())
        for name in names:
            topic = self.topics.get(name)
            if topic is None:
                continue
            current = self.partitions.get(name, topic.partitions)
            holding = [index for index, p in current.items() if p.elr or p.last_known_elr]
            if holding:
                _, partitions = self._partitions_of(topic.topic_id)
                for index in holding:
                    partitions[index] = partitions[index].merge(cleared)
                    self.changed_partitions.append((name, index))

    def build(self, offset: int) -> tuple[MetadataImage, MetadataDelta]:
        for name, partitions in self.partitions.items():
            self._own("topics")[name] = attrs.evolve(self.topics[name], partitions=partitions)
        image = MetadataImage(offset, self.brokers, self.topics, self.names, self.configs, self.next_producer_id,
                              self.quotas, self.features, self.acls, self.scram, self.tokens)
        delta = MetadataDelta(
            tuple(self.topics[name] for name in self.created), tuple(self.deleted), tuple(self.changed_partitions),
            tuple(self.changed_configs), tuple(self.changed_brokers), tuple(self.changed_features),
            "acls" in self._owned)
        return image, delta
