"""Leader and ISR changes when a broker is fenced or comes back: pure functions of the image.

Both metadata backends use them, so a Raft controller and a ZooKeeper one
decide the same. They follow Kafka's ReplicationControlManager: a fenced
broker leaves every ISR it is in unless it is the last member (the ISR
never becomes empty, so the partition remembers who has its data); a
partition it led gets the first live replica of the remaining ISR, in
replica order, or no leader (-1) when none is live; when the broker is
unfenced, partitions without a leader whose ISR holds it are led by it
again. Unclean election (a leader from outside the ISR) is not done here.
"""

from __future__ import annotations

from typing import Iterator

from josef.metadata.image import MetadataImage, PartitionImage
from josef.metadata.records import NO_LEADER_CHANGE, PartitionChangeRecord, uuid_from_text

NO_LEADER = -1


def _live(image: MetadataImage, broker_id: int, leaving: int) -> bool:
    broker = image.brokers.get(broker_id)
    return broker_id != leaving and broker is not None and not broker.fenced


def _partitions(image: MetadataImage) -> Iterator[tuple[str, int, PartitionImage]]:
    for topic in image.topics.values():
        for index, partition in topic.partitions.items():
            yield topic.topic_id, index, partition


def broker_leaving(image: MetadataImage, broker_id: int) -> list[PartitionChangeRecord]:
    """Changes that take ``broker_id`` out of every ISR and leadership, before it is fenced or shut down."""
    changes = []
    for topic_id, index, p in _partitions(image):
        if broker_id not in p.isr and p.leader != broker_id:
            continue
        isr = tuple(r for r in p.isr if r != broker_id) or p.isr
        leader = p.leader
        if p.leader == broker_id:
            leader = next((r for r in p.replicas if r in isr and _live(image, r, broker_id)), NO_LEADER)
        if isr == p.isr and leader == p.leader:
            continue
        changes.append(PartitionChangeRecord(
            partition_id=index, topic_id=uuid_from_text(topic_id), isr=None if isr == p.isr else isr,
            leader=NO_LEADER_CHANGE if leader == p.leader else leader))
    return changes


def broker_returning(image: MetadataImage, broker_id: int) -> list[PartitionChangeRecord]:
    """Changes that make an unfenced ``broker_id`` leader of the leaderless partitions whose ISR holds it."""
    return [PartitionChangeRecord(partition_id=index, topic_id=uuid_from_text(topic_id), leader=broker_id)
            for topic_id, index, p in _partitions(image) if p.leader == NO_LEADER and broker_id in p.isr]
