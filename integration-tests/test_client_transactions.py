"""josef's transactional producer end to end: josef's read_committed consumer sees exactly the committed records.

Against broker processes with the transaction coordinator (one broker, and
three with every topic replicated, via ``brokers``): commit and abort,
fencing of a zombie producer, offsets committed with the transaction
(consume-transform-produce, with transaction.version 1 and 2), the last
stable offset holding back read_committed consumers, and ``josef
transactions`` aborting an open transaction from the command line.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kafka.admin import KafkaAdminClient

from josef.testing import eventually

from josef_client import (
    Admin,
    Consumer,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    ProducerFencedError,
    TopicPartition,
)

TIMEOUT_S = 60


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions)])


def transactional(bootstrap: str, transactional_id: str, **config) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **config})


def read_all(bootstrap: str, topic: str, partitions: int = 1, *, isolation: str = "read_committed") -> list[bytes]:
    """Every value a consumer with ``isolation`` gets from the start to the partitions' end (LSO or high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)  # read_committed: the last stable offsets
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"stuck before {ends} with {len(values)} records"
            values += [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
        return values
    finally:
        consumer.close()


def test_committed_records_are_seen_and_aborted_ones_are_not(brokers):
    create(brokers.bootstrap_servers, "txn-out", 3)
    with transactional(brokers.bootstrap_servers, "writer") as producer:
        producer.init_transactions()
        for n, commit in enumerate((True, False, True, False, True)):
            producer.begin_transaction()
            for i in range(20):
                producer.send("txn-out", f"{n}-{i}".encode(), key=f"{i}".encode())
            (producer.commit_transaction if commit else producer.abort_transaction)()
    want = sorted(f"{n}-{i}".encode() for n in (0, 2, 4) for i in range(20))
    # commit_transaction() returns once the commit is decided; the markers that end it in each partition follow.
    eventually(lambda: sorted(read_all(brokers.bootstrap_servers, "txn-out", 3)) == want, TIMEOUT_S, "the committed records")
    everything = read_all(brokers.bootstrap_servers, "txn-out", 3, isolation="read_uncommitted")
    assert set(want) <= set(everything)  # and what went out of the aborted ones before the abort


def test_an_open_transaction_holds_back_read_committed_consumers(brokers):
    create(brokers.bootstrap_servers, "txn-lso")
    with transactional(brokers.bootstrap_servers, "slow") as producer, \
            Producer({"bootstrap.servers": brokers.bootstrap_servers}) as plain:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-lso", b"in-transaction", partition=0)
        producer.flush()
        plain.send("txn-lso", b"after", partition=0).result(TIMEOUT_S)
        assert read_all(brokers.bootstrap_servers, "txn-lso") == []  # the LSO is the transaction's first offset
        assert read_all(brokers.bootstrap_servers, "txn-lso", isolation="read_uncommitted") == [b"in-transaction", b"after"]
        producer.commit_transaction()
    eventually(lambda: read_all(brokers.bootstrap_servers, "txn-lso") == [b"in-transaction", b"after"], TIMEOUT_S,
               "the commit marker")


def test_a_new_producer_fences_the_zombie_and_aborts_its_transaction(brokers):
    create(brokers.bootstrap_servers, "txn-fence")
    zombie = transactional(brokers.bootstrap_servers, "app-0")
    successor = transactional(brokers.bootstrap_servers, "app-0")
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send("txn-fence", b"zombie", partition=0)
        zombie.flush()
        successor.init_transactions()  # bumps the epoch and aborts the zombie's transaction
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        with pytest.raises(ProducerFencedError):
            zombie.send("txn-fence", b"more", partition=0)
        successor.begin_transaction()
        successor.send("txn-fence", b"successor", partition=0)
        successor.commit_transaction()
    finally:
        zombie.close()
        successor.close()
    eventually(lambda: read_all(brokers.bootstrap_servers, "txn-fence") == [b"successor"], TIMEOUT_S, "the commit marker")


def use_transaction_version(bootstrap: str, level: int) -> None:
    """Finalize ``transaction.version`` at ``level`` (2 is Transactions V2, what a new Kafka 4 cluster runs)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, api_version=(4, 0))
    try:
        # A new cluster's controller finalizes its features at its first sweep, maybe after the brokers are ready.
        finalized = eventually(lambda: admin.describe_features().get("transaction.version", {}).get("finalized"),
                               what="transaction.version finalized by the controller")
        current = finalized[1]
        if current != level:
            update = level if level > current else ("SAFE_DOWNGRADE", level)
            assert admin.update_features({"transaction.version": update}) == {"transaction.version": "OK"}
    finally:
        admin.close()


@pytest.mark.parametrize("transaction_version", [1, 2])
def test_consume_transform_produce_commits_offsets_with_the_output(brokers, transaction_version):
    use_transaction_version(brokers.bootstrap_servers, transaction_version)
    create(brokers.bootstrap_servers, "txn-in", 2)
    create(brokers.bootstrap_servers, "txn-doubled", 2)
    with Producer({"bootstrap.servers": brokers.bootstrap_servers}) as plain:
        for i in range(40):
            plain.send("txn-in", str(i).encode(), partition=i % 2)
        plain.flush()
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap_servers, "group.id": "doubler",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    tps = [TopicPartition("txn-in", 0), TopicPartition("txn-in", 1)]
    with transactional(brokers.bootstrap_servers, "doubler-0") as producer:
        producer.init_transactions()
        consumer.subscribe(["txn-in"])
        seen = 0
        aborted_once = False
        while seen < 40:
            records = consumer.poll(timeout_ms=TIMEOUT_S * 1000)
            assert records, "the consumer got nothing"
            producer.begin_transaction()
            for batch in records.values():
                for record in batch:
                    producer.send("txn-doubled", str(2 * int(record.value)).encode(), partition=record.partition)
            positions = {tp: batch[-1].offset + 1 for tp, batch in records.items()}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            if not aborted_once:  # the first round is thrown away: its records come again
                aborted_once = True
                producer.abort_transaction()
                for tp in records:
                    committed = consumer.committed([tp], timeout_ms=20_000)[tp]
                    consumer.seek(tp, committed.offset if committed is not None else 0)
                continue
            producer.commit_transaction()
            seen += sum(len(batch) for batch in records.values())
        committed = consumer.committed(tps, timeout_ms=20_000)
    consumer.close()
    assert {tp: om.offset for tp, om in committed.items()} == {tps[0]: 20, tps[1]: 20}
    assert all(isinstance(om, OffsetAndMetadata) for om in committed.values())
    eventually(lambda: sorted(int(v) for v in read_all(brokers.bootstrap_servers, "txn-doubled", 2)) == [2 * i for i in range(40)],
               TIMEOUT_S, "the doubled records")


def josef(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def test_the_transactions_tool_lists_describes_and_aborts_an_open_transaction(broker):
    create(broker.bootstrap_servers, "txn-tool")
    b = ("transactions", "--bootstrap-server", broker.bootstrap_servers)
    producer = transactional(broker.bootstrap_servers, "stuck")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-tool", b"stuck", partition=0)
        producer.flush()
        listed = josef(*b, "list")
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        assert header.split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
        assert [r.split()[0::3] for r in rows] == [["stuck", "Ongoing"]]
        described = josef(*b, "describe", "--transactional-id", "stuck")
        assert described.returncode == 0, described.stderr
        cells = described.stdout.splitlines()[1].split()
        assert cells[1] == "stuck" and cells[4] == "Ongoing" and cells[-1] == "txn-tool-0"
        producers = josef(*b, "describe-producers", "--topic", "txn-tool", "--partition", "0")
        assert producers.returncode == 0, producers.stderr
        assert producers.stdout.splitlines()[1].split()[-1] == "0"  # CurrentTransactionStartOffset
        aborted = josef(*b, "abort", "--topic", "txn-tool", "--partition", "0", "--start-offset", "0")
        assert aborted.returncode == 0 and aborted.stdout == "", aborted.stderr
        # The marker ended the transaction in the partition: read_committed consumers move on, without it.
        with Producer({"bootstrap.servers": broker.bootstrap_servers}) as plain:
            plain.send("txn-tool", b"later", partition=0).result(TIMEOUT_S)
        eventually(lambda: read_all(broker.bootstrap_servers, "txn-tool") == [b"later"], TIMEOUT_S, "the abort marker")
    finally:
        producer.close()
