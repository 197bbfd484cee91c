"""The history checker against a real 3-node cluster: a healthy run passes, planted violations are caught.

The workload (josef.testing.workload) runs idempotent producers of
confluent-kafka and of josef's client, a transactional producer, a
read_committed reader and two consumer groups (confluent-kafka's, josef's)
against three combined nodes; the checker (josef.testing.history) finds no
violation. Then the log is tampered with behind the brokers' backs, and the
checker must say so: a record already acknowledged is produced again by a
plain (non-idempotent) producer, and an acknowledged batch is cut out of the
segment files of every replica while the cluster is down.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from josef_client.workload import JosefClient

from josef.protocol.records import iter_batches, iter_records
from josef.testing import eventually
from josef.testing.history import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Ack,
    FinalReads,
    History,
    Read,
    Send,
    check,
    decode_value,
    encode_value,
)
from josef.testing.workload import Group, Producers, Readers, Transactions, Workload, create_topic, final_read

TOPIC = "checked"
PARTITIONS = 3
CLUSTER = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
    "controller.quorum.election.timeout.ms": "1000",
    "controller.quorum.fetch.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "4000",
}
CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


def fully_replicated(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def ready() -> bool:
        partitions = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions.values()
        return len(partitions) == PARTITIONS and all(p.leader >= 0 and len(p.isrs) == 3 for p in partitions)
    eventually(ready, timeout=60, what=f"every partition of {TOPIC} led, with three replicas in sync")


def report(title: str, verdict, history: History, final: FinalReads, directory: Path) -> None:
    """Print the verdict, and keep what it judged for a replay: ``History.load``, ``FinalReads.load``."""
    name = title.replace(" ", "-")
    history.dump(directory / f"{name}.history.jsonl")
    final.dump(directory / f"{name}.final.json")
    print(f"\n=== {title} (history and read-back in {directory}/{name}.*) ===\n{verdict.report()}")


def acknowledged(history: History) -> dict[str, Ack]:
    """The acknowledged records outside transactions, by value."""
    plain = {e.value for e in history.of(Send) if e.txn is None}
    return {a.value: a for a in history.of(Ack) if a.value in plain}


def last_sent_of_its_producer(history: History) -> Ack:
    """An acknowledged record that its producer sent last to its partition: appended again, it is out of no order."""
    acks = acknowledged(history)
    last: dict[tuple[str, int], Send] = {}
    for send in history.of(Send):
        if send.value in acks and send.txn is None:
            last[(send.process, send.partition)] = send
    return acks[next(iter(last.values())).value]


def cut_batch(log_dir: Path, partition: int, offset: int) -> list[str]:
    """Remove the batch holding ``offset`` from the partition's segment; returns the values it held.

    The segment's offset and time indexes go too: the broker rebuilds them when it opens the log.
    """
    directory = log_dir / f"{TOPIC}-{partition}"
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        for position, header in iter_batches(data):
            if header.base_offset <= offset <= header.last_offset:
                assert not header.is_control and not header.is_transactional
                segment.write_bytes(data[:position] + data[position + header.size:])
                for index in (segment.with_suffix(".index"), segment.with_suffix(".timeindex")):
                    index.unlink(missing_ok=True)
                return [decode_value(r.value) for r in iter_records(data[position:position + header.size])]
    raise AssertionError(f"no batch holds offset {offset} in {directory}")


def test_a_healthy_run_passes_and_planted_violations_are_caught(josef_cluster, tmp_path):
    cluster = josef_cluster(combined=3, **CLUSTER)
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, TOPIC, partitions=PARTITIONS)
    fully_replicated(bootstrap)
    history = History()
    josef = JosefClient()
    with Workload(bootstrap, TOPIC, history=history, seed=23, parts=[
        Producers(count=2, rate=120),
        Producers(client=josef, rate=60),
        Transactions(rate=4, partitions_per_txn=PARTITIONS),
        Readers(isolation=(READ_COMMITTED,), settings=CONSUMER),
        Group("confluent-group", members=2, settings=CONSUMER),
        Group("josef-group", members=2, client=josef, settings=CONSUMER),
    ]) as workload:
        workload.start()
        workload.progress(2000, timeout=90)
        final = workload.finish(timeout=90)
    verdict = check(history, final)
    report("a healthy run", verdict, history, final, tmp_path)
    assert verdict.ok, verdict.report()
    assert len(acknowledged(history)) > 1500
    assert {g.group for g in final.groups} == {"confluent-group", "josef-group"}
    assert sum(r.consumer.startswith("josef-group") for r in history.of(Read)) > 0

    # (b) A record acknowledged already, written again by a producer without idempotence.
    again = last_sent_of_its_producer(history)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "acks": "all"})
    plain.produce(TOPIC, encode_value(again.value), partition=again.partition)
    assert plain.flush(30) == 0
    final = final_read(bootstrap, [TOPIC])
    verdict = check(history, final)
    report("a record produced twice", verdict, history, final, tmp_path)
    assert dict(verdict.kinds()) == {"duplicate": 1}
    assert verdict.violations[0].message.startswith(f"{again.value} is at 2 places: ")
    # The read-back carries each batch's producer fields: the idempotent original has a producer, the copy none.
    copies = [r for p in final.partitions if p.isolation == READ_UNCOMMITTED and p.partition == again.partition
              for r in p.records if r.value == again.value]
    assert sorted(r.producer_id >= 0 for r in copies) == [False, True]

    # (a) An acknowledged batch cut out of every replica's log while the cluster is down.
    acks = acknowledged(history)
    on_0 = sorted((a for a in acks.values() if a.partition == 0), key=lambda a: a.offset)
    victim = on_0[len(on_0) // 2]  # well inside the log of partition 0
    cluster.stop()
    removed = [cut_batch(node.log_dirs[0], victim.partition, victim.offset) for node in cluster.nodes]
    assert removed[0] == removed[1] == removed[2] and victim.value in removed[0]
    for node in cluster.nodes:
        node.start(wait=False)
    cluster.wait_ready()
    fully_replicated(bootstrap)
    final = final_read(bootstrap, [TOPIC])
    verdict = check(history, final)
    report("an acknowledged batch deleted from every replica", verdict, history, final, tmp_path)
    lost = verdict.of("lost")
    assert {v.message.split()[1] for v in lost} == {v for v in removed[0] if v in acks}
    where = f"{TOPIC}-{victim.partition}@{victim.offset}"
    assert any(f"acknowledged {victim.value} at {where} is not in the log" in v.message for v in lost)
    assert set(verdict.kinds()) <= {"lost", "duplicate", "disagreement"}
    assert "first violation: [lost]" in verdict.report() or "first violation: [duplicate]" in verdict.report()
