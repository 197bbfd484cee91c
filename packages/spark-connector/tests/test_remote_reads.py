"""remoteReads=direct: a tiered topic's old offsets read by the executors from remote storage, the rest by brokers."""

from __future__ import annotations

import uuid

import pytest
from conftest import create_topic, reader
from pyspark.errors import AnalysisException

from josef.node.runner import BrokerThread
from josef.protocol.api_keys import ApiKey
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from josef.testing import RawClient, broker_overrides, eventually
from josef_client import Producer
from josef_spark.planning import OffsetRange
from josef_spark.remote_reads import TASK_BYTES, RemotePiece, chain, split

#: A broker that copies rolled segments to a directory every 200 ms and keeps about one locally.
TIERED = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "local-dir",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "2",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
}
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": "16384", "local.retention.bytes": "16384",
                "retention.ms": "-1",  # the records are stamped in 2023
                "file.delete.delay.ms": "0"}
RECORDS = 1500


@pytest.fixture
def tiered(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    broker = BrokerThread(broker_overrides(tmp_path / "data", **TIERED, **{"rsm.config.storage.root": str(remote)}))
    broker.start()
    try:
        yield broker, remote
    finally:
        broker.stop()


def list_offset(broker, topic: str, partition: int, spec: int) -> int:
    client = RawClient(broker.port)
    try:
        return client.list_offset(topic, spec, partition=partition)
    finally:
        client.close()


def fetch_error(broker, topic: str, partition: int, offset: int) -> int:
    client = RawClient(broker.port)
    try:
        answer = client.call(ApiKey.FETCH, 12, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    finally:
        client.close()
    return answer.responses[0].partitions[0].error_code


def active_base(data_dir, topic: str, partition: int) -> int:
    """The base offset of the partition's newest segment: what is below it is rolled, so copied in time."""
    return max(int(p.stem) for p in (data_dir / f"{topic}-{partition}").glob("*.log"))


def table(df):
    return sorted((r.partition, r.offset, r.key, r.value, r.timestamp, tuple((h.key, h.value) for h in r.headers))
                  for r in df.collect())


def test_direct_reads_come_from_remote_storage_and_equal_reads_through_the_broker(spark, tiered, tmp_path):
    broker, remote = tiered
    create_topic(broker, "old", 2, **TOPIC_CONFIG)
    with Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5}) as producer:
        for i in range(RECORDS):
            producer.send("old", b"%05d" % i + bytes([i % 251]) * 120, key=b"k%d" % (i % 3), partition=i % 2,
                          headers=[("n", b"%d" % i)], timestamp_ms=1_700_000_000_000 + i)
        producer.flush()
    data_dir = tmp_path / "data"
    for p in (0, 1):  # every rolled segment copied, all but about one deleted locally
        eventually(lambda: list_offset(broker, "old", p, -5) == active_base(data_dir, "old", p) - 1, 60,
                   what=f"old-{p}'s rolled segments to be copied")
        eventually(lambda: list_offset(broker, "old", p, -4) > RECORDS // 4, 60, what=f"old-{p} to shrink locally")
    brokers_read = table(reader(spark, broker, subscribe="old", includeHeaders="true").load())
    assert [(p, o) for p, o, *_ in brokers_read] == [(p, o) for p in (0, 1) for o in range(RECORDS // 2)]

    # The brokers lose their remote storage; the executors are given it under its new name.
    moved = tmp_path / "moved"
    remote.rename(moved)
    assert fetch_error(broker, "old", 0, 0) == 56  # KAFKA_STORAGE_ERROR: no broker can serve the old offsets now
    direct = reader(spark, broker, subscribe="old", includeHeaders="true", remoteReads="direct",
                    **{"remote.log.storage.manager.class.name": "local-dir", "rsm.config.storage.root": str(moved)})
    assert table(direct.load()) == brokers_read
    # From an offset within a segment, to an offset of the local log.
    ranged = direct.option("startingOffsets", '{"old": {"0": 17, "1": 0}}').option(
        "endingOffsets", f'{{"old": {{"0": {RECORDS // 2 - 3}, "1": 1}}}}').load()
    assert [(p, o) for p, o, *_ in table(ranged)] == [(0, o) for o in range(17, RECORDS // 2 - 3)] + [(1, 0)]


def test_read_committed_direct_reads_drop_aborted_transactions_with_the_remote_transaction_indexes(spark, tiered,
                                                                                                  tmp_path):
    broker, remote = tiered
    create_topic(broker, "txn", 1, **TOPIC_CONFIG)
    committed = []
    with Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "remote-reads",
                   "linger.ms": 5}) as producer:
        producer.init_transactions()
        for t in range(40):  # every third transaction aborted, over many 16 KiB segments
            producer.begin_transaction()
            values = [b"t%02d-%02d" % (t, i) + b"." * 100 for i in range(30)]
            for value in values:
                producer.send("txn", value)
            if t % 3 == 1:
                producer.flush()  # written, then aborted (an abort drops what is not sent yet)
                producer.abort_transaction()
            else:
                producer.commit_transaction()
                committed.append(values)
    eventually(lambda: list_offset(broker, "txn", 0, -5) == active_base(tmp_path / "data", "txn", 0) - 1, 60,
               what="txn-0's rolled segments to be copied")
    tiered_end = list_offset(broker, "txn", 0, -5)
    moved = tmp_path / "moved"
    remote.rename(moved)  # so what is read below comes from remote storage, through the executors alone
    # Up to the middle of what is remote: aborts recorded after it settle every transaction before it.
    end = tiered_end // 2
    direct = reader(spark, broker, subscribe="txn", remoteReads="direct", endingOffsets=f'{{"txn": {{"0": {end}}}}}',
                    **{"kafka.isolation.level": "read_committed", "remote.log.storage.manager.class.name": "local-dir",
                       "rsm.config.storage.root": str(moved)}).load()
    got = [r.value for r in direct.orderBy("offset").collect()]
    # Committed transactions t00, t02, t03, t05... in order: the aborted t01, t04... between them are gone.
    assert len(got) >= 90 and got == [value for values in committed for value in values][:len(got)]


def test_direct_reads_need_the_remote_storage_keys(spark, josef_broker):
    create_topic(josef_broker, "plain", 1)
    with pytest.raises(AnalysisException, match="remoteReads=direct needs remote.log.storage.manager.class.name"):
        reader(spark, josef_broker, subscribe="plain", remoteReads="direct").load()
    with pytest.raises(AnalysisException, match="rsm.config.storage.root is for remoteReads=direct only"):
        reader(spark, josef_broker, subscribe="plain", **{"rsm.config.storage.root": "/x"}).load()
    with pytest.raises(AnalysisException, match="no remote storage backend named 'nfs'"):
        reader(spark, josef_broker, subscribe="plain", remoteReads="direct",
               **{"remote.log.storage.manager.class.name": "nfs"}).load()


TOPIC_ID = uuid.uuid4()


def segment(start: int, end: int, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED, size: int = 1000):
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(TOPIC_ID, TopicPartition("t", 0)), start, end, 0, 1, 0,
                                    size, {0: start}, state)


def test_a_chain_takes_finished_copies_in_order_preferring_the_one_reaching_further():
    a, b, b_longer, c = segment(0, 9), segment(10, 19), segment(10, 29), segment(30, 39)
    unfinished, deleting = segment(40, 49, RemoteLogSegmentState.COPY_SEGMENT_STARTED), segment(
        40, 49, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
    assert chain([c, b, unfinished, a, b_longer, deleting]) == [a, b_longer, c]
    overlapping = segment(5, 14)  # a deposed leader's copy from within a: the chain goes on where a ends
    assert chain([a, overlapping, c]) == [a, overlapping]  # 15..29 held by no copy: the chain stops there
    assert chain([]) == []


def test_split_cuts_remote_offsets_into_pieces_of_bounded_bytes_and_leaves_the_rest_to_the_brokers():
    big = TASK_BYTES // 2 + 1
    segments = [segment(0, 9, size=big), segment(10, 19, size=big), segment(20, 29, size=big)]
    remote = {("t", 0): segments}
    pieces = split([OffsetRange("t", 0, 5, 50), OffsetRange("t", 1, 0, 5)], remote, read_committed=False)
    assert pieces == [RemotePiece(OffsetRange("t", 0, 5, 10), (segments[0],)),
                      RemotePiece(OffsetRange("t", 0, 10, 20), (segments[1],)),
                      RemotePiece(OffsetRange("t", 0, 20, 30), (segments[2],)),
                      OffsetRange("t", 0, 30, 50), OffsetRange("t", 1, 0, 5)]
    # read_committed: each piece carries the later segments too, whose transaction indexes it may need.
    first = split([OffsetRange("t", 0, 0, 12)], remote, read_committed=True)
    assert first == [RemotePiece(OffsetRange("t", 0, 0, 10), tuple(segments)),
                     RemotePiece(OffsetRange("t", 0, 10, 12), tuple(segments[1:]))]
    # Below the remote start (nothing to read there), or above the remote end: the brokers' alone.
    assert split([OffsetRange("t", 0, 30, 40)], remote, False) == [OffsetRange("t", 0, 30, 40)]
