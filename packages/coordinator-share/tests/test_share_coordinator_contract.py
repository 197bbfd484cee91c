"""The core's coordinator contract suite (:mod:`josef.testing.coordinator`) run against the share coordinator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing.coordinator import ContractServices, CoordinatorContract, RecordingContext
from josef_coordinator_share.coordinator import ShareCoordinator
from josef_coordinator_share.shard import PRUNE_TIMER, ShareStateShard


def _partitions(answer: Any) -> list[Any]:
    return [p for result in answer.results for p in result.partitions]


class ShareHarness:
    """Two groups' share partitions: initialized, written past a snapshot (two updates per snapshot), read by a newer
    leader; one group's state deleted (tombstones); then the prune timer, which deletes the records a load no
    longer needs."""

    name = "share"

    def config_keys(self) -> Mapping[str, str]:
        return {"share.coordinator.state.topic.num.partitions": "1",
                "share.coordinator.snapshot.update.records.per.snapshot": "2"}

    async def scenario(self, coordinator: ShareCoordinator, context: RecordingContext,
                       services: ContractServices) -> None:
        services.add_topic("orders", 2)
        topic_id = services.image.topics["orders"].topic_id

        async def call(api_key: int, version: int, group: str, partitions: list[dict[str, Any]]) -> list[Any]:
            answer = await services.call(api_key, version, {"group_id": group, "topics": [
                {"topic_id": topic_id, "partitions": partitions}]})
            assert {p.error_code for p in _partitions(answer)} == {ErrorCode.none}, answer
            return _partitions(answer)

        for group in ("g1", "g2"):
            await call(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, group,
                       [{"partition": p, "state_epoch": 1, "start_offset": 0} for p in (0, 1)])
        for i in range(5):
            await call(ApiKey.WRITE_SHARE_GROUP_STATE, 1, "g1", [{
                "partition": 0, "state_epoch": 1, "leader_epoch": 3, "start_offset": 10 * i,
                "state_batches": [{"first_offset": 10 * i, "last_offset": 10 * i + 4, "delivery_state": 2,
                                   "delivery_count": 1},
                                  {"first_offset": 10 * i + 7, "last_offset": 10 * i + 8, "delivery_state": 4,
                                   "delivery_count": 5}]}])
        [read] = await call(ApiKey.READ_SHARE_GROUP_STATE, 0, "g1", [{"partition": 1, "leader_epoch": 9}])
        assert read.start_offset == 0
        await call(ApiKey.DELETE_SHARE_GROUP_STATE, 0, "g2", [{"partition": 0}, {"partition": 1}])
        await context.fire(PRUNE_TIMER)
        assert context.log_start > 0, "nothing was pruned"

    def state(self, shard: ShareStateShard) -> Any:
        return dict(shard.states.view())

    def read(self, shard: ShareStateShard, at: int) -> Any:
        """What ReadShareGroupStateSummary answers from."""
        return {key: (s.state_epoch, s.leader_epoch, s.start_offset) for key, s in shard.states.items(at=at)}

    def request(self, api_key: int, version: int) -> Mapping[str, Any] | None:
        return None


class TestShareCoordinatorContract(CoordinatorContract):
    @pytest.fixture
    def coordinator_harness(self) -> ShareHarness:
        return ShareHarness()
