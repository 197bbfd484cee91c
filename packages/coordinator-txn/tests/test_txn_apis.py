"""The transaction APIs over a real socket against the in-process broker (the josef_broker fixture), every version.

The broker writes the markers itself (WriteTxnMarkers is the core's), so a
commit or abort here goes all the way: PrepareCommit, markers in the
partitions, CompleteCommit, and ``read_committed`` reads what was committed.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.coordinator.hashing import partition_for
from josef.protocol.api_keys import ApiKey as K
from josef.protocol.records import TRANSACTIONAL_BIT, build_batch, iter_batches, iter_records
from josef.testing import RawClient, eventually
from josef_coordinator_txn.records import decode_key, decode_value

E = ErrorCode
RETRIABLE = {E.coordinator_load_in_progress, E.coordinator_not_available, E.concurrent_transactions}


@pytest.fixture
def client(josef_broker):
    client = RawClient(josef_broker.port)
    answer = client.call(K.CREATE_TOPICS, 7, {"topics": [{"name": "orders", "num_partitions": 2, "replication_factor": 1,
                                                          "assignments": [], "configs": []}],
                                              "timeout": 5000, "validate_only": False})
    assert answer.topics[0].error_code == E.none
    yield client
    client.close()


def retried(call, *args, error=lambda answer: answer.error_code) -> Any:
    """The answer once it is not a retriable coordinator error (the partitions load, a transaction completes)."""
    return eventually(lambda: (lambda a: a if error(a) not in RETRIABLE else None)(call(*args)), 20, "an answer")


def init(client: RawClient, transactional_id: str = "tx", version: int = 5, timeout_ms: int = 60000,
         producer: tuple[int, int] = (-1, -1)) -> Any:
    return retried(client.call, K.INIT_PRODUCER_ID, version, {
        "transactional_id": transactional_id, "transaction_timeout": timeout_ms, "producer_id": producer[0],
        "producer_epoch": producer[1]})


def add(client: RawClient, producer: tuple[int, int], partitions: dict[str, list[int]], *, version: int = 3,
        transactional_id: str = "tx") -> dict[tuple[str, int], ErrorCode]:
    answer = client.call(K.ADD_PARTITIONS_TO_TXN, version, {
        "v3_and_below_transactional_id": transactional_id, "v3_and_below_producer_id": producer[0],
        "v3_and_below_producer_epoch": producer[1],
        "v3_and_below_topics": [{"name": t, "partitions": p} for t, p in partitions.items()]})
    return {(t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}


def produce(client: RawClient, producer: tuple[int, int], partition: int, value: bytes, sequence: int = 0) -> None:
    batch = build_batch([(b"k", value, int(time.time() * 1000))], producer_id=producer[0], producer_epoch=producer[1],
                        base_sequence=sequence, attributes=TRANSACTIONAL_BIT)
    answer = client.call(K.PRODUCE, 9, {"transactional_id": "tx", "acks": -1, "timeout": 5000, "topic_data": [
        {"name": "orders", "partition_data": [{"index": partition, "records": batch}]}]})
    assert answer.responses[0].partition_responses[0].error_code == E.none


def end(client: RawClient, producer: tuple[int, int], commit: bool, version: int = 3,
        transactional_id: str = "tx") -> Any:
    return client.call(K.END_TXN, version, {"transactional_id": transactional_id, "producer_id": producer[0],
                                            "producer_epoch": producer[1], "committed": commit})


def describe(client: RawClient, *ids: str) -> list[Any]:
    return list(client.call(K.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": list(ids)}).transaction_states)


def state_of(client: RawClient, transactional_id: str = "tx") -> str:
    return describe(client, transactional_id)[0].transaction_state


def stable_offset(client: RawClient, partition: int) -> int:
    """ListOffsets latest with read_committed: the last stable offset."""
    answer = client.call(K.LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": "orders", "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                           "timestamp": -1}]}]})
    return answer.topics[0].partitions[0].offset


def test_find_coordinator_for_transactional_ids(josef_broker, client):
    answer = retried(client.call, K.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["tx", "other"]},
                     error=lambda a: max(c.error_code for c in a.coordinators))
    assert [(c.key, c.node_id, c.port) for c in answer.coordinators] == [
        ("tx", 1, josef_broker.port), ("other", 1, josef_broker.port)]
    topic = josef_broker.broker.image.topics["__transaction_state"]
    assert len(topic.partitions) == 50
    answer = client.call(K.DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 2, "resource_name": "__transaction_state",
                                                                "configuration_keys": None}],
                                                 "include_synonyms": False, "include_documentation": False})
    configs = {c.name: c.value for c in answer.results[0].configs}
    assert (configs["cleanup.policy"], configs["compression.type"], configs["min.insync.replicas"]) == (
        "compact", "uncompressed", "1")


@pytest.mark.parametrize("version", range(6))
def test_init_producer_id_versions(client, version):
    first = init(client, version=version)
    assert first.error_code == E.none and first.producer_epoch == 0
    again = init(client, version=version)
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)
    assert add(client, (first.producer_id, 0), {"orders": [0]}, version=2)[("orders", 0)] == E.producer_fenced


def test_init_producer_id_refusals(client):
    assert init(client, timeout_ms=900001).error_code == E.invalid_transaction_timeout
    assert init(client, timeout_ms=0).error_code == E.invalid_transaction_timeout
    assert init(client, transactional_id="").error_code == E.invalid_request
    assert init(client, producer=(5, -1)).error_code == E.invalid_request
    producer = init(client)
    fenced = init(client, version=3, producer=(producer.producer_id + 100, 0))
    assert fenced.error_code == E.invalid_producer_epoch  # v3 clients do not know PRODUCER_FENCED
    assert init(client, version=4, producer=(producer.producer_id + 100, 0)).error_code == E.producer_fenced
    resumed = init(client, version=4, producer=(producer.producer_id, 0))
    assert (resumed.producer_id, resumed.producer_epoch) == (producer.producer_id, 1)


def test_idempotent_producers_are_still_the_core_s(client):
    answer = client.call(K.INIT_PRODUCER_ID, 5, {"transactional_id": None, "transaction_timeout": 0,
                                                 "producer_id": -1, "producer_epoch": -1})
    assert answer.error_code == E.none and answer.producer_epoch == 0


@pytest.mark.parametrize("version", range(4))
def test_add_partitions_client_versions(client, version):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    assert add(client, producer, {"orders": [0, 1]}, version=version) == {("orders", 0): E.none, ("orders", 1): E.none}
    assert add(client, producer, {"orders": [0], "missing": [0]}, version=version) == {
        ("orders", 0): E.operation_not_attempted, ("missing", 0): E.unknown_topic_or_partition}
    assert add(client, producer, {"orders": [0], "__consumer_offsets": [1]}, version=version) == {
        ("orders", 0): E.operation_not_attempted, ("__consumer_offsets", 1): E.topic_authorization_failed}
    fenced = E.invalid_producer_epoch if version < 2 else E.producer_fenced
    assert add(client, (producer[0], 9), {"orders": [0]}, version=version) == {("orders", 0): fenced}
    assert add(client, (producer[0] + 1, 0), {"orders": [0]}, version=version) == {
        ("orders", 0): E.invalid_producer_id_mapping}
    [txn] = describe(client, "tx")
    assert (txn.transaction_state, [(t.topic, list(t.partitions)) for t in txn.topics]) == (
        "Ongoing", [("orders", [0, 1])])


@pytest.mark.parametrize("version", [4, 5])
def test_add_partitions_from_brokers(client, version):
    """v4+: several transactions; verify_only checks, v5 without it adds (a Transactions V2 producer's write)."""
    one, two = init(client, "one"), init(client, "two")
    assert add(client, (one.producer_id, 0), {"orders": [0]}, transactional_id="one") == {("orders", 0): E.none}
    answer = client.call(K.ADD_PARTITIONS_TO_TXN, version, {"transactions": [
        {"transactional_id": "one", "producer_id": one.producer_id, "producer_epoch": 0, "verify_only": True,
         "topics": [{"name": "orders", "partitions": [0, 1]}]},
        {"transactional_id": "two", "producer_id": two.producer_id, "producer_epoch": 0, "verify_only": False,
         "topics": [{"name": "orders", "partitions": [1]}]},
        {"transactional_id": "nobody", "producer_id": 1, "producer_epoch": 0, "verify_only": True,
         "topics": [{"name": "orders", "partitions": [1]}]}]})
    assert answer.error_code == E.none
    results = {r.transactional_id: {(t.name, p.partition_index): p.partition_error_code for t in r.topic_results
                                    for p in t.results_by_partition} for r in answer.results_by_transaction}
    assert results == {"one": {("orders", 0): E.none, ("orders", 1): E.transaction_abortable},
                       "two": {("orders", 1): E.none},
                       "nobody": {("orders", 1): E.invalid_producer_id_mapping}}
    assert state_of(client, "two") == "Ongoing"


def test_commit_end_to_end(client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    assert set(add(client, producer, {"orders": [0, 1]}).values()) == {E.none}
    produce(client, producer, 0, b"a")
    produce(client, producer, 1, b"b")
    assert stable_offset(client, 0) == 0  # the open transaction holds the last stable offset
    assert end(client, producer, True).error_code == E.none
    eventually(lambda: state_of(client) == "CompleteCommit", 10, "the commit to complete")
    assert (stable_offset(client, 0), stable_offset(client, 1)) == (2, 2)  # the record and its marker
    assert end(client, producer, True).error_code == E.none  # a retry
    assert end(client, producer, False).error_code == E.invalid_txn_state


def test_abort_and_a_v2_epoch_bump(client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    assert set(add(client, producer, {"orders": [0]}).values()) == {E.none}
    produce(client, producer, 0, b"a")
    ended = end(client, producer, False, version=5)
    assert (ended.error_code, ended.producer_id, ended.producer_epoch) == (E.none, producer[0], 1)
    eventually(lambda: state_of(client) == "CompleteAbort", 10, "the abort to complete")
    assert stable_offset(client, 0) == 2
    [txn] = describe(client, "tx")
    assert (txn.producer_epoch, txn.topics) == (1, ())
    assert end(client, (producer[0], 1), False, version=4).error_code == E.none  # V1: a retried abort


def fetch_partition(client: RawClient, offset: int, isolation: int) -> Any:
    answer = client.call(K.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "orders", "partitions": [{
            "partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
            "last_fetched_epoch": -1, "log_start_offset": -1}]}]})
    [partition] = answer.responses[0].partitions
    assert partition.error_code == E.none
    return partition


def test_read_committed_fetches_stop_at_the_last_stable_offset(client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    assert set(add(client, producer, {"orders": [0]}).values()) == {E.none}
    produce(client, producer, 0, b"a")
    # A read_committed consumer at the last stable offset (librdkafka's default, on every poll) has nothing
    # to read while the transaction is open; a read_uncommitted one reads the record.
    waiting = fetch_partition(client, 0, isolation=1)
    assert (waiting.high_watermark, waiting.last_stable_offset, waiting.records, waiting.aborted_transactions) == (1, 0, b"", ())
    assert fetch_partition(client, 0, isolation=0).records
    assert end(client, producer, False).error_code == E.none
    eventually(lambda: state_of(client) == "CompleteAbort", 10, "the abort to complete")
    aborted = fetch_partition(client, 0, isolation=1)
    assert (aborted.last_stable_offset, [(a.producer_id, a.first_offset) for a in aborted.aborted_transactions]) == (
        2, [(producer[0], 0)])
    assert aborted.records
    caught_up = fetch_partition(client, 2, isolation=1)
    assert (caught_up.high_watermark, caught_up.last_stable_offset, caught_up.records,
            caught_up.aborted_transactions) == (2, 2, b"", ())
    assert fetch_partition(client, 2, isolation=0).aborted_transactions is None


def test_end_txn_errors(client):
    assert end(client, (1, 0), True, transactional_id="").error_code == E.invalid_request
    assert end(client, (1, 0), True, transactional_id="unknown").error_code == E.invalid_producer_id_mapping
    answer = init(client)
    assert end(client, (answer.producer_id, 0), True).error_code == E.invalid_txn_state
    assert end(client, (answer.producer_id, 3), True, version=1).error_code == E.invalid_producer_epoch
    assert end(client, (answer.producer_id, 3), True, version=2).error_code == E.producer_fenced


def test_add_offsets_adds_the_group_s_offsets_partition(client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    for version in range(5):
        assert client.call(K.ADD_OFFSETS_TO_TXN, version, {"transactional_id": "tx", "producer_id": producer[0],
                                                            "producer_epoch": producer[1],
                                                            "group_id": "orders-app"}).error_code == E.none
    fenced = client.call(K.ADD_OFFSETS_TO_TXN, 1, {"transactional_id": "tx", "producer_id": producer[0],
                                                   "producer_epoch": 7, "group_id": "g"})
    assert fenced.error_code == E.invalid_producer_epoch
    [txn] = describe(client, "tx")
    assert [(t.topic, list(t.partitions)) for t in txn.topics] == [
        ("__consumer_offsets", [partition_for("orders-app", 50)])]


def test_describe_and_list_transactions(client):
    first, second = init(client, "app-1"), init(client, "other")
    assert set(add(client, (first.producer_id, 0), {"orders": [1]}, transactional_id="app-1").values()) == {E.none}
    [ongoing, unknown, empty] = describe(client, "app-1", "nobody", "")
    assert (ongoing.error_code, ongoing.transaction_state, ongoing.producer_id, ongoing.transaction_timeout) == (
        E.none, "Ongoing", first.producer_id, timedelta(milliseconds=60000))
    assert unknown.error_code == E.transactional_id_not_found and empty.error_code == E.invalid_request

    def listed(version: int = 2, **filters: Any) -> tuple[set[tuple[str, str]], tuple[str, ...]]:
        body = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1, "transactional_id_pattern": None}
        answer = client.call(K.LIST_TRANSACTIONS, version, {**body, **filters})
        assert answer.error_code == E.none
        return {(t.transactional_id, t.transaction_state) for t in answer.transaction_states}, tuple(
            answer.unknown_state_filters)

    assert listed(0) == ({("app-1", "Ongoing"), ("other", "Empty")}, ())
    assert listed(0, state_filters=["Ongoing", "Bogus"]) == ({("app-1", "Ongoing")}, ("Bogus",))
    assert listed(0, producer_id_filters=[second.producer_id]) == ({("other", "Empty")}, ())
    # Running for longer than an hour: not the new transaction; an Empty id has no start (-1), so it passes, as in Kafka.
    assert listed(1, duration_filter=3_600_000) == ({("other", "Empty")}, ())
    assert listed(1, duration_filter=3_600_000, state_filters=["Ongoing"]) == (set(), ())
    assert listed(2, transactional_id_pattern="app-.*") == ({("app-1", "Ongoing")}, ())
    assert listed(2, transactional_id_pattern="app") == (set(), ())  # the whole id must match
    bad = client.call(K.LIST_TRANSACTIONS, 2, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1,
                                               "transactional_id_pattern": "("})
    assert bad.error_code == E.invalid_regular_expression


def test_state_survives_a_restart(josef_broker, client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    assert set(add(client, producer, {"orders": [0]}).values()) == {E.none}
    produce(client, producer, 0, b"a")
    assert end(client, producer, True).error_code == E.none
    eventually(lambda: state_of(client) == "CompleteCommit", 10, "the commit to complete")
    client.close()
    josef_broker.restart()
    client = RawClient(josef_broker.port)
    try:
        [txn] = retried(describe, client, "tx", error=lambda states: states[0].error_code)
        assert (txn.transaction_state, txn.producer_id, txn.producer_epoch) == ("CompleteCommit", *producer)
        again = init(client)
        assert (again.producer_id, again.producer_epoch) == (producer[0], 1)
    finally:
        client.close()


def test_records_in_the_partition_are_kafka_s(josef_broker, client):
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    add(client, producer, {"orders": [0]})
    fetched = client.call(K.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "__transaction_state", "partitions": [
            {"partition": partition_for("tx", 50), "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    data = fetched.responses[0].partitions[0].records
    records = [(decode_key(r.key), decode_value(r.value)) for pos, header in iter_batches(data)
               for r in iter_records(memoryview(data)[pos:pos + header.size])]
    assert [(key, value.state_id, value.producer_epoch) for key, value in records] == [("tx", 0, 0), ("tx", 1, 0)]
    assert records[1][1].partitions == frozenset({("orders", 0)})


def test_transaction_version_feature(client):
    """Kafka 4.x's range, 0-2, finalized at 2 in a new cluster (clients use Transactions V2 when it is)."""
    answer = client.call(K.API_VERSIONS, 4, {"client_software_name": "test", "client_software_version": "1"})
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in answer.finalized_features}
    assert supported["transaction.version"] == (0, 2) and finalized["transaction.version"] == (2, 2)


def test_transactions_v2_produce_adds_the_partition(client):
    """A Transactions V2 producer (Produce v12+, EndTxn v5) never calls AddPartitionsToTxn: the leader adds for it."""
    answer = init(client)
    producer = (answer.producer_id, answer.producer_epoch)
    batch = build_batch([(b"k", b"v2", int(time.time() * 1000))], producer_id=producer[0], producer_epoch=producer[1],
                        base_sequence=0, attributes=TRANSACTIONAL_BIT)
    produced = client.call(K.PRODUCE, 12, {"transactional_id": "tx", "acks": -1, "timeout": 5000, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 1, "records": batch}]}]})
    assert produced.responses[0].partition_responses[0].error_code == E.none
    [txn] = describe(client, "tx")
    assert (txn.transaction_state, [(t.topic, list(t.partitions)) for t in txn.topics]) == ("Ongoing", [("orders", [1])])
    ended = end(client, producer, True, version=5)
    assert (ended.error_code, ended.producer_epoch) == (E.none, 1)
    eventually(lambda: state_of(client) == "CompleteCommit", 10, "the commit to complete")
    assert stable_offset(client, 1) == 2
