"""Share groups' metrics (josef_coordinator_share.metrics) on a broker, after ShareFetch and ShareAcknowledge over a
socket: acknowledgements by type, lock timeouts, in-flight records, sessions, requests per topic, state writes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually
from test_share_fetch_api import Member, acquired, partition, produce

E = ErrorCode
pytestmark = pytest.mark.josef_config(**{"group.share.record.lock.duration.ms": "1000",
                                         "group.share.min.record.lock.duration.ms": "1000",
                                         "share.coordinator.state.topic.num.partitions": "1",
                                         "share.coordinator.state.topic.prune.interval.ms": "200"})
ACCEPT, RELEASE, REJECT = 1, 2, 3


@pytest.fixture
def jobs(josef_broker):
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "jobs", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    yield client, created.topics[0].topic_id
    client.close()


def node_samples(josef_broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the node exports (its /metrics), read on its event loop; no family is there twice."""
    families = josef_broker.call(lambda: josef_broker.broker.metrics.families())
    names = [f.name for f in families]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def value(samples: dict, name: str, **labels: str) -> Any:
    return samples.get((name, tuple(sorted(labels.items()))))


SHARE_PARTITION = {"group": "queue", "topic": "jobs", "partition": "0"}
BTM = "kafka_server_brokertopicmetrics"


def test_share_metrics_follow_fetches_acknowledgements_and_lock_expiry(josef_broker, jobs):
    client, topic_id = jobs
    a, b = Member(josef_broker.port, topic_id, "a"), Member(josef_broker.port, topic_id, "b")
    try:
        assert acquired(a.fetch()) == []  # loads the share partition (at the end: share.auto.offset.reset latest)
        produce(client, [b"r%d" % i for i in range(10)])
        assert acquired(a.fetch(max_wait_ms=5000)) == [(0, 9, 1)]
        acked = a.acknowledge([(0, 9, [ACCEPT] * 4 + [RELEASE] * 3 + [REJECT] * 3)])
        assert partition(acked).error_code == E.none
        assert partition(a.acknowledge([(0, 0, [ACCEPT])])).error_code == E.invalid_record_state  # done already
        assert acquired(b.fetch()) == [(4, 6, 2)]  # the released ones, to b, whose lock then expires

        samples = node_samples(josef_broker)
        acks = {labels[0][1]: v for (name, labels), v in samples.items()
                if name == "kafka_server_sharegroupmetrics_recordacknowledgements_total"}
        assert acks == {"Accept": 4, "Release": 3, "Reject": 3, "Renew": 0}
        assert value(samples, "kafka_server_sharegroupmetrics_partitionloadtimems_count") == 1
        assert value(samples, "kafka_server_sharesessioncache_sharesessionscount") == 2
        assert value(samples, "kafka_server_sharesessioncache_sharepartitionscount") == 2
        assert value(samples, "kafka_server_sharesessioncache_sharesessionevictions_total") == 0
        for labels in ({"topic": "jobs"}, {}):  # the topic's series and the all-topics one
            assert value(samples, f"{BTM}_totalsharefetchrequests_total", **labels) == 3
            assert value(samples, f"{BTM}_failedsharefetchrequests_total", **labels) == 0
            assert value(samples, f"{BTM}_totalshareacknowledgementrequests_total", **labels) == 2
            assert value(samples, f"{BTM}_failedshareacknowledgementrequests_total", **labels) == 1
        # Writes: the new share partition's start, a's acquisition, a's acknowledgements, b's acquisition.
        assert value(samples, "kafka_server_share_coordinator_metrics_write_total") == 4
        latency = value(samples, "kafka_server_share_coordinator_metrics_write_latency_max")
        assert not math.isnan(latency) and latency >= value(
            samples, "kafka_server_share_coordinator_metrics_write_latency_avg") > 0

        def expired() -> dict | None:
            now = node_samples(josef_broker)
            timeouts = value(now, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", **SHARE_PARTITION)
            return now if timeouts else None

        samples = eventually(expired, 10, what="b's lock to expire")
        assert value(samples, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total",
                     **SHARE_PARTITION) == 3
        # 0-3 accepted are behind the start; 4-6 available again and 7-9 rejected are in flight, two ranges.
        assert value(samples, "kafka_server_sharepartitionmetrics_inflightmessagecount", **SHARE_PARTITION) == 6
        assert value(samples, "kafka_server_sharepartitionmetrics_inflightbatchcount", **SHARE_PARTITION) == 2
        assert value(samples, "kafka_server_share_coordinator_metrics_write_total") == 5  # the expiry's
        # Pruned every 200 ms below the oldest snapshot a load needs: the share partition's first, at offset 0.
        eventually(lambda: value(node_samples(josef_broker), "kafka_server_share_coordinator_metrics_last_pruned_offset",
                                 topic="__share_group_state", partition="0") == 0, 10,
                   what="the state partition to be pruned")
    finally:
        a.close()
        b.close()
