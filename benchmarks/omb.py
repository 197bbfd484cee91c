"""OpenMessaging-Benchmark-shaped workload: end-to-end latency at a fixed produce rate.

    cd /work/main && uv run python benchmarks/omb.py                         # 5 MB/s, 100 partitions, 10 s
    cd /work/main && uv run python benchmarks/omb.py --rate-mb 1 --duration 5 --partitions 1
    cd /work/main && uv run python benchmarks/omb.py --sweep 1,5,10,20 --baseline --json /tmp/omb.json
    cd /work/main && uv run python benchmarks/omb.py --bootstrap 127.0.0.1:9092 --broker-pid 1234

broker.py measures how fast a broker goes flat out; OMB's workloads (and the numbers people compare
Kafka-compatible brokers with) ask something else: at a *fixed* offered rate, how long does a
record take from ``produce()`` to a consumer, and does the broker keep up? That is what this script
measures, the way OMB's ``1-topic-100-partitions-1kb`` workload does:

* one topic of ``--partitions`` partitions (default 100), ``--record-size`` B records (1024);
* a producer **process** offering ``--rate-mb`` MB/s: record ``i`` is due at ``start + i * interval``
  and the loop sleeps until the next one is due (sub-millisecond pacing, never a burst per second),
  with librdkafka at ``linger.ms=1`` and ``--acks`` (default 1), partitions round-robin or random;
* a consumer **process** (``assign()`` of every partition from offset 0, no group, librdkafka's
  default ``fetch.wait.max.ms``) that takes arrival time minus the send time the producer wrote into
  the first bytes of each value (``time.monotonic_ns``: CLOCK_MONOTONIC is one clock for every process
  of a Linux machine, so two processes can subtract their readings);
* ``--warmup`` s (2) that are not measured (connections, metadata, first batches), then
  ``--duration`` s (10) of samples: records *sent* in the window give the latencies, records sent /
  acknowledged / consumed in the window give the rates; broker CPU is read from /proc over the window.

Producer, consumer and broker are three processes, so no one's Python loop or GIL delays another's
timestamps. The producer reports when it could not keep the schedule (records still due at the
end, the largest backlog, how late records were handed to librdkafka) and how far librdkafka's queue
grew; a schedule it cannot keep means the achieved rate, not the offered one, is what was measured.
``--sweep`` runs several rates on one broker (a new topic each) and names the highest rate whose
p99 stays under ``--p99-target-ms``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import random
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback  # noqa: E402  (the sibling baseline)
from broker import (  # noqa: E402  (the sibling benchmark's broker process, client tuning and /proc helpers)
    GB,
    MB,
    BenchmarkError,
    Broker,
    consumer_config,
    cpu_seconds_of,
    machine,
    machine_busy_seconds,
    parse_kv,
    producer_config,
    progress,
    wait_for_leaders,
)
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

STAMP = struct.Struct(">qq")  # sequence number, send time (CLOCK_MONOTONIC ns): the first 16 bytes of a value
NS = 1_000_000_000
LATE_MS = 10.0  # a send delay p99 above this marks a run LATE: the producer itself could not keep time


@dataclass(frozen=True)
class Workload:
    """One rate's parameters, pickled to the producer and consumer processes."""

    bootstrap: str
    topic: str
    partitions: int
    record_size: int
    rate_mb: float
    acks: str
    partitioner: str  # "round-robin" or "random"
    warmup_s: float
    duration_s: float
    drain_s: float
    producer_config: dict[str, str]
    consumer_config: dict[str, str]

    @property
    def records_per_s(self) -> float:
        return self.rate_mb * MB / self.record_size

    @property
    def interval_ns(self) -> float:
        return NS / self.records_per_s

    @property
    def total(self) -> int:
        """Records due in warm-up + measured window: record i is due at start + i * interval < end."""
        return max(1, math.ceil((self.warmup_s + self.duration_s) * self.records_per_s))


@dataclass(frozen=True)
class Timeline:
    """Absolute CLOCK_MONOTONIC instants (ns) the parent hands both children with "go"."""

    start: int  # record 0 is due
    warm: int  # the measured window starts
    end: int  # the measured window and the schedule end
    flush_deadline: int  # the producer stops waiting for acknowledgements
    hard_deadline: int  # the consumer stops whatever it was told


def percentile(ordered: list[int], fraction: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * fraction) - 1))]


def summarize_ns(samples: list[int]) -> dict[str, Any]:
    """p50 / p99 / p99.9 / max in ms of nanosecond samples (None when there are none)."""
    if not samples:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    ordered = sorted(samples)
    return {"count": len(ordered), "p50_ms": percentile(ordered, 0.50) / 1e6,
            "p99_ms": percentile(ordered, 0.99) / 1e6, "p999_ms": percentile(ordered, 0.999) / 1e6,
            "max_ms": ordered[-1] / 1e6}


# --------------------------------------------------------------------------- child processes


def child_main(role: str, conn: Connection, w: Workload) -> None:
    """Entry point of the producer and consumer processes.

    Protocol over ``conn``: the child sends ("ready", pid) once its client has metadata for every
    partition, receives ("go", Timeline), runs, and sends ("result", dict). Any exception is sent as
    ("error", text) so the parent can report it instead of waiting for a result that never comes.
    """
    try:
        (run_producer if role == "producer" else run_consumer)(conn, w)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        try:
            conn.send(("error", f"{role} process: {exc!r}\n{traceback.format_exc()}"))
        except OSError:
            pass
    finally:
        conn.close()


def run_producer(conn: Connection, w: Workload) -> None:
    """Send ``w.total`` records on schedule, then wait for their acknowledgements.

    Each record is stamped with the time it is handed to ``produce()`` (not the time it was due),
    as OMB does; how late that was against the schedule is reported separately (send delay), so a
    producer that falls behind shows up instead of hiding in lower latencies.
    """
    now, unpack = time.monotonic_ns, STAMP.unpack_from
    acked = bytearray(w.total)  # acked[seq] = 1: the parent compares it with what the consumer saw
    publish: list[int] = []  # send -> delivery report, records sent in the window
    errors: list[str] = []
    client_errors: list[str] = []
    n_errors = acked_in_window = 0
    warm = end = 0  # set from the Timeline; the callback reads them through its closure

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal n_errors, acked_in_window
        if err is not None:
            n_errors += 1
            if len(errors) < 10:
                errors.append(f"partition {msg.partition()}: {err}")
            return
        t = now()
        seq, sent = unpack(msg.value())
        acked[seq] = 1
        if warm <= sent < end:
            publish.append(t - sent)
        if warm <= t < end:
            acked_in_window += 1

    def on_error(err: Any) -> None:
        if len(client_errors) < 10:
            client_errors.append(str(err))

    settings = producer_config(w.bootstrap, {"linger.ms": "1", "acks": w.acks, **w.producer_config})
    producer = Producer({**settings, "on_delivery": on_delivery, "error_cb": on_error})
    wait_for_leaders(producer, w.topic, w.partitions, timeout=60)
    conn.send(("ready", os.getpid()))
    kind, tl = conn.recv()
    assert kind == "go", kind
    warm, end = tl.warm, tl.end

    push, topic, size = producer.produce, w.topic, w.record_size
    padding = os.urandom(max(0, size - STAMP.size))
    parts = w.partitions
    pick = (lambda seq: seq % parts) if w.partitioner == "round-robin" else (lambda seq: random.randrange(parts))
    interval, total, start = w.interval_ns, w.total, tl.start
    delays: list[int] = []  # handed to produce() minus due, records sent in the window
    seq = sent_in_window = buffer_full = max_backlog = max_queue = 0

    # Delivery reports are served by their own thread, blocked in poll() (which returns as soon as it
    # has served one), so an acknowledgement is timestamped when librdkafka hands it over, not when
    # the paced loop next wakes up (up to one send interval later: 1 ms at 1 MB/s).
    serving = threading.Event()
    serving.set()

    def serve() -> None:
        while serving.is_set():
            producer.poll(0.05)

    server = threading.Thread(target=serve, name="delivery-reports", daemon=True)
    server.start()
    time.sleep(max(0, start - now()) / NS)
    while (t := now()) < end:
        due = min(total, int((t - start) / interval) + 1)
        max_backlog = max(max_backlog, due - seq)
        while seq < due:
            t = now()
            try:
                push(topic, STAMP.pack(seq, t) + padding, partition=pick(seq))
            except BufferError:  # librdkafka's queue is full: the schedule slips, which is reported
                buffer_full += 1
                time.sleep(0.001)
                continue
            if t >= warm:
                sent_in_window += 1
                delays.append(t - (start + int(seq * interval)))
            seq += 1
        max_queue = max(max_queue, len(producer))
        # sleep until the next record is due (sub-millisecond: time.sleep, not a 1 ms poll tick)
        wait = min(end, start + int(seq * interval) if seq < total else end) - now()
        if wait > 0:
            time.sleep(wait / NS)
    queue_at_end = len(producer)
    while len(producer) and now() < tl.flush_deadline:
        time.sleep(0.01)
    serving.clear()
    server.join()
    producer.flush(0)
    conn.send(("result", {
        "scheduled": total, "sent": seq, "not_sent": total - seq, "sent_in_window": sent_in_window,
        "acked": acked.count(1), "acked_in_window": acked_in_window, "delivery_errors": n_errors,
        "delivery_error_samples": errors, "client_errors": client_errors, "unacked_after_drain": len(producer),
        "max_backlog": max_backlog, "max_queue": max_queue, "queue_at_window_end": queue_at_end,
        "buffer_full": buffer_full, "publish": summarize_ns(publish), "send_delay": summarize_ns(delays),
        "acked_map": bytes(acked), "config": {k: str(v) for k, v in settings.items()},
    }))


def run_consumer(conn: Connection, w: Workload) -> None:
    """Read every partition from offset 0 and take arrival - send time of each record.

    ``consume(n, timeout)`` waits for n records, which would add its wait to every sample, so the loop
    waits for one record with ``poll`` and then takes only what is already queued. It stops when the
    parent says how many records were sent and all of them arrived, when everything acknowledged
    arrived and nothing new came for 2 s (records that failed delivery may never come), or at the
    deadline the parent set; the parent counts what is missing.
    """
    now, unpack = time.monotonic_ns, STAMP.unpack_from
    client_errors: list[str] = []

    def on_error(err: Any) -> None:
        if len(client_errors) < 10:
            client_errors.append(str(err))

    consumer = Consumer({**consumer_config(w.bootstrap, w.consumer_config), "error_cb": on_error})
    wait_for_leaders(consumer, w.topic, w.partitions, timeout=60)
    consumer.assign([TopicPartition(w.topic, p, 0) for p in range(w.partitions)])
    conn.send(("ready", os.getpid()))
    kind, tl = conn.recv()
    assert kind == "go", kind
    warm, end = tl.warm, tl.end

    seen = bytearray(w.total)
    latencies: list[int] = []
    unique = duplicates = received_in_window = n_errors = 0
    error_samples: list[str] = []
    expect_sent = expect_acked = -1
    drain_deadline = tl.hard_deadline
    last_new = now()
    next_check = 0
    poll, pull = consumer.poll, consumer.consume
    try:
        while True:
            first = poll(0.05)
            t = now()
            if first is not None:
                batch = [first, *pull(10_000, 0)]
                t = now()
                before = unique
                for msg in batch:
                    if msg.error() is not None:
                        n_errors += 1
                        if len(error_samples) < 10:
                            error_samples.append(str(msg.error()))
                        continue
                    seq, sent = unpack(msg.value())
                    if seen[seq]:
                        duplicates += 1
                        continue
                    seen[seq] = 1
                    unique += 1
                    if warm <= sent < end:
                        latencies.append(t - sent)
                if unique > before:
                    last_new = t
                    if warm <= t < end:
                        received_in_window += unique - before
            if t >= next_check:
                next_check = t + 50_000_000
                while conn.poll():
                    _, expect_sent, expect_acked, drain_for = conn.recv()
                    drain_deadline = min(tl.hard_deadline, now() + drain_for)
                if expect_sent >= 0 and (unique >= expect_sent
                                         or (unique >= expect_acked and t - last_new > 2 * NS)
                                         or t >= drain_deadline):
                    break
                if t >= tl.hard_deadline:
                    break
    finally:
        consumer.close()
    conn.send(("result", {
        "received": unique, "received_in_window": received_in_window, "duplicates": duplicates,
        "consumer_errors": n_errors, "consumer_error_samples": error_samples, "client_errors": client_errors,
        "latency": summarize_ns(latencies), "seen_map": bytes(seen),
    }))


# --------------------------------------------------------------------------- parent


class Child:
    """A spawned producer or consumer process and the parent's end of its pipe."""

    def __init__(self, role: str, w: Workload) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of the broker's log thread or librdkafka state
        self.role = role
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(role, child_end, w), name=f"omb-{role}", daemon=True)
        self.proc.start()
        child_end.close()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def expect(self, kind: str, timeout: float, blame: Callable[[], str]) -> Any:
        """The next message, which must be ``kind``; a child error or death becomes a BenchmarkError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.conn.poll(0.2):
                try:
                    got, payload = self.conn.recv()
                except EOFError:
                    self.proc.join(5)
                    raise BenchmarkError(f"{self.role} process closed its pipe (exit code {self.proc.exitcode}) "
                                         f"without a {kind!r} message{blame()}") from None
                if got == "error":
                    raise BenchmarkError(f"{payload}{blame()}")
                if got != kind:
                    raise BenchmarkError(f"{self.role} process sent {got!r}, expected {kind!r}")
                return payload
            if not self.proc.is_alive() and not self.conn.poll(0):
                raise BenchmarkError(f"{self.role} process exited (code {self.proc.exitcode}) "
                                     f"without a {kind!r} message{blame()}")
        raise BenchmarkError(f"no {kind!r} from the {self.role} process within {timeout:.0f} s{blame()}")

    def stop(self, grace: float) -> None:
        """Join the child; kill it (this Process object only) if it does not end within ``grace`` s."""
        self.proc.join(grace)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


@dataclass
class Target:
    """Where the load goes and whose CPU to read: our own Broker, or --bootstrap with optional --broker-pid."""

    bootstrap: str
    broker: Broker | None
    pids: list[int]

    def cpu_seconds(self) -> float | None:
        if self.broker is not None:
            return self.broker.cpu_seconds()
        return cpu_seconds_of(self.pids) if self.pids else None

    def blame(self) -> str:
        return f"\n--- last broker log lines ---\n{self.broker.tail(30)}" if self.broker is not None else ""


def create_topic(bootstrap: str, topic: str, partitions: int, replication: int) -> None:
    """CreateTopics through the AdminClient, then wait until every partition has a leader.

    A metadata request comes first so that a wrong --bootstrap fails in seconds with the reason,
    not after CreateTopics' request timeout.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise BenchmarkError(f"cannot reach {bootstrap}: {exc}") from exc
    futures = admin.create_topics([NewTopic(topic, partitions, replication)], operation_timeout=60,
                                  request_timeout=70)
    try:
        futures[topic].result(timeout=90)
    except KafkaException as exc:
        raise BenchmarkError(f"CreateTopics {topic} ({partitions} partitions, RF {replication}) failed: {exc}") from exc
    wait_for_leaders(admin, topic, partitions, timeout=60)


def sleep_until(instant_ns: int) -> None:
    time.sleep(max(0, instant_ns - time.monotonic_ns()) / NS)


def run_rate(w: Workload, target: Target) -> dict[str, Any]:
    """One rate: start consumer and producer processes, run the schedule, gather both sides' figures."""
    blame = target.blame
    children = [Child("consumer", w), Child("producer", w)]  # started together: their imports overlap
    consumer, producer = children
    ok = False
    try:
        for child in children:
            child.expect("ready", 90, blame)
        t0 = time.monotonic_ns() + 200_000_000
        warm = t0 + round(w.warmup_s * NS)
        end = warm + round(w.duration_s * NS)
        drain = round(w.drain_s * NS)
        tl = Timeline(start=t0, warm=warm, end=end, flush_deadline=end + drain, hard_deadline=end + 2 * drain + 10 * NS)
        for child in children:
            child.conn.send(("go", tl))
        progress(f"  {w.topic}: {w.warmup_s:g} s warm-up, then {w.duration_s:g} s measured")

        sleep_until(warm)
        cpu0 = (target.cpu_seconds(), cpu_seconds_of([producer.pid]), cpu_seconds_of([consumer.pid]),
                machine_busy_seconds(), time.monotonic_ns())
        sleep_until(end)
        cpu1 = (target.cpu_seconds(), cpu_seconds_of([producer.pid]), cpu_seconds_of([consumer.pid]),
                machine_busy_seconds(), time.monotonic_ns())

        prod = producer.expect("result", w.drain_s + 60, blame)
        try:
            consumer.conn.send(("expect", prod["sent"], prod["acked"], drain))
        except OSError:  # the consumer already stopped at its own deadline: its result is in the pipe
            pass
        cons = consumer.expect("result", 2 * w.drain_s + 60, blame)
        ok = True
    finally:  # after a failure the other child may be waiting for a message that will not come
        for child in children:
            child.stop(10 if ok else 1)
    return figures(w, prod, cons, cpu0, cpu1)


def figures(w: Workload, prod: dict[str, Any], cons: dict[str, Any], cpu0: tuple[Any, ...],
            cpu1: tuple[Any, ...]) -> dict[str, Any]:
    """Rates over the measured window, what is missing, and CPU per GB from the two /proc samples."""
    acked_map, seen_map = prod.pop("acked_map"), cons.pop("seen_map")
    acked_bits, seen_bits = int.from_bytes(acked_map, "big"), int.from_bytes(seen_map, "big")
    missing_acked = (acked_bits & ~seen_bits).bit_count()  # each byte is 0 or 1: one bit per record
    window_s = (cpu1[4] - cpu0[4]) / NS
    size = w.record_size
    produced_bytes = prod["sent_in_window"] * size
    broker_cpu = None if cpu0[0] is None or cpu1[0] is None else cpu1[0] - cpu0[0]
    if broker_cpu is not None and broker_cpu < 0:  # the broker process ended during the window
        broker_cpu = None
    producer_cpu, consumer_cpu = cpu1[1] - cpu0[1], cpu1[2] - cpu0[2]
    busy = cpu1[3] - cpu0[3]
    other = max(0.0, busy - (broker_cpu or 0.0) - producer_cpu - consumer_cpu)
    out: dict[str, Any] = {
        "topic": w.topic, "partitions": w.partitions, "record_bytes": size, "acks": w.acks,
        "partitioner": w.partitioner, "warmup_s": w.warmup_s, "duration_s": w.duration_s,
        "offered_mb_per_s": w.rate_mb, "offered_records_per_s": w.records_per_s,
        "produced_mb_per_s": produced_bytes / w.duration_s / MB,
        "produced_records_per_s": prod["sent_in_window"] / w.duration_s,
        "acked_mb_per_s": prod["acked_in_window"] * size / w.duration_s / MB,
        "consumed_mb_per_s": cons["received_in_window"] * size / w.duration_s / MB,
        "consumed_records_per_s": cons["received_in_window"] / w.duration_s,
        "end_to_end": cons["latency"], "publish": prod["publish"], "send_delay": prod["send_delay"],
        "missing": prod["sent"] - cons["received"], "missing_acked": missing_acked,
        "window_s": window_s,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_util": None if broker_cpu is None else broker_cpu / window_s,
        "broker_cpu_s_per_gb": None if broker_cpu is None or not produced_bytes else broker_cpu / (produced_bytes / GB),
        "producer_cpu_util": producer_cpu / window_s, "consumer_cpu_util": consumer_cpu / window_s,
        "other_cpu_util": other / window_s,
        "producer": prod, "consumer": cons,
    }
    problems = []
    if prod["delivery_errors"]:
        problems.append(f"{prod['delivery_errors']} delivery errors, first: {prod['delivery_error_samples'][:3]}")
    if out["missing"] > 0:
        problems.append(f"{out['missing']:,} of {prod['sent']:,} records sent never reached the consumer "
                        f"({missing_acked:,} of them acknowledged)")
    elif missing_acked:
        problems.append(f"{missing_acked:,} acknowledged records never reached the consumer")
    if prod["unacked_after_drain"]:
        problems.append(f"{prod['unacked_after_drain']:,} records still unacknowledged {w.drain_s:g} s after the window")
    if cons["duplicates"]:
        problems.append(f"{cons['duplicates']:,} records consumed twice")
    if cons["consumer_errors"]:
        problems.append(f"{cons['consumer_errors']} consumer errors, first: {cons['consumer_error_samples'][:3]}")
    out["problems"] = problems
    out["failed"] = bool(prod["delivery_errors"] or out["missing"] > 0 or missing_acked)
    # "behind": records still due when the schedule ended (the producer could not keep the rate);
    # "late": the rate was kept but 1% of the records were handed over more than 10 ms after they were
    # due (the producer process was starved of CPU), so the latencies miss some of the queueing
    delay_p99 = prod["send_delay"]["p99_ms"]
    out["behind"] = prod["not_sent"] > 0
    out["late"] = delay_p99 is not None and delay_p99 > LATE_MS
    return out


def qualifies(run: dict[str, Any], p99_target_ms: float) -> bool:
    """A rate the broker sustained: kept the schedule, consumed what it was offered, p99 under target."""
    p99 = run["end_to_end"]["p99_ms"]
    return (not run["failed"] and not run["behind"] and not run["late"] and p99 is not None and p99 < p99_target_ms
            and run["consumed_mb_per_s"] >= 0.95 * run["offered_mb_per_s"])


# --------------------------------------------------------------------------- report


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_report(a: argparse.Namespace, info: dict[str, Any], runs: list[dict[str, Any]],
                 baseline: dict[str, Any] | None, best: float | None, problems: list[str]) -> None:
    print()
    print(f"josef OMB-style workload: 1 topic x {a.partitions} partitions, {a.record_size} B records, acks={a.acks}, "
          f"linger.ms={a.linger_label}, {a.partitioner} partitions, {a.warmup:g} s warm-up + {a.duration:g} s measured")
    print(f"machine: {info['nproc']} x {info['cpu_model']}, {info['mem_gib']} GiB, Linux {info['kernel']}, "
          f"{info['implementation']} {info['python']}; confluent-kafka {info['confluent_kafka']} "
          f"(librdkafka {info['librdkafka']})")
    print(f"broker: {a.target_label}; producer, consumer and broker are separate processes on this machine")
    if baseline:
        print(f"loopback baseline: {baseline['mb_per_s']:,.0f} MB/s (TCP 127.0.0.1, {baseline['bytes'] / MB:,.0f} MB "
              f"in {baseline['chunk']:,} B writes, same run)")
    print("MB = 10^6 B of record values; latencies in ms; rates over the measured window")
    print()
    headers = ["offered", "produced", "acked", "consumed", "not sent", "max queue", "e2e p50", "p99", "p99.9",
               "max", "publish p50", "p99", "broker CPU", "CPU s/GB"]
    if baseline:
        headers.append("of loopback")
    headers.append("status")
    rows = []
    for r in runs:
        e, p = r["end_to_end"], r["publish"]
        status = "FAILED" if r["failed"] else "BEHIND" if r["behind"] else "LATE" if r["late"] else "ok"
        row = [f"{r['offered_mb_per_s']:g} MB/s", f"{r['produced_mb_per_s']:.2f}", f"{r['acked_mb_per_s']:.2f}",
               f"{r['consumed_mb_per_s']:.2f}", f"{r['producer']['not_sent']:,}", f"{r['producer']['max_queue']:,}",
               fmt(e["p50_ms"]), fmt(e["p99_ms"]), fmt(e["p999_ms"]), fmt(e["max_ms"]),
               fmt(p["p50_ms"]), fmt(p["p99_ms"]),
               "-" if r["broker_cpu_util"] is None else f"{r['broker_cpu_util']:.0%}", fmt(r["broker_cpu_s_per_gb"])]
        if baseline:
            row.append(f"{r['produced_mb_per_s'] / baseline['mb_per_s']:.3%}")
        row.append(status)
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(f"{{:>{w}}}" if i < len(widths) - 1 else f"{{:<{w}}}" for i, w in enumerate(widths))
    if rows:
        print(line.format(*headers).rstrip())
        print("  ".join("-" * w for w in widths))
        for row in rows:
            print(line.format(*row).rstrip())
    else:
        print("(no rate completed)")
    print()
    for r in runs:
        pr, e, d = r["producer"], r["end_to_end"], r["send_delay"]
        print(f"{r['offered_mb_per_s']:g} MB/s ({r['offered_records_per_s']:,.0f} rec/s offered): produced "
              f"{r['produced_records_per_s']:,.0f} rec/s, consumed {r['consumed_records_per_s']:,.0f} rec/s; "
              f"{e['count']:,} latency samples")
        print(f"    schedule: {pr['not_sent']:,} of {pr['scheduled']:,} records not sent by the end, largest backlog "
              f"{pr['max_backlog']:,}, send delay p99 {fmt(d['p99_ms'], '.2f')} ms max {fmt(d['max_ms'], '.1f')} ms; "
              f"librdkafka queue max {pr['max_queue']:,} records ({pr['queue_at_window_end']:,} at window end)")
        cpu = "-" if r["broker_cpu_util"] is None else f"{r['broker_cpu_util']:.0%}"
        print(f"    CPU over the window: broker {cpu}, producer {r['producer_cpu_util']:.0%}, consumer "
              f"{r['consumer_cpu_util']:.0%}, other {r['other_cpu_util']:.0%} of a core; publish p99.9 "
              f"{fmt(r['publish']['p999_ms'])} max {fmt(r['publish']['max_ms'])} ms")
        for problem in r["problems"]:
            print(f"    ! {problem}")
    if len(runs) > 1 or a.sweep:
        print()
        if best is None:
            print(f"highest rate with p99 under {a.p99_target_ms:g} ms: none of {', '.join(f'{r:g}' for r in a.rates)} MB/s")
        else:
            print(f"highest rate with p99 under {a.p99_target_ms:g} ms (and on schedule, nothing missing): {best:g} MB/s")
    noisy = [f"{r['offered_mb_per_s']:g} MB/s: {r['other_cpu_util']:.0%}" for r in runs if r["other_cpu_util"] > 0.15]
    if noisy:
        print(f"\nWARNING: other processes used CPU during the window ({'; '.join(noisy)} of a core, out of "
              f"{os.cpu_count()}): latencies are pessimistic; rerun on a quiet machine.")
    if problems:
        print("\nproblems:")
        for p in problems:
            print(f"  - {p}")
    print()


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--sweep expects comma-separated MB/s, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"--sweep expects positive rates, got {text!r}")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100, help="partitions of the topic (default 100)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record value (default 1024, >= 16)")
    parser.add_argument("--rate-mb", type=float, default=5.0, help="offered MB/s (10^6 B of values; default 5)")
    parser.add_argument("--sweep", metavar="R1,R2,...", help="run these MB/s rates in turn (new topic each), "
                        "instead of --rate-mb")
    parser.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"], help="producer acks (default 1)")
    parser.add_argument("--partitioner", default="round-robin", choices=["round-robin", "random"],
                        help="how records are spread over the partitions (default round-robin)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before the window, not measured (default 2)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds after the window for acknowledgements, and again for the consumer (default 30)")
    parser.add_argument("--p99-target-ms", type=float, default=10.0,
                        help="the sweep reports the highest rate with p99 under this (default 10)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="use this running broker/cluster instead of starting one")
    parser.add_argument("--broker-pid", type=int, action="append", default=[],
                        help="with --bootstrap: PID(s) of local broker processes whose CPU to measure (repeatable)")
    parser.add_argument("--replication-factor", type=int, default=1, help="of the topic (default 1)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="broker --override for the broker this script starts (repeatable)")
    parser.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka producer setting (repeatable)")
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka consumer setting (repeatable)")
    parser.add_argument("--baseline", action="store_true",
                        help="first measure raw TCP loopback (loopback.py) and report rates as a fraction of it")
    parser.add_argument("--baseline-bytes", type=float, default=1e9, help="bytes the loopback baseline moves (1e9)")
    parser.add_argument("--start-timeout", type=float, default=60, help="seconds allowed for the broker to be ready")
    parser.add_argument("--broker-log", metavar="FILE", help="append the broker's full output to FILE")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)
    if a.record_size < STAMP.size:
        parser.error(f"--record-size must be at least {STAMP.size} (sequence number and send time)")
    if a.partitions < 1 or a.duration <= 0 or a.warmup < 0 or a.rate_mb <= 0:
        parser.error("need --partitions >= 1, --duration > 0, --warmup >= 0, --rate-mb > 0")
    if a.broker_pid and not a.bootstrap:
        parser.error("--broker-pid goes with --bootstrap (the broker this script starts is measured anyway)")
    a.rates = parse_rates(a.sweep) if a.sweep else [a.rate_mb]
    overrides = parse_kv(a.override)
    a.producer_config = parse_kv(a.producer_config)
    a.consumer_config = parse_kv(a.consumer_config)
    a.linger_label = a.producer_config.get("linger.ms", "1")
    info = machine()
    progress(f"machine: {info['nproc']} x {info['cpu_model']}, Python {info['python']}")

    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    baseline: dict[str, Any] | None = None
    failed: str | None = None
    a.target_label = a.bootstrap or "fresh default broker started by this script"
    broker: Broker | None = None
    try:
        if a.baseline:
            progress(f"loopback baseline: {a.baseline_bytes / MB:,.0f} MB over TCP 127.0.0.1")
            try:
                baseline = loopback.measure(int(a.baseline_bytes))
            except (OSError, RuntimeError) as exc:
                raise BenchmarkError(f"loopback baseline failed: {exc}") from exc
            progress(f"  {baseline['mb_per_s']:,.0f} MB/s")
        broker = None if a.bootstrap else Broker(overrides, a.start_timeout, a.broker_log)
        with broker if broker is not None else contextlib.nullcontext():
            if broker is not None:
                target = Target(broker.bootstrap, broker, [])
                a.target_label = f"josef pid {broker.pid} on {broker.bootstrap} (ready in {broker.startup_s:.2f} s)"
            else:
                target = Target(a.bootstrap, None, a.broker_pid)
            for i, rate in enumerate(a.rates):
                topic = f"omb-{os.getpid()}-{i}-{rate:g}mbps".replace(".", "p")
                progress(f"rate {rate:g} MB/s: topic {topic}, {a.partitions} partitions")
                create_topic(target.bootstrap, topic, a.partitions, a.replication_factor)
                w = Workload(bootstrap=target.bootstrap, topic=topic, partitions=a.partitions,
                             record_size=a.record_size, rate_mb=rate, acks=a.acks, partitioner=a.partitioner,
                             warmup_s=a.warmup, duration_s=a.duration, drain_s=a.drain_timeout,
                             producer_config=a.producer_config, consumer_config=a.consumer_config)
                run = run_rate(w, target)
                runs.append(run)
                e = run["end_to_end"]
                progress(f"  produced {run['produced_mb_per_s']:.2f} MB/s, consumed {run['consumed_mb_per_s']:.2f} MB/s, "
                         f"e2e p50 {fmt(e['p50_ms'])} p99 {fmt(e['p99_ms'])} max {fmt(e['max_ms'])} ms"
                         + (f"; {'; '.join(run['problems'])}" if run["problems"] else ""))
    except BenchmarkError as exc:
        failed = str(exc)
    except KeyboardInterrupt:
        failed = "interrupted"
    if broker is not None and broker.stop_problem:
        problems.append(f"broker {broker.stop_problem}")

    sustained = [r["offered_mb_per_s"] for r in runs if qualifies(r, a.p99_target_ms)]
    best = max(sustained) if sustained else None
    print_report(a, info, runs, baseline, best, problems)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "parameters": {"partitions": a.partitions, "record_size": a.record_size, "rates_mb_per_s": a.rates,
                                      "acks": a.acks, "partitioner": a.partitioner, "warmup_s": a.warmup,
                                      "duration_s": a.duration, "drain_timeout_s": a.drain_timeout,
                                      "replication_factor": a.replication_factor, "bootstrap": a.bootstrap,
                                      "broker": a.target_label, "broker_overrides": overrides,
                                      "producer_config": a.producer_config, "consumer_config": a.consumer_config,
                                      "p99_target_ms": a.p99_target_ms, "clock": "CLOCK_MONOTONIC (time.monotonic_ns)"},
                       "loopback": baseline,
                       "runs": [{**r, "loopback_fraction": (r["produced_mb_per_s"] / baseline["mb_per_s"]
                                                            if baseline else None)} for r in runs],
                       "highest_rate_p99_under_target_mb_per_s": best,
                       "problems": problems, "failed": failed}, f, indent=2, default=str)
    failures = [f"{r['offered_mb_per_s']:g} MB/s" for r in runs if r["failed"]]
    if failed or failures:
        print(f"BENCHMARK FAILED: {failed or 'records missing or delivery errors at ' + ', '.join(failures)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
