"""KRaft clusters of real processes: a replicated metadata quorum, split and combined roles, fencing, failover.

Every node is its own ``josef server start`` process on 127.0.0.1 (the
``josef_cluster`` fixture of ``josef.testing``); faults are SIGKILL and
SIGSTOP by PID. Timeouts are shortened so elections and fencing happen in
seconds; what is measured against them is printed for the closing note.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

ELECTION_TIMEOUT_MS = 500
FETCH_TIMEOUT_MS = 1000
SESSION_TIMEOUT_MS = 2000
FAST = {
    "controller.quorum.election.timeout.ms": str(ELECTION_TIMEOUT_MS),
    "controller.quorum.fetch.timeout.ms": str(FETCH_TIMEOUT_MS),
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "metadata.log.max.record.bytes.between.snapshots": "2048",
}


def describe_quorum(node):
    host, port = node.listener("CONTROLLER")
    client = RawClient(port, host, timeout=5)
    try:
        answer = client.call(ApiKey.DESCRIBE_QUORUM, 2, {"topics": [
            {"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]})
    finally:
        client.close()
    [topic] = answer.topics
    [partition] = topic.partitions
    return partition


def active_controller(controllers):
    """The id of the controller among ``controllers`` that answers DescribeQuorum as the leader, once one does."""
    def leader():
        for node in controllers:
            try:
                answer = describe_quorum(node)
            except OSError:
                continue
            if answer.error_code == ErrorCode.none and answer.leader_id == node.node_id:
                return node.node_id
        return None
    return eventually(leader, what="an active controller")


def topics_on(broker):
    return set(AdminClient({"bootstrap.servers": broker.bootstrap_server}).list_topics(timeout=10).topics)


def listed_brokers(broker):
    return set(AdminClient({"bootstrap.servers": broker.bootstrap_server}).list_topics(timeout=10).brokers)


def create(broker, *names, partitions=3, replication=1):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_server})
    for future in admin.create_topics([NewTopic(n, partitions, replication) for n in names],
                                      operation_timeout=30).values():
        future.result(60)


def wait_everywhere(brokers, *names):
    for broker in brokers:
        eventually(lambda: set(names) <= topics_on(broker), what=f"topics {names} on broker {broker.node_id}")


def test_split_roles_metadata_reaches_every_broker_and_survives_losing_the_active_controller(josef_cluster):
    cluster = josef_cluster(controllers=3, brokers=3, **FAST)
    brokers, controllers = cluster.brokers, cluster.controllers
    create(brokers[0], "before", replication=3)
    wait_everywhere(brokers, "before")

    leader = active_controller(controllers)
    survivors = [c for c in controllers if c.node_id != leader]
    killed_at = time.monotonic()
    cluster.node(leader).kill()
    new_leader = active_controller(survivors)
    elected_in = time.monotonic() - killed_at
    print(f"new active controller {new_leader} elected {elected_in * 1000:.0f} ms after SIGKILL of {leader}")
    assert new_leader != leader
    # A follower notices after the fetch timeout, then at most one randomised election timeout (and a retry).
    assert elected_in < (FETCH_TIMEOUT_MS + 4 * ELECTION_TIMEOUT_MS) / 1000 + 2.0

    # Enough metadata while it is down that the survivors snapshot and trim past what it holds.
    create(brokers[1], *(f"after-{i}" for i in range(30)), partitions=1)
    wait_everywhere(brokers, "before", *(f"after-{i}" for i in range(30)))
    for node in survivors:
        assert list(node.log_dirs[0].glob("__cluster_metadata-0/*.checkpoint")), "no snapshot was written"

    restarted = cluster.node(leader).restart()
    assert restarted.wait_for_log("fetched from the leader) loaded", timeout=30), "no snapshot came from the leader"
    high_watermark = describe_quorum(cluster.node(new_leader)).high_watermark

    def caught_up():
        replicas = {v.replica_id: v.log_end_offset for v in describe_quorum(cluster.node(new_leader)).current_voters}
        return replicas[leader] >= high_watermark
    eventually(caught_up, what=f"controller {leader} catching up")


def test_a_broker_that_stops_heartbeating_is_fenced_then_unfenced(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **FAST)
    first, second, third = cluster.brokers
    eventually(lambda: listed_brokers(first) == {2, 3, 4}, what="three live brokers")
    third.pause()
    try:
        eventually(lambda: listed_brokers(first) == {2, 3}, timeout=SESSION_TIMEOUT_MS / 1000 + 10,
                   what="the paused broker being fenced")
    finally:
        third.resume()
    eventually(lambda: listed_brokers(first) == {2, 3, 4}, what="the resumed broker being unfenced")
    second.kill()
    eventually(lambda: listed_brokers(first) == {2, 4}, timeout=SESSION_TIMEOUT_MS / 1000 + 10,
               what="the killed broker being fenced")
    second.restart()
    eventually(lambda: listed_brokers(first) == {2, 3, 4}, what="the restarted broker being unfenced")


def test_three_combined_nodes_fail_over_and_the_killed_one_rejoins(josef_cluster):
    cluster = josef_cluster(combined=3, **FAST)
    nodes = cluster.nodes
    create(nodes[0], "first")
    wait_everywhere(nodes, "first")
    leader = active_controller(nodes)
    cluster.node(leader).kill()
    alive = [n for n in nodes if n.node_id != leader]
    assert active_controller(alive) != leader
    create(alive[0], "second")
    wait_everywhere(alive, "first", "second")
    cluster.node(leader).restart()
    wait_everywhere(nodes, "first", "second")

    # Kafka's tools read the quorum and its log: who leads, who follows, and the records themselves.
    new_leader = active_controller(nodes)
    status = josef("metadata-quorum", "--bootstrap-server", nodes[0].bootstrap_server, "describe", "--status")
    assert f"LeaderId:               {new_leader}\n" in status
    assert re.search(r'CurrentVoters:\s+\[\{"id": 1, .*\{"id": 2, .*\{"id": 3, ', status)
    replication = josef("metadata-quorum", "--bootstrap-controller", nodes[1].controller_address, "describe",
                        "--replication").splitlines()
    assert replication[0].split() == ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                                      "LastCaughtUpTimestamp", "Status"]
    assert sorted(row.split()[-1] for row in replication[1:]) == ["Follower", "Follower", "Leader"]
    # Every segment and snapshot: where a record lies depends on when the last snapshot was taken.
    metadata_files = sorted(nodes[0].log_dirs[0].glob("__cluster_metadata-0/*.log"))
    metadata_files += sorted(nodes[0].log_dirs[0].glob("__cluster_metadata-0/*.checkpoint"))
    dump = josef("dump-log", "--cluster-metadata-decoder", "--files", ",".join(map(str, metadata_files)))
    assert '"type":"TOPIC_RECORD"' in dump and '"name":"second"' in dump
    # Leader changes are control records of the log: once a snapshot covers them, their segment may be deleted.
    assert "LeaderChange:" in dump or "SnapshotHeader" in dump


def josef(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_voter_list_without_the_node_stops_it_with_one_line(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(f"node.id=5\nprocess.roles=controller\nlisteners=CONTROLLER://127.0.0.1:0\n"
                     f"controller.quorum.voters=1@127.0.0.1:1,2@127.0.0.1:2\nlog.dirs={tmp_path / 'data'}\n")
    run = [sys.executable, "-m", "josef"]
    cluster_id = subprocess.run(run + ["storage", "random-uuid"], capture_output=True, text=True).stdout.strip()
    subprocess.run(run + ["storage", "format", "-t", cluster_id, "-c", str(props)], check=True, capture_output=True)
    started = subprocess.run(run + ["server", "start", str(props)], capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    errors = [line for line in started.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: node.id 5 has the controller role but controller.quorum.voters names only [1, 2]"]


def test_a_broker_formatted_for_another_cluster_is_refused(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=1, start=False, **FAST)
    stranger = cluster.brokers[0]
    cluster.format()
    other = subprocess.run([sys.executable, "-m", "josef", "storage", "random-uuid"], capture_output=True,
                           text=True).stdout.strip()
    for directory in stranger.log_dirs:
        meta = directory / "meta.properties"
        meta.write_text(re.sub(r"cluster.id=.*", f"cluster.id={other}", meta.read_text()))
    cluster.controllers[0].start()
    stranger.start(wait=False)
    assert stranger.wait_for_log("Error: controller 1 answered INCONSISTENT_CLUSTER_ID", timeout=30)
    assert stranger.proc is not None and stranger.proc.wait(timeout=30) != 0
