"""Step 2: a Structured Streaming job from the events topic to per-minute aggregates in another topic.

It counts events and sums amounts per action in tumbling one-minute windows
of event time. With a watermark and output mode "append", a window is
written once, when it is final: when the watermark (the newest event time
seen, minus the delay) has passed the window's end. Events arriving later
than that would be dropped; the windows still open when the job stops stay
in the checkpoint and are written by a later run, once newer events arrive.

Each aggregate is a JSON value keyed by its window start and action. The
checkpoint holds the job's progress (offsets read, open windows), so the job
can stop and resume; delete it to start over from the beginning of the topic.

    python examples/spark_pipeline/streaming_job.py --available-now   # process what is there, then exit
    python examples/spark_pipeline/streaming_job.py                   # keep running (Ctrl-C stops)
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from pipeline import (
    AGGREGATES_TOPIC,
    DEFAULT_BOOTSTRAP,
    EVENT_SCHEMA,
    EVENTS_TOPIC,
    STATE_DIR,
    WATERMARK_DELAY_SECONDS,
    WINDOW_SECONDS,
    spark_session,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery


def aggregate(records: DataFrame) -> DataFrame:
    """Records in the josef source's schema to ``key``/``value`` JSON rows of finalized windows."""
    events = (records
              .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event"))
              .select("event.*")
              # A record that is not an event (not JSON, no time) would sit in a window that never closes.
              .where(F.col("event_time").isNotNull()))
    windows = (events
               .withWatermark("event_time", f"{WATERMARK_DELAY_SECONDS} seconds")
               .groupBy(F.window("event_time", f"{WINDOW_SECONDS} seconds"), "action")
               .agg(F.count("*").alias("events"), F.sum("amount").alias("total_amount")))
    window_start = F.col("window.start").alias("window_start")
    window_end = F.col("window.end").alias("window_end")
    return windows.select(
        F.to_json(F.struct(window_start, "action")).alias("key"),
        F.to_json(F.struct(window_start, window_end, "action", "events", "total_amount")).alias("value"))


def start_query(spark: SparkSession, args: argparse.Namespace) -> StreamingQuery:
    reader = (spark.readStream.format("josef")
              .option("kafka.bootstrap.servers", args.bootstrap_server)
              .option("subscribe", args.input_topic)
              .option("startingOffsets", "earliest"))
    if args.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    writer = (aggregate(reader.load()).writeStream.format("josef")
              .queryName("event-aggregates")
              .option("kafka.bootstrap.servers", args.bootstrap_server)
              .option("topic", args.output_topic)
              .option("checkpointLocation", str(args.checkpoint))
              .outputMode("append"))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger_interval)
    return writer.start()


def run_until_stopped(query: StreamingQuery) -> None:
    """Wait for the query until Ctrl-C or SIGTERM, then stop it cleanly.

    PySpark's own Ctrl-C handler cancels jobs over the py4j connection the
    waiting thread is using, which ends in a spray of tracebacks; a flag set
    by the signal and checked every second avoids that.
    """
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping.is_set() and not query.awaitTermination(1):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    query.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--input-topic", default=EVENTS_TOPIC)
    parser.add_argument("--output-topic", default=AGGREGATES_TOPIC)
    parser.add_argument("--checkpoint", type=Path, default=STATE_DIR / "checkpoint",
                        help=f"the query's checkpoint directory (default {STATE_DIR / 'checkpoint'})")
    parser.add_argument("--available-now", action="store_true",
                        help="process the events there are now, then exit (Trigger.AvailableNow)")
    parser.add_argument("--trigger-interval", default="10 seconds",
                        help="without --available-now, how often to look for new events (default 10 seconds)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None,
                        help="read at most this many events per micro-batch (default: all there are)")
    parser.add_argument("--master", default="local[2]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with spark_session("josef-streaming-job", args.master) as spark:
        query = start_query(spark, args)
        if args.available_now:
            query.awaitTermination()
        else:
            run_until_stopped(query)
        progress = query.lastProgress
        read_to = progress["sources"][0]["endOffset"] if progress else "nothing (no events yet)"
        print(f"stopped after reading {args.input_topic} up to {read_to}; "
              f"finalized windows are in {args.output_topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
