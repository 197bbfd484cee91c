"""Tiered storage's metrics (josef_storage_tiered.metrics) on a broker copying to a local directory: copies, remote
reads and their index cache, deletions after DeleteRecords, and a read whose remote data is gone."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.node.runner import BrokerThread
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient, broker_overrides, eventually

E = ErrorCode
#: A broker that copies rolled segments to a directory every 200 ms and keeps about one locally.
TIERED = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "local-dir",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
}
TOPIC_CONFIG = {"remote.storage.enable": "true", "segment.bytes": "16384", "local.retention.bytes": "16384",
                "retention.ms": "-1", "file.delete.delay.ms": "0"}
BTM = "kafka_server_brokertopicmetrics"
TP = TopicPartition("t", 0)


@pytest.fixture
def tiered(tmp_path: Path):
    remote = tmp_path / "remote"
    remote.mkdir()
    broker = BrokerThread(broker_overrides(tmp_path / "data", **TIERED, **{"rsm.config.storage.root": str(remote)}))
    broker.start()
    client = RawClient(broker.port)
    try:
        yield broker, client, remote
    finally:
        client.close()
        broker.stop()


def node_samples(broker: BrokerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the node exports, read on its event loop; no family is there twice."""
    families = broker.call(lambda: broker.broker.metrics.families())
    names = [f.name for f in families]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def topic_value(samples: dict, name: str) -> float:
    """The topic's series, checked against the all-topics one (the only tiered topic)."""
    value = samples[name, (("topic", "t"),)]
    assert samples[name, ()] == value, name
    return value


def fetch(client: RawClient, offset: int) -> Any:
    answer = client.call(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    return answer.responses[0].partitions[0]


def test_remote_copies_reads_deletions_and_errors_are_counted(tiered, tmp_path: Path) -> None:
    broker, client, remote = tiered
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [{
        "name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [],
        "configs": [{"name": k, "value": v} for k, v in TOPIC_CONFIG.items()]}], "timeout": 60000,
        "validate_only": False})
    assert created.topics[0].error_code == E.none
    for n in range(40):  # about 4 KiB a batch: ten 16 KiB segments
        batch = build_batch([(None, b"%03d-%02d" % (n, i) + b"." * 200, int(time.time() * 1000)) for i in range(20)])
        answer = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
        assert answer.responses[0].partition_responses[0].error_code == E.none
    data = tmp_path / "data" / "t-0"
    active = max(int(p.stem) for p in data.glob("*.log"))
    eventually(lambda: client.list_offset("t", -5) == active - 1, 60, what="the rolled segments to be copied")
    eventually(lambda: client.list_offset("t", -4) > 0, 60, what="copied segments to be deleted locally")
    manager = broker.broker.storage.manager
    segments = broker.call(lambda: list(manager.view(TP).segments))

    def copied() -> dict | None:
        samples = node_samples(broker)
        done = samples[f"{BTM}_remotecopylagsegments", (("topic", "t"),)] == 0
        return samples if done and samples[f"{BTM}_remotelogmetadatacount", ()] == len(segments) else None

    samples = eventually(copied, 10, what="the copy lag to be reported as none")
    assert topic_value(samples, f"{BTM}_remotecopyrequests_total") == len(segments) >= 8
    assert topic_value(samples, f"{BTM}_remotecopyerrors_total") == 0
    size = sum(s.segment_size_in_bytes for s in segments)
    assert topic_value(samples, f"{BTM}_remotecopybytes_total") == topic_value(samples, f"{BTM}_remotelogsizebytes") \
        == size
    assert topic_value(samples, f"{BTM}_remotecopylagbytes") == 0
    assert topic_value(samples, f"{BTM}_remotedeletelagsegments") == 0
    assert topic_value(samples, f"{BTM}_remotefetchrequests_total") == 0

    first = fetch(client, 0)  # below the local log start: read from remote storage
    assert first.error_code == E.none and first.records
    samples = node_samples(broker)
    assert topic_value(samples, f"{BTM}_remotefetchrequests_total") == 1
    assert topic_value(samples, f"{BTM}_remotefetchbytes_total") == len(bytes(first.records))
    misses = samples["kafka_log_remoteindexcache_misses_total", ()]
    assert misses >= 1 and samples["kafka_log_remoteindexcache_entrycount", ()] == misses
    assert samples["kafka_log_remoteindexcache_sizebytes", ()] > 0
    assert fetch(client, 0).error_code == E.none
    samples = node_samples(broker)
    assert samples["kafka_log_remoteindexcache_hits_total", ()] >= 1  # the offset index, from memory this time
    assert topic_value(samples, f"{BTM}_remotefetchrequests_total") == 2

    # DeleteRecords past the first remote segment: it is deleted from remote storage.
    start = segments[0].end_offset + 1
    deleted = client.call(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "offset": start}]}], "timeout": 5000})
    assert deleted.topics[0].partitions[0].error_code == E.none

    def removed() -> dict | None:
        samples = node_samples(broker)
        return samples if samples[f"{BTM}_remotelogmetadatacount", ()] == len(segments) - 1 else None

    samples = eventually(removed, 10, what="the first remote segment to be deleted")
    assert topic_value(samples, f"{BTM}_remotedeleterequests_total") == 1
    assert topic_value(samples, f"{BTM}_remotedeleteerrors_total") == 0
    assert topic_value(samples, f"{BTM}_remotelogsizebytes") == size - segments[0].segment_size_in_bytes
    assert topic_value(samples, f"{BTM}_remotedeletelagbytes") == 0

    for path in remote.iterdir():  # remote storage loses everything: the next remote read fails
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert fetch(client, start).error_code == E.kafka_storage_error
    samples = node_samples(broker)
    assert topic_value(samples, f"{BTM}_remotefetcherrors_total") == 1
    assert topic_value(samples, f"{BTM}_remotefetchrequests_total") == 3
