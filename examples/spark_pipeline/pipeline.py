"""What the steps of the pipeline share: topics, the JSON they exchange, the window, the Spark session.

The event-time rules live here because two scripts depend on them: the
streaming job waits ``WATERMARK_DELAY_SECONDS`` for late events, and the
producer keeps its late events within that delay so that none is dropped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from josef_spark import JosefDataSource

DEFAULT_BOOTSTRAP = "localhost:9092"
EVENTS_TOPIC = "events"
AGGREGATES_TOPIC = "event-aggregates"
#: Where checkpoints and tables go unless told otherwise: next to josef's default /tmp/josef-logs.
STATE_DIR = Path(tempfile.gettempdir()) / "josef-spark-pipeline"

#: Tumbling windows of one minute.
WINDOW_SECONDS = 60
#: How long the streaming job waits for late events before a window is final.
WATERMARK_DELAY_SECONDS = 120

#: One event, as produce_events.py writes it (amounts as decimals so that sums are exact).
EVENT_SCHEMA = StructType([
    StructField("user", StringType()),
    StructField("action", StringType()),
    StructField("amount", DecimalType(10, 2)),
    StructField("event_time", TimestampType()),
])

#: One finalized window, as streaming_job.py writes it and batch_job.py reads it.
AGGREGATE_SCHEMA = StructType([
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("action", StringType()),
    StructField("events", LongType()),
    StructField("total_amount", DecimalType(20, 2)),
])


@contextlib.contextmanager
def spark_session(app_name: str, master: str, warehouse: Path | None = None) -> Iterator[SparkSession]:
    """A local Spark session with the ``josef`` format registered.

    A session that is already running (a notebook's, a test's) is used as it
    is and left running; only a session started here is stopped at the end.
    """
    spark = SparkSession.getActiveSession()
    started_here = spark is None
    if started_here:
        # Spark's Python workers must import josef_spark, so they run this interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (SparkSession.builder.appName(app_name).master(master)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.sql.session.timeZone", "UTC"))  # times show as produced (UTC)
        if warehouse is not None:
            builder = builder.config("spark.sql.warehouse.dir", str(warehouse))
        spark = builder.getOrCreate()
    spark.dataSource.register(JosefDataSource)
    try:
        yield spark
    finally:
        if started_here:
            spark.stop()
