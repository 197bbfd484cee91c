"""Moving a partition to a new broker, throttled, under an idempotent acks=all load (1 controller + 4 brokers).

Partition 0 of ``moving`` lives on brokers 2, 3 and 4 with ~3 MB in it; it
is reassigned to 3, 4 and 5 with ``josef reassign-partitions --execute
--throttle 500000``. Broker 5 copies the log at the throttled rate while
``steady``, which broker 5 also follows from broker 2, keeps taking acks=all
writes at full speed. Once the move is done, ``--verify`` removes the
throttles, broker 2 deletes its copy, and broker 5, made the leader, serves
every record: the preloaded ones and every one the producer had acknowledged.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kafka.admin import KafkaAdminClient

from josef.testing import eventually
from test_leader_election import josef, partition_line
from test_replication import FAST, Load, check_every_acknowledged_record, partitions_of, read_all

pytestmark = pytest.mark.metadata

THROTTLE = 500_000  # bytes/s
PRELOAD = 6144  # records of 1 KiB: ~6 MiB to copy, 12 s at the throttle: longer than the checks made meanwhile take on a loaded machine
#: Small fetches, so the copy is paced by the throttle rather than done in a couple of maximal fetches.
FETCH_MAX_BYTES = 262_144


def shortest_throttled_copy_s(size: int) -> float:
    """The least time ``size`` bytes take at THROTTLE B/s: the rate is measured over at least one 1 s window,
    so a first window's worth goes at once, and the fetch that crosses the bound is served whole."""
    return (size - THROTTLE - FETCH_MAX_BYTES) / THROTTLE


def plan(tmp_path, name: str, replicas: list[int]):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"version": 1, "partitions": [{"topic": "moving", "partition": 0, "replicas": replicas}]}))
    return path


def configs(client: AdminClient, resource: ConfigResource, names: list[str]) -> dict[str, str | None]:
    entries = client.describe_configs([resource])[resource].result(30)
    return {name: None if entries[name].is_default else entries[name].value for name in names}


def test_a_throttled_move_to_a_new_broker_copies_every_record_and_leaves_no_trace(josef_cluster, tmp_path):
    cluster = josef_cluster(controllers=1, brokers=4, **FAST, **{"replica.fetch.max.bytes": str(FETCH_MAX_BYTES)})
    b = cluster.bootstrap_servers
    client = AdminClient({"bootstrap.servers": b})
    kafka_admin = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=20000)
    topics = [NewTopic("moving", 3, replica_assignment=[[2, 3, 4]] * 3), NewTopic("steady", 1, replica_assignment=[[2, 5, 3]])]
    for future in client.create_topics(topics).values():
        future.result(30)
    for topic in ("moving", "steady"):
        eventually(lambda: all(len(isr) == 3 for _, _, isr in partitions_of(cluster, topic).values()),
                   what=f"{topic} fully in sync")
    preload = Producer({"bootstrap.servers": b, "acks": "all", "linger.ms": 20})
    for i in range(PRELOAD):
        preload.produce("moving", f"preload-{i}".encode().ljust(1024), partition=0)
    assert preload.flush(60) == 0

    with Load(cluster, "moving") as load:
        started = time.monotonic()
        out = josef("reassign-partitions", "--bootstrap-server", b, "--execute", "--throttle", str(THROTTLE),
                    "--reassignment-json-file", str(plan(tmp_path, "move", [3, 4, 5])))
        assert out[-3:] == ["Warning: You must run --verify periodically, until the reassignment completes, to "
                            "ensure the throttle is removed.",
                            f"The inter-broker throttle limit was set to {THROTTLE} B/s",
                            "Successfully started partition reassignment for moving-0"]
        assert configs(client, ConfigResource(ResourceType.TOPIC, "moving"),
                       ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"]) == {
            "leader.replication.throttled.replicas": "0:2,0:3,0:4", "follower.replication.throttled.replicas": "0:5"}

        # While broker 5 copies at the throttled rate, the move shows, and writes to steady (which broker 5
        # follows from broker 2 too) are acknowledged by all three replicas without waiting for the throttle.
        assert "\tReplicas: 3,4,5,2\tIsr: 2,3,4\tAdding Replicas: 5\tRemoving Replicas: 2\tElr: " in partition_line(b, "moving")
        steady = Producer({"bootstrap.servers": b, "acks": "all", "linger.ms": 0})
        steady_started = time.monotonic()
        for i in range(20):
            steady.produce("steady", f"steady-{i}".encode(), partition=0)
            assert steady.flush(10) == 0
        steady_s = time.monotonic() - steady_started
        assert josef("reassign-partitions", "--bootstrap-server", b, "--verify", "--reassignment-json-file",
                     str(plan(tmp_path, "move", [3, 4, 5]))) == [
            "Status of partition reassignment:", "Reassignment of partition moving-0 is still in progress."]
        assert steady_s < 2.0, f"20 acks=all writes to an unthrottled partition took {steady_s:.2f} s"

        eventually(lambda: kafka_admin.list_partition_reassignments() == {}, timeout=60, what="the move completing")
        moved_s = time.monotonic() - started
        load.progress()
    copied = PRELOAD * 1024
    assert moved_s >= shortest_throttled_copy_s(copied), f"{copied} bytes moved in {moved_s:.2f} s"

    assert josef("reassign-partitions", "--bootstrap-server", b, "--verify", "--reassignment-json-file",
                 str(plan(tmp_path, "move", [3, 4, 5]))) == [
        "Status of partition reassignment:", "Reassignment of partition moving-0 is completed.",
        "Clearing broker-level throttles on brokers 2,3,4,5", "Clearing topic-level throttles on topic moving"]
    assert set(configs(client, ConfigResource(ResourceType.TOPIC, "moving"),
                       ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"]).values()) == {None}
    for broker in (2, 5):
        assert set(configs(client, ConfigResource(ResourceType.BROKER, str(broker)),
                           ["leader.replication.throttled.rate", "follower.replication.throttled.rate"]).values()) == {None}
    assert josef("reassign-partitions", "--bootstrap-server", b, "--list") == ["No partition reassignments found."]
    removed = cluster.node(2).log_dirs[0] / "moving-0"
    eventually(lambda: not removed.exists(), what=f"broker 2 deleting {removed}")
    assert (cluster.node(5).log_dirs[0] / "moving-0").is_dir()
    eventually(lambda: "\tReplicas: 3,4,5\tIsr: 3,4,5\tElr: " in partition_line(b, "moving"), what="3,4,5 in sync")

    # Broker 5 leads (first replica, then a preferred election) and serves the whole log.
    josef("reassign-partitions", "--bootstrap-server", b, "--execute", "--reassignment-json-file",
          str(plan(tmp_path, "reorder", [5, 3, 4])))
    eventually(lambda: "\tReplicas: 5,3,4\t" in partition_line(b, "moving"), what="the reordering")
    assert josef("leader-election", "--bootstrap-server", b, "--election-type", "preferred", "--topic", "moving",
                 "--partition", "0") == ["Successfully completed leader election (PREFERRED) for partitions moving-0"]
    assert partitions_of(cluster, "moving")[0][0] == 5
    records = read_all(cluster, "moving")
    preloaded = [value for _, value in records[0] if value.startswith(b"preload-")]
    assert preloaded == [f"preload-{i}".encode().ljust(1024) for i in range(PRELOAD)]
    records[0] = [(offset, value) for offset, value in records[0] if not value.startswith(b"preload-")]
    acknowledged = check_every_acknowledged_record(load, records)
    assert acknowledged >= 300
    print(f"\nmoved {copied} bytes at {THROTTLE} B/s in {moved_s:.2f} s; 20 steady acks=all writes in {steady_s:.2f} s; "
          f"{acknowledged} acknowledged records read back")
