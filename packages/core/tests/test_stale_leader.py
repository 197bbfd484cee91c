"""A broker whose metadata is behind (frozen, then resumed, still thinking it leads) refuses clients that have seen a
newer leader epoch, over a real socket: it must not answer from its stale log (a consumer would reset its position)."""

import time

import pytest
from kio.schema.errors import ErrorCode as E

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.testing import RawClient


@pytest.fixture
def client(josef_broker):
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    batch = build_batch([(None, b"v", int(time.time() * 1000))])
    produced = client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
    assert produced.responses[0].partition_responses[0].error_code == E.none
    yield client
    client.close()


def end_of_epoch(client, epoch):
    answer = client.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [
        {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": 0, "leader_epoch": epoch}]}]})
    return answer.topics[0].partitions[0]


def fetch(client, last_fetched_epoch):
    answer = client.call(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": 0, "fetch_offset": 1, "last_fetched_epoch": last_fetched_epoch,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    return answer.responses[0].partitions[0]


def test_offset_for_leader_epoch_refuses_an_epoch_newer_than_the_brokers_own(client):
    known = end_of_epoch(client, 0)
    assert (known.error_code, known.leader_epoch, known.end_offset) == (E.none, 0, 1)
    newer = end_of_epoch(client, 1)  # Kafka would answer (-1, -1): "truncated", and librdkafka resets to earliest
    assert newer.error_code == E.unknown_leader_epoch


def test_a_fetch_after_records_of_a_newer_epoch_is_refused(client):
    assert fetch(client, 0).error_code == E.none
    assert fetch(client, 1).error_code == E.unknown_leader_epoch
