"""DescribeQuorum against the single-node default (an in-process voter, no controller listener), over a real socket.

Its voter's endpoint is a placeholder (port -1), which once went into
DescribeQuorum v2's nodes, failed to encode and closed the client's
connection. The voter is named at the listener that reaches it instead.
"""

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

REQUEST = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_quorum_of_the_single_node_default(josef_broker, version):
    client = RawClient(josef_broker.port)
    try:
        response = client.call(ApiKey.DESCRIBE_QUORUM, version, REQUEST)
        [topic] = response.topics
        [partition] = topic.partitions
        assert (response.error_code, partition.error_code) == (ErrorCode.none, ErrorCode.none)
        node_id = josef_broker.broker.node_id
        assert partition.leader_id == node_id
        assert [v.replica_id for v in partition.current_voters] == [node_id]
        assert partition.current_voters[0].log_end_offset == partition.high_watermark > 0
        if version >= 2:
            # As Kafka names a voter's controller listener; this voter's is its client listener, at its bound port.
            [node] = response.nodes
            assert node.node_id == node_id
            assert [(l.name, l.host, l.port) for l in node.listeners] == [("PLAINTEXT", "127.0.0.1", josef_broker.port)]
        # The connection is still open and answers.
        versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == ErrorCode.none
    finally:
        client.close()
