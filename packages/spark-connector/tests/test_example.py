"""The example pipeline in examples/spark_pipeline, end to end against a real broker.

Its three scripts run in this process, in the shared Spark session: produce
events, aggregate them with the streaming job (Trigger.AvailableNow, so it
ends by itself), load the aggregates into a table with the batch job. The
table must hold exactly the windows the watermark has finalized, with the
counts and sums computed here in plain Python from the produced events.
"""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "spark_pipeline"
sys.path.insert(0, str(EXAMPLE))

import batch_job  # noqa: E402
import produce_events  # noqa: E402
import streaming_job  # noqa: E402
from pipeline import AGGREGATES_TOPIC, WATERMARK_DELAY_SECONDS, WINDOW_SECONDS  # noqa: E402

START = "2026-01-05T09:00:00Z"
MINUTES = 10


def finalized_windows(events):
    """{(window start ms, window end ms, action): (events, total amount)} of the windows the watermark has passed.

    The watermark is the newest event time minus the delay; a window is final
    once its end is at or before it. No event is late enough to be dropped
    (the producer guarantees it), so every event of a final window counts.
    """
    times = [round(dt.datetime.fromisoformat(e["event_time"]).timestamp() * 1000) for e in events]
    watermark = max(times) - WATERMARK_DELAY_SECONDS * 1000
    width = WINDOW_SECONDS * 1000
    windows = {}
    for event, time in zip(events, times):
        start = time - time % width
        if start + width <= watermark:
            key = (start, start + width, event["action"])
            count, total = windows.get(key, (0, Decimal(0)))
            windows[key] = (count + 1, total + Decimal(str(event["amount"])))
    return windows


def table_rows(spark):
    rows = spark.table(batch_job.TABLE).selectExpr(
        "unix_millis(window_start) AS start", "unix_millis(window_end) AS end", "action", "events",
        "total_amount").collect()
    return {(r.start, r.end, r.action): (r.events, r.total_amount) for r in rows}


def aggregate_records(spark, broker):
    """How many records the streaming job wrote: counted apart from the table, where duplicates would be dropped."""
    return (spark.read.format("josef").option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("subscribe", AGGREGATES_TOPIC).load().count())


def test_pipeline_aggregates_exactly_the_finalized_windows(spark, josef_broker, tmp_path):
    servers = ["--bootstrap-server", josef_broker.bootstrap_servers]
    produce_args = [*servers, "--minutes", str(MINUTES)]
    stream_args = [*servers, "--available-now", "--checkpoint", str(tmp_path / "checkpoint"),
                   "--max-offsets-per-trigger", "100"]  # several micro-batches: the watermark moves between them
    load_args = [*servers, "--warehouse", str(tmp_path / "warehouse")]

    assert produce_events.main([*produce_args, "--count", "300", "--seed", "7", "--start", START]) == 0
    first = produce_events.generate_events(300, 7, produce_events.iso_time(START), MINUTES)
    assert any(b["event_time"] < a["event_time"] for a, b in zip(first, first[1:])), "no out-of-order events"
    assert streaming_job.main(stream_args) == 0
    assert batch_job.main(load_args) == 0
    expected = finalized_windows(first)
    assert expected and table_rows(spark) == expected
    assert aggregate_records(spark, josef_broker) == len(expected)

    # Ten minutes later: the job resumes from its checkpoint and finalizes the windows it held open, once.
    later = "2026-01-05T09:10:00Z"
    assert produce_events.main([*produce_args, "--count", "200", "--seed", "8", "--start", later]) == 0
    second = produce_events.generate_events(200, 8, produce_events.iso_time(later), MINUTES)
    assert streaming_job.main(stream_args) == 0
    assert batch_job.main(load_args) == 0
    expected = finalized_windows(first + second)
    assert table_rows(spark) == expected
    assert aggregate_records(spark, josef_broker) == len(expected)
