"""What remote storage holds of some partitions, read from ``__remote_log_metadata`` outside the brokers.

Tools and readers that are not brokers (``josef log-dirs describe
--remote``, josef-spark's ``remoteReads=direct``) learn what tiered storage
copied as a broker does: they read the metadata partitions the user
partitions hash to, from their beginning to their current end, into the
brokers' own caches (:mod:`josef.remote_log_metadata.cache`). They read as
an ordinary consumer, so a principal needs READ on the topic; nothing is
committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from josef.metadata.records import uuid_from_text
from josef.protocol.errors import KafkaError
from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata import TOPIC
from josef.remote_log_metadata.cache import RemoteLogMetadataCache, RemotePartitionMetadataStore
from josef.remote_log_metadata.records import decode, metadata_partition
from josef_client.admin import Admin
from josef_client.consumer import Consumer

log = logging.getLogger(__name__)

#: How long one poll of the metadata topic waits, in ms.
POLL_MS = 1000


def remote_log_metadata(config: Mapping[str, Any], partitions: Iterable[tuple[str, int]], admin: Admin | None = None
                        ) -> dict[tuple[str, int], RemoteLogMetadataCache]:
    """The remote log metadata of each of ``partitions`` (topic, partition) that remote storage holds anything of.

    ``config`` is a consumer's configuration (``bootstrap.servers``,
    security settings, a ``group.id`` for ACLs and quotas). Partitions of
    unknown topics, and all of them while no broker has created the
    metadata topic, are left out. ``admin``, when given, describes the
    topics (else one is made from ``config``).
    """
    partitions = sorted(set(partitions))
    topics = sorted({t for t, _ in partitions} | {TOPIC})
    if admin is None:
        with Admin({k: v for k, v in config.items() if k not in ("group.id", "isolation.level")}) as own:
            described = own.describe_topics(topics, raise_errors=False)
    else:
        described = admin.describe_topics(topics, raise_errors=False)
    metadata = described.get(TOPIC)
    if metadata is None or isinstance(metadata, KafkaError) or not metadata.partitions:
        return {}  # no broker has tiered anything yet
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
    if wanted:
        _replay(config, sorted(wanted), store)
    found = {}
    for tp, key in keys.items():
        cache = store.load_partition(*key)
        if len(cache):
            found[tp] = cache
    return found


def _replay(config: Mapping[str, Any], wanted: list[int], store: RemotePartitionMetadataStore) -> None:
    """Apply the records of the metadata partitions ``wanted``, from their beginning to their end as of now."""
    consumer = Consumer({**config, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_uncommitted"})
    try:
        assigned = [TopicPartition(TOPIC, p) for p in wanted]
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
