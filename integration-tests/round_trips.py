"""What the security tests do with confluent-kafka over and over: a topic, records in, the same records out in a group.

Shared so that each test file says only what differs: the listener and the
client's security settings.
"""

from __future__ import annotations

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
