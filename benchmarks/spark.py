"""Spark connector throughput: rows per second read into a DataFrame, beside josef's own consumer on the same topic.

One fresh josef broker (a child process, see broker.py); a topic of
``--records`` records of ``--size`` bytes in ``--partitions`` partitions,
written by josef's producer; then, timed:

- josef's consumer reading every record (assigned partitions, no group);
- ``spark.read.format("josef")...load().count()`` on a local Spark
  (``--master``, default local[2]), once cold (Python workers start) and
  then ``--repeat`` times warm, reporting the median warm run.

Run it where pyspark and josef-spark are installed, for example the nox
session's environment (broker.py also needs confluent-kafka):

    uvx nox -s spark --install-only
    uv pip install --python .nox/spark/bin/python confluent-kafka
    .nox/spark/bin/python benchmarks/spark.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from broker import Broker  # noqa: E402  (the sibling benchmark's broker starter)


def produce(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    from josef_client import Admin, NewTopic, Producer

    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions)])
    value = b"x" * size
    with Producer(bootstrap_servers=bootstrap, acks="1", linger_ms=5, batch_size=1_000_000,
                  buffer_memory=256 * 1024 * 1024) as producer:
        for i in range(records):
            producer.send(topic, value, partition=i % partitions)
        producer.flush()


def consume(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    from josef_client import Consumer, TopicPartition

    started = time.perf_counter()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=bootstrap, max_poll_records=100_000) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = 0
        while got < records:
            got += sum(len(batch) for batch in consumer.poll(timeout_ms=5000).values())
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from josef_spark import JosefDataSource

    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}; {args.records:,} records of "
          f"{args.size} B in {args.partitions} partitions; Spark {args.master}")
    with Broker({}, start_timeout=30) as broker:
        started = time.perf_counter()
        produce(broker.bootstrap, "bench", args.records, args.size, args.partitions)
        print(f"produced in {time.perf_counter() - started:.1f}s", flush=True)
        consumer_s = consume(broker.bootstrap, "bench", args.records, args.partitions)
        print(f"josef consumer       {args.records / consumer_s:>12,.0f} rows/s ({consumer_s:.2f}s)", flush=True)
        spark = (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(JosefDataSource)
        df = spark.read.format("josef").option("kafka.bootstrap.servers", broker.bootstrap) \
            .option("subscribe", "bench").load()
        runs = []
        for _ in range(args.repeat + 1):
            started = time.perf_counter()
            assert df.count() == args.records
            runs.append(time.perf_counter() - started)
        spark.stop()
    warm = statistics.median(runs[1:])
    figures = {"consumer_rows_per_s": args.records / consumer_s, "spark_cold_rows_per_s": args.records / runs[0],
               "spark_warm_rows_per_s": args.records / warm}
    print(f"spark count(), cold  {figures['spark_cold_rows_per_s']:>12,.0f} rows/s ({runs[0]:.2f}s)")
    print(f"spark count(), warm  {figures['spark_warm_rows_per_s']:>12,.0f} rows/s (median {warm:.2f}s of "
          f"{', '.join(f'{r:.2f}' for r in runs[1:])})")
    print(f"spark warm / josef consumer: {figures['spark_warm_rows_per_s'] / figures['consumer_rows_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
