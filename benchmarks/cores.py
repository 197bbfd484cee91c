"""What a second core gives a josef node: the measurements behind the one-event-loop decision (issue 20).

    cd /work/main && uv run python benchmarks/cores.py                 # a few minutes
    cd /work/main && uv run python benchmarks/cores.py --records 200000 --json /tmp/cores.json

A node runs one event loop in one process. Before building anything to use more
cores, this measures what more cores could give, with kcat (librdkafka's CLI, Debian's
``kcat``) as the load so the client costs little:

* **one core**: one broker process pinned to CPU 0 with ``taskset``;
* **two cores**: the same broker process, unpinned;
* **two processes**: the prototype of "several processes per node, partitions pinned to
  processes": two broker processes (two single-node brokers, so the figure is an upper
  bound: no coordination between the processes is paid), each pinned to its own core and
  given half the partitions and half the load, both loads running at once.

Each configuration produces ``--records`` 1 KB records with two ``kcat -P`` processes at
once (acks=1, ``--linger-ms``, 1 MB batches), each to its own topic of half of
``--partitions`` partitions, then reads them back with two ``kcat -C`` from the page cache.
The two kcat processes are the same in every configuration, so the client side has the
same capacity throughout. Reported: MB/s of record values, the brokers'
CPU-seconds per GB, and each configuration's throughput over the one-core figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from broker import MB, Broker, cpu_seconds_of, create_topic, machine, machine_busy_seconds, progress  # noqa: E402
from kcat_read import children_cpu_seconds, records_file, run_all, write_json  # noqa: E402

RECORD_SIZE = 1024
#: kcat processes of every phase, each with its own topic and half the records, in every configuration.
LOADS = 2
KCAT_PRODUCER = ["-X", "batch.size=1000000", "-X", "batch.num.messages=1000000",
                 "-X", "queue.buffering.max.kbytes=1048576", "-X", "acks=1"]


class PinnedBroker(Broker):
    """A benchmark broker started under ``taskset -c CPUS`` (all CPUs when ``cpus`` is None)."""

    def __init__(self, cpus: str | None, start_timeout: float) -> None:
        super().__init__({}, start_timeout)
        self.cpus = cpus

    @property
    def command(self) -> list[str]:
        pin = ["taskset", "-c", self.cpus] if self.cpus is not None else []
        return pin + super().command


def measure(name: str, cpus: list[str | None], a: argparse.Namespace, path: str) -> dict[str, Any]:
    """One configuration: a broker per entry of ``cpus``; always ``LOADS`` kcat runs, each on its own topic.

    The load is the same in every configuration (the same kcat processes, topics and records),
    so what changes is only what the brokers may use. With two processes, broker ``i`` hosts
    topic ``i``; with one, it hosts both.
    """
    with ExitStack() as stack:
        brokers = [stack.enter_context(PinnedBroker(c, a.start_timeout)) for c in cpus]
        targets = [brokers[i % len(brokers)] for i in range(LOADS)]
        for i, b in enumerate(targets):
            create_topic(b.bootstrap, f"cores-{i}", a.partitions // LOADS, 60)
        share = a.records // LOADS
        figures: dict[str, Any] = {"name": name, "processes": len(cpus), "cpus": [c or "all" for c in cpus]}
        for phase, command in (
                ("produce", lambda i, b: ["kcat", "-P", "-b", b.bootstrap, "-t", f"cores-{i}", *KCAT_PRODUCER,
                                          "-X", f"linger.ms={a.linger_ms}", "-l", path]),
                ("consume", lambda i, b: ["kcat", "-C", "-b", b.bootstrap, "-t", f"cores-{i}", "-o", "beginning",
                                          "-e", "-q", "-c", str(share)])):
            pids = [b.pid for b in brokers]
            cpu0, kcat0, busy0 = cpu_seconds_of(pids), children_cpu_seconds(), machine_busy_seconds()
            seconds = run_all([command(i, b) for i, b in enumerate(targets)], a.timeout)
            cpu, kcat = cpu_seconds_of(pids) - cpu0, children_cpu_seconds() - kcat0
            other = max(0.0, machine_busy_seconds() - busy0 - cpu - kcat)
            payload = share * LOADS * RECORD_SIZE
            figures[phase] = {"seconds": seconds, "mb_per_s": payload / MB / seconds,
                              "broker_cpu_s_per_gb": cpu / (payload / 1e9), "broker_cpu_util": cpu / seconds,
                              "kcat_cpu_util": kcat / seconds, "other_cpu_util": other / seconds}
            progress(f"{name}: {phase} {figures[phase]['mb_per_s']:.0f} MB/s, broker CPU {cpu / seconds:.0%}, "
                     f"kcat {kcat / seconds:.0%}, other {other / seconds:.0%}")
    return figures


def median_run(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trials of one configuration (run in turn with the others, so load from outside hits all alike), by median."""
    run = dict(trials[0], trials=trials)
    for phase in ("produce", "consume"):
        run[phase] = {key: statistics.median(t[phase][key] for t in trials) for key in trials[0][phase]}
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000, help="1 KB records per configuration")
    parser.add_argument("--partitions", type=int, default=100, help="partitions in all (split between processes)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the three configurations; medians reported")
    parser.add_argument("--linger-ms", type=float, default=5,
                        help="kcat's linger.ms: 5 fills 1 MB batches, 0 sends many small requests")
    parser.add_argument("--start-timeout", type=float, default=60)
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per kcat run")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)
    if shutil.which("kcat") is None or shutil.which("taskset") is None:
        print("cores.py needs kcat and taskset (apt-get install kcat util-linux)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("cores.py compares one core with two: this machine has one", file=sys.stderr)
        return 2
    info = machine()
    progress(f"machine: {info['nproc']} x {info['cpu_model']}")
    with tempfile.TemporaryDirectory(prefix="josef-cores-") as scratch:
        path = records_file(scratch, a.records // LOADS, RECORD_SIZE)
        configurations = [("one core", ["0"]), ("two cores", [None]), ("two processes", ["0", "1"])]
        trials = [[measure(name, cpus, a, path) for name, cpus in configurations] for _ in range(a.repeat)]
    runs = [median_run([trial[i] for trial in trials]) for i in range(len(configurations))]
    base = runs[0]
    print(f"\njosef on one core and on two ({info['nproc']} x {info['cpu_model']}, {a.records:,} x 1 KB records, "
          f"{a.partitions} partitions, linger.ms={a.linger_ms:g}, load from kcat; medians of {a.repeat})")
    print(f"{'configuration':<16} {'produce MB/s':>13} {'x':>6} {'CPU s/GB':>9} {'consume MB/s':>13} {'x':>6} {'CPU s/GB':>9}")
    for run in runs:
        p, c = run["produce"], run["consume"]
        print(f"{run['name']:<16} {p['mb_per_s']:>13.0f} {p['mb_per_s'] / base['produce']['mb_per_s']:>5.2f}x "
              f"{p['broker_cpu_s_per_gb']:>9.2f} {c['mb_per_s']:>13.0f} "
              f"{c['mb_per_s'] / base['consume']['mb_per_s']:>5.2f}x {c['broker_cpu_s_per_gb']:>9.2f}")
    write_json(a, info, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
