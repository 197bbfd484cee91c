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

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.testing import RawClient, eventually

pytestmark = pytest.mark.storage

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


class Reader:
    """Reads partition 0 whole over and over on a thread of its own, checking that every pass sees a valid log.

    The test marks phases (``begin``) and awaits a whole pass that began in
    a phase (``whole_pass``), so it gets the passes it needs, at the points
    it needs them, instead of counting what a span of time happened to allow.
    """

    def __init__(self, broker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.problems: list[str] = []
        self.first_passes: dict[int, dict[bytes, list[tuple[int, bytes | None]]]] = {}  # phase: records by key
        self._phase = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the reader did not stop"

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                phase = self._phase  # before the read: the pass sees at least what was acknowledged by then
                records = read_all(self.broker, self.topic)
                offsets = [offset for offset, _, _ in records]
                if offsets != sorted(set(offsets)):
                    self.problems.append("offsets out of order or repeated")
                latest: dict[bytes, int] = {}
                by_key: dict[bytes, list[tuple[int, bytes | None]]] = {}
                for offset, k, v in records:
                    if k != b"filler":
                        by_key.setdefault(k, []).append((offset, v))
                        if v is not None:
                            if int(v) % KEYS != int(k[1:]) or int(v) < latest.get(k, -1):
                                self.problems.append(f"{k!r} went from {latest.get(k)} to {v!r}")
                            latest[k] = int(v)
                with self._changed:
                    self.first_passes.setdefault(phase, by_key)
                    self._changed.notify_all()
                self._stop.wait(0.1)  # pacing, so an empty topic is not polled in a tight loop
        except BaseException as exc:
            self.problems.append(f"the reader failed: {exc!r}")
        finally:
            with self._changed:
                self._changed.notify_all()

    def begin(self) -> int:
        """A new phase: passes from now on belong to it."""
        with self._changed:
            self._phase += 1
            return self._phase

    def whole_pass(self, phase: int, timeout: float = 120) -> dict[bytes, list[tuple[int, bytes | None]]]:
        """Records by key (filler left out) of the first whole pass that began in ``phase``, once there is one."""
        with self._changed:
            self._changed.wait_for(lambda: phase in self.first_passes or not self._thread.is_alive(), timeout)
            assert not self.problems, self.problems[:5]
            assert phase in self.first_passes, f"no whole pass of the reader began in phase {phase} and ended within {timeout} s"
            return self.first_passes[phase]

    def next_pass(self) -> dict[bytes, list[tuple[int, bytes | None]]]:
        return self.whole_pass(self.begin())


def test_compacted_topic_keeps_the_latest_value_of_each_live_key(broker_factory):
    broker = broker_factory(**CLEANER)
    topic = "compacted"
    create_topic(broker, topic, **{"cleanup.policy": "compact", "segment.bytes": "262144",
                                   "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "2000"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 5,
                         "compression.type": "lz4", "queue.buffering.max.messages": 200_000})
    updates = [(key(i % KEYS), b"%d" % i) for i in range(UPDATES)]
    half, three_quarters = UPDATES // 2, UPDATES * 3 // 4

    def latest_value(k: bytes, upto: int) -> bytes:
        """The last value of key ``k`` among ``updates[:upto]``."""
        return b"%d" % (upto - KEYS + int(k[1:]))

    with Reader(broker, topic) as reader:
        # A pass over a log half written, while more is produced and the cleaner cleans what is there. It
        # began after the first half was acknowledged and ends before the last quarter is produced.
        produce(producer, topic, updates[:half])
        phase = reader.begin()
        produce(producer, topic, updates[half:three_quarters])
        seen = reader.whole_pass(phase)
        assert set(seen) == {key(i) for i in range(KEYS)}, "a pass lost a key"
        for k, records in seen.items():
            assert int(records[-1][1]) >= int(latest_value(k, half)), f"a pass lost the acknowledged update of {k!r}"
        produce(producer, topic, updates[three_quarters:])
        produce(producer, topic, ((key(i), None) for i in DELETED))
        # A key of its own fills the active segment, which is never cleaned, so every update above can be.
        produce(producer, topic, ((b"filler", os.urandom(1000)) for _ in range(300)))

        # A pass that began after the last write and before the log is seen compacted: the latest record of
        # each key is its last write, whatever the cleaner has done so far.
        seen = reader.next_pass()
        for i in range(KEYS):
            last = seen[key(i)][-1][1] if key(i) in seen else None
            assert last == (None if i in DELETED else latest_value(key(i), UPDATES)), (key(i), seen.get(key(i)))

        # Offsets never change: the latest update of key i stays at the offset it was written at.
        expected = {key(i): [(UPDATES - KEYS + i, latest_value(key(i), UPDATES))] for i in range(KEYS) if i not in DELETED}

        def compacted() -> bool:
            # Tombstones go at a cleaning after delete.retention.ms; new writes make the log dirty again.
            produce(producer, topic, [(b"filler", os.urandom(1000))])
            found: dict[bytes, list[tuple[int, bytes | None]]] = {}
            for offset, k, v in read_all(broker, topic):
                if k != b"filler":
                    found.setdefault(k, []).append((offset, v))
            return found == expected

        eventually(compacted, timeout=120, what="the log cleaned to one value per live key and no tombstone")
        # And a pass of the reader that began after sees the same.
        assert reader.next_pass() == expected
    assert not reader.problems, reader.problems[:5]


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


def test_a_compacted_topic_refuses_records_without_a_key(broker):
    create_topic(broker, "keyed", **{"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 0})
    results = []
    for key in (b"k", None):
        producer.produce("keyed", key=key, value=b"v", partition=0, on_delivery=lambda err, msg: results.append(err))
        producer.flush(30)
    assert results[0] is None
    assert results[1].code() == KafkaError.INVALID_RECORD and not results[1].retriable(), results[1]

    # KIP-467: the response names each refused record by its index in the batch.
    client = RawClient(broker.port)
    records = build_batch([(b"a", b"1", 0), (None, b"2", 0), (b"c", b"3", 0), (None, None, 0)])
    response = client.call(ApiKey.PRODUCE, 11, {"acks": -1, "timeout": 30_000, "transactional_id": None,
                                                "topic_data": [{"name": "keyed", "partition_data": [
                                                    {"index": 0, "records": records}]}]})
    client.close()
    result = response.responses[0].partition_responses[0]
    why = "Compacted topic cannot accept message without key in topic partition keyed-0."
    assert result.error_code == KafkaError.INVALID_RECORD
    assert [(e.batch_index, e.batch_index_error_message) for e in result.record_errors] == [(1, why), (3, why)]
    assert result.error_message.startswith("One or more records have been rejected due to 2 record errors")
    assert read_all(broker, "keyed") == [(0, b"k", b"v")]
