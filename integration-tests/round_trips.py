"""What the security tests do with confluent-kafka over and over: a topic, records in, the same records out in a group.

Shared so that each test file says only what differs: the listener and the
client's security settings.
"""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def poll_values(consumer: Consumer, count: int, attempts: int = 600) -> list[bytes]:
    """Values of the records ``consumer`` polls (errors skipped), until ``count`` arrived or ``attempts`` polls of 0.1 s."""
    seen: list[bytes] = []
    for _ in range(attempts):
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            seen.append(message.value())
        if len(seen) >= count:
            break
    return seen


def first_error(consumer: Consumer, attempts: int = 300) -> int | None:
    """The code of the first error ``consumer`` polls (a refused group or topic), None if none comes."""
    for _ in range(attempts):
        message = consumer.poll(0.1)
        if message is not None and message.error() is not None:
            return message.error().code()
    return None


def confluent_round_trip(settings: dict[str, Any], topic: str, count: int = 50, *, create: bool = True,
                         group: str | None = None) -> set[bytes]:
    """Create ``topic`` (the admin call), produce ``count`` records ``<topic>-<i>`` idempotently, consume them in a
    group and commit; returns the values consumed."""
    if create:
        admin = AdminClient(settings)  # kept in a variable: a destroyed handle fails its futures
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({**settings, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, f"{topic}-{i}".encode(), key=str(i).encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**settings, "group.id": group or f"{topic}-group", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        seen = set(poll_values(consumer, count))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


def expected(topic: str, count: int = 50) -> set[bytes]:
    return {f"{topic}-{i}".encode() for i in range(count)}


def kafka_python_transactional_round_trip(settings: dict[str, Any], topic: str, count: int = 20) -> list[bytes]:
    """kafka-python: create ``topic`` with its admin client, write ``count`` records ``k<i>`` in one transaction,
    read them back read_committed in a group and commit; returns the values read."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(**settings)
    admin.create_topics([KpNewTopic(topic, 1, 1)])
    admin.close()
    producer = KafkaProducer(transactional_id=f"{topic}-tx", **settings)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(count):
        producer.send(topic, f"k{i}".encode())
    producer.commit_transaction()
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"{topic}-group", auto_offset_reset="earliest",
                             isolation_level="read_committed", consumer_timeout_ms=15000, **settings)
    seen = []
    for message in consumer:
        seen.append(message.value)
        if len(seen) == count:
            break
    consumer.commit()
    consumer.close()
    return seen


async def aiokafka_transactional_round_trip(settings: dict[str, Any], topic: str, count: int = 20) -> list[bytes]:
    """aiokafka: the same as :func:`kafka_python_transactional_round_trip`, records ``a<i>``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioNewTopic

    admin = AIOKafkaAdminClient(**settings)
    await admin.start()
    try:
        await admin.create_topics([AioNewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(transactional_id=f"{topic}-tx", **settings)
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(count):
                await producer.send(topic, f"a{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, group_id=f"{topic}-group", auto_offset_reset="earliest",
                                isolation_level="read_committed", **settings)
    await consumer.start()
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            async for message in consumer:
                seen.append(message.value)
                if len(seen) == count:
                    break
        await consumer.commit()
    finally:
        await consumer.stop()
    return seen


def confluent_transactional_round_trip(settings: dict[str, Any], topic: str, count: int = 20) -> list[bytes]:
    """confluent-kafka: create ``topic``, write ``count`` records ``t<i>`` in one transaction, read them back
    read_committed in a group; returns the values read."""
    admin = AdminClient(settings)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({**settings, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, f"t{i}".encode())
    producer.commit_transaction(30)
    consumer = Consumer({**settings, "group.id": f"{topic}-group", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    try:
        seen = poll_values(consumer, count)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen
