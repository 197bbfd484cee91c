"""AlterPartition on the wire: the controller listener answers a leader's ISR change at v2 and v3."""

import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.records import uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

CONTROLLER_LISTENER = pytest.mark.josef_config(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")


def controller_client(josef_broker) -> RawClient:
    return RawClient(next(b.port for b in josef_broker.broker.bound if b.name == "CONTROLLER"))


def request(broker, topic_id, partition, **overrides):
    node = broker.node_id
    body = {"broker_id": node, "broker_epoch": broker.image.brokers[node].epoch, "topics": [{
        "topic_id": topic_id, "partitions": [{
            "partition_index": 0, "leader_epoch": partition.leader_epoch, "partition_epoch": partition.partition_epoch,
            "new_isr": [node], "new_isr_with_epochs": [{"broker_id": node, "broker_epoch": broker.image.brokers[node].epoch}],
            "leader_recovery_state": 0}]}]}
    body.update(overrides)
    return body


@CONTROLLER_LISTENER
@pytest.mark.parametrize("version", [2, 3])
def test_alter_partition_answers_the_partition_state(josef_broker, version):
    broker = josef_broker.broker
    assert josef_broker.call(broker.channel.create_topic, "isr", 1, 1)[0] == ErrorCode.none
    topic = broker.image.topics["isr"]
    partition = topic.partitions[0]
    client = controller_client(josef_broker)
    answer = client.call(ApiKey.ALTER_PARTITION, version, request(broker, uuid_from_text(topic.topic_id), partition))
    assert answer.error_code == ErrorCode.none
    [result] = answer.topics[0].partitions
    assert (result.error_code, result.leader_id, result.isr, result.leader_epoch, result.partition_epoch) == (
        ErrorCode.none, broker.node_id, (broker.node_id,), partition.leader_epoch, partition.partition_epoch)
    stale = client.call(ApiKey.ALTER_PARTITION, version,
                        request(broker, uuid_from_text(topic.topic_id), partition, broker_epoch=123456))
    assert (stale.error_code, stale.topics) == (ErrorCode.stale_broker_epoch, ())
    fenced = request(broker, uuid_from_text(topic.topic_id), partition)
    fenced["topics"][0]["partitions"][0]["leader_epoch"] = partition.leader_epoch - 1
    [refused] = client.call(ApiKey.ALTER_PARTITION, version, fenced).topics[0].partitions
    assert (refused.error_code, refused.leader_id) == (ErrorCode.fenced_leader_epoch, -1)


@CONTROLLER_LISTENER
def test_alter_partition_is_not_a_broker_listener_api(josef_broker):
    port = next(b.port for b in josef_broker.broker.bound if b.name == "PLAINTEXT")
    versions = RawClient(port).call(ApiKey.API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"})
    assert ApiKey.ALTER_PARTITION not in {k.api_key for k in versions.api_keys}
