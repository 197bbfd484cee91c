"""josef-client's share consumer against a real broker (the josef_broker fixture): configuration, the explicit
mode's rules, acknowledgement batching, and acknowledgements reported to the callback."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient, eventually
from josef_client.config import ConfigError
from josef_client.share_consumer import AcknowledgeType, IllegalStateError, ShareConsumer, _ack_batches


def test_acknowledgements_go_as_runs_of_one_type():
    acks = {5: AcknowledgeType.ACCEPT, 6: AcknowledgeType.ACCEPT, 7: AcknowledgeType.RELEASE, 9: AcknowledgeType.ACCEPT}
    assert _ack_batches(acks) == [{"first_offset": 5, "last_offset": 6, "acknowledge_types": [1]},
                                  {"first_offset": 7, "last_offset": 7, "acknowledge_types": [2]},
                                  {"first_offset": 9, "last_offset": 9, "acknowledge_types": [1]}]


@pytest.mark.parametrize("config", [{}, {"group.id": ""}, {"group.id": "g", "share.acknowledgement.mode": "maybe"},
                                    {"group.id": "g", "enable.auto.commit": True}])
def test_bad_configurations_fail_at_once(config):
    with pytest.raises(ConfigError):
        ShareConsumer({"bootstrap.servers": "127.0.0.1:1", **config})


@pytest.fixture
def topic(josef_broker):
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "work", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == ErrorCode.none
    yield client
    client.close()


def produce(client: RawClient, count: int) -> None:
    batch = build_batch([(None, b"job-%d" % i, int(time.time() * 1000)) for i in range(count)])
    answer = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": "work", "partition_data": [{"index": 0, "records": batch}]}]})
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none


def joined(consumer: ShareConsumer) -> None:
    consumer.subscribe(["work"])
    eventually(lambda: consumer.assignment() and not consumer.poll(100), 30, what="an assignment")


def take(consumer: ShareConsumer, count: int) -> list:
    records: list = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(500)
    return records


def test_explicit_mode_needs_every_record_acknowledged_before_the_next_poll(josef_broker, topic):
    consumer = ShareConsumer({"bootstrap.servers": josef_broker.bootstrap_servers, "group.id": "strict",
                              "share.acknowledgement.mode": "explicit"})
    outcomes: list = []
    consumer.set_acknowledgement_commit_callback(lambda offsets, error: outcomes.append((offsets, error)))
    try:
        joined(consumer)
        produce(topic, 3)
        records = take(consumer, 3)
        assert [(r.offset, r.value, r.delivery_count) for r in records] == [(0, b"job-0", 1), (1, b"job-1", 1),
                                                                           (2, b"job-2", 1)]
        consumer.acknowledge(records[0])
        with pytest.raises(IllegalStateError, match="2 records"):
            consumer.poll(0)
        for record in records[1:]:
            consumer.acknowledge(record, AcknowledgeType.REJECT)
        assert consumer.commit_sync() == {TopicPartition("work", 0): None}
        assert [(sorted(next(iter(o.values()))), e) for o, e in outcomes] == [([0, 1, 2], None)]
        with pytest.raises(IllegalStateError):
            consumer.acknowledge(records[0])  # no longer held
        assert consumer.poll(500) == []
    finally:
        consumer.close()


def test_implicit_mode_accepts_at_the_next_poll_and_refuses_acknowledge(josef_broker, topic):
    consumer = ShareConsumer({"bootstrap.servers": josef_broker.bootstrap_servers, "group.id": "easy"})
    try:
        joined(consumer)
        produce(topic, 2)
        records = take(consumer, 2)
        with pytest.raises(IllegalStateError):
            consumer.acknowledge(records[0])
        assert consumer.poll(500) == []  # accepted both
    finally:
        consumer.close()
    later = ShareConsumer({"bootstrap.servers": josef_broker.bootstrap_servers, "group.id": "easy"})
    try:
        later.subscribe(["work"])
        assert sum(len(later.poll(300)) for _ in range(5)) == 0, "accepted records came back"
    finally:
        later.close()
