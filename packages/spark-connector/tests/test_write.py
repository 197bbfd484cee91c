"""Writes: DataFrames into topics (batch and streaming), with the columns of Spark's Kafka sink."""

import re

import pytest
from conftest import create_topic, produce, reader
from pyspark.errors import AnalysisException
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from josef_client import Consumer, TopicPartition

TIMEOUT_S = 120
HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def consume(broker, topic, partitions):
    """Every record of ``topic`` as (partition, key, value, headers), read with josef's own consumer."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer({"bootstrap.servers": broker.bootstrap_servers}) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        records = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for batch in consumer.poll(timeout_ms=1000).values():
                records += [(r.partition, r.key, r.value, tuple(r.headers)) for r in batch]
    return sorted(records, key=lambda r: (r[0], r[2] or b""))


def writer(df, broker, **options):
    return df.write.format("josef").mode("append").option("kafka.bootstrap.servers", broker.bootstrap_servers) \
        .options(**options)


def test_batch_write_round_trip_with_every_column(spark, josef_broker):
    create_topic(josef_broker, "out", 2)
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType()),
                         StructField("topic", StringType()), StructField("partition", IntegerType()),
                         StructField("headers", HEADERS), StructField("ignored", StringType())])
    data = [(f"k{i}", f"v{i}".encode(), "out", i % 2, [("n", f"{i}".encode())], "x") for i in range(200)]
    data.append((None, None, "out", 0, None, "tombstone"))
    writer(spark.createDataFrame(data, schema).coalesce(1), josef_broker).save()  # one task: one order
    got = consume(josef_broker, "out", 2)
    want = [(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("n", f"{i}".encode()),)) for i in range(200)]
    assert got == sorted(want + [(0, None, None, ())], key=lambda r: (r[0], r[2] or b""))
    # And what josef wrote reads back through the source: in order within each partition.
    read = reader(spark, josef_broker, subscribe="out").load().orderBy("partition", "offset").collect()
    assert [r.value for r in read if r.partition == 1] == [f"v{i}".encode() for i in range(1, 200, 2)]


def test_topic_option_wins_over_the_column_and_keys_choose_partitions(spark, josef_broker):
    create_topic(josef_broker, "chosen", 3)
    df = spark.createDataFrame([(f"key-{i}", f"{i}", "elsewhere") for i in range(60)], "key string, value string, topic string")
    writer(df, josef_broker, topic="chosen").save()
    got = consume(josef_broker, "chosen", 3)
    assert sorted(int(v) for _, _, v, _ in got) == list(range(60))
    # Keyed records land where any Java-compatible producer puts them (murmur2), so the same key twice shares a partition.
    by_key = {k: p for p, k, _, _ in got}
    writer(df, josef_broker, topic="chosen").save()
    assert all(by_key[k] == p for p, k, _, _ in consume(josef_broker, "chosen", 3))


def test_streaming_write_round_trip(spark, josef_broker, tmp_path):
    create_topic(josef_broker, "in", 2)
    create_topic(josef_broker, "upper", 2)
    produce(josef_broker, "in", [f"word{i}".encode() for i in range(300)], keys=[f"{i}".encode() for i in range(300)])
    query = (spark.readStream.format("josef").option("kafka.bootstrap.servers", josef_broker.bootstrap_servers)
             .option("subscribe", "in").option("startingOffsets", "earliest").load()
             .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
             .writeStream.format("josef").option("kafka.bootstrap.servers", josef_broker.bootstrap_servers)
             .option("topic", "upper").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(TIMEOUT_S) and query.exception() is None
    got = consume(josef_broker, "upper", 2)
    assert sorted(v for _, _, v, _ in got) == sorted(f"WORD{i}".encode() for i in range(300))
    assert len(got) == 300


@pytest.mark.parametrize("ddl, options, message", [
    ("key string", {"topic": "t"}, "needs a value column"),
    ("value string", {}, "set the topic option or give the DataFrame a topic column"),
    ("value int", {"topic": "t"}, "column value must be string or binary, not int"),
    ("value string, key array<int>", {"topic": "t"}, "column key must be string or binary"),
    ("value string, topic int", {}, "column topic must be string"),
    ("value string, partition string", {"topic": "t"}, "column partition must be int"),
    ("value string, headers map<string,string>", {"topic": "t"}, "column headers must be array<struct<key:string,value:binary>>"),
    ("value string", {"topic": "t", "kafka.acks": "many"}, "acks"),
    ("value string", {"topic": "t", "kafka.value.serializer": "x"}, "kafka.value.serializer is not supported"),
])
def test_bad_writes_fail_before_writing(spark, josef_broker, ddl, options, message):
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("<", "<")):
        writer(df, josef_broker, **options).save()


def test_overwrite_is_refused(spark, josef_broker):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=re.escape('a topic cannot be overwritten: records are only appended to '
                                                  'topics; write with .mode("append")')):
        df.write.format("josef").mode("overwrite").option("kafka.bootstrap.servers", josef_broker.bootstrap_servers) \
            .option("topic", "t").save()


@pytest.mark.parametrize("mode, shown", [(None, "ErrorIfExists"), ("errorifexists", "ErrorIfExists"),
                                         ("ignore", "Ignore")])
def test_save_modes_other_than_append_are_refused_by_spark(spark, josef_broker, mode, shown):
    """Spark's Kafka sink takes its default save mode; Spark refuses it for Python data sources before calling
    the data source (so nothing of josef's can name the fix there): the README says to use .mode("append")."""
    create_topic(josef_broker, "modes", 1)
    df = spark.createDataFrame([("v",)], "value string")
    write = df.write.format("josef") if mode is None else df.write.format("josef").mode(mode)
    with pytest.raises(AnalysisException) as error:
        write.option("kafka.bootstrap.servers", josef_broker.bootstrap_servers).option("topic", "modes").save()
    assert error.value.getCondition() == "UNSUPPORTED_DATA_SOURCE_SAVE_MODE"
    assert str(error.value).startswith(f'[UNSUPPORTED_DATA_SOURCE_SAVE_MODE] The data source "josef" cannot be '
                                       f'written in the "{shown}" mode. Please use either the "Append" or '
                                       '"Overwrite" mode instead.')
    assert consume(josef_broker, "modes", 1) == []
    writer(df, josef_broker, topic="modes").save()  # the fix: .mode("append")
    assert [v for _, _, v, _ in consume(josef_broker, "modes", 1)] == [b"v"]


def test_a_failed_delivery_fails_the_task(spark, josef_broker):
    create_topic(josef_broker, "small", 1, **{"max.message.bytes": "1000"})
    df = spark.createDataFrame([("x" * 5000,)], "value string")
    with pytest.raises(Exception, match="MESSAGE_TOO_LARGE|RECORD_TOO_LARGE|message_too_large"):
        writer(df, josef_broker, topic="small", **{"kafka.delivery.timeout.ms": "5000"}).save()
