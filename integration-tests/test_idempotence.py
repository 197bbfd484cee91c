"""Idempotent producers: real clients, and raw requests that replay a batch as a client retry would.

The raw tests speak the protocol themselves (InitProducerId, Produce, Fetch)
so they can do what a client only does after a lost acknowledgement: send
the very same batch again, also after the broker restarted or was killed.
Tests taking ``brokers`` run against one broker and against three with
every topic replicated three ways (conftest.py); raw requests go to the
partition's leader.
"""

from __future__ import annotations

import asyncio
import io
import socket
import struct
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from josef.protocol.messages import build, request_type, response_type
from josef.protocol.records import BatchHeader, build_batch, iter_batches
from josef.server.dispatch import is_flexible
from josef.testing import eventually

pytestmark = [pytest.mark.metadata, pytest.mark.storage]

PRODUCE, FETCH, LIST_OFFSETS, DELETE_RECORDS, INIT_PRODUCER_ID = 0, 1, 2, 21, 22


class Raw:
    """One connection that sends any request as a plain dict and returns kio's parsed response."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation += 1
        buf = io.BytesIO()
        buf.write(struct.pack(">hhih", key, version, self.correlation, 3) + b"raw")
        if is_flexible(key, version):
            buf.write(b"\x00")
        request = build(request_type(key, version), body)
        entity_writer(type(request))(buf, request)
        payload = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", self._read(4))[0]
        frame = self._read(size)
        assert struct.unpack(">i", frame[:4])[0] == self.correlation
        response, _ = entity_reader(response_type(key, version))(frame, 4 + (1 if is_flexible(key, version) else 0))
        return response

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return bytes(data)

    def init_producer_id(self, producer_id: int = -1, epoch: int = -1, transactional_id: str | None = None,
                         version: int = 4) -> Any:
        return self.call(INIT_PRODUCER_ID, version, {"transactional_id": transactional_id, "transaction_timeout": 60000,
                                                     "producer_id": producer_id, "producer_epoch": epoch})

    def produce(self, topic: str, batch: bytes, partition: int = 0) -> Any:
        response = self.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout": 10000, "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
        return response.responses[0].partition_responses[0]

    def end_offset(self, topic: str, partition: int = 0) -> int:
        response = self.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1, "current_leader_epoch": -1,
                                            "max_num_offsets": 1}]}]})
        return response.topics[0].partitions[0].offset

    def delete_records(self, topic: str, before: int, partition: int = 0) -> int:
        response = self.call(DELETE_RECORDS, 2, {"timeout": 10000, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "offset": before}]}]})
        answer = response.topics[0].partitions[0]
        assert answer.error_code == ErrorCode.none, answer
        return answer.low_watermark

    def batches(self, topic: str, partition: int = 0, offset: int = 0) -> list[BatchHeader]:
        """Headers of every stored batch of a partition from ``offset``, fetched up to the high watermark."""
        headers: list[BatchHeader] = []
        while True:
            response = self.call(FETCH, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 64 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 64 << 20,
                     "current_leader_epoch": -1, "log_start_offset": -1, "last_fetched_epoch": -1}]}]})
            answer = response.responses[0].partitions[0]
            assert answer.error_code == ErrorCode.none, answer
            found = [header for _, header in iter_batches(answer.records or b"")]
            if not found:
                return headers
            headers += found
            offset = found[-1].last_offset + 1


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """A topic with the brokers' default.replication.factor (3 in the 3-broker runs)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)


def leader_of(brokers, topic: str) -> Raw:
    """A connection to the partition's leader once it serves the partition: the leader opens a new partition's log
    in a worker thread and answers NOT_LEADER_OR_FOLLOWER until then, which real clients retry."""
    raw = Raw(brokers.leader_port(topic))

    def serving() -> bool:
        response = raw.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1,
                                            "max_num_offsets": 1}]}]})
        return response.topics[0].partitions[0].error_code == ErrorCode.none

    eventually(serving, what=f"the leader of {topic}-0 serving it")
    return raw


def batch(producer_id: int, epoch: int, sequence: int, count: int = 1, value_size: int = 10) -> bytes:
    """Stamped now, as a client stamps its records: a producer whose last batch is older than
    producer.id.expiration.ms (a day) is forgotten, as Kafka forgets it."""
    now = int(time.time() * 1000)
    records = [(None, f"{sequence + i:0{value_size}d}".encode(), now + i) for i in range(count)]
    return build_batch(records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def assert_idempotent_batches(headers: list[BatchHeader]) -> None:
    """The client really was idempotent: one producer id, and sequences that run on without gaps or repeats."""
    assert headers
    assert len({h.producer_id for h in headers}) == 1 and headers[0].producer_id >= 0
    expected = 0
    for header in headers:
        assert header.base_sequence == expected, (header, expected)
        expected += header.last_offset_delta + 1


# Real clients ------------------------------------------------------------------------------


def test_confluent_kafka_idempotent_producer_stores_every_record_once_in_order(brokers):
    count, partitions = 50_000, 3
    create(brokers.bootstrap_servers, "idem", partitions)
    acked: list[tuple[int, int, bytes]] = []
    errors = []

    def delivered(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": brokers.bootstrap_servers, "enable.idempotence": True,
                         "linger.ms": 5, "max.in.flight.requests.per.connection": 5})
    for i in range(count):
        producer.produce("idem", value=str(i).encode(), partition=i % partitions, on_delivery=delivered)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors and len(acked) == count

    consumer = Consumer({"bootstrap.servers": brokers.bootstrap_servers, "group.id": "unused",
                         "enable.auto.commit": False, "queued.min.messages": 1_000_000,
                         "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition("idem", p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    received = 0
    try:
        while received < count:
            messages = consumer.consume(min(10_000, count - received), timeout=10)
            assert messages, f"only {received} of {count} records arrived"
            for m in messages:
                assert m.error() is None, m.error()
                got[m.partition()].append((m.offset(), m.value()))
                received += 1
    finally:
        consumer.close()
    for p in range(partitions):
        values = [str(i).encode() for i in range(p, count, partitions)]
        assert got[p] == list(enumerate(values)), f"partition {p} is not every record once, in order"
    for p in range(partitions):
        assert_idempotent_batches(Raw(brokers.leader_port("idem", p)).batches("idem", p))


def test_kafka_python_idempotent_producer(brokers):
    count = 3000
    create(brokers.bootstrap_servers, "idem-kp", 2)
    producer = KafkaProducer(bootstrap_servers=brokers.bootstrap_servers, enable_idempotence=True, acks="all",
                             linger_ms=5)
    futures = [producer.send("idem-kp", value=str(i).encode(), partition=i % 2) for i in range(count)]
    producer.flush()
    metadata = [f.get(timeout=30) for f in futures]
    producer.close()
    for p in range(2):
        assert [m.offset for m in metadata if m.partition == p] == list(range(count // 2))
    for p in range(2):
        headers = Raw(brokers.leader_port("idem-kp", p)).batches("idem-kp", p)
        assert_idempotent_batches(headers)
        assert headers[-1].last_offset == count // 2 - 1


def test_aiokafka_idempotent_producer(brokers):
    count = 3000
    create(brokers.bootstrap_servers, "idem-aio", 2)

    async def main():
        producer = AIOKafkaProducer(bootstrap_servers=brokers.bootstrap_servers, enable_idempotence=True,
                                    linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send("idem-aio", value=str(i).encode(), partition=i % 2) for i in range(count)]
            return await asyncio.gather(*sent)
        finally:
            await producer.stop()

    metadata = asyncio.run(main())
    for p in range(2):
        assert [m.offset for m in metadata if m.partition == p] == list(range(count // 2))
    for p in range(2):
        headers = Raw(brokers.leader_port("idem-aio", p)).batches("idem-aio", p)
        assert_idempotent_batches(headers)
        assert headers[-1].last_offset == count // 2 - 1


# Raw protocol --------------------------------------------------------------------------------


def test_init_producer_id_hands_out_distinct_ids_at_every_version(broker):
    raw = Raw(broker.port)
    answers = [raw.init_producer_id(version=v) for v in range(6)]
    assert all(a.error_code == ErrorCode.none and a.producer_epoch == 0 for a in answers)
    assert len({a.producer_id for a in answers}) == 6 and min(a.producer_id for a in answers) >= 0


def test_transactional_ids_wait_for_the_transaction_plugin(broker_factory, monkeypatch):
    monkeypatch.setenv("JOSEF_BLOCK_PLUGINS", "coordinator-txn")  # a broker without it, as a core-only install
    broker = broker_factory()
    answer = Raw(broker.port).init_producer_id(transactional_id="txn-1")
    assert (answer.error_code, answer.producer_id) == (ErrorCode.coordinator_not_available, -1)
    assert broker.wait_for_log("transaction coordinator plugin")


def test_a_retried_batch_is_stored_once_and_answered_with_its_first_offset(brokers):
    create(brokers.bootstrap_servers, "retry")
    raw = leader_of(brokers, "retry")
    pid = raw.init_producer_id().producer_id
    assert raw.produce("retry", batch(-1, -1, -1, count=2)).base_offset == 0  # a plain producer's batch first
    first = batch(pid, 0, 0, count=3)
    answer = raw.produce("retry", first)
    assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 2)
    again = raw.produce("retry", first)  # the acknowledgement was "lost": the client sends it again
    assert (again.error_code, again.base_offset) == (ErrorCode.none, 2)
    assert raw.end_offset("retry") == 5
    assert raw.produce("retry", batch(pid, 0, 3, count=2)).base_offset == 5
    assert raw.produce("retry", first).base_offset == 2  # still one of the last five
    headers = raw.batches("retry")
    assert [(h.base_offset, h.producer_id, h.base_sequence) for h in headers] == [
        (0, -1, -1), (2, pid, 0), (5, pid, 3)]


def test_a_gap_in_sequences_is_out_of_order(brokers):
    create(brokers.bootstrap_servers, "gap")
    raw = leader_of(brokers, "gap")
    pid = raw.init_producer_id().producer_id
    assert raw.produce("gap", batch(pid, 0, 0, count=2)).error_code == ErrorCode.none
    answer = raw.produce("gap", batch(pid, 0, 3))
    assert answer.error_code == ErrorCode.out_of_order_sequence_number
    assert raw.end_offset("gap") == 2
    assert raw.produce("gap", batch(pid, 0, 2)).base_offset == 2


def test_an_old_epoch_is_fenced_after_the_kip_360_epoch_bump(brokers):
    """KIP-360: an idempotent producer bumps its epoch itself and restarts its sequences at 0.

    Asking InitProducerId again with the current id and epoch gives a new
    producer id at epoch 0, as Kafka does for producers without a
    transactional id; the bumped epoch of the old id is what fences its
    old batches.
    """
    create(brokers.bootstrap_servers, "fence")
    raw = leader_of(brokers, "fence")
    pid = raw.init_producer_id().producer_id
    assert raw.produce("fence", batch(pid, 0, 0, count=3)).error_code == ErrorCode.none
    assert raw.produce("fence", batch(pid, 1, 1)).error_code == ErrorCode.out_of_order_sequence_number
    assert raw.produce("fence", batch(pid, 1, 0)).base_offset == 3  # the bumped epoch starts at 0
    renewed = raw.init_producer_id(pid, 1)
    assert renewed.error_code == ErrorCode.none and renewed.producer_id != pid and renewed.producer_epoch == 0
    for stale in (batch(pid, 0, 3), batch(pid, 0, 0, count=3)):  # new data, or a late retry, of the old epoch
        assert raw.produce("fence", stale).error_code == ErrorCode.invalid_producer_epoch
    assert raw.produce("fence", batch(pid, 1, 1)).base_offset == 4
    assert raw.produce("fence", batch(renewed.producer_id, 0, 0)).base_offset == 5
    assert raw.end_offset("fence") == 6


@pytest.mark.parametrize("how", ["clean", "clean-after-delete-records", "kill-9", "kill-9-after-rolls"])
def test_a_retry_after_a_restart_is_still_a_duplicate(broker_factory, how):
    """The producer state comes back: from the snapshot at close, or rebuilt from the log after kill -9.

    With small segments the rolls leave snapshots and kill -9 makes the
    broker replay only the batch headers after the newest one. After
    DeleteRecords up to the log end only the snapshot still knows the
    producer: replaying the log from its start would find nothing.
    """
    overrides = {"log.segment.bytes": "1024"} if how == "kill-9-after-rolls" else {}
    broker = broker_factory(**overrides)
    create(broker.bootstrap_servers, "restart")
    raw = Raw(broker.port)
    pid = raw.init_producer_id().producer_id
    sent = [batch(pid, 0, seq, value_size=200) for seq in range(10)]
    assert [raw.produce("restart", b).base_offset for b in sent] == list(range(10))
    first = 0
    if how == "clean-after-delete-records":
        first = raw.delete_records("restart", 10)
        assert first == 10
    raw.close()
    partition_dir = broker.data_dir / "restart-0"
    if how.startswith("clean"):
        assert broker.stop() == 0
        assert (partition_dir / f"{10:020d}.snapshot").exists(), "a clean shutdown snapshots at the log end"
    else:
        if how == "kill-9-after-rolls":
            assert list(partition_dir.glob("*.snapshot")), "rolls should have left snapshots"
        broker.kill()
    broker.start()

    raw = Raw(broker.port)
    for seq in (9, 5):  # the last five batches are remembered
        answer = raw.produce("restart", sent[seq])
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, seq)
    assert raw.produce("restart", sent[4]).error_code == ErrorCode.out_of_order_sequence_number
    assert raw.end_offset("restart") == 10
    assert raw.produce("restart", batch(pid, 0, 10, value_size=200)).base_offset == 10
    assert [h.base_sequence for h in raw.batches("restart", offset=first)] == list(range(first, 11))
    # Producer ids are never handed out twice, across restarts too.
    assert raw.init_producer_id().producer_id > pid
