"""DescribeLogDirs and AlterReplicaLogDirs over a real socket against an in-process broker with two log dirs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch, iter_batches
from josef.node.runner import BrokerThread
from josef.testing import RawClient, broker_overrides

E = ErrorCode
TOPIC = "spread"


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "dirA", tmp_path / "dirB"]


@pytest.fixture
def client(tmp_path: Path, dirs: list[Path]) -> Iterator[RawClient]:
    """A client of a broker on two log dirs, with a 4-partition topic."""
    broker = BrokerThread(broker_overrides(tmp_path, **{"log.dirs": ",".join(map(str, dirs))}))
    broker.start()
    raw = RawClient(broker.port)
    try:
        response = raw.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 10000, "validate_only": False, "topics": [
            {"name": TOPIC, "num_partitions": 4, "replication_factor": 1, "assignments": [], "configs": []}]})
        assert response.topics[0].error_code == E.none
        yield raw
    finally:
        raw.close()
        broker.stop()


def describe(client: RawClient, topics: list[dict] | None = None, version: int = 5):
    response = client.call(ApiKey.DESCRIBE_LOG_DIRS, version, {"topics": topics})
    if version >= 3:
        assert response.error_code == E.none
    assert all(result.error_code == E.none for result in response.results)
    return response


def placement(response) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """``(topic, partition) -> [(log dir, size)...]``: every dir reporting each partition."""
    found: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for result in response.results:
        for topic in result.topics:
            for p in topic.partitions:
                assert (p.offset_lag, p.is_future_key) == (0, False)
                found.setdefault((topic.name, p.partition_index), []).append((result.log_dir, p.partition_size))
    return found


def produce(client: RawClient, partition: int, count: int) -> int:
    """Append ``count`` one-record batches; returns the bytes appended."""
    size = 0
    for i in range(count):
        batch = build_batch([(None, f"value-{i}".encode(), 1000 + i)])
        size += len(batch)
        response = client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout": 10000,
                                                   "topic_data": [{"name": TOPIC, "partition_data": [
                                                       {"index": partition, "records": batch}]}]})
        assert response.responses[0].partition_responses[0].error_code == E.none
    return size


def fetch_offsets(client: RawClient, partition: int) -> list[int]:
    """Base offsets of every batch in the partition, fetched from offset 0 until the high watermark."""
    offsets: list[int] = []
    while True:
        response = client.call(ApiKey.FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": TOPIC, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": offsets[-1] + 1 if offsets else 0,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
        data = response.responses[0].partitions[0]
        assert data.error_code == E.none
        batches = [header.base_offset for _, header in iter_batches(data.records or b"")]
        if not batches:
            return offsets
        offsets += batches


def alter(client: RawClient, path: str, partitions: dict[str, list[int]], version: int = 2):
    response = client.call(ApiKey.ALTER_REPLICA_LOG_DIRS, version, {"dirs": [
        {"path": path, "topics": [{"name": name, "partitions": indexes} for name, indexes in partitions.items()]}]})
    return {(t.topic_name, p.partition_index): p.error_code for t in response.results for p in t.partitions}


# DescribeLogDirs ------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_every_version_reports_both_dirs_and_each_partition_in_exactly_one(client, dirs, version):
    response = describe(client, version=version)
    assert [r.log_dir for r in response.results] == [str(d) for d in dirs]
    assert sorted(placement(response)) == [(TOPIC, i) for i in range(4)]
    assert all(len(where) == 1 for where in placement(response).values())
    if version >= 4:
        for result in response.results:
            assert result.total_bytes > 0 and 0 <= result.usable_bytes <= result.total_bytes


def test_partition_sizes_grow_with_what_is_produced(client):
    assert {size for [(_, size)] in placement(describe(client)).values()} == {0}
    appended = produce(client, 2, 3)
    sizes = {key: size for key, [(_, size)] in placement(describe(client)).items()}
    assert sizes == {(TOPIC, 0): 0, (TOPIC, 1): 0, (TOPIC, 2): appended, (TOPIC, 3): 0}


def test_only_the_asked_partitions_that_are_here_are_described(client):
    response = describe(client, [{"topic": TOPIC, "partitions": [1, 3, 99]}, {"topic": "absent", "partitions": [0]}])
    assert sorted(placement(response)) == [(TOPIC, 1), (TOPIC, 3)]
    assert len(response.results) == 2, "every log dir is listed, even one without the asked partitions"


# AlterReplicaLogDirs --------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_moved_partition_is_described_in_its_new_dir_and_keeps_every_record(client, dirs, version):
    [(source, _)] = placement(describe(client))[(TOPIC, 0)]
    target = next(str(d) for d in dirs if str(d) != source)
    appended = produce(client, 0, 5)
    assert alter(client, target, {TOPIC: [0]}, version) == {(TOPIC, 0): E.none}
    assert placement(describe(client))[(TOPIC, 0)] == [(target, appended)]
    assert not (Path(source) / f"{TOPIC}-0").exists() and (Path(target) / f"{TOPIC}-0").is_dir()
    produce(client, 0, 2)
    assert fetch_offsets(client, 0) == list(range(7))


def test_moving_a_partition_to_the_dir_it_is_in_changes_nothing(client):
    [(source, _)] = placement(describe(client))[(TOPIC, 1)]
    produce(client, 1, 2)
    assert alter(client, source, {TOPIC: [1]}) == {(TOPIC, 1): E.none}
    assert placement(describe(client))[(TOPIC, 1)][0][0] == source
    assert fetch_offsets(client, 1) == [0, 1]


def test_a_dir_not_in_log_dirs_is_not_found(client, tmp_path):
    before = placement(describe(client))
    assert alter(client, str(tmp_path / "elsewhere"), {TOPIC: [0, 1]}) == {
        (TOPIC, 0): E.log_dir_not_found, (TOPIC, 1): E.log_dir_not_found}
    assert placement(describe(client)) == before


def test_partitions_this_broker_does_not_have_are_unknown(client, dirs):
    assert alter(client, str(dirs[1]), {TOPIC: [99], "absent": [0]}) == {
        (TOPIC, 99): E.unknown_topic_or_partition, ("absent", 0): E.unknown_topic_or_partition}
