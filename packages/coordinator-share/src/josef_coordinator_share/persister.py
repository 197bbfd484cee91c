"""The share partitions' side of the share coordinator (Kafka's DefaultStatePersister): read and write one share
partition's state through whichever broker keeps it.

The broker that keeps ``group:topicId:partition`` is the leader of its
``__share_group_state`` partition; :meth:`Persister.read` and
:meth:`Persister.write` find it as FindCoordinator would and send it the
request (a broker calling itself goes through its own dispatcher, without a
socket). While the coordinator moves, loads or cannot write, they retry with
a backoff, up to ``share.coordinator.write.timeout.ms`` in all.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.metadata.records import uuid_to_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef_coordinator_share.state import ShareKey, StateBatch

if TYPE_CHECKING:
    from josef.services import BrokerServices
    from josef_coordinator_share.coordinator import ShareCoordinator

#: Answers after which the coordinator is looked for again.
RETRIABLE = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                       ErrorCode.coordinator_not_available, ErrorCode.request_timed_out})
BACKOFF_S = 0.05


class PersisterError(Exception):
    """The share coordinator refused (FENCED_LEADER_EPOCH, FENCED_STATE_EPOCH...) or could not be reached in time."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class ReadState:
    state_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]


class Persister:
    def __init__(self, services: BrokerServices, coordinator: ShareCoordinator) -> None:
        self.services = services
        self.coordinator = coordinator

    async def read(self, key: ShareKey, leader_epoch: int) -> ReadState:
        """ReadShareGroupState: the share partition's state (start offset -1: never initialized), recording
        ``leader_epoch`` as the newest leader's."""
        answer = await self._call(key, ApiKey.READ_SHARE_GROUP_STATE, 0, {"leader_epoch": leader_epoch})
        return ReadState(answer.state_epoch, answer.start_offset, tuple(
            StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in answer.state_batches))

    async def write(self, key: ShareKey, state_epoch: int, leader_epoch: int, start_offset: int,
                    batches: tuple[StateBatch, ...]) -> None:
        """WriteShareGroupState of what changed; returns once the coordinator has it replicated."""
        await self._call(key, ApiKey.WRITE_SHARE_GROUP_STATE, 0, {
            "state_epoch": state_epoch, "leader_epoch": leader_epoch, "start_offset": start_offset,
            "state_batches": [{"first_offset": b.first_offset, "last_offset": b.last_offset,
                               "delivery_state": b.delivery_state, "delivery_count": b.delivery_count}
                              for b in batches]})

    async def _call(self, key: ShareKey, api_key: int, version: int, partition: dict[str, Any]) -> Any:
        runtime = self.services.coordinators
        body = {"group_id": key.group_id, "topics": [
            {"topic_id": uuid_to_text(key.topic_id), "partitions": [{"partition": key.partition, **partition}]}]}
        deadline = time.monotonic() + self.coordinator.settings().write_timeout_ms / 1000
        error = PersisterError(ErrorCode.coordinator_not_available, "the share coordinator was not found")
        while True:
            try:
                await runtime.ensure_topic(self.coordinator)
                node = runtime.leader_of(self.coordinator, key.coordinator_key)
                if node >= 0:
                    answer = await self.services.call_peer(node, api_key, body, version=version)
                    [[result]] = [t.partitions for t in answer.results]
                    if result.error_code == ErrorCode.none:
                        return result
                    error = PersisterError(result.error_code, result.error_message or result.error_code.name)
                    if result.error_code not in RETRIABLE:
                        raise error
            except CoordinatorError as exc:
                error = PersisterError(exc.code, exc.message)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                error = PersisterError(ErrorCode.coordinator_not_available, str(exc))
            if time.monotonic() + BACKOFF_S > deadline:
                raise error
            await anyio.sleep(BACKOFF_S)
