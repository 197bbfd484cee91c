"""A broker with two log dirs, one failing (writes under it fail with EIO): its partitions go offline, the others serve.

An in-process broker (no root needed): the failing disk is simulated by
making every ``pwrite`` to a file under one directory fail, as a dying disk
does. integration-tests/test_jbod_failover.py does it with a real full tmpfs and three brokers.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from josef.metadata import meta_properties
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.node.runner import BrokerThread
from josef.testing import RawClient, broker_overrides, eventually

E = ErrorCode
TOPIC = "spread"


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "dirA", tmp_path / "dirB"]


@pytest.fixture
def broker(tmp_path: Path, dirs: list[Path]) -> Iterator[BrokerThread]:
    broker = BrokerThread(broker_overrides(tmp_path, **{"log.dirs": ",".join(map(str, dirs)),
                                                        "broker.heartbeat.interval.ms": "200"}))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def produce(client: RawClient, partition: int) -> ErrorCode:
    response = client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout": 10000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": partition, "records": build_batch([(None, b"v", 1000)])}]}]})
    return response.responses[0].partition_responses[0].error_code


def fetch(client: RawClient, partition: int) -> ErrorCode:
    response = client.call(ApiKey.FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": TOPIC, "partitions": [{"partition": partition, "current_leader_epoch": -1,
                                                    "fetch_offset": 0, "log_start_offset": -1,
                                                    "partition_max_bytes": 1 << 20}]}]})
    return response.responses[0].partitions[0].error_code


def describe(client: RawClient) -> dict[str, tuple[ErrorCode, list[int]]]:
    response = client.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
    return {r.log_dir: (r.error_code, sorted(p.partition_index for t in r.topics for p in t.partitions))
            for r in response.results}


def create_spread(client: RawClient, dirs: list[Path]) -> tuple[list[int], list[int]]:
    """Create the 4-partition topic; returns the partitions placed in each of the two dirs once all are hosted."""
    response = client.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 10000, "validate_only": False, "topics": [
        {"name": TOPIC, "num_partitions": 4, "replication_factor": 1, "assignments": [], "configs": []}]})
    assert response.topics[0].error_code == E.none
    eventually(lambda: sum(len(p) for _, p in describe(client).values()) == 4, what="every partition hosted")
    placed = describe(client)
    return placed[str(dirs[0])][1], placed[str(dirs[1])][1]


def failing_disk(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, position: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_failing_log_dir_takes_its_partitions_offline_and_the_others_keep_serving(broker, dirs, monkeypatch):
    client = RawClient(broker.port)
    try:
        in_a, in_b = create_spread(client, dirs)
        assert len(in_a) == len(in_b) == 2  # spread over both
        ids = meta_properties.directory_ids(broker.broker.config)
        a, b = ids[str(dirs[0])], ids[str(dirs[1])]
        assert broker.broker.image.brokers[1].log_dirs == (a, b)

        def directories():
            partitions = broker.broker.image.topics[TOPIC].partitions
            return {p: partitions[p].directory_of(1) for p in range(4)}
        # The broker told the controller where it put each replica (AssignReplicasToDirs).
        eventually(lambda: directories() == {**{p: a for p in in_a}, **{p: b for p in in_b}},
                   what="the replicas' directories in the metadata")

        failing_disk(monkeypatch, dirs[1])
        assert produce(client, in_b[0]) == E.kafka_storage_error
        # The other dir serves; the failed one lists nothing.
        assert [produce(client, p) for p in in_a] == [E.none, E.none]
        assert [fetch(client, p) for p in in_a] == [E.none, E.none]
        assert describe(client) == {str(dirs[0]): (E.none, in_a), str(dirs[1]): (E.kafka_storage_error, [])}

        # The broker took its partitions offline and named the dir in its heartbeat: the controller dropped the
        # dir and took the replicas in it out of leadership; with no other replica, they have no leader (as in Kafka).
        eventually(lambda: broker.broker.image.brokers[1].log_dirs == (a,), what="the controller learning of the failed dir")
        assert {(tp.topic, tp.partition) for tp in broker.broker.replicas.offline} == {(TOPIC, p) for p in in_b}
        partitions = broker.broker.image.topics[TOPIC].partitions
        assert [partitions[p].leader for p in in_b] == [-1, -1] and [partitions[p].leader for p in in_a] == [1, 1]
        assert [produce(client, p) for p in in_b] == [E.not_leader_or_follower] * 2
        assert [produce(client, p) for p in in_a] == [E.none, E.none]
        assert not broker.broker.image.brokers[1].fenced
    finally:
        client.close()


def test_a_log_dir_dead_at_restart_is_left_offline_and_its_partitions_are_not_recreated_elsewhere(broker, dirs):
    client = RawClient(broker.port)
    try:
        in_a, in_b = create_spread(client, dirs)
        ids = meta_properties.directory_ids(broker.broker.config)
        eventually(lambda: all(broker.broker.image.topics[TOPIC].partitions[p].directory_of(1) == ids[str(dirs[1])]
                               for p in in_b), what="the replicas' directories in the metadata")
        assert [produce(client, p) for p in range(4)] == [E.none] * 4
    finally:
        client.close()

    # The disk under dirB dies while the broker is down: the directory cannot even be read at the next start.
    broker.stop()
    dirs[1].rename(dirs[1].with_name("dead"))
    dirs[1].write_text("")
    broker.start()
    client = RawClient(broker.port)
    try:
        a = ids[str(dirs[0])]
        assert broker.broker.image.brokers[1].log_dirs == (a,)  # registered without it
        eventually(lambda: {(tp.topic, tp.partition) for tp in broker.broker.replicas.offline} == {(TOPIC, p) for p in in_b},
                   what="dirB's partitions offline")
        assert sorted(tp.partition for tp in broker.broker.storage.stored() if tp.topic == TOPIC) == in_a  # none recreated
        assert describe(client) == {str(dirs[0]): (E.none, in_a), str(dirs[1]): (E.kafka_storage_error, [])}
        assert [produce(client, p) for p in in_a] == [E.none, E.none]
        assert all(produce(client, p) != E.none for p in in_b)
    finally:
        client.close()
