"""TxnOffsetCommit over a real socket against the in-process broker, with the markers a transaction coordinator sends.

The broker answers WriteTxnMarkers itself (every broker does), so these
tests play the transaction coordinator's part with RawClient: commit offsets
in a producer's transaction, then commit or abort it, restart the broker in
between to load the partition from its log.
"""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.coordinator.hashing import partition_for
from josef.testing import RawClient

E = ErrorCode
FETCH, INIT_PRODUCER_ID, WRITE_TXN_MARKERS, TXN_OFFSET_COMMIT, DESCRIBE, DELETE, CREATE_TOPICS = (
    9, 22, 27, 28, 15, 42, 19)
OFFSETS_PARTITIONS = 50

# These tests play the transaction coordinator themselves (WriteTxnMarkers), so no coordinator is there to verify
# the offsets partition with (KIP-890): verification is off.
pytestmark = pytest.mark.josef_config(**{"group.initial.rebalance.delay.ms": "0",
                                         "transaction.partition.verification.enable": "false"})


def create_orders(client: RawClient) -> None:
    answer = client.call(CREATE_TOPICS, 7, {"topics": [{"name": "orders", "num_partitions": 2, "replication_factor": 1,
                                                        "assignments": [], "configs": []}],
                                            "timeout": 5000, "validate_only": False})
    assert answer.topics[0].error_code == E.none


def new_producer(client: RawClient) -> tuple[int, int]:
    """A producer id and epoch (the core's InitProducerId; the transaction coordinator would give the same kind)."""
    answer = client.call(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60000,
                                               "producer_id": -1, "producer_epoch": -1})
    assert answer.error_code == E.none
    return answer.producer_id, answer.producer_epoch


def txn_commit(client: RawClient, group: str, producer: tuple[int, int], offsets: dict[tuple[str, int], int], *,
               version: int = 5, generation: int = -1, member: str = "") -> dict[tuple[str, int], ErrorCode]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                             "committed_leader_epoch": 2, "committed_metadata": f"v{version}"})
    answer = client.call(TXN_OFFSET_COMMIT, version, {
        "transactional_id": "tx", "group_id": group, "producer_id": producer[0], "producer_epoch": producer[1],
        "generation_id": generation, "member_id": member, "group_instance_id": None,
        "topics": [{"name": t, "partitions": p} for t, p in topics.items()]})
    return {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}


def end_txn(client: RawClient, producer: tuple[int, int], groups: list[str], commit: bool) -> None:
    """The transaction coordinator's markers, in the ``__consumer_offsets`` partitions of ``groups``."""
    partitions = sorted({partition_for(g, OFFSETS_PARTITIONS) for g in groups})
    answer = client.call(WRITE_TXN_MARKERS, 1, {"markers": [{
        "producer_id": producer[0], "producer_epoch": producer[1], "transaction_result": commit, "coordinator_epoch": 0,
        "topics": [{"name": "__consumer_offsets", "partition_indexes": partitions}]}]})
    assert {p.error_code for p in answer.markers[0].topics[0].partitions} == {E.none}


def fetch(client: RawClient, group: str, partitions=(0, 1), *, version: int = 9, stable: bool = True):
    """(partition, committed offset, metadata, error) of ``orders``' partitions, as OffsetFetch ``version`` answers."""
    wanted = [{"name": "orders", "partition_indexes": list(partitions)}]
    answer = client.call(FETCH, version, {
        "group_id": group, "topics": wanted, "require_stable": stable,
        "groups": [{"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}]})
    topics, error = (answer.groups[0].topics, answer.groups[0].error_code) if version >= 8 else (
        answer.topics, answer.error_code)
    assert error == E.none
    return [(p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in topics[0].partitions]


def test_the_api_is_the_group_coordinators_v0_to_v5(josef_broker):
    api = josef_broker.broker.dispatcher.apis[TXN_OFFSET_COMMIT]
    assert (api.min_version, api.max_version) == (0, 5)


def test_every_version_commits_pending_offsets_that_the_marker_makes_visible(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    producer = new_producer(client)
    groups = [f"txn-v{version}" for version in range(6)]
    for version, group in enumerate(groups):
        assert txn_commit(client, group, producer, {("orders", 0): 10 + version}, version=version) == {
            ("orders", 0): E.none}, version
        # Pending: a stable fetch is told to retry, a plain one sees nothing yet.
        assert fetch(client, group) == [(0, -1, "", E.unstable_offset_commit), (1, -1, "", E.none)]
        assert fetch(client, group, version=7) == [(0, -1, "", E.unstable_offset_commit), (1, -1, "", E.none)]
        assert fetch(client, group, stable=False) == [(0, -1, "", E.none), (1, -1, "", E.none)]
        assert fetch(client, group, version=6) == [(0, -1, "", E.none), (1, -1, "", E.none)]  # no require_stable
    end_txn(client, producer, groups, commit=True)
    for version, group in enumerate(groups):
        assert fetch(client, group) == [(0, 10 + version, f"v{version}", E.none), (1, -1, "", E.none)], version
        described = client.call(DESCRIBE, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
        assert (described.group_state, described.protocol_type) == ("Empty", "")  # a simple group


def test_an_older_epoch_is_fenced(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    pid, epoch = new_producer(client)
    assert txn_commit(client, "g", (pid, epoch), {("orders", 0): 7}) == {("orders", 0): E.none}
    # Transactions V2 bump the epoch in every marker: the old epoch may no longer write here.
    end_txn(client, (pid, epoch + 1), ["g"], commit=True)
    assert fetch(client, "g", (0,)) == [(0, 7, "v5", E.none)]
    assert txn_commit(client, "g", (pid, epoch), {("orders", 0): 8}) == {("orders", 0): E.invalid_producer_epoch}
    assert txn_commit(client, "g", (pid, epoch + 1), {("orders", 0): 9}) == {("orders", 0): E.none}


def test_loading_rebuilds_pending_and_committed_transactions(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    committer, pending = new_producer(client), new_producer(client)
    assert txn_commit(client, "g", committer, {("orders", 0): 100}) == {("orders", 0): E.none}
    end_txn(client, committer, ["g"], commit=True)
    assert txn_commit(client, "g", pending, {("orders", 1): 200}) == {("orders", 1): E.none}

    josef_broker.restart()
    client = RawClient(josef_broker.port)
    assert fetch(client, "g") == [(0, 100, "v5", E.none), (1, -1, "", E.unstable_offset_commit)]
    assert fetch(client, "g", stable=False) == [(0, 100, "v5", E.none), (1, -1, "", E.none)]
    # The transaction left open before the restart still ends with its marker.
    end_txn(client, pending, ["g"], commit=True)
    assert fetch(client, "g") == [(0, 100, "v5", E.none), (1, 200, "v5", E.none)]

    josef_broker.restart()
    client = RawClient(josef_broker.port)
    assert fetch(client, "g") == [(0, 100, "v5", E.none), (1, 200, "v5", E.none)]


def test_an_abort_discards_the_offsets_also_after_loading(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    aborter, later = new_producer(client), new_producer(client)
    plain = client.call(8, 9, {"group_id": "h", "generation_id_or_member_epoch": -1, "member_id": "",
                               "group_instance_id": None, "retention_time": -1, "topics": [
                                   {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 3,
                                                                      "committed_leader_epoch": -1,
                                                                      "committed_metadata": "plain"}]}]})
    assert plain.topics[0].partitions[0].error_code == E.none
    assert txn_commit(client, "h", aborter, {("orders", 0): 300}) == {("orders", 0): E.none}
    end_txn(client, aborter, ["h"], commit=False)
    assert fetch(client, "h", (0,)) == [(0, 3, "plain", E.none)]
    assert txn_commit(client, "h", later, {("orders", 0): 400}) == {("orders", 0): E.none}

    josef_broker.restart()
    client = RawClient(josef_broker.port)
    assert fetch(client, "h", (0,)) == [(0, -1, "", E.unstable_offset_commit)]
    end_txn(client, later, ["h"], commit=False)
    assert fetch(client, "h", (0,)) == [(0, 3, "plain", E.none)]
    josef_broker.restart()
    client = RawClient(josef_broker.port)
    assert fetch(client, "h", (0,)) == [(0, 3, "plain", E.none)]


def test_deleting_the_group_drops_its_pending_offsets_for_good(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    producer = new_producer(client)
    assert txn_commit(client, "doomed", producer, {("orders", 0): 5}) == {("orders", 0): E.none}
    assert client.call(DELETE, 2, {"groups_names": ["doomed"]}).results[0].error_code == E.none
    assert fetch(client, "doomed") == [(0, -1, "", E.none), (1, -1, "", E.none)]  # no longer unstable
    end_txn(client, producer, ["doomed"], commit=True)
    assert fetch(client, "doomed") == [(0, -1, "", E.none), (1, -1, "", E.none)]
    josef_broker.restart()
    client = RawClient(josef_broker.port)
    assert fetch(client, "doomed") == [(0, -1, "", E.none), (1, -1, "", E.none)]
    described = client.call(DESCRIBE, 5, {"groups": ["doomed"], "include_authorized_operations": False}).groups[0]
    assert described.group_state == "Dead"


def test_request_errors(josef_broker):
    client = RawClient(josef_broker.port)
    create_orders(client)
    producer = new_producer(client)
    assert txn_commit(client, "g", producer, {("orders", 0): 1, ("ghost", 0): 1}) == {
        ("orders", 0): E.none, ("ghost", 0): E.unknown_topic_or_partition}
    assert txn_commit(client, "", producer, {("orders", 0): 1, ("ghost", 0): 1}) == {
        ("orders", 0): E.invalid_group_id, ("ghost", 0): E.unknown_topic_or_partition}
    assert txn_commit(client, "g", (-1, -1), {("orders", 0): 1}) == {("orders", 0): E.invalid_producer_id_mapping}
    assert txn_commit(client, "missing", producer, {("orders", 0): 1}, generation=2, member="m") == {
        ("orders", 0): E.illegal_generation}
