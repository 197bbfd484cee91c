"""Client throughput on one josef broker: josef's own client beside confluent-kafka, kafka-python and aiokafka.

Every client produces the same records (100-byte values, no keys) to its own
topic of a fresh default broker, then reads them back from offset 0 with
assigned partitions (no group). All producers use the same settings:
acks=1, linger.ms=5, batch size 1 MB, idempotence off, so the figures compare
the clients and not their defaults.

    uv run python benchmarks/clients.py [--records 500000] [--size 100] [--json FILE]

The broker is started and stopped by PID (see broker.py); the machine is
described in the header, and rates are records per second of wall time from
the first send to the last acknowledgement (produce) or record (consume).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(__file__))
from broker import Broker, create_topic  # noqa: E402  (the sibling benchmark's broker starter)

BATCH = 1_000_000
LINGER_MS = 5


def josef_produce(bootstrap: str, topic: str, n: int, value: bytes) -> None:
    from josef_client import Producer

    with Producer(bootstrap_servers=bootstrap, acks="1", enable_idempotence=False, linger_ms=LINGER_MS,
                  batch_size=BATCH, buffer_memory=256 * 1024 * 1024) as producer:
        for _ in range(n):
            producer.send(topic, value)
        producer.flush()


def josef_async_produce(bootstrap: str, topic: str, n: int, value: bytes) -> None:
    from josef_client import AsyncProducer

    async def main() -> None:
        async with AsyncProducer(bootstrap_servers=bootstrap, acks="1", enable_idempotence=False,
                                 linger_ms=LINGER_MS, batch_size=BATCH, buffer_memory=256 * 1024 * 1024) as producer:
            for _ in range(n):
                await producer.send(topic, value)
            await producer.flush()

    asyncio.run(main())


def confluent_produce(bootstrap: str, topic: str, n: int, value: bytes) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": LINGER_MS, "batch.size": BATCH,
                         "enable.idempotence": False, "queue.buffering.max.kbytes": 1048576,
                         "queue.buffering.max.messages": 2_000_000})
    for i in range(n):
        producer.produce(topic, value)
        if i % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def kafka_python_produce(bootstrap: str, topic: str, n: int, value: bytes) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=LINGER_MS, batch_size=BATCH,
                             enable_idempotence=False)
    for _ in range(n):
        producer.send(topic, value)
    producer.flush()
    producer.close()


def aiokafka_produce(bootstrap: str, topic: str, n: int, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=LINGER_MS, max_batch_size=BATCH,
                                    enable_idempotence=False)
        await producer.start()
        try:
            for _ in range(n):
                await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(main())


def josef_consume(bootstrap: str, topic: str, n: int) -> None:
    from josef_client import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap, max_poll_records=100_000)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    got = 0
    while got < n:
        got += sum(len(records) for records in consumer.poll(timeout_ms=5000).values())
    consumer.close()


def confluent_consume(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    while got < n:
        got += len(consumer.consume(min(100_000, n - got), timeout=5))
    consumer.close()


def kafka_python_consume(bootstrap: str, topic: str, n: int) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=100_000)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    got = 0
    while got < n:
        got += sum(len(records) for records in consumer.poll(timeout_ms=5000).values())
    consumer.close()


def aiokafka_consume(bootstrap: str, topic: str, n: int) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 0)
            got = 0
            while got < n:
                batches = await consumer.getmany(timeout_ms=5000, max_records=100_000)
                got += sum(len(records) for records in batches.values())
        finally:
            await consumer.stop()

    asyncio.run(main())


PRODUCERS: dict[str, Callable[..., None]] = {
    "josef": josef_produce, "josef-async": josef_async_produce, "confluent-kafka": confluent_produce,
    "kafka-python": kafka_python_produce, "aiokafka": aiokafka_produce,
}
CONSUMERS: dict[str, Callable[..., None]] = {
    "josef": josef_consume, "confluent-kafka": confluent_consume, "kafka-python": kafka_python_consume,
    "aiokafka": aiokafka_consume,
}


def timed(function: Callable[..., None], *args: Any) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--clients", default=",".join(PRODUCERS), help="comma-separated subset")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    chosen = args.clients.split(",")
    value = b"x" * args.size
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}; {args.records:,} records of "
          f"{args.size} B; acks=1, linger.ms={LINGER_MS}, batch {BATCH:,} B")
    figures: dict[str, dict[str, float]] = {}
    with Broker({}, start_timeout=30) as broker:
        for name in chosen:
            topic = f"bench-{name}"
            create_topic(broker.bootstrap, topic, 1, timeout=60)
            os.sync()
            produce_s = timed(PRODUCERS[name], broker.bootstrap, topic, args.records, value)
            figures[name] = {"produce_records_per_s": args.records / produce_s}
            if name in CONSUMERS:
                consume_s = timed(CONSUMERS[name], broker.bootstrap, topic, args.records)
                figures[name]["consume_records_per_s"] = args.records / consume_s
            print(f"{name:16s} produce {figures[name]['produce_records_per_s']:>12,.0f} rec/s   consume "
                  + (f"{figures[name]['consume_records_per_s']:>12,.0f} rec/s" if name in CONSUMERS else "—"),
                  flush=True)
    base = {k: figures[k] for k in ("kafka-python", "aiokafka") if k in figures}
    if "josef" in figures and base:
        for other, theirs in base.items():
            for what in ("produce_records_per_s", "consume_records_per_s"):
                print(f"josef / {other} {what.split('_')[0]}: {figures['josef'][what] / theirs[what]:.1f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
