"""Reassignment and leader election tools against a cluster of real processes (1 controller, 3 brokers).

A reordering of a partition's replicas needs no data to move, so it
completes at once; the preferred leader election then moves leadership to
the new first replica. Kafka's admin clients see the same state.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

pytestmark = pytest.mark.metadata

TIMEOUT_S = 60


def josef(*args):
    done = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def partition_line(bootstrap, topic):
    [line] = [l for l in josef("topics", "describe", "--bootstrap-server", bootstrap, "--topic", topic)
              if "Partition: 0" in l]
    return line


def test_reorder_replicas_then_elect_the_preferred_leader(josef_cluster, tmp_path):
    cluster = josef_cluster(controllers=1, brokers=3, **{"broker.heartbeat.interval.ms": "200"})
    b = cluster.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=20000)
    try:
        admin.create_topics([NewTopic("moved", num_partitions=-1, replication_factor=-1,
                                      replica_assignments={0: [2, 3, 4]})])
        brokers = sorted(node.node_id for node in cluster.brokers)
        assert brokers == [2, 3, 4]
        assert "\tLeader: 2\tReplicas: 2,3,4\tIsr: 2,3,4\tElr: \tLastKnownElr: " in partition_line(b, "moved")
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "moved", "partition": 0,
                                                                  "replicas": [4, 3, 2]}]}))
        out = josef("reassign-partitions", "--bootstrap-server", b, "--execute", "--reassignment-json-file", str(plan))
        assert out[0] == "Current partition replica assignment"
        assert json.loads(out[2])["partitions"][0]["replicas"] == [2, 3, 4]
        assert out[-1] == "Successfully started partition reassignment for moved-0"
        assert josef("reassign-partitions", "--bootstrap-server", b, "--verify", "--reassignment-json-file",
                     str(plan)) == ["Status of partition reassignment:",
                                    "Reassignment of partition moved-0 is completed.",
                                    "Clearing broker-level throttles on brokers 2,3,4",
                                    "Clearing topic-level throttles on topic moved"]
        assert josef("reassign-partitions", "--bootstrap-server", b, "--list") == ["No partition reassignments found."]
        assert admin.list_partition_reassignments() == {}
        assert "\tLeader: 2\tReplicas: 4,3,2" in partition_line(b, "moved")
        assert josef("leader-election", "--bootstrap-server", b, "--election-type", "preferred", "--topic", "moved",
                     "--partition", "0") == ["Successfully completed leader election (PREFERRED) for partitions moved-0"]
        assert "\tLeader: 4\tReplicas: 4,3,2" in partition_line(b, "moved")
        assert josef("leader-election", "--bootstrap-server", b, "--election-type", "preferred",
                     "--all-topic-partitions") == []
        assert josef("leader-election", "--bootstrap-server", b, "--election-type", "unclean", "--topic", "moved",
                     "--partition", "0") == ["Valid replica already elected for partitions moved-0"]
    finally:
        admin.close()
