"""Clusters on the ZooKeeper metadata quorum (josef-metadata-zk): three combined nodes, any of which ZooKeeper may
elect controller, each its own ``josef server start`` process, on a real ZooKeeper started by the test.

The replication chaos test runs on ZooKeeper too (test_replication.py). These tests take the ZooKeeper-specific
faults: the active controller frozen past its ZooKeeper session (another node takes over, and the frozen one, once
resumed, writes nothing more), and one server of a 3-server ensemble killed under a running producer.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from confluent_kafka.admin import AdminClient
from josef_metadata_zk.testing import ZooKeeperEnsemble, read_znode
from test_replication import (
    FAST,
    PARTITIONS,
    Load,
    check_every_acknowledged_record,
    create_topic,
    full_isr,
    partitions_of,
    read_all,
    zookeeper_settings,
)

from josef.testing import eventually


def active_controller(zk_connect: str) -> tuple[int, int]:
    """``(node id in /controller, /controller_epoch)``; node -1 while nobody holds /controller."""
    data = read_znode(zk_connect, "/controller")
    return (json.loads(data)["brokerid"] if data else -1), int(read_znode(zk_connect, "/controller_epoch") or b"0")


def topics_seen_by(node, names: set[str]) -> bool:
    """Whether ``node``'s own metadata has every topic of ``names`` with a leader for each partition."""
    metadata = AdminClient({"bootstrap.servers": node.bootstrap_server}).list_topics(timeout=10)
    return all(name in metadata.topics and all(p.leader >= 0 for p in metadata.topics[name].partitions.values())
               for name in names)


def quorum_tool(bootstrap_server: str, option: str) -> str:
    """``josef metadata-quorum --bootstrap-server ... describe OPTION``'s output (Kafka's kafka-metadata-quorum.sh)."""
    result = subprocess.run([sys.executable, "-m", "josef", "metadata-quorum", "--bootstrap-server", bootstrap_server,
                             "describe", option], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def registered(zk_connect: str, node) -> dict | None:
    """``/brokers/ids/<id>`` of ``node`` as JSON, None while it has none."""
    data = read_znode(zk_connect, f"/brokers/ids/{node.node_id}")
    return json.loads(data) if data else None


def test_a_frozen_controller_is_replaced_and_writes_nothing_once_resumed(josef_cluster, zk_connect):
    cluster = josef_cluster(combined=3, **FAST, **zookeeper_settings(zk_connect))
    create_topic(cluster, "before")
    full_isr(cluster, "before")
    for node in cluster.nodes:  # each broker's registration, as Kafka 3.x's brokers kept it
        eventually(lambda node=node: registered(zk_connect, node) is not None, what=f"/brokers/ids/{node.node_id}")
        assert f"PLAINTEXT://{node.bootstrap_server}" in registered(zk_connect, node)["endpoints"]
    controller_id, epoch = active_controller(zk_connect)
    frozen = cluster.node(controller_id)
    with Load(cluster, "before") as load:
        frozen.pause()
        paused_at = time.monotonic()
        try:
            # Its ZooKeeper session (6 s) expires, /controller and /brokers/ids/<id> go with it, another is elected.
            eventually(lambda: active_controller(zk_connect)[0] not in (-1, controller_id), timeout=60,
                       what=f"a controller other than the frozen node {controller_id}")
            took = time.monotonic() - paused_at
            assert registered(zk_connect, frozen) is None
            new_id, new_epoch = active_controller(zk_connect)
            assert new_epoch > epoch
            create_topic(cluster, "while-frozen")  # metadata changes go on under the new controller
            load.progress()
        finally:
            frozen.resume()
        # Resumed, it learns its session is gone (or has its first write refused by the epoch check): it says so,
        # and from then on forwards to the new controller like any broker.
        assert frozen.wait_for_log("is no longer the active controller", timeout=60)
        eventually(lambda: registered(zk_connect, frozen) is not None, what="the resumed node registered again")
        full_isr(cluster, "before")
        load.progress()
    assert active_controller(zk_connect) == (new_id, new_epoch), "the resumed node took nothing back"
    eventually(lambda: all(topics_seen_by(node, {"before", "while-frozen"}) for node in cluster.nodes), timeout=60,
               what="every node's metadata holding both topics")
    # Kafka 3.x's view in ZooKeeper, kept by whichever node is the controller, agrees with what brokers answer.
    def zookeeper_view_agrees() -> bool:
        for p, (leader, _, isr) in partitions_of(cluster, "before").items():
            data = read_znode(zk_connect, f"/brokers/topics/before/partitions/{p}/state")
            state = json.loads(data) if data else None
            if state is None or (state["leader"], tuple(sorted(state["isr"]))) != (leader, isr):
                return False
        return True
    eventually(zookeeper_view_agrees, what="/brokers/topics/before/partitions/<p>/state matching the brokers' metadata")
    assignment = json.loads(read_znode(zk_connect, "/brokers/topics/before"))
    assert assignment["version"] == 3 and sorted(assignment["partitions"]) == [str(p) for p in range(PARTITIONS)]
    # Kafka's quorum tool, through any broker: the active controller leads, at its controller epoch.
    status = quorum_tool(cluster.node(controller_id).bootstrap_server, "--status")
    assert f"LeaderId:               {new_id}\n" in status and f"LeaderEpoch:            {new_epoch}\n" in status
    assert re.search(rf'CurrentVoters:\s+\[\{{"id": {new_id}, .*"endpoints": \["CONTROLLER://127', status), status
    high_watermark = int(re.search(r"HighWatermark:\s+(\d+)", status).group(1))
    assert high_watermark > 0
    rows = quorum_tool(cluster.node(new_id).bootstrap_server, "--replication").splitlines()[1:]
    assert sorted(row.split()[-1] for row in rows) == ["Leader", "Observer", "Observer"], rows
    acknowledged = check_every_acknowledged_record(load, read_all(cluster, "before"))
    print(f"\ncontroller {controller_id} frozen: node {new_id} elected after {took:.1f} s (epoch {epoch} -> "
          f"{new_epoch}); {acknowledged} acknowledged records read back")


def test_killing_one_server_of_a_three_server_ensemble_stops_nothing(josef_cluster, tmp_path):
    with ZooKeeperEnsemble(tmp_path / "zookeeper", servers=3) as ensemble:
        zk_connect = f"{ensemble.connect}/josef"
        cluster = josef_cluster(combined=3, **FAST, **zookeeper_settings(zk_connect))
        create_topic(cluster, "steady")
        full_isr(cluster, "steady")
        leader = next(s for s in ensemble.servers if s.mode() == "leader")
        with Load(cluster, "steady") as load:
            leader.kill()  # SIGKILL by PID: the other two elect a leader among themselves
            load.progress()
            create_topic(cluster, "after-the-kill")  # metadata commits with two of three servers
            load.progress()
            leader.start()
            leader.wait_serving()
            load.progress()
        assert all(topics_seen_by(node, {"steady", "after-the-kill"}) for node in cluster.nodes)
        acknowledged = check_every_acknowledged_record(load, read_all(cluster, "steady"))
        assert not load.failed, load.failed[:3]
        print(f"\n{acknowledged} acknowledged records read back across the loss of ZooKeeper's leader server")
        cluster.stop()  # before the ensemble goes: the nodes end their sessions cleanly


def test_a_broker_whose_zookeeper_session_expired_is_fenced_without_waiting_for_its_heartbeats(josef_cluster,
                                                                                               zk_connect):
    """A broker paused past its ZooKeeper session loses /brokers/ids/<id>, and the active controller fences it then,
    as Kafka 3.x's did, not a ``broker.session.timeout.ms`` (60 s here) later; resumed, it registers and rejoins."""
    cluster = josef_cluster(combined=3, **{**FAST, **zookeeper_settings(zk_connect), "broker.session.timeout.ms": "60000"})
    create_topic(cluster, "fenced")
    full_isr(cluster, "fenced")
    controller_id, _ = active_controller(zk_connect)
    leaders = {leader for leader, _, _ in partitions_of(cluster, "fenced").values()} - {controller_id}
    assert leaders, "a partition led by a broker that is not the controller"
    paused = cluster.node(min(leaders))
    paused.pause()
    started = time.monotonic()
    try:
        eventually(lambda: registered(zk_connect, paused) is None, timeout=30, what="its /brokers/ids znode gone")
        eventually(lambda: all(leader != paused.node_id for leader, _, _ in partitions_of(cluster, "fenced").values()),
                   timeout=20, what="its partitions led by the others")
        took = time.monotonic() - started
    finally:
        paused.resume()
    eventually(lambda: registered(zk_connect, paused) is not None, timeout=30, what="the resumed broker registered")
    full_isr(cluster, "fenced")
    print(f"\nbroker {paused.node_id} paused: its partitions moved after {took:.1f} s (broker.session.timeout.ms 60 s)")
