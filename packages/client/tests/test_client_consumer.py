"""josef's consumer against a real broker (the josef_broker fixture), and its record decoding on hand-built batches.

Test data is produced with the raw protocol (build_batch + Produce over a
Connection), so these tests need nothing but josef; the confluent-kafka
compatibility tests live in integration-tests/test_client_compat_consume.py.
"""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.plugins import get_plugin_manager
from josef.protocol.codecs import Compression
from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.records import (
    CONTROL_BIT,
    TRANSACTIONAL_BIT,
    CorruptRecordError,
    RecordDeserializationError,
    build_batch,
)
from josef.protocol.topic_partition import TopicPartition
from josef.node.runner import BrokerThread
from josef.testing import broker_overrides
from josef_client.cluster import MAX_VERSIONS
from josef_client.config import ConfigError
from josef_client.consumer import (
    AsyncConsumer,
    Consumer,
    ConsumerRecord,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetOutOfRangeError,
)
from josef_client.producer import AsyncProducer
from josef_client.records import FetchedPartition

TP = TopicPartition("t", 0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def address(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


async def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    conn = await Connection.open(*address(bootstrap), max_versions=MAX_VERSIONS)
    try:
        response = await conn.request(19, {
            "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
            "timeout": 30000, "validate_only": False})
        assert response.topics[0].error_code == ErrorCode.none, response
    finally:
        await conn.close()


async def produce(bootstrap: str, tp: TopicPartition, *batches: bytes) -> list[int]:
    """Send each batch in its own Produce request (acks=all); returns their base offsets."""
    conn = await Connection.open(*address(bootstrap), max_versions=MAX_VERSIONS)
    offsets = []
    try:
        for batch in batches:
            response = await conn.request(0, {"transactional_id": None, "acks": -1, "timeout": 30000, "topic_data": [
                {"name": tp.topic, "partition_data": [{"index": tp.partition, "records": batch}]}]})
            part = response.responses[0].partition_responses[0]
            assert part.error_code == ErrorCode.none, part
            offsets.append(part.base_offset)
    finally:
        await conn.close()
    return offsets


def batch_of(start: int, count: int, ts0: int = 1_000, **kwargs: Any) -> bytes:
    """Records (key k<i>, value v<i>, timestamp ts0 + i) for i in [start, start + count)."""
    return build_batch([(b"k%d" % i, b"v%d" % i, ts0 + i) for i in range(start, start + count)], **kwargs)


async def setup_topic(bootstrap: str, tp: TopicPartition = TP, batches: int = 3, per_batch: int = 10,
                      partitions: int = 1) -> None:
    await create_topic(bootstrap, tp.topic, partitions)
    if batches:
        await produce(bootstrap, tp, *(batch_of(b * per_batch, per_batch) for b in range(batches)))


def consumer(broker: BrokerThread, **config: Any) -> AsyncConsumer:
    config.setdefault("auto_offset_reset", "earliest")
    config.setdefault("fetch_max_wait_ms", 200)
    return AsyncConsumer(bootstrap_servers=broker.bootstrap_servers, **config)


async def consume(c: AsyncConsumer, count: int, timeout_s: float = 20, **poll: Any) -> list[ConsumerRecord]:
    """Poll until ``count`` records arrived (fails on a timeout, or on more records than expected)."""
    got: list[ConsumerRecord] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count:
        assert asyncio.get_running_loop().time() < deadline, f"only {len(got)} of {count} records arrived"
        for records in (await c.poll(timeout_ms=500, **poll)).values():
            got.extend(records)
    assert len(got) == count, f"{len(got)} records arrived, {count} expected"
    return got


def values(records: list[ConsumerRecord]) -> list[bytes]:
    return [r.value for r in records]


# ------------------------------------------------------------ fetched partitions


def control_batch(offset: int, pid: int, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return build_batch([(key, value, 0)], base_offset=offset, producer_id=pid, producer_epoch=0,
                       attributes=CONTROL_BIT | TRANSACTIONAL_BIT)


def txn_batch(offset: int, pid: int, count: int) -> bytes:
    return build_batch([(None, b"p%d-%d" % (pid, offset + i), 0) for i in range(count)], base_offset=offset,
                       producer_id=pid, producer_epoch=0, base_sequence=offset, attributes=TRANSACTIONAL_BIT)


def take_all(fp: FetchedPartition) -> list[ConsumerRecord]:
    out = []
    while not fp.exhausted:
        out += fp.take(1000)
    return out


def interleaved_transactions() -> bytes:
    """pid 1 aborts [0, 1] and [7], pid 2 commits [2, 3]; a plain batch at 6; pid 3 commits [10]."""
    return b"".join([
        txn_batch(0, pid=1, count=2),
        txn_batch(2, pid=2, count=2),
        control_batch(4, pid=1, commit=False),
        control_batch(5, pid=2, commit=True),
        batch_of(6, 1, base_offset=6),
        txn_batch(7, pid=1, count=1),
        control_batch(8, pid=1, commit=False),
        control_batch(9, pid=3, commit=True),  # an empty-looking commit must not hide anything
        txn_batch(10, pid=3, count=1),
        control_batch(11, pid=3, commit=True),
    ])


def test_read_committed_drops_aborted_transactions_and_control_batches():
    fp = FetchedPartition(TP, interleaved_transactions(), 0, aborted_transactions=[(1, 0), (1, 7)], read_committed=True)
    records = take_all(fp)
    assert [r.offset for r in records] == [2, 3, 6, 10]
    assert values(records) == [b"p2-2", b"p2-3", b"v6", b"p3-10"]
    assert fp.next_offset == 12  # past the trailing control batch


def test_read_committed_only_drops_what_the_aborted_list_names():
    # Only the second transaction of pid 1 is listed as aborted: its first one stays.
    fp = FetchedPartition(TP, interleaved_transactions(), 0, aborted_transactions=[(1, 7)], read_committed=True)
    assert [r.offset for r in take_all(fp)] == [0, 1, 2, 3, 6, 10]


def test_read_uncommitted_keeps_aborted_data_but_never_control_batches():
    fp = FetchedPartition(TP, interleaved_transactions(), 0, aborted_transactions=[(1, 0)], read_committed=False)
    assert [r.offset for r in take_all(fp)] == [0, 1, 2, 3, 6, 7, 10]
    assert fp.next_offset == 12


def test_fetched_partition_hands_out_pieces_and_skips_below_the_fetch_offset():
    buf = batch_of(0, 10) + batch_of(10, 10, base_offset=10) + batch_of(20, 5, base_offset=20)[:-3]  # partial tail
    fp = FetchedPartition(TP, buf, 4)
    first = fp.take(4)
    assert [r.offset for r in first] == [4, 5, 6, 7] and fp.next_offset == 8
    assert [r.offset for r in fp.take(5)] == [8, 9, 10, 11, 12] and fp.next_offset == 13
    assert [r.offset for r in fp.take(100)] == list(range(13, 20))
    assert fp.exhausted and fp.next_offset == 20  # the partial batch is fetched again from 20


def test_a_bad_batch_stops_the_partition_after_the_good_ones():
    bad = bytearray(batch_of(3, 3, base_offset=3))
    bad[-1] ^= 0xFF
    fp = FetchedPartition(TP, batch_of(0, 3) + bytes(bad), 0)
    assert [r.offset for r in fp.take(10)] == [0, 1, 2]
    with pytest.raises(CorruptRecordError):
        fp.take(10)
    with pytest.raises(CorruptRecordError):  # still there: the application must seek past it
        fp.take(10)
    assert fp.next_offset == 3


# ------------------------------------------------------------ against a broker


def test_assign_poll_and_positions(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        async with consumer(josef_broker) as c:
            assert c.assignment() == frozenset()
            c.assign([TP])
            assert c.assignment() == {TP}
            records = await consume(c, 30)
            assert [r.offset for r in records] == list(range(30))
            assert values(records) == [b"v%d" % i for i in range(30)]
            assert [r.key for r in records] == [b"k%d" % i for i in range(30)]
            assert [r.timestamp for r in records] == [1_000 + i for i in range(30)]
            assert {(r.topic, r.partition, r.timestamp_type, r.headers, r.leader_epoch) for r in records} == {
                ("t", 0, 0, (), 0)}
            assert await c.position(TP) == 30
            assert c.highwater(TP) == 30
            assert await c.poll(timeout_ms=50) == {}

    run(main())


def test_poll_returns_at_most_max_poll_records(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        async with consumer(josef_broker, max_poll_records=7) as c:
            c.assign([TP])
            sizes, got = [], []
            while len(got) < 30:
                batch = (await c.poll(timeout_ms=5000)).get(TP, [])
                assert batch, "poll timed out"
                sizes.append(len(batch))
                got += batch
            assert max(sizes) == 7 and sizes[:4] == [7, 7, 7, 7]
            assert [r.offset for r in got] == list(range(30))
            assert [len(r) for r in (await c.poll(timeout_ms=10, max_records=3)).values()] == []
            c.seek(TP, 0)
            assert [len(r) for r in (await c.poll(timeout_ms=5000, max_records=3)).values()] == [3]

    run(main())


def test_latest_reset_sees_only_new_records(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with consumer(josef_broker, auto_offset_reset="latest") as c:
            c.assign([TP])
            assert await c.position(TP) == 10
            await produce(josef_broker.bootstrap_servers, TP, batch_of(10, 5))
            records = await consume(c, 5)
            assert [r.offset for r in records] == [10, 11, 12, 13, 14]

    run(main())


def test_a_fetch_that_brings_only_a_transaction_marker_is_followed_by_the_next_fetch(josef_broker):
    """The marker moves the position without a record to return; the partition must be fetched again at once,
    not when something else wakes the fetcher (a group member whose partitions all stopped at markers stalled)."""
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        await create_topic(bootstrap, TP.topic)
        async with consumer(josef_broker) as c, AsyncProducer(bootstrap_servers=bootstrap,
                                                               transactional_id="marker") as producer:
            c.assign([TP])
            await producer.init_transactions()
            producer.begin_transaction()
            await (await producer.send(TP.topic, b"in-txn", partition=TP.partition))
            assert values(await consume(c, 1)) == [b"in-txn"]  # read_uncommitted: before the marker exists
            await producer.commit_transaction()  # the commit marker, at offset 1
            deadline = asyncio.get_running_loop().time() + 20
            while c.highwater(TP) != 2:  # fetched while nobody polls, as between an application's polls
                assert asyncio.get_running_loop().time() < deadline, "the marker was never fetched"
                await asyncio.sleep(0.01)
            assert await c.poll(timeout_ms=100) == {} and await c.position(TP) == 2  # the marker alone
            await produce(bootstrap, TP, batch_of(0, 1))
            assert values(await consume(c, 1, timeout_s=10)) == [b"v0"]

    run(main())


def test_seek_inside_a_batch_and_over_buffered_data(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        async with consumer(josef_broker, max_poll_records=2) as c:
            c.assign([TP])
            c.seek(TP, 15)  # the middle of the second batch (10-19)
            first = await consume(c, 2)
            assert [r.offset for r in first] == [15, 16]
            # Records 17.. are now buffered; seeking back must drop them.
            c.seek(TP, 3)
            assert await c.position(TP) == 3
            again = await consume(c, 4)
            assert [r.offset for r in again] == [3, 4, 5, 6]
            with pytest.raises(ValueError):
                c.seek(TP, -1)
            with pytest.raises(ValueError, match="not assigned"):
                c.seek(TopicPartition("t", 9), 0)

    run(main())


def test_seek_discards_a_fetch_in_flight(josef_broker, monkeypatch):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with consumer(josef_broker, fetch_max_wait_ms=10_000, request_timeout_ms=20_000) as c:
            c.assign([TP])
            await consume(c, 10)
            state = c._subscriptions.states[TP]
            while not state.busy:  # the long-poll fetch from offset 10 is on its way
                await asyncio.sleep(0)
            sent = spy_requests(monkeypatch, (1,))
            c.seek(TP, 4)
            # Answers the parked fetch with 10-14, which the seek made void.
            await produce(josef_broker.bootstrap_servers, TP, batch_of(10, 5))
            records = await consume(c, 11)
            assert [r.offset for r in records] == list(range(4, 15))
            assert 4 in [body["topics"][0]["partitions"][0]["fetch_offset"] for _, body in sent]  # fetched again

    run(main())


def test_seek_to_beginning_end_and_log_start(josef_broker):
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        await setup_topic(bootstrap)
        conn = await Connection.open(*address(bootstrap), max_versions=MAX_VERSIONS)
        response = await conn.request(21, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": 12}]}],
                                           "timeout": 30000})
        await conn.close()
        assert response.topics[0].partitions[0].low_watermark == 12
        async with consumer(josef_broker) as c:
            c.assign([TP])
            assert await c.beginning_offsets([TP]) == {TP: 12}
            assert await c.end_offsets([TP]) == {TP: 30}
            assert await c.position(TP) == 12  # earliest = the log start offset
            await c.seek_to_end(TP)
            assert await c.position(TP) == 30
            await c.seek_to_beginning()  # no partitions: all assigned ones
            assert await c.position(TP) == 12
            records = await consume(c, 18)
            assert records[0].offset == 12 and records[-1].offset == 29
            # Below the log start: OFFSET_OUT_OF_RANGE, then auto.offset.reset=earliest.
            c.seek(TP, 2)
            records = await consume(c, 18)
            assert records[0].offset == 12

    run(main())


def test_seek_past_the_end_with_reset_none_raises_until_seek(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with consumer(josef_broker, auto_offset_reset="none") as c:
            c.assign([TP])
            with pytest.raises(NoOffsetForPartitionError) as no_offset:
                await c.poll(timeout_ms=100)
            assert no_offset.value.partitions == {TP}
            with pytest.raises(NoOffsetForPartitionError):
                await c.position(TP)
            c.seek(TP, 25)
            with pytest.raises(OffsetOutOfRangeError) as info:
                await c.poll(timeout_ms=5000)
            assert info.value.partitions == {TP: 25}
            assert info.value.code == ErrorCode.offset_out_of_range
            with pytest.raises(OffsetOutOfRangeError):  # sticky until the application decides
                await c.poll(timeout_ms=0)
            c.seek(TP, 8)
            assert [r.offset for r in await consume(c, 2)] == [8, 9]

    run(main())


def test_seek_past_the_end_with_reset_latest_resets(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with consumer(josef_broker, auto_offset_reset="latest") as c:
            c.assign([TP])
            c.seek(TP, 1000)
            assert await c.poll(timeout_ms=300) == {}
            await produce(josef_broker.bootstrap_servers, TP, batch_of(10, 3))
            records = await consume(c, 3)
            assert [r.offset for r in records] == [10, 11, 12]

    run(main())


def test_pause_and_resume(josef_broker):
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
        await setup_topic(bootstrap, p0, partitions=2, batches=2)
        await produce(bootstrap, p1, batch_of(0, 10))
        async with consumer(josef_broker) as c:
            c.assign([p0, p1])
            c.pause(p0)
            assert c.paused() == {p0}
            got = await consume(c, 10)
            assert {r.partition for r in got} == {1}
            assert await c.poll(timeout_ms=300) == {}  # p0 has data, but is paused
            c.resume(p0)
            assert c.paused() == frozenset()
            got = await consume(c, 20)
            assert {r.partition for r in got} == {0}
            assert [r.offset for r in got] == list(range(20))
            # Pausing with data buffered keeps it for after the resume.
            await produce(bootstrap, p0, batch_of(20, 5))
            await produce(bootstrap, p1, batch_of(10, 5))
            first = await c.poll(timeout_ms=5000, max_records=1)
            [tp] = first
            c.pause(tp)
            other = p1 if tp == p0 else p0
            rest = await consume(c, 5)
            assert {r.partition for r in rest} == {other.partition}
            c.resume(tp)
            rest = await consume(c, 4)
            assert [r.offset for r in rest] == [first[tp][0].offset + 1 + i for i in range(4)]

    run(main())


def test_offsets_for_times(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        async with consumer(josef_broker) as c:
            found = await c.offsets_for_times({TP: 1_005})
            assert found == {TP: (5, 1_005)}
            assert await c.offsets_for_times({TP: 1_015}) == {TP: (15, 1_015)}
            assert await c.offsets_for_times({TP: 0}) == {TP: (0, 1_000)}
            assert await c.offsets_for_times({TP: 99_999}) == {TP: None}
            with pytest.raises(ValueError):
                await c.offsets_for_times({TP: -1})

    run(main())


def spy_requests(monkeypatch: pytest.MonkeyPatch, api_keys: tuple[int, ...]) -> list[tuple[int, dict[str, Any]]]:
    """Record the bodies of the requests the client sends with these API keys."""
    sent: list[tuple[int, dict[str, Any]]] = []
    real = Connection.request

    async def spy(self, api_key, body, **kw):
        if api_key in api_keys:
            sent.append((api_key, body))
        return await real(self, api_key, body, **kw)

    monkeypatch.setattr(Connection, "request", spy)
    return sent


def test_read_committed_uses_isolation_level_1(josef_broker, monkeypatch):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        async with consumer(josef_broker, isolation_level="read_committed") as c:
            sent = spy_requests(monkeypatch, (1, 2))
            c.assign([TP])
            assert await c.end_offsets([TP]) == {TP: 30}
            assert len(await consume(c, 30)) == 30
        assert {body["isolation_level"] for _, body in sent} == {1}
        assert {key for key, _ in sent} == {1, 2}

    run(main())


def test_fetch_requests_carry_the_fetch_configuration(josef_broker, monkeypatch):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers)
        sent = spy_requests(monkeypatch, (1,))
        async with consumer(josef_broker, fetch_min_bytes=5, fetch_max_wait_ms=250, fetch_max_bytes=70_000,
                            max_partition_fetch_bytes=60_000) as c:
            c.assign([TP])
            assert len(await consume(c, 30)) == 30
        _, body = sent[0]
        assert (body["min_bytes"], body["max_wait"], body["max_bytes"], body["isolation_level"]) == (5, 250, 70_000, 0)
        [partition] = body["topics"][0]["partitions"]
        assert (partition["partition"], partition["fetch_offset"], partition["partition_max_bytes"]) == (0, 0, 60_000)

    run(main())


def test_unknown_topics_and_partitions(josef_broker):
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        missing = TopicPartition("missing", 0)
        async with consumer(josef_broker) as c:
            with pytest.raises(KafkaError) as info:
                await c.end_offsets([missing])
            assert info.value.code == ErrorCode.unknown_topic_or_partition
            c.assign([missing])
            with pytest.raises(KafkaError) as info:
                await c.poll(timeout_ms=5000)
            assert info.value.code == ErrorCode.unknown_topic_or_partition and "missing" in str(info.value)
            # The partition stays assigned: once the topic exists, consuming works.
            await setup_topic(bootstrap, missing, batches=1)
            records = await consume_ignoring_unknown(c, 10)
            assert [r.offset for r in records] == list(range(10))
            with pytest.raises(KafkaError) as info:
                await c.beginning_offsets([TopicPartition("missing", 5)])
            assert info.value.code == ErrorCode.unknown_topic_or_partition and "no partition 5" in str(info.value)

    run(main())


async def consume_ignoring_unknown(c: AsyncConsumer, count: int) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    for _ in range(100):
        try:
            for records in (await c.poll(timeout_ms=500)).values():
                got += records
        except KafkaError as exc:
            assert exc.code == ErrorCode.unknown_topic_or_partition
        if len(got) >= count:
            return got
    raise AssertionError(f"only {len(got)} records arrived")


@pytest.fixture
def broker_without_groups(tmp_path):
    """A broker without coordinator plugins (the workspace installs them), for stand-ins and their absence."""
    with BrokerThread(broker_overrides(tmp_path), pm=get_plugin_manager(block=["coordinator-group", "coordinator-txn", "coordinator-share"])) as broker:
        yield broker


def test_committed_needs_a_group_coordinator(broker_without_groups):
    josef_broker = broker_without_groups

    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=0)
        async with consumer(josef_broker) as c:
            with pytest.raises(KafkaError) as info:
                await c.committed([TP])
            assert info.value.code == ErrorCode.invalid_group_id
        async with consumer(josef_broker, group_id="g") as c:
            with pytest.raises(UnsupportedVersionError, match="group coordinator"):
                await c.committed([TP])

    run(main())


def test_committed_asks_the_coordinator(broker_without_groups):
    """A stand-in group coordinator on the broker, as a real Kafka one answers."""
    josef_broker = broker_without_groups
    seen = []

    async def find_coordinator(ctx, request):
        keys = getattr(request, "coordinator_keys", None) or (request.key,)
        host, port = address(josef_broker.bootstrap_servers)
        seen.append(("find", tuple(keys), request.key_type))
        answer = {"node_id": 1, "host": host, "port": port, "error_code": ErrorCode.none, "error_message": None}
        return {"throttle_time": 0, **answer, "coordinators": [{"key": k, **answer} for k in keys]}

    async def offset_fetch(ctx, request):
        [group] = request.groups
        seen.append(("fetch", group.group_id, request.require_stable))
        topics = [{"name": t.name, "partitions": [
            {"partition_index": p, "committed_offset": 42 if p == 0 else -1, "committed_leader_epoch": 3,
             "metadata": "meta" if p == 0 else None, "error_code": ErrorCode.none}
            for p in t.partition_indexes]} for t in group.topics]
        return {"throttle_time": 0, "groups": [{"group_id": group.group_id, "topics": topics, "error_code": ErrorCode.none}]}

    dispatcher = josef_broker.broker.dispatcher
    josef_broker.call(dispatcher.register, 10, find_coordinator, 0, 4)
    josef_broker.call(dispatcher.register, 9, offset_fetch, 8, 9)

    async def main():
        await setup_topic(josef_broker.bootstrap_servers, partitions=2, batches=0)
        async with consumer(josef_broker, group_id="orders") as c:
            p1 = TopicPartition("t", 1)
            assert await c.committed([TP, p1]) == {TP: OffsetAndMetadata(42, "meta", 3), p1: None}
        assert seen == [("find", ("orders",), 0), ("fetch", "orders", True)]

    run(main())


def test_interceptors_see_and_may_replace_what_poll_returns(josef_broker):
    calls = []

    class Upper:
        def __init__(self, config):
            self.config = config

        def on_consume(self, records):
            calls.append(sum(len(r) for r in records.values()))
            return {tp: [ConsumerRecord(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key,
                                        r.value.upper(), r.headers, r.leader_epoch) for r in rs]
                    for tp, rs in records.items()}

    class Broken:
        def __init__(self, config):
            pass

        def on_consume(self, records):
            raise RuntimeError("interceptors may fail without stopping the chain")

    class Plugin:
        @hookimpl
        def register_interceptors(self, register):
            register("upper", Upper)
            register("broken", Broken)

    pm = get_plugin_manager(plugins=[Plugin()])

    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with AsyncConsumer(bootstrap_servers=josef_broker.bootstrap_servers, auto_offset_reset="earliest",
                                 interceptor_classes=["broken", "upper"], plugin_manager=pm) as c:
            c.assign([TP])
            records = await consume(c, 10)
        assert values(records) == [b"V%d" % i for i in range(10)]
        assert sum(calls) == 10

    run(main())


def test_deserialisers_from_config(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=1)
        async with consumer(josef_broker, key_deserializer=lambda k: k.decode(),
                            value_deserializer=lambda v: int(v[1:])) as c:
            c.assign([TP])
            records = await consume(c, 10)
        assert [(r.key, r.value) for r in records] == [(f"k{i}", i) for i in range(10)]

    run(main())


def test_a_failing_deserialiser_is_raised_by_poll_and_seek_skips_it(josef_broker):
    async def main():
        await create_topic(josef_broker.bootstrap_servers, "t")
        await produce(josef_broker.bootstrap_servers, TP, build_batch([(None, b"1", 0), (None, b"x", 0), (None, b"3", 0)]))
        async with consumer(josef_broker, value_deserializer=int) as c:
            c.assign([TP])
            with pytest.raises(RecordDeserializationError) as info:
                while True:
                    await c.poll(timeout_ms=5000)
            assert info.value.offset == 1
            with pytest.raises(RecordDeserializationError):
                await c.poll(timeout_ms=0)
            c.seek(TP, 2)
            assert [r.value for r in await consume(c, 1)] == [3]

    run(main())


def test_many_partitions_progress_under_small_fetch_limits(josef_broker):
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        await create_topic(bootstrap, "wide", 4)
        big = os.urandom(30_000)
        for p in range(4):
            await produce(bootstrap, TopicPartition("wide", p),
                          *(build_batch([(None, big, i)], compression=Compression.NONE) for i in range(3)))
        async with consumer(josef_broker, fetch_max_bytes=1024, max_partition_fetch_bytes=512) as c:
            c.assign([TopicPartition("wide", p) for p in range(4)])
            records = await consume(c, 12)
        by_partition: dict[int, list[int]] = {}
        for r in records:
            by_partition.setdefault(r.partition, []).append(r.offset)
            assert r.value == big
        assert by_partition == {p: [0, 1, 2] for p in range(4)}

    run(main())


def test_fetches_ahead_while_the_application_works(josef_broker):
    async def main():
        await setup_topic(josef_broker.bootstrap_servers, batches=3)
        # Each fetch returns one batch: the next must arrive without another poll.
        async with consumer(josef_broker, max_partition_fetch_bytes=1, fetch_max_bytes=1) as c:
            c.assign([TP])
            first = await consume(c, 10)
            assert [r.offset for r in first] == list(range(10))
            assert c._fetcher._data is not None
            while not any(fp.tp == TP and fp.fetch_offset == 10 for fp in c._fetcher._buffer):
                c._fetcher._data.clear()
                await asyncio.wait_for(c._fetcher._data.wait(), 10)
            second = await c.poll(timeout_ms=0)  # no waiting: it is already here
            assert [r.offset for r in second[TP]] == list(range(10, 20))

    run(main())


def test_paused_partitions_are_not_fetched(josef_broker, monkeypatch):
    async def main():
        bootstrap = josef_broker.bootstrap_servers
        p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
        await setup_topic(bootstrap, p0, partitions=2, batches=1)
        await produce(bootstrap, p1, batch_of(0, 10))
        sent = spy_requests(monkeypatch, (1,))
        async with consumer(josef_broker) as c:
            c.assign([p0, p1])
            c.pause(p0)
            await consume(c, 10)
            await c.poll(timeout_ms=300)
        fetched = {(t["topic"], p["partition"]) for _, body in sent for t in body["topics"] for p in t["partitions"]}
        assert fetched == {("t", 1)}

    run(main())


def test_broker_restart_mid_stream_loses_and_repeats_nothing(josef_broker):
    # Come back on the same port, as a restarted broker does.
    josef_broker.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{josef_broker.port}"

    async def main():
        bootstrap = josef_broker.bootstrap_servers
        await setup_topic(bootstrap, batches=5)
        got: list[ConsumerRecord] = []
        async with consumer(josef_broker, max_poll_records=10, retry_backoff_ms=50, reconnect_backoff_ms=20) as c:
            c.assign([TP])
            got += await consume(c, 20)
            restart = asyncio.ensure_future(asyncio.to_thread(josef_broker.restart))
            while not restart.done():  # keep consuming while the broker goes away and comes back
                for records in (await c.poll(timeout_ms=100)).values():
                    got += records
            await restart
            await produce(bootstrap, TP, *(batch_of(i, 10) for i in range(50, 100, 10)))
            got += await consume(c, 100 - len(got), timeout_s=60)
            assert await c.poll(timeout_ms=300) == {}
        assert [r.offset for r in got] == list(range(100))
        assert values(got) == [b"v%d" % i for i in range(100)]

    run(main())


def test_broker_down_then_up_while_polling(josef_broker):
    josef_broker.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{josef_broker.port}"

    async def main():
        bootstrap = josef_broker.bootstrap_servers
        await setup_topic(bootstrap, batches=1)
        async with consumer(josef_broker, retry_backoff_ms=50) as c:
            c.assign([TP])
            await consume(c, 10)
            await asyncio.to_thread(josef_broker.stop)
            assert await c.poll(timeout_ms=500) == {}  # retrying quietly
            with pytest.raises(KafkaTimeoutError):
                await c.end_offsets([TP], timeout_ms=500)
            await asyncio.to_thread(josef_broker.start)
            await produce(bootstrap, TP, batch_of(10, 10))
            records = await consume(c, 10, timeout_s=60)
            assert [r.offset for r in records] == list(range(10, 20))

    run(main())


class FreezableProxy:
    """A TCP proxy that can stop forwarding requests (a broker that hangs), to test request timeouts."""

    def __init__(self) -> None:
        self.frozen = False
        self.target: tuple[str, int] | None = None
        self.server: asyncio.AbstractServer | None = None
        self.port = -1

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.target is not None
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while data := await src.read(65536):
                    if not (upstream and self.frozen):
                        dst.write(data)
                        await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_request_timeouts_are_retried_and_reported(tmp_path: Path):
    async def main():
        proxy = FreezableProxy()
        await proxy.start()
        broker = BrokerThread(broker_overrides(tmp_path, **{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"}))
        await asyncio.to_thread(broker.start)
        try:
            proxy.target = ("127.0.0.1", broker.port)
            direct = f"127.0.0.1:{broker.port}"
            await setup_topic(direct, batches=1)
            async with AsyncConsumer(bootstrap_servers=f"127.0.0.1:{proxy.port}", auto_offset_reset="earliest",
                                     request_timeout_ms=400, fetch_max_wait_ms=100, retry_backoff_ms=50) as c:
                c.assign([TP])
                assert len(await consume(c, 10)) == 10
                proxy.frozen = True
                with pytest.raises(KafkaTimeoutError):
                    await c.end_offsets([TP], timeout_ms=1200)
                assert await c.poll(timeout_ms=600) == {}  # fetches time out and are retried, not raised
                await produce(direct, TP, batch_of(10, 10))
                proxy.frozen = False
                records = await consume(c, 10)
                assert [r.offset for r in records] == list(range(10, 20))
                assert await c.end_offsets([TP]) == {TP: 20}
        finally:
            await asyncio.to_thread(broker.stop)
            await proxy.close()

    run(main())


def test_sync_consumer(josef_broker):
    run(setup_topic(josef_broker.bootstrap_servers))
    with Consumer({"bootstrap.servers": josef_broker.bootstrap_servers, "auto.offset.reset": "earliest",
                   "fetch.max.wait.ms": 100}) as c:
        c.assign([TP])
        assert c.assignment() == {TP}
        assert c.beginning_offsets([TP]) == {TP: 0}
        assert c.end_offsets([TP]) == {TP: 30}
        assert c.offsets_for_times({TP: 1_007}) == {TP: (7, 1_007)}
        assert c.position(TP) == 0
        got = []
        while len(got) < 30:
            for records in c.poll(timeout_ms=5000).values():
                got += records
        assert [r.offset for r in got] == list(range(30))
        assert c.highwater(TP) == 30
        c.seek(TP, 28)
        assert [r.offset for r in c.poll(timeout_ms=5000)[TP]] == [28, 29]
        c.seek_to_beginning(TP)
        assert c.position(TP) == 0
        c.seek_to_end()
        assert c.position(TP) == 30
        c.pause(TP)
        assert c.paused() == {TP}
        c.resume(TP)
        assert c.paused() == frozenset()
        with pytest.raises(KafkaError):
            c.committed([TP])
    with pytest.raises(RuntimeError, match="closed"):
        c.assign([TP])


def test_configuration_and_state_errors(josef_broker):
    with pytest.raises(ConfigError, match="did you mean"):
        AsyncConsumer(bootstrap_servers="x:1", fetch_max_wait=5)
    with pytest.raises(ConfigError, match="fetch.max.wait.ms"):
        AsyncConsumer(bootstrap_servers="x:1", fetch_max_wait_ms=500, request_timeout_ms=500)
    with pytest.raises(ConfigError):
        AsyncConsumer(bootstrap_servers="x:1", auto_offset_reset="smallest")

    async def main():
        c = consumer(josef_broker)
        with pytest.raises(RuntimeError, match="assign"):
            await c.poll()
        with pytest.raises(TypeError):
            c.assign([("t", 0)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="not assigned"):
            await c.position(TP)
        with pytest.raises(ValueError, match="not assigned"):
            c.pause(TP)
        await c.close()
        with pytest.raises(RuntimeError, match="closed"):
            await c.poll()

    run(main())


def test_start_fails_without_a_reachable_broker():
    async def main():
        with pytest.raises(KafkaError):
            await AsyncConsumer(bootstrap_servers="127.0.0.1:1", socket_connection_setup_timeout_ms=500).start()

    run(main())
