"""The process cluster harness: real ``josef server start`` processes, configured as a Kafka KRaft cluster is.

Today's josef runs a single KRaft voter, so the processes started here are
one-node clusters; the properties of bigger clusters are checked as written,
without starting them. Every process is stopped by its PID, and nothing here
waits by sleeping: readiness and log lines are waited for as events.
"""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode as E

from josef.config import read_properties
from josef.metadata.meta_properties import read as read_meta_properties
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch, iter_batches, iter_records
from josef.node.server_properties import load_config
from josef.testing import JosefCluster, NodeProcess, RawClient, free_ports

pytest_plugins = ["pytester"]


# Without starting anything ---------------------------------------------------------------------------------


def test_free_ports_are_distinct_bindable_and_not_given_twice():
    first = free_ports(12)
    second = free_ports(12)
    assert len(set(first)) == 12 and len(set(second)) == 12
    assert not set(first) & set(second)
    sockets = []
    try:
        for port in first:
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
    finally:
        for sock in sockets:
            sock.close()
    assert free_ports(0) == []


def test_free_ports_lie_below_the_kernels_ephemeral_range():
    # Ports the kernel hands to bind(0) and outgoing connections could be taken while a node restarts.
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(port < floor for port in free_ports(20))


def test_parallel_test_workers_draw_free_ports_from_disjoint_slices(monkeypatch):
    # A port free while its node is down for a restart must not go to another worker's cluster.
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    drawn = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = free_ports(30)
    slice_size = (floor - 10_000) // 4
    for index, worker in enumerate(("gw0", "gw1", "gw2"), start=1):
        low = 10_000 + index * slice_size
        assert all(low <= port < low + slice_size for port in drawn[worker]), (worker, drawn[worker])


def test_split_cluster_writes_kafka_properties_for_every_node(tmp_path):
    cluster = JosefCluster(tmp_path, controllers=3, brokers=3,
                           overrides={"num.partitions": "6", "log.segment.bytes": "1048576"},
                           node_overrides={5: {"num.partitions": "2", "log.segment.bytes": None}})
    paths = cluster.write_properties()
    assert paths == [tmp_path / f"node-{i}" / "server.properties" for i in range(1, 7)]
    props = {i: read_properties(path) for i, path in zip(range(1, 7), paths)}

    controller_ports = [cluster.node(i).listener("CONTROLLER")[1] for i in (1, 2, 3)]
    broker_ports = [cluster.node(i).listener("PLAINTEXT")[1] for i in (4, 5, 6)]
    assert len(set(controller_ports + broker_ports)) == 6
    voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in zip((1, 2, 3), controller_ports))
    for node_id in (1, 2, 3):
        assert props[node_id]["process.roles"] == "controller"
        assert props[node_id]["listeners"] == f"CONTROLLER://127.0.0.1:{controller_ports[node_id - 1]}"
    for node_id in (4, 5, 6):
        assert props[node_id]["process.roles"] == "broker"
        assert props[node_id]["listeners"] == f"PLAINTEXT://127.0.0.1:{broker_ports[node_id - 4]}"
    for node_id, p in props.items():
        assert p["node.id"] == str(node_id)
        assert p["controller.quorum.voters"] == voters
        assert p["controller.listener.names"] == "CONTROLLER"
        assert p["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        assert p["log.dirs"] == str(tmp_path / f"node-{node_id}" / "data")
        assert p["num.partitions"] == ("2" if node_id == 5 else "6")
        assert ("log.segment.bytes" in p) == (node_id != 5)  # an override of None removes the key
        # josef reads every file as a valid configuration.
        config = load_config(paths[node_id - 1])
        assert config["node.id"] == node_id

    assert cluster.bootstrap_servers == ",".join(f"127.0.0.1:{p}" for p in broker_ports)
    assert cluster.controller_bootstrap == ",".join(f"127.0.0.1:{p}" for p in controller_ports)
    assert cluster.voters == voters
    assert [n.node_id for n in cluster.controllers] == [1, 2, 3]
    assert [n.node_id for n in cluster.brokers] == [4, 5, 6]
    assert cluster[4] is cluster.node(4)
    assert all(n.pid is None and not n.running for n in cluster.nodes)
    assert not (tmp_path / "node-1" / "data").exists()  # nothing formatted, nothing started


def test_combined_nodes_carry_both_listeners(tmp_path):
    cluster = JosefCluster(tmp_path, combined=3, first_node_id=0)
    assert [n.node_id for n in cluster.nodes] == [0, 1, 2]
    assert cluster.brokers == cluster.controllers == cluster.nodes
    for node in cluster.nodes:
        assert node.properties["process.roles"] == "broker,controller"
        broker, controller = node.listener("PLAINTEXT"), node.listener("CONTROLLER")
        assert node.properties["listeners"] == f"PLAINTEXT://127.0.0.1:{broker[1]},CONTROLLER://127.0.0.1:{controller[1]}"
    assert cluster.voters == ",".join(f"{n.node_id}@{n.controller_address}" for n in cluster.nodes)
    assert len(cluster.bootstrap_servers.split(",")) == len(cluster.controller_bootstrap.split(",")) == 3


@pytest.mark.parametrize("counts, message", [
    ({"brokers": 3}, "at least one controller"),
    ({"combined": -1, "controllers": 1}, "negative"),
    ({"combined": 1, "node_overrides": {7: {}}}, r"names nodes \[7\]"),
])
def test_impossible_clusters_are_refused(tmp_path, counts, message):
    with pytest.raises(ValueError, match=message):
        JosefCluster(tmp_path, **counts)


# Real processes --------------------------------------------------------------------------------------------


def api_versions_error(port: int) -> int:
    client = RawClient(port)
    try:
        return client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "harness",
                                                    "client_software_version": "1"}).error_code
    finally:
        client.close()


def produce(port: int, topic: str, values: list[bytes]) -> None:
    client = RawClient(port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": topic, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 10000, "validate_only": False})
        assert created.topics[0].error_code in (E.none, E.topic_already_exists)
        batch = build_batch([(None, value, 1000 + i) for i, value in enumerate(values)])
        response = client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout": 10000,
                                                   "topic_data": [{"name": topic, "partition_data": [
                                                       {"index": 0, "records": batch}]}]})
        assert response.responses[0].partition_responses[0].error_code == E.none
    finally:
        client.close()


def consume(port: int, topic: str) -> list[bytes]:
    client = RawClient(port)
    try:
        response = client.call(ApiKey.FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                        "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
        data = response.responses[0].partitions[0]
        assert data.error_code == E.none
        records = data.records or b""
        return [r.value for pos, h in iter_batches(records) for r in iter_records(records[pos:pos + h.size])]
    finally:
        client.close()


def test_one_node_cluster_starts_serves_survives_kill_9_and_stops(josef_cluster):
    cluster = josef_cluster(combined=1)
    (node,) = cluster.nodes
    assert node.running and node.pid is not None
    host, port = node.listener("PLAINTEXT")
    assert cluster.bootstrap_servers == f"127.0.0.1:{port}" and node.bound_port == port
    assert cluster.controller_bootstrap == node.controller_address
    assert re.search(rf"josef broker 1 ready on PLAINTEXT://127.0.0.1:{port}, CONTROLLER://", node.log)
    data_dir = node.log_dirs[0]
    assert read_meta_properties(data_dir).cluster_id == cluster.cluster_id
    assert api_versions_error(port) == E.none

    produce(port, "orders", [b"one", b"two", b"three"])
    assert consume(port, "orders") == [b"one", b"two", b"three"]

    pid = node.pid
    assert node.kill() == -signal.SIGKILL
    assert not node.running and node.pid is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()

    node.restart()  # same properties: same port, same log directory
    assert node.pid != pid and node.bound_port == port
    assert consume(port, "orders") == [b"one", b"two", b"three"]
    assert read_meta_properties(data_dir).cluster_id == cluster.cluster_id

    cluster.stop()
    assert not node.running
    assert node.wait_for_log("josef broker 1 stopped", timeout=0)  # a clean shutdown, not a kill


def test_pause_freezes_a_node_until_resumed(josef_cluster):
    node = josef_cluster(combined=1).nodes[0]
    client = RawClient(node.bound_port, timeout=30)
    try:
        node.pause()
        client.send(ApiKey.API_VERSIONS, 0, {})
        client.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):  # the kernel took the request; the frozen process cannot answer
            client.sock.recv(1, socket.MSG_PEEK)
        client.sock.settimeout(30)
        node.resume()
        assert client.receive().error_code == E.none  # the same request, answered once the node runs again
    finally:
        client.close()
    node.pause()
    assert node.stop() == 0  # a paused node is continued so it can act on SIGTERM


def test_wait_for_log_is_an_event_on_the_current_process(josef_cluster):
    node = josef_cluster(combined=1).nodes[0]
    assert node.wait_for_log("ready on PLAINTEXT://", timeout=0)
    assert node.wait_for_log(re.compile(r"cluster \S{22}"), timeout=0)
    assert not node.wait_for_log("a line nobody prints", timeout=0.2)
    node.stop()
    # After the process ended, a missing line is known at once, whatever the timeout.
    assert not node.wait_for_log("a line nobody prints", timeout=600)


def test_a_node_that_cannot_start_fails_fast_with_its_log(tmp_path):
    node = NodeProcess(1, ["broker", "controller"], {"listeners": "PLAINTEXT://127.0.0.1:notaport",
                                                     "log.dirs": str(tmp_path / "data")}, tmp_path)
    with pytest.raises(RuntimeError, match=r"(?s)josef node 1 \(broker,controller\) exited with status 1.*notaport"):
        node.start()
    assert not node.running and node.pid is None


def test_a_failing_test_reports_every_nodes_log_tail(pytester):
    pytester.makepyfile("""
        def test_fails(josef_cluster):
            cluster = josef_cluster(combined=1)
            assert cluster.nodes[0].running
            assert False, "on purpose"
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*josef cluster 1 logs*", "--- josef node 1 (broker,controller)*",
                                 "*josef broker 1 ready on PLAINTEXT://127.0.0.1:*"])
