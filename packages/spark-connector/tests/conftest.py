"""A local Spark session shared by the tests, and helpers to put records into a josef broker.

Spark's Python workers are started with this interpreter, so they import
the josef and josef_spark under test; the broker is josef's in-process
``josef_broker`` fixture, reached over real sockets on 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

import pytest
from pyspark.sql import SparkSession

from josef_client import Admin, NewTopic, Producer
from josef_spark import JosefDataSource

@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (SparkSession.builder.master("local[2]").appName("josef-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
               .config("spark.sql.streaming.stopTimeout", "60s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(JosefDataSource)
    yield session
    session.stop()


def create_topic(broker, name: str, partitions: int = 1, **configs: str) -> None:
    with Admin({"bootstrap.servers": broker.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(name, partitions, configs=configs)])


def produce(broker, topic: str, values, *, partition: int | None = None, keys=None, headers=None,
            timestamps=None) -> list:
    """Send ``values`` (bytes) and wait for every acknowledgement; returns their RecordMetadata."""
    with Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0}) as producer:
        futures = [producer.send(topic, v, key=None if keys is None else keys[i], partition=partition,
                                 headers=None if headers is None else headers[i],
                                 timestamp_ms=None if timestamps is None else timestamps[i])
                   for i, v in enumerate(values)]
        producer.flush()
        return [f.result(30) for f in futures]


def reader(spark, broker, **options: str):
    """``spark.read.format("josef")`` at the broker with ``options`` (underscores kept: Spark's names are camelCase)."""
    return spark.read.format("josef").option("kafka.bootstrap.servers", broker.bootstrap_servers).options(**options)
