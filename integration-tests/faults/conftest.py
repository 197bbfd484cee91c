"""The ``scenario`` fixture of the fault scenarios (scenario.py has the rest)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from scenario import VERDICTS, Scenario

from josef.node.cluster import JosefCluster
from josef.testing.faults import REPLICATED_FAST


@pytest.fixture(params=["combined", "split"])
def scenario(request: pytest.FixtureRequest, josef_cluster: Callable[..., JosefCluster]) -> Iterator[Callable[..., Scenario]]:
    """``scenario(latency=False, disk_mb=None, seed=N, group_client="confluent")``: a started 3-broker cluster on the fault harness, its
    workload built (not started): combined nodes, or 3 controllers and 3 brokers."""
    made: list[Scenario] = []

    def make(*, latency: bool = False, disk_mb: int | None = None, seed: int = 1, group_client: Any = "confluent",
             **overrides: str) -> Scenario:
        layout = {"combined": 3} if request.param == "combined" else {"controllers": 3, "brokers": 3}
        cluster = josef_cluster(**layout, faults=True, latency=latency, disk_mb=disk_mb, **{**REPLICATED_FAST, **overrides})
        made.append(Scenario(cluster, seed, group_client, name=request.node.nodeid))
        return made[-1]

    yield make
    for scenario in made:
        scenario.workload.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each scenario's faults and the checker's verdict, passed or not: the run's evidence, in the CI log."""
    if VERDICTS:
        terminalreporter.section("fault scenarios: faults injected and the history checker's verdicts")
        for name, report in VERDICTS:
            terminalreporter.write_line(name)
            for line in report.splitlines():
                terminalreporter.write_line(f"    {line}")
