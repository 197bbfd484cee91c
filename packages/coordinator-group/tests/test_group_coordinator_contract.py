"""The core's coordinator contract suite (:mod:`josef.testing.coordinator`) run against the group coordinator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.consumer_protocol import Subscription, encode_subscription
from josef.testing.coordinator import ContractServices, CoordinatorContract, RecordingContext
from josef_coordinator_group.coordinator import GroupCoordinator
from josef_coordinator_group.membership import JoinRequest, SyncRequest
from josef_coordinator_group.shard import GroupShard

SUBSCRIPTION = encode_subscription(Subscription(["orders"]))


def _commit(group_id: str, offsets: Mapping[int, int], *, generation: int = -1, member_id: str = "") -> dict[str, Any]:
    return {"group_id": group_id, "generation_id_or_member_epoch": generation, "member_id": member_id,
            "group_instance_id": None, "topics": [{"name": "orders", "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": 3, "committed_metadata": "m"}
                for p, o in offsets.items()]}]}


def _partition_errors(response: Any) -> set[ErrorCode]:
    return {p.error_code for t in response.topics for p in t.partitions}


class GroupHarness:
    """Offsets of a simple group (one deleted: a tombstone), a classic group rebalanced to a stable generation with
    its commits, and a group deleted with its offsets; through the handlers, and the shard's membership for the
    rebalance, whose join phase waits for a timer."""

    name = "group"

    def config_keys(self) -> Mapping[str, str]:
        return {"offsets.topic.num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}

    async def scenario(self, coordinator: GroupCoordinator, context: RecordingContext,
                       services: ContractServices) -> None:
        services.add_topic("orders", 2)
        assert _partition_errors(await services.call(ApiKey.OFFSET_COMMIT, 9, _commit("simple", {0: 5, 1: 7}))) \
            == {ErrorCode.none}
        deleted = await services.call(ApiKey.OFFSET_DELETE, 0, {"group_id": "simple", "topics": [
            {"name": "orders", "partitions": [{"partition_index": 1}]}]})
        assert deleted.error_code == ErrorCode.none and _partition_errors(deleted) == {ErrorCode.none}

        shard = context.shard
        assert isinstance(shard, GroupShard)
        async with context.lock:
            joining = await shard.membership.join(JoinRequest(
                "consumers", "", None, 10_000, 30_000, "consumer", (("range", SUBSCRIPTION),), "client",
                "/127.0.0.1", 3))
        while ("join", "consumers") in context.timers:  # the initial rebalance delay, extended once per newcomer
            await context.fire(("join", "consumers"))
        joined = await joining.wait()
        assert joined.error == ErrorCode.none, joined
        async with context.lock:
            syncing = await shard.membership.sync(SyncRequest(
                "consumers", joined.generation_id, joined.member_id, None, "consumer", "range",
                {joined.member_id: b"orders-0-1"}))
        assert (await syncing.wait()).error == ErrorCode.none
        committed = await services.call(ApiKey.OFFSET_COMMIT, 9, _commit(
            "consumers", {0: 11, 1: 12}, generation=joined.generation_id, member_id=joined.member_id))
        assert _partition_errors(committed) == {ErrorCode.none}

        await services.call(ApiKey.OFFSET_COMMIT, 9, _commit("doomed", {0: 1}))
        gone = await services.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["doomed"]})
        assert [r.error_code for r in gone.results] == [ErrorCode.none]

        # Share groups (KIP-932): two members join, one leaves; another group is joined, left and deleted.
        services.set_feature("share.version", 1)
        for group, member, epoch in (("queue", "q1", 0), ("queue", "q2", 0), ("queue", "q2", -1),
                                     ("gone", "g1", 0), ("gone", "g1", -1)):
            answer = await services.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {
                "group_id": group, "member_id": member, "member_epoch": epoch, "rack_id": None,
                "subscribed_topic_names": ["orders"] if epoch == 0 else None})
            assert answer.error_code == ErrorCode.none, answer
        gone = await services.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["gone"]})
        assert [r.error_code for r in gone.results] == [ErrorCode.none]

    def state(self, shard: GroupShard) -> Any:
        groups = {
            group_id: (group.state.name, group.generation_id, group.protocol_type, group.protocol_name, group.leader_id,
                       sorted((m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                               m.rebalance_timeout_ms, m.protocol_type, tuple(m.protocols), m.assignment)
                              for m in group.members.values()))
            for group_id, group in shard.groups.items()}
        offsets = {group_id: dict(by_partition) for group_id, by_partition in shard.offsets.by_group.items()}
        consumer_groups = {group_id: (group.group_epoch, group.assignment_epoch, sorted(group.members),
                                      dict(group.target))
                           for group_id, group in shard.consumer_groups.items()}
        share_groups = {group_id: (group.group_epoch, group.assignment_epoch, dict(group.target),
                                   dict(group.initialized),
                                   sorted((m.member_id, m.member_epoch, m.previous_member_epoch, m.client_id,
                                           m.subscribed_topic_names, tuple(sorted(m.assigned.items())))
                                          for m in group.members.values()))
                        for group_id, group in shard.share_groups.items()}
        return groups, offsets, consumer_groups, share_groups

    def read(self, shard: GroupShard, at: int) -> Any:
        """What OffsetFetch, ListGroups and the Describe APIs answer from: the state at the committed offset."""
        offsets = {group_id: shard.offsets.of_group(group_id, at) for group_id in shard.offsets.groups(at)}
        return (sorted(shard.groups.keys(at)), offsets, sorted(shard.consumer_groups.keys(at)),
                sorted(shard.share_groups.keys(at)))

    def request(self, api_key: int, version: int) -> Mapping[str, Any] | None:
        return None


class TestGroupCoordinatorContract(CoordinatorContract):
    @pytest.fixture
    def coordinator_harness(self) -> GroupHarness:
        return GroupHarness()
