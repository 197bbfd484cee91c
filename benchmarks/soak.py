"""A long soak: a 3-broker cluster under a seeded nemesis for as long as asked, then every acknowledged record checked.

The fault scenarios (integration-tests/faults, ``uvx nox -s faults``) each try
one fault for a minute; this runs many of them back to back, chosen by a
seeded :class:`josef.testing.faults.Nemesis`: partitions both ways and one
way, 10% loss, 200 ms ± 50 links, kill -9 and restart, SIGSTOP/SIGCONT and
clean restarts, aimed at any node, a partition's leader or the active
controller. The workload (:mod:`josef.testing.workload`) runs idempotent
producers, transactions that commit and abort, a read_committed reader and
a consumer group throughout. After every few faults the cluster is given
time to get every partition back to three in-sync replicas, so the faults
test recovery rather than pile up past what replication factor 3 survives.

At the end the history checker (:mod:`josef.testing.history`) reads
everything back and prints its verdict; the report (``--report``, Markdown)
has the schedule, the faults by kind, the counts and the verdict, and the
history itself is kept as JSON lines beside it for replaying the check.

Needs root (network namespaces, nftables). Replay a failing run with its seed::

    sudo uv run python benchmarks/soak.py --faults 120 --seed 7                # about 40 minutes
    sudo uv run python benchmarks/soak.py --hours 3 --seed 7 --layout split    # 3 controllers + 3 brokers
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from josef.node.cluster import JosefCluster
from josef.testing import eventually
from josef.testing.faults import (
    NEMESIS_FAULTS,
    REPLICATED_FAST,
    Nemesis,
    Network,
    partition_states,
    standard_targets,
    unavailable,
)
from josef.testing.history import History, check
from josef.testing.workload import (
    FAULT_CONSUMER,
    FAULT_PRODUCER,
    Group,
    Producers,
    Readers,
    Transactions,
    Workload,
    create_topic,
)

TOPIC = "soak"
#: Faults between two waits for full replication: more would let a fault land on a cluster still recovering from
#: the last two, past what three replicas survive (acknowledged data on one replica while the other two are down).
BURST = 3


def fully_replicated(cluster: JosefCluster) -> bool:
    try:
        broker = next(n for n in cluster.brokers if n.running)
        states = partition_states(broker, TOPIC, timeout=5)
    except (OSError, RuntimeError, StopIteration):
        return False
    return bool(states) and all(leader >= 0 and len(isr) == 3 for leader, isr in states.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=120, help="faults to inject (ignored with --hours)")
    parser.add_argument("--hours", type=float, default=None, help="inject faults for this long instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layout", choices=["combined", "split"], default="combined")
    parser.add_argument("--rate", type=float, default=50.0, help="records a second per idempotent producer")
    parser.add_argument("--report", type=Path, default=Path("soak-report.md"))
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        sys.exit(f"the soak needs the fault harness: {reason}")

    base = Path(tempfile.mkdtemp(prefix="josef-soak-"))
    layout = {"combined": 3} if args.layout == "combined" else {"controllers": 3, "brokers": 3}
    network = Network(latency=True)
    cluster = JosefCluster(base, **layout, overrides=REPLICATED_FAST, network=network)
    history = History(log=args.report.with_suffix(".history.jsonl"))
    started = time.monotonic()
    workload = None
    nemesis = None
    verdict = None
    error = ""
    try:
        cluster.start()
        assert cluster.faults is not None
        cluster.faults.listeners.append(history.on_fault)
        create_topic(cluster.bootstrap_servers, TOPIC, partitions=6)
        eventually(lambda: fully_replicated(cluster), timeout=60, what="the topic fully replicated")
        workload = Workload(cluster.bootstrap_servers, TOPIC, history=history, seed=args.seed, parts=[
            Producers(count=2, rate=args.rate, settings=FAULT_PRODUCER), Transactions(rate=2, settings=FAULT_PRODUCER),
            Readers(settings=FAULT_CONSUMER), Group("g", members=3, settings=FAULT_CONSUMER)]).start()
        workload.progress(100, timeout=120)
        nemesis = Nemesis(cluster.faults, args.seed, kinds=sorted(NEMESIS_FAULTS),
                          targets=standard_targets(cluster, TOPIC), duration_s=(3, 10), rest_s=(2, 6))
        deadline = started + args.hours * 3600 if args.hours else float("inf")
        count = 0
        while (count < args.faults if args.hours is None else time.monotonic() < deadline):
            for step in nemesis.schedule(BURST):
                nemesis.apply(step)
                count += 1
                print(f"[{time.monotonic() - started:7.0f}s] fault {count}: {step.fault} on {step.target} "
                      f"({workload.acknowledged} acknowledged)", flush=True)
            eventually(lambda: fully_replicated(cluster), timeout=180, what="recovery after a burst of faults")
        workload.progress(100, timeout=180)
        final = workload.finish(timeout=300)
        verdict = check(history, final)
    except Exception as exc:  # a run that cannot finish is a finding too: report what happened up to it
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if workload is not None:
            workload.stop()
        if cluster.faults is not None:
            cluster.faults.heal_all()
        cluster.stop()
        network.close()
    took = time.monotonic() - started
    kinds = collections.Counter(step.fault for step in nemesis.steps) if nemesis else {}
    report = [
        f"# josef soak, seed {args.seed}, {args.layout} layout",
        "",
        f"- duration: {took / 60:.1f} min; faults injected: {sum(kinds.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})",
        f"- nemesis errors (faults that could not be injected): {len(nemesis.errors) if nemesis else 0}",
        f"- history: {len(history)} events, kept in {args.report.with_suffix('.history.jsonl')}",
        f"- verdict: {'OK' if verdict and verdict.ok else 'VIOLATIONS' if verdict else 'ERROR: ' + error}",
        f"- clients that did not stop within 60 s at the end: {workload.stuck if workload else []}",
        "",
        "```",
        verdict.report() if verdict else error,
        "```",
        "",
        "## Schedule",
        "",
        *(f"{i}. {step.fault} on {step.target} for {step.duration_s} s, then {step.rest_s} s of rest"
          for i, step in enumerate(nemesis.steps if nemesis else [], 1)),
    ]
    args.report.write_text("\n".join(report) + "\n", encoding="utf-8")
    print("\n".join(report[:9]))
    return 0 if verdict is not None and verdict.ok and not (workload and workload.stuck) else 1


if __name__ == "__main__":
    sys.exit(main())
