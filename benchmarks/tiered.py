"""Tiered storage: how fast a broker copies segments to remote storage, and reads from there as a share of local reads.

    cd /work/main && uv run python benchmarks/tiered.py                  # 200 MB, remote storage in a directory
    cd /work/main && uv run python benchmarks/tiered.py --s3 --mb 500    # SeaweedFS (weed mini) as the S3 endpoint
    cd /work/main && uv run python benchmarks/tiered.py --mb 20          # smoke test
    cd /work/main && .nox/spark/bin/python benchmarks/tiered.py --spark  # and Spark reads (uvx nox -s spark
                                                                         # --install-only, then confluent-kafka)

One fresh broker with tiered storage (``local-dir`` in a temporary directory, or ``s3`` on a
``weed mini`` the benchmark starts on free ports and stops by PID) gets two topics of one
partition: ``plain`` (local only) and ``tiered`` (``remote.storage.enable``, 1 MiB segments,
``local.retention.bytes`` of 10 MiB). Both get ``--mb`` of 1 KB records (librdkafka, acks=all).
Reported:

- **upload**: MB/s the broker copied, from its "copied ... to remote storage" log lines (the
  bytes of every copied segment over the time from the first copy to the last), while and
  after the records arrived;
- **read**: a librdkafka consumer reading each topic from the beginning; ``tiered`` is then
  served from remote storage except for its last 10 MiB. The ratio remote/local is the figure
  that matters (these machines are noisy; absolute MB/s say little);
- with ``--spark``, **spark**: ``count()`` of ``tiered`` on a local[2] Spark, through the broker
  and with ``remoteReads=direct`` (executors reading the segments from remote storage), both with
  minPartitions=2 so that both use the two cores; median of two warm runs each. The ratio
  direct/broker is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.testing import RawClient

sys.path.insert(0, os.path.dirname(__file__))
from broker import MB, BenchmarkError, Broker, machine, progress  # noqa: E402

RECORD = 1024
COPIED = re.compile(r"^\[(\S+ \S+)\] INFO copied \S+ offsets \d+-\d+ \((\d+) bytes\) to remote storage")
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": str(1 << 20), "local.retention.bytes": str(10 << 20)}


def produce(bootstrap: str, topic: str, records: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 262144,
                         "queue.buffering.max.kbytes": 1048576})
    value = os.urandom(RECORD)
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise BenchmarkError(f"records to {topic} were not all delivered")
    return time.perf_counter() - start


def consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    start = time.perf_counter()
    deadline = start + 600
    while seen < records:
        if time.perf_counter() > deadline:
            raise BenchmarkError(f"read {seen} of {records} records of {topic} in 600 s")
        for message in consumer.consume(10000, 1):
            if message.error() is not None:
                raise BenchmarkError(f"reading {topic}: {message.error()}")
            seen += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def local_start(bootstrap: str, topic: str) -> int:
    """ListOffsets EARLIEST_LOCAL (-4): where the broker's disk starts."""
    client = RawClient(int(bootstrap.rsplit(":", 1)[1]))
    try:
        return client.list_offset(topic, -4)
    finally:
        client.close()


def upload_rate(log: str) -> tuple[float, int]:
    """MB/s and bytes of the copies the broker logged."""
    copies = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), int(m.group(2)))
              for m in map(COPIED.match, log.splitlines()) if m]
    if len(copies) < 2:
        raise BenchmarkError(f"the broker logged {len(copies)} copies")
    seconds = (copies[-1][0] - copies[0][0]).total_seconds()
    copied = sum(size for _, size in copies[1:])  # the first copy's bytes were moved before the clock started
    return copied / MB / max(seconds, 1e-3), sum(size for _, size in copies)


def run(args: argparse.Namespace) -> dict[str, Any]:
    records = int(args.mb * MB // RECORD)
    with tempfile.TemporaryDirectory(prefix="josef-tiered-bench-") as tmp:
        seaweed = None
        if args.s3:
            from josef_storage_tiered.testing import SeaweedS3

            seaweed = SeaweedS3(Path(tmp) / "weed").start()
            settings = {f"rsm.config.{k}": v for k, v in seaweed.rsm_settings().items()}
            backend = {"remote.log.storage.manager.class.name": "s3", **settings}
        else:
            os.mkdir(os.path.join(tmp, "remote"))
            backend = {"remote.log.storage.manager.class.name": "local-dir",
                       "rsm.config.storage.root": os.path.join(tmp, "remote")}
        overrides = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "500",
                     "log.retention.check.interval.ms": "1000",
                     "rlmm.config.remote.log.metadata.topic.replication.factor": "1", **backend}
        try:
            log_file = os.path.join(tmp, "broker.log")
            with Broker(overrides, start_timeout=60, keep_log=log_file) as broker:
                admin = AdminClient({"bootstrap.servers": broker.bootstrap})
                for name, config in (("plain", {}), ("tiered", TOPIC_CONFIG)):
                    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(60)
                progress(f"producing {args.mb} MB to each topic")
                produce(broker.bootstrap, "plain", records)
                produce(broker.bootstrap, "tiered", records)
                deadline = time.monotonic() + 600
                while local_start(broker.bootstrap, "tiered") < records - 13 * MB // RECORD:  # 10 MiB kept, and segments
                    if time.monotonic() > deadline:
                        raise BenchmarkError("the tiered topic's old segments did not leave the local disk")
                    time.sleep(0.5)  # the copies run in the broker; only its ListOffsets answer shows them
                upload_mb_s, copied = upload_rate("".join(broker.all_log or []))
                progress("reading both topics from the beginning")
                local_s = consume(broker.bootstrap, "plain", records)
                remote_s = consume(broker.bootstrap, "tiered", records)
                spark = spark_reads(broker.bootstrap, backend, records) if args.spark else {}
        finally:
            if seaweed is not None:
                seaweed.stop()
    payload = records * RECORD / MB
    return {"machine": machine(), "backend": "s3 (weed mini)" if args.s3 else "local-dir", "mb": payload,
            "upload_mb_s": upload_mb_s, "copied_mb": copied / MB,
            "local_read_mb_s": payload / local_s, "remote_read_mb_s": payload / remote_s,
            "remote_to_local_read": local_s / remote_s,
            **{key: payload / seconds for key, seconds in spark.items()},
            **({"spark_direct_to_broker": spark["spark_broker_mb_s"] / spark["spark_direct_mb_s"]} if spark else {})}


def spark_reads(bootstrap: str, backend: dict[str, str], records: int, repeat: int = 2) -> dict[str, float]:
    """Seconds of Spark's count() of ``tiered`` through the broker and read directly: the median of warm runs."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from josef_spark import JosefDataSource

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JosefDataSource)
    base = (spark.read.format("josef").option("kafka.bootstrap.servers", bootstrap).option("subscribe", "tiered")
            .option("minPartitions", "2"))
    frames = {"spark_broker_mb_s": base, "spark_direct_mb_s": base.option("remoteReads", "direct").options(**backend)}
    seconds = {}
    try:
        for name, reader in frames.items():
            progress(f"spark: {name}")
            runs = []
            for _ in range(repeat + 1):
                start = time.perf_counter()
                counted = reader.load().count()
                runs.append(time.perf_counter() - start)
                if counted != records:
                    raise BenchmarkError(f"spark counted {counted} of {records} records ({name})")
            seconds[name] = statistics.median(runs[1:])
    finally:
        spark.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200, help="MB of 1 KB records per topic (default 200)")
    parser.add_argument("--s3", action="store_true", help="SeaweedFS's S3 instead of a directory")
    parser.add_argument("--spark", action="store_true", help="also Spark reads of the tiered topic (needs pyspark)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    result = run(args)
    print(f"backend {result['backend']}, {result['mb']:.0f} MB of 1 KB records per topic")
    print(f"upload: {result['upload_mb_s']:.1f} MB/s ({result['copied_mb']:.0f} MB copied)")
    print(f"read: local {result['local_read_mb_s']:.1f} MB/s, tiered (remote but the last 10 MiB) "
          f"{result['remote_read_mb_s']:.1f} MB/s: remote/local {result['remote_to_local_read']:.2f}")
    if "spark_direct_to_broker" in result:
        print(f"spark count(): through the broker {result['spark_broker_mb_s']:.1f} MB/s, remoteReads=direct "
              f"{result['spark_direct_mb_s']:.1f} MB/s: direct/broker {result['spark_direct_to_broker']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
