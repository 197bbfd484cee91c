"""Remote sizes of a tiered topic, read from ``__remote_log_metadata`` records as tiered storage writes them."""

from __future__ import annotations

import uuid

import attrs
import pytest

from josef.metadata.image import PartitionImage, TopicImage
from josef.metadata.records import uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.protocol.topic_partition import TopicPartition
from josef.remote_log_metadata import TOPIC
from josef.remote_log_metadata.records import RemoteLogSegmentMetadataUpdate, encode, metadata_partition
from josef.remote_storage import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from josef_console import cluster
from josef_console.cluster import ClusterReader
from josef_console.remote import RemoteSizes

from console_fakes import FakeServices, ns

pytestmark = pytest.mark.anyio
ORDERS_ID = "AAAAAAAAAAAAAAAAAAAAAQ"


def segment(partition: int, size: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(uuid_from_text(ORDERS_ID), TopicPartition("orders", partition),
                                                       uuid.uuid4()), 0, 99, 0, 1, 0, size, {0: 0})


def finished(metadata: RemoteLogSegmentMetadata, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED):
    return RemoteLogSegmentMetadataUpdate(metadata.segment_id, None, state, 0, 1)


class MetadataLog:
    """The metadata partitions' records, answered to Fetch as their leader would, a few records per answer."""

    def __init__(self) -> None:
        self.records: dict[int, list[bytes]] = {}

    def write(self, partition: int, *records) -> None:
        self.records.setdefault(partition, []).extend(encode(r) for r in records)

    def fetch(self, node: int, body) -> ns:
        [topic] = body["topics"]
        [asked] = topic["partitions"]
        log = self.records.get(asked["partition"], [])
        start = asked["fetch_offset"]
        chunk = log[start:start + 2]
        records = b"".join(build_batch([(None, value, 0)], base_offset=start + i) for i, value in enumerate(chunk))
        return ns(error_code=0, responses=[ns(topic=TOPIC, partitions=[ns(
            partition_index=asked["partition"], error_code=0, high_watermark=len(log), records=records)])])


async def test_remote_sizes_count_the_segments_not_deleted_and_are_read_incrementally():
    services = FakeServices()
    services.image = attrs.evolve(services.image, topics={**services.image.topics, TOPIC: TopicImage(
        TOPIC, "AAAAAAAAAAAAAAAAAAAAAw", {p: PartitionImage((2,), (2,), 2, 0, 0) for p in range(3)})})
    log = MetadataLog()
    services.answers[ApiKey.FETCH] = log.fetch
    where = {p: metadata_partition(uuid_from_text(ORDERS_ID), p, 3) for p in range(3)}
    first, second, third = segment(0, 1000), segment(0, 500), segment(1, 300)
    log.write(where[0], first, finished(first), second, finished(second))
    log.write(where[1], third, finished(third))
    remote = RemoteSizes(ClusterReader(services))
    [orders] = cluster.topics(services.image, 1, names=["orders"])
    assert await remote.of(orders) == {0: 1500, 1: 300}
    fetches = len(services.calls)
    log.write(where[0], finished(first, RemoteLogSegmentState.DELETE_SEGMENT_STARTED),
              finished(first, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
    assert await remote.of(orders) == {0: 500, 1: 300}
    # Only what was written since was read (one Fetch with the two new records, one finding nothing more, per
    # metadata partition of orders' partitions).
    assert all(body["topics"][0]["partitions"][0]["fetch_offset"] > 0 for _, _, body in services.calls[fetches:])


async def test_a_cluster_that_never_tiered_anything_has_no_remote_sizes():
    services = FakeServices()
    [orders] = cluster.topics(services.image, 1, names=["orders"])
    assert await RemoteSizes(ClusterReader(services)).of(orders) == {}
    assert services.calls == []
