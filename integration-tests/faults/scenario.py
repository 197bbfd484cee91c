"""Fault scenarios (the workload, the cluster's view and the verdict): 3-broker clusters (combined, and split into 3 controllers + 3 brokers) in network namespaces,
under a workload of idempotent producers, transactions, a read_committed reader and a consumer group, with faults
injected by the test and every acknowledged record checked at the end (josef.testing.history).

Timeouts are lowered so that each scenario takes about a minute; ``uvx nox -s faults`` runs them (as root, which the
harness needs; elsewhere they skip, saying why).
"""

from __future__ import annotations

import time
from typing import Any

from josef.node.cluster import JosefCluster, NodeProcess
from josef.testing import eventually
from josef.testing.faults import active_controller, group_coordinator, partition_states
from josef.testing.history import Commit, History, Verdict, check
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

TOPIC = "checked"
PARTITIONS = 6


class Scenario:
    """One cluster under the workload; the test injects faults through :attr:`faults` and ends with :meth:`verdict`."""

    def __init__(self, cluster: JosefCluster, seed: int, group_client: Any = "confluent", name: str = "") -> None:
        assert cluster.faults is not None
        self.name = name
        self.cluster = cluster
        self.faults = cluster.faults
        self.history = History(log=cluster.base_dir / "history.jsonl")
        self.faults.listeners.append(self.history.on_fault)
        create_topic(cluster.bootstrap_servers, TOPIC, partitions=PARTITIONS)
        for broker in cluster.brokers:
            eventually(lambda: len([p for p in self.partitions(broker).values() if p[0] >= 0]) == PARTITIONS,
                       timeout=30, what=f"broker {broker.node_id} knowing every partition's leader")
        self.workload = Workload(cluster.bootstrap_servers, TOPIC, history=self.history, seed=seed, parts=[
            Producers(count=2, rate=100, settings=FAULT_PRODUCER),
            Transactions(rate=4, settings=FAULT_PRODUCER),
            Readers(settings=FAULT_CONSUMER),
            Group("g", members=3, client=group_client, settings=FAULT_CONSUMER),
        ])

    def start(self, acknowledged: int = 100) -> Scenario:
        """Start the workload and wait until it runs: ``acknowledged`` records in."""
        self.workload.start()
        self.workload.progress(acknowledged, timeout=90)
        return self

    # What the cluster says -------------------------------------------------------------------------------------

    def partitions(self, node: NodeProcess | None = None) -> dict[int, tuple[int, tuple[int, ...]]]:
        """``{partition: (leader, isr)}`` of the topic, as ``node`` (default: the first running broker) sees it."""
        return partition_states(node or next(n for n in self.cluster.brokers if n.running), TOPIC)

    def active_controller(self) -> int:
        return active_controller(self.cluster)

    def group_coordinator(self, group: str = "g") -> int:
        return group_coordinator(next(n for n in self.cluster.brokers if n.running), group)

    def group_commits_since(self, mono: float, group: str = "g") -> int:
        """Successful offset commits of ``group`` recorded after monotonic time ``mono``."""
        return sum(1 for c in self.history.of(Commit) if c.group == group and c.ok and c.mono > mono)

    def group_keeps_committing(self, within: float = 30, group: str = "g") -> None:
        """The group commits again within ``within`` seconds from now: it has not stopped."""
        now = time.monotonic()
        eventually(lambda: self.group_commits_since(now, group) > 0, timeout=within,
                   what=f"group {group} committing again")

    def wait_fully_replicated(self, timeout: float = 60) -> None:
        """Every partition led and with all three replicas in sync again."""
        eventually(lambda: all(leader >= 0 and len(isr) == 3 for leader, isr in self.partitions().values()),
                   timeout=timeout, what="every partition back to three in-sync replicas")

    # The end -----------------------------------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        """Drain, read everything back, let the group catch up, check; prints the checker's report."""
        final = self.workload.finish(timeout=120)
        verdict = check(self.history, final)
        faults = [e for e in self.faults.events]
        report = f"{len(faults)} faults injected: {', '.join(str(e) for e in faults)}\n{verdict.report()}"
        if self.workload.stuck:
            report += f"\nclients that did not stop within 60 s: {self.workload.stuck}"
        print(f"\n{report}")
        VERDICTS.append((self.name, report))
        assert not self.workload.stuck, f"workload clients did not stop: {self.workload.stuck}"
        return verdict


#: ``(test, report)`` of every verdict, printed at the end of the run (conftest's ``pytest_terminal_summary``).
VERDICTS: list[tuple[str, str]] = []

