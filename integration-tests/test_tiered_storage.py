"""Tiered storage (KIP-405) end to end: segments copied to remote storage, deleted locally, and read back from there by
real clients."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

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


def produce(bootstrap: str, topic: str, count: int, first_timestamp: int = 0) -> list[bytes]:
    """``count`` records; the i-th stamped ``first_timestamp + i`` when that is given (else the producer's clock)."""
    values = [b"%06d-" % i + bytes([i % 251]) * 200 for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % (len(value) % 7), timestamp=first_timestamp + i if first_timestamp else 0)
    assert producer.flush(60) == 0
    return values


def read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None:
            assert message.error() is None, message.error()
            values.append(message.value())
    consumer.close()
    return values


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
    assert read_all(broker.bootstrap_servers, "tiered", 2000) == values
    assert start <= local_start(broker.port, "tiered")
    # kafka-dump-log.sh --remote-log-metadata-decoder: the metadata topic's records as Kafka's classes print them.
    segments = [p for p in broker.data_dir.glob("__remote_log_metadata-*/*.log") if p.stat().st_size]
    dumped = subprocess.run([sys.executable, "-m", "josef", "dump-log", "--remote-log-metadata-decoder", "--files",
                             ",".join(map(str, segments))], capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0 and "Traceback" not in dumped.stderr, dumped.stderr
    assert re.search(r" payload: RemoteLogSegmentMetadata\{remoteLogSegmentId=RemoteLogSegmentId\{topicIdPartition="
                     r"[\w-]{22}:tiered-0, id=[\w-]{22}\}, startOffset=0, endOffset=\d+, brokerId=1, ", dumped.stdout)
    assert "payload: RemoteLogSegmentMetadataUpdate{" in dumped.stdout and "state=COPY_SEGMENT_FINISHED" in dumped.stdout
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
    assert read_all(survivors, "tiered", 3000) == values  # every record once, in order: nothing lost or doubled
    assert offsets(survivors, "tiered") == (0, 3000)
    port = cluster.node(leader_of(survivors, "tiered")).listener("PLAINTEXT")[1]
    eventually(lambda: local_start(port, "tiered") > 2000, 60, what="the new leader to copy and delete its old segments")
    assert read_all(bootstrap, "tiered", 3000) == values
    # A follower away while the leader's local log moved past its end starts over at the leader's local log start
    # (OFFSET_MOVED_TO_TIERED_STORAGE), joins the ISR again, and can lead: what it never had is read remotely.
    leader = leader_of(survivors, "tiered")
    follower = next(n for n in cluster.brokers if n.node_id != leader)
    follower_end = offsets(survivors, "tiered")[1]
    follower.kill()
    values += produce(survivors, "tiered", 2000)
    port = cluster.node(leader).listener("PLAINTEXT")[1]
    eventually(lambda: local_start(port, "tiered") > follower_end, 60, what="the leader's local log to pass the follower")
    follower.start()
    assert follower.wait_for_log("the rest is in remote storage", timeout=30)
    eventually(lambda: len(isr(survivors, "tiered")) == 3, 60, what="the follower to rejoin the ISR")
    cluster.node(leader).kill()
    eventually(lambda: leader_of(follower.bootstrap_server, "tiered") not in (leader, -1), 60, what="a new leader")
    assert read_all(follower.bootstrap_server, "tiered", 5000) == values


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
    assert read_all(broker.bootstrap_servers, "tiered", 2000) == values


def test_wrong_credentials_are_reported_naming_the_setting(broker_factory, seaweedfs, s3_bucket):
    broker = s3_broker(broker_factory, seaweedfs, s3_bucket, **{"storage.aws.secret.access.key": "wrong"})
    create_topic(broker.bootstrap_servers, replicas=1)
    values = produce(broker.bootstrap_servers, "tiered", 500)
    assert broker.wait_for_log("rsm.config.storage.aws.secret.access.key", timeout=60)
    assert local_start(broker.port, "tiered") == 0  # nothing deleted that is not copied
    assert read_all(broker.bootstrap_servers, "tiered", 500) == values


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
    low = offsets(broker.bootstrap_servers, "tiered")[0]
    assert low in remote_logs()  # the log start is the start of a remote segment left (later rounds may take more)
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
    assert read_all(broker.bootstrap_servers, "plain", 500) == values  # from remote storage, then the disk
