"""josef's producer against a real josef broker (the josef_broker fixture)."""

import asyncio
import functools
import time

import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.plugins import get_plugin_manager
from josef.protocol.errors import ConfigError, KafkaError, KafkaTimeoutError
from josef.protocol.records import iter_batches, iter_records
from josef.protocol.topic_partition import TopicPartition
from josef_client.partitioner import Murmur2Partitioner, murmur2, to_positive
from josef_client.producer import AsyncProducer, Producer, RecordMetadata


def stored(broker_thread, topic, partition=0):
    """Every record in a partition's log, read straight from the broker's storage."""
    log = broker_thread.broker.replicas.get(TopicPartition(topic, partition)).log
    data = log.read(log.log_start_offset, 1 << 30, log.log_end_offset)
    return [r for pos, h in iter_batches(data) for r in iter_records(memoryview(data)[pos:pos + h.size])]


def create(broker_thread, topic, partitions=1):
    broker_thread.call(broker_thread.broker.controller.create_topic, topic, partitions)


def producer(broker_thread, **config):
    config.setdefault("enable_idempotence", False)
    return AsyncProducer(bootstrap_servers=broker_thread.bootstrap_servers, **config)


def run(coro):
    return asyncio.run(coro)


# Configuration ---------------------------------------------------------------------


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match="unknown producer configuration 'lingr.ms' .*'linger.ms'"):
        AsyncProducer({"bootstrap.servers": "x:1", "lingr.ms": 5})
    with pytest.raises(ConfigError, match="linger.ms"):
        AsyncProducer(bootstrap_servers="x:1", linger_ms="soon")
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        AsyncProducer(linger_ms=5)
    with pytest.raises(ConfigError, match="acks"):
        AsyncProducer(bootstrap_servers="x:1", acks="2")


def test_dict_and_keyword_spellings_agree():
    a = AsyncProducer({"bootstrap.servers": "x:1", "linger.ms": 7, "acks": "1"})
    b = AsyncProducer(bootstrap_servers="x:1", linger_ms=7, acks="1")
    assert a.config == b.config and a.config["linger.ms"] == 7


def test_idempotence_conflicts():
    with pytest.raises(ConfigError, match="acks=all"):
        AsyncProducer(bootstrap_servers="x:1", acks="1", enable_idempotence=True)
    quiet = AsyncProducer(bootstrap_servers="x:1", acks="1")  # the default gives way, as in the Java client
    assert not quiet._idempotent
    assert AsyncProducer(bootstrap_servers="x:1")._idempotent


# Partitioning ---------------------------------------------------------------------------


def test_murmur2_matches_kafka():
    # Values from Kafka's Utils.murmur2.
    assert [murmur2(s.encode()) for s in ["1", "12", "123", "1234", "12345"]] == [
        -1993445489, 126087238, -267702483, -1614185708, -1188365604]


def test_keyed_records_land_where_the_java_client_puts_them(josef_broker):
    create(josef_broker, "keyed", 6)

    async def main():
        async with producer(josef_broker) as p:
            futures = [await p.send("keyed", b"v", key=f"key-{i}".encode()) for i in range(200)]
            return [await f for f in futures]

    results = run(main())
    for i, md in enumerate(results):
        assert md.partition == to_positive(murmur2(f"key-{i}".encode())) % 6


def test_keyless_records_stick_to_a_partition_per_batch(josef_broker):
    create(josef_broker, "sticky", 4)

    async def main():
        async with producer(josef_broker, linger_ms=1000) as p:
            futures = [await p.send("sticky", b"v") for _ in range(50)]
            await p.flush()
            return {(await f).partition for f in futures}

    assert len(run(main())) == 1
    partitioner = Murmur2Partitioner()
    first = partitioner.partition("t", None, b"v", 4)
    partitioner.on_new_batch("t", 4, first)
    assert partitioner.partition("t", None, b"v", 4) != first


def test_explicit_partition_and_bad_partition(josef_broker):
    create(josef_broker, "explicit", 3)

    async def main():
        async with producer(josef_broker) as p:
            md = await p.send_and_wait("explicit", b"v", partition=2)
            with pytest.raises(KafkaError) as info:
                await p.send("explicit", b"v", partition=3)
            return md, info.value

    md, error = run(main())
    assert md.partition == 2 and error.code == ErrorCode.unknown_topic_or_partition


# Sending ----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_with_headers_and_timestamps(josef_broker, codec):
    async def main():
        async with producer(josef_broker, compression_type=codec) as p:
            futures = [await p.send("rt", f"value-{i}".encode(), key=None if i % 2 else f"k{i}".encode(),
                                    timestamp_ms=1_700_000_000_000 + i, headers=[("n", str(i).encode()), ("none", None)])
                       for i in range(300)]
            return [await f for f in futures]

    results = run(main())
    assert [md.offset for md in results] == list(range(300))
    assert results[5] == RecordMetadata("rt", 0, 5, 1_700_000_000_005, -1, 7)
    records = stored(josef_broker, "rt")
    assert [r.value for r in records] == [f"value-{i}".encode() for i in range(300)]
    assert records[4].key == b"k4" and records[5].key is None
    assert records[7].headers == (("n", b"7"), ("none", None))
    assert [r.timestamp for r in records] == [1_700_000_000_000 + i for i in range(300)]


def test_callbacks_and_sync_producer(josef_broker):
    delivered = []
    with Producer(bootstrap_servers=josef_broker.bootstrap_servers, enable_idempotence=False) as p:
        futures = [p.send("sync", f"v{i}".encode(), on_delivery=lambda md, err: delivered.append((md.offset, err)))
                   for i in range(100)]
        p.flush()
        assert [f.result(10).offset for f in futures] == list(range(100))
        assert p.partitions_for("sync") == 1
    assert sorted(delivered) == [(i, None) for i in range(100)]


def test_values_must_be_bytes_unless_serialized(josef_broker):
    async def main():
        async with producer(josef_broker, value_serializer=lambda v: v.encode()) as p:
            md = await p.send_and_wait("ser", "text")
        async with producer(josef_broker) as p:
            with pytest.raises(TypeError, match="value_serializer"):
                await p.send("ser", "text")
        return md

    assert run(main()).offset == 0
    assert stored(josef_broker, "ser")[0].value == b"text"


def test_acks_zero_completes_without_offsets(josef_broker):
    async def main():
        async with producer(josef_broker, acks="0") as p:
            futures = [await p.send("fire", b"x") for _ in range(10)]
            return [await f for f in futures]

    assert {md.offset for md in run(main())} == {-1}
    deadline = time.monotonic() + 10
    while len(stored(josef_broker, "fire")) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)  # acks=0 offers no event to wait for: poll the log
    assert len(stored(josef_broker, "fire")) == 10


def test_record_larger_than_max_request_size(josef_broker):
    async def main():
        async with producer(josef_broker, max_request_size=1000) as p:
            with pytest.raises(KafkaError) as info:
                await p.send("big", b"x" * 2000)
            return info.value

    assert run(main()).code == ErrorCode.message_too_large


def test_broker_rejection_is_reported(josef_broker):
    josef_broker.call(josef_broker.broker.controller.create_topic, "strict", 1, -1, None, {"max.message.bytes": "500"})

    async def main():
        async with producer(josef_broker) as p:
            future = await p.send("strict", b"x" * 2000)
            with pytest.raises(KafkaError) as info:
                await future
            return info.value

    assert run(main()).code == ErrorCode.message_too_large


def test_unknown_topic_without_auto_create_times_out(josef_broker):
    josef_broker.broker.config = josef_broker.broker.config.with_dynamic({"auto.create.topics.enable": False})

    async def main():
        async with producer(josef_broker, max_block_ms=300) as p:
            with pytest.raises(KafkaError) as info:
                await p.send("nowhere", b"x")
            return info.value

    assert run(main()).code == ErrorCode.unknown_topic_or_partition


# Failures and retries ------------------------------------------------------------------------


def test_delivery_timeout_when_the_broker_is_gone(josef_broker):
    async def main():
        async with producer(josef_broker, delivery_timeout_ms=1500, request_timeout_ms=500) as p:
            await p.send_and_wait("gone", b"first")
            josef_broker.stop()
            future = await p.send("gone", b"second")
            with pytest.raises(KafkaError):
                await future

    run(main())
    josef_broker.start()


def test_buffer_memory_back_pressure(josef_broker):
    async def main():
        async with producer(josef_broker, buffer_memory=20_000, batch_size=4096, linger_ms=0) as p:
            futures = [await p.send("pressure", b"x" * 1000) for _ in range(200)]
            return [await f for f in futures]

    assert [md.offset for md in run(main())] == list(range(200))


def test_buffer_full_times_out_after_max_block(josef_broker):
    async def main():
        async with producer(josef_broker, buffer_memory=5000, max_block_ms=200, delivery_timeout_ms=5000,
                            request_timeout_ms=1000) as p:
            await p.send_and_wait("blocked", b"x")
            josef_broker.stop()
            with pytest.raises(KafkaTimeoutError, match="buffer.memory"):
                for _ in range(100):
                    await p.send("blocked", b"x" * 1000)

    run(main())
    josef_broker.start()


def test_order_kept_across_a_broker_restart_with_one_request_in_flight(josef_broker):
    create(josef_broker, "ordered")

    async def main():
        async with producer(josef_broker, max_in_flight_requests_per_connection=1, linger_ms=1,
                            request_timeout_ms=2000) as p:
            futures = []
            for i in range(3000):
                futures.append(await p.send("ordered", str(i).encode()))
                if i == 1000:
                    josef_broker.restart()
            return [await f for f in futures]

    results = run(main())
    assert [md.offset for md in results] == sorted(md.offset for md in results)
    values = [int(r.value) for r in stored(josef_broker, "ordered")]
    assert sorted(set(values)) == list(range(3000))
    assert values == sorted(values)  # order kept; a batch retried after a lost answer may appear twice in a row


# Interceptors ----------------------------------------------------------------------------


def test_interceptors_run_in_order_and_survive_failures(josef_broker):
    calls = []

    class Tag:
        def __init__(self, config):
            pass

        def on_send(self, record):
            calls.append("tag")
            import attrs

            return attrs.evolve(record, headers=tuple(record.headers) + (("tagged", b"1"),))

        def on_acknowledgement(self, metadata, error):
            calls.append(("ack", metadata.offset))

    class Broken:
        def __init__(self, config):
            pass

        def on_send(self, record):
            calls.append("broken")
            raise RuntimeError("interceptor bug")

    class Plugin:
        @staticmethod
        @hookimpl
        def register_interceptors(register):
            register("tag", Tag)
            register("broken", Broken)

    pm = get_plugin_manager(plugins=[Plugin()])

    async def main():
        async with AsyncProducer(bootstrap_servers=josef_broker.bootstrap_servers, enable_idempotence=False,
                                 interceptor_classes=["broken", "tag"], plugin_manager=pm) as p:
            return await p.send_and_wait("intercepted", b"v")

    assert run(main()).offset == 0
    assert calls == ["broken", "tag", ("ack", 0)]
    assert stored(josef_broker, "intercepted")[0].headers == (("tagged", b"1"),)


def test_records_a_compacted_topic_refuses_fail_with_the_brokers_reason_and_the_rest_of_the_batch_with_javas(
        josef_broker):
    josef_broker.call(functools.partial(josef_broker.broker.controller.create_topic, "compacted-keys", 1,
                                        configs={"cleanup.policy": "compact"}))

    async def send():
        async with producer(josef_broker, linger_ms=200) as p:
            futures = [await p.send("compacted-keys", value=b"v", key=key, partition=0) for key in (b"k", None)]
            return await asyncio.gather(*futures, return_exceptions=True)

    keyed, keyless = run(send())
    assert isinstance(keyless, KafkaError) and keyless.code == ErrorCode.invalid_record
    assert keyless.message == "Compacted topic cannot accept message without key in topic partition compacted-keys-0."
    assert isinstance(keyed, KafkaError) and keyed.code == ErrorCode.invalid_record
    assert keyed.message == ("Failed to append record because it was part of a batch which had one more more "
                             "invalid records")
    assert stored(josef_broker, "compacted-keys") == []
