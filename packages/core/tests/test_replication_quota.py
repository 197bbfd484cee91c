"""Replication throttles (KIP-73): the rate, the throttled-replica lists, and both fetch paths that obey them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import attrs
import pytest
from kio.schema.errors import ErrorCode

from josef.metrics.topics import BrokerTopicMetrics
from josef.config import INT64_MAX, Config, ConfigDef, ConfigError
from josef.metadata.records import BROKER_RESOURCE, TOPIC_RESOURCE
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.protocol.topic_partition import TopicPartition
from josef.replication.replica_fetcher import ReplicaFetcher, ReplicaFetchers
from josef.replication.replication_quota import Rate, ReplicationQuota
from josef.testing import RawClient, eventually

MOVING, STEADY = TopicPartition("moving", 0), TopicPartition("steady", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_is_measured_over_at_least_one_window_and_forgets_old_samples():
    rate = Rate(samples=3, window_s=1.0)
    assert rate.measure(0.0) == 0.0
    rate.record(1000, 0.0)
    assert rate.measure(0.0) == 1000  # one burst counts over a whole window, not an instant
    assert rate.measure(2.0) == 500
    rate.record(500, 2.5)  # a new sample: the first one is 2.5 s old
    assert rate.measure(2.5) == 600
    assert rate.measure(3.5) == 500 / 1.0  # three windows on, the first sample is gone
    assert rate.measure(6.0) == 0.0


def test_throttled_replicas_name_partitions_of_this_broker_or_all():
    quota = ReplicationQuota(broker_id=5, samples=11, window_s=1)
    quota.mark_throttled("t", ["0:5", "1:4", "2:5"])
    assert [quota.is_throttled(TopicPartition("t", p)) for p in range(4)] == [True, False, True, False]
    quota.mark_throttled("u", ["*"])
    assert quota.is_throttled(TopicPartition("u", 7))
    quota.mark_throttled("t", [])
    assert not quota.is_throttled(TopicPartition("t", 0))
    assert quota.is_throttled(TopicPartition("u", 0))


def test_only_a_lagging_throttled_replica_over_the_bound_is_held_back():
    clock = Clock()
    quota = ReplicationQuota(broker_id=1, samples=11, window_s=1, clock=clock)
    quota.mark_throttled("moving", ["0:1"])
    quota.record(10_000)
    assert not quota.is_exceeded(), "the default bound (Long.MAX_VALUE) never throttles"
    quota.bound = 5_000
    assert quota.is_exceeded()
    assert quota.should_throttle(MOVING, in_sync=False)
    assert not quota.should_throttle(MOVING, in_sync=True)
    assert not quota.should_throttle(STEADY, in_sync=False)
    clock.now += 2.5  # 10 000 bytes over 2.5 s is under 5 000 B/s
    assert not quota.should_throttle(MOVING, in_sync=False)


def definition() -> ConfigDef:
    return ConfigDef.from_plugins(get_plugin_manager())


@pytest.mark.parametrize("value", ["*", "", "0:1", "0:1, 12:3"])
def test_valid_throttled_replica_lists(value):
    definition().parse_topic_configs({"leader.replication.throttled.replicas": value})


@pytest.mark.parametrize("value", ["0", "a:1", "0:1,*", "0:1:2"])
def test_invalid_throttled_replica_lists_are_refused_with_kafkas_message(value):
    with pytest.raises(ConfigError, match=r"must be the literal '\*' or a list of replicas in the following format"):
        definition().parse_topic_configs({"follower.replication.throttled.replicas": value})


def test_throttled_replicas_are_topic_configs_only_and_the_rates_are_dynamic_broker_configs():
    config = Config.build(definition(), {"leader.replication.throttled.replicas": "*"})
    assert "leader.replication.throttled.replicas" not in config.definition
    assert config.unknown == {"leader.replication.throttled.replicas": "*"}
    assert config.topic_config({})["follower.replication.throttled.replicas"] == []
    for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate"):
        assert config[name] == INT64_MAX and config.definition[name].dynamic


# Follower side ------------------------------------------------------------------------------------------


class FakeLog:
    def __init__(self) -> None:
        self.log_end_offset = 0
        self.log_start_offset = 0


class FakePartition:
    """What a replica fetcher uses of a partition: its offsets and the follower append."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.topic_id = f"id-{tp.topic}"
        self.log = FakeLog()
        self.leader_epoch = 0

    def latest_epoch(self) -> int:
        return 0

    def append_as_follower(self, records: bytes, high_watermark: int, log_start: int) -> int:
        self.log.log_end_offset += len(records)
        return len(records)


class FakeLeader:
    """A connection to the leader that records each Fetch and answers every partition with ``chunk`` bytes."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.fetched: list[list[str]] = []

    async def request(self, key: ApiKey, body: dict[str, Any]) -> Any:
        assert key == ApiKey.FETCH
        self.fetched.append(sorted(t["topic"] for t in body["topics"]))
        return SimpleNamespace(error_code=ErrorCode.none, session_id=0, responses=[SimpleNamespace(
            topic=t["topic"], topic_id=None, partitions=[SimpleNamespace(
                partition_index=0, error_code=ErrorCode.none, diverging_epoch=None, records=b"x" * self.chunk,
                high_watermark=10 * self.chunk, log_start_offset=0)]) for t in body["topics"]])


def test_a_follower_leaves_throttled_partitions_out_of_its_fetches_while_over_the_bound():
    clock = Clock()
    quota = ReplicationQuota(broker_id=5, samples=11, window_s=1, clock=clock)
    quota.bound = 1000
    quota.mark_throttled("moving", ["0:5"])
    fetchers = ReplicaFetchers(5, Config.build(definition(), {}), lambda _: None, lambda: 1, lambda _: None,
                               "PLAINTEXT", quota, BrokerTopicMetrics())
    leader = FakeLeader(chunk=1500)

    async def fetch() -> None:
        fetcher = ReplicaFetcher(fetchers, leader_id=2, index=0)
        for tp in (MOVING, STEADY):
            fetcher.add(FakePartition(tp))  # type: ignore[arg-type]
            fetcher.partitions[tp].truncating = False
        for _ in range(3):
            assert await fetcher._fetch(leader)  # type: ignore[arg-type]
        # 1500 throttled bytes in the first window exceed 1000 B/s: only the unthrottled partition goes on.
        assert leader.fetched == [["moving", "steady"], ["steady"], ["steady"]]
        clock.now += 1.6  # 1500 bytes over 1.6 s is under the bound again
        assert await fetcher._fetch(leader)  # type: ignore[arg-type]
        assert leader.fetched[-1] == ["moving", "steady"]
    anyio.run(fetch)


# Leader side -----------------------------------------------------------------------------------------------


def produce(client: RawClient, topic: str, size: int) -> None:
    batch = build_batch([(None, b"v" * size, 0)])
    answer = client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none


def alter_configs(client: RawClient, resource_type: int, name: str, configs: dict[str, str]) -> None:
    answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [{
        "resource_type": resource_type, "resource_name": name,
        "configs": [{"name": k, "config_operation": 0, "value": v} for k, v in configs.items()]}]})
    assert answer.responses[0].error_code == ErrorCode.none, answer.responses[0].error_message


def follower_fetch(client: RawClient, follower: int) -> dict[str, int]:
    """A Fetch as broker ``follower`` from offset 0 of both topics: the record bytes each answered."""
    answer = client.call(ApiKey.FETCH, 12, {
        "replica_id": follower, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": tp.topic, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20}]} for tp in (MOVING, STEADY)]})
    result = {}
    for topic in answer.responses:
        [part] = topic.partitions
        assert part.error_code == ErrorCode.none
        result[topic.topic] = len(part.records or b"")
    return result


def test_a_leader_serves_no_throttled_records_to_a_lagging_follower_over_the_bound(josef_broker):
    broker = josef_broker.broker
    for tp in (MOVING, STEADY):
        assert josef_broker.call(broker.channel.create_topic, tp.topic, 1, 1)[0] == ErrorCode.none
    client = RawClient(josef_broker.port)
    try:
        for tp in (MOVING, STEADY):
            produce(client, tp.topic, 20_000)
        alter_configs(client, BROKER_RESOURCE, str(broker.node_id), {"leader.replication.throttled.rate": "1000"})
        alter_configs(client, TOPIC_RESOURCE, MOVING.topic, {"leader.replication.throttled.replicas": f"0:{broker.node_id}"})
        quota = broker.replicas.leader_quota
        eventually(lambda: quota.bound == 1000 and quota.is_throttled(MOVING), what="the throttle configs applied")
        follower = broker.node_id + 1

        def add_follower(isr: tuple[int, ...]) -> None:
            """Make ``follower`` a replica (and maybe in sync) of both partitions, as a metadata change would."""
            for tp in (MOVING, STEADY):
                partition = broker.replicas.get(tp)
                state = broker.image.topics[tp.topic].partitions[0]
                partition.update_state(attrs.evolve(state, replicas=(broker.node_id, follower), isr=isr,
                                                    partition_epoch=partition.partition_epoch + 1))
        josef_broker.call(add_follower, (broker.node_id,))
        first = follower_fetch(client, follower)
        assert first["moving"] > 20_000 and first["steady"] > 20_000  # under the bound until these bytes count
        assert follower_fetch(client, follower) == {"moving": 0, "steady": first["steady"]}
        josef_broker.call(add_follower, (broker.node_id, follower))
        assert follower_fetch(client, follower) == first, "an in-sync follower is never throttled"
    finally:
        client.close()
