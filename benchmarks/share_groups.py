"""Share-group benchmark: consume throughput of 1, 4 and 16 share consumers on 1 and 8 partitions, beside a
consumer group of the same size on the same topics, in the same run.

    cd /work/main && uv run python benchmarks/share_groups.py                           # about two minutes
    cd /work/main && uv run python benchmarks/share_groups.py --consumers 1,4 --json /tmp/share.json

One single-node josef process (``josef.node.cluster.JosefCluster``, free ports of 127.0.0.1)
and, per partition count, a topic of ``--records`` x ``--record-size`` B produced once. Then,
per consumer count, in the benchmark process:

* **share group**: a new share group whose share partitions are initialized at offset 0
  (InitializeShareGroupState, what ``kafka-share-groups.sh --reset-offsets --to-earliest``
  does), read by that many confluent-kafka ``ShareConsumer``\\ s (implicit acknowledgement),
  each polled by its own thread until every record arrived; each record must arrive once;
* **consumer group**: a new consumer group of as many ``Consumer``\\ s (subscribe, earliest,
  auto commit), each polled by its own thread until every record arrived.

Throughput is timed from the first record to the last (the time to the first record,
joining the group, is reported apart: a few hundred ms that would otherwise dominate
short runs). The figures are records/s and MB/s, and the share group's over the
consumer group's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from broker import MB, BenchmarkError, machine, producer_config, progress  # noqa: E402
from confluent_kafka import Consumer, Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402

from josef.metadata.records import uuid_to_text  # noqa: E402
from josef.node.cluster import JosefCluster  # noqa: E402
from josef.protocol.api_keys import ApiKey  # noqa: E402
from josef.testing import RawClient  # noqa: E402


def produce(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer(producer_config(bootstrap, {}))
    value = (os.urandom(64) * (size // 64 + 1))[:size]
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(300):
        raise BenchmarkError(f"{topic}: records left unacknowledged")


def start_at_zero(port: int, group: str, topic: str, partitions: int) -> None:
    """InitializeShareGroupState at offset 0 for each share partition, at its share coordinator."""
    client = RawClient(port)
    try:
        metadata = client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                     "allow_auto_topic_creation": False,
                                                     "include_topic_authorized_operations": False})
        topic_id = uuid_to_text(metadata.topics[0].topic_id)
        for partition in range(partitions):
            deadline = time.monotonic() + 30
            while True:
                answer = client.call(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, {"group_id": group, "topics": [
                    {"topic_id": topic_id, "partitions": [{"partition": partition, "state_epoch": 1,
                                                           "start_offset": 0}]}]})
                code = answer.results[0].partitions[0].error_code
                if code == ErrorCode.none:
                    break
                if time.monotonic() > deadline:
                    raise BenchmarkError(f"initializing {group} on {topic}-{partition}: {code.name}")
                time.sleep(0.1)
    finally:
        client.close()


def read(consumers: list[Any], records: int, timeout: float, share: bool) -> dict[str, float]:
    """Each consumer polled by its own thread (as applications run them) until ``records`` arrived in all.

    Returns the seconds to the first record (joining the group), from the first record to the last (the
    throughput's), and the duplicates (by partition and offset)."""
    seen: set[tuple[int, int]] = set()
    duplicates = 0
    first: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + timeout

    def poll(consumer: Any) -> None:
        nonlocal duplicates
        while len(seen) < records and time.monotonic() < deadline:
            messages = consumer.poll(0.2) if share else consumer.consume(10000, 0.2)
            keys = [(m.partition(), m.offset()) for m in messages if m.error() is None]
            with lock:
                if keys and not first:
                    first.append(time.perf_counter())
                duplicates += sum(key in seen for key in keys)
                seen.update(keys)

    started = time.perf_counter()
    threads = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(seen) < records:
        raise BenchmarkError(f"{len(seen)} of {records} records read in {timeout:.0f}s")
    ended = time.perf_counter()
    return {"join_s": first[0] - started, "seconds": ended - first[0], "duplicates": duplicates}


def figures(run: dict[str, float], records: int, size: int) -> dict[str, Any]:
    return {"join_s": round(run["join_s"], 2), "seconds": round(run["seconds"], 2),
            "records_per_s": round(records / run["seconds"]), "mb_per_s": round(records * size / MB / run["seconds"], 1)}


def scenario(bootstrap: str, port: int, topic: str, partitions: int, count: int, records: int, size: int,
             timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {"partitions": partitions, "consumers": count}
    group = f"share-{topic}-{count}"
    start_at_zero(port, group, topic, partitions)
    shares = [ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group}) for _ in range(count)]
    try:
        for consumer in shares:
            consumer.subscribe([topic])
        share = read(shares, records, timeout, share=True)
    finally:
        for consumer in shares:
            consumer.close()
    if share["duplicates"]:
        raise BenchmarkError(f"{group}: {share['duplicates']} records delivered twice without a redelivery")
    result["share"] = figures(share, records, size)
    members = [Consumer({"bootstrap.servers": bootstrap, "group.id": f"classic-{topic}-{count}",
                         "auto.offset.reset": "earliest", "fetch.max.bytes": 50 << 20})
               for _ in range(count)]
    try:
        for consumer in members:
            consumer.subscribe([topic])
        classic = read(members, records, timeout, share=False)
    finally:
        for consumer in members:
            consumer.close()
    result["consumer_group"] = figures(classic, records, size)
    result["ratio"] = round(result["share"]["records_per_s"] / result["consumer_group"]["records_per_s"], 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", default="1,8", help="partition counts, comma-separated")
    parser.add_argument("--consumers", default="1,4,16", help="consumer counts, comma-separated")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"machine": machine(), "records": args.records, "record_size": args.record_size,
                              "runs": []}
    with tempfile.TemporaryDirectory(prefix="josef-share-bench-") as scratch:
        cluster = JosefCluster(Path(scratch), combined=1, overrides={
            "offsets.topic.replication.factor": "1", "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1", "group.initial.rebalance.delay.ms": "0"}).start()
        try:
            bootstrap = cluster.bootstrap_servers
            port = cluster.brokers[0].listener("PLAINTEXT")[1]
            for partitions in (int(p) for p in args.partitions.split(",")):
                topic = f"bench-{partitions}"
                progress(f"produce {args.records} records to {partitions} partition(s)")
                produce(bootstrap, topic, partitions, args.records, args.record_size)
                for count in (int(c) for c in args.consumers.split(",")):
                    progress(f"{count} consumer(s) on {partitions} partition(s)")
                    run = scenario(bootstrap, port, topic, partitions, count, args.records, args.record_size,
                                   args.timeout)
                    result["runs"].append(run)
                    print(f"  {partitions:>2} partition(s), {count:>2} consumer(s): share "
                          f"{run['share']['records_per_s']:>7} rec/s ({run['share']['mb_per_s']} MB/s), consumer "
                          f"group {run['consumer_group']['records_per_s']:>7} rec/s: {run['ratio']}x", flush=True)
        finally:
            cluster.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
