"""Structured Streaming reads: checkpointed offsets, restarts, admission control, AvailableNow, new partitions, data loss."""

import json
import threading

import pytest
from conftest import create_topic, produce

from josef_client import Admin, NewPartitions, Producer, TopicPartition

TIMEOUT_S = 120


def stream(spark, broker, **options):
    return (spark.readStream.format("josef").option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .options(**options).load())


def collect_batches(spark, broker, checkpoint, trigger, **options):
    """Start a query whose sink records each micro-batch's (partition, offset, value) rows."""
    batches = []

    def sink(df, batch_id):
        batches.append((batch_id, sorted((r.partition, r.offset, r.value) for r in df.collect())))

    query = (stream(spark, broker, **options).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())
    return query, batches


def finish(query):
    """Wait for an AvailableNow query to end by itself."""
    assert query.awaitTermination(TIMEOUT_S), "the AvailableNow query did not finish"
    assert query.exception() is None, query.exception()


def test_restart_mid_stream_delivers_every_record_exactly_once(spark, josef_broker, tmp_path):
    """A file sink with a checkpoint: stopped and started again while a producer keeps writing."""
    create_topic(josef_broker, "live", 3)
    total = 3000
    produce(josef_broker, "live", [f"{i}".encode() for i in range(1000)], keys=[f"k{i}".encode() for i in range(1000)])
    restarted = threading.Event()
    errors = []

    def keep_producing():
        try:
            with Producer({"bootstrap.servers": josef_broker.bootstrap_servers, "linger.ms": 5}) as producer:
                for i in range(1000, total):
                    if i == 2000:
                        producer.flush()
                        assert restarted.wait(TIMEOUT_S)  # the rest arrives while the second run is going
                    producer.send("live", f"{i}".encode(), key=f"k{i}".encode())
                    if i % 50 == 0:
                        producer.flush()
        except BaseException as exc:
            errors.append(exc)

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start():
        return (stream(spark, josef_broker, subscribe="live", startingOffsets="earliest")
                .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
                .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="200 milliseconds").start())

    first = start()
    first.processAllAvailable()  # the first 1000 are in
    writer = threading.Thread(target=keep_producing)
    writer.start()
    first.stop()  # while the producer writes
    second = start()
    restarted.set()
    writer.join(TIMEOUT_S)
    assert not writer.is_alive() and not errors, errors
    second.processAllAvailable()
    second.stop()

    got = spark.read.parquet(str(out)).collect()
    assert sorted(int(r.value) for r in got) == list(range(total))  # all of them, none twice
    assert len({(r.partition, r.offset) for r in got}) == total
    # Progress lives in the checkpoint as Spark's Kafka source writes it: {"topic": {"partition": offset}}.
    last = max((f for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()), key=lambda f: int(f.name))
    offsets = json.loads(last.read_text().splitlines()[-1])
    assert set(offsets["live"]) == {"0", "1", "2"} and sum(offsets["live"].values()) == total


def test_micro_batches_never_exceed_max_offsets_per_trigger(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "limited", 3)
    for partition, count in enumerate((600, 300, 101)):
        produce(josef_broker, "limited", [f"{partition}-{i}".encode() for i in range(count)], partition=partition)
    query, batches = collect_batches(spark, josef_broker, tmp_path / "cp", {"availableNow": True},
                                     subscribe="limited", startingOffsets="earliest", maxOffsetsPerTrigger="70")
    finish(query)
    sizes = [len(rows) for _, rows in batches]
    assert max(sizes) <= 70 and sum(sizes) == 1001
    assert len(sizes) == 15  # 1001 / 70, rounded up: the limit is used in full
    assert len({(p, o) for _, rows in batches for p, o, _ in rows}) == 1001


def test_available_now_reads_what_was_there_and_stops(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "now", 2)
    produce(josef_broker, "now", [f"{i}".encode() for i in range(50)])
    checkpoint = tmp_path / "cp"
    query, batches = collect_batches(spark, josef_broker, checkpoint, {"availableNow": True},
                                     subscribe="now", startingOffsets="earliest")
    finish(query)
    assert sorted(int(v) for _, rows in batches for *_, v in rows) == list(range(50))
    # Run again from the same checkpoint: only what came since.
    produce(josef_broker, "now", [f"{i}".encode() for i in range(50, 60)])
    query, batches = collect_batches(spark, josef_broker, checkpoint, {"availableNow": True},
                                     subscribe="now", startingOffsets="earliest")
    finish(query)
    assert sorted(int(v) for _, rows in batches for *_, v in rows) == list(range(50, 60))


def test_starting_offsets_default_to_latest(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "late", 1)
    produce(josef_broker, "late", [b"before"])
    query, batches = collect_batches(spark, josef_broker, tmp_path / "cp", {"processingTime": "100 milliseconds"},
                                     subscribe="late")
    try:
        query.processAllAvailable()
        produce(josef_broker, "late", [b"after"])
        query.processAllAvailable()
    finally:
        query.stop()
    assert [v for _, rows in batches for *_, v in rows] == [b"after"]


def test_new_partitions_and_topics_are_noticed(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "grow-a", 1)
    produce(josef_broker, "grow-a", [b"a0"])
    query, batches = collect_batches(spark, josef_broker, tmp_path / "cp", {"processingTime": "100 milliseconds"},
                                     subscribePattern="grow-.*", startingOffsets="earliest")
    try:
        query.processAllAvailable()
        with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
            admin.create_partitions({"grow-a": NewPartitions(2)})
        produce(josef_broker, "grow-a", [b"a1"], partition=1)
        create_topic(josef_broker, "grow-b", 1)
        produce(josef_broker, "grow-b", [b"b0"])
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(v for _, rows in batches for *_, v in rows) == [b"a0", b"a1", b"b0"]


@pytest.mark.parametrize("fail", [True, False])
def test_offsets_removed_by_retention_fail_or_are_skipped(spark, josef_broker, tmp_path, fail):
    create_topic(josef_broker, "lossy", 1)
    produce(josef_broker, "lossy", [f"{i}".encode() for i in range(10)])
    checkpoint = tmp_path / "cp"
    options = dict(subscribe="lossy", startingOffsets="earliest", failOnDataLoss=str(fail).lower())
    query, _ = collect_batches(spark, josef_broker, checkpoint, {"availableNow": True}, **options)
    finish(query)
    produce(josef_broker, "lossy", [f"{i}".encode() for i in range(10, 20)])
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        admin.delete_records({TopicPartition("lossy", 0): 15})  # 10..14 are gone before the query reads them
    query, batches = collect_batches(spark, josef_broker, checkpoint, {"availableNow": True}, **options)
    if fail:
        with pytest.raises(Exception, match=r"offsets 10\.\.14 of lossy-0 are gone"):
            query.awaitTermination(TIMEOUT_S)
    else:
        finish(query)
        assert [int(v) for _, rows in batches for *_, v in rows] == list(range(15, 20))


def test_streaming_only_options_are_checked(spark, josef_broker):
    with pytest.raises(Exception, match="endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch"):
        (stream(spark, josef_broker, subscribe="t", endingOffsets="latest").writeStream.format("noop").start()
         .awaitTermination(TIMEOUT_S))
