"""The protocol fuzzer at CI scale, against live broker processes (benchmarks/fuzz.py runs it at a million inputs).

- The single-node default (``josef server start`` with only its listener
  and log directory set): real clients' traffic is captured through a
  recording proxy, then a few thousand inputs are sent, requests drawn from
  every API and version its ApiVersions advertises (valid and broken) and
  byte mutations of the captured frames. Each must be answered in its
  version or refused by closing the connection; between batches the broker
  must be alive, log no error, answer ApiVersions and a produce/fetch round
  trip, hold no connection once the fuzzer's are closed, and stay under a
  memory bound. Any finding fails the test, with the fuzzer's report.
- A 3-node cluster (combined roles): a few hundred inputs to node 1's
  controller listener (Raft, broker registration and heartbeats) and to its
  broker listener, with every node alive and the cluster still producing
  and fetching afterwards.

``JOSEF_FUZZ_INPUTS`` and ``JOSEF_FUZZ_SEED`` change the size and the seed
(a failure names its seed, so it can be replayed).
"""

from __future__ import annotations

import os

import pytest
from kafka.admin import KafkaAdminClient

from conftest import backend_overrides
from josef.testing.fuzz import (
    FUZZ_TOPICS,
    HEALTH_TOPIC,
    BrokerProcess,
    ClusterNode,
    Fuzzer,
    api_versions,
    cap_memory,
    capture_client_sessions,
    create_topics,
    health_problem,
)

INPUTS = int(os.environ.get("JOSEF_FUZZ_INPUTS", "2500"))
SEED = int(os.environ.get("JOSEF_FUZZ_SEED", "20261127"))
#: The default broker's RSS stays well under this through a run (about 80 MB idle, 150 MB fuzzed).
RSS_LIMIT = 600 << 20


@pytest.fixture(scope="module")
def default_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("fuzz"), extra=backend_overrides())
    try:
        create_topics(broker, [HEALTH_TOPIC], partitions=1)
        create_topics(broker, FUZZ_TOPICS)
        yield broker
    finally:
        status = broker.stop()
    assert status == 0, f"the broker exited with {status} after SIGTERM"


def test_describe_quorum_of_the_default_broker_with_a_third_party_admin_client(default_broker):
    """kafka-python asks DescribeQuorum v2; the in-process voter once made an answer that failed to encode
    (its placeholder port -1), and the connection was closed instead."""
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{default_broker.port}", request_timeout_ms=30_000)
    try:
        quorum = admin.describe_metadata_quorum()
    finally:
        admin.close()
    [topic] = quorum["topics"]
    [partition] = topic["partitions"]
    assert partition["error"] is None and partition["leader_id"] == 1
    assert [v["replica_id"] for v in partition["current_voters"]] == [1]
    assert [(n["node_id"], [(l["name"], l["host"], l["port"]) for l in n["listeners"]]) for n in quorum["nodes"]] \
        == [(1, [("PLAINTEXT", "127.0.0.1", default_broker.port)])]


def test_fuzz_the_default_broker(default_broker):
    capture = capture_client_sessions((default_broker.host, default_broker.port))
    assert capture.errors == [], "the client sessions failed before any fuzzing"
    assert len(capture.frames) > 30
    fuzzer = Fuzzer(default_broker, corpus=capture.frames, check_every=max(INPUTS // 3, 1), rss_limit=RSS_LIMIT)
    report = fuzzer.run(INPUTS, seed=SEED)
    print(report.text())
    assert report.inputs == INPUTS
    assert len(report.by_api) > 40, "requests of most APIs were drawn"
    assert not report.findings, f"the fuzzer found problems (seed {SEED}):\n{report.text()}"


def test_fuzz_a_cluster_s_inter_broker_apis(josef_cluster):
    cluster = josef_cluster(combined=3)
    broker = ClusterNode(cluster.node(1))
    create_topics(broker, [HEALTH_TOPIC], partitions=1, replicas=3)
    nodes = [ClusterNode(cluster.node(i)) for i in (1, 2, 3)]
    for node in nodes:
        cap_memory(node.pid)

    def healthy() -> str | None:
        for node in nodes:
            if not node.node.running:
                return f"node {node.node.node_id} exited"
        return health_problem(broker)

    for listener in ("CONTROLLER", "PLAINTEXT"):
        target = ClusterNode(cluster.node(1), listener)
        fuzzer = Fuzzer(target, versions=api_versions(target), check_every=max(INPUTS // 20, 1), reset=False,
                        healthy=healthy, admin=broker, rss_limit=RSS_LIMIT)
        report = fuzzer.run(max(INPUTS // 10, 1), seed=SEED)
        print(f"node 1's {listener} listener:\n{report.text()}")
        assert not report.findings, f"the fuzzer found problems on {listener} (seed {SEED}):\n{report.text()}"
    for node in nodes[1:]:
        errors = [line for line in node.new_log_lines() if " ERROR " in line or "Traceback" in line]
        assert not errors, f"node {node.node.node_id} logged errors:\n" + "\n".join(errors[:20])
