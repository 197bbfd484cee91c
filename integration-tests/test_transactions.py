"""Transactions with real clients over real sockets: confluent-kafka, kafka-python and aiokafka producers.

What a committed transaction writes becomes visible to ``read_committed``
consumers all at once; an aborted one never does (``read_uncommitted`` sees
its records); a producer that dies mid-transaction is aborted by the
coordinator after its ``transaction.timeout.ms``; a new producer with the
same ``transactional.id`` fences the old one; and offsets sent in a
transaction are committed with it (crashes of the application and of the
coordinator are in test_transactions_exactly_once.py). Tests taking ``brokers`` run against one
broker and against three, where ``__transaction_state`` has three replicas
(its default) and markers travel between brokers.

To know that nothing more is coming, a test ends with a committed
*sentinel* transaction and reads until the sentinel: whatever an aborted
transaction wrote before it would have been seen by then.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any, Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaPythonTopicPartition

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

pytestmark = [pytest.mark.metadata, pytest.mark.storage]

DEADLINE_S = 60
SENTINEL = b"sentinel"
#: Short coordinator intervals, so an expired transaction is aborted within a second of its timeout.
FAST_ABORTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """A topic with the brokers' default.replication.factor (3 in the 3-broker runs)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)


def confluent_producer(bootstrap: str, transactional_id: str, **settings: Any) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **settings})
    producer.init_transactions(DEADLINE_S)
    return producer


def commit_sentinel(bootstrap: str, topic: str, partitions: int = 1) -> None:
    producer = confluent_producer(bootstrap, f"sentinel-{topic}")
    producer.begin_transaction()
    for partition in range(partitions):
        producer.produce(topic, value=SENTINEL, partition=partition)
    producer.commit_transaction(DEADLINE_S)


def read(bootstrap: str, topic: str, isolation: str, *, until: Callable[[list[bytes]], bool]) -> list[bytes]:
    """Values of ``topic`` from the start, as a consumer of ``isolation`` reads them, until ``until(values)``.

    The partitions are assigned, not subscribed to: no group is involved.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "isolation.level": isolation,
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    partitions = consumer.list_topics(topic, DEADLINE_S).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not until(values):
            assert time.monotonic() < deadline, f"read only {values!r} from {topic} ({isolation})"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def sentinels(count: int = 1) -> Callable[[list[bytes]], bool]:
    return lambda values: values.count(SENTINEL) >= count


# confluent-kafka -----------------------------------------------------------------------------------------


def test_confluent_kafka_commit_is_seen_by_read_committed(brokers):
    create(brokers.bootstrap_servers, "txn-commit", 3)
    producer = confluent_producer(brokers.bootstrap_servers, "confluent-commit")
    producer.begin_transaction()
    for i in range(30):
        producer.produce("txn-commit", value=b"v%d" % i, partition=i % 3)
    producer.commit_transaction(DEADLINE_S)
    values = read(brokers.bootstrap_servers, "txn-commit", "read_committed", until=lambda v: len(v) >= 30)
    assert sorted(values) == sorted(b"v%d" % i for i in range(30))


def test_confluent_kafka_abort_is_seen_only_by_read_uncommitted(brokers):
    create(brokers.bootstrap_servers, "txn-abort", 2)
    producer = confluent_producer(brokers.bootstrap_servers, "confluent-abort")
    producer.begin_transaction()
    for i in range(10):
        producer.produce("txn-abort", value=b"aborted-%d" % i, partition=i % 2)
    producer.flush(DEADLINE_S)
    producer.abort_transaction(DEADLINE_S)
    producer.begin_transaction()  # the same producer goes on after an abort
    producer.produce("txn-abort", value=b"kept", partition=0)
    producer.commit_transaction(DEADLINE_S)
    commit_sentinel(brokers.bootstrap_servers, "txn-abort", 2)
    committed = read(brokers.bootstrap_servers, "txn-abort", "read_committed", until=sentinels(2))
    assert sorted(committed) == [b"kept", SENTINEL, SENTINEL]
    uncommitted = read(brokers.bootstrap_servers, "txn-abort", "read_uncommitted", until=sentinels(2))
    assert sorted(v for v in uncommitted if v.startswith(b"aborted")) == sorted(b"aborted-%d" % i for i in range(10))


def test_a_new_producer_fences_the_old_one(brokers):
    create(brokers.bootstrap_servers, "txn-fence")
    old = confluent_producer(brokers.bootstrap_servers, "confluent-fence")
    old.begin_transaction()
    old.produce("txn-fence", value=b"zombie")
    old.flush(DEADLINE_S)
    new = confluent_producer(brokers.bootstrap_servers, "confluent-fence")  # aborts the old one's transaction
    new.begin_transaction()
    new.produce("txn-fence", value=b"new")
    new.commit_transaction(DEADLINE_S)
    with pytest.raises(KafkaException) as raised:
        old.commit_transaction(DEADLINE_S)
    error: KafkaError = raised.value.args[0]
    assert error.fatal() and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                              KafkaError.INVALID_PRODUCER_EPOCH), error
    commit_sentinel(brokers.bootstrap_servers, "txn-fence")
    assert sorted(read(brokers.bootstrap_servers, "txn-fence", "read_committed", until=sentinels())) == [
        b"new", SENTINEL]


DYING_PRODUCER = """
import sys, time
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "dies-mid-transaction",
                     "transaction.timeout.ms": 3000})
producer.init_transactions(60)
producer.begin_transaction()
producer.produce(sys.argv[2], value=b"lost")
producer.flush(60)
print("produced", flush=True)
time.sleep(600)
"""


def test_a_producer_that_dies_mid_transaction_is_aborted_after_its_timeout(brokers_factory):
    brokers = brokers_factory(**FAST_ABORTS)
    create(brokers.bootstrap_servers, "txn-dies")
    child = subprocess.Popen([sys.executable, "-c", DYING_PRODUCER, brokers.bootstrap_servers, "txn-dies"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "produced"
    finally:
        child.kill()  # SIGKILL by its PID: no abort, no goodbye
        child.wait(30)
    # The open transaction holds read_committed consumers back until the coordinator aborts it.
    commit_sentinel(brokers.bootstrap_servers, "txn-dies")
    assert read(brokers.bootstrap_servers, "txn-dies", "read_committed", until=sentinels()) == [SENTINEL]
    assert read(brokers.bootstrap_servers, "txn-dies", "read_uncommitted", until=sentinels()) == [b"lost", SENTINEL]
    # The restarted producer gets a new epoch: the coordinator's abort already fenced the dead one.
    producer = confluent_producer(brokers.bootstrap_servers, "dies-mid-transaction")
    producer.begin_transaction()
    producer.produce("txn-dies", value=b"after")
    producer.commit_transaction(DEADLINE_S)
    assert read(brokers.bootstrap_servers, "txn-dies", "read_committed", until=lambda v: b"after" in v) == [
        SENTINEL, b"after"]


def test_send_offsets_to_transaction_commits_group_offsets_with_it(brokers):
    """Consume-transform-produce: the group's offsets are committed in the producer's transaction (TxnOffsetCommit)."""
    create(brokers.bootstrap_servers, "txn-in", 2)
    create(brokers.bootstrap_servers, "txn-out")
    seed = Producer({"bootstrap.servers": brokers.bootstrap_servers})
    for i in range(6):
        seed.produce("txn-in", value=b"in-%d" % i, partition=i % 2)
    seed.flush(DEADLINE_S)

    consumer = Consumer({"bootstrap.servers": brokers.bootstrap_servers, "group.id": "transformer",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe(["txn-in"])
    producer = confluent_producer(brokers.bootstrap_servers, "transformer-out")
    try:
        def transform(count: int, commit: bool) -> None:
            producer.begin_transaction()
            seen = 0
            deadline = time.monotonic() + DEADLINE_S
            while seen < count:
                assert time.monotonic() < deadline
                message = consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue
                producer.produce("txn-out", value=message.value().upper())
                seen += 1
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), DEADLINE_S)
            if commit:
                producer.commit_transaction(DEADLINE_S)
            else:
                producer.abort_transaction(DEADLINE_S)

        transform(6, commit=True)
        committed = consumer.committed([TopicPartition("txn-in", 0), TopicPartition("txn-in", 1)], DEADLINE_S)
        assert sorted(tp.offset for tp in committed) == [3, 3]
        seed.produce("txn-in", value=b"in-6", partition=0)
        seed.flush(DEADLINE_S)
        transform(1, commit=False)  # aborted: its offset is not committed either
        committed = consumer.committed([TopicPartition("txn-in", 0)], DEADLINE_S)
        assert committed[0].offset == 3
    finally:
        consumer.close()
    commit_sentinel(brokers.bootstrap_servers, "txn-out")
    out = read(brokers.bootstrap_servers, "txn-out", "read_committed", until=sentinels())
    assert sorted(out) == sorted([b"IN-%d" % i for i in range(6)] + [SENTINEL])


def test_aborted_and_open_transactions_survive_kill_9(broker_factory):
    """After SIGKILL the log's recovery rebuilds what read_committed needs: the aborted index and the open transaction.

    The restarted broker must still hide the aborted records (its .txnindex is rebuilt from the
    markers), hold read_committed consumers below the transaction left open (the producer state
    rebuilt from the log), and show what that transaction wrote only once the coordinator has
    aborted it after its timeout.
    """
    broker = broker_factory(**FAST_ABORTS)
    create(broker.bootstrap_servers, "txn-crash", 2)
    producer = confluent_producer(broker.bootstrap_servers, "crash-tx")
    for round_, commit in enumerate((True, False, True, False)):
        producer.begin_transaction()
        for i in range(20):
            producer.produce("txn-crash", value=b"%s-%d-%d" % (b"c" if commit else b"a", round_, i), partition=i % 2)
        assert producer.flush(DEADLINE_S) == 0  # on the broker before the abort (which drops what is unsent)
        (producer.commit_transaction if commit else producer.abort_transaction)(DEADLINE_S)
    hanging = confluent_producer(broker.bootstrap_servers, "crash-open", **{"transaction.timeout.ms": 3000})
    hanging.begin_transaction()
    hanging.produce("txn-crash", value=b"open", partition=0)
    assert hanging.flush(DEADLINE_S) == 0
    broker.kill()
    broker.start()
    commit_sentinel(broker.bootstrap_servers, "txn-crash", 2)
    committed = read(broker.bootstrap_servers, "txn-crash", "read_committed", until=sentinels(2))
    assert sorted(v for v in committed if v != SENTINEL) == sorted(
        b"c-%d-%d" % (r, i) for r in (0, 2) for i in range(20))
    everything = read(broker.bootstrap_servers, "txn-crash", "read_uncommitted", until=sentinels(2))
    assert sum(v.startswith(b"a-") for v in everything) == 40 and b"open" in everything


# kafka-python --------------------------------------------------------------------------------------------


def test_kafka_python_transactions(brokers):
    create(brokers.bootstrap_servers, "txn-kp", 2)
    producer = KafkaProducer(bootstrap_servers=brokers.bootstrap_servers, transactional_id="kafka-python-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(4):
            producer.send("txn-kp", value=b"committed-%d" % i, partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("txn-kp", value=b"aborted", partition=0).get(DEADLINE_S)
        producer.abort_transaction()
    finally:
        producer.close(DEADLINE_S)
    commit_sentinel(brokers.bootstrap_servers, "txn-kp", 2)
    consumer = KafkaConsumer("txn-kp", bootstrap_servers=brokers.bootstrap_servers, isolation_level="read_committed",
                             auto_offset_reset="earliest", group_id=None, consumer_timeout_ms=DEADLINE_S * 1000)
    values: list[bytes] = []
    try:
        for message in consumer:
            values.append(message.value)
            if values.count(SENTINEL) == 2:
                break
    finally:
        consumer.close()
    assert sorted(values) == sorted([b"committed-%d" % i for i in range(4)] + [SENTINEL, SENTINEL])
    uncommitted = read(brokers.bootstrap_servers, "txn-kp", "read_uncommitted", until=sentinels(2))
    assert b"aborted" in uncommitted


def test_kafka_python_send_offsets_to_transaction(brokers):
    create(brokers.bootstrap_servers, "txn-kp-in")
    seed = Producer({"bootstrap.servers": brokers.bootstrap_servers})
    seed.produce("txn-kp-in", value=b"x")
    seed.flush(DEADLINE_S)
    producer = KafkaProducer(bootstrap_servers=brokers.bootstrap_servers, transactional_id="kafka-python-offsets")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({KafkaPythonTopicPartition("txn-kp-in", 0): OffsetAndMetadata(1, "", -1)},
                                             "kp-group")
        producer.commit_transaction()
    finally:
        producer.close(DEADLINE_S)
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap_servers, "group.id": "kp-group"})
    try:
        [committed] = consumer.committed([TopicPartition("txn-kp-in", 0)], DEADLINE_S)
    finally:
        consumer.close()
    assert committed.offset == 1


# aiokafka ------------------------------------------------------------------------------------------------


def test_aiokafka_transactions_and_offsets(brokers):
    create(brokers.bootstrap_servers, "txn-aio", 2)

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=brokers.bootstrap_servers, transactional_id="aiokafka-tx")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(4):
                    await producer.send("txn-aio", value=b"committed-%d" % i, partition=i % 2)
                await producer.send_offsets_to_transaction({AioTopicPartition("txn-aio", 0): 2}, "aio-group")
            with pytest.raises(RuntimeError, match="rolled back"):
                async with producer.transaction():
                    await producer.send_and_wait("txn-aio", value=b"aborted", partition=1)
                    raise RuntimeError("rolled back")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=brokers.bootstrap_servers, group_id="aio-group",
                                    isolation_level="read_committed", enable_auto_commit=False)
        await consumer.start()
        try:
            assert await consumer.committed(AioTopicPartition("txn-aio", 0)) == 2
        finally:
            await consumer.stop()

    asyncio.run(main())
    commit_sentinel(brokers.bootstrap_servers, "txn-aio", 2)
    committed = read(brokers.bootstrap_servers, "txn-aio", "read_committed", until=sentinels(2))
    assert sorted(committed) == sorted([b"committed-%d" % i for i in range(4)] + [SENTINEL, SENTINEL])
    uncommitted = read(brokers.bootstrap_servers, "txn-aio", "read_uncommitted", until=sentinels(2))
    assert b"aborted" in uncommitted


def test_transactions_are_listed_and_described(broker):
    """What ``kafka-transactions.sh list/describe`` shows, through the Java-compatible admin APIs (raw requests)."""
    create(broker.bootstrap_servers, "txn-admin")
    producer = confluent_producer(broker.bootstrap_servers, "listed-tx")
    producer.begin_transaction()
    producer.produce("txn-admin", value=b"open")
    producer.flush(DEADLINE_S)
    client = RawClient(broker.port)
    try:
        listed = client.call(ApiKey.LIST_TRANSACTIONS, 1, {"state_filters": ["Ongoing"], "producer_id_filters": [],
                                                           "duration_filter": -1})
        assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [
            ("listed-tx", "Ongoing")]
        [described] = client.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["listed-tx"]}).transaction_states
        assert [(t.topic, list(t.partitions)) for t in described.topics] == [("txn-admin", [0])]
    finally:
        client.close()
    producer.commit_transaction(DEADLINE_S)
