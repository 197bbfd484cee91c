"""KIP-848 consumer groups driven heartbeat by heartbeat on a real shard (no broker, no sleeping)."""

from __future__ import annotations

import pytest
from group_harness import Harness
from kio.schema.errors import ErrorCode

from josef_coordinator_group.consumer_membership import HeartbeatRequest, session_key
from josef_coordinator_group.shard import GroupShard

pytestmark = pytest.mark.anyio
E = ErrorCode
T = "11111111-1111-1111-1111-111111111111"
U = "22222222-2222-2222-2222-222222222222"
TOPICS = {"orders": (T, 6), "other": (U, 2)}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def h(monkeypatch):
    return Harness(monkeypatch)


async def hb(h: Harness, member_id: str, epoch: int, *, owned=None, topics=("orders",), regex=None, group="g",
             instance_id=None, assignor=None, cluster=TOPICS, rebalance_ms=30_000):
    request = HeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch, instance_id=instance_id,
        rebalance_timeout_ms=rebalance_ms if epoch == 0 else -1,
        subscribed_topic_names=tuple(topics) if topics is not None and epoch == 0 else None,
        subscribed_topic_regex=regex, server_assignor=assignor,
        owned=None if owned is None else {t: frozenset(p) for t, p in owned.items()},
        client_id="c", client_host="/127.0.0.1")
    async with h.context.lock:
        return await h.shard.consumer_membership.heartbeat(request, cluster)


def live(h: Harness, group_id: str = "g"):
    """The group as the shard holds it now (each heartbeat puts a changed copy in its place)."""
    return h.shard.consumer_groups[group_id]


def parts(result, topic=T):
    assert result.assignment is not None, result
    return set(result.assignment.get(topic, ()))


async def test_first_member_gets_everything(h):
    r = await hb(h, "a", 0)
    assert r.error == E.none and r.member_epoch == 1 and r.heartbeat_interval_ms == 5000
    assert parts(r) == set(range(6))
    group = h.shard.consumer_groups["g"]
    assert group.group_epoch == 1 and group.assignment_epoch == 1 and group.state == "Stable"
    assert session_key("g", "a") in h.context.timers
    # A heartbeat that reports what it owns gets no assignment back (nothing changed).
    r = await hb(h, "a", 1, owned={T: range(6)})
    assert r.error == E.none and r.member_epoch == 1 and r.assignment is None


async def test_second_member_waits_for_revocation(h):
    await hb(h, "a", 0)
    await hb(h, "a", 1, owned={T: range(6)})
    b = await hb(h, "b", 0)
    # b is at the new epoch but its partitions are still owned by a: nothing yet.
    assert b.error == E.none and b.member_epoch == 2 and parts(b) == set()
    group = h.shard.consumer_groups["g"]
    assert group.state == "Reconciling"
    target_b = group.target["b"][T]
    assert len(target_b) == 3
    # a is told to give up b's partitions, and keeps its epoch until it has.
    a = await hb(h, "a", 1, owned={T: range(6)})
    assert a.member_epoch == 1 and parts(a) == set(range(6)) - target_b
    # Not yet acknowledged: b still gets nothing.
    b = await hb(h, "b", 2, owned={})
    assert b.assignment is None  # unchanged: still nothing
    # a acknowledges the revocation and moves to epoch 2.
    a = await hb(h, "a", 1, owned={T: set(range(6)) - target_b})
    assert a.error == E.none and a.member_epoch == 2
    b = await hb(h, "b", 2, owned={})
    assert b.member_epoch == 2 and parts(b) == target_b
    await hb(h, "b", 2, owned={T: target_b})
    assert live(h).state == "Stable"


async def stable_pair(h):
    await hb(h, "a", 0)
    await hb(h, "b", 0)
    group = h.shard.consumer_groups["g"]
    a_target = group.target["a"][T]
    await hb(h, "a", 1, owned={T: range(6)})
    await hb(h, "a", 1, owned={T: a_target})
    await hb(h, "b", 2, owned={})
    await hb(h, "b", 2, owned={T: live(h).target["b"][T]})
    assert live(h).state == "Stable"
    return live(h)


async def test_leave_hands_partitions_over(h):
    await stable_pair(h)
    r = await hb(h, "b", -1)
    assert r.error == E.none and r.member_epoch == -1
    assert "b" not in live(h).members and session_key("g", "b") not in h.context.timers
    a = await hb(h, "a", 2, owned={T: live(h).members["a"].assigned[T]})
    assert a.member_epoch == 3 and parts(a) == set(range(6))


async def test_session_expiry_removes_member(h):
    group = await stable_pair(h)
    await h.fire(session_key("g", "b"))
    assert "b" not in live(h).members and "b" in group.members  # the version before stays as it was
    a = await hb(h, "a", 2, owned={T: live(h).members["a"].assigned[T]})
    assert parts(a) == set(range(6))
    # The expired member is unknown now.
    r = await hb(h, "b", 2, owned={})
    assert r.error == E.unknown_member_id


async def test_fencing(h):
    await hb(h, "a", 0)
    assert (await hb(h, "a", 5, owned={})).error == E.fenced_member_epoch
    assert (await hb(h, "zz", 1, owned={})).error == E.unknown_member_id
    # A member that lost its epoch rejoins with 0 and gets its partitions back.
    r = await hb(h, "a", 0)
    assert r.error == E.none and parts(r) == set(range(6))


async def test_previous_epoch_accepted_when_owned_is_a_subset(h):
    group = await stable_pair(h)
    a = group.members["a"]
    # a's last response (epoch 2) was lost: it may heartbeat with epoch 1 and the partitions it owns.
    r = await hb(h, "a", 1, owned={T: a.assigned[T]})
    assert r.error == E.none and r.member_epoch == 2
    assert (await hb(h, "a", 1, owned={T: range(6)})).error == E.fenced_member_epoch


async def test_errors(h):
    assert (await hb(h, "a", 0, topics=None)).error == E.invalid_request
    assert (await hb(h, "a", 0, assignor="nope")).error == E.unsupported_assignor
    assert (await hb(h, "a", 3, owned={})).error == E.group_id_not_found
    assert (await hb(h, "", 3, owned={})).error == E.invalid_request
    assert (await hb(h, "a", 0, group="")).error == E.invalid_request


async def test_range_assignor_and_regex(h):
    r = await hb(h, "a", 0, topics=(), regex="ord.*|oth.*", assignor="range")
    assert parts(r) == set(range(6)) and parts(r, U) == {0, 1}
    b = await hb(h, "b", 0, topics=("orders",), assignor="range")
    group = h.shard.consumer_groups["g"]
    assert group.target["b"] == {T: frozenset({3, 4, 5})}
    assert group.target["a"] == {T: frozenset({0, 1, 2}), U: frozenset({0, 1})}
    assert b.error == E.none


async def test_new_topic_matching_regex_bumps_epoch(h):
    await hb(h, "a", 0, topics=(), regex="ord.*")
    group = h.shard.consumer_groups["g"]
    assert group.group_epoch == 1
    more = {**TOPICS, "ordinals": ("33333333-3333-3333-3333-333333333333", 1)}
    r = await hb(h, "a", 1, owned={T: range(6)}, cluster=more)
    assert live(h).group_epoch == 2 and r.member_epoch == 2
    assert parts(r, "33333333-3333-3333-3333-333333333333") == {0}


async def test_static_member_rejoins_with_new_id(h):
    await hb(h, "a", 0, instance_id="i1")
    r = await hb(h, "a", -2, instance_id="i1")
    assert r.member_epoch == -2
    # Still holding its partitions: another instance can't take the id while a is active.
    assert (await hb(h, "c", 0, instance_id="i1")).error == E.none
    group = h.shard.consumer_groups["g"]
    assert "a" not in group.members and group.members["c"].assigned[T] == frozenset(range(6))


async def test_offset_commit_by_member_epoch(h):
    group = await stable_pair(h)
    cm = h.shard.consumer_membership
    cm.validate_offset_commit(group, "a", 2)
    from josef_coordinator_group.group import GroupError

    with pytest.raises(GroupError) as info:
        cm.validate_offset_commit(group, "nobody", 2)
    assert info.value.code == E.unknown_member_id
    with pytest.raises(GroupError):
        cm.validate_offset_commit(group, "", -1)


async def test_records_rebuild_the_group(h, monkeypatch):
    group = await stable_pair(h)
    reloaded = Harness(monkeypatch)
    reloaded.shard.loading = True
    for offset, (key, value) in enumerate(h.context.written):
        reloaded.shard.replay(key, value, offset)
    reloaded.shard.loaded()
    again = reloaded.shard.consumer_groups["g"]
    assert (again.group_epoch, again.assignment_epoch) == (group.group_epoch, group.assignment_epoch)
    assert again.target == group.target
    for member_id, member in group.members.items():
        copy = again.members[member_id]
        assert (copy.member_epoch, copy.assigned, copy.subscribed_topic_names) == (
            member.member_epoch, member.assigned, member.subscribed_topic_names)
    assert session_key("g", "a") in reloaded.context.timers
    # The members carry on heartbeating after the restart.
    r = await hb(reloaded, "a", 2, owned={T: group.members["a"].assigned[T]})
    assert r.error == E.none and r.member_epoch == 2


async def test_classic_and_consumer_groups_do_not_mix(h):
    await hb(h, "a", 0, group="cg")
    from josef_coordinator_group.records import ConsumerKey, decode_key

    assert any(isinstance(decode_key(k), ConsumerKey) for k, _ in h.context.written)
    assert isinstance(h.shard, GroupShard) and "cg" not in h.shard.groups


async def test_member_that_does_not_revoke_in_time_is_removed(h):
    from josef_coordinator_group.consumer_membership import revocation_key

    await hb(h, "a", 0)
    await hb(h, "b", 0)
    a = await hb(h, "a", 1, owned={T: range(6)})
    group = h.shard.consumer_groups["g"]
    assert group.members["a"].state == 1 and revocation_key("g", "a") in h.context.timers
    await h.fire(revocation_key("g", "a"))
    assert "a" not in live(h).members
    b = await hb(h, "b", 2, owned={})
    assert parts(b) == set(range(6)) and a.error == E.none


def test_uniform_assignor_is_balanced_and_sticky():
    from josef_coordinator_group.server_assignors import MemberSpec, UniformAssignor

    assignor = UniformAssignor()
    subs = frozenset({T})
    first = assignor.assign({"a": MemberSpec(subs), "b": MemberSpec(subs)}, {T: 6})
    assert sorted(len(first[m][T]) for m in first) == [3, 3]
    # A third member takes one partition from each; nobody else's move.
    specs = {m: MemberSpec(subs, current={T: frozenset(first[m][T])}) for m in first}
    specs["c"] = MemberSpec(subs)
    second = assignor.assign(specs, {T: 6})
    assert all(len(second[m][T]) == 2 for m in second)
    assert all(second[m][T] <= first[m][T] for m in ("a", "b"))
    assert set().union(*(second[m][T] for m in second)) == set(range(6))
