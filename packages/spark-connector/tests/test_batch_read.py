"""Batch reads: what spark.read.format("josef") returns equals what was produced, option by option."""

import datetime as dt
import re

import pytest
from conftest import create_topic, produce, reader
from pyspark.errors import AnalysisException, PythonException

import josef_spark.reader
from josef_client import Admin, Consumer, TopicPartition
from josef_spark import JosefDataSource


def rows(df):
    return sorted((r.topic, r.partition, r.offset, r.value) for r in df.collect())


@pytest.fixture
def three_partitions(josef_broker):
    """Topic "t" with 3 partitions of 10 records each: value b"p{partition}-{i}"."""
    create_topic(josef_broker, "t", 3)
    for p in range(3):
        produce(josef_broker, "t", [f"p{p}-{i}".encode() for i in range(10)], partition=p)
    return josef_broker


def expected(partitions=range(3), offsets=range(10), topic="t"):
    return sorted((topic, p, i, f"p{p}-{i}".encode()) for p in partitions for i in offsets)


def test_every_column_equals_what_was_produced(spark, josef_broker):
    create_topic(josef_broker, "cols", 1)
    stamps = [1_700_000_000_000 + i for i in range(5)]
    sent = produce(josef_broker, "cols", [f"v{i}".encode() if i != 3 else None for i in range(5)],
                   keys=[f"k{i}".encode() if i != 2 else None for i in range(5)],
                   headers=[[("h", f"{i}".encode()), ("empty", None)] for i in range(5)], timestamps=stamps)
    df = reader(spark, josef_broker, subscribe="cols", includeHeaders="true").load()
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    got = df.orderBy("offset").collect()
    assert [r.offset for r in got] == [m.offset for m in sent] == list(range(5))
    assert [r.key for r in got] == [b"k0", b"k1", None, b"k3", b"k4"]
    assert [r.value for r in got] == [b"v0", b"v1", b"v2", None, b"v4"]
    assert {(r.topic, r.partition, r.timestampType) for r in got} == {("cols", 0, 0)}
    utc = [r.timestamp.replace(tzinfo=None) for r in spark.createDataFrame(got).selectExpr(
        "to_utc_timestamp(timestamp, current_timezone()) as timestamp").collect()]
    assert utc == [dt.datetime(2023, 11, 14, 22, 13, 20, (s % 1000) * 1000) for s in stamps]
    assert [[(h.key, h.value) for h in r.headers] for r in got] == [[("h", f"{i}".encode()), ("empty", None)]
                                                                      for i in range(5)]
    no_headers = reader(spark, josef_broker, subscribe="cols").load()
    assert "headers" not in no_headers.columns and no_headers.count() == 5


def test_subscribe_pattern_and_assign(spark, three_partitions):
    broker = three_partitions
    create_topic(broker, "other", 1)
    produce(broker, "other", [b"o"])
    assert rows(reader(spark, broker, subscribe="t").load()) == expected()
    both = rows(reader(spark, broker, subscribe="t,other").load())
    assert both == sorted(expected() + [("other", 0, 0, b"o")])
    assert rows(reader(spark, broker, subscribePattern="t|oth.*").load()) == both
    assert rows(reader(spark, broker, subscribePattern="th.*").load()) == []  # full match, as Java's Pattern.matches
    assert rows(reader(spark, broker, assign='{"t": [0, 2]}').load()) == expected([0, 2])
    assert reader(spark, broker, subscribe="missing").load().count() == 0


def test_starting_and_ending_offsets(spark, three_partitions):
    broker = three_partitions
    df = reader(spark, broker, subscribe="t", startingOffsets='{"t": {"0": 3, "1": -2, "2": 9}}',
                endingOffsets='{"t": {"0": 5, "1": -1, "2": 10}}').load()
    assert rows(df) == sorted(expected([0], range(3, 5)) + expected([1]) + expected([2], [9]))
    with pytest.raises(Exception, match="lacks t-1, t-2"):
        reader(spark, broker, subscribe="t", startingOffsets='{"t": {"0": 3}}').load().count()
    with pytest.raises(Exception, match="before the starting offset"):
        reader(spark, broker, assign='{"t": [0]}', startingOffsets='{"t": {"0": 5}}',
               endingOffsets='{"t": {"0": 2}}').load().count()


def test_timestamps(spark, josef_broker):
    create_topic(josef_broker, "ts", 2)
    for p in range(2):
        produce(josef_broker, "ts", [f"{p}-{i}".encode() for i in range(10)], partition=p,
                timestamps=[1000 * (i + 1) for i in range(10)])
    values = lambda df: sorted(r.value for r in df.collect())  # noqa: E731
    assert values(reader(spark, josef_broker, subscribe="ts", startingTimestamp="8000").load()) == \
        [b"0-7", b"0-8", b"0-9", b"1-7", b"1-8", b"1-9"]
    per_partition = reader(spark, josef_broker, subscribe="ts",
                           startingOffsetsByTimestamp='{"ts": {"0": 9500, "1": 1}}',
                           endingOffsetsByTimestamp='{"ts": {"0": 99999, "1": 3000}}').load()
    assert values(per_partition) == [b"0-9", b"1-0", b"1-1"]
    assert values(reader(spark, josef_broker, subscribe="ts", startingTimestamp="1", endingTimestamp="2000").load()) \
        == [b"0-0", b"1-0"]
    with pytest.raises(Exception, match="no record of ts-0 has a timestamp at or after 50000"):
        reader(spark, josef_broker, subscribe="ts", startingTimestamp="50000").load().count()
    late = reader(spark, josef_broker, subscribe="ts", startingTimestamp="50000",
                  startingOffsetsByTimestampStrategy="latest").load()
    assert late.count() == 0


def test_min_partitions_splits_ranges_without_changing_the_rows(spark, three_partitions):
    df = reader(spark, three_partitions, subscribe="t", minPartitions="7").load()
    assert df.rdd.getNumPartitions() >= 7
    assert rows(df) == expected()


def test_max_records_per_partition_caps_every_task(spark, three_partitions):
    df = reader(spark, three_partitions, subscribe="t", maxRecordsPerPartition="4").load()
    assert df.rdd.getNumPartitions() == 9  # each partition's 10 records in tasks of 4, 3 and 3
    per_task = df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    assert sorted(per_task) == [3] * 6 + [4] * 3
    assert rows(df) == expected()
    # With minPartitions as well: split by the record limit first, then until there are minPartitions tasks.
    both = reader(spark, three_partitions, subscribe="t", maxRecordsPerPartition="4", minPartitions="15").load()
    assert both.rdd.getNumPartitions() >= 15 and rows(both) == expected()
    assert max(both.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()) <= 4


def test_ending_timestamps_end_at_the_first_offset_at_or_after(spark, josef_broker):
    create_topic(josef_broker, "ends", 2)
    stamps = [1000, 2000, 2000, 3000, 4000]
    for p in range(2):
        produce(josef_broker, "ends", [f"{p}-{i}".encode() for i in range(5)], partition=p, timestamps=stamps)
    values = lambda **o: sorted(r.value for r in reader(spark, josef_broker, subscribe="ends", **o).load().collect())  # noqa: E731
    # The end is exclusive: the first record stamped 2000 or later is not read.
    assert values(endingTimestamp="2000") == [b"0-0", b"1-0"]
    assert values(endingTimestamp="2001") == [b"0-0", b"0-1", b"0-2", b"1-0", b"1-1", b"1-2"]
    # Later than every record: to the end, as Spark does when Kafka finds no offset.
    assert len(values(endingTimestamp="99999")) == 10
    # endingTimestamp wins over endingOffsetsByTimestamp, which wins over endingOffsets.
    assert values(endingTimestamp="1500", endingOffsetsByTimestamp='{"ends": {"0": 99999, "1": 99999}}',
                  endingOffsets='{"ends": {"0": 5, "1": 5}}') == [b"0-0", b"1-0"]
    assert values(endingOffsetsByTimestamp='{"ends": {"0": 3000, "1": 1}}', endingOffsets='{"ends": {"0": 1, "1": 1}}') \
        == [b"0-0", b"0-1", b"0-2"]
    with pytest.raises(Exception, match="must give a timestamp for every partition read; it lacks ends-1"):
        values(endingOffsetsByTimestamp='{"ends": {"0": 3000}}')


def consumer_group_ids(monkeypatch, options):
    """Plan a batch read with ``options`` in this process and read every range; the group.id of each consumer."""
    source = JosefDataSource(options)
    batch = source.reader(source.schema())
    seen = []

    def consumer(config):
        seen.append(config["group.id"])
        return Consumer(config)

    monkeypatch.setattr(josef_spark.reader, "Consumer", consumer)
    records = sum(b.num_rows for p in batch.partitions() for b in batch.read(p))
    return seen, records


def test_group_ids(spark, three_partitions, monkeypatch):
    broker = three_partitions
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": "t"}
    # As Spark: a new id per query, "spark-kafka-relation-<uuid>-executor", shared by the query's tasks ...
    seen, records = consumer_group_ids(monkeypatch, options)
    assert records == 30 and len(seen) == 3 and len(set(seen)) == 1
    assert re.fullmatch(r"spark-kafka-relation-[0-9a-f-]{36}-executor", seen[0])
    assert consumer_group_ids(monkeypatch, options)[0][0] != seen[0]
    # ... with groupIdPrefix in front instead ...
    seen, _ = consumer_group_ids(monkeypatch, {**options, "groupidprefix": "etl"})
    assert re.fullmatch(r"etl-[0-9a-f-]{36}-executor", seen[0])
    # ... and kafka.group.id exactly as given (groupIdPrefix is then ignored).
    seen, records = consumer_group_ids(monkeypatch, {**options, "groupidprefix": "etl", "kafka.group.id": "billing"})
    assert seen == ["billing"] * 3 and records == 30


def test_kafka_group_id_commits_nothing(spark, three_partitions):
    broker = three_partitions
    df = reader(spark, broker, subscribe="t", **{"kafka.group.id": "billing"}).load()
    assert rows(df) == expected()
    streamed = (spark.readStream.format("josef").option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .options(subscribe="t", startingOffsets="earliest", groupIdPrefix="etl", **{"kafka.group.id": "billing"})
                .load().writeStream.format("noop").trigger(availableNow=True).start())
    assert streamed.awaitTermination(120) and streamed.exception() is None
    # Progress lives in Spark's checkpoint, as with Spark's Kafka source: the group has no committed offsets.
    with Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "billing"}) as consumer:
        assert set(consumer.committed([TopicPartition("t", p) for p in range(3)]).values()) == {None}


def test_fail_on_data_loss(spark, three_partitions):
    broker = three_partitions
    with Admin({"bootstrap.servers": broker.bootstrap_servers}) as admin:
        admin.delete_records({TopicPartition("t", 0): 4})
    options = dict(assign='{"t": [0]}', startingOffsets='{"t": {"0": 1}}')
    with pytest.raises(Exception, match=r"offsets 1\.\.3 of t-0 are gone.*failOnDataLoss=false"):
        reader(spark, broker, **options).load().count()
    assert rows(reader(spark, broker, failOnDataLoss="false", **options).load()) == expected([0], range(4, 10))
    # "earliest" is never data loss: it is whatever is left.
    assert rows(reader(spark, broker, assign='{"t": [0]}').load()) == expected([0], range(4, 10))


def test_kafka_options_reach_the_client(spark, three_partitions):
    df = reader(spark, three_partitions, subscribe="t", **{"kafka.client.id": "spark-etl",
                                                            "kafka.max.partition.fetch.bytes": "100"}).load()
    assert rows(df) == expected()  # tiny fetches still read everything


def test_bad_options_fail_when_the_query_is_defined(spark, josef_broker):
    with pytest.raises(AnalysisException, match="exactly one of subscribe, subscribePattern or assign"):
        reader(spark, josef_broker).load()
    with pytest.raises(AnalysisException, match="kafka.auto.offset.reset is not supported"):
        reader(spark, josef_broker, subscribe="t", **{"kafka.auto.offset.reset": "earliest"}).load()
    with pytest.raises(AnalysisException, match="minPartitions must be a positive integer"):
        reader(spark, josef_broker, subscribe="t", minPartitions="0").load()
    with pytest.raises((AnalysisException, PythonException), match='startingOffsets="latest" is not valid for batch'):
        reader(spark, josef_broker, subscribe="t", startingOffsets="latest").load().count()
    with pytest.raises(AnalysisException, match="fixed schema"):
        spark.read.format("josef").schema("value string").option("kafka.bootstrap.servers", "x:1") \
            .option("subscribe", "t").load().count()
