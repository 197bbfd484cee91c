"""Who may commit, what is stored, and when offsets expire (Kafka's retention rules), on a harness shard."""

from __future__ import annotations

import types

import pytest
from group_harness import Harness, done
from kio.schema.errors import ErrorCode

from josef.protocol.consumer_protocol import Subscription, encode_subscription
from josef_coordinator_group.api_offsets import CommitRequest, commit_offsets
from josef_coordinator_group.group import GroupState
from josef_coordinator_group.records import GroupKey, OffsetKey, decode_key

pytestmark = pytest.mark.anyio

E = ErrorCode
MINUTE = 60_000
IMAGE = types.SimpleNamespace(topics={"orders": object(), "audit": object()})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def h(monkeypatch):
    return Harness(monkeypatch, offsets_retention_ms=10 * MINUTE)


async def commit(h: Harness, group: str = "g", *, generation: int = -1, member: str = "", version: int = 9,
                 retention_ms: int = -1, offsets=(("orders", 0, 5),), metadata: str | None = "m"):
    request = CommitRequest(group, generation, member, None, retention_ms,
                            [(t, [(p, o, 3, metadata)]) for t, p, o in offsets], version)
    async with h.context.lock:
        return await commit_offsets(h.shard, IMAGE, request)  # type: ignore[arg-type]


async def member_of_stable_group(h: Harness, topics=("orders",)):
    sub = encode_subscription(Subscription(list(topics)))
    first = await done(await h.join(""))
    parked = await h.join(first.member_id, protocols=(("range", sub),))
    await h.settle()
    joined = await done(parked)
    await h.sync(joined.member_id, joined.generation_id, assignments={})
    return joined.member_id, joined.generation_id


def tombstones(h: Harness):
    return [decode_key(key) for key, value in h.context.written if value is None]


async def test_simple_commit_creates_a_group_and_stores_offsets(h):
    assert await commit(h) == {("orders", 0): E.none}
    group = h.group()
    assert (group.state, group.protocol_type) == (GroupState.EMPTY, None)
    stored = h.shard.offsets.get("g", "orders", 0)
    assert (stored.offset, stored.metadata, stored.leader_epoch, stored.commit_timestamp) == (5, "m", 3, h.clock.now)


async def test_commit_errors(monkeypatch):
    h = Harness(monkeypatch, offset_metadata_max_bytes=4)
    assert await commit(h, generation=1, member="m", version=8) == {("orders", 0): E.illegal_generation}
    assert await commit(h, generation=1, member="m", version=9) == {("orders", 0): E.group_id_not_found}
    assert await commit(h, offsets=(("nope", 0, 1),)) == {("nope", 0): E.unknown_topic_or_partition}
    assert await commit(h, metadata="too long") == {("orders", 0): E.offset_metadata_too_large}
    assert await commit(h, metadata=None) == {("orders", 0): E.none}
    h.context.fail_appends = E.not_enough_replicas
    assert await commit(h) == {("orders", 0): E.coordinator_not_available}


async def test_members_commit_with_their_generation(h):
    member, generation = await member_of_stable_group(h)
    assert await commit(h, generation=generation, member=member) == {("orders", 0): E.none}
    assert await commit(h, generation=generation + 1, member=member) == {("orders", 0): E.illegal_generation}
    assert await commit(h) == {("orders", 0): E.unknown_member_id}  # not empty: no anonymous commits
    h.context.timers.pop(("heartbeat", "g", member))
    await commit(h, generation=generation, member=member)
    assert ("heartbeat", "g", member) in h.context.timers  # a commit shows the member is alive


async def test_offsets_of_simple_groups_expire_after_their_commit_and_then_the_group_goes(h):
    await commit(h, offsets=(("orders", 0, 1), ("orders", 1, 1)))
    h.clock.now += 5 * MINUTE
    await commit(h, offsets=(("orders", 1, 2),))
    h.clock.now += 5 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "orders", 0)]
    assert "g" in h.groups
    h.clock.now += 5 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h)[1:] == [OffsetKey("g", "orders", 1), GroupKey("g")]
    assert "g" not in h.groups and not h.shard.offsets.has_offsets("g")
    assert h.context.timers["expire-offsets"][0] == 600.0  # the check runs again later


async def test_an_explicit_retention_wins(h):
    await commit(h, retention_ms=MINUTE)
    h.clock.now += MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "orders", 0), GroupKey("g")]


async def test_empty_groups_keep_offsets_for_the_retention_after_they_became_empty(h):
    member, generation = await member_of_stable_group(h)
    await commit(h, generation=generation, member=member)
    h.clock.now += 20 * MINUTE  # long after the commit, but the group is still stable and subscribed
    await h.shard.expire_offsets()
    assert tombstones(h) == []
    await h.leave((member, None))
    assert h.group().state is GroupState.EMPTY
    h.clock.now += 9 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == []
    h.clock.now += MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "orders", 0), GroupKey("g")]


async def test_stable_consumer_groups_lose_offsets_of_topics_they_no_longer_read(h):
    member, generation = await member_of_stable_group(h, topics=("orders",))
    await commit(h, generation=generation, member=member, offsets=(("orders", 0, 1), ("audit", 0, 1)))
    h.clock.now += 10 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "audit", 0)]
    assert h.group().state is GroupState.STABLE


async def test_rebalancing_groups_keep_their_offsets(h):
    member, generation = await member_of_stable_group(h)
    await commit(h, generation=generation, member=member, offsets=(("audit", 0, 1),))
    await h.join(member)  # the leader asks for a rebalance
    h.clock.now += 60 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == []
