"""The classic group state machine, driven request by request and timer by timer (no broker, no sleeping)."""

from __future__ import annotations

import attrs
import pytest
from group_harness import SUB, Harness, done
from kio.schema.errors import ErrorCode

from josef.protocol.consumer_protocol import Subscription, encode_subscription
from josef_coordinator_group.group import GroupState
from josef_coordinator_group.records import GroupKey, encode_group, encode_key

pytestmark = pytest.mark.anyio

E = ErrorCode
S = GroupState


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def h(monkeypatch):
    return Harness(monkeypatch)


async def stable_group(h: Harness, count: int, group_id: str = "g", **join_kwargs):
    """``count`` members joined and synced: returns their member ids, leader first, and the generation."""
    waiters = [await h.join_new(group_id, **join_kwargs) for _ in range(count)]
    await h.settle(group_id)
    results = [await done(w) for w in waiters]
    assert {r.error for r in results} == {E.none}, results
    generation = results[0].generation_id
    leader = results[0].leader
    followers = [r.member_id for r in results if r.member_id != leader]
    syncs = [await h.sync(m, generation, group_id) for m in followers]
    await h.sync(leader, generation, group_id, assignments={r.member_id: r.member_id.encode() for r in results})
    for s in syncs:
        assert (await done(s)).error == E.none
    assert h.group(group_id).state is S.STABLE
    return [leader] + followers, generation


async def test_first_join_asks_for_a_member_id_then_waits_for_the_initial_delay(monkeypatch):
    h = Harness(monkeypatch, initial_rebalance_delay_ms=3000)
    first = await done(await h.join(client_id="app"))
    assert first.error == E.member_id_required and first.member_id.startswith("app-")
    assert h.group().pending_members == {first.member_id}
    assert ("heartbeat", "g", first.member_id) in h.timer_keys()  # a pending id expires with the session

    parked = await h.join(first.member_id)
    assert not parked.done
    group = h.group()
    assert group.state is S.PREPARING_REBALANCE and group.pending_members == set()
    assert h.context.timers[("join", "g")][0] == 3.0

    await h.fire(("join", "g"))
    result = await done(parked)
    assert (result.error, result.generation_id, result.protocol_type, result.protocol_name, result.leader) == (
        E.none, 1, "consumer", "range", first.member_id)
    assert [(m.member_id, m.metadata) for m in result.members] == [(first.member_id, SUB)]
    assert group.state is S.COMPLETING_REBALANCE
    assert ("sync", "g") in h.timer_keys()  # members must sync within the rebalance timeout


async def test_old_versions_join_without_a_member_id_round_trip(h):
    waiter = await h.join(version=3)
    assert not waiter.done and h.group().state is S.PREPARING_REBALANCE
    await h.settle()
    result = await done(waiter)
    assert result.error == E.none and result.member_id.startswith("client-") and result.generation_id == 1


async def test_initial_delay_is_extended_while_members_keep_arriving(monkeypatch):
    h = Harness(monkeypatch, initial_rebalance_delay_ms=3000)
    a = await h.join_new(rebalance_ms=10_000)
    b = await h.join_new(rebalance_ms=10_000)
    await h.fire(("join", "g"))  # b arrived during the delay: wait once more
    assert not a.done and ("join", "g") in h.timer_keys()
    await h.fire(("join", "g"))
    assert {(await done(a)).generation_id, (await done(b)).generation_id} == {1}
    assert len(h.group().members) == 2


async def test_leader_assignment_reaches_every_member_and_is_persisted(h):
    a = await h.join_new()
    b = await h.join_new()
    await h.settle()
    ra, rb = await done(a), await done(b)
    assert ra.leader == rb.leader == ra.member_id
    assert len(ra.members) == 2 and rb.members == ()  # only the leader learns the members

    follower_sync = await h.sync(rb.member_id, 1)
    assert not follower_sync.done  # waits for the leader's assignment
    leader_sync = await h.sync(ra.member_id, 1, assignments={ra.member_id: b"A", rb.member_id: b"B"})
    assert (await done(leader_sync)).assignment == b"A"
    answer = await done(follower_sync)
    assert (answer.error, answer.protocol_type, answer.protocol_name, answer.assignment) == (
        E.none, "consumer", "range", b"B")
    assert h.group().state is S.STABLE
    [record] = h.group_records()
    assert record.generation == 1 and record.leader == ra.member_id and record.protocol == "range"
    assert {(m.member_id, m.assignment, m.subscription) for m in record.members} == {
        (ra.member_id, b"A", SUB), (rb.member_id, b"B", SUB)}
    # A late SyncGroup in Stable gets the stored assignment.
    assert (await done(await h.sync(rb.member_id, 1))).assignment == b"B"


async def test_heartbeat_errors(h):
    (leader, follower), generation = await stable_group(h, 2)
    assert await h.heartbeat(follower, generation) == E.none
    assert await h.heartbeat(follower, generation + 1) == E.illegal_generation
    assert await h.heartbeat("stranger", generation) == E.unknown_member_id
    assert await h.heartbeat(follower, generation, group_id="nope") == E.unknown_member_id
    await h.join_new()  # a third member: rebalance
    assert h.group().state is S.PREPARING_REBALANCE
    assert await h.heartbeat(follower, generation) == E.rebalance_in_progress


async def test_new_member_triggers_a_rebalance_that_completes_when_all_rejoin(h):
    (leader, follower), generation = await stable_group(h, 2)
    newcomer = await h.join_new()
    assert await h.heartbeat(leader, generation) == E.rebalance_in_progress
    rejoin_leader = await h.join(leader)
    assert not rejoin_leader.done
    rejoin_follower = await h.join(follower)  # the last one in completes the join phase at once
    results = [await done(w) for w in (newcomer, rejoin_leader, rejoin_follower)]
    assert {r.generation_id for r in results} == {generation + 1}
    assert {r.leader for r in results} == {leader}
    assert h.group().state is S.COMPLETING_REBALANCE


async def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed(h):
    (leader, follower), generation = await stable_group(h, 2)
    await h.join_new()
    rejoined = await h.join(follower)
    assert h.context.timers[("join", "g")][0] == 30.0  # the members' rebalance timeout
    await h.fire(("join", "g"))
    result = await done(rejoined)
    assert result.generation_id == generation + 1
    assert leader not in h.group().members and len(h.group().members) == 2
    assert result.leader != leader  # leadership passed to a member that rejoined
    assert ("heartbeat", "g", leader) not in h.timer_keys()


async def test_session_expiry_removes_a_member_and_rebalances(h):
    (leader, follower), generation = await stable_group(h, 2)
    await h.fire(("heartbeat", "g", follower))
    group = h.group()
    assert follower not in group.members and group.state is S.PREPARING_REBALANCE
    rejoin = await h.join(leader)
    result = await done(rejoin)
    assert result.generation_id == generation + 1 and [m.member_id for m in result.members] == [leader]


async def test_heartbeats_push_the_session_timer_back(h):
    (leader, follower), generation = await stable_group(h, 2)
    h.context.timers.pop(("heartbeat", "g", follower))
    assert await h.heartbeat(follower, generation) == E.none
    assert h.context.timers[("heartbeat", "g", follower)][0] == 10.0


async def test_a_stale_timer_that_was_cancelled_does_nothing(h):
    (leader, follower), generation = await stable_group(h, 2)
    _, stale = h.context.timers[("heartbeat", "g", follower)]
    assert await h.heartbeat(follower, generation) == E.none  # reschedules: the old callback is stale now
    await stale()
    assert follower in h.group().members and h.group().state is S.STABLE


async def test_leave_group_batch_and_last_member_leaving_empties_the_group(h):
    (leader, follower), generation = await stable_group(h, 2)
    error, errors = await h.leave((follower, None), ("ghost", None))
    assert (error, errors) == (E.none, [E.none, E.unknown_member_id])
    group = h.group()
    assert group.state is S.PREPARING_REBALANCE
    error, errors = await h.leave((leader, None))
    assert errors == [E.none]
    assert group.state is S.EMPTY and group.generation_id == generation + 1 and group.leader_id is None
    record = h.group_records()[-1]
    assert (record.generation, record.members, record.protocol) == (generation + 1, (), None)
    assert await h.leave(("x", None), group_id="nope") == (E.unknown_member_id, [E.unknown_member_id])


async def test_leave_while_a_member_is_parked_in_the_join_completes_the_rebalance(h):
    (leader, follower), generation = await stable_group(h, 2)
    await h.join_new()
    rejoin = await h.join(leader)
    await h.leave((follower, None))  # everyone left has rejoined now
    assert (await done(rejoin)).generation_id == generation + 1


async def test_follower_rejoin_with_same_metadata_in_stable_does_not_rebalance(h):
    (leader, follower), generation = await stable_group(h, 2)
    result = await done(await h.join(follower))
    assert (result.error, result.generation_id, result.members) == (E.none, generation, ())
    assert h.group().state is S.STABLE


async def test_leader_rejoin_in_stable_rebalances(h):
    """Cooperative clients rejoin after revoking partitions: the broker side is a plain rebalance."""
    (leader, follower), generation = await stable_group(h, 2)
    parked = await h.join(leader)
    assert not parked.done and h.group().state is S.PREPARING_REBALANCE
    assert await h.heartbeat(follower, generation) == E.rebalance_in_progress
    await h.join(follower)
    assert (await done(parked)).generation_id == generation + 1


async def test_rebalance_during_completing_rebalance_fails_parked_syncs(h):
    a = await h.join_new()
    b = await h.join_new()
    await h.settle()
    assert (await done(a)).error == E.none
    rb = await done(b)
    follower_sync = await h.sync(rb.member_id, 1)
    changed = await h.join(rb.member_id, protocols=(("roundrobin", SUB), ("range", SUB)))
    assert (await done(follower_sync)).error == E.rebalance_in_progress
    assert not changed.done and h.group().state is S.PREPARING_REBALANCE


async def test_members_that_never_sync_are_removed(h):
    a = await h.join_new()
    b = await h.join_new()
    await h.settle()
    ra, rb = await done(a), await done(b)
    await h.sync(ra.member_id, 1, assignments={ra.member_id: b"A", rb.member_id: b"B"})
    await h.fire(("sync", "g"))
    group = h.group()
    assert rb.member_id not in group.members and group.state is S.PREPARING_REBALANCE


async def test_protocol_checks(h):
    (leader, follower), generation = await stable_group(h, 2)
    other_type = await done(await h.join("", protocol_type="connect"))
    assert other_type.error == E.inconsistent_group_protocol
    no_common = await done(await h.join("", protocols=(("sticky", SUB),)))
    assert no_common.error == E.inconsistent_group_protocol
    assert (await done(await h.sync(follower, generation, protocol_type="connect"))).error == \
        E.inconsistent_group_protocol
    assert (await done(await h.sync(follower, generation, protocol_name="roundrobin"))).error == \
        E.inconsistent_group_protocol
    assert (await done(await h.sync(follower, generation, protocol_type="consumer", protocol_name="range"))).error \
        == E.none
    assert (await done(await h.sync(follower, generation + 3))).error == E.illegal_generation
    assert (await done(await h.sync("ghost", generation))).error == E.unknown_member_id
    assert (await done(await h.sync(follower, generation, group_id="nope"))).error == E.unknown_member_id
    empty_protocols = await done(await h.join("", group_id="other", protocols=()))
    assert empty_protocols.error == E.inconsistent_group_protocol
    assert "other" not in h.groups  # a failed first join leaves no group behind


async def test_protocol_selection_by_votes(h):
    both = (("range", SUB), ("roundrobin", SUB))
    a = await h.join_new(protocols=both)
    b = await h.join_new(protocols=(("roundrobin", SUB),))
    await h.settle()
    assert (await done(a)).protocol_name == "roundrobin"  # the only one both support
    assert (await done(b)).protocol_name == "roundrobin"

    c = await h.join_new("g2", protocols=both)
    d = await h.join_new("g2", protocols=(("roundrobin", SUB), ("range", SUB)))
    await h.settle("g2")
    assert (await done(c)).protocol_name == "range"  # a tie: the first member's preference
    assert (await done(d)).protocol_name == "range"


async def test_session_timeout_bounds(monkeypatch):
    h = Harness(monkeypatch, min_session_timeout_ms=6000, max_session_timeout_ms=300_000)
    assert (await done(await h.join(session_ms=5999))).error == E.invalid_session_timeout
    assert (await done(await h.join(session_ms=300_001))).error == E.invalid_session_timeout
    assert (await done(await h.join(session_ms=6000))).error == E.member_id_required


async def test_group_max_size(monkeypatch):
    h = Harness(monkeypatch, max_size=2)
    members, generation = await stable_group(h, 2)
    refused = await done(await h.join(""))
    assert (refused.error, refused.member_id) == (E.group_max_size_reached, "")
    assert len(h.group().members) == 2 and not h.group().pending_members
    assert (await done(await h.join(members[1]))).error == E.none  # members already in may rejoin

    h.settings = attrs.evolve(h.settings, max_size=3)
    first = await done(await h.join("", group_id="g3"))
    second = await done(await h.join("", group_id="g3"))
    joined = [await h.join(first.member_id, group_id="g3"), await h.join(second.member_id, group_id="g3")]
    third, fourth = [await done(await h.join("", group_id="g3")) for _ in range(2)]
    assert third.error == fourth.error == E.member_id_required  # pending ids do not count
    joined.append(await h.join(third.member_id, group_id="g3"))
    assert (await done(await h.join(fourth.member_id, group_id="g3"))).error == E.group_max_size_reached
    assert h.group("g3").pending_members == set()  # the refused id does not hold up the rebalance
    assert not any(w.done for w in joined)


async def test_unknown_member_ids(h):
    assert (await done(await h.join("ghost"))).error == E.unknown_member_id  # no such group
    assert "g" not in h.groups
    await stable_group(h, 1)
    assert (await done(await h.join("ghost"))).error == E.unknown_member_id


async def test_pending_member_that_never_joins_expires(h):
    first = await done(await h.join(""))
    await h.fire(("heartbeat", "g", first.member_id))
    assert h.group().pending_members == set()
    assert (await done(await h.join(first.member_id))).error == E.unknown_member_id


async def test_static_member_rejoin_replaces_its_old_id_without_a_rebalance(h):
    a = await h.join("", instance_id="i-a")  # static members get no MEMBER_ID_REQUIRED
    b = await h.join("", instance_id="i-b")
    await h.settle()
    ra, rb = await done(a), await done(b)
    assert ra.member_id.startswith("i-a-")
    await h.sync(rb.member_id, 1, instance_id="i-b")
    await h.sync(ra.member_id, 1, instance_id="i-a", assignments={ra.member_id: b"A", rb.member_id: b"B"})
    written = len(h.group_records())

    again = await done(await h.join("", instance_id="i-b", version=8))  # i-b restarted
    group = h.group()
    assert again.error == E.none and again.member_id != rb.member_id
    assert (again.generation_id, group.state) == (1, S.STABLE)  # no rebalance
    assert group.members[again.member_id].assignment == b"B"
    assert len(h.group_records()) == written + 1  # the new member id is persisted
    assert await h.heartbeat(rb.member_id, 1, instance_id="i-b") == E.fenced_instance_id
    assert (await done(await h.sync(rb.member_id, 1, instance_id="i-b"))).error == E.fenced_instance_id
    assert (await done(await h.sync(again.member_id, 1, instance_id="i-b"))).assignment == b"B"

    leader_again = await done(await h.join("", instance_id="i-a", version=9))
    assert leader_again.skip_assignment and leader_again.leader == leader_again.member_id  # KIP-814
    assert {m.group_instance_id for m in leader_again.members} == {"i-a", "i-b"}


async def test_static_member_restart_fences_a_parked_join_of_the_old_id(h):
    a = await h.join("", instance_id="i-a")
    b = await h.join("", instance_id="i-b")
    await h.settle()
    ra, rb = await done(a), await done(b)
    await h.sync(ra.member_id, 1, instance_id="i-a", assignments={})
    await h.join_new()  # a dynamic member arrives: rebalance
    old = await h.join(rb.member_id, instance_id="i-b")
    assert not old.done
    await h.join("", instance_id="i-b")
    assert (await done(old)).error == E.fenced_instance_id


async def test_static_members_are_kept_when_they_miss_a_rebalance(h):
    a = await h.join("", instance_id="i-a")
    b = await h.join("", instance_id="i-b")
    await h.settle()
    ra, rb = await done(a), await done(b)
    await h.sync(ra.member_id, 1, instance_id="i-a", assignments={})
    await h.sync(rb.member_id, 1, instance_id="i-b")
    parked = await h.join(ra.member_id, instance_id="i-a")  # the leader asks for a rebalance
    await h.fire(("join", "g"))
    result = await done(parked)
    assert {m.group_instance_id for m in result.members} == {"i-a", "i-b"}  # i-b stays until its session ends


async def test_failed_assignment_write_fails_the_syncs_and_rebalances(h):
    a = await h.join_new()
    b = await h.join_new()
    await h.settle()
    ra, rb = await done(a), await done(b)
    follower = await h.sync(rb.member_id, 1)
    h.context.fail_appends = E.not_coordinator
    leader = await h.sync(ra.member_id, 1, assignments={})
    assert (await done(leader)).error == E.not_coordinator
    assert (await done(follower)).error == E.not_coordinator
    assert h.group().state is S.PREPARING_REBALANCE


async def test_unloading_answers_parked_requests(h):
    a = await h.join_new()
    assert not a.done
    h.context.active = False
    h.shard.unloaded()
    assert (await done(a)).error == E.not_coordinator


async def test_load_restores_stable_groups_and_their_session_timers(h):
    (leader, follower), generation = await stable_group(h, 2)
    records = list(h.context.written)
    fresh = Harness.__new__(Harness)
    fresh.__dict__.update(h.__dict__)
    from group_harness import FakeContext

    from josef_coordinator_group.shard import GroupShard

    context = FakeContext()
    shard = GroupShard(context, lambda: h.settings)  # type: ignore[arg-type]
    context.shard = shard
    for offset, (key, value) in enumerate(records):
        shard.replay(key, value, offset)
    shard.loaded()
    group = shard.groups["g"]
    assert (group.state, group.generation_id, group.leader_id, group.protocol_name) == (
        S.STABLE, generation, leader, "range")
    assert {m.member_id: m.assignment for m in group.members.values()} == {
        leader: leader.encode(), follower: follower.encode()}
    assert group.subscribed_topics == {"orders"}
    assert {("heartbeat", "g", leader), ("heartbeat", "g", follower), "expire-offsets"} <= set(context.timers)
    # Group records written after loading do not replace the live group.
    shard.replay(encode_key(GroupKey("g")), encode_group(group.to_value({})), 99)
    assert shard.groups["g"] is group


async def test_illegal_transitions_are_bugs(h):
    from josef_coordinator_group.group import ClassicGroup, IllegalTransitionError

    group = ClassicGroup("x", 0)
    with pytest.raises(IllegalTransitionError):
        group.transition_to(S.STABLE, 1)
    group.transition_to(S.PREPARING_REBALANCE, 1)
    group.transition_to(S.COMPLETING_REBALANCE, 2)
    group.transition_to(S.STABLE, 3)
    with pytest.raises(IllegalTransitionError):
        group.transition_to(S.EMPTY, 4)
    group.transition_to(S.DEAD, 5)
    assert (group.previous_state, group.state_timestamp_ms) == (S.STABLE, 5)


async def test_offset_commit_rules(h):
    group_errors = []
    (leader, follower), generation = await stable_group(h, 2)
    group = h.group()
    for args in ((follower, None, generation), ("", None, -1), (follower, None, generation + 1),
                 ("ghost", None, generation), (follower, "i-x", generation)):
        try:
            group.validate_offset_commit(*args)
            group_errors.append(E.none)
        except Exception as exc:
            group_errors.append(exc.code)
    assert group_errors == [E.none, E.unknown_member_id, E.illegal_generation, E.unknown_member_id,
                            E.unknown_member_id]
    newcomer = await h.join_new()
    assert group.state is S.PREPARING_REBALANCE
    group.validate_offset_commit(follower, None, generation)  # revoking partitions, eager members commit
    await h.join(leader)
    await h.join(follower)
    assert group.state is S.COMPLETING_REBALANCE
    with pytest.raises(Exception) as info:
        group.validate_offset_commit(follower, None, generation + 1)  # joined, but no assignment yet
    assert info.value.code == E.rebalance_in_progress
    assert newcomer.done


async def test_subscribed_topics_come_from_consumer_subscriptions(h):
    await stable_group(h, 1, protocols=(("range", encode_subscription(Subscription(["a", "b"]))),))
    assert h.group().subscribed_topics == {"a", "b"}
    await stable_group(h, 1, group_id="connect", protocol_type="connect", protocols=(("x", b"opaque"),))
    assert h.group("connect").subscribed_topics is None
