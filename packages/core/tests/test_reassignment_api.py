"""AlterPartitionReassignments and ListPartitionReassignments on the wire, forwarded by the broker."""

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient


def test_reassignments_are_answered_per_partition(josef_broker):
    assert josef_broker.call(josef_broker.broker.channel.create_topic, "moved", 1, 1)[0] == ErrorCode.none
    client = RawClient(josef_broker.port)
    answer = client.call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1, {
        "timeout": 5000, "allow_replication_factor_change": True, "topics": [{"name": "moved", "partitions": [
            {"partition_index": 0, "replicas": [1]}, {"partition_index": 0, "replicas": None},
            {"partition_index": 0, "replicas": [1, 9]}]}]})
    assert answer.error_code == ErrorCode.none
    [topic] = answer.responses
    assert [p.error_code for p in topic.partitions] == [
        ErrorCode.none, ErrorCode.no_reassignment_in_progress, ErrorCode.invalid_replica_assignment]
    listed = client.call(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"timeout": 5000, "topics": None})
    assert (listed.error_code, listed.topics) == (ErrorCode.none, ())
