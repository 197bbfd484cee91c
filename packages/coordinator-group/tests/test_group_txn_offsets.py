"""Offsets committed in transactions (TxnOffsetCommit) on a harness shard: pending until their marker."""

from __future__ import annotations

import pytest
from group_harness import Harness, done
from kio.schema.errors import ErrorCode

from josef.protocol.consumer_protocol import Subscription, encode_subscription
from josef_coordinator_group.api_offsets import CommitRequest, commit_offsets
from josef_coordinator_group.api_txn_offsets import TxnCommitRequest, commit_transactional_offsets
from josef_coordinator_group.consumer_group import ConsumerGroup, ConsumerMember
from josef_coordinator_group.group import GroupState
from josef_coordinator_group.records import GroupKey, OffsetKey, decode_key, encode_key

pytestmark = pytest.mark.anyio

E = ErrorCode
MINUTE = 60_000
PID, EPOCH = 1000, 3


class Image:
    topics = {"orders": object(), "audit": object()}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def h(monkeypatch):
    return Harness(monkeypatch, offsets_retention_ms=10 * MINUTE)


async def txn_commit(h: Harness, group: str = "g", *, pid: int = PID, generation: int = -1, member: str = "",
                     instance: str | None = None, offsets=(("orders", 0, 5),), metadata: str | None = "m"):
    request = TxnCommitRequest(group, pid, EPOCH, generation, member, instance,
                               [(t, [(p, o, 7, metadata)]) for t, p, o in offsets])
    async with h.context.lock:
        return await commit_transactional_offsets(h.shard, request)


async def plain_commit(h: Harness, offset: int, group: str = "g"):
    request = CommitRequest(group, -1, "", None, -1, [("orders", [(0, offset, 1, "plain")])], 9)
    async with h.context.lock:
        return await commit_offsets(h.shard, Image, request)  # type: ignore[arg-type]


def committed(h: Harness, group: str = "g", topic: str = "orders", partition: int = 0):
    value = h.shard.offsets.get(group, topic, partition)
    return None if value is None else value.offset


def tombstones(h: Harness):
    return [decode_key(key) for key, value in h.context.written if value is None]


async def stable_member(h: Harness):
    sub = encode_subscription(Subscription(["orders"]))
    first = await done(await h.join(""))
    parked = await h.join(first.member_id, protocols=(("range", sub),))
    await h.settle()
    joined = await done(parked)
    await h.sync(joined.member_id, joined.generation_id, assignments={})
    return joined.member_id, joined.generation_id


async def test_offsets_stay_pending_until_the_commit_marker(h):
    assert await txn_commit(h, offsets=(("orders", 0, 5), ("orders", 1, 6))) == {
        ("orders", 0): E.none, ("orders", 1): E.none}
    assert committed(h) is None and committed(h, partition=1) is None
    assert h.shard.offsets.has_pending("g", "orders", 0) and h.shard.offsets.has_open_transactions("g")
    assert h.group().state is GroupState.EMPTY  # the simple group exists as soon as the record is replayed
    h.context.end_transaction(PID, committed=True)
    stored = h.shard.offsets.get("g", "orders", 0)
    assert (stored.offset, stored.metadata, stored.leader_epoch, stored.commit_timestamp, stored.expire_timestamp) == (
        5, "m", 7, h.clock.now, -1)
    assert committed(h, partition=1) == 6
    assert not h.shard.offsets.has_pending("g", "orders", 0) and not h.shard.offsets.has_open_transactions("g")


async def test_an_aborted_transaction_leaves_the_committed_offset(h):
    await plain_commit(h, 3)
    await txn_commit(h, offsets=(("orders", 0, 9),))
    h.context.end_transaction(PID, committed=False)
    assert committed(h) == 3
    assert not h.shard.offsets.has_pending("g", "orders", 0)
    h.context.end_transaction(PID, committed=True)  # a marker with nothing pending changes nothing
    assert committed(h) == 3


async def test_a_marker_ends_only_its_producers_transaction(h):
    await txn_commit(h, pid=1, offsets=(("orders", 0, 10),))
    await txn_commit(h, pid=2, offsets=(("orders", 0, 20), ("orders", 1, 21)))
    h.context.end_transaction(2, committed=True)
    assert (committed(h), committed(h, partition=1)) == (20, 21)
    assert h.shard.offsets.has_pending("g", "orders", 0)  # producer 1 is still open there
    assert not h.shard.offsets.has_pending("g", "orders", 1)
    h.context.end_transaction(1, committed=True)
    assert committed(h) == 20  # its record is older than producer 2's: the later record wins


async def test_the_latest_record_wins_between_plain_and_transactional_commits(h):
    await txn_commit(h, offsets=(("orders", 0, 5),))
    await plain_commit(h, 8)  # written after the transactional record
    h.context.end_transaction(PID, committed=True)
    assert committed(h) == 8
    await plain_commit(h, 9)
    await txn_commit(h, offsets=(("orders", 0, 12),))  # written after the plain one
    h.context.end_transaction(PID, committed=True)
    assert committed(h) == 12


async def test_a_deleted_offset_is_not_brought_back_by_its_transaction(h):
    await txn_commit(h, offsets=(("orders", 0, 5), ("orders", 1, 6)))
    h.shard.replay(encode_key(OffsetKey("g", "orders", 0)), None, 99)  # OffsetDelete's tombstone
    assert not h.shard.offsets.has_pending("g", "orders", 0)
    h.context.end_transaction(PID, committed=True)
    assert committed(h) is None and committed(h, partition=1) == 6


async def test_classic_group_checks_the_member_fields_it_is_given(h):
    member, generation = await stable_member(h)
    assert await txn_commit(h, generation=generation, member=member) == {("orders", 0): E.none}
    assert await txn_commit(h, generation=generation + 1, member=member) == {("orders", 0): E.illegal_generation}
    assert await txn_commit(h, generation=generation, member="ghost") == {("orders", 0): E.unknown_member_id}
    # Without member fields (v0-v2, or no group metadata) a transactional commit needs no membership.
    assert await txn_commit(h) == {("orders", 0): E.none}
    assert await plain_commit(h, 1) == {("orders", 0): E.unknown_member_id}  # unlike a plain commit


async def test_static_members_are_fenced_by_instance_id(h):
    sub = encode_subscription(Subscription(["orders"]))
    parked = await h.join("", instance_id="i-1", protocols=(("range", sub),))  # static: no MEMBER_ID_REQUIRED
    await h.settle()
    joined = await done(parked)
    await h.sync(joined.member_id, joined.generation_id, instance_id="i-1", assignments={})
    assert await txn_commit(h, generation=joined.generation_id, member=joined.member_id, instance="i-1") == {
        ("orders", 0): E.none}
    assert await txn_commit(h, generation=joined.generation_id, member="old-id", instance="i-1") == {
        ("orders", 0): E.fenced_instance_id}


async def test_commits_are_accepted_while_the_group_awaits_its_assignment(h):
    sub = encode_subscription(Subscription(["orders"]))
    first = await done(await h.join(""))
    parked = await h.join(first.member_id, protocols=(("range", sub),))
    await h.settle()
    joined = await done(parked)
    assert h.group().state is GroupState.COMPLETING_REBALANCE
    assert await txn_commit(h, generation=joined.generation_id, member=joined.member_id) == {("orders", 0): E.none}


async def test_missing_groups_are_created_for_generation_minus_one_only(h):
    assert await txn_commit(h, group="nope", generation=3, member="m") == {("orders", 0): E.illegal_generation}
    assert "nope" not in h.groups and h.context.written == []
    assert await txn_commit(h, group="simple") == {("orders", 0): E.none}
    assert h.group("simple").protocol_type is None


async def test_consumer_group_members_commit_with_their_epoch(h):
    group = h.shard.consumer_groups["cg"] = ConsumerGroup("cg")
    member = group.members["m1"] = ConsumerMember("m1")
    member.member_epoch = member.previous_member_epoch = 4
    assert await txn_commit(h, group="cg", generation=4, member="m1") == {("orders", 0): E.none}
    # STALE_MEMBER_EPOCH (and FENCED_MEMBER_EPOCH) are ILLEGAL_GENERATION to a producer, as in Kafka.
    assert await txn_commit(h, group="cg", generation=2, member="m1") == {("orders", 0): E.illegal_generation}
    assert await txn_commit(h, group="cg", generation=9, member="m1") == {("orders", 0): E.illegal_generation}
    assert await txn_commit(h, group="cg", generation=4, member="m2") == {("orders", 0): E.unknown_member_id}
    assert await txn_commit(h, group="cg") == {("orders", 0): E.none}
    assert await txn_commit(h, group="cg", instance="i") == {("orders", 0): E.unknown_member_id}
    assert "cg" not in h.groups  # the offsets belong to the consumer group


async def test_metadata_too_large_and_write_failures(monkeypatch):
    h = Harness(monkeypatch, offset_metadata_max_bytes=4)
    assert await txn_commit(h, offsets=(("orders", 0, 1), ("orders", 1, 1)), metadata="too long") == {
        ("orders", 0): E.offset_metadata_too_large, ("orders", 1): E.offset_metadata_too_large}
    h.context.fail_appends = E.not_enough_replicas
    assert await txn_commit(h, metadata=None) == {("orders", 0): E.coordinator_not_available}
    h.context.fail_appends = E.invalid_producer_epoch  # the partition's producer state fenced the producer
    assert await txn_commit(h, metadata=None) == {("orders", 0): E.invalid_producer_epoch}


async def test_pending_offsets_hold_expiry_and_the_group_until_the_marker(h):
    await plain_commit(h, 1)
    await txn_commit(h, offsets=(("orders", 0, 2),))
    h.clock.now += 20 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [] and "g" in h.groups
    h.context.end_transaction(PID, committed=False)
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "orders", 0), GroupKey("g")]
    assert "g" not in h.groups


async def test_a_group_with_only_pending_offsets_is_not_deleted_by_expiry(h):
    await txn_commit(h, offsets=(("orders", 0, 2),))
    h.clock.now += 20 * MINUTE
    await h.shard.expire_offsets()
    assert tombstones(h) == [] and "g" in h.groups
    h.context.end_transaction(PID, committed=True)
    assert committed(h) == 2  # retention counts from the request's time, 20 minutes ago: it expires at once
    await h.shard.expire_offsets()
    assert tombstones(h) == [OffsetKey("g", "orders", 0), GroupKey("g")]
