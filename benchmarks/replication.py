"""Replication benchmark: what acks=all over three replicas costs against acks=1 on one broker.

    cd /work/main && uv run python benchmarks/replication.py --scale 0.05   # quick run, tens of seconds
    cd /work/main && uv run python benchmarks/replication.py --json /tmp/replication.json
    cd /work/main && uv run python benchmarks/replication.py --rf 1        # no followers (the pipeline alone)

Three phases, each on fresh node processes started by ``josef.node.cluster.JosefCluster``
(combined broker+controller nodes, free ports of 127.0.0.1), with the confluent-kafka
producer tuned as benchmarks/broker.py tunes it:

* **single**: ``--records`` x ``--record-size`` B, acks=1, to an RF=1 topic on a one-node cluster;
* **replicated**: the same records, acks=all, to an RF=``--rf`` topic with
  min.insync.replicas=``--min-insync`` on a ``--brokers``-node cluster; the ratio replicated/single
  (MB/s) is the headline figure, goal at least 0.5;
* **latency**: on that same cluster and a topic of the same settings, a producer thread offers
  ``--rate`` MB/s of acks=all records carrying their send time, a consumer in this process reads
  them and takes now - send time (``time.monotonic_ns``: one clock, one process). After
  ``--warmup`` s it keeps ``--latency-seconds`` s of samples: p50, p99, max and the rate achieved.
  A record is visible to consumers only once the ISR has it (high watermark), so this is the
  latency of a replicated write; send-to-acknowledgement percentiles are reported beside it.

Each throughput phase first sends one probe record and fails with a message if it is not
acknowledged within ``--probe-timeout`` s (followers that do not replicate leave acks=all waiting),
and every phase fails after ``--timeout`` s rather than hang. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from broker import (  # noqa: E402  (the sibling benchmark's client tuning and helpers)
    MB,
    BenchmarkError,
    Meter,
    consumer_config,
    cpu_seconds_of,
    machine,
    parse_kv,
    produce,
    producer_config,
    progress,
    wait_for_leaders,
)
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from josef.node.cluster import JosefCluster  # noqa: E402
from josef.protocol.api_keys import ApiKey  # noqa: E402
from josef.testing import RawClient  # noqa: E402

RATIO_GOAL = 0.5
#: Record header of the latency phase: sequence number, send time (monotonic ns).
STAMP = struct.Struct(">qq")


class Nodes:
    """A started :class:`JosefCluster` as benchmarks/broker.py's ``Meter`` and ``produce`` see a broker."""

    def __init__(self, cluster: JosefCluster) -> None:
        self.cluster = cluster

    def cpu_seconds(self) -> float:
        """utime+stime of every node process."""
        return cpu_seconds_of([node.pid for node in self.cluster.nodes if node.pid is not None])

    def tail(self, lines: int = 60) -> str:
        return self.cluster.logs(max(5, lines // len(self.cluster.nodes)))


class Phase:
    """A fresh cluster of ``nodes`` combined nodes in a temporary directory; stopped by PID on exit.

    A node that does not exit 0 after SIGTERM is noted in ``problems``.
    """

    def __init__(self, nodes: int, overrides: dict[str, str], problems: list[str], name: str) -> None:
        self.nodes, self.overrides, self.problems, self.name = nodes, overrides, problems, name

    def __enter__(self) -> Nodes:
        # Write back what earlier phases left dirty in the page cache, as broker.py does: otherwise the
        # kernel throttles this phase's writes by an amount that depends on the previous one.
        os.sync()
        self.scratch = tempfile.TemporaryDirectory(prefix="josef-bench-repl-")
        self.cluster = JosefCluster(Path(self.scratch.name), combined=self.nodes, overrides=self.overrides)
        try:
            self.cluster.start()
        except RuntimeError as exc:
            self.scratch.cleanup()
            raise BenchmarkError(f"{self.name}: the cluster did not start: {exc}") from None
        progress(f"{self.name}: {self.nodes} node(s) ready, bootstrap {self.cluster.bootstrap_servers}")
        return Nodes(self.cluster)

    def __exit__(self, *exc: object) -> None:
        try:
            for node_id, status in self.cluster.stop().items():
                if status != 0:
                    self.problems.append(f"{self.name}: node {node_id} exit status {status} after SIGTERM")
        finally:
            self.scratch.cleanup()


def create_topic(cluster: JosefCluster, topic: str, partitions: int, rf: int, min_insync: int,
                 timeout: float) -> None:
    """Create the topic, then wait until every broker's own metadata has a leader and a full ISR for each partition.

    Brokers apply the metadata log at their own pace; a client that asks one that has not caught up
    yet fails its records with an unknown partition, so each broker is asked directly.
    """
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    future = admin.create_topics([NewTopic(topic, partitions, rf, config={"min.insync.replicas": str(min_insync)})],
                                 operation_timeout=timeout, request_timeout=timeout + 10)[topic]
    try:
        future.result(timeout=timeout + 20)
    except KafkaException as exc:
        raise BenchmarkError(f"CreateTopics {topic} ({partitions} partitions, RF {rf}) failed: {exc}") from exc
    deadline = time.monotonic() + timeout
    for node in cluster.brokers:
        client = RawClient(node.listener("PLAINTEXT")[1], timeout=timeout)  # type: ignore[index]
        try:
            while True:
                answer = client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                           "include_topic_authorized_operations": False})
                found = [t.partitions for t in answer.topics if t.name == topic]
                ready = [p for p in (found[0] if found else ()) if p.leader_id >= 0 and len(p.isr_nodes) >= rf]
                if len(ready) == partitions:
                    break
                if time.monotonic() > deadline:
                    raise BenchmarkError(f"{topic}: broker {node.node_id} knows {len(ready)} of {partitions} "
                                         f"partitions with a leader and {rf} in-sync replicas after {timeout}s")
                time.sleep(0.05)
        finally:
            client.close()


def probe(bootstrap: str, topic: str, partitions: int, acks: str, timeout: float, nodes: Nodes) -> None:
    """One record with ``acks``: a replication that does not complete fails here, with a message, not later.

    """
    outcome: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": False,
                         "message.timeout.ms": int(timeout * 1000)})
    wait_for_leaders(producer, topic, partitions, timeout)
    producer.produce(topic, b"probe", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(timeout + 5)
    if len(outcome) != 1 or outcome[0] is not None:  # (KafkaError == None leaves an exception set: use `is`)
        why = outcome[0] if outcome else "no answer"
        raise BenchmarkError(
            f"a probe record with acks={acks} to {topic} was not acknowledged within {timeout:.0f}s ({why}). "
            "Followers that do not fetch from the leader keep the high watermark (and acks=all) waiting: "
            "does this josef replicate partitions? (--rf 1 measures without followers.)\n"
            f"--- node logs ---\n{nodes.tail(30)}")


def throughput(bootstrap: str, topic: str, a: argparse.Namespace, acks: str, nodes: Nodes) -> dict[str, Any]:
    """broker.py's produce phase (the same producer settings) with ``acks``, after a probe record."""
    probe(bootstrap, topic, a.partitions, acks, a.probe_timeout, nodes)
    extra = {**a.producer_config, "acks": acks}
    return produce(bootstrap, topic, a.n_records, a.record_size, extra, nodes, a.timeout)


def latency(bootstrap: str, topic: str, a: argparse.Namespace, nodes: Nodes) -> dict[str, Any]:
    """Offer ``a.rate`` MB/s for ``a.warmup`` + ``a.latency_seconds`` s; end-to-end latency of the kept part.

    The producer thread sends, every tick of about 1 ms, the records due by then (so the offered rate
    does not depend on how fast acknowledgements come back); each record's value starts with its
    sequence number and send time. The consumer (this thread) reads from offset 0 of every partition
    of a topic nothing else writes to; a record arrives when the consumer hands it to this loop.
    """
    interval_ns = round(a.record_size / (a.rate * MB) * 1e9)
    warmup_n = round(a.warmup * 1e9 / interval_ns)
    total = warmup_n + max(1, round(a.latency_s * 1e9 / interval_ns))
    padding = os.urandom(max(0, a.record_size - STAMP.size))
    errors: list[str] = []
    sent_at: dict[str, int] = {}

    acked: list[int] = []  # send-to-acknowledgement ns of the measured records: where the end-to-end time goes

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            if len(errors) < 20:
                errors.append(str(err))
            return
        seq, at = STAMP.unpack_from(msg.value())
        if seq >= warmup_n:
            acked.append(time.monotonic_ns() - at)

    settings = {**producer_config(bootstrap, a.producer_config), "acks": "all"}
    producer = Producer({**settings, "on_delivery": on_delivery})
    consumer = Consumer(consumer_config(bootstrap, a.consumer_config))
    for client in (producer, consumer):
        wait_for_leaders(client, topic, a.partitions, timeout=60)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(a.partitions)])
    stop = threading.Event()

    def pace() -> None:
        push, poll, now = producer.produce, producer.poll, time.monotonic_ns
        start = now()
        seq = 0
        while seq < total and not stop.is_set():
            due = min(total, (now() - start) // interval_ns + 1)
            while seq < due:
                if seq == warmup_n:
                    sent_at["first"] = now()
                try:
                    push(topic, STAMP.pack(seq, now()) + padding)
                    seq += 1
                except BufferError:
                    poll(0.001)
            poll(0)
            time.sleep(0.001)
        sent_at["last"] = now()
        sent_at["count"] = seq
        while len(producer) and not stop.is_set():  # serve delivery reports until every record is acknowledged
            producer.flush(0.5)

    def send() -> None:
        try:
            pace()
        except Exception as exc:  # reported by the consumer loop, which would otherwise wait for the deadline
            errors.append(f"producer thread: {exc!r}")

    sender = threading.Thread(target=send, name="paced-producer", daemon=True)
    progress(f"latency: {a.rate:g} MB/s of {a.record_size} B records ({1e9 / interval_ns:,.0f} rec/s), acks=all, "
             f"{a.warmup:g} s warm-up then {a.latency_s:g} s measured")
    samples: list[int] = []
    seen = 0
    meter = Meter(nodes)
    sender.start()
    allowed = a.warmup + a.latency_s + a.timeout
    deadline = time.monotonic() + allowed
    try:
        while seen < total:
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"latency: {seen:,} of {total:,} records consumed after {allowed:.0f}s "
                    f"(producer sent {sent_at.get('count', 'not all')}, delivery errors {errors[:3]}): "
                    f"the high watermark is not advancing\n--- node logs ---\n{nodes.tail(30)}")
            # consume(n, timeout) waits for n records or the timeout, which would add its wait to every
            # sample: wait for one record, then take whatever else is already queued without waiting.
            first = consumer.poll(0.2)
            if first is None:
                continue
            batch = [first, *consumer.consume(1000, 0)]
            arrived = time.monotonic_ns()
            for msg in batch:
                if msg.error() is not None:
                    raise BenchmarkError(f"latency: consumer error {msg.error()}")
                seq, at = STAMP.unpack_from(msg.value())
                if seq >= warmup_n:
                    samples.append(arrived - at)
            seen += len(batch)
            if errors:
                raise BenchmarkError(f"latency: delivery errors: {errors[:3]}")
        sender.join(max(1.0, deadline - time.monotonic()))  # its last delivery reports
        if len(acked) != total - warmup_n:
            raise BenchmarkError(f"latency: {len(acked):,} of {total - warmup_n:,} measured records acknowledged "
                                 f"though all were consumed; errors {errors[:3]}")
    finally:
        stop.set()
        sender.join(a.timeout)
        consumer.close()
    figures = meter.stop(total * a.record_size)
    measured_s = (sent_at["last"] - sent_at["first"]) / 1e9
    kept = total - warmup_n
    ms = sorted(s / 1e6 for s in samples)
    ack_ms = sorted(s / 1e6 for s in acked)
    return {
        "offered_mb_per_s": a.rate, "record_bytes": a.record_size, "records": kept, "warmup_records": warmup_n,
        "achieved_mb_per_s": kept * a.record_size / measured_s / MB, "achieved_records_per_s": kept / measured_s,
        "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99), "max_ms": ms[-1],
        "ack_p50_ms": statistics.median(ack_ms), "ack_p99_ms": percentile(ack_ms, 0.99),
        "linger_ms": settings["linger.ms"], **figures,
    }


def percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def run(a: argparse.Namespace, results: dict[str, Any], problems: list[str]) -> None:
    """The three phases in order, filling ``results`` as they finish (a failure keeps what came before)."""
    topic = "bench-replication"
    with Phase(1, a.overrides, problems, "single") as nodes:
        bootstrap = nodes.cluster.bootstrap_servers
        create_topic(nodes.cluster, topic, a.partitions, 1, 1, timeout=60)
        progress(f"single: produce {a.n_records:,} x {a.record_size} B, acks=1, RF 1")
        results["single"] = throughput(bootstrap, topic, a, "1", nodes)
    with Phase(a.brokers, a.overrides, problems, "replicated") as nodes:
        bootstrap = nodes.cluster.bootstrap_servers
        create_topic(nodes.cluster, topic, a.partitions, a.rf, a.min_insync, timeout=60)
        progress(f"replicated: produce {a.n_records:,} x {a.record_size} B, acks=all, RF {a.rf}, "
                 f"min.insync.replicas {a.min_insync}, {a.brokers} brokers")
        results["replicated"] = throughput(bootstrap, topic, a, "all", nodes)
        results["ratio"] = results["replicated"]["mb_per_s"] / results["single"]["mb_per_s"]
        create_topic(nodes.cluster, f"{topic}-latency", a.partitions, a.rf, a.min_insync, timeout=60)
        results["latency"] = latency(bootstrap, f"{topic}-latency", a, nodes)


def print_report(a: argparse.Namespace, info: dict[str, Any], results: dict[str, Any], problems: list[str]) -> None:
    print()
    print("josef replication benchmark")
    print(f"machine: {info['nproc']} x {info['cpu_model']}, {info['mem_gib']} GiB, Linux {info['kernel']}, "
          f"{info['implementation']} {info['python']}")
    print(f"load generator: confluent-kafka {info['confluent_kafka']} (librdkafka {info['librdkafka']}), "
          f"same machine; scale {a.scale:g}; {a.partitions} partition(s)")
    print("MB = 10^6 B of record values")
    print()
    for name, title in (("single", "acks=1, RF 1, 1 broker"),
                        ("replicated", f"acks=all, RF {a.rf}, min.insync {a.min_insync}, {a.brokers} brokers")):
        if name in results:
            x = results[name]
            print(f"{title:<45} {x['mb_per_s']:8.1f} MB/s {x['records_per_s']:11,.0f} rec/s  "
                  f"({x['records']:,} in {x['seconds']:.2f} s; nodes {x['broker_cpu_util']:.0%} CPU, "
                  f"client {x['client_cpu_util']:.0%}, other {x['other_cpu_util']:.0%})")
    if "ratio" in results:
        verdict = "ok" if results["ratio"] >= RATIO_GOAL else "MISS"
        print(f"{'replicated / single':<45} {results['ratio']:8.2f}x (goal >= {RATIO_GOAL}) {verdict}")
    if "latency" in results:
        x = results["latency"]
        print(f"end-to-end latency at {x['offered_mb_per_s']:g} MB/s offered ({x['record_bytes']} B records, "
              f"acks=all, RF {a.rf}, linger.ms {x['linger_ms']}):")
        print(f"  p50 {x['p50_ms']:.1f} ms   p99 {x['p99_ms']:.1f} ms   max {x['max_ms']:.1f} ms   over "
              f"{x['records']:,} records; achieved {x['achieved_mb_per_s']:.1f} MB/s "
              f"({x['achieved_records_per_s']:,.0f} rec/s); nodes {x['broker_cpu_util']:.0%} CPU, "
              f"client {x['client_cpu_util']:.0%}, other {x['other_cpu_util']:.0%}")
        print(f"  produce acknowledgement (send to acks=all delivery report): p50 {x['ack_p50_ms']:.1f} ms   "
              f"p99 {x['ack_p99_ms']:.1f} ms")
    if problems:
        print("\nproblems observed:")
        for problem in problems:
            print(f"  - {problem}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000, help="records per throughput phase (before --scale)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record value")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies --records and the latency phase's durations (0.05: a quick run)")
    parser.add_argument("--brokers", type=int, default=3, help="nodes of the replicated cluster")
    parser.add_argument("--rf", type=int, default=3, help="replication factor of the replicated phases")
    parser.add_argument("--min-insync", type=int, default=None,
                        help="min.insync.replicas of the replicated topics (default: 2, or 1 with --rf 1)")
    parser.add_argument("--partitions", type=int, default=3,
                        help="partitions of every topic (default 3: one leader per broker of the replicated cluster)")
    parser.add_argument("--rate", type=float, default=20.0, help="MB/s offered in the latency phase")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of the latency phase not measured")
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="seconds of latency measured")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="server property for every node (repeatable)")
    parser.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka producer setting (repeatable)")
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka consumer setting (repeatable)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per phase beyond its own length")
    parser.add_argument("--probe-timeout", type=float, default=30,
                        help="seconds for the first acks=all record to be acknowledged")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)
    a.min_insync = a.min_insync if a.min_insync is not None else min(2, a.rf)
    if not 1 <= a.min_insync <= a.rf <= a.brokers:
        parser.error("need 1 <= --min-insync <= --rf <= --brokers")
    a.n_records = max(1, round(a.records * a.scale))
    a.latency_s = max(1.0, a.latency_seconds * a.scale)
    a.warmup = max(1.0, a.warmup * a.scale)
    a.overrides = parse_kv(a.override)
    a.producer_config = parse_kv(a.producer_config)
    a.consumer_config = parse_kv(a.consumer_config)
    info = machine()
    progress(f"machine: {info['nproc']} x {info['cpu_model']}, Python {info['python']}")

    results: dict[str, Any] = {}
    problems: list[str] = []
    failed: str | None = None
    try:
        run(a, results, problems)
    except BenchmarkError as exc:
        failed = str(exc)
    except KeyboardInterrupt:
        failed = "interrupted"
    print_report(a, info, results, problems)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "parameters": {"records": a.n_records, "record_size": a.record_size, "scale": a.scale,
                                      "brokers": a.brokers, "rf": a.rf, "min_insync": a.min_insync,
                                      "partitions": a.partitions, "rate_mb_per_s": a.rate, "warmup_s": a.warmup,
                                      "latency_s": a.latency_s, "overrides": a.overrides,
                                      "producer_config": a.producer_config, "consumer_config": a.consumer_config},
                       "ratio_goal": RATIO_GOAL, "results": results, "problems": problems, "failed": failed},
                      f, indent=2)
    if failed:
        print(f"BENCHMARK FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
