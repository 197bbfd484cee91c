"""kafka-python and aiokafka consumer groups against a josef broker, alone and mixed with confluent-kafka.

Both Python clients speak the classic group protocol with the "range"
assignor by default, so a group may mix them with librdkafka consumers that
use ``partition.assignment.strategy=range``: the broker only checks that all
members share the protocol type and one protocol name; whichever member
leads computes the assignment for everyone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor

from josef.testing import eventually

DEADLINE_S = 60


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(bootstrap: str, topic: str, partitions: int, count: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(30) == 0


class PollingThread:
    """Runs one synchronous consumer's poll loop on its own thread, recording its assignment and records."""

    def __init__(self, poll: Callable[[], list[tuple[int, str]]], assignment: Callable[[], set[int]],
                 close: Callable[[], None], group: Callable[[], Any] | None = None) -> None:
        self._poll, self._assignment, self._close, self._group = poll, assignment, close, group
        self.values: list[str] = []
        self.partitions: set[int] = set()
        self.error: BaseException | None = None
        #: ``time.monotonic()`` when the last ``poll`` returned.
        self.last_poll = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for _, value in self._poll():
                    self.values.append(value)
                self.last_poll = time.monotonic()
                self.partitions = self._assignment()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self._close()

    def state(self) -> dict[str, Any]:
        """What a failed wait reports: partitions, records, seconds since ``poll`` last returned, the client's own view."""
        return {"partitions": sorted(self.partitions), "records": len(self.values),
                "last_poll_s_ago": round(time.monotonic() - self.last_poll, 1), "error": repr(self.error),
                "group": repr(self._group()) if self._group is not None else None}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"the poll loop did not end: {self.state()}"
        if self.error is not None:
            raise self.error


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S,
               members: Sequence[PollingThread] = ()) -> None:
    """Wait for ``condition``; a member whose poll loop failed ends the wait at once, with its error.

    On a timeout the message shows each member's state: its partitions, how
    many records it got, and how long ago its last ``poll`` returned (a poll
    loop that hangs is told apart from one that runs with a stale assignment).
    """
    def check() -> bool:
        for i, member in enumerate(members):
            if member.error is not None:
                raise RuntimeError(f"member {i} failed while waiting for {what}: {member.error!r}") from member.error
        return condition()

    try:
        eventually(check, timeout_s, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {[m.state() for m in members]}") from None


def kafka_python_member(bootstrap: str, group: str, topic: str) -> PollingThread:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500,
                             partition_assignment_strategy=[RangePartitionAssignor])

    def poll() -> list[tuple[int, str]]:
        batches = consumer.poll(timeout_ms=100)
        got = [(r.partition, r.value.decode()) for records in batches.values() for r in records]
        if got:
            consumer.commit()
        return got

    # group_metadata(): the generation, member id and MemberState the client believes in.
    return PollingThread(poll, lambda: {tp.partition for tp in consumer.assignment()}, consumer.close,
                         consumer.group_metadata)


def confluent_member(bootstrap: str, group: str, topic: str) -> PollingThread:
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "partition.assignment.strategy": "range",
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                  "fetch.wait.max.ms": 100})
    consumer.subscribe([topic])

    def poll() -> list[tuple[int, str]]:
        message = consumer.poll(0.1)
        if message is None or message.error():
            return []
        consumer.commit(message=message, asynchronous=False)
        return [(message.partition(), message.value().decode())]

    return PollingThread(poll, lambda: {tp.partition for tp in consumer.assignment()}, consumer.close)


def committed_with_kafka_python(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        consumer.close()


def split_evenly(members: list[PollingThread], partitions: int) -> Callable[[], bool]:
    def check() -> bool:
        sets = [m.partitions for m in members]
        return all(len(s) == partitions // len(members) for s in sets) and \
            set().union(*sets) == set(range(partitions))

    return check


def test_kafka_python_group_subscribes_and_commits(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    create(bootstrap, "kp-group", 4)
    produce(bootstrap, "kp-group", 4, 200)
    members = [kafka_python_member(bootstrap, "kp", "kp-group") for _ in range(2)]
    try:
        wait_until(split_evenly(members, 4), "two partitions each", members=members)
        wait_until(lambda: len({v for m in members for v in m.values}) == 200, "every record", members=members)
    finally:
        for member in members:
            member.stop()
    assert committed_with_kafka_python(bootstrap, "kp", "kp-group", 4) == {p: 50 for p in range(4)}


def test_aiokafka_group_subscribes_and_commits(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    create(bootstrap, "aio-group", 4)
    produce(bootstrap, "aio-group", 4, 200)

    async def main() -> None:
        def member() -> AIOKafkaConsumer:
            return AIOKafkaConsumer("aio-group", bootstrap_servers=bootstrap, group_id="aio",
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=500)

        first, second = member(), member()
        await first.start()
        await second.start()
        got: set[str] = set()
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                for consumer in (first, second):
                    batches = await consumer.getmany(timeout_ms=100)
                    got |= {r.value.decode() for records in batches.values() for r in records}
                    if batches:
                        await consumer.commit()
                mine, theirs = first.assignment(), second.assignment()
                if len(got) == 200 and len(mine) == len(theirs) == 2 and not mine & theirs:
                    break
                assert time.monotonic() < deadline, (len(got), mine, theirs)
            for consumer in (first, second):
                await consumer.commit()
            offsets = {tp.partition: await first.committed(tp) for tp in
                       [AioTP("aio-group", p) for p in range(4)]}
            assert offsets == {p: 50 for p in range(4)}
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(main())


def test_mixed_group_of_kafka_python_and_confluent_kafka(broker_factory):
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    create(bootstrap, "mixed", 4)
    members = [kafka_python_member(bootstrap, "mixed-group", "mixed"),
               confluent_member(bootstrap, "mixed-group", "mixed")]
    try:
        wait_until(split_evenly(members, 4), "two partitions for each client", members=members)
        produce(bootstrap, "mixed", 4, 400)
        wait_until(lambda: len({v for m in members for v in m.values}) == 400, "every record", members=members)
        by_client = [{int(v[1:]) % 4 for v in m.values} for m in members]
        assert by_client[0] and by_client[1] and not by_client[0] & by_client[1]
    finally:
        for member in members:
            member.stop()
    assert committed_with_kafka_python(bootstrap, "mixed-group", "mixed", 4) == {p: 100 for p in range(4)}
