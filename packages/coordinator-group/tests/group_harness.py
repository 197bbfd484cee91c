"""Drive a real GroupShard without a broker: writes are recorded (and replayed), timers fire when a test says so.

The shard under test is the production one; only its link to the partition
(:class:`josef.coordinator.runtime.ShardContext`) is replaced, so state
machine tests are deterministic and need no sleeping.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.protocol.topic_partition import TopicPartition
from josef.testing import ManualClock
from josef.testing.coordinator import Record, RecordingContext
from josef.protocol.consumer_protocol import Subscription, encode_subscription
from josef_coordinator_group.configs import GroupSettings
from josef_coordinator_group.group import JoinResult, SyncResult, Waiter
from josef_coordinator_group.membership import JoinRequest, LeavingMember, SyncRequest
from josef_coordinator_group.records import GroupKey, decode_group, decode_key
from josef_coordinator_group.shard import GroupShard

SUB = encode_subscription(Subscription(["orders"]))


class FakeContext(RecordingContext):
    """The contract suite's recording context (writes replayed as the runtime does, timers fired by the test),
    with the records written so far as (key, value) pairs."""

    def __init__(self) -> None:
        super().__init__(None, TopicPartition("__consumer_offsets", 0))

    @property
    def written(self) -> list[tuple[bytes, bytes | None]]:
        return [(entry.key, entry.value) for entry in self.log if isinstance(entry, Record)]


class Harness:
    """One shard and helpers that speak in requests, as handlers would (lock held for each operation)."""

    def __init__(self, monkeypatch, **settings: Any) -> None:
        self.clock = ManualClock()
        monkeypatch.setattr(clock, "now_ms", self.clock)
        defaults = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 10, "max_session_timeout_ms": 60_000}
        self.settings = GroupSettings(**{**defaults, **settings})
        self.context = FakeContext()
        self.shard = GroupShard(self.context, lambda: self.settings)  # type: ignore[arg-type]
        self.context.shard = self.shard
        self.shard.loading = False

    @property
    def groups(self):
        return self.shard.groups

    def group(self, group_id: str = "g"):
        return self.shard.groups[group_id]

    # Requests -----------------------------------------------------------------------------

    async def join(self, member_id: str = "", group_id: str = "g", *, version: int = 9, instance_id: str | None = None,
                   protocols=(("range", SUB),), session_ms: int = 10_000, rebalance_ms: int = 30_000,
                   protocol_type: str = "consumer", client_id: str = "client") -> Waiter[JoinResult]:
        request = JoinRequest(group_id, member_id, instance_id, session_ms, rebalance_ms, protocol_type,
                              tuple(protocols), client_id, "/127.0.0.1", version)
        async with self.context.lock:
            return await self.shard.membership.join(request)

    async def join_new(self, group_id: str = "g", **kwargs: Any) -> Waiter[JoinResult]:
        """A v4+ first join: ask for a member id, then join with it (the JoinGroup stays parked)."""
        first = await self.join("", group_id, **kwargs)
        result = await first.wait()
        assert result.error == ErrorCode.member_id_required, result
        return await self.join(result.member_id, group_id, **kwargs)

    async def sync(self, member_id: str, generation: int, group_id: str = "g", *, assignments=None,
                   instance_id: str | None = None, protocol_type=None, protocol_name=None) -> Waiter[SyncResult]:
        request = SyncRequest(group_id, generation, member_id, instance_id, protocol_type, protocol_name,
                              dict(assignments or {}))
        async with self.context.lock:
            return await self.shard.membership.sync(request)

    async def heartbeat(self, member_id: str, generation: int, group_id: str = "g",
                        instance_id: str | None = None) -> ErrorCode:
        async with self.context.lock:
            return self.shard.membership.heartbeat(group_id, member_id, instance_id, generation)

    async def leave(self, *members: tuple[str, str | None], group_id: str = "g"):
        async with self.context.lock:
            return await self.shard.membership.leave(group_id, [LeavingMember(m, i) for m, i in members])

    # Timers -------------------------------------------------------------------------------

    def timer_keys(self) -> set[Any]:
        return set(self.context.timers)

    async def fire(self, key: Any) -> None:
        """Let one pending timer go off now."""
        _, callback = self.context.timers.pop(key)
        await callback()

    async def settle(self, group_id: str = "g") -> None:
        """Let the join phase's timers go off until it ends (the initial delay extends once per newcomer)."""
        for _ in range(100):
            if ("join", group_id) not in self.context.timers:
                return
            await self.fire(("join", group_id))
        raise AssertionError("the join phase does not end")

    async def fire_all(self, kind: str) -> None:
        for key in [k for k in self.context.timers if isinstance(k, tuple) and k[0] == kind]:
            if key in self.context.timers:
                await self.fire(key)

    def group_records(self, group_id: str = "g", *, creation: bool = False):
        """The GroupMetadata values written for ``group_id`` (None for a tombstone), oldest first; without the
        empty record that creates the group (generation 0, no members) unless ``creation``."""
        values = [None if value is None else decode_group(value) for key, value in self.context.written
                  if decode_key(key) == GroupKey(group_id)]
        return [v for v in values if creation or v is None or v.generation or v.members]


async def done(waiter: Waiter):
    """The result of a waiter that must already be complete."""
    assert waiter.done, "the request is still parked"
    return await waiter.wait()
