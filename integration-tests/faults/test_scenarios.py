"""Each fault of issue 23's list against a 3-broker cluster under load, ending with the history checker's verdict.

The workload (conftest.Scenario) runs idempotent producers, a transactional
producer that commits and aborts, a read_committed reader and a consumer group
of three throughout; every test ends by reading everything back and checking
that no acknowledged record is lost or duplicated, order holds, transactions
are atomic for read_committed readers, and the group's offsets only move forward
and reach the end of the log.
"""

from __future__ import annotations

from scenario import TOPIC, Scenario

from josef.testing import eventually


def _leader_elsewhere(s: Scenario) -> tuple[int, int]:
    """A partition and its leader, led by a node that is not the active controller."""
    controller = s.active_controller()
    return next((p, leader) for p, (leader, _) in sorted(s.partitions().items()) if leader != controller)


def _new_leader(s: Scenario, partition: int, old: int) -> None:
    """Wait until a node other than ``old`` says another node leads ``partition``."""
    witness = next(n for n in s.cluster.brokers if n.node_id != old)
    eventually(lambda: s.partitions(witness)[partition][0] not in (old, -1), timeout=45,
               what=f"a leader other than {old} for partition {partition}")


def test_a_leader_cut_off_from_the_controller_and_its_followers_stops_acknowledging_and_is_truncated(scenario):
    s = scenario(seed=11).start()
    partition, leader = _leader_elsewhere(s)
    s.faults.partition([leader])  # from every other node, both ways; clients still reach it
    _new_leader(s, partition, leader)
    s.workload.progress(100)  # the new leaders take the writes
    s.faults.heal()
    # what it appended alone, acknowledged to nobody, goes when it follows the new leader
    assert s.cluster.node(leader).wait_for_log(f"truncating {TOPIC}-{partition} ", timeout=45)
    s.wait_fully_replicated()
    assert s.verdict().ok


def test_the_active_controller_cut_off_from_the_other_voters_loses_its_leadership(scenario):
    s = scenario(seed=12).start()
    controller = s.active_controller()
    led = [p for p, (leader, _) in s.partitions().items() if leader == controller]  # none when split
    voters = [n.node_id for n in s.cluster.controllers if n.node_id != controller]
    s.faults.partition([controller], voters)
    eventually(lambda: s.active_controller() != controller, timeout=45, what="another voter elected")
    # The other brokers' heartbeats, hanging on the silent old controller, go to the new one as soon as it is
    # elected: it fences only the old one, within a session (4 s), and its partitions move. (They once waited for
    # the request timeout, 30 s, and the new controller fenced every broker meanwhile.)
    witness = next(n for n in s.cluster.brokers if n.node_id != controller)
    eventually(lambda: all(s.partitions(witness)[p][0] not in (controller, -1) for p in led), timeout=20,
               what=f"partitions {led} of the old controller led elsewhere")
    s.workload.progress(100)
    s.faults.heal()
    s.wait_fully_replicated()
    assert s.verdict().ok


def test_a_follower_partitioned_away_leaves_the_isr_and_rejoins_after_catching_up(scenario):
    s = scenario(seed=13).start()
    controller = s.active_controller()
    partition, (leader, isr) = next((p, v) for p, v in sorted(s.partitions().items())
                                    if any(r not in (v[0], controller) for r in v[1]))
    follower = next(r for r in isr if r not in (leader, controller))
    s.faults.partition([follower])
    eventually(lambda: follower not in s.partitions(s.cluster.node(leader))[partition][1], timeout=45,
               what=f"follower {follower} out of the ISR of partition {partition}")
    s.workload.progress(100)
    s.faults.heal()
    eventually(lambda: follower in s.partitions(s.cluster.node(leader))[partition][1], timeout=60,
               what=f"follower {follower} back in the ISR of partition {partition}")
    assert s.verdict().ok


def test_a_leader_whose_packets_to_the_other_nodes_are_lost_one_way_is_replaced(scenario):
    s = scenario(seed=14).start()
    partition, leader = _leader_elsewhere(s)
    s.faults.partition([leader], one_way=True)  # it hears the others; nobody hears it
    _new_leader(s, partition, leader)
    s.workload.progress(100)
    s.faults.heal()
    s.wait_fully_replicated()
    assert s.verdict().ok


def test_slow_lossy_links_between_the_nodes(scenario):
    s = scenario(latency=True, seed=15).start()
    s.faults.slow(200, 20)  # 200 ms ± 20 each way on every link between nodes
    s.faults.loss(10)
    s.workload.progress(100, timeout=120)
    s.faults.heal()
    s.wait_fully_replicated()
    assert s.verdict().ok


def test_a_full_disk_on_one_replica_under_load(scenario):
    s = scenario(disk_mb=96, seed=16).start()
    controller = s.active_controller()
    victim = next(n.node_id for n in s.cluster.brokers if n.node_id != controller)
    s.faults.fill_disk(victim)
    witness = next(n for n in s.cluster.brokers if n.node_id != victim)
    eventually(lambda: all(victim not in isr for _, isr in s.partitions(witness).values()), timeout=60,
               what=f"node {victim} out of every ISR once its disk is full")
    s.workload.progress(100)
    s.faults.free_disk(victim)
    s.faults.restart(victim)  # a failed log directory comes back with a restart, as in Kafka
    s.wait_fully_replicated()
    assert s.verdict().ok


def test_a_rolling_restart_of_every_node_under_load(scenario):
    s = scenario(seed=17).start()
    for node in list(s.cluster.nodes):
        s.faults.restart(node)
        s.wait_fully_replicated()
        s.workload.progress(100)
    assert s.verdict().ok


def test_a_seeded_nemesis_kills_freezes_and_partitions_nodes(scenario):
    from josef.testing.faults import Nemesis

    s = scenario(seed=18).start()
    nemesis = Nemesis(s.faults, seed=18, kinds=["kill", "pause", "partition", "partition-one-way"],
                      targets={"any": lambda rnd: [rnd.choice(s.cluster.nodes).node_id]},
                      duration_s=(3, 6), rest_s=(4, 6))
    for step in nemesis.schedule(4):
        nemesis.apply(step)
        s.wait_fully_replicated(timeout=90)
    s.workload.progress(100)
    print("nemesis schedule (seed 18):", nemesis.steps)
    assert s.verdict().ok
