"""The coordinator runtime's guarantees for offsets, on real brokers: one controller and two brokers as processes.

``__consumer_offsets`` has one partition on both brokers (``min.insync.replicas``
2); replication is held back by pausing the follower (SIGSTOP), as a slow or
partitioned replica would. Shown, one after another on the same cluster:

- commits arriving together go out as one append (one record batch);
- a commit pending when leadership moves is answered NOT_COORDINATOR;
- a commit that times out is not seen by OffsetFetch while uncommitted, and is
  seen as soon as it commits, with no reload of the coordinator;
- with the follower out of the ISR, a commit's append fails (NOT_ENOUGH_REPLICAS):
  it leaves no trace, not even in the state writes see, while a commit appended
  earlier still commits once the follower is back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kio.schema.errors import ErrorCode
from test_group_apis import COMMIT, DELETE, FETCH, FIND, LIST, commit_body

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import iter_batches, iter_records
from josef.testing import RawClient, eventually
from josef_coordinator_group.records import OffsetKey, decode_key

E = ErrorCode
OFFSETS = "__consumer_offsets"
COMMIT_TIMEOUT_MS = 3000
SETTINGS = {
    "offsets.topic.num.partitions": "1",
    "offsets.topic.replication.factor": "2",
    "min.insync.replicas": "2",
    "offsets.commit.timeout.ms": str(COMMIT_TIMEOUT_MS),
    # Long enough for a commit to time out before the paused follower leaves the ISR.
    "replica.lag.time.max.ms": "6000",
    # Commits that arrive within this window share one append: the batching step is then deterministic.
    "group.coordinator.append.linger.ms": "300",
    "controller.quorum.election.timeout.ms": "500",
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "15000",
    "replica.fetch.backoff.ms": "200",
    "auto.leader.rebalance.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
}


def raw(node) -> RawClient:
    return RawClient(node.listener("PLAINTEXT")[1], timeout=60)


def commit(client: RawClient, group: str, offset: int, *, generation: int = -1, member: str = "") -> ErrorCode:
    answer = client.call(COMMIT, 9, commit_body(group, generation, member, {("orders", 0): offset}))
    return answer.topics[0].partitions[0].error_code


def fetched(client: RawClient, group: str) -> int:
    """The committed offset OffsetFetch (a read: no ``require_stable``) answers for ``group``'s orders-0."""
    answer = client.call(FETCH, 8, {"groups": [{"group_id": group, "topics": [
        {"name": "orders", "partition_indexes": [0]}]}], "require_stable": False})
    [group_answer] = answer.groups
    assert group_answer.error_code == E.none, group_answer
    return group_answer.topics[0].partitions[0].committed_offset


def listed(client: RawClient) -> set[str]:
    return {g.group_id for g in client.call(LIST, 5, {"states_filter": [], "types_filter": []}).groups}


def offsets_partition(client: RawClient) -> Any:
    answer = client.call(ApiKey.METADATA, 12, {"topics": [{"name": OFFSETS, "topic_id": None}],
                                               "allow_auto_topic_creation": False,
                                               "include_topic_authorized_operations": False})
    [topic] = answer.topics
    [partition] = topic.partitions
    return partition


def offset_batches(node) -> list[list[OffsetKey]]:
    """The offset commits in each record batch of ``__consumer_offsets``-0, read from ``node`` (its leader)."""
    body = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 8 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": OFFSETS, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 8 << 20}]}]}
    client = raw(node)
    try:
        [topic] = client.call(ApiKey.FETCH, 12, body).responses
        [answer] = topic.partitions
        assert answer.error_code == E.none, answer
    finally:
        client.close()
    data = bytes(answer.records or b"")
    batches = []
    for pos, header in iter_batches(data):
        if header.is_control:
            continue
        keys = [decode_key(r.key) for r in iter_records(memoryview(data)[pos:pos + header.size])]
        batches.append([k for k in keys if isinstance(k, OffsetKey)])
    return batches


def in_parallel(calls: list) -> list:
    """Run blocking calls at once, each on its own thread; their results in order (a call's error is raised)."""
    results: list = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def loads(node) -> int:
    """How many times ``node`` loaded the offsets partition's shard."""
    return node.log.count(f"loaded {OFFSETS}-0")


def test_offsets_on_the_coordinator_runtime(josef_cluster):
    cluster = josef_cluster(controllers=1, brokers=2, **SETTINGS)
    admin = raw(cluster.node(2))
    created = admin.call(19, 7, {"topics": [{"name": "orders", "num_partitions": 1, "replication_factor": 2,
                                             "assignments": [], "configs": []}], "timeout": 5000,
                                 "validate_only": False})
    assert created.topics[0].error_code == E.none
    found = eventually(lambda: (a := admin.call(FIND, 4, {"key_type": 0, "coordinator_keys": ["g"]}).coordinators[0])
                       .error_code == E.none and a, what="a coordinator for groups")
    coordinator, follower = cluster.node(found.node_id), cluster.node(5 - found.node_id)
    admin.close()
    admin = raw(coordinator)  # never the follower, which is paused at times
    eventually(lambda: len(offsets_partition(admin).isr_nodes) == 2, what="both brokers in the offsets ISR")
    client = raw(coordinator)

    # Commits that arrive together go out as one append.
    groups = [f"batch-{i}" for i in range(8)]
    connections = [raw(coordinator) for _ in groups]
    assert in_parallel([lambda c=c, g=g: commit(c, g, 5) for c, g in zip(connections, groups)]) == [E.none] * 8
    for connection in connections:
        connection.close()
    batch_of = {key.group: index for index, keys in enumerate(offset_batches(coordinator)) for key in keys}
    assert len({batch_of[g] for g in groups}) == 1, batch_of
    assert [fetched(client, g) for g in groups] == [5] * 8

    # Leadership moves while a commit waits for the (paused) follower: the commit is answered NOT_COORDINATOR.
    follower.pause()
    try:
        waiting = in_parallel([
            lambda: commit(client, "moving", 1),
            lambda: (time.sleep(0.5), move_leadership(admin, to=follower.node_id, stays=coordinator.node_id))[1]])
    finally:
        follower.resume()
    assert waiting == [E.not_coordinator, None]
    coordinator, follower = follower, coordinator
    client.close()
    admin.close()
    client, admin = raw(coordinator), raw(coordinator)
    eventually(lambda: offsets_partition(admin).leader_id == coordinator.node_id
               and len(offsets_partition(admin).isr_nodes) == 2, what="the new coordinator leading a full ISR")
    eventually(lambda: fetched(client, "batch-0") == 5, what="the new coordinator loaded")
    # The NOT_COORDINATOR answer does not say the commit is lost: the new leader may have fetched its record (a
    # fetch answered just before the pause). Either way the new coordinator's state is its log's.
    in_log = "moving" in {key.group for keys in offset_batches(coordinator) for key in keys}
    assert fetched(client, "moving") == (1 if in_log else -1)
    loaded = loads(coordinator)

    # A commit that times out is invisible until it commits, then visible with no reload.
    follower.pause()
    try:
        started = time.monotonic()
        assert commit(client, "late", 42) == E.coordinator_not_available
        assert time.monotonic() - started >= COMMIT_TIMEOUT_MS / 1000 * 0.9
        assert fetched(client, "late") == -1
        assert "late" not in listed(client)
    finally:
        follower.resume()
    eventually(lambda: fetched(client, "late") == 42, what="the timed-out commit, once committed")
    assert "late" in listed(client)
    assert loads(coordinator) == loaded

    # The follower leaves the ISR with a commit appended but not committed; the next commit's append is refused.
    follower.pause()
    try:
        assert commit(client, "early", 7) == E.coordinator_not_available
        eventually(lambda: offsets_partition(admin).isr_nodes == (coordinator.node_id,),
                   what="the paused follower out of the offsets ISR")
        started = time.monotonic()
        assert commit(client, "doomed", 9) == E.coordinator_not_available
        assert time.monotonic() - started < COMMIT_TIMEOUT_MS / 1000  # refused, not timed out
        # No trace of it in what writes see: its simple group was never created.
        assert commit(client, "doomed", 9, generation=1, member="m") == E.group_id_not_found
        assert client.call(DELETE, 2, {"groups_names": ["doomed"]}).results[0].error_code == E.group_id_not_found
        assert fetched(client, "doomed") == -1
    finally:
        follower.resume()
    eventually(lambda: fetched(client, "early") == 7, what="the commit appended before the failure, committed")
    assert fetched(client, "doomed") == -1 and "doomed" not in listed(client)
    written = {key.group for keys in offset_batches(coordinator) for key in keys}
    assert "early" in written and "doomed" not in written
    assert loads(coordinator) == loaded
    client.close()
    admin.close()


def move_leadership(admin: RawClient, *, to: int, stays: int) -> None:
    """Make broker ``to`` the preferred leader of the offsets partition, and elect it."""
    moved = admin.call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, {"timeout": 5000, "topics": [
        {"name": OFFSETS, "partitions": [{"partition_index": 0, "replicas": [to, stays]}]}]})
    assert moved.error_code == E.none and moved.responses[0].partitions[0].error_code == E.none, moved
    elected = admin.call(ApiKey.ELECT_LEADERS, 2, {"election_type": 0, "timeout": 5000,
                                                   "topic_partitions": [{"topic": OFFSETS, "partitions": [0]}]})
    [result] = elected.replica_election_results[0].partition_result
    assert result.error_code == E.none, elected
