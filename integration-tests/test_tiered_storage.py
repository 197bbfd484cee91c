"""Tiered storage (KIP-405) end to end: segments copied to remote storage, deleted locally, and read back from there by
real clients."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import obstore
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually
from josef_client import Admin as JosefAdmin
from josef_client import TopicPartition as JosefTopicPartition
from josef_client.admin import ElectionType

pytestmark = [pytest.mark.metadata, pytest.mark.storage]

#: A broker with tiered storage in a directory, visiting its partitions every 200 ms.
TIERED = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "local-dir",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
}
#: Tiny segments, and locally only what is not yet copied plus about one segment.
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": "16384", "local.retention.bytes": "16384",
                "file.delete.delay.ms": "0"}


def create_topic(bootstrap: str, replicas: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("tiered", 1, replicas, config=TOPIC_CONFIG)])["tiered"].result(30)


def produce(bootstrap: str, topic: str, count: int, first_timestamp: int = 0, idempotent: bool = False) -> list[bytes]:
    """``count`` records; the i-th stamped ``first_timestamp + i`` when that is given (else the producer's clock)."""
    values = [b"%06d-" % i + bytes([i % 251]) * 200 for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096,
                         "enable.idempotence": idempotent})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % (len(value) % 7), timestamp=first_timestamp + i if first_timestamp else 0)
    assert producer.flush(60) == 0
    return values


def read_all(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """Up to ``count`` records of partition 0 from offset 0, as (offset, value); gives up after 60 s without a new
    one."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    records: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(records) < count and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None:
            assert message.error() is None, message.error()
            records.append((message.offset(), message.value()))
            deadline = time.monotonic() + 60
    consumer.close()
    return records


def check_read_back(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Partition 0 holds exactly ``values``, in order; a failure names the first offset that differs and the
    offsets the consumer went through (a jump or a step back is a reset after OFFSET_OUT_OF_RANGE)."""
    records = read_all(bootstrap, topic, len(values))
    if records != list(enumerate(values)):
        got = [value for _, value in records]
        first = next((i for i, (a, b) in enumerate(zip(got, values)) if a != b), min(len(got), len(values)))
        runs: list[list[int]] = []
        for offset, _ in records:
            if runs and offset == runs[-1][1] + 1:
                runs[-1][1] = offset
            else:
                runs.append([offset, offset])
        pytest.fail(f"read {len(got)} of {len(values)} records from {bootstrap}; the first difference at "
                    f"record {first}: {got[first][:12] if first < len(got) else None!r} instead of "
                    f"{values[first][:12] if first < len(values) else None!r}; offsets read: "
                    + ", ".join(f"{a}-{b}" for a, b in runs))


def offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return low, high


def local_start(port: int, topic: str) -> int:
    """ListOffsets EARLIEST_LOCAL (-4) of the broker on ``port`` (the leader), as ``kafka-get-offsets.sh --time -4``."""
    client = RawClient(port)
    try:
        return client.list_offset(topic, -4)
    finally:
        client.close()


def local_bytes(directory: Path) -> int:
    """Bytes of the segment files in a partition's directory, while the broker may be deleting some of them."""
    total = 0
    for path in directory.glob("*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


@pytest.fixture
def tiered_broker(broker_factory, tmp_path: Path):
    remote = tmp_path / "remote"
    remote.mkdir()
    return broker_factory(**TIERED, **{"rsm.config.storage.root": str(remote)}), remote


def test_old_segments_move_to_remote_storage_and_are_read_back_from_there(tiered_broker):
    broker, remote = tiered_broker
    create_topic(broker.bootstrap_servers, replicas=1)
    first = int(time.time() * 1000) - 60_000
    values = produce(broker.bootstrap_servers, "tiered", 2000, first_timestamp=first)
    # Copied, then deleted locally down to local.retention.bytes: the local log starts near the end, the log start
    # stays 0. (Deletion follows copying segment by segment, so wait for it to finish, not merely begin.)
    local = broker.data_dir / "tiered-0"
    eventually(lambda: local_bytes(local) < 2000 * 200 / 4, 60,
               what="old segments to leave the local disk")
    start = local_start(broker.port, "tiered")
    assert start > 1500
    assert offsets(broker.bootstrap_servers, "tiered") == (0, 2000)
    assert any(remote.rglob("*.log")), "segments in the remote directory"
    client = RawClient(broker.port)
    try:  # LATEST_TIERED (-5): remote storage reaches at least to the local log start, never to the log end
        tiered = client.list_offset("tiered", -5)
        assert start - 1 <= tiered < 2000
        assert client.list_offset("tiered", -6) == tiered + 1  # EARLIEST_PENDING_UPLOAD (KIP-1023)
        # Timestamp lookups find records in remote storage as well as on disk.
        assert [client.list_offset("tiered", first + i) for i in (0, 100, start - 1, 1999)] == [0, 100, start - 1, 1999]
        assert client.list_offset("__remote_log_metadata", -6) == -1  # not tiered
    finally:
        client.close()
    check_read_back(broker.bootstrap_servers, "tiered", values)
    assert start <= local_start(broker.port, "tiered")
    # josef log-dirs describe --remote: beside the local size, the bytes of the segments in remote storage.
    described = subprocess.run([sys.executable, "-m", "josef", "log-dirs", "describe", "--bootstrap-server",
                                broker.bootstrap_servers, "--topic-list", "tiered", "--remote"],
                               capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    [entry] = json.loads(described.stdout.splitlines()[-1])["brokers"][0]["logDirs"][0]["partitions"]
    remote_logs = sum(p.stat().st_size for p in remote.rglob("tiered-*/0/*.log"))
    assert (entry["partition"], entry["remoteSize"]) == ("tiered-0", remote_logs)
    assert 0 < entry["size"] < remote_logs
    # kafka-dump-log.sh --remote-log-metadata-decoder: the metadata topic's records as Kafka's classes print them.
    segments = [p for p in broker.data_dir.glob("__remote_log_metadata-*/*.log") if p.stat().st_size]
    dumped = subprocess.run([sys.executable, "-m", "josef", "dump-log", "--remote-log-metadata-decoder", "--files",
                             ",".join(map(str, segments))], capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0 and "Traceback" not in dumped.stderr, dumped.stderr
    assert re.search(r" payload: RemoteLogSegmentMetadata\{remoteLogSegmentId=RemoteLogSegmentId\{topicIdPartition="
                     r"[\w-]{22}:tiered-0, id=[\w-]{22}\}, startOffset=0, endOffset=\d+, brokerId=1, ", dumped.stdout)
    assert "payload: RemoteLogSegmentMetadataUpdate{" in dumped.stdout and "state=COPY_SEGMENT_FINISHED" in dumped.stdout
    assert "txnIdxEmpty=true}" in dumped.stdout and "txnIdxEmpty=false" not in dumped.stdout  # no transactions here
    assert " key: " not in dumped.stdout and "Error at offset" not in dumped.stdout


def leader_of(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[0].leader


def test_three_brokers_on_s3_lose_and_duplicate_nothing_when_the_leader_dies(josef_cluster, seaweedfs, s3_bucket):
    settings = {f"rsm.config.{k}": v for k, v in seaweedfs.rsm_settings(s3_bucket).items()}
    cluster = josef_cluster(combined=3, **{**TIERED, **settings, "remote.log.storage.manager.class.name": "s3",
                                           "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
                                           "min.insync.replicas": "2", "default.replication.factor": "3"})
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, replicas=3)
    values = produce(bootstrap, "tiered", 2000)
    leader = leader_of(bootstrap, "tiered")
    port = cluster.node(leader).listener("PLAINTEXT")[1]
    eventually(lambda: local_start(port, "tiered") > 1000, 60, what="old segments to leave the leader's disk")
    cluster.node(leader).kill()  # mid-upload, or nearly: the task runs every 200 ms
    survivors = ",".join(n.bootstrap_server for n in cluster.brokers if n.node_id != leader)
    eventually(lambda: leader_of(survivors, "tiered") not in (leader, -1), 60, what="a new leader")
    values += produce(survivors, "tiered", 1000)
    cluster.node(leader).start()
    check_read_back(survivors, "tiered", values)  # every record once, in order: nothing lost or doubled
    assert offsets(survivors, "tiered") == (0, 3000)
    port = cluster.node(leader_of(survivors, "tiered")).listener("PLAINTEXT")[1]
    eventually(lambda: local_start(port, "tiered") > 2000, 60, what="the new leader to copy and delete its old segments")
    check_read_back(bootstrap, "tiered", values)
    # A follower away while the leader's local log moved past its end starts over at the leader's local log start
    # (OFFSET_MOVED_TO_TIERED_STORAGE), joins the ISR again, and can lead: what it never had is read remotely.
    leader = leader_of(survivors, "tiered")
    follower = next(n for n in cluster.brokers if n.node_id != leader)
    follower_end = offsets(survivors, "tiered")[1]
    follower.kill()
    # An idempotent producer's records, then others: its state at the leader's local log start is kept only in
    # the producer snapshot of a remote segment, which the follower must take from there.
    values += produce(survivors, "tiered", 300, idempotent=True)
    leader_port = cluster.node(leader).listener("PLAINTEXT")[1]
    [idempotent] = [p for p in active_producers(leader_port, "tiered") if p.last_sequence == 299]
    values += produce(survivors, "tiered", 2000)
    eventually(lambda: local_start(leader_port, "tiered") > follower_end + 300, 60,
               what="the leader's local log to pass the follower and the idempotent records")
    follower.start()
    assert follower.wait_for_log("starting over there with the producer state kept there", timeout=30)
    eventually(lambda: len(isr(survivors, "tiered")) == 3, 60, what="the follower to rejoin the ISR")
    # The follower becomes the preferred replica and is elected: it leads with only what it rebuilt.
    others = [n.node_id for n in cluster.brokers if n is not follower]
    with JosefAdmin({"bootstrap.servers": survivors}) as admin:
        assert admin.alter_partition_reassignments({JosefTopicPartition("tiered", 0): [follower.node_id, *others]}) \
            == {JosefTopicPartition("tiered", 0): None}
        eventually(lambda: not admin.list_partition_reassignments(), 60, what="the reassignment to finish")
        eventually(lambda: admin.elect_leaders(ElectionType.PREFERRED, [JosefTopicPartition("tiered", 0)])
                   == {JosefTopicPartition("tiered", 0): None}, 60, what="the follower to be elected")
    eventually(lambda: leader_of(survivors, "tiered") == follower.node_id, 60, what="the follower to lead")
    check_read_back(follower.bootstrap_server, "tiered", values)
    # It knows the idempotent producer as the first leader did (DescribeProducers).
    found = [p for p in active_producers(follower.listener("PLAINTEXT")[1], "tiered")
             if p.producer_id == idempotent.producer_id]
    assert [(p.producer_epoch, p.last_sequence) for p in found] == [(idempotent.producer_epoch, 299)]


def test_a_broker_given_a_tiered_partition_late_learns_what_is_remote_and_serves_it(josef_cluster, tmp_path: Path):
    # Every broker follows the one metadata partition from the start; the one the partition moves to had no reason
    # to keep its records, so it reads them again for it (a late join), and can then serve the remote offsets.
    remote = tmp_path / "remote"
    remote.mkdir()
    cluster = josef_cluster(combined=3, **{**TIERED, "rsm.config.storage.root": str(remote),
                                           "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
                                           "rlmm.config.remote.log.metadata.topic.replication.factor": "3"})
    first, second = cluster.brokers[0], cluster.brokers[1]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("tiered", 1, replica_assignment=[[first.node_id]], config=TOPIC_CONFIG)])[
        "tiered"].result(30)
    values = produce(cluster.bootstrap_servers, "tiered", 2000)
    eventually(lambda: local_start(first.listener("PLAINTEXT")[1], "tiered") > 1500, 60,
               what="old segments to leave the first broker's disk")
    with JosefAdmin({"bootstrap.servers": cluster.bootstrap_servers}) as josef_admin:
        tp = JosefTopicPartition("tiered", 0)
        assert josef_admin.alter_partition_reassignments({tp: [second.node_id]}) == {tp: None}
        eventually(lambda: not josef_admin.list_partition_reassignments(), 120, what="the move to finish")
    for node in cluster.brokers:
        eventually(lambda: leader_of(node.bootstrap_server, "tiered") == second.node_id, 60, what="the new leader")
    # The new replica started at the old leader's local log start with the old leader's log start (Kafka's
    # buildRemoteLogAuxState), so it answers EARLIEST with 0 whether or not it has read what is remote yet: a
    # consumer resetting to the earliest offset misses nothing.
    client = RawClient(second.listener("PLAINTEXT")[1])
    try:
        assert client.list_offset("tiered", -2) == 0
    finally:
        client.close()
    assert offsets(cluster.bootstrap_servers, "tiered") == (0, 2000)
    check_read_back(second.bootstrap_server, "tiered", values)  # the old offsets from remote storage
    assert local_start(second.listener("PLAINTEXT")[1], "tiered") > 1000


def metadata_history(bootstrap: str) -> list:
    """Every record of ``__remote_log_metadata``, decoded, in each partition's order."""
    from josef.remote_log_metadata import TOPIC
    from josef.remote_log_metadata.records import decode
    from josef_client import Consumer as JosefConsumer

    with JosefAdmin({"bootstrap.servers": bootstrap}) as admin:
        partitions = len(admin.describe_topics([TOPIC])[TOPIC].partitions)
    consumer = JosefConsumer({"bootstrap.servers": bootstrap, "group.id": "history", "enable.auto.commit": False,
                              "auto.offset.reset": "earliest"})
    try:
        assigned = [JosefTopicPartition(TOPIC, p) for p in range(partitions)]
        consumer.assign(assigned)
        ends = consumer.end_offsets(assigned)
        records = []
        while any(consumer.position(tp) < ends[tp] for tp in assigned):
            for batch in consumer.poll(timeout_ms=1000).values():
                records += [decode(record.value) for record in batch]
    finally:
        consumer.close()
    return records


def test_a_leader_killed_mid_upload_leaves_a_copy_its_successor_deletes_and_makes_again(josef_cluster, seaweedfs,
                                                                                       s3_bucket):
    from josef.metadata.records import uuid_to_text
    from josef.remote_storage import RemoteLogSegmentMetadata, RemoteLogSegmentState as S
    from josef_client.remote_log_metadata import remote_log_metadata
    from josef_storage_tiered.s3 import S3RemoteStorage

    settings = seaweedfs.rsm_settings(s3_bucket)
    cluster = josef_cluster(combined=3, **{**TIERED, **{f"rsm.config.{k}": v for k, v in settings.items()},
                                           "remote.log.storage.manager.class.name": "s3",
                                           "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
                                           "min.insync.replicas": "2"})
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, replicas=3)
    values = produce(bootstrap, "tiered", 500)
    leader = leader_of(bootstrap, "tiered")
    eventually(lambda: local_start(cluster.node(leader).listener("PLAINTEXT")[1], "tiered") > 0, 60,
               what="the first copies")

    def hanging() -> set:
        """Segments the leader began to copy and has not finished copying."""
        started, ended = set(), set()
        for record in metadata_history(bootstrap):
            if isinstance(record, RemoteLogSegmentMetadata) and record.broker_id == leader:
                started.add(record.segment_id.id)
            elif getattr(record, "state", None) is S.COPY_SEGMENT_FINISHED:
                ended.add(record.segment_id.id)
        return started - ended

    os.kill(seaweedfs.pid, signal.SIGSTOP)  # the object store stops answering: the next copy hangs mid-upload
    try:
        values += produce(bootstrap, "tiered", 300)
        unfinished = eventually(hanging, 60, what="a copy to hang")
        cluster.node(leader).kill()
    finally:
        os.kill(seaweedfs.pid, signal.SIGCONT)
    survivors = ",".join(n.bootstrap_server for n in cluster.brokers if n.node_id != leader)
    successor = eventually(lambda: (new := leader_of(survivors, "tiered")) not in (leader, -1) and new, 60,
                           what="a new leader")
    values += produce(survivors, "tiered", 300)

    def cleaned_up() -> bool:
        last = {}
        for record in metadata_history(survivors):
            if hasattr(record, "segment_id") and record.segment_id.id in unfinished:
                last[record.segment_id.id] = record
        return all(getattr(last[s], "state", None) is S.DELETE_SEGMENT_FINISHED and last[s].broker_id == successor
                   for s in unfinished)

    eventually(cleaned_up, 120, what="the new leader to delete the copies the dead one left")
    port = cluster.node(successor).listener("PLAINTEXT")[1]
    eventually(lambda: local_start(port, "tiered") > 800, 120, what="the new leader to copy the segments again")
    # Every remote offset in exactly one finished copy, and nothing else in the bucket.

    def settled() -> list | None:
        """The remote segments once every closed segment of the new leader is copied, and no copy is under way."""
        [segments] = remote_log_metadata({"bootstrap.servers": survivors, "group.id": "checker"},
                                         [("tiered", 0)]).values()
        listed = sorted(segments.list_segments(), key=lambda m: m.start_offset)
        active = max((int(path.stem) for d in cluster.node(successor).log_dirs for path in d.glob("tiered-0/*.log")),
                     default=-1)
        finished = {m.state for m in listed} == {S.COPY_SEGMENT_FINISHED}
        return listed if finished and listed[-1].end_offset + 1 == active else None

    listed = eventually(settled, 60, what="the last copies to finish")
    assert listed[0].start_offset == 0
    assert all(b.start_offset == a.end_offset + 1 for a, b in zip(listed, listed[1:]))
    store = S3RemoteStorage.from_settings(settings)
    try:
        keys = [entry["path"] for batch in obstore.list(store.settings.store()) for entry in batch]
    finally:
        store.close()
    # (an object's name: the segment's start offset in 20 digits, "-", its id, the file's suffix)
    assert {k.rsplit("/", 1)[1][21:].split(".")[0] for k in keys} == {uuid_to_text(m.segment_id.id) for m in listed}
    check_read_back(survivors, "tiered", values)


def active_producers(port: int, topic: str) -> list:
    """DescribeProducers of partition 0 at its leader, as kafka-transactions.sh describe-producers asks."""
    client = RawClient(port)
    try:
        answer = client.call(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": topic, "partition_indexes": [0]}]})
    finally:
        client.close()
    partition = answer.topics[0].partitions[0]
    assert partition.error_code == 0, partition
    return list(partition.active_producers)


#: The acceptance run's size: 1024 (1 GB) is the figure the issue asks for, run by hand; CI runs a slice of it.
ACCEPTANCE_MB = int(os.environ.get("JOSEF_TIERED_ACCEPTANCE_MB", "48"))
ACCEPTANCE_PARTITIONS = 3
ACCEPTANCE_CONFIG = {"remote.storage.enable": "true", "segment.bytes": str(1 << 20),
                     "local.retention.bytes": str(10 << 20), "file.delete.delay.ms": "0"}
_BLOCK = random.Random(24).randbytes(4096)


def acceptance_value(i: int) -> bytes:
    """The i-th record's 1 KiB value: its number, then bytes that differ from record to record."""
    return i.to_bytes(8, "big") + _BLOCK[i % 3000:i % 3000 + 1016]


def produce_numbered(bootstrap: str, topic: str, numbers: range) -> dict[int, list[int]]:
    """Records ``numbers`` to partition ``i % ACCEPTANCE_PARTITIONS``, acks=all and idempotent, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 20,
                         "batch.size": 512 * 1024, "queue.buffering.max.kbytes": 256 * 1024})
    sent: dict[int, list[int]] = {}
    for i in numbers:
        partition = i % ACCEPTANCE_PARTITIONS
        while True:
            try:
                producer.produce(topic, acceptance_value(i), partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
        sent.setdefault(partition, []).append(i)
    assert producer.flush(300) == 0
    return sent


def partition_bytes(node, topic: str) -> int:
    return sum(local_bytes(d) for directory in node.log_dirs for d in directory.glob(f"{topic}-*"))


def test_acceptance_a_topic_through_three_brokers_on_s3_with_a_leader_failover_mid_upload(josef_cluster, seaweedfs,
                                                                                          s3_bucket):
    """JOSEF_TIERED_ACCEPTANCE_MB (1 KiB records) into 1 MiB segments, 10 MiB kept locally, RF=3 on SeaweedFS."""
    settings = seaweedfs.rsm_settings(s3_bucket)
    cluster = josef_cluster(combined=3, **{
        **TIERED, **{f"rsm.config.{k}": v for k, v in settings.items()}, "remote.log.storage.manager.class.name": "s3",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "3", "min.insync.replicas": "2"})
    bootstrap = cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("big", ACCEPTANCE_PARTITIONS, 3, config=ACCEPTANCE_CONFIG)])["big"].result(60)
    records = ACCEPTANCE_MB << 10
    began = time.monotonic()
    sent = produce_numbered(bootstrap, "big", range(records // 2))
    leader = leader_of(bootstrap, "big")  # of partition 0, with segments still waiting for their copy
    cluster.node(leader).kill()
    survivors = ",".join(n.bootstrap_server for n in cluster.brokers if n.node_id != leader)
    eventually(lambda: leader_of(survivors, "big") not in (leader, -1), 60, what="a new leader")
    for partition, numbers in produce_numbered(survivors, "big", range(records // 2, records)).items():
        sent[partition] += numbers
    cluster.node(leader).start()
    produced = time.monotonic()

    # Every broker's disk ends up holding about local.retention.bytes per partition, plus the active segment.
    bound = ACCEPTANCE_PARTITIONS * (12 << 20)
    for node in cluster.brokers:
        eventually(lambda: partition_bytes(node, "big") < bound, 300, what=f"broker {node.node_id}'s disk to shrink")
    # Every record back once, in order, byte for byte.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "acceptance", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 << 20})
    consumer.assign([TopicPartition("big", p, 0) for p in range(ACCEPTANCE_PARTITIONS)])
    settled = time.monotonic()
    got: dict[int, list[int]] = {}
    deadline = time.monotonic() + 600
    while sum(map(len, got.values())) < records and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 1):
            assert message.error() is None, message.error()
            number = int.from_bytes(message.value()[:8], "big")
            assert message.value() == acceptance_value(number), f"record {number} differs"
            got.setdefault(message.partition(), []).append(number)
    consumer.close()
    print(f"acceptance: {ACCEPTANCE_MB} MiB produced in {produced - began:.0f} s (a leader killed halfway), disks "
          f"bounded {settled - produced:.0f} s later, read back in {time.monotonic() - settled:.0f} s")
    assert got == sent
    # No segment stays uploaded twice: one .log object per start offset. The dead leader's copy that never finished
    # (COPY_SEGMENT_STARTED, its objects written) goes at one of the new leader's next visits, as in Kafka.
    from josef_storage_tiered.s3 import S3RemoteStorage

    def segment_objects() -> list[str]:
        store = S3RemoteStorage.from_settings(settings)
        try:
            return [entry["path"] for batch in obstore.list(store.settings.store()) for entry in batch
                    if entry["path"].endswith(".log")]
        finally:
            store.close()

    def starts_of(logs: list[str]) -> list[tuple[str, str]]:
        return [(k.split("/")[-2], k.split("/")[-1].split("-")[0]) for k in logs]

    logs = eventually(lambda: (found := segment_objects()) and len(set(starts_of(found))) == len(found) and found, 60,
                      what="one object per segment start offset (the dead leader's unfinished copy deleted)")
    assert len({p for p, _ in starts_of(logs)}) == ACCEPTANCE_PARTITIONS
    assert len(logs) >= ACCEPTANCE_MB // 2  # most of it went remote, in 1 MiB segments


def isr(bootstrap: str, topic: str) -> list[int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return list(metadata.topics[topic].partitions[0].isrs)


def fetch_from(port: int, topic: str, offset: int):
    client = RawClient(port)
    try:
        answer = client.call(ApiKey.FETCH, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    finally:
        client.close()
    return answer.responses[0].partitions[0]


COPIED = re.compile(r"^\[(\S+ \S+)\] INFO copied tiered-0 offsets \d+-\d+ \((\d+) bytes\) to remote storage")
QUOTA = 64 * 1024


def test_copy_and_remote_fetch_quotas_hold_bytes_per_second(broker_factory, tmp_path: Path):
    remote = tmp_path / "remote"
    remote.mkdir()
    broker = broker_factory(**TIERED, **{"rsm.config.storage.root": str(remote),
                                         "remote.log.manager.copy.max.bytes.per.second": str(QUOTA),
                                         "remote.log.manager.fetch.max.bytes.per.second": str(QUOTA)})
    create_topic(broker.bootstrap_servers, replicas=1)
    values = produce(broker.bootstrap_servers, "tiered", 2000)
    eventually(lambda: local_start(broker.port, "tiered") > 1500, 120, what="old segments to leave the local disk")
    copies = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), int(m.group(2)))
              for m in map(COPIED.match, broker.log) if m]
    # The copies spread out at the quota: what went beyond one second's worth took a second per quota's worth.
    copied = sum(size for _, size in copies)
    assert copied > 5 * QUOTA
    assert (copies[-1][0] - copies[0][0]).total_seconds() >= 0.7 * (copied - 2 * QUOTA) / QUOTA
    # Reading it back: fetches of remote data past the quota are answered empty, so the read takes as long.
    start = time.monotonic()
    check_read_back(broker.bootstrap_servers, "tiered", values)
    remote_bytes = copied - 4 * 16384  # at least: about one copied segment may still be on the local disk too
    assert time.monotonic() - start >= 0.7 * (remote_bytes - 2 * QUOTA) / QUOTA


def test_a_remote_object_corrupted_behind_the_brokers_back_fails_that_read_alone(tiered_broker):
    broker, remote = tiered_broker
    create_topic(broker.bootstrap_servers, replicas=1)
    produce(broker.bootstrap_servers, "tiered", 2000)
    eventually(lambda: local_start(broker.port, "tiered") > 1000, 60, what="old segments to leave the local disk")
    first = min(remote.rglob("*.log"))  # the segment at offset 0: zero-padded names sort by offset
    first.write_bytes(b"\xff" * first.stat().st_size)
    assert fetch_from(broker.port, "tiered", 0).error_code == 56  # KAFKA_STORAGE_ERROR, for this read alone
    local = local_start(broker.port, "tiered")
    recent = fetch_from(broker.port, "tiered", local)
    assert recent.error_code == 0 and recent.records  # the hot tail is served
    beyond = fetch_from(broker.port, "tiered", min(s for s in (int(p.name[:20]) for p in remote.rglob("*.log")) if s > 0))
    assert beyond.error_code == 0 and beyond.records  # other remote segments too


def s3_broker(broker_factory, seaweedfs, bucket: str, **rsm: str):
    """A broker tiering to ``bucket`` of the SeaweedFS server, with calls that give up after 2 s."""
    settings = seaweedfs.rsm_settings(bucket, {"storage.s3.api.call.timeout": "2000",
                                               "storage.s3.api.call.attempt.timeout": "1000", **rsm})
    return broker_factory(**{**TIERED, "remote.log.storage.manager.class.name": "s3",
                             **{f"rsm.config.{k}": v for k, v in settings.items()}})


def test_with_the_object_store_down_the_tail_is_served_and_nothing_uncopied_is_deleted(broker_factory, seaweedfs,
                                                                                       s3_bucket):
    broker = s3_broker(broker_factory, seaweedfs, s3_bucket)
    create_topic(broker.bootstrap_servers, replicas=1)
    values = produce(broker.bootstrap_servers, "tiered", 500)
    eventually(lambda: local_start(broker.port, "tiered"), 60, what="the first segments to be copied")
    seaweedfs.stop()
    try:
        values += produce(broker.bootstrap_servers, "tiered", 1500)  # acks=all writes go on
        assert broker.wait_for_log("to remote storage failed", timeout=60)
        stuck = local_start(broker.port, "tiered")
        failures = lambda: sum("to remote storage failed" in line for line in broker.log)  # noqa: E731
        seen = failures()
        eventually(lambda: failures() > seen, 60, what="the copy to be tried again")
        assert local_start(broker.port, "tiered") == stuck < 1000  # local retention waits for the copies
        tail = fetch_from(broker.port, "tiered", stuck)
        assert tail.error_code == 0 and tail.records
    finally:
        seaweedfs.start()
    eventually(lambda: local_start(broker.port, "tiered") > 1500, 60, what="the copies to resume")
    check_read_back(broker.bootstrap_servers, "tiered", values)


def test_wrong_credentials_are_reported_naming_the_setting(broker_factory, seaweedfs, s3_bucket):
    broker = s3_broker(broker_factory, seaweedfs, s3_bucket, **{"storage.aws.secret.access.key": "wrong"})
    create_topic(broker.bootstrap_servers, replicas=1)
    values = produce(broker.bootstrap_servers, "tiered", 500)
    assert broker.wait_for_log("rsm.config.storage.aws.secret.access.key", timeout=60)
    assert local_start(broker.port, "tiered") == 0  # nothing deleted that is not copied
    check_read_back(broker.bootstrap_servers, "tiered", values)


def test_read_committed_consumers_skip_aborted_transactions_in_remote_segments(tiered_broker):
    broker, _ = tiered_broker
    create_topic(broker.bootstrap_servers, replicas=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "tiered-txn",
                         "linger.ms": 5, "batch.size": 4096})
    producer.init_transactions(30)
    committed: list[bytes] = []
    for round_ in range(20):
        producer.begin_transaction()
        batch = [b"%02d-%03d-" % (round_, i) + b"x" * 200 for i in range(50)]
        for value in batch:
            producer.produce("tiered", value)
        if round_ % 3 == 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += batch
    eventually(lambda: local_start(broker.port, "tiered") > 500, 60, what="transactional segments to leave the local disk")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "committed",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition("tiered", 0, 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < len(committed) and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            seen.append(message.value())
    consumer.close()
    assert seen == committed  # from remote and local segments alike: no aborted record, every committed one


def test_total_retention_and_delete_records_remove_remote_segments(tiered_broker):
    broker, remote = tiered_broker
    create_topic(broker.bootstrap_servers, replicas=1)
    produce(broker.bootstrap_servers, "tiered", 2000)
    eventually(lambda: local_start(broker.port, "tiered") > 1000, 60, what="old segments to leave the local disk")
    remote_logs = lambda: sorted(int(p.name[:20]) for p in remote.rglob("*.log"))  # noqa: E731
    first_remote = remote_logs()
    assert first_remote[0] == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_records([TopicPartition("tiered", 0, 300)])[TopicPartition("tiered", 0, 300)].result(30)
    assert offsets(broker.bootstrap_servers, "tiered")[0] == 300
    eventually(lambda: remote_logs()[0] > 0, 60, what="remote segments below the log start to be deleted")
    assert all(start > 0 for start in remote_logs()) and remote_logs()[0] <= 300
    # retention.bytes over remote and local data together: the oldest remote segments go first.
    resource = ConfigResource("topic", "tiered", incremental_configs=[
        ConfigEntry("retention.bytes", "100000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    eventually(lambda: offsets(broker.bootstrap_servers, "tiered")[0] > 1000, 60, what="retention.bytes to delete")
    # The log start is the start of a remote segment left. Segments listed first: a later round of retention may
    # take more before the log start is read, and the new log start is then another segment of that list.
    segments = remote_logs()
    low = offsets(broker.bootstrap_servers, "tiered")[0]
    assert low in segments
    # Read from the log start to the end: whatever retention took meanwhile, what is left is contiguous and complete.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "after-retention",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition("tiered", 0, low)])
    read: list[int] = []
    deadline = time.monotonic() + 60
    while (not read or read[-1] < 1999) and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            read.append(int(message.value()[:6]))
    consumer.close()
    assert read and read[0] >= low and read == list(range(read[0], 2000))


def test_a_deleted_topic_takes_its_remote_data_with_it(tiered_broker):
    broker, remote = tiered_broker
    create_topic(broker.bootstrap_servers, replicas=1)
    produce(broker.bootstrap_servers, "tiered", 2000)
    eventually(lambda: local_start(broker.port, "tiered") > 1000, 60, what="old segments to leave the local disk")
    assert any(remote.rglob("*.log"))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.delete_topics(["tiered"])["tiered"].result(30)
    eventually(lambda: not any(remote.rglob("*.log")), 60, what="the remote segments of the deleted topic to go")
    assert broker.wait_for_log("remote segments of deleted tiered-0")


def test_the_brokers_default_tiers_plain_topics_and_leaves_compacted_ones_local(broker_factory, tmp_path: Path):
    """log.remote.storage.enable (josef's broker default of remote.storage.enable): a topic that says nothing is
    copied to remote storage; a compacted one stays local, as Kafka refuses compacted topics remote storage."""
    remote = tmp_path / "remote"
    remote.mkdir()
    broker = broker_factory(**TIERED, **{"rsm.config.storage.root": str(remote), "log.remote.storage.enable": "true"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    small = {"segment.bytes": "16384", "local.retention.bytes": "16384", "file.delete.delay.ms": "0"}
    for future in admin.create_topics([NewTopic("plain", 1, 1, config=small),
                                       NewTopic("keyed", 1, 1, config={"segment.bytes": "16384",
                                                                       "cleanup.policy": "compact"})]).values():
        future.result(30)
    values = produce(broker.bootstrap_servers, "plain", 500)
    produce(broker.bootstrap_servers, "keyed", 500)
    eventually(lambda: local_start(broker.port, "plain") > 0, 60, what="plain's old segments to leave the local disk")
    client = RawClient(broker.port)
    try:
        assert client.list_offset("plain", -5) >= 0  # LATEST_TIERED: something of it is remote
        assert client.list_offset("keyed", -5) == client.list_offset("keyed", -6) == -1  # not tiered
        assert client.list_offset("keyed", -4) == 0  # everything on local disk
    finally:
        client.close()
    check_read_back(broker.bootstrap_servers, "plain", values)  # from remote storage, then the disk
