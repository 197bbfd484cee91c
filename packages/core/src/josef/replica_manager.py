"""The partitions this broker hosts, kept in step with the metadata image.

The replica manager is the only place that creates, updates and removes
:class:`josef.partition.Partition` objects: it reacts to metadata deltas
(become leader, update ISR, delete a topic, new topic configs) and offers
the produce and fetch operations the API handlers call, with their waiting
(acks=all, long-poll fetch) done through the purgatory.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

import anyio
import anyio.to_thread

from josef.config import Config
from josef.log import LogConfig, LogDirError, LogStorage
from josef.metadata.image import MetadataDelta, MetadataImage
from josef.metadata.records import TOPIC_RESOURCE
from josef.partition import Partition
from josef.protocol.topic_partition import TopicPartition
from josef.purgatory import Purgatory

log = logging.getLogger(__name__)

#: Partitions that live in log storage but are not topics (a quorum's own log).
INTERNAL_LOGS = frozenset({"__cluster_metadata"})


class ReplicaManager:
    def __init__(self, broker_id: int, config: Config, storage: LogStorage) -> None:
        self.broker_id = broker_id
        self.config = config
        self.storage = storage
        self.partitions: dict[TopicPartition, Partition] = {}
        self.purgatory = Purgatory()

    def get(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    def topic_config(self, image: MetadataImage, topic: str) -> dict[str, Any]:
        overrides = self.config.definition.parse_topic_configs(image.config(TOPIC_RESOURCE, topic))
        return self.config.topic_config(overrides)

    # Metadata ---------------------------------------------------------------

    def load(self, image: MetadataImage) -> None:
        """At start-up: open every partition the image gives this broker; delete stray logs of deleted topics."""
        hosted = set()
        for topic in image.topics.values():
            for index, state in topic.partitions.items():
                if self.broker_id in state.replicas:
                    hosted.add(TopicPartition(topic.name, index))
        for tp in self.storage.stored():
            if tp not in hosted and tp.topic not in INTERNAL_LOGS:
                log.info("deleting stray log %s: its topic no longer exists", tp)
                self.storage.delete(tp)
        self.apply_delta(MetadataDelta(changed_partitions=tuple((tp.topic, tp.partition) for tp in sorted(hosted))), image)

    def apply_delta(self, delta: MetadataDelta, image: MetadataImage) -> None:
        for topic in delta.deleted_topics:
            for index in topic.partitions:
                self._remove(TopicPartition(topic.name, index))
        for name, index in delta.changed_partitions:
            topic = image.topics.get(name)
            if topic is None:
                continue
            state = topic.partitions[index]
            tp = TopicPartition(name, index)
            if self.broker_id not in state.replicas:
                self._remove(tp)
                continue
            partition = self.partitions.get(tp)
            if partition is None:
                config = self.topic_config(image, name)
                log_ = self.storage.open(tp, LogConfig.from_topic_config(config))
                partition = self.partitions[tp] = Partition(tp, topic.topic_id, self.broker_id, log_, config)
            partition.update_state(state)
            self.purgatory.notify(tp)
        for resource_type, name in delta.changed_configs:
            if resource_type == TOPIC_RESOURCE and name in image.topics:
                config = self.topic_config(image, name)
                for partition in self._partitions_of(name):
                    partition.update_config(config)

    def apply_broker_config(self, config: Config, image: MetadataImage) -> None:
        """Dynamic broker defaults changed: every topic's effective settings may have."""
        self.config = config
        for name in {tp.topic for tp in self.partitions}:
            topic_config = self.topic_config(image, name)
            for partition in self._partitions_of(name):
                partition.update_config(topic_config)

    def _partitions_of(self, topic: str) -> Iterable[Partition]:
        return [p for tp, p in self.partitions.items() if tp.topic == topic]

    def _remove(self, tp: TopicPartition) -> None:
        if self.partitions.pop(tp, None) is not None or tp in self.storage.stored():
            self.storage.delete(tp)
            self.purgatory.notify(tp)

    # Waiting ----------------------------------------------------------------

    async def wait_for_data(self, tps: Iterable[TopicPartition], timeout_ms: int) -> bool:
        return await self.purgatory.wait(tps, timeout_ms / 1000)

    def appended(self, tp: TopicPartition) -> None:
        """Wake fetchers of ``tp`` after an append moved its end or high watermark."""
        self.purgatory.notify(tp)

    # Log directories ----------------------------------------------------------

    async def move_log(self, partition: Partition, log_dir: str) -> None:
        """Move a hosted partition's log into ``log_dir`` (AlterReplicaLogDirs), copying in a worker thread.

        The partition keeps its :class:`josef.log.Log`: the storage switches
        it to the new directory under the log's own lock (the contract of
        :meth:`josef.log.LogStorage.move`), so appends and fetches from the
        event loop wait for the switch and never reach the old directory.
        """
        await anyio.to_thread.run_sync(self.storage.move, partition.tp, log_dir)

    # Housekeeping -------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        """Apply retention every ``log.retention.check.interval.ms``, in worker threads (deleting files blocks)."""
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await anyio.sleep(interval)
            await self.apply_retention()

    async def apply_retention(self) -> int:
        now = int(time.time() * 1000)
        deleted = 0
        for partition in list(self.partitions.values()):
            try:
                deleted += await anyio.to_thread.run_sync(partition.log.apply_retention, now)
            except LogDirError as exc:
                log.error("retention of %s failed: %s", partition.tp, exc)
        return deleted

    def close(self) -> None:
        self.partitions.clear()
        self.storage.close()

