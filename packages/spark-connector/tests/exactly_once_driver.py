"""A Spark driver in its own process, for tests that kill a driver or need task retries.

    python exactly_once_driver.py stream BOOTSTRAP INPUT OUTPUT CHECKPOINT (running|available-now) [MASTER]
    python exactly_once_driver.py failing-batch BOOTSTRAP OUTPUT
    python exactly_once_driver.py named-batch BOOTSTRAP OUTPUT WRITE_ID (slow|fast) RUN[,RUN...]

Once the session is up it prints ``JVM_PID <pid>``: the Spark driver's JVM,
which a test may SIGKILL (the Python process then ends with it). With
MASTER ``local-cluster[2,1,1024]`` the executors are JVMs of their own,
children of the driver's JVM, which a test may SIGKILL too.

``stream`` copies INPUT to OUTPUT through josef-spark, 2000 offsets a
micro-batch (MASTER: ``local[2]`` by default). Its producers send one
record a request, one request at a time (``kafka.batch.size=1``,
``kafka.max.in.flight.requests.per.connection=1``), so each task's
transaction stays open for a second or more with records in it, and a kill
lands in the middle of a batch. The transaction timeout is 5 minutes: only
fencing, not the coordinator's timeout, can end the transactions of a killed
driver within a test.

``failing-batch`` writes 0..1999 (Spark partition 0 has 0..999, partition 1
1000..1999) with up to three attempts per task; on its first attempt row 1950
has no topic, so that attempt fails half-way through its rows.

``named-batch`` writes 0..3999 in 4 Spark partitions (Kafka partition: the
number modulo 2) with ``writeId`` WRITE_ID, once for each RUN, each a job of
its own as a re-run is: ``ok`` prints ``WRITTEN`` when the job is done;
``fail`` gives row 3999 (the last of partition 3) no topic, so partition 3
fails half-way through its rows, the job fails, and it prints ``FAILED`` and
the error. ``slow`` sends as ``stream`` does, so a test can kill the driver
in the middle of the write.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import TaskContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.functions import udf  # noqa: E402
from pyspark.sql.types import StringType  # noqa: E402

from josef_spark import JosefDataSource  # noqa: E402


def session(master: str) -> SparkSession:
    spark = (SparkSession.builder.master(master).appName("josef-spark-exactly-once")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JosefDataSource)
    print("JVM_PID", spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)
    return spark


#: The producer options that keep a task's transaction open long enough for a test to kill it mid-write.
SLOW = {"kafka.batch.size": "1", "kafka.max.in.flight.requests.per.connection": "1",
        "kafka.transaction.timeout.ms": "300000"}


def stream(bootstrap: str, source: str, sink: str, checkpoint: str, mode: str, master: str = "local[2]") -> None:
    spark = session(master)
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


def failing_batch(bootstrap: str, sink: str) -> None:
    spark = session("local[2,3]")  # up to three attempts per task

    @udf(StringType())
    def topic(number: int) -> str | None:
        return None if number == 1950 and TaskContext.get().attemptNumber() == 0 else sink

    df = spark.range(0, 2000, 1, 2).selectExpr("id", "CAST(id AS STRING) AS value", "CAST(id % 2 AS INT) AS partition")
    df.select(topic("id").alias("topic"), "value", "partition").write.format("josef").mode("append") \
        .option("kafka.bootstrap.servers", bootstrap).save()
    spark.stop()


def named_batch(bootstrap: str, sink: str, write_id: str, speed: str, runs: str) -> None:
    spark = session("local[2]")
    for run in runs.split(","):
        missing = 3999 if run == "fail" else -1
        df = spark.range(0, 4000, 1, 4).selectExpr(f"IF(id = {missing}, NULL, '{sink}') AS topic",
                                                    "CAST(id AS STRING) AS value", "CAST(id % 2 AS INT) AS partition")
        try:
            df.write.format("josef").mode("append").option("kafka.bootstrap.servers", bootstrap) \
                .option("writeId", write_id).options(**(SLOW if speed == "slow" else {})).save()
        except Exception as exc:
            if run != "fail":
                raise
            print("FAILED", exc, flush=True)
        else:
            print("WRITTEN", flush=True)
    spark.stop()

if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"stream": stream, "failing-batch": failing_batch, "named-batch": named_batch}[command](*args)
