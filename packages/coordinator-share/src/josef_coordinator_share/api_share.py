"""ShareFetch (78, v1-2) and ShareAcknowledge (79, v1-2): share consumers' requests to partition leaders.

A request first passes its share session (:mod:`josef_coordinator_share.sessions`):
a session error answers the whole request (top-level error code) and changes
nothing. Acknowledgements are applied and persisted next, each partition's
result in its ``acknowledge_error_code`` (ShareFetch) or ``error_code``
(ShareAcknowledge); then ShareFetch acquires records of the session's
partitions for the member, waiting up to ``max_wait`` when there are none.
A partition this broker does not lead answers NOT_LEADER_OR_FOLLOWER with its
current leader and that leader's endpoint, as Fetch does (KIP-951).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from josef.metadata.records import uuid_to_text
from josef.protocol.topic_partition import TopicPartition
from josef_coordinator_share.api_state import coordinator_of
from josef_coordinator_share.partitions import FetchedPartition
from josef_coordinator_share.sessions import FINAL_EPOCH, INITIAL_EPOCH
from josef_coordinator_share.share_partition import ShareError

if TYPE_CHECKING:
    from josef.server.dispatch import RequestContext

#: ShareFetch v2's share_acquire_mode: 0 batch-optimized (whole batches), 1 record-limit (at most max_records).
RECORD_LIMIT = 1
UNLIMITED = 2**31 - 1


def _ms(value: Any) -> int:
    total_seconds = getattr(value, "total_seconds", None)
    return int(total_seconds() * 1000) if total_seconds is not None else int(value)


def _topic_name(ctx: RequestContext, topic_id: Any) -> str | None:
    topic = ctx.services.image.topic_by_id(uuid_to_text(topic_id)) if topic_id is not None else None
    return None if topic is None else topic.name


def _leader(ctx: RequestContext, tp: TopicPartition | None, code: ErrorCode) -> tuple[dict[str, int], int]:
    """The current leader (id, epoch) to tell a client that went to the wrong broker, and its id (-1: none)."""
    if tp is None or code not in (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch):
        return {"leader_id": -1, "leader_epoch": -1}, -1
    topic = ctx.services.image.topics.get(tp.topic)
    state = topic.partitions.get(tp.partition) if topic is not None else None
    if state is None:
        return {"leader_id": -1, "leader_epoch": -1}, -1
    return {"leader_id": state.leader, "leader_epoch": state.leader_epoch}, state.leader


def _endpoints(ctx: RequestContext, leaders: Iterable[int]) -> list[dict[str, Any]]:
    endpoints = []
    for node_id in sorted({n for n in leaders if n >= 0}):
        broker = ctx.services.image.brokers.get(node_id)
        endpoint = broker.endpoint(ctx.listener_name) if broker is not None else None
        if endpoint is not None:
            endpoints.append({"node_id": node_id, "host": endpoint.host, "port": endpoint.port, "rack": broker.rack})
    return endpoints


def _acks(batches: Any) -> list[tuple[int, int, list[int]]]:
    return [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in batches]


async def share_fetch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    coordinator = coordinator_of(ctx)
    manager = coordinator.partitions
    settings = coordinator.settings()
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                              "acquisition_lock_timeout": settings.record_lock_duration_ms, "responses": [],
                              "node_endpoints": []}
    group, member, epoch = request.group_id, request.member_id, request.share_session_epoch
    if group:
        answer["acquisition_lock_timeout"] = manager.lock_duration_ms(group)
    # Partitions named by the request: (topic id, index) -> tp, or None for a topic id this broker does not know.
    named: dict[tuple[Any, int], TopicPartition | None] = {}
    acknowledgements: dict[tuple[Any, int], list[tuple[int, int, list[int]]]] = {}
    max_bytes: dict[tuple[Any, int], int] = {}
    for topic in request.topics:
        name = _topic_name(ctx, topic.topic_id)
        for part in topic.partitions:
            key = (topic.topic_id, part.partition_index)
            named[key] = None if name is None else TopicPartition(name, part.partition_index)
            max_bytes[key] = getattr(part, "partition_max_bytes", 1 << 20)
            if part.acknowledgement_batches:
                acknowledgements[key] = _acks(part.acknowledgement_batches)
    forgotten = {(t.topic_id, p) for t in request.forgotten_topics_data for p in t.partitions}
    if not group or not member:
        return {**answer, "error_code": ErrorCode.invalid_request, "error_message": "a group id and member id are needed"}
    try:
        if epoch == INITIAL_EPOCH:
            if acknowledgements:
                raise ShareError(ErrorCode.invalid_request, "a new share session cannot acknowledge")
            session, closed = manager.sessions.open(group, member, [k for k in named], settings.max_share_sessions,
                                                    2 * settings.record_lock_duration_ms / 1000)
            for old in closed:
                await manager.release(old.group_id, old.member_id, [tp for k in old.partitions
                                                                    if (tp := _resolve(ctx, k, {})) is not None])
        else:
            session = manager.sessions.use(group, member, epoch)
    except ShareError as exc:
        return {**answer, "error_code": exc.code, "error_message": exc.message}
    for key in named:
        session.partitions.setdefault(key, None)
    for key in forgotten:
        session.partitions.pop(key, None)

    results: dict[tuple[Any, int], dict[str, Any]] = {}
    for key, batches in acknowledgements.items():
        tp = named[key]
        code, message = (ErrorCode.unknown_topic_id, "unknown topic id") if tp is None else \
            await manager.acknowledge(group, member, tp, batches)
        results[key] = {"acknowledge_error_code": code, "acknowledge_error_message": message}
    fetching = [key for key in session.partitions if key not in forgotten]
    fetched: dict[tuple[Any, int], FetchedPartition] = {}
    if epoch != FINAL_EPOCH and not getattr(request, "is_renew_ack", False):
        wanted = {key: tp for key in fetching if (tp := _resolve(ctx, key, named)) is not None}
        for key in fetching:
            if key not in wanted:
                fetched[key] = FetchedPartition(error=ErrorCode.unknown_topic_id, message="unknown topic id")
        by_tp = await manager.fetch(group, member, [(tp, max_bytes.get(key, 1 << 20)) for key, tp in wanted.items()],
                                    getattr(request, "max_records", UNLIMITED) or UNLIMITED, _ms(request.max_wait),
                                    strict=getattr(request, "share_acquire_mode", 0) == RECORD_LIMIT)
        for key, tp in wanted.items():
            fetched[key] = by_tp[tp]
    if epoch == FINAL_EPOCH:
        await manager.release(group, member, [tp for key in session.partitions
                                              if (tp := _resolve(ctx, key, named)) is not None])

    leaders: list[int] = []
    by_topic: dict[Any, list[dict[str, Any]]] = {}
    for key in dict.fromkeys([*results, *fetched]):
        got = fetched.get(key, FetchedPartition())
        if key not in results and not got.acquired and got.error == ErrorCode.none and key not in named:
            continue  # nothing to say about a session partition this time
        tp = _resolve(ctx, key, named)
        current, leader = _leader(ctx, tp, got.error)
        leaders.append(leader)
        by_topic.setdefault(key[0], []).append({
            "partition_index": key[1], "error_code": got.error, "error_message": got.message,
            "acknowledge_error_code": ErrorCode.none, "acknowledge_error_message": None, **results.get(key, {}),
            "current_leader": current, "records": got.records,
            "acquired_records": [{"first_offset": a.first, "last_offset": a.last, "delivery_count": a.delivery_count}
                                 for a in got.acquired]})
    answer["responses"] = [{"topic_id": topic_id, "partitions": parts} for topic_id, parts in by_topic.items()]
    answer["node_endpoints"] = _endpoints(ctx, leaders)
    return answer


def _resolve(ctx: RequestContext, key: tuple[Any, int], named: dict[tuple[Any, int], TopicPartition | None]
             ) -> TopicPartition | None:
    if key in named:
        return named[key]
    name = _topic_name(ctx, key[0])
    return None if name is None else TopicPartition(name, key[1])


async def share_acknowledge(ctx: RequestContext, request: Any) -> dict[str, Any]:
    coordinator = coordinator_of(ctx)
    manager = coordinator.partitions
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                              "acquisition_lock_timeout": coordinator.settings().record_lock_duration_ms,
                              "responses": [], "node_endpoints": []}
    group, member, epoch = request.group_id, request.member_id, request.share_session_epoch
    if not group or not member:
        return {**answer, "error_code": ErrorCode.invalid_request, "error_message": "a group id and member id are needed"}
    answer["acquisition_lock_timeout"] = manager.lock_duration_ms(group)
    try:
        if epoch == INITIAL_EPOCH:
            raise ShareError(ErrorCode.invalid_share_session_epoch, "ShareAcknowledge cannot open a share session")
        session = manager.sessions.use(group, member, epoch)
    except ShareError as exc:
        return {**answer, "error_code": exc.code, "error_message": exc.message}
    leaders: list[int] = []
    responses = []
    for topic in request.topics:
        name = _topic_name(ctx, topic.topic_id)
        parts = []
        for part in topic.partitions:
            tp = None if name is None else TopicPartition(name, part.partition_index)
            code, message = (ErrorCode.unknown_topic_id, "unknown topic id") if tp is None else \
                await manager.acknowledge(group, member, tp, _acks(part.acknowledgement_batches))
            current, leader = _leader(ctx, tp, code)
            leaders.append(leader)
            parts.append({"partition_index": part.partition_index, "error_code": code, "error_message": message,
                          "current_leader": current})
        responses.append({"topic_id": topic.topic_id, "partitions": parts})
    if epoch == FINAL_EPOCH:
        await manager.release(group, member, [tp for key in session.partitions
                                              if (tp := _resolve(ctx, key, {})) is not None])
    answer["responses"] = responses
    answer["node_endpoints"] = _endpoints(ctx, leaders)
    return answer
