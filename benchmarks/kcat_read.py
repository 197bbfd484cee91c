"""One kcat consumer reading from a broker's page cache, as a fraction of what the machine moves over loopback.

    cd /work/main && uv run python benchmarks/kcat_read.py                       # 1 KB and 32 KB records
    cd /work/main && uv run python benchmarks/kcat_read.py --record-size 1024 --bytes 2e9 --json /tmp/kr.json

Issue 20's goal: a single consumer reading from the page cache reaches at least half of the
raw-loopback baseline when the client keeps up. For each ``--record-size`` a fresh broker gets
``--bytes`` of records in one partition (written by ``kcat -P``), then ``kcat -C`` reads them
all back ``--repeat`` times (the first read warms nothing: the data was just written, so it is
in the page cache already). In the same run ``loopback.measure()`` moves the same number of
bytes between two processes over TCP with no broker at all. Reported: kcat's MB/s, its ratio
to the loopback, the broker's and kcat's CPU. kcat handles every record, so with 1 KB records
kcat itself is usually the limit; larger records show what the broker can send when it is not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import loopback  # noqa: E402
from broker import MB, BenchmarkError, Broker, cpu_seconds_of, create_topic, machine, progress  # noqa: E402

KCAT_PRODUCER = ["-X", "batch.size=1000000", "-X", "batch.num.messages=1000000",
                 "-X", "queue.buffering.max.kbytes=1048576", "-X", "acks=1", "-X", "linger.ms=5"]


def records_file(directory: str, records: int, size: int) -> str:
    """``records`` lines of ``size - 1`` bytes: kcat -P sends each line, without its newline, as one record."""
    path = os.path.join(directory, f"records-{records}x{size}.txt")
    line = (os.urandom(size // 2 + 1).hex()[: size - 1] + "\n").encode()
    per_write = max(1, (1 << 20) // size)
    with open(path, "wb") as f:
        for _ in range(records // per_write):
            f.write(line * per_write)
        f.write(line * (records % per_write))
    return path


def children_cpu_seconds() -> float:
    """CPU of the children that have been waited for (the kcat runs; brokers still run while it is read)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_all(commands: list[list[str]], timeout: float) -> float:
    """Start every command at once; seconds until the last one finished (each must exit 0)."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    try:
        for proc, command in zip(procs, commands):
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise BenchmarkError(f"{' '.join(command[:4])}... exited {proc.returncode}: {err.decode()[-500:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return time.perf_counter() - start


def read_once(bootstrap: str, records: int, pid: int, timeout: float) -> dict[str, float]:
    cpu0, kcat0 = cpu_seconds_of([pid]), children_cpu_seconds()
    seconds = run_all([["kcat", "-C", "-b", bootstrap, "-t", "read", "-p", "0", "-o", "beginning", "-e", "-q",
                        "-c", str(records)]], timeout)
    return {"seconds": seconds, "broker_cpu_util": (cpu_seconds_of([pid]) - cpu0) / seconds,
            "kcat_cpu_util": (children_cpu_seconds() - kcat0) / seconds}


def measure(size: int, a: argparse.Namespace, scratch: str) -> dict[str, Any]:
    records = int(a.bytes) // size
    path = records_file(scratch, records, size)
    with Broker({}, a.start_timeout) as broker:
        create_topic(broker.bootstrap, "read", 1, 60)
        run_all([["kcat", "-P", "-b", broker.bootstrap, "-t", "read", "-p", "0", *KCAT_PRODUCER, "-l", path]],
                a.timeout)
        reads = [read_once(broker.bootstrap, records, broker.pid, a.timeout) for _ in range(a.repeat)]
    os.unlink(path)
    payload = records * (size - 1)
    seconds = statistics.median(r["seconds"] for r in reads)
    return {"record_size": size - 1, "records": records, "bytes": payload, "reads": reads,
            "mb_per_s": payload / MB / seconds,
            "broker_cpu_util": statistics.median(r["broker_cpu_util"] for r in reads),
            "kcat_cpu_util": statistics.median(r["kcat_cpu_util"] for r in reads)}


def write_json(a: argparse.Namespace, info: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """With ``--json FILE``: the machine, the parameters and the runs, into FILE."""
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "parameters": vars(a), "runs": runs}, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record-size", type=int, action="append",
                        help="bytes per record, repeatable (default: 1024 and 32768)")
    parser.add_argument("--bytes", type=float, default=1e9, help="bytes of records per size")
    parser.add_argument("--repeat", type=int, default=3, help="kcat reads per size; the median is reported")
    parser.add_argument("--start-timeout", type=float, default=60)
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per kcat run")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)
    if shutil.which("kcat") is None:
        print("kcat_read.py needs kcat (apt-get install kcat)", file=sys.stderr)
        return 2
    info = machine()
    sizes = a.record_size or [1024, 32768]
    runs = []
    with tempfile.TemporaryDirectory(prefix="josef-kcat-") as scratch:
        for size in sizes:
            runs.append(measure(size, a, scratch))
            progress(f"{size} B records: kcat read {runs[-1]['mb_per_s']:.0f} MB/s")
            runs[-1]["loopback"] = loopback.measure(int(a.bytes))
            progress(f"loopback {runs[-1]['loopback']['mb_per_s']:.0f} MB/s")
    print(f"\none kcat consumer reading from the page cache ({info['nproc']} x {info['cpu_model']}, "
          f"{a.bytes / 1e9:g} GB per size, medians of {a.repeat} reads)")
    print(f"{'record size':>12} {'kcat MB/s':>10} {'loopback MB/s':>14} {'ratio':>6} {'broker CPU':>11} {'kcat CPU':>9}")
    for run in runs:
        ratio = run["mb_per_s"] / run["loopback"]["mb_per_s"]
        print(f"{run['record_size']:>12,} {run['mb_per_s']:>10.0f} {run['loopback']['mb_per_s']:>14.0f} "
              f"{ratio:>5.2f}x {run['broker_cpu_util']:>10.0%} {run['kcat_cpu_util']:>8.0%}")
    write_json(a, info, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
