"""``josef cluster status`` as CI runs it: ``python -m josef cluster status ...`` against three combined nodes.

The cluster (``josef_cluster``, every node its own process) has a topic with
three replicas and a consumer group left with a known lag; one node is
SIGKILLed by PID and started again while the command is polled: its exit
status and last line must follow the cluster from healthy to needing
attention (fenced broker, under-replicated partitions) and back. Timeouts are
shortened so fencing takes seconds. The command reads what every metadata
backend serves alike, so no backend marker: it runs once, in the kraft/local
cell. The verdict's rules for states this cluster never reaches (offline
partitions, under-min-ISR, group lag over a threshold, no controller) are
checked on :func:`josef_client.commands.cluster_status.problems` directly.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from josef.testing import eventually
from josef_client.commands.cluster_status import (
    Broker,
    ClusterStatus,
    Group,
    GroupPartition,
    Partition,
    Quorum,
    QuorumNode,
    Thresholds,
    as_json,
    problems,
    text_lines,
)

FAST = {
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1000",
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "2000",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "3",
    "group.initial.rebalance.delay.ms": "0",
}
PRODUCED, CONSUMED = 10, 4


def cluster_status(cluster, *args: str) -> tuple[int, str]:
    """The command's exit status and stdout (its stderr must be empty: one command, no noise)."""
    done = subprocess.run([sys.executable, "-m", "josef", "cluster", "status", "--bootstrap-server",
                           cluster.bootstrap_servers, *args], capture_output=True, text=True, timeout=90)
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout


def leave_lag(bootstrap: str, topic: str, group: str) -> None:
    """Produce PRODUCED records to partition 0, consume CONSUMED of them in ``group`` and commit: lag PRODUCED - CONSUMED."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(PRODUCED):
        producer.produce(topic, f"record-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        seen = eventually(lambda: consumer.poll(0.5), timeout=30, what="the first record")
        assert seen.error() is None and seen.offset() == 0, seen.error()
        consumer.commit(offsets=[TopicPartition(topic, 0, CONSUMED)], asynchronous=False)
    finally:
        consumer.close()


def test_status_follows_a_broker_killed_and_restarted(josef_cluster):
    cluster = josef_cluster(combined=3, **FAST)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("orders", 1, 3, config={"min.insync.replicas": "2"})])["orders"].result(30)
    leave_lag(cluster.bootstrap_servers, "orders", "billing")
    lag = PRODUCED - CONSUMED

    code, out = cluster_status(cluster)
    assert code == 0, out
    for node in cluster.nodes:
        assert re.search(rf"^{node.node_id}\s+127\.0\.0\.1:{node.listener('PLAINTEXT')[1]}\s+-\s+", out, re.M), out
    assert re.search(r"^Controller:\s+[123] \(quorum leader, epoch \d+", out, re.M), out
    assert re.search(rf"^billing\s+\S+\s+1\s+{lag}\s+{lag}\b", out, re.M), out
    assert out.rstrip().endswith("Status: healthy"), out

    code, out = cluster_status(cluster, "--json")
    report = json.loads(out)
    assert code == 0 and report["healthy"] and report["problems"] == [], out
    assert [b["node_id"] for b in report["brokers"]] == [1, 2, 3]
    [group] = report["groups"]
    assert (group["group_id"], group["lag"], group["partitions"][0]["lag"]) == ("billing", lag, lag)
    victim = cluster.node(next(n.node_id for n in cluster.nodes if n.node_id != report["controller_id"]))

    victim.kill()

    def needs_attention() -> str | None:
        code, out = cluster_status(cluster)
        verdict = out.rstrip().splitlines()[-1]
        return verdict if code == 1 and "under-replicated partition" in verdict else None

    verdict = eventually(needs_attention, timeout=30, what="the status reporting under-replicated partitions")
    assert verdict.startswith("Status: needs attention: "), verdict
    assert f"broker {victim.node_id} (127.0.0.1:{victim.listener('PLAINTEXT')[1]}) is fenced" in verdict
    assert "orders-0" in verdict

    victim.start()

    def healthy() -> str | None:
        code, out = cluster_status(cluster)
        return out if code == 0 else None

    out = eventually(healthy, timeout=60, what="the status healthy again after the restart")
    assert re.search(rf"^billing\s+\S+\s+1\s+{lag}\s+{lag}\b", out, re.M), out


def test_problems_name_what_needs_attention():
    """The verdict's rules, on states the cluster test does not reach."""
    quorum = Quorum(1, 3, 100, (QuorumNode(1, "Leader", 100, 0, 0), QuorumNode(2, "Follower", 90, 10, 20_000),
                                QuorumNode(3, "Follower", 100, 0, 150)))
    status = ClusterStatus(
        "id", 1, (Broker(1, "h", 1, None), Broker(2, "h", 2, None, fenced=True)), quorum, 1,
        (Partition("t", 0, -1, (1, 2), (), 1), Partition("t", 1, 1, (1, 2, 3), (1,), 2), Partition("t", 2, 1, (1, 2), (1, 2), 2)),
        (Group("g", "Stable", (GroupPartition("t", 2, 5, 50),)), Group("h", "Empty", error="COORDINATOR_NOT_AVAILABLE")),
        {"metadata quorum": "boom"})
    thresholds = Thresholds(group_lag=10, voter_lag_ms=10_000)
    found = problems(status, thresholds)
    assert [p.kind for p in found] == ["fenced_broker", "lagging_voter", "offline", "under_replicated", "under_min_isr",
                                       "group_lag", "unreadable", "unreadable"]
    lines = text_lines(status, found, thresholds)
    assert lines[-1] == "Status: needs attention: " + "; ".join(p.message for p in found)
    assert re.search(r"^t\s+0\s+none\s+1,2\s+-\s+1\s+offline,under-replicated,under-min-ISR$", "\n".join(lines), re.M), lines
    assert json.loads(json.dumps(as_json(status, found)))["offline_partitions"] == 1
    # Lag is only reported without a threshold; a voter is judged by time, not records.
    assert "group_lag" not in [p.kind for p in problems(status, Thresholds(voter_lag_ms=30_000))]
    assert "lagging_voter" not in [p.kind for p in problems(status, Thresholds(voter_lag_ms=30_000))]
    leaderless = ClusterStatus(None, -1, (), Quorum(-1, 4, -1, ()), 0, (), ())
    assert [p.message for p in problems(leaderless, Thresholds())] == ["no active controller"]
    assert problems(ClusterStatus("id", 1, (Broker(1, "h", 1, None),), None, 0, (), ()), Thresholds()) == []
