"""Client quotas enforced: which entity's quota applies, throttle_time_ms in answers, muted connections, mutations.

Timing is only ever asserted as a lower bound (a muted connection answers
no sooner than its throttle time), which a slow machine cannot break.
"""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.server.quotas import PRODUCE, quota_for
from josef.testing import RawClient

ALTER = ApiKey.ALTER_CLIENT_QUOTAS


def test_the_most_specific_entity_with_the_quota_wins_in_kafkas_order():
    quotas = {
        (("client-id", "app"), ("user", "alice")): {PRODUCE: 1.0},
        (("client-id", None), ("user", "alice")): {PRODUCE: 2.0, "request_percentage": 50.0},
        (("user", "alice"),): {PRODUCE: 3.0, "consumer_byte_rate": 30.0},
        (("client-id", "app"), ("user", None)): {PRODUCE: 4.0},
        (("user", None),): {PRODUCE: 6.0},
        (("client-id", "app"),): {PRODUCE: 7.0},
        (("client-id", None),): {PRODUCE: 8.0, "consumer_byte_rate": 80.0},
    }
    assert quota_for(quotas, PRODUCE, "alice", "app") == ((PRODUCE, "alice", "app"), 1.0)
    assert quota_for(quotas, PRODUCE, "alice", "other") == ((PRODUCE, "alice", "other"), 2.0)
    assert quota_for(quotas, "consumer_byte_rate", "alice", "app") == (("consumer_byte_rate", "alice", ""), 30.0)
    assert quota_for(quotas, PRODUCE, "bob", "app") == ((PRODUCE, "bob", "app"), 4.0)
    assert quota_for(quotas, PRODUCE, "bob", "other") == ((PRODUCE, "bob", ""), 6.0)
    assert quota_for(quotas, "consumer_byte_rate", "bob", "x") == (("consumer_byte_rate", "", "x"), 80.0)
    assert quota_for(quotas, "controller_mutation_rate", "alice", "app") is None
    only_clients = {(("client-id", "app"),): {PRODUCE: 7.0}}
    assert quota_for(only_clients, PRODUCE, "ANONYMOUS", "app") == ((PRODUCE, "", "app"), 7.0)


def set_quota(client: RawClient, entity: list[tuple[str, str | None]], key: str, value: float) -> None:
    answer = client.call(ALTER, 1, {"validate_only": False, "entries": [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "ops": [{"key": key, "value": value, "remove": False}]}]})
    assert answer.entries[0].error_code == ErrorCode.none


def create_topic(client: RawClient, name: str) -> None:
    answer = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [{"name": name, "num_partitions": 1,
                                                               "replication_factor": 1, "assignments": [],
                                                               "configs": []}],
                                                   "timeout": 10000, "validate_only": False})
    assert answer.topics[0].error_code == ErrorCode.none


def produce(client: RawClient, topic: str, size: int):
    return client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": build_batch([(None, b"x" * size, 1000)])}]}]})


def test_a_producer_over_its_byte_rate_is_told_and_muted_for_as_long(josef_broker):
    admin = RawClient(josef_broker.port)
    create_topic(admin, "throttled")
    set_quota(admin, [("client-id", "raw")], PRODUCE, 50_000.0)
    # The rate is measured over at least ten one-second windows: 600 kB at once is 60 kB/s there, 1.2x the quota,
    # which takes (60 - 50) / 50 * 10 s = 2 s to come back to it.
    answer = produce(admin, "throttled", 600_000)
    throttle_ms = answer.throttle_time.total_seconds() * 1000
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
    assert 1_900 <= throttle_ms <= 2_200
    started = time.monotonic()
    admin.sock.settimeout(60)
    versions = admin.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert versions.error_code == ErrorCode.none
    assert time.monotonic() - started >= throttle_ms / 1000 * 0.95  # the connection read nothing meanwhile
    admin.close()
    samples = {(s.name, s.labels["client_id"]): s.value for family in josef_broker.broker.metrics.families()
               if family.name.startswith("kafka_server_produce_") for s in family.samples}
    assert samples[("kafka_server_produce_throttle_time", "raw")] == round(throttle_ms)
    assert samples[("kafka_server_produce_throttled_responses_total", "raw")] == 1
    assert samples[("kafka_server_produce_byte_rate", "raw")] > 50_000


def test_another_client_of_the_same_broker_is_not_slowed(josef_broker):
    limited = RawClient(josef_broker.port)
    create_topic(limited, "shared")
    set_quota(limited, [("client-id", "raw")], PRODUCE, 10_000.0)
    assert produce(limited, "shared", 600_000).throttle_time.total_seconds() > 0
    other = RawClient(josef_broker.port, client_id="unlimited")
    answer = produce(other, "shared", 600_000)
    assert answer.throttle_time.total_seconds() == 0
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
    limited.close()
    other.close()


def test_request_time_over_its_percentage_is_throttled_at_most_one_window(josef_broker):
    client = RawClient(josef_broker.port)
    set_quota(client, [("user", "ANONYMOUS")], "request_percentage", 0.0001)
    answer = client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                               "include_topic_authorized_operations": False})
    assert 0 < answer.throttle_time.total_seconds() * 1000 <= 1000
    client.close()


def test_partition_mutations_over_the_rate_are_refused_with_throttling_quota_exceeded(josef_broker):
    client = RawClient(josef_broker.port)
    set_quota(client, [("user", None)], "controller_mutation_rate", 1.0)

    def create(name: str, version: int):
        return client.call(ApiKey.CREATE_TOPICS, version, {
            "topics": [{"name": name, "num_partitions": 11, "replication_factor": 1, "assignments": [],
                        "configs": []}], "timeout": 10000, "validate_only": False})

    first = create("mutated-1", 6)
    assert first.topics[0].error_code == ErrorCode.none  # the rate was 0 before it; 11 partitions over 10 s: 1.1/s
    assert first.throttle_time.total_seconds() > 0
    second = create("mutated-2", 6)
    assert second.topics[0].error_code == ErrorCode.throttling_quota_exceeded
    assert second.throttle_time.total_seconds() > 0
    # Versions that do not know the error are served, then throttled (Kafka's permissive mode).
    old = create("mutated-3", 5)
    assert old.topics[0].error_code == ErrorCode.none and old.throttle_time.total_seconds() > 0
    client.close()
