"""Transactions benchmark: transactional produce throughput against idempotent produce, in the same run.

    cd /work/main && uv run python benchmarks/transactions.py --records 200000      # about a minute
    cd /work/main && uv run python benchmarks/transactions.py --json /tmp/txn.json --per-transaction 100

One single-node josef process (``josef.node.cluster.JosefCluster``, free ports of 127.0.0.1),
two topics of ``--partitions`` partitions, and confluent-kafka producers tuned as
benchmarks/broker.py tunes them (acks=all, as idempotence and transactions require):

* **idempotent**: ``--records`` x ``--record-size`` B with ``enable.idempotence=true``;
* **transactional**: the same records with a ``transactional.id``, in transactions of
  ``--per-transaction`` records (1,000 by default, the issue's figure): begin, produce,
  commit, so each transaction pays AddPartitionsToTxn, the partition verification,
  EndTxn, the coordinator's two ``__transaction_state`` writes and one marker per
  partition;
* then a ``read_committed`` consumer reads the transactional topic to its end and
  checks the count: the markers must leave every committed record readable.

The headline figure is transactional MB/s over idempotent MB/s. Each phase fails after
``--timeout`` s rather than hang.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from broker import MB, BenchmarkError, consumer_config, machine, producer_config, progress  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from josef.node.cluster import JosefCluster  # noqa: E402


def create(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        future.result(30)


def run_producer(bootstrap: str, topic: str, records: int, size: int, per_transaction: int | None,
                 timeout: float) -> dict[str, Any]:
    """Produce every record and wait for all acknowledgements; returns seconds, MB/s and transactions."""
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None and len(failures) < 10:
            failures.append(str(err))

    extra = {"acks": "all", "enable.idempotence": True, "on_delivery": delivered}
    if per_transaction:
        extra["transactional.id"] = f"bench-{os.getpid()}"
    producer = Producer({**producer_config(bootstrap, {}), **extra})
    value = (os.urandom(64) * (size // 64 + 1))[:size]
    if per_transaction:
        producer.init_transactions(30)
    deadline = time.monotonic() + timeout
    started = time.perf_counter()
    sent = transactions = 0
    while sent < records:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{topic}: {sent} of {records} records sent in {timeout:.0f}s")
        count = min(per_transaction or records, records - sent)
        if per_transaction:
            producer.begin_transaction()
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.01)
        sent += count
        if per_transaction:
            producer.commit_transaction(max(deadline - time.monotonic(), 1))
            transactions += 1
        else:
            producer.poll(0)
    if producer.flush(max(deadline - time.monotonic(), 1)):
        raise BenchmarkError(f"{topic}: records left unacknowledged")
    seconds = time.perf_counter() - started
    if failures:
        raise BenchmarkError(f"{topic}: deliveries failed: {failures}")
    return {"seconds": round(seconds, 3), "mb_per_s": round(records * size / MB / seconds, 1),
            "records_per_s": round(records / seconds), "transactions": transactions}


def read_committed(bootstrap: str, topic: str, partitions: int, timeout: float) -> int:
    consumer = Consumer({**consumer_config(bootstrap, {}), "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        count = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            count += sum(1 for m in consumer.consume(10000, timeout=0.5) if m.error() is None)
            if all(p.offset >= end for p, end in zip(consumer.position(tps), ends)):
                return count
        raise BenchmarkError(f"read_committed reached only {count} records of {topic} in {timeout:.0f}s")
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--per-transaction", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"machine": machine(), "records": args.records, "record_size": args.record_size,
                              "per_transaction": args.per_transaction, "partitions": args.partitions}
    with tempfile.TemporaryDirectory(prefix="josef-txn-bench-") as scratch:
        # One node: the internal topics get one replica (as `josef server start` without a file gives them).
        cluster = JosefCluster(Path(scratch), combined=1, overrides={
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "offsets.topic.replication.factor": "1"}).start()
        try:
            bootstrap = cluster.bootstrap_servers
            create(bootstrap, ["idempotent", "transactional"], args.partitions)
            progress("idempotent produce")
            result["idempotent"] = run_producer(bootstrap, "idempotent", args.records, args.record_size, None,
                                                args.timeout)
            progress("transactional produce")
            result["transactional"] = run_producer(bootstrap, "transactional", args.records, args.record_size,
                                                   args.per_transaction, args.timeout)
            progress("read_committed check")
            read = read_committed(bootstrap, "transactional", args.partitions, args.timeout)
            if read != args.records:
                raise BenchmarkError(f"read_committed saw {read} records, {args.records} were committed")
            result["read_committed_records"] = read
        finally:
            cluster.stop()
    result["ratio"] = round(result["transactional"]["mb_per_s"] / result["idempotent"]["mb_per_s"], 2)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
