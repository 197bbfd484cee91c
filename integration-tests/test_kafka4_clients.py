"""kafka-python 3.x told it talks to Kafka 4.0 (``api_version=(4, 0)``), against a josef broker's group APIs.

With a fixed ``api_version`` kafka-python still asks ApiVersions, but only
to detect an older broker: it then picks each API's version from its own
Kafka 4.0 table (FindCoordinator v6, DescribeGroups v6, ...), capped where its
code caps it. Every request it frames is recorded, so the test proves which
versions were exercised, not only that the calls worked.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.parser import KafkaProtocol

KAFKA_4 = (4, 0)
TOPIC, GROUP, MISSING = "k4-orders", "k4-group", "k4-nobody"
PARTITIONS, RECORDS = 2, 10
DEADLINE_S = 60
FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 10, 8, 9, 15, 16, 42


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[tuple[int, int]]]:
    """(API key, version) of every request kafka-python frames, recorded where all of them are encoded."""
    versions: set[tuple[int, int]] = set()
    frame = KafkaProtocol.send_request

    def recording(self: KafkaProtocol, request: Any, correlation_id: int | None = None) -> int:
        correlation = frame(self, request, correlation_id)
        versions.add((request.API_KEY, request.API_VERSION))
        return correlation

    monkeypatch.setattr(KafkaProtocol, "send_request", recording)
    yield versions


def produce(bootstrap: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=KAFKA_4)
    for i in range(RECORDS):
        producer.send(TOPIC, value=f"v{i}".encode(), partition=i % PARTITIONS)
    producer.flush(timeout=30)
    producer.close()


def consume_all(consumer: KafkaConsumer) -> list[bytes]:
    """Poll until every produced record arrived (poll blocks for records; no sleeping)."""
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < RECORDS:
        assert time.monotonic() < deadline, f"only {len(values)} of {RECORDS} records arrived"
        for records in consumer.poll(timeout_ms=1000).values():
            values += [r.value for r in records]
    return values


def test_a_kafka4_consumer_group_and_admin_client(broker, sent):
    bootstrap = broker.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, api_version=KAFKA_4)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    produce(bootstrap)

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=KAFKA_4, group_id=GROUP,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.subscribe([TOPIC])
    values = consume_all(consumer)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(RECORDS))
    consumer.commit()
    per_partition = RECORDS // PARTITIONS
    assert [consumer.committed(TopicPartition(TOPIC, p)) for p in range(PARTITIONS)] == [per_partition] * PARTITIONS

    listed = {g["group_id"]: g for g in admin.list_groups()}
    assert listed[GROUP]["protocol_type"] == "consumer" and listed[GROUP]["group_state"] == "Stable"
    described = admin.describe_groups([GROUP, MISSING])
    group = described[GROUP]
    assert (group["error"], group["group_state"], group["protocol_type"]) == (None, "Stable", "consumer")
    (member,) = group["members"]
    assigned = {(t["topic"], p) for t in member["member_assignment"]["assigned_partitions"] for p in t["partitions"]}
    assert assigned == {(TOPIC, p) for p in range(PARTITIONS)}
    # DescribeGroups v6 (KIP-1043): a missing group is GROUP_ID_NOT_FOUND with a message, not a Dead group.
    assert described[MISSING]["group_state"] == "Dead"
    assert "GroupIdNotFound" in described[MISSING]["error"] and f"Group {MISSING} not found." in described[MISSING]["error"]
    offsets = admin.list_group_offsets({GROUP: None})[GROUP]
    assert {tp: o.offset for tp, o in offsets.items()} == {TopicPartition(TOPIC, p): per_partition
                                                          for p in range(PARTITIONS)}

    consumer.close()  # leaves the group (and waits for the answer): it is empty now
    assert admin.delete_groups([GROUP]) == {GROUP: "OK"}
    assert GROUP not in {g["group_id"] for g in admin.list_groups()}
    admin.close()

    # The versions Kafka 4.x clients send: FindCoordinator and DescribeGroups at their newest (v6),
    # the others at the newest kafka-python speaks (it caps OffsetCommit/OffsetFetch at v8).
    by_api: dict[int, set[int]] = {}
    for key, version in sent:
        by_api.setdefault(key, set()).add(version)
    assert by_api[FIND_COORDINATOR] == {6}
    assert by_api[DESCRIBE_GROUPS] == {6}
    assert (by_api[OFFSET_COMMIT], by_api[OFFSET_FETCH]) == ({8}, {8})
    assert (by_api[LIST_GROUPS], by_api[DELETE_GROUPS]) == ({5}, {2})
