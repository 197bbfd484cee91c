"""The led-partition contract (plugin API 1.5, ``BrokerServices.partitions``) on a running broker: state, reads with
isolation and aborted transactions, timestamp lookups, the long poll and state-change watchers."""

from __future__ import annotations

import functools
import time

import anyio
import pytest
from kio.schema.errors import ErrorCode as E

from josef.led_partitions import AbortedTransaction, PartitionUnavailable
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import TRANSACTIONAL_BIT, build_batch, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient, eventually

TP = TopicPartition("led", 0)


def create(client: RawClient, name: str) -> None:
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none


def produce(client: RawClient, topic: str, values: list[bytes], timestamp: int | None = None) -> int:
    batch = build_batch([(None, v, timestamp or int(time.time() * 1000)) for v in values])
    answer = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    [result] = answer.responses[0].partition_responses
    assert result.error_code == E.none
    return result.base_offset


def read(broker, offset: int, max_bytes: int, *, committed: bool):
    """LedPartitions.read of TP on the broker's loop."""
    return broker.call(functools.partial(broker.broker.services.partitions.read, read_committed=committed), TP,
                       offset, max_bytes)


@pytest.fixture
def led(josef_broker):
    client = RawClient(josef_broker.port)
    create(client, TP.topic)
    yield josef_broker, client
    client.close()


def test_a_led_partition_has_a_state_and_others_a_kafka_error(led):
    broker, client = led
    partitions = broker.broker.services.partitions
    produce(client, TP.topic, [b"a", b"b"])
    state = broker.call(partitions.state, TP)
    assert (state.log_start_offset, state.high_watermark, state.last_stable_offset) == (0, 2, 2)
    assert state.leader_epoch >= 0
    with pytest.raises(PartitionUnavailable) as missing:
        broker.call(partitions.state, TopicPartition("nowhere", 0))
    assert missing.value.code == E.unknown_topic_or_partition


def test_reads_are_whole_batches_below_the_high_watermark(led):
    broker, client = led
    produce(client, TP.topic, [b"a", b"b"])
    produce(client, TP.topic, [b"c"])
    got = read(broker, 1, 1 << 20, committed=False)
    assert [(b.base_offset, b.last_offset) for _, b in iter_batches(got.records)] == [(0, 1), (2, 2)]
    assert got.aborted == () and got.state.high_watermark == 3
    assert read(broker, 3, 1 << 20, committed=False).records == b""  # caught up
    one = read(broker, 0, 1, committed=False)  # min_one_batch: one whole batch
    assert [b.base_offset for _, b in iter_batches(one.records)] == [0]
    with pytest.raises(PartitionUnavailable) as beyond:
        read(broker, 9, 1 << 20, committed=False)
    assert beyond.value.code == E.offset_out_of_range


def test_read_committed_stops_at_an_open_transaction_and_names_the_aborted_ones(led):
    broker, client = led
    partition = broker.broker.replicas.get(TP)
    now = int(time.time() * 1000)

    def write() -> None:
        partition.append_as_leader(build_batch([(None, b"t", now)] * 2, producer_id=7, producer_epoch=0,
                                               base_sequence=0, attributes=TRANSACTIONAL_BIT), -1)  # 0-1
        partition.append_marker(7, 0, 0, commit=False)  # 2: aborted
        partition.append_as_leader(build_batch([(None, b"p", now)]), -1)  # 3
        partition.append_as_leader(build_batch([(None, b"o", now)], producer_id=8, producer_epoch=0,
                                               base_sequence=0, attributes=TRANSACTIONAL_BIT), -1)  # 4: open
        partition.append_as_leader(build_batch([(None, b"q", now)]), -1)  # 5
        broker.broker.replicas.appended(TP)

    broker.call(write)
    committed = read(broker, 0, 1 << 20, committed=True)
    assert committed.state.last_stable_offset == 4
    assert max(b.last_offset for _, b in iter_batches(committed.records)) == 3
    assert committed.aborted == (AbortedTransaction(7, 0),)
    uncommitted = read(broker, 0, 1 << 20, committed=False)
    assert max(b.last_offset for _, b in iter_batches(uncommitted.records)) == 5 and uncommitted.aborted == ()


def test_a_timestamp_finds_the_first_later_record_or_the_high_watermark(led):
    broker, client = led
    partitions = broker.broker.services.partitions
    produce(client, TP.topic, [b"old"], timestamp=1_000)
    produce(client, TP.topic, [b"new"], timestamp=2_000)
    assert broker.call(partitions.offset_for_timestamp, TP, 1_500) == 1
    assert broker.call(partitions.offset_for_timestamp, TP, 0) == 0
    assert broker.call(partitions.offset_for_timestamp, TP, 3_000) == 2


def test_the_long_poll_wakes_on_new_data_and_times_out_without(led):
    broker, client = led
    partitions = broker.broker.services.partitions

    async def poll(timeout_ms: int) -> tuple[set, float]:
        started = time.monotonic()
        return await partitions.wait_for_data([TP], timeout_ms), time.monotonic() - started

    assert broker.call(poll, 50)[0] == set()

    async def poll_then_produce() -> set:
        async with anyio.create_task_group() as tg:
            result: list[set] = []

            async def waiter() -> None:
                result.append(await partitions.wait_for_data([TP], 30_000))

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            await anyio.to_thread.run_sync(produce, client, TP.topic, [b"x"])
        return result[0]

    assert broker.call(poll_then_produce) == {TP}


def test_watchers_hear_of_state_changes_until_they_stop(led):
    broker, client = led
    partitions = broker.broker.services.partitions
    heard: list[TopicPartition] = []
    stop = broker.call(partitions.watch, heard.append)
    deleted = client.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": TP.topic, "topic_id": None}],
                                                    "timeout": 30000})
    assert deleted.responses[0].error_code == E.none
    eventually(lambda: TP in heard, 30, what="the watcher to hear of the deletion")
    broker.call(stop)
    heard.clear()
    create(client, "other")  # a new partition this broker comes to lead: a state change a watcher would hear
    other = TopicPartition("other", 0)
    def led_here() -> bool:
        try:
            return broker.call(partitions.state, other) is not None
        except PartitionUnavailable:
            return False

    eventually(led_here, 30, what="the new partition to be led")
    assert heard == [], "a stopped watcher was called"
