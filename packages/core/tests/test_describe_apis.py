"""DescribeCluster, DescribeTopicPartitions and DescribeProducers over a real socket against the in-process broker."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.image import BrokerImage
from josef.metadata.records import Endpoint, PartitionChangeRecord, random_uuid, uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.testing import RawClient

E = ErrorCode
BROKERS, CONTROLLERS = 1, 2
TWO_LISTENERS = pytest.mark.josef_config(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")


def ports(josef_broker) -> tuple[int, int]:
    """The PLAINTEXT and CONTROLLER listeners' ports."""
    bound = {b.name: b.port for b in josef_broker.broker.bound}
    return bound["PLAINTEXT"], bound["CONTROLLER"]


def create_topics(client: RawClient, partitions: dict[str, int]) -> None:
    response = client.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 10000, "validate_only": False, "topics": [
        {"name": name, "num_partitions": count, "replication_factor": 1, "assignments": [], "configs": []}
        for name, count in partitions.items()]})
    assert [t.error_code for t in response.topics] == [E.none] * len(partitions)


# DescribeCluster ----------------------------------------------------------------


def describe_cluster(port: int, version: int, endpoint_type: int = BROKERS, include_fenced: bool = False):
    return RawClient(port).call(ApiKey.DESCRIBE_CLUSTER, version, {
        "include_cluster_authorized_operations": False, "endpoint_type": endpoint_type,
        "include_fenced_brokers": include_fenced})


@TWO_LISTENERS
@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_cluster_brokers_on_a_broker_listener(josef_broker, version):
    broker_port, controller_port = ports(josef_broker)
    answer = describe_cluster(broker_port, version)
    assert (answer.error_code, answer.controller_id, answer.cluster_id) == (E.none, 1, josef_broker.broker.cluster_id)
    assert [(b.broker_id, b.host, b.port) for b in answer.brokers] == [(1, "127.0.0.1", broker_port)]
    assert answer.cluster_authorized_operations == -(2**31)
    if version >= 1:
        assert answer.endpoint_type == BROKERS
    # The controller listener is not a broker endpoint: v0 cannot say which kind it wanted.
    assert describe_cluster(controller_port, version).error_code == (
        E.invalid_request if version == 0 else E.mismatched_endpoint_type)


@TWO_LISTENERS
@pytest.mark.parametrize("version", [1, 2])
def test_describe_cluster_controllers_only_on_a_controller_listener(josef_broker, version):
    broker_port, controller_port = ports(josef_broker)
    answer = describe_cluster(controller_port, version, CONTROLLERS)
    assert (answer.error_code, answer.endpoint_type, answer.controller_id) == (E.none, CONTROLLERS, 1)
    assert [(b.broker_id, b.host, b.port) for b in answer.brokers] == [(1, "127.0.0.1", controller_port)]
    refused = describe_cluster(broker_port, version, CONTROLLERS)
    assert (refused.error_code, refused.brokers) == (E.mismatched_endpoint_type, ())
    assert "type BROKER, but we wanted an endpoint of type CONTROLLER" in refused.error_message


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("endpoint_type", [0, 3, -1])
def test_describe_cluster_unknown_endpoint_type(josef_broker, version, endpoint_type):
    answer = describe_cluster(josef_broker.port, version, endpoint_type)
    assert (answer.error_code, answer.brokers) == (E.unsupported_endpoint_type, ())
    assert answer.error_message == f"Unsupported endpoint type {endpoint_type}"


def test_describe_cluster_v2_lists_fenced_brokers_only_when_asked(josef_broker):
    fenced = BrokerImage(2, (Endpoint("PLAINTEXT", "elsewhere", 9092),), "r2", True, 7, random_uuid()).to_record()
    josef_broker.call(josef_broker.broker.quorum.append, [fenced])
    listed = describe_cluster(josef_broker.port, 2, include_fenced=True).brokers
    assert [(b.broker_id, b.is_fenced, b.rack) for b in listed] == [(1, False, None), (2, True, "r2")]
    assert [b.broker_id for b in describe_cluster(josef_broker.port, 2).brokers] == [1]
    # Before v2 fenced brokers are never shown.
    assert [b.broker_id for b in describe_cluster(josef_broker.port, 1, include_fenced=True).brokers] == [1]


# DescribeTopicPartitions -------------------------------------------------------

TOPICS = {"charlie": 4, "alpha": 3, "bravo": 2}
EVERY_PARTITION = [(name, index) for name in sorted(TOPICS) for index in range(TOPICS[name])]


def describe_partitions(client: RawClient, names, limit: int = 2000, cursor=None):
    return client.call(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {
        "topics": [{"name": n} for n in names], "response_partition_limit": limit, "cursor": cursor})


@pytest.mark.parametrize(("limit", "pages"), [(3, 4), (4, 3), (9, 2), (10, 1)])
def test_describe_topic_partitions_pages_with_the_cursor(josef_broker, limit, pages):
    client = RawClient(josef_broker.port)
    create_topics(client, TOPICS)
    requested = ["charlie", "missing", "alpha", "bravo"]
    seen, missing, cursors = [], [], []
    cursor = None
    while True:
        answer = describe_partitions(client, requested, limit, cursor)
        assert sum(len(t.partitions) for t in answer.topics) <= limit
        for topic in answer.topics:
            if topic.error_code == E.unknown_topic_or_partition:
                missing.append(topic.name)
                continue
            assert topic.error_code == E.none
            seen += [(topic.name, p.partition_index) for p in topic.partitions]
        if answer.next_cursor is None:
            break
        cursor = {"topic_name": answer.next_cursor.topic_name, "partition_index": answer.next_cursor.partition_index}
        cursors.append(tuple(cursor.values()))
    assert seen == EVERY_PARTITION  # each once, topics by name, partitions in order
    assert missing == ["missing"]
    assert len(cursors) + 1 == pages
    if limit == 3:
        # A topic that fills a page exactly sends the client on to the next topic's first partition,
        # even to one that does not exist.
        assert cursors == [("bravo", 0), ("charlie", 1), ("missing", 0)]


def test_describe_topic_partitions_details(josef_broker):
    client = RawClient(josef_broker.port)
    create_topics(client, {"details": 2})
    (topic,) = describe_partitions(client, ["details"]).topics
    image = josef_broker.broker.image.topics["details"]
    assert (topic.name, topic.topic_id, topic.is_internal) == ("details", uuid_from_text(image.topic_id), False)
    # Kafka always reports them here (the request has no flag): with allow-all, every operation a topic has.
    assert topic.topic_authorized_operations == sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
    assert [(p.error_code, p.partition_index, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes,
             p.eligible_leader_replicas, p.last_known_elr, p.offline_replicas) for p in topic.partitions] == [
        (E.none, i, 1, image.partitions[i].leader_epoch, (1,), (1,), (), (), ()) for i in (0, 1)]
    assert describe_partitions(client, ["details"]).next_cursor is None


def test_describe_topic_partitions_of_every_topic(josef_broker):
    client = RawClient(josef_broker.port)
    create_topics(client, TOPICS)
    answer = describe_partitions(client, [])
    names = [t.name for t in answer.topics]
    assert names == sorted(josef_broker.broker.image.topics) and set(TOPICS) <= set(names)
    assert all(t.error_code == E.none for t in answer.topics)
    # With no topic list the cursor's topic need not be given; topics before it are left out.
    resumed = describe_partitions(client, [], cursor={"topic_name": "bravo", "partition_index": 1})
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in resumed.topics[:2]] == [
        ("bravo", [1]), ("charlie", [0, 1, 2, 3])]


def test_describe_topic_partitions_bad_requests(josef_broker):
    client = RawClient(josef_broker.port)
    create_topics(client, TOPICS)
    outside = describe_partitions(client, ["alpha", "bravo"], cursor={"topic_name": "charlie", "partition_index": 0})
    assert [(t.name, t.error_code) for t in outside.topics] == [("alpha", E.invalid_request), ("bravo", E.invalid_request)]
    negative = describe_partitions(client, ["alpha"], cursor={"topic_name": "alpha", "partition_index": -1})
    assert [t.error_code for t in negative.topics] == [E.invalid_request]
    odd = describe_partitions(client, ["bad name!", "nope"]).topics
    assert [(t.name, t.error_code, t.partitions) for t in odd] == [
        ("bad name!", E.invalid_topic_exception, ()), ("nope", E.unknown_topic_or_partition, ())]
    # A limit below one still answers one partition, as Kafka does.
    tiny = describe_partitions(client, ["alpha"], limit=0)
    assert [len(t.partitions) for t in tiny.topics] == [1]
    assert (tiny.next_cursor.topic_name, tiny.next_cursor.partition_index) == ("alpha", 1)


# DescribeProducers -------------------------------------------------------------


def produce(client: RawClient, topic: str, batch: bytes) -> None:
    response = client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout": 10000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    assert response.responses[0].partition_responses[0].error_code == E.none


def test_describe_producers_after_idempotent_produce(josef_broker):
    client = RawClient(josef_broker.port)
    create_topics(client, {"idem": 2})
    init = client.call(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60000,
                                                    "producer_id": -1, "producer_epoch": -1})
    assert init.error_code == E.none
    pid, epoch = init.producer_id, init.producer_epoch
    produce(client, "idem", build_batch([(None, b"v", 1000 + i) for i in range(3)], producer_id=pid,
                                        producer_epoch=epoch, base_sequence=0))
    produce(client, "idem", build_batch([(None, b"v", 2000), (None, b"v", 2500)], producer_id=pid,
                                        producer_epoch=epoch, base_sequence=3))
    produce(client, "idem", build_batch([(None, b"plain", 3000)]))  # not idempotent: no producer state

    answer = client.call(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [
        {"name": "idem", "partition_indexes": [0, 1, 7]}, {"name": "nope", "partition_indexes": [0]}]})
    idem, nope = answer.topics
    assert [(p.partition_index, p.error_code) for p in idem.partitions] == [
        (0, E.none), (1, E.none), (7, E.unknown_topic_or_partition)]
    (producer,) = idem.partitions[0].active_producers
    assert (producer.producer_id, producer.producer_epoch, producer.last_sequence, producer.last_timestamp,
            producer.coordinator_epoch, producer.current_txn_start_offset) == (pid, epoch, 4, 2500, -1, -1)
    assert idem.partitions[1].active_producers == ()
    assert (nope.name, [(p.partition_index, p.error_code) for p in nope.partitions]) == (
        "nope", [(0, E.unknown_topic_or_partition)])


def test_describe_topic_partitions_reports_eligible_leader_replicas(josef_broker):
    """KIP-966's fields come from the partition's registration; Metadata has none to report."""
    client = RawClient(josef_broker.port)
    create_topics(client, {"elr": 1})
    broker = josef_broker.broker
    change = PartitionChangeRecord(partition_id=0, topic_id=uuid_from_text(broker.image.topics["elr"].topic_id),
                                   eligible_leader_replicas=(1,), last_known_elr=(1,))
    josef_broker.call(broker.quorum.append, [change])
    (partition,) = describe_partitions(client, ["elr"]).topics[0].partitions
    assert (partition.eligible_leader_replicas, partition.last_known_elr) == ((1,), (1,))


def test_metadata_answers_leader_not_available_for_a_topic_created_but_not_yet_known_here(josef_broker, monkeypatch):
    async def created_elsewhere(name, *args, **kwargs):
        return ErrorCode.topic_already_exists, f"topic {name!r} already exists"

    # Another broker created it and this one has not applied that metadata yet.
    monkeypatch.setattr(josef_broker.broker.channel, "create_topic", created_elsewhere)
    client = RawClient(josef_broker.port)
    [topic] = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "lagging", "topic_id": None}],
                                                "allow_auto_topic_creation": True,
                                                "include_topic_authorized_operations": False}).topics
    client.close()
    assert (topic.name, topic.error_code, topic.partitions) == ("lagging", ErrorCode.leader_not_available, ())
