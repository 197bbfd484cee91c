"""The protocol fuzzer at full scale: one million inputs against a live default broker, and a report.

One broker (``python -m josef server start``, the embedded single-node
default, on a free port of 127.0.0.1 with its own temporary ``log.dirs``).
The benchmark captures real client traffic through a recording proxy (a
confluent-kafka produce, transaction, consume and group session, and a
kafka-python admin session), then runs :class:`josef.testing.fuzz.Fuzzer`:
requests drawn from kio's schemas for every API and version the broker
advertises, valid and broken, and byte mutations of the captured frames.
``--workers`` fuzzers (separate processes, seeds and connections) run side
by side, so that drawing inputs and the broker's work overlap. Every
``--check-every`` inputs of each, the broker is checked (alive, no error
logged, ApiVersions and a produce/fetch round trip, no connection left
half-closed or socket leaked, RSS under ``--rss-limit-mb``) and the state
fuzzed admin requests left is undone. The broker's address space is capped
at 8 GB, so a runaway allocation fails it alone.

With ``--cluster-inputs N`` it also starts a 3-node cluster (combined
roles) and sends N inputs to node 1's controller listener (the Raft and
broker-lifecycle APIs) and N to its broker listener (inter-broker Fetch,
AlterPartition, WriteTxnMarkers among the rest), checking every node.

    uv run python benchmarks/fuzz.py                          # 1,000,000 inputs (hours on 2 cores)
    uv run python benchmarks/fuzz.py --inputs 20000 --seed 7  # a quick run
    uv run python benchmarks/fuzz.py --cluster-inputs 5000    # and the 3-node cluster's inter-broker APIs

The report (inputs per API, answers and refusals, findings, RSS over time,
duration) is printed at every check and at the end; ``--json`` writes it
too. The exit status is 1 when anything was found. Every process it starts
is stopped by its PID; the data directories are removed, unless something
was found (their logs then show it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

import attrs

from josef.node.cluster import JosefCluster, free_ports
from josef.testing.fuzz import (
    FUZZ_TOPICS,
    HEALTH_TOPIC,
    BrokerProcess,
    ClusterNode,
    Fuzzer,
    Report,
    RunningBroker,
    api_versions,
    cap_memory,
    capture_client_sessions,
    create_topics,
    health_problem,
)


def progress(label: str):
    def show(report: Report) -> None:
        rss = report.rss[-1][2] / 2**20 if report.rss else 0
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {report.inputs} inputs, {report.duration_s:.0f} s, "
              f"{report.inputs / max(report.duration_s, 1e-9):.0f}/s, RSS {rss:.0f} MB, "
              f"{len(report.findings)} findings", flush=True)
    return show


def single_node(args: argparse.Namespace, base: Path) -> Report:
    broker = BrokerProcess(base / "single", free_ports(1)[0])
    try:
        print(f"broker pid {broker.pid} on {broker.host}:{broker.port}", flush=True)
        create_topics(broker, [HEALTH_TOPIC], partitions=1)
        create_topics(broker, FUZZ_TOPICS)
        capture = capture_client_sessions((broker.host, broker.port))
        print(f"captured {len(capture.frames)} request frames of real clients", flush=True)
        for error in capture.errors:
            print(f"  a client session step failed: {error}", flush=True)
        shares = [args.inputs // args.workers + (i < args.inputs % args.workers) for i in range(args.workers)]
        jobs = [(broker.running().from_now(), capture.frames, args, n, args.seed * 1000 + i, i)
                for i, n in enumerate(shares)]
        if args.workers == 1:
            reports = [fuzz_worker(*jobs[0])]
        else:
            with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
                reports = pool.starmap(fuzz_worker, jobs)
        report = reports[0]
        for other in reports[1:]:
            report.merge(other)
        report.seed = args.seed
        for error in capture.errors:
            report.add("client session failed", error, "capturing client traffic before fuzzing")
    finally:
        status = broker.stop()
    if status not in (0, None):
        report.add("crash", f"the broker exited with status {status} after SIGTERM", "")
    return report


def fuzz_worker(target: RunningBroker, corpus: list[bytes], args: argparse.Namespace, inputs: int, seed: int,
                index: int) -> Report:
    """One fuzzer of ``inputs`` inputs (in its own process when there are several): worker 0 reports the
    errors the broker logs."""
    fuzzer = Fuzzer(target, corpus=corpus, raw_share=args.raw_share, check_every=args.check_every,
                    rss_limit=args.rss_limit_mb << 20, answer_timeout=args.answer_timeout, log_errors=index == 0,
                    progress=progress(f"single node, fuzzer {index}"))
    return fuzzer.run(inputs, seed=seed)


def cluster(args: argparse.Namespace, base: Path) -> list[tuple[str, Report]]:
    reports = []
    with JosefCluster(base / "cluster", combined=3) as nodes:
        broker = ClusterNode(nodes.node(1))
        create_topics(broker, [HEALTH_TOPIC], partitions=1, replicas=3)
        create_topics(broker, FUZZ_TOPICS, replicas=3)
        everyone = [ClusterNode(nodes.node(i)) for i in (1, 2, 3)]
        for node in everyone:
            cap_memory(node.pid)

        def healthy() -> str | None:
            for node in everyone:
                if not node.node.running:
                    return f"node {node.node.node_id} exited"
            return health_problem(broker)

        for listener in ("CONTROLLER", "PLAINTEXT"):
            node = ClusterNode(nodes.node(1), listener)
            fuzzer = Fuzzer(node, versions=api_versions(node), check_every=max(args.cluster_inputs // 5, 100),
                            rss_limit=args.rss_limit_mb << 20, answer_timeout=args.answer_timeout,
                            reset=False, healthy=healthy, admin=broker, progress=progress(f"cluster {listener}"))
            report = fuzzer.run(args.cluster_inputs, seed=args.seed)
            for other in everyone[1:]:  # what the other nodes logged meanwhile
                for line in other.new_log_lines():
                    if " ERROR " in line or "Traceback" in line:
                        report.add("broker logged an error", f"node {other.node.node_id}: {line[:300]}", line)
            reports.append((f"3-node cluster, node 1's {listener} listener", report))
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--raw-share", type=float, default=0.4, help="share of mutated captured traffic")
    parser.add_argument("--check-every", type=int, default=5000)
    parser.add_argument("--rss-limit-mb", type=int, default=1024)
    parser.add_argument("--answer-timeout", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="fuzzers side by side on the single node")
    parser.add_argument("--cluster-inputs", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="josef-fuzz-"))
    results: list[tuple[str, Report]] = []
    try:
        if args.inputs:
            results.append(("single-node default broker", single_node(args, base)))
        if args.cluster_inputs:
            results += cluster(args, base)
    finally:
        if any(report.findings for _, report in results) or not results:
            print(f"\nthe brokers' directories and logs are kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    found = False
    for label, report in results:
        print(f"\n=== {label}\n{report.text()}")
        found = found or bool(report.findings)
    if args.json:
        args.json.write_text(json.dumps([{"label": label, **attrs.asdict(report, recurse=True,
                                                                         value_serializer=_plain)}
                                         for label, report in results], indent=2, default=str))
    return 1 if found else 0


def _plain(_instance: object, _field: object, value: object) -> object:
    if isinstance(value, dict) and value and isinstance(next(iter(value)), tuple):
        return {" / ".join(k): v for k, v in value.items()}
    return value


if __name__ == "__main__":
    sys.exit(main())
