"""Share groups on three broker processes: share-partition state written through one share coordinator is read back
from its successor after a SIGKILL, with the fencing epochs kept (and dump-log decodes __share_group_state); a share
partition's leader killed mid-delivery leaves its successor to deliver again what was not acknowledged, with the
delivery counts kept."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

pytestmark = pytest.mark.metadata

STATE = {"share.coordinator.state.topic.num.partitions": "3", "share.coordinator.state.topic.replication.factor": "3",
         "share.coordinator.snapshot.update.records.per.snapshot": "3"}


def call(cluster, node_id: int, api_key: int, version: int, body: dict):
    client = RawClient(cluster.node(node_id).listener("PLAINTEXT")[1])
    try:
        return client.call(api_key, version, body)
    finally:
        client.close()


def find_share_coordinator(cluster, via: int, key: str) -> int:
    """FindCoordinator v6, key type 2 (a share partition), asked of broker ``via``; -1 while there is none."""
    answer = call(cluster, via, ApiKey.FIND_COORDINATOR, 6, {"key_type": 2, "coordinator_keys": [key]})
    [found] = answer.coordinators
    return found.node_id if found.error_code == ErrorCode.none else -1


def state_call(cluster, node_id: int, api_key: int, version: int, topic_id: str, partition: dict):
    answer = call(cluster, node_id, api_key, version, {"group_id": "queue", "topics": [
        {"topic_id": topic_id, "partitions": [{"partition": 0, **partition}]}]})
    [[result]] = [r.partitions for r in answer.results]
    return result


def test_share_state_survives_its_coordinator_being_killed(josef_cluster):
    cluster = josef_cluster(combined=3, **STATE)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("jobs", 1, 3)])["jobs"].result(30)
    first = cluster.brokers[0].node_id
    topic_id = eventually(lambda: call(cluster, first, ApiKey.METADATA, 12, {
        "topics": [{"name": "jobs", "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}).topics[0].topic_id, 30, what="the topic id")
    from josef.metadata.records import uuid_to_text

    topic_id = uuid_to_text(topic_id)
    key = f"queue:{topic_id}:0"
    coordinator = eventually(lambda: (n := find_share_coordinator(cluster, first, key)) >= 0 and n, 60,
                             what="a share coordinator")

    def ok(result) -> None:
        assert result.error_code == ErrorCode.none, result

    ok(eventually(lambda: (r := state_call(cluster, coordinator, ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, topic_id,
                                           {"state_epoch": 1, "start_offset": 0})).error_code == ErrorCode.none and r,
                  60, what="the coordinator to load"))
    for i in range(5):  # a snapshot, updates, a snapshot again (every three updates)
        ok(state_call(cluster, coordinator, ApiKey.WRITE_SHARE_GROUP_STATE, 1, topic_id, {
            "state_epoch": 1, "leader_epoch": 4, "start_offset": 10 * i, "state_batches": [
                {"first_offset": 10 * i, "last_offset": 10 * i + 5, "delivery_state": 2, "delivery_count": 1},
                {"first_offset": 10 * i + 8, "last_offset": 10 * i + 8, "delivery_state": 4, "delivery_count": 5}]}))

    cluster.node(coordinator).kill()
    survivor = next(n.node_id for n in cluster.brokers if n.node_id != coordinator)
    successor = eventually(lambda: (n := find_share_coordinator(cluster, survivor, key)) not in (-1, coordinator)
                           and n, 60, what="a new share coordinator")
    read = eventually(lambda: (r := state_call(cluster, successor, ApiKey.READ_SHARE_GROUP_STATE, 0, topic_id,
                                               {"leader_epoch": 5})).error_code == ErrorCode.none and r,
                      60, what="the new coordinator to load")
    assert (read.state_epoch, read.start_offset) == (1, 40)
    assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in read.state_batches] == [
        (40, 45, 2, 1), (48, 48, 4, 5)]
    # The leader of epoch 4 is fenced now that one of epoch 5 has read the state.
    fenced = state_call(cluster, successor, ApiKey.WRITE_SHARE_GROUP_STATE, 0, topic_id, {
        "state_epoch": 1, "leader_epoch": 4, "start_offset": 50, "state_batches": []})
    assert fenced.error_code == ErrorCode.fenced_leader_epoch
    [summary] = [state_call(cluster, successor, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, topic_id,
                            {"leader_epoch": 5})]
    assert (summary.error_code, summary.leader_epoch, summary.start_offset) == (ErrorCode.none, 5, 40)

    # kafka-dump-log.sh --share-group-state-decoder over the successor's copy of the topic.
    node = cluster.node(successor)
    files = sorted(str(p) for d in node.log_dirs for p in d.glob("__share_group_state-*/*.log") if p.stat().st_size)
    dumped = subprocess.run([sys.executable, "-m", "josef", "dump-log", "--share-group-state-decoder", "--files",
                             ",".join(files)], capture_output=True, text=True, timeout=60, check=False)
    assert dumped.returncode == 0 and "Traceback" not in dumped.stderr, dumped.stderr
    assert dumped.stdout.count('"type":"0"') >= 2 and '"type":"1"' in dumped.stdout, dumped.stdout[-2000:]
    assert '"groupId":"queue"' in dumped.stdout and '"leaderEpoch":5' in dumped.stdout


def leader_of(cluster, via: int, topic: str) -> int:
    answer = call(cluster, via, ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                      "allow_auto_topic_creation": False,
                                                      "include_topic_authorized_operations": False})
    return answer.topics[0].partitions[0].leader_id


def share_fetch(cluster, node_id: int, topic_id: str, member: str, epoch: int, acks=(), max_wait_ms: int = 0):
    answer = call(cluster, node_id, ApiKey.SHARE_FETCH, 2, {
        "group_id": "workers", "member_id": member, "share_session_epoch": epoch, "max_wait": max_wait_ms,
        "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500, "batch_size": 500, "share_acquire_mode": 0,
        "is_renew_ack": False, "forgotten_topics_data": [],
        "topics": [{"topic_id": topic_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
            {"first_offset": f, "last_offset": la, "acknowledge_types": t} for f, la, t in acks]}]}]})
    assert answer.error_code == ErrorCode.none, answer
    parts = [p for t in answer.responses for p in t.partitions]
    return parts[0] if parts else None


def test_a_killed_leaders_unacknowledged_records_are_delivered_again_by_its_successor(josef_cluster):
    from confluent_kafka import Producer

    from josef.metadata.records import uuid_to_text

    cluster = josef_cluster(combined=3, **STATE, **{"min.insync.replicas": "2"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("work", 1, 3)])["work"].result(30)
    first = cluster.brokers[0].node_id
    topic_id = uuid_to_text(eventually(lambda: call(cluster, first, ApiKey.METADATA, 12, {
        "topics": [{"name": "work", "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}).topics[0].topic_id, 30, what="the topic id"))
    leader = eventually(lambda: (n := leader_of(cluster, first, "work")) >= 0 and n, 30, what="a leader")
    # The share partition starts at the end (latest): open it (loaded from its share coordinator) before producing.
    eventually(lambda: (part := share_fetch(cluster, leader, topic_id, "a", 0)) is not None
               and part.error_code == ErrorCode.none, 60, what="the share partition")
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 50})
    for i in range(20):
        producer.produce("work", b"job-%d" % i)
    assert producer.flush(30) == 0
    got = share_fetch(cluster, leader, topic_id, "a", 1, max_wait_ms=5000)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got.acquired_records] == [(0, 19, 1)]
    done = share_fetch(cluster, leader, topic_id, "a", 2, acks=[(0, 9, [1])])  # ACCEPT half
    assert done.acknowledge_error_code == ErrorCode.none

    cluster.node(leader).kill()
    survivor = next(n.node_id for n in cluster.brokers if n.node_id != leader)
    successor = eventually(lambda: (n := leader_of(cluster, survivor, "work")) not in (-1, leader) and n, 60,
                           what="a new leader")

    epochs = iter(range(1 << 30))  # b's share session: opened at 0, then one epoch per request

    def redelivered():
        part = share_fetch(cluster, successor, topic_id, "b", next(epochs))
        return part if part is not None and part.acquired_records else None

    part = eventually(redelivered, 60, what="the unacknowledged records at the new leader")
    # The accepted half never comes back; the other half comes back with one more delivery.
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(10, 19, 2)]


def summary_start(cluster, topic_id: str, group: str, partition: int) -> int:
    """The share partition's start offset as its share coordinator persisted it (ReadShareGroupStateSummary)."""
    via = cluster.brokers[0].node_id if cluster.brokers[0].running else cluster.brokers[1].node_id
    node = find_share_coordinator(cluster, via, f"{group}:{topic_id}:{partition}")
    if node < 0:
        return -1
    answer = call(cluster, node, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, {"group_id": group, "topics": [
        {"topic_id": topic_id, "partitions": [{"partition": partition, "leader_epoch": -1}]}]})
    result = answer.results[0].partitions[0]
    return result.start_offset if result.error_code == ErrorCode.none else -1


def test_share_consumers_lose_and_double_nothing_when_a_partition_leader_is_killed(josef_cluster):
    """Three ShareConsumers (explicit acknowledgement) on two partitions while the leader of one is SIGKILLed and
    restarted: every produced record is delivered until it is accepted, the brokers end with every record done,
    and no record's acceptance is confirmed twice."""
    from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

    from josef.metadata.records import uuid_to_text
    from josef.testing.faults import REPLICATED_FAST

    cluster = josef_cluster(combined=3, **{**REPLICATED_FAST, "group.share.record.lock.duration.ms": "5000",
                                           "group.share.min.record.lock.duration.ms": "1000",
                                           "group.share.heartbeat.interval.ms": "500",
                                           "group.share.session.timeout.ms": "6000"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("orders", 2, 3)])["orders"].result(30)
    first = cluster.brokers[0].node_id
    topic_id = uuid_to_text(eventually(lambda: call(cluster, first, ApiKey.METADATA, 12, {
        "topics": [{"name": "orders", "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}).topics[0].topic_id, 30, what="the topic id"))
    confirmed: dict[tuple[int, int], int] = {}

    def on_commit(offsets, error) -> None:
        if error is None:
            for tp, done in offsets.items():
                for offset in done:
                    confirmed[tp.partition, offset] = confirmed.get((tp.partition, offset), 0) + 1

    consumers = []
    for _ in range(3):
        consumer = ShareConsumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "shop",
                                  "share.acknowledgement.mode": "explicit"})
        consumer.set_acknowledgement_commit_callback(on_commit)
        consumer.subscribe(["orders"])
        consumers.append(consumer)
    delivered: dict[tuple[int, int], int] = {}

    def consume_round() -> None:
        for consumer in consumers:
            messages = consumer.poll(0.2)
            for message in messages:
                if message.error() is not None:
                    continue
                delivered[message.partition(), message.offset()] = \
                    delivered.get((message.partition(), message.offset()), 0) + 1
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
            if len(messages):
                try:
                    consumer.commit_sync(10)
                except Exception:  # noqa: BLE001 - a leader gone mid-commit: the records come back, checked below
                    pass

    try:
        # Every consumer in the group and fetching before anything is produced (the window starts at the end).
        eventually(lambda: consume_round() or summary_start(cluster, topic_id, "shop", 0) >= 0
                   and summary_start(cluster, topic_id, "shop", 1) >= 0, 60, what="the share partitions to start")
        produced: set[tuple[int, int]] = set()
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5})

        def send(count: int) -> None:
            for i in range(count):
                producer.produce("orders", b"order-%d" % i, partition=i % 2,
                                 on_delivery=lambda err, msg: err is None and produced.add((msg.partition(),
                                                                                            msg.offset())))
            assert producer.flush(60) == 0

        send(300)
        for _ in range(5):
            consume_round()
        victim = leader_of(cluster, first, "orders")  # of partition 0
        cluster.node(victim).kill()
        for _ in range(10):
            consume_round()
        send(300)
        cluster.node(victim).start()

        def all_done() -> bool:
            consume_round()
            ends = {p: max(o for q, o in produced if q == p) + 1 for p in (0, 1)}
            return all(summary_start(cluster, topic_id, "shop", p) == ends[p] for p in (0, 1))

        eventually(all_done, 180, what="every record accepted")
    finally:
        for consumer in consumers:
            consumer.close()
    assert len(produced) == 600
    missing = produced - set(delivered)
    assert not missing, f"{len(missing)} acknowledged-by-nobody records never delivered: {sorted(missing)[:10]}"
    twice = {k: n for k, n in confirmed.items() if n > 1}
    assert not twice, f"records whose acceptance was confirmed twice: {sorted(twice.items())[:10]}"
    print(f"share consumers through a leader kill: {len(produced)} records, {sum(delivered.values())} deliveries "
          f"({sum(n > 1 for n in delivered.values())} redelivered), {len(confirmed)} acceptances confirmed")
