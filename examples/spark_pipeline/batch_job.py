"""Step 3: a batch job that reads the aggregates topic into a table and prints a summary.

It reads the whole topic (a batch read goes from the earliest to the latest
offset), parses each JSON value and overwrites the table
``event_aggregates``, whose files live under ``--warehouse``.

    python examples/spark_pipeline/batch_job.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline import AGGREGATE_SCHEMA, AGGREGATES_TOPIC, DEFAULT_BOOTSTRAP, STATE_DIR, spark_session
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

TABLE = "event_aggregates"


def read_aggregates(spark: SparkSession, bootstrap_servers: str, topic: str) -> DataFrame:
    """One row per window and action.

    The josef sink delivers at least once: a micro-batch replayed after a
    failure writes its windows again. Duplicates are identical, so one of
    each is kept.
    """
    records = (spark.read.format("josef")
               .option("kafka.bootstrap.servers", bootstrap_servers)
               .option("subscribe", topic)
               .load())
    return (records
            .select(F.from_json(F.col("value").cast("string"), AGGREGATE_SCHEMA).alias("aggregate"))
            .select("aggregate.*")
            .dropDuplicates(["window_start", "action"]))


def save(aggregates: DataFrame, warehouse: Path) -> None:
    """Overwrite the table, with its files in ``warehouse`` even in a session started elsewhere."""
    aggregates.write.mode("overwrite").option("path", str(warehouse / TABLE)).saveAsTable(TABLE)


def summarize(spark: SparkSession) -> None:
    """Print the table, its totals per action and its time span."""
    table = spark.table(TABLE)
    windows = table.count()
    if not windows:
        print(f"table {TABLE} is empty: no window is final yet (the watermark has not passed any window's end)")
        return
    table.orderBy("window_start", "action").show(windows, truncate=False)
    (table.groupBy("action")
     .agg(F.count("*").alias("windows"), F.sum("events").alias("events"),
          F.sum("total_amount").alias("total_amount"))
     .orderBy("action")
     .show(truncate=False))
    # As strings, so that they are shown in the session's time zone, as in the tables above.
    first, last = table.agg(F.min("window_start").cast("string"), F.max("window_end").cast("string")).first()
    print(f"table {TABLE}: {windows} window aggregates from {first} to {last}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", default=AGGREGATES_TOPIC)
    parser.add_argument("--warehouse", type=Path, default=STATE_DIR / "warehouse",
                        help=f"Spark SQL warehouse directory (default {STATE_DIR / 'warehouse'})")
    parser.add_argument("--master", default="local[2]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with spark_session("josef-batch-job", args.master, warehouse=args.warehouse) as spark:
        save(read_aggregates(spark, args.bootstrap_server, args.topic), args.warehouse)
        summarize(spark)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
