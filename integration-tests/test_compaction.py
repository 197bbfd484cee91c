"""Log compaction end to end, against a real broker process and confluent-kafka (librdkafka).

A compacted topic's cleaned log holds exactly the latest value of each live
key, and its tombstones go once ``delete.retention.ms`` has passed; a
consumer that reads the partition over and over while the cleaner runs sees
a valid log every time. ``__consumer_offsets`` stays small under a long
commit loop, so the group coordinator reloads it quickly after a restart.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

KEYS = 1000
UPDATES = 200_000
DELETED = range(100)  # keys that end with a tombstone
CLEANER = {"log.cleaner.backoff.ms": "100"}


def create_topic(broker, name: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(30)


def produce(producer: Producer, topic: str, records) -> None:
    failures = []
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0,
                                 on_delivery=lambda err, msg: err and failures.append(err))
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


def read_all(broker, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of partition 0 from the log start to the high watermark, as (offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.max.bytes": 4 << 20})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, 0)])
        records = []
        while high > low and (not records or records[-1][0] < high - 1):
            for msg in consumer.consume(10_000, timeout=10):
                assert msg.error() is None, msg.error()
                records.append((msg.offset(), msg.key(), msg.value()))
        return records
    finally:
        consumer.close()


def key(i: int) -> bytes:
    return b"k%04d" % i


def test_compacted_topic_keeps_the_latest_value_of_each_live_key(broker_factory):
    broker = broker_factory(**CLEANER)
    topic = "compacted"
    create_topic(broker, topic, **{"cleanup.policy": "compact", "segment.bytes": "262144",
                                   "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "2000"})
    passes, problems, stop = [], [], threading.Event()

    def read_while_cleaning() -> None:
        while not stop.is_set():
            records = read_all(broker, topic)
            offsets = [offset for offset, _, _ in records]
            if offsets != sorted(set(offsets)):
                problems.append("offsets out of order or repeated")
            latest: dict[bytes, int] = {}
            for _, k, v in records:
                if k != b"filler" and v is not None:
                    if int(v) % KEYS != int(k[1:]) or int(v) < latest.get(k, -1):
                        problems.append(f"{k!r} went from {latest.get(k)} to {v!r}")
                    latest[k] = int(v)
            passes.append(len(records))
            stop.wait(0.1)  # pacing, so an empty topic is not polled in a tight loop

    reader = threading.Thread(target=read_while_cleaning, daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 5,
                         "compression.type": "lz4", "queue.buffering.max.messages": 200_000})
    produce(producer, topic, ((key(i % KEYS), b"%d" % i) for i in range(UPDATES)))
    produce(producer, topic, ((key(i), None) for i in DELETED))
    # A key of its own fills the active segment, which is never cleaned, so every update above can be.
    produce(producer, topic, ((b"filler", os.urandom(1000)) for _ in range(300)))

    # Offsets never change: the latest update of key i stays at the offset it was written at.
    expected = {key(i): [(UPDATES - KEYS + i, b"%d" % (UPDATES - KEYS + i))] for i in range(KEYS) if i not in DELETED}

    def compacted() -> bool:
        # Tombstones go at a cleaning after delete.retention.ms; new writes make the log dirty again.
        produce(producer, topic, [(b"filler", os.urandom(1000))])
        found: dict[bytes, list[tuple[int, bytes | None]]] = {}
        for offset, k, v in read_all(broker, topic):
            if k != b"filler":
                found.setdefault(k, []).append((offset, v))
        return found == expected

    try:
        eventually(compacted, timeout=120, what="the log cleaned to one value per live key and no tombstone")
    finally:
        stop.set()
        reader.join(60)
    assert not problems, problems[:5]
    assert len(passes) >= 3, passes  # reads while producing, while cleaning, after


def segment_bytes(partition_dir: Path) -> int:
    return sum(path.stat().st_size for path in partition_dir.glob("*.log"))


def test_consumer_offsets_stay_bounded_and_reload_fast(broker_factory):
    broker = broker_factory(**CLEANER, **{"offsets.topic.num.partitions": "1", "offsets.topic.segment.bytes": "1048576"})
    create_topic(broker, "committed", partitions=100)
    client = RawClient(broker.port)
    group, commits_per_request, requests, window = "bounded", 100, 10_000, 50
    body = lambda n: {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                      "group_instance_id": None, "retention_time_ms": -1,
                      "topics": [{"name": "committed", "partitions": [
                          {"partition_index": p, "committed_offset": n, "committed_leader_epoch": -1,
                           "committed_metadata": ""} for p in range(commits_per_request)]}]}
    for start in range(0, requests, window):
        for n in range(start, start + window):
            client.send(ApiKey.OFFSET_COMMIT, 8, body(n))
        for _ in range(window):
            response = client.receive()
            assert {p.error_code for t in response.topics for p in t.partitions} == {0}
    client.close()
    offsets_dir = broker.data_dir / "__consumer_offsets-0"
    written = commits_per_request * requests  # 1,000,000 commits
    eventually(lambda: segment_bytes(offsets_dir) < 3 * 1048576, timeout=120,
               what=f"__consumer_offsets cleaned to a few segments (now {segment_bytes(offsets_dir)} bytes)")

    broker.kill()
    first_run = len(broker.log)
    broker.start()
    reloaded = lambda: [line for line in broker.log[first_run:] if "loaded __consumer_offsets-0" in line]
    line = eventually(lambda: reloaded() and reloaded()[0], timeout=60, what="__consumer_offsets-0 reloaded")
    loaded, seconds = re.search(r": (\d+) records in ([\d.]+)s", line).groups()
    assert 0 < int(loaded) < written // 20, line
    client = RawClient(broker.port)
    fetched = client.call(ApiKey.OFFSET_FETCH, 8, {"groups": [{"group_id": group, "topics": None}],
                                                   "require_stable": False})
    offsets = {p.partition_index: p.committed_offset for g in fetched.groups for t in g.topics for p in t.partitions}
    client.close()
    assert offsets == {p: requests - 1 for p in range(commits_per_request)}
    print(f"wrote {written} commits; restart loaded {loaded} records in {seconds}s")
