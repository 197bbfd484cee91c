"""Restart time after kill -9 with a large flushed log and a smaller unflushed tail.

One broker (``python -m josef server start``, its own temporary ``log.dirs``),
one partition:

1. produce ``--flushed-gb`` of records (acks=1, no compression); rolled
   segments are flushed by the storage's background thread;
2. force a roll (``segment.bytes`` set tiny for one record, then restored),
   so that everything written so far lies below the active segment, and wait
   until ``recovery-point-offset-checkpoint`` names the new segment's base;
3. produce ``--unflushed-mb`` more, which nothing flushes (``flush.ms`` and
   ``flush.messages`` at their defaults: never);
4. SIGKILL the broker by PID, start it again on the same directory, and
   measure the time until it logs ready and until a consumer has read the
   last record produced.

``--before`` reproduces the behaviour before the background flush (issue 13):
the recovery point never reached the checkpoint file between clean stops, so
a crash recovered the whole log. It sets
``log.flush.offset.checkpoint.interval.ms`` to its maximum and skips the wait.

SIGKILL leaves the written data in the page cache, so recovery reads memory.
``--cold`` evicts the log's files from the page cache after the kill (sync,
then ``posix_fadvise(DONTNEED)`` on each file of the data directory, nobody
else's), as after a reboot: recovery then reads the disk.

    uv run python benchmarks/restart.py                                   # 10 GB flushed + 100 MB unflushed
    uv run python benchmarks/restart.py --flushed-gb 1 --unflushed-mb 50  # quick
    uv run python benchmarks/restart.py --flushed-gb 1 --before           # whole-log recovery, for comparison
    uv run python benchmarks/restart.py --cold                            # recovery reads the disk

The data directory (it needs about flushed + unflushed bytes of free disk)
is removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from broker import GB, MB, BenchmarkError, Broker, consumer_config, create_topic, machine, produce, progress  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: E402

TOPIC = "restart"
MAX_INT = 2**31 - 1


def checkpointed(data_dir: Path) -> int | None:
    """The recovery point of the benchmark's partition in ``recovery-point-offset-checkpoint``."""
    try:
        lines = (data_dir / "recovery-point-offset-checkpoint").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        topic, partition, offset = line.split()
        if topic == TOPIC and partition == "0":
            return int(offset)
    return None


def set_segment_bytes(bootstrap: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("TOPIC", TOPIC, incremental_configs=[
        ConfigEntry("segment.bytes", value, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def evict(data_dir: Path) -> None:
    """Drop the files under ``data_dir`` from the page cache (written back first, or the kernel keeps them)."""
    os.sync()
    for path in data_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def produce_one(bootstrap: str) -> int:
    """Produce one small record; returns its offset."""
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(TOPIC, b"roll", on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
    producer.flush(30)
    if not offsets or offsets[0] < 0:
        raise BenchmarkError("the roll record was not acknowledged")
    return offsets[0]


def read_last(bootstrap: str, offset: int, timeout: float) -> None:
    """Wait until a consumer has read the record at ``offset`` (the last one produced)."""
    consumer = Consumer({**consumer_config(bootstrap, {}), "group.id": "josef-restart-bench"})
    consumer.assign([TopicPartition(TOPIC, 0, offset)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None and message.offset() == offset:
                return
        raise BenchmarkError(f"the record at offset {offset} was not readable within {timeout}s")
    finally:
        consumer.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {
        "log.segment.bytes": str(args.segment_bytes),
        "log.flush.offset.checkpoint.interval.ms": str(MAX_INT if args.before else args.checkpoint_ms),
        "message.max.bytes": str(max(1048588, args.record_bytes + 1000)),
    }
    flushed_records = max(1, int(args.flushed_gb * GB) // args.record_bytes)
    unflushed_records = max(1, int(args.unflushed_mb * MB) // args.record_bytes)
    with Broker(overrides, start_timeout=args.start_timeout) as broker:
        data_dir = Path(broker.data_dir)
        create_topic(broker.bootstrap, TOPIC, 1, timeout=30)
        progress(f"producing {flushed_records * args.record_bytes / GB:.2f} GB (flushed part)")
        flushed = produce(broker.bootstrap, TOPIC, flushed_records, args.record_bytes, {}, broker, args.timeout)
        set_segment_bytes(broker.bootstrap, "14")
        roll_base = produce_one(broker.bootstrap)
        set_segment_bytes(broker.bootstrap, str(args.segment_bytes))
        if not args.before:
            progress(f"waiting for the recovery point checkpoint to reach {roll_base}")
            t0 = time.monotonic()
            while checkpointed(data_dir) != roll_base:
                if time.monotonic() - t0 > args.timeout:
                    raise BenchmarkError(f"the recovery point checkpoint is {checkpointed(data_dir)}, not {roll_base}")
                time.sleep(0.2)
            checkpoint_wait_s = time.monotonic() - t0
        else:
            checkpoint_wait_s = 0.0
        progress(f"producing {unflushed_records * args.record_bytes / MB:.0f} MB (unflushed part)")
        unflushed = produce(broker.bootstrap, TOPIC, unflushed_records, args.record_bytes, {}, broker, args.timeout)
        last_offset = roll_base + unflushed_records
        log_bytes = sum(p.stat().st_size for p in (data_dir / f"{TOPIC}-0").glob("*.log"))

        progress(f"kill -9 {broker.pid} with {log_bytes / GB:.2f} GB of log, checkpoint {checkpointed(data_dir)}")
        assert broker.proc is not None
        os.kill(broker.pid, signal.SIGKILL)
        broker.proc.wait(timeout=30)
        if args.cold:
            evict(data_dir)
        killed = time.perf_counter()
        broker.log.clear()
        broker.start()
        ready_s = broker.ready_at - killed
        read_last(broker.bootstrap, last_offset, args.timeout)
        readable_s = time.perf_counter() - killed
        recovered = [line.strip() for line in broker.log if "recovering unflushed segment" in line]
        return {
            "machine": machine(),
            "parameters": vars(args),
            "log_bytes": log_bytes,
            "produce_flushed_mb_s": flushed["mb_per_s"],
            "produce_unflushed_mb_s": unflushed["mb_per_s"],
            "checkpoint_wait_s": checkpoint_wait_s,
            "restart_ready_s": ready_s,
            "restart_last_record_readable_s": readable_s,
            "broker_self_reported_ready_s": broker.self_reported_s,
            "recovered_segments": recovered,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flushed-gb", type=float, default=10.0, help="log written before the last roll (GB, 10^9)")
    parser.add_argument("--unflushed-mb", type=float, default=100.0, help="log written after it, never flushed (MB)")
    parser.add_argument("--record-bytes", type=int, default=100_000, help="value size of every record")
    parser.add_argument("--segment-bytes", type=int, default=1073741824, help="log.segment.bytes (Kafka's default 1 GiB)")
    parser.add_argument("--checkpoint-ms", type=int, default=1000, help="log.flush.offset.checkpoint.interval.ms")
    parser.add_argument("--before", action="store_true", help="never checkpoint the recovery point (whole-log recovery)")
    parser.add_argument("--cold", action="store_true", help="evict the log from the page cache after the kill")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed for each phase")
    parser.add_argument("--start-timeout", type=float, default=1800, help="seconds allowed for a broker start")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    try:
        figures = run(args)
    except BenchmarkError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    for key in ("log_bytes", "produce_flushed_mb_s", "produce_unflushed_mb_s", "checkpoint_wait_s",
                "restart_ready_s", "restart_last_record_readable_s", "broker_self_reported_ready_s"):
        value = figures[key]
        print(f"{key:34} {value:,.2f}" if isinstance(value, float) else f"{key:34} {value:,}")
    print(f"{'recovered_segments':34} {len(figures['recovered_segments'])}")
    for line in figures["recovered_segments"]:
        print(f"  {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
