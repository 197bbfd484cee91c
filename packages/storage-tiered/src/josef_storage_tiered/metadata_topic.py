"""The remote log metadata in ``__remote_log_metadata``, as Kafka's TopicBasedRemoteLogMetadataManager keeps it.

Every event of a remote segment's life (copy started, copy finished,
delete started, delete finished) is a record in the partition of the
metadata topic that its user partition hashes to, in Kafka's format
(:mod:`josef.remote_log_metadata.records`), written with ``acks=all``
by the user partition's leader. Every broker reads the metadata partitions
of the tiered partitions it hosts into its cache, so a new leader knows
exactly what is remote, and a follower what it may delete locally. As in
Kafka, a write returns only once this broker has read it back: the cache
then reflects it, and the order of events is the topic's.

The topic is created by the first broker that needs it, with
``rlmm.config.remote.log.metadata.topic.num.partitions`` (50),
``.replication.factor`` (3) and ``.retention.ms`` (-1, forever). Requests
go through :meth:`josef.services.BrokerServices.call_peer`; reads poll
without waiting at the leader, so they never hold the connection other
inter-broker requests share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from josef.config import Config
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef.protocol.records import build_batch, iter_batches, iter_records
from josef.remote_log_metadata import TOPIC
from josef.remote_log_metadata.records import decode, encode
from josef.services import BrokerServices
from josef_storage_tiered.broker_config import metadata_topic_setting

log = logging.getLogger(__name__)

#: How long a read waits before polling again when it found nothing new.
POLL_INTERVAL_S = 0.2
#: The wait after a failed request (a leader moving, a broker restarting).
RETRY_S = 0.5


class MetadataTopic:
    """Writes to and reads from ``__remote_log_metadata`` for one broker; read records go to ``apply``."""

    def __init__(self, services: BrokerServices, config: Config, apply: Callable[[Any, set[Any] | None], None],
                 caught_up: Callable[[int], None]) -> None:
        """``apply(record, only)`` gets each record read; while a partition is read again for user partitions
        that joined it late, ``only`` names those (the others saw the records before). ``caught_up(partition)`` is
        called whenever a metadata partition has been read to its end after something joined it."""
        self._services = services
        self._apply = apply
        self._on_caught_up = caught_up
        self.partitions = metadata_topic_setting(config, "remote.log.metadata.topic.num.partitions")
        self._replication = metadata_topic_setting(config, "remote.log.metadata.topic.replication.factor")
        self._retention_ms = metadata_topic_setting(config, "remote.log.metadata.topic.retention.ms")
        #: Metadata partitions this broker reads, and the next offset of each.
        self._positions: dict[int, int] = {}
        #: The user partitions (their keys) whose records each metadata partition holds, as far as we follow them.
        self._keys: dict[int, set[Any]] = {}
        #: Metadata partitions read again from their start for keys that joined late: (those keys, read again up to).
        self._replay: dict[int, tuple[set[Any], int]] = {}
        #: Partitions read up to their high watermark once: what was written before is in the cache.
        self._caught_up: set[int] = set()
        self._read_more = anyio.Event()
        #: Set (and replaced) after every round of reads.
        self._progress = anyio.Event()
        self.ready = anyio.Event()

    # Following partitions ------------------------------------------------------------------

    def follow(self, partition: int, key: Any) -> None:
        """Read the records of user partition ``key`` in metadata partition ``partition`` (which it hashes to),
        from the start: a partition followed already for others is read again, for ``key`` alone."""
        keys = self._keys.setdefault(partition, set())
        if key in keys:
            return
        keys.add(key)
        position = self._positions.get(partition, 0)
        if position > 0:
            late, until = self._replay.get(partition, (set(), 0))
            self._replay[partition] = (late | {key}, max(until, position))
        self._positions[partition] = 0
        self._caught_up.discard(partition)
        self._read_more.set()

    def caught_up(self, partition: int) -> bool:
        """Whether this broker has read ``partition`` up to its end at least once: a leader copies segments only
        then, knowing every earlier event (Kafka's RLMM ``isReady``)."""
        return partition in self._caught_up

    # Writing -----------------------------------------------------------------------------------

    async def publish(self, partition: int, record: Any) -> None:
        """Write ``record`` to ``partition`` (acks=all), then wait until this broker has read it back.

        Retries while the metadata partition has no leader or its leader
        moves; raises only when cancelled.
        """
        value = encode(record)
        while True:
            offset = await self._produce(partition, value)
            if offset is not None:
                break
            await anyio.sleep(RETRY_S)
        while self._positions[partition] <= offset:
            progress = self._progress
            self._read_more.set()
            await progress.wait()

    async def _produce(self, partition: int, value: bytes) -> int | None:
        leader = self._leader(partition)
        if leader is None:
            return None
        batch = build_batch([(None, value, int(time.time() * 1000))])
        try:
            answer = await self._services.call_peer(leader, ApiKey.PRODUCE, {
                "transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": [
                    {"name": TOPIC, "partition_data": [{"index": partition, "records": batch}]}]}, version=9)
        except (KafkaConnectionError, KafkaTimeoutError) as exc:  # the leader stopped or moved: ask again
            log.debug("writing to %s-%d at broker %d failed: %r", TOPIC, partition, leader, exc)
            return None
        result = answer.responses[0].partition_responses[0]
        if result.error_code != ErrorCode.none:
            log.debug("writing to %s-%d at broker %d: %s", TOPIC, partition, leader, result.error_code.name)
            return None
        return result.base_offset

    def _leader(self, partition: int) -> int | None:
        topic = self._services.image.topics.get(TOPIC)
        state = topic.partitions.get(partition) if topic is not None else None
        return state.leader if state is not None and state.leader >= 0 else None

    # Reading -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Create the topic if it is missing, then read the followed partitions until cancelled."""
        while not await self._create():
            await anyio.sleep(RETRY_S)
        self.ready.set()
        while True:
            if not self._positions:
                await self._read_more.wait()
            self._read_more = anyio.Event()
            read = await self._read_once()
            self._progress.set()
            self._progress = anyio.Event()
            if not read:
                with anyio.move_on_after(POLL_INTERVAL_S):
                    await self._read_more.wait()

    async def _create(self) -> bool:
        if TOPIC in self._services.image.topics and self._services.image.topics[TOPIC].partitions:
            return True
        try:
            answer = await self._services.call_peer(self._services.node_id, ApiKey.CREATE_TOPICS, {
                "topics": [{"name": TOPIC, "num_partitions": self.partitions, "replication_factor": self._replication,
                            "assignments": [], "configs": [
                                {"name": "retention.ms", "value": str(self._retention_ms)},
                                {"name": "cleanup.policy", "value": "delete"}]}],
                "timeout": 30_000, "validate_only": False}, version=7)
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            log.info("cannot create %s yet: %r", TOPIC, exc)
            return False
        code = answer.topics[0].error_code
        if code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.warning("cannot create %s: %s %s", TOPIC, code.name, answer.topics[0].error_message or "")
            return False
        return TOPIC in self._services.image.topics

    async def _read_once(self) -> int:
        """One fetch from each leader of the followed partitions; returns how many records were applied."""
        by_leader: dict[int, list[int]] = {}
        for partition in self._positions:
            leader = self._leader(partition)
            if leader is not None:
                by_leader.setdefault(leader, []).append(partition)
        applied = 0
        for leader, partitions in by_leader.items():
            asked = {p: self._positions[p] for p in partitions}
            try:
                answer = await self._services.call_peer(leader, ApiKey.FETCH, {
                    "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 8 << 20, "isolation_level": 0,
                    "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
                    "topics": [{"topic": TOPIC, "partitions": [
                        {"partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                         "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}
                        for p, offset in asked.items()]}]}, version=12)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                log.debug("reading %s from broker %d failed: %r", TOPIC, leader, exc)
                continue
            for topic in answer.responses:
                for part in topic.partitions:
                    if part.error_code != ErrorCode.none:
                        continue
                    partition = part.partition_index
                    if self._positions.get(partition) != asked.get(partition):
                        continue  # followed again from its start while the fetch ran: that read comes next
                    applied += self._apply_records(partition, bytes(part.records or b""))
                    if self._positions[partition] >= part.high_watermark and partition not in self._caught_up:
                        self._caught_up.add(partition)
                        self._on_caught_up(partition)
        return applied

    def _apply_records(self, partition: int, data: bytes) -> int:
        applied = 0
        for position, header in iter_batches(data):
            if header.last_offset < self._positions[partition]:
                continue
            late, until = self._replay.get(partition, (None, 0))
            for record in iter_records(data[position:position + header.size]):
                if record.offset < self._positions[partition] or record.value is None:
                    continue
                try:
                    self._apply(decode(record.value), late if record.offset < until else None)
                except ValueError as exc:  # Kafka's manager skips what it cannot read, and so do we
                    log.error("%s-%d offset %d: cannot apply: %s", TOPIC, partition, record.offset, exc)
                applied += 1
            self._positions[partition] = header.last_offset + 1
            if self._positions[partition] >= until:
                self._replay.pop(partition, None)
        return applied
