"""ElectLeaders on the wire: brokers forward it to the controller, which answers per partition as Kafka."""

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient


def elect(josef_broker, version, election_type, topic_partitions):
    body = {"election_type": election_type, "topic_partitions": topic_partitions, "timeout": 5000}
    return RawClient(josef_broker.port).call(ApiKey.ELECT_LEADERS, version, body)


@pytest.mark.parametrize("version,election_type", [(0, 0), (1, 0), (2, 0), (2, 1)])
def test_elections_that_are_not_needed(josef_broker, version, election_type):
    assert josef_broker.call(josef_broker.broker.channel.create_topic, "led", 2, 1)[0] == ErrorCode.none
    answer = elect(josef_broker, version, election_type, [{"topic": "led", "partitions": [0, 1, 5]}])
    [topic] = answer.replica_election_results
    assert topic.topic == "led"
    assert [(p.partition_id, p.error_code) for p in topic.partition_result] == [
        (0, ErrorCode.election_not_needed), (1, ErrorCode.election_not_needed), (5, ErrorCode.unknown_topic_or_partition)]
    assert topic.partition_result[0].error_message == "Leader election not needed for topic partition."
    # Asking for every partition leaves out those that need no election.
    assert elect(josef_broker, version, election_type, None).replica_election_results == ()


def test_an_unknown_election_type_is_an_invalid_request(josef_broker):
    answer = elect(josef_broker, 2, 7, None)
    assert (answer.error_code, answer.replica_election_results) == (ErrorCode.invalid_request, ())
