"""``__remote_log_metadata`` read from outside the brokers: what remote storage holds of some partitions.

Tools and readers that are not brokers (``josef log-dirs describe
--remote``, josef-spark's ``remoteReads=direct``) learn what is in remote
storage as a broker does: by reading the metadata partitions the user
partitions hash to, from their beginning to their current end, into the
same caches (:class:`~josef_storage_tiered.metadata_cache.RemotePartitionMetadataStore`).
They read with josef's client (josef-client, which such callers have), so a
principal needs READ on the topic, as any consumer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from josef.metadata.records import uuid_from_text
from josef.protocol.topic_partition import TopicPartition

from josef_storage_tiered.metadata_cache import RemoteLogMetadataCache, RemotePartitionMetadataStore
from josef_storage_tiered.metadata_records import decode, metadata_partition
from josef_storage_tiered.metadata_topic import TOPIC

log = logging.getLogger(__name__)

#: How long a poll of the metadata topic waits, in ms.
POLL_MS = 1000


def remote_log_metadata(config: Mapping[str, Any], partitions: Iterable[tuple[str, int]]
                        ) -> dict[tuple[str, int], RemoteLogMetadataCache]:
    """The remote log metadata of each of ``partitions`` that remote storage holds anything of.

    ``config`` is a josef-client configuration (``bootstrap.servers``,
    security settings, ``group.id`` for ACLs and quotas: nothing is
    committed). Partitions of unknown topics, and all of them when no
    broker ever created the metadata topic, are left out.
    """
    from josef_client import Admin, Consumer, KafkaError

    partitions = sorted(set(partitions))
    admin_config = {k: v for k, v in config.items() if k not in ("group.id", "isolation.level")}
    with Admin(admin_config) as admin:
        described = admin.describe_topics(sorted({t for t, _ in partitions} | {TOPIC}), raise_errors=False)
    metadata = described.get(TOPIC)
    if metadata is None or isinstance(metadata, KafkaError) or not metadata.partitions:
        return {}
    store = RemotePartitionMetadataStore()
    keys: dict[tuple[str, int], tuple[uuid.UUID, TopicPartition]] = {}
    wanted: set[int] = set()
    for topic, partition in partitions:
        description = described.get(topic)
        if description is None or isinstance(description, KafkaError) or not description.topic_id:
            continue
        topic_id = uuid_from_text(description.topic_id)
        keys[(topic, partition)] = (topic_id, TopicPartition(topic, partition))
        store.load_partition(*keys[(topic, partition)])
        wanted.add(metadata_partition(topic_id, partition, len(metadata.partitions)))
    if not wanted:
        return {}
    consumer = Consumer({**config, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_uncommitted"})
    try:
        assigned = [TopicPartition(TOPIC, p) for p in sorted(wanted)]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        ends = consumer.end_offsets(assigned)
        waiting = {tp for tp in assigned if consumer.position(tp) < ends[tp]}
        while waiting:
            for records in consumer.poll(timeout_ms=POLL_MS).values():
                for record in records:
                    if record.value is None:
                        continue
                    try:
                        store.handle(decode(record.value))
                    except ValueError as exc:  # as a broker does: one unreadable record does not stop the rest
                        log.error("%s-%d offset %d: cannot apply: %s", record.topic, record.partition, record.offset,
                                  exc)
            waiting = {tp for tp in waiting if consumer.position(tp) < ends[tp]}
    finally:
        consumer.close()
    found = {}
    for tp, key in keys.items():
        cache = store.load_partition(*key)
        if len(cache):
            found[tp] = cache
    return found
