"""The five share-state RPCs brokers send the share coordinator (KIP-932's persister): Initialize, Read, Write,
Delete and ReadSummary of ShareGroupState.

Each request names share partitions (a group, topics by id, partitions);
each partition is answered on its own, by the shard of ``__share_group_state``
that keeps it (``abs(hashCode("group:topicId:partition")) % partitions``), or
NOT_COORDINATOR where that shard is elsewhere. The partitions of one request
are worked on concurrently, so the writes of many land in one batch.
Authorization (CLUSTER_ACTION, as Kafka) is the dispatcher's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.metadata.records import uuid_to_text
from josef_coordinator_share.shard import ShareStateError, ShareStateShard
from josef_coordinator_share.state import (DEFAULT_STATE_EPOCH, PERSISTED_STATES, UNCHANGED,
                                           UNINITIALIZED_START_OFFSET, ShareKey, ShareState, StateBatch)

if TYPE_CHECKING:
    from josef.server.dispatch import RequestContext
    from josef_coordinator_share.coordinator import ShareCoordinator

T = TypeVar("T")
#: FindCoordinator's key type of share partitions, by which the runtime finds this coordinator.
SHARE_KEY_TYPE = 2


def coordinator_of(ctx: RequestContext) -> ShareCoordinator:
    return ctx.services.coordinators.by_key_type(SHARE_KEY_TYPE)  # type: ignore[return-value]


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code, self.message = code, message


def _key(ctx: RequestContext, group_id: str, topic_id: Any, partition: int, *, must_exist: bool) -> ShareKey:
    if topic_id is None or topic_id.int == 0:
        raise _Refused(ErrorCode.invalid_request, "the topic id cannot be null")
    if partition < 0:
        raise _Refused(ErrorCode.invalid_request, "the partition id cannot be a negative number")
    if must_exist:
        topic = ctx.services.image.topic_by_id(uuid_to_text(topic_id))
        if topic is None or partition not in topic.partitions:
            raise _Refused(ErrorCode.unknown_topic_or_partition, f"{uuid_to_text(topic_id)}-{partition} does not exist")
    return ShareKey(group_id, topic_id, partition)


async def _each(ctx: RequestContext, group_id: str, topics: Any, *, must_exist: bool,
                operation: Callable[[ShareStateShard, ShareKey, Any], Awaitable[T]],
                answer: Callable[[Any, T | None], dict[str, Any]]) -> list[dict[str, Any]]:
    """``operation`` on each partition's shard, concurrently, with the lock held; the results by topic id."""
    coordinator = coordinator_of(ctx)
    results: dict[tuple[int, int], dict[str, Any]] = {}

    async def one(t: int, p: int, topic_id: Any, part: Any) -> None:
        try:
            key = _key(ctx, group_id, topic_id, part.partition, must_exist=must_exist)
            shard = await coordinator.shard_for(key)
            async with shard.context.lock:
                value = await operation(shard, key, part)
        except (CoordinatorError, ShareStateError, _Refused) as exc:
            results[t, p] = {"partition": part.partition, **answer(part, None), "error_code": exc.code,
                             "error_message": getattr(exc, "message", str(exc))}
            return
        results[t, p] = {"partition": part.partition, **answer(part, value), "error_code": ErrorCode.none,
                         "error_message": None}

    async with anyio.create_task_group() as tg:
        for t, topic in enumerate(topics):
            for p, part in enumerate(topic.partitions):
                tg.start_soon(one, t, p, topic.topic_id, part)
    return [{"topic_id": topic.topic_id, "partitions": [results[t, p] for p in range(len(topic.partitions))]}
            for t, topic in enumerate(topics)]


def _batches(state: ShareState | None) -> list[dict[str, Any]]:
    return [{"first_offset": b.first_offset, "last_offset": b.last_offset, "delivery_state": b.delivery_state,
             "delivery_count": b.delivery_count} for b in (state.batches if state is not None else ())]


def _requested_batches(part: Any) -> tuple[StateBatch, ...]:
    batches = tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                    for b in part.state_batches)
    for b in batches:
        if b.first_offset > b.last_offset or b.first_offset < 0 or b.delivery_state not in PERSISTED_STATES:
            raise _Refused(ErrorCode.invalid_request, f"state batch {b} is not a range of a persisted state")
    return batches


async def initialize_share_group_state(ctx: RequestContext, request: Any) -> dict[str, Any]:
    async def initialize(shard: ShareStateShard, key: ShareKey, part: Any) -> None:
        await shard.initialize(key, part.state_epoch, part.start_offset)

    return {"results": await _each(ctx, request.group_id, request.topics, must_exist=True, operation=initialize,
                                   answer=lambda part, _: {})}


async def read_share_group_state(ctx: RequestContext, request: Any) -> dict[str, Any]:
    async def read(shard: ShareStateShard, key: ShareKey, part: Any) -> ShareState | None:
        return await shard.read(key, part.leader_epoch)

    def answer(part: Any, state: ShareState | None) -> dict[str, Any]:
        if state is None:
            return {"state_epoch": DEFAULT_STATE_EPOCH, "start_offset": UNINITIALIZED_START_OFFSET,
                    "state_batches": []}
        return {"state_epoch": state.state_epoch, "start_offset": state.start_offset, "state_batches": _batches(state)}

    return {"results": await _each(ctx, request.group_id, request.topics, must_exist=False, operation=read,
                                   answer=answer)}


async def write_share_group_state(ctx: RequestContext, request: Any) -> dict[str, Any]:
    async def write(shard: ShareStateShard, key: ShareKey, part: Any) -> None:
        await shard.write(key, part.state_epoch, part.leader_epoch, part.start_offset, _requested_batches(part))

    return {"results": await _each(ctx, request.group_id, request.topics, must_exist=True, operation=write,
                                   answer=lambda part, _: {})}


async def delete_share_group_state(ctx: RequestContext, request: Any) -> dict[str, Any]:
    async def delete(shard: ShareStateShard, key: ShareKey, part: Any) -> None:
        await shard.delete(key)

    return {"results": await _each(ctx, request.group_id, request.topics, must_exist=False, operation=delete,
                                   answer=lambda part, _: {})}


async def read_share_group_state_summary(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """The state epoch, leader epoch and start offset (v1: DeliveryCompleteCount, which josef does not keep: -1)."""
    async def summary(shard: ShareStateShard, key: ShareKey, part: Any) -> ShareState | None:
        await shard.context.wait(shard.context.barrier(), shard.settings().write_timeout_ms / 1000)
        return shard.state(key)

    def answer(part: Any, state: ShareState | None) -> dict[str, Any]:
        if state is None:
            return {"state_epoch": DEFAULT_STATE_EPOCH, "leader_epoch": UNCHANGED,
                    "start_offset": UNINITIALIZED_START_OFFSET, "delivery_complete_count": -1}
        return {"state_epoch": state.state_epoch, "leader_epoch": state.leader_epoch,
                "start_offset": state.start_offset, "delivery_complete_count": -1}

    return {"results": await _each(ctx, request.group_id, request.topics, must_exist=False, operation=summary,
                                   answer=answer)}
