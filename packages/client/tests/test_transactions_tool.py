"""``josef transactions`` (kafka-transactions.sh) against the fake transaction coordinator of ``txn_fake_broker``.

The transactions it shows are made by josef's transactional producer, so
the coordinator state the tool reads is the one the producer left.
"""

from __future__ import annotations

import re
import time

import pytest
from click.testing import CliRunner
from kio.schema.errors import ErrorCode as E
from txn_fake_broker import FakeBroker

from josef.cli import build_cli
from josef.protocol.api_keys import ApiKey
from josef.protocol.topic_partition import TopicPartition
from josef_client import Producer
from josef_client.commands.transactions import transactions

START = 1_700_000_000_000  # the fake's transaction start time and producers' last timestamp


@pytest.fixture
def broker():
    fake = FakeBroker({"t": 2, "u": 1})
    yield fake
    fake.close()


def producer(broker: FakeBroker, transactional_id: str) -> Producer:
    return Producer({"bootstrap.servers": broker.address, "transactional.id": transactional_id, "linger.ms": 0})


def open_transaction(broker: FakeBroker, transactional_id: str, *partitions: int) -> Producer:
    """A producer with an open transaction that wrote one record to each partition of t (close it to leave it open)."""
    p = producer(broker, transactional_id)
    p.init_transactions()
    p.begin_transaction()
    for partition in partitions:
        p.send("t", f"{transactional_id}-{partition}".encode(), partition=partition)
    p.flush()
    return p


def tool(broker: FakeBroker, *args: str):
    result = CliRunner().invoke(transactions, ["--bootstrap-server", broker.address, *args])
    assert "Traceback" not in result.output + result.stderr
    return result


def ok(broker: FakeBroker, *args: str) -> list[str]:
    result = tool(broker, *args)
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout.splitlines()


def one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_the_command_is_registered_on_josef():
    assert "transactions" in build_cli().commands


def test_list_prints_kafkas_columns(broker):
    with producer(broker, "committed") as done:
        done.init_transactions()
        done.begin_transaction()
        done.send("u", b"v")
        done.commit_transaction()
    with open_transaction(broker, "open", 0):
        assert ok(broker, "list") == [
            "TransactionalId\tCoordinator\tProducerId\tTransactionState\t",
            "committed      \t0          \t1001      \tCompleteCommit  \t",
            "open           \t0          \t1002      \tOngoing         \t",
        ]
        ok(broker, "list", "--duration-filter", "60000")
    (_, unfiltered), (_, filtered) = broker.asked(ApiKey.LIST_TRANSACTIONS)
    assert (unfiltered.duration_filter, filtered.duration_filter) == (-1, 60000)


def test_list_asks_a_broker_loading_its_transactions_again(broker):
    """COORDINATOR_LOAD_IN_PROGRESS is retriable (Kafka's ListTransactionsHandler retries it); an authorization error is
    not: it fails at once."""
    with open_transaction(broker, "open", 0):
        asked = len(broker.asked(ApiKey.LIST_TRANSACTIONS))
        broker.fail(ApiKey.LIST_TRANSACTIONS, E.coordinator_load_in_progress, E.coordinator_load_in_progress)
        assert ok(broker, "list")[1].startswith("open ")
        assert len(broker.asked(ApiKey.LIST_TRANSACTIONS)) - asked == 3
        broker.fail(ApiKey.LIST_TRANSACTIONS, E.cluster_authorization_failed)
        one_line_error(tool(broker, "list"), r"Failed to list transactions: list transactions on broker 0")


def test_describe_prints_the_open_transaction(broker):
    with open_transaction(broker, "tx", 0, 1):
        header, row = ok(broker, "describe", "--transactional-id", "tx")
    assert header.split("\t") == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                                  "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                                  "TopicPartitions", ""]
    cells = [c.strip() for c in row.split("\t")]
    assert cells[:7] == ["0", "tx", "1001", "0", "Ongoing", "60000", str(START)]
    assert int(cells[7]) >= int(time.time() * 1000) - START - 60_000  # now minus the start
    assert cells[8:] == ["t-0,t-1", ""]
    assert all(len(h) == len(c) for h, c in zip(header.split("\t"), row.split("\t")))


def test_describe_a_transactional_id_without_an_open_transaction(broker):
    with producer(broker, "idle") as p:
        p.init_transactions()
    header, row = ok(broker, "describe", "--transactional-id", "idle")
    assert [c.strip() for c in row.split("\t")][4:9] == ["Empty", "60000", "None", "None", ""]


def test_describe_an_unknown_transactional_id_is_one_error_line(broker):
    one_line_error(tool(broker, "describe", "--transactional-id", "nope"),
                   r"Failed to describe transaction state of transactional-id `nope`: transactional id 'nope' does not exist")


def test_describe_producers(broker):
    with open_transaction(broker, "tx", 0):
        assert ok(broker, "describe-producers", "--topic", "t", "--partition", "0") == [
            "ProducerId\tProducerEpoch\tLatestCoordinatorEpoch\tLastSequence\tLastTimestamp\tCurrentTransactionStartOffset\t",
            f"1001      \t0            \t3                     \t0           \t{START}\t0                            \t",
        ]
        ok(broker, "describe-producers", "--topic", "t", "--partition", "1", "--broker-id", "0")
    (_, body), = broker.asked(ApiKey.DESCRIBE_PRODUCERS)[-1:]
    assert [(t.name, t.partition_indexes) for t in body.topics] == [("t", (1,))]


def test_abort_by_start_offset_writes_an_abort_marker(broker):
    with producer(broker, "plain") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"committed", partition=0)
        p.commit_transaction()
    hung = open_transaction(broker, "hung", 0)
    hung.close()  # closing does not end the transaction
    assert ok(broker, "abort", "--topic", "t", "--partition", "0", "--start-offset", "1") == []
    marker, = broker.markers
    assert (marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, marker.transaction_result) == (1002, 0, 3, False)
    assert [(t.name, t.partition_indexes) for t in marker.topics] == [("t", (0,))]
    assert broker.values("t", 0, "abort") == [b"hung-0"] and broker.values("t", 0) == [b"committed"]


def test_abort_names_what_is_missing(broker):
    one_line_error(tool(broker, "abort", "--topic", "t", "--partition", "0"),
                   r"must be identified either with --start-offset .* or with --producer-id, --producer-epoch, and --coordinator-epoch")
    one_line_error(tool(broker, "abort", "--topic", "t", "--partition", "0", "--producer-id", "5"),
                   r"Missing required argument --producer-epoch")
    one_line_error(tool(broker, "abort", "--topic", "t", "--partition", "0", "--producer-id", "5", "--producer-epoch", "1"),
                   r"Missing required argument --coordinator-epoch")
    one_line_error(tool(broker, "abort", "--topic", "t", "--partition", "0", "--start-offset", "99"),
                   r"Could not find any open transactions starting at offset 99 on partition t-0")
    assert not broker.markers


def test_abort_by_producer_id_for_older_brokers(broker):
    assert ok(broker, "abort", "--topic", "t", "--partition", "1", "--producer-id", "77", "--producer-epoch", "4",
              "--coordinator-epoch", "-1") == []
    marker, = broker.markers
    assert (marker.producer_id, marker.producer_epoch, marker.coordinator_epoch) == (77, 4, 0)  # -1 taken as 0


def test_find_hanging_lists_transactions_their_coordinator_forgot(broker):
    with open_transaction(broker, "live", 0), open_transaction(broker, "forgotten", 1):
        assert ok(broker, "find-hanging", "--broker-id", "0") == [
            "Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)\t"]
        broker.txns["forgotten"].partitions.discard(TopicPartition("t", 1))
        header, row = ok(broker, "find-hanging", "--topic", "t")
    cells = [c.strip() for c in row.split("\t")]
    assert cells[:7] == ["t", "1", "1002", "0", "3", "0", str(START)]
    assert int(cells[7]) >= (int(time.time() * 1000) - START) // 60_000 - 1


def test_find_hanging_needs_a_scope(broker):
    one_line_error(tool(broker, "find-hanging"), r"requires either --topic or --broker-id")
    one_line_error(tool(broker, "find-hanging", "--partition", "0", "--broker-id", "0"),
                   r"The --partition argument requires --topic to be provided")


def test_an_unreachable_broker_is_one_error_line():
    result = CliRunner().invoke(transactions, ["--bootstrap-server", "127.0.0.1:1", "list"])
    one_line_error(result, r"cannot connect to 127.0.0.1:1")
