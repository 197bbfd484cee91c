"""Bytes in remote storage of tiered partitions, as the brokers count them (Kafka's RemoteLogSizeBytes).

Tiered storage (KIP-405) records every segment it copies in
``__remote_log_metadata``; a partition's remote size is the size of the
segments listed there that are not deleted. The console reads the metadata
partitions a topic's partitions hash to, through Fetch requests to their
leaders, into the core's own caches (:mod:`josef.remote_log_metadata.cache`),
the way ``josef log-dirs describe --remote`` reads them as a consumer.

The reading is incremental: each metadata partition keeps its position,
and a page asks only for what was written since. A topic seen for the first
time in a metadata partition already read makes that partition be read again
from its start (its earlier records were skipped, since the caches keep only
the partitions they are told of).
"""

from __future__ import annotations

import logging
import uuid

import anyio
import attrs

from josef.metadata.records import uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import check
from josef.protocol.records import iter_batches, iter_records
from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata import TOPIC
from josef.remote_log_metadata.cache import RemotePartitionMetadataStore
from josef.remote_log_metadata.records import decode, metadata_partition
from josef_console.cluster import ClusterReader
from josef_console.model import Topic

log = logging.getLogger(__name__)

#: Bytes one Fetch may bring back.
FETCH_BYTES = 1 << 20
#: At most this many Fetch requests per metadata partition per page: a page shows what was read so far, and the next
#: refresh goes on from there, rather than one page waiting for a long topic to be read.
FETCHES_PER_PAGE = 16

Key = tuple[uuid.UUID, TopicPartition]


@attrs.define
class MetadataPartition:
    """One partition of ``__remote_log_metadata`` as read so far, for the user partitions in ``keys``."""

    keys: frozenset[Key]
    store: RemotePartitionMetadataStore
    position: int = 0


class RemoteSizes:
    """Remote bytes per partition of tiered topics, read on request."""

    def __init__(self, reader: ClusterReader) -> None:
        self._reader = reader
        self._partitions: dict[int, MetadataPartition] = {}
        self._lock = anyio.Lock()

    async def of(self, topic: Topic) -> dict[int, int]:
        """Each partition's bytes in remote storage (partitions remote storage holds nothing of are absent)."""
        image = self._reader.image
        metadata = image.topics.get(TOPIC)
        if metadata is None or not metadata.partitions:
            return {}  # nothing was ever tiered in this cluster
        topic_id = uuid_from_text(topic.topic_id)
        keys = {p.partition: (topic_id, TopicPartition(topic.name, p.partition)) for p in topic.partitions}
        by_metadata_partition: dict[int, set[Key]] = {}
        for partition, key in keys.items():
            by_metadata_partition.setdefault(metadata_partition(topic_id, partition, len(metadata.partitions)),
                                             set()).add(key)
        sizes = {}
        async with self._lock:
            for number, wanted in sorted(by_metadata_partition.items()):
                state = self._partitions.get(number)
                if state is None or not wanted <= state.keys:
                    every = frozenset(wanted | (state.keys if state is not None else set()))
                    store = RemotePartitionMetadataStore()
                    for key in every:
                        store.load_partition(*key)
                    state = self._partitions[number] = MetadataPartition(every, store)
                leader = metadata.partitions[number].leader
                if leader >= 0:
                    await self._catch_up(number, state, leader)
                for key in wanted:
                    cache = state.store.load_partition(*key)
                    if len(cache):
                        sizes[key[1].partition] = cache.remote_log_size()
        return sizes

    async def _catch_up(self, number: int, state: MetadataPartition, leader: int) -> None:
        for _ in range(FETCHES_PER_PAGE):
            response = await self._reader.call(leader, ApiKey.FETCH, {
                "cluster_id": None, "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": FETCH_BYTES,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": TOPIC, "partitions": [{
                    "partition": number, "current_leader_epoch": -1, "fetch_offset": state.position,
                    "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": FETCH_BYTES}]}],
                "forgotten_topics_data": [], "rack_id": ""}, version=12)
            check(response.error_code)
            [answer] = [p for t in response.responses for p in t.partitions]
            check(answer.error_code)
            records = bytes(answer.records or b"")
            position = state.position
            for pos, header in iter_batches(records):
                if header.last_offset < position:
                    continue
                if not header.is_control:
                    for record in iter_records(memoryview(records)[pos:pos + header.size]):
                        if record.offset >= position and record.value is not None:
                            try:
                                state.store.handle(decode(record.value))
                            except ValueError as exc:  # as a broker does: one unreadable record does not stop the rest
                                log.warning("%s-%d offset %d: cannot apply: %s", TOPIC, number, record.offset, exc)
                position = header.last_offset + 1
            if position == state.position:
                return  # nothing new
            state.position = position
            if position >= answer.high_watermark:
                return
