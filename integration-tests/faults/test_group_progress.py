"""A consumer group keeps consuming while its coordinator's node is killed, another node is frozen and the third is
restarted: the sequence that once left a group of confluent-kafka consumers silent for minutes.

Run with confluent-kafka's consumers and with josef's; after every fault the group must commit again within seconds,
and at the end it has consumed every acknowledged record and committed up to the end of the log (the checker's
group-coverage and group-lag checks).
"""

from __future__ import annotations

import threading

import pytest


@pytest.mark.parametrize("client", ["confluent", "josef"])
def test_a_group_keeps_consuming_through_a_killed_coordinator_a_frozen_node_and_a_restart(scenario, client):
    if client == "josef":
        from josef_client.workload import JosefClient

        group_client = JosefClient()
    else:
        group_client = client
    s = scenario(seed=21, group_client=group_client).start()
    s.group_keeps_committing()
    coordinator = s.group_coordinator()
    s.faults.kill(coordinator)
    s.group_keeps_committing(within=45)  # a new coordinator loads the group from __consumer_offsets
    s.faults.start(coordinator)
    s.wait_fully_replicated()
    # another node than the one coordinating now (the group moved when its coordinator died)
    frozen = next(n.node_id for n in s.cluster.brokers if n.node_id not in (coordinator, s.group_coordinator()))
    s.faults.pause(frozen)
    threading.Event().wait(15)  # the fault's duration: the node stays frozen this long
    s.group_keeps_committing(within=30)
    s.faults.resume(frozen)
    third = next(n.node_id for n in s.cluster.brokers if n.node_id not in (coordinator, frozen))
    s.faults.restart(third)
    s.group_keeps_committing(within=45)
    s.wait_fully_replicated()
    assert s.verdict().ok
