"""A full disk fails produce requests with KAFKA_STORAGE_ERROR and loses nothing acknowledged; a read-only one stops start-up.

The broker's log directory is a small tmpfs that the test mounts (root is
needed to mount; CI runs as root). With its only log directory offline the
broker stops, as Kafka's does; test_jbod_failover.py has a broker with two.
"""

import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)"),
              pytest.mark.storage]


def send(broker, topic, values):
    results = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 0,
                         "retries": 0, "message.max.bytes": 1_000_000})
    for value in values:
        producer.produce(topic, value=value, partition=0,
                         on_delivery=lambda err, msg: results.append((err, msg.offset(), msg.value())))
        producer.flush(30)
    return results


def read(broker, topic, count):
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while len(got) < count:
            messages = consumer.consume(count - len(got), timeout=10)
            assert messages, f"read {len(got)} of {count}"
            got.extend(m.value() for m in messages if m.error() is None)
    finally:
        consumer.close()
    return got


def test_full_disk(broker_factory, small_disk):
    broker = broker_factory(small_disk, **{"log.segment.bytes": "100000000"})
    values = [bytes([i]) * 400_000 for i in range(12)]  # 4.8 MB into a 3 MB disk
    results = send(broker, "full", values)
    acked = [v for err, _, v in results if err is None]
    errors = [err for err, _, _ in results if err is not None]
    assert acked and errors
    assert {e.code() for e in errors} == {KafkaError.KAFKA_STORAGE_ERROR}
    # Its only log directory went offline: the broker stops by itself, with an error.
    assert broker.proc is not None
    assert broker.proc.wait(timeout=30) != 0
    broker.proc = None
    # The operator grows the disk and starts the broker again: everything acknowledged is there.
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    broker.start()
    assert read(broker, "full", len(acked)) == acked


def test_read_only_disk_stops_start_up_with_a_clear_error(tmp_path, small_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "josef", "server", "start", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
             "--override", "http.listeners=http://127.0.0.1:0",
             "--override", f"log.dirs={small_disk}"], capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert result.returncode != 0
    assert "Read-only file system" in result.stderr
    assert "Traceback" not in result.stderr
