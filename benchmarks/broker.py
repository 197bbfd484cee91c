"""Broker benchmark for josef: startup, produce, consume, small-record produce, memory.

Every scenario runs against a fresh default broker (``python -m josef server start``
in a child process, its own temporary ``log.dirs``), with confluent-kafka in this
process as the load generator. See benchmarks/README.md for what each figure means.

    cd /work/main && uv run python benchmarks/broker.py              # full run
    cd /work/main && uv run python benchmarks/broker.py --scale 0.02 # quick run, seconds

Units: MB = 10^6 bytes, GB = 10^9 bytes, of record *values* (payload). Broker CPU
is utime+stime of the broker process (and any descendants) from /proc/PID/stat.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

try:
    import confluent_kafka
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError:  # pragma: no cover - explained to the user
    sys.exit("confluent-kafka is required: run with `cd /work/main && uv run python benchmarks/broker.py`")

READY = re.compile(r"ready on PLAINTEXT://([^:,\s]+):(\d+)")
SELF_REPORTED = re.compile(r"ready on .*process age ([0-9.]+)s")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6
GB = 1e9

# figure key -> (target label, target value, higher is better)
TARGETS = {
    "startup_s": ("ready <= 2 s", 2.0, False),
    "produce_1k_mb_s": (">= 400 MB/s", 400.0, True),
    "consume_1k_mb_s": (">= 500 MB/s", 500.0, True),
    "produce_100b_rec_s": (">= 1,000,000 rec/s", 1_000_000.0, True),
    "rss_1000_partitions_mb": ("< 250 MB", 250.0, False),
}


class BenchmarkError(RuntimeError):
    """A failed run: delivery error, short consume, broker that does not start..."""


class Server(Protocol):
    """What a phase measures and blames: one broker here, every node of a cluster in replication.py."""

    def cpu_seconds(self) -> float: ...

    def tail(self, lines: int = 60) -> str: ...


# --------------------------------------------------------------------------- broker process


class Broker:
    """``python -m josef server start`` in a child process on a free port of 127.0.0.1.

    Output (stdout+stderr) is drained by a thread so the pipe never fills; the last
    lines are kept for failure reports. Always use as a context manager: the broker
    is stopped by PID with SIGTERM (SIGKILL after a grace period) and its data
    directory removed, whatever happens.
    """

    def __init__(self, overrides: dict[str, str], start_timeout: float, keep_log: str | None = None):
        # Write back what earlier runs left dirty in the page cache: otherwise the
        # kernel throttles this run's writes (balance_dirty_pages) by an amount that
        # depends on the previous run, and produce figures swing 2x between runs.
        os.sync()
        self.data_dir = tempfile.mkdtemp(prefix="josef-bench-")
        self.overrides = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.dirs": self.data_dir,
            **overrides,
        }
        self.start_timeout = start_timeout
        self.keep_log = keep_log
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = -1
        self.log: collections.deque[str] = collections.deque(maxlen=400)
        self.all_log: list[str] | None = [] if keep_log else None
        self.spawned_at = 0.0
        self.ready_at = 0.0
        self.self_reported_s: float | None = None
        self.exit_code: int | None = None
        self.stop_problem: str | None = None

    @property
    def command(self) -> list[str]:
        args = [sys.executable, "-m", "josef", "server", "start"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        return args

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        ready = threading.Event()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.spawned_at = time.perf_counter()
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        threading.Thread(target=self._pump, args=(self.proc, ready), daemon=True).start()
        if not ready.wait(self.start_timeout) or self.port < 0:
            code = self.proc.poll()
            what = (f"broker exited with code {code} before it was ready" if code is not None
                    else f"broker did not become ready within {self.start_timeout:.0f}s")
            raise BenchmarkError(
                f"{what}\n"
                f"command: {' '.join(self.command)}\n"
                f"exit code: {self.proc.poll()}\n--- last broker log lines ---\n" + self.tail())

    def _pump(self, proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            self.log.append(line)
            if self.all_log is not None:
                self.all_log.append(line)
            if not ready.is_set():
                match = READY.search(line)
                if match:
                    self.ready_at = time.perf_counter()
                    self.port = int(match.group(2))
                    reported = SELF_REPORTED.search(line)
                    if reported:
                        self.self_reported_s = float(reported.group(1))
                    ready.set()
        ready.set()  # the process ended: let start() fail with the log

    @property
    def startup_s(self) -> float:
        return self.ready_at - self.spawned_at

    def tail(self, lines: int = 60) -> str:
        return "".join(list(self.log)[-lines:])

    def close(self) -> None:
        proc, self.proc = self.proc, None
        try:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    self.exit_code = proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.stop_problem = "did not exit within 30 s of SIGTERM; killed with SIGKILL"
                    proc.kill()
                    self.exit_code = proc.wait(timeout=30)
            elif proc is not None:
                self.exit_code = proc.returncode
                if self.port >= 0:  # an early exit before ready is already reported by start()
                    self.stop_problem = f"exited on its own before SIGTERM (code {proc.returncode})"
            if proc is not None and self.exit_code not in (0, None) and self.stop_problem is None:
                self.stop_problem = f"exit code {self.exit_code} after SIGTERM"
            if self.stop_problem:
                print(f"  ! broker pid {proc.pid if proc else '?'}: {self.stop_problem}\n"
                      f"  --- last broker log lines ---\n{self.tail(25)}", file=sys.stderr)
        finally:
            if self.keep_log and self.all_log is not None:
                with open(self.keep_log, "a", encoding="utf-8") as out:
                    out.write(f"===== {' '.join(self.command)}\n")
                    out.writelines(self.all_log)
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # ---- /proc readings: the broker process and any descendants it spawned

    def pids(self) -> list[int]:
        root = self.pid
        children: dict[int, list[int]] = collections.defaultdict(list)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    after = f.read().rsplit(b")", 1)[1].split()
                children[int(after[1])].append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return found

    def cpu_seconds(self) -> float:
        """utime+stime of the broker and its descendants, in seconds."""
        return cpu_seconds_of(self.pids())

    def rss_bytes(self) -> int:
        """VmRSS of the broker (plus descendants, if it has any)."""
        total = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status", encoding="ascii") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) * 1024
                            break
            except OSError:
                continue
        return total


def cpu_seconds_of(pids: list[int]) -> float:
    """utime+stime of these processes, in seconds (a process that is gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after "comm)": state(3) ppid(4) ... utime(14) stime(15) -> indexes 11, 12
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


# --------------------------------------------------------------------------- client helpers


def client_cpu_seconds() -> float:
    """CPU of this process (Python loop + librdkafka threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores), from the first line of /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / CLK_TCK


class Meter:
    """Wall time, broker CPU, this process's CPU and everybody else's CPU over one phase."""

    def __init__(self, broker: Server) -> None:
        self.broker = broker
        self.b0, self.c0, self.m0 = broker.cpu_seconds(), client_cpu_seconds(), machine_busy_seconds()
        self.t0 = time.perf_counter()

    def stop(self, payload_bytes: int) -> dict[str, float]:
        elapsed = time.perf_counter() - self.t0
        broker = self.broker.cpu_seconds() - self.b0
        client = client_cpu_seconds() - self.c0
        machine = machine_busy_seconds() - self.m0
        return {
            "seconds": elapsed,
            "broker_cpu_s": broker, "broker_cpu_s_per_gb": broker / (payload_bytes / GB),
            "broker_cpu_util": broker / elapsed, "client_cpu_util": client / elapsed,
            # CPU used by other processes meanwhile (other benchmarks, builds...): noise
            "other_cpu_util": max(0.0, machine - broker - client) / elapsed,
        }


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)],
                                  operation_timeout=timeout, request_timeout=timeout + 10)
    try:
        futures[topic].result(timeout=timeout + 20)
    except KafkaException as exc:
        raise BenchmarkError(f"CreateTopics {topic} ({partitions} partitions) failed: {exc}") from exc
    wait_for_leaders(admin, topic, partitions, timeout)


def wait_for_leaders(client: Any, topic: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no metadata"
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(topic, timeout=5)
            meta = md.topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                    and all(p.leader >= 0 and p.error is None for p in meta.partitions.values()):
                return
            last = f"{meta.error if meta else 'topic missing'}; {len(meta.partitions) if meta else 0} partitions"
        except KafkaException as exc:
            last = str(exc)
        time.sleep(0.1)
    raise BenchmarkError(f"topic {topic} has no leader for all {partitions} partitions after {timeout}s: {last}")


def parse_kv(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {item!r}")
        out[key.strip()] = value
    return out


def producer_config(bootstrap: str, extra: dict[str, str]) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "1",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "batch.num.messages": 1_000_000,
        "compression.type": "none",
        "enable.idempotence": False,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_097_152,  # 2 GiB of client-side queue
        **extra,
    }


def consumer_config(bootstrap: str, extra: dict[str, str]) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "josef-bench",  # librdkafka requires it; no subscribe/commit is used
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        # without these librdkafka pauses fetching for ~1 s at a time (see REFERENCE.md)
        "queued.min.messages": 1_000_000,
        "fetch.queue.backoff.ms": 10,
        **extra,
    }


def produce(bootstrap: str, topic: str, count: int, size: int, extra: dict[str, str],
            broker: Server, timeout: float) -> dict[str, Any]:
    """Produce ``count`` records of ``size`` bytes (null key); every one must be acknowledged."""
    acked = 0
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        elif len(errors) < 20:
            errors.append(f"{err} (partition {msg.partition()})")
        else:
            errors.append("")

    producer = Producer({**producer_config(bootstrap, extra), "on_delivery": on_delivery})
    wait_for_leaders(producer, topic, len(producer.list_topics(topic, timeout=10).topics[topic].partitions),
                     timeout=30)
    value = (os.urandom(64) * (size // 64 + 1))[:size]
    deadline = time.monotonic() + timeout
    push, poll = producer.produce, producer.poll

    meter = Meter(broker)
    t0 = meter.t0
    sent = 0
    while sent < count:
        try:
            push(topic, value)
            sent += 1
            if not sent & 1023:
                poll(0)
        except BufferError:
            poll(0.005)
            if time.monotonic() > deadline:
                break
    queued_s = time.perf_counter() - t0
    while len(producer) > 0 and time.monotonic() < deadline:
        producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
    figures = meter.stop(count * size)
    elapsed = figures["seconds"]

    if errors:
        raise BenchmarkError(f"{len(errors)} delivery errors producing to {topic}, first: "
                             + "; ".join(e for e in errors[:5] if e) + "\n--- broker log ---\n" + broker.tail(30))
    if sent != count or acked != count:
        raise BenchmarkError(f"produce to {topic} timed out after {timeout}s: {sent}/{count} queued, "
                             f"{acked} acknowledged, {len(producer)} still in flight")
    nbytes = count * size
    return {
        "records": count, "record_bytes": size, "queued_s": queued_s,
        "records_per_s": count / elapsed, "mb_per_s": nbytes / elapsed / MB, **figures,
    }


_partition_of, _error_of = confluent_kafka.Message.partition, confluent_kafka.Message.error


def batch_is_clean(batch: list[Any], next_offset: dict[int, int], size: int | None, single: bool) -> bool:
    """Cheap whole-batch check (~0.1 us/record, C-level ``map``): no error, every value ``size``
    bytes, and per partition the offsets continue exactly where the previous batch stopped.

    librdkafka delivers a partition's records in strictly increasing offset order, so
    first == expected and last - first + 1 == count proves there is no gap and no duplicate.
    On success ``next_offset`` is advanced; on failure the caller diagnoses per record.
    """
    if any(map(_error_of, batch)):
        return False
    if size is not None and sum(map(len, batch)) != size * len(batch):
        return False
    counts = {batch[0].partition(): len(batch)} if single else collections.Counter(map(_partition_of, batch))
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    for msg in batch:
        part = msg.partition()
        if part not in firsts:
            firsts[part] = msg.offset()
            if len(firsts) == len(counts):
                break
    for msg in reversed(batch):
        part = msg.partition()
        if part not in lasts:
            lasts[part] = msg.offset()
            if len(lasts) == len(counts):
                break
    for part, count in counts.items():
        if next_offset.get(part) != firsts[part] or lasts[part] - firsts[part] + 1 != count:
            return False
    for part in counts:
        next_offset[part] = lasts[part] + 1
    return True


def diagnose_batch(batch: list[Any], next_offset: dict[int, int], size: int | None, got: int,
                   broker: Broker) -> None:
    """Find and raise the first bad record of a batch that failed ``batch_is_clean``."""
    expected = dict(next_offset)
    for i, msg in enumerate(batch):
        err = msg.error()
        where = f"record {got + i} (partition {msg.partition()}, offset {msg.offset()})"
        if err is not None:
            raise BenchmarkError(f"consumer error at {where}: {err}\n--- broker log ---\n{broker.tail(30)}")
        part = msg.partition()
        if part not in expected:
            raise BenchmarkError(f"{where}: partition was not assigned")
        if msg.offset() != expected[part]:
            raise BenchmarkError(f"{where}: expected offset {expected[part]} (gap or duplicate)")
        if size is not None and len(msg) != size:
            raise BenchmarkError(f"{where}: value is {len(msg)} bytes, expected {size}")
        expected[part] += 1
    raise BenchmarkError(f"batch at record {got} failed the batch check but no bad record was found")


def consume(bootstrap: str, topic: str, expected: int, size: int, extra: dict[str, str],
            broker: Broker, timeout: float) -> dict[str, Any]:
    """Read ``topic`` from offset 0 of every partition (manual assign, no group) and verify it."""
    errors: list[str] = []
    consumer = Consumer({**consumer_config(bootstrap, extra),
                         "error_cb": lambda err: errors.append(f"error_cb: {err}")})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        wait_for_leaders(consumer, topic, len(partitions), timeout=30)
        next_offset = {p: 0 for p in partitions}
        single = len(partitions) == 1
        got = nbytes = 0
        deadline = time.monotonic() + timeout
        pull = consumer.consume

        meter = Meter(broker)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while got < expected:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"consume timed out after {timeout}s: {got}/{expected} records; "
                                     f"errors: {errors[:5]}\n--- broker log ---\n{broker.tail(30)}")
            batch = pull(min(expected - got, 10_000), 1.0)  # never ask for more than remains
            if not batch:
                continue
            if not batch_is_clean(batch, next_offset, size, single):
                diagnose_batch(batch, next_offset, size, got, broker)
            got += len(batch)
            nbytes += size * len(batch) if size is not None else sum(map(len, batch))
        figures = meter.stop(nbytes)
        elapsed = figures["seconds"]

        # nothing more must arrive: a short poll beyond the end
        extra_msgs = [m for m in pull(1, 0.5) if m.error() is None]
        if extra_msgs:
            raise BenchmarkError(f"consumer got more records than produced ({expected}): "
                                 f"partition {extra_msgs[0].partition()} offset {extra_msgs[0].offset()}")
        if size is not None and nbytes != expected * size:
            raise BenchmarkError(f"consumed {nbytes} value bytes, expected {expected * size}")
    finally:
        consumer.close()
    return {
        "records": got, "record_bytes": size,
        "records_per_s": got / elapsed, "mb_per_s": nbytes / elapsed / MB, **figures,
        "client_errors_reported": errors[:10],
    }


# --------------------------------------------------------------------------- scenarios


@dataclass
class Run:
    args: argparse.Namespace
    overrides: dict[str, str]
    results: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def broker(self) -> Broker:
        return Broker(self.overrides, self.args.start_timeout, self.args.broker_log)

    def note_stop(self, broker: Broker, scenario: str) -> None:
        if broker.stop_problem:
            self.problems.append(f"{scenario}: broker {broker.stop_problem}")

    def record(self, name: str, figure: str, metric: str, res: dict[str, Any]) -> None:
        """Keep every repetition; report the median one (by ``metric``) as the result."""
        runs = self.samples.setdefault(name, [])
        runs.append(res)
        ordered = sorted(runs, key=lambda r: r[metric])
        median = dict(ordered[(len(ordered) - 1) // 2]) if len(ordered) % 2 else dict(ordered[len(ordered) // 2])
        median["metric"] = metric
        median["all_runs"] = [r[metric] for r in runs]
        self.results[name] = median
        self.figures[figure] = median[metric]
        other = res["other_cpu_util"]
        progress(f"  {res['records_per_s']:,.0f} rec/s, {res['mb_per_s']:,.1f} MB/s"
                 + (f"  (other processes used {other:.0%} of a core meanwhile: noisy)" if other > 0.15 else ""))


def scenario_startup(run: Run) -> None:
    times, reported = [], []
    for i in range(run.args.startup_runs):
        broker = run.broker()
        with broker:
            times.append(broker.startup_s)
            if broker.self_reported_s is not None:
                reported.append(broker.self_reported_s)
            rss = broker.rss_bytes()
        run.note_stop(broker, "startup")
        progress(f"startup {i + 1}/{run.args.startup_runs}: ready after {times[-1]:.3f} s")
    run.results["startup"] = {"runs_s": times, "median_s": statistics.median(times),
                              "broker_self_reported_s": reported, "rss_idle_mb": rss / MB}
    run.figures["startup_s"] = statistics.median(times)


def scenario_produce_consume(run: Run, do_consume: bool) -> None:
    a = run.args
    topic = "bench-1k"
    broker = run.broker()
    with broker:
        create_topic(broker.bootstrap, topic, a.partitions, timeout=60)
        progress(f"produce {a.n_1k:,} x {a.size} B to {topic} ({a.partitions} partition(s))")
        res = produce(broker.bootstrap, topic, a.n_1k, a.size, a.producer_config, broker, a.timeout)
        res["partitions"] = a.partitions
        run.record("produce_1k", "produce_1k_mb_s", "mb_per_s", res)
        if do_consume:
            progress(f"consume {a.n_1k:,} records from offset 0 (assign, no group)")
            res = consume(broker.bootstrap, topic, a.n_1k, a.size, a.consumer_config, broker, a.timeout)
            run.record("consume_1k", "consume_1k_mb_s", "mb_per_s", res)
            if res["client_errors_reported"]:
                run.problems.append("consume: librdkafka reported " + "; ".join(res["client_errors_reported"][:3]))
    run.note_stop(broker, "produce/consume 1 KB")


def scenario_small(run: Run) -> None:
    a = run.args
    topic = "bench-100b"
    broker = run.broker()
    with broker:
        create_topic(broker.bootstrap, topic, a.partitions, timeout=60)
        progress(f"produce {a.n_100:,} x {a.small_size} B to {topic}")
        res = produce(broker.bootstrap, topic, a.n_100, a.small_size, a.producer_config, broker, a.timeout)
        res["partitions"] = a.partitions
        run.record("produce_100b", "produce_100b_rec_s", "records_per_s", res)
    run.note_stop(broker, "produce 100 B")


def load_partitions(broker: Broker, names: list[str], per_topic: int,
                    extra: dict[str, str]) -> tuple[float, int]:
    """Create the topics, wait for their leaders, then produce one acknowledged record to every
    partition. Returns (seconds to create, RSS right after creation). The clients are local so
    they are gone before the broker stops."""
    total = per_topic * len(names)
    t0 = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(n, per_topic, 1) for n in names],
                                  operation_timeout=120, request_timeout=150)
    for name, fut in futures.items():
        try:
            fut.result(timeout=200)
        except KafkaException as exc:
            raise BenchmarkError(f"CreateTopics {name} ({per_topic} partitions) failed: {exc}\n"
                                 f"--- broker log ---\n{broker.tail(30)}") from exc
    for name in names:
        wait_for_leaders(admin, name, per_topic, timeout=120)
    create_s = time.perf_counter() - t0
    rss_created = broker.rss_bytes()

    acked, errors = 0, []

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        else:
            errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    producer = Producer({**producer_config(broker.bootstrap, extra), "on_delivery": on_delivery})
    value = b"r" * 100
    for name in names:
        for p in range(per_topic):
            producer.produce(name, value, partition=p)
    producer.poll(0)
    remaining = producer.flush(120)
    if errors or remaining or acked != total:
        raise BenchmarkError(f"producing one record to each of {total} partitions: {acked} acked, "
                             f"{remaining} unacknowledged, errors: {errors[:5]}")
    return create_s, rss_created


def scenario_rss(run: Run) -> None:
    a = run.args
    total, topics = a.rss_partitions, a.rss_topics
    if total % topics:
        raise SystemExit("--rss-partitions must be a multiple of --rss-topics")
    per_topic = total // topics
    names = [f"bench-rss-{i}" for i in range(topics)]
    broker = run.broker()
    with broker:
        rss_idle = broker.rss_bytes()
        progress(f"create {topics} topic(s) x {per_topic} partitions")
        create_s, rss_created = load_partitions(broker, names, per_topic, a.producer_config)
        time.sleep(a.rss_settle)
        rss = broker.rss_bytes()
        run.results["rss"] = {"partitions": total, "topics": topics, "create_s": create_s,
                              "rss_idle_mb": rss_idle / MB, "rss_after_create_mb": rss_created / MB,
                              "rss_mb": rss / MB}
        run.figures["rss_1000_partitions_mb"] = rss / MB
        progress(f"  RSS {rss / MB:,.1f} MB (idle {rss_idle / MB:,.1f} MB, topics created in {create_s:.2f} s)")
    run.note_stop(broker, "rss")


# --------------------------------------------------------------------------- report


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(), "cpu_model": model, "mem_gib": round(mem / 2**30, 1),
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "confluent_kafka": _first(confluent_kafka.version()), "librdkafka": _first(confluent_kafka.libversion()),
    }


def _first(version: Any) -> str:
    return version[0] if isinstance(version, tuple) else str(version)


def verdict(key: str, value: float) -> tuple[str, str, str]:
    label, target, higher = TARGETS[key]
    ratio = value / target if higher else (target / value if value else float("inf"))
    ok = value >= target if higher else (value <= target if key == "startup_s" else value < target)
    return label, f"{ratio:.2f}x", "ok" if ok else "MISS"


def print_table(run: Run, info: dict[str, Any]) -> None:
    a = run.args
    print()
    print("josef broker benchmark")
    print(f"machine: {info['nproc']} x {info['cpu_model']}, {info['mem_gib']} GiB, Linux {info['kernel']}, "
          f"{info['implementation']} {info['python']}")
    print(f"load generator: confluent-kafka {info['confluent_kafka']} (librdkafka {info['librdkafka']}), "
          f"same machine; scale {a.scale:g}")
    if run.overrides:
        print("broker overrides: " + " ".join(f"{k}={v}" for k, v in run.overrides.items()))
    print("MB = 10^6 B, GB = 10^9 B of record values; vs target >= 1.00x meets the target")
    print()
    rows: list[tuple[str, str, str, str, str, str]] = []

    def row(scenario: str, metric: str, value: str, key: str | None = None, raw: float = 0.0) -> None:
        if key:
            label, ratio, status = verdict(key, raw)
            rows.append((scenario, metric, value, label, ratio, status))
        else:
            rows.append((scenario, metric, value, "", "", ""))

    r = run.results
    if "startup" in r:
        s = r["startup"]
        row("startup", f"ready, median of {len(s['runs_s'])}", f"{s['median_s']:.3f} s", "startup_s", s["median_s"])
        row("", "runs", " ".join(f"{t:.2f}" for t in s["runs_s"]) + " s")
        row("", "idle RSS", f"{s['rss_idle_mb']:.1f} MB")
    for name, title, key in (("produce_1k", f"produce {a.size} B", "produce_1k_mb_s"),
                             ("consume_1k", f"consume {a.size} B", "consume_1k_mb_s"),
                             ("produce_100b", f"produce {a.small_size} B", "produce_100b_rec_s")):
        if name not in r:
            continue
        x = r[name]
        row(title, "records", f"{x['records']:,} in {x['seconds']:.2f} s")
        if "queued_s" in x:
            row("", "last record queued after", f"{x['queued_s']:.2f} s")
        if name == "produce_100b":
            row("", "records/s", f"{x['records_per_s']:,.0f}", key, x["records_per_s"])
            row("", "MB/s", f"{x['mb_per_s']:,.1f}")
        else:
            row("", "records/s", f"{x['records_per_s']:,.0f}")
            row("", "MB/s", f"{x['mb_per_s']:,.1f}", key, x["mb_per_s"])
        row("", "broker CPU s/GB", f"{x['broker_cpu_s_per_gb']:.2f}")
        row("", "CPU broker / client / other",
            f"{x['broker_cpu_util']:.0%} / {x['client_cpu_util']:.0%} / {x['other_cpu_util']:.0%}")
        if len(x.get("all_runs", ())) > 1:
            row("", f"all {len(x['all_runs'])} runs ({x['metric']})", " ".join(f"{v:,.0f}" for v in x["all_runs"]))
    if "rss" in r:
        x = r["rss"]
        title = f"{x['partitions']} partitions"
        row(title, "VmRSS after 1 rec/partition", f"{x['rss_mb']:.1f} MB", "rss_1000_partitions_mb", x["rss_mb"])
        row("", "VmRSS idle / after create", f"{x['rss_idle_mb']:.1f} / {x['rss_after_create_mb']:.1f} MB")
        row("", f"create {x['topics']} topic(s)", f"{x['create_s']:.2f} s")

    if not rows:
        print("(no figures)")
    headers = ("scenario", "metric", "value", "target", "vs target", "")
    widths = [max(len(h), *(len(rw[i]) for rw in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:{'>' if i in (2, 4) else '<'}{w}}}" for i, w in enumerate(widths))
    if rows:
        print(fmt.format(*headers).rstrip())
        print("  ".join("-" * w for w in widths))
        for rw in rows:
            print(fmt.format(*rw).rstrip())
    noisy = [f"{name} {x['other_cpu_util']:.0%}" for name, x in r.items()
             if isinstance(x, dict) and x.get("other_cpu_util", 0) > 0.15]
    if noisy:
        print(f"\nWARNING: other processes used CPU during the measurement ({', '.join(noisy)} of a core, "
              f"out of {os.cpu_count()}): the throughput figures are pessimistic; rerun on a quiet machine.")
    if run.problems:
        print("\nbroker problems observed:")
        for p in run.problems:
            print(f"  - {p}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark a josef broker (fresh broker per scenario) with confluent-kafka.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records for the 1 KB produce/consume scenarios (before --scale)")
    parser.add_argument("--small-records", type=int, default=2_000_000,
                        help="records for the 100 B produce scenario (before --scale)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply --records and --small-records (0.02 makes a run of seconds)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per record value, large scenario")
    parser.add_argument("--small-size", type=int, default=100, help="bytes per record value, small scenario")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the produce/consume topics")
    parser.add_argument("--rss-partitions", type=int, default=1000, help="partitions for the memory scenario")
    parser.add_argument("--rss-topics", type=int, default=1,
                        help="spread --rss-partitions over this many topics (1 = one topic, 10 = 10 x 100)")
    parser.add_argument("--rss-settle", type=float, default=1.0, help="seconds to wait before reading VmRSS")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the throughput scenarios N times (fresh broker each) and report the median")
    parser.add_argument("--startup-runs", type=int, default=3, help="broker starts for the startup median")
    parser.add_argument("--only", default="startup,produce,consume,small,rss",
                        help="comma-separated scenarios: startup, produce, consume, small, rss "
                             "(consume reads what produce wrote, so it implies produce)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra broker --override for every broker started (repeatable)")
    parser.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka producer setting (repeatable)")
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra/overriding librdkafka consumer setting (repeatable)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per produce/consume phase")
    parser.add_argument("--start-timeout", type=float, default=30, help="seconds allowed for a broker to be ready")
    parser.add_argument("--broker-log", metavar="FILE", help="append every broker's full output to FILE")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)

    a.n_1k = max(1, round(a.records * a.scale))
    a.n_100 = max(1, round(a.small_records * a.scale))
    a.producer_config = parse_kv(a.producer_config)
    a.consumer_config = parse_kv(a.consumer_config)
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    unknown = only - {"startup", "produce", "consume", "small", "rss"}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    run = Run(a, parse_kv(a.override))
    info = machine()
    progress(f"machine: {info['nproc']} x {info['cpu_model']}, Python {info['python']}")

    failed: str | None = None
    try:
        if "startup" in only:
            scenario_startup(run)
        for i in range(a.repeat):
            if a.repeat > 1:
                progress(f"repetition {i + 1}/{a.repeat}")
            if only & {"produce", "consume"}:
                scenario_produce_consume(run, do_consume="consume" in only)
            if "small" in only:
                scenario_small(run)
        if "rss" in only:
            scenario_rss(run)
    except BenchmarkError as exc:
        failed = str(exc)
    except KeyboardInterrupt:
        failed = "interrupted"

    print_table(run, info)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "parameters": {"records_1k": a.n_1k, "records_100b": a.n_100, "size": a.size,
                                      "small_size": a.small_size, "partitions": a.partitions,
                                      "rss_partitions": a.rss_partitions, "rss_topics": a.rss_topics,
                                      "scale": a.scale, "repeat": a.repeat, "broker_overrides": run.overrides,
                                      "producer_config": a.producer_config,
                                      "consumer_config": a.consumer_config},
                       "figures": run.figures,
                       "targets": {k: {"target": v[0], "value": v[1], "higher_is_better": v[2]}
                                   for k, v in TARGETS.items()},
                       "results": run.results, "problems": run.problems, "failed": failed},
                      f, indent=2)
    if failed:
        print(f"BENCHMARK FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
