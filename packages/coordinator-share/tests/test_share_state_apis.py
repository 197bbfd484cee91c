"""The share-state RPCs on a real shard without a broker: fencing, errors per partition, snapshots and pruning."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.node.server_properties import load_config
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.testing.coordinator import ContractServices, Record
from josef_coordinator_share import records
from josef_coordinator_share.coordinator import ShareCoordinator
from josef_coordinator_share.shard import PRUNE_TIMER

E = ErrorCode
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Share:
    """A share coordinator with one loaded shard and a topic ``orders`` of two partitions."""

    def __init__(self, per_snapshot: int = 500) -> None:
        config = load_config(None, {"share.coordinator.state.topic.num.partitions": "1",
                                    "share.coordinator.snapshot.update.records.per.snapshot": str(per_snapshot)})
        self.services = ContractServices(config, get_plugin_manager())
        self.services.coordinators.coordinator = ShareCoordinator(self.services)
        self.context = self.services.coordinators.load()
        self.services.add_topic("orders", 2)
        self.topic_id = self.services.image.topics["orders"].topic_id

    async def call(self, api_key: int, version: int, partitions: list[dict[str, Any]], group: str = "g",
                   topic_id: Any = None) -> list[Any]:
        answer = await self.services.call(api_key, version, {"group_id": group, "topics": [
            {"topic_id": topic_id or self.topic_id, "partitions": partitions}]})
        return [p for result in answer.results for p in result.partitions]

    async def init(self, partition: int = 0, state_epoch: int = 1, start: int = 0) -> Any:
        [answer] = await self.call(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0,
                                   [{"partition": partition, "state_epoch": state_epoch, "start_offset": start}])
        return answer

    async def write(self, leader_epoch: int, start: int = -1, batches: tuple = (), state_epoch: int = 1,
                    partition: int = 0) -> Any:
        [answer] = await self.call(ApiKey.WRITE_SHARE_GROUP_STATE, 1, [{
            "partition": partition, "state_epoch": state_epoch, "leader_epoch": leader_epoch, "start_offset": start,
            "state_batches": [{"first_offset": f, "last_offset": la, "delivery_state": s, "delivery_count": c}
                              for f, la, s, c in batches]}])
        return answer

    async def read(self, leader_epoch: int, partition: int = 0) -> Any:
        [answer] = await self.call(ApiKey.READ_SHARE_GROUP_STATE, 0,
                                   [{"partition": partition, "leader_epoch": leader_epoch}])
        return answer

    def record_types(self) -> list[tuple[int, bool]]:
        """Each record written: its type (0 snapshot, 1 update) and whether it is a tombstone."""
        return [(records.decode_key(e.key)[0], e.value is None) for e in self.context.log if isinstance(e, Record)]


async def test_a_share_partition_never_initialized_reads_as_start_offset_minus_one():
    share = Share()
    answer = await share.read(leader_epoch=0)
    assert (answer.error_code, answer.start_offset, answer.state_epoch, answer.state_batches) == (E.none, -1, 0, ())
    assert share.context.log == []


async def test_a_write_then_a_read_give_back_the_start_and_batches():
    share = Share()
    assert (await share.init(start=5)).error_code == E.none
    assert (await share.write(2, 5, [(5, 9, 2, 1), (12, 12, 4, 3)])).error_code == E.none
    answer = await share.read(leader_epoch=2)
    assert (answer.start_offset, answer.state_epoch) == (5, 1)
    assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in answer.state_batches] == [
        (5, 9, 2, 1), (12, 12, 4, 3)]


async def test_an_older_leader_is_fenced_once_a_newer_one_read_the_state():
    share = Share()
    await share.init()
    assert (await share.write(leader_epoch=3, batches=[(0, 0, 2, 1)])).error_code == E.none
    assert (await share.read(leader_epoch=4)).error_code == E.none  # the new leader takes over
    assert (await share.write(leader_epoch=3, batches=[(1, 1, 2, 1)])).error_code == E.fenced_leader_epoch
    assert (await share.read(leader_epoch=3)).error_code == E.fenced_leader_epoch
    answer = await share.read(leader_epoch=4)
    assert [(b.first_offset, b.last_offset) for b in answer.state_batches] == [(0, 0)], "the fenced write changed it"


async def test_a_write_against_an_older_state_epoch_is_fenced_and_initialize_cannot_go_back():
    share = Share()
    await share.init(state_epoch=1)
    await share.write(leader_epoch=1, batches=[(0, 3, 2, 1)])
    assert (await share.init(state_epoch=2, start=100)).error_code == E.none  # an offset reset
    assert (await share.write(leader_epoch=1, batches=[(4, 4, 2, 1)], state_epoch=1)).error_code == E.fenced_state_epoch
    assert (await share.init(state_epoch=1)).error_code == E.fenced_state_epoch
    answer = await share.read(leader_epoch=1)
    assert (answer.state_epoch, answer.start_offset, answer.state_batches) == (2, 100, ())


async def test_each_partition_is_answered_on_its_own():
    share = Share()
    answers = await share.call(ApiKey.WRITE_SHARE_GROUP_STATE, 0, [
        {"partition": 0, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "state_batches": []},
        {"partition": 7, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "state_batches": []},
        {"partition": -1, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "state_batches": []},
        {"partition": 1, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0,
         "state_batches": [{"first_offset": 5, "last_offset": 4, "delivery_state": 2, "delivery_count": 1}]},
        {"partition": 1, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0,
         "state_batches": [{"first_offset": 0, "last_offset": 4, "delivery_state": 1, "delivery_count": 1}]}])
    assert [(a.partition, a.error_code) for a in answers] == [
        (0, E.none), (7, E.unknown_topic_or_partition), (-1, E.invalid_request), (1, E.invalid_request),
        (1, E.invalid_request)]
    [unknown] = await share.call(ApiKey.WRITE_SHARE_GROUP_STATE, 0, [
        {"partition": 0, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "state_batches": []}],
        topic_id=uuid.uuid4())
    assert unknown.error_code == E.unknown_topic_or_partition
    assert len(share.context.log) == 1, "only the valid partition was written"


async def test_every_nth_write_is_a_whole_snapshot():
    share = Share(per_snapshot=2)
    await share.init()
    for i in range(5):
        await share.write(leader_epoch=1, start=i, batches=[(i, i, 2, 1)])
    assert share.record_types() == [(0, False), (1, False), (1, False), (0, False), (1, False), (1, False)]
    answer = await share.read(leader_epoch=1)
    assert answer.start_offset == 4
    assert [(b.first_offset, b.last_offset) for b in answer.state_batches] == [(4, 4)]


async def test_delete_writes_tombstones_under_both_keys_and_the_state_is_gone():
    share = Share()
    await share.init()
    await share.write(leader_epoch=1, batches=[(0, 0, 2, 1)])
    [deleted] = await share.call(ApiKey.DELETE_SHARE_GROUP_STATE, 0, [{"partition": 0}])
    assert deleted.error_code == E.none
    assert share.record_types()[-2:] == [(0, True), (1, True)]
    assert (await share.read(leader_epoch=1)).start_offset == -1
    [again] = await share.call(ApiKey.DELETE_SHARE_GROUP_STATE, 0, [{"partition": 0}])
    assert again.error_code == E.none and len(share.context.log) == 4, "deleting nothing writes nothing"


async def test_the_summary_gives_the_epochs_and_start_offset():
    share = Share()
    await share.init(state_epoch=3, start=42)
    await share.read(leader_epoch=6)
    [summary] = await share.call(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, [{"partition": 0, "leader_epoch": 6}])
    assert (summary.error_code, summary.state_epoch, summary.leader_epoch, summary.start_offset,
            summary.delivery_complete_count) == (E.none, 3, 6, 42, -1)


async def test_pruning_keeps_each_share_partitions_latest_snapshot():
    share = Share(per_snapshot=1)
    await share.init(partition=0)  # offset 0
    await share.init(partition=1)  # offset 1
    for _ in range(2):
        await share.write(leader_epoch=1, batches=[(0, 0, 2, 1)], partition=1)  # update at 2, snapshot at 3
    await share.context.fire(PRUNE_TIMER)
    assert share.context.log_start == 0, "partition 0's only snapshot is at offset 0"
    await share.write(leader_epoch=1, batches=[(0, 0, 2, 1)], partition=0)  # update at 4
    await share.write(leader_epoch=1, batches=[(1, 1, 2, 1)], partition=0)  # snapshot at 5
    await share.context.fire(PRUNE_TIMER)
    assert share.context.log_start == 3
    assert PRUNE_TIMER in share.context.timers, "pruning is scheduled again"


async def test_a_shard_elsewhere_answers_not_coordinator():
    share = Share()
    share.context.close()
    answer = await share.read(leader_epoch=0)
    assert answer.error_code == E.not_coordinator
