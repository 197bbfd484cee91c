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
- ``/kafka-acl/<ResourceType>/<name>`` (literal) and
  ``/kafka-acl-extended/prefixed/<ResourceType>/<name>`` (prefixed): the
  ACLs of each resource pattern;
- ``/latest_producer_id_block``: the last block of producer ids handed out;
- ``/feature``: the finalized feature levels.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import attrs

from josef.acls import AclBinding, PatternType
from josef.metadata.image import MetadataDelta, MetadataImage, PartitionImage, TopicImage
from josef.metadata.records import (
    BROKER_RESOURCE,
    PRODUCER_ID_BLOCK_SIZE,
    TOPIC_RESOURCE,
    MetadataRecord,
    ProducerIdsRecord,
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


def full_layout(image: MetadataImage, controller_epoch: int) -> list[Write]:
    """Every znode of the view of ``image``: what a newly elected controller writes."""
    writes: list[Write] = []
    for topic in image.topics.values():
        writes += _topic_writes(topic, sorted(topic.partitions), controller_epoch)
    for (resource_type, name), config in image.configs.items():
        path = config_path(resource_type, name)
        if path is not None:
            writes.append(Write(path, _json({"version": 1, "config": dict(config)})))
    writes += [Write(path, acls_json(bindings)) for path, bindings in _acls_by_path(image).items()]
    if image.features:
        writes.append(_features(image))
    return writes


def changed_layout(old: MetadataImage, new: MetadataImage, delta: MetadataDelta, records: Sequence[MetadataRecord],
                   controller_epoch: int) -> list[Write]:
    """The znodes one commit (``records``, taking ``old`` to ``new`` with ``delta``) changes, in order."""
    writes = [Write(topic_path(t.name), None) for t in delta.deleted_topics]
    writes += [Write(f"/config/topics/{t.name}", None) for t in delta.deleted_topics if t.name not in new.topics]
    touched: dict[str, list[int]] = defaultdict(list)
    for name, partition in delta.changed_partitions:
        touched[name].append(partition)
    for topic in delta.created_topics:
        touched.setdefault(topic.name, [])
    for name, partitions in touched.items():
        topic = new.topics.get(name)
        if topic is not None:
            writes += _topic_writes(topic, partitions, controller_epoch)
    for resource_type, name in delta.changed_configs:
        path = config_path(resource_type, name)
        if path is not None:
            config = new.config(resource_type, name)
            writes.append(Write(path, _json({"version": 1, "config": dict(config)}) if config else None))
    if delta.changed_acls:
        before, after = _acls_by_path(old), _acls_by_path(new)
        for path in sorted(before.keys() | after.keys()):
            if path not in after:
                writes.append(Write(path, None))
            elif set(after[path]) != set(before.get(path, ())):
                writes.append(Write(path, acls_json(after[path])))
    if delta.changed_features:
        writes.append(_features(new))
    for record in records:
        if isinstance(record, ProducerIdsRecord):
            writes.append(Write("/latest_producer_id_block", _json({
                "version": 1, "broker": record.broker_id,
                "block_start": str(record.next_producer_id - PRODUCER_ID_BLOCK_SIZE),
                "block_end": str(record.next_producer_id - 1)})))
    return writes


def _features(image: MetadataImage) -> Write:
    levels: Mapping[str, int] = image.features
    return Write("/feature", _json({"version": 2, "status": 1, "features": {
        name: {"min_version_level": 1, "max_version_level": level} for name, level in sorted(levels.items())}}))
