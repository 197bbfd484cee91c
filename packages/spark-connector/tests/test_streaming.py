"""Structured Streaming reads: checkpointed offsets, restarts, admission control, AvailableNow, new partitions, data loss."""

import json
import threading
import time

import pytest
from conftest import create_topic, produce
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

import josef_spark.reader
from josef_client import Admin, NewPartitions, Producer, TopicPartition
from josef_spark import JosefDataSource

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


class FakePlanner:
    """What a stream reader asks the cluster, answered from ``latest`` (one partition, "t"-0, starting at 0)."""

    def __init__(self):
        self.latest_offset = 0

    def partitions(self):
        return [("t", 0)]

    def latest(self, tps):
        return {tp: self.latest_offset for tp in tps}

    def earliest(self, tps):
        return {tp: 0 for tp in tps}


def fake_stream_reader(monkeypatch, **options):
    source = JosefDataSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t", **options})
    reader = source.streamReader(source.schema())
    reader._planner = FakePlanner()
    clock = [1000.0]
    monkeypatch.setattr(josef_spark.reader.time, "monotonic", lambda: clock[0])
    return reader, reader._planner, clock


def test_min_offsets_per_trigger_holds_batches_back_until_enough_or_the_delay(monkeypatch):
    reader, planner, clock = fake_stream_reader(monkeypatch, minoffsetspertrigger="10", maxtriggerdelay="30s")
    assert reader.getDefaultReadLimit() == ReadMinRows(10)
    limit = reader.getDefaultReadLimit()
    start = {"t": {"0": 0}}
    planner.latest_offset = 3
    assert reader.latestOffset(start, limit) == {"t": {"0": 3}}  # the first trigger is never held back (as Spark)
    start = {"t": {"0": 3}}
    planner.latest_offset = 12
    clock[0] += 29
    assert reader.latestOffset(start, limit) is start  # 9 new offsets, 29 s: wait
    planner.latest_offset = 13
    assert reader.latestOffset(start, limit) == {"t": {"0": 13}}  # 10 new: go, and the delay starts again
    start = {"t": {"0": 13}}
    planner.latest_offset = 14
    clock[0] += 29.9
    assert reader.latestOffset(start, limit) is start
    clock[0] += 0.1
    assert reader.latestOffset(start, limit) == {"t": {"0": 14}}  # 30 s since the last batch: go with what there is
    # Spark asking for everything (Trigger.Once) is never held back.
    planner.latest_offset = 15
    assert reader.latestOffset({"t": {"0": 14}}, ReadAllAvailable()) == {"t": {"0": 15}}


def test_min_and_max_offsets_per_trigger_together(monkeypatch):
    reader, planner, clock = fake_stream_reader(monkeypatch, minoffsetspertrigger="5", maxoffsetspertrigger="20")
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(20)  # Spark gets the maximum; the minimum is applied from the options
    planner.latest_offset = 100
    assert reader.latestOffset({"t": {"0": 0}}, limit) == {"t": {"0": 20}}
    planner.latest_offset = 24
    assert reader.latestOffset({"t": {"0": 20}}, limit) == {"t": {"0": 20}}  # 4 new < 5: wait (15 min by default)
    planner.latest_offset = 70
    assert reader.latestOffset({"t": {"0": 20}}, limit) == {"t": {"0": 40}}
    # Trigger.AvailableNow: never held back, or the query would end before reading everything.
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset({"t": {"0": 68}}, limit) == {"t": {"0": 70}}


def test_min_offsets_per_trigger_in_a_running_query(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "trickle", 2)
    produce(josef_broker, "trickle", [f"{i}".encode() for i in range(10)])
    batches = []

    def sink(df, batch_id):
        batches.append((time.monotonic(), df.count()))

    delay_s = 8
    query = (stream(spark, josef_broker, subscribe="trickle", startingOffsets="earliest", minOffsetsPerTrigger="50",
                    maxTriggerDelay=f"{delay_s}s")
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="100 milliseconds").start())

    def wait_for(count):
        deadline = time.monotonic() + TIMEOUT_S
        while len(batches) < count and query.exception() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert query.exception() is None, query.exception()
        assert len(batches) >= count, batches

    try:
        wait_for(1)  # the first trigger goes with what there is
        produced = time.monotonic()
        produce(josef_broker, "trickle", [f"{i}".encode() for i in range(10, 70)])  # 60 >= 50: at once
        wait_for(2)
        assert batches[1][0] - produced < delay_s - 2, batches
        produce(josef_broker, "trickle", [f"{i}".encode() for i in range(70, 75)])  # 5 < 50: held back ...
        wait_for(3)  # ... until maxTriggerDelay passed since the last batch
        assert batches[2][0] - batches[1][0] >= delay_s - 1.5, batches
    finally:
        query.stop()
    assert [n for _, n in batches[:3]] == [10, 60, 5]
