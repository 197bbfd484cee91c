"""Logs are opened and deleted in a worker thread, after the metadata says so (ReplicaManager.apply_delta).

While a new partition's log is still opening, requests for it are answered
with the retriable NOT_LEADER_OR_FOLLOWER; once open, they are served. A
topic deleted and created again under the same name ends with an empty log
of the new topic: the old directory is renamed away first.
"""

import threading
import uuid

from kio.schema.errors import ErrorCode

from josef.protocol.records import build_batch, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient


def produce(client: RawClient, topic: str, value: bytes):
    answer = client.call(0, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": topic, "topic_id": uuid.UUID(int=0), "partition_data": [
            {"index": 0, "records": build_batch([(None, value, 1000)])}]}]})
    return answer.responses[0].partition_responses[0]


def fetch(client: RawClient, topic: str):
    answer = client.call(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
        "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "", "topics": [
            {"topic": topic, "topic_id": uuid.UUID(int=0), "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                 "log_start_offset": -1, "last_fetched_epoch": -1}]}]})
    return answer.responses[0].partitions[0]


class HeldOpens:
    """Makes the broker's storage wait before opening any log until :meth:`release` (the worker thread waits)."""

    def __init__(self, storage) -> None:
        self.storage = storage
        self.original = storage.open
        self.go = threading.Event()
        self.waiting = threading.Event()
        storage.open = self._open

    def _open(self, *args, **kwargs):
        self.waiting.set()
        self.go.wait(30)
        return self.original(*args, **kwargs)

    def release(self) -> None:
        self.go.set()
        self.storage.open = self.original


def test_a_partition_whose_log_is_opening_answers_not_leader_then_serves(josef_broker):
    broker = josef_broker.broker
    held = HeldOpens(broker.storage)
    josef_broker.call(broker.controller.create_topic, "opening", 1)
    assert held.waiting.wait(30)  # the worker thread is inside storage.open now, and stays there
    tp = TopicPartition("opening", 0)
    assert broker.replicas.get(tp) is None and broker.image.topics["opening"].partitions[0].leader == broker.node_id
    client = RawClient(josef_broker.port)
    assert produce(client, "opening", b"early").error_code == ErrorCode.not_leader_or_follower
    assert fetch(client, "opening").error_code == ErrorCode.not_leader_or_follower
    held.release()
    josef_broker.call(broker.replicas.storage_settled)
    assert broker.replicas.get(tp).is_leader
    written = produce(client, "opening", b"served")
    assert (written.error_code, written.base_offset) == (ErrorCode.none, 0)
    read = fetch(client, "opening")
    assert read.error_code == ErrorCode.none and read.high_watermark == 1
    client.close()


def test_delete_then_create_again_at_once_leaves_an_empty_log_of_the_new_topic(josef_broker):
    broker = josef_broker.broker
    client = RawClient(josef_broker.port)
    josef_broker.call(broker.controller.create_topic, "again", 1)
    josef_broker.call(broker.replicas.storage_settled)
    for n in range(3):
        assert produce(client, "again", b"old-%d" % n).error_code == ErrorCode.none
    old_id = broker.image.topics["again"].topic_id

    async def delete_and_create() -> None:  # one after the other on the loop: the worker sees both at once
        await broker.controller.delete_topic("again")
        await broker.controller.create_topic("again", 1)

    josef_broker.call(delete_and_create)
    josef_broker.call(broker.replicas.storage_settled)
    partition = broker.replicas.get(TopicPartition("again", 0))
    assert partition.topic_id == broker.image.topics["again"].topic_id != old_id
    assert (partition.log.log_start_offset, partition.log.log_end_offset) == (0, 0)
    written = produce(client, "again", b"new")
    assert (written.error_code, written.base_offset) == (ErrorCode.none, 0)
    read = fetch(client, "again")
    assert read.error_code == ErrorCode.none and read.high_watermark == 1
    assert len(list(iter_batches(read.records))) == 1 and b"new" in read.records and b"old" not in read.records
    client.close()


def test_delete_and_create_again_while_the_first_log_is_still_opening(josef_broker):
    """The first topic's opening, its deletion and the new topic's opening run in that order in the worker."""
    broker = josef_broker.broker
    held = HeldOpens(broker.storage)
    josef_broker.call(broker.controller.create_topic, "racing", 1)
    assert held.waiting.wait(30)

    async def delete_and_create() -> None:
        await broker.controller.delete_topic("racing")
        await broker.controller.create_topic("racing", 1)

    josef_broker.call(delete_and_create)
    held.release()
    josef_broker.call(broker.replicas.storage_settled)
    partition = broker.replicas.get(TopicPartition("racing", 0))
    assert partition.topic_id == broker.image.topics["racing"].topic_id
    assert partition.log.log_end_offset == 0 and not partition.log.closed
    client = RawClient(josef_broker.port)
    written = produce(client, "racing", b"new")
    assert (written.error_code, written.base_offset) == (ErrorCode.none, 0)
    client.close()
    live = [p.name for d in broker.storage.dirs for p in d.iterdir() if p.name.startswith("racing-")
            and not p.name.endswith("-delete")]
    assert live == ["racing-0"]
