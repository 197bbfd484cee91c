"""The coordinator epoch on real brokers: when ``__transaction_state``'s leader epoch rises while its leader stays,
the transaction coordinator's shard is loaded again and its markers carry the new epoch.

One controller and two brokers as processes. The partition's leader epoch
rises without a leader change when a replica leaves it (a reassignment
from both brokers to the leader alone), as in Kafka.
"""

from __future__ import annotations

import struct

from kio.schema.errors import ErrorCode
from test_txn_apis import add, end, fetch_partition, init, produce, state_of

from josef.protocol.api_keys import ApiKey as K
from josef.protocol.records import iter_batches, iter_records
from josef.testing import RawClient, eventually

E = ErrorCode
STATE = "__transaction_state"
SETTINGS = {
    "transaction.state.log.num.partitions": "1",
    "transaction.state.log.replication.factor": "2",
    "transaction.state.log.min.isr": "1",
    "controller.quorum.election.timeout.ms": "500",
    "broker.heartbeat.interval.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "auto.leader.rebalance.enable": "false",
}


def state_partition(client: RawClient):
    answer = client.call(K.METADATA, 12, {"topics": [{"name": STATE, "topic_id": None}],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    [partition] = answer.topics[0].partitions
    return partition


def marker_epochs(client: RawClient) -> list[int]:
    """The coordinator epoch of every transaction marker in orders-0."""
    data = bytes(fetch_partition(client, 0, isolation=0).records or b"")
    epochs = []
    for pos, header in iter_batches(data):
        if header.is_control:
            [record] = iter_records(memoryview(data)[pos:pos + header.size])
            epochs.append(struct.unpack(">hi", bytes(record.value)[:6])[1])
    return epochs


def committed_transaction(client: RawClient, value: bytes) -> None:
    answer = init(client)
    assert answer.error_code == E.none, answer
    producer = (answer.producer_id, answer.producer_epoch)
    assert set(add(client, producer, {"orders": [0]}).values()) == {E.none}
    produce(client, producer, 0, value)
    assert end(client, producer, True).error_code == E.none
    eventually(lambda: state_of(client) == "CompleteCommit", 20, "the commit to complete")


def test_a_leader_epoch_bump_reloads_the_shard_with_the_new_coordinator_epoch(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=2, **SETTINGS)
    probe = RawClient(cluster.node(2).listener("PLAINTEXT")[1], timeout=60)
    found = eventually(lambda: (a := probe.call(K.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["tx"]})
                                .coordinators[0]).error_code == E.none and a, what="a transaction coordinator")
    probe.close()
    leader = cluster.node(found.node_id)
    client = RawClient(leader.listener("PLAINTEXT")[1], timeout=60)
    created = client.call(K.CREATE_TOPICS, 7, {"topics": [{
        "name": "orders", "num_partitions": -1, "replication_factor": -1, "configs": [],
        "assignments": [{"partition_index": 0, "broker_ids": [leader.node_id]}]}], "timeout": 5000,
        "validate_only": False})
    assert created.topics[0].error_code == E.none
    first = eventually(lambda: (p := state_partition(client)).leader_id == leader.node_id and len(p.isr_nodes) == 2
                       and p, what="the transaction log on both brokers")
    committed_transaction(client, b"one")
    assert marker_epochs(client) == [first.leader_epoch]

    other = 5 - leader.node_id
    moved = client.call(K.ALTER_PARTITION_REASSIGNMENTS, 0, {"timeout": 5000, "topics": [
        {"name": STATE, "partitions": [{"partition_index": 0, "replicas": [leader.node_id]}]}]})
    assert moved.responses[0].partitions[0].error_code == E.none, moved
    bumped = eventually(lambda: (p := state_partition(client)).replica_nodes == (leader.node_id,) and p,
                        what=f"broker {other} out of the transaction log's replicas")
    assert bumped.leader_id == leader.node_id and bumped.leader_epoch > first.leader_epoch

    committed_transaction(client, b"two")
    assert marker_epochs(client) == [first.leader_epoch, bumped.leader_epoch]
    assert f"reloading {STATE}-0: its leader epoch rose from {first.leader_epoch} to {bumped.leader_epoch}" in leader.log
    client.close()
