"""Partition replication across real broker processes: no acknowledged write is lost.

One controller and three brokers, each its own ``josef server start``
process on 127.0.0.1 (``josef_cluster``). Topics have three replicas and
``min.insync.replicas=2``; confluent-kafka produces with ``acks=all`` and
idempotence while the test kills, pauses and stops brokers by PID. A checker
then reads every partition back from the start and holds it against every
acknowledgement the producer got.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from josef.node.broker_config import RACK_AWARE_SELECTOR
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.testing import RawClient, eventually
from secured import client_settings, start_secured_cluster

pytestmark = pytest.mark.metadata

FAST = {
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1000",
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "1000",
    "replica.fetch.backoff.ms": "200",
    "auto.leader.rebalance.enable": "false",
}
PARTITIONS = 3


def settings(cluster, client: Mapping[str, str] | None = None, **extra) -> dict:
    """librdkafka settings for ``cluster``'s brokers: ``client`` (security settings; none for PLAINTEXT), then ``extra``."""
    return {"bootstrap.servers": cluster.bootstrap_servers, **(client or {}), **extra}


def admin(cluster, client=None):
    return AdminClient(settings(cluster, client))


def create_topic(cluster, name, partitions=PARTITIONS, min_isr=2, client=None):
    client = admin(cluster, client)  # kept alive until the answer: a collected client fails its futures
    futures = client.create_topics([NewTopic(name, partitions, 3, config={"min.insync.replicas": str(min_isr)})])
    futures[name].result(30)


def partitions_of(cluster, topic, client=None):
    """``{partition: (leader, replicas, isr)}`` as the brokers' Metadata tells it."""
    metadata = admin(cluster, client).list_topics(topic, timeout=10)
    return {p.id: (p.leader, tuple(p.replicas), tuple(sorted(p.isrs))) for p in metadata.topics[topic].partitions.values()}


def full_isr(cluster, topic, client=None):
    """Once every partition has a leader and all three replicas in sync."""
    eventually(lambda: all(leader >= 0 and len(isr) == 3
                           for leader, _, isr in partitions_of(cluster, topic, client).values()),
               timeout=60, what=f"every replica of {topic} back in the ISR")


class Load:
    """An idempotent acks=all producer writing ``partition:sequence`` values to every partition until stopped."""

    def __init__(self, cluster, topic: str, partitions: int = PARTITIONS, client: Mapping[str, str] | None = None) -> None:
        self.topic, self.partitions = topic, partitions
        self.producer = Producer(settings(cluster, client, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                                              "message.timeout.ms": 60000}))
        self.acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.failed: list[KafkaError] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, error, message) -> None:
        with self._lock:
            if error is None:
                self.acked[message.partition()].append((message.offset(), message.value()))
            else:
                self.failed.append(error)

    def _run(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            for partition in range(self.partitions):
                self.producer.produce(self.topic, f"{partition}:{sequence}".encode(), partition=partition,
                                      on_delivery=self._delivered)
            sequence += 1
            self.producer.poll(0.002)
        self.producer.flush(90)

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())

    def progress(self, more: int = 300, on: Iterable[int] | None = None) -> None:
        """Wait until ``more`` further records are acknowledged (on each of partitions ``on``, when given)."""
        with self._lock:
            targets = {p: len(self.acked[p]) + more for p in on} if on is not None else None
        total = self.count() + more

        def reached() -> bool:
            with self._lock:
                if targets is None:
                    return sum(len(v) for v in self.acked.values()) >= total
                return all(len(self.acked[p]) >= n for p, n in targets.items())
        eventually(reached, timeout=60, what=f"{more} more acknowledgements" + (f" on partitions {list(on)}" if on else ""))

    def __enter__(self) -> Load:
        self._thread.start()
        self.progress()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the producer did not flush"


def read_all(cluster, topic, partitions=PARTITIONS, client=None, group="checker"):
    """Every record of every partition, from the log start to the high watermark: ``{partition: [(offset, value)]}``."""
    consumer = Consumer(settings(cluster, client, **{"group.id": group, "enable.auto.commit": False,
                                                     "fetch.queue.backoff.ms": 10}))
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records: dict[int, list[tuple[int, bytes]]] = defaultdict(list)

        def done() -> bool:
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                records[message.partition()].append((message.offset(), message.value()))
            return all((records[p][-1][0] + 1 if records[p] else 0) >= ends[p] for p in range(partitions))
        eventually(done, timeout=120, what="reading every partition to its end")
        return records
    finally:
        consumer.close()


def check_every_acknowledged_record(load: Load, records) -> int:
    """Every acknowledged record is in the log at its offset, once; each partition's sequence only goes up."""
    for partition, acked in load.acked.items():
        stored = dict(records[partition])
        values = [value for _, value in records[partition]]
        assert len(values) == len(set(values)), f"partition {partition} holds a record twice"
        sequences = [int(value.split(b":")[1]) for value in values]
        assert sequences == sorted(sequences), f"partition {partition} is out of order"
        present = set(values)
        for offset, value in acked:
            if offset is None:  # the delivery report gave no offset: the record must be there all the same
                assert value in present, f"acknowledged {value!r} in partition {partition} is lost"
            else:
                assert stored.get(offset) == value, f"acknowledged {value!r} at {partition}/{offset} is lost"
    return load.count()


def zookeeper_settings(zk_connect: str) -> dict[str, str | None]:
    """Nodes on the ZooKeeper metadata quorum (josef-metadata-zk) instead of KRaft: no voters, a short ZooKeeper
    session, so a paused controller is replaced within seconds."""
    return {"metadata.quorum": "zookeeper", "zookeeper.connect": zk_connect, "controller.quorum.voters": None,
            "zookeeper.session.timeout.ms": "6000"}


@pytest.mark.parametrize("setup", ["plaintext", "sasl_ssl", pytest.param("zookeeper", marks=pytest.mark.own_quorum)])
def test_no_acknowledged_write_is_lost_through_kills_pauses_and_controlled_shutdowns(josef_cluster, tmp_path, setup,
                                                                                     request):
    """On KRaft, one controller and three brokers; on ZooKeeper, three combined nodes any of which may be elected
    controller, so the kill, the pause and the clean stop each take the controller away too at some point."""
    if setup == "sasl_ssl":  # every listener SASL_SSL, the StandardAuthorizer on every node (secured.py)
        cluster, tls = start_secured_cluster(josef_cluster, tmp_path / "tls", controllers=1, brokers=3, **FAST)
        client = client_settings(tls)
    elif setup == "zookeeper":
        cluster, client = josef_cluster(combined=3, **FAST, **zookeeper_settings(request.getfixturevalue("zk_connect"))), None
    else:
        cluster, client = josef_cluster(controllers=1, brokers=3, **FAST), None
    topic = "chaos"
    create_topic(cluster, topic, client=client)
    full_isr(cluster, topic, client)
    with Load(cluster, topic, client=client) as load:
        # SIGKILL the leader of partition 0; another replica takes over and writes go on.
        victim = cluster.node(partitions_of(cluster, topic, client)[0][0])
        victim.kill()
        eventually(lambda: partitions_of(cluster, topic, client)[0][0] not in (-1, victim.node_id), what="a new leader")
        load.progress()
        victim.restart()
        full_isr(cluster, topic, client)  # the killed broker caught up and rejoined every ISR
        load.progress()

        # SIGSTOP another broker past replica.lag.time.max.ms: the leaders it follows drop it from their ISR
        # (AlterPartition, well before its session ends); partitions it leads move once it is fenced.
        paused = next(b for b in cluster.brokers if b is not victim)
        followed = [p for p, (leader, _, _) in partitions_of(cluster, topic, client).items()
                    if leader != paused.node_id]
        paused.pause()
        try:
            eventually(lambda: all(paused.node_id not in partitions_of(cluster, topic, client)[p][2] for p in followed),
                       what=f"broker {paused.node_id} leaving the ISRs of the partitions it follows")
            assert any(f"shrinking the ISR of {topic}-{p} " in b.log for p in followed for b in cluster.brokers)
            eventually(lambda: all(leader not in (-1, paused.node_id)
                                   for leader, _, _ in partitions_of(cluster, topic, client).values()),
                       what=f"leaders moving off the paused broker {paused.node_id}")
            load.progress()
        finally:
            paused.resume()
        full_isr(cluster, topic, client)
        load.progress()

        # A controlled shutdown moves leadership away first; the producer barely notices.
        stopped = next(b for b in cluster.brokers if b not in (victim, paused))
        assert stopped.stop() == 0
        assert all(leader != stopped.node_id for leader, _, _ in partitions_of(cluster, topic, client).values())
        load.progress()
        stopped.restart()
        full_isr(cluster, topic, client)
        load.progress()
    acknowledged = check_every_acknowledged_record(load, read_all(cluster, topic, client=client))
    assert acknowledged >= 7 * 300  # what the seven load.progress() calls (one on entering Load) awaited
    print(f"\n{acknowledged} acknowledged records read back; {len(load.failed)} deliveries failed")


def test_with_two_of_three_brokers_down_acks_all_is_refused_and_nothing_is_written(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **FAST)
    topic = "starved"
    create_topic(cluster, topic, partitions=1)
    full_isr(cluster, topic)
    leader = partitions_of(cluster, topic)[0][0]
    survivor = cluster.node(leader)
    for broker in cluster.brokers:
        if broker is not survivor:
            broker.kill()
    eventually(lambda: partitions_of(cluster, topic)[0][2] == (leader,), what="the ISR shrinking to the survivor")

    def offline_replicas():
        raw = RawClient(survivor.listener("PLAINTEXT")[1])
        try:
            [described] = raw.call(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                         "allow_auto_topic_creation": False,
                                                         "include_topic_authorized_operations": False}).topics
        finally:
            raw.close()
        return sorted(described.partitions[0].offline_replicas)
    # Once their sessions end they are fenced, and Metadata lists their replicas offline.
    eventually(lambda: offline_replicas() == sorted(b.node_id for b in cluster.brokers if b is not survivor),
               what="the dead brokers' replicas listed offline")
    errors = []
    producer = Producer({"bootstrap.servers": survivor.bootstrap_server, "acks": "all", "retries": 0,
                         "enable.idempotence": False, "message.timeout.ms": 10000})
    for i in range(10):
        producer.produce(topic, f"refused-{i}".encode(), partition=0, on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(30) == 0
    assert len(errors) == 10 and all(e is not None and e.code() == KafkaError.NOT_ENOUGH_REPLICAS for e in errors), errors
    consumer = Consumer({"bootstrap.servers": survivor.bootstrap_server, "group.id": "probe"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
    finally:
        consumer.close()


def test_a_returning_leader_truncates_the_tail_nobody_replicated(josef_cluster):
    # A long lag time keeps the paused followers in the ISR, so one of them can be elected.
    cluster = josef_cluster(controllers=1, brokers=3, **{**FAST, "replica.lag.time.max.ms": "60000"})
    topic = "diverging"
    create_topic(cluster, topic, partitions=1, min_isr=1)
    full_isr(cluster, topic)
    old_leader = cluster.node(partitions_of(cluster, topic)[0][0])
    followers = [b for b in cluster.brokers if b is not old_leader]
    committed = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(100):
        committed.produce(topic, f"committed-{i}".encode(), partition=0)
    assert committed.flush(30) == 0

    for follower in followers:
        follower.pause()
    lonely = Producer({"bootstrap.servers": old_leader.bootstrap_server, "acks": "1", "enable.idempotence": False})
    # A fetch a follower had pending when it stopped may still be answered, and the answer waits in its
    # socket until it resumes: one record answers it, so that nothing written after reaches a follower.
    lonely.produce(topic, b"answering-pending-fetches", partition=0)
    assert lonely.flush(30) == 0
    delivered = []
    for i in range(50):
        lonely.produce(topic, f"unreplicated-{i}".encode(), partition=0, on_delivery=lambda e, m: delivered.append(e))
    assert lonely.flush(30) == 0 and delivered == [None] * 50  # in the old leader's log only
    old_leader.kill()
    for follower in followers:
        follower.resume()
    # One answer both checked and kept: the next may come from a broker whose metadata is older.
    new_leader = eventually(lambda: (leader := partitions_of(cluster, topic)[0][0]) in {f.node_id for f in followers}
                            and leader, what="a follower elected")
    later = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(30):
        later.produce(topic, f"new-leader-{i}".encode(), partition=0)
    assert later.flush(30) == 0

    old_leader.restart()
    assert old_leader.wait_for_log(re.compile(r"truncating diverging-0 from 151 to 10[01]\b"), timeout=30)
    full_isr(cluster, topic)
    # Make the old leader lead again (it is the preferred replica): what it serves is its own log.
    client = admin(cluster)
    result = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
    assert result[TopicPartition(topic, 0)] is None
    eventually(lambda: partitions_of(cluster, topic)[0][0] == old_leader.node_id, what="the old leader leading again")
    values = [value.decode() for _, value in read_all(cluster, topic, partitions=1)[0] if value != b"answering-pending-fetches"]
    assert values == [f"committed-{i}" for i in range(100)] + [f"new-leader-{i}" for i in range(30)]
    assert new_leader != old_leader.node_id


def test_consumers_fetch_from_an_in_sync_replica_in_their_rack(josef_cluster):
    racks = {2: "east", 3: "west", 4: "north"}
    cluster = josef_cluster(controllers=1, brokers=3, node_overrides={b: {"broker.rack": r} for b, r in racks.items()},
                            **FAST, **{"replica.selector.class": RACK_AWARE_SELECTOR})
    topic = "racks"
    client = admin(cluster)
    client.create_topics([NewTopic(topic, 1, replica_assignment=[[2, 3, 4]])])[topic].result(30)
    full_isr(cluster, topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(200):
        producer.produce(topic, f"r-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    body = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "west",
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}

    def fetch_from(node):
        raw = RawClient(node.listener("PLAINTEXT")[1])
        try:
            [topic_answer] = raw.call(ApiKey.FETCH, 12, body).responses
            [answer] = topic_answer.partitions
            return answer
        finally:
            raw.close()
    # The leader (broker 2, in "east") points a consumer in "west" at broker 3, which serves it.
    from_leader = eventually(lambda: (a := fetch_from(cluster.node(2))).preferred_read_replica == 3 and a,
                             what="broker 3 in sync with a high watermark of 200")
    assert from_leader.error_code == 0 and from_leader.records in (None, b"")
    # The follower learns the high watermark from its next fetch answer, a moment after the leader
    # counts it in sync; until then it serves nothing, as Kafka's followers do.
    from_follower = eventually(lambda: (a := fetch_from(cluster.node(3))).records and a,
                               what="broker 3 serving the records below its high watermark")
    assert from_follower.error_code == 0 and from_follower.preferred_read_replica == -1
    # A produce to a follower names the leader and how to reach it (KIP-951).
    raw = RawClient(cluster.node(3).listener("PLAINTEXT")[1])
    try:
        answer = raw.call(ApiKey.PRODUCE, 11, {"transactional_id": None, "acks": -1, "timeout": 10000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": build_batch([(None, b"x", 0)])}]}]})
    finally:
        raw.close()
    [produced] = answer.responses[0].partition_responses
    assert produced.error_code == ErrorCode.not_leader_or_follower
    assert produced.current_leader.leader_id == 2 and produced.current_leader.leader_epoch >= 0
    assert [(n.node_id, n.port, n.rack) for n in answer.node_endpoints] == [(2, cluster.node(2).listener("PLAINTEXT")[1], "east")]
    # librdkafka follows the redirection and reads everything.
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "west", "client.rack": "west",
                         "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 10})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        eventually(lambda: values.extend(m.value() for m in consumer.consume(200, 0.5) if m.error() is None)
                   or len(values) >= 200, what="the rack-aware consumer reading 200 records")
        assert values == [f"r-{i}".encode() for i in range(200)]
    finally:
        consumer.close()


def test_eligible_leader_replicas_let_a_cleanly_stopped_replica_lead_when_the_isr_is_gone(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=3, **FAST)
    features = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, api_version=(4, 0))
    try:
        assert features.update_features({"eligible.leader.replicas.version": 1}) == {"eligible.leader.replicas.version": "OK"}
    finally:
        features.close()
    topic = "elr"
    client = admin(cluster)
    client.create_topics([NewTopic(topic, 1, replica_assignment=[[2, 3, 4]],
                                   config={"min.insync.replicas": "2"})])[topic].result(30)
    full_isr(cluster, topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(100):
        producer.produce(topic, f"e-{i}".encode(), partition=0)
    assert producer.flush(30) == 0

    def state():
        node = next(b for b in cluster.brokers if b.running)
        raw = RawClient(node.listener("PLAINTEXT")[1])
        try:
            [described] = raw.call(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {
                "topics": [{"name": topic}], "response_partition_limit": 10, "cursor": None}).topics
        finally:
            raw.close()
        p = described.partitions[0]
        return p.leader_id, tuple(p.isr_nodes), tuple(p.eligible_leader_replicas or ())

    assert cluster.node(4).stop() == 0
    assert cluster.node(3).stop() == 0  # the ISR falls below min.insync.replicas: 3 is eligible
    eventually(lambda: state() == (2, (2,), (3,)), what="broker 3 in the ELR")
    cluster.node(2).kill()  # the last in-sync replica dies
    cluster.node(4).restart()  # back, but neither in sync nor eligible: it may not lead
    eventually(lambda: state()[0] == -1, what="the partition without a leader")
    cluster.node(3).restart()  # a clean stop: still eligible, and it has every committed record
    eventually(lambda: state()[0] == 3, what="broker 3 elected from the ELR")
    values = [value for _, value in read_all(cluster, topic, partitions=1)[0]]
    assert values == [f"e-{i}".encode() for i in range(100)]
