"""Kafka 3.x's ZooKeeper layout, written from the metadata image for the operators and tools that read ZooKeeper.

josef's metadata lives in its own log (:mod:`josef_metadata_zk.commits`);
these znodes are a view of it, in the paths and JSON a Kafka 3.9 cluster
kept there, so ``zookeeper-shell get /brokers/topics/orders`` shows what a
Kafka user expects. They are never read back: the active controller writes
them, the whole view when it is elected and what each commit changes after
that, every write conditioned on its controller epoch like a commit.

- ``/brokers/topics/<topic>``: the assignment (version 3: partitions to
  replicas, the topic id, replicas being added and removed);
- ``/brokers/topics/<topic>/partitions/<p>/state``: leader, leader epoch,
  ISR and the controller epoch that wrote it;
- ``/config/topics/<topic>``, ``/config/brokers/<id>`` (``<default>`` for
  the cluster-wide one): dynamic configs (``{"version":1,"config":{...}}``);
- ``/config/users/<user>``, ``/config/clients/<id>``,
  ``/config/users/<user>/clients/<id>``, ``/config/ips/<ip>``: client
  quotas, and a user's SCRAM credentials (``SCRAM-SHA-256``:
  ``salt=...,stored_key=...,server_key=...,iterations=...``), as Kafka's
  ``kafka-configs.sh --zookeeper`` kept them; an entity's znode stays, with
  no config, once its last one is removed, as Kafka's did;
- ``/kafka-acl/<ResourceType>/<name>`` (literal) and
  ``/kafka-acl-extended/prefixed/<ResourceType>/<name>`` (prefixed): the
  ACLs of each resource pattern;
- ``/latest_producer_id_block``: the last block of producer ids handed out;
- ``/feature``: the finalized feature levels;
- Kafka's other persistent paths, empty here since josef's notifications
  travel in the metadata log: ``/config/changes``, ``/admin/delete_topics``
  (a topic is deleted at once), ``/kafka-acl-changes``,
  ``/kafka-acl-extended-changes``, ``/isr_change_notification``,
  ``/log_dir_event_notification``, ``/brokers/seqid``, ``/consumers``.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import attrs

from josef.acls import AclBinding, PatternType
from josef.metadata.image import MetadataImage, PartitionImage, TopicImage
from josef.metadata.records import (
    BROKER_RESOURCE,
    PRODUCER_ID_BLOCK_SIZE,
    QuotaEntity,
    TOPIC_RESOURCE,
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UserScramCredentialRecord,
    quota_entity,
    uuid_to_text,
)


@attrs.frozen
class Write:
    """One znode to set (created with its parents when missing), or to delete with its children (``data`` None)."""

    path: str
    data: bytes | None


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _camel(name: str) -> str:
    """``TRANSACTIONAL_ID`` -> ``TransactionalId``: how Kafka names resource types and operations in ZooKeeper."""
    return "".join(part.capitalize() for part in name.split("_"))


def topic_path(name: str) -> str:
    return f"/brokers/topics/{name}"


def topic_json(topic: TopicImage) -> bytes:
    partitions = sorted(topic.partitions.items())
    return _json({"version": 3, "topic_id": topic.topic_id,
                  "partitions": {str(p): list(state.replicas) for p, state in partitions},
                  "adding_replicas": {str(p): list(s.adding_replicas) for p, s in partitions if s.adding_replicas},
                  "removing_replicas": {str(p): list(s.removing_replicas) for p, s in partitions if s.removing_replicas}})


def partition_state_json(state: PartitionImage, controller_epoch: int) -> bytes:
    return _json({"controller_epoch": controller_epoch, "leader": state.leader, "version": 1,
                  "leader_epoch": state.leader_epoch, "isr": list(state.isr)})


def config_path(resource_type: int, name: str) -> str | None:
    if resource_type == TOPIC_RESOURCE:
        return f"/config/topics/{name}"
    if resource_type == BROKER_RESOURCE:
        return f"/config/brokers/{name or '<default>'}"
    return None  # groups, client metrics...: Kafka 3.x kept none in ZooKeeper


#: Kafka 3.x's persistent paths with nothing under them here (see the module's docstring).
EMPTY_PATHS = ("/config/changes", "/admin/delete_topics", "/kafka-acl-changes", "/kafka-acl-extended-changes",
               "/isr_change_notification", "/log_dir_event_notification", "/brokers/seqid", "/consumers")
#: The entity paths of Kafka's ConfigType (ZkAdminManager), by ClientQuotaRecord entity type.
_ENTITY_DIRECTORIES = {"user": "users", "client-id": "clients", "ip": "ips"}
_SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}


def entity_path(entity: QuotaEntity) -> str:
    """``(("client-id", "app"), ("user", "alice"))`` -> ``/config/users/alice/clients/app``; None names the default."""
    names = dict(entity)
    parts = [f"{_ENTITY_DIRECTORIES[kind]}/{names[kind] if names[kind] is not None else '<default>'}"
             for kind in ("user", "client-id", "ip") if kind in names]
    return "/config/" + "/".join(parts)


def _entity_configs(image: MetadataImage) -> dict[str, dict[str, str]]:
    """Every quota entity's and SCRAM user's config znode of ``image``: path -> Kafka's config properties."""
    configs: dict[str, dict[str, str]] = defaultdict(dict)
    for entity, values in image.client_quotas.items():
        configs[entity_path(entity)].update((key, str(value)) for key, value in values.items())
    for (user, mechanism), credential in image.scram_credentials.items():
        configs[entity_path((("user", user),))][_SCRAM_MECHANISMS[mechanism]] = (
            f"salt={base64.b64encode(credential.salt).decode()},"
            f"stored_key={base64.b64encode(credential.stored_key).decode()},"
            f"server_key={base64.b64encode(credential.server_key).decode()},iterations={credential.iterations}")
    return configs


def _entity_write(path: str, configs: Mapping[str, Mapping[str, str]]) -> Write:
    return Write(path, _json({"version": 1, "config": dict(configs.get(path, {}))}))


def acl_path(binding: AclBinding) -> str:
    kind = "/kafka-acl" if binding.pattern_type == PatternType.LITERAL else "/kafka-acl-extended/prefixed"
    return f"{kind}/{_camel(binding.resource_type.name)}/{binding.resource_name}"


def acls_json(bindings: Iterable[AclBinding]) -> bytes:
    entries = [{"principal": b.principal, "permissionType": _camel(b.permission_type.name),
                "operation": _camel(b.operation.name), "host": b.host} for b in bindings]
    return _json({"version": 1, "acls": sorted(entries, key=lambda e: tuple(e.values()))})


def _acls_by_path(image: MetadataImage) -> dict[str, list[AclBinding]]:
    by_path: dict[str, list[AclBinding]] = defaultdict(list)
    for binding in image.acls.values():
        by_path[acl_path(binding)].append(binding)
    return by_path


def _topic_writes(topic: TopicImage, partitions: Iterable[int], controller_epoch: int) -> list[Write]:
    writes = [Write(topic_path(topic.name), topic_json(topic))]
    for p in partitions:
        state = topic.partitions.get(p)
        if state is not None:
            writes.append(Write(f"{topic_path(topic.name)}/partitions/{p}/state",
                                partition_state_json(state, controller_epoch)))
    return writes


def _config_write(resource_type: int, name: str, config: Mapping[str, str]) -> Write | None:
    """The config znode of a resource as it is now (deleted once empty); None for resources Kafka kept elsewhere."""
    path = config_path(resource_type, name)
    if path is None:
        return None
    return Write(path, _json({"version": 1, "config": dict(config)}) if config else None)


def full_layout(image: MetadataImage, controller_epoch: int) -> list[Write]:
    """Every znode of the view of ``image``: what a newly elected controller writes."""
    writes = [Write(path, b"") for path in EMPTY_PATHS]
    for topic in image.topics.values():
        writes += _topic_writes(topic, sorted(topic.partitions), controller_epoch)
    configs = (_config_write(resource_type, name, config) for (resource_type, name), config in image.configs.items())
    writes += [write for write in configs if write is not None]
    entity_configs = _entity_configs(image)
    writes += [_entity_write(path, entity_configs) for path in entity_configs]
    writes += [Write(path, acls_json(bindings)) for path, bindings in _acls_by_path(image).items()]
    if image.features:
        writes.append(_features(image))
    return writes


def changed_layout(old: MetadataImage, new: MetadataImage, records: Sequence[MetadataRecord],
                   controller_epoch: int) -> list[Write]:
    """The znodes the commit of ``records`` (which took ``old`` to ``new``) changes: deletions first, then what
    the records touch, as ``new`` has it. Read from the records, so the image is not built a second time."""
    deleted: list[Write] = []
    touched: dict[str, set[int]] = {}  # topic name -> partitions, in the order the records touch them
    configs: dict[tuple[int, str], None] = {}
    acl_paths: set[str] = set()
    entity_paths: dict[str, None] = {}
    features = False
    producer_ids: list[Write] = []
    for record in records:
        if isinstance(record, TopicRecord):
            touched.setdefault(record.name, set())
        elif isinstance(record, (PartitionRecord, PartitionChangeRecord)):
            topic = new.topic_by_id(uuid_to_text(record.topic_id))
            if topic is not None:
                touched.setdefault(topic.name, set()).add(record.partition_id)
        elif isinstance(record, RemoveTopicRecord):
            gone = old.topic_by_id(uuid_to_text(record.topic_id))
            if gone is not None:
                deleted += [Write(topic_path(gone.name), None), Write(f"/config/topics/{gone.name}", None)]
        elif isinstance(record, ConfigRecord):
            configs[(record.resource_type, record.resource_name)] = None
        elif isinstance(record, AccessControlEntryRecord):
            acl_paths.add(acl_path(new.acls[record.id]))
        elif isinstance(record, RemoveAccessControlEntryRecord) and record.id in old.acls:
            acl_paths.add(acl_path(old.acls[record.id]))
        elif isinstance(record, ClientQuotaRecord):
            entity_paths[entity_path(quota_entity(record))] = None
        elif isinstance(record, (UserScramCredentialRecord, RemoveUserScramCredentialRecord)):
            entity_paths[entity_path((("user", record.name),))] = None
        elif isinstance(record, FeatureLevelRecord):
            features = True
        elif isinstance(record, ProducerIdsRecord):
            producer_ids.append(Write("/latest_producer_id_block", _json({
                "version": 1, "broker": record.broker_id,
                "block_start": str(record.next_producer_id - PRODUCER_ID_BLOCK_SIZE),
                "block_end": str(record.next_producer_id - 1)})))
    writes = deleted
    for name, partitions in touched.items():
        topic = new.topics.get(name)
        if topic is not None:
            writes += _topic_writes(topic, sorted(partitions), controller_epoch)
    for resource_type, name in configs:
        write = _config_write(resource_type, name, new.config(resource_type, name))
        if write is not None:
            writes.append(write)
    if entity_paths:
        entity_configs = _entity_configs(new)
        writes += [_entity_write(path, entity_configs) for path in entity_paths]
    if acl_paths:
        by_path = _acls_by_path(new)
        writes += [Write(path, acls_json(by_path[path]) if path in by_path else None) for path in sorted(acl_paths)]
    if features:
        writes.append(_features(new))
    return writes + producer_ids


def _features(image: MetadataImage) -> Write:
    return Write("/feature", _json({"version": 2, "status": 1, "features": {
        name: {"min_version_level": 1, "max_version_level": level} for name, level in sorted(image.features.items())}}))
