"""The group APIs over a real socket against the in-process broker (the josef_broker fixture), every version.

RawClient builds requests with the same builder the handlers use for
responses, so each version's fields are exercised as a client sends them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.metadata.records import uuid_from_text
from josef.protocol.consumer_protocol import Subscription, encode_assignment, encode_subscription
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient

E = ErrorCode
JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH, OFFSET_DELETE, LIST, DESCRIBE, DELETE, FIND = (
    11, 14, 12, 13, 8, 9, 47, 16, 15, 42, 10)
SUB = encode_subscription(Subscription(["orders"]))

pytestmark = pytest.mark.josef_config(**{"group.initial.rebalance.delay.ms": "0", "num.partitions": "2"})


def join_body(group: str = "g", member: str = "", instance: str | None = None, protocols=(("range", SUB),),
              session: int = 10_000, rebalance: int = 20_000) -> dict[str, Any]:
    return {"group_id": group, "session_timeout": session, "rebalance_timeout": rebalance, "member_id": member,
            "group_instance_id": instance, "protocol_type": "consumer",
            "protocols": [{"name": n, "metadata": m} for n, m in protocols], "reason": None}


def sync_body(group: str, generation: int, member: str, assignments: dict[str, bytes] | None = None,
              instance: str | None = None) -> dict[str, Any]:
    return {"group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": instance,
            "protocol_type": "consumer", "protocol_name": "range",
            "assignments": [{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()]}


def commit_body(group: str, generation: int, member: str, offsets: dict[tuple[str, int], int],
                metadata: str = "", ids: dict[str, uuid.UUID] | None = None) -> dict[str, Any]:
    """An OffsetCommit of any version; v10+ name topics by id, taken from ``ids`` (name -> id)."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                             "committed_leader_epoch": 0, "committed_metadata": metadata,
                                             "commit_timestamp": -1})
    return {"group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
            "group_instance_id": None, "retention_time": -1,
            "topics": [{"name": t, "topic_id": (ids or {}).get(t), "partitions": p} for t, p in topics.items()]}


def fetch_body(group: str, topics: dict[str, list[int]] | None,
               ids: dict[str, uuid.UUID] | None = None) -> dict[str, Any]:
    """An OffsetFetch of any version; v10+ name topics by id, taken from ``ids`` (name -> id)."""
    wanted = None if topics is None else [{"name": t, "topic_id": (ids or {}).get(t), "partition_indexes": p}
                                          for t, p in topics.items()]
    return {"group_id": group, "topics": wanted, "require_stable": True,
            "groups": [{"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}]}


def create_topic(client: RawClient, name: str = "orders", partitions: int = 2) -> None:
    answer = client.call(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                            "assignments": [], "configs": []}], "timeout": 5000,
                                 "validate_only": False})
    assert answer.topics[0].error_code in (E.none, E.topic_already_exists)


def topic_ids(josef_broker: Any) -> dict[str, uuid.UUID]:
    """Every topic's id, as the broker's metadata image has it (Kafka's base64 text there)."""
    return {name: uuid_from_text(topic.topic_id) for name, topic in josef_broker.broker.image.topics.items()}


def join_alone(client: RawClient, group: str = "g", **kwargs: Any) -> Any:
    """A v9 join of a lone member: MEMBER_ID_REQUIRED, then the real join, answered after the initial delay."""
    first = client.call(JOIN, 9, join_body(group, **kwargs))
    assert first.error_code == E.member_id_required
    answer = client.call(JOIN, 9, join_body(group, first.member_id, **kwargs))
    assert answer.error_code == E.none, answer
    return answer


def stable_member(client: RawClient, group: str = "g", **kwargs: Any) -> tuple[str, int]:
    joined = join_alone(client, group, **kwargs)
    assignment = encode_assignment([TopicPartition("orders", 0), TopicPartition("orders", 1)])
    synced = client.call(SYNC, 5, sync_body(group, joined.generation_id, joined.member_id,
                                            {joined.member_id: assignment}))
    assert (synced.error_code, synced.assignment, synced.protocol_name) == (E.none, assignment, "range")
    return joined.member_id, joined.generation_id


def wait_for_state(client: RawClient, group: str, state: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.call(DESCRIBE, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
        if found.group_state == state:
            return
        assert time.monotonic() < deadline, f"group {group} is {found.group_state}, not {state}"
        time.sleep(0.02)


def test_find_coordinator_for_groups(josef_broker):
    client = RawClient(josef_broker.port)
    answer = client.call(FIND, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]})
    assert [(c.key, c.node_id, c.port, c.error_code) for c in answer.coordinators] == [
        ("a", 1, josef_broker.port, E.none), ("b", 1, josef_broker.port, E.none)]
    topic = josef_broker.broker.image.topics["__consumer_offsets"]
    assert len(topic.partitions) == 50
    assert josef_broker.broker.image.config(2, "__consumer_offsets")["cleanup.policy"] == "compact"


@pytest.mark.josef_config(**{"offsets.topic.replication.factor": "3"})
def test_offsets_are_never_kept_on_fewer_replicas_than_configured(josef_broker):
    client = RawClient(josef_broker.port)
    answer = client.call(FIND, 4, {"key_type": 0, "coordinator_keys": ["a"]})
    [found] = answer.coordinators
    assert found.error_code == E.coordinator_not_available
    assert "replication factor 3" in found.error_message
    assert "__consumer_offsets" not in josef_broker.broker.image.topics


def test_every_group_api_at_every_version(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    member, generation = stable_member(client, "sweep")
    dispatcher = josef_broker.broker.dispatcher
    ranges = {key: (dispatcher.apis[key].min_version, dispatcher.apis[key].max_version)
              for key in (JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH, OFFSET_DELETE, LIST, DESCRIBE, DELETE)}
    assert ranges == {JOIN: (0, 9), SYNC: (0, 5), HEARTBEAT: (0, 4), LEAVE: (0, 5), COMMIT: (2, 10),
                      FETCH: (1, 10), OFFSET_DELETE: (0, 0), LIST: (0, 5), DESCRIBE: (0, 6), DELETE: (0, 2)}
    ids = topic_ids(josef_broker)
    for version in range(0, 10):
        body = join_body(f"join-v{version}")
        answer = client.call(JOIN, version, body)
        if version >= 4:
            assert answer.error_code == E.member_id_required
            answer = client.call(JOIN, version, join_body(f"join-v{version}", answer.member_id))
        assert (answer.error_code, answer.generation_id, answer.leader) == (E.none, 1, answer.member_id), version
        assert answer.protocol_name == "range"
        if version >= 5:
            assert answer.members[0].group_instance_id is None
        synced = client.call(SYNC, min(version, 5), sync_body(f"join-v{version}", 1, answer.member_id,
                                                             {answer.member_id: b"x"}))
        assert synced.error_code == E.none and synced.assignment == b"x"
    for version in range(0, 5):
        answer = client.call(HEARTBEAT, version, {"group_id": "sweep", "generation_id": generation,
                                                  "member_id": member, "group_instance_id": None})
        assert answer.error_code == E.none
    for version in range(2, 11):
        answer = client.call(COMMIT, version, commit_body("sweep", generation, member, {("orders", 0): version},
                                                          ids=ids))
        assert answer.topics[0].partitions[0].error_code == E.none, version
    for version in range(1, 11):
        answer = client.call(FETCH, version, fetch_body("sweep", {"orders": [0, 1]}, ids))
        topic = answer.groups[0].topics[0] if version >= 8 else answer.topics[0]
        assert (topic.topic_id if version >= 10 else topic.name) == (ids["orders"] if version >= 10 else "orders")
        assert [(p.partition_index, p.committed_offset, p.error_code) for p in topic.partitions] == [
            (0, 10, E.none), (1, -1, E.none)], version
    for version in range(0, 6):
        answer = client.call(LIST, version, {"states_filter": [], "types_filter": []})
        assert answer.error_code == E.none and "sweep" in {g.group_id for g in answer.groups}
    for version in range(0, 7):
        answer = client.call(DESCRIBE, version, {"groups": ["sweep"], "include_authorized_operations": True})
        described = answer.groups[0]
        assert (described.error_code, described.group_state, described.protocol_data) == (E.none, "Stable", "range")
        assert described.members[0].member_metadata == SUB
        if version >= 6:
            assert described.error_message is None
    answer = client.call(OFFSET_DELETE, 0, {"group_id": "sweep", "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0}]}]})
    assert answer.error_code == E.none
    assert answer.topics[0].partitions[0].error_code == E.group_subscribed_to_topic  # members still read it
    for version in range(0, 6):
        group = f"join-v{min(version, 9)}"
        answer = client.call(LEAVE, version, {"group_id": group, "member_id": "nobody",
                                              "members": [{"member_id": "nobody", "group_instance_id": None,
                                                           "reason": None}]})
        code = answer.error_code if version < 3 else answer.members[0].error_code
        assert code == E.unknown_member_id
    for version in range(0, 3):
        answer = client.call(DELETE, version, {"groups_names": ["sweep", "nothing-here"]})
        assert [(r.group_id, r.error_code) for r in answer.results] == [
            ("sweep", E.non_empty_group), ("nothing-here", E.group_id_not_found)]


def test_a_group_over_the_wire_from_join_to_delete(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    member, generation = stable_member(client)
    commit = client.call(COMMIT, 9, commit_body("g", generation, member, {("orders", 0): 10, ("orders", 1): 20},
                                                metadata="hello"))
    assert {p.error_code for p in commit.topics[0].partitions} == {E.none}
    fetched = client.call(FETCH, 9, {"groups": [{"group_id": "g", "member_id": None, "member_epoch": -1,
                                                 "topics": None},
                                                {"group_id": "other", "member_id": None, "member_epoch": -1,
                                                 "topics": None}], "require_stable": False})
    everything = fetched.groups[0].topics[0]
    assert everything.name == "orders"
    assert [(p.partition_index, p.committed_offset, p.metadata, p.committed_leader_epoch)
            for p in everything.partitions] == [(0, 10, "hello", 0), (1, 20, "hello", 0)]
    assert (fetched.groups[1].group_id, fetched.groups[1].topics, fetched.groups[1].error_code) == (
        "other", (), E.none)

    listed = client.call(LIST, 5, {"states_filter": ["stable"], "types_filter": []})
    assert [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed.groups] == [
        ("g", "consumer", "Stable", "classic")]
    assert client.call(LIST, 5, {"states_filter": ["Empty"], "types_filter": []}).groups == ()
    assert client.call(LIST, 5, {"states_filter": [], "types_filter": ["consumer"]}).groups == ()

    described = client.call(DESCRIBE, 5, {"groups": ["g"], "include_authorized_operations": True}).groups[0]
    assert (described.group_state, described.protocol_type, described.protocol_data) == ("Stable", "consumer", "range")
    [m] = described.members
    assert (m.member_id, m.client_id, m.client_host, m.member_metadata) == (member, "raw", "/127.0.0.1", SUB)
    assert m.member_assignment == encode_assignment([TopicPartition("orders", 0), TopicPartition("orders", 1)])
    # Every operation a group has (Kafka 4.x: READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS), with allow-all.
    assert described.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)

    left = client.call(LEAVE, 5, {"group_id": "g", "members": [{"member_id": member, "group_instance_id": None,
                                                                 "reason": "done"}]})
    assert (left.error_code, [(x.member_id, x.error_code) for x in left.members]) == (E.none, [(member, E.none)])
    described = client.call(DESCRIBE, 5, {"groups": ["g"], "include_authorized_operations": False}).groups[0]
    assert (described.group_state, described.members, described.authorized_operations) == ("Empty", (), -(2**31))

    deleted = client.call(OFFSET_DELETE, 0, {"group_id": "g", "topics": [
        {"name": "orders", "partitions": [{"partition_index": 1}, {"partition_index": 7}]}]})
    assert [p.error_code for p in deleted.topics[0].partitions] == [E.none, E.unknown_topic_or_partition]
    remaining = client.call(FETCH, 7, fetch_body("g", None)).topics
    assert [(p.partition_index, p.committed_offset) for t in remaining for p in t.partitions] == [(0, 10)]

    assert client.call(DELETE, 2, {"groups_names": ["g"]}).results[0].error_code == E.none
    described = client.call(DESCRIBE, 5, {"groups": ["g"], "include_authorized_operations": False}).groups[0]
    assert (described.error_code, described.group_state) == (E.none, "Dead")
    assert client.call(FETCH, 7, fetch_body("g", None)).topics == ()
    assert client.call(OFFSET_DELETE, 0, {"group_id": "g", "topics": []}).error_code == E.group_id_not_found


def test_a_second_member_rebalances_the_group_over_two_connections(josef_broker):
    a, b = RawClient(josef_broker.port), RawClient(josef_broker.port)
    create_topic(a)
    member_a, generation = stable_member(a)
    first = b.call(JOIN, 9, join_body())
    b.send(JOIN, 9, join_body("g", first.member_id))  # parked until a rejoins
    wait_for_state(a, "g", "PreparingRebalance")
    heartbeat = a.call(HEARTBEAT, 4, {"group_id": "g", "generation_id": generation, "member_id": member_a,
                                      "group_instance_id": None})
    assert heartbeat.error_code == E.rebalance_in_progress
    rejoined_a = a.call(JOIN, 9, join_body("g", member_a))
    joined_b = b.receive()
    assert rejoined_a.generation_id == joined_b.generation_id == generation + 1
    assert rejoined_a.leader == member_a and len(rejoined_a.members) == 2 and joined_b.members == ()

    b.send(SYNC, 5, sync_body("g", joined_b.generation_id, first.member_id))  # waits for the leader
    synced_a = a.call(SYNC, 5, sync_body("g", rejoined_a.generation_id, member_a,
                                         {member_a: b"for-a", first.member_id: b"for-b"}))
    assert synced_a.assignment == b"for-a" and b.receive().assignment == b"for-b"

    # A commit from the previous generation is refused: a must rejoin first.
    stale = a.call(COMMIT, 9, commit_body("g", generation, member_a, {("orders", 0): 1}))
    assert stale.topics[0].partitions[0].error_code == E.illegal_generation


def test_rebalance_timeout_removes_members_that_do_not_rejoin(josef_broker):
    a, b = RawClient(josef_broker.port), RawClient(josef_broker.port)
    create_topic(a)
    # The longest rebalance timeout of the members bounds the join phase; sessions last far longer.
    member_a, generation = stable_member(a, rebalance=300, session=60_000)
    first = b.call(JOIN, 9, join_body(rebalance=300, session=60_000))
    started = time.monotonic()
    joined = b.call(JOIN, 9, join_body("g", first.member_id, rebalance=300, session=60_000))  # a never rejoins
    assert time.monotonic() - started < 10
    assert (joined.error_code, joined.leader, [m.member_id for m in joined.members]) == (
        E.none, first.member_id, [first.member_id])
    answer = a.call(HEARTBEAT, 4, {"group_id": "g", "generation_id": generation, "member_id": member_a,
                                   "group_instance_id": None})
    assert answer.error_code == E.unknown_member_id


@pytest.mark.josef_config(**{"group.min.session.timeout.ms": "100"})
def test_session_expiry_over_the_wire(josef_broker):
    a = RawClient(josef_broker.port)
    create_topic(a)
    joined = join_alone(a, session=300)
    a.call(SYNC, 5, sync_body("g", joined.generation_id, joined.member_id, {joined.member_id: b""}))
    wait_for_state(a, "g", "Empty")
    answer = a.call(HEARTBEAT, 4, {"group_id": "g", "generation_id": joined.generation_id,
                                   "member_id": joined.member_id, "group_instance_id": None})
    assert answer.error_code == E.unknown_member_id


def test_static_member_restart_keeps_its_assignment(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    first = client.call(JOIN, 9, join_body(instance="box-1"))
    assert first.error_code == E.none  # no MEMBER_ID_REQUIRED round for static members
    client.call(SYNC, 5, sync_body("g", 1, first.member_id, {first.member_id: b"mine"}, instance="box-1"))
    again = client.call(JOIN, 9, join_body(instance="box-1"))
    assert (again.error_code, again.generation_id, again.skip_assignment) == (E.none, 1, True)
    assert again.member_id != first.member_id
    synced = client.call(SYNC, 5, sync_body("g", 1, again.member_id, instance="box-1"))
    assert synced.assignment == b"mine"
    fenced = client.call(HEARTBEAT, 4, {"group_id": "g", "generation_id": 1, "member_id": first.member_id,
                                        "group_instance_id": "box-1"})
    assert fenced.error_code == E.fenced_instance_id
    # An admin removes the static member by its instance id alone.
    left = client.call(LEAVE, 5, {"group_id": "g", "members": [{"member_id": "", "group_instance_id": "box-1",
                                                                "reason": None}]})
    assert left.members[0].error_code == E.none
    assert client.call(DESCRIBE, 5, {"groups": ["g"], "include_authorized_operations": False}).groups[0]\
        .group_state == "Empty"


def test_simple_commits_need_no_membership_and_survive_a_restart(josef_broker):
    client = RawClient(josef_broker.port)
    create_topic(client)
    member, generation = stable_member(client, "members")
    client.call(COMMIT, 9, commit_body("members", generation, member, {("orders", 1): 77}))
    answer = client.call(COMMIT, 9, commit_body("simple", -1, "", {("orders", 0): 5, ("ghost", 0): 1}))
    assert {(t.name, t.partitions[0].error_code) for t in answer.topics} == {
        ("orders", E.none), ("ghost", E.unknown_topic_or_partition)}
    assert client.call(COMMIT, 9, commit_body("members", -1, "", {("orders", 0): 1})).topics[0].partitions[0]\
        .error_code == E.unknown_member_id

    josef_broker.restart()
    client = RawClient(josef_broker.port)
    simple = client.call(FETCH, 9, fetch_body("simple", {"orders": [0]})).groups[0].topics[0].partitions[0]
    assert simple.committed_offset == 5
    kept = client.call(FETCH, 9, fetch_body("members", {"orders": [1]})).groups[0].topics[0].partitions[0]
    assert kept.committed_offset == 77
    described = client.call(DESCRIBE, 5, {"groups": ["members", "simple"],
                                          "include_authorized_operations": False}).groups
    assert [(d.group_state, d.protocol_type, len(d.members)) for d in described] == [
        ("Stable", "consumer", 1), ("Empty", "", 0)]
    # The member carries on in its generation after the restart.
    answer = client.call(HEARTBEAT, 4, {"group_id": "members", "generation_id": generation, "member_id": member,
                                        "group_instance_id": None})
    assert answer.error_code == E.none
    listed = client.call(LIST, 4, {"states_filter": []}).groups
    assert {(g.group_id, g.group_state) for g in listed} == {("members", "Stable"), ("simple", "Empty")}


@pytest.mark.josef_config(**{"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "50"})
def test_offsets_of_an_empty_group_expire_by_the_retention_timer(josef_broker, monkeypatch):
    client = RawClient(josef_broker.port)
    create_topic(client)
    client.call(COMMIT, 9, commit_body("old", -1, "", {("orders", 0): 5}))
    real = clock.now_ms
    monkeypatch.setattr(clock, "now_ms", lambda: real() + 61_000)  # a minute and a bit later
    deadline = time.monotonic() + 20
    while client.call(LIST, 4, {"states_filter": []}).groups:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert client.call(FETCH, 9, fetch_body("old", {"orders": [0]})).groups[0].topics[0].partitions[0]\
        .committed_offset == -1
    monkeypatch.setattr(clock, "now_ms", real)
    josef_broker.restart()  # the tombstones were written: nothing comes back
    client = RawClient(josef_broker.port)
    assert client.call(LIST, 4, {"states_filter": []}).groups == ()
    assert client.call(FETCH, 9, fetch_body("old", None)).groups[0].topics == ()


def test_invalid_requests(josef_broker):
    client = RawClient(josef_broker.port)
    assert client.call(JOIN, 9, join_body("")).error_code == E.invalid_group_id
    assert client.call(JOIN, 9, join_body("g", session=10)).error_code == E.invalid_session_timeout
    assert client.call(HEARTBEAT, 4, {"group_id": "", "generation_id": 1, "member_id": "m",
                                      "group_instance_id": None}).error_code == E.invalid_group_id
    assert client.call(SYNC, 5, sync_body("nope", 1, "m")).error_code == E.unknown_member_id
    answer = client.call(COMMIT, 8, commit_body("", -1, "", {("orders", 0): 1}))
    assert answer.topics[0].partitions[0].error_code == E.invalid_group_id
