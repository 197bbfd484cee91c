"""Fetch sessions (KIP-227) with real fetchers: kafka-python's consumer (sessions on by default), librdkafka
(which fetches without them), and followers competing for a one-slot session cache."""

import random

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from josef.testing import eventually, free_ports

pytestmark = pytest.mark.storage

PARTITIONS = 200
RECORDS = 2000


def produce_spread(bootstrap: str, topic: str, count: int, *, acks: str = "1") -> dict[int, list[bytes]]:
    """``count`` records over random partitions; what each partition holds, in order."""
    rng = random.Random(topic)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": acks})
    sent: dict[int, list[bytes]] = {}
    for i in range(count):
        partition = rng.randrange(PARTITIONS)
        value = f"{topic}-{i}".encode()
        sent.setdefault(partition, []).append(value)
        producer.produce(topic, value, partition=partition)
        producer.poll(0)
    assert producer.flush(30) == 0
    return sent


def read_into(consumer: KafkaConsumer, got: dict[int, list[bytes]], total: int) -> None:
    """Read from kafka-python's ``consumer`` into ``got`` (values by partition) until it holds ``total`` records."""
    for message in consumer:
        got.setdefault(message.partition, []).append(message.value)
        if sum(map(len, got.values())) == total:
            return


def read_with_librdkafka(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    """Every partition's records from the start (librdkafka fetches without sessions), ``RECORDS`` in all."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: dict[int, list[bytes]] = {}
    try:
        while sum(map(len, seen.values())) < RECORDS:
            messages = reader.consume(1000, timeout=10)
            assert messages, f"librdkafka stopped at {sum(map(len, seen.values()))} records"
            for m in messages:
                assert m.error() is None, m.error()
                seen.setdefault(m.partition(), []).append(m.value())
    finally:
        reader.close()
    return seen


def create(bootstrap: str, topic: str, replication: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, replication, config=config)])[topic].result(60)


def test_kafka_python_reads_200_partitions_through_an_incremental_session_and_librdkafka_without_one(broker):
    create(broker.bootstrap_servers, "sessions")
    sent = produce_spread(broker.bootstrap_servers, "sessions", RECORDS // 2)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=20_000)
    consumer.assign([KafkaTopicPartition("sessions", p) for p in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {}
    try:
        read_into(consumer, got, RECORDS // 2)
        # More records while the session is open: the incremental fetches must bring exactly these.
        for partition, values in produce_spread(broker.bootstrap_servers, "sessions", RECORDS // 2).items():
            sent.setdefault(partition, []).extend(values)
        read_into(consumer, got, RECORDS)
        handlers = consumer._fetcher._session_handlers  # kafka-python's own record of its sessions
        assert handlers and all(h.next_metadata.session_id > 0 and h.next_metadata.epoch > 1 for h in handlers.values()), handlers
    finally:
        consumer.close()
    assert got == sent

    assert read_with_librdkafka(broker.bootstrap_servers, "sessions") == sent


def test_followers_replicate_when_one_session_slot_leaves_the_other_follower_sessionless(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **{"max.incremental.fetch.session.cache.slots": "1"})
    create(cluster.bootstrap_servers, "replicated", replication=3, **{"min.insync.replicas": "3"})
    sent = produce_spread(cluster.bootstrap_servers, "replicated", RECORDS, acks="all")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

    def full_isr() -> bool:
        topic = admin.list_topics("replicated", timeout=10).topics["replicated"]
        return all(len(p.isrs) == 3 for p in topic.partitions.values())

    eventually(full_isr, timeout=30, what="every partition's ISR holding all three brokers")
    assert read_with_librdkafka(cluster.bootstrap_servers, "replicated") == sent


def test_kafka_python_starts_a_new_session_when_a_restarted_broker_has_forgotten_its_own(broker_factory, monkeypatch):
    """A restart loses every session: kafka-python's next fetch fails (FETCH_SESSION_ID_NOT_FOUND, or its connection
    broke under a fetch) and it must start a new session that reads on from where it was, nothing lost or repeated."""
    from kafka.consumer.fetcher import FetchSessionHandler

    failures: list[str] = []
    real_response, real_error = FetchSessionHandler.handle_response, FetchSessionHandler.handle_error

    def handle_response(self, response):
        if response.error_code:
            failures.append(f"error {response.error_code}")
        return real_response(self, response)

    def handle_error(self, exception):
        failures.append(f"exception {exception!r}")
        return real_error(self, exception)

    monkeypatch.setattr(FetchSessionHandler, "handle_response", handle_response)
    monkeypatch.setattr(FetchSessionHandler, "handle_error", handle_error)
    port = free_ports(1)[0]
    broker = broker_factory(listeners=f"PLAINTEXT://127.0.0.1:{port}")
    create(broker.bootstrap_servers, "restarted")
    sent = produce_spread(broker.bootstrap_servers, "restarted", RECORDS // 2)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=30_000, reconnect_backoff_max_ms=200)
    consumer.assign([KafkaTopicPartition("restarted", p) for p in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {}
    try:
        read_into(consumer, got, RECORDS // 2)
        (handler,) = consumer._fetcher._session_handlers.values()
        before = handler.next_metadata.session_id
        assert before > 0
        broker.restart()
        for partition, values in produce_spread(broker.bootstrap_servers, "restarted", RECORDS // 2).items():
            sent.setdefault(partition, []).extend(values)
        read_into(consumer, got, RECORDS)
        (handler,) = consumer._fetcher._session_handlers.values()
        assert failures, "kafka-python never noticed that its session was gone"
        assert handler.next_metadata.session_id not in (0, before)  # a new session, on the restarted broker
    finally:
        consumer.close()
    assert got == sent
