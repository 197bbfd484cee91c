"""A Spark driver in its own process, for tests that kill a driver or an executor, or need task retries.

    python exactly_once_driver.py stream BOOTSTRAP INPUT OUTPUT CHECKPOINT (running|available-now)
    python exactly_once_driver.py stalled-stream BOOTSTRAP INPUT OUTPUT CHECKPOINT
    python exactly_once_driver.py failing-batch BOOTSTRAP OUTPUT
    python exactly_once_driver.py upstream-failing-batch BOOTSTRAP OUTPUT
    python exactly_once_driver.py named-batch BOOTSTRAP OUTPUT WRITE_ID RUN[,RUN...]

Once the session is up it prints ``JVM_PID <pid>``: the Spark driver's JVM,
which a test may SIGKILL (the Python process then ends with it).

``stream`` copies INPUT to OUTPUT through josef-spark, 2000 offsets a
micro-batch. Its producers send one record a request, one request at a time
(``kafka.batch.size=1``, ``kafka.max.in.flight.requests.per.connection=1``),
so each task's transaction stays open for a second or more with records in
it, and a kill lands in the middle of a batch. The transaction timeout is 5
minutes: only fencing, not the coordinator's timeout, can end the
transactions of a killed driver within a test.

``stalled-stream`` copies INPUT to OUTPUT in one micro-batch (AvailableNow)
on Spark's ``local-cluster[2,1,1024]``: two executors of one core each, JVMs
of their own (children of the driver's JVM), which a test may SIGKILL. The
first attempt of Spark partition 0's task stops at the row of offset 300
(in a Python UDF), its transaction open with the rows before it sent, until
its executor is killed; later attempts go through. Rows reach the writer in
Arrow batches of 100; with values of 1 KB, each batch of 100 leaves the
UDF's Python worker at once (it holds back 64 KB of output).
``failing-batch`` writes 0..1999 (Spark partition 0 has 0..999, partition 1
1000..1999) with up to three attempts per task; on its first attempt row 1950
has no topic, so that attempt fails half-way through its rows.

``upstream-failing-batch`` writes 0..1999 (as ``failing-batch``) with
values of 1 KB made by a Python UDF, which fails at row 1950 on its first
attempt, once partition 1's writer has its transaction open with rows in
it: Spark then shuts the writer's input down after the batches of 100 rows
it had sent, which the writer must not take for the end of its rows.

``named-batch`` writes 0..3999 (values of 1 KB, made by a Python UDF) in 4
Spark partitions (Kafka partition: the number modulo 2) with ``writeId``
WRITE_ID, once for each RUN, each a job of its own as a re-run is: ``ok``
prints ``WRITTEN`` when the job is done; ``fail`` gives row 3999 (the last
of partition 3) no topic, so partition 3 fails half-way through its rows,
the job fails, and it prints ``FAILED`` and the error; ``stall`` stops the
first attempt of partition 3 at row 3500 (in the UDF), its transaction
open, so a test can kill the driver in the middle of the write.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import TaskContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.functions import col, expr, udf  # noqa: E402
from pyspark.sql.types import BinaryType, StringType  # noqa: E402

from josef_client import Admin  # noqa: E402
from josef_spark import JosefDataSource  # noqa: E402


def session(master: str, **config: str) -> SparkSession:
    builder = (SparkSession.builder.master(master).appName("josef-spark-exactly-once")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2"))
    for key, value in config.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JosefDataSource)
    print("JVM_PID", spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)
    return spark


#: The producer options that keep a task's transaction open long enough for a test to kill it mid-write.
SLOW = {"kafka.batch.size": "1", "kafka.max.in.flight.requests.per.connection": "1",
        "kafka.transaction.timeout.ms": "300000"}


def stream(bootstrap: str, source: str, sink: str, checkpoint: str, mode: str) -> None:
    spark = session("local[2]")
    trigger = {"availableNow": True} if mode == "available-now" else {"processingTime": "0 seconds"}
    query = (spark.readStream.format("josef").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "2000")
             .load().select("key", "value", "partition")
             .writeStream.format("josef").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .options(**SLOW).option("checkpointLocation", checkpoint).trigger(**trigger).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    spark.stop()


def stalled_stream(bootstrap: str, source: str, sink: str, checkpoint: str) -> None:
    spark = session("local-cluster[2,1,1024]", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})

    @udf(BinaryType())
    def stall(value: bytes, offset: int) -> bytes:
        context = TaskContext.get()
        if offset >= 300 and context.partitionId() == 0 and context.attemptNumber() == 0:
            threading.Event().wait(600)  # until the executor is killed (the test gives up well before)
        return value

    query = (spark.readStream.format("josef").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").load()
             .select("key", stall("value", "offset").alias("value"), "partition")
             .writeStream.format("josef").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    spark.stop()


def failing_batch(bootstrap: str, sink: str) -> None:
    spark = session("local[2,3]")  # up to three attempts per task

    @udf(StringType())
    def topic(number: int) -> str | None:
        return None if number == 1950 and TaskContext.get().attemptNumber() == 0 else sink

    df = spark.range(0, 2000, 1, 2).selectExpr("id", "CAST(id AS STRING) AS value", "CAST(id % 2 AS INT) AS partition")
    df.select(topic("id").alias("topic"), "value", "partition").write.format("josef").mode("append") \
        .option("kafka.bootstrap.servers", bootstrap).save()
    spark.stop()


def upstream_failing_batch(bootstrap: str, sink: str) -> None:
    spark = session("local[2,3]", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})

    @udf(StringType())
    def padded(number: int) -> str:
        if number == 1950 and TaskContext.get().attemptNumber() == 0:
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                deadline = time.monotonic() + 120
                while not any(t.transactional_id.endswith("-1") and t.state == "Ongoing"
                              for ts in admin.list_transactions().values() for t in ts):
                    if time.monotonic() > deadline:
                        break  # the test then finds no aborted rows, and says so
                    threading.Event().wait(0.1)
            raise ValueError("row 1950 cannot be made on a first attempt")
        return f"{number}:" + "." * 1000

    df = spark.range(0, 2000, 1, 2).select(padded("id").alias("value"), (col("id") % 2).cast("int").alias("partition"))
    df.write.format("josef").mode("append").option("kafka.bootstrap.servers", bootstrap).option("topic", sink).save()
    spark.stop()


def padded(stall_at: int) -> Any:
    """A UDF making a value of 1 KB from a number, whose first attempt stops at ``stall_at`` until it is killed."""

    @udf(StringType())
    def value(number: int) -> str:
        if number == stall_at and TaskContext.get().attemptNumber() == 0:
            threading.Event().wait(600)  # until the driver is killed (the test gives up well before)
        return f"{number}:" + "." * 1000

    return value


def named_batch(bootstrap: str, sink: str, write_id: str, runs: str) -> None:
    spark = session("local[2]", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})
    for run in runs.split(","):
        missing = 3999 if run == "fail" else -1
        df = spark.range(0, 4000, 1, 4).select(expr(f"IF(id = {missing}, NULL, '{sink}')").alias("topic"),
                                               padded(3500 if run == "stall" else -1)("id").alias("value"),
                                               (col("id") % 2).cast("int").alias("partition"))
        try:
            df.write.format("josef").mode("append").option("kafka.bootstrap.servers", bootstrap) \
                .option("writeId", write_id).save()
        except Exception as exc:
            if run != "fail":
                raise
            print("FAILED", exc, flush=True)
        else:
            print("WRITTEN", flush=True)
    spark.stop()

if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"stream": stream, "stalled-stream": stalled_stream, "failing-batch": failing_batch,
     "upstream-failing-batch": upstream_failing_batch, "named-batch": named_batch}[command](*args)
